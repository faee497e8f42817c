//! Tether's leader controller: approves member registrations, provisions each member's namespace,
//! identity and sealed credential, tracks member health from heartbeats, keeps ClusterSet status
//! and removes members and sets cleanly. `run` wires three controllers over shared caches; the
//! logic lives in pure modules (`policy`, `provision`, `health`, `status`).
//!
//! Every replica runs the controllers and keeps its caches warm; only the holder of the lease
//! (a `watch` of "am I leader", passed in) acts, and every write checks it (`write.rs`).

pub mod approval;
pub mod cleanup;
pub mod clusterset;
pub mod discovery;
pub mod health;
pub mod inventory;
pub mod members;
pub mod metrics;
pub mod naming;
pub mod policy;
pub mod provision;
pub mod proxy;
pub mod registration;
pub mod retention;
pub mod roles;
mod run;
pub mod skew;
pub mod status;
pub mod write;
pub mod written;

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, Resource, ResourceExt};
use tether_api::clusterset::ClusterSetRole;
use tether_api::{ClusterRegistrationRequest, ClusterSet, ManagedCluster, MemberClusterAnnounce, SetRef};
use tokio::sync::watch;
use tracing::warn;

pub use metrics::Metrics;
pub use run::run;

/// What the leader controller needs to run.
pub struct Options {
    /// PEM CA bundle of this (the leader's) API server, handed to members in their credential.
    pub leader_ca: String,
    /// Name of this replica, for Events.
    pub instance: Option<String>,
    /// Whether this replica holds the lease; only then does it write.
    pub leader: watch::Receiver<bool>,
    /// Set once the caches are complete (for `/readyz`).
    pub ready: watch::Sender<bool>,
    /// Where the controllers count what they do.
    pub metrics: Metrics,
    /// This API server's URL as members reach it, published with the CA in `kube-public/cluster-info`.
    pub leader_url: String,
    /// Member access (the aggregated proxy API), if served.
    pub proxy: Option<proxy::ProxyOptions>,
    /// How long a request the policy denied is kept (so its reason can be read) before it is
    /// deleted; an admin's denial is kept until someone deletes it.
    pub denied_retention: std::time::Duration,
    /// How long an approved request is kept before it is deleted, once its member heartbeat
    /// after it or its credential expired (retention.rs).
    pub approved_retention: std::time::Duration,
    /// Publish members as ClusterProfiles (the upstream CRD is installed).
    pub cluster_profiles: bool,
}

/// Shared state of the leader's reconcilers.
pub struct Context {
    /// Client acting as the leader's ServiceAccount.
    pub client: Client,
    /// Every ClusterSet (Leader ones are used).
    pub sets: Store<ClusterSet>,
    /// Every ManagedCluster the leader created.
    pub clusters: Store<ManagedCluster>,
    /// The member controller's status writes that `clusters` may not show yet.
    pub written_clusters: written::Written<ManagedCluster>,
    /// Every member's announce (its presence: a deleted announce is a member that left).
    pub announces: Store<MemberClusterAnnounce>,
    /// Every member's heartbeat Lease.
    pub leases: Store<Lease>,
    /// Asks the member controller to look at a member again (its tunnel changed): a
    /// ManagedCluster with only its name and namespace set.
    pub nudge: futures::channel::mpsc::UnboundedSender<ManagedCluster>,
    /// Every registration request.
    pub requests: Store<ClusterRegistrationRequest>,
    /// The registration controller's status writes that `requests` may not show yet.
    pub written_requests: written::Written<ClusterRegistrationRequest>,
    /// When each member last renewed, as this replica saw it.
    pub health: Arc<health::Tracker>,
    /// Publishes Events.
    pub events: write::Events,
    /// PEM CA bundle of the leader's API server.
    pub leader_ca: String,
    /// Prometheus metrics.
    pub metrics: Metrics,
    /// Whether this replica holds the lease.
    pub leader: watch::Receiver<bool>,
    /// True once every cache is complete.
    pub synced: watch::Receiver<bool>,
    /// Registrations provisioned at once, handed out first come, first served.
    pub provisioning: tokio::sync::Semaphore,
    /// Paces each set's status (`clusterset::STATUS_EVERY`).
    pub status_throttle: clusterset::Throttle,
    /// See `Options::denied_retention`.
    pub denied_retention: std::time::Duration,
    /// See `Options::approved_retention`.
    pub approved_retention: std::time::Duration,
}

