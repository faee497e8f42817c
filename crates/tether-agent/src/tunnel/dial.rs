//! Dialing the leader: a challenge read with the member's key, then the HTTP/1.1 upgrade through
//! the leader's API server that carries the proof; proving the key again over a renewed
//! credential; and why a dial failed (unreachable, to retry at the normal pace, or refused).

use std::time::Duration;

use http::header::{CONNECTION, RETRY_AFTER, UPGRADE};
use http::{Request, Response, StatusCode};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use kube::Client;
use kube::client::Body as KubeBody;
use tether_tunnel::pipe::{self};
use tether_tunnel::proof::{self, ATTACH_PROOF, Challenge, PROOF_REFUSED, Renewed};
use tether_tunnel::{UPGRADE_PROTOCOL, attach_path, idle};

use crate::Metrics;
use tracing::{info, warn};

use super::{Attach, MAX_CHALLENGE};

/// The longest turn the agent waits for, whatever the leader says.
const MOST_TURN: Duration = Duration::from_secs(300);

/// Attaches member `at`'s tunnel once and hands back the upgraded connection without serving
/// anything on it: a tunnel that answers nothing, not even pings (the benchmark's frozen agent).
pub async fn attach_unserved(client: &Client, at: &Attach) -> Result<hyper::upgrade::Upgraded, String> {
    dial(client, at).await.map(|t| t.io).map_err(|d| d.to_string())
}

/// An attached tunnel.
pub(crate) struct Attached {
    /// The upgraded connection.
    pub io: hyper::upgrade::Upgraded,
    /// Whether the leader starts HTTP/2 on it at its first request only (`tether_tunnel::idle`);
    /// otherwise it runs from the first byte.
    pub on_demand: bool,
}

/// The cause of a failure to reach the leader.
pub type Cause = Box<dyn std::error::Error + Send + Sync>;

/// Why a dial failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Dial {
    /// No answer (network, TLS, the leader's API server down), or a server error.
    #[error(transparent)]
    Unreachable(Cause),
    /// An answer other than the one asked for.
    #[error("{0}")]
    Refused(String),
    /// The leader paced the attach: this member's turn is this far away (`503` with
    /// `Retry-After`; many members are attaching at once).
    #[error("many members are attaching through the leader; this one's turn is in {}s", .0.as_secs())]
    Turn(Duration),
}

impl Dial {
    fn unreachable(e: impl Into<Cause>) -> Self {
        Dial::Unreachable(e.into())
    }
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
            .header(UPGRADE, UPGRADE_PROTOCOL)
            .header(idle::START_HEADER, idle::ON_DEMAND);
    }
    req.body(KubeBody::empty()).map_err(Dial::unreachable)
}

/// The answer's status and (bounded) body, or why there was none.
pub(crate) async fn send(client: &Client, req: Request<KubeBody>) -> Result<Response<KubeBody>, Dial> {
    client.send(req).await.map_err(Dial::unreachable)
}

/// Why the leader's answer `code` with `body` was not the one asked for.
pub(crate) fn refused(code: StatusCode, body: &[u8]) -> Dial {
    let why = format!(
        "the leader answered {code}: {}",
        String::from_utf8_lossy(body).trim()
    );
    // NB: 503 from the aggregator means the leader replica is not (yet) reachable behind the
    // APIService, as during a failover: retry at the normal pace. A refused proof (expired, used
    // already, issued by another replica) says nothing about the member: a new challenge may pass.
    if code.is_server_error() || proof_refused(code, body) {
        Dial::unreachable(why)
    } else {
        Dial::Refused(why)
    }
}

/// The wait a `503` with `Retry-After` (whole seconds) asks for, at most `MOST_TURN`: the leader
/// pacing attaches (`tether_leader::proxy::pace`). A 503 without it (no replica serving) is
/// retried at the recovery pace.
fn turn(code: StatusCode, headers: &http::HeaderMap) -> Option<Duration> {
    if code != StatusCode::SERVICE_UNAVAILABLE {
        return None;
    }
    let seconds: u64 = headers.get(RETRY_AFTER)?.to_str().ok()?.trim().parse().ok()?;
    Some(Duration::from_secs(seconds).min(MOST_TURN))
}

/// Whether the leader refused the proof itself, not the member: a 403 Status whose reason is
/// `PROOF_REFUSED`.
pub(crate) fn proof_refused(code: StatusCode, body: &[u8]) -> bool {
    code == StatusCode::FORBIDDEN
        && serde_json::from_slice::<Status>(body).is_ok_and(|s| s.reason.as_deref() == Some(PROOF_REFUSED))
}

/// Asks the leader for a challenge and reads the proof out of it with the member's key.
async fn proof(client: &Client, at: &Attach, req: Request<KubeBody>) -> Result<String, Dial> {
    open_challenge(client, req, &at.namespace, &at.name, &at.key).await
}

