//! What a verdict changes in a member's status, decided without the API: the conditions the
//! leader owns (Ready, AgentVersionSupported, TunnelConnected), the Ready message, and which
//! Event the change is worth. `members.rs` executes it: one status apply, then the Events.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use tether_api::conditions::{ConditionType, Reason, Status, find};

use super::{Timings, Tunnel, Verdict};
use crate::status::condition;

/// What the leader knows of a member when it decides its status.
#[derive(Clone, Copy, Debug)]
pub struct Facts<'a> {
    /// The member's conditions as they are now.
    pub previous: &'a [Condition],
    /// The judge's verdict.
    pub verdict: Verdict,
    /// Its tunnel at this replica.
    pub tunnel: Tunnel,
    /// Its set's timings.
    pub timings: Timings,
    /// Its set's grace period as written in the spec (`40s`), for messages.
    pub grace_period: &'a str,
    /// Its agent's version: reported, or else the one it registered with.
    pub agent_version: Option<&'a str>,
    /// This leader's version.
    pub leader_version: &'a str,
}

/// A change of Ready worth an Event (and a log line).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Notice {
    /// Lost (`HeartbeatExpired` or `TunnelLost`, the reason given) after not being lost.
    Lost(Reason),
    /// Ready again after being lost.
    Recovered,
    /// Ready for the first time.
    Ready,
}

/// A change of a member's status.
#[derive(Clone, Debug, PartialEq)]
pub struct Transition {
    /// Every condition the leader owns, applied together: the leader's field manager owns them,
    /// and an apply without one would remove it.
    pub conditions: Vec<Condition>,
    /// The Ready condition's message (an Event's message too).
    pub message: String,
    /// What the change of Ready is worth telling, if anything.
    pub notice: Option<Notice>,
    /// The agent just fell outside the supported version skew: what to do, for a warning Event.
    pub unsupported: Option<String>,
}

/// The change `f` makes to a member's status at `now`, or `None` when its conditions already say
/// it (a heartbeat that changes nothing writes nothing).
pub fn transition(f: &Facts<'_>, now: Timestamp) -> Option<Transition> {
    let current = find(f.previous, ConditionType::Ready);
    // NB: never judged, not renewed: no status until the first heartbeat (or HeartbeatExpired).
    let awaiting = f
        .verdict
        .condition()
        .is_none_or(|(_, r)| r == Reason::AwaitingHeartbeat);
    if current.is_none() && awaiting {
        return None;
    }
    // NB: a verdict on hold keeps what the member's condition says (or, for a member never
    // judged, waits for its first heartbeat).
    let (status, reason) = f.verdict.condition().unwrap_or_else(|| {
        current
            .and_then(|c| Some((parse_status(&c.status)?, c.reason.parse().ok()?)))
            .unwrap_or((Status::Unknown, Reason::AwaitingHeartbeat))
    });
    let ready_changed = !says(current, status, reason);
    let (skew_status, skew_reason, skew_message) = crate::skew::judge(f.leader_version, f.agent_version);
    let skew_now = find(f.previous, ConditionType::AgentVersionSupported);
    let skew_changed =
        !says(skew_now, skew_status, skew_reason) || skew_now.is_some_and(|c| c.message != skew_message);
    let tunnel_now = find(f.previous, ConditionType::TunnelConnected);
    let tunnel_want = tunnel_condition(f.tunnel, &f.verdict, tunnel_now);
    let tunnel_changed = tunnel_want
        .as_ref()
        .is_some_and(|(s, r, _)| !says(tunnel_now, *s, *r));
    if !(ready_changed || skew_changed || tunnel_changed) {
        return None;
    }
    let message = match (reason, current) {
        (Reason::AwaitingHeartbeat, _) => "approved; waiting for the agent's first heartbeat".to_string(),
        (Reason::HeartbeatExpired, _) => format!(
            "no heartbeat for more than {}: check that the agent runs and reaches the leader",
            if matches!(f.tunnel, Tunnel::Attached) {
                humantime(f.timings.tunnel_grace)
            } else {
                f.grace_period.to_string()
            }
        ),
        (Reason::TunnelLost, _) => format!(
            "the agent's tunnel closed or stopped answering pings, and within {} the agent neither \
             attached it again nor renewed its heartbeat: check that the agent runs and reaches the leader",
            humantime(f.timings.detection)
        ),
        (Reason::TunnelAlive, _) => "the agent's tunnel is attached and answers pings".to_string(),
        (_, Some(c)) if !ready_changed => c.message.clone(),
        _ => "heartbeats arrive".to_string(),
    };
    let mut conditions = vec![
        condition(
            f.previous,
            ConditionType::Ready,
            status,
            reason,
            message.clone(),
            now,
        ),
        condition(
            f.previous,
            ConditionType::AgentVersionSupported,
            skew_status,
            skew_reason,
            skew_message.clone(),
            now,
        ),
    ];
    match (tunnel_want, tunnel_now) {
        (Some((s, r, m)), _) => conditions.push(condition(
            f.previous,
            ConditionType::TunnelConnected,
            s,
            r,
            m,
            now,
        )),
        (None, Some(c)) => conditions.push(c.clone()),
        (None, None) => {}
    }
    Some(Transition {
        conditions,
        message,
        notice: ready_changed.then(|| notice(current, status, reason)).flatten(),
        unsupported: (skew_changed && skew_status == Status::False).then_some(skew_message),
    })
}

