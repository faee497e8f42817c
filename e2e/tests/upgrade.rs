//! An upgrade from an earlier release on real nodes (`make test-upgrade FROM=v0.1.0`): that
//! release's image and charts (built by `e2e/upgrade.sh` in a worktree of the tag) run a leader
//! and two members, with traffic through the leader to each member all along. Then the leader is
//! upgraded to this tree's chart and image, and the old agents must keep heartbeating, renewing
//! their credentials and serving member access; then one agent is upgraded, then the other; then
//! one is downgraded again. Throughout, no member may leave Ready, nothing may register twice
//! and no member may stay unreachable longer than a reconnect.
//!
//! Needs `TETHER_UPGRADE_FROM_DIR` (the worktree, with its `target/images/tether.tar` imported
//! through `TETHER_EXTRA_IMAGES`); ignored by a plain `cargo test`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tether_api::{ClusterSet, ManagedCluster};
use tether_e2e::pods::{self, Helm, NAMESPACE, chart_pods, printed_command, step, text, words};
use tether_testkit::{TestCluster, eventually};

const MEMBERS: [&str; 2] = ["east", "west"];
/// Longest a member may be unreachable through the leader: a leader pod's restart and the
/// agent's reconnect (the old agents back off up to a minute).
const MAX_OUTAGE: Duration = Duration::from_secs(90);

fn main() -> ExitCode {
    tether_e2e::long_lab_main(
        "the upgrade test",
        "an_upgrade_from_the_previous_release_keeps_every_member",
        upgrade,
    )
}

/// The earlier release's worktree.
fn from_dir() -> PathBuf {
    std::env::var_os("TETHER_UPGRADE_FROM_DIR")
        .map(PathBuf::from)
        .expect("TETHER_UPGRADE_FROM_DIR: run `make test-upgrade FROM=v0.1.0`")
}

/// What the observer saw, per member.
#[derive(Default, Debug)]
struct Seen {
    /// Times a member's Ready was not True.
    not_ready: Vec<String>,
    /// Current run of failed probes through the leader, and the longest one.
    down_since: BTreeMap<String, Instant>,
    longest_outage: BTreeMap<String, Duration>,
    probes: usize,
}

/// Every second: each member's Ready at the leader, and a request to its API server through
/// the leader (`/version`, as the leader's admin).
fn observe(leader: Client, seen: Arc<Mutex<Seen>>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            for name in MEMBERS {
                let ns = tether_e2e::sim::ns_of(name);
                let mc = Api::<ManagedCluster>::namespaced(leader.clone(), &ns)
                    .get(name)
                    .await;
                let ready = mc.as_ref().ok().and_then(|mc| {
                    let s = mc.status.as_ref()?;
                    s.conditions
                        .iter()
                        .find(|c| c.type_ == "Ready")
                        .map(|c| c.status.clone())
                });
                let path = format!("{}/version", tether_tunnel::proxy_path(&ns, name));
                let req = http::Request::get(path).body(Vec::new()).expect("request");
                let reached = leader
                    .request_text(req)
                    .await
                    .is_ok_and(|b| b.contains("gitVersion"));
                let mut s = seen.lock().expect("lock");
                s.probes += 1;
                if mc.is_ok() && ready.as_deref() != Some("True") {
                    s.not_ready
                        .push(format!("{} {name}: Ready={ready:?}", Timestamp::now()));
                }
                if reached {
                    if let Some(since) = s.down_since.remove(name) {
                        let d = since.elapsed();
                        let longest = s.longest_outage.entry(name.to_string()).or_default();
                        *longest = (*longest).max(d);
                        eprintln!("  {name} reachable through the leader again after {d:.1?}");
                    }
                } else {
                    s.down_since.entry(name.to_string()).or_insert_with(Instant::now);
                }
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    })
}

/// The credential expiry the member's agent reports on its ClusterSet.
async fn credential_expiry(member: &TestCluster) -> Option<String> {
    let set = Api::<ClusterSet>::namespaced(member.client().ok()?, NAMESPACE)
        .get("prod")
        .await
        .ok()?;
    Some(set.status?.membership?.credential_expiry?.0.to_string())
}

