//! Reconciles ManagedClusters from their heartbeats: `Ready` follows the announce renewals seen in
//! memory (health.rs), with an Event on every loss and recovery; a deleted announce means the
//! member left, and a member silent past `memberExpiry` is removed. A heartbeat that changes
//! nothing writes nothing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use tether_api::conditions::{ConditionType, EventReason, Reason, Status};
use tether_api::{ManagedCluster, ManagedClusterStatus, MemberClusterAnnounce};
use tracing::{info, warn};

use crate::cleanup::{Removal, remove_member};
use crate::health::{Facts, Notice, Signals, Timings, Transition, Tunnel, Verdict, judge, transition};
use crate::write::{apply_status, event, key};
use crate::{Context, Error};

/// How long a just-approved member may lack its announce in the cache before it counts as left.
const ANNOUNCE_SETTLE: Duration = Duration::from_secs(2);

/// How soon a member is looked at again while the leader cannot see heartbeats.
const BLIND_RECHECK: Duration = Duration::from_secs(1);

/// Reconciles one member's health.
pub async fn reconcile(mc: Arc<ManagedCluster>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.wait_ready().await;
    if !ctx.is_leader() || mc.meta().deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let _timer = ctx.metrics.reconcile_timer("member");
    // NB: a Lease or tunnel event can start this look within milliseconds of the last one's
    // status write, before the cache shows it; judging the older object would write the same
    // change, and tell its Event, again.
    let key = key(mc.as_ref());
    let mc = ctx.written_clusters.current(&key, Some(mc.clone())).unwrap_or(mc);
    let namespace = mc.namespace().unwrap_or_default();
    let name = mc.name_any();
    let set = ctx.set_of(&mc).and_then(|set| ctx.leader_set(&set));
    // NB: a ban written into the set's spec (GitOps, or `tether member remove --ban` racing this
    // member's rejoin) removes the member at its next look; the set's controller nudges every
    // member of a set whose spec changed, so that look is at once. A ban names an ID, a name or
    // a key: whichever the member has.
    if let Some(s) = set.as_deref()
        && s.spec.leader.as_ref().is_some_and(|l| {
            l.ban_of(&mc.spec.cluster_id, &mc.name_any(), mc.spec.public_key.as_deref())
                .is_some()
        })
    {
        remove_member(&ctx, Some(s), &mc, Removal::Banned).await?;
        return Ok(Action::await_change());
    }
    if mc.spec.public_key.is_none() {
        migrate_key(&ctx, &mc).await?;
    }
    let announce_ref = ObjectRef::<MemberClusterAnnounce>::new(&name).within(&namespace);
    let Some(announce) = ctx.announces.get(&announce_ref) else {
        // NB: the announce comes from another watch than the ManagedCluster; confirm with a read
        // before taking its absence as the member leaving.
        let api = Api::<MemberClusterAnnounce>::namespaced(ctx.client.clone(), &namespace);
        let found = api
            .get_opt(&name)
            .await
            .map_err(Error::api::<MemberClusterAnnounce>(
                "get",
                Some(&namespace),
                &name,
            ))?;
        if found.is_some() {
            return Ok(Action::requeue(ANNOUNCE_SETTLE));
        }
        remove_member(&ctx, set.as_deref(), &mc, Removal::Left).await?;
        return Ok(Action::await_change());
    };

    // NB: heartbeats may have gone unseen while a heartbeat watch failed; judge nobody until
    // it works again (at most `health::QUIET` after its last error).
    let now = Instant::now();
    if ctx.health.is_blind(now) {
        return Ok(Action::requeue(BLIND_RECHECK));
    }
    let lease = ctx.leases.get(&ObjectRef::<Lease>::new(&name).within(&namespace));
    let renewed = latest(
        announce.spec.renew_time.as_ref(),
        lease.as_ref().and_then(|l| l.spec.as_ref()?.renew_time.as_ref()),
    );
    let obs = ctx.health.observe(&key, renewed, now, Timestamp::now());
    if let Some(interval) = obs.interval {
        ctx.metrics.heartbeat(interval);
    }
    let policy = set
        .as_ref()
        .and_then(|s| s.spec.leader.clone())
        .unwrap_or_default();
    let previous = mc
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let tunnel_now = tether_api::conditions::find(previous, ConditionType::TunnelConnected);
    // NB: a new term's grace is for members whose tunnel was attached (to the replica before):
    // they are re-attaching. One without a tunnel is judged by its heartbeat at once.
    let up_since = tunnel_now
        .filter(|c| c.status == Status::True.as_str())
        .map(|c| c.last_transition_time.0);
    let had_tunnel = up_since.is_some();
    ctx.health.start_term(now, Timestamp::now());
    let (tunnel, settle) = ctx.health.tunnel(&key, now, up_since);
    let signals = Signals {
        heartbeat: obs,
        tunnel,
        settling: settle
            .filter(|_| had_tunnel || tunnel != Tunnel::Unseen)
            .map(|until| until.saturating_duration_since(now)),
    };
    let timings = Timings::of(&policy);
    let verdict = judge(signals, timings);
    let recheck = match verdict {
        Verdict::Expired => {
            remove_member(&ctx, set.as_deref(), &mc, Removal::Expired).await?;
            return Ok(Action::await_change());
        }
        Verdict::Ready { recheck, .. } | Verdict::Unknown { recheck, .. } | Verdict::Hold { recheck } => {
            recheck
        }
    };
    if let Some(s) = set.as_deref()
        && ctx.is_leader()
    {
        ensure_lease(&ctx, s, &mc, lease.as_deref(), &policy).await?;
    }

    // NB: before the agent's first report, the version it registered with: the first status
    // write then carries the verdict, and no second write follows the report.
    let agent_version = mc
        .status
        .as_ref()
        .and_then(|s| s.agent_version.as_deref())
        .or_else(|| {
            mc.annotations()
                .get(tether_api::annotations::REGISTERED_AGENT_VERSION)
                .map(String::as_str)
        });
    let grace_period = policy.grace_period.to_string();
    let facts = Facts {
        previous,
        verdict,
        tunnel,
        timings,
        grace_period: &grace_period,
        agent_version,
        leader_version: crate::skew::LEADER_VERSION,
    };
    if let Some(change) = transition(&facts, Timestamp::now()) {
        // NB: the last heartbeat rides along with every Ready change (and the agent's periodic
        // report), so LAST HEARTBEAT is true at each transition without a write per heartbeat.
        let patch = ManagedClusterStatus {
            conditions: change.conditions.clone(),
            last_heartbeat_time: renewed.map(|t| Time(t.0)),
            ..ManagedClusterStatus::default()
        };
        let api = Api::<ManagedCluster>::namespaced(ctx.client.clone(), &namespace);
        let after = apply_status(&ctx, &api, &name, &patch).await?;
        ctx.written_clusters.wrote(key.clone(), Some(&mc), Some(after));
        tell(&ctx, &mc, &change, agent_version, obs.age).await;
    }
    Ok(Action::requeue(recheck))
}

