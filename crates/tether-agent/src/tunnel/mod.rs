//! Ensures the member stays reachable through the leader without any inbound port: the agent
//! dials out to the leader's API server as its own member ServiceAccount, upgrades to a tunnel,
//! and serves HTTP/2 on it. Each stream becomes one request to the member API server, either
//! with the caller's own member credential (pass-through) or as the allow-listed, prefixed
//! impersonation of the leader user, never with anything the caller forged. Each attach, and each
//! renewed credential, proves the member's registered key by reading a challenge the leader
//! sealed to it. One caller cannot make the agent hold more than a bounded number of streams
//! and request bytes. A lost tunnel is redialled with jittered backoff and never ends the
//! member's session.

use std::time::{Duration, Instant};

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use kube::Client;
use rand::Rng;
use tether_tunnel::identity::AllowList;
use tether_tunnel::limits::{Budget, Streams};

use crate::Metrics;
use crate::link::Link;
use tokio::sync::watch;
use tracing::{info, warn};

mod dial;
mod forward;
mod redial;

pub use dial::{Cause, attach_unserved};
pub(crate) use dial::{Dial, proof_refused, read_challenge, refused, send};
use dial::{dial, reprove};
use forward::{Member, forward};
use redial::{Ended, Redial};

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
/// Unanswered ping intervals before the agent gives a tunnel up (the set's default).
const PING_MISSES: u32 = 2;
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

/// Serves member `m` on an attached tunnel until it ends, pinging every `ping`: idle until the
/// leader starts HTTP/2 if it said so at attach, HTTP/2 throughout otherwise.
async fn serve(attached: dial::Attached, m: Member, ping: Duration) -> Result<(), Cause> {
    let io = if attached.on_demand {
        let idle = tether_tunnel::idle::follow(TokioIo::new(attached.io), ping, ping * PING_MISSES);
        match idle.await {
            Ok(io) => io.into_inner(),
            // NB: the leader closed it (a handover, a replacement): a close, as HTTP/2's would be.
            Err(tether_tunnel::idle::Error::Closed) => return Ok(()),
            Err(e) => return Err(e.into()),
        }
    } else {
        attached.io
    };
    let svc = hyper::service::service_fn(move |req| forward(req, m.clone()));
    hyper::server::conn::http2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .keep_alive_interval(ping)
        .keep_alive_timeout(ping * PING_MISSES)
        // NB: above MAX_STREAMS, so that the stream past the limit is answered 429 rather than
        // left waiting for a protocol slot at the leader.
        .max_concurrent_streams(2 * MAX_STREAMS as u32)
        .max_header_list_size(64 * 1024)
        .serve_connection(io, svc)
        .await?;
    Ok(())
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
    let mut redial = Redial::default();
    loop {
        let client = leader.borrow_and_update().clone();
        let started = Instant::now();
        let dialled = dial(&client, &at).await;
        if dialled.is_err() {
            link.set_dialled();
        }
        let ended = match dialled {
            Ok(attached) => {
                access.metrics.attach("attached");
                info!(namespace = %at.namespace, on_demand = attached.on_demand, "Tunnel to the leader attached");
                let m = Member {
                    set: at.set.clone(),
                    namespace: at.namespace.clone(),
                    name: at.name.clone(),
                    key: at.key.clone(),
                    access: access.clone(),
                    streams: Streams::new(MAX_STREAMS),
                };
                // NB: pinged at the leader's interval, so that a tunnel the leader no longer
                // answers on is redialled as soon as the leader would call it lost.
                let ping = link.ping();
                link.set_attached(true);
                link.set_dialled();
                access.metrics.set_tunnel_attached(true);
                let served = serve(attached, m, ping);
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
                Ended::Closed {
                    lived: started.elapsed(),
                }
            }
            Err(Dial::Unreachable(cause)) => {
                access.metrics.attach("unreachable");
                warn!(
                    error = &*cause as &dyn std::error::Error,
                    "Cannot reach the leader to attach the tunnel; retrying"
                );
                Ended::Unreachable
            }
            Err(Dial::Turn(wait)) => {
                access.metrics.attach("paced");
                info!(
                    seconds = wait.as_secs(),
                    "Many members are attaching through the leader; waiting for this one's turn"
                );
                Ended::Turn(wait)
            }
            Err(Dial::Refused(why)) => {
                access.metrics.attach("refused");
                warn!(error = %why, "The leader refused the tunnel; retrying slowly");
                Ended::Refused
            }
        };
        let wait = redial.after(ended, Instant::now(), rand::rng().random_range(0.0..1.0));
        tokio::time::sleep(wait).await;
    }
}
