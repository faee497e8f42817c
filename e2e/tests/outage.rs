//! The fleet outlives a leader outage longer than both its credentials and its join token, with
//! no human: on real clusters, members join with a join token that expires during the outage
//! and a 10-minute credential; a third member is removed with `tether member remove --ban`
//! first; then the leader's API server is stopped for longer than both. When it is back, every
//! member proves its registered key at `rejoin` and is Ready again, as the same member (same
//! ManagedCluster UID, same namespace, no new namespace, no new or Denied request), within one
//! grace period; the banned one never returns.
//!
//! About 13 minutes, so it is ignored by a plain `cargo test`; `make test` runs it with
//! `--ignored` beside the other tests (e2e/runner).

use std::process::{ExitCode, Output};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use serde_json::json;
use tether_api::clusterset::LeaderSpec;
use tether_api::registration::{RegistrationReason, RegistrationResult};
use tether_api::{ClusterRegistrationRequest, ClusterSet};
use tether_e2e::fleet::{
    self, LeaderSide, credential_expiry, duration, kube_system_uid, managed, ready, wait_ready,
};
use tether_e2e::sim::{HOME, SET, ns_of};
use tether_testkit::controller::binary;
use tether_testkit::{BootstrapToken, CreateToken, TestCluster, eventually, free_port, lab};

/// The leader's grace period: members must be Ready again within it of the API server's return.
const GRACE: Duration = Duration::from_secs(60);

fn main() -> ExitCode {
    tether_e2e::long_lab_main(
        "the leader-outage test",
        "members_come_back_by_themselves_after_an_outage_longer_than_credentials_and_join_tokens",
        outage,
    )
}

fn step(what: &str) {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let t = START.get_or_init(Instant::now).elapsed();
    eprintln!("== [{:6.1}s] {what}", t.as_secs_f64());
}

async fn tether(kubeconfig: &std::path::Path, args: &[&str]) -> Output {
    let mut cmd = tokio::process::Command::new(binary("tether").expect("tether binary"));
    cmd.arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(args)
        .env("NO_COLOR", "1");
    cmd.output().await.expect("run tether")
}

async fn requests(admin: &kube::Client) -> Vec<ClusterRegistrationRequest> {
    Api::<ClusterRegistrationRequest>::namespaced(admin.clone(), HOME)
        .list(&ListParams::default())
        .await
        .expect("requests")
        .items
}

async fn member_namespaces(admin: &kube::Client) -> Vec<String> {
    let mut names: Vec<String> = Api::<Namespace>::all(admin.clone())
        .list(&ListParams::default().labels("app.kubernetes.io/managed-by=tether-leader"))
        .await
        .expect("namespaces")
        .items
        .iter()
        .filter(|n| n.metadata.deletion_timestamp.is_none())
        .map(|n| n.name_any())
        .collect();
    names.sort();
    names
}

