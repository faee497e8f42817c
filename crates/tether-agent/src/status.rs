//! The member ClusterSet's status has one owner per session: the task `owner` returns. It holds
//! the `View` and the status it last wrote, receives what the loops observe over a channel (a
//! `StatusSink` each, cloneable), and writes the status only when it changed. Observations that
//! arrive together are written together, and the heartbeat time goes into the status at most once
//! a minute, so a heartbeat costs the member's API server nothing in between.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use tether_api::conditions::Reason;
use tether_api::{ClusterSet, ClusterSetStatus};
use tokio::sync::{mpsc, watch};
use tracing::warn;

use crate::Error;
use crate::view::{View, time};

/// The heartbeat time in the member status is refreshed at most this often.
pub const HEARTBEAT_STATUS_EVERY: Duration = Duration::from_secs(60);

/// A change to the view.
type Change = Box<dyn FnOnce(&mut View) + Send>;

/// What a loop tells the owner.
enum Observation {
    /// Any change to the view.
    Change(Change),
    /// A heartbeat went through at `at`; `how` says how the member heartbeats.
    Beat { at: Timestamp, how: String },
}

/// Where the loops send what they observe; cloneable.
#[derive(Clone)]
pub struct StatusSink {
    tx: mpsc::UnboundedSender<Observation>,
    beat: watch::Receiver<Option<Timestamp>>,
}

impl StatusSink {
    /// Changes the view; the owner writes the status if it changed.
    pub fn update(&self, change: impl FnOnce(&mut View) + Send + 'static) {
        // NB: a send fails only once the owner is gone, with its session.
        let _ = self.tx.send(Observation::Change(Box::new(change)));
    }

    /// A heartbeat went through at `at`: the leader is reachable, as `how` says.
    pub fn beat(&self, at: Timestamp, how: String) {
        let _ = self.tx.send(Observation::Beat { at, how });
    }

    /// When the last heartbeat went through (reported with the ManagedCluster status).
    pub fn last_beat(&self) -> Option<Timestamp> {
        *self.beat.borrow()
    }
}

/// A sink and the owner that writes what it is sent: `current` gives the set as the cache has it
/// now, `write` writes a status for it. The owner ends once every sink is dropped.
pub fn owner<C, W, F>(current: C, write: W) -> (StatusSink, impl Future<Output = ()>)
where
    C: Fn() -> Arc<ClusterSet>,
    W: Fn(Arc<ClusterSet>, ClusterSetStatus) -> F,
    F: Future<Output = Result<(), Error>>,
{
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (beat_tx, beat) = watch::channel(None);
    let task = async move {
        let mut view = View::default();
        let mut written: Option<ClusterSetStatus> = None;
        let mut published: Option<Instant> = None;
        while let Some(first) = rx.recv().await {
            let mut next = Some(first);
            while let Some(observation) = next {
                match observation {
                    Observation::Change(change) => change(&mut view),
                    Observation::Beat { at, how } => {
                        view.reachable = Some((true, Reason::HeartbeatOK, how));
                        beat_tx.send_replace(Some(at));
                        if published.is_none_or(|t| t.elapsed() >= HEARTBEAT_STATUS_EVERY) {
                            published = Some(Instant::now());
                            view.membership.last_heartbeat_time = Some(time(at));
                        }
                    }
                }
                next = rx.try_recv().ok();
            }
            // NB: compare with what this session last wrote, not the (possibly lagging) cache.
            let set = current();
            let previous = written.clone().or_else(|| set.status.clone()).unwrap_or_default();
            let status = view.status(&previous.conditions, set.metadata.generation, Timestamp::now());
            if status == previous {
                continue;
            }
            match write(set, status.clone()).await {
                Ok(()) => written = Some(status),
                Err(e) => warn!(
                    error = &e as &dyn std::error::Error,
                    "Cannot write the member ClusterSet status"
                ),
            }
        }
    };
    (StatusSink { tx, beat }, task)
}

#[cfg(test)]
mod tests {
    use tether_api::conditions::{ConditionType, find};

    use super::*;

    fn start(fail: bool) -> (StatusSink, tokio::task::JoinHandle<()>, crate::testing::Writes) {
        crate::testing::sink(fail)
    }

    fn reason(s: &ClusterSetStatus, kind: ConditionType) -> Option<String> {
        find(&s.conditions, kind).map(|c| c.reason.clone())
    }

    #[tokio::test]
    async fn observations_sent_together_make_one_write_and_a_repeat_makes_none() {
        let (sink, task, writes) = start(false);
        sink.update(|v| v.registered = Some((true, Reason::Approved, "namespace ns".into())));
        sink.beat(Timestamp::now(), "heartbeat Lease renewed every 10s".into());
        sink.update(|v| v.membership.namespace = Some("ns".into()));
        // Heartbeats a minute apart at most: the second one changes nothing written.
        sink.beat(Timestamp::now(), "heartbeat Lease renewed every 10s".into());
        drop(sink);
        task.await.expect("owner");
        let writes = writes.lock().unwrap();
        assert_eq!(writes.len(), 1, "{writes:?}");
        let status = &writes[0];
        assert_eq!(reason(status, ConditionType::Ready).as_deref(), Some("Joined"));
        assert!(status.membership.as_ref().unwrap().last_heartbeat_time.is_some());
    }

    #[tokio::test]
    async fn each_change_is_written_once_and_the_last_beat_is_known() {
        let (sink, task, writes) = start(false);
        let at = Timestamp::now();
        let pause = || tokio::time::sleep(Duration::from_millis(20));
        sink.update(|v| v.registered = Some((true, Reason::Approved, "namespace ns".into())));
        pause().await;
        sink.beat(at, "tunnel attached".into());
        pause().await;
        sink.update(|v| v.reachable = Some((false, Reason::LeaderUnreachable, "refused".into())));
        pause().await;
        sink.update(|v| v.reachable = Some((false, Reason::LeaderUnreachable, "refused".into())));
        assert_eq!(sink.last_beat(), Some(at));
        drop(sink);
        task.await.expect("owner");
        let reasons: Vec<_> = writes
            .lock()
            .unwrap()
            .iter()
            .map(|s| reason(s, ConditionType::Ready).unwrap_or_default())
            .collect();
        assert_eq!(
            reasons,
            ["Joining", "Joined", "LeaderUnreachable"],
            "the repeat wrote nothing"
        );
    }

    #[tokio::test]
    async fn a_failed_write_is_tried_again_with_the_next_observation() {
        let (sink, task, writes) = start(true);
        sink.update(|v| v.registered = Some((true, Reason::Approved, "namespace ns".into())));
        tokio::time::sleep(Duration::from_millis(20)).await;
        sink.update(|v| v.registered = Some((true, Reason::Approved, "namespace ns".into())));
        drop(sink);
        task.await.expect("owner");
        assert_eq!(
            writes.lock().unwrap().len(),
            2,
            "nothing was written, so the same status is tried again"
        );
    }
}