/// How many registrations are provisioned at once. Each takes three round trips; more in flight
/// only queue in the API server.
pub const PROVISIONING_SLOTS: usize = 16;

impl Context {
    /// Whether this replica may write.
    pub fn is_leader(&self) -> bool {
        *self.leader.borrow()
    }

    /// Refuses a write when this replica is not the leader.
    pub fn ensure_leader(&self) -> Result<(), Error> {
        if self.is_leader() {
            Ok(())
        } else {
            Err(Error::NotLeader)
        }
    }

    /// Waits until every cache is complete: a decision on a partial cache could approve a duplicate.
    pub async fn wait_ready(&self) {
        let _ = self.synced.clone().wait_for(|synced| *synced).await;
    }

    /// Waits for the caches themselves (one waiter only; see `run`).
    async fn wait_caches(&self) {
        let _ = futures::join!(
            self.sets.wait_until_ready(),
            self.clusters.wait_until_ready(),
            self.announces.wait_until_ready(),
            self.leases.wait_until_ready(),
            self.requests.wait_until_ready()
        );
    }

    /// The Leader ClusterSet `set`.
    pub fn leader_set(&self, set: &SetRef) -> Option<Arc<ClusterSet>> {
        self.sets
            .get(&ObjectRef::new(&set.name).within(&set.namespace))
            .filter(|s| s.spec.role == ClusterSetRole::Leader)
    }

    /// The set a member belongs to, from its labels. NB: members approved before sets were
    /// keyed by namespace carry only the set name; such a member belongs to the one Leader set
    /// of that name, and to none while the name is ambiguous. A member whose set label disagrees
    /// with its spec (labels planted through a registration request before the leader refused
    /// reserved keys) belongs to no set.
    pub fn set_of(&self, mc: &ManagedCluster) -> Option<SetRef> {
        if let Some(set) = SetRef::from_labels(mc.labels()) {
            return (set.name == mc.spec.cluster_set).then_some(set);
        }
        let mut named = self
            .sets
            .state()
            .into_iter()
            .filter(|s| s.name_any() == mc.spec.cluster_set && s.spec.role == ClusterSetRole::Leader);
        match (named.next(), named.next()) {
            (Some(only), None) => Some(SetRef::of(&only)),
            _ => None,
        }
    }

    /// The live (not deleting) members of `set`.
    pub fn members_of(&self, set: &SetRef) -> Vec<Arc<ManagedCluster>> {
        self.clusters
            .state()
            .into_iter()
            .filter(|mc| mc.meta().deletion_timestamp.is_none() && self.set_of(mc).as_ref() == Some(set))
            .collect()
    }
}

/// Errors of the leader's reconcilers.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An API call failed.
    #[error("{verb} {kind} {}: {source}", write::object_name(namespace.as_deref(), name))]
    Api {
        /// What was attempted: `apply`, `patch status`, `delete`, `get`, `create token`...
        verb: &'static str,
        /// The object's kind.
        kind: Cow<'static, str>,
        /// Its namespace, if namespaced.
        namespace: Option<String>,
        /// Its name (a label selector for a collection).
        name: String,
        /// The cause (boxed: it is large, and every Result of the leader carries this type).
        source: Box<kube::Error>,
    },
    /// The credential could not be sealed.
    #[error("seal credential: {0}")]
    Seal(#[from] tether_seal::SealError),
    /// This replica lost the lease; it does not write.
    #[error("not the leader")]
    NotLeader,
    /// A ClusterSet's deletion waits for its members to leave.
    #[error("ClusterSet {name} still has {members} member(s)")]
    DeletionBlocked {
        /// The set.
        name: String,
        /// How many members remain.
        members: usize,
    },
    /// Adding or removing the finalizer failed.
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
    /// Something that cannot happen did.
    #[error("invariant violated: {0}")]
    Invariant(&'static str),
}

impl Error {
    /// An API call `verb` on object `name` of kind `K` in `namespace` failed.
    pub fn api<K: Resource<DynamicType = ()>>(
        verb: &'static str,
        namespace: Option<&str>,
        name: &str,
    ) -> impl FnOnce(kube::Error) -> Self {
        let (namespace, name) = (namespace.map(str::to_string), name.to_string());
        move |source| Error::Api {
            verb,
            kind: K::kind(&()),
            namespace,
            name,
            source: Box::new(source),
        }
    }

    /// A bounded label for metrics: the verb and kind of a failed call (`apply/Role`), else what
    /// failed.
    pub fn label(&self) -> Cow<'static, str> {
        match self {
            Error::Api { verb, kind, .. } => format!("{verb}/{kind}").into(),
            Error::Seal(_) => "seal".into(),
            Error::NotLeader => "not_leader".into(),
            Error::DeletionBlocked { .. } => "deletion_blocked".into(),
            Error::Finalizer(e) => match e.as_ref() {
                kube::runtime::finalizer::Error::ApplyFailed(inner)
                | kube::runtime::finalizer::Error::CleanupFailed(inner) => inner.label(),
                _ => "finalizer".into(),
            },
            Error::Invariant(_) => "invariant".into(),
        }
    }
}

