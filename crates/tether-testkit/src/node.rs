//! A real node for a test cluster: containerd + runc + CNI bridge, kubelet and kube-proxy, in a
//! network namespace, a mount namespace and a cgroup subtree of its own, hung off the lab bridge
//! (see `lab`). Pods run the project's own images, imported from `make image`'s archives.
//!
//! What the node changes stays inside it: its mount namespace hides `/run`, `/var/lib` and
//! `/var/log` behind tmpfs and binds files over the kernel settings kubelet would write
//! (`vm.overcommit_memory`, `kernel.panic*`, `kernel.keys.*`); kube-proxy leaves conntrack alone;
//! every per-network setting (forwarding, iptables) is the node's network namespace's own.
//! Teardown kills every process of the node's cgroup (containerd's shims and the pods
//! included) and removes the cgroups; the namespaces go with the last process. A node of a
//! killed test run is reaped by the next run (`process::reap_strays`).

use std::fs;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::Error;
use crate::cgroup::{CGROUP_FS, CGROUPS_FILE, SANDBOX_CGROUP, TEST_CGROUP, kill_cgroup};
use crate::lab::{self, CNI_BIN_DIR};
use crate::process::Proc;
use crate::tools::{Tools, repo_root};

pub use crate::cgroup::kill_sandbox_nodes;

/// The sandbox image every node uses (built by `make image`, never pulled).
pub const PAUSE_IMAGE: &str = "tether.test/pause:1";

/// The image archives a node imports: the pause image and the project's image, plus those
/// `$TETHER_EXTRA_IMAGES` names (`:`-separated; `make test-upgrade` adds an earlier release's).
pub fn image_archives() -> Result<Vec<PathBuf>, Error> {
    let dir = repo_root().join("target/images");
    let mut archives: Vec<PathBuf> = ["pause.tar", "tether.tar"].iter().map(|f| dir.join(f)).collect();
    if let Some(extra) = std::env::var_os("TETHER_EXTRA_IMAGES") {
        archives.extend(std::env::split_paths(&extra).filter(|p| !p.as_os_str().is_empty()));
    }
    let missing: Vec<String> = archives
        .iter()
        .filter(|p| !p.is_file())
        .map(|p| p.display().to_string())
        .collect();
    if missing.is_empty() {
        Ok(archives)
    } else {
        Err(Error::ToolsMissing {
            dir,
            missing: format!("{} (build them with `make image`)", missing.join(", ")),
        })
    }
}

/// What a node needs to know about its cluster.
pub(crate) struct NodeSpec<'a> {
    /// The cluster's folder (the node's folder goes inside it).
    pub cluster_dir: &'a Path,
    /// The node's name.
    pub name: String,
    /// The API server URL as the node reaches it (on the lab bridge).
    pub url: &'a str,
    /// The cluster CA (PEM).
    pub ca_pem: &'a str,
    /// kubelet's client certificate and key (system:node:<name>).
    pub kubelet_cert: (String, String),
    /// kube-proxy's client certificate and key (system:kube-proxy).
    pub proxy_cert: (String, String),
    /// Whether the cluster folder outlives the test (a sandbox): its cgroups are not reaped.
    pub detachable: bool,
}

/// A running node; torn down (every process of its cgroup killed) when dropped.
pub struct Node {
    name: String,
    ip: Ipv4Addr,
    dir: PathBuf,
    cgroup: String,
    init: Option<Proc>,
}