/// Moves the key of a member approved by a leader before 0.3 out of the annotation it was kept
/// in (which anyone who may patch ManagedClusters can edit) into `spec.publicKey`, which is set
/// once and then never changes, and drops the annotation. A member whose annotation is missing
/// or not a key keeps no key: it cannot attach or rejoin until it registers again.
async fn migrate_key(ctx: &Context, mc: &ManagedCluster) -> Result<(), Error> {
    use kube::api::{Patch, PatchParams};
    let legacy = tether_api::annotations::LEGACY_PUBLIC_KEY;
    let Some(key) = mc
        .annotations()
        .get(legacy)
        .filter(|k| tether_seal::parse_recipient(k).is_ok())
    else {
        return Ok(());
    };
    let (namespace, name) = (mc.namespace().unwrap_or_default(), mc.name_any());
    ctx.ensure_leader()?;
    let patch = serde_json::json!({
        "metadata": {"annotations": {legacy: null}},
        "spec": {"publicKey": key},
    });
    Api::<ManagedCluster>::namespaced(ctx.client.clone(), &namespace)
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(Error::api::<ManagedCluster>("patch", Some(&namespace), &name))?;
    info!(member = %name, %namespace, "Moved the member's registered key into spec.publicKey");
    Ok(())
}

/// The later of two renewal times (an agent renews one of them: its Lease, or an agent from
/// before Leases its announce).
fn latest<'a>(a: Option<&'a MicroTime>, b: Option<&'a MicroTime>) -> Option<&'a MicroTime> {
    match (a, b) {
        (Some(a), Some(b)) => Some(if b.0 > a.0 { b } else { a }),
        (a, b) => a.or(b),
    }
}

