//! ClusterSet: one per namespace, named by the set's ID. On the leader it holds the set's policy
//! and member counts; on a member it holds how to reach the leader and the membership state.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::core::Duration;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::validation::{
    AGE_RECIPIENT, CA_CERT_HASH, DNS1123_LABEL, DNS1123_SUBDOMAIN, DURATION, IMMUTABLE_RULE, LABELS_RULE,
    MAX_CLUSTER_ID, MAX_CLUSTER_NAME, MAX_LABELS, NO_RESERVED_LABELS_MESSAGE, NO_RESERVED_LABELS_RULE,
};

/// Most entries in the leader's member summary; the full list is `kubectl get mcls -A -l ...`.
pub const MAX_MEMBER_SUMMARY: u32 = 100;
/// Most entries in an approval allow-list.
pub const MAX_ALLOWED_CLUSTERS: u32 = 1000;
/// Most banned cluster IDs of a set.
pub const MAX_BANNED_CLUSTERS: u32 = 1000;

/// Desired state of a ClusterSet. Exactly one of `leader` / `member` applies, chosen by `role`.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "multicluster.tether.dev",
    version = "v1alpha1",
    kind = "ClusterSet",
    namespaced,
    status = "ClusterSetStatus",
    category = "tether",
    derive = "PartialEq",
    doc = "A set of clusters managed together: the leader's view of the set, or a member's membership.",
    printcolumn(name = "Role", type_ = "string", json_path = ".spec.role"),
    printcolumn(name = "State", type_ = "string", json_path = ".status.state"),
    printcolumn(name = "Total", type_ = "integer", json_path = ".status.members.total"),
    printcolumn(name = "Ready", type_ = "integer", json_path = ".status.members.ready"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    printcolumn(name = "Leader", type_ = "string", json_path = ".spec.member.leaderURL", priority = 1),
    printcolumn(name = "Cluster ID", type_ = "string", json_path = ".status.membership.clusterID", priority = 1),
    validation = Rule::new(
        "self.metadata.name.size() <= 63 && self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')"
    ).message(
        "metadata.name is the ClusterSet ID and must be a DNS-1123 label: lowercase letters, digits and '-', at most 63 characters"
    )
)]
#[x_kube(validation = Rule::new(
    "self.role == 'Leader' ? !has(self.member) : (has(self.member) && !has(self.leader))"
).message("a Leader ClusterSet takes only spec.leader; a Member ClusterSet needs spec.member and takes no spec.leader"))]
#[serde(rename_all = "camelCase")]
pub struct ClusterSetSpec {
    /// Whether this object describes the set on its leader or this cluster's membership.
    #[x_kube(validation = Rule::new(IMMUTABLE_RULE).message("spec.role is immutable: delete the ClusterSet and create it again"))]
    pub role: ClusterSetRole,
    /// Leader-side policy (role Leader).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<LeaderSpec>,
    /// How this member reaches and joins its leader (role Member).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member: Option<MemberSpec>,
}

/// The side of the set a ClusterSet object describes.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClusterSetRole {
    /// The set's home on its leader cluster.
    Leader,
    /// A member cluster's membership of a set.
    Member,
}

/// Leader-side policy of a set.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = Rule::new("duration(self.gracePeriod) > duration(self.heartbeatInterval)")
    .message("gracePeriod must be longer than heartbeatInterval (the default is 4 intervals)"))]
#[x_kube(validation = Rule::new("duration(self.memberExpiry) >= duration(self.gracePeriod)")
    .message("memberExpiry must not be shorter than gracePeriod"))]
#[x_kube(validation = Rule::new("duration(self.tunnelHeartbeatInterval) >= duration(self.heartbeatInterval)")
    .message("tunnelHeartbeatInterval must not be shorter than heartbeatInterval"))]
