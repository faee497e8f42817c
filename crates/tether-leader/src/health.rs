//! Member health from heartbeats, kept in memory: when each member's announce was last seen
//! renewed, and the verdict for that age. Pure apart from a mutex; no API calls, so a heartbeat
//! costs the leader no write.
//!
//! The leader does not blame members for its own blindness: while its announce watch is failing
//! (its API server down or restarting) heartbeats may arrive unseen, so no member is judged, and
//! once the watch works again the blind time is not counted in any member's age.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use tether_api::conditions::{Reason, Status};

/// What the leader last saw of one member's announce.
#[derive(Clone, Debug)]
struct Seen {
    renew_time: Option<MicroTime>,
    at: Instant,
}

/// The result of looking at a member's announce.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Observation {
    /// Time since the last renewal (or since the leader first saw the member, if it never renewed).
    pub age: Duration,
    /// Whether the member has ever renewed its announce.
    pub renewed: bool,
    /// Set when this observation is a new renewal: the time since the previous one.
    pub interval: Option<Duration>,
}

/// How long after the last watch error without another one the watch counts as working again
/// (longer than the longest watch retry delay, so a watch still failing errors again first).
pub const QUIET: Duration = Duration::from_secs(10);

/// Whether the leader can see heartbeats.
#[derive(Clone, Copy, Debug, Default)]
struct Sight {
    /// Since when it cannot, if it cannot.
    blind_since: Option<Instant>,
    /// The last watch error.
    last_error: Option<Instant>,
}

/// Last renewal of every member, keyed by `namespace/name` of its announce.
#[derive(Default)]
pub struct Tracker {
    seen: Mutex<HashMap<String, Seen>>,
    sight: Mutex<Sight>,
}

impl Tracker {
    /// The announce watch failed at `now`: heartbeats may go unseen until it works again.
    pub fn lost_sight(&self, now: Instant) {
        let mut sight = self.sight.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        sight.blind_since.get_or_insert(now);
        sight.last_error = Some(now);
    }

    /// The announce watch delivered an event (or finished a list) at `now`: it works again.
    pub fn saw_event(&self, now: Instant) {
        let mut sight = self.sight.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(since) = sight.blind_since.take() {
            self.shift(now.saturating_duration_since(since), now);
        }
    }

    /// Whether heartbeats may currently go unseen. A watch that resumed without an event counts
    /// as working again `QUIET` after its last error.
    pub fn is_blind(&self, now: Instant) -> bool {
        let mut sight = self.sight.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
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

    /// Adds `blind` to every member's last sighting (never past `now`).
    fn shift(&self, blind: Duration, now: Instant) {
        let mut seen = self.seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        for s in seen.values_mut() {
            s.at = (s.at + blind).min(now);
        }
    }

    /// Records the announce's `renewTime` as seen at `now` and returns the member's heartbeat age.
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
        let mut seen = self.seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
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

    /// Forgets a member that left.
    pub fn forget(&self, key: &str) {
        self.seen
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(key);
    }

    /// How many members are tracked.
    pub fn len(&self) -> usize {
        self.seen.lock().map(|s| s.len()).unwrap_or_default()
    }

    /// Whether no member is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The leader's verdict on a member, from its heartbeat age and the set's timings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Heartbeats arrive: `Ready=True`. Look again after `recheck`.
    Ready {
        /// When the member would go Unknown if no renewal arrives.
        recheck: Duration,
    },
    /// No heartbeat yet, or none within the grace period: `Ready=Unknown`.
    Unknown {
        /// `AwaitingHeartbeat` or `HeartbeatExpired`.
        reason: Reason,
        /// When to look again (the end of the grace period or the member's expiry).
        recheck: Duration,
    },
    /// Silent for longer than `memberExpiry`: remove the member.
    Expired,
}

/// Judges a member whose last renewal is `obs.age` old.
pub fn judge(obs: Observation, grace: Duration, expiry: Duration) -> Verdict {
    // NB: one second past the deadline, so a recheck lands after it rather than just before.
    let slack = Duration::from_secs(1);
    if obs.age > expiry {
        Verdict::Expired
    } else if obs.age <= grace && obs.renewed {
        Verdict::Ready {
            recheck: grace - obs.age + slack,
        }
    } else if obs.age <= grace {
        Verdict::Unknown {
            reason: Reason::AwaitingHeartbeat,
            recheck: grace - obs.age + slack,
        }
    } else {
        Verdict::Unknown {
            reason: Reason::HeartbeatExpired,
            recheck: expiry - obs.age + slack,
        }
    }
}

impl Verdict {
    /// The Ready condition's status and reason for this verdict.
    pub fn condition(&self) -> (Status, Reason) {
        match self {
            Verdict::Ready { .. } => (Status::True, Reason::HeartbeatReceived),
            Verdict::Unknown { reason, .. } => (Status::Unknown, *reason),
            Verdict::Expired => (Status::Unknown, Reason::HeartbeatExpired),
        }
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
    fn verdicts_follow_grace_and_expiry() {
        let grace = Duration::from_secs(40);
        let expiry = Duration::from_secs(3600);
        let obs = |age: u64, renewed: bool| Observation {
            age: Duration::from_secs(age),
            renewed,
            interval: None,
        };
        let cases = [
            (
                "fresh heartbeat",
                obs(0, true),
                Verdict::Ready {
                    recheck: Duration::from_secs(41),
                },
            ),
            (
                "at the grace limit",
                obs(40, true),
                Verdict::Ready {
                    recheck: Duration::from_secs(1),
                },
            ),
            (
                "just past grace",
                obs(41, true),
                Verdict::Unknown {
                    reason: Reason::HeartbeatExpired,
                    recheck: Duration::from_secs(3560),
                },
            ),
            (
                "approved, never renewed",
                obs(5, false),
                Verdict::Unknown {
                    reason: Reason::AwaitingHeartbeat,
                    recheck: Duration::from_secs(36),
                },
            ),
            (
                "never renewed past grace",
                obs(50, false),
                Verdict::Unknown {
                    reason: Reason::HeartbeatExpired,
                    recheck: Duration::from_secs(3551),
                },
            ),
            ("past expiry", obs(3601, true), Verdict::Expired),
        ];
        for (what, o, want) in cases {
            assert_eq!(judge(o, grace, expiry), want, "{what}");
        }
        assert_eq!(
            Verdict::Expired.condition(),
            (Status::Unknown, Reason::HeartbeatExpired)
        );
    }
}
