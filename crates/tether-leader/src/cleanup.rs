//! Removing members and sets completely: a member's dedicated namespace (its credentials die with
//! its ServiceAccount) and its registration requests; for a set, every member plus the set's
//! join tokens and their RBAC.

use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::events::EventType;
use tether_api::conditions::EventReason;
use tether_api::{ClusterRegistrationRequest, ClusterSet, ManagedCluster, SetRef};
use tracing::info;

use crate::write::{delete, delete_labelled, event, key};
use crate::{Context, Error};

/// Why a member is removed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Removal {
    /// It deleted its announce (`tether leave`).
    Left,
    /// It was silent longer than the set's `memberExpiry`.
    Expired,
    /// Its ClusterSet is being destroyed.
    SetDeleted,
    /// Its cluster ID is in the set's `bannedClusterIDs`.
    Banned,
}

impl Removal {
    fn reason(self) -> EventReason {
        match self {
            Removal::Left => EventReason::MemberLeft,
            Removal::Expired => EventReason::MemberExpired,
            Removal::SetDeleted | Removal::Banned => EventReason::MemberRemoved,
        }
    }
}

/// Removes a member: Event on its set, its requests, then its dedicated namespace.
pub async fn remove_member(
    ctx: &Context,
    set: Option<&ClusterSet>,
    mc: &ManagedCluster,
    why: Removal,
) -> Result<(), Error> {
    let namespace = mc.namespace().unwrap_or_default();
    let name = mc.name_any();
    let id = &mc.spec.cluster_id;
    if let Some(set) = set {
        let note = match why {
            Removal::Left => format!("member {name} ({id}) left; removing namespace {namespace}"),
            Removal::Expired => {
                format!("member {name} ({id}) silent past memberExpiry; removing namespace {namespace}")
            }
            Removal::SetDeleted => format!("removing member {name} ({id}) with its ClusterSet"),
            Removal::Banned => {
                format!("member {name}'s cluster ID {id} is banned; removing namespace {namespace}")
            }
        };
        event(ctx, set, EventType::Normal, why.reason(), "RemoveMember", &note).await;
        // NB: the request is what a rejoining agent would find again; remove it with the member.
        let home = set.namespace().unwrap_or_default();
        let requests: Api<ClusterRegistrationRequest> = Api::namespaced(ctx.client.clone(), &home);
        for req in ctx
            .requests
            .state()
            .iter()
            .filter(|r| r.namespace().as_deref() == Some(home.as_str()) && r.spec.cluster_id == *id)
        {
            delete(ctx, &requests, &req.name_any()).await?;
        }
    }
    // NB: the ManagedCluster first, so the set's status drops the member at once; the namespace
    // controller would take seconds to reach it.
    delete(
        ctx,
        &Api::<ManagedCluster>::namespaced(ctx.client.clone(), &namespace),
        &name,
    )
    .await?;
    delete(ctx, &Api::<Namespace>::all(ctx.client.clone()), &namespace).await?;
    ctx.health.forget(&key(mc));
    ctx.metrics.member_removed(why.reason().as_str());
    info!(cluster = %name, cluster_id = %id, set = %mc.spec.cluster_set, %namespace, reason = %why.reason(),
          "Removed member");
    Ok(())
}

/// Removes everything of a set being destroyed: members, requests, join tokens and their RBAC.
pub async fn destroy_set(
    ctx: &Context,
    set: &ClusterSet,
    members: &[std::sync::Arc<ManagedCluster>],
) -> Result<(), Error> {
    for mc in members {
        remove_member(ctx, Some(set), mc, Removal::SetDeleted).await?;
    }
    let home = set.namespace().unwrap_or_default();
    let set_name = set.name_any();
    let requests: Api<ClusterRegistrationRequest> = Api::namespaced(ctx.client.clone(), &home);
    for req in ctx
        .requests
        .state()
        .iter()
        .filter(|r| r.namespace().as_deref() == Some(home.as_str()))
    {
        delete(ctx, &requests, &req.name_any()).await?;
    }
    // NB: both labels: another namespace may hold a set with the same ID.
    let selector = SetRef::of(set).selector();
    // Join tokens are bootstrap-token Secrets in kube-system, labelled with their set by the CLI.
    delete_labelled(
        ctx,
        &Api::<Secret>::namespaced(ctx.client.clone(), "kube-system"),
        &selector,
    )
    .await?;
    delete_labelled(
        ctx,
        &Api::<RoleBinding>::namespaced(ctx.client.clone(), &home),
        &selector,
    )
    .await?;
    delete_labelled(
        ctx,
        &Api::<Role>::namespaced(ctx.client.clone(), &home),
        &selector,
    )
    .await?;
    info!(set = %set_name, namespace = %home, members = members.len(), "Destroyed ClusterSet");
    Ok(())
}
