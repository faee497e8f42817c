//! Reconciles ClusterRegistrationRequests: decides (policy.rs), provisions the member's objects
//! (provision.rs), mints a TokenRequest token, seals it to the member's key and records the
//! result. Only Pending requests are acted on, so a token is minted once per approval.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use serde_json::json;
use tether_api::conditions::{HEARTBEAT_EXPIRED, READY};
use tether_api::registration::{RegistrationReason, RegistrationResult};
use tether_api::{ClusterRegistrationRequest, ClusterSet, ManagedCluster, MemberClusterAnnounce, duration};
use tether_seal::MemberCredential;
use tracing::{info, warn};

use crate::cleanup::{Removal, remove_member};
use crate::clusterset::set_in;
use crate::naming::{AGENT_SERVICE_ACCOUNT, member_namespace};
use crate::policy::{Decision, Member, decide};
use crate::provision::member_objects;
use crate::write::{apply, apply_status, event};
use crate::{Context, Error};

/// How long to wait for a replaced member's namespace to go before provisioning again.
const REPLACE_RETRY: Duration = Duration::from_secs(3);

/// Reconciles one registration request.
pub async fn reconcile(req: Arc<ClusterRegistrationRequest>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.wait_ready().await;
    let status = req.status.clone().unwrap_or_default();
    if status.result != RegistrationResult::Pending || !ctx.is_leader() {
        return Ok(Action::await_change());
    }
    // First come, first served: tokio's semaphore is fair.
    let _slot = ctx
        .provisioning
        .acquire()
        .await
        .map_err(|_| Error::Invariant("the provisioning semaphore is never closed"))?;
    let _timer = ctx.metrics.reconcile_timer("registration");
    let ns = req.namespace().unwrap_or_default();
    let set = set_in(&ctx.sets, &ns).or_else(|| {
        ctx.sets
            .state()
            .into_iter()
            .find(|s| s.namespace().as_deref() == Some(ns.as_str()))
    });
    let set_name = set.as_ref().map(|s| s.name_any()).unwrap_or_default();
    let members = members_of(&ctx, &set_name);
    match decide(&req, set.as_deref(), &members) {
        Decision::Wait { reason, message } => {
            if status.reason != reason {
                write_status(
                    &ctx,
                    &req,
                    json!({"result": "Pending", "reason": reason, "message": message}),
                )
                .await?;
                event(
                    &ctx,
                    req.as_ref(),
                    EventType::Normal,
                    "AwaitingApproval",
                    "Register",
                    &message,
                )
                .await;
            }
            Ok(Action::await_change())
        }
        Decision::Deny { reason, message } => {
            warn!(request = %req.name_any(), namespace = %ns, ?reason, %message, "Denied registration");
            write_status(
                &ctx,
                &req,
                json!({"result": "Denied", "reason": reason, "message": message}),
            )
            .await?;
            event(
                &ctx,
                req.as_ref(),
                EventType::Warning,
                "RegistrationDenied",
                "Register",
                &message,
            )
            .await;
            ctx.metrics.registrations(reason_label(reason));
            Ok(Action::await_change())
        }
        Decision::Approve { rejoin } => {
            let set = set.ok_or(Error::Invariant("approved without a ClusterSet"))?;
            approve(&req, &set, rejoin, &ctx).await
        }
    }
}

/// Members of a set as the policy sees them, from the ManagedCluster store.
fn members_of(ctx: &Context, set: &str) -> Vec<Member> {
    ctx.clusters
        .state()
        .iter()
        .filter(|mc| mc.spec.cluster_set == set)
        .map(|mc| Member {
            name: mc.name_any(),
            cluster_id: mc.spec.cluster_id.clone(),
            public_key: mc
                .annotations()
                .get(tether_api::annotations::PUBLIC_KEY)
                .cloned()
                .unwrap_or_default(),
            // NB: a member awaiting its first heartbeat is alive; only an expired one is not.
            alive: !mc.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == READY && c.reason == HEARTBEAT_EXPIRED)
            }) && mc.meta().deletion_timestamp.is_none(),
        })
        .collect()
}

