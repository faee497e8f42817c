//! Member access attacked, on real clusters: a leader whose kube-apiserver runs the aggregation
//! layer, its controller serving `proxy.multicluster.tether.dev` on the lab bridge (connection
//! cap 300), and members east and west whose agents dial their tunnels out. Each scenario is
//! what an attacker would try, and shows the refusal: a token minted for an agent taking over
//! its tunnel, a second attach with the member's own key (replaced, with a Warning), a flood of
//! idle connections, a peer without the front proxy's certificate, trickled request bodies, a
//! malformed pass-through credential, forged audit fields, an anonymous caller at `rejoin`, a
//! member's identity asking to attach in a loop to push the fleet's turns out, a ManagedCluster
//! patcher re-keying a member, a join-token holder taking a silent member's name or ID, and
//! revocation (the agent's
//! ServiceAccount deleted, the member removed) closing the tunnel within 10 s.
//!
//! One fixture, scenarios run in order (revocations last), each reported as its own test.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::header::{CONNECTION, UPGRADE};
use http::{Request, StatusCode};
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;
use tether_api::ManagedCluster;
use tether_e2e::access::{
    allow_impersonation, apply, get, grant_proxy, leader_counter, leader_metric, leader_metric_read, sealed,
    serve_from_the_first_byte, through, wait_tunnel,
};
use tether_e2e::fleet::{self, LeaderSide, MemberSide, policy};
use tether_e2e::sim::{HOME, join_token, ns_of};
use tether_e2e::{Scenario, lab_scenarios};
use tether_testkit::{TestCluster, eventually, free_port, lab};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[path = "attacks/bounds.rs"]
mod bounds;
#[path = "attacks/identity.rs"]
mod identity;
#[path = "attacks/pace.rs"]
mod pace;
#[path = "attacks/replace.rs"]
mod replace;

use identity::{
    a_ban_written_into_the_set_closes_the_tunnel_and_holds_whatever_the_cluster_reports,
    a_join_token_holder_cannot_take_a_silent_members_name_or_id,
    a_members_key_cannot_be_changed_by_whoever_may_patch_managedclusters,
};
use pace::one_member_asking_to_attach_in_a_loop_holds_one_turn_and_pushes_no_other_out;

use replace::an_attach_with_the_members_own_key_replaces_the_tunnel_with_a_warning;

use bounds::{
    a_peer_without_the_front_proxy_certificate_gets_health_only_then_is_closed,
    deleting_the_agents_service_account_closes_its_tunnel_within_10_s,
    removing_a_member_closes_its_tunnel_within_10_s,
    six_hundred_idle_connections_are_closed_within_30_s_without_a_restart,
    trickled_request_bodies_are_bounded_and_others_are_served,
};

/// Connections the leader's proxy port holds at once in this fixture.
const MAX_CONNECTIONS: usize = 300;
/// Tunnels the leader lets attach per second in this fixture (its default is 250).
const ATTACH_RATE: f64 = 1.0;

struct World {
    leader: LeaderSide,
    east: MemberSide,
    west: MemberSide,
    /// The serving replica's proxy address.
    proxy: SocketAddr,
}

macro_rules! scenarios {
    ($($f:ident),* $(,)?) => {
        vec![$((stringify!($f), (|w| Box::pin($f(w))) as Scenario<World>)),*]
    };
}

fn main() -> ExitCode {
    lab_scenarios(
        "the member-access attack tests",
        setup,
        scenarios![
            a_token_minted_for_the_agent_cannot_take_over_its_tunnel,
            an_anonymous_caller_cannot_rejoin_as_a_member_nor_learn_who_is_one,
            an_attach_with_the_members_own_key_replaces_the_tunnel_with_a_warning,
            a_malformed_member_credential_is_refused_not_sent_as_anonymous,
            a_passed_through_member_token_is_not_readable_in_the_leaders_logs,
            headers_that_set_the_members_audit_fields_are_stripped,
            a_peer_without_the_front_proxy_certificate_gets_health_only_then_is_closed,
            six_hundred_idle_connections_are_closed_within_30_s_without_a_restart,
            trickled_request_bodies_are_bounded_and_others_are_served,
            one_member_asking_to_attach_in_a_loop_holds_one_turn_and_pushes_no_other_out,
            a_members_key_cannot_be_changed_by_whoever_may_patch_managedclusters,
            a_join_token_holder_cannot_take_a_silent_members_name_or_id,
            deleting_the_agents_service_account_closes_its_tunnel_within_10_s,
            removing_a_member_closes_its_tunnel_within_10_s,
            a_ban_written_into_the_set_closes_the_tunnel_and_holds_whatever_the_cluster_reports,
        ],
    )
}

