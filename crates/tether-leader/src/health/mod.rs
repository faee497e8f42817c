//! Member health, kept in memory from two signals: the member's tunnel (attached, or closed and
//! how), and the renewals of its heartbeat (its Lease, or the announce of an agent from before
//! Leases). Pure apart from a mutex; no API calls, so neither a heartbeat nor a ping costs the
//! leader a write.
//!
//! A member whose tunnel is attached is alive: the serving replica pings it, so a tunnel that
//! stops answering closes within the set's detection time, and its agent renews the Lease only
//! every few minutes as a backstop. A member without a tunnel is judged by its Lease alone, at
//! the set's heartbeat interval and grace period.
//!
//! The leader does not blame members for its own blindness:
//! - while its heartbeat watches fail (its API server down or restarting) renewals may arrive
//!   unseen, so no member is judged, and once the watches work again the blind time is counted
//!   neither in any member's age nor in the time since its tunnel closed;
//! - when many tunnels close at once (the API server in their path restarted, or a replica
//!   handed over), each gets `MASS_GRACE` to attach again;
//! - for `TERM_GRACE` after this replica gains leadership, no member is judged by the absence of
//!   a tunnel or of a recent renewal: agents are still re-attaching to it;
//! - both graces go on while tunnels keep coming back, up to a bound (`tunnels.rs`).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;

mod transition;
mod tunnels;
mod verdict;

pub use transition::{Facts, Notice, Transition, transition};
use tunnels::Tunnels;
pub use tunnels::{Close, MASS_GRACE, TERM_GRACE, Tunnel};
pub use verdict::{Signals, Timings, Verdict, judge};

/// What the leader last saw of one member's heartbeat.
#[derive(Clone, Debug)]
struct Seen {
    renew_time: Option<MicroTime>,
    at: Instant,
}

/// The result of looking at a member's heartbeat.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Observation {
    /// Time since the last renewal (or since the leader first saw the member, if it never renewed).
    pub age: Duration,
    /// Whether the member has ever renewed its heartbeat.
    pub renewed: bool,
    /// Set when this observation is a new renewal: the time since the previous one.
    pub interval: Option<Duration>,
}

/// How long after its last error a watch without another error counts as working again (longer
/// than the longest watch retry delay, so a watch still failing errors again first).
pub const QUIET: Duration = Duration::from_secs(10);
/// Whether the leader can see heartbeats.
#[derive(Clone, Copy, Debug, Default)]
struct Sight {
    /// Since when it cannot, if it cannot.
    blind_since: Option<Instant>,
    /// The last watch error.
    last_error: Option<Instant>,
}

/// Last renewal and tunnel of every member, keyed by `namespace/name`.
#[derive(Default)]
pub struct Tracker {
    seen: Mutex<HashMap<String, Seen>>,
    sight: Mutex<Sight>,
    tunnels: Mutex<Tunnels>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // NB: every update is one insert, remove or field write: consistent under a panic elsewhere.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Tracker {
    /// A heartbeat watch failed at `now`: renewals may go unseen until it works again.
    pub fn lost_sight(&self, now: Instant) {
        let mut sight = lock(&self.sight);
        sight.blind_since.get_or_insert(now);
        sight.last_error = Some(now);
    }

    /// A heartbeat watch delivered an event (or finished a list) at `now`: it works again.
    pub fn saw_event(&self, now: Instant) {
        let mut sight = lock(&self.sight);
        if let Some(since) = sight.blind_since.take() {
            self.shift(now.saturating_duration_since(since), now);
        }
    }

    /// Whether renewals may currently go unseen. A watch that resumed without an event counts
    /// as working again `QUIET` after its last error.
    pub fn is_blind(&self, now: Instant) -> bool {
        let mut sight = lock(&self.sight);
        let (Some(since), Some(last)) = (sight.blind_since, sight.last_error) else {
            return false;
        };
        let regained = last + QUIET;
        if now < regained {
            return true;
        }
        sight.blind_since = None;
        self.shift(regained.saturating_duration_since(since), now);
        false
    }