#[serde(rename_all = "camelCase")]
pub struct LeaderSpec {
    /// How registration requests are approved.
    #[serde(default)]
    pub approval: ApprovalPolicy,
    /// How often members renew their MemberClusterAnnounce (Go duration, 1s–10m).
    #[serde(default = "default_heartbeat_interval")]
    #[schemars(regex(pattern = DURATION), length(max = 32))]
    #[x_kube(validation = Rule::new("duration(self) >= duration('1s') && duration(self) <= duration('10m')")
        .message("heartbeatInterval must be between 1s and 10m"))]
    pub heartbeat_interval: Duration,
    /// How often members whose tunnel is attached renew their heartbeat Lease (Go duration,
    /// 1m–1h): the tunnel tells the leader they are alive, and the Lease is the backstop. A
    /// member with an attached tunnel is Unknown if it did not renew for as many of these
    /// intervals as `gracePeriod` holds heartbeat intervals.
    #[serde(default = "default_tunnel_heartbeat_interval")]
    #[schemars(regex(pattern = DURATION), length(max = 32))]
    #[x_kube(validation = Rule::new("duration(self) >= duration('1m') && duration(self) <= duration('1h')")
        .message("tunnelHeartbeatInterval must be between 1m and 1h"))]
    pub tunnel_heartbeat_interval: Duration,
    /// How often the serving leader replica pings each member's tunnel (a one-byte ping while
    /// the tunnel is idle, HTTP/2 PING once it carries requests; Go duration, 1s–1m).
    #[serde(default = "default_tunnel_ping_interval")]
    #[schemars(regex(pattern = DURATION), length(max = 32))]
    #[x_kube(validation = Rule::new("duration(self) >= duration('1s') && duration(self) <= duration('1m')")
        .message("tunnelPingInterval must be between 1s and 1m"))]
    pub tunnel_ping_interval: Duration,
    /// How many ping intervals a tunnel may stay silent before it counts as lost (1–10). A
    /// member whose tunnel is lost or closed and not attached again within
    /// `tunnelPingInterval × (tunnelPingMisses + 1)` is marked Ready=Unknown (`TunnelLost`).
    #[serde(default = "default_tunnel_ping_misses")]
    #[schemars(range(min = 1, max = 10))]
    pub tunnel_ping_misses: i32,
    /// A member without a renewal for this long is marked Ready=Unknown (Go duration).
    #[serde(default = "default_grace_period")]
    #[schemars(regex(pattern = DURATION), length(max = 32))]
    pub grace_period: Duration,
    /// A member silent for this long is removed from the set (Go duration).
    #[serde(default = "default_member_expiry")]
    #[schemars(regex(pattern = DURATION), length(max = 32))]
    pub member_expiry: Duration,
    /// Lifetime of the credential minted for each member (Go duration, 10m–24h).
    #[serde(rename = "credentialTTL", default = "default_credential_ttl")]
    #[schemars(regex(pattern = DURATION), length(max = 32))]
    #[x_kube(validation = Rule::new("duration(self) >= duration('10m') && duration(self) <= duration('24h')")
        .message("credentialTTL must be between 10m and 24h"))]
    pub credential_ttl: Duration,
    /// Cluster IDs that may not be members: their requests are Denied (Banned) whatever the
    /// approval mode, they cannot rejoin with their key, and a member with such an ID is
    /// removed. `tether member remove --ban` adds one, `tether member unban` lifts it.
    #[serde(rename = "bannedClusterIDs", default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_BANNED_CLUSTERS))]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub banned_cluster_ids: Vec<ClusterRef>,
    /// Clusters that may not be members, each named by what the member was: its cluster ID, its
    /// name and its key (`tether member remove --ban` writes all three). A cluster reports its
    /// own ID and name, so a banned cluster that comes back under a new ID is still known by
    /// its name or its key; a request or member matching any field of a ban is refused as
    /// `bannedClusterIDs` says. `tether member unban` lifts the bans naming an ID or name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_BANNED_CLUSTERS))]
    pub bans: Vec<Ban>,
    /// Where the set's members are published for tools outside Tether, as SIG-Multicluster
    /// ClusterProfiles (`multicluster.x-k8s.io`), when the leader runs with them enabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inventory: Option<InventorySpec>,
}

/// Most inventory namespaces of a set.
pub const MAX_INVENTORY_NAMESPACES: u32 = 16;

/// Where a set's members are published as ClusterProfiles.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct InventorySpec {
    /// Namespaces that get one ClusterProfile per member (consumers such as Kueue read only
    /// their own namespace). Each must exist; the leader creates none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_INVENTORY_NAMESPACES))]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub namespaces: Vec<InventoryNamespace>,
}

/// A namespace name (a DNS-1123 label).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[serde(transparent)]
pub struct InventoryNamespace(
    #[schemars(regex(pattern = DNS1123_LABEL), length(min = 1, max = 63))] pub String,
);

impl LeaderSpec {
    /// The namespaces the set's members are published into as ClusterProfiles.
    pub fn inventory_namespaces(&self) -> impl Iterator<Item = &str> {
        self.inventory
            .iter()
            .flat_map(|i| i.namespaces.iter().map(|n| n.0.as_str()))
    }
}

