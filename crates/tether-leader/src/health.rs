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
//!   a tunnel or of a recent renewal: agents are still re-attaching to it.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use tether_api::conditions::{Reason, Status};

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

/// A member's tunnel, as this replica saw it during its current leadership term.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tunnel {
    /// No tunnel attached to this replica this term (or it does not serve member access).
    Unseen,
    /// Attached, and answering pings.
    Attached,
    /// Closed `ago`; `silent` when it stopped answering pings rather than being closed.
    Closed {
        /// How long ago (blind time not counted).
        ago: Duration,
        /// Closed for not answering pings within the timeout (so the silence was its grace).
        silent: bool,
    },
}

#[derive(Clone, Copy, Debug)]
enum TunnelSeen {
    Attached,
    Closed { at: Instant, silent: bool },
}

/// How long after its last error a watch without another error counts as working again (longer
/// than the longest watch retry delay, so a watch still failing errors again first).
pub const QUIET: Duration = Duration::from_secs(10);
/// How long after gaining leadership absence (of a tunnel, of a recent renewal) is not judged.
pub const TERM_GRACE: Duration = Duration::from_secs(45);
/// How long tunnels that closed together get to attach again.
pub const MASS_GRACE: Duration = Duration::from_secs(45);
/// Closes within this window count together.
const MASS_WINDOW: Duration = Duration::from_secs(5);
/// At least this many closes within the window, and at least `MASS_SHARE` of the tunnels, are a
/// mass close.
const MASS_MIN: usize = 2;
const MASS_SHARE: f64 = 0.05;

/// Whether the leader can see heartbeats.
#[derive(Clone, Copy, Debug, Default)]
struct Sight {
    /// Since when it cannot, if it cannot.
    blind_since: Option<Instant>,
    /// The last watch error.
    last_error: Option<Instant>,
}

#[derive(Default)]
struct Tunnels {
    seen: HashMap<String, TunnelSeen>,
    attached: usize,
    /// Recent closes and whose, for spotting a mass close.
    recent: VecDeque<(Instant, String)>,
    /// Until when closes count as part of a mass close.
    mass_until: Option<Instant>,
    /// When this replica's leadership term began.
    term: Option<Instant>,
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
        let mut t = lock(&self.tunnels);
        for s in t.seen.values_mut() {
            if let TunnelSeen::Closed { at, .. } = s {
                *at = (*at + blind).min(now);
            }
        }
        if let Some(until) = t.mass_until.as_mut() {
            *until += blind;
        }
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
    /// `TERM_GRACE` from now. Idempotent within a term.
    pub fn start_term(&self, now: Instant) {
        lock(&self.tunnels).term.get_or_insert(now);
    }

    /// This replica lost leadership: what it saw of tunnels no longer counts.
    pub fn end_term(&self) {
        *lock(&self.tunnels) = Tunnels::default();
    }

    /// `key`'s tunnel attached at this replica.
    pub fn tunnel_attached(&self, key: &str) {
        let mut t = lock(&self.tunnels);
        let before = t.seen.insert(key.to_string(), TunnelSeen::Attached);
        if !matches!(before, Some(TunnelSeen::Attached)) {
            t.attached += 1;
        }
    }

    /// `key`'s tunnel closed at `now`; `silent` if it stopped answering pings.
    pub fn tunnel_closed(&self, key: &str, now: Instant, silent: bool) {
        let mut t = lock(&self.tunnels);
        let before = t
            .seen
            .insert(key.to_string(), TunnelSeen::Closed { at: now, silent });
        if !matches!(before, Some(TunnelSeen::Attached)) {
            return;
        }
        let open_before = t.attached;
        t.attached -= 1;
        while t
            .recent
            .front()
            .is_some_and(|(c, _)| now.saturating_duration_since(*c) > MASS_WINDOW)
        {
            t.recent.pop_front();
        }
        t.recent.push_back((now, key.to_string()));
        // NB: members, not closes: one member that closes its own tunnel over and over must not
        // buy every other member the mass close's grace.
        let members: std::collections::HashSet<&str> = t.recent.iter().map(|(_, k)| k.as_str()).collect();
        let threshold = MASS_MIN.max((open_before as f64 * MASS_SHARE).ceil() as usize);
        if members.len() >= threshold {
            // NB: the closes already in the window are part of it too.
            let first = t.recent.front().map_or(now, |(at, _)| *at);
            t.mass_until = Some(first.max(t.mass_until.unwrap_or(first)).max(now) + MASS_GRACE);
        }
    }

