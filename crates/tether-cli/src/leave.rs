//! `tether leave`: deletes the Member ClusterSet; the agent's finalizer deregisters at the leader
//! and removes what it created here, and the join token Secret goes last.

use std::time::Duration;

use anyhow::bail;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};
use tether_api::ClusterSet;

use crate::cluster::{Target, wait_deleted};
use crate::join::TOKEN_SECRET;

/// `tether leave`.
#[derive(clap::Args, Debug)]
pub struct LeaveArgs {
    /// Wait until the agent has deregistered and the ClusterSet is gone.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub wait: bool,
    /// How long to wait.
    #[arg(long, default_value = "2m", value_parser = tether_api::duration::parse)]
    pub timeout: Duration,
}

/// Leaves: deletes the Member ClusterSet (the agent deregisters through its finalizer).
pub async fn leave(target: &Target, args: LeaveArgs) -> anyhow::Result<()> {
    let client = target.client().await?;
    let ns = target.namespace.as_str();
    let sets = Api::<ClusterSet>::namespaced(client.clone(), ns);
    let members: Vec<ClusterSet> = sets
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter(|s| s.spec.role == tether_api::clusterset::ClusterSetRole::Member)
        .collect();
    let Some(set) = members.first() else {
        println!("this cluster is not a member of any ClusterSet in {ns}; nothing to do");
        return Ok(());
    };
    let name = set.name_any();
    sets.delete(&name, &DeleteParams::default()).await?;
    eprintln!("Leaving ClusterSet {name}…");
    if args.wait && !wait_deleted(&sets, &name, set.uid(), args.timeout).await? {
        bail!(
            "still leaving after {:?}: is the agent running? (kubectl -n {ns} describe clusterset {name})",
            args.timeout
        );
    }
    let _ = Api::<Secret>::namespaced(client, ns)
        .delete(TOKEN_SECRET, &DeleteParams::default())
        .await;
    println!("Left ClusterSet {name}");
    Ok(())
}
