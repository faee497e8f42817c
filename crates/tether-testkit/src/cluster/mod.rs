//! A real Kubernetes control plane for one test: etcd, kube-apiserver (bootstrap tokens,
//! TokenRequest, Node+RBAC) and kube-controller-manager (namespace deletion, garbage collection,
//! bootstrap signer, token cleaner), on free loopback ports, torn down when the handle drops.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::config::{AuthInfo, KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};

use crate::args::{ApiServer, Layout, Ports, apiserver_args, etcd_args, kcm_args, scheduler_args};
use crate::kubeconfig::{admin_kubeconfig, client_kubeconfig, kube_config};
use crate::lab;
use crate::node::{Node, NodeSpec};

pub use crate::args::FRONT_PROXY_CLIENT;

mod processes;
mod waits;
use crate::pki::Pki;
use crate::process::{self, Proc};
use crate::tools::Tools;
use crate::{Error, free_port};

/// How long a control plane may take to become ready before start-up fails.
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// Start-up attempts, for the rare case that another process takes a chosen port first.
const ATTEMPTS: usize = 3;

/// Options for a test cluster; `TestCluster::builder(name)`.
#[derive(Clone, Debug)]
pub struct ClusterBuilder {
    name: String,
    controller_manager: bool,
    wait_for_controllers: bool,
    audit_log: bool,
    profiling: bool,
    bootstrap_tokens: bool,
    root: Option<PathBuf>,
    nodes: usize,
    request_timeout: Option<Duration>,
    verbosity: u8,
    kubernetes: Option<String>,
}

impl ClusterBuilder {
    /// kube-apiserver's log verbosity (`--v`, default 1), e.g. 7 to see the request headers
    /// its client-go transports log (the aggregator's proxy among them).
    pub fn verbosity(mut self, v: u8) -> Self {
        self.verbosity = v;
        self
    }

    /// The API server's `--request-timeout` (default: its own, 60 s), e.g. to prove that
    /// long-running requests outlive it.
    pub fn request_timeout(mut self, t: Duration) -> Self {
        self.request_timeout = Some(t);
        self
    }

    /// Starts `n` real nodes (containerd, kubelet, kube-proxy) and kube-scheduler, and waits
    /// until every node is Ready (default: none). The process must be in its lab
    /// (`lab::enter()`); the API server then listens on the lab bridge, and `url()` is that
    /// address, reachable from every node and pod of the run.
    pub fn nodes(mut self, n: usize) -> Self {
        self.nodes = n;
        self
    }

    /// Runs the Kubernetes binaries of `version` (one of `e2e/versions.env`'s, installed in
    /// `.tools/k8s/<version>` by `make tools`) instead of the default version's.
    pub fn kubernetes(mut self, version: &str) -> Self {
        self.kubernetes = Some(version.to_string());
        self
    }

    /// Whether to run kube-controller-manager (default: yes).
    pub fn controller_manager(mut self, on: bool) -> Self {
        self.controller_manager = on;
        self
    }

    /// Whether `start` waits until the controllers have published `kube-root-ca.crt` (default: yes).
    pub fn wait_for_controllers(mut self, on: bool) -> Self {
        self.wait_for_controllers = on;
        self
    }

    /// Whether the API server accepts bootstrap tokens (default: yes), as kubeadm clusters do.
    pub fn bootstrap_tokens(mut self, on: bool) -> Self {
        self.bootstrap_tokens = on;
        self
    }

    /// Puts the cluster folder under `root` instead of `$TMPDIR/tether-testkit` (where folders of
    /// dead test processes are reaped): for a sandbox that outlives its creator (see `detach`).
    pub fn root(mut self, root: &Path) -> Self {
        self.root = Some(root.to_path_buf());
        self
    }

    /// Writes an audit log of every request (level Metadata) to `audit.log` in the cluster folder.
    pub fn audit_log(mut self, on: bool) -> Self {
        self.audit_log = on;
        self
    }

