//! Tether's leader controller: approves member registrations and provisions each member's
//! namespace, identity and sealed credential. `run` wires the controller; the logic lives in
//! `policy` (decisions) and `provision` (desired objects), both pure.

pub mod metrics;
pub mod naming;
pub mod policy;
pub mod provision;
pub mod registration;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tether_api::{ClusterRegistrationRequest, ClusterSet, ManagedCluster};
use tracing::warn;

pub use metrics::Metrics;

/// What the leader controller needs to run.
pub struct Options {
    /// PEM CA bundle of this (the leader's) API server, handed to members in their credential.
    pub leader_ca: String,
    /// Name of this replica, for Events.
    pub instance: Option<String>,
}

/// Shared state of the leader's reconcilers.
pub struct Context {
    /// Client acting as the leader's ServiceAccount.
    pub client: Client,
    /// Every ClusterSet (Leader ones are used).
    pub sets: Store<ClusterSet>,
    /// Every ManagedCluster the leader created.
    pub clusters: Store<ManagedCluster>,
    /// Publishes Events.
    pub recorder: Recorder,
    /// PEM CA bundle of the leader's API server.
    pub leader_ca: String,
    /// Prometheus metrics.
    pub metrics: Metrics,
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
            Error::Invariant(_) => "invariant",
        }
    }
}

fn error_policy(req: Arc<ClusterRegistrationRequest>, err: &Error, ctx: Arc<Context>) -> Action {
    warn!(request = %req.name_any(), error = err as &dyn std::error::Error, "Reconcile failed; retrying");
    ctx.metrics.reconcile_error(err.label());
    Action::requeue(Duration::from_secs(5))
}

/// Runs the leader controller until `shutdown` resolves.
pub async fn run(client: Client, opts: Options, shutdown: impl Future<Output = ()> + Send + Sync + 'static) {
    let (sets, sets_writer) = reflector::store();
    let sets_stream = reflector::reflector(
        sets_writer,
        watcher(Api::<ClusterSet>::all(client.clone()), watcher::Config::default()),
    )
    .default_backoff()
    .touched_objects()
    .for_each(|_| async {});
    tokio::spawn(sets_stream);
    let (clusters, clusters_writer) = reflector::store();
    let cluster_cfg = watcher::Config::default().labels(tether_api::labels::CLUSTER_SET);
    let clusters_stream = reflector::reflector(
        clusters_writer,
        watcher(Api::<ManagedCluster>::all(client.clone()), cluster_cfg),
    )
    .default_backoff()
    .touched_objects()
    .for_each(|_| async {});
    tokio::spawn(clusters_stream);

    let reporter = Reporter {
        controller: "tether-leader".into(),
        instance: opts.instance.clone(),
    };
    let ctx = Arc::new(Context {
        client: client.clone(),
        sets: sets.clone(),
        clusters: clusters.clone(),
        recorder: Recorder::new(client.clone(), reporter),
        leader_ca: opts.leader_ca,
        metrics: Metrics::default(),
    });
    let controller = Controller::new(
        Api::<ClusterRegistrationRequest>::all(client),
        watcher::Config::default(),
    );
    let requests = controller.store();
    // NB: the stores must be complete before the first decision, or a duplicate could be approved.
    let (_, _) = futures::join!(sets.wait_until_ready(), clusters.wait_until_ready());
    // A ClusterSet created or changed after its requests re-queues every request of its namespace.
    let set_changed = move |set: ClusterSet| {
        let ns = set.namespace();
        requests
            .state()
            .into_iter()
            .filter(move |r| r.namespace() == ns)
            .map(|r| ObjectRef::from_obj(r.as_ref()))
            .collect::<Vec<_>>()
    };
    controller
        .watches(
            Api::<ClusterSet>::all(ctx.client.clone()),
            watcher::Config::default(),
            set_changed,
        )
        .graceful_shutdown_on(shutdown)
        .run(registration::reconcile, error_policy, ctx)
        .for_each(|_| async {})
        .await;
}
