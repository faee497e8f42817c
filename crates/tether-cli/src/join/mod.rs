//! Member-side commands. `join` checks the leader's CA pin before anything else (nothing is sent
//! on a mismatch), checks the token with the leader, then writes the join token Secret and the
//! Member ClusterSet for the agent and follows its progress; on failure, timeout or Ctrl-C it
//! removes what it created. `leave` deletes the Member ClusterSet and waits for the agent.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context as _, bail};
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::api::{Api, PostParams};
use serde::Deserialize;
use tether_api::clusterset::{ClusterSetRole, ClusterSetSpec, MemberSpec, SecretKeyRef};
use tether_api::{ClusterSet, SetRef};
use tether_join::CaPin;
use tether_join::discovery::{self, Trust};
use tether_join::settle::Settle;
use tether_join::token::{parse_join_group, parse_join_service_account};
use tether_tunnel::route::is_dns_label;

use crate::cluster::Target;

mod follow;

use follow::{create_and_follow, follow};

/// The Secret `join` writes for the agent.
pub const TOKEN_SECRET: &str = "tether-join-token";
/// Its key holding the token.
const TOKEN_KEY: &str = "token";

/// `tether join`. Its `Debug` never prints the join token.
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  tether join --leader https://leader:6443 --token abcdef.0123456789abcdef \\\n    \
                        --ca-cert-hash sha256:1234… --name east\n  tether join --config-file join.yaml --name west"
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
    /// This cluster's name in the set: a DNS label (default: the kubeconfig context's name, if
    /// that is one).
    #[arg(long)]
    pub name: Option<String>,
    /// A join config file written by `tether init --values-file` (flags override it); the same file
    /// is the agent chart's values (`helm install -f`).
    #[arg(long = "config-file", visible_alias = "config", value_name = "FILE")]
    pub config: Option<std::path::PathBuf>,
    /// The ClusterSet's namespace on the leader (default: from the token, else tether-system).
    #[arg(long)]
    pub leader_namespace: Option<String>,
    /// How long to wait for the agent to register and become Ready.
    #[arg(long, default_value = "3m", value_parser = tether_api::duration::parse)]
    pub timeout: Duration,
    /// Check the leader and the token, print what would be created, create nothing.
    #[arg(long)]
    pub dry_run: bool,
}

impl std::fmt::Debug for JoinArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JoinArgs")
            .field("leader", &self.leader)
            .field(
                "token",
                &self.token.as_ref().map(|_| tether_tunnel::cert::REDACTED),
            )
            .field("ca_cert_hash", &self.ca_cert_hash)
            .field("name", &self.name)
            .field("config", &self.config)
            .field("leader_namespace", &self.leader_namespace)
            .field("timeout", &self.timeout)
            .field("dry_run", &self.dry_run)
            .finish()
    }
}

/// The join config `tether init --values-file` writes: the agent chart's values (`parentURL`,
/// `token`, `caCertHash`, `clusterSet`, `leader.namespace`), so that `helm install -f` takes the
/// same file. Files of earlier versions (`leaderURL`, `leaderNamespace`) are read too.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct JoinFile {
    #[serde(rename = "parentURL", alias = "leaderURL")]
    leader_url: Option<String>,
    token: Option<String>,
    ca_cert_hash: Option<String>,
    cluster_set: Option<String>,
    #[serde(default)]
    leader: FileLeader,
    leader_namespace: Option<String>,
    cluster: Option<FileCluster>,
}

#[derive(Deserialize, Default)]
struct FileLeader {
    namespace: Option<String>,
}

#[derive(Deserialize, Default)]
struct FileCluster {
    name: Option<String>,
}

