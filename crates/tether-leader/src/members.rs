//! Reconciles ManagedClusters from their heartbeats: `Ready` follows the announce renewals seen in
//! memory (health.rs), with an Event on every loss and recovery; a deleted announce means the
//! member left, and a member silent past `memberExpiry` is removed. A heartbeat that changes
//! nothing writes nothing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
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
use crate::health::{Signals, Timings, Tunnel, Verdict, judge};
use crate::status::condition;
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
    let namespace = mc.namespace().unwrap_or_default();
    let name = mc.name_any();
    let set = ctx.set_of(&mc).and_then(|set| ctx.leader_set(&set));
    // NB: a ban written into the set's spec (GitOps, or `tether member remove --ban` racing this
    // member's rejoin) removes the member at its next look.
    if let Some(s) = set.as_deref()
        && s.spec
            .leader
            .as_ref()
            .is_some_and(|l| l.is_banned(&mc.spec.cluster_id))
    {
        remove_member(&ctx, Some(s), &mc, Removal::Banned).await?;
        return Ok(Action::await_change());
    }
    let announce_ref = ObjectRef::<MemberClusterAnnounce>::new(&name).within(&namespace);
    let Some(announce) = ctx.announces.get(&announce_ref) else {
        // NB: the announce comes from another watch than the ManagedCluster; confirm with a read
        // before taking its absence as the member leaving.
        let api = Api::<MemberClusterAnnounce>::namespaced(ctx.client.clone(), &namespace);
        let found = api.get_opt(&name).await.map_err(|source| Error::Api {
            op: "get announce",
            name: name.clone(),
            source,
        })?;
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
    let key = key(mc.as_ref());
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
    ctx.health.start_term(now);
    let (tunnel, settle) = ctx.health.tunnel(&key, now);
    let previous = mc
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let tunnel_now = tether_api::conditions::find(previous, ConditionType::TunnelConnected);
    // NB: a new term's grace is for members whose tunnel was attached (to the replica before):
    // they are re-attaching. One without a tunnel is judged by its heartbeat at once.
    let had_tunnel = tunnel_now.is_some_and(|c| c.status == Status::True.as_str());
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

    let current = tether_api::conditions::find(previous, ConditionType::Ready);
    // NB: a verdict on hold keeps what the member's condition says (or, for a member never
    // judged, waits for its first heartbeat).
    let (status, reason) = verdict.condition().unwrap_or_else(|| {
        current
            .and_then(|c| {
                let status = [Status::True, Status::False, Status::Unknown]
                    .into_iter()
                    .find(|s| c.status == s.as_str())?;
                Some((status, c.reason.parse().ok()?))
            })
            .unwrap_or((Status::Unknown, Reason::AwaitingHeartbeat))
    });
    let ready_changed =
        current.map(|c| (c.status.as_str(), c.reason.as_str())) != Some((status.as_str(), reason.as_str()));
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
    let (skew_status, skew_reason, skew_message) =
        crate::skew::judge(crate::skew::LEADER_VERSION, agent_version);
    let skew_now = tether_api::conditions::find(previous, ConditionType::AgentVersionSupported);
    let skew_changed = skew_now.map(|c| (c.status.as_str(), c.reason.as_str(), c.message.as_str()))
        != Some((skew_status.as_str(), skew_reason.as_str(), skew_message.as_str()));
    let tunnel_want = tunnel_condition(tunnel, &verdict, tunnel_now);
    let tunnel_changed = tunnel_want.as_ref().is_some_and(|(s, r, _)| {
        tunnel_now.map(|c| (c.status.as_str(), c.reason.as_str())) != Some((s.as_str(), r.as_str()))
    });
    let message = match (reason, current) {
        (Reason::AwaitingHeartbeat, _) => "approved; waiting for the agent's first heartbeat".to_string(),
        (Reason::HeartbeatExpired, _) => format!(
            "no heartbeat for more than {}: check that the agent runs and reaches the leader",
            if matches!(tunnel, Tunnel::Attached) {
                humantime(timings.tunnel_grace)
            } else {
                policy.grace_period.to_string()
            }
        ),
        (Reason::TunnelLost, _) => format!(
            "the agent's tunnel closed or stopped answering pings, and within {} the agent neither \
             attached it again nor renewed its heartbeat: check that the agent runs and reaches the leader",
            humantime(timings.detection)
        ),
        (Reason::TunnelAlive, _) => "the agent's tunnel is attached and answers pings".to_string(),
        (_, Some(c)) if !ready_changed => c.message.clone(),
        _ => "heartbeats arrive".to_string(),
    };
    if ready_changed || skew_changed || tunnel_changed {
        // NB: every condition the leader owns goes in every apply: the leader's field manager
        // owns them, and an apply without one would remove it.
        let now = Timestamp::now();
        let mut conditions = vec![
            condition(
                previous,
                ConditionType::Ready,
                status,
                reason,
                message.clone(),
                now,
            ),
            condition(
                previous,
                ConditionType::AgentVersionSupported,
                skew_status,
                skew_reason,
                skew_message.clone(),
                now,
            ),
        ];
        match (&tunnel_want, tunnel_now) {
            (Some((s, r, m)), _) => conditions.push(condition(
                previous,
                ConditionType::TunnelConnected,
                *s,
                *r,
                m.clone(),
                now,
            )),
            (None, Some(c)) => conditions.push(c.clone()),
            (None, None) => {}
        }
        // NB: the last heartbeat rides along with every Ready change (and the agent's periodic
        // report), so LAST HEARTBEAT is true at each transition without a write per heartbeat.
        let last_heartbeat_time = renewed.map(|t| k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(t.0));
        let patch = ManagedClusterStatus {
            conditions,
            last_heartbeat_time,
            ..ManagedClusterStatus::default()
        };
        let api = Api::<ManagedCluster>::namespaced(ctx.client.clone(), &namespace);
        apply_status(&ctx, &api, &name, &patch).await?;
    }
    if skew_changed && skew_status == Status::False {
        warn!(cluster = %name, cluster_id = %mc.spec.cluster_id, set = %mc.spec.cluster_set,
              agent_version = agent_version.unwrap_or_default(), leader_version = crate::skew::LEADER_VERSION,
              "Member's agent is outside the supported version skew");
        event(
            &ctx,
            mc.as_ref(),
            EventType::Warning,
            EventReason::AgentVersionUnsupported,
            "VersionSkew",
            &skew_message,
        )
        .await;
    }
    if ready_changed {
        let lost = |r: &str| r == Reason::HeartbeatExpired.as_str() || r == Reason::TunnelLost.as_str();
        let was_lost = current.is_some_and(|c| lost(&c.reason));
        let was_ready = current.is_some_and(|c| c.status == Status::True.as_str());
        if lost(reason.as_str()) && !was_lost {
            warn!(cluster = %name, cluster_id = %mc.spec.cluster_id, set = %mc.spec.cluster_set,
                  reason = reason.as_str(), heartbeat_age_seconds = obs.age.as_secs(), "Member lost");
            let action = if reason == Reason::TunnelLost {
                "Tunnel"
            } else {
                "Heartbeat"
            };
            event(
                &ctx,
                mc.as_ref(),
                EventType::Warning,
                EventReason::MemberLost,
                action,
                &message,
            )
            .await;
        } else if status == Status::True && was_lost {
            info!(cluster = %name, cluster_id = %mc.spec.cluster_id, set = %mc.spec.cluster_set,
                  reason = reason.as_str(), "Member recovered");
            event(
                &ctx,
                mc.as_ref(),
                EventType::Normal,
                EventReason::MemberRecovered,
                "Heartbeat",
                &message,
            )
            .await;
        } else if status == Status::True && !was_ready {
            info!(cluster = %name, cluster_id = %mc.spec.cluster_id, set = %mc.spec.cluster_set, "Member ready");
            event(
                &ctx,
                mc.as_ref(),
                EventType::Normal,
                EventReason::MemberReady,
                "Heartbeat",
                "first heartbeat received",
            )
            .await;
        }
    }
    Ok(Action::requeue(recheck))
}