/// A GET of `path`.
fn get(path: &str) -> Result<Request<KubeBody>, Dial> {
    Request::get(path)
        .body(KubeBody::empty())
        .map_err(Dial::unreachable)
}

/// `req`, sent once by the client: a dial's requests come back to the redial schedule at once
/// (`run`), rather than waiting in the client's own retries while no leader replica serves.
fn once(mut req: Request<KubeBody>) -> Request<KubeBody> {
    req.extensions_mut().insert(tether_join::retry::Once);
    req
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
    open_challenge(client, get(path)?, namespace, name, key).await
}

/// Sends `req` for a challenge and reads the proof token out of it (see `read_challenge`).
async fn open_challenge(
    client: &Client,
    req: Request<KubeBody>,
    namespace: &str,
    name: &str,
    key: &str,
) -> Result<String, Dial> {
    let resp = send(client, req).await?;
    let code = resp.status();
    if let Some(wait) = turn(code, resp.headers()) {
        return Err(Dial::Turn(wait));
    }
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
/// through the leader's API server that carries the proof (and offers to start HTTP/2 on
/// demand; a leader from before ignores the offer).
pub(super) async fn dial(client: &Client, at: &Attach) -> Result<Attached, Dial> {
    let path = attach_path(&at.namespace, &at.name);
    let p = proof(client, at, once(get(&path)?)).await?;
    let mut resp = send(client, once(attach_request(at, Some(&p), true)?)).await?;
    let code = resp.status();
    if code != StatusCode::SWITCHING_PROTOCOLS {
        let body = pipe::collect_limited(resp.into_body(), 2048).await;
        // NB: the leader just answered our challenge, so a refused proof is a race (the serving
        // replica changed between the two requests): ask again at the normal pace.
        return Err(match refused(code, &body) {
            Dial::Refused(why) => Dial::unreachable(why),
            other => other,
        });
    }
    let on_demand = resp
        .headers()
        .get(idle::START_HEADER)
        .is_some_and(|v| v == idle::ON_DEMAND);
    let io = hyper::upgrade::on(&mut resp).await.map_err(Dial::unreachable)?;
    Ok(Attached { io, on_demand })
}

/// Proves the key again over `client` (a renewed credential), so the live tunnel is kept.
pub(super) async fn reprove(client: Client, at: Attach, metrics: Metrics) {
    let renewed = async {
        let p = proof(&client, &at, get(&attach_path(&at.namespace, &at.name))?).await?;
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
        Err(why) => {
            metrics.attach("refused");
            warn!(
                error = &why as &dyn std::error::Error,
                "Cannot prove the key over the renewed credential; the leader closes the tunnel when the old one expires, and it is redialled"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_proof_is_retried_and_a_refused_member_is_not() {
        let body = |reason: &str| {
            serde_json::json!({"kind": "Status", "apiVersion": "v1", "code": 403, "reason": reason,
                               "message": "member east: the attach proof was used already"})
            .to_string()
        };
        let proof = body(PROOF_REFUSED);
        assert!(proof_refused(StatusCode::FORBIDDEN, proof.as_bytes()));
        assert!(matches!(
            refused(StatusCode::FORBIDDEN, proof.as_bytes()),
            Dial::Unreachable(_)
        ));
        let member = body("Forbidden");
        assert!(!proof_refused(StatusCode::FORBIDDEN, member.as_bytes()));
        assert!(matches!(
            refused(StatusCode::FORBIDDEN, member.as_bytes()),
            Dial::Refused(_)
        ));
        assert!(!proof_refused(StatusCode::UNAUTHORIZED, proof.as_bytes()));
        assert!(!proof_refused(StatusCode::FORBIDDEN, b"not json"));
        assert!(matches!(
            refused(StatusCode::SERVICE_UNAVAILABLE, b""),
            Dial::Unreachable(_)
        ));
    }

    #[test]
    fn a_turn_is_a_503_with_whole_seconds_to_wait_and_nothing_else() {
        let after = |v: &str| {
            let mut h = http::HeaderMap::new();
            h.insert(RETRY_AFTER, http::HeaderValue::from_str(v).unwrap());
            h
        };
        let unavailable = StatusCode::SERVICE_UNAVAILABLE;
        assert_eq!(turn(unavailable, &after("7")), Some(Duration::from_secs(7)));
        assert_eq!(turn(unavailable, &after("86400")), Some(MOST_TURN));
        // The aggregator's own 503 (no replica serving) has none: the recovery pace.
        assert_eq!(turn(unavailable, &http::HeaderMap::new()), None);
        // An HTTP date, garbage, or another status: not a turn.
        assert_eq!(turn(unavailable, &after("Wed, 21 Oct 2026 07:28:00 GMT")), None);
        assert_eq!(turn(unavailable, &after("-1")), None);
        assert_eq!(turn(StatusCode::TOO_MANY_REQUESTS, &after("1")), None);
    }
}
