//! `tether member remove|unban|list`: an admin takes a member out of a set, for now or for good,
//! and sees who is waiting or refused. Everything is done on the leader cluster with the admin's
//! own rights, so it works whether or not the leader controller runs.

use anyhow::Context as _;
use k8s_openapi::api::core::v1::Namespace;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde::Serialize;
use serde_json::json;
use tether_api::clusterset::{Ban, ClusterRef, PublicKey};
use tether_api::registration::RegistrationResult;
use tether_api::{ClusterRegistrationRequest, ClusterSet, ManagedCluster, SetRef, labels};

use crate::cluster::Target;
use crate::output::{Format, render};

use super::{MemberCommand, pick_set};

/// `tether member ...`.
pub async fn member(target: &Target, cmd: MemberCommand) -> anyhow::Result<()> {
    match cmd {
        MemberCommand::Remove {
            name,
            clusterset,
            ban,
        } => remove(target, &name, clusterset.as_deref(), ban).await,
        MemberCommand::Unban {
            cluster_id,
            clusterset,
        } => unban(target, &cluster_id, clusterset.as_deref()).await,
        MemberCommand::List { clusterset, output } => list(target, clusterset.as_deref(), output).await,
    }
}

fn leader_set(set: &ClusterSet) -> anyhow::Result<()> {
    if set.spec.role != tether_api::clusterset::ClusterSetRole::Leader {
        crate::bail_code!(
            Usage,
            "ClusterSet {} is this cluster's membership, not a set it leads: run this on the leader cluster",
            set.name_any()
        );
    }
    Ok(())
}

/// The set's bans: the IDs of `bannedClusterIDs` (as bans naming an ID) and `bans`.
fn bans(set: &ClusterSet) -> Vec<Ban> {
    let Some(l) = set.spec.leader.as_ref() else {
        return Vec::new();
    };
    l.banned_cluster_ids
        .iter()
        .map(|id| Ban {
            cluster_id: Some(id.clone()),
            ..Ban::default()
        })
        .chain(l.bans.iter().cloned())
        .collect()
}

/// Edits the set's bans (`bannedClusterIDs`, `bans`) with `edit` in a resourceVersion-checked
/// write. When the set changed since it was read (the leader writes its status often), it is read
/// again and the edit made again, a few times, so that no one else's edit is lost and no
/// conflict reaches the admin.
async fn edit_bans(
    sets: &Api<ClusterSet>,
    name: &str,
    edit: impl Fn(&mut Vec<ClusterRef>, &mut Vec<Ban>),
) -> anyhow::Result<()> {
    const ATTEMPTS: usize = 5;
    for attempt in 1..=ATTEMPTS {
        let set = sets.get(name).await?;
        let leader = set.spec.leader.clone().unwrap_or_default();
        let (mut ids, mut bans) = (leader.banned_cluster_ids, leader.bans);
        edit(&mut ids, &mut bans);
        let patch = json!({
            "metadata": {"resourceVersion": set.resource_version()},
            "spec": {"leader": {"bannedClusterIDs": ids, "bans": bans}},
        });
        match sets
            .patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 && attempt < ATTEMPTS => continue,
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("cannot write the bans of ClusterSet {name} (run it again)"));
            }
        }
    }
    unreachable!("the last attempt returns")
}

/// The join tokens of `set` (IDs), to rotate after a ban: every member holds the set's token.
async fn token_ids(client: &kube::Client, set: &SetRef) -> anyhow::Result<Vec<String>> {
    let secrets = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(
        client.clone(),
        tether_join::token::TOKEN_NAMESPACE,
    );
    let list = secrets
        .list(&ListParams::default().labels(&set.selector()))
        .await?;
    Ok(list
        .items
        .iter()
        .filter_map(|s| tether_join::token::secret_text(s, "token-id"))
        .collect())
}