    /// `key`'s tunnel as seen this term, and until when (if at all) absence is not judged: for
    /// a member not attached this term yet, the end of the term's grace; for a closed tunnel,
    /// the end of the mass close it was part of (its agent already had its chance at this
    /// replica, so the term's grace is not its).
    pub fn tunnel(&self, key: &str, now: Instant) -> (Tunnel, Option<Instant>) {
        let t = lock(&self.tunnels);
        match t.seen.get(key) {
            None => (
                Tunnel::Unseen,
                t.term.map(|term| term + TERM_GRACE).filter(|u| *u > now),
            ),
            Some(TunnelSeen::Attached) => (Tunnel::Attached, None),
            Some(TunnelSeen::Closed { at, silent }) => {
                let mass = t
                    .mass_until
                    .filter(|until| *until > now && *at + MASS_WINDOW + MASS_GRACE >= *until);
                let tunnel = Tunnel::Closed {
                    ago: now.saturating_duration_since(*at),
                    silent: *silent,
                };
                (tunnel, mass)
            }
        }
    }

    /// Forgets a member that left.
    pub fn forget(&self, key: &str) {
        lock(&self.seen).remove(key);
        let mut t = lock(&self.tunnels);
        if matches!(t.seen.remove(key), Some(TunnelSeen::Attached)) {
            t.attached -= 1;
        }
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

/// A set's timings, as the judge uses them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timings {
    /// A member without a tunnel is Unknown after this long without a renewal.
    pub grace: Duration,
    /// A member with an attached tunnel is Unknown after this long without a renewal.
    pub tunnel_grace: Duration,
    /// A tunnel closed for this long, not attached again and with no renewal since, is lost.
    pub detection: Duration,
    /// A member silent for this long is removed.
    pub expiry: Duration,
}

impl Timings {
    /// The timings of a set's leader policy.
    pub fn of(policy: &tether_api::clusterset::LeaderSpec) -> Self {
        Self {
            grace: policy.grace(),
            tunnel_grace: policy.tunnel_grace().max(policy.grace()),
            detection: policy.tunnel_detection(),
            expiry: policy.expiry(),
        }
    }
}

/// What the leader knows of one member at one moment.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Signals {
    /// Its heartbeat.
    pub heartbeat: Observation,
    /// Its tunnel.
    pub tunnel: Tunnel,
    /// How long absence is not judged yet (a new term, a mass close), if at all.
    pub settling: Option<Duration>,
}

/// The leader's verdict on a member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Alive: `Ready=True` with `reason` (`TunnelAlive` or `HeartbeatReceived`). Look again
    /// after `recheck`.
    Ready {
        /// Why.
        reason: Reason,
        /// When the member would go Unknown if nothing else happens.
        recheck: Duration,
    },
    /// Not judged yet: keep what the member's conditions say, and look again after `recheck`.
    Hold {
        /// When to look again.
        recheck: Duration,
    },
    /// No heartbeat yet, none within the grace period, or a lost tunnel: `Ready=Unknown`.
    Unknown {
        /// `AwaitingHeartbeat`, `HeartbeatExpired` or `TunnelLost`.
        reason: Reason,
        /// When to look again (the end of the grace period or the member's expiry).
        recheck: Duration,
    },
    /// Silent for longer than `memberExpiry`: remove the member.
    Expired,
}

/// NB: one second past a deadline, so a recheck lands after it rather than just before.
const SLACK: Duration = Duration::from_secs(1);

