//! A local OCI registry for the packaged charts: distribution's own `registry` (`make tools`
//! builds it), on loopback in the test's lab, storing into a temporary directory. The node tier
//! pushes the leader chart to it and installs from it, as users install a release
//! (`helm install oci://...`, docs/releasing.md).

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tether_testkit::{Tools, free_port};

/// A running registry; stopped when dropped.
pub struct Registry {
    child: Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Registry {
    /// Starts a registry on a free loopback port and waits until it answers `/v2/`.
    pub async fn start() -> Self {
        let dir = tempfile::tempdir().expect("registry dir");
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port().expect("port")));
        let config = dir.path().join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {addr}\n",
                dir.path().join("data").display()
            ),
        )
        .expect("registry config");
        let child = Command::new(Tools::locate().expect("tools").path("registry"))
            .args(["serve", &config.display().to_string()])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("registry.log")).expect("log"))
            .spawn()
            .expect("start the registry (make tools builds it)");
        let registry = Self {
            child,
            addr,
            _dir: dir,
        };
        tether_testkit::eventually("the registry answers /v2/", Duration::from_secs(20), || async {
            use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
            let mut conn = tokio::net::TcpStream::connect(addr)
                .await
                .map_err(|e| e.to_string())?;
            conn.write_all(format!("GET /v2/ HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
                .await
                .map_err(|e| e.to_string())?;
            let mut answer = String::new();
            conn.read_to_string(&mut answer)
                .await
                .map_err(|e| e.to_string())?;
            match answer.lines().next() {
                Some(status) if status.split(' ').nth(1) == Some("200") => Ok(()),
                other => Err(format!("GET /v2/: {other:?}")),
            }
        })
        .await;
        registry
    }

    /// `oci://<addr>/charts`: where charts are pushed.
    pub fn charts(&self) -> String {
        format!("oci://{}/charts", self.addr)
    }

    /// Packages `chart_dir` with `helm` and pushes it here; the chart's `oci://` reference.
    pub fn push_chart(&self, helm: &Path, chart_dir: &Path) -> String {
        let out = tempfile::tempdir().expect("package dir");
        let helm_env = |c: &mut Command| {
            let home = std::env::temp_dir().join("tether-helm-oci");
            c.env("HELM_CACHE_HOME", home.join("cache"))
                .env("HELM_CONFIG_HOME", home.join("config"))
                .env("HELM_DATA_HOME", home.join("data"));
        };
        let mut package = Command::new(helm);
        package.args([
            "package",
            &chart_dir.display().to_string(),
            "-d",
            &out.path().display().to_string(),
        ]);
        helm_env(&mut package);
        let o = package.output().expect("helm package");
        assert!(o.status.success(), "helm package: {o:?}");
        let tgz = std::fs::read_dir(out.path())
            .expect("packaged")
            .filter_map(Result::ok)
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|x| x == "tgz"))
            .expect("a .tgz");
        let mut push = Command::new(helm);
        push.args(["push", &tgz.display().to_string(), &self.charts(), "--plain-http"]);
        helm_env(&mut push);
        let o = push.output().expect("helm push");
        assert!(o.status.success(), "helm push: {o:?}");
        let name = chart_dir.file_name().expect("chart name").to_string_lossy();
        format!("{}/{name}", self.charts())
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
