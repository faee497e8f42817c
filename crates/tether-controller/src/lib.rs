//! The `tether-controller` binary's wiring: flags, logging, the admin port, leader election and
//! shutdown around the chosen controller. One binary (and one image) serves both roles; the
//! subcommand picks the role.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use tether_process::{ProcessArgs, admin, leadership, logging, signals, stall};
use tokio::sync::watch;
use tracing::{error, info};

pub mod heap;
pub mod metricsdoc;

/// The build's version and commit, for the start-up line and `--version`.
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("TETHER_BUILD"), ")");

/// Runs a Tether controller.
#[derive(Parser, Debug)]
#[command(name = "tether-controller", version = VERSION, about, long_about = None,
          after_help = "Examples:\n  tether-controller leader --log-format plain\n  \
                        tether-controller agent --leader-elect=false --admin-addr 127.0.0.1:8081")]
pub struct Cli {
    /// Which controller to run.
    #[command(subcommand)]
    pub role: Role,
}

/// The controllers this binary runs.
#[derive(Subcommand, Debug)]
pub enum Role {
    /// The leader controller: approves registrations, tracks members, keeps ClusterSet status.
    Leader(LeaderArgs),
    /// The member agent: joins the leader named by the Member ClusterSet in its namespace.
    Agent(AgentArgs),
}

/// Flags of the member agent. What to join comes from the Member ClusterSet in the agent's
/// namespace (`--lease-namespace`, in a pod its own namespace), not from flags.
#[derive(clap::Args, Debug)]
pub struct AgentArgs {
    /// Process settings shared by every controller.
    #[command(flatten)]
    pub process: ProcessArgs,
    /// How long to wait for the leader's decision (manual approval) before asking again.
    #[arg(long, env = "TETHER_REGISTRATION_TIMEOUT", default_value = "30m", value_parser = tether_api::duration::parse)]
    pub registration_timeout: std::time::Duration,
    /// How long leaving tries to deregister at an unreachable leader before giving up.
    #[arg(long, env = "TETHER_LEAVE_TIMEOUT", default_value = "60s", value_parser = tether_api::duration::parse)]
    pub leave_timeout: std::time::Duration,
    /// How often the agent re-reads the leader's published URL (kube-public/cluster-info, over
    /// its verified connection) to follow a change of the leader's address.
    #[arg(long, env = "TETHER_LEADER_URL_CHECK_INTERVAL", default_value = "5m", value_parser = tether_api::duration::parse)]
    pub leader_url_check_interval: std::time::Duration,
    /// Keep a tunnel to the leader so admins reach this member through it (member access).
    #[arg(long, env = "TETHER_TUNNEL", default_value_t = true, action = clap::ArgAction::Set)]
    pub tunnel: bool,
    /// Leader users that proxied requests may act as here, impersonated as
    /// `tether:<set>:<user>`, a leader ServiceAccount `system:serviceaccount:<ns>:<name>` as
    /// `tether:<set>:serviceaccount:<ns>:<name>` (comma-separated; the agent's RBAC must name
    /// the same). Empty: only callers who bring a member credential (pass-through) get in.
    #[arg(long, env = "TETHER_IMPERSONATE_USERS", value_delimiter = ',')]
    pub impersonate_users: Vec<String>,
    /// Leader groups carried along, as `tether:<set>:<group>` (comma-separated; `system:` groups
    /// are never carried).
    #[arg(long, env = "TETHER_IMPERSONATE_GROUPS", value_delimiter = ',')]
    pub impersonate_groups: Vec<String>,
}

