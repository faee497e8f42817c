//! Tether's member agent. It is configured by a Member ClusterSet in its namespace (written by the
//! chart or `tether join`); for each one it runs a session (session.rs) that trusts the leader by
//! pin before sending anything, registers with the join token, then heartbeats, reports status
//! and renews its credential as its own ServiceAccount on the leader. Deleting the ClusterSet
//! (finalizer) deregisters at the leader and removes what the agent created here.
//!
//! Only the replica holding the Lease runs sessions; the others keep their cache warm.

pub mod endpoint;
pub mod heartbeat;
mod leave;
pub mod link;
pub mod metrics;
pub mod register;
pub mod rejoin;
pub mod renewal;
pub mod report;
pub mod reporter;
pub mod session;
pub mod state;
pub mod status;
#[cfg(test)]
mod testing;
pub mod tunnel;
pub mod view;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use tether_api::clusterset::ClusterSetRole;
use tether_api::conditions::{EventReason, Reason};
use tether_api::{AGENT_FINALIZER, ClusterSet, ClusterSetStatus};
use tether_join::discovery;
use tokio::sync::{Mutex, watch};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

pub use leave::deregister;
pub use metrics::Metrics;

/// The field manager of everything the agent writes.
pub const FIELD_MANAGER: &str = "tether-agent";
/// The agent's version, reported in requests and ManagedCluster status.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// What the agent needs to run.
pub struct Options {
    /// The namespace of its Member ClusterSet, Secrets and Lease.
    pub namespace: String,
    /// This replica's name, for Events.
    pub instance: Option<String>,
    /// Whether this replica holds the lease.
    pub leader: watch::Receiver<bool>,
    /// Set once the cache is synced (for `/readyz`).
    pub ready: watch::Sender<bool>,
    /// Metrics.
    pub metrics: Metrics,
    /// The member API server URL as the agent reaches it (reported to the leader).
    pub api_server_url: String,
    /// How long a registration may wait for the leader's decision before retrying.
    pub registration_timeout: Duration,
    /// How long leaving tries to deregister at an unreachable leader before giving up.
    pub leave_timeout: Duration,
    /// How often the leader's published URL is re-read, to follow a change of its address.
    pub leader_url_check: Duration,
    /// How the tunnel reaches this member's API server; None: no tunnel (members stay
    /// unreachable through the leader).
    pub access: Option<tunnel::MemberAccess>,
}

struct Running {
    generation: Option<i64>,
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

/// Shared state of the agent.
pub struct Context {
    /// Client of the member cluster (the agent's own ServiceAccount).
    pub client: Client,
    /// The agent's namespace.
    pub namespace: String,
    /// Member ClusterSets in that namespace.
    pub sets: Store<ClusterSet>,
    /// Metrics.
    pub metrics: Metrics,
    /// The member API server URL.
    pub api_server_url: String,
    /// See `Options::registration_timeout`.
    pub registration_timeout: Duration,
    leave_timeout: Duration,
    leader_url_check: Duration,
    /// See `Options::access`.
    pub access: Option<tunnel::MemberAccess>,
    recorder: Recorder,
    leader: watch::Receiver<bool>,
    sessions: Mutex<HashMap<String, Running>>,
}

/// Errors of the agent.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The leader is not trusted or not reachable for discovery.
    #[error(transparent)]
    Discovery(#[from] discovery::DiscoveryError),
    /// A call to the member API server failed.
    #[error("{op} {name}: {source}")]
    Member {
        /// What was attempted.
        op: &'static str,
        /// The object.
        name: String,
        /// The cause.
        source: kube::Error,
    },
    /// A call to the leader failed (network, server error).
    #[error("{op} at the leader: {source}")]
    Leader {
        /// What was attempted.
        op: &'static str,
        /// The cause.
        source: kube::Error,
    },
    /// The join token Secret is missing or empty.
    #[error(
        "join token Secret {secret} (key {key}) is missing or empty: create it, or run `tether join` again"
    )]
    JoinTokenMissing {
        /// The Secret.
        secret: String,
        /// The key.
        key: String,
    },
    /// The leader rejected the join token (expired or deleted).
    #[error(
        "the leader rejected the join token (expired or deleted): create a new one on the leader with \
         `tether token create` and update the join token Secret"
    )]
    JoinTokenRejected,
    /// The join token may not register here.
    #[error("the join token may not register in this set ({0}): check the set name and leaderNamespace")]
    JoinTokenForbidden(String),
    /// The leader denied the registration.
    #[error("registration denied ({reason}): {message}")]
    Denied {
        /// The machine-readable reason.
        reason: String,
        /// The leader's explanation.
        message: String,
    },
    /// The leader did not decide in time.
    #[error("registration request {request} still pending: {message}")]
    RegistrationTimeout {
        /// The request.
        request: String,
        /// Its last message.
        message: String,
    },
    /// The leader no longer accepts the credential.
    #[error("credential rejected: {0}")]
    CredentialRejected(String),
    /// The leader will not give this member a new credential for its key (removed, banned, or
    /// rejoining is not served there): the agent registers with its join token instead.
    #[error("cannot rejoin with the member's key: {0}")]
    RejoinRefused(String),
    /// The leader published a new URL (read over a verified connection): the session starts again on it.
    #[error("the leader moved to {0}")]
    LeaderMoved(String),
    /// The leader published a new CA bundle (read over a verified connection): the session
    /// starts again trusting it.
    #[error("the leader's CA bundle changed")]
    LeaderCAChanged,
    /// The leader could not answer a rejoin now (its API server or its proxy API is down).
    #[error("cannot reach the leader to rejoin: {0}")]
    RejoinUnreachable(#[source] tunnel::Cause),
    /// The credential could not be unsealed.
    #[error("cannot unseal the credential: {0}")]
    Seal(#[from] tether_seal::SealError),
    /// The explicit cluster ID disagrees with the recorded one.
    #[error(
        "spec.clusterID {explicit} differs from the cluster's recorded ID {property} (ClusterProperty \
         cluster.clusterset.k8s.io): use that ID, or delete the ClusterProperty if the cluster really changed"
    )]
    ClusterIdConflict {
        /// The spec's value.
        explicit: String,
        /// The property's value.
        property: String,
    },
    /// Adding or removing the finalizer failed.
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
    /// Something that cannot happen did.
    #[error("invariant violated: {0}")]
    Invariant(&'static str),
}

