//! A leader cluster with Tether installed and simulated members that do what an agent does on
//! the wire: register with a bootstrap token and an X25519 key, unseal their credential, then
//! heartbeat and leave with it. The leader controller runs as its own ServiceAccount with exactly
//! `config/rbac/leader.yaml`, in this process (`leader`) or as the real binary (see the tests).

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tether_api::SetRef;
use tether_api::clusterset::{ApprovalMode, ApprovalPolicy, LeaderSpec, MemberCounts};
use tether_api::registration::RegistrationResult;
use tether_api::{ClusterRegistrationRequest, ClusterSet, ManagedCluster, MemberClusterAnnounce};
use tether_seal::MemberCredential;
use tether_testkit::{BootstrapToken, CreateToken, TestCluster, eventually, install_tether_crds};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::{apply_rbac_file, create_raw, service_account_token};

/// The leader's home namespace in the tests.
pub const HOME: &str = "tether-system";
/// The ClusterSet the tests use.
pub const SET: &str = "prod";

/// A leader cluster with the CRDs, the leader's RBAC, the join RBAC and a `prod` ClusterSet
/// whose `spec.leader` is `policy`.
pub async fn leader_cluster(name: &str, policy: &LeaderSpec) -> (TestCluster, Client) {
    let cluster = TestCluster::start(name).await.expect("cluster");
    let admin = install_leader(&cluster, policy).await;
    (cluster, admin)
}

/// Installs Tether's leader side in `cluster` (as `leader_cluster` does); returns an admin client.
pub async fn install_leader(cluster: &TestCluster, policy: &LeaderSpec) -> Client {
    let admin = install_leader_base(cluster).await;
    let set = json!({"apiVersion": "multicluster.tether.dev/v1alpha1", "kind": "ClusterSet",
                     "metadata": {"name": SET}, "spec": {"role": "Leader", "leader": policy}});
    create_raw::<ClusterSet>(&admin, Some(HOME), set)
        .await
        .expect("ClusterSet");
    crate::join_role(&admin, &home()).await.expect("join RBAC");
    admin
}

/// Tether's CRDs, the leader's RBAC and its admission policy, as the leader chart installs
/// them; an admin client of `cluster`.
pub async fn install_leader_base(cluster: &TestCluster) -> Client {
    let admin = cluster.client().expect("admin");
    install_tether_crds(&admin).await.expect("crds");
    apply_rbac_file(&admin, "leader.yaml").await.expect("leader RBAC");
    crate::apply_config_file(&admin, crate::LEADER_POLICY)
        .await
        .expect("leader admission policy");
    admin
}

/// A set's leader policy with this approval mode; the rest is the default.
pub fn approving(mode: ApprovalMode) -> LeaderSpec {
    LeaderSpec {
        approval: ApprovalPolicy {
            mode,
            allowed_clusters: None,
        },
        ..LeaderSpec::default()
    }
}

/// A token of the leader's ServiceAccount (what its pod would use).
pub async fn leader_token(admin: &Client) -> String {
    service_account_token(admin, HOME, "tether-leader")
        .await
        .expect("leader token")
}

/// A leader cluster with the leader controller running in this process.
pub struct Leader {
    /// The leader cluster.
    pub cluster: TestCluster,
    /// An admin client of it.
    pub admin: Client,
    /// The controller's metrics.
    pub metrics: tether_leader::Metrics,
    leading: watch::Sender<bool>,
    stop: CancellationToken,
}

impl Drop for Leader {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Where a test's leader runs: a new cluster of this name, or one the caller started.
pub(crate) enum Site {
    /// A new cluster of this name.
    Named(String),
    /// One the caller started.
    Started(Box<TestCluster>),
}

/// How an in-process leader starts: `Leader::named(name)` or `Leader::on(cluster)`, then
/// `policy` (the `prod` set's; the default otherwise), `denied_retention`,
/// `approved_retention`, and `start`.
pub struct InProcess {
    site: Site,
    policy: LeaderSpec,
    denied_retention: Duration,
    approved_retention: Duration,
}

impl InProcess {
    /// The `prod` set's leader policy.
    pub fn policy(mut self, spec: LeaderSpec) -> Self {
        self.policy = spec;
        self
    }

