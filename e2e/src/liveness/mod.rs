//! The liveness benchmark (`make bench-liveness`): one leader serving member access and N
//! members simulated by `tether-sim` through the agent's own code, each holding a real tunnel
//! through the leader's kube-apiserver, as real agents do. For each N it measures, in one run on
//! one control plane:
//!
//! - what a member and what an idle tunnel cost kube-apiserver and etcd (RSS, Go heap,
//!   goroutines, file descriptors), and that open tunnels hold no priority-and-fairness seat;
//! - registration: members/s, API writes per registration, and the rate the API server's
//!   measured write limit allows for that many writes;
//! - the steady state with every tunnel attached: writes/s by kind and per member, leader and
//!   kube-apiserver CPU and RSS;
//! - detection: killed agents (tunnel closed, no more renewals) and frozen ones (tunnel open,
//!   answering nothing) to `Ready=Unknown`, p50 and p99;
//! - a leader failover (the serving replica killed for a standby): time until every tunnel is
//!   attached again, members marked Unknown meanwhile (the target is none), and the peak write
//!   rate.
//!
//! Needs root: the leader's proxy listens on the lab bridge (the aggregator cannot route to
//! loopback), as in `make bench-proxy`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::Client;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tether_api::ManagedCluster;
use tether_api::conditions::{ConditionType, find};
use tether_sim::{Fleet, quantile};
use tether_testkit::{TestCluster, free_port, lab};
use tokio_util::sync::CancellationToken;

use crate::fleet::{self, LeaderSide};
use crate::probe::procfs::{CLOCK_TICKS, cpu_ticks, rss_mib};
use crate::probe::prom::{metric, request_counts, request_mix};
use crate::scale::{classify, sim_join, write_limit};
use crate::sim::join_token;

mod apis;
mod failover;
mod held;
mod report;
mod transitions;

use apis::Apis;
pub use failover::Failover;
use failover::failover;
use held::*;
pub use report::{Outcome, report};
use transitions::Transitions;

/// The nice value of the leader's side (kube-apiserver, etcd, kube-controller-manager, the
/// leader's replicas); the simulated fleet runs at 0. It stands in for N clusters, each with its
/// own CPU: starved of this machine's two cores by the very surge it measures (a failover's
/// re-attach), its agents answered no ping for seconds and the leader rightly judged them lost
/// (seen at 9,000: the benchmark's runtime ran up to 4.8 s late while the members it marked
/// went silent).
const LEADER_NICE: i32 = 5;

/// Puts the leader's side (the control plane and `replicas`) behind the simulated fleet for CPU.
fn behind_the_fleet(cluster: &TestCluster, replicas: &[u32]) {
    let control_plane = ["etcd", "kube-controller-manager"]
        .into_iter()
        .filter_map(|p| cluster.pid(p))
        .chain(cluster.api_server_pids());
    crate::probe::procfs::renice(
        &control_plane.chain(replicas.iter().copied()).collect::<Vec<_>>(),
        LEADER_NICE,
    );
}

/// Samples of the executing seats, a second apart, after the steady window (every tunnel open).
const SEAT_SAMPLES: usize = 10;

/// What to run.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Members.
    pub members: usize,
    /// Registrations in flight at once.
    pub concurrency: usize,
    /// Members killed, and as many frozen, to time detection.
    pub probes: usize,
    /// The steady window.
    pub steady: Duration,
    /// How long the failover is watched.
    pub failover_window: Duration,
    /// Each member dials its tunnel as soon as it is in (as agents do), rather than all once
    /// every member is in: registration as a fleet sees it, but no split of what a member and
    /// what its tunnel cost.
    pub attach_at_join: bool,
    /// `--proxy-attach-rate` of the first leader replica and of the standby that takes over,
    /// attaches per second (`None`: the leader's default).
    pub attach_rate: [Option<f64>; 2],
    /// kube-apiservers in front of the leader's etcd (1 or more): members take them in turn
    /// for registration, heartbeats and tunnel, as behind a load balancer. One process may hold
    /// only so many open files, and each holds two per tunnel (the sandbox's hard limit of
    /// 20,000 stops one at about 9,900 tunnels).
    pub api_servers: usize,
    /// The leader's `--approved-request-retention`; when set, what a member holds is measured
    /// again once every approved request is deleted (`per_member` then has none).
    pub approved_retention: Option<Duration>,
}

/// A frozen tunnel of a member, once attached (dropping it closes it).
type Frozen = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Box<dyn std::any::Any + Send>, tether_sim::Error>> + Send>,
>;

