//! A new credential when the stored one expired or was refused: by proving the member's key
//! (`rejoin.rs`), else by registering with the join token.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use tether_api::clusterset::MemberSpec;
use tether_api::conditions::{EventReason, Reason};
use tracing::warn;

use super::shared::{Shared, update};
use crate::endpoint::LeaderEndpoint;
use crate::register::{Registration, Target, register};
use crate::state::{self, Stored};
use crate::{Context, Error};

/// Who this agent is: the member's cluster ID and key pair.
pub(super) struct Identity<'a> {
    pub(super) cluster_id: &'a str,
    pub(super) identity: &'a str,
    pub(super) recipient: &'a str,
}

/// A new credential when the stored one (`previous`) expired or was refused: first by proving
/// the member's key (`rejoin.rs`: no join token needed, so any outage is survived), then, if the
/// leader will not take the member back that way, by registering with the join token.
pub(super) async fn acquire(
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
pub(super) async fn register_with_token(
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

pub(super) async fn join_token(ctx: &Context, spec: &MemberSpec) -> Result<String, Error> {
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
