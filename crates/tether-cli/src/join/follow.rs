//! After `join` wrote the token Secret and the Member ClusterSet: following the agent's
//! progress until it joined, and removing what was created when it fails.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context as _, bail};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use tether_api::conditions::{ConditionType, Reason, SetState};
use tether_api::{AGENT_FINALIZER, ClusterSet};
use tether_join::token::MANAGER;

use super::*;

/// Writes the token Secret and the Member ClusterSet, follows the agent until Ready, and undoes
/// both on failure, timeout or Ctrl-C.
pub(super) async fn create_and_follow(
    client: &Client,
    sets: &Api<ClusterSet>,
    set_obj: ClusterSet,
    token: String,
    timeout: Duration,
) -> anyhow::Result<()> {
    let ns = set_obj.namespace().unwrap_or_default();
    let set = set_obj.name_any();
    let name = set_obj
        .spec
        .member
        .as_ref()
        .map(|m| m.cluster_name.clone())
        .unwrap_or_default();
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(TOKEN_SECRET.into()),
            namespace: Some(ns.clone()),
            labels: Some(BTreeMap::from([(
                tether_api::labels::MANAGED_BY.into(),
                MANAGER.into(),
            )])),
            ..ObjectMeta::default()
        },
        string_data: Some(BTreeMap::from([(TOKEN_KEY.to_string(), token)])),
        ..Secret::default()
    };
    let secrets = Api::<Secret>::namespaced(client.clone(), &ns);
    secrets
        .patch(
            TOKEN_SECRET,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&secret),
        )
        .await?;
    if let Err(e) = sets.create(&PostParams::default(), &set_obj).await {
        rollback(sets, &secrets, &set, false).await;
        return Err(e).context("cannot create the Member ClusterSet");
    }
    eprintln!("Created Secret {ns}/{TOKEN_SECRET} and ClusterSet {ns}/{set}; waiting for the agent…");
    let outcome = tokio::select! {
        r = follow(sets, &set, timeout) => r,
        _ = tokio::signal::ctrl_c() => Err(crate::exit::fail(crate::exit::Code::Interrupted, "interrupted")),
    };
    match outcome {
        Ok(st) => {
            println!("Joined ClusterSet {set} as {name}: {st}");
            Ok(())
        }
        Err(e) => {
            rollback(sets, &secrets, &set, true).await;
            Err(e.context("join failed; removed the ClusterSet and Secret it had created"))
        }
    }
}

/// Follows the Member ClusterSet until Ready; fails on a permanent error or timeout.
pub(super) async fn follow(sets: &Api<ClusterSet>, set: &str, timeout: Duration) -> anyhow::Result<String> {
    let start = tokio::time::Instant::now();
    let mut last = String::new();
    let mut picked_up = false;
    loop {
        let s = sets.get(set).await?;
        picked_up |= s.finalizers().iter().any(|f| f == AGENT_FINALIZER);
        let st = s.status.clone().unwrap_or_default();
        let state = st.state.clone().unwrap_or_else(|| "Pending".into());
        let ns = st.membership.as_ref().and_then(|m| m.namespace.clone());
        let line = match &ns {
            Some(ns) => format!("{state} (namespace {ns} on the leader)"),
            None => state.clone(),
        };
        if line != last {
            eprintln!("  {line}");
            last = line.clone();
        }
        if state == SetState::Ready.as_str() {
            return Ok(line);
        }
        let registered = tether_api::conditions::find(&st.conditions, ConditionType::Registered);
        if let Some(c) = registered.filter(|c| c.status == "False")
            && matches!(
                c.reason.parse(),
                Ok(Reason::JoinTokenExpired | Reason::JoinTokenInvalid | Reason::Denied)
            )
        {
            bail!("{}: {}", c.reason, c.message);
        }
        if !picked_up && start.elapsed() > Duration::from_secs(30) {
            crate::bail_code!(
                Timeout,
                "no agent picked up the ClusterSet within 30s: is tether-agent installed and running in this \
                 namespace? (helm install tether-agent charts/tether-agent -n {})",
                sets.namespace().unwrap_or_default()
            );
        }
        if start.elapsed() > timeout {
            let why = st
                .conditions
                .iter()
                .find(|c| c.status == "False")
                .map(|c| format!("{}: {}", c.reason, c.message));
            crate::bail_code!(Timeout, "not Ready after {timeout:?}: {}", why.unwrap_or(last));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

pub(super) async fn rollback(sets: &Api<ClusterSet>, secrets: &Api<Secret>, set: &str, wait: bool) {
    let _ = sets.delete(set, &DeleteParams::default()).await;
    if wait {
        // The agent's finalizer deregisters first; give it a bounded time.
        for _ in 0..120 {
            if sets.get_opt(set).await.map(|s| s.is_none()).unwrap_or(true) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    let _ = secrets.delete(TOKEN_SECRET, &DeleteParams::default()).await;
}
