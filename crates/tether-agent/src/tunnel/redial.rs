//! When the agent dials its tunnel again: pure, so that the whole schedule is a table test.
//!
//! - A tunnel that closed after it was healthy (a leader replica handing over, its API server
//!   restarting) is redialled at a random point of `SPREAD`, so that a fleet whose tunnels
//!   closed together spreads its attaches out. For `RECOVERY` after that, a dial the leader does
//!   not answer is tried again after `FLOOR` plus a random point of a spread that starts at
//!   `SPREAD` and doubles with each failed dial up to `RECOVERY_SPREAD`: every agent is back
//!   within about `FLOOR + RECOVERY_SPREAD` of a new replica serving, and a fleet of N that
//!   keeps failing dials about N / 12 per second, not N / 7 (at a failover every attach costs
//!   the leader's API server two TLS handshakes, and nothing there holds a surge back: `attach`
//!   is long-running to priority and fairness; a fleet that outruns it saturates it, and when
//!   its 5 s availability check of the proxy API fails in the surge nothing attaches for ~20 s).
//! - A leader that paces attaches (`tether_leader::proxy::pace`, 2026-12-06) answers an agent past
//!   its rate with a turn (`503` and `Retry-After`): the agent dials again exactly then, and the
//!   schedule above is left as it was. The fleet's turns are given in order at the leader's rate,
//!   so a fleet of N is back N / rate seconds after the replica serves, without the surge.
//! - Otherwise failures back off exponentially with jitter, from `BACKOFF.0` up to `BACKOFF.1`
//!   while the leader cannot be reached, and up to `REFUSED_BACKOFF` once it refused the tunnel
//!   (no proxy API there, or no right to attach): a fleet of such members must not hammer it.

use std::time::{Duration, Instant};

/// First and longest wait between dials when the leader cannot be reached.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(250), Duration::from_secs(30));
/// Longest wait when the leader answered but refused the tunnel.
const REFUSED_BACKOFF: Duration = Duration::from_secs(300);
/// A tunnel that lived this long was healthy: its close starts a recovery.
const HEALTHY: Duration = Duration::from_secs(30);
/// The random part of every wait while recovering (and all of the first one).
const SPREAD: Duration = Duration::from_secs(10);
/// The largest random part of a wait after failed dials while recovering.
const RECOVERY_SPREAD: Duration = Duration::from_secs(20);
/// The fixed part of a wait after a failed dial while recovering.
const FLOOR: Duration = Duration::from_secs(2);
/// How long after a healthy tunnel closed failed dials are retried at the recovery pace.
const RECOVERY: Duration = Duration::from_secs(120);

/// How the last dial ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Ended {
    /// It attached, and the tunnel closed after `lived`.
    Closed { lived: Duration },
    /// No answer, or a server error.
    Unreachable,
    /// The leader refused the tunnel.
    Refused,
    /// The leader paced the attach and gave this member its turn, this far away.
    Turn(Duration),
}

/// The redial schedule of one tunnel.
#[derive(Debug)]
pub(super) struct Redial {
    backoff: Duration,
    recovering_until: Option<Instant>,
    /// The random part of the next wait while recovering.
    spread: Duration,
}

impl Default for Redial {
    fn default() -> Self {
        Self {
            backoff: BACKOFF.0,
            recovering_until: None,
            spread: SPREAD,
        }
    }
}

