//! SIG-Multicluster's ClusterProfile (KEP-4322, `sigs.k8s.io/cluster-inventory-api`,
//! `multicluster.x-k8s.io/v1alpha1`): the fields Tether writes and reads. The CRD is upstream's,
//! shipped as published (`config/upstream/`), so no schema is generated from these types.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use serde::{Deserialize, Serialize};

/// The cluster-inventory-api release whose CRD Tether ships and whose consumers it is tested with.
pub const UPSTREAM_VERSION: &str = "v0.1.3";
/// `spec.clusterManager.name` and the value of [`CLUSTER_MANAGER_LABEL`] on Tether's profiles.
pub const CLUSTER_MANAGER: &str = "tether";
/// The label naming the cluster manager that owns a profile (upstream's key).
pub const CLUSTER_MANAGER_LABEL: &str = "x-k8s.io/cluster-manager";
/// The label naming the ClusterSet of a profile (upstream's key).
pub const CLUSTER_SET_LABEL: &str = "multicluster.x-k8s.io/clusterset";
/// The access provider name of Tether's entry in `status.accessProviders`.
pub const ACCESS_PROVIDER: &str = "tether";
/// The cluster extension whose value client-go hands the exec plugin as
/// `ExecCredential.spec.cluster.config` (reserved by SIG Auth).
pub const EXEC_EXTENSION: &str = "client.authentication.k8s.io/exec";
/// Condition type: the member's API server answers its health checks.
pub const CONTROL_PLANE_HEALTHY: &str = "ControlPlaneHealthy";
/// Condition type: the cluster is a working member of its set.
pub const JOINED: &str = "Joined";

/// What a ClusterProfile's spec says.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "multicluster.x-k8s.io",
    version = "v1alpha1",
    kind = "ClusterProfile",
    namespaced,
    status = "ClusterProfileStatus",
    schema = "disabled",
    derive = "PartialEq"
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterProfileSpec {
    /// A human-readable name of the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
    /// Who manages the cluster (immutable upstream).
    pub cluster_manager: ClusterManager,
}

/// `spec.clusterManager`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ClusterManager {
    /// The cluster manager's name.
    pub name: String,
}

/// What a ClusterProfile's status says.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ClusterProfileStatus {
    /// The cluster's conditions.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// The cluster's versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<ClusterVersion>,
    /// Properties of the cluster (KEP-2149 ClusterProperties and the manager's own).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub properties: Vec<Property>,
    /// How to reach the cluster.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub access_providers: Vec<AccessProvider>,
}

/// `status.version`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
pub struct ClusterVersion {
    /// The Kubernetes version of the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<String>,
}

/// One entry of `status.properties`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Property {
    /// The property's name.
    pub name: String,
    /// Its value (1–1024 characters upstream).
    pub value: String,
}

/// One entry of `status.accessProviders`: a kubeconfig cluster entry (client-go's
/// `clientcmdv1.Cluster`) under a provider name the consumer's provider file matches.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct AccessProvider {
    /// The provider's name.
    pub name: String,
    /// Where and how to connect.
    pub cluster: kube::config::Cluster,
}

impl PartialEq for AccessProvider {
    fn eq(&self, other: &Self) -> bool {
        // NB: kube's Cluster has no PartialEq; its serialized form is what the API server holds.
        self.name == other.name
            && serde_json::to_value(&self.cluster).ok() == serde_json::to_value(&other.cluster).ok()
    }
}

/// What the leader hands `tether credential` about the member through the exec extension (the
/// plugin reads it from `KUBERNETES_EXEC_INFO`, `spec.cluster.config`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ExecExtension {
    /// The member's ManagedCluster name.
    pub cluster_name: String,
    /// Its ClusterSet.
    pub cluster_set: String,
    /// Its dedicated namespace on the leader.
    pub namespace: String,
}
