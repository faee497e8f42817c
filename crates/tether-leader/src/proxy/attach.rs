//! Ensures only a member's own agent attaches, or keeps, that member's tunnel: its ServiceAccount
//! (which must still exist), and proof of the key the member registered, read out of a challenge
//! sealed to that key. A replaced tunnel is a Warning; a proven one lives for the credential it
//! attached with, unless proven again.

use std::pin::Pin;
use std::sync::Arc;

use http::header::{CONNECTION, RETRY_AFTER, UPGRADE};
use http::{HeaderValue, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::upgrade::Upgraded;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use kube::ResourceExt;
use kube::runtime::events::EventType;
use tether_api::ManagedCluster;
use tether_api::clusterset::LeaderSpec;
use tether_api::conditions::EventReason;
use tether_tunnel::identity::Caller;
use tether_tunnel::pipe::{self, Body};
use tether_tunnel::proof::{self, ATTACH_PROOF, Challenge, Renewed};
use tether_tunnel::{ATTACH, UPGRADE_PROTOCOL, headers, idle, status};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::challenge::{Purpose, Refused};
use super::pace;
use super::shared::{Shared, json, member_cluster, registered_key, unix_now};
use super::tunnels::{Carrier, Line, MemberKey};
use crate::Context;
use crate::health::Close;
use crate::metrics::Proxied;
use crate::naming::AGENT_SERVICE_ACCOUNT;

/// The leader policy of member `mc`'s set (the defaults if the set is gone).
fn policy_of(ctx: &Context, mc: &ManagedCluster) -> LeaderSpec {
    ctx.set_of(mc)
        .and_then(|set| ctx.leader_set(&set))
        .and_then(|s| s.spec.leader.clone())
        .unwrap_or_default()
}

/// `attach`, as the member's own agent ServiceAccount. Without a proof header: a challenge
/// sealed to the member's registered key. With a proof: the upgrade to a tunnel, or without an
/// upgrade the renewal of the live tunnel's deadline. A proof is the token inside a challenge;
/// only the holder of the private key can read it.
pub(super) fn attach(
    mut req: Request<Incoming>,
    caller: &Caller,
    m: MemberKey,
    sh: &Arc<Shared>,
) -> Response<Body> {
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
        sh.ctx.metrics.proxied(Proxied::AttachForbidden);
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
            sh.ctx.metrics.proxied(Proxied::AttachForbidden);
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
        sh.ctx.metrics.proxied(Proxied::AttachUnproven);
        return status(
            StatusCode::FORBIDDEN,
            &format!("member {} has no registered key; it must register again", m.name),
        );
    };
    let now = unix_now();
    let Some(given) = req.headers().get(ATTACH_PROOF) else {
        if upgrade.is_some() {
            sh.ctx.metrics.proxied(Proxied::AttachUnproven);
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
        // NB: a member with a live tunnel here is proving its key again, never paced.
        if sh.tunnels.get(&m).is_none() {
            let admitted = sh
                .pace
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .admit(&m, Instant::now());
            if let Err(turn) = admitted {
                // NB: the member is not blamed for being away until its turn (`health/tunnels.rs`).
                if turn.new {
                    sh.ctx
                        .health
                        .tunnel_turn(turn.at.into_std(), std::time::Instant::now());
                }
                sh.ctx.metrics.proxied(Proxied::AttachPaced);
                return paced(&m, turn.wait);
            }
        }
        let token = sh.challenges.issue(&m, Purpose::Attach, now);
        return match tether_seal::seal_text(&proof::plaintext(&m.namespace, &m.name, &token), &key) {
            Ok(sealed) => json(&serde_json::json!(Challenge { sealed })),
            Err(e) => status(
                StatusCode::INTERNAL_SERVER_ERROR,
                &format!("member {}'s registered key cannot be sealed to: {e}", m.name),
            ),
        };
    };
    let redeemed = match given.to_str() {
        Ok(p) if p.len() <= proof::MAX_PROOF => sh.challenges.redeem(&m, Purpose::Attach, p, now),
        _ => Err(Refused::Malformed),
    };
    if let Err(why) = redeemed {
        sh.ctx.metrics.proxied(Proxied::Refused(why));
        warn!(member = %m.name, namespace = %m.namespace, reason = why.label(), "Refused an attach proof");
        return super::rejoin::refused_proof(&m, why);
    }
    // NB: a tunnel proven now lives without a new proof for the lifetime of the credential
    // its agent attached with (the set's `credentialTTL`), so that it never outlives that token.
    let policy = policy_of(&sh.ctx, &mc);
    let lifetime = policy.credential_lifetime();
    let deadline = tokio::time::Instant::now() + lifetime;
    if upgrade.is_none() {
        return if sh.tunnels.renew(&m, &key, deadline) {
            sh.ctx.metrics.proxied(Proxied::AttachRenewed);
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
    // NB: an agent that offers it gets a tunnel that starts HTTP/2 on its first request only
    // (`tether_tunnel::idle`); one from before gets HTTP/2 at once.
    let on_demand = req
        .headers()
        .get(idle::START_HEADER)
        .is_some_and(|v| v == idle::ON_DEMAND);
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
        let (line, carrier, start) = if on_demand {
            let (line, carrier) = Line::new(None);
            (line, carrier, Start::Idle(upgraded))
        } else {
            match Box::pin(handshake(upgraded, &policy)).await {
                Ok((send, conn)) => {
                    let (line, carrier) = Line::new(Some(send));
                    (line, carrier, Start::Running(Box::pin(conn)))
                }
                Err(e) => {
                    warn!(member = %m.name, error = %e, "Tunnel handshake failed");
                    return;
                }
            }
        };
        let tunnels = &sh.tunnels;
        let inserted = tunnels.insert(m.clone(), line, key, deadline);
        info!(member = %m.name, namespace = %m.namespace, tunnels = tunnels.len(), on_demand, "Tunnel connected");
        if inserted.replaced {
            // NB: beside the tunnel, not before it: a slow API server must not keep the new
            // tunnel unanswered (its agent would find it silent).
            let ctx = sh.ctx.clone();
            tokio::spawn(async move { replaced(&ctx, &mc).await });
        }
        let how = tokio::select! {
            r = carry(start, carrier, &policy, &m) => r.err().map_or(Close::Closed, |e| {
                debug!(member = %m.name, error = %e.error, "Tunnel closed with an error");
                e.how
            }),
            _ = inserted.close.cancelled() => Close::Closed,
            _ = sh.stop.cancelled() => Close::Closed,
        };
        tunnels.remove(&m, inserted.id, how);
        if let Close::Silent { heard } = how {
            warn!(member = %m.name, namespace = %m.namespace, timeout_seconds = policy.ping_timeout().as_secs(),
                  heard, "Tunnel stopped answering pings; closed");
        } else {
            info!(member = %m.name, namespace = %m.namespace, "Tunnel disconnected");
        }
    });
    let mut resp = Response::new(pipe::empty());
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    resp.headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("Upgrade"));
    resp.headers_mut()
        .insert(UPGRADE, HeaderValue::from_static(UPGRADE_PROTOCOL));
    if on_demand {
        resp.headers_mut()
            .insert(idle::START_HEADER, HeaderValue::from_static(idle::ON_DEMAND));
    }
    resp
}