/// What a change of Ready from `current` to `status`/`reason` is worth telling.
fn notice(current: Option<&Condition>, status: Status, reason: Reason) -> Option<Notice> {
    let lost = |r: &str| r == Reason::HeartbeatExpired.as_str() || r == Reason::TunnelLost.as_str();
    let was_lost = current.is_some_and(|c| lost(&c.reason));
    let was_ready = current.is_some_and(|c| c.status == Status::True.as_str());
    if lost(reason.as_str()) && !was_lost {
        Some(Notice::Lost(reason))
    } else if status == Status::True && was_lost {
        Some(Notice::Recovered)
    } else if status == Status::True && !was_ready {
        Some(Notice::Ready)
    } else {
        None
    }
}

/// Whether condition `c` says `status` for `reason`.
fn says(c: Option<&Condition>, status: Status, reason: Reason) -> bool {
    c.is_some_and(|c| c.status == status.as_str() && c.reason == reason.as_str())
}

fn parse_status(s: &str) -> Option<Status> {
    [Status::True, Status::False, Status::Unknown]
        .into_iter()
        .find(|status| s == status.as_str())
}

/// What the TunnelConnected condition should say, if the leader knows better than what it says
/// now: attached; closed for good (the verdict is no longer on hold); or, past the new term's
/// grace, no tunnel at this replica although the condition still says connected.
fn tunnel_condition(
    tunnel: Tunnel,
    verdict: &Verdict,
    now: Option<&Condition>,
) -> Option<(Status, Reason, String)> {
    let says_connected = now.is_some_and(|c| c.status == Status::True.as_str());
    match (tunnel, verdict) {
        (Tunnel::Attached, _) => Some((
            Status::True,
            Reason::TunnelAttached,
            "the agent's tunnel is attached to the active leader".to_string(),
        )),
        (_, Verdict::Hold { .. }) => None,
        (Tunnel::Closed { .. }, _) => Some((
            Status::False,
            Reason::TunnelClosed,
            "the agent's tunnel closed; it reconnects by itself".to_string(),
        )),
        (Tunnel::Unseen, _) if says_connected => Some((
            Status::False,
            Reason::NoTunnel,
            "no tunnel reached the active leader".to_string(),
        )),
        (Tunnel::Unseen, _) => None,
    }
}

