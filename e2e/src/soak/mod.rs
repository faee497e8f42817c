//! The soak (`make soak`): one real control plane, the leader as its own process, N members
//! simulated by `tether-sim`, for a set time, with faults injected at random, bounded
//! intervals: the leader process killed (and started again, as its Deployment would), the
//! leader's API server restarted, its etcd paused, a share of members stopped and started
//! again, members leaving and new ones joining. After each fault it measures how long until
//! the ClusterSet counts every expected member Ready again. At the end it prints members lost,
//! duplicate registrations, heartbeats failed, recovery p50/p99 per fault, writes per
//! heartbeat and the leader's memory and CPU, against the targets. The leader binary is the
//! one `TETHER_BIN_DIR` names; `make soak` points it at the image's static musl build (the
//! allocator users run) with the `heap-stats` counter, so that a leak is judged on the heap the
//! program holds and RSS is reported beside it.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use kube::Client;
use kube::api::{Api, ListParams};
use rand::Rng;
use rand::seq::SliceRandom;
use tether_api::{ClusterRegistrationRequest, ManagedCluster};
use tether_sim::{Fleet, Join, Member};
use tether_testkit::{TestCluster, token_kubeconfig};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::fleet::{LeaderSide, policy};
use crate::probe::prom::request_counts;
use crate::scale::wait_for_counts;
use crate::sim::{HOME, join_token, leader_token};

mod faults;
mod leader;
mod memory;
mod report;

use faults::{Soak, Tally, wait_recovered};
use leader::Leader;
use memory::*;

/// What to run.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Simulated members.
    pub members: usize,
    /// How long to inject faults.
    pub duration: Duration,
    /// The heartbeat interval; the grace period is four of them.
    pub interval: Duration,
    /// Faults come at random times between these two gaps.
    pub gap: (Duration, Duration),
    /// How long etcd stays paused.
    pub etcd_pause: Duration,
    /// Faults left out of the rounds (e.g. the leader kill, to watch one process's memory).
    pub without: Vec<Fault>,
}

/// The faults, in the order the table lists them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Fault {
    /// SIGKILL of the leader process, started again at once.
    LeaderKilled,
    /// The leader's kube-apiserver killed and started again.
    ApiServerRestarted,
    /// The leader's etcd stopped (SIGSTOP) for `etcd_pause`.
    EtcdPaused,
    /// 5 % of the members stop heartbeating for two intervals, then go on.
    MembersRestarted,
    /// 2 % of the members leave and as many new ones join.
    Churn,
}

impl std::str::FromStr for Fault {
    type Err = String;

    /// The flag names: `leader-killed`, `api-server-restarted`, `etcd-paused`,
    /// `members-restarted`, `churn`.
    fn from_str(s: &str) -> Result<Self, String> {
        FAULTS.into_iter().find(|f| f.flag() == s).ok_or_else(|| {
            let names: Vec<&str> = FAULTS.iter().map(|f| f.flag()).collect();
            format!("no fault {s:?} (one of {})", names.join(", "))
        })
    }
}

impl Fault {
    fn flag(self) -> &'static str {
        match self {
            Fault::LeaderKilled => "leader-killed",
            Fault::ApiServerRestarted => "api-server-restarted",
            Fault::EtcdPaused => "etcd-paused",
            Fault::MembersRestarted => "members-restarted",
            Fault::Churn => "churn",
        }
    }
}

const FAULTS: [Fault; 5] = [
    Fault::LeaderKilled,
    Fault::ApiServerRestarted,
    Fault::EtcdPaused,
    Fault::MembersRestarted,
    Fault::Churn,
];

/// How long after a fault's recovery a process's end reading is taken (the run's end, or before
/// the kill fault). A fault's burst of requests opens extra connections to the API server, and
/// the leader's HTTP client (hyper-util's pool) closes idle ones after 90 s: until then their
/// buffers hold about 2 MiB of live heap at 1,000 members (measured: +1.8 MiB at a churn, gone
/// 90 s later, docs/benchmarks.md). An end read inside that window judges the last fault's
/// connections, not the process; the baseline after a relist holds none (the restart closed them).
const SETTLE: Duration = Duration::from_secs(120);

/// A member heartbeating in its own task.
struct Running {
    cancel: CancellationToken,
    task: JoinHandle<Member>,
}

fn run_member(member: Member) -> Running {
    let cancel = CancellationToken::new();
    let task = tokio::spawn(member.heartbeat_until(cancel.clone()));
    Running { cancel, task }
}

async fn stop_member(r: Running) -> Member {
    r.cancel.cancel();
    r.task.await.expect("member task")
}

/// What the soak saw.
pub struct Outcome {
    settings: Settings,
    recoveries: BTreeMap<Fault, Vec<Duration>>,
    unready: BTreeMap<Fault, usize>,
    timeouts: Vec<(Fault, String)>,
    lost: Vec<String>,
    duplicates: Vec<String>,
    heartbeats: u64,
    heartbeat_failures: u64,
    writes: f64,
    writes_by_kind: BTreeMap<String, f64>,
    /// Each leader process, in order.
    lives: Vec<Life>,
    leader_restarts: usize,
    denials: usize,
    binary: String,
}