impl Redial {
    /// How long to wait after a dial that `ended` at `now`; `r` is a random number in [0, 1).
    pub(super) fn after(&mut self, ended: Ended, now: Instant, r: f64) -> Duration {
        let limit = match ended {
            // NB: the leader's turn is the fleet's pace: kept as given, without jitter (turns
            // are spread already) and without moving the schedule's own pace.
            Ended::Turn(wait) => return wait,
            Ended::Closed { lived } if lived >= HEALTHY => {
                self.backoff = BACKOFF.0;
                self.recovering_until = Some(now + RECOVERY);
                self.spread = SPREAD;
                return SPREAD.mul_f64(r);
            }
            Ended::Closed { .. } | Ended::Unreachable => BACKOFF.1,
            Ended::Refused => {
                self.recovering_until = None;
                REFUSED_BACKOFF
            }
        };
        match self.recovering_until {
            Some(until) if now < until => {
                let wait = FLOOR + self.spread.mul_f64(r);
                self.spread = (self.spread * 2).min(RECOVERY_SPREAD);
                return wait;
            }
            // NB: the recovery is over: go on from its pace, not from the first backoff.
            Some(_) => {
                self.recovering_until = None;
                self.backoff = self.backoff.max(FLOOR + self.spread);
            }
            None => {}
        }
        let wait = self.backoff.mul_f64(0.5 + 0.5 * r);
        self.backoff = (self.backoff * 2).min(limit);
        wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn a_failover_is_redialled_at_a_jittered_pace_that_slows_while_dials_fail_then_backs_off_as_before() {
        let mut d = Redial::default();
        let t0 = Instant::now();
        // A healthy tunnel closes: first dial within the spread.
        assert_eq!(d.after(Ended::Closed { lived: S(3600) }, t0, 0.0), S(0));
        assert_eq!(d.after(Ended::Closed { lived: S(3600) }, t0, 0.5), S(5));
        // Failed dials during the recovery: 2–12 s, then 2–22 s each, however many.
        let most = |d: &mut Redial, i: u64| d.after(Ended::Unreachable, t0 + S(i * 5), 0.999).as_secs();
        assert_eq!([most(&mut d, 0), most(&mut d, 1), most(&mut d, 2)], [11, 21, 21]);
        for i in 3..20 {
            let w = d.after(
                Ended::Unreachable,
                t0 + S(i * 5),
                if i % 2 == 0 { 0.0 } else { 0.999 },
            );
            assert!(w >= FLOOR && w < FLOOR + RECOVERY_SPREAD, "{w:?}");
        }
        // A tunnel that lived again starts the next recovery at the first pace.
        d.after(Ended::Closed { lived: S(600) }, t0 + S(100), 0.0);
        assert_eq!(d.after(Ended::Unreachable, t0 + S(101), 0.999).as_secs(), 11);
        // After it, the backoff goes on from the recovery's pace up to its limit.
        let after = t0 + S(100) + RECOVERY + S(1);
        assert_eq!(d.after(Ended::Unreachable, after, 0.999).as_secs(), 21);
        assert_eq!(d.after(Ended::Unreachable, after, 0.999).as_secs(), 29);
        assert_eq!(d.after(Ended::Unreachable, after, 0.999).as_secs(), 29);
    }

    #[test]
    fn a_turn_the_leader_gives_is_waited_exactly_and_leaves_the_recovery_as_it_was() {
        let mut d = Redial::default();
        let t0 = Instant::now();
        d.after(Ended::Closed { lived: S(3600) }, t0, 0.0);
        assert_eq!(d.after(Ended::Unreachable, t0 + S(1), 0.999).as_secs(), 11);
        for r in [0.0, 0.5, 0.999] {
            assert_eq!(d.after(Ended::Turn(S(37)), t0 + S(5), r), S(37));
        }
        // The recovery goes on where it was: the spread doubled once, not four times.
        assert_eq!(d.after(Ended::Unreachable, t0 + S(50), 0.999).as_secs(), 21);
    }

    #[test]
    fn without_a_healthy_tunnel_before_failures_back_off_exponentially() {
        let mut d = Redial::default();
        let now = Instant::now();
        let waits: Vec<u128> = (0..9)
            .map(|_| d.after(Ended::Unreachable, now, 0.0).as_millis())
            .collect();
        assert_eq!(waits, [125, 250, 500, 1000, 2000, 4000, 8000, 15000, 15000]);
        // A tunnel that closes soon after attaching is a failure too, not a recovery.
        assert_eq!(d.after(Ended::Closed { lived: S(5) }, now, 0.0), S(15));
    }

    #[test]
    fn a_refusal_ends_a_recovery_and_backs_off_to_minutes() {
        let mut d = Redial::default();
        let now = Instant::now();
        d.after(Ended::Closed { lived: S(600) }, now, 0.0);
        assert_eq!(d.after(Ended::Refused, now, 0.0), Duration::from_millis(125));
        let longest = (0..12)
            .map(|_| d.after(Ended::Refused, now, 0.999))
            .max()
            .expect("waits");
        assert!(longest > S(280) && longest < REFUSED_BACKOFF, "{longest:?}");
        // Reachable again but not attaching: back to the shorter limit.
        assert!(d.after(Ended::Unreachable, now, 0.999) > S(280));
        assert!(d.after(Ended::Unreachable, now, 0.999) < S(30));
    }
}
