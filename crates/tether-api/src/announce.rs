//! MemberClusterAnnounce: a member's presence in its dedicated namespace on the leader (its agent
//! deletes it to leave). The heartbeat is the member's Lease beside it; agents from before
//! heartbeat Leases renew the announce's `renewTime` instead, and the leader accepts either.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::validation::{DNS1123_SUBDOMAIN, IMMUTABLE_RULE, MAX_CLUSTER_ID};

/// A member's heartbeat record.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "multicluster.tether.dev",
    version = "v1alpha1",
    kind = "MemberClusterAnnounce",
    namespaced,
    shortname = "mca",
    category = "tether",
    derive = "PartialEq",
    doc = "A member cluster's presence on its leader: deleting it leaves the set. Its heartbeat is the Lease of the same name (agents before v0.2 renew this object instead).",
    printcolumn(name = "Cluster ID", type_ = "string", json_path = ".spec.clusterID"),
    printcolumn(name = "Renewed", type_ = "date", json_path = ".spec.renewTime"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct MemberClusterAnnounceSpec {
    /// The member's cluster ID. Immutable.
    #[serde(rename = "clusterID")]
    #[schemars(regex(pattern = DNS1123_SUBDOMAIN), length(min = 1, max = MAX_CLUSTER_ID))]
    #[x_kube(validation = Rule::new(IMMUTABLE_RULE).message("clusterID is immutable"))]
    pub cluster_id: String,
    /// When the member last renewed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renew_time: Option<MicroTime>,
    /// The interval the member renews at, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 600))]
    pub heartbeat_interval_seconds: Option<i32>,
}