    /// Denied requests are kept only this long (the flag's default: 1 h).
    pub fn denied_retention(mut self, retention: Duration) -> Self {
        self.denied_retention = retention;
        self
    }

    /// Approved requests are kept only this long (the flag's default: 1 h).
    pub fn approved_retention(mut self, retention: Duration) -> Self {
        self.approved_retention = retention;
        self
    }

    /// Starts the cluster if needed, installs Tether's leader side and runs the controller in
    /// this process as the leader's ServiceAccount.
    pub async fn start(self) -> Leader {
        let cluster = match self.site {
            Site::Started(c) => *c,
            Site::Named(name) => TestCluster::start(&name).await.expect("cluster"),
        };
        Leader::run(
            cluster,
            &self.policy,
            self.denied_retention,
            self.approved_retention,
        )
        .await
    }
}

impl Leader {
    /// A leader on a new cluster named `name`.
    pub fn named(name: &str) -> InProcess {
        Self::at(Site::Named(name.to_string()))
    }

    /// A leader on `cluster`.
    pub fn on(cluster: TestCluster) -> InProcess {
        Self::at(Site::Started(Box::new(cluster)))
    }

    fn at(site: Site) -> InProcess {
        InProcess {
            site,
            policy: LeaderSpec::default(),
            denied_retention: Duration::from_secs(3600),
            approved_retention: Duration::from_secs(3600),
        }
    }

    async fn run(
        cluster: TestCluster,
        policy: &LeaderSpec,
        denied_retention: Duration,
        approved_retention: Duration,
    ) -> Self {
        crate::init_logs();
        let admin = install_leader(&cluster, policy).await;
        let as_leader = cluster
            .client_with_token(&leader_token(&admin).await)
            .expect("leader client");
        let (leading, leader) = watch::channel(true);
        let (ready, _) = watch::channel(false);
        let metrics = tether_leader::Metrics::default();
        let stop = CancellationToken::new();
        let opts = tether_leader::Options {
            leader_ca: cluster.ca_pem().to_string(),
            instance: Some("test".into()),
            leader,
            ready,
            metrics: metrics.clone(),
            leader_url: cluster.url().to_string(),
            proxy: None,
            denied_retention,
            approved_retention,
            cluster_profiles: false,
        };
        tokio::spawn(tether_leader::run(as_leader, opts, stop.clone()));
        Self {
            cluster,
            admin,
            metrics,
            leading,
            stop,
        }
    }

    /// Flips this replica's leadership, as the Lease would.
    pub fn set_leading(&self, leading: bool) {
        self.leading.send_replace(leading);
    }

    /// The `prod` ClusterSet as it is now.
    pub async fn set(&self) -> ClusterSet {
        Api::<ClusterSet>::namespaced(self.admin.clone(), HOME)
            .get(SET)
            .await
            .expect("ClusterSet")
    }
}

/// A simulated agent before it joins: a bootstrap token and an X25519 key pair.
pub struct Joiner {
    /// A client with the bootstrap token.
    pub client: Client,
    /// The private key.
    pub identity: String,
    /// The public key (age recipient).
    pub public_key: String,
}

/// The `prod` set in `tether-system`, the set most tests use.
pub fn home() -> SetRef {
    SetRef::new(HOME, SET)
}

/// The leader namespace of member `name` of the `prod` set.
pub fn ns_of(name: &str) -> String {
    tether_leader::naming::member_namespace(&home(), name)
}

/// A new bootstrap token of the `prod` set.
pub async fn join_token(admin: &Client) -> BootstrapToken {
    join_token_of(admin, &home()).await
}

/// A new bootstrap token of `set`, made as `tether token create` makes it.
pub async fn join_token_of(admin: &Client, set: &SetRef) -> BootstrapToken {
    let token = BootstrapToken::random();
    token
        .create(admin, Some(set), None)
        .await
        .expect("bootstrap token");
    token
}

/// A new joiner with its own bootstrap token: of the `prod` set, or of `set` with `.of(&set)`.
pub fn joiner<'a>(cluster: &'a TestCluster, admin: &'a Client) -> NewJoiner<'a> {
    NewJoiner {
        cluster,
        admin,
        set: home(),
    }
}

/// A joiner to be made (`joiner`); awaiting it makes the token and the key pair.
pub struct NewJoiner<'a> {
    cluster: &'a TestCluster,
    admin: &'a Client,
    set: SetRef,
}