impl Error {
    /// A bounded label for metrics and logs: what failed.
    pub fn label(&self) -> &'static str {
        match self {
            Error::Discovery(discovery::DiscoveryError::PinMismatch { .. }) => "pin_mismatch",
            Error::Discovery(_) | Error::Leader { .. } | Error::RejoinUnreachable(_) => "leader_unreachable",
            Error::Member { .. } => "member_api",
            Error::JoinTokenMissing { .. } => "join_token_missing",
            Error::JoinTokenRejected => "join_token_expired",
            Error::JoinTokenForbidden(_) => "join_token_forbidden",
            Error::Denied { .. } => "denied",
            Error::RegistrationTimeout { .. } => "registration_timeout",
            Error::CredentialRejected(_) => "credential_rejected",
            Error::RejoinRefused(_) => "rejoin_refused",
            Error::LeaderMoved(_) => "leader_moved",
            Error::LeaderCAChanged => "leader_ca_changed",
            Error::Seal(_) => "seal",
            Error::ClusterIdConflict { .. } => "cluster_id_conflict",
            Error::Finalizer(_) => "finalizer",
            Error::Invariant(_) => "invariant",
        }
    }

    /// A failed call `op` to the leader with the member's credential: `CredentialRejected` when
    /// the leader no longer accepts this identity (401, 403, 404), else `Leader`.
    pub fn rejected(op: &'static str, e: kube::Error) -> Self {
        match &e {
            kube::Error::Api(s) if matches!(s.code, 401 | 403 | 404) => {
                Error::CredentialRejected(format!("{op}: {} {}", s.code, s.message))
            }
            _ => Error::Leader { op, source: e },
        }
    }
}

impl Context {
    fn is_leader(&self) -> bool {
        *self.leader.borrow()
    }

    /// Publishes an Event about the member ClusterSet.
    pub async fn event(&self, set: &ClusterSet, warning: bool, reason: EventReason, note: &str) {
        let ev = Event {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.as_str().into(),
            note: Some(note.chars().take(1000).collect()),
            action: "Membership".into(),
            secondary: None,
        };
        if let Err(err) = self.recorder.publish(&ev, &set.object_ref(&())).await {
            warn!(error = &err as &dyn std::error::Error, "Cannot publish event");
        }
    }

    /// Writes the member ClusterSet's status (server-side apply, the agent's fields only).
    pub async fn write_status(&self, set: &ClusterSet, status: &ClusterSetStatus) -> Result<(), Error> {
        if !self.is_leader() {
            return Ok(());
        }
        let api = Api::<ClusterSet>::namespaced(self.client.clone(), &self.namespace);
        api.patch_status(
            &set.name_any(),
            &PatchParams::apply(FIELD_MANAGER).force(),
            &tether_api::status_apply::<ClusterSet, _>(status),
        )
        .await
        .map_err(|source| Error::Member {
            op: "patch ClusterSet status",
            name: set.name_any(),
            source,
        })?;
        Ok(())
    }

    async fn ensure_session(self: &Arc<Self>, set: Arc<ClusterSet>) {
        let uid = set.uid().unwrap_or_default();
        let mut sessions = self.sessions.lock().await;
        if let Some(r) = sessions.get(&uid)
            && r.generation == set.metadata.generation
            && !r.task.is_finished()
        {
            return;
        }
        if let Some(old) = sessions.remove(&uid) {
            old.cancel.cancel();
            let _ = old.task.await;
        }
        info!(set = %set.name_any(), generation = ?set.metadata.generation, "Starting member session");
        let cancel = CancellationToken::new();
        let task = tokio::spawn(session::run(self.clone(), set.clone(), cancel.clone()));
        sessions.insert(
            uid,
            Running {
                generation: set.metadata.generation,
                cancel,
                task,
            },
        );
    }