    /// Serves `/debug/pprof` (kube-apiserver's `--profiling`), e.g. for a benchmark to force a
    /// garbage collection before it reads the live heap. Also on with `TETHER_TESTKIT_PROFILING=1`.
    pub fn profiling(mut self, on: bool) -> Self {
        self.profiling = on;
        self
    }

    /// Starts the cluster and waits until it serves requests.
    pub async fn start(self) -> Result<TestCluster, Error> {
        let tools = Tools::locate_version(self.kubernetes.as_deref())?;
        let root = self
            .root
            .clone()
            .unwrap_or_else(|| std::env::temp_dir().join("tether-testkit"));
        std::fs::create_dir_all(&root).map_err(|source| Error::Io {
            path: root.clone(),
            source,
        })?;
        if self.root.is_none() {
            process::reap_strays(&root);
        }
        let mut last = None;
        for _ in 0..ATTEMPTS {
            match TestCluster::start_once(&self, &tools, &root).await {
                Ok(cluster) => return Ok(cluster),
                Err(err @ Error::PortInUse { .. }) => last = Some(err),
                Err(err) => return Err(err),
            }
        }
        Err(last.unwrap_or(Error::NotReady {
            name: self.name,
            what: "no attempt ran".into(),
        }))
    }
}

/// A running control plane; everything is killed and removed when it drops. If the test is
/// panicking, the logs' last lines are printed and the folder is kept for inspection.
pub struct TestCluster {
    name: String,
    // NB: fields drop in order: nodes first, then processes (kube-scheduler,
    // kube-controller-manager, kube-apiserver, etcd), then the folder they write to.
    nodes: Vec<Node>,
    procs: Vec<Proc>,
    dir: Option<tempfile::TempDir>,
    url: String,
    pki: Pki,
    kubeconfig: PathBuf,
    config: Config,
    startup: Duration,
    /// How kube-apiserver was started, to start it again after `stop_api_server`.
    api_command: (std::ffi::OsString, Vec<std::ffi::OsString>),
    /// The CA bundle clients trust to reach the API server, once `trust_serving_cas` changed it.
    trusted: Option<String>,
}

impl TestCluster {
    /// A cluster with kube-controller-manager, waiting for its controllers.
    pub fn builder(name: &str) -> ClusterBuilder {
        ClusterBuilder {
            name: name.to_string(),
            controller_manager: true,
            wait_for_controllers: true,
            audit_log: false,
            profiling: false,
            bootstrap_tokens: true,
            root: None,
            nodes: 0,
            request_timeout: None,
            verbosity: 1,
            kubernetes: None,
        }
    }

    /// Starts a cluster with default options.
    pub async fn start(name: &str) -> Result<Self, Error> {
        Self::builder(name).start().await
    }

