//! The command lines of a test control plane, as pure functions of where its files are
//! (`Layout`), which ports it listens on (`Ports`) and what it is asked for (`ApiServer`), so
//! every flag is unit-tested without starting anything. `cluster.rs` writes the files, spawns the
//! processes and waits for them.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The common name of the API server's front-proxy client certificate.
pub const FRONT_PROXY_CLIENT: &str = "front-proxy-client";

/// Where a cluster's files live, under its own directory.
#[derive(Clone, Debug)]
pub struct Layout {
    dir: PathBuf,
}

impl Layout {
    /// The files of a cluster in `dir`.
    pub fn new(dir: &Path) -> Self {
        Self {
            dir: dir.to_path_buf(),
        }
    }

    /// `file` in the cluster's directory, as a flag value.
    pub fn file(&self, file: &str) -> String {
        self.dir.join(file).display().to_string()
    }

    /// The cluster's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// The ports a control plane listens on (all on loopback but the API server's on the lab).
#[derive(Clone, Copy, Debug)]
pub struct Ports {
    /// etcd's clients.
    pub etcd_client: u16,
    /// etcd's peers (itself).
    pub etcd_peer: u16,
    /// The API server's secure port.
    pub api: u16,
}

/// What the API server is asked for.
#[derive(Clone, Debug)]
pub struct ApiServer {
    /// Bootstrap token authentication.
    pub bootstrap_tokens: bool,
    /// `--v`.
    pub verbosity: u8,
    /// `--request-timeout`, if not the default.
    pub request_timeout: Option<Duration>,
    /// The lab address pods and kubelets reach it at (a cluster with nodes), or none: loopback.
    pub lab: Option<Ipv4Addr>,
    /// Whether kube-controller-manager runs (without it, no ServiceAccount admission).
    pub controllers: bool,
    /// An audit log (`audit.log`, policy `audit-policy.yaml`).
    pub audit_log: bool,
    /// `/debug/pprof`, for a benchmark's profile.
    pub profiling: bool,
}

/// etcd's arguments for cluster `name`.
pub fn etcd_args(name: &str, files: &Layout, ports: Ports) -> Vec<String> {
    let (client, peer) = (ports.etcd_client, ports.etcd_peer);
    vec![
        "--name".into(),
        name.into(),
        "--log-level".into(),
        "warn".into(),
        "--unsafe-no-fsync".into(),
        format!("--data-dir={}", files.file("etcd")),
        format!("--listen-client-urls=http://127.0.0.1:{client}"),
        format!("--advertise-client-urls=http://127.0.0.1:{client}"),
        format!("--listen-peer-urls=http://127.0.0.1:{peer}"),
        format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer}"),
        format!("--initial-cluster={name}=http://127.0.0.1:{peer}"),
    ]
}

/// kube-apiserver's arguments.
pub fn apiserver_args(files: &Layout, ports: Ports, api: &ApiServer) -> Vec<String> {
    let f = |name: &str| files.file(name);
    let mut args = vec![
        format!("--etcd-servers=http://127.0.0.1:{}", ports.etcd_client),
        format!("--secure-port={}", ports.api),
        format!("--cert-dir={}", f("certs")),
        format!("--tls-cert-file={}", f("serving.crt")),
        format!("--tls-private-key-file={}", f("serving.key")),
        format!("--client-ca-file={}", f("ca.crt")),
        "--authorization-mode=Node,RBAC".into(),
        format!("--enable-bootstrap-token-auth={}", api.bootstrap_tokens),
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
        format!("--service-account-key-file={}", f("sa.pub")),
        format!("--service-account-signing-key-file={}", f("sa.key")),
        "--service-cluster-ip-range=10.0.0.0/24".into(),
        "--allow-privileged=true".into(),
        format!("--profiling={}", api.profiling),
        format!("--v={}", api.verbosity),
        // The aggregation layer, as kubeadm sets it up: a front-proxy CA of its own, and routing
        // to an APIService's endpoints (no kube-proxy runs beside these API servers).
        format!("--requestheader-client-ca-file={}", f("front-proxy-ca.crt")),
        format!("--requestheader-allowed-names={FRONT_PROXY_CLIENT}"),
        "--requestheader-username-headers=X-Remote-User".into(),
        "--requestheader-group-headers=X-Remote-Group".into(),
        "--requestheader-extra-headers-prefix=X-Remote-Extra-".into(),
        "--enable-aggregator-routing=true".into(),
        format!("--proxy-client-cert-file={}", f("front-proxy-client.crt")),
        format!("--proxy-client-key-file={}", f("front-proxy-client.key")),
    ];
    if let Some(t) = api.request_timeout {
        args.push(format!("--request-timeout={}s", t.as_secs().max(1)));
    }
    match api.lab {
        // Pods reach the API server as the `kubernetes` Service, whose endpoint is the advertised
        // lab address; kubectl logs/exec reach kubelets with a client certificate.
        Some(gateway) => args.extend([
            "--bind-address=0.0.0.0".into(),
            format!("--advertise-address={gateway}"),
            "--endpoint-reconciler-type=lease".into(),
            format!("--kubelet-client-certificate={}", f("kubelet-client.crt")),
            format!("--kubelet-client-key={}", f("kubelet-client.key")),
            "--kubelet-preferred-address-types=InternalIP".into(),
        ]),
        None => args.extend([
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            "--endpoint-reconciler-type=none".into(),
        ]),
    }
    if !api.controllers {
        args.push("--disable-admission-plugins=ServiceAccount".into());
    }
    if api.audit_log {
        args.push(format!("--audit-policy-file={}", f("audit-policy.yaml")));
        args.push(format!("--audit-log-path={}", f("audit.log")));
    }
    args
}

