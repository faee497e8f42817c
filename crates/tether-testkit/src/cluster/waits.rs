//! Waiting for a test cluster: its API server ready, its controllers running, its nodes started
//! and Ready, and every process still alive meanwhile.

use super::*;

impl TestCluster {
    pub(super) async fn start_nodes(&mut self, opts: &ClusterBuilder, tools: &Tools) -> Result<(), Error> {
        let d = self.dir().to_path_buf();
        let missing: Vec<&str> = ["kube-scheduler", "kubelet", "kube-proxy"]
            .into_iter()
            .filter(|t| !tools.path(t).is_file())
            .collect();
        if !missing.is_empty() {
            return Err(Error::ToolsMissing {
                dir: tools.dir().to_path_buf(),
                missing: missing.join(", "),
            });
        }
        crate::node::image_archives()?;
        let mut scheduler = Command::new(tools.path("kube-scheduler"));
        scheduler.args(scheduler_args(&Layout::new(&d)));
        self.procs.push(Proc::spawn("kube-scheduler", scheduler, &d)?);
        for i in 0..opts.nodes {
            let name = format!("{}-node-{i}", self.name);
            let spec = NodeSpec {
                cluster_dir: &d,
                kubelet_cert: self
                    .pki
                    .client_cert(&format!("system:node:{name}"), Some("system:nodes"))?,
                proxy_cert: self.pki.client_cert("system:kube-proxy", None)?,
                name,
                url: &self.url,
                ca_pem: self.ca_pem(),
                detachable: opts.root.is_some(),
            };
            self.nodes.push(Node::start(spec, tools)?);
        }
        self.wait_nodes_ready().await
    }

    /// Waits until every node of the cluster reports Ready.
    pub(super) async fn wait_nodes_ready(&mut self) -> Result<(), Error> {
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(self.client()?);
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            self.check_alive()?;
            for n in &mut self.nodes {
                if let Some(status) = n.exited() {
                    return Err(Error::Exited {
                        name: n.name().to_string(),
                        status,
                        log: n.logs(30),
                    });
                }
            }
            let ready = nodes
                .list(&Default::default())
                .await
                .map(|l| {
                    l.items
                        .iter()
                        .filter(|n| {
                            n.status
                                .as_ref()
                                .and_then(|s| s.conditions.as_ref())
                                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
                        })
                        .count()
                })
                .unwrap_or(0);
            if ready == self.nodes.len() {
                return Ok(());
            }
            if Instant::now() > deadline {
                let logs: String = self.nodes.iter().map(|n| n.logs(30)).collect();
                return Err(Error::NotReady {
                    name: self.name.clone(),
                    what: format!("{ready} of {} nodes Ready; node logs:\n{logs}", self.nodes.len()),
                });
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    pub(super) async fn wait_ready(&mut self) -> Result<(), Error> {
        let client = self.client()?;
        self.wait_ready_at(client).await
    }

    /// Waits until the API server that `client` reaches answers `/readyz` with `ok`.
    pub(super) async fn wait_ready_at(&mut self, client: Client) -> Result<(), Error> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut last;
        loop {
            self.check_alive()?;
            let req = http::Request::get("/readyz")
                .body(Vec::new())
                .map_err(|e| Error::NotReady {
                    name: self.name.clone(),
                    what: e.to_string(),
                })?;
            match client.request_text(req).await {
                Ok(body) if body.trim() == "ok" => return Ok(()),
                Ok(body) => last = body,
                Err(err) => last = err.to_string(),
            }
            if Instant::now() > deadline {
                return Err(Error::NotReady {
                    name: self.name.clone(),
                    what: format!("/readyz: {last}"),
                });
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    pub(super) async fn wait_controllers(&mut self) -> Result<(), Error> {
        let cms: Api<ConfigMap> = Api::namespaced(self.client()?, "default");
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            self.check_alive()?;
            if let Ok(Some(_)) = cms.get_opt("kube-root-ca.crt").await {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::NotReady {
                    name: self.name.clone(),
                    what: "kube-controller-manager did not publish default/kube-root-ca.crt".into(),
                });
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Fails with the log tail of the first process that exited.
    pub(super) fn check_alive(&mut self) -> Result<(), Error> {
        for p in &mut self.procs {
            if let Some(status) = p.exited() {
                let log = p.log_tail(30);
                if log.contains("address already in use") {
                    return Err(Error::PortInUse {
                        name: p.name().to_string(),
                    });
                }
                return Err(Error::Exited {
                    name: p.name().to_string(),
                    status,
                    log,
                });
            }
        }
        Ok(())
    }
}
