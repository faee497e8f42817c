//! Member-side commands. `join` checks the leader's CA pin before anything else (nothing is sent
//! on a mismatch), checks the token with the leader, then writes the join token Secret and the
//! Member ClusterSet for the agent and follows its progress; on failure, timeout or Ctrl-C it
//! removes what it created. `leave` deletes the Member ClusterSet and waits for the agent.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context as _, bail};
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde::Deserialize;
use serde_json::json;
use tether_agent::discovery::{self, Trust};
use tether_api::ClusterSet;

use crate::cluster::Target;

/// The Secret `join` writes for the agent.
pub const TOKEN_SECRET: &str = "tether-join-token";
const MANAGER: &str = "tether-cli";

/// `tether join`.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "Examples:\n  tether join --leader https://leader:6443 --token abcdef.0123456789abcdef \\\n    \
                        --ca-cert-hash sha256:1234… --name east\n  tether join --config join.yaml --name west"
)]
pub struct JoinArgs {
    /// The leader's API server URL (https).
    #[arg(long)]
    pub leader: Option<String>,
    /// The join token printed by `tether init` on the leader.
    #[arg(long, env = "TETHER_JOIN_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// The leader's CA pin printed by `tether init` (sha256:<hex>).
    #[arg(long)]
    pub ca_cert_hash: Option<String>,
    /// This cluster's name in the set (a DNS label; default: the kubeconfig context name).
    #[arg(long)]
    pub name: Option<String>,
    /// A join config file written by `tether init --output` (flags override it).
    #[arg(long)]
    pub config: Option<std::path::PathBuf>,
    /// The ClusterSet's namespace on the leader (default: from the token, else tether-system).
    #[arg(long)]
    pub leader_namespace: Option<String>,
    /// How long to wait for the agent to register and become Ready.
    #[arg(long, default_value = "3m", value_parser = crate::parse_duration)]
    pub timeout: Duration,
    /// Check the leader and the token, print what would be created, create nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// `tether leave`.
#[derive(clap::Args, Debug)]
pub struct LeaveArgs {
    /// Wait until the agent has deregistered and the ClusterSet is gone.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub wait: bool,
    /// How long to wait.
    #[arg(long, default_value = "2m", value_parser = crate::parse_duration)]
    pub timeout: Duration,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct JoinFile {
    #[serde(rename = "leaderURL")]
    leader_url: Option<String>,
    token: Option<String>,
    ca_cert_hash: Option<String>,
    cluster_set: Option<String>,
    leader_namespace: Option<String>,
}

/// A DNS label from a context name: lowercase, other characters to `-`, at most 63.
pub fn dns_label(name: &str) -> String {
    let s: String = name
        .to_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    s.trim_matches('-')
        .chars()
        .take(63)
        .collect::<String>()
        .trim_end_matches('-')
        .to_string()
}

/// Joins this cluster; see the module docs.
pub async fn join(target: &Target, args: JoinArgs) -> anyhow::Result<()> {
    let file: JoinFile = match &args.config {
        Some(p) => serde_norway::from_str(
            &std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))?,
        )
        .with_context(|| {
            format!(
                "{} is not a join config written by `tether init --output`",
                p.display()
            )
        })?,
        None => JoinFile::default(),
    };
    let leader = args
        .leader
        .or(file.leader_url)
        .context("--leader is required (the leader's https:// URL)")?;
    let token = args
        .token
        .or(file.token)
        .context("--token is required (printed by `tether init` on the leader)")?;
    let hash = args.ca_cert_hash.or(file.ca_cert_hash).context(
        "--ca-cert-hash is required (printed by `tether init`); it lets the agent verify the leader before sending the token",
    )?;
    if !leader.starts_with("https://") {
        bail!("--leader must be an https:// URL, got {leader:?}");
    }
    if !hash.starts_with("sha256:") || hash.len() != 71 {
        bail!("--ca-cert-hash must be sha256:<64 hex digits>, got {hash:?}");
    }

