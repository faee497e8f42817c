//! ManagedCluster: the leader's record of one member, in the member's dedicated namespace.
//! The leader owns the spec and the Ready condition; the agent writes what it observes.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::validation::{AGE_RECIPIENT, DNS1123_LABEL, DNS1123_SUBDOMAIN, IMMUTABLE_RULE, MAX_CLUSTER_ID};

/// Most resource names summed in capacity/allocatable.
pub const MAX_RESOURCES: u32 = 64;

/// Identity of a member cluster.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "multicluster.tether.dev",
    version = "v1alpha1",
    kind = "ManagedCluster",
    namespaced,
    status = "ManagedClusterStatus",
    shortname = "mcls",
    category = "tether",
    derive = "PartialEq",
    doc = "A member cluster of a ClusterSet, as seen by the leader.",
    printcolumn(name = "Cluster ID", type_ = "string", json_path = ".spec.clusterID"),
    printcolumn(name = "Kubernetes", type_ = "string", json_path = ".status.kubernetesVersion"),
    printcolumn(name = "Nodes", type_ = "string", json_path = ".status.nodes.summary"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    printcolumn(name = "Reason", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].reason", priority = 1),
    printcolumn(name = "ClusterSet", type_ = "string", json_path = ".spec.clusterSet", priority = 1),
    printcolumn(name = "Platform", type_ = "string", json_path = ".status.platform", priority = 1),
    printcolumn(name = "Agent Version", type_ = "string", json_path = ".status.agentVersion", priority = 1),
    printcolumn(name = "Last Heartbeat", type_ = "date", json_path = ".status.lastHeartbeatTime", priority = 1),
    printcolumn(name = "Tunnel", type_ = "string", json_path = ".status.conditions[?(@.type==\"TunnelConnected\")].reason", priority = 1),
    validation = Rule::new(
        "self.metadata.name.size() <= 63 && self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')"
    ).message("metadata.name is the cluster name and must be a DNS-1123 label of at most 63 characters")
)]
#[x_kube(validation = Rule::new("!has(oldSelf.publicKey) || (has(self.publicKey) && self.publicKey == oldSelf.publicKey)")
    .message("spec.publicKey is the member's identity: set once, at approval, never changed or removed; an admin replaces a member that lost its key by approving its new registration (`tether approve`)"))]
#[serde(rename_all = "camelCase")]
pub struct ManagedClusterSpec {
    /// The member's cluster ID. Immutable.
    #[serde(rename = "clusterID")]
    #[schemars(regex(pattern = DNS1123_SUBDOMAIN), length(min = 1, max = MAX_CLUSTER_ID))]
    #[x_kube(validation = Rule::new(IMMUTABLE_RULE).message("clusterID is immutable"))]
    pub cluster_id: String,
    /// The ClusterSet ID this member belongs to. Immutable.
    #[schemars(regex(pattern = DNS1123_LABEL), length(min = 1, max = 63))]
    #[x_kube(validation = Rule::new(IMMUTABLE_RULE).message("clusterSet is immutable"))]
    pub cluster_set: String,
    /// The key the member registered with (an `age` X25519 recipient): what its agent proves to
    /// attach its tunnel or rejoin, and what member credentials are sealed to. Written by the
    /// leader at approval; once set it never changes (a member with a new key is a new object).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = AGE_RECIPIENT))]
    pub public_key: Option<String>,
}

/// What the agent observes in its cluster, plus the leader's Ready condition.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ManagedClusterStatus {
    /// Kubernetes version of the member's API server (gitVersion).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub kubernetes_version: Option<String>,
    /// Platform of the member's API server (os/arch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub platform: Option<String>,
    /// The member's API server URL as the agent sees it.
    #[serde(rename = "apiServerURL", default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 2048))]
    pub api_server_url: Option<String>,
    /// Version of the reporting agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub agent_version: Option<String>,
    /// Node counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<NodeCounts>,
    /// Capacity summed over all nodes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = MAX_RESOURCES))]
    pub capacity: BTreeMap<String, Quantity>,
    /// Allocatable resources summed over all nodes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = MAX_RESOURCES))]
    pub allocatable: BTreeMap<String, Quantity>,
    /// Health of the member's API server (`/livez`, `/readyz`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_server_health: Option<ApiServerHealth>,
    /// The member's `about.k8s.io` ClusterProperties (KEP-2149), by name, as its agent reads
    /// them (at most 64; values over 1,024 characters are left out).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_PROPERTIES))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub properties: Vec<PropertyValue>,
    /// The member's last heartbeat, never written per heartbeat: the leader sets it with every Ready
    /// change and the agent with every status report (on change, and at least every 5 minutes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heartbeat_time: Option<Time>,
    /// When the agent last wrote this status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_report_time: Option<Time>,
    /// Standard conditions: Ready (leader), ApiServerHealthy (agent).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
}

/// Most ClusterProperties a member reports.
pub const MAX_PROPERTIES: u32 = 64;
/// The longest ClusterProperty value reported (what a ClusterProfile property holds).
pub const MAX_PROPERTY_VALUE: u32 = 1024;

/// One ClusterProperty of a member: its name and value.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PropertyValue {
    /// The ClusterProperty's name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Its value.
    #[schemars(length(min = 1, max = MAX_PROPERTY_VALUE))]
    pub value: String,
}

/// Node counts of a member cluster.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct NodeCounts {
    /// All nodes.
    pub total: i32,
    /// Nodes whose Ready condition is True.
    pub ready: i32,
    /// Nodes whose Ready condition is False.
    pub not_ready: i32,
    /// Nodes whose Ready condition is Unknown or missing.
    pub unknown: i32,
    /// `ready/total`, for `kubectl get`.
    #[schemars(length(max = 32))]
    pub summary: String,
}

/// Results of the member API server's health endpoints.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ApiServerHealth {
    /// `/livez` answered ok.
    pub livez: bool,
    /// `/readyz` answered ok.
    pub readyz: bool,
}
