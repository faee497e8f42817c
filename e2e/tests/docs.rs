//! Every command the docs print runs as printed. Each `sh` block of README.md and
//! docs/operations.md runs line by line, as a reader would type it, against a leader and two
//! members (`east`, `west`) that each have a real node running the project's image, as in
//! `make demo`:
//! - `L$` / `M$` prefixes (operations.md) and comment lines (`# leader ...`, `# member east ...`,
//!   `# each member cluster`, `# alice ...`; README) say whose kubeconfig a line runs with;
//! - placeholders (`<token>`, `<east's namespace>`, `<cluster ID>`, ...) are filled from what
//!   earlier lines printed or made;
//! - a block or line that cannot run here is listed in [`PLAN`] / [`SKIPPED_LINES`] with why, and
//!   a block the plan does not name, in the order the docs have them, fails the test: a new block
//!   is classified before it lands.
//!
//! Between lines the test only waits for what the docs say happens by itself (a member becoming
//! Ready after a join or an unban), and read-only lines (`get`, `status`, `logs`, ...) are
//! retried for a while, as a reader would run them again while a rollout settles. It never
//! changes a line. Lines run in a scratch folder holding `charts/` (the repository's), so files
//! the docs write (`join.yaml`, `east.kubeconfig`) stay out of the tree.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Output};
use std::time::{Duration, Instant};

use kube::ResourceExt;
use kube::api::{Api, ListParams};
use tether_api::{ManagedCluster, labels};
use tether_e2e::pods::{self, step};
use tether_testkit::{TestCluster, Tools};

#[path = "docs/plan.rs"]
mod plan;
#[path = "docs/readme.rs"]
mod readme;

use plan::*;
use readme::*;

fn main() -> ExitCode {
    tether_e2e::lab_main(
        "the docs-commands test",
        "every_shell_block_of_the_readme_and_the_runbooks_runs_as_printed",
        docs_commands,
    )
}

/// The clusters, the scratch folder and what the lines printed so far.
struct World {
    leader: TestCluster,
    members: BTreeMap<&'static str, TestCluster>,
    dir: PathBuf,
    alice: PathBuf,
    /// Placeholder → value.
    vars: BTreeMap<String, String>,
    path: String,
    start: Instant,
}

impl World {
    /// `KUBECONFIG` for `who`: its own file first (its context is the current one), then the
    /// others, so `--context <name>` reaches every cluster as `.sandbox/env` lets it.
    fn kubeconfig(&self, who: Who) -> String {
        let first = match who {
            Who::Alice => return self.alice.display().to_string(),
            Who::Leader => &self.leader,
            Who::Member(m) => &self.members[m],
        };
        std::iter::once(first)
            .chain(std::iter::once(&self.leader).filter(|c| c.name() != first.name()))
            .chain(self.members.values().filter(|c| c.name() != first.name()))
            .map(|c| c.kubeconfig().display().to_string())
            .collect::<Vec<_>>()
            .join(":")
    }

    fn cluster(&self, who: Who) -> &TestCluster {
        match who {
            Who::Member(m) => &self.members[m],
            _ => &self.leader,
        }
    }

    /// Runs `cmd` with bash as `who`, in the scratch folder.
    fn bash(&self, who: Who, cmd: &str) -> Output {
        let helm_home = std::env::temp_dir().join("tether-helm4");
        Command::new("bash")
            .args(["-o", "pipefail", "-c", cmd])
            .current_dir(&self.dir)
            .env("PATH", &self.path)
            .env("KUBECONFIG", self.kubeconfig(who))
            .env("HELM_CACHE_HOME", helm_home.join("cache"))
            .env("HELM_CONFIG_HOME", helm_home.join("config"))
            .env("HELM_DATA_HOME", helm_home.join("data"))
            .output()
            .expect("run bash")
    }

    /// Fills placeholders from the leader's view of `east` (its namespace and cluster ID).
    async fn refresh(&mut self) {
        if let Some(mc) = member(&self.leader, "east").await {
            self.vars
                .insert("<east's namespace>".into(), mc.namespace().unwrap_or_default());
            self.vars.insert("<cluster ID>".into(), mc.spec.cluster_id);
        }
    }

