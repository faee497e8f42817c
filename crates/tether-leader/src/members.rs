//! Reconciles ManagedClusters from their heartbeats: `Ready` follows the announce renewals seen in
//! memory (health.rs), with an Event on every loss and recovery; a deleted announce means the
//! member left, and a member silent past `memberExpiry` is removed. A heartbeat that changes
//! nothing writes nothing.

use std::sync::Arc;
use std::time::{Duration, Instant};

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
use crate::health::{Verdict, judge};
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

    // NB: heartbeats may have gone unseen while the announce watch failed; judge nobody until
    // it works again (at most `health::QUIET` after its last error).
    if ctx.health.is_blind(Instant::now()) {
        return Ok(Action::requeue(BLIND_RECHECK));
    }
    let obs = ctx.health.observe(
        &key(mc.as_ref()),
        announce.spec.renew_time.as_ref(),
        Instant::now(),
        Timestamp::now(),
    );
    if let Some(interval) = obs.interval {
        ctx.metrics.heartbeat(interval);
    }
    let policy = set
        .as_ref()
        .and_then(|s| s.spec.leader.clone())
        .unwrap_or_default();
    let (grace, expiry) = (policy.grace(), policy.expiry());
    let verdict = judge(obs, grace, expiry);
    let (status, reason) = verdict.condition();
    let recheck = match verdict {
        Verdict::Expired => {
            remove_member(&ctx, set.as_deref(), &mc, Removal::Expired).await?;
            return Ok(Action::await_change());
        }
        Verdict::Ready { recheck } | Verdict::Unknown { recheck, .. } => recheck,
    };

    let previous = mc
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let current = tether_api::conditions::find(previous, ConditionType::Ready);
    let ready_changed =
        current.map(|c| (c.status.as_str(), c.reason.as_str())) != Some((status.as_str(), reason.as_str()));
    let agent_version = mc.status.as_ref().and_then(|s| s.agent_version.as_deref());
    let (skew_status, skew_reason, skew_message) =
        crate::skew::judge(crate::skew::LEADER_VERSION, agent_version);
    let skew_now = tether_api::conditions::find(previous, ConditionType::AgentVersionSupported);
    let skew_changed = skew_now.map(|c| (c.status.as_str(), c.reason.as_str(), c.message.as_str()))
        != Some((skew_status.as_str(), skew_reason.as_str(), skew_message.as_str()));
    let message = match reason {
        Reason::AwaitingHeartbeat => "approved; waiting for the agent's first heartbeat".to_string(),
        Reason::HeartbeatExpired => format!(
            "no heartbeat for more than {}: check that the agent runs and reaches the leader",
            policy.grace_period
        ),
        _ => "heartbeats arrive".to_string(),
    };
    if ready_changed || skew_changed {
        // NB: both conditions go in every apply: the leader's field manager owns both, and an
        // apply without one would remove it.
        let now = Timestamp::now();
        let conditions = vec![
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
        // NB: the last heartbeat rides along with every Ready change (and the agent's periodic
        // report), so LAST HEARTBEAT is true at each transition without a write per heartbeat.
        let last_heartbeat_time = announce
            .spec
            .renew_time
            .as_ref()
            .map(|t| k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(t.0));
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
        let was_lost = current.is_some_and(|c| c.reason == Reason::HeartbeatExpired);
        if reason == Reason::HeartbeatExpired {
            warn!(cluster = %name, cluster_id = %mc.spec.cluster_id, set = %mc.spec.cluster_set,
                  age_seconds = obs.age.as_secs(), "Member lost: heartbeat expired");
            event(
                &ctx,
                mc.as_ref(),
                EventType::Warning,
                EventReason::MemberLost,
                "Heartbeat",
                &message,
            )
            .await;
        } else if status == Status::True && was_lost {
            info!(cluster = %name, cluster_id = %mc.spec.cluster_id, set = %mc.spec.cluster_set, "Member recovered");
            event(
                &ctx,
                mc.as_ref(),
                EventType::Normal,
                EventReason::MemberRecovered,
                "Heartbeat",
                "heartbeats resumed",
            )
            .await;
        } else if status == Status::True {
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

/// The ManagedCluster an announce belongs to (same namespace and name).
pub fn announce_owner(announce: MemberClusterAnnounce) -> Option<ObjectRef<ManagedCluster>> {
    Some(ObjectRef::new(&announce.name_any()).within(&announce.namespace()?))
}