/// The tether-agent image tag running in `member`.
async fn agent_image(member: &TestCluster) -> String {
    chart_pods(member, "tether-agent")
        .await
        .into_iter()
        .filter(|(_, ready, _)| *ready)
        .filter_map(|(_, _, p)| p.spec?.containers.first()?.image.clone())
        .collect::<Vec<_>>()
        .join(",")
}

fn helm_upgrade(helm: &Helm, cluster: &TestCluster, release: &str, chart: &Path) -> String {
    helm.ok(
        cluster,
        &[
            "upgrade",
            release,
            &chart.display().to_string(),
            "-n",
            NAMESPACE,
            "--reset-then-reuse-values",
            "--wait",
            "--timeout",
            "4m",
        ],
    )
}

async fn all_ready_with(leader: &TestCluster, members: &[(&str, &TestCluster)], image: &str, what: &str) {
    for (name, cluster) in members {
        eventually(&format!("{name}: {what}"), Duration::from_secs(180), || async {
            let running = agent_image(cluster).await;
            let ready: Vec<String> = pods::ready_members(leader)
                .await
                .into_iter()
                .map(|(n, _)| n)
                .collect();
            if running.ends_with(image) && !running.contains(',') && ready.iter().any(|n| n == name) {
                Ok(())
            } else {
                Err(format!("agent image {running:?}, Ready members {ready:?}"))
            }
        })
        .await;
    }
}

