//! Ensures the member stays reachable through the leader without any inbound port: the agent
//! dials out to the leader's API server as its own member ServiceAccount, upgrades to a tunnel,
//! and serves HTTP/2 on it. Each stream becomes one request to the member API server, either
//! with the caller's own member credential (pass-through) or as the allow-listed, prefixed
//! impersonation of the leader user, never with anything the caller forged. A lost tunnel is
//! redialled with jittered backoff and never ends the member's session.

use std::convert::Infallible;
use std::time::{Duration, Instant};

use http::header::{AUTHORIZATION, CONNECTION, UPGRADE};
use http::{HeaderName, HeaderValue, Request, Response, StatusCode, Version};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use kube::Client;
use kube::client::Body as KubeBody;
use rand::Rng;
use tether_tunnel::headers::{self, MEMBER_AUTHORIZATION, REMOTE_GROUP, REMOTE_USER, strip_untrusted};
use tether_tunnel::identity::{AllowList, Caller, bearer, impersonate};
use tether_tunnel::pipe::{self, Body};
use tether_tunnel::{UPGRADE_PROTOCOL, attach_path, status};
use tokio::sync::watch;
use tracing::{debug, info, warn};

/// Largest request body forwarded (the API server's own limit for a request body is 3 MiB).
/// NB: request bodies are read whole, as the API server does; responses, watches and upgraded
/// streams are never buffered.
const MAX_REQUEST_BODY: usize = 3 * 1024 * 1024;
/// First and longest wait between dials when the leader cannot be reached.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(250), Duration::from_secs(30));
/// Longest wait when the leader answered but refused the tunnel (no proxy API there, or no
/// right to attach): a fleet of such members must not hammer it.
const REFUSED_BACKOFF: Duration = Duration::from_secs(300);
/// A tunnel that lived this long resets the backoff.
const HEALTHY: Duration = Duration::from_secs(30);

/// How the agent reaches its own API server for proxied requests.
#[derive(Clone)]
pub struct MemberAccess {
    /// As the agent's ServiceAccount (impersonation mode).
    pub agent: Client,
    /// With no credentials of its own (pass-through mode adds the caller's).
    pub bare: Client,
    /// Which leader users and groups may be impersonated.
    pub allow: AllowList,
}

/// Who this member is, for impersonation names and messages.
#[derive(Clone)]
struct Member {
    set: String,
    name: String,
    access: MemberAccess,
}

/// Keeps a tunnel to the leader attached for member `name` of set `set` in `namespace`, dialing
/// with the current client of `leader` (never returns).
pub async fn run(
    leader: watch::Receiver<Client>,
    access: MemberAccess,
    set: String,
    namespace: String,
    name: String,
) -> Result<(), crate::Error> {
    let member = Member {
        set,
        name: name.clone(),
        access,
    };
    let mut backoff = BACKOFF.0;
    let mut limit = BACKOFF.1;
    loop {
        let client = leader.borrow().clone();
        let started = Instant::now();
        match dial(&client, &namespace, &name).await {
            Ok(upgraded) => {
                info!(namespace = %namespace, "Tunnel to the leader attached");
                let m = member.clone();
                let svc = hyper::service::service_fn(move |req| forward(req, m.clone()));
                let served = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .timer(TokioTimer::new())
                    .keep_alive_interval(Duration::from_secs(20))
                    .keep_alive_timeout(Duration::from_secs(20))
                    .serve_connection(upgraded, svc)
                    .await;
                match served {
                    Ok(()) => info!("Tunnel to the leader closed; redialling"),
                    Err(e) => warn!(error = %e, "Tunnel to the leader failed; redialling"),
                }
            }
            Err(Dial::Unreachable(why)) => {
                warn!(error = %why, "Cannot reach the leader to attach the tunnel; retrying");
                limit = BACKOFF.1;
            }
            Err(Dial::Refused(why)) => {
                warn!(error = %why, "The leader refused the tunnel; retrying slowly");
                limit = REFUSED_BACKOFF;
            }
        }
        if started.elapsed() >= HEALTHY {
            backoff = BACKOFF.0;
        }
        let wait = backoff.mul_f64(rand::rng().random_range(0.5..1.0));
        tokio::time::sleep(wait).await;
        backoff = (backoff * 2).min(limit);
    }
}

/// Why a dial failed.
enum Dial {
    /// No answer (network, TLS, the leader's API server down).
    Unreachable(String),
    /// An answer other than 101.
    Refused(String),
}

/// Opens the tunnel: an HTTP/1.1 upgrade through the leader's API server.
async fn dial(client: &Client, namespace: &str, name: &str) -> Result<hyper::upgrade::Upgraded, Dial> {
    let req = Request::get(attach_path(namespace, name))
        .header(CONNECTION, "Upgrade")
        .header(UPGRADE, UPGRADE_PROTOCOL)
        .body(KubeBody::empty())
        .map_err(|e| Dial::Unreachable(e.to_string()))?;
    let mut resp = client
        .send(req)
        .await
        .map_err(|e| Dial::Unreachable(e.to_string()))?;
    let code = resp.status();
    if code != StatusCode::SWITCHING_PROTOCOLS {
        let body = pipe::collect_limited(resp.into_body(), 2048).await;
        let why = format!(
            "the leader answered {code}: {}",
            String::from_utf8_lossy(&body).trim()
        );
        // NB: 503 from the aggregator means the leader replica is not (yet) reachable behind the
        // APIService, as during a failover: retry at the normal pace.
        return Err(
            if code == StatusCode::SERVICE_UNAVAILABLE || code.is_server_error() {
                Dial::Unreachable(why)
            } else {
                Dial::Refused(why)
            },
        );
    }
    hyper::upgrade::on(&mut resp)
        .await
        .map_err(|e| Dial::Unreachable(e.to_string()))
}

