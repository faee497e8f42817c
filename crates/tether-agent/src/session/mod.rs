//! One member ClusterSet's life while it exists: trust the leader (discovery.rs), register if
//! there is no valid credential (register.rs), then heartbeat, report ManagedCluster status only
//! when it changed, and renew the credential before it expires — all with the member's own
//! credential. An expired or refused credential is replaced by proving the member's key
//! (rejoin.rs), and only if the leader will not take the member back that way by registering
//! again with the join token; other failures retry with capped, jittered backoff and say why in
//! status.

use crate::endpoint::LeaderEndpoint;
use crate::state::{self};
use crate::view::time;
use crate::{Context, Error};
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use rand::Rng;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tether_api::conditions::{EventReason, Reason};
use tether_api::{ClusterSet, properties};
use tether_join::discovery::{self, Trust};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::warn;

mod acquire;
mod moves;
mod shared;

use acquire::{Identity, acquire};
use moves::{abandon_moved_after_failures, follow_leader, has_certificates, learns_ca, moved_to, pins_of};
use shared::{Shared, spec, update};

/// Longest wait between retries (jittered down to half): a member is back within about this
/// long of its leader, so it must stay below the sets' default grace period (40 s).
const MAX_BACKOFF: Duration = Duration::from_secs(30);

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
            ctx.access.is_some(),
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