    /// Adds `blind` to every member's last sighting and tunnel close (never past `now`).
    fn shift(&self, blind: Duration, now: Instant) {
        for s in lock(&self.seen).values_mut() {
            s.at = (s.at + blind).min(now);
        }
        lock(&self.tunnels).shift(blind, now);
    }

    /// Records the heartbeat's `renewTime` as seen at `now` and returns the member's heartbeat age.
    ///
    /// NB: a renewal counts from when the leader *sees* it change, so clock skew between clusters
    /// does not matter. Only a member the leader has not seen before (after a restart or a
    /// failover) is aged from its `renewTime` against `wall_now`, so that a member silent before
    /// the restart does not get a fresh grace period; that assumes clocks synced within seconds.
    pub fn observe(
        &self,
        key: &str,
        renew_time: Option<&MicroTime>,
        now: Instant,
        wall_now: Timestamp,
    ) -> Observation {
        let mut seen = lock(&self.seen);
        let renewed = renew_time.is_some();
        match seen.get_mut(key) {
            Some(s) if s.renew_time.as_ref() == renew_time => Observation {
                age: now.saturating_duration_since(s.at),
                renewed,
                interval: None,
            },
            Some(s) => {
                let interval = now.saturating_duration_since(s.at);
                s.renew_time = renew_time.cloned();
                s.at = now;
                Observation {
                    age: Duration::ZERO,
                    renewed,
                    interval: renewed.then_some(interval),
                }
            }
            None => {
                let age = renew_time
                    .and_then(|t| Duration::try_from(wall_now.duration_since(t.0)).ok())
                    .unwrap_or_default();
                let at = now.checked_sub(age).unwrap_or(now);
                seen.insert(
                    key.to_string(),
                    Seen {
                        renew_time: renew_time.cloned(),
                        at,
                    },
                );
                Observation {
                    age: now.saturating_duration_since(at),
                    renewed,
                    interval: None,
                }
            }
        }
    }

    /// This replica leads at `now`: if that began a term, absence is not judged for
    /// `TERM_GRACE` from now (longer while tunnels come back; `tunnels.rs`). Idempotent within
    /// a term.
    pub fn start_term(&self, now: Instant, wall_now: Timestamp) {
        lock(&self.tunnels).start_term(now, wall_now);
    }

    /// This replica lost leadership: what it saw of tunnels no longer counts.
    pub fn end_term(&self) {
        *lock(&self.tunnels) = Tunnels::default();
    }

    /// `key`'s tunnel attached at this replica at `now`.
    pub fn tunnel_attached(&self, key: &str, now: Instant) {
        lock(&self.tunnels).attached(key, now);
    }

    /// This replica's attach pace told an agent at `now` to come back at `turn`: a term's or a
    /// mass close's grace lasts until then at least, if it began at most 180 s before
    /// (`tunnels.rs`).
    pub fn tunnel_turn(&self, turn: Instant, now: Instant) {
        lock(&self.tunnels).promised(turn, now);
    }

    /// `key`'s tunnel closed at `now`, as `how` says.
    pub fn tunnel_closed(&self, key: &str, now: Instant, how: Close) {
        lock(&self.tunnels).closed(key, now, how);
    }

    /// `key`'s tunnel as seen this term, and until when (if at all) absence is not judged: for
    /// a member not attached this term yet, or whose tunnel was up since before the term
    /// (`up_since`, by its TunnelConnected condition), the end of the term's grace; for a
    /// closed tunnel, the end of the mass close it was part of.
    pub fn tunnel(&self, key: &str, now: Instant, up_since: Option<Timestamp>) -> (Tunnel, Option<Instant>) {
        lock(&self.tunnels).tunnel(key, now, up_since)
    }

