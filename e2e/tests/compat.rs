//! The member side on another Kubernetes version: a member cluster of `TETHER_MEMBER_KUBERNETES`
//! (default: `KUBERNETES_OLDEST` of `e2e/versions.env`, so `make test` always runs the oldest
//! supported minor) joins a leader of `TETHER_LEADER_KUBERNETES` (default: `KUBERNETES_VERSION`),
//! reports its status and version, heartbeats, serves member access through its tunnel with its
//! own RBAC deciding, and leaves cleanly. `make test-compat` runs this binary for every supported
//! member version against the oldest and the newest leader (`e2e/compat.sh`).
//!
//! This binary has its own `main` (libtest-mimic): it moves into its lab network namespace
//! first, so every address it uses lives in namespaces this run creates.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams};
use serde_json::json;
use tether_e2e::access::{allow_impersonation, apply, get, grant_proxy, through, wait_tunnel};
use tether_e2e::fleet::{self, LeaderSide, policy, ready, wait_mc};
use tether_e2e::sim::{HOME, SET, join_token, ns_of};
use tether_testkit::{TestCluster, eventually, free_port, lab, tools};

fn main() -> ExitCode {
    tether_e2e::lab_main(
        "the version compatibility test",
        "a_member_of_another_kubernetes_version_joins_reports_serves_and_leaves",
        compat,
    )
}

/// The version of one side: its environment variable, else `versions.env`'s `default_key`.
fn version(var: &str, default_key: &str) -> String {
    std::env::var(var)
        .ok()
        .filter(|v| !v.is_empty())
        .or_else(|| tools::pinned(default_key))
        .unwrap_or_else(|| panic!("neither {var} nor {default_key} in e2e/versions.env"))
}

fn step(start: Instant, what: &str) {
    eprintln!("== [{:6.1}s] {what}", start.elapsed().as_secs_f64());
}

async fn server_version(c: &kube::Client) -> String {
    c.apiserver_version().await.expect("/version").git_version
}

async fn compat() {
    let start = Instant::now();
    let leader_version = version("TETHER_LEADER_KUBERNETES", "KUBERNETES_VERSION");
    let member_version = version("TETHER_MEMBER_KUBERNETES", "KUBERNETES_OLDEST");
    step(
        start,
        &format!("leader on Kubernetes {leader_version}, member on {member_version}"),
    );
    let cluster = TestCluster::builder("compat-leader")
        .kubernetes(&leader_version)
        .start()
        .await
        .expect("leader cluster");
    let addr = std::net::SocketAddr::from((lab::GATEWAY, free_port().expect("port")));
    let leader = LeaderSide::on(cluster)
        .policy(policy("2s", "6s"))
        .proxy(addr, 4)
        .start()
        .await;
    assert_eq!(server_version(&leader.admin).await, leader_version);
    let token = join_token(&leader.admin).await;
    let member = fleet::member_on(
        fleet::member_cluster("compat-member").kubernetes(&member_version),
        &leader,
        &token,
        json!({}),
        &["--impersonate-users=alice"],
    )
    .await;
    assert_eq!(server_version(&member.admin).await, member_version);

    step(start, "the member joins and reports its version");
    wait_mc(&leader.admin, "compat-member", "Ready with its version", |mc| {
        ready(mc).as_deref() == Some("True")
            && mc.status.as_ref().and_then(|s| s.kubernetes_version.as_deref())
                == Some(member_version.as_str())
    })
    .await;

    step(start, "the agent shows the leader's verdict on its version");
    eventually(
        "AgentVersionSupported=True on the member's ClusterSet",
        Duration::from_secs(60),
        || async {
            let conditions = member
                .set()
                .await
                .and_then(|s| s.status)
                .map(|s| s.conditions)
                .unwrap_or_default();
            match conditions.iter().find(|c| c.type_ == "AgentVersionSupported") {
                Some(c) if c.status == "True" && c.reason == "WithinSkew" => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;

    step(
        start,
        "it is alive on its tunnel, and renewed its heartbeat Lease",
    );
    wait_mc(&leader.admin, "compat-member", "Ready=True/TunnelAlive", |mc| {
        mc.status
            .as_ref()
            .and_then(|s| {
                tether_api::conditions::find(&s.conditions, tether_api::conditions::ConditionType::Ready)
            })
            .is_some_and(|c| c.status == "True" && c.reason == "TunnelAlive")
    })
    .await;
    eventually("a heartbeat Lease renewal", Duration::from_secs(30), || async {
        match fleet::heartbeat_time(&leader.admin, "compat-member").await {
            Some(_) => Ok(()),
            None => Err("never renewed"),
        }
    })
    .await;

    step(
        start,
        "member access through its tunnel; the member's RBAC decides",
    );
    wait_tunnel(&leader, "compat-member", "True").await;
    grant_proxy(&leader, "compat-member", &["alice"]).await;
    allow_impersonation(&member, &["alice"], &[]).await;
    apply(
        &member.admin,
        None,
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "namespace-reader"},
        "rules": [{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list"]}]}),
    )
    .await;
    apply(&member.admin, None, json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "alice-reads-namespaces"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "namespace-reader"},
        "subjects": [{"kind": "User", "name": "tether:prod:alice", "apiGroup": "rbac.authorization.k8s.io"}]}))
    .await;
    let alice = through(&leader, "alice", None, "compat-member").await;
    let namespaces = get(&alice, "/api/v1/namespaces", &[])
        .await
        .expect("alice lists the member's namespaces (the member lets her)");
    assert!(namespaces.contains("kube-system"), "{namespaces}");
    let version_through = get(&alice, "/version", &[]).await.expect("/version");
    assert!(
        version_through.contains(&member_version),
        "the tunnel reaches the member's API server: {version_through}"
    );
    let err = get(&alice, "/api/v1/namespaces/kube-system/secrets", &[])
        .await
        .expect_err("alice has no right to the member's Secrets");
    assert!(err.0 == 403 && err.1.contains("tether:prod:alice"), "{err:?}");

    step(start, "it leaves: everything at the leader goes");
    Api::<tether_api::ClusterSet>::namespaced(member.admin.clone(), HOME)
        .delete(SET, &DeleteParams::default())
        .await
        .expect("leave");
    eventually(
        "the member's namespace gone at the leader",
        Duration::from_secs(60),
        || async {
            let ns = Api::<Namespace>::all(leader.admin.clone())
                .get_opt(&ns_of("compat-member"))
                .await
                .map_err(|e| e.to_string())?;
            match (ns, fleet::managed(&leader.admin, "compat-member").await) {
                (None, Err(_)) => Ok(()),
                (ns, mc) => Err(format!(
                    "namespace {:?}, ManagedCluster {:?}",
                    ns.map(|n| n.metadata.name),
                    mc.map(|m| m.metadata.name)
                )),
            }
        },
    )
    .await;
    step(start, "done");
}
