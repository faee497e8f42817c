//! Ensures every request to the aggregated server is answered on behalf of a caller the leader's
//! API server vouched for: the front-proxy certificate is checked before any header is read,
//! `attach` is the member's own agent's alone (`attach.rs`), `rejoin` is anyone's but answers
//! only the holder of a member's key (`rejoin.rs`), and a user's
//! request travels to the member as one HTTP/2 stream with every forgeable identity header
//! removed. Errors are Kubernetes `Status` objects that name the member and say why.

use std::convert::Infallible;
use std::sync::Arc;

use http::header::CONNECTION;
use http::{HeaderValue, Request, Response, StatusCode, Version};
use hyper::body::Incoming;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    APIGroup, APIGroupList, APIResource, APIResourceList, GroupVersionForDiscovery,
};
use kube::runtime::reflector::Store;
use tether_api::ManagedCluster;
use tether_tunnel::headers::{self, MEMBER_AUTHORIZATION, REMOTE_GROUP, REMOTE_USER, strip_untrusted};
use tether_tunnel::identity::Caller;
use tether_tunnel::passthrough;
use tether_tunnel::pipe::{self, Body};
use tether_tunnel::relay::{self, Hop};
use tether_tunnel::route::{Discovery, Route, route};
use tether_tunnel::{ATTACH, GROUP, PROXY, REJOIN, RESOURCE, VERSION, status};
use tracing::debug;

use super::frontproxy::FrontProxy;
use super::shared::{Shared, json, member_cluster, registered_key};
use super::tunnels::MemberKey;
use super::{attach, rejoin};
use crate::metrics::Proxied;

/// How long a request waits for an idle tunnel to start HTTP/2 (one round trip to its agent).
const START_WITHIN: std::time::Duration = std::time::Duration::from_secs(10);

/// Answers one request; `front` is the front-proxy trust the connection's peer was verified
/// against, or why the peer is not the front proxy.
pub async fn handle(
    req: Request<Incoming>,
    front: Result<Arc<FrontProxy>, Arc<str>>,
    sh: Arc<Shared>,
) -> Result<Response<Body>, Infallible> {
    let path = req.uri().path().to_string();
    let r = route(&path);
    if r == Route::Health {
        return Ok(text(StatusCode::OK, "ok"));
    }
    let front = match front {
        Ok(front) => front,
        Err(why) => {
            sh.ctx.metrics.proxied(Proxied::Unauthenticated);
            return Ok(status(StatusCode::UNAUTHORIZED, &why));
        }
    };
    let Some(caller) = front.caller(req.headers()) else {
        sh.ctx.metrics.proxied(Proxied::Unauthenticated);
        return Ok(status(StatusCode::UNAUTHORIZED, "the front proxy named no user"));
    };
    Ok(match r {
        Route::Discovery(d) => json(&discovery(d)),
        Route::OpenApi => json(&serde_json::json!({
            "swagger": "2.0", "info": {"title": "tether-proxy", "version": VERSION}, "paths": {}
        })),
        Route::Attach { namespace, name } => attach::attach(req, &caller, member(namespace, name), &sh),
        Route::Rejoin { namespace, name } => {
            let m = member(namespace, name);
            rejoin::rejoin(req, m, &sh).await
        }
        Route::Proxy {
            namespace,
            name,
            path,
        } => {
            let m = member(namespace, name);
            let path = path.to_string();
            proxy(req, &caller, m, &path, &sh).await
        }
        Route::Health | Route::NotFound => {
            status(StatusCode::NOT_FOUND, &format!("{path} is not served here"))
        }
    })
}

fn member(namespace: &str, name: &str) -> MemberKey {
    MemberKey {
        namespace: namespace.to_string(),
        name: name.to_string(),
    }
}

/// Whether `m` is a member the leader created.
fn known(clusters: &Store<ManagedCluster>, m: &MemberKey) -> bool {
    member_cluster(clusters, m).is_some()
}

