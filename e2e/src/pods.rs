//! The node tier, as a user meets Tether: clusters with a real node each, both charts installed
//! with `helm install --wait` from the project's own image, `tether init` run on the leader and
//! the agent chart installed in each member with exactly the values `tether init` printed.
//! Shared by `tests/nodes.rs` and the sandbox (`make demo`). The process must be in its lab
//! (`tether_testkit::lab::enter()`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use tether_api::ManagedCluster;
use tether_testkit::{TestCluster, Tools, eventually};

/// Namespace of both charts.
pub const NAMESPACE: &str = "tether-system";
/// The image repository the charts default to; the tests import the image under this name.
pub const IMAGE_REPOSITORY: &str = "ghcr.io/tether-dev/tether";

/// The repository root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The charts' appVersion, which is the image tag they default to.
pub fn app_version() -> String {
    let chart = std::fs::read_to_string(repo().join("charts/tether-leader/Chart.yaml")).expect("Chart.yaml");
    chart
        .lines()
        .find_map(|l| l.strip_prefix("appVersion:"))
        .map(|v| v.trim().trim_matches('"').to_string())
        .expect("appVersion")
}

/// A Helm release of one major version (4 is `helm`, 3 is `helm3`).
#[derive(Clone, Debug)]
pub struct Helm {
    /// The binary.
    pub bin: PathBuf,
    /// Its major version, for messages.
    pub major: u8,
}

impl Helm {
    /// Helm 4 (`.tools/bin/helm`).
    pub fn v4() -> Self {
        Self {
            bin: Tools::locate().expect("tools").path("helm"),
            major: 4,
        }
    }

    /// Helm 3 (`.tools/bin/helm3`).
    pub fn v3() -> Self {
        Self {
            bin: Tools::locate().expect("tools").path("helm3"),
            major: 3,
        }
    }

    /// Runs helm against `cluster` from the repository root.
    pub fn run(&self, cluster: &TestCluster, args: &[&str]) -> Output {
        let tmp = std::env::temp_dir().join(format!("tether-helm{}", self.major));
        Command::new(&self.bin)
            .args(args)
            .current_dir(repo())
            .env("KUBECONFIG", cluster.kubeconfig())
            .env("HELM_CACHE_HOME", tmp.join("cache"))
            .env("HELM_CONFIG_HOME", tmp.join("config"))
            .env("HELM_DATA_HOME", tmp.join("data"))
            .output()
            .expect("run helm")
    }

    /// Runs helm and panics with its output unless it succeeds; returns the output.
    pub fn ok(&self, cluster: &TestCluster, args: &[&str]) -> String {
        let o = self.run(cluster, args);
        let out = text(&o);
        assert!(
            o.status.success(),
            "helm {} {}: {out}",
            self.major,
            args.join(" ")
        );
        out
    }

    /// `helm upgrade <chart> charts/<chart> -n tether-system --reuse-values --set <each of sets>
    /// --wait`, which must succeed.
    pub fn upgrade_reusing(&self, cluster: &TestCluster, chart: &str, sets: &[&str]) -> String {
        let path = format!("charts/{chart}");
        let mut args = vec!["upgrade", chart, &path, "-n", NAMESPACE, "--reuse-values"];
        for set in sets {
            args.extend(["--set", set]);
        }
        args.extend(["--wait", "--timeout", "3m"]);
        self.ok(cluster, &args)
    }
}

/// stdout and stderr of a finished command.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Runs a command line as a user would type it (`kubectl …`, `tether …`, `helm …`) against
/// `cluster`, with `KUBECONFIG` pointing at its admin kubeconfig.
pub fn shell(cluster: &TestCluster, line: &str) -> Output {
    let words = words(line);
    // Leading `NAME=value` words set the environment, as in a shell.
    let env_words = words.iter().take_while(|w| w.contains('=')).count();
    let (env, words) = words.split_at(env_words);
    let (program, args) = words.split_first().expect("a command");
    let bin = match program.as_str() {
        "tether" => tether_testkit::controller::binary("tether").expect("tether binary"),
        "kubectl" | "helm" | "helm3" => Tools::locate().expect("tools").path(program),
        other => panic!("unexpected command {other} in {line}"),
    };
    Command::new(bin)
        .args(args)
        .envs(env.iter().filter_map(|w| w.split_once('=')))
        .current_dir(repo())
        .env("KUBECONFIG", cluster.kubeconfig())
        .env("KUBECTL", Tools::locate().expect("tools").path("kubectl"))
        .env("HELM_CACHE_HOME", std::env::temp_dir().join("tether-helm4/cache"))
        .env(
            "HELM_CONFIG_HOME",
            std::env::temp_dir().join("tether-helm4/config"),
        )
        .env("HELM_DATA_HOME", std::env::temp_dir().join("tether-helm4/data"))
        .output()
        .expect("run command")
}