    /// Forgets a member that left.
    pub fn forget(&self, key: &str) {
        lock(&self.seen).remove(key);
        lock(&self.tunnels).forget(key);
    }

    /// How many members are tracked.
    pub fn len(&self) -> usize {
        lock(&self.seen).len()
    }

    /// Whether no member is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn micro(secs_ago: i64, wall_now: Timestamp) -> MicroTime {
        MicroTime(wall_now - k8s_openapi::jiff::SignedDuration::from_secs(secs_ago))
    }

    #[test]
    fn a_renewal_resets_the_age_and_reports_the_interval() {
        let t = Tracker::default();
        let wall = Timestamp::now();
        let start = Instant::now();
        let first = t.observe("ns/a", Some(&micro(0, wall)), start, wall);
        assert_eq!(first.age, Duration::ZERO);
        assert!(first.interval.is_none(), "the first sighting is not a renewal");
        let later = start + Duration::from_secs(7);
        let same = t.observe("ns/a", Some(&micro(0, wall)), later, wall);
        assert_eq!(same.age, Duration::from_secs(7));
        assert!(same.interval.is_none());
        let renewed = t.observe(
            "ns/a",
            Some(&micro(-7, wall)),
            later + Duration::from_secs(3),
            wall,
        );
        assert_eq!(renewed.age, Duration::ZERO);
        assert_eq!(renewed.interval, Some(Duration::from_secs(10)));
    }

    #[test]
    fn a_member_first_seen_after_a_restart_keeps_its_age() {
        let t = Tracker::default();
        let wall = Timestamp::now();
        let now = Instant::now() + Duration::from_secs(3600);
        let obs = t.observe("ns/a", Some(&micro(120, wall)), now, wall);
        assert_eq!(obs.age, Duration::from_secs(120));
        // A renewTime in the future (member clock ahead) counts as fresh, not as negative age.
        let obs = t.observe("ns/b", Some(&micro(-30, wall)), now, wall);
        assert_eq!(obs.age, Duration::ZERO);
    }

    #[test]
    fn time_the_leader_could_not_see_does_not_age_members() {
        let t = Tracker::default();
        let wall = Timestamp::now();
        let start = Instant::now();
        t.observe("ns/a", Some(&micro(0, wall)), start, wall);
        // The watch fails 5 s later and keeps failing for a minute.
        t.lost_sight(start + Duration::from_secs(5));
        t.lost_sight(start + Duration::from_secs(60));
        assert!(t.is_blind(start + Duration::from_secs(65)));
        // An event at 65 s: the 60 s blind stretch is not the member's fault.
        t.saw_event(start + Duration::from_secs(65));
        assert!(!t.is_blind(start + Duration::from_secs(65)));
        let obs = t.observe(
            "ns/a",
            Some(&micro(0, wall)),
            start + Duration::from_secs(66),
            wall,
        );
        assert_eq!(
            obs.age,
            Duration::from_secs(6),
            "5 s before and 1 s after the blind stretch"
        );
    }

    #[test]
    fn a_watch_that_resumes_without_events_counts_as_seeing_after_the_quiet_time() {
        let t = Tracker::default();
        let wall = Timestamp::now();
        let start = Instant::now();
        t.observe("ns/a", Some(&micro(0, wall)), start, wall);
        t.lost_sight(start + Duration::from_secs(10));
        assert!(t.is_blind(start + Duration::from_secs(10) + QUIET - Duration::from_millis(1)));
        let after = start + Duration::from_secs(10) + QUIET + Duration::from_secs(30);
        assert!(!t.is_blind(after));
        // Blind from 10 s until QUIET after the last error; aged for the rest.
        let obs = t.observe("ns/a", Some(&micro(0, wall)), after, wall);
        assert_eq!(obs.age, Duration::from_secs(40));
        // Seeing again without having been blind changes nothing.
        t.saw_event(after);
        let obs = t.observe("ns/a", Some(&micro(0, wall)), after, wall);
        assert_eq!(obs.age, Duration::from_secs(40));
    }

    #[test]
    fn forgotten_members_start_over() {
        let t = Tracker::default();
        let wall = Timestamp::now();
        let now = Instant::now();
        t.observe("ns/a", None, now, wall);
        assert_eq!(t.len(), 1);
        t.forget("ns/a");
        assert!(t.is_empty());
    }

    #[test]
    fn one_close_is_judged_after_the_detection_time_but_many_together_get_the_mass_grace() {
        let t = Tracker::default();
        let now = Instant::now();
        t.start_term(now - TERM_GRACE - Duration::from_secs(1), Timestamp::now());
        for i in 0..40 {
            t.tunnel_attached(&format!("ns/m{i}"), now - TERM_GRACE);
        }
        // One close: no grace beyond the detection time.
        t.tunnel_closed("ns/m0", now, Close::Closed);
        assert_eq!(t.tunnel("ns/m0", now, None).1, None);
        // Closes of 2 and then more of the 39 left within the window: a mass close.
        t.tunnel_closed("ns/m1", now + Duration::from_secs(60), Close::Closed);
        let later = now + Duration::from_secs(61);
        t.tunnel_closed("ns/m2", later, Close::Closed);
        let (tunnel, settle) = t.tunnel("ns/m1", later, None);
        assert_eq!(
            tunnel,
            Tunnel::Closed {
                ago: Duration::from_secs(1),
                silent: false
            }
        );
        assert_eq!(
            settle,
            Some(later + MASS_GRACE),
            "the first close of the burst too"
        );
        assert_eq!(t.tunnel("ns/m2", later, None).1, Some(later + MASS_GRACE));
        // The lone close a minute before is not part of it.
        assert_eq!(t.tunnel("ns/m0", later, None).1, None);
        // One member closing its own tunnel again and again is no mass close.
        let churn = later + Duration::from_secs(120);
        for i in 0..5 {
            t.tunnel_attached("ns/m9", churn);
            t.tunnel_closed("ns/m9", churn + Duration::from_millis(i * 100), Close::Closed);
        }
        assert_eq!(t.tunnel("ns/m9", churn + Duration::from_secs(1), None).1, None);
        assert_eq!(t.tunnel("ns/m3", later, None), (Tunnel::Attached, None));
    }

    #[test]
    fn a_new_term_settles_and_blind_time_does_not_count_against_a_closed_tunnel() {
        let t = Tracker::default();
        let start = Instant::now();
        t.start_term(start, Timestamp::now());
        assert_eq!(
            t.tunnel("ns/a", start + Duration::from_secs(1), None),
            (Tunnel::Unseen, Some(start + TERM_GRACE))
        );
        // A member that attached this term (first up this term, by its condition) and closed
        // again gets no term grace: it had its chance.
        t.tunnel_attached("ns/b", start + Duration::from_secs(1));
        t.tunnel_closed("ns/b", start + Duration::from_secs(2), Close::Closed);
        assert_eq!(t.tunnel("ns/b", start + Duration::from_secs(3), None).1, None);
        let after = start + TERM_GRACE + Duration::from_secs(1);
        assert_eq!(t.tunnel("ns/a", after, None), (Tunnel::Unseen, None));
        t.tunnel_attached("ns/a", after);
        t.tunnel_closed("ns/a", after, Close::Closed);
        // The watches fail from the close on for 30 s: the close counts from their recovery.
        t.lost_sight(after);
        t.saw_event(after + Duration::from_secs(30));
        let (tunnel, _) = t.tunnel("ns/a", after + Duration::from_secs(32), None);
        assert_eq!(
            tunnel,
            Tunnel::Closed {
                ago: Duration::from_secs(2),
                silent: false
            }
        );
        t.end_term();
        assert_eq!(t.tunnel("ns/a", after, None), (Tunnel::Unseen, None));
    }
}