async fn remove(target: &Target, name: &str, clusterset: Option<&str>, ban: bool) -> anyhow::Result<()> {
    let client = target.client().await?;
    let ns = target.namespace.as_str();
    let sets = Api::<ClusterSet>::namespaced(client.clone(), ns);
    let set = pick_set(&sets, clusterset, ns).await?;
    leader_set(&set)?;
    let set_name = set.name_any();
    let selector = SetRef::of(&set).selector();
    let members = Api::<ManagedCluster>::all(client.clone())
        .list(&ListParams::default().labels(&selector))
        .await?;
    let Some(mc) = members.items.into_iter().find(|m| m.name_any() == name) else {
        crate::bail_code!(
            NotFound,
            "no member {name} in ClusterSet {ns}/{set_name}: list them with `tether status --clusterset {set_name}`"
        );
    };
    let id = mc.spec.cluster_id.clone();
    let member_ns = mc.namespace().unwrap_or_default();
    // NB: the ban first: a member removed and not yet banned could register again in between.
    // It names the ID, the name and the key: a cluster reports its own ID, so a banned one that
    // comes back as another ID is still known by its name or key.
    let ban_of = Ban {
        cluster_id: Some(ClusterRef(id.clone())),
        cluster_name: Some(ClusterRef(name.to_string())),
        public_key: mc.spec.public_key.clone().map(PublicKey),
    };
    if ban && !bans(&set).contains(&ban_of) {
        edit_bans(&sets, &set.name_any(), |_, bans| {
            if !bans.contains(&ban_of) {
                bans.push(ban_of.clone());
            }
        })
        .await?;
    }
    let requests = Api::<ClusterRegistrationRequest>::namespaced(client.clone(), ns);
    for req in requests.list(&ListParams::default()).await?.items {
        if req.spec.cluster_id == id {
            super::delete(&requests, &req.name_any()).await?;
        }
    }
    super::delete(
        &Api::<ManagedCluster>::namespaced(client.clone(), &member_ns),
        name,
    )
    .await?;
    // NB: only a namespace the leader made for this very member.
    let namespaces = Api::<Namespace>::all(client.clone());
    if let Some(n) = namespaces.get_opt(&member_ns).await? {
        let l = n.labels();
        let made = l.get(labels::MANAGED_BY).map(String::as_str) == Some("tether-leader")
            && l.get(labels::CLUSTER_NAME).map(String::as_str) == Some(name);
        if made {
            super::delete(&namespaces, &member_ns).await?;
        } else {
            eprintln!("namespace {member_ns} was not made by the leader for {name}: left in place");
        }
    }
    if ban {
        println!(
            "member {name} (cluster ID {id}) removed from ClusterSet {set_name} and banned by its ID, name \
             and key: its requests are denied whatever it reports and it cannot rejoin; lift it with \
             `tether member unban {id} --clusterset {set_name} -n {ns}`"
        );
        let tokens = token_ids(&client, &SetRef::of(&set)).await.unwrap_or_default();
        if !tokens.is_empty() {
            println!(
                "its cluster may still hold ClusterSet {set_name}'s join token (every member joined with it): \
                 rotate it: `tether token create --clusterset {set_name} -n {ns}` for the members to come, \
                 then `tether token delete <id>` for each of {}",
                tokens.join(", ")
            );
        }
    } else {
        println!(
            "member {name} (cluster ID {id}) removed from ClusterSet {set_name}: namespace {member_ns} is being \
             deleted and its credentials are dead. Its agent registers again if it holds a valid join token; \
             add --ban to keep it out, or run `tether leave` on the member"
        );
    }
    Ok(())
}

async fn unban(target: &Target, id: &str, clusterset: Option<&str>) -> anyhow::Result<()> {
    let client = target.client().await?;
    let ns = target.namespace.as_str();
    let sets = Api::<ClusterSet>::namespaced(client, ns);
    let set = pick_set(&sets, clusterset, ns).await?;
    leader_set(&set)?;
    if !bans(&set).iter().any(|b| b.names(id)) {
        println!(
            "no ban of ClusterSet {} names {id} (a cluster ID, name or key); nothing to do",
            set.name_any()
        );
        return Ok(());
    }
    edit_bans(&sets, &set.name_any(), |ids, bans| {
        ids.retain(|b| b.0 != id);
        bans.retain(|b| !b.names(id));
    })
    .await?;
    println!(
        "{id} may register in ClusterSet {} again (with a valid join token): the bans naming it are lifted",
        set.name_any()
    );
    Ok(())
}

/// One row of `tether member list`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Row {
    request: String,
    cluster: String,
    cluster_id: String,
    result: String,
    reason: String,
    message: String,
}

async fn list(target: &Target, clusterset: Option<&str>, output: Format) -> anyhow::Result<()> {
    let client = target.client().await?;
    let ns = target.namespace.as_str();
    let sets = Api::<ClusterSet>::namespaced(client.clone(), ns);
    let set = pick_set(&sets, clusterset, ns).await?;
    leader_set(&set)?;
    let requests = Api::<ClusterRegistrationRequest>::namespaced(client, ns)
        .list(&ListParams::default())
        .await?;
    let mut rows: Vec<Row> = requests
        .items
        .iter()
        .filter_map(|r| {
            let s = r.status.clone().unwrap_or_default();
            (s.result != RegistrationResult::Approved).then(|| Row {
                request: r.name_any(),
                cluster: r.spec.cluster_name.clone(),
                cluster_id: r.spec.cluster_id.clone(),
                result: format!("{:?}", s.result),
                reason: format!("{:?}", s.reason),
                message: s.message.unwrap_or_default(),
            })
        })
        .collect();
    for b in bans(&set) {
        let name = b.cluster_name.clone().map(|n| n.0).unwrap_or_default();
        let id = b.cluster_id.clone().map(|n| n.0).unwrap_or_default();
        let handle = b.handle().to_string();
        let key = b
            .public_key
            .as_ref()
            .filter(|k| k.0 != handle)
            .map(|k| format!(" (and key {})", k.0))
            .unwrap_or_default();
        rows.push(Row {
            request: String::new(),
            cluster: name,
            cluster_id: id,
            result: "Banned".into(),
            reason: "Banned".into(),
            message: format!("lift with `tether member unban {handle}`{key}"),
        });
    }
    if output == Format::Table && rows.is_empty() {
        println!(
            "no pending or denied requests and no bans in ClusterSet {}",
            set.name_any()
        );
        return Ok(());
    }
    let table = rows
        .iter()
        .map(|r| {
            vec![
                r.request.clone(),
                r.cluster.clone(),
                r.cluster_id.clone(),
                r.result.clone(),
                r.reason.clone(),
                r.message.clone(),
            ]
        })
        .collect();
    let headers = ["REQUEST", "CLUSTER", "CLUSTER ID", "RESULT", "REASON", "MESSAGE"];
    print!("{}", render(output, &headers, table, &rows)?);
    Ok(())
}
