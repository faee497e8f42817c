//! Every condition type, condition reason, Event reason and one-word state that Tether writes,
//! as enums: the controllers, the CLI and the tests name them through these types, so a rename
//! is a compile error, never a silent mismatch between a writer and a reader.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// Defines a fieldless enum whose variants are written to the API as their own names.
macro_rules! api_words {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident,)* }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)*
        }

        impl $name {
            /// Every variant.
            pub const ALL: &'static [$name] = &[$($name::$variant,)*];

            /// The word as written to the API.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => stringify!($variant),)*
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl std::str::FromStr for $name {
            type Err = UnknownWord;
            fn from_str(s: &str) -> Result<Self, UnknownWord> {
                Self::ALL
                    .iter()
                    .copied()
                    .find(|v| v.as_str() == s)
                    .ok_or_else(|| UnknownWord { kind: stringify!($name), word: s.to_string() })
            }
        }

        impl PartialEq<$name> for str {
            fn eq(&self, other: &$name) -> bool {
                self == other.as_str()
            }
        }

        impl PartialEq<$name> for String {
            fn eq(&self, other: &$name) -> bool {
                self.as_str() == other.as_str()
            }
        }
    };
}

/// A word that names no variant of the enum it was parsed as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownWord {
    /// The enum.
    pub kind: &'static str,
    /// What was given.
    pub word: String,
}

impl std::fmt::Display for UnknownWord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?} is not a {}", self.word, self.kind)
    }
}

impl std::error::Error for UnknownWord {}

api_words! {
    /// Condition types.
    ConditionType {
        /// ManagedCluster: the member heartbeats. ClusterSet: the set is served / the member works.
        Ready,
        /// Leader ClusterSet: deletion waits for members to leave.
        DeletionBlocked,
        /// Member ClusterSet: the leader approved this cluster.
        Registered,
        /// Member ClusterSet: the leader answers (heartbeats go through).
        LeaderReachable,
        /// Member ClusterSet: the leader's CA was verified (False when verification is skipped).
        CAVerified,
        /// ManagedCluster: the member's own API server answers `/livez` and `/readyz`.
        ApiServerHealthy,
        /// ManagedCluster: the agent's tunnel is attached to the active leader replica, so the
        /// member is reachable through the leader's proxy API.
        TunnelConnected,
        /// ManagedCluster: the agent's version is within the skew the leader supports (one minor
        /// older or newer).
        AgentVersionSupported,
    }
}

api_words! {
    /// Reasons of conditions.
    Reason {
        /// ManagedCluster Ready=Unknown: no heartbeat within the set's gracePeriod.
        HeartbeatExpired,
        /// ManagedCluster Ready=Unknown: approved, no heartbeat yet.
        AwaitingHeartbeat,
        /// ManagedCluster Ready=True: heartbeats arrive.
        HeartbeatReceived,
        /// ManagedCluster Ready=True: the agent's tunnel is attached and answers pings.
        TunnelAlive,
        /// ManagedCluster Ready=Unknown: the agent's tunnel closed or stopped answering pings,
        /// and the agent neither attached again nor renewed its heartbeat Lease since.
        TunnelLost,
        /// Leader ClusterSet Ready=True.
        Serving,
        /// Leader ClusterSet DeletionBlocked=True: members remain.
        MembersRemain,
        /// Leader ClusterSet DeletionBlocked=False.
        NotDeleting,
        /// Member Ready=True: registered and heartbeating.
        Joined,
        /// Member Ready=False: still registering.
        Joining,
        /// Member side Registered=False: the agent is installed and idle, with no Member
        /// ClusterSet yet (`tether join` gives it one).
        NotJoined,
        /// Member Registered=False: waiting for the leader's decision.
        Registering,
        /// Member Registered=True.
        Approved,
        /// Member Registered=False: the leader denied the request.
        Denied,
        /// Member Registered=False: the join token was refused (expired, deleted or mistyped).
        JoinTokenExpired,
        /// Member Registered=False: the join token is missing or may not register in that namespace.
        JoinTokenInvalid,
        /// Member Registered=False: the leader no longer accepts the member credential.
        CredentialRejected,
        /// Member Registered=False: another failure (see the message).
        Error,
        /// Member LeaderReachable=True.
        HeartbeatOK,
        /// Member LeaderReachable=False.
        LeaderUnreachable,
        /// Member LeaderReachable=False: the leader's CA does not match the pin.
        PinMismatch,
        /// Member CAVerified=True: the leader's serving chain was verified against the pinned CA.
        PinMatched,
        /// Member CAVerified=True: the leader was verified with the configured caBundle.
        CABundle,
        /// Member CAVerified=True: the leader was verified with the CA bundle it published,
        /// learned over a connection verified by the pin or by the bundle learned before.
        PublishedCABundle,
        /// Member CAVerified=False: verification is switched off.
        InsecureSkipCAVerification,
        /// ManagedCluster ApiServerHealthy=True.
        LivezReadyzOK,
        /// ManagedCluster ApiServerHealthy=False.
        HealthCheckFailed,
        /// ManagedCluster TunnelConnected=True.
        TunnelAttached,
        /// ManagedCluster TunnelConnected=False: the tunnel closed (the agent reconnects).
        TunnelClosed,
        /// ManagedCluster TunnelConnected=False: no tunnel reached the active leader replica.
        NoTunnel,
        /// ManagedCluster AgentVersionSupported=True.
        WithinSkew,
        /// ManagedCluster AgentVersionSupported=False: upgrade the agent (or the leader).
        OutsideSkew,
        /// ManagedCluster AgentVersionSupported=Unknown: no readable agent version yet.
        AgentVersionUnknown,
    }
}

