//! Liveness from the tunnel, on real clusters: a leader serving member access with short ping
//! timings, two members whose agents hold tunnels and one whose agent has member access off.
//!
//! - Members with a tunnel are Ready on it (`TunnelAlive`) and renew their heartbeat Lease only
//!   at the long interval; the member without one stays Ready on its Lease at the short one; no
//!   agent writes its announce at all.
//! - A killed agent is `Ready=Unknown` (`TunnelLost`) within the set's detection time; a frozen
//!   one (its tunnel open, answering nothing) within the ping timeout; each is Ready again when
//!   it comes back.
//! - The leader's API server restarted for longer than the detection time and the grace period,
//!   and the leading replica killed for a standby: no member is marked Unknown, and every
//!   tunnel attaches again.
//!
//! This binary has its own `main` (libtest-mimic): the leader's proxy listens on the lab bridge.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::Client;
use kube::ResourceExt;
use kube::api::Api;
use serde_json::json;
use tether_api::clusterset::LeaderSpec;
use tether_api::conditions::{ConditionType, find};
use tether_api::{ManagedCluster, MemberClusterAnnounce};
use tether_e2e::access::wait_tunnel;
use tether_e2e::fleet::{self, LeaderSide, duration, managed};
use tether_e2e::sim::{join_token, ns_of};
use tether_testkit::{TestCluster, eventually, free_port, lab};

fn main() -> ExitCode {
    tether_e2e::lab_main(
        "the liveness test",
        "members_are_judged_by_their_tunnels_and_leases_and_the_leaders_own_faults_blame_none",
        liveness,
    )
}

fn step(what: &str) {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let t = START.get_or_init(Instant::now).elapsed();
    eprintln!("== [{:6.1}s] {what}", t.as_secs_f64());
}

/// The set's timings: pings every second, lost after two unanswered (detection 3 s); a member
/// without a tunnel renews every 2 s and is lost after 6 s.
const PING: Duration = Duration::from_secs(1);
const DETECTION: Duration = Duration::from_secs(3);
/// What the leader may take beyond the detection time to see and write it (its reconcile, the
/// status write, and this test's polling).
const SLACK: Duration = Duration::from_secs(3);

fn policy() -> LeaderSpec {
    LeaderSpec {
        tunnel_heartbeat_interval: duration("1m"),
        tunnel_ping_interval: PING.into(),
        tunnel_ping_misses: 2,
        ..fleet::policy("2s", "6s")
    }
}

/// Member `name`'s Ready condition: status and reason.
async fn ready(admin: &Client, name: &str) -> Result<(String, String), String> {
    let mc = managed(admin, name).await?;
    let c = mc
        .status
        .as_ref()
        .and_then(|s| find(&s.conditions, ConditionType::Ready))
        .ok_or("no Ready condition")?;
    Ok((c.status.clone(), c.reason.clone()))
}