/// The log line and Event of a status change: the agent outside the skew; the member lost,
/// recovered or ready for the first time.
async fn tell(
    ctx: &Context,
    mc: &ManagedCluster,
    change: &Transition,
    agent_version: Option<&str>,
    heartbeat_age: Duration,
) {
    let (name, id, set) = (mc.name_any(), &mc.spec.cluster_id, &mc.spec.cluster_set);
    if let Some(message) = &change.unsupported {
        warn!(cluster = %name, cluster_id = %id, %set, agent_version = agent_version.unwrap_or_default(),
              leader_version = crate::skew::LEADER_VERSION, "Member's agent is outside the supported version skew");
        event(
            ctx,
            mc,
            EventType::Warning,
            EventReason::AgentVersionUnsupported,
            "VersionSkew",
            message,
        )
        .await;
    }
    let message = change.message.as_str();
    let (kind, reason, action, message) = match change.notice {
        None => return,
        Some(Notice::Lost(reason)) => {
            warn!(cluster = %name, cluster_id = %id, %set, reason = reason.as_str(),
                  heartbeat_age_seconds = heartbeat_age.as_secs(), "Member lost");
            let action = if reason == Reason::TunnelLost {
                "Tunnel"
            } else {
                "Heartbeat"
            };
            (EventType::Warning, EventReason::MemberLost, action, message)
        }
        Some(Notice::Recovered) => {
            info!(cluster = %name, cluster_id = %id, %set, "Member recovered");
            (
                EventType::Normal,
                EventReason::MemberRecovered,
                "Heartbeat",
                message,
            )
        }
        Some(Notice::Ready) => {
            info!(cluster = %name, cluster_id = %id, %set, "Member ready");
            (
                EventType::Normal,
                EventReason::MemberReady,
                "Heartbeat",
                "first heartbeat received",
            )
        }
    };
    event(ctx, mc, kind, reason, action, message).await;
}

/// Makes sure member `mc` has its heartbeat Lease, telling its agent the set's intervals: a
/// member approved before Leases gets one (its agent renews the announce until then), and a
/// change of the set's intervals reaches every Lease. Writes nothing when it is as it should be.
async fn ensure_lease(
    ctx: &Context,
    set: &tether_api::ClusterSet,
    mc: &ManagedCluster,
    existing: Option<&Lease>,
    policy: &tether_api::clusterset::LeaderSpec,
) -> Result<(), Error> {
    let set_ref = tether_api::SetRef::of(set);
    let namespace = mc.namespace().unwrap_or_default();
    let want =
        crate::provision::heartbeat_lease(&set_ref, &namespace, &mc.name_any(), &mc.spec.cluster_id, policy);
    let current = existing.map(|l| {
        let a = l.annotations();
        (
            l.spec.as_ref().and_then(|s| s.lease_duration_seconds),
            crate::provision::LEASE_ANNOTATIONS.map(|k| a.get(k).cloned()),
        )
    });
    let wanted = {
        let a = want.annotations();
        (
            want.spec.as_ref().and_then(|s| s.lease_duration_seconds),
            crate::provision::LEASE_ANNOTATIONS.map(|k| a.get(k).cloned()),
        )
    };
    if current.as_ref() == Some(&wanted) {
        return Ok(());
    }
    let api = Api::<Lease>::namespaced(ctx.client.clone(), &namespace);
    // NB: a member approved a moment ago has its Lease already, made with the rest of its
    // objects; the Lease watch may not have delivered it yet. A read is cheaper than a write.
    if current.is_none()
        && let Ok(Some(found)) = api.get_opt(&mc.name_any()).await
    {
        let a = found.annotations();
        let fresh = (
            found.spec.as_ref().and_then(|s| s.lease_duration_seconds),
            crate::provision::LEASE_ANNOTATIONS.map(|k| a.get(k).cloned()),
        );
        if fresh == wanted {
            return Ok(());
        }
    }
    crate::write::apply(ctx, &api, &want).await.map(|_| ())
}

/// The ManagedCluster an announce or heartbeat Lease belongs to (same namespace and name).
pub fn owner<K: Resource>(obj: K) -> Option<ObjectRef<ManagedCluster>> {
    Some(ObjectRef::new(&obj.name_any()).within(&obj.namespace()?))
}
