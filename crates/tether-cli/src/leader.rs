//! Leader-side commands: `init` (ClusterSet, join RBAC, join token, the join command), `token`,
//! `approve`/`deny`, `status` and `destroy`.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context as _, bail};
use k8s_openapi::api::authentication::v1::{SelfSubjectReview, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::config::AuthInfo;
use kube::{Client, Resource, ResourceExt};
use rand::Rng;
use serde::Serialize;
use serde_json::json;
use tether_api::registration::RegistrationResult;
use tether_api::{ClusterRegistrationRequest, ClusterSet, ManagedCluster, MemberClusterAnnounce, labels};

use crate::cluster::{Target, ca_pem};
use crate::output::{Format, age, render};

const MANAGER: &str = "tether-cli";

/// `tether init`.
#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:\n  tether init --clusterset prod\n  \
                        tether init --clusterset prod --approval manual --token-ttl 2h\n  \
                        tether init --clusterset prod --leader-url https://leader.example.com:6443 --output join.yaml")]
pub struct InitArgs {
    /// The ClusterSet ID (a DNS label), e.g. prod.
    #[arg(long)]
    pub clusterset: String,
    /// How registrations are approved.
    #[arg(long, value_enum, default_value_t = Approval::Auto)]
    pub approval: Approval,
    /// Lifetime of the join token.
    #[arg(long, default_value = "24h", value_parser = crate::parse_duration)]
    pub token_ttl: Duration,
    /// The leader API server URL members reach (default: the kubeconfig's server).
    #[arg(long)]
    pub leader_url: Option<String>,
    /// Write a join config file (for `tether join --config`) instead of printing the token.
    #[arg(long)]
    pub output: Option<std::path::PathBuf>,
    /// How long to wait for the leader controller to pick the ClusterSet up.
    #[arg(long, default_value = "60s", value_parser = crate::parse_duration)]
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
        #[arg(long, default_value = "24h", value_parser = crate::parse_duration)]
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
    #[arg(long, default_value = "120s", value_parser = crate::parse_duration)]
    pub wait: Duration,
}

fn meta(name: &str, ns: Option<&str>, set: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: ns.map(str::to_string),
        labels: Some(BTreeMap::from([
            (labels::CLUSTER_SET.to_string(), set.to_string()),
            (labels::MANAGED_BY.to_string(), MANAGER.to_string()),
        ])),
        ..ObjectMeta::default()
    }
}

async fn apply<K>(api: &Api<K>, obj: &K) -> anyhow::Result<()>
where
    K: Resource<DynamicType = ()> + Clone + Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let name = obj.meta().name.clone().unwrap_or_default();
    let mut body = serde_json::to_value(obj)?;
    body["apiVersion"] = json!(K::api_version(&()));
    body["kind"] = json!(K::kind(&()));
    api.patch(&name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(body))
        .await
        .with_context(|| format!("cannot apply {} {name}", K::kind(&())))?;
    Ok(())
}

/// The join RBAC: the set's bootstrap group (and the fallback ServiceAccount) may create and
/// read registration requests in the set's namespace, nothing else.
fn join_rbac(ns: &str, set: &str) -> (Role, RoleBinding) {
    let name = format!("tether-join-{set}");
    let role = Role {
        metadata: meta(&name, Some(ns), set),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![tether_api::GROUP.into()]),
            resources: Some(vec!["clusterregistrationrequests".into()]),
            verbs: vec!["create".into(), "get".into()],
            ..PolicyRule::default()
        }]),
    };
    let binding = RoleBinding {
        metadata: meta(&name, Some(ns), set),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: name.clone(),
        },
        subjects: Some(vec![
            Subject {
                api_group: Some("rbac.authorization.k8s.io".into()),
                kind: "Group".into(),
                name: format!("system:bootstrappers:tether:{set}"),
                ..Subject::default()
            },
            Subject {
                kind: "ServiceAccount".into(),
                name,
                namespace: Some(ns.into()),
                ..Subject::default()
            },
        ]),
    };
    (role, binding)
}

fn set_object(ns: &str, set: &str, approval: Approval) -> anyhow::Result<ClusterSet> {
    let mode = match approval {
        Approval::Auto => "Automatic",
        Approval::Manual => "Manual",
    };
    Ok(serde_json::from_value(json!({
        "apiVersion": "multicluster.tether.dev/v1alpha1", "kind": "ClusterSet",
        "metadata": {"name": set, "namespace": ns},
        "spec": {"role": "Leader", "leader": {"approval": {"mode": mode}}}
    }))?)
}

