//! Reconciles ClusterRegistrationRequests: decides (policy.rs), provisions the member's objects
//! (provision.rs), mints a TokenRequest token, seals it to the member's key and records the
//! result. Only Pending requests are acted on, so a token is minted once per approval. Decided
//! requests are deleted after their retention (retention.rs).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use tether_api::conditions::{ConditionType, EventReason, Reason, find};
use tether_api::registration::{RegistrationReason, RegistrationResult, SealedCredential};
use tether_api::{ClusterRegistrationRequest, ClusterSet, ManagedCluster, RegistrationStatus, SetRef};
use tether_seal::MemberCredential;
use tracing::{info, warn};

use crate::approval::{Plan, plan_approval};
use crate::cleanup::{Removal, remove_member};
use crate::clusterset::set_in;
use crate::naming::{AGENT_SERVICE_ACCOUNT, member_namespace};
use crate::policy::{Decision, Member, decide};
use crate::provision::{MemberObjects, member_objects};
use crate::retention::{expire_approved, expire_denied, expires};
use crate::write::{apply, apply_status, delete, event, key};
use crate::{Context, Error};

/// How long to wait for a replaced member's namespace to go before provisioning again.
const REPLACE_RETRY: Duration = Duration::from_secs(3);
/// How often a request that names a silent member with another key is looked at again.
const CONFLICT_RECHECK: Duration = Duration::from_secs(30);

/// Reconciles one registration request.
pub async fn reconcile(req: Arc<ClusterRegistrationRequest>, ctx: Arc<Context>) -> Result<Action, Error> {
    // NB: this controller runs without a concurrency limit, so a new leader listing 10,000
    // requests starts a reconcile per request that all wait here for the caches at once. The
    // work is boxed after the wait: a waiting reconcile then holds a few hundred bytes, not the
    // whole state machine (12 KB measured, 120 MB at 10,000 requests).
    ctx.wait_ready().await;
    Box::pin(act(req, ctx)).await
}

