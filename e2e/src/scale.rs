//! The scale benchmark (`make bench`): one real control plane, the leader as its own process
//! (`tether-controller leader`, its own ServiceAccount), and N members simulated by `tether-sim`
//! in this process. Measures registration, steady-state writes by kind, the leader's CPU and
//! memory, loss detection, join/leave visibility, and the API server's own limit for small
//! writes on the same machine, against which the other figures are put.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use tether_api::registration::RegistrationResult;
use tether_api::{ClusterRegistrationRequest, ClusterSet, ManagedCluster};
use tether_sim::{Fleet, Join, Member, join_all, quantile};
use tether_testkit::TestCluster;
use tokio_util::sync::CancellationToken;

use crate::fleet::LeaderSide;
use crate::sim::{HOME, SET, join_token};

/// Heartbeat intervals the benchmark chooses from (seconds).
const INTERVALS: [u64; 10] = [10, 15, 20, 30, 45, 60, 90, 120, 180, 300];
/// The share of the API server's measured write limit that heartbeats may take.
pub const HEARTBEAT_SHARE: f64 = 0.3;

/// What to run.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Simulated members.
    pub members: usize,
    /// Registrations in flight at once.
    pub concurrency: usize,
    /// Heartbeat interval in seconds; None: the shortest in `INTERVALS` whose heartbeat rate
    /// stays within `HEARTBEAT_SHARE` of the measured API server limit.
    pub interval: Option<u64>,
    /// How long the steady state is measured.
    pub steady: Duration,
    /// How long the API server's write limit is measured.
    pub limit_window: Duration,
    /// How long the writes of a new leader are counted after a failover (the issue: 2 minutes).
    pub failover_window: Duration,
    /// How many failovers, one after the other (each kills the leader the previous one started).
    pub failovers: usize,
    /// Directories holding the `tether-controller` each new leader runs, in turn (failover i runs
    /// the one in `failover_bins[i % len]`); empty: the workspace's, as the first leader. Two
    /// builds compared on the same 10,000-member fleet.
    pub failover_bins: Vec<std::path::PathBuf>,
    /// The set's `credentialTTL`; when given, the run also measures credential renewals once
    /// every member is past its first one (None: the leader's default, 1 h, and no renewal
    /// window).
    pub credential_ttl: Option<Duration>,
    /// Publish the members as ClusterProfiles (one inventory namespace) and count those writes.
    pub cluster_profiles: bool,
}

/// ClusterProfile writes (creates, applies, status applies, deletes) in each phase of a run.
#[derive(Clone, Debug, Default)]
pub struct ProfileWrites {
    /// During the registrations, per member.
    pub per_registration: f64,
    /// Per second over the steady window (heartbeats only: should be none).
    pub steady: f64,
    /// For one member going silent and being marked Unknown.
    pub silent_member: f64,
    /// For one member joining and leaving.
    pub join_and_leave: f64,
    /// Over the first failover window (a new leader re-reads every profile: should be none).
    pub failover: f64,
}

/// One leader failover: the leader process killed, a new one started.
#[derive(Clone, Debug, Default)]
pub struct Failover {
    /// The directory of the binary the new leader ran (None: the workspace's).
    pub bin: Option<std::path::PathBuf>,
    /// Leader killed → the new leader process answers ready (caches listed, acting).
    pub ready: Duration,
    /// The new leader's peak RSS over the failover window (MiB).
    pub peak_rss: f64,
    /// Writes per second by kind in the new leader's first failover window.
    pub writes: BTreeMap<String, f64>,
    /// ClusterProfile writes in that window.
    pub profile_writes: f64,
}

/// Credential renewals, measured over a window in which every member renews at its own pace.
#[derive(Clone, Debug, Default)]
pub struct Renewals {
    /// The `credentialTTL` in force.
    pub ttl: Duration,
    /// The window.
    pub window: Duration,
    /// TokenRequests per second the API server counted (`serviceaccounts/token` creates).
    pub api_rate: f64,
    /// Renewals per second the simulated members completed.
    pub sim_rate: f64,
    /// What the agent's schedule predicts: N / (TTL × (1 − 0.95 / 3)).
    pub expected_rate: f64,
    /// Renewals that failed over the whole run.
    pub failures: u64,
    /// Heartbeats that failed during the window.
    pub heartbeat_failures: u64,
    /// All writes per second during the window.
    pub writes: f64,
    /// CPU share of one core during the window, by process.
    pub cpu: BTreeMap<&'static str, f64>,
}

/// Everything measured in one run.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// ClusterProfile writes by phase, when the run published them.
    pub profiles: Option<ProfileWrites>,
    /// Simulated members.
    pub members: usize,
    /// Registrations in flight at once.
    pub concurrency: usize,
    /// The API server's sustained rate of small writes (Lease updates) per second.
    pub api_limit: f64,
    /// The heartbeat interval used (s).
    pub interval: u64,
    /// The grace period used (s).
    pub grace: u64,
    /// Wall time of the registration phase.
    pub registration_wall: Duration,
    /// Request created → `Approved` seen by a watch (server side), sorted.
    pub approved: Vec<Duration>,
    /// Create call → first heartbeat accepted with the new credential (agent side), sorted.
    pub usable: Vec<Duration>,
    /// CPU share of one core during registration, by process.
    pub registration_cpu: BTreeMap<&'static str, f64>,
    /// From the last join until the ClusterSet status shows every member Ready.
    pub all_ready: Duration,
    /// Steady-state writes per second by kind.
    pub writes: BTreeMap<String, f64>,
    /// Heartbeats per second the simulated members sent during the steady window.
    pub heartbeats: f64,
    /// Heartbeats that failed during the whole run.
    pub heartbeat_failures: u64,
    /// Failed leader reconciles over the run (each retried).
    pub reconcile_errors: u64,
    /// The slowest approvals: (member, position in creation order, latency).
    pub slowest: Vec<(String, usize, Duration)>,
    /// CPU share of one core at steady state, by process.
    pub steady_cpu: BTreeMap<&'static str, f64>,
    /// Leader RSS at the end of the steady window (MiB).
    pub leader_rss: f64,
    /// Leader peak RSS over the run (MiB).
    pub leader_peak_rss: f64,
    /// Last accepted heartbeat of a member → its ManagedCluster `Ready=Unknown`.
    pub detection: Duration,
    /// A new member's create call → ClusterSet status counting it.
    pub join_visible: Duration,
    /// A member's deregistration → ClusterSet status no longer counting it.
    pub leave_visible: Duration,
    /// Each failover, in order.
    pub failovers: Vec<Failover>,
    /// The failover window.
    pub failover_window: Duration,
    /// Credential renewals, if the run measured them.
    pub renewals: Option<Renewals>,
}

