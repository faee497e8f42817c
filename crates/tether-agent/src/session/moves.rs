//! Following the leader when it moves: a URL or a CA bundle it publishes in `cluster-info`, read
//! over a connection verified with the CA the agent trusts; a moved-to URL that does not answer
//! is given up on after `MOVED_ATTEMPTS` failures.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use kube::runtime::reflector::ObjectRef;
use tether_api::clusterset::MemberSpec;
use tether_api::conditions::EventReason;
use tether_join::discovery::{self, Trust};
use tracing::{info, warn};

use super::shared::{MOVED_ATTEMPTS, Moved, Shared, spec};
use crate::Error;
use crate::endpoint::LeaderEndpoint;
use crate::state::{self};

/// Counts a failure to reach the leader; on a moved-to URL, the `MOVED_ATTEMPTS`th goes back to
/// the declared one for good.
pub(super) fn abandon_moved_after_failures(sh: &Shared) {
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
pub(super) fn moved_to(sh: &Shared, declared: &str) -> Option<String> {
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
pub(super) fn learns_ca(spec: &MemberSpec) -> bool {
    spec.ca_bundle.is_none() && spec.ca_cert_hash.is_some()
}

pub(super) fn has_certificates(pem: &str) -> bool {
    tether_join::pin::certificates(pem).is_ok_and(|c| !c.is_empty())
}

/// The pins of the CA certificates in `pem`, sorted (empty if it does not parse).
pub(super) fn pins_of(pem: &str) -> Vec<String> {
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
pub(super) async fn follow_leader(
    sh: &Arc<Shared>,
    leader: &LeaderEndpoint,
    declared: &str,
) -> Result<(), Error> {
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
pub(super) async fn adopt_ca(sh: &Arc<Shared>, trusted: &str, published: &str) -> Result<(), Error> {
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
pub(super) async fn follow_url(
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