async fn wait_ready(admin: &Client, name: &str, status: &str, reason: &str, within: Duration) -> Duration {
    let start = Instant::now();
    eventually(&format!("{name}: Ready={status} ({reason})"), within, || async {
        match ready(admin, name).await? {
            (s, r) if s == status && r == reason => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    start.elapsed()
}

/// Watches every member in `names` for `window`, and fails at the first one not `Ready=True`.
async fn never_unknown(admin: &Client, names: &[&str], window: Duration, what: &str) {
    let start = Instant::now();
    while start.elapsed() < window {
        for name in names {
            // NB: a read can fail while the leader's own API server is away; only what it says counts.
            if let Ok((status, reason)) = ready(admin, name).await
                && status != "True"
            {
                let conditions = managed(admin, name)
                    .await
                    .ok()
                    .and_then(|mc| mc.status)
                    .map(|s| s.conditions);
                panic!(
                    "{what}: {name} was marked {status} ({reason}) {:.1?} in; its conditions: {conditions:#?}",
                    start.elapsed()
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Watches every ManagedCluster and records, per member, each Ready reason it showed, in order
/// (a version that repeats the last reason adds nothing).
fn ready_reasons(admin: &Client) -> (tokio::task::JoinHandle<()>, Reasons) {
    use futures::StreamExt;
    use kube::runtime::watcher::{Config, Event, watcher};
    let seen = Reasons::default();
    let (api, record) = (Api::<ManagedCluster>::all(admin.clone()), seen.clone());
    let task = tokio::spawn(async move {
        let mut events = std::pin::pin!(watcher(api, Config::default()));
        while let Some(event) = events.next().await {
            let (Ok(Event::Apply(mc)) | Ok(Event::InitApply(mc))) = event else {
                continue;
            };
            let Some(ready) = mc
                .status
                .as_ref()
                .and_then(|s| find(&s.conditions, ConditionType::Ready))
            else {
                continue;
            };
            let mut seen = record.lock().expect("lock");
            let reasons = seen.entry(mc.name_any()).or_default();
            if reasons.last() != Some(&ready.reason) {
                reasons.push(ready.reason.clone());
            }
        }
    });
    (task, seen)
}

type Reasons = std::sync::Arc<std::sync::Mutex<std::collections::BTreeMap<String, Vec<String>>>>;

async fn lease_renewed(admin: &Client, name: &str) -> Option<String> {
    Api::<Lease>::namespaced(admin.clone(), &ns_of(name))
        .get(name)
        .await
        .ok()?
        .spec?
        .renew_time
        .map(|t| t.0.to_string())
}

/// How many times each member in `names` renewed its Lease during `window` (sampled twice a second).
async fn renewals(admin: &Client, names: &[&str], window: Duration) -> Vec<usize> {
    let mut last: Vec<Option<String>> = Vec::new();
    for name in names {
        last.push(lease_renewed(admin, name).await);
    }
    let mut counts = vec![0; names.len()];
    let start = Instant::now();
    while start.elapsed() < window {
        tokio::time::sleep(Duration::from_millis(500)).await;
        for (i, name) in names.iter().enumerate() {
            let now = lease_renewed(admin, name).await;
            if now.is_some() && now != last[i] {
                counts[i] += 1;
                last[i] = now;
            }
        }
    }
    counts
}

async fn announce_version(admin: &Client, name: &str) -> String {
    Api::<MemberClusterAnnounce>::namespaced(admin.clone(), &ns_of(name))
        .get(name)
        .await
        .expect("announce")
        .metadata
        .resource_version
        .unwrap_or_default()
}

async fn liveness() {
    let cluster = TestCluster::builder("live-leader")
        .start()
        .await
        .expect("leader cluster");
    let addr = |port| std::net::SocketAddr::from((lab::GATEWAY, port));
    let (port_a, port_b) = (free_port().expect("port"), free_port().expect("port"));
    let mut leader: LeaderSide = LeaderSide::on(cluster)
        .policy(policy())
        .proxy(addr(port_a), 4)
        .start()
        .await;
    let admin = leader.admin.clone();
    let token = join_token(&admin).await;
    let (watching, reasons) = ready_reasons(&admin);
    let (east, west, north) = futures::join!(
        fleet::member("east", &leader, &token, json!({})),
        fleet::member("west", &leader, &token, json!({})),
        fleet::member_with_args("north", &leader, &token, json!({}), &["--tunnel=false"]),
    );
    let (mut east, west) = (east, west);

    step("members with a tunnel are Ready on it; the one without is Ready on its Lease");
    for m in ["east", "west"] {
        wait_tunnel(&leader, m, "True").await;
        wait_ready(&admin, m, "True", "TunnelAlive", Duration::from_secs(60)).await;
    }
    wait_ready(
        &admin,
        "north",
        "True",
        "HeartbeatReceived",
        Duration::from_secs(60),
    )
    .await;
    // NB: an agent with member access sends its first renewal once its tunnel attached, so the
    // leader declares it Ready on both at once: one status write, never HeartbeatReceived first.
    watching.abort();
    let reasons = reasons.lock().expect("lock").clone();
    for (m, first) in [
        ("east", "TunnelAlive"),
        ("west", "TunnelAlive"),
        ("north", "HeartbeatReceived"),
    ] {
        assert_eq!(
            reasons.get(m),
            Some(&vec![first.to_string()]),
            "{m}'s Ready reasons as it joined"
        );
    }
    let announces =
        futures::future::join_all(["east", "west", "north"].map(|m| announce_version(&admin, m))).await;

    step("the member without a tunnel stays Ready on its Lease for three grace periods, renewing every 2 s");
    let (renewals, ()) = futures::join!(
        renewals(&admin, &["east", "north"], Duration::from_secs(18)),
        never_unknown(
            &admin,
            &["east", "west", "north"],
            Duration::from_secs(18),
            "steady"
        ),
    );
    eprintln!(
        "Lease renewals seen in 18 s: east (tunnel) {}, north (no tunnel) {}",
        renewals[0], renewals[1]
    );
    assert!(
        renewals[1] >= 6,
        "north renews its Lease every 2 s: {}",
        renewals[1]
    );
    assert!(
        renewals[0] <= 1,
        "east renews at the 1 m interval: {}",
        renewals[0]
    );
    let after =
        futures::future::join_all(["east", "west", "north"].map(|m| announce_version(&admin, m))).await;
    assert_eq!(announces, after, "no agent writes its announce");

    step("a killed agent is Unknown (TunnelLost) within the detection time");
    east.kill_agent();
    let seen = wait_ready(&admin, "east", "Unknown", "TunnelLost", DETECTION + SLACK + SLACK).await;
    eprintln!("killed agent: Ready=Unknown after {seen:.1?} (detection {DETECTION:?})");
    assert!(seen <= DETECTION + SLACK, "killed agent seen after {seen:?}");
    wait_tunnel(&leader, "east", "False").await;
    east.start_agent();
    wait_ready(&admin, "east", "True", "TunnelAlive", Duration::from_secs(60)).await;

    step("a frozen agent (its tunnel open, answering nothing) is Unknown within the ping timeout");
    let pid = west.agent.as_ref().expect("west's agent").pid();
    signal(pid, "STOP");
    let seen = wait_ready(&admin, "west", "Unknown", "TunnelLost", DETECTION + SLACK + SLACK).await;
    eprintln!(
        "silent agent: Ready=Unknown after {seen:.1?} (ping {PING:?}, timeout {:?})",
        DETECTION - PING
    );
    assert!(seen <= DETECTION + SLACK, "silent agent seen after {seen:?}");
    signal(pid, "CONT");
    wait_ready(&admin, "west", "True", "TunnelAlive", Duration::from_secs(60)).await;
    let names = ["east", "west", "north"];
    never_unknown(&admin, &names, Duration::from_secs(3), "settled").await;

    step("the leader's API server is away for 10 s (past detection and grace): no member is Unknown");
    leader.cluster.stop_api_server();
    tokio::time::sleep(Duration::from_secs(10)).await;
    leader.cluster.start_api_server().await.expect("API server back");
    never_unknown(
        &admin,
        &names,
        Duration::from_secs(60),
        "after the API server restart",
    )
    .await;
    for m in ["east", "west"] {
        wait_tunnel(&leader, m, "True").await;
    }

    step("the leading replica is killed: the standby takes over and no member is Unknown");
    let args = fleet::proxy_args(addr(port_b), 4, &[]);
    let b = leader.start_replica("leader-b", &args).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let killed = Instant::now();
    leader.controller.kill();
    never_unknown(&admin, &names, Duration::from_secs(60), "after the handover").await;
    eventually(
        "both tunnels attached to the new leader",
        Duration::from_secs(30),
        || async {
            let (_, text) = b.admin_get("/metrics").await.map_err(|e| e.to_string())?;
            match tether_e2e::probe::prom::metric(&text, "tether_leader_tunnels") {
                Some(2.0) => Ok(()),
                other => Err(format!("tunnels at the new leader: {other:?}")),
            }
        },
    )
    .await;
    eprintln!(
        "handover: every member Ready throughout the {:.0?} after the kill",
        killed.elapsed()
    );
    step("done");
    drop((east, west, north, b));
}

/// Sends `SIGSTOP` or `SIGCONT` to process `pid`.
fn signal(pid: u32, which: &str) {
    let ok = std::process::Command::new("kill")
        .arg(format!("-{which}"))
        .arg(pid.to_string())
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill -{which} {pid}");
}