impl Outcome {
    /// Writes per second the API server took over the steady window, of kind `kind`.
    fn writes_of(&self, kind: &str) -> f64 {
        self.writes.get(kind).copied().unwrap_or(0.0)
    }

    /// All steady writes per second.
    pub fn total_writes(&self) -> f64 {
        self.writes.values().sum()
    }

    /// Heartbeat writes per heartbeat the members sent (the target is 1).
    pub fn writes_per_heartbeat(&self) -> f64 {
        if self.heartbeats == 0.0 {
            return 0.0;
        }
        self.writes_of(ANNOUNCE) / self.heartbeats
    }

    /// Registration throughput (members/s).
    pub fn throughput(&self) -> f64 {
        self.members as f64 / self.registration_wall.as_secs_f64().max(f64::EPSILON)
    }

    /// The table of this run, in Markdown.
    pub fn table(&self) -> String {
        let ms = |d: Duration| format!("{:.0} ms", d.as_secs_f64() * 1000.0);
        let s = |d: Duration| format!("{:.1} s", d.as_secs_f64());
        let pct = |x: f64| format!("{:.0}%", x * 100.0);
        let ratio = |x: f64| format!("{:.1}% of the API server limit", x / self.api_limit * 100.0);
        let mut t = String::new();
        let _ = writeln!(
            t,
            "\n### N = {} (heartbeat {}s, grace {}s, {} registrations in flight)\n",
            self.members, self.interval, self.grace, self.concurrency
        );
        let _ = writeln!(t, "| figure | value | note |\n| --- | --- | --- |");
        let mut row = |a: &str, b: String, c: String| {
            let _ = writeln!(t, "| {a} | {b} | {c} |");
        };
        if let Some(p) = &self.profiles {
            row(
                "ClusterProfile writes",
                format!(
                    "{:.2} per registration, {:.2} /s steady",
                    p.per_registration, p.steady
                ),
                format!(
                    "a member silent → Unknown: {:.0}; one joining and leaving: {:.0}; failover window: {:.0}",
                    p.silent_member, p.join_and_leave, p.failover
                ),
            );
        }
        row(
            "API server limit (small writes)",
            format!("{:.0} writes/s", self.api_limit),
            "Lease updates, same API server + etcd".into(),
        );
        row(
            "registration throughput",
            format!("{:.1} /s", self.throughput()),
            format!(
                "{} members in {}; ≈ {:.0} writes/s, {}",
                self.members,
                s(self.registration_wall),
                self.throughput() * WRITES_PER_REGISTRATION,
                ratio(self.throughput() * WRITES_PER_REGISTRATION)
            ),
        );
        let p50_p99 =
            |sorted: &[Duration]| format!("{} / {}", ms(quantile(sorted, 0.5)), ms(quantile(sorted, 0.99)));
        row(
            "request → Approved p50 / p99",
            p50_p99(&self.approved),
            "seen by a watch on the leader".into(),
        );
        row(
            "request → usable credential p50 / p99",
            p50_p99(&self.usable),
            "first heartbeat accepted; includes the agent's polling".into(),
        );
        for (who, share) in &self.registration_cpu {
            row(
                &format!("CPU during registration: {who}"),
                pct(*share),
                "of one core".into(),
            );
        }
        row(
            "last join → all members Ready in the set status",
            s(self.all_ready),
            "Ready needs the first heartbeat seen".into(),
        );
        row(
            "leader reconcile errors (retried)",
            self.reconcile_errors.to_string(),
            format!(
                "slowest approvals (creation order, latency): {}",
                self.slowest
                    .iter()
                    .map(|(_, i, d)| format!("#{i} {:.1} s", d.as_secs_f64()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        );
        row(
            "heartbeats sent",
            format!("{:.1} /s", self.heartbeats),
            format!("{} failed over the run", self.heartbeat_failures),
        );
        row(
            "announce writes per heartbeat",
            format!("{:.2}", self.writes_per_heartbeat()),
            "target 1".into(),
        );
        for kind in [ANNOUNCE, MANAGED_CLUSTER_STATUS, CLUSTER_SET_STATUS, OTHER] {
            row(
                &format!("steady writes: {kind}"),
                format!("{:.2} /s", self.writes_of(kind)),
                ratio(self.writes_of(kind)),
            );
        }
        row(
            "steady writes: all",
            format!("{:.2} /s", self.total_writes()),
            ratio(self.total_writes()),
        );
        for (who, share) in &self.steady_cpu {
            row(
                &format!("CPU at steady state: {who}"),
                pct(*share),
                "of one core".into(),
            );
        }
        row(
            "leader RSS (steady / peak)",
            format!("{:.0} / {:.0} MiB", self.leader_rss, self.leader_peak_rss),
            "target ≤ 256 MiB at 10,000".into(),
        );
        row(
            "member silent → Ready=Unknown",
            s(self.detection),
            format!("grace period {}s", self.grace),
        );
        row(
            "join → ClusterSet status counts it",
            s(self.join_visible),
            "includes the registration".into(),
        );
        row(
            "leave → ClusterSet status drops it",
            s(self.leave_visible),
            "set status is paced to once a second".into(),
        );
        for (i, f) in self.failovers.iter().enumerate() {
            let mut which = if self.failovers.len() == 1 {
                "leader failover".to_string()
            } else {
                format!("leader failover {}", i + 1)
            };
            if let Some(bin) = &f.bin {
                which.push_str(&format!(" ({})", bin.display()));
            }
            row(
                &format!("{which}: killed → new leader ready"),
                s(f.ready),
                "a new process lists every kind and acts; no Lease wait (election off here)".into(),
            );
            row(
                &format!("{which}: new leader peak RSS"),
                format!("{:.0} MiB", f.peak_rss),
                format!("over its first {}", s(self.failover_window)),
            );
            let total: f64 = f.writes.values().sum();
            row(
                &format!("{which}: writes/s in the new leader's first window"),
                format!("{total:.2} /s"),
                format!(
                    "steady {:.2} /s; by kind: {}",
                    self.total_writes(),
                    f.writes
                        .iter()
                        .map(|(k, v)| format!("{k} {v:.2}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            );
        }
        if let Some(r) = &self.renewals {
            row(
                "credential renewals (TokenRequests/s)",
                format!("{:.2} /s", r.api_rate),
                format!(
                    "credentialTTL {}s, {} window; counted by the API server; members renewed {:.2} /s, \
                     the agent's schedule predicts {:.2} /s; {} renewals failed over the run, {} \
                     heartbeats failed in the window",
                    r.ttl.as_secs(),
                    s(r.window),
                    r.sim_rate,
                    r.expected_rate,
                    r.failures,
                    r.heartbeat_failures
                ),
            );
            row(
                "writes/s while renewing (all)",
                format!("{:.2} /s", r.writes),
                format!(
                    "steady window before it: {:.2} /s (members that joined ¾ TTL before it already renewed there)",
                    self.total_writes()
                ),
            );
            for (who, share) in &r.cpu {
                row(
                    &format!("CPU while renewing: {who}"),
                    pct(*share),
                    "of one core".into(),
                );
            }
        }
        t
    }
}

/// The member count the API server limit implies at each heartbeat interval, if heartbeats may
/// take `HEARTBEAT_SHARE` of it.
pub fn capacity_table(api_limit: f64) -> String {
    let mut t =
        String::from("| heartbeat interval | members (heartbeats at 30% of the limit) |\n| --- | --- |\n");
    for i in [10u64, 30, 60, 120, 300] {
        let _ = writeln!(t, "| {i} s | {:.0} |", api_limit * HEARTBEAT_SHARE * i as f64);
    }
    t
}

/// Writes per registration measured by `make bench-leader` (docs/benchmarks.md): used only to put
/// the registration rate next to the API server limit.
const WRITES_PER_REGISTRATION: f64 = 10.0;
/// Heartbeats: Lease renewals (the control plane's own Leases, about 0.1 /s, count here too)
/// and announces (agents from before heartbeat Leases).
const ANNOUNCE: &str = "heartbeat (Lease, announce)";
const MANAGED_CLUSTER_STATUS: &str = "ManagedCluster status";
const CLUSTER_SET_STATUS: &str = "ClusterSet status";
const OTHER: &str = "other";

/// Runs one benchmark; progress goes to stderr.
pub async fn run(settings: &Settings) -> Outcome {
    let n = settings.members;
    let setup = start(settings).await;
    let (interval, grace) = (setup.interval, setup.grace);
    let admin = setup.leader.admin.clone();
    let c0 = request_counts(&admin).await;
    let joined = register_all(settings, &setup).await;
    let (approved, slowest) = approval_latencies(&setup.approvals, &joined.names);
    assert_eq!(approved.len(), n, "the watch saw every request approved");
    wait_for_counts(&setup.leader.admin, n, n, Duration::from_secs(600)).await;
    let all_ready = joined.started.elapsed() - joined.registration_wall;
    let c1 = request_counts(&admin).await;

    // One full interval first, so that every member's heartbeat phase is spread.
    eprintln!(
        "== [{n}] all Ready; settling {interval}s, then measuring the steady state for {:?}",
        settings.steady
    );
    tokio::time::sleep(Duration::from_secs(interval)).await;
    let steady = measure_steady(settings, &setup).await;
    let renewals = match settings.credential_ttl {
        Some(ttl) => Some(measure_renewals(settings, &setup, &joined, ttl).await),
        None => None,
    };

    let c2 = request_counts(&admin).await;
    eprintln!("== [{n}] silencing one member");
    joined.silent_cancel.cancel();
    let silent = joined.silent.await.expect("silent member task");
    silent.beat().await.expect("last heartbeat");
    let last = Instant::now();
    wait_ready_unknown(
        &setup.leader.admin,
        &silent.namespace,
        &silent.name,
        Duration::from_secs(grace * 2 + 60),
    )
    .await;
    let detection = last.elapsed();
    // NB: the profile follows the Ready condition at once; a second lets its write land.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let c3 = request_counts(&admin).await;

    eprintln!("== [{n}] one more member joins, then leaves");
    let t0 = Instant::now();
    let (late, _) = setup.fleet.join("sim-late").await.expect("late member joins");
    wait_total(&setup.leader.admin, n + 1, Duration::from_secs(120)).await;
    let join_visible = t0.elapsed();
    let t0 = Instant::now();
    late.leave().await.expect("late member leaves");
    wait_total(&setup.leader.admin, n, Duration::from_secs(120)).await;
    let leave_visible = t0.elapsed();
    if settings.cluster_profiles {
        // NB: the set counts a member gone before its ManagedCluster is; its profile goes then.
        let profiles: kube::Api<tether_api::inventory::ClusterProfile> =
            kube::Api::namespaced(admin.clone(), INVENTORY);
        tether_testkit::eventually("sim-late's profile removed", Duration::from_secs(60), || async {
            match profiles.get_opt("sim-late").await.map_err(|e| e.to_string())? {
                None => Ok(()),
                Some(_) => Err("still there".to_string()),
            }
        })
        .await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let c4 = request_counts(&admin).await;
    let leader_peak_rss = rss_mib(setup.leader.controller.pid(), "VmHWM");

    let mut leader = setup.leader;
    let kubeconfig = tether_testkit::token_kubeconfig(
        &leader.cluster,
        "tether-leader",
        &crate::sim::leader_token(&leader.admin).await,
    )
    .expect("leader kubeconfig");
    let mut failovers = Vec::new();
    for i in 0..settings.failovers.max(1) {
        let bin = (!settings.failover_bins.is_empty())
            .then(|| settings.failover_bins[i % settings.failover_bins.len()].clone());
        eprintln!(
            "== [{n}] leader failover {}: the leader process killed, a new one started{}",
            i + 1,
            bin.as_ref()
                .map(|b| format!(" from {}", b.display()))
                .unwrap_or_default()
        );
        failovers.push(
            failover(
                &mut leader,
                &kubeconfig,
                bin,
                settings.failover_window,
                settings.cluster_profiles,
            )
            .await,
        );
    }
    let setup = Setup { leader, ..setup };

    joined.cancel.cancel();
    for t in joined.tasks {
        let _ = t.await;
    }
    let reconcile_errors = keep_leader_output(&setup.leader, n).await;
    let profiles = settings.cluster_profiles.then(|| ProfileWrites {
        per_registration: profile_writes(&c0, &c1) / n as f64,
        steady: steady.profile_writes / settings.steady.as_secs_f64(),
        silent_member: profile_writes(&c2, &c3),
        join_and_leave: profile_writes(&c3, &c4),
        failover: failovers.first().map(|f| f.profile_writes).unwrap_or_default(),
    });
    Outcome {
        profiles,
        members: n,
        concurrency: settings.concurrency,
        api_limit: setup.api_limit,
        interval,
        grace,
        registration_wall: joined.registration_wall,
        approved,
        usable: joined.usable,
        registration_cpu: joined.registration_cpu,
        all_ready,
        writes: steady.writes,
        heartbeats: steady.heartbeats,
        heartbeat_failures: setup.fleet.stats.failures(),
        reconcile_errors,
        slowest,
        steady_cpu: steady.cpu,
        leader_rss: steady.leader_rss,
        leader_peak_rss,
        detection,
        join_visible,
        leave_visible,
        failovers,
        failover_window: settings.failover_window,
        renewals,
    }
}

/// Kills the leader process and starts a new one with `kubeconfig`: how soon it is ready, its
/// peak memory and its writes over its first `window`.
async fn failover(
    leader: &mut LeaderSide,
    kubeconfig: &std::path::Path,
    bin: Option<std::path::PathBuf>,
    window: Duration,
    cluster_profiles: bool,
) -> Failover {
    let before = request_counts(&leader.admin).await;
    leader.controller.kill();
    let killed = Instant::now();
    let mut args = vec!["leader", "--leader-elect=false"];
    if cluster_profiles {
        args.push("--cluster-profiles");
    }
    let binary = match &bin {
        Some(dir) => dir.join("tether-controller"),
        None => tether_testkit::controller::binary("tether-controller").expect("tether-controller"),
    };
    leader.controller = tether_testkit::Controller::start_binary(
        &binary,
        &leader.cluster,
        "tether-leader",
        kubeconfig,
        &args,
    )
    .expect("new leader process");
    loop {
        if let Ok((200, _)) = leader.controller.admin_get("/readyz").await {
            break;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(600),
            "the new leader ready within 10 min"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ready = killed.elapsed();
    tokio::time::sleep(window.saturating_sub(killed.elapsed())).await;
    let after = request_counts(&leader.admin).await;
    let writes = classify(&before, &after, killed.elapsed().as_secs_f64());
    Failover {
        bin,
        ready,
        peak_rss: rss_mib(leader.controller.pid(), "VmHWM"),
        writes,
        profile_writes: profile_writes(&before, &after),
    }
}

/// A leader under test, its process list, the fleet that joins it, and the approval watch.
struct Setup {
    leader: LeaderSide,
    procs: Vec<(&'static str, u32)>,
    fleet: Fleet,
    approvals: Approvals,
    api_limit: f64,
    interval: u64,
    grace: u64,
}

/// Starts the control plane, measures its write limit, picks the heartbeat interval from it,
/// starts the leader and connects a fleet (the leader publishes its CA shortly after it starts).
async fn start(settings: &Settings) -> Setup {
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
    let mut leader_spec =
        json!({"heartbeatInterval": format!("{interval}s"), "gracePeriod": format!("{grace}s")});
    if let Some(ttl) = settings.credential_ttl {
        leader_spec["credentialTTL"] = json!(format!("{}s", ttl.as_secs()));
    }
    let mut extra = vec![];
    if settings.cluster_profiles {
        crate::install_cluster_profile_crd(&admin)
            .await
            .expect("ClusterProfile CRD");
        crate::allow_inventory(&admin, &[INVENTORY])
            .await
            .expect("inventory RBAC");
        leader_spec["inventory"] = json!({"namespaces": [INVENTORY]});
        extra.push("--cluster-profiles");
    }
    let leader = crate::fleet::leader_on_with(cluster, Some(leader_spec), &extra).await;
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

/// The members once all have joined, each heartbeating from the moment it was in (as an agent
/// does); the first one separately, to be silenced later.
struct Joined {
    names: Vec<String>,
    usable: Vec<Duration>,
    tasks: Vec<tokio::task::JoinHandle<Member>>,
    silent: tokio::task::JoinHandle<Member>,
    cancel: CancellationToken,
    silent_cancel: CancellationToken,
    started: Instant,
    registration_wall: Duration,
    registration_cpu: BTreeMap<&'static str, f64>,
}

async fn register_all(settings: &Settings, setup: &Setup) -> Joined {
    let n = settings.members;
    eprintln!(
        "== [{n}] registering {n} members, {} in flight (heartbeat {}s, grace {}s)",
        settings.concurrency, setup.interval, setup.grace
    );
    let cpu = Cpu::sample(&setup.procs);
    let started = Instant::now();
    let step = (n / 10).max(1);
    let cancel = CancellationToken::new();
    let silent_cancel = CancellationToken::new();
    let mut silent = None;
    let mut tasks = Vec::with_capacity(n);
    let mut usable = Vec::with_capacity(n);
    let mut names = Vec::with_capacity(n);
    join_all(
        &setup.fleet,
        (0..n).map(|i| format!("sim-{i:05}")).collect(),
        settings.concurrency,
        |member, timings| {
            usable.push(timings.usable);
            names.push(member.name.clone());
            if silent.is_none() {
                silent = Some(tokio::spawn(member.heartbeat_until(silent_cancel.clone())));
            } else {
                tasks.push(tokio::spawn(member.heartbeat_until(cancel.clone())));
            }
            if names.len() % step == 0 {
                eprintln!(
                    "   {}/{n} joined after {:.0}s",
                    names.len(),
                    started.elapsed().as_secs_f64()
                );
            }
        },
    )
    .await
    .expect("every member joins");
    usable.sort();
    Joined {
        names,
        usable,
        tasks,
        silent: silent.expect("at least one member"),
        cancel,
        silent_cancel,
        started,
        registration_wall: started.elapsed(),
        registration_cpu: cpu.shares(&setup.procs),
    }
}

/// Request → Approved latency of each of `names` (sorted), and the five slowest with their
/// creation rank.
fn approval_latencies(
    approvals: &Approvals,
    names: &[String],
) -> (Vec<Duration>, Vec<(String, usize, Duration)>) {
    let seen = approvals.lock().expect("approvals");
    let mut approved: Vec<Duration> = names
        .iter()
        .filter_map(|name| {
            seen.get(name)
                .and_then(|(c, a)| a.map(|a| a.saturating_duration_since(*c)))
        })
        .collect();
    approved.sort();
    let mut order: Vec<(&String, Instant, Duration)> = seen
        .iter()
        .filter_map(|(name, (c, a))| a.map(|a| (name, *c, a.saturating_duration_since(*c))))
        .collect();
    order.sort_by_key(|(_, created, _)| *created);
    let mut slowest: Vec<(String, usize, Duration)> = order
        .iter()
        .enumerate()
        .map(|(i, (name, _, d))| ((*name).clone(), i, *d))
        .collect();
    slowest.sort_by_key(|(_, _, d)| std::cmp::Reverse(*d));
    slowest.truncate(5);
    (approved, slowest)
}

/// What the steady window measured.
struct Steady {
    writes: BTreeMap<String, f64>,
    /// ClusterProfile writes in the window.
    profile_writes: f64,
    heartbeats: f64,
    cpu: BTreeMap<&'static str, f64>,
    leader_rss: f64,
}

async fn measure_steady(settings: &Settings, setup: &Setup) -> Steady {
    let before = request_counts(&setup.leader.admin).await;
    let beats = setup.fleet.stats.heartbeats();
    let cpu = Cpu::sample(&setup.procs);
    let window = Instant::now();
    tokio::time::sleep(settings.steady).await;
    let elapsed = window.elapsed().as_secs_f64();
    let cpu = cpu.shares(&setup.procs);
    let heartbeats = (setup.fleet.stats.heartbeats() - beats) as f64 / elapsed;
    let after = request_counts(&setup.leader.admin).await;
    Steady {
        writes: classify(&before, &after, elapsed),
        profile_writes: profile_writes(&before, &after),
        heartbeats,
        cpu,
        leader_rss: rss_mib(setup.leader.controller.pid(), "VmRSS"),
    }
}

/// Waits until every member is past its first renewal (the last one registered at the end of
/// the registration phase renews within ¾ TTL of it), then counts renewals over a window of
/// two minutes or N/10 renewals' worth, whichever is longer. NB: a window shorter than one
/// renewal period samples the members' phases, which follow the registration rate; the long-run
/// mean is the expected rate.
async fn measure_renewals(settings: &Settings, setup: &Setup, joined: &Joined, ttl: Duration) -> Renewals {
    let n = settings.members;
    let expected_rate = n as f64 / (ttl.as_secs_f64() * (1.0 - 0.95 / 3.0));
    let from = joined.started + joined.registration_wall + ttl.mul_f64(0.75) + Duration::from_secs(10);
    eprintln!(
        "== [{n}] credential renewals: waiting {:.0?} until every member renews at its own pace",
        from.saturating_duration_since(Instant::now())
    );
    tokio::time::sleep_until(from.into()).await;
    let window = Duration::from_secs(120).max(Duration::from_secs_f64(n as f64 / 10.0 / expected_rate));
    let before = request_counts(&setup.leader.admin).await;
    let (renewed, failed) = (setup.fleet.stats.renewals(), setup.fleet.stats.failures());
    let cpu = Cpu::sample(&setup.procs);
    let t = Instant::now();
    tokio::time::sleep(window).await;
    let secs = t.elapsed().as_secs_f64();
    let cpu = cpu.shares(&setup.procs);
    let after = request_counts(&setup.leader.admin).await;
    let tokens = after.get(TOKEN_REQUESTS).copied().unwrap_or(0.0)
        - before.get(TOKEN_REQUESTS).copied().unwrap_or(0.0);
    Renewals {
        ttl,
        window,
        api_rate: tokens / secs,
        sim_rate: (setup.fleet.stats.renewals() - renewed) as f64 / secs,
        expected_rate,
        failures: setup.fleet.stats.renewal_failures(),
        heartbeat_failures: setup.fleet.stats.failures() - failed,
        writes: classify(&before, &after, secs).values().sum(),
        cpu,
    }
}

/// What a credential renewal creates (`apiserver_request_total` resource/subresource).
const TOKEN_REQUESTS: &str = "serviceaccounts/token";

/// Keeps the leader's log and metrics in `target/scale-bench/`, fails on any RBAC refusal, and
/// returns the leader's reconcile error count.
async fn keep_leader_output(leader: &LeaderSide, n: usize) -> u64 {
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

/// The API server's sustained rate of small writes: 32 writers, each updating its own Lease
/// (a ~300-byte object, like an announce) as fast as the API server answers, for `window`.
pub async fn write_limit(admin: &Client, window: Duration) -> f64 {
    const WRITERS: usize = 32;
    let api = Api::<Lease>::namespaced(admin.clone(), "default");
    for i in 0..WRITERS {
        let lease: Lease = serde_json::from_value(json!({"metadata": {"name": format!("bench-{i}")},
                                                          "spec": {"holderIdentity": "bench"}}))
        .expect("lease");
        api.create(&PostParams::default(), &lease)
            .await
            .expect("create lease");
    }
    let deadline = Instant::now() + window;
    let started = Instant::now();
    let counts = futures::future::join_all((0..WRITERS).map(|i| {
        let api = api.clone();
        async move {
            let mut done = 0u64;
            while Instant::now() < deadline {
                // NB: a changed field, so that every patch is a real write to etcd.
                let body = json!({"spec": {"leaseTransitions": done + 1}});
                match api
                    .patch(
                        &format!("bench-{i}"),
                        &PatchParams::default(),
                        &Patch::Merge(body),
                    )
                    .await
                {
                    Ok(_) => done += 1,
                    Err(e) => panic!("Lease update failed: {e}"),
                }
            }
            done
        }
    }))
    .await;
    let rate = counts.iter().sum::<u64>() as f64 / started.elapsed().as_secs_f64();
    for i in 0..WRITERS {
        let _ = api.delete(&format!("bench-{i}"), &Default::default()).await;
    }
    rate
}

/// What one kind of write costs the API server, measured with 32 writers for a window.
pub struct WriteCost {
    /// What was written.
    pub what: &'static str,
    /// Sustained writes per second.
    pub rate: f64,
    /// kube-apiserver CPU per write, in milliseconds.
    pub api_cpu_ms: f64,
    /// etcd CPU per write, in milliseconds.
    pub etcd_cpu_ms: f64,
}

/// The write kinds `write_costs` compares.
#[derive(Clone, Copy, Debug)]
enum Write {
    /// A Lease `spec.renewTime` merge patch (what a Lease-based heartbeat would send).
    Lease,
    /// The agent's own heartbeat: a MemberClusterAnnounce `spec.renewTime` merge patch.
    Announce,
    /// A TokenRequest for a ServiceAccount (what a credential renewal sends).
    TokenRequest,
}

/// Measures, on `cluster` (Tether CRDs installed), the rate and API server/etcd CPU per write of
/// a Lease heartbeat, the agent's announce heartbeat and a credential renewal, each with 32
/// writers for `window`.
pub async fn write_costs(cluster: &TestCluster, window: Duration) -> Vec<WriteCost> {
    const WRITERS: usize = 32;
    let admin = cluster.client().expect("admin");
    let ns = "bench-costs";
    crate::create_namespace(&admin, ns).await.expect("namespace");
    let procs: Vec<(&'static str, u32)> = [("kube-apiserver", "kube-apiserver"), ("etcd", "etcd")]
        .into_iter()
        .filter_map(|(label, p)| cluster.pid(p).map(|pid| (label, pid)))
        .collect();
    let leases = Api::<Lease>::namespaced(admin.clone(), ns);
    let announces = Api::<tether_api::MemberClusterAnnounce>::namespaced(admin.clone(), ns);
    let accounts = Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(admin.clone(), ns);
    for i in 0..WRITERS {
        let name = format!("w-{i}");
        let lease: Lease = serde_json::from_value(json!({"metadata": {"name": name},
            "spec": {"holderIdentity": name, "leaseDurationSeconds": 40}}))
        .expect("lease");
        leases
            .create(&PostParams::default(), &lease)
            .await
            .expect("lease");
        let announce: tether_api::MemberClusterAnnounce = serde_json::from_value(json!({
            "apiVersion": "multicluster.tether.dev/v1alpha1", "kind": "MemberClusterAnnounce",
            "metadata": {"name": name, "labels": {"multicluster.tether.dev/clusterset": "prod",
                "multicluster.tether.dev/cluster-id": format!("0000-{i}"), "app.kubernetes.io/managed-by": "tether-leader"}},
            "spec": {"clusterID": format!("0000-{i}"), "heartbeatIntervalSeconds": 10}}))
        .expect("announce");
        announces
            .create(&PostParams::default(), &announce)
            .await
            .expect("announce");
        let sa: k8s_openapi::api::core::v1::ServiceAccount =
            serde_json::from_value(json!({"metadata": {"name": name}})).expect("sa");
        accounts.create(&PostParams::default(), &sa).await.expect("sa");
    }
    let mut out = Vec::new();
    for kind in [Write::Lease, Write::Announce, Write::TokenRequest] {
        let cpu = Cpu::sample(&procs);
        let deadline = Instant::now() + window;
        let started = Instant::now();
        let counts = futures::future::join_all((0..WRITERS).map(|i| {
            let (leases, announces, accounts) = (leases.clone(), announces.clone(), accounts.clone());
            async move {
                let name = format!("w-{i}");
                let mut done = 0u64;
                while Instant::now() < deadline {
                    let now = k8s_openapi::jiff::Timestamp::now();
                    let ok = match kind {
                        Write::Lease => {
                            let renew = k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(now);
                            let body = json!({"spec": {"renewTime": renew}});
                            leases
                                .patch(&name, &PatchParams::default(), &Patch::Merge(body))
                                .await
                                .map(|_| ())
                        }
                        Write::Announce => tether_agent::heartbeat::beat(&announces, &name, now)
                            .await
                            .map(|_| ()),
                        Write::TokenRequest => {
                            let req = k8s_openapi::api::authentication::v1::TokenRequest {
                                spec: k8s_openapi::api::authentication::v1::TokenRequestSpec {
                                    expiration_seconds: Some(600),
                                    ..Default::default()
                                },
                                ..Default::default()
                            };
                            accounts
                                .create_token_request(&name, &PostParams::default(), &req)
                                .await
                                .map(|_| ())
                        }
                    };
                    if let Err(e) = ok {
                        panic!("{kind:?} write failed: {e}");
                    }
                    done += 1;
                }
                done
            }
        }))
        .await;
        let writes = counts.iter().sum::<u64>() as f64;
        let secs = started.elapsed().as_secs_f64();
        let shares = cpu.shares(&procs);
        let per_write = |p: &str| shares.get(p).copied().unwrap_or(0.0) * secs * 1000.0 / writes.max(1.0);
        out.push(WriteCost {
            what: match kind {
                Write::Lease => "Lease renewTime patch",
                Write::Announce => "MemberClusterAnnounce renewTime patch (the heartbeat)",
                Write::TokenRequest => "TokenRequest (a credential renewal)",
            },
            rate: writes / secs,
            api_cpu_ms: per_write("kube-apiserver"),
            etcd_cpu_ms: per_write("etcd"),
        });
    }
    out
}

type Approvals = Arc<Mutex<HashMap<String, (Instant, Option<Instant>)>>>;

/// Records, by cluster name, when each request is first seen and when it is first seen Approved.
fn watch_approvals(admin: &Client) -> Approvals {
    let seen: Approvals = Arc::default();
    let out = seen.clone();
    let api = Api::<ClusterRegistrationRequest>::namespaced(admin.clone(), HOME);
    tokio::spawn(async move {
        let mut events = watcher(api, watcher::Config::default()).applied_objects().boxed();
        while let Ok(Some(r)) = events.try_next().await {
            let now = Instant::now();
            let mut seen = seen.lock().expect("approvals");
            let entry = seen.entry(r.spec.cluster_name.clone()).or_insert((now, None));
            if entry.1.is_none() && r.status.as_ref().map(|s| s.result) == Some(RegistrationResult::Approved)
            {
                entry.1 = Some(now);
            }
        }
    });
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

async fn wait_total(admin: &Client, total: usize, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let now = set_counts(admin).await;
        if now.map(|c| c.0) == Some(total) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "ClusterSet counts {now:?}, want total {total} within {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn wait_ready_unknown(admin: &Client, ns: &str, name: &str, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    let api = Api::<ManagedCluster>::namespaced(admin.clone(), ns);
    loop {
        let unknown = api.get(name).await.ok().is_some_and(|mc| {
            mc.status
                .iter()
                .flat_map(|s| &s.conditions)
                .any(|c| c.type_ == "Ready" && c.status == "Unknown")
        });
        if unknown {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{ns}/{name} not Ready=Unknown within {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The processes whose CPU is measured.
fn processes(leader: &LeaderSide) -> Vec<(&'static str, u32)> {
    let mut out = vec![("tether leader", leader.controller.pid())];
    for p in ["kube-apiserver", "etcd", "kube-controller-manager"] {
        if let Some(pid) = leader.cluster.pid(p) {
            out.push((p, pid));
        }
    }
    out.push(("tether-sim (all members)", std::process::id()));
    out
}

/// CPU time of processes at one instant.
struct Cpu {
    at: Instant,
    ticks: Vec<u64>,
}

impl Cpu {
    fn sample(procs: &[(&'static str, u32)]) -> Self {
        Self {
            at: Instant::now(),
            ticks: procs.iter().map(|(_, pid)| cpu_ticks(*pid)).collect(),
        }
    }

    /// CPU used since the sample, as a share of one core, by process.
    fn shares(&self, procs: &[(&'static str, u32)]) -> BTreeMap<&'static str, f64> {
        let secs = self.at.elapsed().as_secs_f64();
        procs
            .iter()
            .zip(&self.ticks)
            .map(|((name, pid), before)| {
                let used = cpu_ticks(*pid).saturating_sub(*before) as f64 / CLOCK_TICKS;
                (*name, used / secs)
            })
            .collect()
    }
}

/// `USER_HZ`: Linux reports process times in 1/100 s.
pub const CLOCK_TICKS: f64 = 100.0;

/// The numeric fields of `/proc/<pid>/stat` after the command name (field 3 on), 0 where
/// unreadable.
fn stat_fields(pid: u32) -> Vec<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // NB: the command name (field 2) may contain spaces; fields after its ')' are fixed.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    rest.split_whitespace().map(|f| f.parse().unwrap_or(0)).collect()
}

/// utime + stime of `pid`, in clock ticks.
pub fn cpu_ticks(pid: u32) -> u64 {
    let fields = stat_fields(pid);
    // utime and stime are fields 14 and 15, i.e. 11 and 12 after the ')'.
    fields.get(11).unwrap_or(&0) + fields.get(12).unwrap_or(&0)
}

/// How long ago `pid` started (its `starttime`, field 22, against `/proc/uptime`).
pub fn process_age(pid: u32) -> Duration {
    let started = stat_fields(pid).get(19).copied().unwrap_or(0) as f64 / CLOCK_TICKS;
    let uptime: f64 = std::fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|u| u.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    Duration::from_secs_f64((uptime - started).max(0.0))
}

/// Time `pid`'s live threads have spent on a CPU, in nanoseconds (`/proc/<pid>/task/*/schedstat`;
/// finer than `cpu_ticks`, but a thread that exited is no longer counted).
pub fn cpu_ns(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .filter_map(Result::ok)
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next().and_then(|n| n.parse::<u64>().ok()))
        .sum()
}

/// The value of the series `series` (name and labels, as printed) in Prometheus or OpenMetrics
/// text `text`.
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

/// A memory figure (`VmRSS`, `VmHWM`) of `pid` in MiB.
pub fn rss_mib(pid: u32, field: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(&format!("{field}:")))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kib| kib.parse::<f64>().ok())
        .map(|kib| kib / 1024.0)
        .unwrap_or(0.0)
}

/// `apiserver_request_total` of write verbs, by `resource[/subresource]`.
pub(crate) async fn request_counts(admin: &Client) -> BTreeMap<String, f64> {
    let req = http::Request::get("/metrics").body(vec![]).expect("request");
    let text = admin.request_text(req).await.expect("API server /metrics");
    parse_request_counts(&text)
}

/// Sums `apiserver_request_total` samples of write verbs by `resource[/subresource]`.
pub fn parse_request_counts(text: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| l.starts_with("apiserver_request_total{")) {
        let Some((labels, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let labels: HashMap<&str, &str> = labels
            .trim_start_matches("apiserver_request_total{")
            .trim_end_matches('}')
            .split("\",")
            .filter_map(|kv| kv.split_once("=\""))
            .map(|(k, v)| (k, v.trim_end_matches('"')))
            .collect();
        let label = |name: &str| labels.get(name).copied().unwrap_or_default();
        if !matches!(
            label("verb"),
            "POST" | "PUT" | "PATCH" | "APPLY" | "DELETE" | "DELETECOLLECTION"
        ) {
            continue;
        }
        let mut what = label("resource").to_string();
        if !label("subresource").is_empty() {
            what = format!("{what}/{}", label("subresource"));
        }
        // NB: a collection delete in a namespace (the namespace controller emptying a member's
        // namespace) is counted apart from deletes of one object.
        if label("verb") == "DELETE" && label("scope") == "namespace" {
            what.push_str(" (collection)");
        }
        *out.entry(what).or_default() += value.parse::<f64>().unwrap_or(0.0);
    }
    out
}

/// Writes per second between two counts, by benchmark kind.
/// The inventory namespace of a run with ClusterProfiles.
const INVENTORY: &str = "inventory";

/// ClusterProfile writes (`clusterprofiles` and `clusterprofiles/status`) between two counts.
fn profile_writes(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>) -> f64 {
    after
        .iter()
        // NB: the namespace controller's collection deletes in a deleted member namespace are
        // not the leader's writes (Tether's profiles live in inventory namespaces).
        .filter(|(k, _)| k.starts_with("clusterprofiles") && !k.ends_with("(collection)"))
        .map(|(k, n)| n - before.get(k).copied().unwrap_or(0.0))
        .sum()
}

pub(crate) fn classify(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
    secs: f64,
) -> BTreeMap<String, f64> {
    let mut out: BTreeMap<String, f64> = [ANNOUNCE, MANAGED_CLUSTER_STATUS, CLUSTER_SET_STATUS, OTHER]
        .into_iter()
        .map(|k| (k.to_string(), 0.0))
        .collect();
    for (what, n) in after {
        let delta = n - before.get(what).copied().unwrap_or(0.0);
        let kind = match what.as_str() {
            "memberclusterannounces" | "leases" => ANNOUNCE,
            "managedclusters/status" => MANAGED_CLUSTER_STATUS,
            "clustersets/status" => CLUSTER_SET_STATUS,
            _ => OTHER,
        };
        *out.entry(kind.to_string()).or_default() += delta / secs;
    }
    out
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_counts_keep_writes_by_resource() {
        let text = r#"# HELP apiserver_request_total x
apiserver_request_total{code="200",component="apiserver",dry_run="",group="multicluster.tether.dev",resource="memberclusterannounces",scope="resource",subresource="",verb="PATCH",version="v1alpha1"} 40
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="namespaces",scope="cluster",subresource="",verb="LIST",version="v1"} 7
apiserver_request_total{code="201",component="apiserver",dry_run="",group="multicluster.tether.dev",resource="managedclusters",scope="resource",subresource="status",verb="APPLY",version="v1alpha1"} 3
apiserver_request_total{code="409",component="apiserver",dry_run="",group="multicluster.tether.dev",resource="memberclusterannounces",scope="resource",subresource="",verb="PATCH",version="v1alpha1"} 2
"#;
        let counts = parse_request_counts(text);
        assert_eq!(counts.get("memberclusterannounces"), Some(&42.0));
        assert_eq!(counts.get("managedclusters/status"), Some(&3.0));
        assert_eq!(counts.get("namespaces"), None, "reads are not writes");
        let before = BTreeMap::from([("memberclusterannounces".to_string(), 2.0)]);
        let kinds = classify(&before, &counts, 2.0);
        assert_eq!(kinds[ANNOUNCE], 20.0);
        assert_eq!(kinds[MANAGED_CLUSTER_STATUS], 1.5);
        assert_eq!(kinds[OTHER], 0.0);
    }
}
