//! The alert rules and the dashboard.

use super::*;

/// The PrometheusRules of both charts and the leader's dashboard render when turned on, and
/// load: Prometheus's rule parser accepts every rule (the check `promtool check rules` makes)
/// and the dashboard is a Grafana dashboard whose every PromQL target parses. The checker
/// itself refuses a broken rule and a broken panel.
#[test]
fn the_alerts_and_the_dashboard_lint() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rules_of = |docs: &[Value], name: &str| {
        let rule = kind(docs, "PrometheusRule", name);
        let file = dir.path().join(format!("{name}.rules.yaml"));
        std::fs::write(&file, serde_json::to_string(&rule["spec"]).expect("json")).expect("write");
        (file, rule["spec"]["groups"][0]["rules"].clone())
    };
    let alerts = |rules: &Value| -> Vec<String> {
        rules
            .as_array()
            .expect("rules")
            .iter()
            .filter_map(|r| r["alert"].as_str().map(str::to_string))
            .collect()
    };
    for (chart, name, extra, want) in [
        (
            "charts/tether-leader",
            "tether-leader",
            vec!["--set", "prometheusRule.enabled=true"],
            LEADER_ALERTS.to_vec(),
        ),
        (
            "charts/tether-leader",
            "tether-leader",
            vec![
                "--set",
                "prometheusRule.enabled=true",
                "--set",
                "memberMetrics=true",
            ],
            LEADER_ALERTS.to_vec(),
        ),
        (
            "charts/tether-agent",
            "tether-agent",
            vec!["--set", "prometheusRule.enabled=true"],
            vec![
                "TetherLeaderUnreachable",
                "TetherAgentCredentialRenewalFailing",
                "TetherTunnelDown",
            ],
        ),
    ] {
        let d = render(chart, &extra);
        let (file, rules) = rules_of(&d, name);
        assert_eq!(alerts(&rules), want, "{chart} {extra:?}");
        let o = promlint("rules", &file);
        assert!(o.status.success(), "{chart} {extra:?}: {}", out(&o));
        assert!(
            out(&o).contains(&format!("{} alerts parsed", want.len())),
            "{}",
            out(&o)
        );
        let text = rules.to_string();
        assert!(
            text.contains("namespace=\\\"fleet\\\""),
            "scoped to the release: {text}"
        );
    }
    let member_lost = |extra: &[&str]| {
        let d = render("charts/tether-leader", extra);
        let (_, rules) = rules_of(&d, "tether-leader");
        rules[0]["expr"].as_str().expect("expr").to_string()
    };
    assert!(
        member_lost(&[
            "--set",
            "prometheusRule.enabled=true",
            "--set",
            "memberMetrics=true"
        ])
        .contains("tether_leader_member_ready")
    );
    assert!(member_lost(&["--set", "prometheusRule.enabled=true"]).contains("state=\"not_ready\""));
    // Off by default; the tunnel's alert goes with the tunnel, the certificate's with member access.
    assert!(
        !render("charts/tether-leader", &[])
            .iter()
            .any(|v| v["kind"] == "PrometheusRule")
    );
    let d = render(
        "charts/tether-agent",
        &[
            "--set",
            "prometheusRule.enabled=true",
            "--set",
            "proxy.tunnel=false",
        ],
    );
    assert!(!alerts(&rules_of(&d, "tether-agent").1).contains(&"TetherTunnelDown".to_string()));
    let d = render(
        "charts/tether-leader",
        &[
            "--set",
            "prometheusRule.enabled=true",
            "--set",
            "memberAccess.enabled=false",
        ],
    );
    assert!(
        !alerts(&rules_of(&d, "tether-leader").1)
            .iter()
            .any(|a| a.contains("Certificate"))
    );

    let d = render("charts/tether-leader", &["--set", "dashboard.enabled=true"]);
    let cm = kind(&d, "ConfigMap", "tether-leader-dashboard");
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1");
    let json = cm["data"]["tether-leader.json"].as_str().expect("dashboard json");
    let board = dir.path().join("dashboard.json");
    std::fs::write(&board, json).expect("write");
    let o = promlint("dashboard", &board);
    assert!(o.status.success(), "{}", out(&o));
    assert!(
        !render("charts/tether-leader", &[])
            .iter()
            .any(|v| v["metadata"]["name"] == "tether-leader-dashboard")
    );

    // The checker is not a rubber stamp: a rule that does not parse, an alert without a
    // severity, and a panel whose PromQL is broken are each refused.
    let broken = dir.path().join("broken.rules.yaml");
    std::fs::write(
        &broken,
        "groups:\n- name: g\n  rules:\n  - alert: A\n    expr: sum(rate(x[5m])\n    labels: {severity: warning}\n    annotations: {summary: s, description: d}\n  - alert: B\n    expr: up == 0\n    annotations: {summary: s, description: d}\n",
    )
    .expect("write");
    let o = promlint("rules", &broken);
    assert!(!o.status.success(), "{}", out(&o));
    assert!(out(&o).contains("no severity label"), "{}", out(&o));
    let mut bad: Value = serde_json::from_str(json).expect("dashboard");
    bad["panels"][0]["targets"][0]["expr"] = "sum(tether_leader_is_leader".into();
    std::fs::write(&board, bad.to_string()).expect("write");
    let o = promlint("dashboard", &board);
    assert!(!o.status.success(), "{}", out(&o));
}

