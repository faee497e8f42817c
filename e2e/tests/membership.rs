//! Membership on a real API server with the namespace controller running: heartbeats drive
//! Ready, members that leave or expire are removed completely, ClusterSet status follows, and a
//! set's deletion waits for its members unless forced. The leader runs with its own RBAC.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::Role;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tether_api::clusterset::{LeaderSpec, MemberCounts};
use tether_api::registration::{RegistrationReason, RegistrationResult};
use tether_api::{ClusterRegistrationRequest, ClusterSet, ManagedCluster, labels};
use tether_e2e::fleet;
use tether_e2e::sim::{self, HOME, Leader, SET, join, register, wait_counts, wait_ready};
use tether_testkit::eventually;

const FAST: Duration = Duration::from_secs(1);

/// Event reasons recorded about objects named `name`.
async fn event_reasons(admin: &Client, name: &str) -> Vec<String> {
    Api::<Event>::all(admin.clone())
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .filter_map(|e| e.reason)
        .collect()
}

async fn wait_event(admin: &Client, name: &str, reason: &str) {
    eventually(
        &format!("Event {reason} on {name}"),
        Duration::from_secs(15),
        || async {
            let reasons = event_reasons(admin, name).await;
            if reasons.iter().any(|r| r == reason) {
                Ok(())
            } else {
                Err(format!("{reasons:?}"))
            }
        },
    )
    .await
}

async fn wait_gone(admin: &Client, namespace: &str) {
    let api = Api::<Namespace>::all(admin.clone());
    eventually(
        &format!("namespace {namespace} deleted"),
        Duration::from_secs(60),
        || async {
            match api.get_opt(namespace).await.map_err(|e| e.to_string())? {
                None => Ok(()),
                Some(ns) => Err(format!("phase {:?}", ns.status.and_then(|s| s.phase))),
            }
        },
    )
    .await
}

