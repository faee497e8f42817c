//! How long a decided registration request is kept. Both kinds go, as the API server's CSR
//! cleaner deletes decided CSRs after an hour:
//! - a request the policy denied, `Options::denied_retention` after its creation, so that agents
//!   retrying (a lost-state rejoin while the old member is live, a wrong name) do not pile
//!   requests up; an admin's denial stays until someone deletes it;
//! - an approved one, `Options::approved_retention` after its creation, once its member
//!   heartbeat after it was made (its agent unsealed the credential) or its credential expired
//!   (nothing left in it to read). It is needed only while its agent waits for the decision,
//!   and each one kept is an object per member in the API server, etcd and every cache of
//!   requests. A new leader after an upgrade finds every member's request past its retention;
//!   each deletion is put off by its own share of `SPREAD` so that they do not all go at once.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use tether_api::registration::{RegistrationReason, RegistrationResult};
use tether_api::{ClusterRegistrationRequest, ManagedCluster};
use tracing::{debug, info};

use crate::registration::requests_api;
use crate::write::delete;
use crate::{Context, Error};

/// At most this much is added to an approved request's retention, a fixed share of it per
/// request (and at most a quarter of the retention).
const SPREAD: Duration = Duration::from_secs(300);
/// How often an approved request past its retention whose member has not heartbeat since is
/// looked at again.
const RECHECK: Duration = Duration::from_secs(600);

/// Whether a request denied for `reason` is deleted after the retention: the policy's denials
/// are, an admin's decision is kept.
pub fn expires(reason: RegistrationReason) -> bool {
    reason != RegistrationReason::DeniedByAdmin
}

fn age(req: &ClusterRegistrationRequest, now: Timestamp) -> Duration {
    let created = req.meta().creation_timestamp.as_ref().map_or(now, |t| t.0);
    Duration::try_from(now.duration_since(created)).unwrap_or(Duration::ZERO)
}

/// How much longer the Denied `req` is kept at `now` (zero: delete it).
fn denied_left(req: &ClusterRegistrationRequest, retention: Duration, now: Timestamp) -> Duration {
    retention.saturating_sub(age(req, now))
}

/// This request's share of `SPREAD` (fixed: the same on every replica and every look).
fn spread(req: &ClusterRegistrationRequest, retention: Duration) -> Duration {
    let mut h = DefaultHasher::new();
    req.uid().unwrap_or_else(|| req.name_any()).hash(&mut h);
    let window = SPREAD.min(retention / 4).as_millis().max(1) as u64;
    Duration::from_millis(h.finish() % window)
}

/// How much longer the Approved `req` is kept at `now` (zero: delete it), its member being
/// `member` (its ManagedCluster, if any).
fn approved_left(
    req: &ClusterRegistrationRequest,
    member: Option<&ManagedCluster>,
    retention: Duration,
    now: Timestamp,
) -> Duration {
    let left = (retention + spread(req, retention)).saturating_sub(age(req, now));
    if !left.is_zero() {
        return left;
    }
    let created = req.meta().creation_timestamp.as_ref().map_or(now, |t| t.0);
    let heartbeat_since = member
        .and_then(|m| m.status.as_ref()?.last_heartbeat_time.as_ref())
        .is_some_and(|t| t.0 >= created);
    let expiry = req
        .status
        .as_ref()
        .and_then(|s| s.credential.as_ref()?.expiration_time.as_ref())
        .map(|t| t.0);
    let expired = expiry.is_none_or(|t| t <= now);
    if heartbeat_since || expired {
        return Duration::ZERO;
    }
    // NB: `expiry` is later than `now` here.
    let until_expiry = expiry
        .and_then(|t| Duration::try_from(t.duration_since(now)).ok())
        .unwrap_or(RECHECK);
    RECHECK.min(until_expiry + Duration::from_secs(1))
}

/// Deletes the Denied `req` once its retention has passed; until then, comes back when it has.
pub async fn expire_denied(req: &ClusterRegistrationRequest, ctx: &Context) -> Result<Action, Error> {
    let left = denied_left(req, ctx.denied_retention, Timestamp::now());
    if !left.is_zero() {
        return Ok(Action::requeue(left + Duration::from_secs(1)));
    }
    gone(req, ctx, RegistrationResult::Denied, ctx.denied_retention).await
}

/// Deletes the Approved `req` once it may go (`approved_left`); until then, comes back when it may.
pub async fn expire_approved(req: &ClusterRegistrationRequest, ctx: &Context) -> Result<Action, Error> {
    let member = req
        .status
        .as_ref()
        .and_then(|s| s.namespace.as_deref())
        .and_then(|ns| {
            ctx.clusters
                .get(&ObjectRef::new(&req.spec.cluster_name).within(ns))
        });
    let left = approved_left(req, member.as_deref(), ctx.approved_retention, Timestamp::now());
    if !left.is_zero() {
        return Ok(Action::requeue(left + Duration::from_secs(1)));
    }
    gone(req, ctx, RegistrationResult::Approved, ctx.approved_retention).await
}

