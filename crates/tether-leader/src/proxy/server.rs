//! Ensures every request to the aggregated server is answered on behalf of a caller the leader's
//! API server vouched for: the front-proxy certificate is checked before any header is read,
//! only a member's own agent ServiceAccount that also proves the member's registered key may
//! attach (or keep) that member's tunnel, and a user's
//! request travels to the member as one HTTP/2 stream with every forgeable identity header
//! removed. Errors are Kubernetes `Status` objects that name the member and say why.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http::header::{CONNECTION, CONTENT_TYPE, UPGRADE};
use http::{HeaderValue, Request, Response, StatusCode, Version};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    APIGroup, APIGroupList, APIResource, APIResourceList, GroupVersionForDiscovery,
};
use kube::ResourceExt;
use kube::runtime::events::EventType;
use kube::runtime::reflector::{ObjectRef, Store};
use tether_api::conditions::EventReason;
use tether_api::{ManagedCluster, annotations, labels};
use tether_tunnel::headers::{self, MEMBER_AUTHORIZATION, REMOTE_GROUP, REMOTE_USER, strip_untrusted};
use tether_tunnel::identity::Caller;
use tether_tunnel::passthrough;
use tether_tunnel::pipe::{self, Body};
use tether_tunnel::proof::{self, ATTACH_PROOF, Challenge, Renewed};
use tether_tunnel::route::{Discovery, Route, route};
use tether_tunnel::{ATTACH, GROUP, PROXY, RESOURCE, UPGRADE_PROTOCOL, VERSION, status};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::challenge::{Challenges, Refused};
use super::frontproxy::FrontProxy;
use super::revoke::Identities;
use super::tunnels::{MemberKey, Tunnels};
use crate::Context;
use crate::naming::AGENT_SERVICE_ACCOUNT;