/// Flags of the leader controller.
#[derive(clap::Args, Debug)]
pub struct LeaderArgs {
    /// Process settings shared by every controller.
    #[command(flatten)]
    pub process: ProcessArgs,
    /// PEM CA bundle of this cluster's API server, handed to members with their credential.
    /// Default: the CA the controller itself trusts (in a pod, the ServiceAccount's ca.crt).
    #[arg(long, env = "TETHER_LEADER_CA_FILE")]
    pub leader_ca_file: Option<std::path::PathBuf>,
    /// This API server's URL as members reach it, published in kube-public/cluster-info (kept
    /// in step on every start when the leader made it; agents follow a change). Default: the
    /// URL the controller itself uses.
    #[arg(long, env = "TETHER_LEADER_URL")]
    pub leader_url: Option<String>,
    /// Serve member access (the proxy.multicluster.tether.dev aggregated API) on this address
    /// while leading, e.g. 0.0.0.0:8443. Unset: member access is off.
    #[arg(long, env = "TETHER_PROXY_ADDR")]
    pub proxy_addr: Option<std::net::SocketAddr>,
    /// The address the leader's API server reaches this replica at (the pod IP), written into
    /// the proxy Service's EndpointSlice while this replica leads.
    #[arg(long, env = "POD_IP")]
    pub proxy_advertise_address: Option<std::net::IpAddr>,
    /// The selector-less Service that the APIService points at.
    #[arg(long, env = "TETHER_PROXY_SERVICE", default_value = "tether-leader-proxy")]
    pub proxy_service: String,
    /// The Secret holding the proxy's serving certificate (created when absent).
    #[arg(
        long,
        env = "TETHER_PROXY_SECRET",
        default_value = "tether-leader-proxy-serving"
    )]
    pub proxy_secret: String,
    /// How long each proxy serving certificate is valid (at least 1m); the serving leader
    /// renews it from the same CA at two thirds of that, with no restart and no caBundle change.
    #[arg(long, env = "TETHER_PROXY_CERT_VALIDITY", default_value = "2160h", value_parser = cert_validity)]
    pub proxy_cert_validity: std::time::Duration,
    /// Most connections the member proxy port holds open at once (each member tunnel is one);
    /// past it new connections are closed at once and counted.
    #[arg(long, env = "TETHER_PROXY_MAX_CONNECTIONS", default_value_t = 20_000)]
    pub proxy_max_connections: usize,
    /// Most attach challenges a second the serving replica gives agents without a live tunnel
    /// (0: unpaced). When a whole fleet re-attaches at once (a failover), each agent past it is
    /// answered 503 with its turn in Retry-After, so the leader's API server, which pays two TLS
    /// handshakes per tunnel and does not pace them itself, is not saturated.
    #[arg(long, env = "TETHER_PROXY_ATTACH_RATE", default_value = "250", value_parser = attach_rate)]
    pub proxy_attach_rate: f64,
    /// How long a registration request the policy denied is kept, counted from its creation,
    /// before the leader deletes it (retrying agents must not pile requests up); an admin's
    /// denial is kept until someone deletes it.
    #[arg(long, env = "TETHER_DENIED_REQUEST_RETENTION", default_value = "1h", value_parser = tether_api::duration::parse)]
    pub denied_request_retention: std::time::Duration,
    /// How long an approved registration request is kept, counted from its creation, before the
    /// leader deletes it: only once its member heartbeat after it was made (its agent read the
    /// credential) or the credential in it expired. Spread over up to 5 more minutes per request.
    #[arg(long, env = "TETHER_APPROVED_REQUEST_RETENTION", default_value = "1h", value_parser = tether_api::duration::parse)]
    pub approved_request_retention: std::time::Duration,
    /// Export `tether_leader_member_ready{clusterset,namespace,member}`: one series per member
    /// (10,000 members, 10,000 series), hence off by default.
    #[arg(long, env = "TETHER_MEMBER_METRICS")]
    pub member_metrics: bool,
    /// Publish every member as a SIG-Multicluster ClusterProfile in the inventory namespaces
    /// its ClusterSet lists (`spec.leader.inventory.namespaces`). Needs the upstream
    /// ClusterProfile CRD (`tether crds apply --side leader --cluster-profiles`).
    #[arg(long, env = "TETHER_CLUSTER_PROFILES")]
    pub cluster_profiles: bool,
}

/// `--proxy-cert-validity`: a duration of at least a minute (a shorter one would renew the
/// certificate all the time).
fn cert_validity(text: &str) -> Result<std::time::Duration, String> {
    let d = tether_api::duration::parse(text)?;
    if d < std::time::Duration::from_secs(60) {
        return Err(format!(
            "{text:?} is too short for a certificate: give at least 1m"
        ));
    }
    Ok(d)
}

/// `--proxy-attach-rate`: attaches per second, 0 for unpaced.
fn attach_rate(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(r) if r.is_finite() && r >= 0.0 => Ok(r),
        _ => Err(format!(
            "{text:?} is not a rate: give attaches per second, e.g. 250 (0 turns pacing off)"
        )),
    }
}

/// Parses flags and runs; the exit code says whether it stopped cleanly.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let process = match &cli.role {
        Role::Leader(args) => &args.process,
        Role::Agent(args) => &args.process,
    };
    if let Err(err) = logging::init(process.log_format, &process.log_level) {
        eprintln!("error: {err}");
        return ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            error!(error = format!("{err:#}"), "Stopped on error");
            ExitCode::FAILURE
        }
    }
}

