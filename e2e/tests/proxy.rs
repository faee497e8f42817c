//! Member access through the leader, on real clusters: a leader whose kube-apiserver runs the
//! aggregation layer, the leader controller serving `proxy.multicluster.tether.dev` on the lab
//! bridge, and two members whose agents dial their tunnels out. Every identity rule is proven
//! against the real API servers: the leader's RBAC on `managedclusters/proxy`, the member's own
//! RBAC on the impersonated or passed-through identity, forged headers, another member's agent,
//! a watch longer than the leader's `--request-timeout`, an upgraded stream, a member whose
//! agent is gone, a rotated front-proxy CA (trusted and then dropped without a restart) and an
//! unusable one (the last good trust kept), the serving certificate renewed from the same CA
//! while serving (and a renewal the API server refuses, retried a minute later while the
//! front-proxy trust is still followed), a failover of the leader replica, and an agent Role
//! of an earlier version (no attach rule) that the new leader brings up to date.
//!
//! One fixture (a leader, east and west), and one named test per rule, run in order over it
//! (`tether_e2e::lab_scenarios`): the first failure hides nothing, and the name says what broke.
//! The binary has its own `main` (libtest-mimic): it moves into its lab network namespace first,
//! so every address it uses lives in namespaces this run creates.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use http::header::{CONNECTION, UPGRADE};
use http::{Request, StatusCode};
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Endpoints, Namespace, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::Role;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tether_e2e::access::{
    allow_impersonation, apply, get, grant_proxy, leader_metric, sealed, through, wait_tunnel,
};
use tether_e2e::fleet::{self, LeaderSide, MemberSide, policy};
use tether_e2e::sim::{HOME, join_token, ns_of};
use tether_e2e::{Scenario, lab_scenarios};
use tether_testkit::{TestCluster, eventually, free_port, lab};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

// NB: a test target's root looks for modules beside it, not in a folder of its name.
#[path = "proxy/identity.rs"]
mod identity;
#[path = "proxy/serving.rs"]
mod serving;
#[path = "proxy/streams.rs"]
mod streams;
#[path = "proxy/support.rs"]
mod support;

use support::*;

/// What every scenario runs over: the leader (its first replica serving member access on
/// `proxy_a`; a standby takes `proxy_b`), east (impersonation allowed for alice and devs) and
/// west (none). Scenarios that kill something hold the lock.
pub(crate) struct World {
    pub(crate) leader: tokio::sync::Mutex<LeaderSide>,
    pub(crate) east: MemberSide,
    pub(crate) west: tokio::sync::Mutex<MemberSide>,
    pub(crate) proxy_a: std::net::SocketAddr,
    pub(crate) proxy_b: std::net::SocketAddr,
    /// East's echo Service: upgrades on `/`, refuses on `/refuse`; it stops when dropped.
    pub(crate) _echo: EchoServer,
}

macro_rules! scenarios {
    ($($f:path),* $(,)?) => {
        vec![$((stringify!($f).rsplit("::").next().unwrap_or_default().trim(), (|w| Box::pin($f(w))) as Scenario<World>)),*]
    };
}

fn main() -> ExitCode {
    lab_scenarios(
        "the member-access test",
        setup,
        scenarios![
            identity::both_tunnels_attach,
            identity::the_leaders_rbac_decides_who_may_use_managedclusters_proxy,
            identity::the_members_rbac_decides_what_the_impersonated_user_may_do,
            identity::a_leader_user_without_managedclusters_proxy_gets_the_leaders_403,
            identity::a_user_not_on_the_members_allow_list_is_never_impersonated,
            identity::forged_identity_headers_are_refused_or_stripped,
            identity::a_passed_through_member_credential_decides_not_the_leader_identity,
            identity::kubectl_passes_a_member_token_through_with_member_token_file,
            identity::a_user_granted_only_in_easts_namespace_names_it_with_member_namespace,
            identity::agent_west_cannot_serve_easts_tunnel,
            streams::a_watch_through_the_proxy_outlives_the_leaders_request_timeout,
            streams::an_upgraded_stream_passes_through_both_ways,
            streams::an_upgrade_the_member_refuses_reaches_the_caller_and_closes,
            streams::a_member_whose_agent_is_gone_answers_503_naming_it,
            streams::tether_grant_revoke_refuses_alice_on_west_and_only_there,
            serving::a_rotated_front_proxy_ca_is_trusted_without_a_restart,
            serving::an_unusable_front_proxy_configmap_keeps_the_last_good_trust,
            serving::the_serving_certificate_is_renewed_from_the_same_ca_while_serving,
            serving::a_refused_renewal_is_counted_and_retried_while_the_trust_is_followed,
            serving::after_a_failover_the_standby_serves_and_updates_an_old_agent_role,
        ],
    )
}

