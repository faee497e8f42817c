//! The leader/agent version skew policy: a leader supports agents of its own minor version and
//! of one minor older or newer (same major), so the leader can be upgraded first and agents a
//! cluster at a time, weeks later. An agent outside it gets `AgentVersionSupported=False` on its
//! ManagedCluster with what to do, instead of failing in some other way.

use tether_api::conditions::{Reason, Status};

/// This leader's version.
pub const LEADER_VERSION: &str = env!("CARGO_PKG_VERSION");

/// Minor versions an agent may be away from its leader.
pub const MAX_MINOR_SKEW: u64 = 1;

/// `MAJOR.MINOR` of a version like `0.2.0` or `v0.2.0 (abc123)`.
fn major_minor(version: &str) -> Option<(u64, u64)> {
    let v = version.trim().trim_start_matches('v');
    let core = v.split([' ', '-', '+']).next()?;
    let mut parts = core.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// Whether an agent of `agent` (its reported version, if any) is supported by a leader of
/// `leader`, as a condition's status, reason and message.
pub fn judge(leader: &str, agent: Option<&str>) -> (Status, Reason, String) {
    let Some((lmaj, lmin)) = major_minor(leader) else {
        return (
            Status::Unknown,
            Reason::AgentVersionUnknown,
            format!("the leader's own version {leader} cannot be read"),
        );
    };
    let range = format!(
        "{lmaj}.{} to {lmaj}.{}",
        lmin.saturating_sub(MAX_MINOR_SKEW),
        lmin + MAX_MINOR_SKEW
    );
    let Some(agent) = agent else {
        return (
            Status::Unknown,
            Reason::AgentVersionUnknown,
            "the agent has not reported its version yet".into(),
        );
    };
    match major_minor(agent) {
        None => (
            Status::Unknown,
            Reason::AgentVersionUnknown,
            format!("the agent reports a version that cannot be read: {agent:?}"),
        ),
        Some((amaj, amin)) if amaj == lmaj && amin.abs_diff(lmin) <= MAX_MINOR_SKEW => (
            Status::True,
            Reason::WithinSkew,
            format!("agent {agent} is within the skew leader {leader} supports ({range})"),
        ),
        Some((amaj, amin)) => {
            let what = if (amaj, amin) < (lmaj, lmin) {
                "upgrade the agent (helm upgrade tether-agent) to"
            } else {
                "upgrade the leader first, or downgrade the agent to"
            };
            (
                Status::False,
                Reason::OutsideSkew,
                format!(
                    "agent {agent} is outside the skew leader {leader} supports ({range}): {what} a version in that range"
                ),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_minor_either_way_of_the_same_major_is_supported() {
        for agent in ["0.1.0", "0.2.0", "0.2.7", "0.3.1", "v0.3.0"] {
            assert_eq!(judge("0.2.0 (abc)", Some(agent)).0, Status::True, "{agent}");
        }
        for agent in ["0.0.9", "0.4.0", "1.2.0"] {
            let (status, reason, message) = judge("0.2.0", Some(agent));
            assert_eq!((status, reason), (Status::False, Reason::OutsideSkew), "{agent}");
            assert!(message.contains("0.1 to 0.3"), "{message}");
        }
        assert!(judge("0.2.0", Some("0.0.1")).2.contains("upgrade the agent"));
        assert!(
            judge("0.2.0", Some("0.4.0"))
                .2
                .contains("upgrade the leader first")
        );
    }

    #[test]
    fn a_missing_or_unreadable_version_is_unknown_not_refused() {
        assert_eq!(judge("0.2.0", None).0, Status::Unknown);
        assert_eq!(judge("0.2.0", Some("banana")).0, Status::Unknown);
        assert_eq!(judge("", Some("0.2.0")).0, Status::Unknown);
    }
}