impl Default for LeaderSpec {
    fn default() -> Self {
        Self {
            approval: ApprovalPolicy::default(),
            heartbeat_interval: default_heartbeat_interval(),
            grace_period: default_grace_period(),
            member_expiry: default_member_expiry(),
            tunnel_heartbeat_interval: default_tunnel_heartbeat_interval(),
            tunnel_ping_interval: default_tunnel_ping_interval(),
            tunnel_ping_misses: default_tunnel_ping_misses(),
            credential_ttl: default_credential_ttl(),
            banned_cluster_ids: Vec::new(),
            bans: Vec::new(),
            inventory: None,
        }
    }
}

fn default_heartbeat_interval() -> Duration {
    std::time::Duration::from_secs(10).into()
}
fn default_tunnel_heartbeat_interval() -> Duration {
    std::time::Duration::from_secs(300).into()
}
fn default_tunnel_ping_interval() -> Duration {
    std::time::Duration::from_secs(5).into()
}
fn default_tunnel_ping_misses() -> i32 {
    2
}
fn default_grace_period() -> Duration {
    std::time::Duration::from_secs(40).into()
}
fn default_member_expiry() -> Duration {
    std::time::Duration::from_secs(24 * 3600).into()
}
fn default_credential_ttl() -> Duration {
    std::time::Duration::from_secs(3600).into()
}

impl LeaderSpec {
    /// The heartbeat interval (validated positive by the CRD).
    pub fn heartbeat(&self) -> std::time::Duration {
        positive(&self.heartbeat_interval)
    }

    /// The grace period after which a silent member is Unknown.
    pub fn grace(&self) -> std::time::Duration {
        positive(&self.grace_period)
    }

    /// How long a silent member stays before it is removed.
    pub fn expiry(&self) -> std::time::Duration {
        positive(&self.member_expiry)
    }

    /// How often a member with an attached tunnel renews its heartbeat Lease.
    pub fn tunnel_heartbeat(&self) -> std::time::Duration {
        positive(&self.tunnel_heartbeat_interval)
    }

    /// How long a member with an attached tunnel may go without a Lease renewal: as many
    /// tunnel heartbeat intervals as the grace period holds heartbeat intervals.
    pub fn tunnel_grace(&self) -> std::time::Duration {
        let per = self.grace().as_secs_f64() / self.heartbeat().as_secs_f64().max(1.0);
        self.tunnel_heartbeat().mul_f64(per.max(1.0))
    }

    /// How often the leader pings each tunnel.
    pub fn ping(&self) -> std::time::Duration {
        positive(&self.tunnel_ping_interval).max(std::time::Duration::from_secs(1))
    }

    /// How long a ping may go unanswered before the tunnel counts as lost.
    pub fn ping_timeout(&self) -> std::time::Duration {
        self.ping() * self.tunnel_ping_misses.clamp(1, 10) as u32
    }

    /// How long after its tunnel closed a member that has not attached again, nor renewed its
    /// Lease since, is marked Unknown: the time a silent tunnel takes to be found lost.
    pub fn tunnel_detection(&self) -> std::time::Duration {
        self.ping() + self.ping_timeout()
    }

    /// The lifetime of a member credential.
    pub fn credential_lifetime(&self) -> std::time::Duration {
        positive(&self.credential_ttl)
    }

    /// What bans a cluster that reports cluster ID `id`, name `name` and key `key`, if anything
    /// does: the first matching field of `bannedClusterIDs` and `bans`.
    pub fn ban_of(&self, id: &str, name: &str, key: Option<&str>) -> Option<Banned> {
        if self.banned_cluster_ids.iter().any(|b| b.0 == id) {
            return Some(Banned {
                matched: format!("cluster ID {id}"),
                unban: id.to_string(),
            });
        }
        self.bans.iter().find_map(|b| {
            let matched = if b.cluster_id.as_ref().is_some_and(|b| b.0 == id) {
                format!("cluster ID {id}")
            } else if b.cluster_name.as_ref().is_some_and(|b| b.0 == name) {
                format!("cluster name {name}")
            } else if let Some(k) = key.filter(|k| b.public_key.as_ref().is_some_and(|b| b.0 == *k)) {
                format!("key {k}")
            } else {
                return None;
            };
            Some(Banned {
                matched,
                unban: b.handle().to_string(),
            })
        })
    }
}

/// NB: the CRD refuses negative durations; a negative one read anyway counts as zero.
fn positive(d: &Duration) -> std::time::Duration {
    if d.is_negative() {
        std::time::Duration::ZERO
    } else {
        std::time::Duration::from(*d)
    }
}

