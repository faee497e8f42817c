//! ClusterRegistrationRequest: an agent's request to join, created with the bootstrap token in the
//! set's home namespace on the leader. Its result is never blank (`Pending` from creation on), and
//! the credential in its status is sealed to the agent's key, so reading it yields nothing usable.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::validation::{
    AGE_RECIPIENT, DNS1123_LABEL, DNS1123_SUBDOMAIN, IMMUTABLE_RULE, LABELS_RULE, MAX_CLUSTER_ID,
    MAX_CLUSTER_NAME, MAX_LABELS, NO_RESERVED_LABELS_MESSAGE, NO_RESERVED_LABELS_RULE,
};

/// Largest sealed credential accepted in a status (an armored `age` message).
pub const MAX_SEALED_CREDENTIAL: u32 = 32 * 1024;

/// What a member asks for when it registers. Immutable: a new attempt is a new request.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "multicluster.tether.dev",
    version = "v1alpha1",
    kind = "ClusterRegistrationRequest",
    namespaced,
    status = "RegistrationStatus",
    shortname = "clsrr",
    category = "tether",
    derive = "PartialEq",
    doc = "A member cluster's request to join the ClusterSet of this namespace.",
    printcolumn(name = "Cluster Name", type_ = "string", json_path = ".spec.clusterName"),
    printcolumn(name = "Cluster ID", type_ = "string", json_path = ".spec.clusterID"),
    printcolumn(name = "Result", type_ = "string", json_path = ".status.result"),
    printcolumn(name = "Reason", type_ = "string", json_path = ".status.reason"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    printcolumn(
        name = "Message",
        type_ = "string",
        json_path = ".status.message",
        priority = 1
    )
)]
#[x_kube(validation = Rule::new(IMMUTABLE_RULE).message("spec is immutable: create a new request instead"))]
#[serde(rename_all = "camelCase")]
pub struct ClusterRegistrationRequestSpec {
    /// The member's cluster ID (by default the UID of its kube-system namespace).
    #[serde(rename = "clusterID")]
    #[schemars(regex(pattern = DNS1123_SUBDOMAIN), length(min = 1, max = MAX_CLUSTER_ID))]
    pub cluster_id: String,
    /// The member's name in the set (DNS-1123 label).
    #[schemars(regex(pattern = DNS1123_LABEL), length(min = 1, max = MAX_CLUSTER_NAME))]
    pub cluster_name: String,
    /// X25519 `age` recipient the credential is sealed to.
    #[schemars(regex(pattern = AGE_RECIPIENT))]
    pub public_key: String,
    /// Version of the agent that registers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub agent_version: Option<String>,
    /// Labels the member asks to carry on its ManagedCluster.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = MAX_LABELS))]
    #[x_kube(validation = Rule::new(LABELS_RULE).message("label keys must be at most 317 and values at most 63 characters"))]
    #[x_kube(validation = Rule::new(NO_RESERVED_LABELS_RULE).message(kube::core::cel::Message::Expression(NO_RESERVED_LABELS_MESSAGE.into())))]
    pub labels: std::collections::BTreeMap<String, String>,
}

/// The leader's answer to a registration request.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RegistrationStatus {
    /// Pending until the leader decides; then Approved or Denied.
    #[serde(default)]
    pub result: RegistrationResult,
    /// Machine-readable reason for the result.
    #[serde(default)]
    pub reason: RegistrationReason,
    /// Human-readable explanation, with what to do next when Denied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub message: Option<String>,
    /// An admin's decision in Manual approval mode (set by `tether approve|deny` via the status subresource).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<AdminDecision>,
    /// The member's dedicated namespace on the leader, once approved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DNS1123_LABEL), length(max = 63))]
    pub namespace: Option<String>,
    /// The credential, sealed to `spec.publicKey`, once approved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<SealedCredential>,
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Standard conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
}

impl Default for RegistrationStatus {
    fn default() -> Self {
        Self {
            result: RegistrationResult::Pending,
            reason: RegistrationReason::AwaitingLeader,
            message: None,
            decision: None,
            namespace: None,
            credential: None,
            observed_generation: None,
            conditions: Vec::new(),
        }
    }
}

/// The outcome of a registration request.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum RegistrationResult {
    /// Not decided yet.
    #[default]
    Pending,
    /// The member was admitted; the sealed credential is in the status.
    Approved,
    /// The member was refused; see the reason.
    Denied,
}

/// Why a registration request has its result.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum RegistrationReason {
    /// The leader has not processed the request yet.
    #[default]
    AwaitingLeader,
    /// Manual approval mode: waiting for an admin.
    AwaitingApproval,
    /// Admitted.
    Approved,
    /// Another live member has this cluster ID with another key.
    DuplicateClusterID,
    /// Another live member has this cluster name with another key.
    DuplicateClusterName,
    /// The approval policy does not allow this cluster.
    NotAllowed,
    /// An admin denied the request.
    DeniedByAdmin,
    /// No ClusterSet exists in this namespace.
    ClusterSetNotFound,
    /// The public key is not a usable X25519 recipient.
    InvalidPublicKey,
    /// The ClusterSet is being deleted.
    ClusterSetDeleting,
    /// The member's namespace exists and was not created by the leader for this member.
    NamespaceConflict,
    /// The cluster ID is in the set's `bannedClusterIDs`.
    Banned,
    /// It names a silent member's cluster ID or name with another key: an admin decides whether
    /// it replaces that member (`tether approve`) or not (`tether deny`).
    ReplacesMember,
}

/// An admin's decision on a request in Manual mode.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AdminDecision {
    /// Approve or Deny.
    pub action: DecisionAction,
    /// Why, shown to the member when denied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    pub message: Option<String>,
}

/// What an admin decided.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecisionAction {
    /// Admit the member.
    Approve,
    /// Refuse the member.
    Deny,
}

/// A credential readable only by the holder of the request's private key.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SealedCredential {
    /// ASCII-armored `age` message holding the token, the leader CA and the namespace.
    #[schemars(length(min = 1, max = MAX_SEALED_CREDENTIAL))]
    pub sealed: String,
    /// When the sealed token expires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expiration_time: Option<Time>,
}
