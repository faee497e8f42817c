//! The scale benchmark (`make bench`): for each N, a fresh control plane, the leader as its own
//! process, and N members simulated by `tether-sim` through the agent's own code. Prints one
//! table per N, then a summary. See `docs/benchmarks.md` for the recorded numbers.
//!
//! `cargo run --release -p tether-e2e --example scale_bench -- [N…] [--concurrency C]
//!  [--interval SECONDS] [--steady SECONDS] [--credential-ttl SECONDS] [--failovers K]
//!  [--failover-bins DIR[,DIR…]] [--cluster-profiles]` (default N:
//! 100 1000 5000 10000; concurrency: min(N, 1000); interval: chosen from the measured API server
//! limit; steady: 60; credential TTL: the leader's default and no renewal window; with it, each
//! run waits until every member renews at its own pace and measures the renewals, ¾ TTL after
//! the last join; failovers: 1, each measured over its own 2 minutes; failover bins: the
//! `tether-controller` each new leader runs, in turn, to compare two builds on one fleet;
//! cluster profiles: the members are also published as ClusterProfiles, and those writes are
//! counted by phase).

use std::time::Duration;

use tether_e2e::scale::{Outcome, Settings, capacity_table, run};
use tether_sim::quantile;

#[tokio::main]
async fn main() {
    let mut sizes = Vec::new();
    let (mut concurrency, mut interval, mut steady, mut ttl) = (None, None, 60u64, None);
    let mut failovers = 1;
    let mut failover_bins = Vec::new();
    let mut cluster_profiles = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--failover-bins" {
            let dirs = args.next().expect("--failover-bins needs DIR[,DIR…]");
            failover_bins = dirs.split(',').map(std::path::PathBuf::from).collect();
            continue;
        }
        let mut value = |flag: &str| {
            args.next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or_else(|| panic!("{flag} needs a number"))
        };
        match a.as_str() {
            "--concurrency" => concurrency = Some(value("--concurrency") as usize),
            "--interval" => interval = Some(value("--interval")),
            "--steady" => steady = value("--steady"),
            "--credential-ttl" => ttl = Some(Duration::from_secs(value("--credential-ttl"))),
            "--failovers" => failovers = value("--failovers") as usize,
            "--cluster-profiles" => cluster_profiles = true,
            n => sizes.push(
                n.parse::<usize>()
                    .unwrap_or_else(|_| panic!("not a member count: {n}")),
            ),
        }
    }
    if sizes.is_empty() {
        sizes = vec![100, 1000, 5000, 10_000];
    }
    let machine = machine();
    eprintln!("== scale benchmark: N = {sizes:?} on {machine}");
    let mut outcomes: Vec<Outcome> = Vec::new();
    for n in sizes {
        let settings = Settings {
            members: n,
            concurrency: concurrency.unwrap_or(n.min(1000)),
            interval,
            steady: Duration::from_secs(steady),
            limit_window: Duration::from_secs(15),
            failover_window: Duration::from_secs(120),
            failovers,
            failover_bins: failover_bins.clone(),
            credential_ttl: ttl,
            cluster_profiles,
        };
        let o = run(&settings).await;
        println!("{}", o.table());
        outcomes.push(o);
    }
    println!("\n## Summary ({machine})\n");
    println!(
        "| N | heartbeat | reg/s | Approved p50/p99 | usable p99 | writes/heartbeat | steady writes/s (% of limit) | leader CPU steady | leader CPU reg | API server CPU steady | leader RSS peak | silent → Unknown | join / leave visible |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for o in &outcomes {
        println!(
            "| {} | {}s | {:.1} | {:.0}/{:.0} ms | {:.0} ms | {:.2} | {:.1} ({:.0}%) | {:.0}% | {:.0}% | {:.0}% | {:.0} MiB | {:.1} s (grace {}s) | {:.1} / {:.1} s |",
            o.members,
            o.interval,
            o.throughput(),
            quantile(&o.approved, 0.5).as_secs_f64() * 1000.0,
            quantile(&o.approved, 0.99).as_secs_f64() * 1000.0,
            quantile(&o.usable, 0.99).as_secs_f64() * 1000.0,
            o.writes_per_heartbeat(),
            o.total_writes(),
            o.total_writes() / o.api_limit * 100.0,
            o.steady_cpu.get("tether leader").copied().unwrap_or(0.0) * 100.0,
            o.registration_cpu.get("tether leader").copied().unwrap_or(0.0) * 100.0,
            o.steady_cpu.get("kube-apiserver").copied().unwrap_or(0.0) * 100.0,
            o.leader_peak_rss,
            o.detection.as_secs_f64(),
            o.grace,
            o.join_visible.as_secs_f64(),
            o.leave_visible.as_secs_f64(),
        );
    }
    if let Some(limit) = outcomes.iter().map(|o| o.api_limit).reduce(f64::min) {
        println!(
            "\nAPI server limit for small writes: {:.0}–{:.0} writes/s. Members it allows:\n",
            limit,
            outcomes.iter().map(|o| o.api_limit).fold(0.0, f64::max)
        );
        println!("{}", capacity_table(limit));
    }
}

fn machine() -> String {
    let cpus = std::thread::available_parallelism().map(|p| p.get()).unwrap_or(0);
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .next()
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|k| k.parse::<f64>().ok())
        })
        .map(|kib| format!("{:.0} GiB", kib / 1024.0 / 1024.0))
        .unwrap_or_default();
    format!("{cpus} CPUs, {mem}")
}