/// Judges a member from its signals and its set's timings.
pub fn judge(s: Signals, t: Timings) -> Verdict {
    let age = s.heartbeat.age;
    if age > t.expiry {
        return Verdict::Expired;
    }
    let by_heartbeat = |grace: Duration, alive: Reason| {
        if age <= grace && s.heartbeat.renewed {
            Verdict::Ready {
                reason: alive,
                recheck: grace - age + SLACK,
            }
        } else if age <= grace {
            Verdict::Unknown {
                reason: Reason::AwaitingHeartbeat,
                recheck: grace - age + SLACK,
            }
        } else {
            Verdict::Unknown {
                reason: Reason::HeartbeatExpired,
                recheck: t.expiry - age + SLACK,
            }
        }
    };
    let absent = |v: Verdict| match (v, s.settling) {
        (Verdict::Unknown { .. }, Some(left)) => Verdict::Hold {
            recheck: left + SLACK,
        },
        (v, _) => v,
    };
    match s.tunnel {
        Tunnel::Attached => by_heartbeat(t.tunnel_grace, Reason::TunnelAlive),
        // NB: in a new term's grace, a member that had a tunnel is left as it is even with a
        // fresh heartbeat: judged by it now, it would turn HeartbeatReceived and TunnelConnected
        // False, only to turn back when its agent re-attaches (two writes per member at a
        // failover, and a lost grace for the next look).
        Tunnel::Unseen => match s.settling {
            Some(left) => Verdict::Hold {
                recheck: left + SLACK,
            },
            None => by_heartbeat(t.grace, Reason::HeartbeatReceived),
        },
        // NB: the agent renews its Lease at the short interval once it lost its tunnel; a
        // renewal since the close means it lives and only its tunnel path does not.
        Tunnel::Closed { ago, .. } if age < ago => by_heartbeat(t.grace, Reason::HeartbeatReceived),
        Tunnel::Closed { ago, silent } => {
            let wait = if silent { Duration::ZERO } else { t.detection };
            if ago < wait {
                return Verdict::Hold {
                    recheck: (wait - ago + SLACK).max(s.settling.unwrap_or_default() + SLACK),
                };
            }
            absent(Verdict::Unknown {
                reason: Reason::TunnelLost,
                recheck: t.expiry - age + SLACK,
            })
        }
    }
}

