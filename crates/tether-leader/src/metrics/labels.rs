//! The bounded label values of the leader's counters that alerts select, one variant each: a
//! call site cannot count under a value that the list of series created at 0 lacks.

use crate::proxy::challenge::Refused;

/// The result of one request to the member proxy API (`tether_leader_proxy_requests_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proxied {
    /// A request proxied and answered.
    Ok,
    /// A request proxied as an upgraded connection (exec, port-forward, watch over a stream).
    Upgraded,
    /// No tunnel of the member is attached to this replica.
    NoTunnel,
    /// The tunnel failed the request.
    TunnelError,
    /// No authenticated user in the front proxy's headers.
    Unauthenticated,
    /// An attach by someone other than the member's agent.
    AttachForbidden,
    /// An attach without a valid proof of the member's key (or for a member without one).
    AttachUnproven,
    /// A live tunnel's credential deadline moved by a new proof.
    AttachRenewed,
    /// An attach told to wait for its turn (`proxy::pace`).
    AttachPaced,
    /// An attach or rejoin proof refused.
    Refused(Refused),
    /// A rejoin challenge issued.
    RejoinChallenge,
    /// A rejoin accepted.
    Rejoined,
    /// A rejoin refused (no such member, or another key).
    RejoinRefused,
    /// A rejoin that failed on this side.
    RejoinError,
}

impl Proxied {
    /// Every result, in the order the help text lists them.
    pub const ALL: [Self; 17] = [
        Self::Ok,
        Self::Upgraded,
        Self::NoTunnel,
        Self::TunnelError,
        Self::Unauthenticated,
        Self::AttachForbidden,
        Self::AttachUnproven,
        Self::AttachRenewed,
        Self::AttachPaced,
        Self::Refused(Refused::Malformed),
        Self::Refused(Refused::Forged),
        Self::Refused(Refused::Expired),
        Self::Refused(Refused::Reused),
        Self::RejoinChallenge,
        Self::Rejoined,
        Self::RejoinRefused,
        Self::RejoinError,
    ];

    /// The `result` label.
    pub fn label(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Upgraded => "upgraded",
            Self::NoTunnel => "no_tunnel",
            Self::TunnelError => "tunnel_error",
            Self::Unauthenticated => "unauthenticated",
            Self::AttachForbidden => "attach_forbidden",
            Self::AttachUnproven => "attach_unproven",
            Self::AttachRenewed => "attach_renewed",
            Self::AttachPaced => "attach_paced",
            Self::Refused(why) => why.label(),
            Self::RejoinChallenge => "rejoin_challenge",
            Self::Rejoined => "rejoined",
            Self::RejoinRefused => "rejoin_refused",
            Self::RejoinError => "rejoin_error",
        }
    }
}

/// Why a live tunnel was closed (`tether_leader_tunnel_revocations_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Revoked {
    /// The member's ManagedCluster is gone or being deleted.
    MemberRemoved,
    /// The member registered another key.
    KeyChanged,
    /// The member's agent ServiceAccount was deleted or recreated.
    IdentityDeleted,
    /// The credential it attached with expired without a new proof.
    CredentialExpired,
}

impl Revoked {
    /// Every reason.
    pub const ALL: [Self; 4] = [
        Self::MemberRemoved,
        Self::KeyChanged,
        Self::IdentityDeleted,
        Self::CredentialExpired,
    ];

    /// The `reason` label.
    pub fn label(self) -> &'static str {
        match self {
            Self::MemberRemoved => "member_removed",
            Self::KeyChanged => "key_changed",
            Self::IdentityDeleted => "identity_deleted",
            Self::CredentialExpired => "credential_expired",
        }
    }

    /// What it tells the member's admin.
    pub fn explain(self) -> &'static str {
        match self {
            Self::MemberRemoved => "the member was removed",
            Self::KeyChanged => "the member registered another key",
            Self::IdentityDeleted => {
                "the member's agent ServiceAccount was deleted or recreated (its tokens are void)"
            }
            Self::CredentialExpired => {
                "the credential it attached with expired without a new proof of the member's key"
            }
        }
    }
}
