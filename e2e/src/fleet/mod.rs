//! A leader and member clusters with both controllers running as real `tether-controller`
//! processes, each with a token of its own ServiceAccount (exactly `config/rbac/*.yaml`). The
//! leader controller itself publishes its CA in `kube-public/cluster-info` for anonymous readers.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Node, Secret};
use kube::api::{Api, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tether_api::clusterset::LeaderSpec;
use tether_api::{ClusterRegistrationRequest, ClusterSet};
use tether_testkit::{
    BootstrapToken, Controller, TestCluster, eventually, install_tether_crds, token_kubeconfig,
};

use crate::sim::{HOME, SET, Site, install_leader, leader_token};

mod status;
use crate::{apply_rbac_file, service_account_token};
pub use status::{heartbeat_time, managed, nodes, ready, renewed_after, wait_mc, wait_ready};

/// The leader side: cluster, admin client, the leader process.
pub struct LeaderSide {
    /// The leader cluster.
    pub cluster: TestCluster,
    /// Admin client.
    pub admin: Client,
    /// The running leader controller.
    pub controller: Controller,
}

/// A set's leader policy for a test: heartbeat interval and grace period as a set writes them
/// (`policy("2s", "6s")`); the rest is the default, or set with struct update syntax.
pub fn policy(heartbeat: &str, grace: &str) -> LeaderSpec {
    LeaderSpec {
        heartbeat_interval: duration(heartbeat),
        grace_period: duration(grace),
        ..LeaderSpec::default()
    }
}

/// A duration as a set writes it (`10m`, `2s`).
pub fn duration(text: &str) -> kube::core::Duration {
    text.parse()
        .unwrap_or_else(|e| panic!("a duration in a test: {text}: {e}"))
}

/// How a test's leader starts: `LeaderSide::named(name)` or `LeaderSide::on(cluster)`, then
/// `policy` (without one, no ClusterSet and no join RBAC, as before `tether init`), `proxy`
/// (member access served on an address, Lease election on), `args`, and `start`.
pub struct LeaderBuilder {
    site: Site,
    policy: Option<LeaderSpec>,
    proxy: Option<(std::net::SocketAddr, u64)>,
    args: Vec<String>,
}

impl LeaderSide {
    /// A leader on a new cluster named `name` (audit log on).
    pub fn named(name: &str) -> LeaderBuilder {
        LeaderBuilder::new(Site::Named(name.to_string()))
    }

    /// A leader on `cluster`.
    pub fn on(cluster: TestCluster) -> LeaderBuilder {
        LeaderBuilder::new(Site::Started(Box::new(cluster)))
    }
}

impl LeaderBuilder {
    fn new(site: Site) -> Self {
        Self {
            site,
            policy: None,
            proxy: None,
            args: Vec::new(),
        }
    }

    /// The `prod` set, with this policy, and its join RBAC.
    pub fn policy(mut self, spec: LeaderSpec) -> Self {
        self.policy = Some(spec);
        self
    }

    /// Member access: `config/proxy/leader-proxy.yaml` applied, and the first replica
    /// (`leader-a`, Lease election on, lease `lease_seconds`) serving on `addr`.
    pub fn proxy(mut self, addr: std::net::SocketAddr, lease_seconds: u64) -> Self {
        self.proxy = Some((addr, lease_seconds));
        self
    }

    /// More flags of the leader process.
    pub fn args(mut self, args: &[&str]) -> Self {
        self.args.extend(args.iter().map(|a| a.to_string()));
        self
    }

    /// Starts the cluster if needed, installs Tether's leader side and runs the leader binary
    /// as its ServiceAccount.
    pub async fn start(self) -> LeaderSide {
        let cluster = match self.site {
            Site::Started(c) => *c,
            Site::Named(name) => TestCluster::builder(&name)
                .audit_log(true)
                .start()
                .await
                .expect("leader cluster"),
        };
        let extra: Vec<&str> = self.args.iter().map(String::as_str).collect();
        let args = match self.proxy {
            Some((addr, lease)) => proxy_args(addr, lease, &extra),
            None => ["leader", "--leader-elect=false"]
                .into_iter()
                .chain(extra)
                .map(str::to_string)
                .collect(),
        };
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        leader_process(cluster, self.policy.as_ref(), &args, self.proxy.is_some()).await
    }
}

/// The flags of a leader replica serving member access on `proxy_addr`, and `extra`.
pub fn proxy_args(proxy_addr: std::net::SocketAddr, lease_seconds: u64, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = vec![
        "leader".into(),
        "--leader-elect=true".into(),
        format!("--lease-duration={lease_seconds}"),
        format!("--proxy-addr={proxy_addr}"),
        format!("--proxy-advertise-address={}", proxy_addr.ip()),
    ];
    args.extend(extra.iter().map(|a| a.to_string()));
    args
}

impl LeaderSide {
    /// Starts another leader replica as the leader's ServiceAccount with `args`.
    pub async fn start_replica(&self, identity: &str, args: &[String]) -> Controller {
        let token = leader_token(&self.admin).await;
        let kubeconfig = token_kubeconfig(&self.cluster, identity, &token).expect("kubeconfig");
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Controller::start(&self.cluster, identity, &kubeconfig, &args).expect("leader replica")
    }
}

async fn leader_process(
    cluster: TestCluster,
    policy: Option<&LeaderSpec>,
    args: &[&str],
    proxy: bool,
) -> LeaderSide {
    crate::init_logs();
    let admin = match policy {
        Some(policy) => install_leader(&cluster, policy).await,
        None => crate::sim::install_leader_base(&cluster).await,
    };
    if proxy {
        crate::apply_config_file(&admin, "proxy/leader-proxy.yaml")
            .await
            .expect("member access objects");
    }
    let token = leader_token(&admin).await;
    let name = if proxy { "leader-a" } else { "tether-leader" };
    let kubeconfig = token_kubeconfig(&cluster, name, &token).expect("kubeconfig");
    let controller = Controller::start(&cluster, name, &kubeconfig, args).expect("leader process");
    LeaderSide {
        cluster,
        admin,
        controller,
    }
}

/// A member cluster with its agent.
pub struct MemberSide {
    /// The member cluster (no controller-manager: nothing there changes on its own).
    pub cluster: TestCluster,
    /// Admin client.
    pub admin: Client,
    /// The agent process (None while stopped).
    pub agent: Option<Controller>,
    /// The agent's kubeconfig (its own ServiceAccount).
    kubeconfig: std::path::PathBuf,
    /// Extra agent flags, kept across restarts.
    agent_args: Vec<String>,
}

/// Starts a member cluster with Tether's CRDs and the agent RBAC, and writes the join token Secret
/// and the Member ClusterSet (`member_spec` is merged over a spec pointing at `leader`).
pub async fn member(
    name: &str,
    leader: &LeaderSide,
    token: &BootstrapToken,
    member_spec: serde_json::Value,
) -> MemberSide {
    member_with_args(name, leader, token, member_spec, &[]).await
}

/// As `member`, with extra agent flags (e.g. the impersonation allow-list).
pub async fn member_with_args(
    name: &str,
    leader: &LeaderSide,
    token: &BootstrapToken,
    member_spec: serde_json::Value,
    agent_args: &[&str],
) -> MemberSide {
    member_on(member_cluster(name), leader, token, member_spec, agent_args).await
}

/// As `member_with_args`, on a cluster of the caller's options (e.g. another Kubernetes version).
pub async fn member_on(
    cluster: tether_testkit::ClusterBuilder,
    leader: &LeaderSide,
    token: &BootstrapToken,
    member_spec: serde_json::Value,
    agent_args: &[&str],
) -> MemberSide {
    let mut m = bare_member_on(cluster).await;
    m.agent_args = agent_args.iter().map(|a| a.to_string()).collect();
    write_membership(&m, leader, token, member_spec).await;
    m.start_agent();
    m
}

/// Writes the join token Secret and the Member ClusterSet into `m`, as `member` does (no agent).
pub async fn write_membership(
    m: &MemberSide,
    leader: &LeaderSide,
    token: &BootstrapToken,
    member_spec: serde_json::Value,
) {
    let name = m.cluster.name().to_string();
    let admin = m.admin.clone();
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some("tether-join-token".into()),
            namespace: Some(HOME.into()),
            ..ObjectMeta::default()
        },
        string_data: Some(BTreeMap::from([("token".to_string(), token.token())])),
        ..Secret::default()
    };
    Api::<Secret>::namespaced(admin.clone(), HOME)
        .create(&PostParams::default(), &secret)
        .await
        .expect("join token Secret");
    let mut spec = json!({"leaderURL": leader.cluster.url(), "caCertHash": leader.cluster.ca_cert_hash(),
                          "joinTokenSecretRef": {"name": "tether-join-token"}, "clusterName": &name});
    if let (Some(base), Some(extra)) = (spec.as_object_mut(), member_spec.as_object()) {
        base.extend(extra.clone());
    }
    let set = json!({"apiVersion": "multicluster.tether.dev/v1alpha1", "kind": "ClusterSet",
                     "metadata": {"name": SET}, "spec": {"role": "Member", "member": spec}});
    crate::create_raw::<ClusterSet>(&admin, Some(HOME), set)
        .await
        .expect("Member ClusterSet");
}

