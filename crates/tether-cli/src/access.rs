//! Member access from wherever an admin already reaches the leader: a kubeconfig whose server is
//! a member's proxy path on the leader (`tether kubeconfig --cluster east`), and kubectl run
//! through it (`tether --cluster east -- get ns`). The credentials stay the leader's own: the
//! leader's RBAC on `managedclusters/proxy` decides who gets through, the member's RBAC decides
//! what they may do there. Nothing is stored anywhere else.

use std::path::PathBuf;

use anyhow::Context as _;
use kube::api::{Api, ListParams};
use kube::config::{Kubeconfig, NamedContext};
use kube::{ResourceExt, core::ObjectList};
use tether_api::{ManagedCluster, labels};

use crate::cluster::Target;
use crate::passthrough;

/// Stops a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// `tether kubeconfig`.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "Examples:\n  tether kubeconfig --cluster east > east.kubeconfig\n  \
                        kubectl --kubeconfig east.kubeconfig get pods -A\n  \
                        tether --cluster east -- get pods -A        # the same in one step"
)]
pub struct KubeconfigArgs {
    /// The member (its ManagedCluster name).
    #[arg(long, value_name = "MEMBER")]
    pub cluster: String,
    /// The ClusterSet, when several sets have a member of that name.
    #[arg(long)]
    pub clusterset: Option<String>,
    /// The member's namespace on the leader. Needed only if you may not list ManagedClusters
    /// (say, you were granted managedclusters/proxy in that one namespace).
    #[arg(long, value_name = "NAMESPACE")]
    pub member_namespace: Option<String>,
    /// Write the kubeconfig to this file (mode 0600) instead of printing it.
    #[arg(long, value_name = "FILE")]
    pub output_file: Option<PathBuf>,
    /// The kubeconfig's format (kubectl's `-o`).
    #[arg(short, long, value_enum, default_value_t = KubeconfigFormat::Yaml)]
    pub output: KubeconfigFormat,
}

/// `tether kubeconfig -o yaml|json`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum KubeconfigFormat {
    /// YAML, as kubectl writes kubeconfigs.
    Yaml,
    /// JSON.
    Json,
}

/// Which member to reach, as the user named it.
#[derive(Clone, Copy, Debug)]
pub struct MemberRef<'a> {
    /// The ManagedCluster name.
    pub name: &'a str,
    /// The ClusterSet, when several sets have a member of that name.
    pub set: Option<&'a str>,
    /// The member's namespace on the leader, for users who may not list ManagedClusters.
    pub namespace: Option<&'a str>,
}

/// Where a member lives on the leader.
pub(crate) struct Located {
    /// Its dedicated namespace.
    pub(crate) namespace: String,
    /// Its ClusterSet, when the user may read its ManagedCluster.
    pub(crate) set: Option<String>,
    /// Its registered key, when the user may read its ManagedCluster.
    recipient: Option<String>,
}

impl Located {
    /// The kubeconfig entry (cluster and context) name.
    fn entry(&self, name: &str) -> String {
        match &self.set {
            Some(set) => format!("tether-{set}-{name}"),
            None => format!("tether-{name}"),
        }
    }
}

