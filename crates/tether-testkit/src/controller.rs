//! Runs Tether's own controller binary against a test cluster, as a ServiceAccount (never as
//! admin), with its log kept next to the cluster's and its admin port reachable, so tests can
//! stop it the way Kubernetes does (SIGTERM) or crash it (SIGKILL).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use nix::sys::signal::Signal;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::process::Proc;
use crate::{Error, TestCluster, free_port};

/// A kubeconfig for `cluster` that authenticates with `token` only; written in the cluster folder.
pub fn token_kubeconfig(cluster: &TestCluster, user: &str, token: &str) -> Result<PathBuf, Error> {
    let path = cluster.dir().join(format!("kubeconfig-{user}"));
    let name = cluster.name();
    let contents = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: {name}\n  cluster:\n    server: {url}\n    \
         certificate-authority-data: {ca}\nusers:\n- name: {user}\n  user:\n    token: {token}\n\
         contexts:\n- name: {name}\n  context:\n    cluster: {name}\n    user: {user}\ncurrent-context: {name}\n",
        url = cluster.url(),
        ca = B64.encode(cluster.ca_pem()),
    );
    std::fs::write(&path, contents).map_err(|source| Error::Io {
        path: path.clone(),
        source,
    })?;
    Ok(path)
}

/// Where the workspace's binaries are built: `TETHER_BIN_DIR`, else `$CARGO_TARGET_DIR/debug`
/// (relative to the workspace when relative), else `<workspace>/target/debug`.
pub fn binary(name: &str) -> Result<PathBuf, Error> {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = std::env::var_os("TETHER_BIN_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("CARGO_TARGET_DIR").map(|t| workspace.join(t).join("debug")))
        .unwrap_or_else(|| workspace.join("target/debug"));
    let path = dir.join(name);
    if path.is_file() {
        Ok(path)
    } else {
        Err(Error::ToolsMissing {
            dir,
            missing: format!("{name} (build it with `cargo build -p {name}`; `make test` does)"),
        })
    }
}

/// A running `tether-controller` process.
pub struct Controller {
    proc: Proc,
    admin: SocketAddr,
}

impl Controller {
    /// Starts `tether-controller <args>` with `kubeconfig`, plain logs and a free admin port.
    pub fn start(cluster: &TestCluster, name: &str, kubeconfig: &Path, args: &[&str]) -> Result<Self, Error> {
        Self::start_binary(&binary("tether-controller")?, cluster, name, kubeconfig, args)
    }

    /// As [`Controller::start`], with the `tether-controller` binary at `bin` (a benchmark
    /// comparing two builds).
    pub fn start_binary(
        bin: &Path,
        cluster: &TestCluster,
        name: &str,
        kubeconfig: &Path,
        args: &[&str],
    ) -> Result<Self, Error> {
        let admin: SocketAddr = ([127, 0, 0, 1], free_port()?).into();
        let mut cmd = Command::new(bin);
        cmd.args(args)
            .arg(format!("--admin-addr={admin}"))
            .arg("--log-format=plain")
            .arg(format!("--identity={name}"))
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "info")
            .env_remove("POD_NAMESPACE")
            .env_remove("POD_NAME");
        let proc = Proc::spawn(name, cmd, cluster.dir())?;
        Ok(Self { proc, admin })
    }

    /// Sends SIGTERM and waits for the process to exit, as a pod deletion does.
    pub fn terminate(&mut self) -> Option<String> {
        if self.proc.exited().is_none() {
            let _ = self.proc.signal(Signal::SIGTERM);
        }
        self.proc.wait()
    }

    /// Kills the process with SIGKILL (a crash).
    pub fn kill(&mut self) {
        self.proc.stop();
    }

    /// Freezes the process (SIGSTOP): it holds its connections but reads and answers nothing
    /// until `thaw`, as a node or process stalled for a while.
    pub fn freeze(&self) {
        let _ = self.proc.signal(Signal::SIGSTOP);
    }

    /// Lets a frozen process run again (SIGCONT).
    pub fn thaw(&self) {
        let _ = self.proc.signal(Signal::SIGCONT);
    }

    /// Freezes the process until the returned guard is dropped, also when the test holding it
    /// fails: a shared fixture is not left with a stalled process for the tests after it.
    pub fn frozen(&self) -> Thaw<'_> {
        self.freeze();
        Thaw(self)
    }

    /// Leaves the process running after this value is gone (a sandbox).
    pub fn detach(self) {
        std::mem::forget(self);
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    /// The exit status, if it exited.
    pub fn exited(&mut self) -> Option<String> {
        self.proc.exited()
    }

    /// The last lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.proc.log_tail(lines)
    }

    /// The whole log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.proc.log()).unwrap_or_default()
    }

    /// GETs `path` on the admin port: `(status code, body)`.
    pub async fn admin_get(&self, path: &str) -> Result<(u16, String), Error> {
        let io = |source| Error::Io {
            path: PathBuf::from(format!("http://{}{path}", self.admin)),
            source,
        };
        let mut s = tokio::net::TcpStream::connect(self.admin).await.map_err(io)?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: admin\r\n\r\n").as_bytes())
            .await
            .map_err(io)?;
        let mut out = String::new();
        s.read_to_string(&mut out).await.map_err(io)?;
        let code = out
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let body = out
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default();
        Ok((code, body))
    }
}

/// Thaws its process when dropped (see [`Controller::frozen`]).
pub struct Thaw<'a>(&'a Controller);

impl Drop for Thaw<'_> {
    fn drop(&mut self) {
        self.0.thaw();
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- {} log (last 60 lines) ---\n{}",
                self.proc.name(),
                self.log_tail(60)
            );
        }
    }
}