impl Node {
    /// Starts the node's processes; returns once its network is wired (not when it is Ready).
    pub(crate) fn start(spec: NodeSpec<'_>, tools: &Tools) -> Result<Self, Error> {
        let (index, ip) = lab::next_node()?;
        let dir = spec.cluster_dir.join(&spec.name);
        let folder = spec
            .cluster_dir
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        let top = if spec.detachable {
            SANDBOX_CGROUP
        } else {
            TEST_CGROUP
        };
        let cgroup = format!("{top}/{folder}--{}", spec.name);
        mkdirs(&[
            dir.clone(),
            dir.join("cni"),
            dir.join("sysctl"),
            dir.join("kubelet"),
        ])?;
        let pod_cidr = format!("10.244.{index}.0/24");
        let images = image_archives()?;
        let file = |name: &str, text: String| write(&dir.join(name), &text);
        file("ca.crt", spec.ca_pem.to_string())?;
        file(
            "kubelet.kubeconfig",
            crate::kubeconfig::client_kubeconfig(&spec.name, spec.url, spec.ca_pem, &spec.kubelet_cert),
        )?;
        file(
            "kube-proxy.kubeconfig",
            crate::kubeconfig::client_kubeconfig(&spec.name, spec.url, spec.ca_pem, &spec.proxy_cert),
        )?;
        file("containerd.toml", containerd_config(&dir))?;
        file("cni/10-tether.conflist", cni_config(&dir, &pod_cidr))?;
        file("kubelet.yaml", kubelet_config(&dir, ip, &cgroup))?;
        file("kube-proxy.yaml", proxy_config(&dir, &spec.name, &pod_cidr))?;
        file("resolv.conf", String::new())?;
        for (setting, value) in SYSCTLS {
            file(
                &format!("sysctl/{}", setting.replace('/', ".")),
                format!("{value}\n"),
            )?;
        }
        let cgroups = spec.cluster_dir.join(CGROUPS_FILE);
        append_line(&cgroups, &cgroup)?;

        let script = init_script(&dir, &spec.name, ip, &cgroup, &images, tools);
        let mut cmd = Command::new("unshare");
        cmd.args(["--net", "--mount", "--propagation", "private", "--", "bash", "-c"])
            .arg(script);
        let init = Proc::spawn(&format!("{}-init", spec.name), cmd, spec.cluster_dir)?;
        let mut node = Self {
            name: spec.name,
            ip,
            dir,
            cgroup,
            init: Some(init),
        };
        node.wire(index)?;
        Ok(node)
    }

