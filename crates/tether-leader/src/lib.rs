//! Tether's leader controller: approves member registrations, provisions each member's namespace,
//! identity and sealed credential, tracks member health from heartbeats, keeps ClusterSet status
//! and removes members and sets cleanly. `run` wires three controllers over shared caches; the
//! logic lives in pure modules (`policy`, `provision`, `health`, `status`).
//!
//! Every replica runs the controllers and keeps its caches warm; only the holder of the lease
//! (a `watch` of "am I leader", passed in) acts, and every write checks it (`write.rs`).

pub mod cleanup;
pub mod clusterset;
pub mod discovery;
pub mod health;
pub mod members;
pub mod metrics;
pub mod naming;
pub mod policy;
pub mod provision;
pub mod registration;
pub mod status;
pub mod write;

use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, predicates, watcher};
use kube::{Api, Client, ResourceExt};
use tether_api::clusterset::ClusterSetRole;
use tether_api::{ClusterRegistrationRequest, ClusterSet, ManagedCluster, MemberClusterAnnounce, labels};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

pub use metrics::Metrics;

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
}

/// Shared state of the leader's reconcilers.
pub struct Context {
    /// Client acting as the leader's ServiceAccount.
    pub client: Client,
    /// Every ClusterSet (Leader ones are used).
    pub sets: Store<ClusterSet>,
    /// Every ManagedCluster the leader created.
    pub clusters: Store<ManagedCluster>,
    /// Every member's heartbeat slot.
    pub announces: Store<MemberClusterAnnounce>,
    /// Every registration request.
    pub requests: Store<ClusterRegistrationRequest>,
    /// When each member last renewed, as this replica saw it.
    pub health: health::Tracker,
    /// Publishes Events.
    pub recorder: Recorder,
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
            self.requests.wait_until_ready()
        );
    }

    /// The Leader ClusterSet named `name`.
    // NB: set names are unique on a leader: member namespaces and labels carry only the name.
    pub fn leader_set(&self, name: &str) -> Option<Arc<ClusterSet>> {
        self.sets
            .state()
            .into_iter()
            .find(|s| s.name_any() == name && s.spec.role == ClusterSetRole::Leader)
    }
}

/// Errors of the leader's reconcilers.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An API call failed.
    #[error("{op} {name}: {source}")]
    Api {
        /// What was attempted.
        op: &'static str,
        /// The object.
        name: String,
        /// The cause.
        source: kube::Error,
    },
    /// The credential could not be sealed.
    #[error("seal credential: {0}")]
    Seal(#[from] tether_seal::SealError),
    /// An object could not be serialized.
    #[error("serialize: {0}")]
    Serialize(String),
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
    /// A bounded label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Error::Api { op, .. } => op,
            Error::Seal(_) => "seal",
            Error::Serialize(_) => "serialize",
            Error::NotLeader => "not_leader",
            Error::DeletionBlocked { .. } => "deletion_blocked",
            Error::Finalizer(e) => match e.as_ref() {
                kube::runtime::finalizer::Error::ApplyFailed(inner)
                | kube::runtime::finalizer::Error::CleanupFailed(inner) => inner.label(),
                _ => "finalizer",
            },
            Error::Invariant(_) => "invariant",
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
    ctx.metrics.reconcile_error(err.label());
    Action::requeue(Duration::from_secs(5))
}

/// A stream that emits each time this replica becomes the leader.
fn on_gaining(leader: watch::Receiver<bool>) -> impl Stream<Item = ()> + Send + 'static {
    futures::stream::unfold(leader, |mut rx| async move {
        loop {
            rx.changed().await.ok()?;
            if *rx.borrow_and_update() {
                return Some(((), rx));
            }
        }
    })
}

/// Drops what no controller reads from a cached object: `managedFields` is the bulk of a small
/// object's memory (a JSON tree per field manager), and caches hold one object per member.
fn slim<K: kube::Resource>(o: &mut K) {
    o.meta_mut().managed_fields = None;
}

/// As `slim`; of a ManagedCluster's status only the Ready condition is kept: the capacity,
/// nodes and versions the agent reports are for users, and no leader controller reads them.
fn slim_cluster(mc: &mut ManagedCluster) {
    slim(mc);
    if let Some(status) = mc.status.as_mut() {
        let conditions = std::mem::take(&mut status.conditions)
            .into_iter()
            .filter(|c| c.type_ == tether_api::conditions::READY)
            .collect();
        *status = tether_api::ManagedClusterStatus {
            conditions,
            ..Default::default()
        };
    }
}