/// A serving certificate this short is renewed (at 40 s) while the test runs.
const CERT_VALIDITY: &str = "--proxy-cert-validity=1m";
/// The leader's request timeout: the watch below must outlive it.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

async fn setup() -> World {
    let cluster = TestCluster::builder("leader")
        .request_timeout(REQUEST_TIMEOUT)
        .start()
        .await
        .expect("leader cluster");
    let addr = |port| std::net::SocketAddr::from((lab::GATEWAY, port));
    let (port_a, port_b) = (free_port().expect("port"), free_port().expect("port"));
    let leader = LeaderSide::on(cluster)
        .policy(policy("2s", "6s"))
        .proxy(addr(port_a), 4)
        .args(&[CERT_VALIDITY])
        .start()
        .await;
    let token = join_token(&leader.admin).await;
    let east = fleet::member_with_args(
        "east",
        &leader,
        &token,
        json!({}),
        &[
            "--impersonate-users=alice,bob-unlisted-not",
            "--impersonate-groups=devs",
        ],
    )
    .await;
    let west = fleet::member("west", &leader, &token, json!({})).await;
    // A member Service that speaks an upgrade protocol (and refuses one on `/refuse`).
    let echo = EchoServer::start().await;
    expose_echo(&east, echo.port).await;
    World {
        _echo: echo,
        leader: tokio::sync::Mutex::new(leader),
        east,
        west: tokio::sync::Mutex::new(west),
        proxy_a: addr(port_a),
        proxy_b: addr(port_b),
    }
}

/// Alice (of group devs) through the leader to east.
async fn alice(leader: &LeaderSide) -> Client {
    through(leader, "alice", Some("devs"), "east").await
}

/// A file in the leader cluster's folder holding `token`.
fn token_file(leader: &LeaderSide, name: &str, token: &str) -> std::path::PathBuf {
    let path = leader.cluster.dir().join(format!("{name}.token"));
    std::fs::write(&path, token).expect("token file");
    path
}

/// The API server's front-proxy trust (`kube-system/extension-apiserver-authentication`) as it
/// was, and a way to change its CA bundle.
struct FrontProxyTrust {
    configmaps: Api<ConfigMap>,
    /// The CA bundle as the API server wrote it.
    old_ca: String,
}

impl FrontProxyTrust {
    async fn read(leader: &LeaderSide) -> Self {
        let configmaps = Api::<ConfigMap>::namespaced(leader.admin.clone(), "kube-system");
        let trust = configmaps
            .get("extension-apiserver-authentication")
            .await
            .expect("front-proxy ConfigMap");
        let old_ca = trust
            .data
            .as_ref()
            .and_then(|d| d.get("requestheader-client-ca-file"))
            .cloned()
            .expect("requestheader CA");
        Self { configmaps, old_ca }
    }

    /// Sets the CA bundle to `pem`.
    async fn set(&self, pem: String) {
        self.configmaps
            .patch(
                "extension-apiserver-authentication",
                &PatchParams::default(),
                &Patch::Merge(json!({"data": {"requestheader-client-ca-file": pem}})),
            )
            .await
            .expect("patch the front-proxy CA bundle");
    }
}