/// Serves one stream of the tunnel: one request to the member API server.
async fn forward(req: Request<Incoming>, m: Member) -> Result<Response<Body>, Infallible> {
    let (mut parts, body) = req.into_parts();
    let caller = Caller {
        user: header_text(&parts.headers, &REMOTE_USER).unwrap_or_default(),
        groups: parts
            .headers
            .get_all(&REMOTE_GROUP)
            .iter()
            .filter_map(|v| v.to_str().ok().map(str::to_string))
            .collect(),
    };
    let member_credential = parts.headers.remove(MEMBER_AUTHORIZATION);
    let upgrade = parts.headers.remove(headers::UPGRADE);
    strip_untrusted(&mut parts.headers, false);
    let client = match member_credential {
        Some(credential) => {
            // NB: an empty or non-Bearer Authorization is system:anonymous to the member.
            let Some(token) = bearer(&credential) else {
                return Ok(status(
                    StatusCode::UNAUTHORIZED,
                    "the member credential (Tether-Member-Authorization) must be `Bearer <token>`; \
                     nothing was sent to the member",
                ));
            };
            let Ok(value) = HeaderValue::from_str(&format!("Bearer {token}")) else {
                return Ok(status(
                    StatusCode::UNAUTHORIZED,
                    "the member credential is not a valid header",
                ));
            };
            parts.headers.insert(AUTHORIZATION, value);
            &m.access.bare
        }
        None => match impersonate(&m.set, &m.name, &caller, &m.access.allow) {
            Ok(who) => {
                let Ok(user) = HeaderValue::from_str(&who.user) else {
                    return Ok(status(
                        StatusCode::BAD_REQUEST,
                        "the user name is not a valid header",
                    ));
                };
                parts
                    .headers
                    .insert(HeaderName::from_static("impersonate-user"), user);
                for g in who.groups.iter().filter_map(|g| HeaderValue::from_str(g).ok()) {
                    parts
                        .headers
                        .append(HeaderName::from_static("impersonate-group"), g);
                }
                &m.access.agent
            }
            Err(refusal) => {
                debug!(user = %caller.user, "Refused to impersonate");
                return Ok(status(StatusCode::FORBIDDEN, &refusal.to_string()));
            }
        },
    };
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str()).to_string();
    let Ok(uri) = path.parse() else {
        return Ok(status(
            StatusCode::BAD_REQUEST,
            "the member path is not a valid URI",
        ));
    };
    parts.uri = uri;
    parts.version = Version::HTTP_11;
    let Some(protocol) = upgrade else {
        let bytes = pipe::collect_limited(body, MAX_REQUEST_BODY + 1).await;
        if bytes.len() > MAX_REQUEST_BODY {
            return Ok(status(
                StatusCode::PAYLOAD_TOO_LARGE,
                "the request body is larger than 3 MiB",
            ));
        }
        let resp = client
            .send(Request::from_parts(parts, KubeBody::from(bytes)))
            .await;
        return Ok(match resp {
            Ok(r) => {
                let (mut p, b) = r.into_parts();
                strip_untrusted(&mut p.headers, false);
                p.version = Version::HTTP_2;
                Response::from_parts(p, pipe::boxed(b))
            }
            Err(e) => status(
                StatusCode::BAD_GATEWAY,
                &format!("member {}'s API server did not answer: {e}", m.name),
            ),
        });
    };
    parts
        .headers
        .insert(CONNECTION, HeaderValue::from_static("Upgrade"));
    parts.headers.insert(UPGRADE, protocol);
    let mut resp = match client.send(Request::from_parts(parts, KubeBody::empty())).await {
        Ok(r) => r,
        Err(e) => {
            return Ok(status(
                StatusCode::BAD_GATEWAY,
                &format!("member {}'s API server did not answer: {e}", m.name),
            ));
        }
    };
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        let (mut p, b) = resp.into_parts();
        strip_untrusted(&mut p.headers, false);
        p.version = Version::HTTP_2;
        return Ok(Response::from_parts(p, pipe::boxed(b)));
    }
    let switched_to = resp.headers().get(UPGRADE).cloned();
    let mut out = Response::new(pipe::empty());
    for h in headers::UPGRADE_RESPONSE_HEADERS {
        for v in resp.headers().get_all(&h) {
            out.headers_mut().append(h.clone(), v.clone());
        }
    }
    out.headers_mut().insert(
        headers::UPGRADE,
        switched_to.unwrap_or_else(|| HeaderValue::from_static("unknown")),
    );
    let on_upgrade = hyper::upgrade::on(&mut resp);
    let (to_leader, out_body) = pipe::channel();
    *out.body_mut() = out_body;
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(up) => pipe::splice(TokioIo::new(up), to_leader, body).await,
            Err(e) => debug!(error = %e, "Member upgrade did not complete"),
        }
    });
    Ok(out)
}

fn header_text(h: &http::HeaderMap, name: &HeaderName) -> Option<String> {
    h.get(name).and_then(|v| v.to_str().ok()).map(str::to_string)
}
