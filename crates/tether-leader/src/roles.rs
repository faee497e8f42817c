//! Brings the agent Roles an earlier leader version made up to this version's rules, once per
//! leadership term: a member approved before member access existed has no `attach` rule, so its
//! agent could not open its tunnel until it registered again. One paged LIST of the leader-made
//! agent Roles (memory bounded by the page, not the fleet), and a write only for a Role whose
//! rules differ: an ordinary failover writes nothing.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::rbac::v1::Role;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kube::runtime::reflector::ObjectRef;
use tether_api::{ManagedCluster, labels};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::naming::AGENT_ROLE;
use crate::provision::{FIELD_MANAGER, outdated_agent_role};
use crate::{Context, Error, write};

/// Roles per LIST page.
const PAGE: u32 = 500;

/// Updates every outdated agent Role of a live member; how many it updated.
pub async fn refresh(ctx: &Context) -> Result<usize, Error> {
    let api = Api::<Role>::all(ctx.client.clone());
    let mut params = ListParams::default()
        .fields(&format!("metadata.name={AGENT_ROLE}"))
        .labels(&format!(
            "{}={FIELD_MANAGER},{}",
            labels::MANAGED_BY,
            labels::CLUSTER_NAME
        ))
        .limit(PAGE);
    let mut updated = 0;
    loop {
        let page = api
            .list(&params)
            .await
            .map_err(Error::api::<Role>("list", None, AGENT_ROLE))?;
        for role in &page.items {
            let Some(want) = outdated_agent_role(role) else {
                continue;
            };
            // NB: only for a member the leader still has; a Role left in a namespace being
            // deleted goes with it.
            let ns = role.namespace().unwrap_or_default();
            let member = role
                .labels()
                .get(labels::CLUSTER_NAME)
                .cloned()
                .unwrap_or_default();
            if ctx
                .clusters
                .get(&ObjectRef::<ManagedCluster>::new(&member).within(&ns))
                .is_none_or(|mc| mc.metadata.deletion_timestamp.is_some())
            {
                continue;
            }
            write::apply(ctx, &Api::<Role>::namespaced(ctx.client.clone(), &ns), &want).await?;
            info!(namespace = %ns, member = %member, "Updated the agent Role to this version's rules");
            updated += 1;
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(next) => params = params.continue_token(&next),
            None => return Ok(updated),
        }
    }
}

/// Runs `refresh` each time this replica gains leadership (after the caches are complete),
/// retrying while it leads until one pass succeeds.
pub async fn on_each_term(ctx: Arc<Context>, mut leader: watch::Receiver<bool>) {
    loop {
        if leader.wait_for(|l| *l).await.is_err() {
            return;
        }
        ctx.wait_ready().await;
        while ctx.is_leader() {
            match refresh(&ctx).await {
                Ok(n) => {
                    if n > 0 {
                        info!(updated = n, "Agent Roles brought up to date");
                    }
                    break;
                }
                Err(Error::NotLeader) => break,
                Err(err) => {
                    warn!(
                        error = &err as &dyn std::error::Error,
                        "Cannot check the agent Roles; retrying"
                    );
                    tokio::time::sleep(Duration::from_secs(10)).await;
                }
            }
        }
        if leader.wait_for(|l| !*l).await.is_err() {
            return;
        }
    }
}
