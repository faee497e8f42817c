//! `tether leave`: deletes the Member ClusterSet; the agent's finalizer deregisters at the leader
//! and removes what it created here, and the join token Secret goes last. With `--force` it
//! finishes by hand what the agent could not (the leader is gone or unreachable, or no agent
//! runs): the finalizer, the agent's key and credential, the ClusterSet property.

use std::time::Duration;

use anyhow::{Context as _, bail};
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};
use tether_api::about::ClusterProperty;
use tether_api::{AGENT_FINALIZER, ClusterSet, agent_secrets, properties};

use crate::cluster::{Target, remove_finalizer, wait_deleted};
use crate::join::TOKEN_SECRET;

/// How long `--force` gives the agent to deregister before it finishes by hand.
const FORCE_GRACE: Duration = Duration::from_secs(20);

/// `tether leave`.
#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:\n  tether leave\n  \
                        tether leave --clusterset prod --force    # the leader is gone: clean up here anyway")]
pub struct LeaveArgs {
    /// The Member ClusterSet to leave (default: the only one in the namespace).
    #[arg(long)]
    pub clusterset: Option<String>,
    /// Wait until the agent has deregistered and the ClusterSet is gone.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub wait: bool,
    /// How long to wait.
    #[arg(long, default_value = "2m", value_parser = tether_api::duration::parse)]
    pub timeout: Duration,
    /// If the agent has not deregistered within 20 s (the leader is unreachable or gone, or no
    /// agent runs), remove the membership here anyway: the finalizer, the agent's key and
    /// credential, and the ClusterSet property. The leader is not told.
    #[arg(long)]
    pub force: bool,
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
    let set = match (&args.clusterset, members.as_slice()) {
        (Some(want), _) => match members.iter().find(|s| s.name_any() == *want) {
            Some(s) => s,
            None => {
                println!("this cluster is not a member of ClusterSet {want} in {ns}; nothing to do");
                return Ok(());
            }
        },
        (None, []) => {
            println!("this cluster is not a member of any ClusterSet in {ns}; nothing to do");
            return Ok(());
        }
        (None, [only]) => only,
        (None, several) => {
            let names: Vec<String> = several.iter().map(|s| s.name_any()).collect();
            crate::bail_code!(
                Usage,
                "this cluster is a member of several ClusterSets in {ns} ({}): pick one with --clusterset",
                names.join(", ")
            );
        }
    };
    let name = set.name_any();
    sets.delete(&name, &DeleteParams::default()).await?;
    eprintln!("Leaving ClusterSet {name}…");
    let forced = if !args.wait {
        false
    } else if args.force {
        let within = args.timeout.min(FORCE_GRACE);
        if wait_deleted(&sets, &name, set.uid(), within).await? {
            false
        } else {
            eprintln!(
                "the agent has not deregistered within {within:?}; removing the membership here by hand"
            );
            force(&client, &sets, set).await?;
            true
        }
    } else if !wait_deleted(&sets, &name, set.uid(), args.timeout).await? {
        crate::bail_code!(
            Timeout,
            "still leaving after {:?}: is the agent running? (kubectl -n {ns} describe clusterset {name}); \
             `tether leave --clusterset {name} --force` finishes without the leader",
            args.timeout
        );
    } else {
        false
    };
    let _ = Api::<Secret>::namespaced(client, ns)
        .delete(TOKEN_SECRET, &DeleteParams::default())
        .await;
    if forced {
        let member = set
            .spec
            .member
            .as_ref()
            .map(|m| m.cluster_name.clone())
            .unwrap_or_default();
        println!(
            "Left ClusterSet {name} here without telling the leader: on the leader, `tether member remove \
             {member} --clusterset {name}` removes it at once; else it is lost there and removed after \
             the set's memberExpiry"
        );
    } else {
        println!("Left ClusterSet {name}");
    }
    Ok(())
}

/// Finishes the leave of `set` without the agent: its key, credential and property, then the
/// finalizer, so the ClusterSet goes.
async fn force(client: &kube::Client, sets: &Api<ClusterSet>, set: &ClusterSet) -> anyhow::Result<()> {
    let ns = set.namespace().unwrap_or_default();
    let secrets = Api::<Secret>::namespaced(client.clone(), &ns);
    for s in [agent_secrets::CREDENTIAL, agent_secrets::KEY] {
        match secrets.delete(s, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e).with_context(|| format!("cannot delete Secret {ns}/{s}")),
        }
    }
    let props = Api::<ClusterProperty>::all(client.clone());
    if let Some(p) = props.get_opt(properties::CLUSTER_SET).await?
        && p.spec.value == set.name_any()
    {
        props
            .delete(properties::CLUSTER_SET, &DeleteParams::default())
            .await?;
    }
    let name = set.name_any();
    remove_finalizer(sets, &name, AGENT_FINALIZER).await?;
    if !wait_deleted(sets, &name, set.uid(), Duration::from_secs(30)).await? {
        bail!(
            "ClusterSet {ns}/{name} is still there: `kubectl -n {ns} get clusterset {name} -o yaml` shows what holds it"
        );
    }
    Ok(())
}
