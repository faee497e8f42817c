//! The members' tunnels as this replica saw them during its leadership term, and until when
//! absence is not judged: a new term's grace, and a mass close's. Both last at least their fixed
//! grace, and longer while tunnels keep coming back (until `RETURN_QUIET` after the last one, at
//! most `SETTLE_MAX` from the start), and until `RETURN_QUIET` after the furthest turn this
//! replica's attach pace gave within `SETTLE_MAX` of the start: at 10,000 members a fleet
//! re-attaches at the pace the API server allows, which no fixed grace fits.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;

/// How long after gaining leadership absence (of a tunnel, of a recent renewal) is not judged.
pub const TERM_GRACE: Duration = Duration::from_secs(45);
/// How long tunnels that closed together get to attach again.
pub const MASS_GRACE: Duration = Duration::from_secs(45);
/// A grace goes on while tunnels come back: until this long after the last one…
const RETURN_QUIET: Duration = Duration::from_secs(15);
/// …but never longer than this from its start (unless turns were given further out).
const SETTLE_MAX: Duration = Duration::from_secs(180);
/// Closes within this window count together.
const MASS_WINDOW: Duration = Duration::from_secs(5);
/// At least this many closes within the window, and at least `MASS_SHARE` of the tunnels, are a
/// mass close.
const MASS_MIN: usize = 2;
const MASS_SHARE: f64 = 0.05;

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

/// How a tunnel ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Close {
    /// Closed: by either end or the path between, replaced, revoked, or this replica stopping.
    Closed,
    /// Stopped answering pings; `heard` if any byte of its agent ever arrived on it.
    Silent {
        /// Whether the path ever carried the agent's bytes to this replica.
        heard: bool,
    },
}

#[derive(Clone, Copy, Debug)]
enum Seen {
    Attached,
    Closed { at: Instant, how: Close },
}

/// A burst of closes: the first and the last close counted in it.
#[derive(Clone, Copy, Debug)]
struct Mass {
    from: Instant,
    to: Instant,
}

/// The furthest turns given during a grace's first `SETTLE_MAX`.
#[derive(Default)]
struct Promised {
    term: Option<Instant>,
    mass: Option<Instant>,
}

#[derive(Default)]
pub(super) struct Tunnels {
    seen: HashMap<String, Seen>,
    attached: usize,
    /// Recent closes and whose, for spotting a mass close…
    recent: VecDeque<(Instant, String)>,
    /// …and how many of them each member made.
    recent_by: HashMap<String, usize>,
    /// The last mass close.
    mass: Option<Mass>,
    /// When a tunnel last attached that was not attached before (first this term, or again).
    returned: Option<Instant>,
    /// The furthest turn to attach this replica's pace gave within `SETTLE_MAX` of this term's
    /// start, and of the last mass close's.
    promised: Promised,
    /// When this replica's leadership term began, and on the wall clock (whole seconds, as
    /// conditions keep it).
    term: Option<(Instant, Timestamp)>,
}

impl Tunnels {
    /// This replica leads at `now`, `wall` on the wall clock (idempotent within a term).
    pub(super) fn start_term(&mut self, now: Instant, wall: Timestamp) {
        let second = Timestamp::from_second(wall.as_second()).unwrap_or(wall);
        self.term.get_or_insert((now, second));
    }

    /// `key`'s tunnel attached at `now`.
    pub(super) fn attached(&mut self, key: &str, now: Instant) {
        let before = self.seen.insert(key.to_string(), Seen::Attached);
        if !matches!(before, Some(Seen::Attached)) {
            self.attached += 1;
            self.returned = Some(now);
        }
    }