/// Which registration requests the leader approves by itself.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[x_kube(validation = Rule::new("self.mode == 'AllowList' || !has(self.allowedClusters)")
    .message("allowedClusters is only used with mode AllowList"))]
#[serde(rename_all = "camelCase")]
pub struct ApprovalPolicy {
    /// Automatic approves every valid request; AllowList only listed names/IDs; Manual waits for an admin.
    #[serde(default)]
    pub mode: ApprovalMode,
    /// Cluster names or IDs approved automatically in AllowList mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_ALLOWED_CLUSTERS))]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub allowed_clusters: Option<Vec<ClusterRef>>,
}

/// What a ban matched of a request or member.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Banned {
    /// What matched: `cluster ID x`, `cluster name y`, `key age1...`.
    pub matched: String,
    /// What `tether member unban` takes to lift the ban that matched (its ID, else its name,
    /// else its key).
    pub unban: String,
}

impl std::fmt::Display for Banned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.matched)
    }
}

/// One ban of a set: what a member was known by, any of which keeps it out.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[x_kube(validation = Rule::new("has(self.clusterID) || has(self.clusterName) || has(self.publicKey)")
    .message("a ban names a clusterID, a clusterName or a publicKey"))]
#[serde(rename_all = "camelCase")]
pub struct Ban {
    /// The banned cluster ID.
    #[serde(rename = "clusterID", default, skip_serializing_if = "Option::is_none")]
    pub cluster_id: Option<ClusterRef>,
    /// The banned cluster name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_name: Option<ClusterRef>,
    /// The banned key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_key: Option<PublicKey>,
}

impl Ban {
    /// Whether this ban names cluster ID or name `what`.
    pub fn names(&self, what: &str) -> bool {
        self.cluster_id.as_ref().is_some_and(|b| b.0 == what)
            || self.cluster_name.as_ref().is_some_and(|b| b.0 == what)
            || self.public_key.as_ref().is_some_and(|b| b.0 == what)
    }

    /// What names this ban to `tether member unban`: its cluster ID, else its name, else its key.
    pub fn handle(&self) -> &str {
        self.cluster_id
            .as_ref()
            .map(|b| b.0.as_str())
            .or(self.cluster_name.as_ref().map(|b| b.0.as_str()))
            .or(self.public_key.as_ref().map(|b| b.0.as_str()))
            .unwrap_or_default()
    }
}

/// A member's key: an `age` X25519 recipient.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[serde(transparent)]
pub struct PublicKey(#[schemars(regex(pattern = AGE_RECIPIENT))] pub String);

/// A cluster name or ID (a DNS-1123 subdomain).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[serde(transparent)]
pub struct ClusterRef(
    #[schemars(regex(pattern = DNS1123_SUBDOMAIN), length(min = 1, max = MAX_CLUSTER_ID))] pub String,
);

/// How registration requests are approved.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ApprovalMode {
    /// Every valid request is approved.
    #[default]
    Automatic,
    /// Only requests whose cluster name or ID is in `allowedClusters`; others are Denied (NotAllowed).
    AllowList,
    /// Requests stay Pending until an admin approves or denies them (`tether approve|deny`).
    Manual,
}

/// How a member reaches and joins its leader.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = Rule::new("has(self.caCertHash) || has(self.caBundle) || self.insecureSkipCAVerification")
    .message("set caCertHash (the sha256:<hex> printed by `tether init`) or caBundle; insecureSkipCAVerification: true skips the check and is unsafe"))]
#[x_kube(validation = Rule::new("!has(oldSelf.clusterID) || (has(self.clusterID) && self.clusterID == oldSelf.clusterID)")
    .message("clusterID is immutable while the cluster is a member: leave the set first"))]
