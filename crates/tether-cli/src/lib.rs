//! The `tether` command line: one binary for the leader side (`init`, `token`, `approve`, `deny`,
//! `member`, `status`, `destroy`, `uninstall`, `kubeconfig`, `grant`) and the member side (`join`, `leave`), plus `crds`
//! for both charts' hooks. Installed as `kubectl-tether` it is
//! a kubectl plugin. Every command is idempotent and fails with a message that says what to do.

pub mod access;
pub mod cluster;
pub mod crds;
pub mod credential;
pub mod exit;
pub mod grant;
pub mod join;
pub mod leader;
pub mod leave;
pub mod output;
pub mod passthrough;
pub mod version;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

/// The CLI's version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Joins Kubernetes clusters into a ClusterSet.
#[derive(Parser, Debug)]
#[command(name = "tether", version = VERSION, about, long_about = None, after_help = "\
Leader cluster:
  helm install tether-leader charts/tether-leader -n tether-system --create-namespace
  tether init --clusterset prod            # prints the join command
Each member cluster:
  tether join --leader https://leader:6443 --token abcdef.0123456789abcdef --ca-cert-hash sha256:...
Then:
  tether status                            # on the leader: the set and its members
  tether --cluster east -- get pods -A     # on the leader: kubectl against member east
  tether member remove east --ban          # on the leader: east out for good
  tether leave                             # on a member
  tether destroy --clusterset prod         # on the leader
Exit codes: 0 done, 1 error, 2 usage, 3 not found, 4 forbidden, 5 unreachable, 6 timed out,
130 interrupted (with --cluster: kubectl's own).")]
pub struct Cli {
    /// Kubeconfig to use (default: $KUBECONFIG, a list of files merged as kubectl does, or
    /// ~/.kube/config).
    #[arg(long, global = true)]
    pub kubeconfig: Option<std::path::PathBuf>,
    /// Kubeconfig context to use (default: the current context).
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// Namespace of the ClusterSet (leader: the set's home; member: the agent's namespace).
    /// Default: on the leader, the kubeconfig context's namespace as kubectl would use it, else
    /// tether-system; for join, leave and uninstall, which address where the agent chart is
    /// installed rather than where you work, tether-system.
    #[arg(short = 'n', long, global = true)]
    pub namespace: Option<String>,
    /// Leader: run kubectl against this member through the leader (`tether --cluster east --
    /// get ns`; as a plugin `kubectl tether --cluster east -- get ns`).
    #[arg(long, value_name = "MEMBER", requires = "kubectl")]
    pub cluster: Option<String>,
    /// With --cluster: the ClusterSet, when several sets have a member of that name (the same
    /// flag as the subcommands'; `--in-clusterset` is its former name).
    #[arg(
        long = "clusterset",
        alias = "in-clusterset",
        value_name = "SET",
        requires = "cluster"
    )]
    pub in_clusterset: Option<String>,
    /// With --cluster: the member's namespace on the leader. Needed only if you may not list
    /// ManagedClusters (say, you were granted managedclusters/proxy in that one namespace).
    #[arg(long, value_name = "NAMESPACE", requires = "cluster")]
    pub member_namespace: Option<String>,
    /// With --cluster: pass this member token through (a file holding a bearer token of the
    /// member cluster), so the member's RBAC decides as that token, not as your leader identity.
    #[arg(long, value_name = "FILE", requires = "cluster")]
    pub member_token_file: Option<std::path::PathBuf>,
    /// With --cluster: the kubectl arguments, after `--`.
    #[arg(last = true, value_name = "KUBECTL ARGS")]
    pub kubectl: Vec<String>,
    /// What to do.
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// The commands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Leader: create a ClusterSet and a join token, and print the join command.
    Init(leader::InitArgs),
    /// Leader: create, list or delete join tokens.
    #[command(subcommand)]
    Token(leader::TokenCommand),
    /// Leader: approve a pending registration request (manual approval).
    Approve(leader::DecideArgs),
    /// Leader: deny a pending registration request.
    Deny(leader::DecideArgs),
    /// The ClusterSet and its members (leader), or this cluster's membership (member).
    Status(leader::StatusArgs),
    /// Leader: remove or ban a member, lift a ban, list pending and denied requests.
    #[command(subcommand)]
    Member(leader::MemberCommand),
    /// Leader: remove a ClusterSet, its tokens and (with --force) its members.
    Destroy(leader::DestroyArgs),
    /// Leader: before `helm uninstall tether-leader` (its pre-delete hook runs it): refuses while
    /// any set has members, else destroys the sets and removes what the leader made outside its chart.
    Uninstall(leader::UninstallArgs),
    /// Member: join a leader's ClusterSet (the agent must be installed here).
    Join(join::JoinArgs),
    /// Member: leave the ClusterSet (the agent deregisters at the leader).
    Leave(leave::LeaveArgs),
    /// Leader: print a kubeconfig that reaches a member through the leader (its proxy API).
    Kubeconfig(access::KubeconfigArgs),
    /// Leader: let a user or group reach a member through the leader (or --revoke it); prints
    /// the member's side to apply there.
    Grant(grant::GrantArgs),
    /// The exec credential plugin of the ClusterProfiles the leader publishes: prints an
    /// ExecCredential holding the caller's own leader token (the pod's ServiceAccount token by
    /// default).
    Credential(credential::CredentialArgs),
    /// Apply this version's CRDs (the charts' install and upgrade hooks run it).
    #[command(subcommand)]
    Crds(crds::CrdsCommand),
    /// The versions that run: this CLI's, each controller replica's in the namespace (which one
    /// leads), and on a leader every member's agent.
    Version {
        /// Output format.
        #[arg(short, long, value_enum, default_value_t = output::Format::Table)]
        output: output::Format,
    },
    /// Print shell completions (bash, zsh, fish, powershell, elvish).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

