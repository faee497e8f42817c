//! Member access helpers shared by the member-access test and its benchmark: leader-side grants
//! of `managedclusters/proxy`, clients whose requests go to a member through the leader, and
//! the wait for a member's TunnelConnected condition.

use std::time::Duration;

use http::Request;
use kube::api::Api;
use kube::{Client, Config, ResourceExt};
use serde_json::json;
use tether_api::conditions::{ConditionType, find};
use tether_testkit::eventually;

use crate::fleet::{LeaderSide, managed};
use crate::sim::ns_of;

/// Waits until member `name`'s TunnelConnected condition is `status`.
pub async fn wait_tunnel(leader: &LeaderSide, name: &str, status: &str) {
    eventually(
        &format!("{name}: TunnelConnected={status}"),
        Duration::from_secs(60),
        || async {
            let mc = managed(&leader.admin, name).await?;
            let c = mc
                .status
                .as_ref()
                .and_then(|s| find(&s.conditions, ConditionType::TunnelConnected).cloned());
            match c {
                Some(c) if c.status == status => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
}

/// Server-side applies `value` (any kind the API server serves) as the tests' field manager.
pub async fn apply(client: &Client, ns: Option<&str>, value: serde_json::Value) {
    let obj: kube::api::DynamicObject = serde_json::from_value(value.clone()).expect("object");
    let gvk = kube::core::GroupVersionKind::try_from(obj.types.as_ref().expect("types")).expect("gvk");
    let (ar, _) = kube::discovery::pinned_kind(client, &gvk)
        .await
        .expect("discover kind");
    let api = match ns {
        Some(ns) => Api::<kube::api::DynamicObject>::namespaced_with(client.clone(), ns, &ar),
        None => Api::<kube::api::DynamicObject>::all_with(client.clone(), &ar),
    };
    api.patch(
        &obj.name_any(),
        &kube::api::PatchParams::apply("tether-e2e").force(),
        &kube::api::Patch::Apply(value),
    )
    .await
    .expect("apply");
}

/// Lets `users` call managedclusters/proxy on member `name` (a leader-side Role).
pub async fn grant_proxy(leader: &LeaderSide, name: &str, users: &[&str]) {
    let ns = ns_of(name);
    apply(
        &leader.admin,
        Some(&ns),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "member-proxy", "namespace": ns},
        "rules": [{"apiGroups": [tether_tunnel::GROUP], "resources": ["managedclusters/proxy"],
                   "verbs": ["get", "create", "update", "patch", "delete"]}]}),
    )
    .await;
    let subjects: Vec<_> = users
        .iter()
        .map(|u| json!({"kind": "User", "name": u, "apiGroup": "rbac.authorization.k8s.io"}))
        .collect();
    apply(
        &leader.admin,
        Some(&ns),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "member-proxy", "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "member-proxy"},
        "subjects": subjects}),
    )
    .await;
}

/// A client of leader user `user` whose requests go to member `name` through the proxy.
pub async fn through(leader: &LeaderSide, user: &str, group: Option<&str>, name: &str) -> Client {
    let mut config: Config = leader
        .cluster
        .user_config(user, group)
        .await
        .expect("user config");
    let base = format!(
        "{}{}",
        leader.cluster.url(),
        tether_tunnel::proxy_path(&ns_of(name), name)
    );
    config.cluster_url = base.parse().expect("url");
    // NB: as kubectl does, take a 503 as an answer instead of retrying it.
    config.default_retry = false;
    Client::try_from(config).expect("client")
}

/// GET `path` with extra headers; an error is (code, message).
pub async fn get(c: &Client, path: &str, headers: &[(&str, &str)]) -> Result<String, (u16, String)> {
    let mut req = Request::get(path);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    c.request_text(req.body(Vec::new()).expect("request"))
        .await
        .map_err(|e| match e {
            kube::Error::Api(s) => (s.code, s.message),
            other => (0, other.to_string()),
        })
}

/// The value of the series `series` (name and labels, as printed) on the leader's `/metrics`.
pub async fn leader_metric(leader: &LeaderSide, series: &str) -> f64 {
    leader_metric_read(leader, series)
        .await
        .expect("leader /metrics")
        .unwrap_or_else(|| panic!("no {series} in the leader's metrics"))
}

/// The value of `series` on the leader's `/metrics`, `None` while it has none; an error when
/// `/metrics` did not answer (for a condition polled until it holds).
pub async fn leader_metric_read(leader: &LeaderSide, series: &str) -> Result<Option<f64>, String> {
    let (_, text) = leader
        .controller
        .admin_get("/metrics")
        .await
        .map_err(|e| format!("leader /metrics: {e}"))?;
    Ok(crate::probe::prom::metric(&text, series))
}

/// The leader's counter `series`, 0 while it has counted nothing (a labelled series appears with
/// its first count).
pub async fn leader_counter(leader: &LeaderSide, series: &str) -> f64 {
    leader_metric_read(leader, series)
        .await
        .expect("leader /metrics")
        .unwrap_or(0.0)
}

/// `token` as leader user `user` passes it through to member `name`: sealed to the key the
/// member registered (read from its ManagedCluster), now.
pub async fn sealed(leader: &LeaderSide, name: &str, user: &str, token: &str) -> String {
    let mc = managed(&leader.admin, name).await.expect("member");
    let key = mc.spec.public_key.clone().expect("registered key");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    tether_tunnel::passthrough::seal(&key, &ns_of(name), name, user, token, now)
        .expect("seal")
        .to_str()
        .expect("text")
        .to_string()
}

/// Member side, as its admin sets it: the agent may impersonate exactly the names on the member
/// of leader `users` and `groups` of set `prod` (`resourceNames`), nothing else.
pub async fn allow_impersonation(m: &crate::fleet::MemberSide, users: &[&str], groups: &[&str]) {
    let names = |kind: &str, names: &[&str]| {
        let prefixed: Vec<String> = names
            .iter()
            .map(|n| match kind {
                "users" => tether_tunnel::identity::member_user(crate::sim::SET, n)
                    .expect("a user the agent impersonates"),
                _ => tether_tunnel::identity::prefixed(crate::sim::SET, n),
            })
            .collect();
        json!({"apiGroups": [""], "resources": [kind], "verbs": ["impersonate"], "resourceNames": prefixed})
    };
    let mut rules = vec![names("users", users)];
    if !groups.is_empty() {
        rules.push(names("groups", groups));
    }
    apply(
        &m.admin,
        None,
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "tether-agent-impersonate"}, "rules": rules}),
    )
    .await;
    apply(&m.admin, None, json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "tether-agent-impersonate"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "tether-agent-impersonate"},
        "subjects": [{"kind": "ServiceAccount", "name": "tether-agent", "namespace": crate::sim::HOME}]}))
    .await;
}

/// Serves HTTP/2 from the first byte on tunnel `up`, as an agent from before the on-demand start
/// does (it offered nothing at attach), answering every request with `body`.
pub fn serve_from_the_first_byte(up: hyper::upgrade::Upgraded, body: String) -> tokio::task::JoinHandle<()> {
    let answer = move |_req: Request<hyper::body::Incoming>| {
        let body = bytes::Bytes::from(body.clone());
        async move { Ok::<_, std::convert::Infallible>(hyper::Response::new(http_body_util::Full::new(body))) }
    };
    tokio::spawn(async move {
        let _ = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .serve_connection(up, hyper::service::service_fn(answer))
            .await;
    })
}