/// Creates the namespace, ClusterSet and join RBAC, waits for the leader, mints a token and
/// prints the join command. Safe to run again (a new token is minted each time).
pub async fn init(target: &Target, args: InitArgs) -> anyhow::Result<()> {
    let ns = target.namespace.as_str();
    let set = args.clusterset.as_str();
    let (role, binding) = join_rbac(ns, set);
    let set_obj = set_object(ns, set, args.approval)?;
    if args.dry_run {
        for doc in [
            serde_json::to_value(&set_obj)?,
            serde_json::to_value(&role)?,
            serde_json::to_value(&binding)?,
        ] {
            print!("---\n{}", serde_norway::to_string(&doc)?);
        }
        println!(
            "# plus a join token (bootstrap token in kube-system) valid for {:?}",
            args.token_ttl
        );
        return Ok(());
    }
    let config = target.config().await?;
    let client = Client::try_from(config.clone())?;
    let mut nsobj = Namespace::default();
    nsobj.metadata.name = Some(ns.into());
    apply(&Api::<Namespace>::all(client.clone()), &nsobj).await?;
    let sets = Api::<ClusterSet>::namespaced(client.clone(), ns);
    if let Some(existing) = sets.get_opt(set).await?
        && existing.spec.role != tether_api::clusterset::ClusterSetRole::Leader
    {
        bail!("{ns}/{set} is a Member ClusterSet: this cluster is a member, not a leader");
    }
    apply(&sets, &set_obj)
        .await
        .context("is Tether installed? helm install tether-leader charts/tether-leader")?;
    apply(&Api::<Role>::namespaced(client.clone(), ns), &role).await?;
    apply(&Api::<RoleBinding>::namespaced(client.clone(), ns), &binding).await?;
    eprintln!("ClusterSet {ns}/{set} applied; waiting for the leader controller…");
    wait_for_leader(&sets, set, args.wait).await?;

    let token = create_token(&client, &config, ns, set, args.token_ttl).await?;
    let url = args
        .leader_url
        .clone()
        .unwrap_or_else(|| config.cluster_url.to_string().trim_end_matches('/').to_string());
    let ca = ca_pem(&config)
        .context("the kubeconfig has no CA for this cluster; cannot compute --ca-cert-hash")?;
    let hash = tether_agent::discovery::pins(&ca)?
        .first()
        .map(|p| p.pin.clone())
        .context("no CA certificate in the kubeconfig")?;
    let expires = Timestamp::now() + SignedDuration::from_secs(args.token_ttl.as_secs() as i64);
    if let Some(path) = &args.output {
        let file = json!({"leaderURL": url, "token": token.value, "caCertHash": hash, "clusterSet": set,
                          "leaderNamespace": ns, "expires": expires.to_string()});
        std::fs::write(path, serde_norway::to_string(&file)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
        println!(
            "Wrote the join config to {} (it holds a secret token: keep it private).",
            path.display()
        );
        println!(
            "On each member cluster:\n  tether join --config {} --name <CLUSTER-NAME>",
            path.display()
        );
        return Ok(());
    }
    println!(
        "ClusterSet {set} is ready ({:?} approval). Token kind: {}.",
        args.approval, token.kind
    );
    println!("\nJoin a member cluster (with that cluster's kubeconfig):");
    println!(
        "  tether join --leader {url} --token {} --ca-cert-hash {hash} --name <CLUSTER-NAME>",
        token.value
    );
    println!("\nor install the agent there with Helm:");
    println!(
        "  helm install tether-agent charts/tether-agent -n tether-system --create-namespace \\\n    \
         --set leader.url={url} --set leader.token={} --set leader.caCertHash={hash} \\\n    \
         --set cluster.name=<CLUSTER-NAME>",
        token.value
    );
    println!("\nThe token expires at {expires}; `tether token create --clusterset {set}` makes another.");
    Ok(())
}

async fn wait_for_leader(sets: &Api<ClusterSet>, set: &str, wait: Duration) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let s = sets.get(set).await?;
        if s.status.as_ref().and_then(|st| st.observed_generation).is_some() {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            bail!(
                "the leader controller has not picked up ClusterSet {set} within {wait:?}: is it installed and \
                 running? (helm install tether-leader charts/tether-leader -n tether-system; \
                 kubectl -n tether-system logs deploy/tether-leader)"
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A join token and how it authenticates.
pub struct JoinToken {
    /// The bearer token.
    pub value: String,
    /// `bootstrap token` or `ServiceAccount token`.
    pub kind: &'static str,
}

fn random(len: usize) -> String {
    const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    (0..len)
        .map(|_| CHARS[rng.random_range(0..CHARS.len())] as char)
        .collect()
}

/// Mints a join token: a bootstrap token where the API server accepts them (checked by
/// authenticating with it), else a short-lived token of the set's join ServiceAccount.
pub async fn create_token(
    client: &Client,
    config: &kube::Config,
    ns: &str,
    set: &str,
    ttl: Duration,
) -> anyhow::Result<JoinToken> {
    let (id, secret) = (random(6), random(16));
    let expires = Timestamp::now() + SignedDuration::from_secs(ttl.as_secs() as i64);
    let data = BTreeMap::from([
        ("token-id".to_string(), id.clone()),
        ("token-secret".to_string(), secret.clone()),
        ("expiration".to_string(), expires.to_string()),
        ("usage-bootstrap-authentication".to_string(), "true".to_string()),
        ("usage-bootstrap-signing".to_string(), "true".to_string()),
        (
            "auth-extra-groups".to_string(),
            format!("system:bootstrappers:tether:{set}"),
        ),
        (
            "description".to_string(),
            format!("tether join token for ClusterSet {set}"),
        ),
    ]);
    let name = format!("bootstrap-token-{id}");
    let secret_obj = Secret {
        metadata: meta(&name, Some("kube-system"), set),
        type_: Some("bootstrap.kubernetes.io/token".into()),
        string_data: Some(data),
        ..Secret::default()
    };
    let secrets = Api::<Secret>::namespaced(client.clone(), "kube-system");
    secrets
        .create(&PostParams::default(), &secret_obj)
        .await
        .context("cannot create the join token")?;
    let value = format!("{id}.{secret}");
    if authenticates(config, &value).await {
        return Ok(JoinToken {
            value,
            kind: "bootstrap token",
        });
    }
    // Bootstrap-token authentication is off here: fall back to a ServiceAccount token.
    secrets.delete(&name, &DeleteParams::default()).await.ok();
    let sa_name = format!("tether-join-{set}");
    let sa = ServiceAccount {
        metadata: meta(&sa_name, Some(ns), set),
        ..ServiceAccount::default()
    };
    apply(&Api::<ServiceAccount>::namespaced(client.clone(), ns), &sa).await?;
    let req = TokenRequest {
        spec: TokenRequestSpec {
            expiration_seconds: Some(ttl.as_secs() as i64),
            ..TokenRequestSpec::default()
        },
        ..TokenRequest::default()
    };
    let token = Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .create_token_request(&sa_name, &PostParams::default(), &req)
        .await
        .context("cannot mint a ServiceAccount join token")?;
    Ok(JoinToken {
        value: token.status.map(|s| s.token).unwrap_or_default(),
        kind: "ServiceAccount token (bootstrap tokens are not enabled here)",
    })
}

/// Whether the API server accepts `token` (it may take a moment to see a new bootstrap token).
async fn authenticates(config: &kube::Config, token: &str) -> bool {
    let mut config = config.clone();
    config.auth_info = AuthInfo {
        token: Some(token.to_string().into()),
        ..AuthInfo::default()
    };
    let Ok(client) = Client::try_from(config) else {
        return false;
    };
    let api = Api::<SelfSubjectReview>::all(client);
    for _ in 0..10 {
        match api
            .create(&PostParams::default(), &SelfSubjectReview::default())
            .await
        {
            Ok(_) => return true,
            Err(_) => tokio::time::sleep(Duration::from_millis(300)).await,
        }
    }
    false
}

/// `tether token …`.
pub async fn token(target: &Target, cmd: TokenCommand) -> anyhow::Result<()> {
    let config = target.config().await?;
    let client = Client::try_from(config.clone())?;
    let secrets = Api::<Secret>::namespaced(client.clone(), "kube-system");
    match cmd {
        TokenCommand::Create { clusterset, ttl } => {
            let sets = Api::<ClusterSet>::namespaced(client.clone(), &target.namespace);
            if sets.get_opt(&clusterset).await?.is_none() {
                bail!(
                    "no ClusterSet {}/{clusterset}: create it with `tether init --clusterset {clusterset}`",
                    target.namespace
                );
            }
            let t = create_token(&client, &config, &target.namespace, &clusterset, ttl).await?;
            println!("{}", t.value);
        }
        TokenCommand::List { clusterset, output } => {
            let selector = match &clusterset {
                Some(s) => format!("{}={s}", labels::CLUSTER_SET),
                None => labels::CLUSTER_SET.to_string(),
            };
            let list = secrets.list(&ListParams::default().labels(&selector)).await?;
            #[derive(Serialize)]
            struct Row {
                id: String,
                clusterset: String,
                expires: String,
                usages: String,
            }
            let rows: Vec<Row> = list
                .items
                .iter()
                .filter(|s| s.type_.as_deref() == Some("bootstrap.kubernetes.io/token"))
                .map(|s| {
                    let text = |k: &str| tether_agent::state::secret_text(s, k).unwrap_or_default();
                    let usages = ["authentication", "signing"]
                        .into_iter()
                        .filter(|u| text(&format!("usage-bootstrap-{u}")) == "true")
                        .collect::<Vec<_>>()
                        .join(",");
                    Row {
                        id: text("token-id"),
                        clusterset: s.labels().get(labels::CLUSTER_SET).cloned().unwrap_or_default(),
                        expires: text("expiration"),
                        usages,
                    }
                })
                .collect();
            let table = rows
                .iter()
                .map(|r| {
                    vec![
                        r.id.clone(),
                        r.clusterset.clone(),
                        r.expires.clone(),
                        r.usages.clone(),
                    ]
                })
                .collect();
            print!(
                "{}",
                render(output, &["ID", "CLUSTERSET", "EXPIRES", "USAGES"], table, &rows)?
            );
        }
        TokenCommand::Delete { id } => {
            match secrets
                .delete(&format!("bootstrap-token-{id}"), &DeleteParams::default())
                .await
            {
                Ok(_) => println!("deleted token {id}"),
                Err(kube::Error::Api(s)) if s.code == 404 => {
                    println!("token {id} does not exist (nothing to do)")
                }
                Err(e) => return Err(e).context("cannot delete the token"),
            }
        }
    }
    Ok(())
}

/// `tether approve|deny NAME`.
pub async fn decide(target: &Target, args: DecideArgs, approve: bool) -> anyhow::Result<()> {
    let client = target.client().await?;
    let api = Api::<ClusterRegistrationRequest>::namespaced(client, &target.namespace);
    let req = api.get_opt(&args.name).await?.with_context(|| {
        format!(
            "no registration request {}/{}: list them with `kubectl get clsrr -n {}`",
            target.namespace, args.name, target.namespace
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
    let set = match &args.clusterset {
        Some(name) => sets
            .get_opt(name)
            .await?
            .with_context(|| format!("no ClusterSet {}/{name}", target.namespace))?,
        None => {
            let all = sets.list(&ListParams::default()).await?.items;
            match all.len() {
                1 => all.into_iter().next().context("one ClusterSet")?,
                0 => bail!(
                    "no ClusterSet in namespace {}: `tether init` (leader) or `tether join` (member)",
                    target.namespace
                ),
                _ => bail!(
                    "several ClusterSets in {}: pick one with --clusterset",
                    target.namespace
                ),
            }
        }
    };
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
    let selector = format!("{}={}", labels::CLUSTER_SET, set.name_any());
    let mcs = Api::<ManagedCluster>::all(client.clone())
        .list(&ListParams::default().labels(&selector))
        .await?;
    let mcas = Api::<MemberClusterAnnounce>::all(client)
        .list(&ListParams::default().labels(&selector))
        .await?;
    let now = Timestamp::now();
    let rows: Vec<MemberRow> = mcs
        .items
        .iter()
        .map(|mc| {
            let s = mc.status.clone().unwrap_or_default();
            let renewed = mcas
                .items
                .iter()
                .find(|a| a.namespace() == mc.namespace())
                .and_then(|a| a.spec.renew_time.clone())
                .map(|t| format!("{} ago", age((now - t.0).get_seconds())))
                .unwrap_or_else(|| "never".into());
            MemberRow {
                name: mc.name_any(),
                cluster_id: mc.spec.cluster_id.clone(),
                ready: s
                    .conditions
                    .iter()
                    .find(|c| c.type_ == "Ready")
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

/// `tether destroy`: refuses while members remain unless `--force`.
pub async fn destroy(target: &Target, args: DestroyArgs) -> anyhow::Result<()> {
    let client = target.client().await?;
    let ns = target.namespace.as_str();
    let set = args.clusterset.as_str();
    let sets = Api::<ClusterSet>::namespaced(client.clone(), ns);
    let selector = format!("{}={set}", labels::CLUSTER_SET);
    if sets.get_opt(set).await?.is_some() {
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
        if args.force {
            let patch = json!({"metadata": {"annotations": {tether_api::annotations::FORCE_DELETE: "true"}}});
            sets.patch(set, &PatchParams::default(), &Patch::Merge(patch))
                .await?;
        }
        sets.delete(set, &DeleteParams::default()).await?;
        eprintln!("deleting ClusterSet {ns}/{set}…");
        let deadline = tokio::time::Instant::now() + args.wait;
        while sets.get_opt(set).await?.is_some() {
            if tokio::time::Instant::now() >= deadline {
                bail!(
                    "ClusterSet {set} is still being deleted after {:?}: see `kubectl describe clusterset -n {ns} {set}`",
                    args.wait
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    } else {
        eprintln!("ClusterSet {ns}/{set} does not exist; removing what is left of it");
    }
    // The leader's finalizer removes these too; doing it here also covers a set whose leader is gone.
    let dp = DeleteParams::default();
    let lp = ListParams::default().labels(&selector);
    Api::<Secret>::namespaced(client.clone(), "kube-system")
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