async fn approve(
    req: &ClusterRegistrationRequest,
    set: &ClusterSet,
    rejoin: bool,
    ctx: &Context,
) -> Result<Action, Error> {
    let set_name = set.name_any();
    let name = req.spec.cluster_name.clone();
    let namespace = member_namespace(&set_name, &name);
    // A dead member with this name but another ID or key is replaced: its namespace goes first,
    // since the ManagedCluster's ID is immutable and its old credential must die.
    let existing = ctx.clusters.get(&ObjectRef::new(&name).within(&namespace));
    if let Some(old) = existing {
        let key = old.annotations().get(tether_api::annotations::PUBLIC_KEY);
        if old.meta().deletion_timestamp.is_some() {
            return Ok(Action::requeue(REPLACE_RETRY));
        }
        if old.spec.cluster_id != req.spec.cluster_id || key != Some(&req.spec.public_key) {
            info!(cluster = %name, old_id = %old.spec.cluster_id, new_id = %req.spec.cluster_id,
                  "Replacing an expired member with the same name");
            remove_member(ctx, None, &old, Removal::Expired).await?;
            return Ok(Action::requeue(REPLACE_RETRY));
        }
    }
    let policy = set.spec.leader.clone().unwrap_or_default();
    let heartbeat = duration::parse(&policy.heartbeat_interval).unwrap_or(Duration::from_secs(10));
    let ttl = duration::parse(&policy.credential_ttl).unwrap_or(Duration::from_secs(3600));
    let objs = member_objects(req, &set_name, &namespace, heartbeat.as_secs().max(1) as i32);

    let client = ctx.client.clone();
    // Three round trips instead of eight: the namespace; the ServiceAccount, Role and announce;
    // then what needs them (RoleBinding, ManagedCluster, token).
    apply(ctx, &Api::<Namespace>::all(client.clone()), &objs.namespace).await?;
    let (sa_api, role_api, binding_api, announce_api, clusters_api) = (
        Api::<ServiceAccount>::namespaced(client.clone(), &namespace),
        Api::<Role>::namespaced(client.clone(), &namespace),
        Api::<RoleBinding>::namespaced(client.clone(), &namespace),
        Api::<MemberClusterAnnounce>::namespaced(client.clone(), &namespace),
        Api::<ManagedCluster>::namespaced(client, &namespace),
    );
    // NB: the announce before the ManagedCluster: a member without one counts as having left.
    let (sa, role, announce) = futures::join!(
        apply(ctx, &sa_api, &objs.service_account),
        apply(ctx, &role_api, &objs.role),
        apply(ctx, &announce_api, &objs.announce),
    );
    sa?;
    role?;
    announce?;
    ctx.ensure_leader()?;
    let request = TokenRequest {
        spec: TokenRequestSpec {
            expiration_seconds: Some(ttl.as_secs() as i64),
            ..Default::default()
        },
        ..Default::default()
    };
    let post = PostParams::default();
    // NB: the RoleBinding after the Role: the API server resolves the Role to check escalation.
    let (binding, cluster, token) = futures::join!(
        apply(ctx, &binding_api, &objs.role_binding),
        apply(ctx, &clusters_api, &objs.managed_cluster),
        sa_api.create_token_request(AGENT_SERVICE_ACCOUNT, &post, &request),
    );
    binding?;
    cluster?;
    let token = token.map_err(|source| Error::Api {
        op: "mint member token",
        name: namespace.clone(),
        source,
    })?;
    let token_status = token
        .status
        .ok_or(Error::Invariant("TokenRequest answered without a token"))?;
    let expiry = token_status.expiration_timestamp.0.to_string();
    let credential = MemberCredential {
        token: token_status.token,
        expiration_timestamp: expiry.clone(),
        namespace: namespace.clone(),
        service_account: AGENT_SERVICE_ACCOUNT.into(),
        ca_cert: ctx.leader_ca.clone(),
    };
    let sealed = tether_seal::seal(&credential, &req.spec.public_key)?;
    let message = if rejoin {
        format!("re-registered; namespace {namespace}")
    } else {
        format!("joined ClusterSet {set_name}; namespace {namespace}")
    };
    write_status(
        ctx,
        req,
        json!({"result": "Approved", "reason": "Approved", "message": message, "namespace": namespace,
               "credential": {"sealed": sealed, "expirationTime": expiry}}),
    )
    .await?;
    info!(cluster = %name, cluster_id = %req.spec.cluster_id, set = %set_name, %namespace, rejoin, "Approved registration");
    event(
        ctx,
        req,
        EventType::Normal,
        "RegistrationApproved",
        "Register",
        &message,
    )
    .await;
    ctx.metrics.registrations("Approved");
    Ok(Action::await_change())
}

async fn write_status(
    ctx: &Context,
    req: &ClusterRegistrationRequest,
    status: serde_json::Value,
) -> Result<(), Error> {
    let api: Api<ClusterRegistrationRequest> =
        Api::namespaced(ctx.client.clone(), &req.namespace().unwrap_or_default());
    apply_status(ctx, &api, &req.name_any(), status).await
}

fn reason_label(reason: RegistrationReason) -> &'static str {
    match reason {
        RegistrationReason::DuplicateClusterID => "DuplicateClusterID",
        RegistrationReason::DuplicateClusterName => "DuplicateClusterName",
        RegistrationReason::NotAllowed => "NotAllowed",
        RegistrationReason::DeniedByAdmin => "DeniedByAdmin",
        RegistrationReason::ClusterSetNotFound => "ClusterSetNotFound",
        RegistrationReason::InvalidPublicKey => "InvalidPublicKey",
        RegistrationReason::ClusterSetDeleting => "ClusterSetDeleting",
        RegistrationReason::AwaitingLeader
        | RegistrationReason::AwaitingApproval
        | RegistrationReason::Approved => "Other",
    }
}
