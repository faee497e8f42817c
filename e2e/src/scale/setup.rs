//! Starting a benchmark: the control plane, the leader as its own process, the simulated
//! fleet's join settings, and waiting for the set's counts.

use std::time::{Duration, Instant};

use kube::Client;
use kube::api::Api;
use tether_api::ClusterSet;
use tether_sim::{Fleet, Join};
use tether_testkit::TestCluster;

use crate::fleet::LeaderSide;
use crate::sim::{HOME, SET, join_token};

use tether_api::clusterset::{InventoryNamespace, InventorySpec};

use super::*;
use crate::fleet::policy;

/// A leader under test, its process list, the fleet that joins it, and the approval watch.
pub(super) struct Setup {
    pub(super) leader: LeaderSide,
    pub(super) procs: Vec<(&'static str, u32)>,
    pub(super) fleet: Fleet,
    pub(super) approvals: Approvals,
    pub(super) api_limit: f64,
    pub(super) interval: u64,
    pub(super) grace: u64,
}

/// Starts the control plane, measures its write limit, picks the heartbeat interval from it,
/// starts the leader and connects a fleet (the leader publishes its CA shortly after it starts).
pub(super) async fn start(settings: &Settings) -> Setup {
    let n = settings.members;
    let cluster = TestCluster::builder(&format!("scale-{n}"))
        .start()
        .await
        .expect("control plane");
    let admin = cluster.client().expect("admin");
    eprintln!(
        "== [{n}] measuring the API server's limit for small writes ({:?})",
        settings.limit_window
    );
    let api_limit = write_limit(&admin, settings.limit_window).await;
    eprintln!("   {api_limit:.0} writes/s");
    let interval = settings.interval.unwrap_or_else(|| {
        INTERVALS
            .into_iter()
            .find(|i| n as f64 / *i as f64 <= api_limit * HEARTBEAT_SHARE)
            .unwrap_or(INTERVALS[INTERVALS.len() - 1])
    });
    let grace = interval * 4;
    let mut leader_spec = policy(&format!("{interval}s"), &format!("{grace}s"));
    if let Some(ttl) = settings.credential_ttl {
        leader_spec.credential_ttl = ttl.into();
    }
    let mut extra = vec![];
    if settings.cluster_profiles {
        crate::install_cluster_profile_crd(&admin)
            .await
            .expect("ClusterProfile CRD");
        crate::allow_inventory(&admin, &[INVENTORY])
            .await
            .expect("inventory RBAC");
        leader_spec.inventory = Some(InventorySpec {
            namespaces: vec![InventoryNamespace(INVENTORY.into())],
        });
        extra.push("--cluster-profiles");
    }
    let leader = LeaderSide::on(cluster)
        .policy(leader_spec)
        .args(&extra)
        .start()
        .await;
    let procs = processes(&leader);
    let token = join_token(&leader.admin).await;
    let join = sim_join(&leader, &token);
    let deadline = Instant::now() + Duration::from_secs(30);
    let fleet = loop {
        match Fleet::connect(join.clone()).await {
            Ok(f) => break f,
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("connect to the leader: {e}"),
        }
    };
    let approvals = watch_approvals(&leader.admin);
    tokio::time::sleep(Duration::from_secs(1)).await;
    Setup {
        leader,
        procs,
        fleet,
        approvals,
        api_limit,
        interval,
        grace,
    }
}

/// Keeps the leader's log and metrics in `target/scale-bench/`, fails on any RBAC refusal, and
/// returns the leader's reconcile error count.
pub(super) async fn keep_leader_output(leader: &LeaderSide, n: usize) -> u64 {
    let log = leader.controller.log();
    let (_, metrics) = leader
        .controller
        .admin_get("/metrics")
        .await
        .expect("leader /metrics");
    let reconcile_errors = metrics
        .lines()
        .filter(|l| l.starts_with("tether_leader_reconcile_errors_total{"))
        .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
        .sum::<f64>() as u64;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/scale-bench");
    let _ = std::fs::create_dir_all(&dir);
    let _ = std::fs::write(dir.join(format!("leader-{n}.log")), &log);
    let _ = std::fs::write(dir.join(format!("leader-{n}.metrics")), &metrics);
    assert!(
        !log.contains("forbidden"),
        "the leader was refused something:\n{}",
        leader.controller.log_tail(40)
    );
    reconcile_errors
}

/// The processes whose CPU is measured.
pub(super) fn processes(leader: &LeaderSide) -> Vec<(&'static str, u32)> {
    let mut out = vec![("tether leader", leader.controller.pid())];
    for p in ["kube-apiserver", "etcd", "kube-controller-manager"] {
        if let Some(pid) = leader.cluster.pid(p) {
            out.push((p, pid));
        }
    }
    out.push(("tether-sim (all members)", std::process::id()));
    out
}

pub(crate) async fn set_counts(admin: &Client) -> Option<(usize, usize)> {
    let set = Api::<ClusterSet>::namespaced(admin.clone(), HOME)
        .get(SET)
        .await
        .ok()?;
    let m = set.status?.members?;
    Some((m.total as usize, m.ready as usize))
}

pub(crate) async fn wait_for_counts(admin: &Client, total: usize, ready: usize, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let now = set_counts(admin).await;
        if now == Some((total, ready)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "ClusterSet counts {now:?}, want total {total} ready {ready} within {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// How `tether-sim`'s fleet joins `leader` with `token` (registrations may wait 15 minutes).
pub fn sim_join(leader: &LeaderSide, token: &tether_testkit::BootstrapToken) -> Join {
    Join {
        leader_url: leader.cluster.url().to_string(),
        ca_cert_hash: leader.cluster.ca_cert_hash().to_string(),
        token: token.token(),
        namespace: HOME.into(),
        registration_timeout: Duration::from_secs(900),
    }
}
