//! Leader and two members, both controllers as real processes with their own RBAC: agents join
//! by themselves after checking the pin, report what their nodes add up to (and write nothing
//! when nothing changes), survive restarts without re-registering, re-register when their
//! credential is revoked, and leave cleanly. A wrong pin sends nothing to the leader.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Secret, ServiceAccount};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams};
use serde_json::json;
use tether_api::ClusterRegistrationRequest;
use tether_api::about::ClusterProperty;
use tether_api::clusterset::LeaderSpec;
use tether_e2e::fleet::{
    self, LeaderSide, MemberSide, add_node, audit_events, kube_system_uid, managed, nodes, policy, ready,
    requests_for, wait_mc, wait_ready,
};
use tether_e2e::sim::{HOME, SET};
use tether_testkit::{BootstrapToken, CreateToken, eventually};

#[tokio::test]
async fn agents_join_report_restart_recover_and_leave() {
    let leader = LeaderSide::named("agent-leader")
        .policy(policy("2s", "6s"))
        .start()
        .await;
    let token = BootstrapToken::random();
    token
        .create(&leader.admin, Some(&tether_e2e::sim::home()), None)
        .await
        .expect("token");
    let (mut east, mut west) = {
        let e = fleet::member("east", &leader, &token, json!({}));
        let w = fleet::member("west", &leader, &token, json!({"labels": {"region": "eu"}}));
        tokio::join!(e, w)
    };
    tokio::join!(
        add_node(&east.admin, "east-1", "4", "16Gi"),
        add_node(&east.admin, "east-2", "2", "8Gi")
    );
    add_node(&west.admin, "west-1", "8", "32Gi").await;

    // Both join by themselves and report their nodes.
    wait_mc(&leader.admin, "east", "Ready with 2/2 nodes", |mc| {
        ready(mc).as_deref() == Some("True") && nodes(mc).as_deref() == Some("2/2")
    })
    .await;
    wait_mc(&leader.admin, "west", "Ready with 1/1 nodes", |mc| {
        ready(mc).as_deref() == Some("True") && nodes(mc).as_deref() == Some("1/1")
    })
    .await;
    // The agent says it is ready once its cache has synced (the charts' readiness probe).
    for m in [&east, &west] {
        let agent = m.agent.as_ref().expect("agent");
        eventually(
            "the agent's /readyz answers 200",
            Duration::from_secs(10),
            || async {
                match agent.admin_get("/readyz").await {
                    Ok((200, _)) => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            },
        )
        .await;
    }
    // Its metrics say which build runs, when its credential expires and when a heartbeat last
    // reached the leader (docs/metrics.md).
    let agent = east.agent.as_ref().expect("agent");
    eventually(
        "the agent's /metrics has its build, credential expiry and last heartbeat",
        Duration::from_secs(20),
        || async {
            let (_, text) = agent.admin_get("/metrics").await.map_err(|e| e.to_string())?;
            let value = |name: &str| {
                text.lines()
                    .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<i64>().ok())
            };
            let now = k8s_openapi::jiff::Timestamp::now().as_second();
            let expiry = value("tether_agent_credential_expiry_timestamp_seconds").unwrap_or(0);
            let beat = value("tether_agent_last_heartbeat_timestamp_seconds").unwrap_or(0);
            let build = text.lines().any(|l| {
                l.starts_with("tether_build_info{version=\"")
                    && l.contains(",commit=\"")
                    && l.ends_with("} 1")
            });
            if build && expiry > now && (now - 30..=now + 1).contains(&beat) {
                Ok(())
            } else {
                Err(format!(
                    "build {build}, expiry {expiry}, last heartbeat {beat}, now {now}"
                ))
            }
        },
    )
    .await;
    let e = managed(&leader.admin, "east").await.expect("east");
    let st = e.status.clone().expect("status");
    assert_eq!(st.capacity["cpu"].0, "6", "{:?}", st.capacity);
    assert_eq!(st.capacity["memory"].0, "24Gi", "{:?}", st.capacity);
    assert_eq!(
        st.kubernetes_version,
        tether_testkit::tools::pinned("KUBERNETES_VERSION"),
        "the member's own version (the default of e2e/versions.env)"
    );
    assert_eq!(
        st.api_server_health.as_ref().map(|h| h.livez && h.readyz),
        Some(true)
    );
    // LAST HEARTBEAT is never blank once the member is Ready.
    assert!(st.last_heartbeat_time.is_some(), "lastHeartbeatTime set: {st:?}");
    let healthy_since = |st: &tether_api::ManagedClusterStatus| {
        tether_api::conditions::find(
            &st.conditions,
            tether_api::conditions::ConditionType::ApiServerHealthy,
        )
        .map(|c| c.last_transition_time.clone())
    };
    let first_healthy = healthy_since(&st).expect("ApiServerHealthy");
    let east_id = kube_system_uid(&east).await;
    assert_eq!(
        e.spec.cluster_id, east_id,
        "the cluster ID defaults to kube-system's UID"
    );
    let w = managed(&leader.admin, "west").await.expect("west");
    assert_eq!(w.labels().get("region").map(String::as_str), Some("eu"));

    // The member side says so too.
    eventually(
        "east's Member ClusterSet Ready",
        Duration::from_secs(30),
        || async {
            let s = east.set().await.and_then(|s| s.status).ok_or("no status")?;
            let m = s.membership.clone().unwrap_or_default();
            let conds: Vec<(String, String)> = s
                .conditions
                .iter()
                .map(|c| (c.type_.clone(), c.status.clone()))
                .collect();
            if s.state.as_deref() == Some("Ready")
                && m.namespace.as_deref() == Some(tether_e2e::sim::ns_of("east").as_str())
                && m.credential_expiry.is_some()
                && conds.contains(&("CAVerified".into(), "True".into()))
            {
                Ok(())
            } else {
                Err(format!("{:?} {conds:?} {m:?}", s.state))
            }
        },
    )
    .await;
    let props = Api::<ClusterProperty>::all(east.admin.clone());
    assert_eq!(
        props
            .get("cluster.clusterset.k8s.io")
            .await
            .expect("id property")
            .spec
            .value,
        east_id
    );
    assert_eq!(
        props
            .get("clusterset.k8s.io")
            .await
            .expect("set property")
            .spec
            .value,
        SET
    );

    // A new node shows up at the leader.
    add_node(&east.admin, "east-3", "2", "8Gi").await;
    let third = wait_mc(&leader.admin, "east", "3/3 nodes", |mc| {
        nodes(mc).as_deref() == Some("3/3")
    })
    .await;
    // A second status write with the API server still healthy keeps the condition's transition time.
    let third = third.status.expect("status");
    assert_ne!(
        third.last_report_time, st.last_report_time,
        "the agent wrote again"
    );
    assert_eq!(
        healthy_since(&third),
        Some(first_healthy),
        "ApiServerHealthy did not transition"
    );

    // Nothing changes for a minute: heartbeats flow, no status write.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let east_user = &format!(
        "system:serviceaccount:{}:tether-agent",
        tether_e2e::sim::ns_of("east")
    );
    let writes = |sub: Option<&'static str>, resource: &'static str| {
        move |e: &serde_json::Value| {
            e["user"]["username"] == *east_user
                && e["objectRef"]["resource"] == resource
                && e["objectRef"]["subresource"].as_str() == sub
                && matches!(e["verb"].as_str(), Some("patch" | "update"))
        }
    };
    let before_status = audit_events(&leader.cluster, writes(Some("status"), "managedclusters")).len();
    // NB: the heartbeat is the member's Lease (this leader serves no member access, so the
    // agent has no tunnel and renews it every heartbeatInterval); the announce is not written.
    let before_beats = audit_events(&leader.cluster, writes(None, "leases")).len();
    let before_announces = audit_events(&leader.cluster, writes(None, "memberclusterannounces")).len();
    tokio::time::sleep(Duration::from_secs(60)).await;
    let status_writes =
        audit_events(&leader.cluster, writes(Some("status"), "managedclusters")).len() - before_status;
    let beats = audit_events(&leader.cluster, writes(None, "leases")).len() - before_beats;
    let announces =
        audit_events(&leader.cluster, writes(None, "memberclusterannounces")).len() - before_announces;
    eprintln!("steady minute: {status_writes} status writes, {beats} heartbeats");
    assert_eq!(
        status_writes, 0,
        "no ManagedCluster status write without a change"
    );
    assert!(beats >= 20, "heartbeats every ~2s: saw {beats}");
    assert_eq!(announces, 0, "the announce is written only when it changes");

    // Agent stopped → Unknown; restarted → Ready, same ID, no new registration.
    east.kill_agent();
    let stopped = Instant::now();
    wait_mc(&leader.admin, "east", "Ready=Unknown", |mc| {
        ready(mc).as_deref() == Some("Unknown")
    })
    .await;
    eprintln!("agent loss seen after {:?} (gracePeriod 6s)", stopped.elapsed());
    east.start_agent();
    wait_ready(&leader.admin, "east").await;
    assert_eq!(
        requests_for(&leader.admin, &east_id).await,
        1,
        "a restart does not register again"
    );
    assert_eq!(
        managed(&leader.admin, "east")
            .await
            .expect("east")
            .spec
            .cluster_id,
        east_id
    );

    // Credential revoked at the leader → the agent registers again by itself and recovers.
    let west_id = kube_system_uid(&west).await;
    let credential = |m: &MemberSide| {
        let api = Api::<Secret>::namespaced(m.admin.clone(), HOME);
        async move {
            api.get("tether-agent-credential")
                .await
                .ok()
                .and_then(|s| s.data)
                .map(|d| d["token"].clone())
        }
    };
    let old_token = credential(&west).await.expect("west's credential");
    Api::<ServiceAccount>::namespaced(leader.admin.clone(), &tether_e2e::sim::ns_of("west"))
        .delete("tether-agent", &DeleteParams::default())
        .await
        .expect("revoke");
    eventually(
        "west to re-register and hold a new credential",
        Duration::from_secs(60),
        || async {
            let n = requests_for(&leader.admin, &west_id).await;
            let fresh = credential(&west).await.is_some_and(|t| t != old_token);
            let state = west.set().await.and_then(|s| s.status).and_then(|s| s.state);
            if n >= 2 && fresh && state.as_deref() == Some("Ready") {
                Ok(())
            } else {
                Err(format!("{n} {fresh} {state:?}"))
            }
        },
    )
    .await;
    wait_ready(&leader.admin, "west").await;
    Api::<ServiceAccount>::namespaced(leader.admin.clone(), &tether_e2e::sim::ns_of("west"))
        .get("tether-agent")
        .await
        .expect("the leader recreated west's ServiceAccount");

    // Leave: everything at the leader and at the member goes.
    Api::<tether_api::ClusterSet>::namespaced(west.admin.clone(), HOME)
        .delete(SET, &DeleteParams::default())
        .await
        .expect("leave");
    eventually(
        "west's Member ClusterSet gone",
        Duration::from_secs(30),
        || async {
            if west.set().await.is_none() {
                Ok(())
            } else {
                Err("still there")
            }
        },
    )
    .await;
    eventually(
        "west's namespace gone at the leader",
        Duration::from_secs(60),
        || async {
            let ns = Api::<Namespace>::all(leader.admin.clone())
                .get_opt(&tether_e2e::sim::ns_of("west"))
                .await
                .map_err(|e| e.to_string())?;
            if ns.is_none() {
                Ok(())
            } else {
                Err("still there".to_string())
            }
        },
    )
    .await;
    let secrets = Api::<Secret>::namespaced(west.admin.clone(), HOME);
    for s in ["tether-agent-key", "tether-agent-credential"] {
        assert!(secrets.get_opt(s).await.expect("get").is_none(), "{s} removed");
    }
    let props = Api::<ClusterProperty>::all(west.admin.clone());
    assert!(
        props.get_opt("clusterset.k8s.io").await.expect("get").is_none(),
        "set property removed"
    );
    assert!(
        props
            .get_opt("cluster.clusterset.k8s.io")
            .await
            .expect("get")
            .is_some(),
        "the cluster ID stays"
    );

    // The controllers' own RBAC was enough for all of this.
    for (who, log) in [
        ("leader", leader.controller.log()),
        ("east", east.agent.as_ref().map(|a| a.log()).unwrap_or_default()),
    ] {
        assert!(!log.contains("orbidden"), "RBAC denial in the {who} log:\n{log}");
        // No unverified connection to the leader, ever.
        assert!(
            !log.contains("bypassed"),
            "certificate check bypassed in the {who} log:\n{log}"
        );
    }
    let east_log = east.agent.as_ref().map(|a| a.log()).unwrap_or_default();
    assert!(
        east_log.contains("Leader CA verified against the pin"),
        "the agent says what it verified:\n{east_log}"
    );
    west.kill_agent();
}