async fn outage() {
    let cluster = TestCluster::builder("outage-leader")
        .start()
        .await
        .expect("leader cluster");
    let addr = std::net::SocketAddr::from((lab::GATEWAY, free_port().expect("port")));
    let mut leader = LeaderSide::on(cluster)
        .policy(LeaderSpec {
            heartbeat_interval: duration("5s"),
            grace_period: duration(&format!("{}s", GRACE.as_secs())),
            credential_ttl: duration("10m"),
            ..LeaderSpec::default()
        })
        .proxy(addr, 4)
        .start()
        .await;
    // Valid when the members join, expired long before the leader is back.
    let token = BootstrapToken::random();
    let token_expiry = Timestamp::now() + SignedDuration::from_secs(180);
    token
        .create(&leader.admin, Some(&tether_e2e::sim::home()), Some(token_expiry))
        .await
        .expect("join token");
    step("three members join with a join token that expires in 3 minutes");
    let (east, west, gone) = tokio::join!(
        fleet::member("east", &leader, &token, json!({})),
        fleet::member("west", &leader, &token, json!({})),
        fleet::member("gone", &leader, &token, json!({})),
    );
    for name in ["east", "west", "gone"] {
        wait_ready(&leader.admin, name).await;
    }
    let mut before = Vec::new();
    for (name, m) in [("east", &east), ("west", &west)] {
        let mc = managed(&leader.admin, name).await.expect("member");
        before.push((name, mc.uid().expect("uid"), kube_system_uid(m).await));
    }
    let gone_id = kube_system_uid(&gone).await;

    step("`tether member remove gone --ban`: removed, and refused while its join token is still valid");
    let kubeconfig = leader.cluster.kubeconfig().to_path_buf();
    let out = tether(
        &kubeconfig,
        &[
            "member",
            "remove",
            "gone",
            "--ban",
            "--clusterset",
            SET,
            "-n",
            HOME,
        ],
    )
    .await;
    let said = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("banned") && said.contains("tether member unban"),
        "{said}"
    );
    let set = Api::<ClusterSet>::namespaced(leader.admin.clone(), HOME)
        .get(SET)
        .await
        .expect("set");
    assert!(
        set.spec
            .leader
            .as_ref()
            .is_some_and(|l| l.bans.iter().any(|b| b.names(&gone_id) && b.names("gone"))),
        "{:?}",
        set.spec
    );
    // Its agent's credential dies with its ServiceAccount; its key is no longer recognised, so
    // it registers with the still-valid join token and is Denied: Banned, naming the unban.
    eventually(
        "gone's request is Denied as Banned",
        Duration::from_secs(90),
        || async {
            let denied = requests(&leader.admin).await.into_iter().find(|r| {
                r.spec.cluster_id == gone_id
                    && r.status.as_ref().is_some_and(|s| {
                        s.result == RegistrationResult::Denied && s.reason == RegistrationReason::Banned
                    })
            });
            match denied {
                Some(r) => {
                    let msg = r.status.and_then(|s| s.message).unwrap_or_default();
                    if msg.contains(&format!("tether member unban {gone_id}")) {
                        Ok(())
                    } else {
                        Err(format!("message does not name the unban command: {msg}"))
                    }
                }
                None => Err("no Denied request yet".to_string()),
            }
        },
    )
    .await;
    let listed = tether(&kubeconfig, &["member", "list", "--clusterset", SET, "-n", HOME]).await;
    let listed = String::from_utf8_lossy(&listed.stdout).to_string();
    assert!(listed.contains(&gone_id) && listed.contains("Banned"), "{listed}");
    let namespaces = member_namespaces(&leader.admin).await;
    assert_eq!(
        namespaces,
        vec![ns_of("east"), ns_of("west")],
        "the banned member's namespace went"
    );
    let requests_before: Vec<String> = requests(&leader.admin)
        .await
        .iter()
        .filter(|r| r.spec.cluster_id != gone_id)
        .map(|r| r.name_any())
        .collect();

    let stopped = Timestamp::now();
    let back_after = credential_expiry(&east)
        .await
        .max(credential_expiry(&west).await)
        .max(token_expiry)
        .max(stopped + SignedDuration::from_secs(630))
        + SignedDuration::from_secs(30);
    step(&format!(
        "the leader's API server stops until {back_after}: past the credentials ({}), the join token ({token_expiry}) and credentialTTL",
        credential_expiry(&east).await
    ));
    leader.cluster.stop_api_server();
    let wait = (back_after - Timestamp::now()).get_seconds().max(0) as u64;
    tokio::time::sleep(Duration::from_secs(wait)).await;
    // NB: timed from the process's start: members may come back before it reports ready.
    let returned = Instant::now();
    leader
        .cluster
        .start_api_server()
        .await
        .expect("the API server starts again");
    eprintln!(
        "the API server was ready {:.1?} after it started",
        returned.elapsed()
    );
    step(&format!(
        "the API server is back after {:.1} min",
        (Timestamp::now() - stopped).get_seconds() as f64 / 60.0
    ));

    let mut back = Vec::new();
    for (name, uid, id) in &before {
        eventually(
            &format!("{name} Ready again as the same member"),
            GRACE + Duration::from_secs(60),
            || async {
                // NB: the announce's renewTime is the heartbeat itself; the ManagedCluster's
                // lastHeartbeatTime is only refreshed on a Ready change or the agent's 5-minute
                // report, and the leader does not count its own outage against members.
                let mc = managed(&leader.admin, name).await?;
                let beat = fleet::renewed_after(&leader.admin, name, back_after).await;
                match (ready(&mc).as_deref(), beat) {
                    (Some("True"), true) => Ok(()),
                    other => Err(format!("(Ready, heartbeat after the outage) = {other:?}")),
                }
            },
        )
        .await;
        back.push((name, returned.elapsed()));
        let mc = managed(&leader.admin, name).await.expect("member");
        assert_eq!(mc.uid().as_ref(), Some(uid), "{name}: the same ManagedCluster");
        assert_eq!(mc.namespace(), Some(ns_of(name)), "{name}: the same namespace");
        assert_eq!(&mc.spec.cluster_id, id, "{name}: the same cluster ID");
    }
    let slowest = back.iter().map(|(_, d)| *d).max().unwrap_or_default();
    eprintln!("members Ready again after the API server's return: {back:?} (grace {GRACE:?})");
    assert!(
        slowest <= GRACE,
        "every member Ready within one grace period ({GRACE:?}) of the API server's return: {back:?}"
    );

    step("same members, same namespaces, no new request and none Denied; the banned one stays out");
    assert_eq!(
        member_namespaces(&leader.admin).await,
        vec![ns_of("east"), ns_of("west")],
        "0 new namespaces"
    );
    let after = requests(&leader.admin).await;
    let theirs: Vec<String> = after
        .iter()
        .filter(|r| r.spec.cluster_id != gone_id)
        .map(|r| r.name_any())
        .collect();
    assert_eq!(
        theirs, requests_before,
        "the returning members made no new request"
    );
    assert!(
        after.iter().all(|r| r.spec.cluster_id == gone_id
            || r.status
                .as_ref()
                .is_none_or(|s| s.result != RegistrationResult::Denied)),
        "0 Denied requests of returning members"
    );
    assert!(
        managed(&leader.admin, "gone").await.is_err(),
        "the banned member did not return"
    );
    for (name, m) in [("east", &east), ("west", &west)] {
        eventually(
            &format!("{name}'s own status Ready"),
            Duration::from_secs(60),
            || async {
                let s = m.set().await.and_then(|s| s.status).ok_or("no status")?;
                match s.state.as_deref() {
                    Some("Ready") => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            },
        )
        .await;
        let log = m.agent.as_ref().expect("agent").log();
        assert!(
            log.contains("Rejoined with the member's registered key"),
            "{name}: {log}"
        );
    }
    // The banned member found its key refused and its join token expired: it says what to do.
    eventually(
        "gone says its join token expired",
        Duration::from_secs(120),
        || async {
            let s = gone.set().await.and_then(|s| s.status).ok_or("no status")?;
            let registered = s
                .conditions
                .iter()
                .find(|c| c.type_ == "Registered")
                .map(|c| c.reason.clone());
            match registered.as_deref() {
                Some("JoinTokenExpired") | Some("Denied") => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    assert!(
        managed(&leader.admin, "gone").await.is_err(),
        "the banned member did not return"
    );
    drop(leader);
}
