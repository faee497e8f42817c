//! `tether status`: the set's counts and one row per member (leader), or the membership (member).

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use serde::Serialize;
use serde_json::json;
use tether_api::{ClusterSet, ManagedCluster, MemberClusterAnnounce, SetRef};

use crate::cluster::Target;
use crate::output::{Format, age, render};

use super::StatusArgs;

/// One member in `tether status`.
#[derive(Serialize)]
struct MemberRow {
    name: String,
    cluster_id: String,
    ready: String,
    kubernetes: String,
    nodes: String,
    last_heartbeat: String,
    age: String,
}

/// `tether status`.
pub async fn status(target: &Target, args: StatusArgs) -> anyhow::Result<()> {
    let client = target.client().await?;
    let sets = Api::<ClusterSet>::namespaced(client.clone(), &target.namespace);
    if args.clusterset.is_none() && sets.list(&ListParams::default().limit(1)).await?.items.is_empty() {
        let ns = &target.namespace;
        println!(
            "No ClusterSet in namespace {ns}.\n\
             On a member with the agent installed: Registered=False (NotJoined); join with\n  \
             tether join --config-file join.yaml --name <CLUSTER-NAME> -n {ns}\n\
             (the file `tether init --values-file join.yaml` writes on the leader).\n\
             On the leader: `tether init --clusterset <ID> -n {ns}` creates a set."
        );
        return Ok(());
    }
    let set = super::pick_set(&sets, args.clusterset.as_deref(), &target.namespace).await?;
    let st = set.status.clone().unwrap_or_default();
    if set.spec.role == tether_api::clusterset::ClusterSetRole::Member {
        let m = st.membership.clone().unwrap_or_default();
        let conds: Vec<String> = st
            .conditions
            .iter()
            .map(|c| format!("{}={} ({})", c.type_, c.status, c.reason))
            .collect();
        let data = json!({"clusterSet": set.name_any(), "role": "Member", "state": st.state, "membership": m,
                          "conditions": st.conditions});
        let rows = vec![vec![
            set.name_any(),
            st.state.clone().unwrap_or_else(|| "Joining".into()),
            set.spec
                .member
                .as_ref()
                .map(|s| s.leader_url.clone())
                .unwrap_or_default(),
            m.namespace.clone().unwrap_or_default(),
            m.cluster_id.clone().unwrap_or_default(),
        ]];
        print!(
            "{}",
            render(
                args.output,
                &["CLUSTERSET", "STATE", "LEADER", "NAMESPACE", "CLUSTER ID"],
                rows,
                &data
            )?
        );
        if args.output == Format::Table {
            println!("conditions: {}", conds.join(", "));
        }
        return Ok(());
    }
    let selector = SetRef::of(&set).selector();
    let mcs = Api::<ManagedCluster>::all(client.clone())
        .list(&ListParams::default().labels(&selector))
        .await?;
    let mcas = Api::<MemberClusterAnnounce>::all(client.clone())
        .list(&ListParams::default().labels(&selector))
        .await?;
    // NB: the heartbeat is the member's Lease; agents from before Leases renew the announce.
    let leases = Api::<Lease>::all(client)
        .list(&ListParams::default().labels(&selector))
        .await?;
    let now = Timestamp::now();
    let rows: Vec<MemberRow> = mcs
        .items
        .iter()
        .map(|mc| {
            let s = mc.status.clone().unwrap_or_default();
            let announced = mcas
                .items
                .iter()
                .find(|a| a.namespace() == mc.namespace())
                .and_then(|a| a.spec.renew_time.clone());
            let leased = leases
                .items
                .iter()
                .find(|l| l.namespace() == mc.namespace() && l.name_any() == mc.name_any())
                .and_then(|l| l.spec.as_ref()?.renew_time.clone());
            let renewed = announced
                .into_iter()
                .chain(leased)
                .map(|t| t.0)
                .max()
                .map(|t| format!("{} ago", age((now - t).get_seconds())))
                .unwrap_or_else(|| "never".into());
            MemberRow {
                name: mc.name_any(),
                cluster_id: mc.spec.cluster_id.clone(),
                ready: s
                    .conditions
                    .iter()
                    .find(|c| c.type_ == tether_api::conditions::ConditionType::Ready)
                    .map(|c| c.status.clone())
                    .unwrap_or_default(),
                kubernetes: s.kubernetes_version.unwrap_or_default(),
                nodes: s.nodes.map(|n| n.summary).unwrap_or_default(),
                last_heartbeat: renewed,
                age: mc
                    .creation_timestamp()
                    .map(|t| age((now - t.0).get_seconds()))
                    .unwrap_or_default(),
            }
        })
        .collect();
    if args.output == Format::Table {
        let c = st.members.clone().unwrap_or_default();
        println!(
            "ClusterSet {}/{}: {} members, {} ready, {} not ready, {} pending",
            target.namespace,
            set.name_any(),
            c.total,
            c.ready,
            c.not_ready,
            c.pending
        );
    }
    let table = rows
        .iter()
        .map(|r| {
            vec![
                r.name.clone(),
                r.cluster_id.clone(),
                r.ready.clone(),
                r.kubernetes.clone(),
                r.nodes.clone(),
                r.last_heartbeat.clone(),
                r.age.clone(),
            ]
        })
        .collect();
    let headers = [
        "NAME",
        "CLUSTER ID",
        "READY",
        "KUBERNETES",
        "NODES",
        "LAST HEARTBEAT",
        "AGE",
    ];
    print!("{}", render(args.output, &headers, table, &rows)?);
    Ok(())
}