    fn fill(&self, cmd: &str) -> String {
        self.vars
            .iter()
            .fold(cmd.to_string(), |c, (k, v)| c.replace(k.as_str(), v))
    }
}

/// Member `name`'s ManagedCluster on the leader.
async fn member(leader: &TestCluster, name: &str) -> Option<ManagedCluster> {
    Api::<ManagedCluster>::all(leader.client().ok()?)
        .list(&ListParams::default().labels(&format!("{}={name}", labels::CLUSTER_NAME)))
        .await
        .ok()?
        .items
        .pop()
}

/// Waits until member `name` is Ready at the leader (a join, a rejoin, an unban).
async fn wait_ready(w: &World, name: &'static str, why: &str) {
    step(
        w.start,
        &format!("  (waiting: {name} Ready at the leader, {why})"),
    );
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut ready = pods::ready_members(&w.leader).await;
    while !ready.iter().any(|(n, _)| n == name) {
        if Instant::now() >= deadline {
            // What the agent and the leader made of it, before the clusters go.
            let diagnose = [
                (
                    Who::Member(name),
                    "kubectl -n tether-system logs deploy/tether-agent --tail=60",
                ),
                (
                    Who::Leader,
                    "kubectl get clsrr -A -o wide; kubectl get mcls -A -o wide",
                ),
            ];
            for (who, cmd) in diagnose {
                eprintln!("{who:?}$ {cmd}\n{}", pods::text(&w.bash(who, cmd)));
            }
            panic!("timed out after 180s waiting for {name} Ready at the leader ({why}); Ready: {ready:?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        ready = pods::ready_members(&w.leader).await;
    }
}

/// Waits until every Ready member has a ClusterProfile in `ns` that says it Joined (the set
/// lists `ns` in its inventory: the leader publishes them by itself).
async fn wait_profiles(w: &World, ns: &str) {
    use tether_api::inventory::{ClusterProfile, JOINED};
    step(
        w.start,
        &format!("  (waiting: every Ready member's ClusterProfile in {ns})"),
    );
    let profiles: Api<ClusterProfile> = Api::namespaced(w.leader.client().expect("client"), ns);
    tether_testkit::eventually(
        &format!("a ClusterProfile in {ns} for every Ready member"),
        Duration::from_secs(180),
        || async {
            let ready: Vec<String> = pods::ready_members(&w.leader)
                .await
                .into_iter()
                .map(|(n, _)| n)
                .collect();
            let joined: Vec<String> = profiles
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?
                .items
                .into_iter()
                .filter(|p| {
                    p.status
                        .iter()
                        .flat_map(|s| &s.conditions)
                        .any(|c| c.type_ == JOINED && c.status == "True")
                })
                .map(|p| p.name_any())
                .collect();
            if !ready.is_empty() && ready.iter().all(|n| joined.contains(n)) {
                Ok(())
            } else {
                Err(format!("Ready {ready:?}, joined profiles {joined:?}"))
            }
        },
    )
    .await;
}

/// What the test itself waits for after a line, as the docs say it happens by itself.
async fn after(w: &mut World, who: Who, cmd: &str, out: &str) {
    let c = cmd.trim_start();
    if c.starts_with("tether init --clusterset prod") && !c.contains("--values-file") {
        let printed = pods::printed_command(out, "helm install tether-agent");
        for (key, flag) in [("<token>", "token="), ("sha256:<hash>", "caCertHash=")] {
            let value = pods::words(&printed)
                .into_iter()
                .find_map(|w| w.strip_prefix(flag).map(str::to_string))
                .unwrap_or_else(|| panic!("no {flag} in the printed helm line: {printed}"));
            w.vars.insert(key.into(), value);
        }
    } else if c.starts_with("tether token create") {
        let token = out.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("");
        w.vars.insert("<new token>".into(), token.trim().to_string());
    } else if c.starts_with("helm install tether-agent") && c.contains("cluster.name=east") {
        wait_ready(w, "east", "the agent joined as the chart's values say").await;
    } else if c.starts_with("tether join ")
        && let Who::Member(m) = who
    {
        wait_ready(w, m, "the idle agent joined with the join file").await;
    } else if c.starts_with("tether member remove east") && !c.contains("--ban") {
        wait_ready(
            w,
            "east",
            "its agent registered again with its still valid join token",
        )
        .await;
    } else if c.contains("patch clusterset prod") && c.contains("inventory") {
        wait_profiles(w, "argocd").await;
    } else if c.starts_with("tether member unban") {
        wait_ready(w, "east", "its agent registered again once the ban was lifted").await;
    } else if c.starts_with("helm upgrade tether-agent")
        && c.contains("--reset-then-reuse-values")
        && let Who::Member(m) = who
    {
        wait_ready(w, m, "after the agent's upgrade").await;
    }
    if c.contains("--set serviceMonitor.enabled=true") {
        // What the monitoring runbook promises: the objects Prometheus Operator (and, on the
        // leader, Grafana's sidecar) pick up.
        let mut want = vec![
            ("servicemonitors", "servicemonitor"),
            ("prometheusrules", "prometheusrule"),
        ];
        if who == Who::Leader {
            want.push((
                "configmaps -l grafana_dashboard",
                "configmap/tether-leader-dashboard",
            ));
        }
        for (what, name) in want {
            let out = w.bash(who, &format!("kubectl -n tether-system get {what} -o name"));
            let names = String::from_utf8_lossy(&out.stdout).into_owned();
            assert!(
                names.lines().any(|l| l.starts_with(name)),
                "{who:?}: no {name} after `{cmd}`: {}",
                pods::text(&out)
            );
        }
    }
    w.refresh().await;
}

/// What the test prepares before a block, beside the docs (named in its output).
async fn before(w: &mut World, block: &Block) {
    if block.body.contains("tether grant --cluster east --user alice") {
        step(
            w.start,
            "  (prepared: alice's kubeconfig for the leader, and east.token: a token of a \
             ServiceAccount east's admin gave view rights, handed to alice)",
        );
        w.leader
            .write_user_kubeconfig("alice", None, &w.alice)
            .expect("alice's kubeconfig");
        let east = Who::Member("east");
        for cmd in [
            "kubectl -n default create serviceaccount alice-east",
            "kubectl create clusterrolebinding alice-east-view --clusterrole=view --serviceaccount=default:alice-east",
            "kubectl -n default create token alice-east --duration=1h > east.token",
        ] {
            let out = w.bash(east, cmd);
            assert!(out.status.success(), "{cmd}: {}", pods::text(&out));
        }
    }
    if block.body.contains("serviceMonitor.enabled=true") {
        // NB: kubectl reads a folder given as a symlink as a file: the link is resolved first.
        let crds = std::fs::canonicalize(Tools::locate().expect("tools").path("prometheus-operator-crds"))
            .expect("the prometheus-operator CRDs (make tools)");
        step(
            w.start,
            &format!(
                "  (prepared: the prometheus-operator CRDs ServiceMonitor and PrometheusRule, \
                 upstream's from {}, in the leader and east, as a cluster running Prometheus \
                 Operator has them)",
                crds.display()
            ),
        );
        for who in [Who::Leader, Who::Member("east")] {
            let cmd = format!("kubectl apply --server-side -f {}", crds.display());
            let out = w.bash(who, &cmd);
            assert!(out.status.success(), "{cmd}: {}", pods::text(&out));
        }
    }
}

/// Runs one line; panics with its output if it fails (read-only lines get a few tries).
async fn run_line(w: &mut World, who: Who, raw: &str) -> usize {
    let cmd = w.fill(raw);
    if let Some(p) = unfilled(&cmd) {
        panic!("the test cannot fill {p} in `{raw}`: teach World::refresh or after() where it comes from");
    }
    step(
        w.start,
        &format!("{who:?}$ {}", cmd.replace("\\\n", "\\\n      ")),
    );
    let watch = pods::words(&cmd).iter().any(|w| w == "-w" || w == "--watch");
    if watch {
        // A watch never ends by itself: it must still be running, and have printed, after 10 s.
        let out = w.bash(who, &format!("timeout 10 {cmd}"));
        let text = pods::text(&out);
        assert!(
            out.status.code() == Some(124) && text.contains("NAME"),
            "`{cmd}` as {who:?} should watch: {text}"
        );
        eprintln!("{}", indent(&text));
        after(w, who, &cmd, &text).await;
        return 1;
    }
    let tries = if read_only(&cmd) { 45 } else { 1 };
    let mut last = String::new();
    for attempt in 1..=tries {
        let out = w.bash(who, &cmd);
        last = pods::text(&out);
        if out.status.success() {
            eprintln!("{}", indent(&last));
            let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
            after(w, who, &cmd, &format!("{stdout}{last}")).await;
            return 1;
        }
        if attempt < tries {
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    }
    panic!(
        "a documented command fails as printed\n  {who:?}$ {cmd}\n{}\n(on {}; its logs:\n{})",
        indent(&last),
        w.cluster(who).name(),
        w.cluster(who).logs(20)
    );
}

fn indent(text: &str) -> String {
    text.lines()
        .take(40)
        .map(|l| format!("      | {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Runs a block's lines; returns how many ran.
async fn run_block(w: &mut World, block: &Block, member: &'static str) -> usize {
    step(
        w.start,
        &format!("== {}:{} (`M$` is {member})", block.doc, block.line),
    );
    before(w, block).await;
    let mut who = Who::Leader;
    let mut ran = 0;
    for line in lines(&block.body) {
        let trimmed = line.trim_start();
        if trimmed.starts_with('#') {
            if let Some(next) = comment_switch(trimmed, member) {
                who = next;
            }
            continue;
        }
        if let Some((_, why)) = SKIPPED_LINES.iter().find(|(p, _)| trimmed.starts_with(p)) {
            step(w.start, &format!("skipped: {trimmed}\n      because it {why}"));
            continue;
        }
        let (line_who, cmd) = if let Some(c) = trimmed.strip_prefix("L$ ") {
            (Who::Leader, c)
        } else if let Some(c) = trimmed.strip_prefix("M$ ") {
            (Who::Member(member), c)
        } else {
            (who, trimmed)
        };
        ran += run_line(w, line_who, cmd).await;
    }
    ran
}

async fn docs_commands() {
    let start = Instant::now();
    let repo = pods::repo();
    let plan = planned_blocks(&repo);

    let (leader, members) = pods::start_clusters(None, &["east", "west"], start).await;
    let dir = tempfile::tempdir().expect("scratch folder");
    std::os::unix::fs::symlink(repo.join("charts"), dir.path().join("charts")).expect("charts link");
    let tools = Tools::locate().expect("tools");
    let tether = tether_testkit::controller::binary("tether").expect("tether binary");
    let path = format!(
        "{}:{}:{}",
        tools.path("kubectl").parent().expect("tools dir").display(),
        tether.parent().expect("tether dir").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut world = World {
        vars: BTreeMap::from([("https://leader:6443".to_string(), leader.url().to_string())]),
        members: ["east", "west"].into_iter().zip(members).collect(),
        leader,
        alice: dir.path().join("alice.kubeconfig"),
        dir: dir.path().to_path_buf(),
        path,
        start,
    };

    let (mut ran, mut skipped) = (0, Vec::new());
    let mut last = Vec::new();
    for (block, how) in &plan {
        match how {
            How::Run { member } => ran += run_block(&mut world, block, member).await,
            How::Last { member } => last.push((block, *member)),
            How::Skip(why) => {
                step(
                    start,
                    &format!("== {}:{} skipped: it {why}", block.doc, block.line),
                );
                skipped.push(format!("{}:{}", block.doc, block.line));
            }
        }
    }
    for (block, member) in last {
        ran += run_block(&mut world, block, member).await;
    }
    step(
        start,
        &format!(
            "{ran} documented commands ran as printed in {} blocks; blocks not run here: {}",
            plan.len() - skipped.len(),
            skipped.join(", ")
        ),
    );
    assert!(
        ran >= 30,
        "too few commands ran ({ran}): did a block lose its lines?"
    );
}
