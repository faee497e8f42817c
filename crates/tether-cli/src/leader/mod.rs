//! Leader-side commands: `init` (ClusterSet, join RBAC, join token, the join command), `token`,
//! `approve`/`deny`, `status` and `destroy`, one module each; their flags are defined here.

mod admin;
mod init;
mod member;
mod status;
mod token;
mod uninstall;

pub use admin::{decide, destroy};
pub use init::{JoinToken, create_token, helm_command, init, join_file};
pub use member::member;
pub use status::status;
pub use token::token;
pub use uninstall::{UninstallArgs, uninstall};

use std::time::Duration;

use anyhow::Context as _;
use kube::Resource;
use kube::api::{Api, Patch, PatchParams};
use serde::Serialize;
use serde_json::json;
use tether_api::ClusterSet;
use tether_api::clusterset::{ApprovalMode, ClusterSetRole, ClusterSetSpec};

use crate::output::Format;

use tether_join::token::MANAGER;

/// `tether init`.
#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:\n  tether init --clusterset prod\n  \
                        tether init --clusterset prod --approval manual --token-ttl 2h\n  \
                        tether init --clusterset prod --leader-url https://leader.example.com:6443 --values-file join.yaml")]
pub struct InitArgs {
    /// The ClusterSet ID (a DNS label), e.g. prod.
    #[arg(long)]
    pub clusterset: String,
    /// How registrations are approved.
    #[arg(long, value_enum, default_value_t = Approval::Auto)]
    pub approval: Approval,
    /// Lifetime of the join token.
    #[arg(long, default_value = "24h", value_parser = tether_api::duration::parse)]
    pub token_ttl: Duration,
    /// The leader API server URL members reach. Default: the server published in
    /// kube-public/cluster-info (kubeadm's endpoint, or the leader chart's `leaderURL`), else the
    /// kubeconfig's server.
    #[arg(long)]
    pub leader_url: Option<String>,
    /// Write the join config to FILE instead of printing the token, so it stays out of shell
    /// history: the agent chart's values (`helm install -f FILE`) and `tether join --config-file
    /// FILE` alike. `--output` is its former name.
    #[arg(long = "values-file", visible_alias = "output", value_name = "FILE")]
    pub values_file: Option<std::path::PathBuf>,
    /// PEM file of the leader API server's CA (or bundle) that members pin. Default: the
    /// kubeconfig's CA. With several CAs (a CA rotation's overlap), the one the leader's serving
    /// certificate chains to now is pinned.
    #[arg(long, value_name = "FILE")]
    pub ca_file: Option<std::path::PathBuf>,
    /// How long to wait for the leader controller to pick the ClusterSet up.
    #[arg(long, default_value = "60s", value_parser = tether_api::duration::parse)]
    pub wait: Duration,
    /// Print what would be created, create nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// Approval modes.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Approval {
    /// Every valid request is approved.
    Auto,
    /// An admin approves each request (`tether approve`).
    Manual,
}

/// `tether token`.
#[derive(clap::Subcommand, Debug)]
pub enum TokenCommand {
    /// Create a join token and print it (the secret part is shown only now).
    Create {
        /// The ClusterSet.
        #[arg(long)]
        clusterset: String,
        /// Lifetime.
        #[arg(long, default_value = "24h", value_parser = tether_api::duration::parse)]
        ttl: Duration,
    },
    /// List join tokens (IDs only, never secrets).
    List {
        /// Only this ClusterSet's.
        #[arg(long)]
        clusterset: Option<String>,
        /// Output format.
        #[arg(short, long, value_enum, default_value_t = Format::Table)]
        output: Format,
    },
    /// Delete a join token by ID.
    Delete {
        /// The token ID (the part before the dot).
        id: String,
    },
}

/// `tether member`.
#[derive(clap::Subcommand, Debug)]
pub enum MemberCommand {
    /// Remove a member: its namespace, ServiceAccount (every credential it holds dies with it),
    /// ManagedCluster and requests; its tunnel closes within seconds. With --ban it can never
    /// come back until `tether member unban`.
    #[command(after_help = "Examples:\n  tether member remove east\n  \
                            tether member remove east --ban --clusterset prod")]
    Remove {
        /// The member (its ManagedCluster name, `tether status`).
        name: String,
        /// The ClusterSet (default: the only one in the namespace).
        #[arg(long)]
        clusterset: Option<String>,
        /// Also ban it, by its cluster ID, its name and its key: its requests are Denied
        /// (Banned) whatever it reports, it cannot rejoin, and its tunnel closes.
        #[arg(long)]
        ban: bool,
    },
    /// Lift the bans that name a cluster ID, name or key, so that it may register again.
    Unban {
        /// The cluster ID, name or key (as `tether member list` shows it).
        cluster_id: String,
        /// The ClusterSet (default: the only one in the namespace).
        #[arg(long)]
        clusterset: Option<String>,
    },
    /// List registration requests that are pending or denied, and the bans.
    List {
        /// The ClusterSet (default: the only one in the namespace).
        #[arg(long)]
        clusterset: Option<String>,
        /// Output format.
        #[arg(short, long, value_enum, default_value_t = Format::Table)]
        output: Format,
    },
}