impl JoinFile {
    fn leader_namespace(&self) -> Option<String> {
        self.leader.namespace.clone().or(self.leader_namespace.clone())
    }
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

/// What `join` needs from flags and the join config file.
struct Inputs {
    leader: String,
    token: String,
    pin: CaPin,
    file: JoinFile,
}

fn inputs(args: &JoinArgs) -> anyhow::Result<Inputs> {
    let file: JoinFile = match &args.config {
        Some(p) => serde_norway::from_str(
            &std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))?,
        )
        .with_context(|| {
            format!(
                "{} is not a join config written by `tether init --values-file`",
                p.display()
            )
        })?,
        None => JoinFile::default(),
    };
    let leader = args
        .leader
        .clone()
        .or(file.leader_url.clone())
        .context("--leader is required (the leader's https:// URL)")?;
    let token = args
        .token
        .clone()
        .or(file.token.clone())
        .context("--token is required (printed by `tether init` on the leader)")?;
    let hash = args.ca_cert_hash.clone().or(file.ca_cert_hash.clone()).context(
        "--ca-cert-hash is required (printed by `tether init`); it lets the agent verify the leader before sending the token",
    )?;
    discovery::leader_uri(&leader).context("--leader")?;
    let pin = hash.parse().context("--ca-cert-hash")?;
    Ok(Inputs {
        leader,
        token,
        pin,
        file,
    })
}

/// Proves the leader by its pin before anything is sent, then asks it who the token is: the
/// set it joins, home namespace included, if the token names one.
async fn check_leader(i: &Inputs) -> anyhow::Result<Option<SetRef>> {
    eprintln!("Checking the leader's CA against {}…", i.pin);
    let ca = discovery::fetch_leader_ca(&i.leader, &i.pin).await?;
    let config = discovery::leader_config(&i.leader, &Trust::Ca(ca), Some(&i.token))?;
    let reviews = Api::<SelfSubjectReview>::all(Client::try_from(config)?);
    // NB: a token created moments ago may be refused until the API server has seen it.
    let mut unseen = Settle::unauthorized();
    let review = loop {
        match reviews
            .create(&PostParams::default(), &SelfSubjectReview::default())
            .await
        {
            Err(e) if unseen.tolerate(&e) => tokio::time::sleep(Duration::from_millis(500)).await,
            other => break other,
        }
    };
    let user = match review {
        Ok(r) => r.status.and_then(|s| s.user_info).unwrap_or_default(),
        Err(kube::Error::Api(s)) if s.code == 401 => crate::bail_code!(
            Forbidden,
            "the leader rejected the token (expired, deleted or mistyped): create a new one on the leader with \
             `tether token create --clusterset <SET>`; nothing was created here"
        ),
        Err(e) => return Err(e).context(format!("cannot reach the leader at {}", i.leader)),
    };
    Ok(user
        .groups
        .unwrap_or_default()
        .iter()
        .find_map(|g| parse_join_group(g))
        .or_else(|| user.username.as_deref().and_then(parse_join_service_account)))
}

/// This cluster's name in the set: `--name`, else its kubeconfig context's name. Either must be
/// a DNS label already: a context such as an EKS ARN is refused with a name to pass instead, not
/// turned into an odd one silently.
fn cluster_name(target: &Target, name: Option<String>) -> anyhow::Result<String> {
    const LABEL: &str = "a DNS label: lowercase letters, digits and '-', at most 63 characters, \
                         starting and ending with a letter or digit";
    if let Some(name) = name {
        if !is_dns_label(&name) {
            crate::bail_code!(
                Usage,
                "--name {name:?} is not {LABEL}; for example --name {}",
                suggest(&name)
            );
        }
        return Ok(name);
    }
    let ctx = target
        .context
        .clone()
        .or_else(|| {
            kube::config::Kubeconfig::read()
                .ok()
                .and_then(|k| k.current_context)
        })
        .unwrap_or_default();
    if is_dns_label(&ctx) {
        return Ok(ctx);
    }
    if ctx.is_empty() {
        crate::bail_code!(
            Usage,
            "no kubeconfig context to name this cluster by: pass --name, {LABEL}"
        );
    }
    crate::bail_code!(
        Usage,
        "the kubeconfig context {ctx:?} cannot name this cluster in the set (it is not {LABEL}): \
         pass --name, for example --name {}",
        suggest(&ctx)
    )
}