    /// This replica's attach pace told an agent at `now` to come back at `turn`
    /// (`proxy/pace.rs`): a term's or a mass close's grace that began at most `SETTLE_MAX`
    /// before lasts until that agent could be back, however far out.
    ///
    /// NB: only turns given in a grace's first `SETTLE_MAX` count, so that an agent identity
    /// asking in a loop (a turn each time the pace runs short) cannot keep a grace going, or
    /// bring one back: the furthest turn it can get then is behind the fleet's, members ÷ rate.
    pub(super) fn promised(&mut self, turn: Instant, now: Instant) {
        let within = |start: Instant| start <= now && now <= start + SETTLE_MAX;
        let further = |p: &mut Option<Instant>| *p = Some(p.map_or(turn, |p| p.max(turn)));
        if self.term.is_some_and(|(start, _)| within(start)) {
            further(&mut self.promised.term);
        }
        if self.mass.is_some_and(|m| within(m.from)) {
            further(&mut self.promised.mass);
        }
    }

    /// `key`'s tunnel closed at `now`, as `how` says.
    pub(super) fn closed(&mut self, key: &str, now: Instant, how: Close) {
        let before = self.seen.insert(key.to_string(), Seen::Closed { at: now, how });
        if !matches!(before, Some(Seen::Attached)) {
            return;
        }
        let open_before = self.attached;
        self.attached -= 1;
        while let Some((c, _)) = self.recent.front()
            && now.saturating_duration_since(*c) > MASS_WINDOW
        {
            if let Some((_, k)) = self.recent.pop_front()
                && let Some(n) = self.recent_by.get_mut(&k)
            {
                *n -= 1;
                if *n == 0 {
                    self.recent_by.remove(&k);
                }
            }
        }
        self.recent.push_back((now, key.to_string()));
        *self.recent_by.entry(key.to_string()).or_default() += 1;
        // NB: members, not closes: one member that closes its own tunnel over and over must not
        // buy every other member the mass close's grace.
        let threshold = MASS_MIN.max((open_before as f64 * MASS_SHARE).ceil() as usize);
        if self.recent_by.len() >= threshold {
            // NB: the closes already in the window are part of it too, and a burst that goes on
            // is one mass close, however many closes it counts.
            let first = self.recent.front().map_or(now, |(at, _)| *at);
            self.mass = Some(match self.mass {
                Some(m) if m.to + MASS_WINDOW >= first => Mass {
                    from: m.from,
                    to: now,
                },
                _ => {
                    self.promised.mass = None;
                    Mass { from: first, to: now }
                }
            });
        }
    }

    /// `key`'s tunnel, and until when (if at all) absence is not judged: for a member not
    /// attached this term yet, the end of the term's grace; for a closed tunnel, the end of the
    /// mass close it was part of (its agent already had its chance at this replica, so the
    /// term's grace is not its), unless it is still re-attaching after a take-over. `up_since`
    /// is since when the member's tunnel has been up by its TunnelConnected condition, if it is.
    pub(super) fn tunnel(
        &self,
        key: &str,
        now: Instant,
        up_since: Option<Timestamp>,
    ) -> (Tunnel, Option<Instant>) {
        let term_grace = || {
            let (term, _) = self.term?;
            Some(self.settled(term + TERM_GRACE, term, self.promised.term)).filter(|u| *u > now)
        };
        // NB: the previous replica saw this member's tunnel up; this one took over.
        let up_before_term = self
            .term
            .zip(up_since)
            .is_some_and(|((_, began), since)| since < began);
        match self.seen.get(key) {
            None => (Tunnel::Unseen, term_grace()),
            Some(Seen::Attached) => (Tunnel::Attached, None),
            // NB: a take-over's tunnels do not have their fair chance until the fleet is back:
            // the path through the leader's API server is congested by the whole fleet
            // re-attaching, and the new replica is short of CPU, so a tunnel can attach and
            // close again (an attach answered while no ping gets through, a handshake timed
            // out) with an agent that lives. Inside the term's grace such a close counts as not
            // attached yet (the agent dials again); once the grace is over, as the close it was.
            // The same holds for a tunnel silent before its agent was ever heard, whoever it is.
            Some(Seen::Closed { how, .. })
                if (up_before_term || matches!(how, Close::Silent { heard: false }))
                    && let Some(until) = term_grace() =>
            {
                (Tunnel::Unseen, Some(until))
            }
            Some(Seen::Closed { at, how }) => {
                let until = self
                    .mass
                    .filter(|m| m.from <= *at && *at <= m.to)
                    .map(|m| self.settled(m.to + MASS_GRACE, m.from, self.promised.mass));
                let tunnel = Tunnel::Closed {
                    ago: now.saturating_duration_since(*at),
                    silent: matches!(how, Close::Silent { .. }),
                };
                (tunnel, until.filter(|u| *u > now))
            }
        }
    }

