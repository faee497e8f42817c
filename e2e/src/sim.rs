//! A leader cluster with Tether installed and simulated members that do what an agent does on
//! the wire: register with a bootstrap token and an X25519 key, unseal their credential, then
//! heartbeat and leave with it. The leader controller runs as its own ServiceAccount with exactly
//! `config/rbac/leader.yaml`, in this process (`leader`) or as the real binary (see the tests).

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tether_api::SetRef;
use tether_api::clusterset::MemberCounts;
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
/// whose `spec.leader` is `leader_spec`.
pub async fn leader_cluster(name: &str, leader_spec: serde_json::Value) -> (TestCluster, Client) {
    let cluster = TestCluster::start(name).await.expect("cluster");
    let admin = install_leader(&cluster, leader_spec).await;
    (cluster, admin)
}

/// Installs Tether's leader side in `cluster` (as `leader_cluster` does); returns an admin client.
pub async fn install_leader(cluster: &TestCluster, leader_spec: serde_json::Value) -> Client {
    let admin = cluster.client().expect("admin");
    install_tether_crds(&admin).await.expect("crds");
    apply_rbac_file(&admin, "leader.yaml").await.expect("leader RBAC");
    crate::apply_config_file(&admin, crate::LEADER_POLICY)
        .await
        .expect("leader admission policy");
    let set = json!({"apiVersion": "multicluster.tether.dev/v1alpha1", "kind": "ClusterSet",
                     "metadata": {"name": SET}, "spec": {"role": "Leader", "leader": leader_spec}});
    create_raw::<ClusterSet>(&admin, Some(HOME), set)
        .await
        .expect("ClusterSet");
    crate::join_role(&admin, &home()).await.expect("join RBAC");
    admin
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

impl Leader {
    /// Starts a leader cluster and runs the controller in this process as the leader's ServiceAccount.
    pub async fn start(name: &str, leader_spec: serde_json::Value) -> Self {
        let cluster = TestCluster::start(name).await.expect("cluster");
        Self::run_in(cluster, leader_spec).await
    }

    /// As `start`, with denied requests kept only `denied_retention` (the flag's default: 1 h).
    pub async fn start_with_retention(
        name: &str,
        leader_spec: serde_json::Value,
        denied_retention: Duration,
    ) -> Self {
        let cluster = TestCluster::start(name).await.expect("cluster");
        Self::run_with(cluster, leader_spec, denied_retention).await
    }

    /// Installs Tether in a started cluster and runs the leader controller in this process.
    pub async fn run_in(cluster: TestCluster, leader_spec: serde_json::Value) -> Self {
        Self::run_with(cluster, leader_spec, Duration::from_secs(3600)).await
    }

    async fn run_with(
        cluster: TestCluster,
        leader_spec: serde_json::Value,
        denied_retention: Duration,
    ) -> Self {
        crate::init_logs();
        let admin = install_leader(&cluster, leader_spec).await;
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

/// A new joiner with its own bootstrap token of the `prod` set.
pub async fn joiner(cluster: &TestCluster, admin: &Client) -> Joiner {
    joiner_of(cluster, admin, &home()).await
}

/// A new joiner with its own bootstrap token of `set`.
pub async fn joiner_of(cluster: &TestCluster, admin: &Client, set: &SetRef) -> Joiner {
    let token = join_token_of(admin, set).await;
    let (identity, public_key) = tether_seal::generate_keypair();
    Joiner {
        client: cluster.client_with_token(&token.token()).expect("client"),
        identity,
        public_key,
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

/// Joins `name`/`id` to the `prod` set and returns the member.
pub async fn join(cluster: &TestCluster, admin: &Client, name: &str, id: &str) -> Member {
    join_in(cluster, admin, &home(), name, id).await
}

/// Joins `name`/`id` to `set` and returns the member.
pub async fn join_in(cluster: &TestCluster, admin: &Client, set: &SetRef, name: &str, id: &str) -> Member {
    let j = joiner_of(cluster, admin, set).await;
    let req = register_in(&j, &set.namespace, &format!("{name}-1"), name, id).await;
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
        name: name.into(),
        namespace: credential.namespace.clone(),
        credential,
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