/// Splits a printed command line into words (it has no quotes), joining `\`-continued lines.
pub fn words(line: &str) -> Vec<String> {
    line.replace("\\\n", " ")
        .split_whitespace()
        .filter(|w| *w != "\\")
        .map(str::to_string)
        .collect()
}

/// The printed command that starts with `prefix`, with its continuation lines.
pub fn printed_command(output: &str, prefix: &str) -> String {
    let mut lines = output.lines().skip_while(|l| !l.trim_start().starts_with(prefix));
    let mut cmd = String::new();
    for line in lines.by_ref() {
        let line = line.trim();
        cmd.push_str(line.trim_end_matches('\\'));
        cmd.push(' ');
        if !line.ends_with('\\') {
            break;
        }
    }
    assert!(!cmd.is_empty(), "no `{prefix}` command in:\n{output}");
    cmd
}

/// The pods of a chart's Deployment, as (name, ready) pairs.
pub async fn chart_pods(cluster: &TestCluster, app: &str) -> Vec<(String, bool, Pod)> {
    let pods: Api<Pod> = Api::namespaced(cluster.client().expect("client"), NAMESPACE);
    pods.list(&kube::api::ListParams::default().labels(&format!("app.kubernetes.io/name={app}")))
        .await
        .expect("list pods")
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| {
            let ready = p
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            (p.metadata.name.clone().unwrap_or_default(), ready, p)
        })
        .collect()
}

/// The members of `set` at the leader that are Ready, by name, with their node summaries.
pub async fn ready_members(leader: &TestCluster) -> Vec<(String, String)> {
    let mcs: Api<ManagedCluster> = Api::all(leader.client().expect("client"));
    let mut out: Vec<(String, String)> = mcs
        .list(&Default::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|m| {
            m.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
            })
        })
        .map(|m| {
            let nodes = m
                .status
                .as_ref()
                .and_then(|s| s.nodes.as_ref())
                .map(|n| n.summary.clone())
                .unwrap_or_default();
            (kube::ResourceExt::name_any(&m), nodes)
        })
        .collect();
    out.sort();
    out
}

