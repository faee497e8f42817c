//! Ensures a fleet re-attaching at once (a failover, the API server in its path restarted)
//! reaches this replica, and the leader's API server before it, at no more than a set rate:
//! each agent without a live tunnel that asks for an attach challenge either gets one, within
//! the rate, or a turn (a time to come back) after every turn already given. Pure, so that the
//! schedule is a table test.
//!
//! - A turn is a slot of `1 / rate` seconds; turns are given in arrival order, so N agents that
//!   all ask at once are done in N / rate seconds whatever pace they redial at. An agent that
//!   comes back at its turn is admitted (its slot was counted when it was given); one that comes
//!   back early is told the time left and keeps its turn: asking again never moves it back, so
//!   one member cannot push the fleet's turns out, and it holds at most one turn.
//! - Turns are answered `503` with `Retry-After` (whole seconds, rounded up so that the agent is
//!   never early): an agent from before turns reads a 503 as "retry at the recovery pace", and
//!   is admitted when it happens to come at or after its turn.
//! - What it holds: one turn per member that asked (a member is known to the leader before it
//!   is paced), dropped `STALE` after the turn if its agent never came back.
//! - Why a challenge and not the upgrade: a refused challenge costs the API server a request on
//!   connections it already holds; an upgrade costs it two TLS handshakes (the agent's and its
//!   own to this replica), ~4.6 ms of its CPU, and nothing in it paces upgrades (`attach` is
//!   long-running, which priority and fairness pass through).

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use super::tunnels::MemberKey;

/// The longest wait told: a turn further out is told this much, and kept.
pub const MOST: Duration = Duration::from_secs(120);
/// How long after its turn a turn nobody came back for is kept.
const STALE: Duration = Duration::from_secs(60);
/// How often turns past `STALE` are dropped.
const SWEEP: Duration = Duration::from_secs(10);

/// A member told to come back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Turn {
    /// When the member is admitted.
    pub at: Instant,
    /// How long that is from now, at most `MOST`.
    pub wait: Duration,
    /// Whether this answer gave the turn (false: the member already held it).
    pub new: bool,
}

/// The attach pace of one serving term.
#[derive(Debug)]
pub struct Pace {
    /// Seconds between two admissions (0: unpaced).
    slot: Duration,
    /// Admissions allowed at once while no turn is waiting.
    burst: Duration,
    /// The time of the last turn given or admission counted.
    last: Option<Instant>,
    /// Members told to come back, and when.
    turns: HashMap<MemberKey, Instant>,
    next_sweep: Option<Instant>,
}

impl Pace {
    /// A pace of `rate` admissions per second (0 or less: unpaced; at least one an hour),
    /// allowing a burst of half a second's (at least one).
    pub fn new(rate: f64) -> Self {
        let (slot, burst) = if rate > 0.0 {
            let rate = rate.max(1.0 / 3600.0);
            let slot = Duration::from_secs_f64(1.0 / rate);
            (slot, slot.mul_f64((rate / 2.0).ceil()))
        } else {
            (Duration::ZERO, Duration::ZERO)
        };
        Self {
            slot,
            burst,
            last: None,
            turns: HashMap::new(),
            next_sweep: None,
        }
    }

    /// Whether member `m` (no live tunnel) may have a challenge at `now`; if not, its turn.
    pub fn admit(&mut self, m: &MemberKey, now: Instant) -> Result<(), Turn> {
        if self.slot.is_zero() {
            return Ok(());
        }
        self.sweep(now);
        if let Some(&turn) = self.turns.get(m) {
            if now >= turn {
                self.turns.remove(m);
                return Ok(());
            }
            return Err(Turn {
                at: turn,
                wait: (turn - now).min(MOST),
                new: false,
            });
        }
        // NB: the schedule never lags `now` by more than the burst: idle time is not saved up.
        let floor = now.checked_sub(self.burst).unwrap_or(now);
        let at = self.last.map_or(floor, |last| last.max(floor)) + self.slot;
        self.last = Some(at);
        if at <= now {
            return Ok(());
        }
        self.turns.insert(m.clone(), at);
        Err(Turn {
            at,
            wait: (at - now).min(MOST),
            new: true,
        })
    }

    /// How many members hold a turn.
    pub fn waiting(&self) -> usize {
        self.turns.len()
    }

    /// Member `m`'s turn, if it holds one.
    pub fn turn(&self, m: &MemberKey) -> Option<Instant> {
        self.turns.get(m).copied()
    }

    fn sweep(&mut self, now: Instant) {
        if self.next_sweep.is_some_and(|t| now < t) {
            return;
        }
        self.next_sweep = Some(now + SWEEP);
        self.turns.retain(|_, turn| *turn + STALE > now);
    }
}

