//! Ensures a tunnel lives no longer than what it was proven with, without a restart of
//! anything: the member's ManagedCluster (removed or deleting), the key it registered (changed
//! by a re-registration), its agent ServiceAccount (deleted or recreated, which revokes every
//! token of it) and the credential it attached with (the deadline a new proof moves). The
//! verdict is a pure function; `sweep` and `follow_identities` apply it while this replica
//! serves.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use tether_api::ManagedCluster;
use tether_api::conditions::EventReason;
use tokio::time::Instant;
use tracing::warn;

use super::identities::Identities;
use super::shared::registered_key;
use super::tunnels::{Live, MemberKey, Tunnels};
use crate::Context;
use crate::metrics::Revoked;
use crate::naming::AGENT_SERVICE_ACCOUNT;

/// How often every live tunnel is checked against the caches.
const SWEEP: Duration = Duration::from_secs(2);

/// Why the live tunnel `live` must close at `now`, given its member's ManagedCluster `mc` and
/// whether its agent ServiceAccount exists (`None`: not known yet).
pub fn verdict(
    live: &Live,
    mc: Option<&ManagedCluster>,
    identity: Option<bool>,
    now: Instant,
) -> Option<Revoked> {
    let Some(mc) = mc.filter(|mc| mc.meta().deletion_timestamp.is_none()) else {
        return Some(Revoked::MemberRemoved);
    };
    if registered_key(mc) != Some(live.key.as_str()) {
        return Some(Revoked::KeyChanged);
    }
    if identity == Some(false) {
        return Some(Revoked::IdentityDeleted);
    }
    (live.deadline <= now).then_some(Revoked::CredentialExpired)
}

/// Closes `member`'s tunnel for `reason`, counts it and tells the member's admin.
async fn revoke(ctx: &Context, tunnels: &Tunnels, member: &MemberKey, reason: Revoked) {
    if !tunnels.revoke(member) {
        return;
    }
    ctx.metrics.tunnel_revoked(reason);
    warn!(member = %member.name, namespace = %member.namespace, reason = reason.label(), "Closed a revoked tunnel");
    let mc = ctx
        .clusters
        .get(&ObjectRef::new(&member.name).within(&member.namespace));
    if let Some(mc) = mc.filter(|mc| mc.meta().deletion_timestamp.is_none()) {
        let note = format!("the tunnel was closed: {}", reason.explain());
        crate::write::event(
            ctx,
            &*mc,
            EventType::Warning,
            EventReason::TunnelRevoked,
            "Revoke",
            &note,
        )
        .await;
    }
}

/// Every `SWEEP`, closes each tunnel whose verdict says so (while this replica serves).
pub async fn sweep(ctx: Arc<Context>, tunnels: Arc<Tunnels>, identities: Arc<Identities>) {
    loop {
        tokio::time::sleep(SWEEP).await;
        let now = Instant::now();
        for live in tunnels.snapshot() {
            let mc = ctx
                .clusters
                .get(&ObjectRef::new(&live.member.name).within(&live.member.namespace));
            let identity = identities.present(&live.member.namespace);
            if let Some(reason) = verdict(&live, mc.as_deref(), identity, now) {
                revoke(&ctx, &tunnels, &live.member, reason).await;
            }
        }
    }
}

