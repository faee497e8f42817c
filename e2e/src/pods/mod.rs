//! The node tier, as a user meets Tether: clusters with a real node each, both charts installed
//! with `helm install --wait` from the project's own image, `tether init` run on the leader and
//! the agent chart installed in each member with exactly the values `tether init` printed.
//! Shared by `tests/nodes.rs` and the sandbox (`make demo`). The process must be in its lab
//! (`tether_testkit::lab::enter()`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use tether_api::ManagedCluster;
use tether_testkit::{TestCluster, Tools, eventually};

mod up;

pub use up::{LeaderInstall, PodFleet, RESTRICTED_LEADER_VALUES, RESTRICTED_UID, start_clusters, step, up};

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
