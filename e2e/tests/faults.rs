//! Faults a fleet meets, on real control planes with both controllers as real processes: the
//! leader's API server stopped for longer than the grace period, its etcd paused and its API
//! server restarted, an agent's local state lost, two agent replicas handing over, and the
//! leader's watches expiring while it was frozen (faults/relist.rs). Each recovery is measured
//! and printed; no controller restarts, no member is lost and nothing registers twice.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, DeleteParams};
use serde_json::json;
use tether_api::clusterset::LeaderSpec;
use tether_api::conditions::{ConditionType, find};
use tether_api::{ManagedCluster, MemberClusterAnnounce};
use tether_e2e::fleet::{
    self, LeaderSide, MemberSide, kube_system_uid, managed, ready, requests_for, wait_ready,
};
use tether_e2e::sim::{HOME, ns_of};
use tether_testkit::{BootstrapToken, CreateToken, eventually};

#[path = "faults/relist.rs"]
mod relist;

/// The leader's heartbeat interval and grace period in these tests.
const HEARTBEAT: Duration = Duration::from_secs(2);
const GRACE: Duration = Duration::from_secs(6);

fn timings() -> LeaderSpec {
    LeaderSpec {
        heartbeat_interval: HEARTBEAT.into(),
        grace_period: GRACE.into(),
        ..LeaderSpec::default()
    }
}

/// A leader (these tests' timings) and a join token of its `prod` set.
async fn leader_with_token(name: &str) -> (LeaderSide, BootstrapToken) {
    let leader = LeaderSide::named(name).policy(timings()).start().await;
    let token = BootstrapToken::random();
    token
        .create(&leader.admin, Some(&tether_e2e::sim::home()), None)
        .await
        .expect("token");
    (leader, token)
}

async fn fleet_of(leader: &str, members: &[&str]) -> (LeaderSide, BootstrapToken, Vec<MemberSide>) {
    let (leader, token) = leader_with_token(leader).await;
    let joins = members
        .iter()
        .map(|name| fleet::member(name, &leader, &token, json!({})));
    let members = futures::future::join_all(joins).await;
    for name in members_names(&members) {
        wait_ready(&leader.admin, &name).await;
    }
    (leader, token, members)
}

fn members_names(members: &[MemberSide]) -> Vec<String> {
    members.iter().map(|m| m.cluster.name().to_string()).collect()
}