#[serde(rename_all = "camelCase")]
pub struct MemberSpec {
    /// The leader's API server URL (https).
    #[serde(rename = "leaderURL")]
    #[schemars(length(max = 2048))]
    #[x_kube(validation = Rule::new("isURL(self) && self.startsWith('https://')").message("leaderURL must be an https:// URL"))]
    pub leader_url: String,
    /// The set's home namespace on the leader, where registration requests go.
    #[serde(default = "default_leader_namespace")]
    #[schemars(regex(pattern = DNS1123_LABEL), length(min = 1, max = 63))]
    pub leader_namespace: String,
    /// Pin of the leader's CA: `sha256:` + hex SHA-256 of its SubjectPublicKeyInfo (kubeadm format).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = CA_CERT_HASH))]
    pub ca_cert_hash: Option<String>,
    /// PEM CA bundle that verifies the leader, as an alternative to the pin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 65536))]
    pub ca_bundle: Option<String>,
    /// Skip verifying the leader's CA. Unsafe: the join token may be sent to an impostor.
    #[serde(rename = "insecureSkipCAVerification", default)]
    pub insecure_skip_ca_verification: bool,
    /// Secret in this namespace holding the join (bootstrap) token.
    pub join_token_secret_ref: SecretKeyRef,
    /// This cluster's name in the set (DNS-1123 label, unique in the set).
    #[schemars(regex(pattern = DNS1123_LABEL), length(min = 1, max = MAX_CLUSTER_NAME))]
    pub cluster_name: String,
    /// Explicit cluster ID; defaults to the UID of the `kube-system` namespace.
    #[serde(rename = "clusterID", default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DNS1123_SUBDOMAIN), length(min = 1, max = MAX_CLUSTER_ID))]
    pub cluster_id: Option<String>,
    /// Labels the member asks to carry on the leader's ManagedCluster.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = MAX_LABELS))]
    #[x_kube(validation = Rule::new(LABELS_RULE).message("label keys must be at most 317 and values at most 63 characters"))]
    #[x_kube(validation = Rule::new(NO_RESERVED_LABELS_RULE).message(kube::core::cel::Message::Expression(NO_RESERVED_LABELS_MESSAGE.into())))]
    pub labels: std::collections::BTreeMap<String, String>,
}

/// A key of a Secret in the same namespace.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// Name of the Secret.
    #[schemars(regex(pattern = DNS1123_SUBDOMAIN), length(min = 1, max = 253))]
    pub name: String,
    /// Key in the Secret's data.
    #[serde(default = "default_token_key")]
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

fn default_leader_namespace() -> String {
    "tether-system".into()
}

fn default_token_key() -> String {
    "token".into()
}

/// Observed state of a ClusterSet, on the leader or on a member.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ClusterSetStatus {
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// One word for `kubectl get`: Active/Deleting on a leader; Joining/Ready/NotReady/Leaving on a member.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub state: Option<String>,
    /// Standard conditions (leader: Ready, DeletionBlocked; member: Registered, LeaderReachable, Ready).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
    /// Leader: member counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub members: Option<MemberCounts>,
    /// Leader: a bounded summary, members needing attention first; see `summaryTruncated`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_MEMBER_SUMMARY))]
    pub member_summary: Vec<MemberSummary>,
    /// Leader: true when more members exist than `memberSummary` lists.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub summary_truncated: bool,
    /// Member: this cluster's membership.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub membership: Option<Membership>,
}

/// Member counts of a set, kept by the leader.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct MemberCounts {
    /// Approved members.
    pub total: i32,
    /// Members whose Ready condition is True.
    pub ready: i32,
    /// Members whose Ready condition is False or Unknown.
    pub not_ready: i32,
    /// Registration requests still Pending.
    pub pending: i32,
}

/// One member in the leader's bounded summary.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MemberSummary {
    /// Cluster name.
    #[schemars(length(max = MAX_CLUSTER_NAME))]
    pub name: String,
    /// Cluster ID.
    #[serde(rename = "clusterID")]
    #[schemars(length(max = MAX_CLUSTER_ID))]
    pub cluster_id: String,
    /// The member's Ready condition status: True, False or Unknown.
    #[schemars(length(max = 16))]
    pub ready: String,
}

/// A member's view of its own membership.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Membership {
    /// The cluster ID this member registered with.
    #[serde(rename = "clusterID", default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_CLUSTER_ID))]
    pub cluster_id: Option<String>,
    /// The member's dedicated namespace on the leader.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub namespace: Option<String>,
    /// When the current leader credential expires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential_expiry: Option<Time>,
    /// Last successful heartbeat.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heartbeat_time: Option<Time>,
    /// The leader URL the agent uses when the leader published a new one (read over the
    /// connection verified with its CA) in place of `spec.member.leaderURL`.
    #[serde(rename = "leaderURL", default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 2048))]
    pub leader_url: Option<String>,
    /// The `spec.member.leaderURL` that `leaderURL` replaces; a spec changed since wins.
    #[serde(
        rename = "leaderURLReplaces",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(length(max = 2048))]
    pub leader_url_replaces: Option<String>,
    /// Pins (`sha256:` of the SubjectPublicKeyInfo) of the leader CAs the agent trusts now. A
    /// member joined by `caCertHash` trusts the bundle the leader publishes, and takes a new one
    /// only over a connection verified with these (a CA rotation, see docs/operations.md).
    #[serde(rename = "leaderCAs", default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(max = 71)))]
    pub leader_cas: Vec<String>,
}
