//! The scale benchmark (`make bench`): one real control plane, the leader as its own process
//! (`tether-controller leader`, its own ServiceAccount), and N members simulated by `tether-sim`
//! in this process. Measures registration, steady-state writes by kind, the leader's CPU and
//! memory, loss detection, join/leave visibility, and the API server's own limit for small
//! writes on the same machine, against which the other figures are put.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

mod phases;
mod replay;
mod report;
mod setup;
mod writes;

use crate::probe::procfs::*;
use crate::probe::prom::*;
use phases::*;
use setup::*;

pub(crate) use phases::classify;
pub use replay::{Ceiling, registration_ceiling};
pub use report::capacity_table;
pub use setup::sim_join;
pub(crate) use setup::{set_counts, wait_for_counts};
pub use writes::{WriteCost, write_costs, write_limit};

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
    /// Once every member is Ready: the leader's `MemberReady` and `MemberLost` Events (each
    /// member declared Ready once, unless it was lost and came back).
    pub declared: (usize, usize),
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
    let declared = (
        events_of(&admin, "MemberReady").await,
        events_of(&admin, "MemberLost").await,
    );

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
        declared,
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

/// What a credential renewal creates (`apiserver_request_total` resource/subresource).
const TOKEN_REQUESTS: &str = "serviceaccounts/token";

/// The inventory namespace of a run with ClusterProfiles.
const INVENTORY: &str = "inventory";