/// The `tether_` selectors of `expr`: each metric name with its `label="value"` matchers, and
/// each value of a `label=~"a|b"` one (negative matchers name nothing that must exist).
fn selectors(expr: &str) -> Vec<(String, Vec<(String, String)>)> {
    let mut found = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("tether_") {
        rest = &rest[at..];
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        let name = rest[..end].to_string();
        rest = &rest[end..];
        let mut matchers = Vec::new();
        if let Some(inner) = rest.strip_prefix('{').and_then(|r| r.split_once('}')) {
            for m in inner.0.split(',') {
                let (label, value) = match m.split_once("=~") {
                    Some((l, v)) => (l, v),
                    None if m.contains("!=") || m.contains("!~") => continue,
                    None => match m.split_once('=') {
                        Some(lv) => lv,
                        None => continue,
                    },
                };
                for v in value.trim().trim_matches('"').split('|') {
                    matchers.push((label.trim().to_string(), v.to_string()));
                }
            }
            rest = inner.1;
        }
        found.push((name, matchers));
    }
    found
}

/// Every series an alert selects on is exposed by its component from the start: its family, and
/// for a `result` or `reason` label each value it names at 0. So `increase()` sees the first
/// failure (a series born at 1 shows no increase), and an alert on a result nothing counts is
/// caught. (Per-set and per-member labels exist once there is a set or a member.)
#[test]
fn every_series_an_alert_selects_is_exposed_from_the_start() {
    let on = ["--set", "prometheusRule.enabled=true"];
    let per_member = [
        "--set",
        "prometheusRule.enabled=true",
        "--set",
        "memberMetrics=true",
    ];
    // NB: a family shows only once it has a series; `documented()` has one of every family.
    let leader = (
        tether_leader::metrics::Metrics::documented().encode(),
        tether_leader::metrics::Metrics::default().encode(),
    );
    let agent = (
        tether_agent::metrics::Metrics::documented().encode(),
        tether_agent::metrics::Metrics::default().encode(),
    );
    let mut checked = 0;
    for (chart, name, extra, (families, text)) in [
        ("charts/tether-leader", "tether-leader", &on[..], &leader),
        ("charts/tether-leader", "tether-leader", &per_member[..], &leader),
        ("charts/tether-agent", "tether-agent", &on[..], &agent),
    ] {
        let docs = render(chart, extra);
        let rule = kind(&docs, "PrometheusRule", name);
        for r in rule["spec"]["groups"][0]["rules"].as_array().expect("rules") {
            let expr = r["expr"].as_str().expect("expr");
            for (metric, matchers) in selectors(expr) {
                let family = metric.strip_suffix("_total").unwrap_or(&metric);
                assert!(
                    families.contains(&format!("# TYPE {family} ")),
                    "{chart}: {metric} in {expr:?} is not a metric of the component:\n{families}"
                );
                for (label, value) in matchers.iter().filter(|(l, _)| l == "result" || l == "reason") {
                    let series = format!("{metric}{{{label}=\"{value}\"}} 0");
                    assert!(
                        text.lines().any(|l| l == series),
                        "{chart}: {expr:?} selects {series}, which is not exposed from the start:\n{text}"
                    );
                    checked += 1;
                }
            }
        }
    }
    // The selectors are read: both failure alerts' series were checked.
    assert!(checked >= 3, "{checked} series checked");
}
