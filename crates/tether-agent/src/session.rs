//! One member ClusterSet's life while it exists: trust the leader (discovery.rs), register if
//! there is no valid credential (register.rs), then heartbeat, report ManagedCluster status only
//! when it changed, and renew the credential before it expires — all with the member's own
//! credential. A rejected credential (revoked, expired, namespace gone) drops it and registers
//! again with the join token; other failures retry with capped backoff and say why in status.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Node, Secret, ServiceAccount};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use rand::Rng;
use serde_json::json;
use tether_api::clusterset::MemberSpec;
use tether_api::{ClusterSet, ManagedCluster, MemberClusterAnnounce, properties};
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::discovery::{self, Trust};
use crate::register::{Registration, Target, register};
use crate::report::{Report, summarize, worth_writing};
use crate::state::{self, Stored};
use crate::view::{View, time};
use crate::{Context, Error, FIELD_MANAGER};

/// A full ManagedCluster status refresh happens at least this often, changed or not.
const FULL_REFRESH: Duration = Duration::from_secs(300);
/// How often the member API server's health is checked.
const HEALTH_EVERY: Duration = Duration::from_secs(30);
/// The heartbeat time in the member status is refreshed at most this often.
const HEARTBEAT_STATUS_EVERY: Duration = Duration::from_secs(60);
/// Longest wait between retries.
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// Shared by the loops of one session.
struct Shared {
    ctx: Arc<Context>,
    set: Arc<ClusterSet>,
    view: Mutex<View>,
    last_heartbeat_published: Mutex<Option<Instant>>,
    written: tokio::sync::Mutex<Option<tether_api::ClusterSetStatus>>,
}