async fn setup() -> World {
    // NB: --v=7: the aggregator's client-go transport logs the request headers it forwards.
    let cluster = TestCluster::builder("leader")
        .verbosity(7)
        .start()
        .await
        .expect("leader cluster");
    let port = free_port().expect("port");
    let proxy = SocketAddr::from((lab::GATEWAY, port));
    let cap = format!("--proxy-max-connections={MAX_CONNECTIONS}");
    let rate = format!("--proxy-attach-rate={ATTACH_RATE}");
    let leader = LeaderSide::on(cluster)
        .policy(policy("2s", "6s"))
        .proxy(proxy, 4)
        .args(&[&cap, &rate])
        .start()
        .await;
    let token = join_token(&leader.admin).await;
    let east =
        fleet::member_with_args("east", &leader, &token, json!({}), &["--impersonate-users=alice"]).await;
    let west =
        fleet::member_with_args("west", &leader, &token, json!({}), &["--impersonate-users=alice"]).await;
    for m in ["east", "west"] {
        wait_tunnel(&leader, m, "True").await;
    }
    // The agent says so too (the chart's TetherTunnelDown alert reads it).
    let agent = east.agent.as_ref().expect("east's agent");
    eventually(
        "east's agent reports tether_agent_tunnel_attached 1",
        Duration::from_secs(10),
        || async {
            let (_, text) = agent.admin_get("/metrics").await.map_err(|e| e.to_string())?;
            match tether_e2e::probe::prom::metric(&text, "tether_agent_tunnel_attached") {
                Some(1.0) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    grant_proxy(&leader, "east", &["alice", "carol"]).await;
    grant_proxy(&leader, "west", &["alice"]).await;
    for m in [&east, &west] {
        allow_alice(m).await;
    }
    World {
        leader,
        east,
        west,
        proxy,
    }
}

/// Anyone may ask `rejoin` for a challenge (an agent whose credential expired has no token),
/// so an attacker without the member's key tries to get a credential with it: every answer is a
/// challenge of the same kind whether or not the member exists, no proof but the real one is
/// accepted, an attach proof does not rejoin, and nothing else of the proxy API is open to them.
async fn an_anonymous_caller_cannot_rejoin_as_a_member_nor_learn_who_is_one(w: &World) {
    let anonymous = w.leader.cluster.anonymous_client().expect("anonymous client");
    let counted = |series: &'static str| async move {
        let (_, text) = w
            .leader
            .controller
            .admin_get("/metrics")
            .await
            .expect("leader /metrics");
        tether_e2e::probe::prom::metric(&text, series).unwrap_or(0.0)
    };
    let challenges = "tether_leader_proxy_requests_total{result=\"rejoin_challenge\"}";
    let rejoined = counted(challenges).await;
    let ask = |name: &str| {
        let path = tether_tunnel::rejoin_path(&ns_of(name), name);
        let anonymous = anonymous.clone();
        async move { get(&anonymous, &path, &[]).await }
    };
    let member = ask("east").await.expect("a challenge for east");
    let nobody = ask("zzzz")
        .await
        .expect("a challenge for a name nobody registered");
    let sealed = |text: &str| {
        serde_json::from_str::<tether_tunnel::proof::Challenge>(text)
            .expect("a challenge")
            .sealed
    };
    // NB: age pads each message with a random-length "grease" stanza, so sizes vary anyway.
    for answer in [&member, &nobody] {
        let armored = sealed(answer);
        assert!(
            armored.starts_with("-----BEGIN AGE ENCRYPTED FILE-----"),
            "an age message either way: {answer}"
        );
    }
    assert!(counted(challenges).await >= rejoined + 2.0);
    let path = tether_tunnel::rejoin_path(&ns_of("east"), "east");
    for forged in [
        "1.2.3",
        "1733270000.0123456789abcdef0123456789abcdef.00",
        &format!(
            "{}.0123456789abcdef0123456789abcdef.{}",
            1_733_270_000,
            "ab".repeat(32)
        ),
    ] {
        let err = get(&anonymous, &path, &[("tether-attach-proof", forged)])
            .await
            .expect_err("a forged proof is refused");
        assert_eq!(err.0, 403, "{forged}: {err:?}");
    }
    // The attach path, the proxy path and the leader's own API stay closed to anonymous callers.
    for path in [
        tether_tunnel::attach_path(&ns_of("east"), "east"),
        format!(
            "{}/api/v1/namespaces",
            tether_tunnel::proxy_path(&ns_of("east"), "east")
        ),
        format!(
            "/apis/multicluster.tether.dev/v1alpha1/namespaces/{}/managedclusters",
            ns_of("east")
        ),
    ] {
        let err = get(&anonymous, &path, &[]).await.expect_err("anonymous refused");
        assert!(matches!(err.0, 401 | 403), "{path}: {err:?}");
    }
    let minted = counted("tether_leader_registrations_total{result=\"Rejoined\"}").await;
    assert_eq!(minted, 0.0, "no credential was minted by rejoin");
}

/// Member side: the agent may impersonate tether:prod:alice, who may read namespaces (the
/// members run no controller-manager, so the aggregated `view` role is empty).
async fn allow_alice(m: &MemberSide) {
    let c = &m.admin;
    allow_impersonation(m, &["alice"], &[]).await;
    apply(
        c,
        None,
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "namespace-reader"},
        "rules": [{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list"]}]}),
    )
    .await;
    apply(c, None, json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "alice-reads-namespaces"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "namespace-reader"},
        "subjects": [{"kind": "User", "name": "tether:prod:alice", "apiGroup": "rbac.authorization.k8s.io"}]}))
    .await;
}

