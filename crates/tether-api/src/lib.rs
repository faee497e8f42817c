//! Tether's API: the `multicluster.tether.dev/v1alpha1` custom resources and the upstream
//! `about.k8s.io` ClusterProperty, with the validation the API server enforces. No I/O here.

// NB: kube-derive takes one `printcolumn(...)` per column; clippy reads repeated `type_ = ...`
// inside them as duplicated attributes.
#![allow(clippy::duplicated_attributes)]

pub mod about;
pub mod announce;
pub mod clusterset;
pub mod conditions;
pub mod crds;
pub mod duration;
pub mod inventory;
pub mod managedcluster;
pub mod registration;
pub mod setref;
pub mod validation;

pub use announce::{MemberClusterAnnounce, MemberClusterAnnounceSpec};
pub use clusterset::{ClusterSet, ClusterSetSpec, ClusterSetStatus};
pub use managedcluster::{ManagedCluster, ManagedClusterSpec, ManagedClusterStatus};
pub use registration::{ClusterRegistrationRequest, ClusterRegistrationRequestSpec, RegistrationStatus};
pub use setref::SetRef;

/// A server-side-apply body for the status subresource of a `K`: the typed `status` (unset
/// fields are left out, so the writer owns exactly what it sets), with `apiVersion` and `kind`
/// taken from the type rather than typed by hand.
pub fn status_apply<K, S>(status: &S) -> kube::api::Patch<serde_json::Value>
where
    K: kube::Resource<DynamicType = ()>,
    S: serde::Serialize,
{
    kube::api::Patch::Apply(serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    }))
}

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
    /// The home namespace of the ClusterSet an object belongs to (sets are unique per namespace,
    /// not per leader: two namespaces may hold sets with the same ID).
    pub const CLUSTER_SET_NAMESPACE: &str = "multicluster.tether.dev/clusterset-namespace";
    /// The member's cluster name.
    pub const CLUSTER_NAME: &str = "multicluster.tether.dev/cluster-name";
    /// The member's cluster ID.
    pub const CLUSTER_ID: &str = "multicluster.tether.dev/cluster-id";
    /// On a member's ClusterProfile: the member's dedicated namespace on the leader.
    pub const MEMBER_NAMESPACE: &str = "multicluster.tether.dev/member-namespace";
    /// Which Tether component manages an object.
    pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";

    /// Label prefixes (domains) that are reserved with every subdomain: Tether's own, and the
    /// SIG-Multicluster inventory's (`x-k8s.io/cluster-manager`, `multicluster.x-k8s.io/…`).
    pub const RESERVED_DOMAINS: [&str; 2] = ["tether.dev", "x-k8s.io"];
    /// Label prefixes reserved exactly (Kubernetes' own).
    pub const RESERVED_PREFIXES: [&str; 2] = ["kubernetes.io", "k8s.io"];

    /// Whether a member may not ask for label `key`: the labels that say who a member is (set,
    /// set namespace, name, ID, manager) are the leader's alone, and so is everything under a
    /// reserved prefix. The CRD's rule (`validation::RESERVED_LABEL_KEY`) says the same to the
    /// API server; this check keeps objects made before that rule, or under an edited CRD, out.
    pub fn is_reserved(key: &str) -> bool {
        if key == MANAGED_BY {
            return true;
        }
        let Some((prefix, _)) = key.split_once('/') else {
            return false;
        };
        RESERVED_PREFIXES.contains(&prefix)
            || RESERVED_DOMAINS
                .iter()
                .any(|d| prefix == *d || prefix.strip_suffix(d).is_some_and(|sub| sub.ends_with('.')))
    }

    /// Keys that the unit test and the CRD test (on a real API server) hold both checks to.
    pub mod examples {
        /// Keys a member may not ask for.
        pub const RESERVED: [&str; 10] = [
            "multicluster.tether.dev/clusterset",
            "multicluster.tether.dev/clusterset-namespace",
            "multicluster.tether.dev/cluster-id",
            "tether.dev/x",
            "a.b.tether.dev/x",
            "app.kubernetes.io/managed-by",
            "kubernetes.io/hostname",
            "k8s.io/x",
            "x-k8s.io/cluster-manager",
            "multicluster.x-k8s.io/clusterset",
        ];
        /// Keys a member may ask for.
        pub const ALLOWED: [&str; 7] = [
            "region",
            "example.com/team",
            "app.kubernetes.io/name",
            "nottether.dev/x",
            "topology.kubernetes.io/zone",
            "tether.devx/y",
            "k8s.iox/z",
        ];
    }
}

/// Well-known `about.k8s.io` ClusterProperty names (KEP-2149).
pub mod properties {
    /// Holds the cluster ID.
    pub const CLUSTER_ID: &str = "cluster.clusterset.k8s.io";
    /// Holds the ClusterSet ID while the cluster is a member.
    pub const CLUSTER_SET: &str = "clusterset.k8s.io";
}

/// The Secrets the agent keeps in its namespace (what `tether leave --force` removes by hand).
pub mod agent_secrets {
    /// The agent's private key.
    pub const KEY: &str = "tether-agent-key";
    /// The agent's leader credential.
    pub const CREDENTIAL: &str = "tether-agent-credential";
}

/// Annotation keys Tether uses.
pub mod annotations {
    /// On a ManagedCluster of a leader before 0.3: the public key the member registered with.
    /// Anyone who may patch ManagedClusters can edit an annotation, so it is never read as the
    /// key: the leader moves it into `spec.publicKey` once (set-once there) and removes it.
    pub const LEGACY_PUBLIC_KEY: &str = "multicluster.tether.dev/public-key";
    /// On a ManagedCluster: the agent version its registration request carried, so the leader
    /// judges the version skew from the first status write on, before the agent's first report.
    pub const REGISTERED_AGENT_VERSION: &str = "multicluster.tether.dev/registered-agent-version";
    /// On a Leader ClusterSet: `"true"` lets its deletion remove every remaining member
    /// (`tether destroy --force`).
    pub const FORCE_DELETE: &str = "multicluster.tether.dev/force-delete";
    /// On a member's heartbeat Lease: seconds between renewals while the agent has no tunnel
    /// attached (the set's `heartbeatInterval`).
    pub const HEARTBEAT_INTERVAL: &str = "multicluster.tether.dev/heartbeat-interval-seconds";
    /// On a member's heartbeat Lease: seconds between renewals while the agent's tunnel is
    /// attached (the set's `tunnelHeartbeatInterval`).
    pub const TUNNEL_HEARTBEAT_INTERVAL: &str = "multicluster.tether.dev/tunnel-heartbeat-interval-seconds";
    /// On a member's heartbeat Lease: seconds between the leader's pings of the tunnel (the
    /// set's `tunnelPingInterval`); the agent pings at the same interval.
    pub const TUNNEL_PING_INTERVAL: &str = "multicluster.tether.dev/tunnel-ping-interval-seconds";
}

/// The finalizer the leader puts on Leader ClusterSets, to remove members and tokens first.
pub const LEADER_FINALIZER: &str = "multicluster.tether.dev/leader-cleanup";

/// The finalizer the agent puts on Member ClusterSets, so that deleting one is a clean leave.
pub const AGENT_FINALIZER: &str = "multicluster.tether.dev/agent-leave";

#[cfg(test)]
mod tests {
    use super::labels::{examples, is_reserved};

    #[test]
    fn reserved_label_keys_are_the_leaders_alone() {
        for k in examples::RESERVED {
            assert!(is_reserved(k), "{k}");
        }
        for k in examples::ALLOWED {
            assert!(!is_reserved(k), "{k}");
        }
    }
}