api_words! {
    /// Reasons of the Events Tether publishes.
    EventReason {
        /// A registration request waits for an admin.
        AwaitingApproval,
        /// A registration request was approved.
        RegistrationApproved,
        /// A registration request was denied.
        RegistrationDenied,
        /// A member's first heartbeat arrived.
        MemberReady,
        /// A member's heartbeats stopped for longer than the grace period.
        MemberLost,
        /// A lost member's heartbeats resumed.
        MemberRecovered,
        /// A member left (deleted its announce).
        MemberLeft,
        /// A member was silent past memberExpiry and was removed.
        MemberExpired,
        /// A member was removed with its ClusterSet, or its cluster ID was banned.
        MemberRemoved,
        /// A member whose credential had expired proved its registered key and got a new one.
        Rejoined,
        /// A ClusterSet's deletion waits for its members.
        DeletionBlocked,
        /// A member's live tunnel was replaced by a new one proven with its key.
        TunnelReplaced,
        /// A member's tunnel was closed because what it was proven with no longer holds.
        TunnelRevoked,
        /// A ClusterSet and everything of it were removed.
        Destroyed,
        /// Member side: registered with the leader.
        Registered,
        /// Member side: the leader's CA does not match the pin.
        PinMismatch,
        /// Member side: the join token was refused.
        JoinTokenExpired,
        /// Member side: the join token is missing or not allowed.
        JoinTokenInvalid,
        /// Member side: the leader rejected the credential; registering again.
        CredentialRejected,
        /// Member side: left the set.
        Left,
        /// Member side: the leader published a new URL and the agent follows it.
        LeaderMoved,
        /// Member side: the leader published a new CA bundle (a CA rotation) and the agent trusts it.
        LeaderCAChanged,
        /// Leader side: a member's agent is outside the supported version skew.
        AgentVersionUnsupported,
        /// Member side: leaving could not deregister at the leader.
        LeaveIncomplete,
    }
}

api_words! {
    /// The one-word `status.state` of a ClusterSet.
    SetState {
        /// Leader: the set is served.
        Active,
        /// Leader: the set is being deleted.
        Deleting,
        /// Member: registering.
        Joining,
        /// Member: registered and heartbeating.
        Ready,
        /// Member: registered, but the leader does not answer.
        NotReady,
        /// Member: leaving.
        Leaving,
    }
}

/// A condition's status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// `True`.
    True,
    /// `False`.
    False,
    /// `Unknown`.
    Unknown,
}

impl Status {
    /// `True` or `False`.
    pub fn of(ok: bool) -> Self {
        if ok { Status::True } else { Status::False }
    }

    /// The word as written to the API.
    pub const fn as_str(self) -> &'static str {
        match self {
            Status::True => "True",
            Status::False => "False",
            Status::Unknown => "Unknown",
        }
    }
}

/// A condition that keeps its `lastTransitionTime` while its status does not change, so an
/// unchanged status compares equal and is not written again.
pub fn condition(
    previous: &[Condition],
    type_: ConditionType,
    status: Status,
    reason: Reason,
    message: String,
    now: Timestamp,
) -> Condition {
    let last_transition_time = previous
        .iter()
        .find(|c| c.type_ == type_ && c.status == status.as_str())
        .map(|c| c.last_transition_time.clone())
        .unwrap_or(Time(now));
    Condition {
        type_: type_.as_str().into(),
        status: status.as_str().into(),
        reason: reason.as_str().into(),
        message,
        last_transition_time,
        observed_generation: None,
    }
}

/// The condition of `type_` in `conditions`, if any.
pub fn find(conditions: &[Condition], type_: ConditionType) -> Option<&Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_round_trip_and_unknown_words_say_what_they_are_not() {
        for r in Reason::ALL {
            assert_eq!(r.as_str().parse::<Reason>(), Ok(*r));
        }
        assert_eq!(ConditionType::CAVerified.as_str(), "CAVerified");
        let err = "Nope".parse::<EventReason>().unwrap_err().to_string();
        assert!(err.contains("Nope") && err.contains("EventReason"), "{err}");
    }

    #[test]
    fn transition_time_moves_only_when_the_status_does() {
        let t0 = Timestamp::from_second(1_000).unwrap();
        let t1 = Timestamp::from_second(2_000).unwrap();
        let first = condition(
            &[],
            ConditionType::Ready,
            Status::True,
            Reason::Joined,
            "a".into(),
            t0,
        );
        let same = condition(
            std::slice::from_ref(&first),
            ConditionType::Ready,
            Status::True,
            Reason::Joined,
            "b".into(),
            t1,
        );
        assert_eq!(same.last_transition_time, Time(t0));
        let flipped = condition(
            &[same],
            ConditionType::Ready,
            Status::False,
            Reason::Joining,
            "c".into(),
            t1,
        );
        assert_eq!(flipped.last_transition_time, Time(t1));
    }
}