/// `Retry-After` for `wait`: whole seconds, rounded up so the agent is never early.
pub fn retry_after(wait: Duration) -> u64 {
    wait.as_secs() + u64::from(wait.subsec_nanos() > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The wait of a turn, for a table of waits.
    fn wait(admitted: Result<(), Turn>) -> Result<(), Duration> {
        admitted.map_err(|t| t.wait)
    }

    fn m(i: usize) -> MemberKey {
        MemberKey {
            namespace: format!("tether-m-{i}"),
            name: format!("m{i}"),
        }
    }

    #[test]
    fn a_fleet_asking_at_once_gets_turns_in_order_at_the_rate_and_is_admitted_at_them() {
        let mut p = Pace::new(100.0);
        let t0 = Instant::now();
        // 1,000 at once: the first half second's burst at once, then a turn every 10 ms.
        let waits: Vec<Option<Duration>> = (0..1000).map(|i| wait(p.admit(&m(i), t0)).err()).collect();
        let admitted = waits.iter().filter(|w| w.is_none()).count();
        assert_eq!(admitted, 50);
        assert_eq!(waits[50], Some(Duration::from_millis(10)));
        assert_eq!(waits[999], Some(Duration::from_millis(9500)));
        assert_eq!(p.waiting(), 950);
        assert_eq!(p.turn(&m(999)), Some(t0 + Duration::from_millis(9500)));
        assert_eq!(p.turn(&m(0)), None);
        // Early: told the time left, the turn kept, nothing moved.
        assert_eq!(
            wait(p.admit(&m(999), t0 + Duration::from_secs(9))),
            Err(Duration::from_millis(500))
        );
        assert_eq!(
            wait(p.admit(&m(999), t0 + Duration::from_secs(9))),
            Err(Duration::from_millis(500))
        );
        // At their turns: admitted, whatever came in between.
        assert_eq!(wait(p.admit(&m(999), t0 + Duration::from_millis(9500))), Ok(()));
        assert_eq!(p.turn(&m(999)), None);
        assert_eq!(wait(p.admit(&m(50), t0 + Duration::from_secs(20))), Ok(()));
        // A newcomer queues behind every turn given.
        assert_eq!(
            wait(p.admit(&m(5000), t0 + Duration::from_secs(1))),
            Err(Duration::from_millis(8510))
        );
        assert_eq!(p.waiting(), 949);
    }

    #[test]
    fn asking_again_and_again_never_moves_the_fleets_turns_and_holds_one_turn() {
        let mut p = Pace::new(10.0);
        let t0 = Instant::now();
        for i in 0..5 {
            p.admit(&m(i), t0).ok();
        }
        let given = p.admit(&m(5), t0).expect_err("a turn");
        assert!(given.new);
        for k in 0..10_000 {
            let again = p
                .admit(&m(5), t0 + Duration::from_micros(k))
                .expect_err("the same turn");
            assert!(again.at == given.at && !again.new, "{again:?}");
        }
        assert_eq!(p.waiting(), 1);
        // The next member's turn comes right after the spammer's, not 10,000 turns later.
        assert_eq!(
            wait(p.admit(&m(6), t0)),
            Err(given.wait + Duration::from_millis(100))
        );
    }

    #[test]
    fn when_quiet_a_burst_is_admitted_at_once_and_idle_time_is_not_saved_up() {
        let mut p = Pace::new(4.0);
        let t0 = Instant::now();
        assert!(wait(p.admit(&m(0), t0)).is_ok() && wait(p.admit(&m(1), t0)).is_ok());
        assert_eq!(wait(p.admit(&m(2), t0)), Err(Duration::from_millis(250)));
        // An hour later: the same burst, not an hour's worth.
        let later = t0 + Duration::from_secs(3600);
        let admitted = (10..20).filter(|&i| wait(p.admit(&m(i), later)).is_ok()).count();
        assert_eq!(admitted, 2);
        // Unpaced: everyone, always.
        let mut off = Pace::new(0.0);
        assert!((0..10_000).all(|i| wait(off.admit(&m(i), t0)).is_ok()));
        assert_eq!(off.waiting(), 0);
        // Under one a second: one at once, then a turn per slot.
        let mut slow = Pace::new(0.5);
        assert!(wait(slow.admit(&m(0), t0)).is_ok());
        assert_eq!(wait(slow.admit(&m(1), t0)), Err(Duration::from_secs(2)));
        assert_eq!(wait(slow.admit(&m(2), t0)), Err(Duration::from_secs(4)));
    }

    #[test]
    fn a_turn_far_out_is_told_at_most_two_minutes_and_one_nobody_came_back_for_is_dropped() {
        let mut p = Pace::new(1.0);
        let t0 = Instant::now();
        let waits: Vec<Duration> = (0..300).filter_map(|i| wait(p.admit(&m(i), t0)).err()).collect();
        assert_eq!(waits.last(), Some(&MOST));
        assert_eq!(p.waiting(), 299);
        // Far past every turn and STALE: a sweep drops them all.
        wait(p.admit(&m(1000), t0 + Duration::from_secs(400))).ok();
        assert_eq!(p.waiting(), 0);
        assert_eq!(retry_after(Duration::from_millis(10)), 1);
        assert_eq!(retry_after(Duration::from_secs(3)), 3);
        assert_eq!(retry_after(Duration::from_millis(3001)), 4);
    }
}
