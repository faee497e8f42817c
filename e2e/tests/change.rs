//! The leader's address changes under a running fleet: members joined at an old URL (a TCP
//! forwarder, reached as `localhost`), the leader is restarted with `--leader-url` set to a new
//! one (as `helm upgrade --set leaderURL=...` does), it rewrites the `cluster-info` it published,
//! every agent re-reads it over its verified connection and moves, and when the old address is
//! removed the members stay Ready, also across an agent restart. A published URL members cannot
//! reach is tried, then given up for the declared one.
//!
//! The leader's serving CA rotates under a running fleet (the testkit's PKI, a second CA): the
//! leader publishes both CAs, members take the bundle over their verified connection, the API
//! server restarts with a certificate of the new CA, a new member joins with the new pin (which
//! `tether init --ca-file` prints), and the old CA goes; no member leaves Ready.

use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use serde_json::json;
use tether_api::ManagedCluster;
use tether_e2e::fleet::{self, LeaderSide, MemberSide, policy, ready, wait_ready};
use tether_testkit::controller::binary;
use tether_testkit::eventually;
use tether_testkit::pki::Pki;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

/// A TCP forwarder from a port of its own to `target`: the old address. Dropping it (or
/// `close`) removes the address and cuts every connection through it.
struct Forwarder {
    port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl Forwarder {
    async fn start(target: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let task = tokio::spawn(async move {
            let mut conns = JoinSet::new();
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    return;
                };
                let target = target.clone();
                conns.spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(&target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        Self { port, task }
    }

    /// Removes the address: no new connection, and every open one is cut (the JoinSet aborts
    /// its tasks when the accept task is aborted).
    fn close(self) {
        self.task.abort();
    }
}

async fn moved_to(m: &MemberSide) -> Option<String> {
    m.set().await?.status?.membership?.leader_url
}

#[tokio::test]
async fn members_follow_a_new_leader_url_and_stay_ready_when_the_old_address_goes() {
    let mut leader = LeaderSide::named("url-leader")
        .policy(policy("2s", "8s"))
        .start()
        .await;
    let new_url = leader.cluster.url().to_string();
    let api_addr = new_url.trim_start_matches("https://").to_string();
    let old = Forwarder::start(api_addr).await;
    // NB: `localhost` is in the test API server's certificate; the member verifies it.
    let old_url = format!("https://localhost:{}", old.port);
    let leader_args = |url: &str| {
        vec![
            "leader".to_string(),
            "--leader-elect=false".to_string(),
            format!("--leader-url={url}"),
        ]
    };
    leader.controller.terminate();
    leader.controller = leader
        .start_replica("tether-leader", &leader_args(&old_url))
        .await;
    eventually(
        "cluster-info names the old URL",
        Duration::from_secs(30),
        || async {
            match tether_join::discovery::published_url(&leader.admin).await {
                Some(u) if u == old_url => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;

    let token = tether_e2e::sim::join_token(&leader.admin).await;
    let spec = json!({"leaderURL": old_url});
    let args = ["--leader-url-check-interval=2s"];
    let (east, mut west) = tokio::join!(
        fleet::member_with_args("east", &leader, &token, spec.clone(), &args),
        fleet::member_with_args("west", &leader, &token, spec.clone(), &args),
    );
    for name in ["east", "west"] {
        wait_ready(&leader.admin, name).await;
    }

    // A URL members cannot reach (a mistyped value): they try it, then go back to the declared
    // one and stay Ready; it is not followed again.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").expect("port");
    let dead_url = format!("https://localhost:{}", dead.local_addr().expect("addr").port());
    drop(dead);
    leader.controller.terminate();
    leader.controller = leader
        .start_replica("tether-leader", &leader_args(&dead_url))
        .await;
    let east_log = || east.agent.as_ref().map(|a| a.log()).unwrap_or_default();
    eventually(
        "east tried the unreachable URL and went back",
        Duration::from_secs(90),
        || async {
            let log = east_log();
            if log.contains("back to the declared one") {
                Ok(())
            } else {
                Err(log.lines().rev().take(3).collect::<Vec<_>>().join("\n"))
            }
        },
    )
    .await;
    heartbeats_after(
        &leader,
        &["east", "west"],
        Timestamp::now(),
        "on the declared URL again",
    )
    .await;

    // `helm upgrade --set leaderURL=<new>`: the leader restarts with the new URL.
    leader.controller.terminate();
    leader.controller = leader
        .start_replica("tether-leader", &leader_args(&new_url))
        .await;
    let started = Instant::now();
    for m in [&east, &west] {
        eventually(
            "the agent follows the new URL",
            Duration::from_secs(60),
            || async {
                match moved_to(m).await {
                    Some(u) if u == new_url => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            },
        )
        .await;
    }
    eprintln!(
        "both agents use the new URL {:.1?} after the leader's restart",
        started.elapsed()
    );

    // The old address goes: nothing reaches the leader through it any more.
    old.close();
    heartbeats_after(
        &leader,
        &["east", "west"],
        Timestamp::now(),
        "after the old address went",
    )
    .await;
    // An agent restarted now starts on the URL it learned (its status), not the dead one.
    west.kill_agent();
    west.start_agent();
    heartbeats_after(&leader, &["west"], Timestamp::now(), "after its restart").await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    for name in ["east", "west"] {
        let mc = fleet::managed(&leader.admin, name).await.expect("member");
        assert_eq!(ready(&mc).as_deref(), Some("True"), "{name}: {:?}", mc.status);
    }
    for m in [&east, &west] {
        let s = m.set().await.and_then(|s| s.status).expect("status");
        assert_eq!(s.state.as_deref(), Some("Ready"), "{s:?}");
        let spec_url = m.set().await.and_then(|s| s.spec.member).map(|m| m.leader_url);
        assert_eq!(
            spec_url.as_deref(),
            Some(old_url.as_str()),
            "the declared URL is untouched"
        );
    }
}

/// When `mc` last changed Ready (a member that never left Ready keeps its first one).
fn ready_since(mc: &ManagedCluster) -> Option<String> {
    mc.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready" && c.status == "True")
        .map(|c| c.last_transition_time.0.to_string())
}

/// Restarts the leader controller as `helm upgrade --set-file leaderCA=<file>` rolls it.
async fn restart_leader_with_ca(leader: &mut LeaderSide, file: &std::path::Path) {
    leader.controller.terminate();
    let args = vec![
        "leader".to_string(),
        "--leader-elect=false".to_string(),
        format!("--leader-ca-file={}", file.display()),
    ];
    leader.controller = leader.start_replica("tether-leader", &args).await;
}

/// Waits until every one of `members` trusts exactly the CAs `pins` (its status says so).
async fn trusting(members: &[&MemberSide], pins: &[&str]) {
    let mut want: Vec<String> = pins.iter().map(|p| p.to_string()).collect();
    want.sort();
    for m in members {
        eventually(
            &format!("{} trusts {want:?}", m.cluster.name()),
            Duration::from_secs(60),
            || async {
                let have = m
                    .set()
                    .await
                    .and_then(|s| s.status?.membership)
                    .map(|m| m.leader_cas)
                    .unwrap_or_default();
                if have == want {
                    Ok(())
                } else {
                    Err(format!("{have:?}"))
                }
            },
        )
        .await;
    }
}

async fn heartbeats_after(leader: &LeaderSide, names: &[&str], since: Timestamp, what: &str) {
    for name in names {
        eventually(
            &format!("{name} heartbeats {what}"),
            Duration::from_secs(60),
            || async {
                if fleet::renewed_after(&leader.admin, name, since).await {
                    Ok(())
                } else {
                    Err("no heartbeat yet".to_string())
                }
            },
        )
        .await;
    }
}

#[tokio::test]
async fn the_leaders_serving_ca_rotates_with_an_overlap_and_no_member_leaves_ready() {
    let mut leader = LeaderSide::named("ca-leader")
        .policy(policy("2s", "30s"))
        .start()
        .await;
    let dir = leader.cluster.dir().to_path_buf();
    let (old_ca, old_pin) = (
        leader.cluster.ca_pem().to_string(),
        leader.cluster.ca_cert_hash().to_string(),
    );
    let new = Pki::generate("ca-leader-next").expect("a second CA");
    let new_pin = new.ca_cert_hash.clone();
    let token = tether_e2e::sim::join_token(&leader.admin).await;
    let args = ["--leader-url-check-interval=2s"];
    let (east, mut west) = tokio::join!(
        fleet::member_with_args("east", &leader, &token, json!({}), &args),
        fleet::member_with_args("west", &leader, &token, json!({}), &args),
    );
    let mut since = Vec::new();
    for name in ["east", "west"] {
        let mc = wait_ready(&leader.admin, name).await;
        since.push(ready_since(&mc).expect("Ready since"));
    }
    trusting(&[&east, &west], &[&old_pin]).await;

    // 1. Overlap: the cluster's CA bundle holds both (what pods and kubeconfigs trust), and the
    //    leader publishes both.
    let both = format!("{old_ca}{}", new.ca_cert);
    let both_file = dir.join("leader-ca-both.pem");
    std::fs::write(&both_file, &both).expect("write bundle");
    leader.cluster.trust_serving_cas(&both).await.expect("trust both");
    leader.admin = leader.cluster.client().expect("admin");
    restart_leader_with_ca(&mut leader, &both_file).await;
    trusting(&[&east, &west], &[&old_pin, &new_pin]).await;

    // 2. The API server serves a certificate of the new CA.
    let switched = Timestamp::now();
    leader
        .cluster
        .restart_api_server_serving(&new)
        .await
        .expect("API server with the new serving CA");
    heartbeats_after(
        &leader,
        &["east", "west"],
        switched,
        "after the serving CA changed",
    )
    .await;

    // The pin for new joins changes: `tether init --ca-file` pins the CA that serves now.
    let out = tokio::process::Command::new(binary("tether").expect("tether binary"))
        .arg(format!("--kubeconfig={}", leader.cluster.kubeconfig().display()))
        .args(["init", "--clusterset", tether_e2e::sim::SET, "--ca-file"])
        .arg(&both_file)
        .output()
        .await
        .expect("tether init");
    let printed = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{printed}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        printed.contains(&format!("--ca-cert-hash {new_pin}")) && !printed.contains(&old_pin),
        "init pins the serving CA: {printed}"
    );
    let north =
        fleet::member_with_args("north", &leader, &token, json!({"caCertHash": new_pin}), &args).await;
    wait_ready(&leader.admin, "north").await;

    // 3. The old CA goes.
    let new_file = dir.join("leader-ca-new.pem");
    std::fs::write(&new_file, &new.ca_cert).expect("write CA");
    leader
        .cluster
        .trust_serving_cas(&new.ca_cert)
        .await
        .expect("trust the new CA alone");
    leader.admin = leader.cluster.client().expect("admin");
    restart_leader_with_ca(&mut leader, &new_file).await;
    trusting(&[&east, &west, &north], &[&new_pin]).await;
    west.kill_agent();
    west.start_agent();
    heartbeats_after(
        &leader,
        &["east", "west", "north"],
        Timestamp::now(),
        "with the new CA alone",
    )
    .await;

    for (name, first) in ["east", "west"].into_iter().zip(since) {
        let mc = fleet::managed(&leader.admin, name).await.expect("member");
        assert_eq!(
            ready_since(&mc).as_deref(),
            Some(first.as_str()),
            "{name} never left Ready"
        );
    }
}