    // 1. The pin, before anything is sent.
    eprintln!("Checking the leader's CA against {hash}…");
    let ca = discovery::fetch_leader_ca(&leader).await?;
    discovery::check_pin(&ca, &hash)?;
    let trust = Trust::Ca(ca);

    // 2. The token, at the now-trusted leader: valid, and for which set.
    let leader_client = Client::try_from(discovery::leader_config(&leader, &trust, Some(&token))?)?;
    let review = Api::<SelfSubjectReview>::all(leader_client)
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await;
    let user = match review {
        Ok(r) => r.status.and_then(|s| s.user_info).unwrap_or_default(),
        Err(kube::Error::Api(s)) if s.code == 401 => bail!(
            "the leader rejected the token (expired, deleted or mistyped): create a new one on the leader with \
             `tether token create --clusterset <SET>`; nothing was created here"
        ),
        Err(e) => return Err(e).context(format!("cannot reach the leader at {leader}")),
    };
    let groups = user.groups.unwrap_or_default();
    let from_token = groups
        .iter()
        .find_map(|g| g.strip_prefix("system:bootstrappers:tether:").map(str::to_string));
    let from_sa = user
        .username
        .as_deref()
        .and_then(|u| u.strip_prefix("system:serviceaccount:"))
        .and_then(|rest| rest.split_once(':'))
        .and_then(|(ns, name)| {
            name.strip_prefix("tether-join-")
                .map(|set| (ns.to_string(), set.to_string()))
        });
    let set = file
        .cluster_set
        .or(from_token)
        .or(from_sa.as_ref().map(|(_, s)| s.clone()))
        .context("this token does not belong to a Tether ClusterSet: use one printed by `tether init`")?;
    let leader_ns = args
        .leader_namespace
        .or(file.leader_namespace)
        .or(from_sa.map(|(ns, _)| ns))
        .unwrap_or_else(|| "tether-system".into());

    // 3. This cluster.
    let config = target.config().await?;
    let name = match args.name {
        Some(n) => n,
        None => {
            let ctx = target.context.clone().or_else(|| {
                kube::config::Kubeconfig::read()
                    .ok()
                    .and_then(|k| k.current_context)
            });
            dns_label(&ctx.unwrap_or_default())
        }
    };
    if name.is_empty() {
        bail!("cannot derive a cluster name from the kubeconfig context: pass --name");
    }
    let ns = target.namespace.clone();
    let spec = json!({"leaderURL": leader, "leaderNamespace": leader_ns, "caCertHash": hash,
                      "joinTokenSecretRef": {"name": TOKEN_SECRET, "key": "token"}, "clusterName": name});
    let set_obj = json!({"apiVersion": "multicluster.tether.dev/v1alpha1", "kind": "ClusterSet",
                         "metadata": {"name": set, "namespace": ns}, "spec": {"role": "Member", "member": spec}});
    if args.dry_run {
        println!("The leader's CA matches and the token is valid for ClusterSet {set}. Would create:");
        print!("---\n{}", serde_norway::to_string(&set_obj)?);
        println!("---\n# Secret {ns}/{TOKEN_SECRET} holding the join token");
        return Ok(());
    }
    let client = Client::try_from(config)?;
    if Api::<Namespace>::all(client.clone())
        .get_opt(&ns)
        .await?
        .is_none()
    {
        bail!(
            "namespace {ns} does not exist here, so no agent is installed: helm install tether-agent \
             charts/tether-agent -n {ns} --create-namespace (or pass -n with the agent's namespace)"
        );
    }
    let sets = Api::<ClusterSet>::namespaced(client.clone(), &ns);
    let existing = match sets.get_opt(&set).await {
        Ok(s) => s,
        Err(kube::Error::Api(s)) if s.code == 404 => {
            bail!(
                "the Tether CRDs are not installed here: helm install tether-agent charts/tether-agent -n {ns}"
            )
        }
        Err(e) => return Err(e.into()),
    };
    if let Some(existing) = existing {
        let same = existing
            .spec
            .member
            .as_ref()
            .is_some_and(|m| m.leader_url == leader && m.cluster_name == name);
        if !same {
            bail!(
                "this cluster already has ClusterSet {ns}/{set} with another leader or name: run `tether leave` first"
            );
        }
        eprintln!("Already joined (ClusterSet {ns}/{set} exists); checking its state…");
        return follow(&sets, &set, args.timeout).await.map(|_| ());
    }

