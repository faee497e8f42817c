//! Ensures the member stays reachable through the leader without any inbound port: the agent
//! dials out to the leader's API server as its own member ServiceAccount, upgrades to a tunnel,
//! and serves HTTP/2 on it. Each stream becomes one request to the member API server, either
//! with the caller's own member credential (pass-through) or as the allow-listed, prefixed
//! impersonation of the leader user, never with anything the caller forged. Each attach, and each
//! renewed credential, proves the member's registered key by reading a challenge the leader
//! sealed to it. One caller cannot make the agent hold more than a bounded number of streams
//! and request bytes. A lost tunnel is redialled with jittered backoff and never ends the
//! member's session.

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
use tether_tunnel::identity::{AllowList, Caller, impersonate};
use tether_tunnel::limits::{Budget, Streams};
use tether_tunnel::passthrough;
use tether_tunnel::pipe::{self, Body};
use tether_tunnel::proof::{self, ATTACH_PROOF, Challenge, Renewed};
use tether_tunnel::{UPGRADE_PROTOCOL, attach_path, status};

use crate::Metrics;
use crate::heartbeat::Link;
use tokio::sync::watch;
use tracing::{debug, info, warn};

/// Largest request body forwarded (the API server's own limit for a request body is 3 MiB).
/// NB: request bodies are read whole (kube's client takes no streamed body), within
/// `BODY_DEADLINE` and against the process's shared `BODY_BUDGET`; responses, watches and
/// upgraded streams are never buffered.
const MAX_REQUEST_BODY: usize = 3 * 1024 * 1024;
/// How long a caller has to send a request body.
const BODY_DEADLINE: Duration = Duration::from_secs(30);
/// Request-body bytes the agent holds at once across all tunnels (its chart limit is 64 MiB).
pub const BODY_BUDGET: usize = 16 * 1024 * 1024;
/// Streams one tunnel serves at once; the next is answered 429.
const MAX_STREAMS: usize = 128;
/// First and longest wait between dials when the leader cannot be reached.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(250), Duration::from_secs(30));
/// Longest wait when the leader answered but refused the tunnel (no proxy API there, or no
/// right to attach): a fleet of such members must not hammer it.
const REFUSED_BACKOFF: Duration = Duration::from_secs(300);
/// A tunnel that lived this long resets the backoff.
const HEALTHY: Duration = Duration::from_secs(30);
/// Unanswered ping intervals before the agent gives a tunnel up (the set's default).
const PING_MISSES: u32 = 2;
/// The first redial after a healthy tunnel closed waits up to this long, at random: a fleet
/// whose tunnels closed together (a leader replica handing over) spreads its attaches out.
const REDIAL_SPREAD: Duration = Duration::from_secs(10);
/// Largest challenge answer read from the leader.
pub(crate) const MAX_CHALLENGE: usize = 16 * 1024;

/// How the agent reaches its own API server for proxied requests.
#[derive(Clone)]
pub struct MemberAccess {
    /// As the agent's ServiceAccount (impersonation mode).
    pub agent: Client,
    /// With no credentials of its own (pass-through mode adds the caller's).
    pub bare: Client,
    /// Which leader users and groups may be impersonated.
    pub allow: AllowList,
    /// Request-body bytes held at once, shared by every tunnel.
    pub budget: Budget,
    /// The agent's metrics.
    pub metrics: Metrics,
}

impl MemberAccess {
    /// Member access with the default body budget.
    pub fn new(agent: Client, bare: Client, allow: AllowList, metrics: Metrics) -> Self {
        Self {
            agent,
            bare,
            allow,
            budget: Budget::new(BODY_BUDGET),
            metrics,
        }
    }
}

/// Who this member is on the leader, and the key it proves that with. No `Debug`: it holds the
/// private key.
#[derive(Clone)]
pub struct Attach {
    /// The ClusterSet ID (impersonation prefix).
    pub set: String,
    /// The member's dedicated namespace on the leader.
    pub namespace: String,
    /// The member's name.
    pub name: String,
    /// The member's private key (`AGE-SECRET-KEY-1…`), whose public half the leader recorded.
    pub key: String,
}

/// Who this member is, for impersonation names, sealed credentials and messages. No `Debug`:
/// it holds the private key.
#[derive(Clone)]
struct Member {
    set: String,
    namespace: String,
    name: String,
    key: String,
    access: MemberAccess,
    streams: Streams,
}