    async fn stop_sessions(&self, uid: Option<&str>) {
        let mut sessions = self.sessions.lock().await;
        let keys: Vec<String> = sessions
            .keys()
            .filter(|k| uid.is_none_or(|u| u == *k))
            .cloned()
            .collect();
        for k in keys {
            if let Some(r) = sessions.remove(&k) {
                r.cancel.cancel();
                let _ = r.task.await;
            }
        }
    }
}

async fn reconcile(set: Arc<ClusterSet>, ctx: Arc<Context>) -> Result<Action, Error> {
    if set.spec.role != ClusterSetRole::Member {
        return Ok(Action::await_change());
    }
    if !ctx.is_leader() {
        ctx.stop_sessions(None).await;
        return Ok(Action::await_change());
    }
    let api = Api::<ClusterSet>::namespaced(ctx.client.clone(), &ctx.namespace);
    finalizer(&api, AGENT_FINALIZER, set, |ev| async {
        match ev {
            Finalizer::Apply(set) => {
                ctx.ensure_session(set).await;
                Ok(Action::requeue(Duration::from_secs(60)))
            }
            Finalizer::Cleanup(set) => {
                ctx.stop_sessions(set.uid().as_deref()).await;
                leave::leave(&ctx, &set).await?;
                Ok(Action::await_change())
            }
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)))
}

fn error_policy(set: Arc<ClusterSet>, err: &Error, _ctx: Arc<Context>) -> Action {
    warn!(set = %set.name_any(), error = err as &dyn std::error::Error, "Reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
}

/// How often an agent without a membership says so in its log.
const NOT_JOINED_EVERY: Duration = Duration::from_secs(600);

/// Runs the agent until `shutdown` is cancelled.
pub async fn run(client: Client, opts: Options, shutdown: CancellationToken) {
    let api = Api::<ClusterSet>::namespaced(client.clone(), &opts.namespace);
    // NB: not `Controller::new`: its own watch hands out a list's objects before caching them,
    // and a set created while the watch was down would be dropped (tether_process::streams).
    let mut watch = tether_process::streams::watch(api, watcher::Config::default(), |_| {}, None);
    let controller = Controller::for_stream(watch.subscribe(), watch.store());
    let sets = watch.store();
    let watching = watch.start();
    let reporter = Reporter {
        controller: "tether-agent".into(),
        instance: opts.instance.clone(),
    };
    let ctx = Arc::new(Context {
        client: client.clone(),
        namespace: opts.namespace.clone(),
        sets: sets.clone(),
        metrics: opts.metrics,
        api_server_url: opts.api_server_url,
        registration_timeout: opts.registration_timeout,
        leave_timeout: opts.leave_timeout,
        leader_url_check: opts.leader_url_check,
        access: opts.access,
        recorder: Recorder::new(client, reporter),
        leader: opts.leader.clone(),
        sessions: Mutex::default(),
    });
    let gained = tether_process::leadership::gained(opts.leader.clone());
    // Losing the lease stops every session at once.
    let lost = {
        let ctx = ctx.clone();
        tether_process::leadership::lost(opts.leader.clone()).for_each(move |()| {
            let ctx = ctx.clone();
            async move { ctx.stop_sessions(None).await }
        })
    };
    let lost = tokio::spawn(lost);
    let ready = opts.ready;
    let namespace = opts.namespace.clone();
    // NB: `Store::wait_until_ready` wakes only its latest waiter, and the controller waits on
    // this store too: a single wait here may never wake (the agent stayed unready for ever), so
    // poll it again until it is ready.
    let ready_task = tokio::spawn(async move {
        loop {
            match tokio::time::timeout(Duration::from_millis(250), sets.wait_until_ready()).await {
                Ok(Ok(())) => {
                    info!("Cache synced; ready");
                    ready.send_replace(true);
                    break;
                }
                Ok(Err(_)) => return,
                Err(_) => {}
            }
        }
        // An agent installed without a membership idles until `tether join` gives it one.
        loop {
            let joined = sets.state().iter().any(|s| s.spec.role == ClusterSetRole::Member);
            if !joined {
                info!(
                    reason = Reason::NotJoined.as_str(),
                    "Registered=False (NotJoined): this cluster has not joined a ClusterSet; run `tether join \
                     --config-file join.yaml --name <CLUSTER-NAME> -n {namespace}` with the file `tether init \
                     --output join.yaml` wrote on the leader"
                );
            }
            tokio::time::sleep(NOT_JOINED_EVERY).await;
        }
    });
    controller
        .reconcile_all_on(gained)
        .graceful_shutdown_on(shutdown.cancelled_owned())
        .run(reconcile, error_policy, ctx.clone())
        .for_each(|_| async {})
        .await;
    ctx.stop_sessions(None).await;
    lost.abort();
    ready_task.abort();
    watching.abort();
    info!("Agent stopped");
}
