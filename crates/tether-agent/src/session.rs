//! One member ClusterSet's life while it exists: trust the leader (discovery.rs), register if
//! there is no valid credential (register.rs), then heartbeat, report ManagedCluster status only
//! when it changed, and renew the credential before it expires — all with the member's own
//! credential. An expired or refused credential is replaced by proving the member's key
//! (rejoin.rs), and only if the leader will not take the member back that way by registering
//! again with the join token; other failures retry with capped, jittered backoff and say why in
//! status.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;
use rand::Rng;
use tether_api::clusterset::MemberSpec;
use tether_api::conditions::{EventReason, Reason};
use tether_api::{ClusterSet, properties};
use tether_join::discovery::{self, Trust};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::endpoint::LeaderEndpoint;
use crate::register::{Registration, Target, register};
use crate::state::{self, Stored};
use crate::status::StatusSink;
use crate::view::{View, time};
use crate::{Context, Error};

/// Longest wait between retries (jittered down to half): a member is back within about this
/// long of its leader, so it must stay below the sets' default grace period (40 s).
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// What one session keeps across its attempts.
struct Shared {
    ctx: Arc<Context>,
    set: Arc<ClusterSet>,
    /// Where the member ClusterSet's status goes (status.rs owns it).
    status: StatusSink,
    /// The leader refused the stored credential: get a new one before using it again.
    refused: AtomicBool,
    /// What this session knows of a URL the leader moved to.
    moved: Mutex<Moved>,
    /// Failed attempts in a row on a moved-to URL.
    moved_failures: std::sync::atomic::AtomicU32,
}

/// A URL the leader published in place of the declared one.
#[derive(Clone, Debug, Default)]
enum Moved {
    /// Nothing learned in this process: the status an earlier session wrote says.
    #[default]
    Unknown,
    /// Use `url` while the declared URL is `replaces`.
    To { url: String, replaces: String },
    /// `url` did not answer: back on the declared URL, and `url` is not followed again.
    Abandoned { url: String },
}

/// Failed attempts in a row on a moved-to URL before the agent goes back to the declared one
/// (a leader that published an address this member cannot reach must not strand it).
const MOVED_ATTEMPTS: u32 = 3;

/// Runs the session of `set` until `cancel`.
pub async fn run(ctx: Arc<Context>, set: Arc<ClusterSet>, cancel: CancellationToken) {
    let (status, owner) = {
        let (cache, set) = (ctx.clone(), set.clone());
        let current = move || {
            cache
                .sets
                .get(&ObjectRef::from_obj(set.as_ref()))
                .unwrap_or_else(|| set.clone())
        };
        let ctx = ctx.clone();
        let write = move |set: Arc<ClusterSet>, status| {
            let ctx = ctx.clone();
            async move { ctx.write_status(&set, &status).await }
        };
        crate::status::owner(current, write)
    };
    let shared = Arc::new(Shared {
        ctx,
        set,
        status,
        refused: AtomicBool::new(false),
        moved: Mutex::default(),
        moved_failures: std::sync::atomic::AtomicU32::new(0),
    });
    // NB: the status owner lives as long as the session and no longer: once the session is
    // cancelled (the set deleted or changed), nothing it observed is written over what comes next.
    tokio::select! {
        _ = cancel.cancelled() => {}
        _ = owner => {}
        _ = attempts(&shared, &cancel) => {}
    }
}

