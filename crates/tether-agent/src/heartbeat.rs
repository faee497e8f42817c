//! The member's heartbeat: one small write that renews its Lease on the leader, often while
//! nothing else tells the leader the member lives, rarely while its tunnel does.
//!
//! - With the tunnel attached, the leader sees the agent alive in its pings, so the Lease is only
//!   the backstop, renewed every `tunnelHeartbeatInterval` (minutes).
//! - Without a tunnel (member access off, the leader does not serve it, or it cannot attach),
//!   the Lease is the heartbeat, renewed every `heartbeatInterval`.
//! - When the tunnel is lost, the agent first tries to attach it again and renews at the short
//!   interval only `DETACHED_WAIT` intervals later; one back within that wait keeps its old
//!   schedule, so a whole fleet whose tunnels dropped at once (a leader failover) re-attaches
//!   without a burst of writes.
//!
//! Both intervals, and the ping interval, are annotations the leader keeps on the Lease, read
//! back from each renewal. Under a leader from before heartbeat Leases (no Lease, or no right to
//! it) the agent renews its announce as before, and tries the Lease again every `LEASE_RETRY`.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use rand::Rng;
use serde_json::json;
use tether_api::conditions::Reason;
use tether_api::{MemberClusterAnnounce, annotations};
use tether_join::settle::Settle;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::link::{DEFAULT_PING, Link};
use crate::status::StatusSink;
use crate::{Error, FIELD_MANAGER, Metrics};
/// After losing its tunnel, the agent waits this many short intervals before renewing.
const DETACHED_WAIT: u32 = 3;
/// Under a leader without heartbeat Leases, how often the agent tries its Lease again.
const LEASE_RETRY: Duration = Duration::from_secs(300);
/// How long the first renewal of a session waits at most for the tunnel's first dial to end
/// (member access on; `first_attach`).
pub const FIRST_ATTACH_WAIT: Duration = Duration::from_secs(5);

/// The intervals the leader asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Intervals {
    /// Between renewals without a tunnel (the set's `heartbeatInterval`).
    pub alone: Duration,
    /// Between renewals with the tunnel attached (the set's `tunnelHeartbeatInterval`).
    pub tunneled: Duration,
    /// Between pings of the tunnel (the set's `tunnelPingInterval`).
    pub ping: Duration,
}

impl Default for Intervals {
    /// The set defaults, until the leader says otherwise.
    fn default() -> Self {
        Self {
            alone: Duration::from_secs(10),
            tunneled: Duration::from_secs(300),
            ping: DEFAULT_PING,
        }
    }
}

impl Intervals {
    /// The intervals on a heartbeat Lease (the defaults for any it lacks or that do not parse).
    pub fn of(lease: &Lease) -> Self {
        let d = Self::default();
        let a = lease.annotations();
        let secs = |key: &str, default: Duration| {
            a.get(key)
                .and_then(|v| v.parse::<u64>().ok())
                .filter(|s| (1..=86_400).contains(s))
                .map_or(default, Duration::from_secs)
        };
        Self {
            alone: secs(annotations::HEARTBEAT_INTERVAL, d.alone),
            tunneled: secs(annotations::TUNNEL_HEARTBEAT_INTERVAL, d.tunneled),
            ping: secs(annotations::TUNNEL_PING_INTERVAL, d.ping),
        }
    }

    /// Until the next renewal: the long interval while the tunnel is attached.
    pub fn next(&self, attached: bool) -> Duration {
        if attached {
            self.tunneled.max(self.alone)
        } else {
            self.alone
        }
    }
}

/// One heartbeat: renews the Lease `name` with `now` (one small write) and returns the
/// intervals it carries.
pub async fn renew(api: &Api<Lease>, name: &str, now: Timestamp) -> Result<Intervals, kube::Error> {
    let pp = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    let body = json!({"spec": {"renewTime": MicroTime(now)}});
    let lease = api.patch(name, &pp, &Patch::Merge(body)).await?;
    Ok(Intervals::of(&lease))
}

/// One heartbeat under a leader from before heartbeat Leases: renews the announce `name` with
/// `now` and returns the interval the leader asks for.
pub async fn beat(
    api: &Api<MemberClusterAnnounce>,
    name: &str,
    now: Timestamp,
) -> Result<Duration, kube::Error> {
    let pp = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    let body = json!({"spec": {"renewTime": now.to_string()}});
    let mca = api.patch(name, &pp, &Patch::Merge(body)).await?;
    Ok(Duration::from_secs(
        mca.spec.heartbeat_interval_seconds.unwrap_or(10).max(1) as u64,
    ))
}

/// When the renewal after the one at `began` is due, now that the tunnel turned `attached` at
/// `now` (it was due at `due`): sooner if the tunnel was lost (`DETACHED_WAIT` short intervals,
/// jittered, unless it was due sooner anyway); the long interval after `began` if it is back.
///
/// NB: a fleet whose tunnels dropped together (a leader failover) and came back within the wait
/// renews on its old schedule, not all at once `DETACHED_WAIT` intervals after the drop.
pub fn due_after_change<T>(due: T, began: T, now: T, attached: bool, intervals: Intervals) -> T
where
    T: Copy + Ord + std::ops::Add<Duration, Output = T>,
{
    if attached {
        due.max(began + jittered(intervals.next(true)))
    } else {
        due.min(now + jittered(intervals.alone * DETACHED_WAIT))
    }
}

