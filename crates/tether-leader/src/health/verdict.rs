//! The verdict on one member from what the leader knows of it at one moment: pure, so every rule
//! is a row of a table test.

use std::time::Duration;

use tether_api::conditions::{Reason, Status};

use super::{Observation, Tunnel};

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
pub(super) mod tests {
    use super::*;

    pub(in crate::health) const T: Timings = Timings {
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
}