/// Runs `line`, a `helm` command as printed, with `helm` against `cluster`, adding `--wait`.
fn run_printed(helm: &Helm, cluster: &TestCluster, line: &str) {
    let mut args = words(line);
    assert_eq!(args.first().map(String::as_str), Some("helm"), "{line}");
    args.remove(0);
    args.extend(["--wait".into(), "--timeout".into(), "3m".into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    helm.ok(cluster, &args);
}

/// The two-step join of member `name`, every command as printed: the agent chart installed with
/// no values (an idle agent that says NotJoined), then the `helm upgrade ... -f join.yaml` its
/// NOTES print, with the file `tether init --values-file` wrote on the leader.
fn two_step_join(start: Instant, leader: &TestCluster, name: &str, helm: &Helm, cluster: &TestCluster) {
    step(
        start,
        &format!(
            "helm {} install tether-agent in {name} with no values: an idle agent",
            helm.major
        ),
    );
    helm.ok(
        cluster,
        &[
            "install",
            "tether-agent",
            "charts/tether-agent",
            "-n",
            NAMESPACE,
            "--create-namespace",
            "--wait",
            "--timeout",
            "3m",
        ],
    );
    let idle = text(&shell(cluster, &format!("tether status -n {NAMESPACE}")));
    assert!(idle.contains("NotJoined"), "{idle}");
    let dir = std::env::temp_dir().join(format!("tether-join-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("join dir");
    let file = dir.join("join.yaml").display().to_string();
    let init = shell(
        leader,
        &format!("tether init --clusterset prod -n {NAMESPACE} --values-file {file}"),
    );
    assert!(
        init.status.success(),
        "tether init --values-file: {}",
        text(&init)
    );
    let notes = helm.ok(cluster, &["get", "notes", "tether-agent", "-n", NAMESPACE]);
    let line = printed_command(&notes, "helm upgrade tether-agent")
        .replace("<CLUSTER-NAME>", name)
        .replace(" join.yaml ", &format!(" {file} "));
    step(
        start,
        &format!("  {name} joins with the NOTES' command: {}", line.trim()),
    );
    run_printed(helm, cluster, &line);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A running real-pod fleet: the leader and its members, each a cluster with one node.
pub struct PodFleet {
    /// The leader cluster.
    pub leader: TestCluster,
    /// The members: (name, cluster, the helm used for its agent).
    pub members: Vec<(String, TestCluster, Helm)>,
    /// What `tether init` printed.
    pub init_output: String,
}

/// How the leader chart is installed.
#[derive(Clone, Copy, Default)]
pub struct LeaderInstall<'a> {
    /// More `helm install` arguments (say, [`RESTRICTED_LEADER_VALUES`]).
    pub values: &'a [&'a str],
    /// Package the chart, push it to a local OCI registry and `helm install oci://...` it, as a
    /// release is installed; otherwise install it from the tree.
    pub from_oci: bool,
}

/// The UID OpenShift's restricted-v2 SCC assigns from a namespace's range (the range starts at
/// 1000680000 on a typical cluster).
pub const RESTRICTED_UID: i64 = 1_000_680_000;

/// The leader chart's values that run its pods as the restricted-v2 SCC would: the chart's fixed
/// UID and group dropped (docs/operations.md, "Chart values for production"), and the UID the
/// SCC would inject set in their place, with no group (the root group, as OpenShift runs them).
pub const RESTRICTED_LEADER_VALUES: [&str; 4] = [
    "--set",
    "podSecurityContext.runAsUser=1000680000",
    "--set",
    "podSecurityContext.runAsGroup=null",
];

/// Prints a timed step.
pub fn step(start: Instant, what: &str) {
    eprintln!("[{:>5.1}s] {what}", start.elapsed().as_secs_f64());
}

/// Starts the leader and `members`, each a control plane with one real node, in parallel (the
/// members, or the leader, on the Kubernetes version `make test-compat` names), and prints each
/// one's version and start-up time.
pub async fn start_clusters(
    root: Option<&Path>,
    members: &[&str],
    start: Instant,
) -> (TestCluster, Vec<TestCluster>) {
    step(
        start,
        "starting the leader and members, each a control plane with one real node",
    );
    let builder = |name: &str| {
        let mut b = TestCluster::builder(name).nodes(1);
        // NB: `make test-compat` runs the node tier with the members (or leader) on another
        // Kubernetes version.
        let side = if name == "leader" {
            "TETHER_LEADER_KUBERNETES"
        } else {
            "TETHER_MEMBER_KUBERNETES"
        };
        if let Some(v) = std::env::var(side).ok().filter(|v| !v.is_empty()) {
            b = b.kubernetes(&v);
        }
        match root {
            Some(r) => b.root(r),
            None => b,
        }
    };
    let mut all = futures::future::join_all(
        std::iter::once("leader")
            .chain(members.iter().copied())
            .map(|n| builder(n).start()),
    )
    .await
    .into_iter()
    .map(|c| c.expect("cluster with a node"));
    let leader = all.next().expect("leader");
    let member_clusters: Vec<TestCluster> = all.collect();
    for c in std::iter::once(&leader).chain(&member_clusters) {
        let version = match c.client() {
            Ok(client) => client
                .apiserver_version()
                .await
                .map(|v| v.git_version)
                .unwrap_or_default(),
            Err(_) => String::new(),
        };
        step(
            start,
            &format!(
                "  {} (Kubernetes {version}) ready at {} ({:.1?}, node Ready)",
                c.name(),
                c.url(),
                c.startup_time()
            ),
        );
    }
    (leader, member_clusters)
}

/// Starts the leader and the members (one node each, in parallel), installs the leader chart,
/// runs `tether init`, installs the agent chart in each member with the printed values (member
/// `i` with `helms[i]`; the second in two steps, idle then joined with `init --values-file`'s file),
/// and waits until every member is Ready at the leader.
pub async fn up(
    root: Option<&Path>,
    members: &[(&str, Helm)],
    leader: LeaderInstall<'_>,
    start: Instant,
) -> PodFleet {
    let leader_values = leader.values;
    let from_oci = leader.from_oci;
    let names: Vec<&str> = members.iter().map(|(n, _)| *n).collect();
    let (leader, member_clusters) = start_clusters(root, &names, start).await;

    let leader_url = format!("leaderURL={}", leader.url());
    step(
        start,
        if from_oci {
            "helm install tether-leader oci://... --wait: the packaged chart from a local OCI registry (2 replicas, the image's pods)"
        } else {
            "helm install tether-leader --wait (2 replicas, the image's pods)"
        },
    );
    // From the packaged chart in an OCI registry, as users install a release, or from the tree.
    let registry = if from_oci {
        Some(crate::registry::Registry::start().await)
    } else {
        None
    };
    let (chart, version) = match &registry {
        Some(r) => {
            let helm = Tools::locate().expect("tools").path("helm");
            let reference = r.push_chart(&helm, &repo().join("charts/tether-leader"));
            step(
                start,
                &format!("  the leader chart packaged and pushed: {reference}"),
            );
            (reference, Some(app_version()))
        }
        None => ("charts/tether-leader".to_string(), None),
    };
    let mut install = vec![
        "install",
        "tether-leader",
        &chart,
        "-n",
        NAMESPACE,
        "--create-namespace",
        "--set",
        &leader_url,
        "--wait",
        "--timeout",
        "3m",
    ];
    if let Some(v) = &version {
        install.extend(["--version", v, "--plain-http"]);
    }
    install.extend_from_slice(leader_values);
    Helm::v4().ok(&leader, &install);
    drop(registry);

    step(start, "tether init --clusterset prod");
    let init = shell(&leader, &format!("tether init --clusterset prod -n {NAMESPACE}"));
    let init_output = text(&init);
    assert!(init.status.success(), "tether init: {init_output}");
    let helm_line = printed_command(&init_output, "helm install tether-agent");
    assert!(
        helm_line.contains(&format!("--set parentURL={} ", leader.url())),
        "tether init prints the URL member pods reach (the chart's leaderURL): {helm_line}"
    );

    let mut fleet_members = Vec::new();
    for (i, ((name, helm), cluster)) in members.iter().zip(member_clusters).enumerate() {
        if i == 1 {
            two_step_join(start, &leader, name, helm, &cluster);
            fleet_members.push((name.to_string(), cluster, helm.clone()));
            continue;
        }
        step(
            start,
            &format!(
                "helm {} install tether-agent in {name}, exactly as tether init printed it, --wait",
                helm.major
            ),
        );
        let line = helm_line.replace("<CLUSTER-NAME>", name);
        run_printed(helm, &cluster, &line);
        fleet_members.push((name.to_string(), cluster, helm.clone()));
    }

    step(start, "waiting until every member is Ready at the leader");
    let want: Vec<String> = members.iter().map(|(n, _)| n.to_string()).collect();
    eventually(
        "every member Ready at the leader",
        Duration::from_secs(90),
        || async {
            let ready = ready_members(&leader).await;
            let names: Vec<String> = ready.iter().map(|(n, _)| n.clone()).collect();
            if names == want {
                Ok(())
            } else {
                Err(format!("{ready:?}"))
            }
        },
    )
    .await;
    step(start, "every member joined");
    PodFleet {
        leader,
        members: fleet_members,
        init_output,
    }
}

/// Lets the leader's admin (`tether-admin`) into member `name` through the leader: the agent's
/// allow-list (`helm upgrade --set proxy.impersonate.users={tether-admin}`) and `role` bound to
/// `tether:prod:tether-admin` there, with `sets` (more `--set` values) in the same upgrade. Waits until the new agent pod's tunnel answers
/// `tether --cluster <name> -- get pods` on the leader; returns that pod's name.
pub async fn allow_leader_admin(
    leader: &TestCluster,
    name: &str,
    member: &TestCluster,
    helm: &Helm,
    role: &str,
    sets: &[&str],
) -> String {
    let mut all = vec!["proxy.impersonate.users={tether-admin}"];
    all.extend(sets);
    helm.upgrade_reusing(member, "tether-agent", &all);
    let o = shell(
        member,
        &format!(
            "kubectl create clusterrolebinding leader-admin --clusterrole={role} --user=tether:prod:tether-admin"
        ),
    );
    assert!(o.status.success(), "{}", text(&o));
    eventually(
        &format!("{name}'s new agent pod answers through the leader"),
        Duration::from_secs(90),
        || async {
            let pods = chart_pods(member, "tether-agent").await;
            match pods.as_slice() {
                [(pod, true, _)] => {
                    let o = shell(
                        leader,
                        &format!("tether --cluster {name} -- get pods -n {NAMESPACE} -o name"),
                    );
                    if o.status.success() && text(&o).contains(pod.as_str()) {
                        Ok(pod.clone())
                    } else {
                        Err(text(&o))
                    }
                }
                _ => Err(format!("{} agent pods", pods.len())),
            }
        },
    )
    .await
}

/// UID of every ManagedCluster and the number of registration requests at the leader: a second
/// registration of the same member would change either.
pub async fn identities(leader: &TestCluster) -> (std::collections::BTreeMap<String, String>, usize) {
    let client = leader.client().expect("client");
    let mcs = Api::<ManagedCluster>::all(client.clone())
        .list(&Default::default())
        .await
        .expect("list mcls");
    let requests = Api::<tether_api::ClusterRegistrationRequest>::all(client)
        .list(&Default::default())
        .await
        .expect("list requests");
    (
        mcs.items
            .iter()
            .map(|m| {
                (
                    kube::ResourceExt::name_any(m),
                    kube::ResourceExt::uid(m).unwrap_or_default(),
                )
            })
            .collect(),
        requests.items.len(),
    )
}