/// Members expected but missing at the leader, and cluster IDs with more than one request.
async fn check_members(admin: &Client, expected: &[String]) -> (Vec<String>, Vec<String>) {
    let clusters = Api::<ManagedCluster>::all(admin.clone())
        .list(&ListParams::default())
        .await
        .expect("list members");
    let present: std::collections::HashSet<String> = clusters
        .items
        .iter()
        .map(|mc| mc.spec.cluster_id.clone())
        .collect();
    let mut lost: Vec<String> = expected
        .iter()
        .filter(|n| !present.contains(*n))
        .cloned()
        .collect();
    lost.sort();
    let requests = Api::<ClusterRegistrationRequest>::namespaced(admin.clone(), HOME)
        .list(&ListParams::default())
        .await
        .expect("list requests");
    let mut per_id: BTreeMap<String, usize> = BTreeMap::new();
    for r in &requests.items {
        *per_id.entry(r.spec.cluster_id.clone()).or_default() += 1;
    }
    let duplicates = per_id
        .into_iter()
        .filter(|(_, count)| *count > 1)
        .map(|(id, count)| format!("{id}×{count}"))
        .collect();
    (lost, duplicates)
}

/// Runs the soak.
pub async fn run(settings: &Settings) -> Outcome {
    let mut soak = start(settings).await;
    let grace = settings.interval * 4;
    let beats_before = soak.fleet.stats.heartbeats();
    let failures_before = soak.fleet.stats.failures();
    let mut tally = Tally::default();
    let mut leader_restarts = 0;
    let started = Instant::now();
    let mut order: Vec<Fault> = Vec::new();
    eprintln!("== soak: injecting faults for {:?}", settings.duration);
    while started.elapsed() < settings.duration {
        if order.is_empty() {
            order = FAULTS
                .into_iter()
                .filter(|f| !settings.without.contains(f))
                .collect();
            order.shuffle(&mut rand::rng());
        }
        let fault = order.pop().expect("a fault");
        let gap = rand::rng().random_range(settings.gap.0..=settings.gap.1);
        // A process's last reading is taken before it is killed: settled, like the run's end.
        let settled = fault == Fault::LeaderKilled;
        tokio::time::sleep(if settled { gap.max(SETTLE) } else { gap }).await;
        let at = Instant::now();
        fault.inject(&mut soak).await;
        leader_restarts += usize::from(fault == Fault::LeaderKilled);
        let ended = Instant::now();
        let expected = soak.running.keys().cloned().collect();
        let recovered = wait_recovered(
            &soak.admin,
            &soak.leader.side.controller,
            &expected,
            ended,
            grace * 3,
        )
        .await;
        if recovered.is_ok() {
            soak.leader.sample(Some(fault)).await;
        }
        tally.record(fault, ended - at, recovered, started.elapsed().as_secs_f64());
    }
    // The closing figures (and the last process's end reading) once the last fault settled.
    tokio::time::sleep(SETTLE).await;
    soak.close_window().await;
    let life = soak.leader.life().await;
    soak.lives.push(life);
    let heartbeats = soak.fleet.stats.heartbeats() - beats_before;
    let heartbeat_failures = soak.fleet.stats.failures() - failures_before;
    let expected: Vec<String> = soak.running.keys().cloned().collect();
    let (lost, duplicates) = check_members(&soak.admin, &expected).await;
    for (_, r) in soak.running.drain() {
        stop_member(r).await;
    }
    // NB: a just-restarted API server may refuse requests (403) until its RBAC caches fill;
    // counted, not failed on: the leader retries them.
    let denials = soak.leader.side.controller.log().matches("is forbidden").count();
    Outcome {
        settings: settings.clone(),
        recoveries: tally.recoveries,
        unready: tally.unready,
        timeouts: tally.timeouts,
        lost,
        duplicates,
        heartbeats,
        heartbeat_failures,
        writes: soak.writes.values().sum(),
        writes_by_kind: soak.writes,
        lives: soak.lives,
        leader_restarts,
        denials,
        binary: tether_testkit::controller::binary("tether-controller")
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
    }
}

/// The control plane, the leader and `settings.members` members joined and heartbeating.
async fn start(settings: &Settings) -> Soak {
    let n = settings.members;
    let interval = settings.interval;
    let grace = interval * 4;
    let cluster = TestCluster::builder("soak").start().await.expect("control plane");
    let spec = policy(
        &format!("{}s", interval.as_secs()),
        &format!("{}s", grace.as_secs()),
    );
    let side = LeaderSide::on(cluster).policy(spec).start().await;
    let kubeconfig = token_kubeconfig(&side.cluster, "tether-leader", &leader_token(&side.admin).await)
        .expect("leader kubeconfig");
    let leader = Leader {
        side,
        kubeconfig,
        samples: Vec::new(),
        relisted: false,
    };
    let admin = leader.side.admin.clone();
    let token = join_token(&admin).await;
    let join = Join {
        leader_url: leader.side.cluster.url().to_string(),
        ca_cert_hash: leader.side.cluster.ca_cert_hash().to_string(),
        token: token.token(),
        namespace: HOME.into(),
        registration_timeout: Duration::from_secs(600),
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let fleet = loop {
        match Fleet::connect(join.clone()).await {
            Ok(f) => break f,
            Err(_) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(200)).await,
            Err(e) => panic!("connect to the leader: {e}"),
        }
    };
    let mut soak = Soak {
        settings: settings.clone(),
        leader,
        admin,
        fleet,
        running: HashMap::new(),
        next_name: n,
        writes: BTreeMap::new(),
        since: BTreeMap::new(),
        window: Instant::now(),
        lives: Vec::new(),
    };
    eprintln!("== soak: {n} members join");
    soak.join((0..n).map(|i| format!("soak-{i:05}")).collect(), 200)
        .await;
    let joined = soak.running.len();
    wait_for_counts(&soak.admin, joined, joined, Duration::from_secs(600)).await;
    tokio::time::sleep(interval).await;
    soak.leader.sample(None).await;
    soak.since = request_counts(&soak.admin).await;
    soak.window = Instant::now();
    soak
}