    /// The end of a grace that began at `start` and lasts until `until` at least: later while
    /// tunnels come back (until `SETTLE_MAX` from `start`), and until `RETURN_QUIET` after
    /// `promised`, the furthest turn given in it, whichever is later.
    ///
    /// NB: a turn is this replica's own word to an agent that asked (and so lives): blaming it
    /// for not being back before then would be blaming it for the leader's pace, however slow
    /// (a pace slower than one attach per `RETURN_QUIET` leaves gaps between returns). One turn
    /// per member, so the furthest is at most members ÷ rate away.
    fn settled(&self, until: Instant, start: Instant, promised: Option<Instant>) -> Instant {
        let promised = promised.map(|p| p + RETURN_QUIET);
        let most = promised.map_or(start + SETTLE_MAX, |p| p.max(start + SETTLE_MAX));
        let back = match self.returned {
            Some(r) if r >= start => (r + RETURN_QUIET).min(most),
            _ => until,
        };
        until.max(back).max(promised.unwrap_or(until))
    }

    /// Adds `blind` to every close (never past `now`).
    pub(super) fn shift(&mut self, blind: Duration, now: Instant) {
        let later = |at: &mut Instant| *at = (*at + blind).min(now);
        for s in self.seen.values_mut() {
            if let Seen::Closed { at, .. } = s {
                later(at);
            }
        }
        if let Some(m) = self.mass.as_mut() {
            later(&mut m.from);
            later(&mut m.to);
        }
    }