async fn upgrade() {
    let start = Instant::now();
    let old = from_dir();
    let new = pods::repo();
    let old_tag = chart_version(&old);
    let new_tag = chart_version(&new);
    step(start, &format!("from {old_tag} ({}) to {new_tag}", old.display()));
    let helm = Helm::v4();

    step(
        start,
        "three clusters with a real node each (both images imported)",
    );
    let mut clusters = futures::future::join_all(
        ["leader", "east", "west"].map(|n| TestCluster::builder(n).nodes(1).start()),
    )
    .await
    .into_iter()
    .map(|c| c.expect("cluster with a node"));
    let leader = clusters.next().expect("leader");
    let members: Vec<(String, TestCluster)> = MEMBERS
        .iter()
        .map(|n| (n.to_string(), clusters.next().expect("member")))
        .collect();
    let admin = leader.client().expect("admin");

    step(start, &format!("helm install tether-leader {old_tag}"));
    helm.ok(
        &leader,
        &[
            "install",
            "tether-leader",
            &old.join("charts/tether-leader").display().to_string(),
            "-n",
            NAMESPACE,
            "--create-namespace",
            "--set",
            &format!("leaderURL={}", leader.url()),
            "--wait",
            "--timeout",
            "4m",
        ],
    );
    step(
        start,
        &format!("tether init ({old_tag}'s CLI), credentialTTL 10m so renewals happen during the test"),
    );
    let old_cli = old.join("target/x86_64-unknown-linux-musl/release/tether");
    let init = Command::new(&old_cli)
        .args(["init", "--clusterset", "prod", "-n", NAMESPACE])
        .env("KUBECONFIG", leader.kubeconfig())
        .output()
        .expect("old tether init");
    let printed = text(&init);
    assert!(init.status.success(), "tether init: {printed}");
    Api::<ClusterSet>::namespaced(admin.clone(), NAMESPACE)
        .patch(
            "prod",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"leader": {"credentialTTL": "10m"}}})),
        )
        .await
        .expect("credentialTTL");
    let helm_line = printed_command(&printed, "helm install tether-agent");
    for (name, cluster) in &members {
        step(
            start,
            &format!("helm install tether-agent {old_tag} in {name}, as {old_tag}'s init printed it"),
        );
        let mut args = words(&helm_line.replace("<CLUSTER-NAME>", name));
        assert_eq!(args.remove(0), "helm");
        for a in args.iter_mut() {
            if a == "charts/tether-agent" {
                *a = old.join("charts/tether-agent").display().to_string();
            }
        }
        args.extend(
            [
                "--set",
                "proxy.impersonate.users={tether-admin}",
                "--wait",
                "--timeout",
                "4m",
            ]
            .map(String::from),
        );
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        helm.ok(cluster, &args);
    }
    let both: Vec<(&str, &TestCluster)> = members.iter().map(|(n, c)| (n.as_str(), c)).collect();
    all_ready_with(&leader, &both, &old_tag, &format!("Ready on {old_tag}")).await;
    let before = pods::identities(&leader).await;
    let joined = Timestamp::now();
    let seen = Arc::new(Mutex::new(Seen::default()));
    step(
        start,
        "member access through the leader works, and is probed every second from now on",
    );
    eventually(
        "both members answer through the leader",
        Duration::from_secs(120),
        || async {
            for name in MEMBERS {
                let ns = tether_e2e::sim::ns_of(name);
                let path = format!("{}/version", tether_tunnel::proxy_path(&ns, name));
                let req = http::Request::get(path).body(Vec::new()).expect("request");
                admin
                    .request_text(req)
                    .await
                    .map_err(|e| format!("{name}: {e}"))?;
            }
            Ok::<(), String>(())
        },
    )
    .await;
    let watcher = observe(admin.clone(), seen.clone());

    step(
        start,
        &format!("helm upgrade tether-leader to {new_tag} (the agents stay on {old_tag})"),
    );
    helm_upgrade(&helm, &leader, "tether-leader", &new.join("charts/tether-leader"));
    eventually(
        "the leader pods run the new image",
        Duration::from_secs(120),
        || async {
            let images: Vec<String> = chart_pods(&leader, "tether-leader")
                .await
                .into_iter()
                .filter(|(_, ready, _)| *ready)
                .filter_map(|(_, _, p)| p.spec?.containers.first()?.image.clone())
                .collect();
            if !images.is_empty() && images.iter().all(|i| i.ends_with(&new_tag)) {
                Ok(())
            } else {
                Err(format!("{images:?}"))
            }
        },
    )
    .await;
    step(
        start,
        &format!("the {old_tag} agents renew their credentials under the {new_tag} leader"),
    );
    for (name, cluster) in &members {
        let first = credential_expiry(cluster).await;
        eventually(
            &format!("{name} renews (credentialTTL 10m: at about 6.7 min after joining)"),
            Duration::from_secs(540),
            || async {
                let now = credential_expiry(cluster).await;
                if now.is_some() && now != first {
                    Ok(())
                } else {
                    Err(format!("expiry still {now:?} (joined {joined})"))
                }
            },
        )
        .await;
    }
    all_ready_with(&leader, &both, &old_tag, &format!("still Ready on {old_tag}")).await;

    for (name, cluster) in &members {
        step(
            start,
            &format!("helm upgrade tether-agent in {name} to {new_tag}"),
        );
        helm_upgrade(&helm, cluster, "tether-agent", &new.join("charts/tether-agent"));
        all_ready_with(
            &leader,
            &[(name.as_str(), cluster)],
            &new_tag,
            &format!("Ready on {new_tag}"),
        )
        .await;
    }
    let (east_name, east) = &members[0];
    step(
        start,
        &format!("helm upgrade tether-agent in {east_name} back to {old_tag} (a downgrade)"),
    );
    helm_upgrade(&helm, east, "tether-agent", &old.join("charts/tether-agent"));
    all_ready_with(
        &leader,
        &[(east_name.as_str(), east)],
        &old_tag,
        &format!("Ready on {old_tag} again"),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(20)).await;
    watcher.abort();

    step(start, "judging what the observer saw");
    let after = pods::identities(&leader).await;
    assert_eq!(
        after, before,
        "no member registered twice (ManagedCluster UIDs, request count)"
    );
    let seen = seen.lock().expect("lock");
    eprintln!(
        "  {} probes; longest unreachable through the leader: {:?}; still down: {:?}",
        seen.probes,
        seen.longest_outage,
        seen.down_since.keys().collect::<Vec<_>>()
    );
    assert!(
        seen.not_ready.is_empty(),
        "a member left Ready: {:?}",
        seen.not_ready
    );
    assert!(
        seen.down_since.is_empty(),
        "unreachable at the end: {:?}",
        seen.down_since
    );
    for (name, d) in &seen.longest_outage {
        assert!(
            *d <= MAX_OUTAGE,
            "{name} was unreachable through the leader for {d:?}"
        );
    }
    step(start, "done");
}

/// The chart version (= image tag) of a tree.
fn chart_version(root: &Path) -> String {
    let chart = std::fs::read_to_string(root.join("charts/tether-leader/Chart.yaml")).expect("Chart.yaml");
    chart
        .lines()
        .find_map(|l| l.strip_prefix("appVersion:"))
        .map(|v| v.trim().trim_matches('"').to_string())
        .expect("appVersion")
}