/// Runs the session's attempts, with backoff, until it ends or `cancel`.
async fn attempts(shared: &Arc<Shared>, cancel: &CancellationToken) {
    let shared = shared.clone();
    let mut backoff = Duration::from_secs(1);
    loop {
        let result = tokio::select! {
            _ = cancel.cancelled() => return,
            r = serve(&shared) => r,
        };
        let Err(err) = result else { return };
        if matches!(err, Error::LeaderMoved(_) | Error::LeaderCAChanged) {
            backoff = Duration::from_secs(1);
            continue;
        }
        if matches!(
            err,
            Error::Discovery(_) | Error::Leader { .. } | Error::RejoinUnreachable(_)
        ) {
            abandon_moved_after_failures(&shared);
        }
        let retry_now = matches!(err, Error::CredentialRejected(_));
        record_failure(&shared, &err).await;
        if retry_now {
            // NB: get a new credential at once: by proving the key, else with the join token.
            shared.refused.store(true, Ordering::Release);
            backoff = Duration::from_secs(1);
            continue;
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(backoff.mul_f64(rand::rng().random_range(0.5..=1.0))) => {}
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
    let declared = spec(&sh.set)?;
    // NB: a URL the leader published in place of the declared one, learned over a verified
    // connection, is used for as long as the declared one is the one it replaced.
    let moved = moved_to(sh, &declared.leader_url);
    let mut effective = declared.clone();
    if let Some(url) = &moved {
        effective.leader_url = url.clone();
    }
    let spec = &effective;
    let replaces = moved.as_ref().map(|_| declared.leader_url.clone());
    let leader_url = moved.clone();
    update(sh, move |v| {
        v.membership.leader_url = leader_url;
        v.membership.leader_url_replaces = replaces;
    });
    let stored = state::load_credential(&ctx.client, &ctx.namespace).await?;
    // NB: a member that joined by pin trusts the CA bundle the leader gave it (in its credential,
    // kept in step with cluster-info by `follow_leader`), so that a leader whose serving CA
    // rotated (with an overlap) is still reached; the pin proves the leader only until then.
    let learned = stored
        .as_ref()
        .map(|s| s.credential.ca_cert.as_str())
        .filter(|ca| learns_ca(spec) && has_certificates(ca));
    let trust = match learned {
        Some(ca) => Trust::Ca(ca.to_string()),
        None => discovery::trust_for(spec).await?,
    };
    let verified = match &trust {
        Trust::Ca(_) if spec.ca_bundle.is_some() => (
            true,
            Reason::CABundle,
            "the leader is verified with caBundle".into(),
        ),
        Trust::Ca(_) if learned.is_some() => (
            true,
            Reason::PublishedCABundle,
            "the leader is verified with the CA bundle it published, first proven by caCertHash".into(),
        ),
        Trust::Ca(_) => (
            true,
            Reason::PinMatched,
            "the leader's serving certificate chains to the CA pinned by caCertHash".into(),
        ),
        Trust::Insecure => {
            warn!(
                "insecureSkipCAVerification is set: the leader is NOT verified; the join token may reach an impostor"
            );
            (
                false,
                Reason::InsecureSkipCAVerification,
                "UNSAFE: the leader's CA is not verified".into(),
            )
        }
    };
    let pins = match &trust {
        Trust::Ca(ca) => pins_of(ca),
        Trust::Insecure => Vec::new(),
    };
    update(sh, move |v| {
        v.ca_verified = Some(verified);
        v.membership.leader_cas = pins;
    });
    let leader = LeaderEndpoint {
        url: spec.leader_url.clone(),
        trust,
    };
    if learned.is_some() {
        // NB: as pin discovery would, make sure the leader answers at this URL (anonymously)
        // before anything else, so that a moved-to URL that does not answer is counted and given
        // up on (`abandon_moved_after_failures`).
        leader
            .client(None)?
            .apiserver_version()
            .await
            .map_err(|source| Error::Leader {
                op: "reach the leader",
                source,
            })?;
    }
    // NB: the leader answered here: a moved-to URL works.
    sh.moved_failures.store(0, Ordering::Release);

    let cluster_id = state::cluster_id(&ctx.client, spec.cluster_id.as_deref()).await?;
    let (identity, recipient) = state::key_pair(&ctx.client, &ctx.namespace).await?;
    let stored = match stored {
        Some(s) if !s.expired() && !sh.refused.load(Ordering::Acquire) => s,
        previous => {
            let id = Identity {
                cluster_id: &cluster_id,
                identity: &identity,
                recipient: &recipient,
            };
            let stored = acquire(sh, spec, &leader, previous, &id).await?;
            sh.refused.store(false, Ordering::Release);
            stored
        }
    };
    let namespace = stored.credential.namespace.clone();
    let (id, ns, expiry) = (cluster_id.clone(), namespace.clone(), stored.expiry().map(time));
    update(sh, move |v| {
        v.registered = Some((true, Reason::Approved, format!("namespace {ns} on the leader")));
        v.membership.cluster_id = Some(id);
        v.membership.namespace = Some(ns);
        v.membership.credential_expiry = expiry;
    });
    state::write_property(&ctx.client, properties::CLUSTER_ID, &cluster_id).await?;
    state::write_property(&ctx.client, properties::CLUSTER_SET, &sh.set.name_any()).await?;

    let (client_tx, client_rx) = watch::channel(leader.client(Some(&stored.credential.token))?);
    let name = spec.cluster_name.clone();
    let link = crate::link::Link::default();
    let tunnel = async {
        match ctx.access.clone() {
            Some(access) => {
                let at = crate::tunnel::Attach {
                    set: sh.set.name_any(),
                    namespace: namespace.clone(),
                    name: name.clone(),
                    key: identity.clone(),
                };
                crate::tunnel::run(client_rx.clone(), access, at, &link).await
            }
            None => std::future::pending().await,
        }
    };
    tokio::try_join!(
        crate::heartbeat::run(
            &ctx.metrics,
            &sh.status,
            client_rx.clone(),
            &link,
            &namespace,
            &name
        ),
        crate::reporter::run(
            crate::reporter::Member {
                client: &ctx.client,
                api_server_url: &ctx.api_server_url,
                metrics: &ctx.metrics,
            },
            &sh.status,
            client_rx.clone(),
            &namespace,
            &name
        ),
        crate::renewal::run(
            crate::renewal::Keep {
                client: &ctx.client,
                namespace: &ctx.namespace,
                metrics: &ctx.metrics,
            },
            &sh.status,
            &leader,
            stored.clone(),
            client_tx
        ),
        follow_leader(sh, &leader, &declared.leader_url),
        tunnel,
    )?;
    Ok(())
}

/// Counts a failure to reach the leader; on a moved-to URL, the `MOVED_ATTEMPTS`th goes back to
/// the declared one for good.
fn abandon_moved_after_failures(sh: &Shared) {
    let mut moved = sh.moved.lock().unwrap_or_else(|p| p.into_inner());
    let Moved::To { url, .. } = moved.clone() else {
        return;
    };
    let failures = sh.moved_failures.fetch_add(1, Ordering::AcqRel) + 1;
    if failures >= MOVED_ATTEMPTS {
        warn!(url = %url, attempts = failures, "The leader's new URL does not answer; back to the declared one");
        *moved = Moved::Abandoned { url };
        sh.moved_failures.store(0, Ordering::Release);
    }
}

/// The URL the leader moved to, if this session learned one for `declared` (in memory, else
/// from the status an earlier session wrote).
fn moved_to(sh: &Shared, declared: &str) -> Option<String> {
    let known = sh.moved.lock().unwrap_or_else(|p| p.into_inner()).clone();
    match known {
        Moved::To { url, replaces } => return (replaces == declared).then_some(url),
        Moved::Abandoned { .. } => return None,
        Moved::Unknown => {}
    }
    let set = sh
        .ctx
        .sets
        .get(&ObjectRef::from_obj(sh.set.as_ref()))
        .unwrap_or_else(|| sh.set.clone());
    let m = set.status.as_ref()?.membership.as_ref()?;
    let url = (m.leader_url_replaces.as_deref() == Some(declared))
        .then(|| m.leader_url.clone())
        .flatten()?;
    // NB: from now on this process counts its failures there too.
    *sh.moved.lock().unwrap_or_else(|p| p.into_inner()) = Moved::To {
        url: url.clone(),
        replaces: declared.to_string(),
    };
    Some(url)
}

/// Whether a member of this spec trusts the CA bundle its leader publishes: one that joined by
/// pin. An explicit `caBundle` is the admin's to change; with verification off there is no trust
/// to carry a new bundle over.
fn learns_ca(spec: &MemberSpec) -> bool {
    spec.ca_bundle.is_none() && spec.ca_cert_hash.is_some()
}

fn has_certificates(pem: &str) -> bool {
    tether_join::pin::certificates(pem).is_ok_and(|c| !c.is_empty())
}

/// The pins of the CA certificates in `pem`, sorted (empty if it does not parse).
fn pins_of(pem: &str) -> Vec<String> {
    let mut pins: Vec<String> = tether_join::pin::certificates(pem)
        .map(|cas| cas.iter().map(|c| c.pin.to_string()).collect())
        .unwrap_or_default();
    pins.sort();
    pins.dedup();
    pins
}

/// Re-reads what the leader publishes in `cluster-info` every `leader_url_check`, anonymously
/// over a connection verified with the CA the agent trusts, and ends the session (to start again
/// at once) when the leader moved to a new URL or published a new CA bundle. Never with
/// verification off: an unverified answer could send the member anywhere.
async fn follow_leader(sh: &Arc<Shared>, leader: &LeaderEndpoint, declared: &str) -> Result<(), Error> {
    let Trust::Ca(trusted) = &leader.trust else {
        return std::future::pending().await;
    };
    loop {
        tokio::time::sleep(sh.ctx.leader_url_check).await;
        let Some(published) = discovery::published(&leader.client(None)?).await else {
            continue;
        };
        if let Some(ca) = &published.ca {
            adopt_ca(sh, trusted, ca).await?;
        }
        let Some(url) = published.url else { continue };
        follow_url(sh, leader, declared, &url).await?;
    }
}

/// Trusts the CA bundle `published` in place of `trusted` if it differs (by pins) and this
/// member learns its leader's CA: stores it with the credential and ends the session.
async fn adopt_ca(sh: &Arc<Shared>, trusted: &str, published: &str) -> Result<(), Error> {
    let spec = spec(&sh.set)?;
    let (old, new) = (pins_of(trusted), pins_of(published));
    if !learns_ca(spec) || new.is_empty() || old == new {
        return Ok(());
    }
    let ctx = &sh.ctx;
    let Some(mut stored) = state::load_credential(&ctx.client, &ctx.namespace).await? else {
        return Ok(());
    };
    stored.credential.ca_cert = published.to_string();
    state::store_credential(&ctx.client, &ctx.namespace, &stored).await?;
    info!(from = ?old, to = ?new, "The leader published a new CA bundle; trusting it");
    ctx.event(
        &sh.set,
        false,
        EventReason::LeaderCAChanged,
        &format!(
            "the leader published a new CA bundle over the verified connection: trusting {} in place of {}",
            new.join(", "),
            old.join(", ")
        ),
    )
    .await;
    Err(Error::LeaderCAChanged)
}

/// Follows `published`, the URL the leader names, if it is a new and valid one not given up on.
async fn follow_url(
    sh: &Arc<Shared>,
    leader: &LeaderEndpoint,
    declared: &str,
    published: &str,
) -> Result<(), Error> {
    let published = published.trim_end_matches('/').to_string();
    let abandoned = matches!(&*sh.moved.lock().unwrap_or_else(|p| p.into_inner()),
                             Moved::Abandoned { url } if *url == published);
    if published == leader.url.trim_end_matches('/')
        || abandoned
        || discovery::leader_uri(&published).is_err()
    {
        return Ok(());
    }
    info!(from = %leader.url, to = %published, "The leader published a new URL; following it");
    *sh.moved.lock().unwrap_or_else(|p| p.into_inner()) = Moved::To {
        url: published.clone(),
        replaces: declared.to_string(),
    };
    sh.moved_failures.store(0, Ordering::Release);
    sh.ctx
        .event(
            &sh.set,
            false,
            EventReason::LeaderMoved,
            &format!("the leader published a new URL, {published}; using it in place of {declared}"),
        )
        .await;
    Err(Error::LeaderMoved(published))
}

/// Who this agent is: the member's cluster ID and key pair.
struct Identity<'a> {
    cluster_id: &'a str,
    identity: &'a str,
    recipient: &'a str,
}

/// A new credential when the stored one (`previous`) expired or was refused: first by proving
/// the member's key (`rejoin.rs`: no join token needed, so any outage is survived), then, if the
/// leader will not take the member back that way, by registering with the join token.
async fn acquire(
    sh: &Arc<Shared>,
    spec: &MemberSpec,
    leader: &LeaderEndpoint,
    previous: Option<Stored>,
    id: &Identity<'_>,
) -> Result<Stored, Error> {
    let ctx = &sh.ctx;
    let mut unreachable = None;
    if let Some(previous) = previous {
        let anonymous = leader.client(None)?;
        let member = crate::rejoin::Member {
            namespace: &previous.credential.namespace,
            name: &spec.cluster_name,
            identity: id.identity,
        };
        match crate::rejoin::rejoin(&anonymous, &member).await {
            Ok(credential) => {
                let stored = Stored::issued(credential);
                state::store_credential(&ctx.client, &ctx.namespace, &stored).await?;
                ctx.metrics.registration("Rejoined");
                ctx.event(
                    &sh.set,
                    false,
                    EventReason::Registered,
                    &format!(
                        "rejoined with the member's key; namespace {} on the leader",
                        stored.credential.namespace
                    ),
                )
                .await;
                return Ok(stored);
            }
            Err(Error::RejoinRefused(why)) => {
                warn!(reason = %why, "The leader does not take this member back with its key; registering with the join token");
                state::delete_secret(&ctx.client, &ctx.namespace, state::CREDENTIAL_SECRET).await?;
            }
            // NB: the leader's API server answers but its proxy API does not (no serving replica
            // yet, or an aggregator that cannot reach it): a valid join token still gets the
            // member back (as the same member: same ID and key); the key is tried again next time.
            Err(Error::RejoinUnreachable(why)) => unreachable = Some(why),
            Err(e) => return Err(e),
        }
    }
    let registered = register_with_token(sh, spec, leader, id).await;
    match (registered, unreachable) {
        (
            Err(Error::JoinTokenRejected | Error::JoinTokenMissing { .. } | Error::JoinTokenForbidden(_)),
            Some(why),
        ) => Err(Error::RejoinUnreachable(why)),
        (registered, _) => registered,
    }
}

/// Registers with the join token and stores the credential the leader approves.
async fn register_with_token(
    sh: &Arc<Shared>,
    spec: &MemberSpec,
    leader: &LeaderEndpoint,
    id: &Identity<'_>,
) -> Result<Stored, Error> {
    let ctx = &sh.ctx;
    update(sh, |v| {
        v.registered = Some((
            false,
            Reason::Registering,
            "waiting for the leader's decision".into(),
        ))
    });
    let token = join_token(ctx, spec).await?;
    let bootstrap = leader.client(Some(&token))?;
    let reg = Registration {
        cluster_id: id.cluster_id,
        cluster_name: &spec.cluster_name,
        labels: spec.labels.clone(),
        identity: id.identity,
        recipient: id.recipient,
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
        EventReason::Registered,
        &format!("joined; namespace {} on the leader", stored.credential.namespace),
    )
    .await;
    Ok(stored)
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

/// Turns a session failure into status, an Event where a user must act, and a log line.
async fn record_failure(sh: &Arc<Shared>, err: &Error) {
    warn!(set = %sh.set.name_any(), failure = err.label(), error = err as &dyn std::error::Error,
          "Member session failed");
    sh.ctx.metrics.session_failure(err.label());
    let msg = err.to_string();
    match err {
        Error::Discovery(discovery::DiscoveryError::PinMismatch { .. }) => {
            let m = msg.clone();
            update(sh, move |v| v.reachable = Some((false, Reason::PinMismatch, m)));
            sh.ctx.event(&sh.set, true, EventReason::PinMismatch, &msg).await;
        }
        Error::Discovery(_) | Error::Leader { .. } | Error::RejoinUnreachable(_) => {
            let m = msg.clone();
            update(sh, move |v| {
                v.reachable = Some((false, Reason::LeaderUnreachable, m))
            });
        }
        Error::JoinTokenRejected | Error::JoinTokenForbidden(_) | Error::JoinTokenMissing { .. } => {
            let (reason, event) = if matches!(err, Error::JoinTokenRejected) {
                (Reason::JoinTokenExpired, EventReason::JoinTokenExpired)
            } else {
                (Reason::JoinTokenInvalid, EventReason::JoinTokenInvalid)
            };
            let m = msg.clone();
            update(sh, move |v| v.registered = Some((false, reason, m)));
            sh.ctx.event(&sh.set, true, event, &msg).await;
        }
        Error::Denied { .. } => {
            let m = msg.clone();
            update(sh, move |v| v.registered = Some((false, Reason::Denied, m)));
            sh.ctx
                .event(&sh.set, true, EventReason::RegistrationDenied, &msg)
                .await;
        }
        Error::CredentialRejected(_) => {
            let m = msg.clone();
            update(sh, move |v| {
                v.registered = Some((false, Reason::CredentialRejected, m))
            });
            sh.ctx
                .event(
                    &sh.set,
                    true,
                    EventReason::CredentialRejected,
                    "the leader rejected the credential; registering again",
                )
                .await;
        }
        _ => update(sh, move |v| v.registered = Some((false, Reason::Error, msg))),
    }
}

/// Changes the view; the status owner writes the status if it changed.
fn update(sh: &Shared, change: impl FnOnce(&mut View) + Send + 'static) {
    sh.status.update(change);
}