fn error_policy<K: kube::Resource<DynamicType = ()>>(obj: Arc<K>, err: &Error, ctx: Arc<Context>) -> Action {
    match err {
        // Leadership regained re-runs every reconcile.
        Error::NotLeader => return Action::await_change(),
        Error::DeletionBlocked { .. } => return Action::requeue(clusterset::BLOCKED_RETRY),
        Error::Finalizer(e)
            if matches!(
                e.as_ref(),
                kube::runtime::finalizer::Error::CleanupFailed(Error::DeletionBlocked { .. })
            ) =>
        {
            return Action::requeue(clusterset::BLOCKED_RETRY);
        }
        _ => {}
    }
    warn!(kind = %K::kind(&()), object = %write::key(obj.as_ref()), error = err as &dyn std::error::Error,
          "Reconcile failed; retrying");
    ctx.metrics.reconcile_error(&err.label());
    Action::requeue(Duration::from_secs(5))
}

/// Drops what no controller reads from a cached object: `managedFields` is the bulk of a small
/// object's memory (a JSON tree per field manager), and caches hold one object per member.
fn slim<K: kube::Resource>(o: &mut K) {
    o.meta_mut().managed_fields = None;
}

/// Of a member's heartbeat Lease only what the leader reads: its name, namespace, renewal,
/// duration and the interval annotations it sets (each at most `MAX_LEASE_ANNOTATION` bytes).
/// NB: the agent may patch its own Lease as it likes (labels, annotations, holder); what it
/// adds there must not grow the leader's cache.
pub(crate) fn slim_lease(lease: &mut k8s_openapi::api::coordination::v1::Lease) {
    const MAX_LEASE_ANNOTATION: usize = 32;
    let meta = &mut lease.metadata;
    meta.managed_fields = None;
    meta.labels = None;
    meta.owner_references = None;
    meta.finalizers = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.retain(|k, v| {
            crate::provision::LEASE_ANNOTATIONS.contains(&k.as_str()) && v.len() <= MAX_LEASE_ANNOTATION
        });
    }
    if let Some(spec) = lease.spec.as_mut() {
        *spec = k8s_openapi::api::coordination::v1::LeaseSpec {
            renew_time: spec.renew_time.take(),
            lease_duration_seconds: spec.lease_duration_seconds,
            ..Default::default()
        };
    }
}

/// As `slim`; of a ManagedCluster's status only the Ready condition is kept: the capacity,
/// nodes and versions the agent reports are for users, and no leader controller reads them.
/// What the ClusterProfile publisher reads of a member, besides what `slim_cluster` keeps: its
/// Kubernetes version, platform, capacity and allocatable resources, ClusterProperties, and the
/// health it reports.
/// Most bytes (names and values) of a member's reported ClusterProperties the leader caches.
/// NB: a member writes its own status: the CRD allows 64 properties of up to 1,024 characters,
/// which 10,000 members could make 800 MiB of cache; this bounds it to 40 MiB.
const MAX_CACHED_PROPERTY_BYTES: usize = 4096;

/// The properties, in order, as long as their names and values fit `MAX_CACHED_PROPERTY_BYTES`.
fn bounded_properties(
    all: Vec<tether_api::managedcluster::PropertyValue>,
) -> Vec<tether_api::managedcluster::PropertyValue> {
    let mut used = 0;
    all.into_iter()
        .take_while(|p| {
            used += p.name.len() + p.value.len();
            used <= MAX_CACHED_PROPERTY_BYTES
        })
        .collect()
}