/// kube-controller-manager's arguments: every controller, and the bootstrap token ones.
pub fn kcm_args(files: &Layout) -> Vec<String> {
    vec![
        format!("--kubeconfig={}", files.file("kubeconfig")),
        "--leader-elect=false".into(),
        "--use-service-account-credentials=true".into(),
        format!("--service-account-private-key-file={}", files.file("sa.key")),
        format!("--root-ca-file={}", files.file("ca.crt")),
        "--controllers=*,bootstrap-signer-controller,token-cleaner-controller".into(),
        "--secure-port=0".into(),
        "--v=1".into(),
    ]
}

/// kube-scheduler's arguments (a cluster with nodes).
pub fn scheduler_args(files: &Layout) -> Vec<String> {
    vec![
        format!("--kubeconfig={}", files.file("kubeconfig")),
        "--leader-elect=false".into(),
        "--secure-port=0".into(),
        "--v=1".into(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    const PORTS: Ports = Ports {
        etcd_client: 2379,
        etcd_peer: 2380,
        api: 6443,
    };

    fn api() -> ApiServer {
        ApiServer {
            bootstrap_tokens: true,
            verbosity: 1,
            request_timeout: None,
            lab: None,
            controllers: true,
            audit_log: false,
            profiling: false,
        }
    }

    fn has(args: &[String], flag: &str) -> bool {
        args.iter().any(|a| a == flag)
    }

    fn value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
        args.iter().find_map(|a| a.strip_prefix(flag)?.strip_prefix('='))
    }

    #[test]
    fn etcd_serves_its_one_member_on_loopback_from_the_cluster_dir() {
        let files = Layout::new(Path::new("/c/east-1"));
        let args = etcd_args("east", &files, PORTS);
        assert_eq!(value(&args, "--data-dir"), Some("/c/east-1/etcd"));
        assert_eq!(
            value(&args, "--listen-client-urls"),
            Some("http://127.0.0.1:2379")
        );
        assert_eq!(
            value(&args, "--initial-cluster"),
            Some("east=http://127.0.0.1:2380")
        );
        assert!(has(&args, "--unsafe-no-fsync"));
    }

    #[test]
    fn the_api_server_binds_to_loopback_without_nodes_and_to_the_lab_with_them() {
        let files = Layout::new(Path::new("/c"));
        let alone = apiserver_args(&files, PORTS, &api());
        assert_eq!(value(&alone, "--etcd-servers"), Some("http://127.0.0.1:2379"));
        assert_eq!(value(&alone, "--secure-port"), Some("6443"));
        assert_eq!(value(&alone, "--bind-address"), Some("127.0.0.1"));
        assert_eq!(value(&alone, "--endpoint-reconciler-type"), Some("none"));
        assert_eq!(value(&alone, "--kubelet-client-certificate"), None);
        let lab = ApiServer {
            lab: Some(Ipv4Addr::new(10, 203, 0, 1)),
            ..api()
        };
        let with_nodes = apiserver_args(&files, PORTS, &lab);
        assert_eq!(value(&with_nodes, "--bind-address"), Some("0.0.0.0"));
        assert_eq!(value(&with_nodes, "--advertise-address"), Some("10.203.0.1"));
        assert_eq!(value(&with_nodes, "--endpoint-reconciler-type"), Some("lease"));
        assert_eq!(
            value(&with_nodes, "--kubelet-client-certificate"),
            Some("/c/kubelet-client.crt")
        );
    }

    #[test]
    fn api_server_options_map_to_their_flags() {
        let files = Layout::new(Path::new("/c"));
        let plain = apiserver_args(&files, PORTS, &api());
        assert_eq!(value(&plain, "--enable-bootstrap-token-auth"), Some("true"));
        assert_eq!(value(&plain, "--profiling"), Some("false"));
        assert_eq!(value(&plain, "--request-timeout"), None);
        assert_eq!(value(&plain, "--audit-log-path"), None);
        assert!(!has(&plain, "--disable-admission-plugins=ServiceAccount"));
        assert_eq!(
            value(&plain, "--requestheader-allowed-names"),
            Some(FRONT_PROXY_CLIENT)
        );
        let asked = ApiServer {
            bootstrap_tokens: false,
            verbosity: 4,
            request_timeout: Some(Duration::from_millis(200)),
            controllers: false,
            audit_log: true,
            profiling: true,
            ..api()
        };
        let args = apiserver_args(&files, PORTS, &asked);
        assert_eq!(value(&args, "--enable-bootstrap-token-auth"), Some("false"));
        assert_eq!(value(&args, "--v"), Some("4"));
        assert_eq!(value(&args, "--request-timeout"), Some("1s"), "at least a second");
        assert_eq!(value(&args, "--audit-log-path"), Some("/c/audit.log"));
        assert_eq!(value(&args, "--audit-policy-file"), Some("/c/audit-policy.yaml"));
        assert_eq!(value(&args, "--profiling"), Some("true"));
        assert!(has(&args, "--disable-admission-plugins=ServiceAccount"));
    }

    #[test]
    fn the_controller_manager_runs_the_bootstrap_token_controllers_with_its_keys() {
        let args = kcm_args(&Layout::new(Path::new("/c")));
        assert_eq!(value(&args, "--kubeconfig"), Some("/c/kubeconfig"));
        assert_eq!(
            value(&args, "--service-account-private-key-file"),
            Some("/c/sa.key")
        );
        assert_eq!(
            value(&args, "--controllers"),
            Some("*,bootstrap-signer-controller,token-cleaner-controller")
        );
        assert_eq!(
            value(&scheduler_args(&Layout::new(Path::new("/c"))), "--leader-elect"),
            Some("false")
        );
    }
}