/// Deletes `req`, decided as `decision`, whose `retention` has passed.
async fn gone(
    req: &ClusterRegistrationRequest,
    ctx: &Context,
    decision: RegistrationResult,
    retention: Duration,
) -> Result<Action, Error> {
    delete(ctx, &requests_api(ctx, req), &req.name_any()).await?;
    let namespace = req.namespace().unwrap_or_default();
    let (request, denied) = (req.name_any(), decision == RegistrationResult::Denied);
    let decision = format!("{decision:?}");
    // NB: a denial is rare and worth a line; approved requests go one per member.
    if denied {
        info!(%request, %namespace, %decision, ?retention, "Deleted a decided registration request after its retention");
    } else {
        debug!(%request, %namespace, %decision, ?retention, "Deleted a decided registration request after its retention");
    }
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use kube::api::ObjectMeta;
    use tether_api::registration::{RegistrationResult, SealedCredential};
    use tether_api::{
        ClusterRegistrationRequestSpec, ManagedClusterSpec, ManagedClusterStatus, RegistrationStatus,
    };

    const HOUR: Duration = Duration::from_secs(3600);

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).expect("time")
    }

    fn approved(uid: &str, created: i64, expires: Option<i64>) -> ClusterRegistrationRequest {
        let mut r = ClusterRegistrationRequest::new(
            "east-1",
            ClusterRegistrationRequestSpec {
                cluster_id: "id-east".into(),
                cluster_name: "east".into(),
                public_key: "age1...".into(),
                agent_version: None,
                labels: Default::default(),
            },
        );
        r.metadata = ObjectMeta {
            name: Some("east-1".into()),
            uid: Some(uid.into()),
            creation_timestamp: Some(Time(at(created))),
            ..ObjectMeta::default()
        };
        r.status = Some(RegistrationStatus {
            result: RegistrationResult::Approved,
            credential: Some(SealedCredential {
                sealed: "sealed".into(),
                expiration_time: expires.map(|s| Time(at(s))),
            }),
            ..RegistrationStatus::default()
        });
        r
    }

    fn member(heartbeat: Option<i64>) -> ManagedCluster {
        let spec = ManagedClusterSpec {
            cluster_id: "id-east".into(),
            cluster_set: "prod".into(),
            public_key: None,
        };
        let mut mc = ManagedCluster::new("east", spec);
        mc.status = Some(ManagedClusterStatus {
            last_heartbeat_time: heartbeat.map(|s| Time(at(s))),
            ..ManagedClusterStatus::default()
        });
        mc
    }

    #[test]
    fn an_approved_request_goes_after_its_retention_once_its_member_heartbeat_since() {
        let req = approved("uid-1", 0, Some(10 * 3600));
        let extra = spread(&req, HOUR);
        assert!(extra < SPREAD, "{extra:?}");
        let m = member(Some(5));
        let due = 3600 + extra.as_secs() as i64 + 1;
        assert!(
            !approved_left(&req, Some(&m), HOUR, at(3599)).is_zero(),
            "kept its retention"
        );
        assert_eq!(approved_left(&req, Some(&m), HOUR, at(due)), Duration::ZERO);

        // Its agent never heartbeat after the request: kept until the credential expires.
        for m in [Some(member(Some(-5))), Some(member(None)), None] {
            let left = approved_left(&req, m.as_ref(), HOUR, at(due));
            assert_eq!(left, RECHECK, "looked at again later");
            let near_expiry = approved_left(&req, m.as_ref(), HOUR, at(10 * 3600 - 30));
            assert_eq!(near_expiry, Duration::from_secs(31), "back just after the expiry");
            assert_eq!(
                approved_left(&req, m.as_ref(), HOUR, at(10 * 3600)),
                Duration::ZERO
            );
        }
        let no_expiry = approved("uid-1", 0, None);
        assert_eq!(approved_left(&no_expiry, None, HOUR, at(due)), Duration::ZERO);
    }

    #[test]
    fn deletions_after_an_upgrade_are_spread_over_minutes_not_all_at_once() {
        let shares: Vec<Duration> = (0..1000)
            .map(|i| spread(&approved(&format!("uid-{i}"), 0, None), HOUR))
            .collect();
        assert!(shares.iter().all(|s| *s < SPREAD));
        let first_minute = shares.iter().filter(|s| **s < Duration::from_secs(60)).count();
        assert!(
            (100..=300).contains(&first_minute),
            "about a fifth in each minute: {first_minute}"
        );
        assert_eq!(
            spread(&approved("uid-7", 0, None), HOUR),
            spread(&approved("uid-7", 0, None), HOUR),
            "the same on every look"
        );
        assert!(spread(&approved("uid-7", 0, None), Duration::from_secs(8)) < Duration::from_secs(2));
    }

    #[test]
    fn a_denied_request_goes_after_its_retention_from_creation() {
        let req = approved("uid-1", 0, None);
        assert_eq!(denied_left(&req, HOUR, at(600)), Duration::from_secs(3000));
        assert_eq!(denied_left(&req, HOUR, at(3600)), Duration::ZERO);
        assert!(expires(RegistrationReason::DuplicateClusterID));
        assert!(!expires(RegistrationReason::DeniedByAdmin));
    }
}