fn slim_cluster_for_inventory(mc: &mut ManagedCluster) {
    let full = mc.status.clone();
    slim_cluster(mc);
    if let (Some(status), Some(full)) = (mc.status.as_mut(), full) {
        status.kubernetes_version = full.kubernetes_version;
        status.platform = full.platform;
        status.capacity = full.capacity;
        status.allocatable = full.allocatable;
        status.properties = bounded_properties(full.properties);
        status.conditions.extend(
            full.conditions
                .into_iter()
                .filter(|c| c.type_ == tether_api::conditions::ConditionType::ApiServerHealthy),
        );
    }
}

fn slim_cluster(mc: &mut ManagedCluster) {
    slim(mc);
    if let Some(status) = mc.status.as_mut() {
        let conditions = std::mem::take(&mut status.conditions)
            .into_iter()
            .filter(|c| {
                c.type_ == tether_api::conditions::ConditionType::Ready
                    || c.type_ == tether_api::conditions::ConditionType::TunnelConnected
                    || c.type_ == tether_api::conditions::ConditionType::AgentVersionSupported
            })
            .collect();
        // NB: the agent's version stays for the skew check (`skew.rs`), the last heartbeat for
        // when a member's approved request may go (`retention.rs`).
        *status = tether_api::ManagedClusterStatus {
            conditions,
            agent_version: status.agent_version.take(),
            last_heartbeat_time: status.last_heartbeat_time.take(),
            ..Default::default()
        };
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    #[test]
    fn a_member_cannot_grow_the_leaders_cache_with_properties() {
        let big: Vec<_> = (0..64)
            .map(|i| tether_api::managedcluster::PropertyValue {
                name: format!("p{i:02}.example.com"),
                value: "v".repeat(1024),
            })
            .collect();
        let kept = super::bounded_properties(big.clone());
        let bytes: usize = kept.iter().map(|p| p.name.len() + p.value.len()).sum();
        assert_eq!(kept.len(), 3, "{bytes} bytes");
        assert_eq!(kept[..], big[..3], "the first ones, in order");
        let small = big[..2]
            .iter()
            .map(|p| tether_api::managedcluster::PropertyValue {
                value: "v".into(),
                ..p.clone()
            })
            .collect::<Vec<_>>();
        assert_eq!(super::bounded_properties(small.clone()), small);
    }

    #[test]
    fn a_cached_lease_keeps_only_what_the_leader_reads() {
        use k8s_openapi::api::coordination::v1::Lease;
        let mut lease: Lease = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "east", "namespace": "ns",
                "labels": {"multicluster.tether.dev/clusterset": "prod", "junk": "x"},
                "annotations": {
                    tether_api::annotations::HEARTBEAT_INTERVAL: "10",
                    tether_api::annotations::TUNNEL_PING_INTERVAL: "5".repeat(64),
                    "junk": "y".repeat(100_000)}},
            "spec": {"holderIdentity": "h".repeat(100_000), "leaseDurationSeconds": 40,
                     "renewTime": "2026-12-04T10:00:00.000000Z"}}))
        .expect("lease");
        super::slim_lease(&mut lease);
        let a = lease.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(a.len(), 1, "only the intervals, and none oversized: {a:?}");
        assert_eq!(
            a.get(tether_api::annotations::HEARTBEAT_INTERVAL)
                .map(String::as_str),
            Some("10")
        );
        assert!(lease.metadata.labels.is_none());
        let spec = lease.spec.expect("spec");
        assert!(spec.holder_identity.is_none());
        assert_eq!(spec.lease_duration_seconds, Some(40));
        assert!(spec.renew_time.is_some());
        assert_eq!(lease.metadata.name.as_deref(), Some("east"));
    }

    use super::Context;

    /// The size of the future `f` returns: what one reconcile of its kind holds while it waits.
    fn future_size<K, F, Fut>(_: F) -> usize
    where
        F: Fn(Arc<K>, Arc<Context>) -> Fut,
    {
        std::mem::size_of::<Fut>()
    }

    /// A new leader starts one registration reconcile per listed request (that controller has no
    /// concurrency limit) and each waits for the caches first: what one holds while it waits
    /// is multiplied by the requests. The member and set controllers run at most 16 at once.
    #[test]
    fn registration_reconciles_waiting_for_the_caches_are_small() {
        let sizes = [
            ("registration", future_size(crate::registration::reconcile)),
            ("member", future_size(crate::members::reconcile)),
            ("clusterset", future_size(crate::clusterset::reconcile)),
        ];
        eprintln!("reconcile future sizes (bytes): {sizes:?}");
        assert!(sizes[0].1 <= 1024, "{sizes:?}");
    }
}
