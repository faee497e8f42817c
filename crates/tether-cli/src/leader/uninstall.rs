//! `tether uninstall`: what must happen before `helm uninstall tether-leader` (the chart runs it
//! as a pre-delete hook). It refuses while any ClusterSet in the namespace has members, as
//! `destroy` does, so an uninstall never strands a fleet silently; otherwise it destroys the
//! sets, stops the leader (its Deployment to 0: each replica withdraws its APIService while it
//! may), and removes what the leader created outside its chart: `kube-public/cluster-info` and
//! its anonymous read access, the proxy's serving Secret and EndpointSlice, and the APIService.
//! Only objects carrying the leader's label are touched (a kubeadm `cluster-info` stays).

use std::time::Duration;

use anyhow::bail;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::ResourceExt;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams};
use kube::core::GroupVersionKind;
use tether_api::clusterset::ClusterSetRole;
use tether_api::{ClusterSet, ManagedCluster, SetRef, labels};

use crate::cluster::Target;

use super::{DestroyArgs, destroy};

/// `tether uninstall`.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "Examples:\n  tether uninstall -n tether-system && helm uninstall tether-leader -n tether-system"
)]
pub struct UninstallArgs {
    /// How long to wait for each ClusterSet to go.
    #[arg(long, default_value = "120s", value_parser = tether_api::duration::parse)]
    pub wait: Duration,
}

/// The label value of everything the leader makes, and the leader chart's Deployment.
const LEADER: &str = "tether-leader";

/// Scales the leader's Deployment in `ns` (if any) to 0 and waits up to `wait` for its pods to
/// go, while its RBAC still exists: each replica withdraws what it registered (the APIService)
/// on the way out, and none is left to register it again, or to republish `cluster-info`,
/// while Helm removes the rest. (Helm deletes the ClusterRole while the pods are still
/// terminating, so a replica stopped by the uninstall itself may no longer be allowed to.)
async fn stop_leader(client: &kube::Client, ns: &str, wait: Duration) -> anyhow::Result<()> {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Patch, PatchParams};
    let deployments = Api::<Deployment>::namespaced(client.clone(), ns);
    let Some(d) = deployments.get_opt(LEADER).await? else {
        return Ok(());
    };
    deployments
        .patch(
            LEADER,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"replicas": 0}})),
        )
        .await?;
    let selector = d
        .spec
        .and_then(|s| s.selector.match_labels)
        .map(|l| {
            l.iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default();
    if selector.is_empty() {
        return Ok(());
    }
    let pods = Api::<Pod>::namespaced(client.clone(), ns);
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let left = pods
            .list(&ListParams::default().labels(&selector))
            .await?
            .items
            .len();
        if left == 0 {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            crate::bail_code!(
                Timeout,
                "the leader's {left} pod(s) in {ns} did not stop within {wait:?}"
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// `tether uninstall`.
pub async fn uninstall(target: &Target, args: UninstallArgs) -> anyhow::Result<()> {
    let client = target.client().await?;
    let ns = target.namespace.as_str();
    let sets: Vec<ClusterSet> = Api::<ClusterSet>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|s| s.spec.role == ClusterSetRole::Leader)
        .collect();
    let mut refusals = Vec::new();
    for set in &sets {
        let members = Api::<ManagedCluster>::all(client.clone())
            .list(&ListParams::default().labels(&SetRef::of(set).selector()))
            .await?;
        if !members.items.is_empty() {
            let names: Vec<String> = members.items.iter().map(|m| m.name_any()).collect();
            refusals.push(format!(
                "ClusterSet {} has {} member(s): {}",
                set.name_any(),
                names.len(),
                names.join(", ")
            ));
        }
    }
    if !refusals.is_empty() {
        bail!(
            "not uninstalling Tether from namespace {ns}: {}. Run `tether leave` in each member (or \
             `tether member remove NAME` here), or `tether destroy --clusterset <SET> --force -n {ns}` to \
             remove them all; then uninstall again",
            refusals.join("; ")
        );
    }
    for set in &sets {
        destroy(
            target,
            DestroyArgs {
                clusterset: set.name_any(),
                force: false,
                wait: args.wait,
                dry_run: false,
                // NB: `uninstall` is the confirmation: it destroys only sets without members.
                yes: true,
            },
        )
        .await?;
    }
    stop_leader(&client, ns, args.wait).await?;
    let mine = ListParams::default().labels(&format!("{}={LEADER}", labels::MANAGED_BY));
    let dp = DeleteParams::default();
    let public = tether_join::discovery::DISCOVERY_NAMESPACE;
    Api::<ConfigMap>::namespaced(client.clone(), public)
        .delete_collection(&dp, &mine)
        .await?;
    Api::<RoleBinding>::namespaced(client.clone(), public)
        .delete_collection(&dp, &mine)
        .await?;
    Api::<Role>::namespaced(client.clone(), public)
        .delete_collection(&dp, &mine)
        .await?;
    Api::<Secret>::namespaced(client.clone(), ns)
        .delete_collection(&dp, &mine)
        .await?;
    Api::<k8s_openapi::api::core::v1::Endpoints>::namespaced(client.clone(), ns)
        .delete_collection(&dp, &mine)
        .await?;
    Api::<EndpointSlice>::namespaced(client.clone(), ns)
        .delete_collection(
            &dp,
            &ListParams::default().labels(&format!("endpointslice.kubernetes.io/managed-by={LEADER}")),
        )
        .await?;
    let apiservices = Api::<DynamicObject>::all_with(
        client,
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("apiregistration.k8s.io", "v1", "APIService"),
            "apiservices",
        ),
    );
    if let Some(svc) = apiservices.get_opt(tether_tunnel::API_SERVICE).await?
        && svc.labels().get(labels::MANAGED_BY).map(String::as_str) == Some(LEADER)
    {
        apiservices.delete(tether_tunnel::API_SERVICE, &dp).await?;
    }
    println!(
        "Tether's objects outside the chart are removed from the leader cluster ({} ClusterSet(s) destroyed); \
         `helm uninstall tether-leader -n {ns}` removes the rest. Helm never deletes CRDs: `kubectl delete crd \
         clustersets.multicluster.tether.dev managedclusters.multicluster.tether.dev \
         memberclusterannounces.multicluster.tether.dev clusterregistrationrequests.multicluster.tether.dev` \
         does, once no cluster here is a member either",
        sets.len()
    );
    Ok(())
}