/// A DNS label to suggest for `name`: its last `/`- or `:`-separated part (an EKS ARN's cluster
/// name, a GKE context's last field), lowercased, other characters turned to `-`.
fn suggest(name: &str) -> String {
    let last = name.rsplit(['/', ':']).find(|p| !p.is_empty()).unwrap_or(name);
    let label = dns_label(last).trim_matches('-').to_string();
    if label.is_empty() {
        "east".to_string()
    } else {
        label
    }
}

/// The Member ClusterSet `set` that makes the agent join `leader_ns` at `i.leader` as `name`.
fn member_set(i: &Inputs, set: &str, ns: &str, leader_ns: String, name: &str) -> ClusterSet {
    let spec = MemberSpec {
        leader_url: i.leader.clone(),
        leader_namespace: leader_ns,
        ca_cert_hash: Some(i.pin.to_string()),
        ca_bundle: None,
        insecure_skip_ca_verification: false,
        join_token_secret_ref: SecretKeyRef {
            name: TOKEN_SECRET.into(),
            key: TOKEN_KEY.into(),
        },
        cluster_name: name.to_string(),
        cluster_id: None,
        labels: BTreeMap::new(),
    };
    let mut obj = ClusterSet::new(
        set,
        ClusterSetSpec {
            role: ClusterSetRole::Member,
            leader: None,
            member: Some(spec),
        },
    );
    obj.metadata.namespace = Some(ns.to_string());
    obj
}

/// Joins this cluster; see the module docs.
pub async fn join(target: &Target, args: JoinArgs) -> anyhow::Result<()> {
    let i = inputs(&args)?;
    let from_token = check_leader(&i).await?;
    let set = i
        .file
        .cluster_set
        .clone()
        .or(from_token.as_ref().map(|s| s.name.clone()))
        .context("this token does not belong to a Tether ClusterSet: use one printed by `tether init`")?;
    let leader_ns = args
        .leader_namespace
        .clone()
        .or(i.file.leader_namespace())
        .or(from_token.map(|s| s.namespace))
        .unwrap_or_else(|| "tether-system".into());
    let name = cluster_name(
        target,
        args.name
            .clone()
            .or(i.file.cluster.as_ref().and_then(|c| c.name.clone())),
    )?;
    let ns = target.namespace.clone();
    let set_obj = member_set(&i, &set, &ns, leader_ns, &name);
    if args.dry_run {
        println!("The leader's CA matches and the token is valid for ClusterSet {set}. Would create:");
        print!("---\n{}", serde_norway::to_string(&set_obj)?);
        println!("---\n# Secret {ns}/{TOKEN_SECRET} holding the join token");
        return Ok(());
    }
    let client = Client::try_from(target.config().await?)?;
    let sets = Api::<ClusterSet>::namespaced(client.clone(), &ns);
    if let Some(existing) = existing_membership(&client, &sets, &ns, &set).await? {
        let same = existing
            .spec
            .member
            .as_ref()
            .is_some_and(|m| m.leader_url == i.leader && m.cluster_name == name);
        if !same {
            bail!(
                "this cluster already has ClusterSet {ns}/{set} with another leader or name: run `tether leave` first"
            );
        }
        eprintln!("Already joined (ClusterSet {ns}/{set} exists); checking its state…");
        return follow(&sets, &set, args.timeout).await.map(|_| ());
    }
    create_and_follow(&client, &sets, set_obj, i.token, args.timeout).await
}