/// After a fault ends at `since`, watches every member at the leader for `window` and returns
/// how long it took until each had heartbeated again and was (and stayed) `Ready=True`, and
/// whether any was seen not Ready meanwhile. Panics if one is not Ready at the end.
async fn recovery(admin: &Client, names: &[String], since: Instant, window: Duration) -> (Duration, bool) {
    let wall_since =
        Timestamp::now() - k8s_openapi::jiff::SignedDuration::try_from(since.elapsed()).unwrap_or_default();
    let mut settled: Vec<Option<Duration>> = vec![None; names.len()];
    let mut went_unknown = false;
    let mut last = String::new();
    while since.elapsed() < window {
        for (i, name) in names.iter().enumerate() {
            let mc = managed(admin, name).await;
            let ok = match &mc {
                Ok(mc) => {
                    ready(mc).as_deref() == Some("True")
                        && fleet::renewed_after(admin, name, wall_since).await
                }
                Err(_) => false,
            };
            if let Ok(mc) = &mc
                && ready(mc).as_deref() == Some("Unknown")
            {
                went_unknown = true;
            }
            match (ok, settled[i]) {
                (true, None) => settled[i] = Some(since.elapsed()),
                (false, _) => {
                    settled[i] = None;
                    last = format!("{name}: {:?}", mc.map(|m| m.status));
                }
                (true, Some(_)) => {}
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let times: Option<Vec<Duration>> = settled.into_iter().collect();
    let times =
        times.unwrap_or_else(|| panic!("not every member Ready after {window:?}; last not Ready: {last}"));
    (times.into_iter().max().unwrap_or_default(), went_unknown)
}

fn assert_alive(leader: &mut LeaderSide, members: &mut [MemberSide]) {
    assert_eq!(
        leader.controller.exited(),
        None,
        "the leader controller kept running"
    );
    for m in members {
        let agent = m.agent.as_mut().expect("agent");
        assert_eq!(agent.exited(), None, "{}'s agent kept running", m.cluster.name());
    }
}

async fn assert_registered_once(leader: &LeaderSide, ids: &[String]) {
    for id in ids {
        assert_eq!(
            requests_for(&leader.admin, id).await,
            1,
            "cluster {id} registered once"
        );
    }
}

#[tokio::test]
async fn leader_api_server_outage_etcd_pause_and_restart_lose_nothing() {
    let (mut leader, token, mut members) = fleet_of("outage-leader", &["east", "west"]).await;
    let names = members_names(&members);
    let mut ids = Vec::new();
    for m in &members {
        ids.push(kube_system_uid(m).await);
    }
    // Recovery bound: the later of the agents' next renewal (one heartbeat interval plus its
    // jitter) and the leader's watches trying again (after an outage this long, a watch waits
    // up to 4 s plus 20 % between tries: two CIs missed the old bound, which left that out, by
    // 1.7 and 2 s), plus the leader's reaction.
    let bound = HEARTBEAT.mul_f64(1.1).max(tether_process::streams::LONGEST_RETRY) + Duration::from_secs(2);

    // 1. The leader's API server stopped for longer than the grace period.
    let outage = GRACE * 5;
    leader.cluster.stop_api_server();
    let down = Instant::now();
    for m in &members {
        eventually(
            &format!("{} says the leader is unreachable", m.cluster.name()),
            outage,
            || async {
                let s = m.set().await.and_then(|s| s.status).ok_or("no status")?;
                let c = find(&s.conditions, ConditionType::LeaderReachable).ok_or("no condition")?;
                if c.status == "False" && c.reason == "LeaderUnreachable" {
                    Ok(())
                } else {
                    Err(format!("{c:?}"))
                }
            },
        )
        .await;
    }
    tokio::time::sleep(outage.saturating_sub(down.elapsed())).await;
    leader.cluster.start_api_server().await.expect("API server back");
    let back = Instant::now();
    let (took, unknown) = recovery(&leader.admin, &names, back, GRACE * 3).await;
    eprintln!(
        "API server down {:?}: every member Ready and heartbeating {took:?} after it was back (seen Unknown meanwhile: {unknown})",
        down.elapsed() - back.elapsed()
    );
    assert!(
        took <= bound,
        "members Ready within {bound:?} of the API server's return, took {took:?}"
    );
    assert_alive(&mut leader, &mut members);
    assert_registered_once(&leader, &ids).await;

    // 2. etcd paused for 30 s: the API server is up but every request hangs.
    leader.cluster.pause_etcd().expect("pause etcd");
    tokio::time::sleep(Duration::from_secs(30)).await;
    leader.cluster.resume_etcd().expect("resume etcd");
    let resumed = Instant::now();
    let (took, unknown) = recovery(&leader.admin, &names, resumed, GRACE * 3).await;
    eprintln!(
        "etcd paused 30s: every member Ready and heartbeating {took:?} after it resumed (seen Unknown meanwhile: {unknown})"
    );
    assert!(
        took <= bound,
        "members Ready within {bound:?} of etcd resuming, took {took:?}"
    );

    // 3. The API server restarted at once.
    leader.cluster.stop_api_server();
    leader
        .cluster
        .start_api_server()
        .await
        .expect("API server restarted");
    let restarted = Instant::now();
    let (took, unknown) = recovery(&leader.admin, &names, restarted, GRACE * 3).await;
    eprintln!(
        "API server restarted: every member Ready and heartbeating {took:?} after it was ready (seen Unknown meanwhile: {unknown})"
    );
    // NB: a request that reaches the restarted API server before it has installed every path
    // gets a 503 with `Retry-After`, which the client honours (5 s seen): that comes on top.
    let restart_bound = bound + Duration::from_secs(5);
    assert!(
        took <= restart_bound,
        "members Ready within {restart_bound:?} of the restart, took {took:?}"
    );
    assert_alive(&mut leader, &mut members);
    assert_registered_once(&leader, &ids).await;

    // The leader's controllers still act without a restart: a new member is approved and Ready.
    let joined = Instant::now();
    let late = fleet::member("late", &leader, &token, json!({})).await;
    wait_ready(&leader.admin, "late").await;
    eprintln!(
        "after the faults a new member joined and was Ready in {:?}",
        joined.elapsed()
    );
    assert_registered_once(&leader, &[kube_system_uid(&late).await]).await;
    let log = leader.controller.log();
    assert_eq!(
        log.matches("Starting tether-controller").count(),
        1,
        "the leader never restarted:\n{log}"
    );
}

#[tokio::test]
async fn an_agent_that_lost_its_key_rejoins_as_the_same_cluster_once_an_admin_approves_its_new_key() {
    let (leader, _token, mut members) = fleet_of("lost-leader", &["lost"]).await;
    let m = &mut members[0];
    let id = kube_system_uid(m).await;
    let before = managed(&leader.admin, "lost").await.expect("lost");
    let uid_before = before.metadata.uid.clone();

    // Everything the agent keeps about its membership is gone (a restore from an old backup, an
    // overzealous cleanup): its key pair and its credential.
    m.kill_agent();
    let secrets = Api::<Secret>::namespaced(m.admin.clone(), HOME);
    let old_token = secrets
        .get(tether_agent::state::CREDENTIAL_SECRET)
        .await
        .ok()
        .as_ref()
        .and_then(|s| tether_agent::state::secret_text(s, "token"))
        .expect("the agent's credential");
    for s in [
        tether_agent::state::KEY_SECRET,
        tether_agent::state::CREDENTIAL_SECRET,
    ] {
        secrets
            .delete(s, &DeleteParams::default())
            .await
            .expect("delete Secret");
    }
    let lost = Instant::now();
    m.start_agent();
    // A new key is a new identity (trust invariant 1): the agent's request names the silent
    // member and waits for an admin, who looked and approves it with the command it names.
    let request = eventually(
        "the new key's request waits for an admin, naming the member",
        Duration::from_secs(60),
        || async {
            let reqs = Api::<tether_api::ClusterRegistrationRequest>::namespaced(leader.admin.clone(), HOME)
                .list(&Default::default())
                .await
                .map_err(|e| e.to_string())?;
            reqs.items
                .into_iter()
                .find(|r| {
                    r.spec.cluster_id == id
                        && r.status.as_ref().is_some_and(|s| {
                            s.reason == tether_api::registration::RegistrationReason::ReplacesMember
                                && s.message.as_deref().is_some_and(|m| m.contains("member lost"))
                        })
                })
                .ok_or_else(|| "no request waiting as ReplacesMember yet".to_string())
        },
    )
    .await;
    let name = request.metadata.name.clone().expect("request name");
    let message = request.status.and_then(|s| s.message).unwrap_or_default();
    assert!(
        message.contains(&format!("tether approve {name} -n {HOME}")),
        "the wait names the command that replaces the member: {message}"
    );
    let out =
        tokio::process::Command::new(tether_testkit::controller::binary("tether").expect("tether binary"))
            .arg(format!("--kubeconfig={}", leader.cluster.kubeconfig().display()))
            .args(["approve", &name, "-n", HOME])
            .output()
            .await
            .expect("tether approve");
    assert!(
        out.status.success(),
        "tether approve: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    eventually(
        "a new credential issued for the same cluster",
        Duration::from_secs(60),
        || async {
            let stored = secrets
                .get_opt(tether_agent::state::CREDENTIAL_SECRET)
                .await
                .map_err(|e| e.to_string())?;
            let mc = managed(&leader.admin, "lost").await?;
            if stored.is_some() && ready(&mc).as_deref() == Some("True") {
                Ok(())
            } else {
                Err(format!(
                    "credential stored: {}, {:?}",
                    stored.is_some(),
                    mc.status
                ))
            }
        },
    )
    .await;
    eprintln!(
        "lost local state: Ready again {:?} after the agent restarted",
        lost.elapsed()
    );
    let after = managed(&leader.admin, "lost").await.expect("lost");
    assert_eq!(after.spec.cluster_id, id, "the same cluster ID");
    // NB: its key is set once (spec.publicKey): with a new key the member is a new object in
    // the same namespace.
    assert_ne!(
        after.metadata.uid, uid_before,
        "a new ManagedCluster for the new key"
    );
    assert_ne!(
        after.spec.public_key, before.spec.public_key,
        "the new key is the member's"
    );
    assert_eq!(
        after.metadata.namespace.as_deref(),
        Some(ns_of("lost").as_str()),
        "the same namespace"
    );
    let same_id: Vec<String> = Api::<ManagedCluster>::all(leader.admin.clone())
        .list(&Default::default())
        .await
        .expect("list")
        .items
        .into_iter()
        .filter(|mc| mc.spec.cluster_id == id)
        .map(|mc| {
            format!(
                "{}/{}",
                mc.metadata.namespace.unwrap_or_default(),
                mc.metadata.name.unwrap_or_default()
            )
        })
        .collect();
    assert_eq!(
        same_id.len(),
        1,
        "one member for the cluster ID, not a duplicate: {same_id:?}"
    );
    eprintln!(
        "registration requests for the cluster ID: {}",
        requests_for(&leader.admin, &id).await
    );
    // The old key's credential no longer works: whoever holds the lost Secret cannot act as it.
    // NB: the API server caches a successful token check for 10 s.
    let stale = Api::<MemberClusterAnnounce>::namespaced(
        leader.cluster.client_with_token(&old_token).expect("client"),
        &ns_of("lost"),
    );
    eventually(
        "the old credential refused with 401",
        Duration::from_secs(20),
        || async {
            match stale.get("lost").await {
                Err(e) if tether_e2e::status_code(&e) == Some(401) => Ok(()),
                other => Err(format!("{:?}", other.map(|_| "accepted"))),
            }
        },
    )
    .await;
    // NB: the agent writes its own status after its first heartbeat went through; the old
    // credential may be refused before that.
    eventually(
        "the agent reports its set Ready",
        Duration::from_secs(30),
        || async {
            let set = m.set().await.and_then(|s| s.status);
            match set.as_ref().and_then(|s| s.state.as_deref()) {
                Some("Ready") => Ok(()),
                _ => Err(format!("{set:?}")),
            }
        },
    )
    .await;
}

#[tokio::test]
async fn two_agent_replicas_hand_over_without_registering_twice() {
    let (leader, token) = leader_with_token("replicas-leader").await;
    let mut m = fleet::member("pair", &leader, &token, json!({})).await;
    // The member starts with one agent; replace it by two replicas that elect one.
    m.kill_agent();
    let lease_seconds = 4;
    let mut a = m.start_replica("agent-a", lease_seconds);
    wait_ready(&leader.admin, "pair").await;
    let mut b = m.start_replica("agent-b", lease_seconds);
    let leases = Api::<Lease>::namespaced(m.admin.clone(), HOME);
    let holder = || async {
        leases
            .get_opt("tether-agent")
            .await
            .ok()
            .flatten()
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity)
    };
    assert_eq!(
        holder().await.as_deref(),
        Some("agent-a"),
        "the first replica leads"
    );
    let id = kube_system_uid(&m).await;

    // The leading replica crashes: the standby takes over within the lease duration and the
    // member stays joined as the same cluster.
    a.kill();
    let killed = Instant::now();
    eventually("agent-b holds the Lease", Duration::from_secs(30), || async {
        match holder().await {
            Some(h) if h == "agent-b" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let took_over = killed.elapsed();
    let wall = Timestamp::now();
    eventually("agent-b heartbeats", Duration::from_secs(30), || async {
        if fleet::renewed_after(&leader.admin, "pair", wall).await {
            Ok(())
        } else {
            Err("no heartbeat since the takeover")
        }
    })
    .await;
    eprintln!(
        "agent replica killed: the standby took the Lease after {took_over:?} (lease {lease_seconds}s) and heartbeated {:?} after the kill",
        killed.elapsed()
    );
    assert!(
        took_over <= Duration::from_secs(lease_seconds + 3),
        "takeover within the lease duration"
    );
    let mc: ManagedCluster = managed(&leader.admin, "pair").await.expect("pair");
    assert_eq!(ready(&mc).as_deref(), Some("True"), "{:?}", mc.status);
    assert_eq!(
        requests_for(&leader.admin, &id).await,
        1,
        "no second registration"
    );
    assert_eq!(b.exited(), None, "the new leader keeps running");
    let log = b.log();
    assert!(
        !log.contains("Registering with the leader"),
        "the standby reused the stored credential instead of registering:\n{log}"
    );
}