/// Runs the chosen controller until SIGTERM.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.role {
        Role::Leader(args) => run_leader(args).await,
        Role::Agent(args) => run_agent(args).await,
    }
}

async fn run_leader(args: LeaderArgs) -> anyhow::Result<()> {
    let process = &args.process;
    info!(version = VERSION, role = "leader", "Starting tether-controller");
    let config = kube::Config::infer()
        .await
        .context("cannot find Kubernetes credentials: run in a pod or set KUBECONFIG")?;
    let leader_ca = match &args.leader_ca_file {
        Some(path) => std::fs::read_to_string(path)
            .with_context(|| format!("cannot read --leader-ca-file {}", path.display()))?,
        None => config
            .root_cert
            .iter()
            .flatten()
            .map(|der| pem::encode(&pem::Pem::new("CERTIFICATE", der.clone())))
            .collect::<String>(),
    };
    anyhow::ensure!(
        !leader_ca.trim().is_empty(),
        "no CA for this API server: pass --leader-ca-file with the PEM CA members must trust"
    );
    let leader_url = args
        .leader_url
        .clone()
        .unwrap_or_else(|| config.cluster_url.to_string());
    let client = kube::Client::try_from(config).context("cannot build a Kubernetes client")?;
    let proxy = match (args.proxy_addr, args.proxy_advertise_address) {
        (None, _) => None,
        (Some(_), None) => anyhow::bail!(
            "--proxy-addr needs --proxy-advertise-address (POD_IP): the address the API server reaches this replica at"
        ),
        (Some(addr), Some(advertise)) => Some(tether_leader::proxy::ProxyOptions {
            addr,
            advertise,
            namespace: process.lease_namespace.clone(),
            service: args.proxy_service.clone(),
            secret: args.proxy_secret.clone(),
            cert_validity: args.proxy_cert_validity,
            max_connections: args.proxy_max_connections,
            attach_rate: args.proxy_attach_rate,
        }),
    };
    let metrics = if args.member_metrics {
        tether_leader::Metrics::default().with_member_ready()
    } else {
        tether_leader::Metrics::default()
    };
    let (m1, m2) = (metrics.clone(), metrics.clone());
    let p = Plumbing::start(
        client.clone(),
        process,
        "tether-leader",
        move || m1.encode(),
        move |l| m2.set_leader(l),
    )
    .await?;
    let opts = tether_leader::Options {
        leader_ca,
        instance: Some(leadership::identity(process)),
        leader: p.leadership.receiver(),
        ready: p.ready.clone(),
        metrics,
        leader_url,
        proxy,
        denied_retention: args.denied_request_retention,
        approved_retention: args.approved_request_retention,
        cluster_profiles: args.cluster_profiles,
    };
    tether_leader::run(client, opts, p.shutdown.clone()).await;
    p.stopped().await;
    Ok(())
}

async fn run_agent(args: AgentArgs) -> anyhow::Result<()> {
    let process = &args.process;
    info!(version = VERSION, role = "agent", namespace = %process.lease_namespace, "Starting tether-controller");
    let config = kube::Config::infer()
        .await
        .context("cannot find Kubernetes credentials: run in a pod or set KUBECONFIG")?;
    let api_server_url = config.cluster_url.to_string();
    // NB: proxied requests are not retried here: a 429 or 503 of the member goes back to the
    // caller, who decides (and a request body is not replayed).
    let mut forward = config.clone();
    forward.default_retry = false;
    let mut bare = forward.clone();
    bare.auth_info = kube::config::AuthInfo::default();
    let client = kube::Client::try_from(config).context("cannot build a Kubernetes client")?;
    let metrics = tether_agent::Metrics::default();
    // NB: a system: user other than a ServiceAccount is never impersonated: listing one is a
    // mistake to say at start, not a request refused later.
    if let Some(bad) = args
        .impersonate_users
        .iter()
        .find(|u| tether_tunnel::identity::member_user("set", u).is_err())
    {
        anyhow::bail!(
            "--impersonate-users lists {bad:?}: a system: user other than a ServiceAccount \
             (system:serviceaccount:<namespace>:<name>) is never impersonated; remove it"
        );
    }
    let access = if args.tunnel {
        Some(tether_agent::tunnel::MemberAccess::new(
            kube::Client::try_from(forward).context("cannot build a Kubernetes client")?,
            kube::Client::try_from(bare).context("cannot build a Kubernetes client")?,
            tether_tunnel::identity::AllowList {
                users: args
                    .impersonate_users
                    .iter()
                    .filter(|u| !u.is_empty())
                    .cloned()
                    .collect(),
                groups: args
                    .impersonate_groups
                    .iter()
                    .filter(|g| !g.is_empty())
                    .cloned()
                    .collect(),
            },
            metrics.clone(),
        ))
    } else {
        None
    };
    let (m1, m2) = (metrics.clone(), metrics.clone());
    let p = Plumbing::start(
        client.clone(),
        process,
        "tether-agent",
        move || m1.encode(),
        move |l| m2.set_leader(l),
    )
    .await?;
    let opts = tether_agent::Options {
        namespace: process.lease_namespace.clone(),
        instance: Some(leadership::identity(process)),
        leader: p.leadership.receiver(),
        ready: p.ready.clone(),
        metrics,
        api_server_url,
        registration_timeout: args.registration_timeout,
        leave_timeout: args.leave_timeout,
        leader_url_check: args.leader_url_check_interval,
        access,
    };
    tether_agent::run(client, opts, p.shutdown.clone()).await;
    p.stopped().await;
    Ok(())
}