/// Whether to colour output: only on a terminal, and never with NO_COLOR.
pub fn colour() -> bool {
    std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none()
}

/// Parses the command line, runs it and turns errors into a message and an exit code.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(Command::Completions { shell }) = cli.command {
        let mut cmd = Cli::command();
        let name = if invoked_as_plugin() {
            "kubectl-tether"
        } else {
            "tether"
        };
        clap_complete::generate(shell, &mut cmd, name, &mut std::io::stdout());
        return ExitCode::SUCCESS;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("error: cannot start: {err}");
            return ExitCode::FAILURE;
        }
    };
    if let (None, Some(member)) = (&cli.command, &cli.cluster) {
        let target = target(&cli);
        let code = runtime.block_on(access::kubectl(
            &target,
            access::MemberRef {
                name: member,
                set: cli.in_clusterset.as_deref(),
                namespace: cli.member_namespace.as_deref(),
            },
            cli.member_token_file.as_deref(),
            &cli.kubectl,
        ));
        return match code {
            Ok(c) => ExitCode::from(u8::try_from(c).unwrap_or(1)),
            Err(err) => failed(&err),
        };
    }
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => failed(&err),
    }
}

/// Prints `err` and returns its exit code (README, "Exit codes").
fn failed(err: &anyhow::Error) -> ExitCode {
    eprintln!("error: {err:#}");
    exit::code_of(err).exit()
}

fn invoked_as_plugin() -> bool {
    std::env::args()
        .next()
        .is_some_and(|a| a.rsplit('/').next().is_some_and(|n| n.starts_with("kubectl-")))
}

/// The namespace when neither `-n` nor the context names one: where both charts install.
pub const DEFAULT_NAMESPACE: &str = "tether-system";