impl Verdict {
    /// The Ready condition's status and reason for this verdict (`None` for `Hold`).
    pub fn condition(&self) -> Option<(Status, Reason)> {
        match self {
            Verdict::Ready { reason, .. } => Some((Status::True, *reason)),
            Verdict::Unknown { reason, .. } => Some((Status::Unknown, *reason)),
            Verdict::Expired => Some((Status::Unknown, Reason::HeartbeatExpired)),
            Verdict::Hold { .. } => None,
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

    const T: Timings = Timings {
        grace: Duration::from_secs(40),
        tunnel_grace: Duration::from_secs(1200),
        detection: Duration::from_secs(15),
        expiry: Duration::from_secs(3600),
    };

    fn signals(age: u64, renewed: bool, tunnel: Tunnel, settling: Option<u64>) -> Signals {
        Signals {
            heartbeat: Observation {
                age: Duration::from_secs(age),
                renewed,
                interval: None,
            },
            tunnel,
            settling: settling.map(Duration::from_secs),
        }
    }

    fn closed(ago: u64, silent: bool) -> Tunnel {
        Tunnel::Closed {
            ago: Duration::from_secs(ago),
            silent,
        }
    }

    fn ready(reason: Reason, recheck: u64) -> Verdict {
        Verdict::Ready {
            reason,
            recheck: Duration::from_secs(recheck),
        }
    }

    fn unknown(reason: Reason, recheck: u64) -> Verdict {
        Verdict::Unknown {
            reason,
            recheck: Duration::from_secs(recheck),
        }
    }

    fn hold(recheck: u64) -> Verdict {
        Verdict::Hold {
            recheck: Duration::from_secs(recheck),
        }
    }

    #[test]
    fn verdicts_follow_the_tunnel_then_the_heartbeat() {
        use Reason::*;
        let cases = [
            // Without a tunnel: the heartbeat alone, at the set's grace.
            (
                "fresh heartbeat",
                signals(0, true, Tunnel::Unseen, None),
                ready(HeartbeatReceived, 41),
            ),
            (
                "at the grace limit",
                signals(40, true, Tunnel::Unseen, None),
                ready(HeartbeatReceived, 1),
            ),
            (
                "just past grace",
                signals(41, true, Tunnel::Unseen, None),
                unknown(HeartbeatExpired, 3560),
            ),
            (
                "approved, never renewed",
                signals(5, false, Tunnel::Unseen, None),
                unknown(AwaitingHeartbeat, 36),
            ),
            (
                "never renewed past grace",
                signals(50, false, Tunnel::Unseen, None),
                unknown(HeartbeatExpired, 3551),
            ),
            (
                "past expiry",
                signals(3601, true, Tunnel::Unseen, None),
                Verdict::Expired,
            ),
            (
                "past grace in a new term: held",
                signals(90, true, Tunnel::Unseen, Some(30)),
                hold(31),
            ),
            (
                "fresh in a new term: held too",
                signals(3, true, Tunnel::Unseen, Some(30)),
                hold(31),
            ),
            // An attached tunnel: alive, with the Lease at the long grace as the backstop.
            (
                "tunnel, Lease 10 min old",
                signals(600, true, Tunnel::Attached, None),
                ready(TunnelAlive, 601),
            ),
            (
                "tunnel, Lease past its long grace",
                signals(1201, true, Tunnel::Attached, None),
                unknown(HeartbeatExpired, 2400),
            ),
            // A closed tunnel: the detection time to attach again, unless the silence was it.
            (
                "closed 5 s ago",
                signals(200, true, closed(5, false), None),
                hold(11),
            ),
            (
                "closed 15 s ago",
                signals(200, true, closed(15, false), None),
                unknown(TunnelLost, 3401),
            ),
            (
                "silent: lost at once",
                signals(200, true, closed(0, true), None),
                unknown(TunnelLost, 3401),
            ),
            (
                "closed, then a renewal",
                signals(2, true, closed(30, false), None),
                ready(HeartbeatReceived, 39),
            ),
            (
                "closed long ago, renewals stopped",
                signals(45, true, closed(60, false), None),
                unknown(HeartbeatExpired, 3556),
            ),
            (
                "closed in a mass close",
                signals(200, true, closed(20, false), Some(25)),
                hold(26),
            ),
            (
                "closed 5 s ago in a mass close",
                signals(200, true, closed(5, false), Some(40)),
                hold(41),
            ),
        ];
        for (what, s, want) in cases {
            assert_eq!(judge(s, T), want, "{what}");
        }
        assert_eq!(
            Verdict::Expired.condition(),
            Some((Status::Unknown, Reason::HeartbeatExpired))
        );
        assert_eq!(hold(1).condition(), None);
    }

    #[test]
    fn one_close_is_judged_after_the_detection_time_but_many_together_get_the_mass_grace() {
        let t = Tracker::default();
        let now = Instant::now();
        t.start_term(now - TERM_GRACE - Duration::from_secs(1));
        for i in 0..40 {
            t.tunnel_attached(&format!("ns/m{i}"));
        }
        // One close: no grace beyond the detection time.
        t.tunnel_closed("ns/m0", now, false);
        assert_eq!(t.tunnel("ns/m0", now).1, None);
        // Closes of 2 and then more of the 39 left within the window: a mass close.
        t.tunnel_closed("ns/m1", now + Duration::from_secs(60), false);
        let later = now + Duration::from_secs(61);
        t.tunnel_closed("ns/m2", later, false);
        let (tunnel, settle) = t.tunnel("ns/m1", later);
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
        assert_eq!(t.tunnel("ns/m2", later).1, Some(later + MASS_GRACE));
        // The lone close a minute before is not part of it.
        assert_eq!(t.tunnel("ns/m0", later).1, None);
        // One member closing its own tunnel again and again is no mass close.
        let churn = later + Duration::from_secs(120);
        for i in 0..5 {
            t.tunnel_attached("ns/m9");
            t.tunnel_closed("ns/m9", churn + Duration::from_millis(i * 100), false);
        }
        assert_eq!(t.tunnel("ns/m9", churn + Duration::from_secs(1)).1, None);
        assert_eq!(t.tunnel("ns/m3", later), (Tunnel::Attached, None));
    }

    #[test]
    fn a_new_term_settles_and_blind_time_does_not_count_against_a_closed_tunnel() {
        let t = Tracker::default();
        let start = Instant::now();
        t.start_term(start);
        assert_eq!(
            t.tunnel("ns/a", start + Duration::from_secs(1)),
            (Tunnel::Unseen, Some(start + TERM_GRACE))
        );
        // A member that attached this term and closed again gets no term grace: it had its chance.
        t.tunnel_attached("ns/b");
        t.tunnel_closed("ns/b", start + Duration::from_secs(2), false);
        assert_eq!(t.tunnel("ns/b", start + Duration::from_secs(3)).1, None);
        let after = start + TERM_GRACE + Duration::from_secs(1);
        assert_eq!(t.tunnel("ns/a", after), (Tunnel::Unseen, None));
        t.tunnel_attached("ns/a");
        t.tunnel_closed("ns/a", after, false);
        // The watches fail from the close on for 30 s: the close counts from their recovery.
        t.lost_sight(after);
        t.saw_event(after + Duration::from_secs(30));
        let (tunnel, _) = t.tunnel("ns/a", after + Duration::from_secs(32));
        assert_eq!(
            tunnel,
            Tunnel::Closed {
                ago: Duration::from_secs(2),
                silent: false
            }
        );
        t.end_term();
        assert_eq!(t.tunnel("ns/a", after), (Tunnel::Unseen, None));
    }
}