/// The Member ClusterSet `set` if this cluster has it; an error that says what to install if
/// the agent is not.
async fn existing_membership(
    client: &Client,
    sets: &Api<ClusterSet>,
    ns: &str,
    set: &str,
) -> anyhow::Result<Option<ClusterSet>> {
    if Api::<Namespace>::all(client.clone()).get_opt(ns).await?.is_none() {
        crate::bail_code!(
            NotFound,
            "namespace {ns} does not exist here, so no agent is installed: helm install tether-agent \
             charts/tether-agent -n {ns} --create-namespace (or pass -n with the agent's namespace)"
        );
    }
    match sets.get_opt(set).await {
        Ok(s) => Ok(s),
        Err(kube::Error::Api(s)) if s.code == 404 => {
            crate::bail_code!(
                NotFound,
                "the Tether CRDs are not installed here: helm install tether-agent charts/tether-agent -n {ns}"
            )
        }
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use proptest::prelude::*;

    #[test]
    fn debug_of_the_join_arguments_never_prints_the_token() {
        let args = join_args(&["--token".into(), "abcdef.0123456789abcdef".into()]).unwrap();
        let text = format!("{args:?}");
        assert!(!text.contains("0123456789abcdef"), "{text}");
        assert!(text.contains(tether_tunnel::cert::REDACTED), "{text}");
    }

    fn join_args(extra: &[String]) -> Result<JoinArgs, clap::Error> {
        #[derive(Parser)]
        struct Wrap {
            #[command(flatten)]
            args: JoinArgs,
        }
        let argv = std::iter::once("join".to_string()).chain(extra.iter().cloned());
        Wrap::try_parse_from(argv).map(|w| w.args)
    }

    proptest! {
        #[test]
        fn any_leader_token_and_pin_are_checked_without_panicking(
            leader in "\\PC{0,40}", token in "\\PC{0,40}", hash in "\\PC{0,80}"
        ) {
            let args = join_args(&[
                format!("--leader={leader}"),
                format!("--token={token}"),
                format!("--ca-cert-hash={hash}"),
            ]);
            if let Ok(args) = args
                && let Err(e) = inputs(&args)
            {
                let msg = format!("{e:#}");
                prop_assert!(
                    msg.contains("--leader") || msg.contains("--ca-cert-hash"),
                    "the error names the flag: {}", msg
                );
            }
        }
    }

    #[test]
    fn missing_and_malformed_inputs_name_the_flag() {
        let err = |extra: &[&str]| {
            let args = join_args(&extra.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
            format!("{:#}", inputs(&args).err().expect("refused"))
        };
        let pin = format!("--ca-cert-hash=sha256:{}", "ab".repeat(32));
        assert!(err(&["--token=a.b", &pin]).contains("--leader is required"));
        assert!(err(&["--leader=https://l:6443", &pin]).contains("--token is required"));
        assert!(err(&["--leader=https://l:6443", "--token=a.b"]).contains("--ca-cert-hash is required"));
        let bad_url = err(&["--leader=leader:6443", "--token=a.b", &pin]);
        assert!(
            bad_url.contains("--leader") && bad_url.contains("https://<host>"),
            "{bad_url}"
        );
        let bad_pin = err(&["--leader=https://l:6443", "--token=a.b", "--ca-cert-hash=md5:00"]);
        assert!(bad_pin.contains("--ca-cert-hash"), "{bad_pin}");
    }

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

    #[test]
    fn only_dns_labels_name_a_cluster_and_the_error_says_what_to_pass() {
        let target = |ctx: &str| Target {
            kubeconfig: None,
            context: Some(ctx.to_string()),
            namespace: "tether-system".into(),
        };
        let name = |ctx: &str, flag: Option<&str>| cluster_name(&target(ctx), flag.map(str::to_string));
        assert_eq!(name("east", None).unwrap(), "east");
        assert_eq!(
            name("arn:aws:eks:eu-west-1:123:cluster/prod", Some("west")).unwrap(),
            "west"
        );
        let arn = name("arn:aws:eks:eu-west-1:123:cluster/Prod_1", None).unwrap_err();
        assert_eq!(crate::exit::code_of(&arn), crate::exit::Code::Usage);
        assert!(
            arn.to_string().contains("pass --name, for example --name prod-1"),
            "{arn}"
        );
        let gke = name("gke_my-project_europe-west1_fleet-a", None).unwrap_err();
        assert!(
            gke.to_string()
                .contains("--name gke-my-project-europe-west1-fleet-a"),
            "{gke}"
        );
        for bad in ["East", "east_1", "-east", &"x".repeat(64), ""] {
            let err = name("ctx", Some(bad)).unwrap_err();
            assert_eq!(crate::exit::code_of(&err), crate::exit::Code::Usage, "{bad}");
            assert!(err.to_string().contains("is not a DNS label"), "{err}");
        }
        assert!(name("", None).unwrap_err().to_string().contains("pass --name"));
    }
}