impl NewJoiner<'_> {
    /// Of `set` instead of `prod`.
    pub fn of(mut self, set: &SetRef) -> Self {
        self.set = set.clone();
        self
    }
}

impl<'a> IntoFuture for NewJoiner<'a> {
    type Output = Joiner;
    type IntoFuture = Pin<Box<dyn Future<Output = Joiner> + Send + 'a>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let token = join_token_of(self.admin, &self.set).await;
            let (identity, public_key) = tether_seal::generate_keypair();
            Joiner {
                client: self.cluster.client_with_token(&token.token()).expect("client"),
                identity,
                public_key,
            }
        })
    }
}

/// Creates a registration request in the `prod` set and waits until it is decided.
pub async fn register(j: &Joiner, request: &str, name: &str, id: &str) -> ClusterRegistrationRequest {
    register_in(j, HOME, request, name, id).await
}

/// Creates the registration request `body` in namespace `ns` with `j`'s join token; a 401 of the
/// just-created token is retried as the agent does (`Settle::unauthorized`).
pub async fn create_request(j: &Joiner, ns: &str, body: serde_json::Value) {
    let mut unseen = tether_join::settle::Settle::unauthorized();
    loop {
        match create_raw::<ClusterRegistrationRequest>(&j.client, Some(ns), body.clone()).await {
            Ok(_) => return,
            Err(e) if unseen.tolerate(&e) => tokio::time::sleep(Duration::from_millis(200)).await,
            Err(e) => panic!("create request {}: {e}", body["metadata"]["name"]),
        }
    }
}

/// Creates a registration request in namespace `ns` and waits until it is decided. A 401 of the
/// just-created token is retried as the agent does (`Settle::unauthorized`).
pub async fn register_in(
    j: &Joiner,
    ns: &str,
    request: &str,
    name: &str,
    id: &str,
) -> ClusterRegistrationRequest {
    let body = json!({"apiVersion": "multicluster.tether.dev/v1alpha1", "kind": "ClusterRegistrationRequest",
                      "metadata": {"name": request},
                      "spec": {"clusterID": id, "clusterName": name, "publicKey": j.public_key}});
    create_request(j, ns, body).await;
    let api = Api::<ClusterRegistrationRequest>::namespaced(j.client.clone(), ns);
    eventually(
        &format!("request {request} to be decided"),
        Duration::from_secs(30),
        || async {
            let r = api.get(request).await.map_err(|e| e.to_string())?;
            match r.status.as_ref().map(|s| s.result) {
                Some(RegistrationResult::Pending) | None => Err(format!("{:?}", r.status)),
                _ => Ok(r),
            }
        },
    )
    .await
}

/// A joined member, talking to the leader only with its unsealed credential.
pub struct Member {
    /// Client with the member's own ServiceAccount token.
    pub client: Client,
    /// Its cluster name (its ManagedCluster's and announce's name).
    pub name: String,
    /// Its dedicated namespace.
    pub namespace: String,
    /// What it unsealed.
    pub credential: MemberCredential,
}

/// Joins `name`/`id` to the `prod` set, or to `set` with `.of(&set)`; awaiting it returns the
/// member once its credential is unsealed.
pub fn join<'a>(cluster: &'a TestCluster, admin: &'a Client, name: &str, id: &str) -> Joining<'a> {
    Joining {
        joiner: joiner(cluster, admin),
        name: name.to_string(),
        id: id.to_string(),
    }
}

/// A join to be made (`join`).
pub struct Joining<'a> {
    joiner: NewJoiner<'a>,
    name: String,
    id: String,
}

impl Joining<'_> {
    /// Into `set` instead of `prod`.
    pub fn of(mut self, set: &SetRef) -> Self {
        self.joiner = self.joiner.of(set);
        self
    }
}

