// promlint checks what the charts ship for Prometheus and Grafana with Prometheus's own parser
// (the code `promtool check rules` runs), so that a rule or a panel that would not load fails
// `make test` rather than someone's monitoring:
//
//	promlint rules FILE      a rule file (`groups:`, the spec of a PrometheusRule): parsed and
//	                         validated by model/rulefmt; every alert also needs a severity label
//	                         and summary and description annotations
//	promlint dashboard FILE  a Grafana dashboard (JSON): its shape (title, uid, panels on the
//	                         24-column grid, unique ids) and the PromQL of every target
//
// It prints what it checked and exits 1 with every problem found.
package main

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: promlint rules|dashboard FILE")
		os.Exit(2)
	}
	var problems []string
	switch os.Args[1] {
	case "rules":
		problems = rules(os.Args[2])
	case "dashboard":
		problems = dashboard(os.Args[2])
	default:
		fmt.Fprintf(os.Stderr, "promlint: unknown check %q (rules or dashboard)\n", os.Args[1])
		os.Exit(2)
	}
	for _, p := range problems {
		fmt.Fprintln(os.Stderr, "promlint:", p)
	}
	if len(problems) > 0 {
		os.Exit(1)
	}
}

func promql() parser.Parser {
	return parser.NewParser(parser.Options{})
}

func rules(file string) []string {
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	groups, errs := rulefmt.ParseFile(file, false, model.UTF8Validation, promql(), logger)
	var problems []string
	for _, e := range errs {
		problems = append(problems, e.Error())
	}
	if groups == nil {
		return problems
	}
	n := 0
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			n++
			if r.Labels["severity"] == "" {
				problems = append(problems, fmt.Sprintf("alert %s: no severity label", r.Alert))
			}
			for _, a := range []string{"summary", "description"} {
				if r.Annotations[a] == "" {
					problems = append(problems, fmt.Sprintf("alert %s: no %s annotation", r.Alert, a))
				}
			}
		}
	}
	if n == 0 {
		problems = append(problems, file+": no alert")
	}
	fmt.Printf("%s: %d groups, %d alerts parsed\n", file, len(groups.Groups), n)
	return problems
}

type board struct {
	Title         string  `json:"title"`
	UID           string  `json:"uid"`
	SchemaVersion int     `json:"schemaVersion"`
	Panels        []panel `json:"panels"`
}

type panel struct {
	ID         int             `json:"id"`
	Type       string          `json:"type"`
	Title      string          `json:"title"`
	Datasource json.RawMessage `json:"datasource"`
	GridPos    struct {
		X, Y, W, H int
	} `json:"gridPos"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
}

var panelTypes = map[string]bool{"timeseries": true, "stat": true, "gauge": true, "table": true, "row": true, "bargauge": true, "text": true}

func dashboard(file string) []string {
	raw, err := os.ReadFile(file)
	if err != nil {
		return []string{err.Error()}
	}
	var b board
	if err := json.Unmarshal(raw, &b); err != nil {
		return []string{fmt.Sprintf("%s: not a dashboard: %v", file, err)}
	}
	var problems []string
	bad := func(format string, a ...any) { problems = append(problems, fmt.Sprintf(format, a...)) }
	if b.Title == "" {
		bad("no title")
	}
	if b.UID == "" || len(b.UID) > 40 {
		bad("uid %q: 1 to 40 characters", b.UID)
	}
	if b.SchemaVersion < 30 {
		bad("schemaVersion %d: a current Grafana dashboard has 30 or more", b.SchemaVersion)
	}
	if len(b.Panels) == 0 {
		bad("no panels")
	}
	ids := map[int]bool{}
	exprs := 0
	for _, p := range b.Panels {
		if ids[p.ID] || p.ID <= 0 {
			bad("panel %q: id %d is not positive and unique", p.Title, p.ID)
		}
		ids[p.ID] = true
		if !panelTypes[p.Type] {
			bad("panel %q: unknown type %q", p.Title, p.Type)
		}
		if p.Title == "" {
			bad("panel %d: no title", p.ID)
		}
		g := p.GridPos
		if g.W <= 0 || g.H <= 0 || g.X < 0 || g.Y < 0 || g.X+g.W > 24 {
			bad("panel %q: gridPos %+v is off the 24-column grid", p.Title, g)
		}
		if p.Type == "row" || p.Type == "text" {
			continue
		}
		if len(p.Datasource) == 0 {
			bad("panel %q: no datasource", p.Title)
		}
		if len(p.Targets) == 0 {
			bad("panel %q: no targets", p.Title)
		}
		for _, t := range p.Targets {
			if t.RefID == "" {
				bad("panel %q: a target without refId", p.Title)
			}
			if _, err := promql().ParseExpr(t.Expr); err != nil {
				bad("panel %q, target %s: %q: %v", p.Title, t.RefID, t.Expr, err)
			}
			exprs++
		}
	}
	fmt.Printf("%s: %d panels, %d PromQL expressions parsed\n", file, len(b.Panels), exprs)
	return problems
}
