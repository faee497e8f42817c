//! `tether approve|deny` and `tether destroy`: an admin's decisions on requests and sets.

use anyhow::bail;
use k8s_openapi::api::core::v1::{Namespace, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;
use tether_api::registration::RegistrationResult;
use tether_api::{ClusterRegistrationRequest, ClusterSet, ManagedCluster, SetRef};
use tether_join::token::TOKEN_NAMESPACE;

use crate::cluster::{Target, remove_finalizer, wait_deleted};

use super::{DecideArgs, DestroyArgs};

/// `tether approve|deny NAME`.
pub async fn decide(target: &Target, args: DecideArgs, approve: bool) -> anyhow::Result<()> {
    let client = target.client().await?;
    let api = Api::<ClusterRegistrationRequest>::namespaced(client, &target.namespace);
    let req = api.get_opt(&args.name).await?.ok_or_else(|| {
        crate::exit::fail(
            crate::exit::Code::NotFound,
            format!(
                "no registration request {}/{}: list them with `kubectl get clsrr -n {}`",
                target.namespace, args.name, target.namespace
            ),
        )
    })?;
    let status = req.status.clone().unwrap_or_default();
    if status.result != RegistrationResult::Pending {
        println!(
            "{} is already {:?} ({:?}); nothing to do",
            args.name, status.result, status.reason
        );
        return Ok(());
    }
    let action = if approve { "Approve" } else { "Deny" };
    let patch = json!({"status": {"decision": {"action": action, "message": args.message}}});
    api.patch_status(&args.name, &PatchParams::default(), &Patch::Merge(patch))
        .await?;
    println!(
        "{} {} (cluster {}, ID {})",
        if approve { "approved" } else { "denied" },
        args.name,
        req.spec.cluster_name,
        req.spec.cluster_id
    );
    Ok(())
}

/// `tether destroy`: refuses while members remain unless `--force`.
pub async fn destroy(target: &Target, args: DestroyArgs) -> anyhow::Result<()> {
    let client = target.client().await?;
    let ns = target.namespace.as_str();
    let set = args.clusterset.as_str();
    let sets = Api::<ClusterSet>::namespaced(client.clone(), ns);
    let selector = SetRef::new(ns, set).selector();
    if let Some(existing) = sets.get_opt(set).await? {
        let members = Api::<ManagedCluster>::all(client.clone())
            .list(&ListParams::default().labels(&selector))
            .await?;
        if !members.items.is_empty() && !args.force {
            let names: Vec<String> = members.items.iter().map(|m| m.name_any()).collect();
            bail!(
                "ClusterSet {set} still has {} member(s): {}. Run `tether leave` in each member, or pass --force \
                 to remove them all",
                names.len(),
                names.join(", ")
            );
        }
        // NB: the plan is read only to be shown: `--yes` (and `tether uninstall`, whose hook may
        // not list registration requests) goes straight on.
        if args.dry_run || !args.yes {
            let requests = Api::<ClusterRegistrationRequest>::namespaced(client.clone(), ns)
                .list(&ListParams::default())
                .await?
                .items
                .len();
            let tokens = Api::<Secret>::namespaced(client.clone(), TOKEN_NAMESPACE)
                .list_metadata(&ListParams::default().labels(&selector))
                .await?
                .items
                .len();
            let plan = destroy_plan(ns, set, &members.items, requests, tokens);
            if args.dry_run {
                println!("{plan}\n(dry run: nothing was changed)");
                return Ok(());
            }
            confirm(&plan, set)?;
        }
        if args.force {
            let patch = json!({"metadata": {"annotations": {tether_api::annotations::FORCE_DELETE: "true"}}});
            sets.patch(set, &PatchParams::default(), &Patch::Merge(patch))
                .await?;
        }
        sets.delete(set, &DeleteParams::default()).await?;
        eprintln!("deleting ClusterSet {ns}/{set}…");
        // NB: with --force the leader controller gets a short while; if it is gone, the CLI
        // does its part (members, requests, its finalizer) with the admin's rights.
        let first = if args.force {
            args.wait.min(FORCE_GRACE)
        } else {
            args.wait
        };
        let mut gone = wait_deleted(&sets, set, existing.uid(), first).await?;
        if !gone && args.force {
            eprintln!("the leader controller has not finished within {first:?}; removing what it would");
            remove_members(&client, ns, &selector).await?;
            remove_finalizer(&sets, set, tether_api::LEADER_FINALIZER).await?;
            gone = wait_deleted(&sets, set, existing.uid(), args.wait).await?;
        }
        if !gone {
            crate::bail_code!(
                Timeout,
                "ClusterSet {set} is still being deleted after {:?}: see `kubectl describe clusterset -n {ns} {set}` \
                 (is the leader controller running? --force finishes without it)",
                args.wait
            );
        }
    } else if args.dry_run {
        println!(
            "ClusterSet {ns}/{set} does not exist; would remove what is left of it (its join tokens and \
             join RBAC)\n(dry run: nothing was changed)"
        );
        return Ok(());
    } else {
        eprintln!("ClusterSet {ns}/{set} does not exist; removing what is left of it");
    }
    // The leader's finalizer removes these too; doing it here also covers a set whose leader is gone.
    let dp = DeleteParams::default();
    let lp = ListParams::default().labels(&selector);
    Api::<Secret>::namespaced(client.clone(), TOKEN_NAMESPACE)
        .delete_collection(&dp, &lp)
        .await?;
    Api::<RoleBinding>::namespaced(client.clone(), ns)
        .delete_collection(&dp, &lp)
        .await?;
    Api::<Role>::namespaced(client.clone(), ns)
        .delete_collection(&dp, &lp)
        .await?;
    Api::<ServiceAccount>::namespaced(client, ns)
        .delete_collection(&dp, &lp)
        .await?;
    println!("ClusterSet {set} destroyed: members, requests, join tokens and join RBAC removed");
    Ok(())
}

/// What `destroy` removes, as it tells the admin before doing it.
fn destroy_plan(ns: &str, set: &str, members: &[ManagedCluster], requests: usize, tokens: usize) -> String {
    let mut plan = format!("tether destroy removes ClusterSet {ns}/{set} for good:");
    if members.is_empty() {
        plan.push_str("\n  members: none");
    }
    for m in members {
        plan.push_str(&format!(
            "\n  member {} (cluster ID {}) and its namespace {}",
            m.name_any(),
            m.spec.cluster_id,
            m.namespace().unwrap_or_default()
        ));
    }
    plan.push_str(&format!(
        "\n  {requests} registration request(s) in {ns}, {tokens} join token(s), the set's join RBAC"
    ));
    if !members.is_empty() {
        plan.push_str("\n  members lose their credentials; their agents stay installed and keep trying");
    }
    plan
}

/// Asks the admin to type the set's name, on a terminal; refuses without one (use `--yes`).
fn confirm(plan: &str, set: &str) -> anyhow::Result<()> {
    use std::io::{BufRead as _, IsTerminal as _, Write as _};
    if !std::io::stdin().is_terminal() {
        crate::bail_code!(
            Usage,
            "{plan}\nnot destroying without confirmation: stdin is not a terminal; pass --yes to confirm, or \
             --dry-run to only see what it would remove"
        );
    }
    eprint!("{plan}\ntype the set's name ({set}) to destroy it: ");
    let _ = std::io::stderr().flush();
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    if line.trim() != set {
        bail!(
            "not confirmed (typed {:?}, not {set:?}); nothing was changed",
            line.trim()
        );
    }
    Ok(())
}

/// How long `destroy --force` gives the leader controller before it does its part by hand.
const FORCE_GRACE: std::time::Duration = std::time::Duration::from_secs(20);

/// Removes every member of the set `selector` names, as the leader would: its ManagedCluster,
/// its namespace (only one the leader made: it carries the leader's label), and the set's
/// registration requests in `ns`.
async fn remove_members(client: &kube::Client, ns: &str, selector: &str) -> anyhow::Result<()> {
    let lp = ListParams::default().labels(selector);
    let namespaces = Api::<Namespace>::all(client.clone());
    for mc in Api::<ManagedCluster>::all(client.clone()).list(&lp).await?.items {
        let member_ns = mc.namespace().unwrap_or_default();
        super::delete(
            &Api::<ManagedCluster>::namespaced(client.clone(), &member_ns),
            &mc.name_any(),
        )
        .await?;
        if let Some(n) = namespaces.get_opt(&member_ns).await?
            && n.labels().get(tether_api::labels::MANAGED_BY).map(String::as_str) == Some("tether-leader")
        {
            super::delete(&namespaces, &member_ns).await?;
        }
    }
    Api::<ClusterRegistrationRequest>::namespaced(client.clone(), ns)
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await?;
    Ok(())
}
