//! Ensures a tunnel lives no longer than what it was proven with, without a restart of
//! anything: the member's ManagedCluster (removed or deleting), the key it registered (changed
//! by a re-registration), its agent ServiceAccount (deleted or recreated, which revokes every
//! token of it) and the credential it attached with (the deadline a new proof moves). The
//! verdict is a pure function; `sweep` and `follow_identities` apply it while this replica
//! serves.

use std::collections::{HashMap, HashSet};
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

use super::server::registered_key;
use super::tunnels::{Live, MemberKey, Tunnels};
use crate::Context;
use crate::naming::AGENT_SERVICE_ACCOUNT;

/// How often every live tunnel is checked against the caches.
const SWEEP: Duration = Duration::from_secs(2);

/// Why the live tunnel `live` must close at `now`, given its member's ManagedCluster `mc`.
pub fn verdict(live: &Live, mc: Option<&ManagedCluster>, now: Instant) -> Option<&'static str> {
    let Some(mc) = mc.filter(|mc| mc.meta().deletion_timestamp.is_none()) else {
        return Some("member_removed");
    };
    if registered_key(mc) != Some(live.key.as_str()) {
        return Some("key_changed");
    }
    (live.deadline <= now).then_some("credential_expired")
}

/// What each reason tells the member's admin.
fn explain(reason: &str) -> &'static str {
    match reason {
        "member_removed" => "the member was removed",
        "key_changed" => "the member registered another key",
        "identity_deleted" => {
            "the member's agent ServiceAccount was deleted or recreated (its tokens are void)"
        }
        "credential_expired" => {
            "the credential it attached with expired without a new proof of the member's key"
        }
        _ => "what it was proven with no longer holds",
    }
}

/// Closes `member`'s tunnel for `reason`, counts it and tells the member's admin.
async fn revoke(ctx: &Context, tunnels: &Tunnels, member: &MemberKey, reason: &'static str) {
    if !tunnels.revoke(member) {
        return;
    }
    ctx.metrics.tunnel_revoked(reason);
    warn!(member = %member.name, namespace = %member.namespace, reason, "Closed a revoked tunnel");
    let mc = ctx
        .clusters
        .get(&ObjectRef::new(&member.name).within(&member.namespace));
    if let Some(mc) = mc.filter(|mc| mc.meta().deletion_timestamp.is_none()) {
        let note = format!("the tunnel was closed: {}", explain(reason));
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
pub async fn sweep(ctx: Arc<Context>, tunnels: Arc<Tunnels>) {
    loop {
        tokio::time::sleep(SWEEP).await;
        let now = Instant::now();
        for live in tunnels.snapshot() {
            let mc = ctx
                .clusters
                .get(&ObjectRef::new(&live.member.name).within(&live.member.namespace));
            if let Some(reason) = verdict(&live, mc.as_deref(), now) {
                revoke(&ctx, &tunnels, &live.member, reason).await;
            }
        }
    }
}

/// Follows the members' agent ServiceAccounts: one deleted, or recreated under a new UID (all
/// tokens of the old one are void), closes the tunnel of its namespace.
pub async fn follow_identities(ctx: Arc<Context>, tunnels: Arc<Tunnels>) {
    // NB: metadata only: the leader keeps a UID per member namespace, nothing else.
    let api = Api::<PartialObjectMeta<ServiceAccount>>::all(ctx.client.clone());
    let cfg = watcher::Config::default()
        .labels(&format!(
            "{}={}",
            tether_api::labels::MANAGED_BY,
            crate::provision::FIELD_MANAGER
        ))
        .fields(&format!("metadata.name={AGENT_SERVICE_ACCOUNT}"));
    let mut uids: HashMap<String, String> = HashMap::new();
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
                if uids.insert(ns.clone(), uid.clone()).is_some_and(|old| old != uid) {
                    gone.push(ns);
                }
            }
            watcher::Event::Delete(sa) => {
                let ns = sa.namespace().unwrap_or_default();
                uids.remove(&ns);
                gone.push(ns);
            }
            watcher::Event::InitDone => {
                gone.extend(uids.keys().filter(|ns| !relisted.contains(*ns)).cloned());
                uids.retain(|ns, _| relisted.contains(ns));
            }
        }
        if gone.is_empty() {
            continue;
        }
        for live in tunnels.snapshot() {
            if gone.contains(&live.member.namespace) {
                revoke(&ctx, &tunnels, &live.member, "identity_deleted").await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use tether_api::ManagedClusterSpec;

    fn mc(key: Option<&str>, deleting: bool) -> ManagedCluster {
        let mut mc = ManagedCluster::new(
            "east",
            ManagedClusterSpec {
                cluster_id: "id".into(),
                cluster_set: "prod".into(),
            },
        );
        mc.metadata.annotations =
            key.map(|k| BTreeMap::from([(tether_api::annotations::PUBLIC_KEY.to_string(), k.to_string())]));
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
        let table: [(Option<ManagedCluster>, Instant, Option<&str>); 6] = [
            (Some(mc(Some("age1old"), false)), now, None),
            (None, now, Some("member_removed")),
            (Some(mc(Some("age1old"), true)), now, Some("member_removed")),
            (Some(mc(Some("age1new"), false)), now, Some("key_changed")),
            (Some(mc(None, false)), now, Some("key_changed")),
            (
                Some(mc(Some("age1old"), false)),
                now + Duration::from_secs(61),
                Some("credential_expired"),
            ),
        ];
        for (i, (cluster, at, want)) in table.iter().enumerate() {
            assert_eq!(verdict(&live, cluster.as_ref(), *at), *want, "case {i}");
        }
    }
}