/// What runs around either controller: SIGTERM handling, the Lease, the admin port.
struct Plumbing {
    shutdown: tokio_util::sync::CancellationToken,
    leadership: leadership::Leadership,
    ready: watch::Sender<bool>,
    admin: tokio::task::JoinHandle<()>,
}

impl Plumbing {
    async fn start(
        client: kube::Client,
        process: &ProcessArgs,
        lease: &str,
        encode: impl Fn() -> String + Send + Sync + 'static,
        set_leader: impl Fn(bool) + Send + 'static,
    ) -> anyhow::Result<Self> {
        let shutdown = signals::shutdown_token();
        tokio::spawn(stall::watch(shutdown.clone()));
        let leadership = leadership::elect(client, process, lease, shutdown.clone());
        let mut leader_rx = leadership.receiver();
        tokio::spawn(async move {
            loop {
                set_leader(*leader_rx.borrow_and_update());
                if leader_rx.changed().await.is_err() {
                    break;
                }
            }
        });
        let (ready, ready_rx) = watch::channel(false);
        let health = admin::Health {
            metrics: Arc::new(move || metricsdoc::with_build_info(heap::with_heap(encode()))),
            ready: ready_rx,
        };
        let (_, admin) = admin::start(process.admin_addr, health, shutdown.clone()).await?;
        Ok(Self {
            shutdown,
            leadership,
            ready,
            admin,
        })
    }

    /// Waits for the Lease to be released and the admin port to close.
    async fn stopped(self) {
        self.leadership.stopped().await;
        let _ = self.admin.await;
        info!("Stopped");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn leader_flags_parse_and_bad_values_are_refused() {
        let cli = Cli::try_parse_from([
            "tether-controller",
            "leader",
            "--leader-elect=false",
            "--admin-addr",
            "127.0.0.1:9000",
            "--log-format",
            "plain",
        ])
        .unwrap();
        let Role::Leader(args) = cli.role else {
            panic!("leader")
        };
        assert!(!args.process.leader_elect);
        assert_eq!(args.process.admin_addr.port(), 9000);
        assert_eq!(
            args.proxy_cert_validity.as_secs(),
            90 * 24 * 3600,
            "90 days by default"
        );
        let err =
            Cli::try_parse_from(["tether-controller", "leader", "--proxy-cert-validity", "30s"]).unwrap_err();
        assert!(err.to_string().contains("at least 1m"), "{err}");
        assert_eq!(args.proxy_attach_rate, 250.0, "250 attaches a second by default");
        for bad in ["-1", "NaN", "inf", "fast"] {
            let flag = format!("--proxy-attach-rate={bad}");
            let err = Cli::try_parse_from(["tether-controller", "leader", &flag]).unwrap_err();
            assert!(err.to_string().contains("not a rate"), "{bad}: {err}");
        }
        assert!(Cli::try_parse_from(["tether-controller", "leader", "--admin-addr", "nope"]).is_err());
        assert!(Cli::try_parse_from(["tether-controller", "leader", "--lease-duration", "1"]).is_err());
        assert!(Cli::try_parse_from(["tether-controller"]).is_err());
        let cli = Cli::try_parse_from(["tether-controller", "agent", "--leave-timeout", "90s"]).unwrap();
        let Role::Agent(args) = cli.role else {
            panic!("agent")
        };
        assert_eq!(args.leave_timeout.as_secs(), 90);
        let err = Cli::try_parse_from(["tether-controller", "agent", "--leave-timeout", "soon"]).unwrap_err();
        assert!(err.to_string().contains("not a duration"), "{err}");
    }
}