/// Runs the leader's controllers until `shutdown` is cancelled.
pub async fn run(client: Client, opts: Options, shutdown: CancellationToken) {
    let cfg = controller::Config::default().concurrency(16);

    // Registration requests: the primary of the registration controller; its cache counts Pending.
    // NB: cached without the sealed credential, which the leader never reads back.
    let (requests, requests_writer) = reflector::store();
    let requests_stream = reflector::reflector(
        requests_writer,
        watcher(
            Api::<ClusterRegistrationRequest>::all(client.clone()),
            watcher::Config::default(),
        )
        .modify(|r: &mut ClusterRegistrationRequest| {
            slim(r);
            if let Some(status) = r.status.as_mut() {
                status.credential = None;
            }
        }),
    )
    .default_backoff()
    .touched_objects();
    // NB: no concurrency limit here: kube-runtime holds the reconciles it cannot start in a
    // HashSet and picks from it in hash order, which starved early requests for minutes at 3,000
    // simultaneous registrations (p99 226 s at p50 9 s). Reconciles of decided requests return at
    // once; Pending ones wait for a FIFO semaphore (`Context::provisioning`) instead.
    let registration =
        Controller::for_stream(requests_stream, requests.clone()).with_config(cfg.clone().concurrency(0));

    // ClusterSets: the primary of the set controller; status is throttled to once a second per
    // set, so a burst of member changes becomes one write a second.
    let sets_ctl = Controller::new(Api::<ClusterSet>::all(client.clone()), watcher::Config::default())
        .with_config(cfg.clone());
    let sets = sets_ctl.store();

    // ManagedClusters and announces: one watch each, shared by the member controller's trigger
    // and the caches the other controllers read.
    let selector = watcher::Config::default().labels(labels::CLUSTER_SET);
    let (clusters, clusters_writer) = reflector::store();
    let clusters_stream = reflector::reflector(
        clusters_writer,
        watcher(Api::<ManagedCluster>::all(client.clone()), selector.clone()).modify(slim_cluster),
    )
    .default_backoff()
    .touched_objects();
    let (announces, announces_writer) = reflector::store();
    let announces_stream = reflector::reflector(
        announces_writer,
        watcher(
            Api::<MemberClusterAnnounce>::all(client.clone()),
            selector.clone(),
        )
        .modify(slim),
    )
    .default_backoff()
    .touched_objects();

    let reporter = Reporter {
        controller: "tether-leader".into(),
        instance: opts.instance.clone(),
    };
    // NB: `Store::wait_until_ready` wakes only its latest waiter, so one task waits for the
    // caches and publishes the result on a watch channel that any number of reconciles can await.
    let (synced_tx, synced) = watch::channel(false);
    let ctx = Arc::new(Context {
        client: client.clone(),
        sets: sets.clone(),
        clusters: clusters.clone(),
        announces,
        requests: requests.clone(),
        health: health::Tracker::default(),
        recorder: Recorder::new(client.clone(), reporter),
        leader_ca: opts.leader_ca,
        metrics: opts.metrics,
        leader: opts.leader.clone(),
        synced,
        provisioning: tokio::sync::Semaphore::new(PROVISIONING_SLOTS),
        status_throttle: clusterset::Throttle::default(),
    });

    // A ClusterSet created or changed re-queues every request of its namespace.
    let requests_of_set = {
        let requests = requests.clone();
        move |set: ClusterSet| {
            let ns = set.namespace();
            requests
                .state()
                .into_iter()
                .filter(move |r| r.namespace() == ns)
                .map(|r| ObjectRef::from_obj(r.as_ref()))
                .collect::<Vec<_>>()
        }
    };
    // Only spec changes (generation) matter to requests; status writes, once a second while
    // members join, would otherwise re-queue every request each time.
    let set_specs = watcher(Api::<ClusterSet>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .touched_objects()
        .predicate_filter(predicates::generation, Default::default());
    let registration = registration
        .watches_stream(set_specs, requests_of_set)
        .reconcile_all_on(on_gaining(opts.leader.clone()))
        .graceful_shutdown_on(shutdown.clone().cancelled_owned())
        .run(registration::reconcile, error_policy, ctx.clone())
        .for_each(|_| async {});

    let members = Controller::for_stream(clusters_stream, clusters.clone())
        .with_config(cfg)
        .watches_stream(announces_stream, members::announce_owner)
        .reconcile_all_on(on_gaining(opts.leader.clone()))
        .graceful_shutdown_on(shutdown.clone().cancelled_owned())
        .run(members::reconcile, error_policy, ctx.clone())
        .for_each(|_| async {});

    // Member and request changes wake their set; the status is recomputed and written if changed.
    let set_of_member = {
        let ctx = ctx.clone();
        move |mc: ManagedCluster| {
            ctx.leader_set(&mc.spec.cluster_set)
                .map(|s| clusterset::set_ref(&s))
        }
    };
    let set_of_request = {
        let sets = sets.clone();
        move |r: ClusterRegistrationRequest| {
            clusterset::set_in(&sets, &r.namespace().unwrap_or_default()).map(|s| clusterset::set_ref(&s))
        }
    };
    let sets_ctl = sets_ctl
        .watches(
            Api::<ManagedCluster>::all(client.clone()),
            selector,
            set_of_member,
        )
        .watches(
            Api::<ClusterRegistrationRequest>::all(client.clone()),
            watcher::Config::default(),
            set_of_request,
        )
        .reconcile_all_on(on_gaining(opts.leader.clone()))
        .graceful_shutdown_on(shutdown.clone().cancelled_owned())
        .run(clusterset::reconcile, error_policy, ctx.clone())
        .for_each(|_| async {});

    // The discovery ConfigMap, published once this replica leads (retried until it works).
    let publish = {
        let ctx = ctx.clone();
        let url = opts.leader_url.clone();
        let mut leader = opts.leader.clone();
        async move {
            loop {
                if leader.wait_for(|l| *l).await.is_err() {
                    return;
                }
                match discovery::publish(&ctx.client, &ctx.leader_ca, &url).await {
                    Ok(()) => return,
                    Err(err) => warn!(
                        error = &err as &dyn std::error::Error,
                        "Cannot publish cluster-info; retrying"
                    ),
                }
                tokio::time::sleep(Duration::from_secs(10)).await;
            }
        }
    };
    let publish = tokio::spawn(publish);
    let ready = {
        let ctx = ctx.clone();
        async move {
            ctx.wait_caches().await;
            info!("Caches synced; ready");
            synced_tx.send_replace(true);
            opts.ready.send_replace(true);
        }
    };
    futures::join!(registration, members, sets_ctl, ready);
    publish.abort();
    info!("Leader controllers stopped");
}
