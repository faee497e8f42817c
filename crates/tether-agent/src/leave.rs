//! Leaving a ClusterSet: deregistering at the leader with the member's own credential, then
//! removing what the agent created here.

use std::time::Duration;

use kube::ResourceExt;
use kube::api::{Api, DeleteParams};
use tether_api::conditions::EventReason;
use tether_api::{ClusterSet, MemberClusterAnnounce, properties};
use tether_join::discovery;
use tracing::{info, warn};

use crate::{Context, Error, endpoint, state};

/// Deregisters at the leader: deletes the announce `name` with the member's credential (the
/// leader then removes the member). Already gone counts as done.
pub async fn deregister(api: &Api<MemberClusterAnnounce>, name: &str) -> Result<(), kube::Error> {
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Leaves: deregisters at the leader (deletes the announce), then removes the set's
/// ClusterProperty and the agent's Secrets here. An unreachable leader is given up on after
/// `leave_timeout`, with a Warning Event and log, so a leave never hangs forever.
pub(crate) async fn leave(ctx: &Context, set: &ClusterSet) -> Result<(), Error> {
    info!(set = %set.name_any(), "Leaving the ClusterSet");
    let stored = state::load_credential(&ctx.client, &ctx.namespace).await?;
    if let (Some(stored), Some(spec)) = (stored, set.spec.member.as_ref()) {
        let trust = if spec.insecure_skip_ca_verification
            && spec.ca_cert_hash.is_none()
            && spec.ca_bundle.is_none()
        {
            discovery::Trust::Insecure
        } else {
            discovery::Trust::Ca(stored.credential.ca_cert.clone())
        };
        let leader = endpoint::LeaderEndpoint {
            url: spec.leader_url.clone(),
            trust,
        };
        let client = leader.client(Some(&stored.credential.token))?;
        let api = Api::<MemberClusterAnnounce>::namespaced(client, &stored.credential.namespace);
        let deregister = async {
            loop {
                match deregister(&api, &spec.cluster_name).await {
                    Ok(()) => return Ok(()),
                    // The credential is dead: the leader cannot be told.
                    Err(kube::Error::Api(s)) if matches!(s.code, 401 | 403) => return Err(s.message),
                    Err(e) => {
                        warn!(
                            error = &e as &dyn std::error::Error,
                            "Deregistration failed; retrying"
                        );
                        tokio::time::sleep(Duration::from_secs(2)).await;
                    }
                }
            }
        };
        let why = match tokio::time::timeout(ctx.leave_timeout, deregister).await {
            Ok(Ok(())) => None,
            Ok(Err(rejected)) => Some(format!("the leader rejected the credential ({rejected})")),
            Err(_) => Some(format!(
                "could not reach the leader within {:?}",
                ctx.leave_timeout
            )),
        };
        match why {
            None => info!(set = %set.name_any(), "Deregistered at the leader"),
            Some(why) => {
                let msg = format!(
                    "{why}, so the leader was not told: it marks this member lost and removes it after \
                     memberExpiry, or an admin removes it there at once with `kubectl delete ns {}`",
                    stored.credential.namespace
                );
                warn!(set = %set.name_any(), "Leave incomplete: {msg}");
                ctx.event(set, true, EventReason::LeaveIncomplete, &msg).await;
            }
        }
    }
    state::delete_property(&ctx.client, properties::CLUSTER_SET).await?;
    state::delete_secret(&ctx.client, &ctx.namespace, state::CREDENTIAL_SECRET).await?;
    state::delete_secret(&ctx.client, &ctx.namespace, state::KEY_SECRET).await?;
    ctx.event(
        set,
        false,
        EventReason::Left,
        "left the ClusterSet; credential and key removed",
    )
    .await;
    Ok(())
}