/// Keeps a tunnel to the leader attached for member `at`, dialing with the current client of
/// `leader`, and proves the key again over each renewed credential (never returns). `link`
/// hears whether it is attached, and says how often to ping.
pub async fn run(
    mut leader: watch::Receiver<Client>,
    access: MemberAccess,
    at: Attach,
    link: &Link,
) -> Result<(), crate::Error> {
    let mut backoff = BACKOFF.0;
    let mut limit = BACKOFF.1;
    loop {
        let client = leader.borrow_and_update().clone();
        let started = Instant::now();
        match dial(&client, &at).await {
            Ok(upgraded) => {
                access.metrics.attach("attached");
                info!(namespace = %at.namespace, "Tunnel to the leader attached");
                let m = Member {
                    set: at.set.clone(),
                    namespace: at.namespace.clone(),
                    name: at.name.clone(),
                    key: at.key.clone(),
                    access: access.clone(),
                    streams: Streams::new(MAX_STREAMS),
                };
                let svc = hyper::service::service_fn(move |req| forward(req, m.clone()));
                // NB: pinged at the leader's interval, so that a tunnel the leader no longer
                // answers on is redialled as soon as the leader would call it lost.
                let ping = link.ping();
                link.set_attached(true);
                access.metrics.set_tunnel_attached(true);
                let served = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .timer(TokioTimer::new())
                    .keep_alive_interval(ping)
                    .keep_alive_timeout(ping * PING_MISSES)
                    // NB: above MAX_STREAMS, so that the stream past the limit is answered 429
                    // rather than left waiting for a protocol slot at the leader.
                    .max_concurrent_streams(2 * MAX_STREAMS as u32)
                    .max_header_list_size(64 * 1024)
                    .serve_connection(upgraded, svc);
                tokio::pin!(served);
                let served = loop {
                    tokio::select! {
                        r = &mut served => break r,
                        changed = leader.changed() => {
                            if changed.is_err() {
                                break (&mut served).await;
                            }
                            // A renewed credential: prove the key over it, so the leader keeps the
                            // tunnel past the old credential's expiry.
                            let client = leader.borrow_and_update().clone();
                            tokio::spawn(reprove(client, at.clone(), access.metrics.clone()));
                        }
                    }
                };
                link.set_attached(false);
                access.metrics.set_tunnel_attached(false);
                match served {
                    Ok(()) => info!("Tunnel to the leader closed; redialling"),
                    Err(e) => warn!(error = %e, "Tunnel to the leader failed; redialling"),
                }
            }
            Err(Dial::Unreachable(why)) => {
                access.metrics.attach("unreachable");
                warn!(error = %why, "Cannot reach the leader to attach the tunnel; retrying");
                limit = BACKOFF.1;
            }
            Err(Dial::Refused(why)) => {
                access.metrics.attach("refused");
                warn!(error = %why, "The leader refused the tunnel; retrying slowly");
                limit = REFUSED_BACKOFF;
            }
        }
        let wait = if started.elapsed() >= HEALTHY {
            backoff = BACKOFF.0;
            REDIAL_SPREAD.mul_f64(rand::rng().random_range(0.0..1.0))
        } else {
            backoff.mul_f64(rand::rng().random_range(0.5..1.0))
        };
        tokio::time::sleep(wait).await;
        backoff = (backoff * 2).min(limit);
    }
}

/// Attaches member `at`'s tunnel once and hands back the upgraded connection without serving
/// anything on it: a tunnel that answers nothing, not even pings (the benchmark's frozen agent).
pub async fn attach_unserved(client: &Client, at: &Attach) -> Result<hyper::upgrade::Upgraded, String> {
    dial(client, at).await.map_err(|d| match d {
        Dial::Unreachable(why) | Dial::Refused(why) => why,
    })
}

/// Why a dial failed.
pub(crate) enum Dial {
    /// No answer (network, TLS, the leader's API server down).
    Unreachable(String),
    /// An answer other than the one asked for.
    Refused(String),
}

/// A GET of the member's `attach` path; `proof` and `upgrade` as asked.
fn attach_request(at: &Attach, proof: Option<&str>, upgrade: bool) -> Result<Request<KubeBody>, Dial> {
    let mut req = Request::get(attach_path(&at.namespace, &at.name));
    if let Some(p) = proof {
        req = req.header(ATTACH_PROOF, p);
    }
    if upgrade {
        req = req
            .header(CONNECTION, "Upgrade")
            .header(UPGRADE, UPGRADE_PROTOCOL);
    }
    req.body(KubeBody::empty())
        .map_err(|e| Dial::Unreachable(e.to_string()))
}

/// The answer's status and (bounded) body, or why there was none.
pub(crate) async fn send(client: &Client, req: Request<KubeBody>) -> Result<Response<KubeBody>, Dial> {
    client
        .send(req)
        .await
        .map_err(|e| Dial::Unreachable(e.to_string()))
}