/// The later of two renewal times (an agent renews one of them: its Lease, or an agent from
/// before Leases its announce).
fn latest<'a>(a: Option<&'a MicroTime>, b: Option<&'a MicroTime>) -> Option<&'a MicroTime> {
    match (a, b) {
        (Some(a), Some(b)) => Some(if b.0 > a.0 { b } else { a }),
        (a, b) => a.or(b),
    }
}

/// What the TunnelConnected condition should say, if the leader knows better than what it says
/// now: attached; closed for good (the verdict is no longer on hold); or, past the new term's
/// grace, no tunnel at this replica although the condition still says connected.
fn tunnel_condition(
    tunnel: Tunnel,
    verdict: &Verdict,
    now: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
) -> Option<(Status, Reason, String)> {
    let says_connected = now.is_some_and(|c| c.status == Status::True.as_str());
    match (tunnel, verdict) {
        (Tunnel::Attached, _) => Some((
            Status::True,
            Reason::TunnelAttached,
            "the agent's tunnel is attached to the active leader".to_string(),
        )),
        (_, Verdict::Hold { .. }) => None,
        (Tunnel::Closed { .. }, _) => Some((
            Status::False,
            Reason::TunnelClosed,
            "the agent's tunnel closed; it reconnects by itself".to_string(),
        )),
        (Tunnel::Unseen, _) if says_connected => Some((
            Status::False,
            Reason::NoTunnel,
            "no tunnel reached the active leader".to_string(),
        )),
        (Tunnel::Unseen, _) => None,
    }
}

/// `d` as a Go duration would print it (`15s`, `20m0s`).
fn humantime(d: Duration) -> String {
    kube::core::Duration::from(d).to_string()
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
    crate::write::apply(ctx, &api, &want).await
}

/// The ManagedCluster an announce or heartbeat Lease belongs to (same namespace and name).
pub fn owner<K: Resource>(obj: K) -> Option<ObjectRef<ManagedCluster>> {
    Some(ObjectRef::new(&obj.name_any()).within(&obj.namespace()?))
}
