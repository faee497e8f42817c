//! Says when the process's runtime ran late: a timer that should have fired fired seconds after.
//! Then every judgement made on time in that stretch (a ping unanswered, a renewal missed) may
//! be this process's own lateness rather than its peer's: the log says so, with when and how
//! long, for whoever reads a verdict next to it.

use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::warn;

/// How often the timer is set.
const TICK: Duration = Duration::from_millis(250);
/// Lateness reported (beyond the tick).
pub const REPORTED: Duration = Duration::from_secs(1);

/// How late a tick set at `set` for `tick` came at `now`.
fn lateness(set: Instant, now: Instant, tick: Duration) -> Duration {
    now.saturating_duration_since(set).saturating_sub(tick)
}

/// Runs until `stop`: logs a warning each time a timer fired [`REPORTED`] or more late.
pub async fn watch(stop: CancellationToken) {
    watch_with(stop, |late| {
        warn!(
            late_ms = late.as_millis() as u64,
            "This process ran {late:.1?} late: its CPU went elsewhere (other processes, or a task that \
             did not yield); a peer judged silent in that time may not have been"
        );
    })
    .await;
}

/// Runs until `stop`: calls `report` with the lateness each time a timer fired [`REPORTED`] or
/// more late.
pub async fn watch_with(stop: CancellationToken, mut report: impl FnMut(Duration)) {
    loop {
        let set = Instant::now();
        tokio::select! {
            () = tokio::time::sleep(TICK) => {}
            () = stop.cancelled() => return,
        }
        let late = lateness(set, Instant::now(), TICK);
        if late >= REPORTED {
            report(late);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lateness_is_what_came_after_the_tick() {
        let set = Instant::now();
        assert_eq!(lateness(set, set + TICK, TICK), Duration::ZERO);
        assert_eq!(
            lateness(set, set + TICK + Duration::from_secs(3), TICK),
            Duration::from_secs(3)
        );
        // A clock that did not move (or a tick cut short) is not late.
        assert_eq!(lateness(set, set, TICK), Duration::ZERO);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_blocked_runtime_is_reported_and_a_free_one_is_not() {
        let stop = CancellationToken::new();
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let record = seen.clone();
        let task = tokio::spawn(watch_with(stop.clone(), move |late| {
            record.lock().expect("lock").push(late)
        }));
        // Free for a second: nothing reported.
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(seen.lock().expect("lock").is_empty());
        // NB: the runtime's only thread blocked for 1.5 s: the watcher's tick comes that late.
        std::thread::sleep(Duration::from_millis(1500));
        tokio::time::sleep(Duration::from_millis(50)).await;
        stop.cancel();
        task.await.expect("the watcher ends when stopped");
        let seen = seen.lock().expect("lock");
        assert_eq!(seen.len(), 1, "one late tick: {seen:?}");
        assert!(
            seen[0] >= REPORTED && seen[0] < Duration::from_secs(2),
            "{seen:?}"
        );
    }
}
