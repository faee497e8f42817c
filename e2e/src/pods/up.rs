//! Bringing the node tier up: the clusters started in parallel, the leader chart installed and
//! `tether init` run, then each member joined with exactly the commands that were printed.

use std::path::Path;
use std::time::{Duration, Instant};
use tether_testkit::{TestCluster, Tools, eventually};

use super::{Helm, NAMESPACE, app_version, printed_command, ready_members, repo, shell, text, words};

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