/// `503` with `Retry-After`: member `m`'s turn to attach is `wait` away (`pace`). An agent from
/// before turns retries a 503 at its recovery pace.
fn paced(m: &MemberKey, wait: std::time::Duration) -> Response<Body> {
    let seconds = pace::retry_after(wait);
    debug!(member = %m.name, seconds, "Attach paced: told its turn");
    let mut resp = status(
        StatusCode::SERVICE_UNAVAILABLE,
        &format!(
            "many members are attaching through this leader at once; member {}'s turn is in {seconds}s",
            m.name
        ),
    );
    resp.headers_mut().insert(RETRY_AFTER, HeaderValue::from(seconds));
    resp
}

type Connection = hyper::client::conn::http2::Connection<Upgraded, Body, TokioExecutor>;

/// Where a tunnel's connection starts: idle (HTTP/2 on its first request) or with HTTP/2.
/// NB: HTTP/2's connection and handshake are boxed, so that the task of an idle tunnel is only
/// as large as the idle state (a task is allocated at its largest state).
enum Start {
    Idle(Upgraded),
    Running(Pin<Box<Connection>>),
}

/// Why a tunnel's connection ended.
struct Ended {
    /// Closed, or the agent stopped answering pings (and whether it was ever heard).
    how: Close,
    error: String,
}

impl From<idle::Error> for Ended {
    fn from(e: idle::Error) -> Self {
        let how = if e.is_timeout() {
            Close::Silent {
                heard: !e.never_heard(),
            }
        } else {
            Close::Closed
        };
        Ended {
            how,
            error: e.to_string(),
        }
    }
}

/// HTTP/2, with the leader as client, on `io`. NB: the set's ping interval and timeout: a
/// tunnel that stops answering closes with a timeout error, which the member's health counts as
/// lost at once.
async fn handshake(
    io: Upgraded,
    policy: &LeaderSpec,
) -> hyper::Result<(hyper::client::conn::http2::SendRequest<Body>, Connection)> {
    hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .keep_alive_interval(policy.ping())
        .keep_alive_timeout(policy.ping_timeout())
        .keep_alive_while_idle(true)
        .handshake::<_, Body>(io)
        .await
}

/// Carries member `m`'s tunnel from `start` until it ends: pinged while idle, HTTP/2 from the
/// first request on (handed to the line through `carrier`).
async fn carry(start: Start, carrier: Carrier, policy: &LeaderSpec, m: &MemberKey) -> Result<(), Ended> {
    let conn = match start {
        Start::Running(conn) => conn,
        Start::Idle(io) => {
            let idle = idle::lead(
                TokioIo::new(io),
                policy.ping(),
                policy.ping_timeout(),
                &carrier.start,
            );
            let io = idle.await?;
            let started = Box::pin(handshake(io.into_inner(), policy)).await;
            let (send, conn) = started.map_err(|e| Ended {
                how: Close::Closed,
                error: e.to_string(),
            })?;
            debug!(member = %m.name, "Tunnel started HTTP/2 for its first request");
            carrier.ready.send_replace(Some(send));
            Box::pin(conn)
        }
    };
    // NB: a silent HTTP/2 tunnel counts as heard: on-demand, it started on the agent's STARTED;
    // from the first byte (an agent from before on-demand), HTTP/2 does not tell, and such a
    // tunnel is judged as before.
    conn.await.map_err(|e| Ended {
        how: if e.is_timeout() {
            Close::Silent { heard: true }
        } else {
            Close::Closed
        },
        error: e.to_string(),
    })
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