async fn proxy(
    req: Request<Incoming>,
    caller: &Caller,
    m: MemberKey,
    path: &str,
    sh: &Arc<Shared>,
) -> Response<Body> {
    let Some(mut line) = sh.tunnels.get(&m) else {
        sh.ctx.metrics.proxied(Proxied::NoTunnel);
        let why = if known(&sh.ctx.clusters, &m) {
            format!(
                "member {} is not reachable: its agent has no tunnel to this leader (the agent is \
                 not running or cannot reach the leader); see `kubectl get mcls -n {} {} -o wide`",
                m.name, m.namespace, m.name
            )
        } else {
            format!("no member {} in namespace {}", m.name, m.namespace)
        };
        return status(StatusCode::SERVICE_UNAVAILABLE, &why);
    };
    let upgrade = headers::upgrade_request(req.headers());
    let (mut parts, body) = req.into_parts();
    let target = match parts.uri.query() {
        Some(q) => format!("http://member{path}?{q}"),
        None => format!("http://member{path}"),
    };
    let Ok(uri) = target.parse() else {
        return status(StatusCode::BAD_REQUEST, "the member path is not a valid URI");
    };
    parts.uri = uri;
    parts.version = Version::HTTP_2;
    strip_untrusted(&mut parts.headers, true);
    let Ok(user) = HeaderValue::from_str(&caller.user) else {
        return status(StatusCode::BAD_REQUEST, "the user name is not a valid header");
    };
    parts.headers.insert(REMOTE_USER, user);
    for g in caller.groups.iter().filter_map(|g| HeaderValue::from_str(g).ok()) {
        parts.headers.append(REMOTE_GROUP, g);
    }
    let has_member_credential = parts.headers.contains_key(MEMBER_AUTHORIZATION);
    debug!(member = %m.name, user = %caller.user, method = %parts.method, path, pass_through = has_member_credential, "Proxying");
    // NB: an idle tunnel starts HTTP/2 now; its agent confirms within one round trip.
    let Ok(Some(mut send)) = tokio::time::timeout(START_WITHIN, line.sender()).await else {
        sh.ctx.metrics.proxied(Proxied::TunnelError);
        return tunnel_failed(&m, "the tunnel closed before it carried the request");
    };
    if send.ready().await.is_err() {
        sh.ctx.metrics.proxied(Proxied::TunnelError);
        return tunnel_failed(&m, "the tunnel closed");
    }
    let Some(protocol) = upgrade else {
        let resp = send
            .send_request(Request::from_parts(parts, pipe::boxed(body)))
            .await;
        return match resp {
            Ok(r) => {
                sh.ctx.metrics.proxied(Proxied::Ok);
                let mut out = relay::answer(r, Hop::Caller);
                recipient(out.headers_mut(), sh, &m);
                out
            }
            Err(e) => {
                sh.ctx.metrics.proxied(Proxied::TunnelError);
                tunnel_failed(&m, &e.to_string())
            }
        };
    };
    // An upgrade (exec, attach, port-forward): the caller's raw connection is spliced with one
    // stream once the member agreed to switch.
    let on_upgrade = parts.extensions.remove::<hyper::upgrade::OnUpgrade>();
    let Ok(p) = HeaderValue::from_str(&protocol) else {
        return status(StatusCode::BAD_REQUEST, "the Upgrade header is not valid");
    };
    parts.headers.insert(headers::UPGRADE, p);
    // NB: an upgrade request has no body of its own; the stream's body carries the caller's bytes,
    // so its `Content-Length: 0` (a POST upgrade: SPDY exec, attach, port-forward) must not reach
    // the HTTP/2 stream, whose peer would reset it at the first byte past that length.
    drop(body);
    parts.headers.remove(http::header::CONTENT_LENGTH);
    let (to_member, out) = pipe::channel();
    let resp = match send.send_request(Request::from_parts(parts, out)).await {
        Ok(r) => r,
        Err(e) => {
            sh.ctx.metrics.proxied(Proxied::TunnelError);
            return tunnel_failed(&m, &e.to_string());
        }
    };
    match (resp.headers().get(headers::UPGRADE).cloned(), on_upgrade) {
        (Some(proto), Some(on_upgrade)) => {
            sh.ctx.metrics.proxied(Proxied::Upgraded);
            let out = relay::switched(resp.headers(), proto, Hop::Caller);
            relay::splice_upgraded(on_upgrade, to_member, resp.into_body(), ());
            out
        }
        _ => {
            // NB: a non-101 answer to an upgrade closes the connection.
            sh.ctx.metrics.proxied(Proxied::Ok);
            let mut out = relay::answer(resp, Hop::Caller);
            recipient(out.headers_mut(), sh, &m);
            out.headers_mut()
                .insert(CONNECTION, HeaderValue::from_static("close"));
            out
        }
    }
}

/// Adds member `m`'s registered key to a proxied answer: callers seal the member credentials
/// they pass through to it (`tether_tunnel::passthrough`). It is a public key, and a caller who
/// may not read ManagedClusters learns it here.
fn recipient(headers: &mut http::HeaderMap, sh: &Shared, m: &MemberKey) {
    let key = member_cluster(&sh.ctx.clusters, m).and_then(|mc| registered_key(&mc).map(str::to_string));
    if let Some(v) = key.and_then(|k| HeaderValue::from_str(&k).ok()) {
        headers.insert(passthrough::RECIPIENT, v);
    }
}

fn tunnel_failed(m: &MemberKey, why: &str) -> Response<Body> {
    status(
        StatusCode::BAD_GATEWAY,
        &format!(
            "member {}'s tunnel failed: {why}; the agent reconnects by itself",
            m.name
        ),
    )
}

/// The discovery documents of the proxy API.
fn discovery(d: Discovery) -> serde_json::Value {
    let gv = GroupVersionForDiscovery {
        group_version: format!("{GROUP}/{VERSION}"),
        version: VERSION.into(),
    };
    let group = APIGroup {
        name: GROUP.into(),
        versions: vec![gv.clone()],
        preferred_version: Some(gv),
        server_address_by_client_cidrs: None,
    };
    let sub = |name: &str, verbs: &[&str]| APIResource {
        name: format!("{RESOURCE}/{name}"),
        singular_name: String::new(),
        namespaced: true,
        kind: "ManagedClusterProxy".into(),
        verbs: verbs.iter().map(|v| v.to_string()).collect(),
        ..APIResource::default()
    };
    let value = match d {
        Discovery::Groups => serde_json::to_value(APIGroupList { groups: vec![group] }),
        Discovery::Group => serde_json::to_value(group),
        Discovery::Resources => serde_json::to_value(APIResourceList {
            group_version: format!("{GROUP}/{VERSION}"),
            resources: vec![
                sub(PROXY, &["get", "create", "update", "patch", "delete"]),
                sub(ATTACH, &["get"]),
                sub(REJOIN, &["get"]),
            ],
        }),
    };
    let kind = match d {
        Discovery::Groups => "APIGroupList",
        Discovery::Group => "APIGroup",
        Discovery::Resources => "APIResourceList",
    };
    let mut v = value.unwrap_or_default();
    if let Some(o) = v.as_object_mut() {
        o.insert("kind".into(), kind.into());
        o.insert("apiVersion".into(), "v1".into());
    }
    v
}

fn text(code: StatusCode, body: &'static str) -> Response<Body> {
    let mut r = Response::new(pipe::full(body));
    *r.status_mut() = code;
    r
}