fn target(cli: &Cli) -> cluster::Target {
    let mut target = cluster::Target {
        kubeconfig: cli.kubeconfig.clone(),
        context: cli.context.clone(),
        namespace: DEFAULT_NAMESPACE.to_string(),
    };
    target.namespace = match (&cli.namespace, &cli.command) {
        (Some(ns), _) => ns.clone(),
        // The agent's namespace is the agent chart's release namespace, not the one you work in:
        // a context's namespace (say, an app team's) would only make `join` say "no agent here".
        (None, Some(Command::Join(_) | Command::Leave(_) | Command::Uninstall(_) | Command::Crds(_))) => {
            DEFAULT_NAMESPACE.to_string()
        }
        (None, _) => target
            .context_namespace()
            .unwrap_or_else(|| DEFAULT_NAMESPACE.to_string()),
    };
    target
}

/// Runs one command.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    let target = target(&cli);
    let Some(command) = cli.command else {
        bail_code!(
            Usage,
            "no command: see `tether --help` (or `tether --cluster <member> -- <kubectl args>`)"
        );
    };
    match command {
        Command::Init(args) => leader::init(&target, args).await,
        Command::Token(cmd) => leader::token(&target, cmd).await,
        Command::Approve(args) => leader::decide(&target, args, true).await,
        Command::Deny(args) => leader::decide(&target, args, false).await,
        Command::Status(args) => leader::status(&target, args).await,
        Command::Member(cmd) => leader::member(&target, cmd).await,
        Command::Destroy(args) => leader::destroy(&target, args).await,
        Command::Uninstall(args) => leader::uninstall(&target, args).await,
        Command::Join(args) => join::join(&target, args).await,
        Command::Leave(args) => leave::leave(&target, args).await,
        Command::Kubeconfig(args) => access::kubeconfig(&target, args).await,
        Command::Grant(args) => grant::grant(&target, args).await,
        Command::Crds(cmd) => crds::crds(&target, cmd).await,
        Command::Credential(args) => credential::credential(args).await,
        Command::Version { output } => version::version(&target, output).await,
        Command::Completions { .. } => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn any_command_line_parses_or_is_refused_without_panicking(
            args in proptest::collection::vec(
                prop_oneof![
                    Just("init".to_string()), Just("join".to_string()), Just("status".to_string()),
                    Just("leave".to_string()), Just("destroy".to_string()), Just("token".to_string()),
                    Just("create".to_string()), Just("approve".to_string()),
                    Just("--clusterset".to_string()), Just("--timeout".to_string()), Just("-o".to_string()),
                    Just("--approval".to_string()), Just("--token-ttl".to_string()), Just("-n".to_string()),
                    "\\PC{0,12}", "--[a-z-]{1,12}(=\\PC{0,8})?",
                ],
                0..8,
            )
        ) {
            let argv = std::iter::once("tether".to_string()).chain(args);
            let _ = Cli::try_parse_from(argv);
        }
    }

    #[test]
    fn the_namespace_comes_from_n_then_the_context_where_kubectl_would_use_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config");
        std::fs::write(
            &file,
            "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n\
             users: [{name: u, user: {}}]\ncontexts:\n\
             - {name: fleet, context: {cluster: c, user: u, namespace: fleet}}\n\
             - {name: plain, context: {cluster: c, user: u}}\ncurrent-context: fleet\n",
        )
        .unwrap();
        let kubeconfig = format!("--kubeconfig={}", file.display());
        let ns = |args: &[&str]| {
            let argv = ["tether", kubeconfig.as_str()]
                .into_iter()
                .chain(args.iter().copied());
            target(&Cli::try_parse_from(argv).unwrap()).namespace
        };
        assert_eq!(ns(&["status"]), "fleet", "the current context's namespace");
        assert_eq!(ns(&["--context", "plain", "status"]), DEFAULT_NAMESPACE);
        assert_eq!(ns(&["-n", "other", "status"]), "other");
        assert_eq!(ns(&["member", "list"]), "fleet");
        let join = [
            "join",
            "--leader",
            "https://l:6443",
            "--token",
            "abcdef.0123456789abcdef",
        ];
        assert_eq!(
            ns(&join),
            DEFAULT_NAMESPACE,
            "the agent's namespace is the chart's"
        );
        assert_eq!(ns(&["leave"]), DEFAULT_NAMESPACE);
        assert_eq!(ns(&["-n", "agents", "leave"]), "agents");
    }

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn commands_parse_and_bad_flags_are_refused() {
        let cli =
            Cli::try_parse_from(["tether", "init", "--clusterset", "prod", "--approval", "manual"]).unwrap();
        assert!(matches!(cli.command, Some(Command::Init(ref a)) if a.clusterset == "prod"));
        let cli = Cli::try_parse_from([
            "tether",
            "join",
            "--leader",
            "https://l:6443",
            "--token",
            "abcdef.0123456789abcdef",
            "--ca-cert-hash",
            "sha256:00",
            "-n",
            "agents",
        ])
        .unwrap();
        assert_eq!(cli.namespace.as_deref(), Some("agents"));
        assert!(
            Cli::try_parse_from(["tether", "init"]).is_err(),
            "--clusterset is required"
        );
        assert!(Cli::try_parse_from(["tether", "init", "--clusterset", "p", "--token-ttl", "soon"]).is_err());
        assert!(Cli::try_parse_from(["tether", "status", "-o", "xml"]).is_err());
        assert!(Cli::try_parse_from(["tether", "completions", "bash"]).is_ok());
        let cli = Cli::try_parse_from(["tether", "--cluster", "east", "--", "get", "ns", "-A"]).unwrap();
        assert_eq!(cli.cluster.as_deref(), Some("east"));
        assert_eq!(cli.kubectl, ["get", "ns", "-A"]);
        assert!(cli.command.is_none());
        assert!(
            Cli::try_parse_from(["tether", "--cluster", "east"]).is_err(),
            "--cluster needs kubectl arguments"
        );
        assert!(Cli::try_parse_from(["tether", "--clusterset", "prod", "--", "get"]).is_err());
        // One spelling of the set flag: before a subcommand it is the --cluster mode's, after
        // it the subcommand's own; the former name still parses.
        for flag in ["--clusterset", "--in-clusterset"] {
            let cli =
                Cli::try_parse_from(["tether", "--cluster", "east", flag, "prod", "--", "get"]).unwrap();
            assert_eq!(cli.in_clusterset.as_deref(), Some("prod"));
        }
        let cli = Cli::try_parse_from(["tether", "destroy", "--clusterset", "prod"]).unwrap();
        assert!(cli.in_clusterset.is_none(), "{cli:?}");
        assert!(matches!(cli.command, Some(Command::Destroy(ref d)) if d.clusterset == "prod"));
        let cli = Cli::try_parse_from([
            "tether",
            "--cluster",
            "east",
            "--member-token-file",
            "t",
            "--",
            "get",
        ])
        .unwrap();
        assert_eq!(cli.member_token_file.as_deref(), Some(std::path::Path::new("t")));
        assert!(
            Cli::try_parse_from(["tether", "--member-token-file", "t", "--", "get"]).is_err(),
            "--member-token-file needs --cluster"
        );
        let cli = Cli::try_parse_from([
            "tether",
            "kubeconfig",
            "--cluster",
            "east",
            "--output-file",
            "e.yaml",
        ])
        .unwrap();
        assert!(matches!(cli.command, Some(Command::Kubeconfig(ref a))
            if a.cluster == "east" && a.output_file.as_deref() == Some(std::path::Path::new("e.yaml"))));
        let cli = Cli::try_parse_from(["tether", "kubeconfig", "--cluster", "east", "-o", "json"]).unwrap();
        assert!(
            matches!(cli.command, Some(Command::Kubeconfig(ref a)) if a.output == access::KubeconfigFormat::Json)
        );
        assert!(
            Cli::try_parse_from(["tether", "kubeconfig", "--cluster", "east", "-o", "e.yaml"]).is_err(),
            "-o is a format, as in kubectl"
        );
        assert!(
            Cli::try_parse_from(["tether", "kubeconfig"]).is_err(),
            "--cluster is required"
        );
    }
}