    async fn start_once(opts: &ClusterBuilder, tools: &Tools, root: &Path) -> Result<Self, Error> {
        let started = Instant::now();
        let dir = tempfile::Builder::new()
            .prefix(&format!("{}-", opts.name))
            .tempdir_in(root)
            .map_err(|source| Error::Io {
                path: root.to_path_buf(),
                source,
            })?;
        let d = dir.path().to_path_buf();
        process::claim(&d)?;
        let pki = Pki::generate(&opts.name)?;
        for (file, pem) in [
            ("ca.crt", &pki.ca_cert),
            ("serving.crt", &pki.serving_cert),
            ("serving.key", &pki.serving_key),
            ("sa.key", &pki.service_account_key),
            ("sa.pub", &pki.service_account_pub),
        ] {
            write(&d.join(file), pem)?;
        }
        if opts.nodes > 0 && !lab::entered() {
            return Err(Error::Lab(
                "a cluster with nodes needs the lab: call tether_testkit::lab::enter() first thing in main"
                    .into(),
            ));
        }
        let ports = Ports {
            etcd_client: free_port()?,
            etcd_peer: free_port()?,
            api: free_port()?,
        };
        let lab_address = (opts.nodes > 0).then_some(lab::GATEWAY);
        let host = lab_address.map_or_else(|| "127.0.0.1".to_string(), |a| a.to_string());
        let url = format!("https://{host}:{}", ports.api);
        let kubeconfig = d.join("kubeconfig");
        write(&kubeconfig, &admin_kubeconfig(&opts.name, &url, &pki))?;
        let files = Layout::new(&d);
        let mut procs = Vec::new();
        let mut etcd = Command::new(tools.path("etcd"));
        etcd.args(etcd_args(&opts.name, &files, ports));
        procs.push(Proc::spawn("etcd", etcd, &d)?);

        let front = Pki::generate(&format!("{}-front-proxy", opts.name))?;
        let (fp_cert, fp_key) = front.client_cert(FRONT_PROXY_CLIENT, None)?;
        write(&d.join("front-proxy-ca.crt"), &front.ca_cert)?;
        write(&d.join("front-proxy-client.crt"), &fp_cert)?;
        write(&d.join("front-proxy-client.key"), &fp_key)?;
        if lab_address.is_some() {
            let (cert, key) = pki.client_cert("kube-apiserver-kubelet-client", Some("system:masters"))?;
            write(&d.join("kubelet-client.crt"), &cert)?;
            write(&d.join("kubelet-client.key"), &key)?;
        }
        if opts.audit_log {
            write(&d.join("audit-policy.yaml"), AUDIT_POLICY)?;
        }
        let asked = ApiServer {
            bootstrap_tokens: opts.bootstrap_tokens,
            verbosity: opts.verbosity,
            request_timeout: opts.request_timeout,
            lab: lab_address,
            controllers: opts.controller_manager,
            audit_log: opts.audit_log,
            // NB: `/debug/pprof` for a benchmark's profile (TETHER_TESTKIT_PROFILING=1).
            profiling: opts.profiling
                || std::env::var_os("TETHER_TESTKIT_PROFILING").is_some_and(|v| v == "1"),
        };
        let mut api = Command::new(tools.path("kube-apiserver"));
        api.args(apiserver_args(&files, ports, &asked));
        let api_command = (
            api.get_program().to_os_string(),
            api.get_args().map(|a| a.to_os_string()).collect(),
        );
        procs.push(Proc::spawn("kube-apiserver", api, &d)?);

        let config = kube_config(&kubeconfig).await?;
        let mut cluster = Self {
            name: opts.name.clone(),
            nodes: Vec::new(),
            procs,
            dir: Some(dir),
            url,
            pki,
            kubeconfig,
            config,
            startup: Duration::ZERO,
            api_command,
            trusted: None,
        };
        cluster.wait_ready().await?;

        if opts.controller_manager {
            let mut kcm = Command::new(tools.path("kube-controller-manager"));
            kcm.args(kcm_args(&files));
            cluster
                .procs
                .push(Proc::spawn("kube-controller-manager", kcm, &d)?);
            if opts.wait_for_controllers || opts.nodes > 0 {
                cluster.wait_controllers().await?;
            }
        }
        if opts.nodes > 0 {
            cluster.start_nodes(opts, tools).await?;
        }
        cluster.startup = started.elapsed();
        eprintln!(
            "tether-testkit: cluster {} ready at {} in {:.1?}",
            cluster.name, cluster.url, cluster.startup
        );
        Ok(cluster)
    }

    /// The cluster's real nodes (empty unless started with `nodes(n)`).
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// Leaves the cluster running after this value is gone (a sandbox): its processes are not
    /// killed and its folder is kept. Returns the folder; its `children` file lists the pids.
    pub fn detach(mut self) -> PathBuf {
        for n in self.nodes.drain(..) {
            n.detach();
        }
        for p in self.procs.drain(..) {
            std::mem::forget(p);
        }
        self.dir.take().map(|d| d.keep()).unwrap_or_else(|| {
            self.kubeconfig
                .parent()
                .map(Path::to_path_buf)
                .unwrap_or_default()
        })
    }

    /// The cluster's name (also its kubeconfig context).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The API server URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The CA bundle (PEM) a client trusts to reach the API server: the cluster CA, unless
    /// `trust_serving_cas` set another bundle (a serving CA rotation).
    pub fn ca_pem(&self) -> &str {
        self.trusted.as_deref().unwrap_or(&self.pki.ca_cert)
    }