/// Why the leader's answer `code` with `body` was not the one asked for.
pub(crate) fn refused(code: StatusCode, body: &[u8]) -> Dial {
    let why = format!(
        "the leader answered {code}: {}",
        String::from_utf8_lossy(body).trim()
    );
    // NB: 503 from the aggregator means the leader replica is not (yet) reachable behind the
    // APIService, as during a failover: retry at the normal pace.
    if code.is_server_error() {
        Dial::Unreachable(why)
    } else {
        Dial::Refused(why)
    }
}

/// Asks the leader for a challenge and reads the proof out of it with the member's key.
async fn proof(client: &Client, at: &Attach) -> Result<String, Dial> {
    let path = attach_path(&at.namespace, &at.name);
    read_challenge(client, &path, &at.namespace, &at.name, &at.key).await
}

/// GETs the challenge at `path` (attach or rejoin of member `name` in `namespace`) and reads
/// the proof token out of it with private key `key`.
pub(crate) async fn read_challenge(
    client: &Client,
    path: &str,
    namespace: &str,
    name: &str,
    key: &str,
) -> Result<String, Dial> {
    let req = Request::get(path)
        .body(KubeBody::empty())
        .map_err(|e| Dial::Unreachable(e.to_string()))?;
    let resp = send(client, req).await?;
    let code = resp.status();
    let body = pipe::collect_limited(resp.into_body(), MAX_CHALLENGE).await;
    if code != StatusCode::OK {
        return Err(refused(code, &body));
    }
    let challenge: Challenge = serde_json::from_slice(&body)
        .map_err(|e| Dial::Refused(format!("the leader's challenge is not readable: {e}")))?;
    let text = tether_seal::unseal_text(&challenge.sealed, key).map_err(|e| {
        Dial::Refused(format!(
            "cannot open the leader's challenge with this member's key ({e}): the leader does not \
             hold this key for member {name} (it was removed, banned, or registered again with another key)"
        ))
    })?;
    proof::token_in(&text, namespace, name)
        .map(str::to_string)
        .ok_or_else(|| Dial::Refused("the leader's challenge is not for this member; ignored".into()))
}

/// Opens the tunnel: a challenge answered with the member's key, then an HTTP/1.1 upgrade
/// through the leader's API server that carries the proof.
async fn dial(client: &Client, at: &Attach) -> Result<hyper::upgrade::Upgraded, Dial> {
    let p = proof(client, at).await?;
    let mut resp = send(client, attach_request(at, Some(&p), true)?).await?;
    let code = resp.status();
    if code != StatusCode::SWITCHING_PROTOCOLS {
        let body = pipe::collect_limited(resp.into_body(), 2048).await;
        // NB: the leader just answered our challenge, so a refused proof is a race (the serving
        // replica changed between the two requests): ask again at the normal pace.
        return Err(match refused(code, &body) {
            Dial::Refused(why) => Dial::Unreachable(why),
            other => other,
        });
    }
    hyper::upgrade::on(&mut resp)
        .await
        .map_err(|e| Dial::Unreachable(e.to_string()))
}

/// Proves the key again over `client` (a renewed credential), so the live tunnel is kept.
async fn reprove(client: Client, at: Attach, metrics: Metrics) {
    let renewed = async {
        let p = proof(&client, &at).await?;
        let resp = send(&client, attach_request(&at, Some(&p), false)?).await?;
        let code = resp.status();
        let body = pipe::collect_limited(resp.into_body(), 2048).await;
        if code != StatusCode::OK {
            return Err(refused(code, &body));
        }
        serde_json::from_slice::<Renewed>(&body)
            .map_err(|e| Dial::Refused(format!("the leader's renewal answer is not readable: {e}")))
    };
    match renewed.await {
        Ok(r) => {
            metrics.attach("proven");
            info!(
                seconds = r.seconds,
                "Proved the member's key over the renewed credential; the tunnel is kept"
            );
        }
        Err(Dial::Unreachable(why) | Dial::Refused(why)) => {
            metrics.attach("refused");
            warn!(error = %why, "Cannot prove the key over the renewed credential; the leader closes the tunnel when the old one expires, and it is redialled");
        }
    }
}