/// Finds member `m` on the leader. With its namespace given, one `get` in that namespace: a
/// user granted only `managedclusters/proxy` there (and not even `get`) still gets through, as
/// the proxy request itself is what the leader authorizes. Otherwise, one list by label.
pub(crate) async fn find_member(target: &Target, m: MemberRef<'_>) -> anyhow::Result<Located> {
    let client = target.client().await?;
    let name = m.name;
    if let Some(ns) = m.namespace {
        return match Api::<ManagedCluster>::namespaced(client, ns).get(name).await {
            Ok(mc) => Ok(Located {
                namespace: ns.to_string(),
                recipient: recipient_of(&mc),
                set: Some(mc.spec.cluster_set),
            }),
            Err(kube::Error::Api(s)) if s.code == 403 => Ok(Located {
                namespace: ns.to_string(),
                set: m.set.map(str::to_string),
                recipient: None,
            }),
            Err(kube::Error::Api(s)) if s.code == 404 => crate::bail_code!(
                NotFound,
                "no member {name:?} in namespace {ns} on this leader: `kubectl get mcls -A` (or your \
                 admin) tells each member's namespace"
            ),
            Err(err) => Err(err).with_context(|| format!("cannot read ManagedCluster {ns}/{name}")),
        };
    }
    let mut selector = format!("{}={name}", labels::CLUSTER_NAME);
    if let Some(set) = m.set {
        selector.push_str(&format!(",{}={set}", labels::CLUSTER_SET));
    }
    let found: ObjectList<ManagedCluster> = Api::<ManagedCluster>::all(client)
        .list(&ListParams::default().labels(&selector))
        .await
        .context(
            "cannot list ManagedClusters: is this the leader? If you may reach only some members, \
             pass --member-namespace with the member's namespace on the leader",
        )?;
    let mut items = found.items;
    match (items.pop(), items.is_empty()) {
        (None, _) => crate::bail_code!(
            NotFound,
            "no member {name:?} on this leader{}: `tether status` lists the members",
            m.set.map(|s| format!(" in ClusterSet {s}")).unwrap_or_default()
        ),
        (Some(one), true) => Ok(Located {
            namespace: one.namespace().unwrap_or_default(),
            recipient: recipient_of(&one),
            set: Some(one.spec.cluster_set),
        }),
        (Some(last), false) => {
            let sets: Vec<String> = items
                .iter()
                .chain(std::iter::once(&last))
                .map(|m| m.spec.cluster_set.clone())
                .collect();
            crate::bail_code!(
                Usage,
                "member {name:?} is in several ClusterSets ({}): pass --clusterset",
                sets.join(", ")
            )
        }
    }
}

/// The key member `mc` registered with (what pass-through credentials are sealed to): the spec
/// field the leader sets once at approval.
fn recipient_of(mc: &ManagedCluster) -> Option<String> {
    mc.spec.public_key.clone()
}

/// A kubeconfig that reaches member `name` through the leader with the current credentials.
pub async fn member_kubeconfig(target: &Target, m: MemberRef<'_>) -> anyhow::Result<Kubeconfig> {
    let name = m.name;
    let found = find_member(target, m).await?;
    let raw = match &target.kubeconfig {
        Some(path) => Kubeconfig::read_from(path)
            .with_context(|| format!("cannot read kubeconfig {}", path.display()))?,
        None => {
            Kubeconfig::read().context("cannot read the kubeconfig: pass --kubeconfig or set KUBECONFIG")?
        }
    };
    let ctx_name = target
        .context
        .clone()
        .or_else(|| raw.current_context.clone())
        .context("the kubeconfig has no current context: pass --context")?;
    let ctx = raw
        .contexts
        .iter()
        .find(|c| c.name == ctx_name)
        .and_then(|c| c.context.clone())
        .with_context(|| format!("no context {ctx_name:?} in the kubeconfig"))?;
    let mut cluster = raw
        .clusters
        .iter()
        .find(|c| c.name == ctx.cluster)
        .cloned()
        .with_context(|| format!("no cluster {:?} in the kubeconfig", ctx.cluster))?;
    let user = ctx
        .user
        .as_ref()
        .and_then(|u| raw.auth_infos.iter().find(|a| &a.name == u))
        .cloned();
    let entry = found.entry(name);
    if let Some(c) = cluster.cluster.as_mut() {
        let server = c
            .server
            .clone()
            .context("the leader's kubeconfig entry has no server")?;
        c.server = Some(format!(
            "{}{}",
            server.trim_end_matches('/'),
            tether_tunnel::proxy_path(&found.namespace, name)
        ));
    }
    cluster.name = entry.clone();
    let mut context = ctx.clone();
    context.cluster = entry.clone();
    context.namespace = None;
    Ok(Kubeconfig {
        clusters: vec![cluster],
        auth_infos: user.into_iter().collect(),
        contexts: vec![NamedContext {
            name: entry.clone(),
            context: Some(context),
            other: Default::default(),
        }],
        current_context: Some(entry),
        ..Kubeconfig::default()
    })
}