/// Runs the session of `set` until `cancel`.
pub async fn run(ctx: Arc<Context>, set: Arc<ClusterSet>, cancel: CancellationToken) {
    let shared = Arc::new(Shared {
        ctx,
        set,
        view: Mutex::default(),
        last_heartbeat_published: Mutex::default(),
        written: tokio::sync::Mutex::default(),
    });
    let mut backoff = Duration::from_secs(1);
    loop {
        let result = tokio::select! {
            _ = cancel.cancelled() => return,
            r = serve(&shared) => r,
        };
        let Err(err) = result else { return };
        let retry_now = matches!(err, Error::CredentialRejected(_));
        record_failure(&shared, &err).await;
        if retry_now {
            // NB: drop the dead credential and register again at once with the join token.
            let ns = &shared.ctx.namespace;
            if let Err(e) = state::delete_secret(&shared.ctx.client, ns, state::CREDENTIAL_SECRET).await {
                warn!(
                    error = &e as &dyn std::error::Error,
                    "Cannot delete the rejected credential"
                );
            }
            backoff = Duration::from_secs(1);
            continue;
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

fn spec(set: &ClusterSet) -> Result<&MemberSpec, Error> {
    set.spec
        .member
        .as_ref()
        .ok_or(Error::Invariant("a Member ClusterSet without spec.member"))
}

/// Connects, registers if needed, then serves until an error.
async fn serve(sh: &Arc<Shared>) -> Result<(), Error> {
    let ctx = &sh.ctx;
    let spec = spec(&sh.set)?;
    let trust = discovery::trust_for(spec).await?;
    let verified = match &trust {
        Trust::Ca(_) if spec.ca_bundle.is_some() => {
            (true, "CABundle", "the leader is verified with caBundle".into())
        }
        Trust::Ca(_) => (true, "PinMatched", "the leader's CA matches caCertHash".into()),
        Trust::Insecure => {
            warn!(
                "insecureSkipCAVerification is set: the leader is NOT verified; the join token may reach an impostor"
            );
            (
                false,
                "InsecureSkipCAVerification",
                "UNSAFE: the leader's CA is not verified".into(),
            )
        }
    };
    update(sh, |v| v.ca_verified = Some(verified)).await;

    let cluster_id = state::cluster_id(&ctx.client, spec.cluster_id.as_deref()).await?;
    let (identity, recipient) = state::key_pair(&ctx.client, &ctx.namespace).await?;
    let stored = match state::load_credential(&ctx.client, &ctx.namespace).await? {
        Some(s) if !expired(&s) => s,
        _ => {
            update(sh, |v| {
                v.registered = Some((false, "Registering", "waiting for the leader's decision".into()))
            })
            .await;
            let token = join_token(ctx, spec).await?;
            let bootstrap =
                Client::try_from(discovery::leader_config(&spec.leader_url, &trust, Some(&token))?).map_err(
                    |source| Error::Leader {
                        op: "build client",
                        source,
                    },
                )?;
            let reg = Registration {
                cluster_id: &cluster_id,
                cluster_name: &spec.cluster_name,
                labels: spec.labels.clone(),
                identity: &identity,
                recipient: &recipient,
            };
            let target = Target {
                bootstrap,
                namespace: &spec.leader_namespace,
            };
            let stored = register(&target, &reg, ctx.registration_timeout).await;
            ctx.metrics
                .registration(if stored.is_ok() { "Approved" } else { "Failed" });
            let stored = stored?;
            state::store_credential(&ctx.client, &ctx.namespace, &stored).await?;
            ctx.event(
                &sh.set,
                false,
                "Registered",
                &format!("joined; namespace {} on the leader", stored.credential.namespace),
            )
            .await;
            stored
        }
    };
    let namespace = stored.credential.namespace.clone();
    update(sh, |v| {
        v.registered = Some((true, "Approved", format!("namespace {namespace} on the leader")));
        v.membership.cluster_id = Some(cluster_id.clone());
        v.membership.namespace = Some(namespace.clone());
        v.membership.credential_expiry = expiry(&stored).map(time);
    })
    .await;
    state::write_property(&ctx.client, properties::CLUSTER_ID, &cluster_id).await?;
    state::write_property(&ctx.client, properties::CLUSTER_SET, &sh.set.name_any()).await?;

    let leader_trust = match &trust {
        Trust::Insecure => Trust::Insecure,
        Trust::Ca(ca) => Trust::Ca(ca.clone()),
    };
    let (client_tx, client_rx) = watch::channel(leader_client(spec, &leader_trust, &stored)?);
    let name = spec.cluster_name.clone();
    tokio::try_join!(
        heartbeat(sh, client_rx.clone(), &namespace, &name),
        report(sh, client_rx, &namespace, &name),
        renew(sh, spec, &leader_trust, stored.clone(), client_tx),
    )?;
    Ok(())
}

async fn join_token(ctx: &Context, spec: &MemberSpec) -> Result<String, Error> {
    let r = &spec.join_token_secret_ref;
    let secret = Api::<Secret>::namespaced(ctx.client.clone(), &ctx.namespace)
        .get_opt(&r.name)
        .await
        .map_err(|source| Error::Member {
            op: "read join token Secret",
            name: r.name.clone(),
            source,
        })?;
    secret
        .and_then(|s| state::secret_text(&s, &r.key))
        .filter(|t| !t.trim().is_empty())
        .map(|t| t.trim().to_string())
        .ok_or_else(|| Error::JoinTokenMissing {
            secret: r.name.clone(),
            key: r.key.clone(),
        })
}

fn expiry(s: &Stored) -> Option<Timestamp> {
    s.credential.expiration_timestamp.parse().ok()
}

fn expired(s: &Stored) -> bool {
    expiry(s).is_none_or(|e| e <= Timestamp::now() + k8s_openapi::jiff::SignedDuration::from_secs(30))
}

fn leader_client(spec: &MemberSpec, trust: &Trust, s: &Stored) -> Result<Client, Error> {
    let config = discovery::leader_config(&spec.leader_url, trust, Some(&s.credential.token))?;
    Client::try_from(config).map_err(|source| Error::Leader {
        op: "build client",
        source,
    })
}

/// How long 403s are taken for RBAC still on its way rather than a revoked identity. The leader
/// binds the member's Role before it approves, but each API server authorizes from a cache fed
/// by a watch, which lags under load (seen at 1,000 simultaneous registrations).
pub const RBAC_SETTLE: Duration = Duration::from_secs(30);

/// Tells a 403 that may still pass (within `RBAC_SETTLE` of the first one in a row) from one
/// that means the leader took the grant away.
#[derive(Debug, Default)]
pub struct Forbidden {
    since: Option<Instant>,
}

impl Forbidden {
    /// Whether `e` is a 403 to retry; any other outcome starts the count again.
    pub fn tolerate(&mut self, e: &kube::Error) -> bool {
        self.tolerate_at(e, Instant::now())
    }

    fn tolerate_at(&mut self, e: &kube::Error, now: Instant) -> bool {
        match e {
            kube::Error::Api(s) if s.code == 403 => {
                now.saturating_duration_since(*self.since.get_or_insert(now)) < RBAC_SETTLE
            }
            _ => {
                self.since = None;
                false
            }
        }
    }

    /// A call succeeded.
    pub fn clear(&mut self) {
        self.since = None;
    }
}

/// A credential error: the leader no longer accepts this identity.
fn rejected(op: &'static str, e: kube::Error) -> Error {
    match &e {
        kube::Error::Api(s) if matches!(s.code, 401 | 403 | 404) => {
            Error::CredentialRejected(format!("{op}: {} {}", s.code, s.message))
        }
        _ => Error::Leader { op, source: e },
    }
}

/// One heartbeat: renews the announce `name` with `now` (one small write) and returns the
/// interval the leader asks for until the next one.
pub async fn beat(
    api: &Api<MemberClusterAnnounce>,
    name: &str,
    now: Timestamp,
) -> Result<Duration, kube::Error> {
    let pp = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    let body = json!({"spec": {"renewTime": now.to_string()}});
    let mca = api.patch(name, &pp, &Patch::Merge(body)).await?;
    Ok(Duration::from_secs(
        mca.spec.heartbeat_interval_seconds.unwrap_or(10).max(1) as u64,
    ))
}

/// `interval` ±10%, so that members started together do not heartbeat in lockstep.
pub fn jittered(interval: Duration) -> Duration {
    let factor = rand::rng().random_range(0.9..1.1);
    interval.mul_f64(factor)
}

async fn heartbeat(
    sh: &Arc<Shared>,
    client: watch::Receiver<Client>,
    ns: &str,
    name: &str,
) -> Result<(), Error> {
    let mut interval = Duration::from_secs(10);
    let mut failures: u32 = 0;
    let mut forbidden = Forbidden::default();
    loop {
        let api = Api::<MemberClusterAnnounce>::namespaced(client.borrow().clone(), ns);
        let now = Timestamp::now();
        match beat(&api, name, now).await {
            Ok(next) => {
                forbidden.clear();
                sh.ctx.metrics.heartbeat(true);
                failures = 0;
                interval = next;
                let publish_time = {
                    let mut last = sh
                        .last_heartbeat_published
                        .lock()
                        .unwrap_or_else(|p| p.into_inner());
                    let due = last.is_none_or(|t| t.elapsed() >= HEARTBEAT_STATUS_EVERY);
                    if due {
                        *last = Some(Instant::now());
                    }
                    due
                };
                update(sh, |v| {
                    v.reachable = Some((
                        true,
                        "HeartbeatOK",
                        format!("heartbeat every {}s", interval.as_secs()),
                    ));
                    if publish_time {
                        v.membership.last_heartbeat_time = Some(time(now));
                    }
                })
                .await;
            }
            Err(e) => {
                let settling = forbidden.tolerate(&e);
                let err = rejected("heartbeat", e);
                if matches!(err, Error::CredentialRejected(_)) && !settling {
                    return Err(err);
                }
                sh.ctx.metrics.heartbeat(false);
                failures += 1;
                warn!(
                    error = &err as &dyn std::error::Error,
                    failures, "Heartbeat failed; retrying"
                );
                update(sh, |v| {
                    v.reachable = Some((false, "LeaderUnreachable", err.to_string()))
                })
                .await;
                let backoff =
                    Duration::from_secs(1 << failures.min(6)).min(interval.max(Duration::from_secs(1)));
                tokio::time::sleep(backoff).await;
                continue;
            }
        }
        tokio::time::sleep(jittered(interval)).await;
    }
}

async fn report(
    sh: &Arc<Shared>,
    client: watch::Receiver<Client>,
    ns: &str,
    name: &str,
) -> Result<(), Error> {
    let member = sh.ctx.client.clone();
    let (nodes, writer) = reflector::store::<Node>();
    let changed = Arc::new(Notify::new());
    let notify = changed.clone();
    let stream = reflector::reflector(
        writer,
        watcher(Api::<Node>::all(member.clone()), watcher::Config::default()),
    )
    .default_backoff()
    .touched_objects()
    .for_each(move |_| {
        notify.notify_one();
        async {}
    });
    let drive = tokio::spawn(stream);
    let _stop = AbortOnDrop(drive);
    let _ = nodes.wait_until_ready().await;

    let mut last: Option<Report> = None;
    let mut forbidden = Forbidden::default();
    let mut last_write = Instant::now();
    loop {
        let next = observe(&member, &nodes).await;
        let full = last_write.elapsed() >= FULL_REFRESH;
        if worth_writing(last.as_ref(), &next) || full {
            let api = Api::<ManagedCluster>::namespaced(client.borrow().clone(), ns);
            match crate::report::write_status(&api, name, &next, &sh.ctx.api_server_url).await {
                Ok(()) => {
                    forbidden.clear();
                    sh.ctx.metrics.status_write();
                    last = Some(next);
                    last_write = Instant::now();
                }
                Err(e) => {
                    let settling = forbidden.tolerate(&e);
                    let err = rejected("report status", e);
                    if matches!(err, Error::CredentialRejected(_)) && !settling {
                        return Err(err);
                    }
                    warn!(
                        error = &err as &dyn std::error::Error,
                        "Status report failed; retrying"
                    );
                }
            }
        }
        tokio::select! {
            _ = changed.notified() => tokio::time::sleep(Duration::from_secs(1)).await,
            _ = tokio::time::sleep(HEALTH_EVERY) => {}
        }
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);
impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Builds a report from the node cache and the member API server's version and health.
async fn observe(member: &Client, nodes: &reflector::Store<Node>) -> Report {
    let state = nodes.state();
    let (counts, capacity, allocatable) = summarize(state.iter().map(|n| n.as_ref()));
    let version = member.apiserver_version().await.ok();
    let probe = |path: &'static str| async move {
        let req = http::Request::get(path).body(vec![]);
        match req {
            Ok(r) => member.request_text(r).await.is_ok(),
            Err(_) => false,
        }
    };
    let (livez, readyz) = futures::join!(probe("/livez"), probe("/readyz"));
    Report {
        nodes: counts,
        capacity,
        allocatable,
        kubernetes_version: version.as_ref().map(|v| v.git_version.clone()),
        platform: version.map(|v| v.platform),
        health: tether_api::managedcluster::ApiServerHealth { livez, readyz },
    }
}

async fn renew(
    sh: &Arc<Shared>,
    spec: &MemberSpec,
    trust: &Trust,
    mut stored: Stored,
    client_tx: watch::Sender<Client>,
) -> Result<(), Error> {
    loop {
        let remaining = expiry(&stored)
            .map(|e| (e - Timestamp::now()).get_seconds().max(0) as u64)
            .unwrap_or(0);
        // Renew with a third of the lifetime left.
        let wait = Duration::from_secs(remaining.saturating_sub(stored.ttl_seconds as u64 / 3))
            .max(Duration::from_secs(5));
        tokio::time::sleep(wait).await;
        let api = Api::<ServiceAccount>::namespaced(client_tx.borrow().clone(), &stored.credential.namespace);
        let req = TokenRequest {
            spec: TokenRequestSpec {
                expiration_seconds: Some(stored.ttl_seconds),
                ..TokenRequestSpec::default()
            },
            ..TokenRequest::default()
        };
        match api
            .create_token_request(&stored.credential.service_account, &PostParams::default(), &req)
            .await
        {
            Ok(t) => {
                let Some(status) = t.status else { continue };
                stored.credential.token = status.token;
                stored.credential.expiration_timestamp = status.expiration_timestamp.0.to_string();
                state::store_credential(&sh.ctx.client, &sh.ctx.namespace, &stored).await?;
                client_tx.send_replace(leader_client(spec, trust, &stored)?);
                sh.ctx.metrics.renewal(true);
                info!(expires = %stored.credential.expiration_timestamp, "Credential renewed");
                let exp = expiry(&stored).map(time);
                update(sh, |v| v.membership.credential_expiry = exp).await;
            }
            Err(e) => {
                sh.ctx.metrics.renewal(false);
                let err = rejected("renew credential", e);
                if matches!(err, Error::CredentialRejected(_)) {
                    return Err(err);
                }
                warn!(
                    error = &err as &dyn std::error::Error,
                    "Credential renewal failed; retrying"
                );
                tokio::time::sleep(Duration::from_secs(10)).await;
            }
        }
    }
}

/// Turns a session failure into status, an Event where a user must act, and a log line.
async fn record_failure(sh: &Arc<Shared>, err: &Error) {
    warn!(set = %sh.set.name_any(), error = err as &dyn std::error::Error, "Member session failed");
    let msg = err.to_string();
    match err {
        Error::Discovery(discovery::DiscoveryError::PinMismatch { .. }) => {
            update(sh, |v| v.reachable = Some((false, "PinMismatch", msg.clone()))).await;
            sh.ctx.event(&sh.set, true, "PinMismatch", &msg).await;
        }
        Error::Discovery(_) | Error::Leader { .. } => {
            update(sh, |v| {
                v.reachable = Some((false, "LeaderUnreachable", msg.clone()))
            })
            .await;
        }
        Error::JoinTokenRejected | Error::JoinTokenForbidden(_) | Error::JoinTokenMissing { .. } => {
            let reason = if matches!(err, Error::JoinTokenRejected) {
                "JoinTokenExpired"
            } else {
                "JoinTokenInvalid"
            };
            update(sh, |v| v.registered = Some((false, reason, msg.clone()))).await;
            sh.ctx.event(&sh.set, true, reason, &msg).await;
        }
        Error::Denied { .. } => {
            update(sh, |v| v.registered = Some((false, "Denied", msg.clone()))).await;
            sh.ctx.event(&sh.set, true, "RegistrationDenied", &msg).await;
        }
        Error::CredentialRejected(_) => {
            update(sh, |v| {
                v.registered = Some((false, "CredentialRejected", msg.clone()))
            })
            .await;
            sh.ctx
                .event(
                    &sh.set,
                    true,
                    "CredentialRejected",
                    "the leader rejected the credential; registering again",
                )
                .await;
        }
        _ => update(sh, |v| v.registered = Some((false, "Error", msg.clone()))).await,
    }
}

/// Changes the view and writes the member ClusterSet's status if it changed.
async fn update(sh: &Arc<Shared>, change: impl FnOnce(&mut View)) {
    let view = {
        let mut v = sh.view.lock().unwrap_or_else(|p| p.into_inner());
        change(&mut v);
        v.clone()
    };
    // NB: compare with what this session last wrote, not the (possibly lagging) cache.
    let mut written = sh.written.lock().await;
    let set = sh
        .ctx
        .sets
        .get(&ObjectRef::from_obj(sh.set.as_ref()))
        .unwrap_or_else(|| sh.set.clone());
    let previous = written.clone().or_else(|| set.status.clone()).unwrap_or_default();
    let status = view.status(&previous.conditions, set.metadata.generation, Timestamp::now());
    if status == previous {
        return;
    }
    match sh.ctx.write_status(&set, &status).await {
        Ok(()) => *written = Some(status),
        Err(e) => warn!(
            error = &e as &dyn std::error::Error,
            "Cannot write the member ClusterSet status"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("refused", "Forbidden")
                .with_code(code)
                .boxed(),
        )
    }

    #[test]
    fn forbidden_is_tolerated_only_while_rbac_may_still_be_settling() {
        let t0 = Instant::now();
        let mut f = Forbidden::default();
        assert!(f.tolerate_at(&status(403), t0));
        assert!(f.tolerate_at(&status(403), t0 + RBAC_SETTLE - Duration::from_secs(1)));
        assert!(
            !f.tolerate_at(&status(403), t0 + RBAC_SETTLE),
            "a 403 that lasts is a revoked grant"
        );
        // Another answer in between starts the window again.
        let t1 = t0 + RBAC_SETTLE * 2;
        assert!(!f.tolerate_at(&status(500), t1));
        assert!(f.tolerate_at(&status(403), t1 + Duration::from_secs(1)));
        assert!(!f.tolerate_at(&status(401), t1), "401 is never tolerated");
        f.clear();
        assert!(f.tolerate_at(&status(403), t1 + RBAC_SETTLE * 3));
    }
}