#[tokio::test]
async fn silent_member_goes_unknown_within_grace_and_recovers_without_leader_writes_per_heartbeat() {
    let l = Leader::named("members-health")
        .policy(fleet::policy("1s", "4s"))
        .start()
        .await;
    let east = Arc::new(join(&l.cluster, &l.admin, "east", "id-east").await);
    // Approved, no heartbeat yet (and the grace of 4 s not over): no status from the leader;
    // the first comes with the first heartbeat.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let unjudged = sim::ready(&l.admin, &east.namespace, &east.name).await;
    assert!(
        unjudged.as_ref().is_err_and(|e| e.contains("no Ready condition")),
        "a status before the first heartbeat: {unjudged:?}"
    );
    let beating = east.keep_heartbeating(FAST);
    wait_ready(
        &l.admin,
        &east,
        "True",
        "HeartbeatReceived",
        Duration::from_secs(10),
    )
    .await;
    wait_counts(
        &l.admin,
        MemberCounts {
            total: 1,
            ready: 1,
            ..MemberCounts::default()
        },
        Duration::from_secs(10),
    )
    .await;

    // Steady state: heartbeats flow, and neither the ManagedCluster nor the set is written.
    let mcs = Api::<ManagedCluster>::namespaced(l.admin.clone(), &east.namespace);
    let mc_version = mcs.get("east").await.expect("mcls").resource_version();
    let set_version = l.set().await.resource_version();
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(
        mcs.get("east").await.expect("mcls").resource_version(),
        mc_version,
        "ManagedCluster written"
    );
    assert_eq!(
        l.set().await.resource_version(),
        set_version,
        "ClusterSet written during steady heartbeats"
    );
    let text = l.metrics.encode();
    let observed: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("tether_leader_heartbeat_age_seconds_count "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    assert!(
        observed >= 3,
        "renewals are observed as heartbeat ages ({observed}):\n{text}"
    );

    wait_event(&l.admin, "east", "MemberReady").await;
    // Silence: Unknown within gracePeriod + 5 s of the last heartbeat.
    drop(beating);
    let stopped = Instant::now();
    wait_ready(
        &l.admin,
        &east,
        "Unknown",
        "HeartbeatExpired",
        Duration::from_secs(4 + 5),
    )
    .await;
    let detected = stopped.elapsed();
    eprintln!("member loss detected {detected:?} after the last heartbeat (gracePeriod 4s)");
    wait_event(&l.admin, "east", "MemberLost").await;
    wait_counts(
        &l.admin,
        MemberCounts {
            total: 1,
            not_ready: 1,
            ..MemberCounts::default()
        },
        Duration::from_secs(10),
    )
    .await;
    let set = l.set().await;
    let summary = &set.status.expect("status").member_summary;
    assert_eq!(
        (summary[0].name.as_str(), summary[0].ready.as_str()),
        ("east", "Unknown")
    );

    // Heartbeats resume: Ready again, with an Event.
    let _beating = east.keep_heartbeating(FAST);
    wait_ready(
        &l.admin,
        &east,
        "True",
        "HeartbeatReceived",
        Duration::from_secs(10),
    )
    .await;
    wait_event(&l.admin, "east", "MemberRecovered").await;
    wait_counts(
        &l.admin,
        MemberCounts {
            total: 1,
            ready: 1,
            ..MemberCounts::default()
        },
        Duration::from_secs(10),
    )
    .await;
}

#[tokio::test]
async fn member_that_leaves_is_removed_with_its_namespace_and_request() {
    let l = Leader::named("members-leave").start().await;
    let east = join(&l.cluster, &l.admin, "east", "id-east").await;
    let west = join(&l.cluster, &l.admin, "west", "id-west").await;
    wait_counts(
        &l.admin,
        MemberCounts {
            total: 2,
            not_ready: 2,
            ..MemberCounts::default()
        },
        Duration::from_secs(10),
    )
    .await;

    east.leave().await.expect("east deletes its announce");
    wait_gone(&l.admin, &east.namespace).await;
    wait_counts(
        &l.admin,
        MemberCounts {
            total: 1,
            not_ready: 1,
            ..MemberCounts::default()
        },
        Duration::from_secs(10),
    )
    .await;
    wait_event(&l.admin, SET, "MemberLeft").await;
    let requests = Api::<ClusterRegistrationRequest>::namespaced(l.admin.clone(), HOME);
    assert!(
        requests.get_opt("east-1").await.expect("get").is_none(),
        "east's request is removed"
    );
    assert!(
        requests.get_opt("west-1").await.expect("get").is_some(),
        "west's request stays"
    );

    // East's old credential is dead; west's still works.
    let err = east
        .heartbeat()
        .await
        .expect_err("a removed member cannot heartbeat");
    assert!(
        matches!(tether_e2e::status_code(&err), Some(401 | 403 | 404)),
        "{err}"
    );
    west.heartbeat().await.expect("west is untouched");

    // East can join again from scratch, under the same name.
    let again = join(&l.cluster, &l.admin, "east", "id-east").await;
    assert_eq!(again.namespace, east.namespace);
    // West heartbeated once above, so it is Ready; the new east awaits its first heartbeat.
    wait_counts(
        &l.admin,
        MemberCounts {
            total: 2,
            ready: 1,
            not_ready: 1,
            ..MemberCounts::default()
        },
        Duration::from_secs(20),
    )
    .await;
}

#[tokio::test]
async fn member_silent_past_member_expiry_is_removed() {
    let l = Leader::named("members-expiry")
        .policy(LeaderSpec {
            member_expiry: fleet::duration("6s"),
            ..fleet::policy("1s", "2s")
        })
        .start()
        .await;
    let east = Arc::new(join(&l.cluster, &l.admin, "east", "id-east").await);
    let beating = east.keep_heartbeating(FAST);
    wait_ready(
        &l.admin,
        &east,
        "True",
        "HeartbeatReceived",
        Duration::from_secs(10),
    )
    .await;
    drop(beating);
    wait_gone(&l.admin, &east.namespace).await;
    wait_event(&l.admin, SET, "MemberExpired").await;
    wait_counts(&l.admin, MemberCounts::default(), Duration::from_secs(10)).await;
}

#[tokio::test]
async fn set_deletion_waits_for_members_and_force_removes_everything() {
    let l = Leader::named("members-destroy").start().await;
    let east = join(&l.cluster, &l.admin, "east", "id-east").await;
    let sets = Api::<ClusterSet>::namespaced(l.admin.clone(), HOME);
    eventually("the finalizer", Duration::from_secs(10), || async {
        let s = sets.get(SET).await.map_err(|e| e.to_string())?;
        if s.finalizers().iter().any(|f| f == tether_api::LEADER_FINALIZER) {
            Ok(())
        } else {
            Err("none".to_string())
        }
    })
    .await;

    sets.delete(SET, &DeleteParams::default())
        .await
        .expect("delete set");
    eventually(
        "deletion blocked with a reason",
        Duration::from_secs(15),
        || async {
            let s = sets.get(SET).await.map_err(|e| e.to_string())?;
            let st = s.status.unwrap_or_default();
            let blocked = st
                .conditions
                .iter()
                .find(|c| c.type_ == tether_api::conditions::ConditionType::DeletionBlocked);
            match (st.state.as_deref(), blocked) {
                (Some("Deleting"), Some(c)) if c.message.contains("tether leave") => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    wait_event(&l.admin, SET, "DeletionBlocked").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        sets.get_opt(SET).await.expect("get").is_some(),
        "the set stays while a member remains"
    );
    let late = sim::joiner(&l.cluster, &l.admin).await;
    let denied = register(&late, "late-1", "late", "id-late").await;
    let st = denied.status.expect("status");
    assert_eq!(
        (st.result, st.reason),
        (RegistrationResult::Denied, RegistrationReason::ClusterSetDeleting)
    );

    let force = json!({"metadata": {"annotations": {tether_api::annotations::FORCE_DELETE: "true"}}});
    sets.patch(SET, &PatchParams::default(), &Patch::Merge(force))
        .await
        .expect("force");
    eventually("the set gone", Duration::from_secs(30), || async {
        match sets.get_opt(SET).await.map_err(|e| e.to_string())? {
            None => Ok(()),
            Some(s) => Err(format!("{:?}", s.status)),
        }
    })
    .await;
    wait_gone(&l.admin, &east.namespace).await;
    let selector = ListParams::default().labels(&format!("{}={SET}", labels::CLUSTER_SET));
    let tokens = Api::<Secret>::namespaced(l.admin.clone(), "kube-system")
        .list(&selector)
        .await
        .expect("list");
    assert_eq!(
        sim::names(&tokens.items),
        Vec::<String>::new(),
        "join tokens removed"
    );
    let roles = Api::<Role>::namespaced(l.admin.clone(), HOME)
        .list(&selector)
        .await
        .expect("list");
    assert_eq!(
        sim::names(&roles.items),
        Vec::<String>::new(),
        "join RBAC removed"
    );
    let requests = Api::<ClusterRegistrationRequest>::namespaced(l.admin.clone(), HOME)
        .list(&ListParams::default())
        .await
        .expect("list");
    assert_eq!(
        sim::names(&requests.items),
        Vec::<String>::new(),
        "requests removed"
    );
}

#[tokio::test]
async fn a_replica_that_is_not_the_leader_writes_nothing() {
    let l = Leader::named("members-standby").start().await;
    l.set_leading(false);
    let j = sim::joiner(&l.cluster, &l.admin).await;
    let body = json!({"apiVersion": "multicluster.tether.dev/v1alpha1", "kind": "ClusterRegistrationRequest",
                      "metadata": {"name": "east-1"},
                      "spec": {"clusterID": "id-east", "clusterName": "east", "publicKey": j.public_key}});
    tether_e2e::create_raw::<ClusterRegistrationRequest>(&j.client, Some(HOME), body)
        .await
        .expect("request");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let requests = Api::<ClusterRegistrationRequest>::namespaced(l.admin.clone(), HOME);
    let r = requests.get("east-1").await.expect("get");
    let st = r.status.unwrap_or_default();
    assert_eq!(
        (st.result, st.reason),
        (RegistrationResult::Pending, RegistrationReason::AwaitingLeader)
    );
    assert!(l.set().await.status.is_none(), "a standby writes no set status");
    assert!(
        l.set().await.finalizers().is_empty(),
        "a standby adds no finalizer"
    );

    l.set_leading(true);
    eventually("approval once leading", Duration::from_secs(15), || async {
        let r = requests.get("east-1").await.map_err(|e| e.to_string())?;
        match r.status.map(|s| s.result) {
            Some(RegistrationResult::Approved) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    wait_counts(
        &l.admin,
        MemberCounts {
            total: 1,
            not_ready: 1,
            ..MemberCounts::default()
        },
        Duration::from_secs(10),
    )
    .await;
}

/// AgentVersionSupported of a member's ManagedCluster: `(status, reason, message)`.
async fn skew_condition(admin: &Client, m: &sim::Member) -> Option<(String, String, String)> {
    let mc = Api::<ManagedCluster>::namespaced(admin.clone(), &m.namespace)
        .get(&m.name)
        .await
        .ok()?;
    mc.status?
        .conditions
        .into_iter()
        .find(|c| c.type_ == "AgentVersionSupported")
        .map(|c| (c.status, c.reason, c.message))
}

#[tokio::test]
async fn an_agent_outside_the_version_skew_is_told_what_to_do_and_stays_a_member() {
    let l = Leader::named("skew").start().await;
    let m = join(&l.cluster, &l.admin, "east", "id-east").await;
    m.heartbeat().await.expect("heartbeat");
    let mcs = Api::<ManagedCluster>::namespaced(m.client.clone(), &m.namespace);
    // What the agent writes in its report, with its own credential and field manager.
    let report = |version: &'static str| {
        let mcs = mcs.clone();
        let name = m.name.clone();
        async move {
            mcs.patch_status(
                &name,
                &PatchParams::apply("tether-agent").force(),
                &Patch::Apply(
                    json!({"apiVersion": "multicluster.tether.dev/v1alpha1", "kind": "ManagedCluster",
                                     "status": {"agentVersion": version}}),
                ),
            )
            .await
            .expect("the agent reports its version");
        }
    };
    let wait_skew = |status: &'static str, reason: &'static str, says: &'static str| {
        let admin = l.admin.clone();
        let m = &m;
        async move {
            eventually(
                &format!("AgentVersionSupported={status} ({reason})"),
                Duration::from_secs(20),
                || async {
                    match skew_condition(&admin, m).await {
                        Some((s, r, msg)) if s == status && r == reason && msg.contains(says) => Ok(()),
                        other => {
                            let mc = Api::<ManagedCluster>::namespaced(admin.clone(), &m.namespace)
                                .get(&m.name)
                                .await;
                            Err(format!(
                                "{other:?} {:?}",
                                mc.map(|mc| mc.status.and_then(|s| s.agent_version))
                            ))
                        }
                    }
                },
            )
            .await;
        }
    };
    let leader = tether_leader::skew::LEADER_VERSION;
    let (major, minor) = {
        let mut p = leader
            .split('.')
            .map(|n| n.parse::<u64>().expect("numeric version"));
        (p.next().expect("major"), p.next().expect("minor"))
    };
    let too_new: &'static str = Box::leak(format!("{major}.{}.0", minor + 2).into_boxed_str());
    let one_older: &'static str =
        Box::leak(format!("{major}.{}.9", minor.saturating_sub(1)).into_boxed_str());

    report(too_new).await;
    wait_skew("False", "OutsideSkew", "upgrade the leader first").await;
    wait_event(&l.admin, "east", "AgentVersionUnsupported").await;
    assert_eq!(
        sim::ready(&l.admin, &m.namespace, &m.name)
            .await
            .expect("Ready")
            .0,
        "True",
        "a member outside the skew is flagged, not dropped"
    );

    report(one_older).await;
    wait_skew("True", "WithinSkew", one_older).await;
    report("not-a-version").await;
    wait_skew("Unknown", "AgentVersionUnknown", "cannot be read").await;
}