/// A member cluster with the CRDs and the agent's RBAC but no ClusterSet and no agent running yet.
pub async fn bare_member(name: &str) -> MemberSide {
    bare_member_on(member_cluster(name)).await
}

/// A member cluster's options: no controller manager (the agent needs none), an audit log.
pub fn member_cluster(name: &str) -> tether_testkit::ClusterBuilder {
    TestCluster::builder(name)
        .controller_manager(false)
        .audit_log(true)
}

/// As `bare_member`, on a cluster of the caller's options.
pub async fn bare_member_on(cluster: tether_testkit::ClusterBuilder) -> MemberSide {
    let cluster = cluster.start().await.expect("member cluster");
    let admin = cluster.client().expect("admin");
    install_tether_crds(&admin).await.expect("crds");
    apply_rbac_file(&admin, "agent.yaml").await.expect("agent RBAC");
    let token = service_account_token(&admin, HOME, "tether-agent")
        .await
        .expect("agent token");
    let kubeconfig = token_kubeconfig(&cluster, "tether-agent", &token).expect("kubeconfig");
    MemberSide {
        cluster,
        admin,
        agent: None,
        kubeconfig,
        agent_args: Vec::new(),
    }
}

impl MemberSide {
    /// Starts the agent process.
    pub fn start_agent(&mut self) {
        let mut args = vec![
            "agent",
            "--leader-elect=false",
            "--lease-namespace=tether-system",
            "--leave-timeout=20s",
        ];
        args.extend(self.agent_args.iter().map(String::as_str));
        let agent =
            Controller::start(&self.cluster, "tether-agent", &self.kubeconfig, &args).expect("agent process");
        self.agent = Some(agent);
    }