    // 4. Create, follow, and undo on failure or Ctrl-C.
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
        string_data: Some(BTreeMap::from([("token".to_string(), token)])),
        ..Secret::default()
    };
    let secrets = Api::<Secret>::namespaced(client.clone(), &ns);
    let mut body = serde_json::to_value(&secret)?;
    body["apiVersion"] = json!("v1");
    body["kind"] = json!("Secret");
    secrets
        .patch(
            TOKEN_SECRET,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(body),
        )
        .await?;
    let obj: ClusterSet = serde_json::from_value(set_obj)?;
    if let Err(e) = sets.create(&PostParams::default(), &obj).await {
        rollback(&sets, &secrets, &set, false).await;
        return Err(e).context("cannot create the Member ClusterSet");
    }
    eprintln!("Created Secret {ns}/{TOKEN_SECRET} and ClusterSet {ns}/{set}; waiting for the agent…");
    let outcome = tokio::select! {
        r = follow(&sets, &set, args.timeout) => r,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
    };
    match outcome {
        Ok(st) => {
            println!("Joined ClusterSet {set} as {name}: {st}");
            Ok(())
        }
        Err(e) => {
            rollback(&sets, &secrets, &set, true).await;
            Err(e.context("join failed; removed the ClusterSet and Secret it had created"))
        }
    }
}

/// Follows the Member ClusterSet until Ready; fails on a permanent error or timeout.
async fn follow(sets: &Api<ClusterSet>, set: &str, timeout: Duration) -> anyhow::Result<String> {
    let start = tokio::time::Instant::now();
    let mut last = String::new();
    let mut picked_up = false;
    loop {
        let s = sets.get(set).await?;
        picked_up |= s.finalizers().iter().any(|f| f == tether_agent::AGENT_FINALIZER);
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
        if state == "Ready" {
            return Ok(line);
        }
        let registered = st.conditions.iter().find(|c| c.type_ == "Registered");
        if let Some(c) = registered.filter(|c| c.status == "False")
            && matches!(
                c.reason.as_str(),
                "JoinTokenExpired" | "JoinTokenInvalid" | "Denied"
            )
        {
            bail!("{}: {}", c.reason, c.message);
        }
        if !picked_up && start.elapsed() > Duration::from_secs(30) {
            bail!(
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
            bail!("not Ready after {timeout:?}: {}", why.unwrap_or(last));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn rollback(sets: &Api<ClusterSet>, secrets: &Api<Secret>, set: &str, wait: bool) {
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
    if args.wait {
        let deadline = tokio::time::Instant::now() + args.timeout;
        while sets.get_opt(&name).await?.is_some() {
            if tokio::time::Instant::now() >= deadline {
                bail!(
                    "still leaving after {:?}: is the agent running? (kubectl -n {ns} describe clusterset {name})",
                    args.timeout
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    let _ = Api::<Secret>::namespaced(client, ns)
        .delete(TOKEN_SECRET, &DeleteParams::default())
        .await;
    println!("Left ClusterSet {name}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_names_become_dns_labels() {
        assert_eq!(dns_label("kind-East_1"), "kind-east-1");
        assert_eq!(
            dns_label("arn:aws:eks:eu-west-1:123:cluster/prod"),
            "arn-aws-eks-eu-west-1-123-cluster-prod"
        );
        assert_eq!(dns_label(&"x".repeat(80)).len(), 63);
        assert_eq!(dns_label("--"), "");
    }
}