/// How often the leader pings each tunnel (the agent's read timeout is longer).
const KEEPALIVE: Duration = Duration::from_secs(10);
/// A tunnel that does not answer a ping for this long is closed.
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// What every connection's handler shares.
pub struct Shared {
    /// Live tunnels.
    pub tunnels: Arc<Tunnels>,
    /// The leader's caches (ManagedClusters with their registered keys, sets), recorder and metrics.
    pub ctx: Arc<Context>,
    /// Attach challenges of this serving term.
    pub challenges: Challenges,
    /// Which members' agent ServiceAccounts exist.
    pub identities: Arc<Identities>,
    /// Cancelled when this replica stops serving: every tunnel closes at once.
    pub stop: CancellationToken,
}

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
            sh.ctx.metrics.proxied("unauthenticated");
            return Ok(status(StatusCode::UNAUTHORIZED, &why));
        }
    };
    let Some(caller) = front.caller(req.headers()) else {
        sh.ctx.metrics.proxied("unauthenticated");
        return Ok(status(StatusCode::UNAUTHORIZED, "the front proxy named no user"));
    };
    Ok(match r {
        Route::Discovery(d) => json(&discovery(d)),
        Route::OpenApi => json(&serde_json::json!({
            "swagger": "2.0", "info": {"title": "tether-proxy", "version": VERSION}, "paths": {}
        })),
        Route::Attach { namespace, name } => attach(req, &caller, member(namespace, name), &sh),
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

/// The ManagedCluster of `m`, if the leader created it (not an object anyone could make).
fn member_cluster(clusters: &Store<ManagedCluster>, m: &MemberKey) -> Option<Arc<ManagedCluster>> {
    clusters
        .get(&ObjectRef::new(&m.name).within(&m.namespace))
        .filter(|mc| {
            mc.labels().get(labels::MANAGED_BY).map(String::as_str) == Some(crate::provision::FIELD_MANAGER)
        })
}

/// Whether `m` is a member the leader created.
fn known(clusters: &Store<ManagedCluster>, m: &MemberKey) -> bool {
    member_cluster(clusters, m).is_some()
}

/// The key member `mc` registered with: what its agent must prove to attach.
pub fn registered_key(mc: &ManagedCluster) -> Option<&str> {
    mc.annotations()
        .get(annotations::PUBLIC_KEY)
        .map(String::as_str)
        .filter(|k| !k.is_empty())
}

/// How long a tunnel proven now may live without a new proof: the lifetime of the credential
/// its agent attached with (the set's `credentialTTL`), so that it never outlives that token.
fn proven_for(ctx: &Context, mc: &ManagedCluster) -> Duration {
    ctx.set_of(mc)
        .and_then(|set| ctx.leader_set(&set))
        .and_then(|s| s.spec.leader.clone())
        .unwrap_or_default()
        .credential_lifetime()
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// `attach`, as the member's own agent ServiceAccount. Without a proof header: a challenge
/// sealed to the member's registered key. With a proof: the upgrade to a tunnel, or without an
/// upgrade the renewal of the live tunnel's deadline. A proof is the token inside a challenge;
/// only the holder of the private key can read it.
fn attach(mut req: Request<Incoming>, caller: &Caller, m: MemberKey, sh: &Arc<Shared>) -> Response<Body> {
    let upgrade = headers::upgrade_request(req.headers());
    if upgrade.as_deref().is_some_and(|u| u != UPGRADE_PROTOCOL) {
        return status(
            StatusCode::BAD_REQUEST,
            &format!("{ATTACH} needs Connection: Upgrade and Upgrade: {UPGRADE_PROTOCOL}"),
        );
    }
    let agent = format!("system:serviceaccount:{}:{AGENT_SERVICE_ACCOUNT}", m.namespace);
    if caller.user != agent {
        warn!(member = %m.name, namespace = %m.namespace, user = %caller.user, "Refused a tunnel from another identity");
        sh.ctx.metrics.proxied("attach_forbidden");
        return status(
            StatusCode::FORBIDDEN,
            &format!(
                "only member {}'s agent ({agent}) may attach its tunnel, not {}",
                m.name, caller.user
            ),
        );
    }
    let Some(mc) = member_cluster(&sh.ctx.clusters, &m) else {
        return status(
            StatusCode::NOT_FOUND,
            &format!("no member {} in namespace {}", m.name, m.namespace),
        );
    };
    match sh.identities.present(&m.namespace) {
        Some(true) => {}
        Some(false) => {
            sh.ctx.metrics.proxied("attach_forbidden");
            return status(
                StatusCode::FORBIDDEN,
                &format!(
                    "member {}'s agent ServiceAccount no longer exists; it must register again",
                    m.name
                ),
            );
        }
        None => {
            return status(
                StatusCode::SERVICE_UNAVAILABLE,
                "this leader replica is still reading the members' identities; retry shortly",
            );
        }
    }
    let Some(key) = registered_key(&mc).map(str::to_string) else {
        sh.ctx.metrics.proxied("attach_unproven");
        return status(
            StatusCode::FORBIDDEN,
            &format!("member {} has no registered key; it must register again", m.name),
        );
    };
    let now = unix_now();
    let Some(given) = req.headers().get(ATTACH_PROOF) else {
        if upgrade.is_some() {
            sh.ctx.metrics.proxied("attach_unproven");
            warn!(member = %m.name, namespace = %m.namespace, "Refused a tunnel without a proof of the member's key");
            return status(
                StatusCode::FORBIDDEN,
                &format!(
                    "attaching member {}'s tunnel needs a proof of its registered key: GET {ATTACH} \
                     without an upgrade for a challenge sealed to that key, then attach with the \
                     token inside it in the {ATTACH_PROOF} header",
                    m.name
                ),
            );
        }
        let token = sh.challenges.issue(&m, now);
        return match tether_seal::seal_text(&proof::plaintext(&m.namespace, &m.name, &token), &key) {
            Ok(sealed) => json(&serde_json::json!(Challenge { sealed })),
            Err(e) => status(
                StatusCode::INTERNAL_SERVER_ERROR,
                &format!("member {}'s registered key cannot be sealed to: {e}", m.name),
            ),
        };
    };
    let redeemed = match given.to_str() {
        Ok(p) if p.len() <= proof::MAX_PROOF => sh.challenges.redeem(&m, p, now),
        _ => Err(Refused::Malformed),
    };
    if let Err(why) = redeemed {
        sh.ctx.metrics.proxied(why.label());
        warn!(member = %m.name, namespace = %m.namespace, reason = why.label(), "Refused an attach proof");
        return status(StatusCode::FORBIDDEN, &format!("member {}: {why}", m.name));
    }
    let lifetime = proven_for(&sh.ctx, &mc);
    let deadline = tokio::time::Instant::now() + lifetime;
    if upgrade.is_none() {
        return if sh.tunnels.renew(&m, &key, deadline) {
            sh.ctx.metrics.proxied("attach_renewed");
            debug!(member = %m.name, seconds = lifetime.as_secs(), "Tunnel proven again");
            json(&serde_json::json!(Renewed {
                seconds: lifetime.as_secs()
            }))
        } else {
            status(
                StatusCode::NOT_FOUND,
                &format!(
                    "member {} has no live tunnel proven with its key to keep; attach one",
                    m.name
                ),
            )
        };
    }
    let on_upgrade = hyper::upgrade::on(&mut req);
    let sh = sh.clone();
    tokio::spawn(async move {
        let upgraded = match on_upgrade.await {
            Ok(u) => u,
            Err(e) => {
                debug!(member = %m.name, error = %e, "Tunnel upgrade did not complete");
                return;
            }
        };
        let handshake = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .keep_alive_interval(KEEPALIVE)
            .keep_alive_timeout(KEEPALIVE_TIMEOUT)
            .keep_alive_while_idle(true)
            .handshake::<_, Body>(upgraded)
            .await;
        let (send, conn) = match handshake {
            Ok(h) => h,
            Err(e) => {
                warn!(member = %m.name, error = %e, "Tunnel handshake failed");
                return;
            }
        };
        let tunnels = &sh.tunnels;
        let inserted = tunnels.insert(m.clone(), send, key, deadline);
        info!(member = %m.name, namespace = %m.namespace, tunnels = tunnels.len(), "Tunnel connected");
        if inserted.replaced {
            replaced(&sh.ctx, &mc).await;
        }
        tokio::select! {
            r = conn => if let Err(e) = r { debug!(member = %m.name, error = %e, "Tunnel closed with an error") },
            _ = inserted.close.cancelled() => {}
            _ = sh.stop.cancelled() => {}
        }
        tunnels.remove(&m, inserted.id);
        info!(member = %m.name, namespace = %m.namespace, "Tunnel disconnected");
    });
    let mut resp = Response::new(pipe::empty());
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    resp.headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("Upgrade"));
    resp.headers_mut()
        .insert(UPGRADE, HeaderValue::from_static(UPGRADE_PROTOCOL));
    resp
}

/// A live tunnel was replaced by a new proven one: a Warning Event, since only the member's
/// own agent can do that (a restart before the old tunnel timed out, or a stolen key).
async fn replaced(ctx: &Context, mc: &ManagedCluster) {
    ctx.metrics.tunnel_replaced();
    warn!(member = %mc.name_any(), namespace = %mc.namespace().unwrap_or_default(),
          "A live tunnel was replaced by a new attach proven with the member's key");
    crate::write::event(
        ctx,
        mc,
        EventType::Warning,
        EventReason::TunnelReplaced,
        "Attach",
        "a new tunnel proven with this member's registered key replaced the live one (the agent \
         restarted before its old tunnel timed out, or someone else holds the member's key)",
    )
    .await;
}

async fn proxy(
    req: Request<Incoming>,
    caller: &Caller,
    m: MemberKey,
    path: &str,
    sh: &Arc<Shared>,
) -> Response<Body> {
    let Some(mut send) = sh.tunnels.get(&m) else {
        sh.ctx.metrics.proxied("no_tunnel");
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
    if send.ready().await.is_err() {
        sh.ctx.metrics.proxied("tunnel_error");
        return tunnel_failed(&m, "the tunnel closed");
    }
    let Some(protocol) = upgrade else {
        let resp = send
            .send_request(Request::from_parts(parts, pipe::boxed(body)))
            .await;
        return match resp {
            Ok(r) => {
                sh.ctx.metrics.proxied("ok");
                let (mut p, b) = r.into_parts();
                strip_untrusted(&mut p.headers, false);
                recipient(&mut p.headers, sh, &m);
                p.version = Version::HTTP_11;
                Response::from_parts(p, pipe::boxed(b))
            }
            Err(e) => {
                sh.ctx.metrics.proxied("tunnel_error");
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
            sh.ctx.metrics.proxied("tunnel_error");
            return tunnel_failed(&m, &e.to_string());
        }
    };
    let switched = resp.headers().get(headers::UPGRADE).cloned();
    let (mut p, from_member) = resp.into_parts();
    match (switched, on_upgrade) {
        (Some(proto), Some(on_upgrade)) => {
            sh.ctx.metrics.proxied("upgraded");
            let mut r = Response::new(pipe::empty());
            *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
            r.headers_mut()
                .insert(CONNECTION, HeaderValue::from_static("Upgrade"));
            r.headers_mut().insert(UPGRADE, proto);
            for h in headers::UPGRADE_RESPONSE_HEADERS {
                for v in p.headers.get_all(&h) {
                    r.headers_mut().append(h.clone(), v.clone());
                }
            }
            tokio::spawn(async move {
                match on_upgrade.await {
                    Ok(up) => pipe::splice(TokioIo::new(up), to_member, from_member).await,
                    Err(e) => debug!(error = %e, "Caller's upgrade did not complete"),
                }
            });
            r
        }
        _ => {
            // NB: a non-101 answer to an upgrade closes the connection.
            sh.ctx.metrics.proxied("ok");
            strip_untrusted(&mut p.headers, false);
            recipient(&mut p.headers, sh, &m);
            p.version = Version::HTTP_11;
            p.headers.insert(CONNECTION, HeaderValue::from_static("close"));
            Response::from_parts(p, pipe::boxed(from_member))
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

fn json(v: &serde_json::Value) -> Response<Body> {
    let mut r = Response::new(pipe::full(v.to_string()));
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

fn text(code: StatusCode, body: &'static str) -> Response<Body> {
    let mut r = Response::new(pipe::full(body));
    *r.status_mut() = code;
    r
}