#[tokio::test]
async fn a_wrong_pin_sends_nothing_to_the_leader() {
    let leader = LeaderSide::named("pin-leader")
        .policy(LeaderSpec::default())
        .start()
        .await;
    let token = BootstrapToken::random();
    token
        .create(&leader.admin, Some(&tether_e2e::sim::home()), None)
        .await
        .expect("token");
    let wrong = format!("sha256:{}", "ab".repeat(32));
    let m = fleet::member("pinned", &leader, &token, json!({"caCertHash": wrong})).await;
    eventually("the pin mismatch in status", Duration::from_secs(30), || async {
        let s = m.set().await.and_then(|s| s.status).ok_or("no status")?;
        let c = s
            .conditions
            .iter()
            .find(|c| c.type_ == "LeaderReachable")
            .ok_or("no condition")?;
        if c.reason == "PinMismatch"
            && c.message.contains("Nothing was sent")
            && c.message.contains(leader.cluster.ca_cert_hash())
        {
            Ok(())
        } else {
            Err(format!("{c:?}"))
        }
    })
    .await;
    let from_token = audit_events(&leader.cluster, |e| {
        e["user"]["username"] == token.user().as_str()
    });
    assert!(
        from_token.is_empty(),
        "requests with the join token reached the leader: {from_token:?}"
    );
    let discovery = audit_events(&leader.cluster, |e| {
        e["user"]["username"] == "system:anonymous" && e["objectRef"]["name"] == "cluster-info"
    });
    assert!(
        !discovery.is_empty(),
        "the agent did read cluster-info anonymously"
    );
    let requests = Api::<ClusterRegistrationRequest>::namespaced(leader.admin.clone(), HOME)
        .list(&ListParams::default())
        .await
        .expect("list");
    assert!(requests.items.is_empty(), "no registration request");
}

#[tokio::test]
async fn an_expired_join_token_is_reported_with_what_to_do() {
    let leader = LeaderSide::named("expired-leader")
        .policy(LeaderSpec::default())
        .start()
        .await;
    let token = BootstrapToken::random();
    token
        .create(
            &leader.admin,
            Some(&tether_e2e::sim::home()),
            Some("2020-01-01T00:00:00Z".parse().expect("time")),
        )
        .await
        .expect("token");
    let m = fleet::member("late", &leader, &token, json!({})).await;
    m.wait_join_token_expired().await;
    let requests = Api::<ClusterRegistrationRequest>::namespaced(leader.admin.clone(), HOME)
        .list(&ListParams::default())
        .await
        .expect("list");
    assert!(requests.items.is_empty(), "an expired token registers nothing");
}