/// Follows the members' agent ServiceAccounts: one deleted, or recreated under a new UID (all
/// tokens of the old one are void), closes the tunnel of its namespace.
pub async fn follow_identities(ctx: Arc<Context>, tunnels: Arc<Tunnels>, identities: Arc<Identities>) {
    // NB: metadata only: the leader keeps a UID per member namespace, nothing else.
    let api = Api::<PartialObjectMeta<ServiceAccount>>::all(ctx.client.clone());
    let cfg = watcher::Config::default()
        .labels(&format!(
            "{}={}",
            tether_api::labels::MANAGED_BY,
            crate::provision::FIELD_MANAGER
        ))
        .fields(&format!("metadata.name={AGENT_SERVICE_ACCOUNT}"));
    let mut relisted: HashSet<String> = HashSet::new();
    let stream = watcher(api, cfg).default_backoff();
    futures::pin_mut!(stream);
    while let Some(ev) = stream.next().await {
        let ev = match ev {
            Ok(ev) => ev,
            Err(e) => {
                warn!(
                    error = &e as &dyn std::error::Error,
                    "Watch of agent ServiceAccounts failed; retrying"
                );
                continue;
            }
        };
        let mut gone: Vec<String> = Vec::new();
        match ev {
            watcher::Event::Init => relisted.clear(),
            watcher::Event::InitApply(sa) | watcher::Event::Apply(sa) => {
                let (ns, uid) = (sa.namespace().unwrap_or_default(), sa.uid().unwrap_or_default());
                relisted.insert(ns.clone());
                if identities
                    .uids()
                    .insert(ns.clone(), uid.clone())
                    .is_some_and(|old| old != uid)
                {
                    gone.push(ns);
                }
            }
            watcher::Event::Delete(sa) => {
                let ns = sa.namespace().unwrap_or_default();
                identities.uids().remove(&ns);
                gone.push(ns);
            }
            watcher::Event::InitDone => {
                let mut uids = identities.uids();
                gone.extend(uids.keys().filter(|ns| !relisted.contains(*ns)).cloned());
                uids.retain(|ns, _| relisted.contains(ns));
                identities
                    .synced
                    .store(true, std::sync::atomic::Ordering::Release);
            }
        }
        if gone.is_empty() {
            continue;
        }
        for live in tunnels.snapshot() {
            if gone.contains(&live.member.namespace) {
                revoke(&ctx, &tunnels, &live.member, Revoked::IdentityDeleted).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tether_api::ManagedClusterSpec;

    fn mc(key: Option<&str>, deleting: bool) -> ManagedCluster {
        let mut mc = ManagedCluster::new(
            "east",
            ManagedClusterSpec {
                cluster_id: "id".into(),
                cluster_set: "prod".into(),
                public_key: key.map(str::to_string),
            },
        );
        if deleting {
            mc.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            ));
        }
        mc
    }

    #[test]
    fn a_tunnel_is_revoked_when_what_it_was_proven_with_no_longer_holds() {
        let now = Instant::now();
        let live = Live {
            member: MemberKey {
                namespace: "tether-prod-east".into(),
                name: "east".into(),
            },
            key: "age1old".into(),
            deadline: now + Duration::from_secs(60),
        };
        /// The member's ManagedCluster, whether its agent ServiceAccount exists, when, verdict.
        type Case = (Option<ManagedCluster>, Option<bool>, Instant, Option<Revoked>);
        let table: [Case; 9] = [
            (Some(mc(Some("age1old"), false)), Some(true), now, None),
            (Some(mc(Some("age1old"), false)), None, now, None),
            (None, Some(true), now, Some(Revoked::MemberRemoved)),
            (
                Some(mc(Some("age1old"), true)),
                Some(true),
                now,
                Some(Revoked::MemberRemoved),
            ),
            (
                Some(mc(Some("age1new"), false)),
                Some(true),
                now,
                Some(Revoked::KeyChanged),
            ),
            (Some(mc(None, false)), Some(true), now, Some(Revoked::KeyChanged)),
            (
                Some(mc(Some("age1old"), false)),
                Some(false),
                now,
                Some(Revoked::IdentityDeleted),
            ),
            (
                Some(mc(Some("age1old"), false)),
                Some(true),
                now + Duration::from_secs(61),
                Some(Revoked::CredentialExpired),
            ),
            (
                Some(mc(Some("age1old"), false)),
                Some(true),
                now + Duration::from_secs(59),
                None,
            ),
        ];
        for (i, (cluster, identity, at, want)) in table.iter().enumerate() {
            assert_eq!(
                verdict(&live, cluster.as_ref(), *identity, *at),
                *want,
                "case {i}"
            );
        }
    }
}