/// Waits until leader user alice lists member `name`'s namespaces through the leader.
async fn alice_is_served(w: &World, name: &str) {
    let alice = through(&w.leader, "alice", None, name).await;
    eventually(
        &format!("alice is served by {name}"),
        Duration::from_secs(60),
        || async {
            get(&alice, "/api/v1/namespaces", &[])
                .await
                .map_err(|e| format!("{e:?}"))
        },
    )
    .await;
}

/// A token of member `name`'s agent ServiceAccount on the leader, minted by the leader's admin.
async fn minted_agent_token(w: &World, name: &str) -> String {
    Api::<ServiceAccount>::namespaced(w.leader.admin.clone(), &ns_of(name))
        .create_token_request("tether-agent", &PostParams::default(), &TokenRequest::default())
        .await
        .expect("token request")
        .status
        .expect("status")
        .token
}

/// GETs member `name`'s attach path with `token`, with a proof and an upgrade as asked; the
/// status, the body (when not upgraded) and the upgraded connection (when it was).
async fn attach(
    w: &World,
    token: &str,
    name: &str,
    proof: Option<&str>,
    upgrade: bool,
) -> (StatusCode, String, Option<hyper::upgrade::Upgraded>) {
    let c = w.leader.cluster.client_with_token(token).expect("client");
    let mut req = Request::get(tether_tunnel::attach_path(&ns_of(name), name));
    if let Some(p) = proof {
        req = req.header(tether_tunnel::proof::ATTACH_PROOF, p);
    }
    if upgrade {
        req = req
            .header(CONNECTION, "Upgrade")
            .header(UPGRADE, tether_tunnel::UPGRADE_PROTOCOL);
    }
    let mut resp = c
        .send(req.body(kube::client::Body::empty()).expect("request"))
        .await
        .expect("send");
    let code = resp.status();
    if code == StatusCode::SWITCHING_PROTOCOLS {
        let up = hyper::upgrade::on(&mut resp).await.expect("upgraded");
        return (code, String::new(), Some(up));
    }
    let body = tether_tunnel::pipe::collect_limited(resp.into_body(), 16 * 1024).await;
    (code, String::from_utf8_lossy(&body).to_string(), None)
}