/// Writes `text` to `path`, readable by its owner only on Unix (mode 0600); on Windows the file
/// takes its folder's ACL, as kubectl's own kubeconfig does.
fn write_private(path: &std::path::Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut options = std::fs::OpenOptions::new();
    options.create(true).truncate(true).write(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut f = options
        .open(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    f.write_all(text.as_bytes())
        .with_context(|| format!("cannot write {}", path.display()))
}

/// `tether kubeconfig --cluster <member>`.
pub async fn kubeconfig(target: &Target, args: KubeconfigArgs) -> anyhow::Result<()> {
    let member = MemberRef {
        name: &args.cluster,
        set: args.clusterset.as_deref(),
        namespace: args.member_namespace.as_deref(),
    };
    let kc = member_kubeconfig(target, member).await?;
    let text = match args.output {
        KubeconfigFormat::Yaml => serde_norway::to_string(&kc).context("cannot write the kubeconfig")?,
        KubeconfigFormat::Json => {
            serde_json::to_string_pretty(&kc).context("cannot write the kubeconfig")? + "\n"
        }
    };
    match args.output_file {
        Some(path) => {
            write_private(&path, &text)?;
            eprintln!(
                "wrote {} (context {:?})",
                path.display(),
                kc.current_context.unwrap_or_default()
            );
        }
        None => print!("{text}"),
    }
    Ok(())
}

/// A kubeconfig for kubectl against the local pass-through endpoint `e`.
fn local_kubeconfig(e: &passthrough::Endpoint, name: &str) -> anyhow::Result<Kubeconfig> {
    use base64::Engine as _;
    let ca = base64::engine::general_purpose::STANDARD.encode(&e.ca_pem);
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: {name}\n  cluster:\n    server: {}\n    \
         certificate-authority-data: {ca}\nusers:\n- name: {name}\n  user:\n    token: {}\n\
         contexts:\n- name: {name}\n  context:\n    cluster: {name}\n    user: {name}\n\
         current-context: {name}\n",
        e.server, e.token
    );
    Kubeconfig::from_yaml(&text).context("cannot build the local kubeconfig")
}

/// `tether --cluster <member> [--member-token-file F] -- <kubectl args>`: kubectl through the
/// leader, as the leader identity or (with a member token) passing that token through; its
/// exit code.
pub async fn kubectl(
    target: &Target,
    member: MemberRef<'_>,
    member_token: Option<&std::path::Path>,
    args: &[String],
) -> anyhow::Result<i32> {
    let mut local = None;
    let kc = match member_token {
        None => member_kubeconfig(target, member).await?,
        Some(file) => {
            let token = passthrough::read_member_token(file)?;
            let found = find_member(target, member).await?;
            let base = tether_tunnel::proxy_path(&found.namespace, member.name);
            let leader = target.client().await?;
            let sealing =
                passthrough::Sealing::find(&leader, &found.namespace, member.name, found.recipient.clone())
                    .await?;
            let (endpoint, task) = passthrough::start(leader, base, &token, sealing).await?;
            local = Some(task);
            local_kubeconfig(&endpoint, &found.entry(member.name))?
        }
    };
    let _stop = local.map(AbortOnDrop);
    let text = serde_norway::to_string(&kc).context("cannot write the kubeconfig")?;
    let dir = tempfile::tempdir().context("cannot create a temporary folder")?;
    let path = dir.path().join("kubeconfig");
    write_private(&path, &text)?;
    let kubectl = std::env::var_os("KUBECTL").unwrap_or_else(|| "kubectl".into());
    let status = tokio::process::Command::new(&kubectl)
        .arg(format!("--kubeconfig={}", path.display()))
        .args(args)
        .status()
        .await
        .with_context(|| {
            format!(
                "cannot run {}: install kubectl or set KUBECTL",
                kubectl.to_string_lossy()
            )
        })?;
    Ok(status.code().unwrap_or(1))
}