    /// Forgets `key`.
    pub(super) fn forget(&mut self, key: &str) {
        if matches!(self.seen.remove(key), Some(Seen::Attached)) {
            self.attached -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    /// A term's start on the wall clock.
    fn wall() -> Timestamp {
        Timestamp::from_second(1_800_000_000).expect("timestamp")
    }

    #[test]
    fn a_new_term_settles_while_the_fleet_comes_back_and_no_longer() {
        let mut t = Tunnels::default();
        let start = Instant::now();
        t.start_term(start, wall());
        // Nobody back yet: the fixed grace.
        assert_eq!(
            t.tunnel("ns/late", start + S(1), None),
            (Tunnel::Unseen, Some(start + TERM_GRACE))
        );
        // The fleet comes back slowly, one every 10 s: the grace follows it…
        for i in 1..=10 {
            t.attached(&format!("ns/m{i}"), start + S(10 * i));
        }
        assert_eq!(t.tunnel("ns/late", start + S(101), None).1, Some(start + S(115)));
        // …for at most SETTLE_MAX.
        for i in 11..=30 {
            t.attached(&format!("ns/m{i}"), start + S(10 * i));
        }
        assert_eq!(
            t.tunnel("ns/late", start + S(170), None).1,
            Some(start + SETTLE_MAX)
        );
        assert_eq!(t.tunnel("ns/late", start + SETTLE_MAX, None).1, None);
        // Once returns stop, RETURN_QUIET later absence is judged.
        let mut t = Tunnels::default();
        t.start_term(start, wall());
        t.attached("ns/m1", start + S(40));
        assert_eq!(t.tunnel("ns/late", start + S(54), None).1, Some(start + S(55)));
        assert_eq!(t.tunnel("ns/late", start + S(56), None).1, None);
    }

    #[test]
    fn a_grace_lasts_until_the_furthest_turn_given_and_no_turn_given_later_keeps_it() {
        let mut t = Tunnels::default();
        let start = Instant::now();
        t.start_term(start, wall());
        // A pace slower than the fleet: turns given up to 400 s out in the surge after the
        // take-over, so the grace lasts until the furthest turn…
        t.promised(start + S(400), start + S(20));
        t.promised(start + S(100), start + S(21));
        assert_eq!(t.tunnel("ns/late", start + S(200), None).1, Some(start + S(415)));
        // …and while the fleet keeps coming back at its turns, never longer.
        for i in 1..=45 {
            t.attached(&format!("ns/m{i}"), start + S(10 * i));
        }
        assert_eq!(t.tunnel("ns/late", start + S(401), None).1, Some(start + S(415)));
        assert_eq!(t.tunnel("ns/late", start + S(415), None).1, None);
        // An agent identity asking in a loop later gets turns (the pace ran short): they bring
        // no grace back.
        for k in 0..100 {
            t.promised(start + S(416 + k), start + S(415 + k));
        }
        assert_eq!(t.tunnel("ns/late", start + S(515), None).1, None);

        // A pace slower than one attach per RETURN_QUIET: the gaps between returns are not the
        // end of the grace.
        let mut t = Tunnels::default();
        t.start_term(start, wall());
        t.attached("ns/m1", start + S(2));
        for turn in [27, 52, 77] {
            t.promised(start + S(turn), start + S(2));
        }
        t.attached("ns/m2", start + S(27));
        assert_eq!(t.tunnel("ns/late", start + S(46), None).1, Some(start + S(92)));
        t.attached("ns/m3", start + S(52));
        t.attached("ns/m4", start + S(77));
        assert_eq!(t.tunnel("ns/late", start + S(91), None).1, Some(start + S(92)));
        assert_eq!(t.tunnel("ns/late", start + S(92), None).1, None);

        // A turn given before the term, or past its first SETTLE_MAX, does not stretch it.
        let mut t = Tunnels::default();
        t.promised(start + S(300), start);
        t.start_term(start + S(1), wall());
        t.promised(start + S(900), start + S(182));
        for i in 1..=60 {
            t.attached(&format!("ns/m{i}"), start + S(1 + 10 * i));
        }
        assert_eq!(t.tunnel("ns/late", start + S(200), None).1, None);
    }

    #[test]
    fn a_burst_of_thousands_of_closes_is_one_mass_close_with_one_grace() {
        let mut t = Tunnels::default();
        let t0 = Instant::now();
        t.start_term(t0 - S(600), wall());
        for i in 0..10_000 {
            t.attached(&format!("ns/m{i}"), t0 - S(600));
        }
        // The API server in the tunnels' path restarts: every tunnel closes within 8 s.
        for i in 0..10_000u64 {
            t.closed(
                &format!("ns/m{i}"),
                t0 + Duration::from_micros(800 * i),
                Close::Closed,
            );
        }
        let last = t0 + Duration::from_micros(800 * 9_999);
        for key in ["ns/m0", "ns/m5000", "ns/m9999"] {
            assert_eq!(t.tunnel(key, last, None).1, Some(last + MASS_GRACE), "{key}");
        }
        // The first come back 30 s later and keep coming: the grace follows them.
        for i in 0..5_000u64 {
            t.attached(&format!("ns/m{i}"), last + S(30) + Duration::from_millis(10 * i));
        }
        let back = last + S(30) + Duration::from_millis(10 * 4_999);
        assert_eq!(t.tunnel("ns/m9999", back, None).1, Some(back + RETURN_QUIET));
        // The pace gave the rest turns up to 60 s after: their grace lasts until then.
        t.promised(back + S(60), last + S(31));
        assert_eq!(
            t.tunnel("ns/m9999", back, None).1,
            Some(back + S(60) + RETURN_QUIET)
        );
        // A lone close long after is judged on its own.
        let lone = last + S(600);
        t.closed("ns/m1", lone, Close::Closed);
        assert_eq!(t.tunnel("ns/m1", lone, None).1, None);
    }

    #[test]
    fn a_tunnel_silent_before_its_agent_was_ever_heard_waits_for_the_terms_grace() {
        let mut t = Tunnels::default();
        let start = Instant::now();
        t.start_term(start, wall());
        for i in 0..100 {
            t.attached(&format!("ns/m{i}"), start + S(40));
        }
        // Attached among the first, its pings never got through the congested path: closed
        // silent 15 s later, with the fleet still coming back.
        t.closed("ns/m0", start + S(45), Close::Silent { heard: false });
        // One heard before it went silent had its chance: lost at once, as before.
        t.closed("ns/m1", start + S(45), Close::Silent { heard: true });
        let now = start + S(46);
        assert_eq!(
            t.tunnel("ns/m0", now, None),
            (Tunnel::Unseen, Some(start + S(55)))
        );
        let lost = Tunnel::Closed {
            ago: S(1),
            silent: true,
        };
        assert_eq!(t.tunnel("ns/m1", now, None), (lost, None));
        // The grace follows the fleet coming back, for the unheard one too…
        t.attached("ns/m100", start + S(50));
        assert_eq!(t.tunnel("ns/m0", now, None).1, Some(start + S(65)));
        // …and once it is over, the unheard one is judged as the silent close it was.
        let after = start + S(65);
        let judged = Tunnel::Closed {
            ago: S(20),
            silent: true,
        };
        assert_eq!(t.tunnel("ns/m0", after, None), (judged, None));
        // Outside a term's grace, an unheard silence is a silence.
        t.closed("ns/m2", after, Close::Silent { heard: false });
        assert_eq!(t.tunnel("ns/m2", after, None).1, None);
        // Re-attached, it is attached.
        t.attached("ns/m0", after);
        assert_eq!(t.tunnel("ns/m0", after, None), (Tunnel::Attached, None));
    }

    #[test]
    fn after_a_take_over_a_tunnel_that_was_up_before_keeps_the_terms_grace_through_its_closes() {
        let mut t = Tunnels::default();
        let start = Instant::now();
        // The term began at wall() + 0.6 s: conditions keep whole seconds.
        let began = wall() + k8s_openapi::jiff::SignedDuration::from_millis(600);
        t.start_term(start, began);
        let before = Some(wall() - k8s_openapi::jiff::SignedDuration::from_secs(3_600));
        let this_term = Some(wall());
        for i in 0..100 {
            t.attached(&format!("ns/m{i}"), start + S(20));
        }
        // Up at the replica before: re-attached, then closed (by its agent, or silent after it
        // was heard) while the fleet comes back. It waits for the term's grace…
        t.closed("ns/m0", start + S(30), Close::Closed);
        t.closed("ns/m1", start + S(30), Close::Silent { heard: true });
        let now = start + S(31);
        for key in ["ns/m0", "ns/m1"] {
            assert_eq!(
                t.tunnel(key, now, before),
                (Tunnel::Unseen, Some(start + TERM_GRACE)),
                "{key}"
            );
        }
        // …as it would, had it not re-attached yet; a member first up this term does not (its
        // condition went True at the term's start second, which counts as this term).
        let lost = Tunnel::Closed {
            ago: S(1),
            silent: false,
        };
        assert_eq!(t.tunnel("ns/m0", now, this_term), (lost, None));
        assert_eq!(t.tunnel("ns/m0", now, None), (lost, None));
        // Once the grace is over, the close is judged as the close it was.
        let after = start + TERM_GRACE;
        let judged = Tunnel::Closed {
            ago: TERM_GRACE - S(30),
            silent: false,
        };
        assert_eq!(t.tunnel("ns/m0", after, before), (judged, None));
        // Outside a term, nothing is held.
        let mut t = Tunnels::default();
        t.closed("ns/m0", start, Close::Closed);
        assert_eq!(t.tunnel("ns/m0", start, before).1, None);
    }
}