    /// Starts one agent replica of several: leader election on, in the Lease `tether-agent`.
    pub fn start_replica(&self, identity: &str, lease_seconds: u64) -> Controller {
        Controller::start(
            &self.cluster,
            identity,
            &self.kubeconfig,
            &[
                "agent",
                "--leader-elect=true",
                &format!("--lease-duration={lease_seconds}"),
                "--lease-namespace=tether-system",
                "--leave-timeout=20s",
            ],
        )
        .expect("agent replica")
    }

    /// Kills the agent process.
    pub fn kill_agent(&mut self) {
        if let Some(mut a) = self.agent.take() {
            a.kill();
        }
    }

    /// Waits until the member says its join token expired and what to do about it
    /// (`Registered=False`, `JoinTokenExpired`, naming `tether token create`).
    pub async fn wait_join_token_expired(&self) {
        eventually(
            "Registered=False/JoinTokenExpired with what to do",
            Duration::from_secs(60),
            || async {
                let s = self.set().await.and_then(|s| s.status).ok_or("no status")?;
                let c = tether_api::conditions::find(
                    &s.conditions,
                    tether_api::conditions::ConditionType::Registered,
                )
                .ok_or("no condition")?;
                if c.status == "False"
                    && c.reason == "JoinTokenExpired"
                    && c.message.contains("tether token create")
                {
                    Ok(())
                } else {
                    Err(format!("{c:?}"))
                }
            },
        )
        .await;
    }

    /// The member's Member ClusterSet.
    pub async fn set(&self) -> Option<ClusterSet> {
        Api::<ClusterSet>::namespaced(self.admin.clone(), HOME)
            .get_opt(SET)
            .await
            .expect("get set")
    }
}

/// Creates a Ready node with `cpu` and `memory` capacity (allocatable the same).
pub async fn add_node(admin: &Client, name: &str, cpu: &str, memory: &str) {
    let api = Api::<Node>::all(admin.clone());
    let node: Node =
        serde_json::from_value(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}))
            .expect("node");
    api.create(&PostParams::default(), &node)
        .await
        .expect("create node");
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let resources = json!({"cpu": cpu, "memory": memory, "pods": "110"});
    let status = json!({"status": {"capacity": resources, "allocatable": resources,
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "simulated",
                        "lastHeartbeatTime": now, "lastTransitionTime": now}]}});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(status))
        .await
        .expect("node status");
}

/// Audit events of the leader cluster matching `keep`, as JSON.
pub fn audit_events(
    cluster: &TestCluster,
    keep: impl Fn(&serde_json::Value) -> bool,
) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(cluster.audit_log()).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["stage"] == "ResponseComplete")
        .filter(|e| keep(e))
        .collect()
}

/// When member `m`'s stored leader credential expires.
pub async fn credential_expiry(m: &MemberSide) -> k8s_openapi::jiff::Timestamp {
    let s = Api::<Secret>::namespaced(m.admin.clone(), HOME)
        .get(tether_agent::state::CREDENTIAL_SECRET)
        .await
        .expect("credential Secret");
    tether_agent::state::secret_text(&s, "expiration")
        .and_then(|t| t.parse().ok())
        .expect("expiration")
}

/// How many registration requests the leader holds for cluster ID `id`.
pub async fn requests_for(admin: &Client, id: &str) -> usize {
    Api::<ClusterRegistrationRequest>::namespaced(admin.clone(), HOME)
        .list(&ListParams::default())
        .await
        .expect("requests")
        .items
        .iter()
        .filter(|r| r.spec.cluster_id == id)
        .count()
}

/// The UID of the member's `kube-system` namespace (the default cluster ID).
pub async fn kube_system_uid(m: &MemberSide) -> String {
    Api::<Namespace>::all(m.admin.clone())
        .get("kube-system")
        .await
        .expect("ns")
        .uid()
        .expect("uid")
}