/// `tether approve|deny`.
#[derive(clap::Args, Debug)]
pub struct DecideArgs {
    /// The registration request (`kubectl get clsrr -n tether-system`).
    pub name: String,
    /// A note for the member (shown in the request's status).
    #[arg(long)]
    pub message: Option<String>,
}

/// `tether status`.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "Examples:\n  tether status                   # on the leader: counts and one row per member\n  \
                        tether status -o json           # the same rows for scripts\n  \
                        tether status --context east    # on a member: its membership and conditions"
)]
pub struct StatusArgs {
    /// The ClusterSet (default: the only one in the namespace).
    #[arg(long)]
    pub clusterset: Option<String>,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Format::Table)]
    pub output: Format,
}

/// `tether destroy`.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "Examples:\n  tether destroy --clusterset prod            # refuses while members remain\n  \
                        tether destroy --clusterset prod --force    # removes every member too"
)]
pub struct DestroyArgs {
    /// The ClusterSet to remove.
    #[arg(long)]
    pub clusterset: String,
    /// Remove it even while members remain (they are removed too).
    #[arg(long)]
    pub force: bool,
    /// How long to wait until everything is gone.
    #[arg(long, default_value = "120s", value_parser = tether_api::duration::parse)]
    pub wait: Duration,
    /// Print what would be removed and change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Do not ask for confirmation (needed when stdin is not a terminal).
    #[arg(long, short = 'y')]
    pub yes: bool,
}

/// The ClusterSet `name` in `namespace`, or without a name the only one there.
pub(crate) async fn pick_set(
    sets: &Api<ClusterSet>,
    name: Option<&str>,
    namespace: &str,
) -> anyhow::Result<ClusterSet> {
    if let Some(name) = name {
        return sets.get_opt(name).await?.ok_or_else(|| {
            crate::exit::fail(
                crate::exit::Code::NotFound,
                format!(
                    "no ClusterSet {namespace}/{name}: list them with `kubectl get clusterset -n {namespace}`"
                ),
            )
        });
    }
    let mut all = sets.list(&kube::api::ListParams::default()).await?.items;
    match all.len() {
        1 => Ok(all.remove(0)),
        0 => crate::bail_code!(
            NotFound,
            "no ClusterSet in namespace {namespace}: `tether init` (leader) or `tether join` (member)"
        ),
        _ => crate::bail_code!(
            Usage,
            "several ClusterSets in {namespace}: pick one with --clusterset"
        ),
    }
}

/// Deletes `name`; one already gone (the leader or another admin got there first) is done.
async fn delete<K>(api: &Api<K>, name: &str) -> anyhow::Result<()>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &kube::api::DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e).with_context(|| format!("cannot delete {} {name}", K::kind(&()))),
    }
}

async fn apply<K>(api: &Api<K>, obj: &K) -> anyhow::Result<()>
where
    K: Resource<DynamicType = ()> + Clone + Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let name = obj.meta().name.clone().unwrap_or_default();
    api.patch(&name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(obj))
        .await
        .with_context(|| format!("cannot apply {} {name}", K::kind(&())))?;
    Ok(())
}

/// The Leader ClusterSet `init` applies: the approval mode, every other field left to the CRD's
/// defaults (so a re-run does not take them over from an admin who changed them).
fn set_object(ns: &str, set: &str, approval: Approval) -> anyhow::Result<serde_json::Value> {
    let mode = match approval {
        Approval::Auto => ApprovalMode::Automatic,
        Approval::Manual => ApprovalMode::Manual,
    };
    let mut obj = ClusterSet::new(
        set,
        ClusterSetSpec {
            role: ClusterSetRole::Leader,
            leader: None,
            member: None,
        },
    );
    obj.metadata.namespace = Some(ns.into());
    let mut value = serde_json::to_value(&obj)?;
    // NB: only spec.leader.approval.mode: the typed LeaderSpec would apply every duration too.
    value["spec"]["leader"] = json!({"approval": {"mode": mode}});
    Ok(value)
}