async fn act(req: Arc<ClusterRegistrationRequest>, ctx: Arc<Context>) -> Result<Action, Error> {
    if !ctx.is_leader() {
        return Ok(Action::await_change());
    }
    // NB: a set's spec change re-queues its requests; a look that runs before the watch
    // delivered this controller's last status write would take an approved request for a
    // Pending one and mint, seal and announce its credential again.
    let req = ctx
        .written_requests
        .current(&key(req.as_ref()), Some(req.clone()))
        .unwrap_or(req);
    let status = req.status.clone().unwrap_or_default();
    if status.result == RegistrationResult::Denied && expires(status.reason) {
        return expire_denied(&req, &ctx).await;
    }
    if status.result == RegistrationResult::Approved {
        return expire_approved(&req, &ctx).await;
    }
    if status.result != RegistrationResult::Pending {
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
    let set = set_in(&ctx.sets, &ns);
    let members = set
        .as_ref()
        .map(|s| members_of(&ctx, &SetRef::of(s)))
        .unwrap_or_default();
    match decide(&req, set.as_deref(), &members) {
        Decision::Wait { reason, message } => {
            // NB: a request naming a silent member with another key is a possible takeover: a
            // Warning; and it is looked at again, since that member may come back (a duplicate)
            // or be removed by an admin (then nothing collides).
            let conflict = reason == RegistrationReason::ReplacesMember;
            if status.reason != reason {
                write_status(&ctx, &req, RegistrationResult::Pending, reason, &message).await?;
                event(
                    &ctx,
                    req.as_ref(),
                    if conflict {
                        EventType::Warning
                    } else {
                        EventType::Normal
                    },
                    EventReason::AwaitingApproval,
                    "Register",
                    &message,
                )
                .await;
            }
            Ok(if conflict {
                Action::requeue(CONFLICT_RECHECK)
            } else {
                Action::await_change()
            })
        }
        Decision::Deny { reason, message } => deny(&ctx, &req, reason, &message).await,
        Decision::Approve { rejoin } => {
            let set = set.ok_or(Error::Invariant("approved without a ClusterSet"))?;
            approve(&req, &set, rejoin, &ctx).await
        }
    }
}

async fn deny(
    ctx: &Context,
    req: &ClusterRegistrationRequest,
    reason: RegistrationReason,
    message: &str,
) -> Result<Action, Error> {
    warn!(request = %req.name_any(), namespace = %req.namespace().unwrap_or_default(), ?reason, %message,
          "Denied registration");
    write_status(ctx, req, RegistrationResult::Denied, reason, message).await?;
    event(
        ctx,
        req,
        EventType::Warning,
        EventReason::RegistrationDenied,
        "Register",
        message,
    )
    .await;
    ctx.metrics.registrations(reason_label(reason));
    if expires(reason) {
        expire_denied(req, ctx).await
    } else {
        Ok(Action::await_change())
    }
}

/// Members of a set as the policy sees them, from the ManagedCluster store.
fn members_of(ctx: &Context, set: &SetRef) -> Vec<Member> {
    ctx.members_of(set)
        .iter()
        .map(|mc| Member {
            name: mc.name_any(),
            cluster_id: mc.spec.cluster_id.clone(),
            public_key: mc.spec.public_key.clone().unwrap_or_default(),
            // NB: a member awaiting its first heartbeat is alive; one whose heartbeat expired or
            // whose tunnel was lost is not (alive or not, another key is never approved by
            // policy: this only decides between a duplicate and a wait for an admin).
            alive: !mc.status.as_ref().is_some_and(|s| {
                find(&s.conditions, ConditionType::Ready)
                    .is_some_and(|c| c.reason == Reason::HeartbeatExpired || c.reason == Reason::TunnelLost)
            }),
        })
        .collect()
}

/// Where a member of `set` named `name` lives: the namespace of its existing ManagedCluster
/// (so a rejoin never moves it), else the name computed for it.
fn namespace_for(ctx: &Context, set: &SetRef, name: &str) -> (String, Option<Arc<ManagedCluster>>) {
    let existing = ctx
        .clusters
        .state()
        .into_iter()
        .find(|mc| mc.name_any() == name && ctx.set_of(mc).as_ref() == Some(set));
    match existing {
        Some(mc) => (mc.namespace().unwrap_or_default(), Some(mc)),
        None => (member_namespace(set, name), None),
    }
}

/// Executes the approval plan (approval.rs) for `req`: replace, wait, deny, or provision.
async fn approve(
    req: &ClusterRegistrationRequest,
    set: &ClusterSet,
    rejoin: bool,
    ctx: &Context,
) -> Result<Action, Error> {
    let set_ref = SetRef::of(set);
    let name = &req.spec.cluster_name;
    let (namespace, existing) = namespace_for(ctx, &set_ref, name);
    let found = Api::<Namespace>::all(ctx.client.clone())
        .get_opt(&namespace)
        .await
        .map_err(Error::api::<Namespace>("get", None, &namespace))?;
    match plan_approval(
        req,
        &set_ref,
        &namespace,
        existing.as_deref(),
        found.as_ref(),
        rejoin,
    ) {
        Plan::Requeue => Ok(Action::requeue(REPLACE_RETRY)),
        Plan::Replace { old_id } => {
            let old = existing.ok_or(Error::Invariant("a replacement without a member"))?;
            info!(cluster = %name, %old_id, new_id = %req.spec.cluster_id,
                  "Replacing an expired member with the same name");
            remove_member(ctx, None, &old, Removal::Expired).await?;
            Ok(Action::requeue(REPLACE_RETRY))
        }
        Plan::Deny { reason, message } => deny(ctx, req, reason, &message).await,
        Plan::Provision { revoke_key, rejoin } => {
            if revoke_key {
                info!(cluster = %name, cluster_id = %req.spec.cluster_id, %namespace,
                      "An admin approved the member's new key; revoking the old key's credential");
                // NB: bound tokens carry the ServiceAccount's UID: deleting it revokes them all;
                // provisioning recreates it. The ManagedCluster goes too: its key is set once,
                // so the member with its new key is a new object (its namespace and what is in
                // it, grants included, stay).
                let accounts = Api::<ServiceAccount>::namespaced(ctx.client.clone(), &namespace);
                delete(ctx, &accounts, AGENT_SERVICE_ACCOUNT).await?;
                let clusters = Api::<ManagedCluster>::namespaced(ctx.client.clone(), &namespace);
                delete(ctx, &clusters, name).await?;
            }
            let policy = set.spec.leader.clone().unwrap_or_default();
            let objs = member_objects(req, &set_ref, &namespace, &policy);
            let (credential, expiry) = provision(ctx, &objs, policy.credential_lifetime()).await?;
            let message = if rejoin {
                format!("re-registered; namespace {namespace}")
            } else {
                format!("joined ClusterSet {}; namespace {namespace}", set_ref.name)
            };
            grant(ctx, req, &namespace, &credential, expiry, &message).await?;
            info!(cluster = %name, cluster_id = %req.spec.cluster_id, set = %set_ref, %namespace, rejoin,
                  "Approved registration");
            Ok(Action::await_change())
        }
    }
}

/// Applies a member's objects and mints its credential, valid for `ttl`. Three round trips
/// instead of nine: the namespace; the ServiceAccount, Role, announce and Lease; then what needs
/// them (RoleBinding, ManagedCluster, token).
async fn provision(
    ctx: &Context,
    objs: &MemberObjects,
    ttl: Duration,
) -> Result<(MemberCredential, Time), Error> {
    let namespace = objs.namespace.name_any();
    let client = || ctx.client.clone();
    let (namespaces, accounts, roles, bindings, announces, leases, clusters) = (
        Api::<Namespace>::all(client()),
        Api::namespaced(client(), &namespace),
        Api::namespaced(client(), &namespace),
        Api::namespaced(client(), &namespace),
        Api::namespaced(client(), &namespace),
        Api::namespaced(client(), &namespace),
        Api::namespaced(client(), &namespace),
    );
    apply(ctx, &namespaces, &objs.namespace).await?;
    // NB: the announce before the ManagedCluster: a member without one counts as having left.
    let (sa, role, announce, lease) = futures::join!(
        apply(ctx, &accounts, &objs.service_account),
        apply(ctx, &roles, &objs.role),
        apply(ctx, &announces, &objs.announce),
        apply(ctx, &leases, &objs.lease),
    );
    sa?;
    role?;
    announce?;
    lease?;
    ctx.ensure_leader()?;
    // NB: the RoleBinding after the Role: the API server resolves the Role to check escalation.
    let (binding, cluster, credential) = futures::join!(
        apply(ctx, &bindings, &objs.role_binding),
        apply(ctx, &clusters, &objs.managed_cluster),
        mint_credential(ctx, &namespace, ttl),
    );
    binding?;
    cluster?;
    credential
}

/// Seals `credential` to the request's key and records the approval in the request's status,
/// with an Event.
async fn grant(
    ctx: &Context,
    req: &ClusterRegistrationRequest,
    namespace: &str,
    credential: &MemberCredential,
    expiry: Time,
    message: &str,
) -> Result<(), Error> {
    let sealed = tether_seal::seal(credential, &req.spec.public_key)?;
    let status = RegistrationStatus {
        result: RegistrationResult::Approved,
        reason: RegistrationReason::Approved,
        message: Some(message.to_string()),
        namespace: Some(namespace.to_string()),
        credential: Some(SealedCredential {
            sealed,
            expiration_time: Some(expiry),
        }),
        ..RegistrationStatus::default()
    };
    record(ctx, req, &status).await?;
    event(
        ctx,
        req,
        EventType::Normal,
        EventReason::RegistrationApproved,
        "Register",
        message,
    )
    .await;
    ctx.metrics.registrations("Approved");
    Ok(())
}

/// A new credential of member namespace `namespace`'s agent ServiceAccount, valid for `ttl`,
/// and when it expires.
pub(crate) async fn mint_credential(
    ctx: &Context,
    namespace: &str,
    ttl: Duration,
) -> Result<(MemberCredential, Time), Error> {
    let request = TokenRequest {
        spec: TokenRequestSpec {
            expiration_seconds: Some(ttl.as_secs() as i64),
            ..Default::default()
        },
        ..Default::default()
    };
    let token = Api::<ServiceAccount>::namespaced(ctx.client.clone(), namespace)
        .create_token_request(AGENT_SERVICE_ACCOUNT, &PostParams::default(), &request)
        .await
        .map_err(Error::api::<TokenRequest>(
            "create",
            Some(namespace),
            AGENT_SERVICE_ACCOUNT,
        ))?;
    let status = token
        .status
        .ok_or(Error::Invariant("TokenRequest answered without a token"))?;
    let expiry = status.expiration_timestamp;
    let credential = MemberCredential {
        token: status.token,
        expiration_timestamp: expiry.0.to_string(),
        namespace: namespace.to_string(),
        service_account: AGENT_SERVICE_ACCOUNT.into(),
        ca_cert: ctx.leader_ca.clone(),
    };
    Ok((credential, expiry))
}

pub(crate) fn requests_api(
    ctx: &Context,
    req: &ClusterRegistrationRequest,
) -> Api<ClusterRegistrationRequest> {
    Api::namespaced(ctx.client.clone(), &req.namespace().unwrap_or_default())
}

/// Writes a Pending or Denied result (the fields the leader owns; an admin's decision stays).
async fn write_status(
    ctx: &Context,
    req: &ClusterRegistrationRequest,
    result: RegistrationResult,
    reason: RegistrationReason,
    message: &str,
) -> Result<(), Error> {
    let status = RegistrationStatus {
        result,
        reason,
        message: Some(message.to_string()),
        ..RegistrationStatus::default()
    };
    record(ctx, req, &status).await
}

/// Applies `status` to `req` and remembers the result until the request cache shows it.
async fn record(
    ctx: &Context,
    req: &ClusterRegistrationRequest,
    status: &RegistrationStatus,
) -> Result<(), Error> {
    let after = apply_status(ctx, &requests_api(ctx, req), &req.name_any(), status).await?;
    ctx.written_requests.wrote(key(req), Some(req), Some(after));
    Ok(())
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
        RegistrationReason::NamespaceConflict => "NamespaceConflict",
        RegistrationReason::Banned => "Banned",
        RegistrationReason::ReplacesMember => "ReplacesMember",
        RegistrationReason::AwaitingLeader
        | RegistrationReason::AwaitingApproval
        | RegistrationReason::Approved => "Other",
    }
}