impl<'a> IntoFuture for Joining<'a> {
    type Output = Member;
    type IntoFuture = Pin<Box<dyn Future<Output = Member> + Send + 'a>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let Joining { joiner, name, id } = self;
            let cluster = joiner.cluster;
            let ns = joiner.set.namespace.clone();
            let j = joiner.await;
            let req = register_in(&j, &ns, &format!("{name}-1"), &name, &id).await;
            let sealed = req
                .status
                .and_then(|s| s.credential)
                .unwrap_or_else(|| panic!("{name} was not approved"))
                .sealed;
            let credential = tether_seal::unseal(&sealed, &j.identity).expect("unseal");
            Member {
                client: cluster
                    .client_with_token(&credential.token)
                    .expect("member client"),
                name,
                namespace: credential.namespace.clone(),
                credential,
            }
        })
    }
}

impl Member {
    /// Renews its announce now (one small write, as the agent does).
    pub async fn heartbeat(&self) -> Result<(), kube::Error> {
        let now = Timestamp::now().to_string();
        Api::<MemberClusterAnnounce>::namespaced(self.client.clone(), &self.namespace)
            .patch(
                &self.name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"renewTime": now}})),
            )
            .await
            .map(drop)
    }

    /// Heartbeats every `interval` until the returned token is cancelled (or dropped).
    pub fn keep_heartbeating(self: &std::sync::Arc<Self>, interval: Duration) -> tokio_util::sync::DropGuard {
        let stop = CancellationToken::new();
        let me = self.clone();
        let token = stop.clone();
        tokio::spawn(async move {
            loop {
                let _ = me.heartbeat().await;
                tokio::select! {
                    _ = token.cancelled() => return,
                    _ = tokio::time::sleep(interval) => {}
                }
            }
        });
        stop.drop_guard()
    }

    /// Leaves: deletes its announce, as `tether leave` makes the agent do.
    pub async fn leave(&self) -> Result<(), kube::Error> {
        Api::<MemberClusterAnnounce>::namespaced(self.client.clone(), &self.namespace)
            .delete(&self.name, &DeleteParams::default())
            .await
            .map(drop)
    }
}

/// The Ready condition of a member's ManagedCluster: `(status, reason)`.
pub async fn ready(admin: &Client, namespace: &str, name: &str) -> Result<(String, String), String> {
    let mc = Api::<ManagedCluster>::namespaced(admin.clone(), namespace)
        .get(name)
        .await
        .map_err(|e| e.to_string())?;
    mc.status
        .unwrap_or_default()
        .conditions
        .into_iter()
        .find(|c| c.type_ == tether_api::conditions::ConditionType::Ready)
        .map(|c| (c.status, c.reason))
        .ok_or_else(|| format!("{} has no Ready condition", mc.metadata.name.unwrap_or_default()))
}

/// Waits until a member's Ready condition is `(status, reason)`.
pub async fn wait_ready(admin: &Client, m: &Member, status: &str, reason: &str, within: Duration) {
    eventually(
        &format!("{} Ready={status} ({reason})", m.name),
        within,
        || async {
            let got = ready(admin, &m.namespace, &m.name).await?;
            if got == (status.to_string(), reason.to_string()) {
                Ok(())
            } else {
                Err(format!("{got:?}"))
            }
        },
    )
    .await
}

/// The `prod` set's member counts.
pub async fn counts(admin: &Client) -> Result<MemberCounts, String> {
    let set = Api::<ClusterSet>::namespaced(admin.clone(), HOME)
        .get(SET)
        .await
        .map_err(|e| e.to_string())?;
    set.status.and_then(|s| s.members).ok_or_else(|| {
        format!(
            "{} has no member counts yet",
            set.metadata.name.unwrap_or_default()
        )
    })
}

/// Waits until the `prod` set's counts are `want`.
pub async fn wait_counts(admin: &Client, want: MemberCounts, within: Duration) {
    eventually(&format!("set counts {want:?}"), within, || async {
        let got = counts(admin).await?;
        if got == want {
            Ok(())
        } else {
            Err(format!("{got:?}"))
        }
    })
    .await
}

/// Names of a kind's objects, for assertions.
pub fn names<K: kube::Resource>(items: &[K]) -> Vec<String> {
    items.iter().map(|o| o.name_any()).collect()
}