/// Serves one stream of the tunnel: one request to the member API server.
async fn forward(req: Request<Incoming>, m: Member) -> Result<Response<Body>, Infallible> {
    let Some(slot) = m.streams.enter() else {
        m.access.metrics.proxied("streams_full");
        return Ok(status(
            StatusCode::TOO_MANY_REQUESTS,
            &format!(
                "member {}'s tunnel is serving {MAX_STREAMS} requests already; retry shortly",
                m.name
            ),
        ));
    };
    let (mut parts, body) = req.into_parts();
    let upgrade = parts.headers.remove(headers::UPGRADE);
    let client = match authorize(&mut parts.headers, &m) {
        Ok(c) => c,
        Err((code, why)) => {
            m.access.metrics.proxied(if code == StatusCode::UNAUTHORIZED {
                "unauthorized"
            } else {
                "forbidden"
            });
            return Ok(status(code, &why));
        }
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
        let (bytes, _held) = match m
            .access
            .budget
            .collect(body, MAX_REQUEST_BODY, BODY_DEADLINE)
            .await
        {
            Ok(b) => b,
            Err(refusal) => {
                m.access.metrics.proxied(refusal.label());
                debug!(member = %m.name, reason = refusal.label(), "Refused a request body");
                return Ok(status(refusal.status(), &refusal.to_string()));
            }
        };
        let resp = client
            .send(Request::from_parts(parts, KubeBody::from(bytes)))
            .await;
        return Ok(match resp {
            Ok(r) => {
                m.access.metrics.proxied("ok");
                let (mut p, b) = r.into_parts();
                strip_untrusted(&mut p.headers, false);
                p.version = Version::HTTP_2;
                // NB: a watch holds its stream slot for as long as it streams.
                Response::from_parts(p, pipe::holding(pipe::boxed(b), slot))
            }
            Err(e) => {
                m.access.metrics.proxied("member_error");
                status(
                    StatusCode::BAD_GATEWAY,
                    &format!("member {}'s API server did not answer: {e}", m.name),
                )
            }
        });
    };
    parts
        .headers
        .insert(CONNECTION, HeaderValue::from_static("Upgrade"));
    parts.headers.insert(UPGRADE, protocol);
    let mut resp = match client.send(Request::from_parts(parts, KubeBody::empty())).await {
        Ok(r) => r,
        Err(e) => {
            m.access.metrics.proxied("member_error");
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
    m.access.metrics.proxied("upgraded");
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
        let _slot = slot;
        match on_upgrade.await {
            Ok(up) => pipe::splice(TokioIo::new(up), to_leader, body).await,
            Err(e) => debug!(error = %e, "Member upgrade did not complete"),
        }
    });
    Ok(out)
}

/// Decides as whom a stream reaches the member, and sets the headers for it: the caller's own
/// member credential when one is passed (sealed to this member's key by that caller, recently,
/// holding a well-formed Bearer token, else 401), or else the
/// allow-listed, prefixed impersonation of the leader-verified caller (else 403). Every header
/// the caller could forge is gone afterwards. Returns the client to send with.
fn authorize<'a>(headers: &mut http::HeaderMap, m: &'a Member) -> Result<&'a Client, (StatusCode, String)> {
    let caller = Caller {
        user: header_text(headers, &REMOTE_USER).unwrap_or_default(),
        groups: headers
            .get_all(&REMOTE_GROUP)
            .iter()
            .filter_map(|v| v.to_str().ok().map(str::to_string))
            .collect(),
    };
    let member_credential = headers.remove(MEMBER_AUTHORIZATION);
    strip_untrusted(headers, false);
    if let Some(credential) = member_credential {
        // NB: only a sealed, well-formed bearer token: an empty or non-Bearer Authorization is
        // system:anonymous to the member, and a plain one crossed the leader readable.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let token = passthrough::open(&credential, &m.key, &m.namespace, &m.name, &caller.user, now)
            .map_err(|refusal| (StatusCode::UNAUTHORIZED, refusal.to_string()))?;
        let value = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
            (
                StatusCode::UNAUTHORIZED,
                "the member credential is not a valid header".into(),
            )
        })?;
        headers.insert(AUTHORIZATION, value);
        return Ok(&m.access.bare);
    }
    let who = impersonate(&m.set, &m.name, &caller, &m.access.allow).map_err(|refusal| {
        debug!(user = %caller.user, "Refused to impersonate");
        (StatusCode::FORBIDDEN, refusal.to_string())
    })?;
    let user = HeaderValue::from_str(&who.user).map_err(|_| {
        (
            StatusCode::BAD_REQUEST,
            "the user name is not a valid header".to_string(),
        )
    })?;
    headers.insert(HeaderName::from_static("impersonate-user"), user);
    for g in who.groups.iter().filter_map(|g| HeaderValue::from_str(g).ok()) {
        headers.append(HeaderName::from_static("impersonate-group"), g);
    }
    Ok(&m.access.agent)
}

fn header_text(h: &http::HeaderMap, name: &HeaderName) -> Option<String> {
    h.get(name).and_then(|v| v.to_str().ok()).map(str::to_string)
}