async fn a_token_minted_for_the_agent_cannot_take_over_its_tunnel(w: &World) {
    let token = minted_agent_token(w, "east").await;
    let (code, body, up) = attach(w, &token, "east", None, true).await;
    assert!(
        up.is_none(),
        "a minted agent token attached east's tunnel without the member's key"
    );
    assert_eq!(code, StatusCode::FORBIDDEN, "{body}");
    assert!(body.contains("proof of its registered key"), "{body}");

    // The challenge is sealed to east's key: the attacker's own key cannot open it.
    let (code, body, _) = attach(w, &token, "east", None, false).await;
    assert_eq!(code, StatusCode::OK, "{body}");
    let challenge: tether_tunnel::proof::Challenge = serde_json::from_str(&body).expect("challenge");
    let (mine, _) = tether_seal::generate_keypair();
    assert!(tether_seal::unseal_text(&challenge.sealed, &mine).is_err());
    for forged in [
        "1733270000.0123456789abcdef0123456789abcdef.00".to_string(),
        format!("{}.0123456789abcdef0123456789abcdef.{}", now(), "ab".repeat(32)),
        "garbage".to_string(),
    ] {
        let (code, body, up) = attach(w, &token, "east", Some(&forged), true).await;
        assert!(
            up.is_none() && code == StatusCode::FORBIDDEN,
            "{forged}: {code} {body}"
        );
    }
    // The real agent still serves, and nothing replaced its tunnel.
    alice_is_served(w, "east").await;
    let replaced = leader_metric(&w.leader, "tether_leader_tunnel_replacements_total").await;
    assert_eq!(replaced, 0.0, "no tunnel was replaced");
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

async fn a_malformed_member_credential_is_refused_not_sent_as_anonymous(w: &World) {
    let carol = through(&w.leader, "carol", None, "east").await;
    // NB: /version is readable by system:anonymous: forwarded as anonymous, it would answer 200.
    let not_bearer = sealed(&w.leader, "east", "carol", "two words").await;
    for bad in [
        "",
        "Bearer ",
        "Basic Y2Fyb2w6c2VjcmV0",
        "Token abc",
        "Bearer a b",
        "Sealed x",
        &not_bearer,
    ] {
        let err = get(&carol, "/version", &[("tether-member-authorization", bad)]).await;
        match err {
            Err((401, msg)) => assert!(msg.contains("nothing was sent to the member"), "{bad:?}: {msg}"),
            other => panic!("{bad:?} must be refused with 401, got {other:?}"),
        }
    }
}

async fn a_passed_through_member_token_is_not_readable_in_the_leaders_logs(w: &World) {
    let carol = through(&w.leader, "carol", None, "east").await;
    let marker = format!("leakcheck{}", now());
    let bearer = sealed(&w.leader, "east", "carol", &marker).await;
    let err = get(
        &carol,
        "/api/v1/namespaces",
        &[("tether-member-authorization", &bearer)],
    )
    .await;
    assert!(
        matches!(err, Err((401, _))),
        "east refuses the made-up token: {err:?}"
    );
    // A plain token is refused too, but only after it crossed the leader: the reason to seal.
    let plain = format!("Bearer plain{marker}");
    let err = get(&carol, "/version", &[("tether-member-authorization", &plain)]).await;
    assert!(
        matches!(&err, Err((401, m)) if m.contains("must be sealed")),
        "{err:?}"
    );
    let log = w.leader.cluster.log_of("kube-apiserver");
    assert!(
        log.contains("\"Request\"") && log.contains("headers=<"),
        "the leader's API server logs the request headers it forwards at --v=7"
    );
    assert!(
        log.contains(&format!("Bearer plain{marker}")),
        "this check can see a plain token"
    );
    let leaked: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(&marker) && !l.contains("Bearer plain"))
        .collect();
    assert!(
        leaked.is_empty(),
        "the member token is readable in the leader's API server log: {leaked:?}"
    );
}

async fn headers_that_set_the_members_audit_fields_are_stripped(w: &World) {
    let alice = through(&w.leader, "alice", None, "east").await;
    let marker = format!("audit-marker-{}", now());
    let chosen = format!("chosen-by-alice-{}", now());
    let forged = "203.0.113.66";
    let _ = get(
        &alice,
        &format!("/api/v1/namespaces/{marker}"),
        &[
            ("x-forwarded-for", forged),
            ("x-real-ip", forged),
            ("audit-id", &chosen),
        ],
    )
    .await;
    let event = eventually(
        "the request in east's audit log",
        Duration::from_secs(15),
        || async {
            let log = std::fs::read_to_string(w.east.cluster.audit_log()).map_err(|e| e.to_string())?;
            log.lines()
                .filter(|l| l.contains(&marker))
                .find(|l| l.contains("\"ResponseComplete\""))
                .map(str::to_string)
                .ok_or_else(|| "not yet".to_string())
        },
    )
    .await;
    let ev: serde_json::Value = serde_json::from_str(&event).expect("audit event");
    let ips = ev["sourceIPs"].to_string();
    assert!(
        !ips.contains(forged),
        "the caller chose the member's source IPs: {ips}"
    );
    assert_ne!(
        ev["auditID"].as_str(),
        Some(chosen.as_str()),
        "the caller chose the audit ID"
    );
    assert_eq!(
        ev["user"]["username"].as_str(),
        Some("system:serviceaccount:tether-system:tether-agent")
    );
    assert_eq!(
        ev["impersonatedUser"]["username"].as_str(),
        Some("tether:prod:alice")
    );
}
