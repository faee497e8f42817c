//! A running test cluster's processes: stopping, restarting and pausing them for fault tests,
//! changing what the API server serves with, and their logs.

use super::*;
use nix::sys::signal::Signal;

impl TestCluster {
    /// Makes every client this cluster hands out (admin, users, token kubeconfigs written from
    /// now on) trust `bundle` (PEM) to reach the API server: the clients' side of a serving CA
    /// rotation. Client certificates and ServiceAccount tokens stay the cluster CA's.
    pub async fn trust_serving_cas(&mut self, bundle: &str) -> Result<(), Error> {
        self.trusted = Some(bundle.to_string());
        let text = client_kubeconfig(
            &self.name,
            &self.url,
            bundle,
            &(self.pki.admin_cert.clone(), self.pki.admin_key.clone()),
        );
        write(&self.kubeconfig, &text)?;
        self.config = kube_config(&self.kubeconfig).await?;
        Ok(())
    }

    /// Restarts kube-apiserver with a serving certificate (same names and addresses) signed by
    /// `ca`, another CA than the cluster's, and waits until it is ready (trust `ca` first, with
    /// `trust_serving_cas`). The cluster CA still authenticates clients.
    pub async fn restart_api_server_serving(&mut self, ca: &Pki) -> Result<(), Error> {
        self.stop_api_server();
        let d = self.dir().to_path_buf();
        write(&d.join("serving.crt"), &ca.serving_cert)?;
        write(&d.join("serving.key"), &ca.serving_key)?;
        self.start_api_server().await
    }

    /// The process ID of `process` (`etcd`, `kube-apiserver`, `kube-controller-manager`), if running.
    pub fn pid(&self, process: &str) -> Option<u32> {
        self.procs.iter().find(|p| p.name() == process).map(Proc::pid)
    }

    /// The process IDs of every kube-apiserver (the first, then those `add_api_server` started).
    pub fn api_server_pids(&self) -> Vec<u32> {
        let mut apis: Vec<&Proc> = self
            .procs
            .iter()
            .filter(|p| p.name().starts_with("kube-apiserver"))
            .collect();
        apis.sort_by_key(|p| p.name().len());
        apis.into_iter().map(Proc::pid).collect()
    }

    /// Stops kube-controller-manager, e.g. to observe what happens without it.
    pub fn stop_controller_manager(&mut self) {
        self.procs.retain(|p| p.name() != "kube-controller-manager");
    }

    /// Kills kube-apiserver (etcd keeps the data); `start_api_server` brings it back on the same
    /// address. For fault tests: clients see refused connections meanwhile.
    pub fn stop_api_server(&mut self) {
        self.procs.retain(|p| p.name() != "kube-apiserver");
    }

    /// Starts kube-apiserver again with the flags it first ran with and waits until it is ready.
    pub async fn start_api_server(&mut self) -> Result<(), Error> {
        let args = self.api_command.1.clone();
        self.spawn_api_server("kube-apiserver", &args)?;
        self.wait_ready().await
    }

    /// Spawns kube-apiserver as `name` with `args`, right after etcd in the list of processes,
    /// so teardown still stops them in reverse start order.
    fn spawn_api_server(&mut self, name: &str, args: &[std::ffi::OsString]) -> Result<(), Error> {
        let mut api = Command::new(&self.api_command.0);
        api.args(args);
        let proc = Proc::spawn(name, api, self.dir())?;
        let at = self
            .procs
            .iter()
            .position(|p| p.name() == "etcd")
            .map_or(0, |i| i + 1);
        self.procs.insert(at, proc);
        Ok(())
    }

    /// Starts one more kube-apiserver of this control plane, as a highly available control plane
    /// runs several: the same etcd, certificates and flags, another free port on the same
    /// address. Waits until it is ready; returns an admin client of it and its URL. It is
    /// `kube-apiserver-<k>` (k = 2, 3, …) to `pid` and in the logs, and stops with the cluster
    /// (`stop_api_server` stops only the first). NB: a benchmark uses it to spread N members'
    /// tunnels: kube-apiserver holds two open files per tunnel it proxies, and one process here
    /// may hold at most the sandbox's hard limit.
    pub async fn add_api_server(&mut self) -> Result<(Client, String), Error> {
        let port = free_port()?;
        let args: Vec<std::ffi::OsString> = self
            .api_command
            .1
            .iter()
            .map(|a| match a.to_str() {
                Some(a) if a.starts_with("--secure-port=") => format!("--secure-port={port}").into(),
                _ => a.clone(),
            })
            .collect();
        let url = match self.url.rsplit_once(':') {
            Some((host, _)) => format!("{host}:{port}"),
            None => {
                return Err(Error::NotReady {
                    name: self.name.clone(),
                    what: format!("no port in the API server URL {}", self.url),
                });
            }
        };
        // NB: counted apart from the first, which a fault test may have stopped meanwhile.
        let k = 2 + self
            .procs
            .iter()
            .filter(|p| p.name().starts_with("kube-apiserver-"))
            .count();
        self.spawn_api_server(&format!("kube-apiserver-{k}"), &args)?;
        let mut config = self.config();
        config.cluster_url = url
            .parse()
            .map_err(|e| Error::Kubeconfig(format!("{url}: {e}")))?;
        let client = Client::try_from(config).map_err(Error::Client)?;
        self.wait_ready_at(client.clone()).await?;
        Ok((client, url))
    }

    /// Freezes etcd (SIGSTOP): the API server stays up but every read and write hangs until
    /// `resume_etcd`.
    pub fn pause_etcd(&self) -> Result<(), Error> {
        self.signal_etcd(Signal::SIGSTOP)
    }

    /// Lets a paused etcd run again (SIGCONT).
    pub fn resume_etcd(&self) -> Result<(), Error> {
        self.signal_etcd(Signal::SIGCONT)
    }

    fn signal_etcd(&self, signal: Signal) -> Result<(), Error> {
        let etcd = self.procs.iter().find(|p| p.name() == "etcd");
        let etcd = etcd.ok_or_else(|| Error::NotReady {
            name: self.name.clone(),
            what: "etcd is not running".into(),
        })?;
        etcd.signal(signal).map_err(|e| Error::NotReady {
            name: self.name.clone(),
            what: format!("cannot send {signal} to etcd: {e}"),
        })
    }

    /// The whole log of process `name` (`kube-apiserver`, `etcd`, …) as it is now.
    pub fn log_of(&self, name: &str) -> String {
        self.procs
            .iter()
            .find(|p| p.name() == name)
            .and_then(|p| std::fs::read_to_string(p.log()).ok())
            .unwrap_or_default()
    }

    /// The last lines of every process log, for a failure message.
    pub fn logs(&self, lines: usize) -> String {
        let mut out = String::new();
        for p in &self.procs {
            let _ = writeln!(
                out,
                "----- {} ({}) -----\n{}",
                p.name(),
                p.log().display(),
                p.log_tail(lines)
            );
        }
        out
    }
}