/// `interval` ±10%, so that members started together do not heartbeat in lockstep.
pub fn jittered(interval: Duration) -> Duration {
    let factor = rand::rng().random_range(0.9..1.1);
    interval.mul_f64(factor)
}

/// Whether a refusal of the Lease means the leader has none for this member (a leader from
/// before heartbeat Leases: no Lease, or an agent Role without it), rather than a bad credential.
fn no_lease(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if matches!(s.code, 403 | 404))
}

/// What the heartbeat renews.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    Lease,
    /// The announce, since `since` (the Lease is tried again `LEASE_RETRY` after).
    Announce {
        since: Instant,
    },
}

/// Renews the member's heartbeat until the credential is rejected. With member access on
/// (`tunnel`), the first renewal waits for the tunnel a little (`first_attach`).
pub(crate) async fn run(
    metrics: &Metrics,
    sink: &StatusSink,
    client: watch::Receiver<Client>,
    link: &Link,
    tunnel: bool,
    ns: &str,
    name: &str,
) -> Result<(), Error> {
    let mut intervals = Intervals::default();
    let mut target = Target::Lease;
    let mut failures: u32 = 0;
    let mut forbidden = Settle::forbidden();
    let mut attached = link.attached();
    if tunnel {
        first_attach(link, FIRST_ATTACH_WAIT).await;
    }
    loop {
        let leader = client.borrow().clone();
        let now = Timestamp::now();
        let result = match target {
            Target::Lease => match renew(&Api::namespaced(leader.clone(), ns), name, now).await {
                // NB: a leader from before Leases has none (404) or gave no right to it (403);
                // but a 403 is also what an API server whose RBAC cache is still cold (just
                // restarted) answers for a while. Only when the announce can be renewed
                // instead is it the former.
                Err(e) if no_lease(&e) => match beat(&Api::namespaced(leader, ns), name, now).await {
                    Ok(alone) => {
                        info!(error = %e, "No heartbeat Lease on the leader (a leader from before them); renewing the announce");
                        target = Target::Announce {
                            since: Instant::now(),
                        };
                        Ok(Intervals {
                            alone,
                            tunneled: alone,
                            ..intervals
                        })
                    }
                    Err(_) => Err(e),
                },
                r => r,
            },
            Target::Announce { since } => {
                let r = beat(&Api::namespaced(leader, ns), name, now).await;
                if since.elapsed() >= LEASE_RETRY {
                    target = Target::Lease;
                }
                r.map(|alone| Intervals {
                    alone,
                    tunneled: alone,
                    ..intervals
                })
            }
        };
        match result {
            Ok(next) => {
                forbidden.clear();
                metrics.heartbeat(true);
                failures = 0;
                intervals = next;
                link.set_ping(intervals.ping);
                let how = match (target, *attached.borrow()) {
                    (Target::Announce { .. }, _) => {
                        format!("announce renewed every {}s", intervals.alone.as_secs())
                    }
                    (Target::Lease, true) => format!(
                        "tunnel attached; heartbeat Lease renewed every {}s",
                        intervals.tunneled.as_secs()
                    ),
                    (Target::Lease, false) => {
                        format!("heartbeat Lease renewed every {}s", intervals.alone.as_secs())
                    }
                };
                sink.beat(now, how);
            }
            Err(e) => {
                let settling = forbidden.tolerate(&e);
                let err = Error::rejected("heartbeat", e);
                if matches!(err, Error::CredentialRejected(_)) && !settling {
                    return Err(err);
                }
                metrics.heartbeat(false);
                failures += 1;
                warn!(
                    error = &err as &dyn std::error::Error,
                    failures, "Heartbeat failed; retrying"
                );
                let why = err.to_string();
                sink.update(move |v| v.reachable = Some((false, Reason::LeaderUnreachable, why)));
                let backoff = Duration::from_secs(1 << failures.min(6))
                    .min(intervals.alone.max(Duration::from_secs(1)));
                tokio::time::sleep(backoff).await;
                continue;
            }
        }
        wait(&mut attached, intervals).await;
    }
}

/// Waits until the tunnel's first dial ended, at most `wait`; whether the tunnel is attached. A
/// joining member's first renewal waits so: with its tunnel attached first, the leader declares
/// it Ready on both in one status write (`TunnelAlive`); a renewal first is one write
/// (`HeartbeatReceived`), and the tunnel attaching a moment later another (0.77 more per
/// registration at 5,000 members, each one more ManagedCluster version in the API server's watch
/// cache). A dial that fails (a leader that does not serve member access, or asks to wait for a
/// turn) ends the wait at once.
pub async fn first_attach(link: &Link, wait: Duration) -> bool {
    let mut dialled = link.dialled();
    let _ = tokio::time::timeout(wait, dialled.wait_for(|d| *d)).await;
    *link.attached().borrow()
}

/// Waits until the next renewal is due: the interval for whether the tunnel is attached now,
/// moved as the tunnel is lost and comes back meanwhile (`due_after_change`).
async fn wait(attached: &mut watch::Receiver<bool>, intervals: Intervals) {
    let began = tokio::time::Instant::now();
    let mut due = began + jittered(intervals.next(*attached.borrow_and_update()));
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(due) => return,
            changed = attached.changed() => {
                if changed.is_err() {
                    // NB: the tunnel is gone for good (member access off): keep the due time.
                    tokio::time::sleep_until(due).await;
                    return;
                }
                let now = *attached.borrow_and_update();
                due = due_after_change(due, began, tokio::time::Instant::now(), now, intervals);
            }
        }
    }
}

#[cfg(test)]
mod tests;