    /// The kubeadm-style pin of the cluster CA.
    pub fn ca_cert_hash(&self) -> &str {
        &self.pki.ca_cert_hash
    }

    /// Path of an admin kubeconfig (system:masters) for this cluster.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The folder holding the cluster's data, certificates and process logs.
    pub fn dir(&self) -> &Path {
        self.dir.as_ref().map_or(Path::new("."), |d| d.path())
    }

    /// How long start-up took, from nothing to serving (and controllers running, if waited for).
    pub fn startup_time(&self) -> Duration {
        self.startup
    }

    /// The audit log, if the cluster was started with `audit_log(true)`.
    pub fn audit_log(&self) -> PathBuf {
        self.dir().join("audit.log")
    }

    /// Admin client configuration.
    pub fn config(&self) -> Config {
        self.config.clone()
    }

    /// A new admin client (system:masters).
    pub fn client(&self) -> Result<Client, Error> {
        Client::try_from(self.config()).map_err(Error::Client)
    }

    /// A client that authenticates with a bearer token only (bootstrap or ServiceAccount token).
    pub fn client_with_token(&self, token: &str) -> Result<Client, Error> {
        let mut config = self.config();
        config.auth_info = AuthInfo {
            token: Some(token.to_string().into()),
            ..AuthInfo::default()
        };
        Client::try_from(config).map_err(Error::Client)
    }

    /// A client authenticated as user `name` (in `group`, if any) by a client certificate.
    pub async fn user_client(&self, name: &str, group: Option<&str>) -> Result<Client, Error> {
        Client::try_from(self.user_config(name, group).await?).map_err(Error::Client)
    }

    /// Client configuration of user `name` (in `group`, if any), by a client certificate.
    pub async fn user_config(&self, name: &str, group: Option<&str>) -> Result<Config, Error> {
        let (cert, key) = self.pki.client_cert(name, group)?;
        let text = client_kubeconfig(&self.name, &self.url, self.ca_pem(), &(cert, key));
        let kubeconfig = Kubeconfig::from_yaml(&text).map_err(|e| Error::Kubeconfig(e.to_string()))?;
        Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|e| Error::Kubeconfig(e.to_string()))
    }

    /// Writes a kubeconfig for user `name` (in `group`) to `path`, as kubectl would be given.
    pub fn write_user_kubeconfig(&self, name: &str, group: Option<&str>, path: &Path) -> Result<(), Error> {
        let (cert, key) = self.pki.client_cert(name, group)?;
        let text = client_kubeconfig(&self.name, &self.url, self.ca_pem(), &(cert, key));
        std::fs::write(path, text).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })
    }

    /// A client with no credentials at all (`system:anonymous`).
    pub fn anonymous_client(&self) -> Result<Client, Error> {
        let mut config = self.config();
        config.auth_info = AuthInfo::default();
        Client::try_from(config).map_err(Error::Client)
    }

    /// `kubectl` against this cluster as admin (from `.tools/bin`).
    pub fn kubectl(&self) -> Result<Command, Error> {
        let tools = Tools::locate()?;
        let mut cmd = Command::new(tools.path("kubectl"));
        cmd.arg(format!("--kubeconfig={}", self.kubeconfig.display()));
        Ok(cmd)
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        let failed = std::thread::panicking();
        if failed {
            eprintln!(
                "tether-testkit: cluster {} logs (last lines):\n{}",
                self.name,
                self.logs(40)
            );
            for n in &self.nodes {
                eprintln!("{}", n.logs(40));
            }
        }
        // Nodes first (pods, kubelet, containerd), then the control plane in reverse start
        // order, then remove (or keep) the folder.
        self.nodes.clear();
        while let Some(mut p) = self.procs.pop() {
            p.stop();
        }
        if let Some(dir) = self.dir.take()
            && failed
        {
            let kept = dir.keep();
            eprintln!("tether-testkit: kept {} for inspection", kept.display());
        }
    }
}

const AUDIT_POLICY: &str =
    "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n";

fn write(path: &Path, contents: &str) -> Result<(), Error> {
    std::fs::write(path, contents).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })
}
