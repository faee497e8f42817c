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

/// Renews the member's heartbeat until the credential is rejected.
pub(crate) async fn run(
    metrics: &Metrics,
    sink: &StatusSink,
    client: watch::Receiver<Client>,
    link: &Link,
    ns: &str,
    name: &str,
) -> Result<(), Error> {
    let mut intervals = Intervals::default();
    let mut target = Target::Lease;
    let mut failures: u32 = 0;
    let mut forbidden = Settle::forbidden();
    let mut attached = link.attached();
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
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn lease(annotations: &[(&str, &str)]) -> Lease {
        let mut l = Lease::default();
        l.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
        );
        l
    }

    #[test]
    fn intervals_come_from_the_lease_with_defaults_for_what_is_missing_or_bad() {
        let l = lease(&[
            (annotations::HEARTBEAT_INTERVAL, "2"),
            (annotations::TUNNEL_HEARTBEAT_INTERVAL, "120"),
            (annotations::TUNNEL_PING_INTERVAL, "0"),
        ]);
        let i = Intervals::of(&l);
        assert_eq!(i.alone, Duration::from_secs(2));
        assert_eq!(i.tunneled, Duration::from_secs(120));
        assert_eq!(i.ping, Duration::from_secs(5), "0 is not an interval");
        assert_eq!(Intervals::of(&lease(&[])), Intervals::default());
        assert_eq!(
            Intervals::of(&lease(&[(annotations::HEARTBEAT_INTERVAL, "ten")])).alone,
            Duration::from_secs(10)
        );
        assert_eq!(i.next(true), Duration::from_secs(120));
        assert_eq!(i.next(false), Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_tunnel_brings_the_next_renewal_forward_but_not_at_once() {
        let link = Link::default();
        link.set_attached(true);
        let mut attached = link.attached();
        let i = Intervals {
            alone: Duration::from_secs(10),
            tunneled: Duration::from_secs(300),
            ping: Duration::from_secs(5),
        };
        let start = tokio::time::Instant::now();
        let waiting = tokio::spawn(async move { wait(&mut attached, i).await });
        tokio::time::sleep(Duration::from_secs(60)).await;
        link.set_attached(false);
        waiting.await.expect("wait");
        let waited = start.elapsed();
        // Lost at 60 s: renewed 27–33 s later, not at 300 s and not at once.
        assert!(
            waited >= Duration::from_secs(87) && waited <= Duration::from_secs(93),
            "{waited:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_tunnel_back_within_the_wait_keeps_the_long_interval_and_one_attached_late_gets_it() {
        let link = Link::default();
        link.set_attached(true);
        let i = Intervals {
            alone: Duration::from_secs(10),
            tunneled: Duration::from_secs(300),
            ping: Duration::from_secs(5),
        };
        let timed = |lost: u64, back: u64| {
            let (link, mut attached) = (&link, link.attached());
            async move {
                let start = tokio::time::Instant::now();
                let waiting = tokio::spawn(async move {
                    wait(&mut attached, i).await;
                    start.elapsed()
                });
                tokio::time::sleep(Duration::from_secs(lost)).await;
                link.set_attached(false);
                tokio::time::sleep(Duration::from_secs(back - lost)).await;
                link.set_attached(true);
                waiting.await.expect("wait")
            }
        };
        // Lost at 60 s, back at 75 s (a failover): renewed on the old schedule, 270–330 s.
        let waited = timed(60, 75).await;
        assert!(
            waited >= Duration::from_secs(270) && waited <= Duration::from_secs(330),
            "{waited:?}"
        );
        // Lost at 60 s and back only after the wait ran out: renewed at 87–93 s as before.
        let waited = timed(60, 95).await;
        assert!(
            waited >= Duration::from_secs(87) && waited <= Duration::from_secs(93),
            "{waited:?}"
        );
    }

    use crate::testing::{self, count, failure};
    use serde_json::json;
    use tether_api::conditions::ConditionType;

    const LEASE: &str = "PATCH /apis/coordination.k8s.io/v1/namespaces/ns/leases/east";
    const ANNOUNCE: &str =
        "PATCH /apis/multicluster.tether.dev/v1alpha1/namespaces/ns/memberclusterannounces/east";

    fn renewed_lease() -> (u16, serde_json::Value) {
        (
            200,
            json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                   "metadata": {"name": "east", "namespace": "ns",
                                "annotations": {annotations::HEARTBEAT_INTERVAL: "10"}},
                   "spec": {}}),
        )
    }

    fn renewed_announce(interval: i32) -> (u16, serde_json::Value) {
        (
            200,
            json!({"apiVersion": "multicluster.tether.dev/v1alpha1", "kind": "MemberClusterAnnounce",
                   "metadata": {"name": "east", "namespace": "ns"},
                   "spec": {"clusterID": "id-1", "heartbeatIntervalSeconds": interval}}),
        )
    }

    /// Runs the heartbeat against `leader` for `secs` of (paused) time; its result if it ended.
    async fn beat_for(leader: kube::Client, secs: u64, sink: &StatusSink) -> Option<Result<(), Error>> {
        let (_tx, rx) = watch::channel(leader);
        let link = Link::default();
        let metrics = Metrics::default();
        tokio::time::timeout(
            Duration::from_secs(secs),
            run(&metrics, sink, rx, &link, "ns", "east"),
        )
        .await
        .ok()
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_leader_is_retried_with_backoff_and_shown_unreachable_until_it_answers() {
        let (leader, calls) = testing::client(|_, _, n| if n < 2 { failure(500) } else { renewed_lease() });
        let (sink, owner, writes) = testing::sink(false);
        // Fails at 0 s and 2 s (backoff 2 s, then 4 s), renews at 6 s, next at 15–17 s.
        assert!(beat_for(leader, 14, &sink).await.is_none(), "still beating");
        assert_eq!(count(&calls, LEASE), 3);
        drop(sink);
        owner.await.expect("owner");
        assert_eq!(
            testing::reasons(&writes, ConditionType::LeaderReachable),
            ["LeaderUnreachable", "HeartbeatOK"]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusal_is_taken_for_rbac_settling_for_30_s_then_ends_the_session() {
        // 403 on the Lease and on the announce: a cold RBAC cache, or a revoked identity.
        let (leader, calls) = testing::client(|_, _, _| failure(403));
        let (sink, _owner, _) = testing::sink(false);
        let start = tokio::time::Instant::now();
        let ended = beat_for(leader, 120, &sink).await.expect("ended");
        assert!(matches!(ended, Err(Error::CredentialRejected(_))), "{ended:?}");
        let after = start.elapsed();
        assert!(
            after >= Duration::from_secs(30) && after < Duration::from_secs(45),
            "{after:?}"
        );
        assert!(count(&calls, LEASE) >= 4, "retried meanwhile");
    }

    #[tokio::test(start_paused = true)]
    async fn an_unauthorized_credential_ends_the_session_at_once() {
        let (leader, calls) = testing::client(|_, _, _| failure(401));
        let (sink, _owner, _) = testing::sink(false);
        let ended = beat_for(leader, 120, &sink).await.expect("ended");
        assert!(matches!(ended, Err(Error::CredentialRejected(_))), "{ended:?}");
        assert_eq!(count(&calls, LEASE), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_leader_without_heartbeat_leases_gets_the_announce_renewed_at_its_interval() {
        let (leader, calls) = testing::client(|_, path, _| {
            if path.contains("/leases/") {
                failure(404)
            } else {
                renewed_announce(20)
            }
        });
        let (sink, _owner, _) = testing::sink(false);
        // The Lease once (404), the announce at 0 s and every 18–22 s: at 0, ~20, ~40 s.
        assert!(beat_for(leader, 50, &sink).await.is_none());
        assert_eq!(count(&calls, LEASE), 1, "not tried again before LEASE_RETRY");
        assert_eq!(count(&calls, ANNOUNCE), 3);
    }
}
