//! Tether's API: the `multicluster.tether.dev/v1alpha1` custom resources and the upstream
//! `about.k8s.io` ClusterProperty, with the validation the API server enforces. No I/O here.

// NB: kube-derive takes one `printcolumn(...)` per column; clippy reads repeated `type_ = ...`
// inside them as duplicated attributes.
#![allow(clippy::duplicated_attributes)]

pub mod about;
pub mod announce;
pub mod clusterset;
pub mod crds;
pub mod duration;
pub mod managedcluster;
pub mod registration;
pub mod validation;

pub use announce::{MemberClusterAnnounce, MemberClusterAnnounceSpec};
pub use clusterset::{ClusterSet, ClusterSetSpec, ClusterSetStatus};
pub use managedcluster::{ManagedCluster, ManagedClusterSpec, ManagedClusterStatus};
pub use registration::{ClusterRegistrationRequest, ClusterRegistrationRequestSpec, RegistrationStatus};

/// The API group of every Tether kind.
pub const GROUP: &str = "multicluster.tether.dev";
/// The served and stored version of every Tether kind.
pub const VERSION: &str = "v1alpha1";
/// `kubectl get tether` lists every Tether kind.
pub const CATEGORY: &str = "tether";

/// Label keys Tether puts on the objects it creates, so that sets and members can be selected.
pub mod labels {
    /// The ClusterSet ID (the ClusterSet's name) an object belongs to.
    pub const CLUSTER_SET: &str = "multicluster.tether.dev/clusterset";
    /// The member's cluster name.
    pub const CLUSTER_NAME: &str = "multicluster.tether.dev/cluster-name";
    /// The member's cluster ID.
    pub const CLUSTER_ID: &str = "multicluster.tether.dev/cluster-id";
    /// Which Tether component manages an object.
    pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
}

/// Well-known `about.k8s.io` ClusterProperty names (KEP-2149).
pub mod properties {
    /// Holds the cluster ID.
    pub const CLUSTER_ID: &str = "cluster.clusterset.k8s.io";
    /// Holds the ClusterSet ID while the cluster is a member.
    pub const CLUSTER_SET: &str = "clusterset.k8s.io";
}

/// Annotation keys Tether uses.
pub mod annotations {
    /// On a ManagedCluster: the public key the member registered with (to recognise re-registration).
    pub const PUBLIC_KEY: &str = "multicluster.tether.dev/public-key";
    /// On a Leader ClusterSet: `"true"` lets its deletion remove every remaining member
    /// (`tether destroy --force`).
    pub const FORCE_DELETE: &str = "multicluster.tether.dev/force-delete";
}

/// The finalizer the leader puts on Leader ClusterSets, to remove members and tokens first.
pub const LEADER_FINALIZER: &str = "multicluster.tether.dev/leader-cleanup";

/// Condition types and reasons shared by the controllers, the CLI and the tests.
pub mod conditions {
    /// ManagedCluster: the member heartbeats. ClusterSet: the set is served.
    pub const READY: &str = "Ready";
    /// ClusterSet (leader): deletion waits for members to leave.
    pub const DELETION_BLOCKED: &str = "DeletionBlocked";
    /// Ready=Unknown: no heartbeat within the set's gracePeriod.
    pub const HEARTBEAT_EXPIRED: &str = "HeartbeatExpired";
    /// Ready=Unknown: approved, no heartbeat yet.
    pub const AWAITING_HEARTBEAT: &str = "AwaitingHeartbeat";
    /// Ready=True: heartbeats arrive.
    pub const HEARTBEAT_RECEIVED: &str = "HeartbeatReceived";
    /// Member ClusterSet: the leader approved this cluster.
    pub const REGISTERED: &str = "Registered";
    /// Member ClusterSet: the leader answers (heartbeats go through).
    pub const LEADER_REACHABLE: &str = "LeaderReachable";
    /// Member ClusterSet: the leader's CA was verified (False when verification is skipped).
    pub const CA_VERIFIED: &str = "CAVerified";

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use k8s_openapi::jiff::Timestamp;

    /// A condition that keeps its `lastTransitionTime` while its status does not change, so an
    /// unchanged status compares equal and is not written again.
    pub fn condition(
        previous: &[Condition],
        type_: &str,
        status: &str,
        reason: &str,
        message: String,
        now: Timestamp,
    ) -> Condition {
        let last_transition_time = previous
            .iter()
            .find(|c| c.type_ == type_ && c.status == status)
            .map(|c| c.last_transition_time.clone())
            .unwrap_or(Time(now));
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message,
            last_transition_time,
            observed_generation: None,
        }
    }
}
