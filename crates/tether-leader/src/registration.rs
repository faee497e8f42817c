//! Reconciles ClusterRegistrationRequests: decides (policy.rs), provisions the member's objects
//! (provision.rs), mints a TokenRequest token, seals it to the member's key and records the
//! result. Only Pending requests are acted on, so a token is minted once per approval.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;
use tether_api::registration::{RegistrationReason, RegistrationResult};
use tether_api::{ClusterRegistrationRequest, ClusterSet, ManagedCluster, MemberClusterAnnounce, duration};
use tether_seal::MemberCredential;
use tracing::{info, warn};

use crate::naming::{AGENT_SERVICE_ACCOUNT, member_namespace};
use crate::policy::{Decision, Member, decide};
use crate::provision::{FIELD_MANAGER, member_objects};
use crate::{Context, Error};

/// Reconciles one registration request.
pub async fn reconcile(req: Arc<ClusterRegistrationRequest>, ctx: Arc<Context>) -> Result<Action, Error> {
    let status = req.status.clone().unwrap_or_default();
    if status.result != RegistrationResult::Pending {
        return Ok(Action::await_change());
    }
    let ns = req.namespace().unwrap_or_default();
    let set = ctx
        .sets
        .state()
        .into_iter()
        .find(|s| s.namespace().as_deref() == Some(ns.as_str()));
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
                event(&ctx, &req, EventType::Normal, "AwaitingApproval", &message).await;
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
            event(&ctx, &req, EventType::Warning, "RegistrationDenied", &message).await;
            ctx.metrics.registrations(reason_label(reason));
            Ok(Action::await_change())
        }
        Decision::Approve { rejoin } => {
            let set = set.ok_or(Error::Invariant("approved without a ClusterSet"))?;
            approve(&req, &set, rejoin, &ctx).await?;
            ctx.metrics.registrations("Approved");
            Ok(Action::await_change())
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
            alive: !mc.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "Unknown")
            }),
        })
        .collect()
}

async fn approve(
    req: &ClusterRegistrationRequest,
    set: &ClusterSet,
    rejoin: bool,
    ctx: &Context,
) -> Result<(), Error> {
    let set_name = set.name_any();
    let name = req.spec.cluster_name.clone();
    let namespace = member_namespace(&set_name, &name);
    let policy = set.spec.leader.clone().unwrap_or_default();
    let heartbeat = duration::parse(&policy.heartbeat_interval).unwrap_or(Duration::from_secs(10));
    let ttl = duration::parse(&policy.credential_ttl).unwrap_or(Duration::from_secs(3600));
    let objs = member_objects(req, &set_name, &namespace, heartbeat.as_secs().max(1) as i32);

    let client = ctx.client.clone();
    apply(Api::<Namespace>::all(client.clone()), &objs.namespace).await?;
    apply(
        Api::<ServiceAccount>::namespaced(client.clone(), &namespace),
        &objs.service_account,
    )
    .await?;
    apply(Api::<Role>::namespaced(client.clone(), &namespace), &objs.role).await?;
    apply(
        Api::<RoleBinding>::namespaced(client.clone(), &namespace),
        &objs.role_binding,
    )
    .await?;
    apply(
        Api::<ManagedCluster>::namespaced(client.clone(), &namespace),
        &objs.managed_cluster,
    )
    .await?;
    apply(
        Api::<MemberClusterAnnounce>::namespaced(client.clone(), &namespace),
        &objs.announce,
    )
    .await?;

    let token = Api::<ServiceAccount>::namespaced(client, &namespace)
        .create_token_request(
            AGENT_SERVICE_ACCOUNT,
            &PostParams::default(),
            &TokenRequest {
                spec: TokenRequestSpec {
                    expiration_seconds: Some(ttl.as_secs() as i64),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .map_err(|source| Error::Api {
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
    event(ctx, req, EventType::Normal, "RegistrationApproved", &message).await;
    Ok(())
}

/// Server-side applies an object the leader owns.
async fn apply<K>(api: Api<K>, obj: &K) -> Result<(), Error>
where
    K: Resource + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
    K::DynamicType: Default,
{
    let name = obj.meta().name.clone().unwrap_or_default();
    let mut body = serde_json::to_value(obj).map_err(|e| Error::Serialize(e.to_string()))?;
    let dt = K::DynamicType::default();
    body["apiVersion"] = json!(K::api_version(&dt));
    body["kind"] = json!(K::kind(&dt));
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(body),
    )
    .await
    .map_err(|source| Error::Api {
        op: "apply member object",
        name,
        source,
    })?;
    Ok(())
}

async fn write_status(
    ctx: &Context,
    req: &ClusterRegistrationRequest,
    status: serde_json::Value,
) -> Result<(), Error> {
    let api: Api<ClusterRegistrationRequest> =
        Api::namespaced(ctx.client.clone(), &req.namespace().unwrap_or_default());
    let body = json!({"apiVersion": "multicluster.tether.dev/v1alpha1", "kind": "ClusterRegistrationRequest",
                      "status": status});
    api.patch_status(
        &req.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(body),
    )
    .await
    .map_err(|source| Error::Api {
        op: "patch request status",
        name: req.name_any(),
        source,
    })?;
    Ok(())
}

async fn event(ctx: &Context, req: &ClusterRegistrationRequest, type_: EventType, reason: &str, note: &str) {
    let ev = Event {
        type_,
        reason: reason.into(),
        note: Some(note.chars().take(1000).collect()),
        action: "Register".into(),
        secondary: None,
    };
    if let Err(err) = ctx.recorder.publish(&ev, &req.object_ref(&())).await {
        warn!(error = &err as &dyn std::error::Error, "Cannot publish event");
    }
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