/// `d` as a Go duration would print it (`15s`, `20m0s`).
fn humantime(d: Duration) -> String {
    kube::core::Duration::from(d).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::health::verdict::tests::T;
    const LEADER: &str = "0.5.0";

    fn cond(kind: ConditionType, status: Status, reason: Reason) -> Condition {
        condition(&[], kind, status, reason, "before".into(), Timestamp::UNIX_EPOCH)
    }

    fn ready(reason: Reason) -> Verdict {
        Verdict::Ready {
            reason,
            recheck: Duration::from_secs(1),
        }
    }

    fn unknown(reason: Reason) -> Verdict {
        Verdict::Unknown {
            reason,
            recheck: Duration::from_secs(1),
        }
    }

    const HOLD: Verdict = Verdict::Hold {
        recheck: Duration::from_secs(1),
    };
    const CLOSED: Tunnel = Tunnel::Closed {
        ago: Duration::from_secs(20),
        silent: false,
    };

    /// A member judged before: Ready as given, its agent within the skew (its message as the
    /// judge writes it), and its tunnel condition if any.
    fn member(status: Status, reason: Reason, tunnel: Option<(Status, Reason)>) -> Vec<Condition> {
        let (s, r, m) = crate::skew::judge(LEADER, Some("0.5.0"));
        let mut skew = cond(ConditionType::AgentVersionSupported, s, r);
        skew.message = m;
        let mut all = vec![cond(ConditionType::Ready, status, reason), skew];
        all.extend(tunnel.map(|(s, r)| cond(ConditionType::TunnelConnected, s, r)));
        all
    }

    fn facts<'a>(
        previous: &'a [Condition],
        verdict: Verdict,
        tunnel: Tunnel,
        agent: &'static str,
    ) -> Facts<'a> {
        Facts {
            previous,
            verdict,
            tunnel,
            timings: T,
            grace_period: "40s",
            agent_version: Some(agent),
            leader_version: LEADER,
        }
    }

    /// Ready, TunnelConnected (if written) and the notice of a transition, to compare in a table.
    type Shape = ((String, String), Option<(String, String)>, Option<Notice>, bool);

    /// (what, the conditions before, the verdict, the tunnel, the agent's version, the change wanted)
    type Case = (
        &'static str,
        Vec<Condition>,
        Verdict,
        Tunnel,
        &'static str,
        Option<Shape>,
    );

    fn shape(t: &Transition) -> Shape {
        let of = |kind| find(&t.conditions, kind).map(|c: &Condition| (c.status.clone(), c.reason.clone()));
        (
            of(ConditionType::Ready).expect("Ready is always written"),
            of(ConditionType::TunnelConnected),
            t.notice,
            t.unsupported.is_some(),
        )
    }

    fn want(
        ready: (Status, Reason),
        tunnel: Option<(Status, Reason)>,
        notice: Option<Notice>,
        unsupported: bool,
    ) -> Option<Shape> {
        let pair = |(s, r): (Status, Reason)| (s.as_str().to_string(), r.as_str().to_string());
        Some((pair(ready), tunnel.map(pair), notice, unsupported))
    }

    #[test]
    fn status_changes_follow_the_verdict_and_only_changes_are_written() {
        use Reason::*;
        use Status::{False, True, Unknown};
        let attached = Some((True, TunnelAttached));
        let cases: Vec<Case> = vec![
            (
                "just approved, no heartbeat yet: nothing written",
                vec![],
                unknown(AwaitingHeartbeat),
                Tunnel::Unseen,
                "0.5.0",
                None,
            ),
            (
                "on hold before the first verdict: nothing written",
                vec![],
                HOLD,
                Tunnel::Unseen,
                "0.5.0",
                None,
            ),
            (
                "the tunnel attaches before the first heartbeat: nothing written yet",
                vec![],
                unknown(AwaitingHeartbeat),
                Tunnel::Attached,
                "0.5.0",
                None,
            ),
            (
                "the first heartbeat with the tunnel attached: one write says both",
                vec![],
                ready(TunnelAlive),
                Tunnel::Attached,
                "0.5.0",
                want((True, TunnelAlive), attached, Some(Notice::Ready), false),
            ),
            (
                "no heartbeat within the grace period: the first status says so, with a warning",
                vec![],
                unknown(HeartbeatExpired),
                Tunnel::Unseen,
                "0.5.0",
                want(
                    (Unknown, HeartbeatExpired),
                    None,
                    Some(Notice::Lost(HeartbeatExpired)),
                    false,
                ),
            ),
            (
                "the first tunnel attaches (a member judged by a leader from before)",
                member(Unknown, AwaitingHeartbeat, None),
                ready(TunnelAlive),
                Tunnel::Attached,
                "0.5.0",
                want((True, TunnelAlive), attached, Some(Notice::Ready), false),
            ),
            (
                "alive as before: nothing to write",
                member(True, TunnelAlive, attached),
                ready(TunnelAlive),
                Tunnel::Attached,
                "0.5.0",
                None,
            ),
            (
                "on hold keeps what the member says",
                member(True, TunnelAlive, attached),
                HOLD,
                Tunnel::Unseen,
                "0.5.0",
                None,
            ),
            (
                "the tunnel is lost",
                member(True, TunnelAlive, attached),
                unknown(TunnelLost),
                CLOSED,
                "0.5.0",
                want(
                    (Unknown, TunnelLost),
                    Some((False, TunnelClosed)),
                    Some(Notice::Lost(TunnelLost)),
                    false,
                ),
            ),
            (
                "lost, then expired: no second loss Event",
                member(Unknown, TunnelLost, Some((False, TunnelClosed))),
                unknown(HeartbeatExpired),
                CLOSED,
                "0.5.0",
                want(
                    (Unknown, HeartbeatExpired),
                    Some((False, TunnelClosed)),
                    None,
                    false,
                ),
            ),
            (
                "back on its Lease alone after a loss",
                member(Unknown, TunnelLost, Some((False, TunnelClosed))),
                ready(HeartbeatReceived),
                Tunnel::Unseen,
                "0.5.0",
                want(
                    (True, HeartbeatReceived),
                    Some((False, TunnelClosed)),
                    Some(Notice::Recovered),
                    false,
                ),
            ),
            (
                "no tunnel at this replica although the condition says connected",
                member(True, TunnelAlive, attached),
                ready(HeartbeatReceived),
                Tunnel::Unseen,
                "0.5.0",
                want((True, HeartbeatReceived), Some((False, NoTunnel)), None, false),
            ),
            (
                "the expired member first judged",
                member(True, HeartbeatReceived, None),
                unknown(HeartbeatExpired),
                Tunnel::Unseen,
                "0.5.0",
                want(
                    (Unknown, HeartbeatExpired),
                    None,
                    Some(Notice::Lost(HeartbeatExpired)),
                    false,
                ),
            ),
            (
                "an agent two minors behind: only the skew changes",
                member(True, TunnelAlive, attached),
                ready(TunnelAlive),
                Tunnel::Attached,
                "0.3.0",
                want((True, TunnelAlive), attached, None, true),
            ),
        ];
        let now = Timestamp::now();
        for (what, previous, verdict, tunnel, agent, expected) in cases {
            let got = transition(&facts(&previous, verdict, tunnel, agent), now);
            assert_eq!(got.as_ref().map(shape), expected, "{what}");
        }
    }

    #[test]
    fn messages_name_what_to_check_and_unchanged_conditions_keep_their_time() {
        let previous = member(
            Status::True,
            Reason::TunnelAlive,
            Some((Status::True, Reason::TunnelAttached)),
        );
        let now = Timestamp::now();
        let lost = transition(
            &facts(&previous, unknown(Reason::TunnelLost), CLOSED, "0.5.0"),
            now,
        )
        .unwrap();
        assert!(lost.message.contains("within 15s"), "{}", lost.message);
        let skew = find(&lost.conditions, ConditionType::AgentVersionSupported).unwrap();
        assert_eq!(
            skew.last_transition_time.0,
            Timestamp::UNIX_EPOCH,
            "the skew did not change"
        );
        let ready = find(&lost.conditions, ConditionType::Ready).unwrap();
        assert_eq!(ready.last_transition_time.0, now);
        // Expired with the tunnel attached: the tunnel grace, not the set's grace period.
        let expired = transition(
            &facts(
                &previous,
                unknown(Reason::HeartbeatExpired),
                Tunnel::Attached,
                "0.5.0",
            ),
            now,
        )
        .unwrap();
        assert!(expired.message.contains("more than 1200s"), "{}", expired.message);
        let expired = transition(
            &facts(
                &previous,
                unknown(Reason::HeartbeatExpired),
                Tunnel::Unseen,
                "0.5.0",
            ),
            now,
        )
        .unwrap();
        assert!(expired.message.contains("more than 40s"), "{}", expired.message);
    }
}