    /// Moves one end of a veth pair into the node as `eth0` and puts the other on the bridge.
    fn wire(&mut self, index: u8) -> Result<(), Error> {
        let pid = self.init.as_ref().map(Proc::pid).unwrap_or_default().to_string();
        // `unshare` switches namespaces after it starts: wait until it has.
        let ours = fs::read_link("/proc/self/ns/net").ok();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while fs::read_link(format!("/proc/{pid}/ns/net")).ok() == ours {
            if std::time::Instant::now() > deadline {
                return Err(Error::Lab(format!(
                    "node {} did not enter its network namespace",
                    self.name
                )));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let host_end = format!("tnode{index}");
        lab::ip(&[
            "link", "add", &host_end, "type", "veth", "peer", "name", "eth0", "netns", &pid,
        ])?;
        lab::ip(&["link", "set", &host_end, "master", lab::BRIDGE, "up"])?;
        // Pod IPs are reachable from the lab (the API servers), as on a routed pod network:
        // the aggregator reaches an APIService's pod endpoints, a service proxy its pods.
        lab::ip(&[
            "route",
            "replace",
            &format!("10.244.{index}.0/24"),
            "via",
            &self.ip.to_string(),
        ])
    }

    /// The node's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The node's address on the lab bridge.
    pub fn ip(&self) -> Ipv4Addr {
        self.ip
    }

    /// The node's folder (configuration, logs, containerd's and kubelet's state).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `ctr` against this node's containerd, in the `k8s.io` namespace (images, containers).
    pub fn ctr(&self) -> Command {
        let mut cmd = Command::new("ctr");
        cmd.arg("--address")
            .arg(self.dir.join("containerd.sock"))
            .args(["-n", "k8s.io"]);
        cmd
    }

    /// Holds the node's kubelet (`SIGSTOP`, `held`) or lets it go on (`SIGCONT`): while it is
    /// held, nothing on the node is restarted, as on a node whose kubelet hangs.
    pub fn hold_kubelet(&self, held: bool) -> Result<(), Error> {
        use nix::sys::signal::{Signal, kill};
        let pid = self
            .kubelet_pid()
            .ok_or_else(|| Error::Lab(format!("node {}: no kubelet process", self.name)))?;
        let signal = if held { Signal::SIGSTOP } else { Signal::SIGCONT };
        kill(nix::unistd::Pid::from_raw(pid), signal)
            .map_err(|e| Error::Lab(format!("node {}: {signal} to kubelet {pid}: {e}", self.name)))
    }

    /// The node's kubelet: the process started with this node's root directory.
    fn kubelet_pid(&self) -> Option<i32> {
        let root = format!("--root-dir={}", self.dir.join("kubelet").display());
        fs::read_dir("/proc").ok()?.flatten().find_map(|entry| {
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = fs::read(entry.path().join("cmdline")).ok()?;
            let mut args = cmdline.split(|b| *b == 0).map(String::from_utf8_lossy);
            let exe = args.next()?;
            (exe.ends_with("kubelet") && args.any(|a| a == root)).then_some(pid)
        })
    }

    /// `Some(status)` if the node's init process has exited (a node process died).
    pub fn exited(&mut self) -> Option<String> {
        self.init.as_mut().and_then(Proc::exited)
    }

    /// The last lines of each of the node's logs, for a failure message.
    pub fn logs(&self, lines: usize) -> String {
        let mut out = String::new();
        for log in ["init", "containerd", "kubelet", "kube-proxy"] {
            let path = if log == "init" {
                self.init
                    .as_ref()
                    .map(|p| p.log().to_path_buf())
                    .unwrap_or_default()
            } else {
                self.dir.join(format!("{log}.log"))
            };
            out.push_str(&format!(
                "----- {} {log} ({}) -----\n{}\n",
                self.name,
                path.display(),
                crate::process::tail(&path, lines)
            ));
        }
        out
    }

    /// Kills every process of the node (pods included) and removes its cgroups.
    pub fn stop(&mut self) {
        kill_cgroup(&self.cgroup);
        if let Some(mut init) = self.init.take() {
            init.stop();
        }
    }

    /// Leaves the node running after this value is gone (a sandbox).
    pub fn detach(mut self) {
        if let Some(init) = self.init.take() {
            std::mem::forget(init);
        }
        self.cgroup.clear();
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if !self.cgroup.is_empty() {
            self.stop();
        }
    }
}

/// Kernel settings kubelet checks and would write; the node sees these files instead.
const SYSCTLS: [(&str, &str); 5] = [
    ("vm/overcommit_memory", "1"),
    ("kernel/panic", "10"),
    ("kernel/panic_on_oops", "1"),
    ("kernel/keys/root_maxkeys", "1000000"),
    ("kernel/keys/root_maxbytes", "25000000"),
];

fn init_script(
    dir: &Path,
    name: &str,
    ip: Ipv4Addr,
    cgroup: &str,
    images: &[PathBuf],
    tools: &Tools,
) -> String {
    let d = dir.display();
    let binds: String = SYSCTLS
        .iter()
        .map(|(s, _)| format!("mount --bind {d}/sysctl/{} /proc/sys/{s}\n", s.replace('/', ".")))
        .collect();
    let imports: String = images
        .iter()
        .map(|i| {
            format!(
                "ctr --address {d}/containerd.sock -n k8s.io images import {} >/dev/null\n",
                i.display()
            )
        })
        .collect();
    let kubelet = tools.path("kubelet");
    let proxy = tools.path("kube-proxy");
    format!(
        r#"set -euo pipefail
say() {{ echo "[node {name}] $*"; }}
# 1. Cgroups: the node and all it starts, pods included, live under {cgroup}.
for h in {CGROUP_FS}/*; do
  [[ -f $h/cgroup.procs && ${{h##*/}} != unified ]] || continue
  mkdir -p "$h/{cgroup}"
  if [[ -f $h/cpuset.cpus ]]; then
    for c in "$h/{cgroup}" ; do
      p=${{c%/*}}
      for f in cpuset.cpus cpuset.mems; do
        [[ -n $(cat "$p/$f") ]] || cat "$h/$f" > "$p/$f"
        [[ -n $(cat "$c/$f") ]] || cat "$p/$f" > "$c/$f"
      done
    done
  fi
  echo $$ > "$h/{cgroup}/cgroup.procs"
done
# 2. Network: the test moves eth0 in from the lab bridge.
for _ in $(seq 400); do ip link show eth0 >/dev/null 2>&1 && break; sleep 0.05; done
ip link set lo up
ip addr add {ip}/{prefix} dev eth0
ip link set eth0 up
ip route add default via {gw}
echo 1 > /proc/sys/net/ipv4/ip_forward
# 3. Mounts private to this node.
mount -t tmpfs -o mode=755 tether-node-run /run
mount -t tmpfs -o mode=755 tether-node-lib /var/lib
mount -t tmpfs -o mode=755 tether-node-log /var/log
{binds}# 4. containerd, the images, kubelet and kube-proxy.
say "starting containerd"
containerd --config {d}/containerd.toml > {d}/containerd.log 2>&1 &
for _ in $(seq 400); do [[ -S {d}/containerd.sock ]] && break; sleep 0.05; done
say "importing images"
{imports}say "starting kubelet and kube-proxy"
{kubelet} --config={d}/kubelet.yaml --kubeconfig={d}/kubelet.kubeconfig --hostname-override={name} \
  --node-ip={ip} --root-dir={d}/kubelet --cert-dir={d}/kubelet/pki --v=1 > {d}/kubelet.log 2>&1 &
{proxy} --config={d}/kube-proxy.yaml --v=1 > {d}/kube-proxy.log 2>&1 &
set +e
wait -n
say "a node process exited ($?); see the logs in {d}"
exit 1
"#,
        prefix = lab::PREFIX,
        gw = lab::GATEWAY,
        kubelet = kubelet.display(),
        proxy = proxy.display(),
    )
}

fn containerd_config(dir: &Path) -> String {
    let d = dir.display();
    format!(
        r#"version = 2
root = "{d}/containerd/root"
state = "{d}/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "{d}/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # No CAP_SYS_RESOURCE on these machines: a negative oom_score_adj is refused, so clamp it.
  restrict_oom_score_adj = true
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{d}/cni"
"#
    )
}

fn cni_config(dir: &Path, pod_cidr: &str) -> String {
    serde_json::json!({
        "cniVersion": "0.4.0",
        "name": "tether",
        "plugins": [
            {
                "type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": pod_cidr}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": dir.join("cni-ipam"),
                }
            },
            {"type": "portmap", "capabilities": {"portMappings": true}}
        ]
    })
    .to_string()
}

fn kubelet_config(dir: &Path, ip: Ipv4Addr, cgroup: &str) -> String {
    let d = dir.display();
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://{d}/containerd.sock
cgroupDriver: cgroupfs
cgroupRoot: /{cgroup}
failSwapOn: false
failCgroupV1: false
protectKernelDefaults: false
address: {ip}
readOnlyPort: 0
healthzPort: 0
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: false}}
  x509: {{clientCAFile: {d}/ca.crt}}
authorization: {{mode: AlwaysAllow}}
clusterDomain: cluster.local
resolvConf: {d}/resolv.conf
podLogsDir: {d}/pod-logs
staticPodPath: ""
localStorageCapacityIsolation: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {{memory.available: "50Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}}
serializeImagePulls: false
registerNode: true
nodeStatusUpdateFrequency: 5s
"#
    )
}

fn proxy_config(dir: &Path, name: &str, pod_cidr: &str) -> String {
    let d = dir.display();
    format!(
        r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {{kubeconfig: {d}/kube-proxy.kubeconfig}}
hostnameOverride: {name}
mode: iptables
clusterCIDR: {pod_cidr}
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
# Zero: leave the kernel's conntrack settings alone (they are not the node's to change).
conntrack: {{maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}}
"#
    )
}

fn mkdirs(dirs: &[PathBuf]) -> Result<(), Error> {
    for d in dirs {
        fs::create_dir_all(d).map_err(|source| Error::Io {
            path: d.clone(),
            source,
        })?;
    }
    Ok(())
}

fn write(path: &Path, text: &str) -> Result<(), Error> {
    fs::write(path, text).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn append_line(path: &Path, line: &str) -> Result<(), Error> {
    use std::io::Write as _;
    fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut f| writeln!(f, "{line}"))
        .map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })
}