/// One member of the run: its heartbeat task, its tunnel task, and how to freeze it.
struct Running {
    name: String,
    heartbeat: CancellationToken,
    tunnel: Option<tokio::task::JoinHandle<()>>,
    frozen: Option<Frozen>,
}

/// Runs the benchmark for `s.members` members.
pub async fn run(s: &Settings) -> Outcome {
    let n = s.members;
    let mut cluster = TestCluster::builder(&format!("live-{n}"))
        .profiling(true)
        .start()
        .await
        .expect("control plane");
    let admin = cluster.client().expect("admin");
    let (mut clients, mut urls) = (vec![admin.clone()], Vec::new());
    for _ in 1..s.api_servers.max(1) {
        let (client, url) = cluster.add_api_server().await.expect("another kube-apiserver");
        clients.push(client);
        urls.push(url);
    }
    let apis = Apis::new(clients, cluster.api_server_pids());
    let etcd_pid = cluster.pid("etcd").expect("etcd");
    eprintln!(
        "== [{n}] measuring the API server's limit for small writes (15 s){}",
        if apis.len() > 1 {
            format!(", through the first of {} kube-apiservers", apis.len())
        } else {
            String::new()
        }
    );
    let api_limit = write_limit(&admin, Duration::from_secs(15)).await;
    eprintln!("   {api_limit:.0} writes/s");
    // NB: members heartbeat without a tunnel until theirs attaches: the interval keeps N of
    // them within 30 % of the limit, as `make bench` chooses it.
    let interval = [10u64, 15, 20, 30, 45, 60, 90, 120]
        .into_iter()
        .find(|i| n as f64 / *i as f64 <= api_limit * 0.3)
        .unwrap_or(120);
    let policy = fleet::policy(&format!("{interval}s"), &format!("{}s", interval * 4));
    let addr = |port| std::net::SocketAddr::from((lab::GATEWAY, port));
    let (port_a, port_b) = (free_port().expect("port"), free_port().expect("port"));
    let (baseline, baseline_etcd) = held_settled(&apis, etcd_pid, Duration::from_secs(5)).await;
    let mut args = failover::rate_args(s.attach_rate[0]);
    args.extend(
        s.approved_retention
            .map(|r| format!("--approved-request-retention={}s", r.as_secs())),
    );
    let leader = LeaderSide::on(cluster)
        .policy(policy)
        .proxy(addr(port_a), 15)
        .args(&args.iter().map(String::as_str).collect::<Vec<_>>())
        .start()
        .await;
    behind_the_fleet(&leader.cluster, &[leader.controller.pid()]);
    let (transitions, watch) = Transitions::follow(&admin);
    let token = join_token(&admin).await;
    let join = sim_join(&leader, &token);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut sim = loop {
        match Fleet::connect(join.clone()).await {
            Ok(f) => break f,
            Err(_) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(200)).await,
            Err(e) => panic!("connect to the leader: {e}"),
        }
    };
    for url in &urls {
        sim.also_through(url).expect("another API server of the leader");
    }
    if s.attach_at_join {
        // NB: as agents do: the tunnel first, then the first heartbeat.
        sim.tunnels_at_join("prod");
    }
    let leader_alone = rss_mib(leader.controller.pid(), "VmRSS");

    let at_join = s.attach_at_join;
    eprintln!(
        "== [{n}] registering {n} members, {} in flight, tunnels {} (heartbeat {interval}s without one)",
        s.concurrency,
        if at_join {
            "dialled once in, as agents do"
        } else {
            "later"
        }
    );
    let (before, beats_before) = (apis.request_counts().await, sim.stats.heartbeats());
    let mix_before = apis.request_mix().await;
    let started = Instant::now();
    let names: Vec<String> = (0..n).map(|i| format!("live-{i:05}")).collect();
    let mut running: Vec<Running> = Vec::with_capacity(n);
    let mut tunnels = Vec::with_capacity(n);
    tether_sim::join_all(&sim, names.clone(), s.concurrency, |mut m, _| {
        // NB: each heartbeats from the moment it is in, as an agent does.
        let cancel = CancellationToken::new();
        let i = running.len();
        let tunnel = m.tunnel_task.take();
        if !at_join {
            tunnels.push(m.tunnel("prod"));
        }
        running.push(Running {
            name: m.name.clone(),
            heartbeat: cancel.clone(),
            tunnel,
            frozen: (i < 2 * s.probes).then(|| Box::pin(m.frozen_tunnel("prod")) as Frozen),
        });
        tokio::spawn(m.heartbeat_until(cancel));
        if (i + 1).is_multiple_of((n / 10).max(1)) {
            eprintln!("   {} joined after {:.0?}", i + 1, started.elapsed());
        }
    })
    .await
    .expect("members join");
    let registration = started.elapsed();
    let after = apis.request_counts().await;
    let registration_mix: BTreeMap<String, f64> = apis
        .request_mix()
        .await
        .into_iter()
        .map(|(k, v)| {
            let d = (v - mix_before.get(&k).copied().unwrap_or(0.0)) / n as f64;
            (k, d)
        })
        .filter(|(_, d)| *d >= 0.05)
        .collect();
    // NB: the heartbeats members sent while others registered are not the registrations' writes.
    let beats = (sim.stats.heartbeats() - beats_before) as f64;
    let writes_per_registration = (after
        .iter()
        .map(|(k, v)| v - before.get(k).copied().unwrap_or(0.0))
        .sum::<f64>()
        - beats)
        / n as f64;
    let registration_rate = n as f64 / registration.as_secs_f64();
    eprintln!(
        "   {registration_rate:.1} registrations/s, {writes_per_registration:.1} writes each, not counting \
         {beats} heartbeats (the limit allows {:.1}/s)",
        api_limit / writes_per_registration
    );
    crate::scale::wait_for_counts(&admin, n, n, Duration::from_secs(900)).await;
    let t0 = Instant::now();
    if at_join {
        all_attached(&leader, &transitions, n, t0).await;
    }
    let attached_at_join = t0.elapsed();
    eprintln!("== [{n}] all Ready; measuring what the members hold");
    let (mut members_held, mut members_etcd) = held_settled(&apis, etcd_pid, Duration::from_secs(20)).await;
    let per_member_with_request = match s.approved_retention {
        Some(r) => {
            let with = (
                members_held.minus(baseline, n),
                (members_etcd - baseline_etcd) * 1024.0 / n as f64,
            );
            let kept = requests_gone(&admin, r + Duration::from_secs(900)).await;
            (members_held, members_etcd) = held_settled(&apis, etcd_pid, Duration::from_secs(20)).await;
            Some((with, kept))
        }
        None => None,
    };
    let leader_before = (leader_alone, rss_mib(leader.controller.pid(), "VmRSS"));
    let (attach_all, per_tunnel) = if at_join {
        (attached_at_join, None)
    } else {
        eprintln!("== [{n}] attaching {n} tunnels");
        let t0 = Instant::now();
        // NB: 1,000 agents a second start their tunnel (as a fleet rolled out), not all at once.
        for (i, (r, t)) in running.iter_mut().zip(tunnels).enumerate() {
            r.tunnel = Some(tokio::spawn(t));
            if i % 10 == 9 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        all_attached(&leader, &transitions, n, t0).await;
        let attach_all = t0.elapsed();
        eprintln!(
            "   all attached and Ready on them after {attach_all:.1?}; settling one heartbeat interval"
        );
        let (held, etcd) = held_settled(&apis, etcd_pid, Duration::from_secs(interval + 5)).await;
        let per = (
            held.minus(members_held, n),
            (etcd - members_etcd) * 1024.0 / n as f64,
        );
        (attach_all, Some(per))
    };
    let mut seats = 0f64;

    eprintln!("== [{n}] steady state for {:?}", s.steady);
    let procs = [leader.controller.pid(), etcd_pid];
    let cpu0: Vec<u64> = procs.iter().map(|p| cpu_ticks(*p)).collect();
    let api_cpu0 = apis.cpu_ticks();
    let (w0, steady_start) = (apis.request_counts().await, Instant::now());
    // NB: nothing is read from the API server inside the window but its request counts at both
    // ends: its whole `/metrics` each second cost it more CPU than 1,000 idle tunnels (a third
    // of its steady CPU in a profile), and the window measures what the members cost it.
    tokio::time::sleep(s.steady).await;
    let secs = steady_start.elapsed().as_secs_f64();
    let steady_writes = classify(&w0, &apis.request_counts().await, secs);
    let cpu: Vec<f64> = procs
        .iter()
        .zip(&cpu0)
        .map(|(p, c0)| (cpu_ticks(*p) - c0) as f64 / CLOCK_TICKS / secs)
        .collect();
    let api_cpu = (apis.cpu_ticks() - api_cpu0) as f64 / CLOCK_TICKS / secs;
    for _ in 0..SEAT_SAMPLES {
        let texts = apis.metrics().await;
        let now: f64 = texts
            .iter()
            .map(|t| sum_of(t, "apiserver_flowcontrol_current_executing_seats"))
            .sum();
        seats = seats.max(now);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let rss = (
        rss_mib(leader.controller.pid(), "VmRSS"),
        apis.rss(),
        rss_mib(etcd_pid, "VmRSS"),
    );

    let detection = detect(s, &transitions, &mut running).await;
    let (seen, leader) = failover(s, leader, addr(port_b), &apis, &transitions, &running).await;
    for r in &running {
        r.heartbeat.cancel();
        if let Some(t) = &r.tunnel {
            t.abort();
        }
    }
    watch.abort();
    drop(leader);
    Outcome {
        members: n,
        api_servers: apis.len(),
        api_limit,
        registration_rate,
        writes_per_registration,
        registration_mix,
        per_member: (
            members_held.minus(baseline, n),
            (members_etcd - baseline_etcd) * 1024.0 / n as f64,
        ),
        per_member_with_request,
        per_tunnel,
        attach_at_join: at_join,
        seats,
        steady_writes,
        steady_cpu: (cpu[0], api_cpu, cpu[1]),
        rss,
        leader_before,
        attach_all,
        killed: detection.0,
        frozen: detection.1,
        detection: detection.2,
        failover: seen,
    }
}

/// Waits until the leader holds `n` tunnels and every member is Ready on its tunnel (15 min at
/// most from `since`).
async fn all_attached(leader: &LeaderSide, transitions: &Transitions, n: usize, since: Instant) {
    let mut told = Instant::now();
    loop {
        let (held, alive) = (
            tunnels_at(&leader.controller).await,
            transitions.count("TunnelAlive"),
        );
        if held >= n as f64 && alive >= n {
            return;
        }
        if told.elapsed() >= Duration::from_secs(5) {
            eprintln!(
                "   after {:.0?}: {held} tunnels held, {alive} members Ready on them",
                since.elapsed()
            );
            told = Instant::now();
        }
        assert!(
            since.elapsed() < Duration::from_secs(900),
            "every tunnel attached within 15 min"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Kills `s.probes` members (tunnel closed, no more renewals) and freezes as many (tunnel open,
/// answering nothing), and times each to `Ready=Unknown`.
async fn detect(
    s: &Settings,
    transitions: &Transitions,
    running: &mut [Running],
) -> (Vec<Duration>, Vec<Duration>, (Duration, Duration)) {
    let n = running.len();
    let policy = tether_api::clusterset::LeaderSpec::default();
    let timings = (policy.tunnel_detection(), policy.ping_timeout());
    eprintln!("== [{n}] killing {} agents", s.probes);
    let killed_at = Instant::now();
    let killed: Vec<String> = running[..s.probes]
        .iter_mut()
        .map(|r| {
            r.heartbeat.cancel();
            if let Some(t) = r.tunnel.take() {
                t.abort();
            }
            r.name.clone()
        })
        .collect();
    let killed = times_to_unknown(transitions, &killed, killed_at).await;
    eprintln!("== [{n}] freezing {} agents", s.probes);
    let mut held = Vec::new();
    let mut frozen_at = Vec::new();
    for r in running[s.probes..2 * s.probes].iter_mut() {
        r.heartbeat.cancel();
        if let Some(t) = r.tunnel.take() {
            t.abort();
        }
        let frozen = r.frozen.take().expect("a member set aside to freeze");
        held.push(frozen.await.expect("frozen tunnel attaches"));
        frozen_at.push((r.name.clone(), Instant::now()));
    }
    let mut frozen = Vec::new();
    for (name, at) in &frozen_at {
        frozen.extend(times_to_unknown(transitions, std::slice::from_ref(name), *at).await);
    }
    frozen.sort();
    drop(held);
    (killed, frozen, timings)
}

/// For each of `names`, the time from `since` until it was seen `Ready=Unknown` (waiting up
/// to 2 minutes), sorted.
async fn times_to_unknown(transitions: &Transitions, names: &[String], since: Instant) -> Vec<Duration> {
    let deadline = since + Duration::from_secs(120);
    loop {
        let seen: Vec<Option<Instant>> = names
            .iter()
            .map(|n| transitions.first(n, "Unknown", since))
            .collect();
        if seen.iter().all(Option::is_some) || Instant::now() > deadline {
            let mut out: Vec<Duration> = seen
                .into_iter()
                .map(|t| t.map_or(Duration::from_secs(120), |t| t - since))
                .collect();
            out.sort();
            return out;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
