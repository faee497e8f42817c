//! The liveness benchmark (`make bench-liveness`): for each N, a fresh control plane, the leader
//! serving member access as its own process, and N members simulated by `tether-sim` through the
//! agent's own code, each holding a real tunnel. Prints one table per N (`e2e/src/liveness/mod.rs`
//! says what is measured); `docs/benchmarks.md` keeps the recorded numbers.
//!
//! `cargo run --release -p tether-e2e --example liveness_bench -- [N…] [--probes K]
//!  [--steady SECONDS] [--attach-at-join] [--in-flight K] [--attach-rate R] [--api-servers K]
//!  [--approved-request-retention SECONDS]` (default N: 1000 5000 10000; probes:
//! 20 killed and 20 frozen agents; steady: 60; registrations in flight: 1000). By default every
//! tunnel attaches once all members are in, to measure what a member and what a tunnel cost
//! apart; `--attach-at-join` dials each as soon as its member is in, as agents do, to measure
//! registration as a fleet sees it. `--attach-rate` sets the leader's
//! `--proxy-attach-rate` (attaches per second; 0: unpaced). `--api-servers K` runs K
//! kube-apiservers in front of the one etcd, members taking them in turn, their figures summed
//! (each holds two open files per tunnel, and one process here may hold 20,000).
//! `--approved-request-retention` sets the leader's, and measures what a member holds again once
//! every approved request is deleted. Needs root (its lab network namespace).

use std::process::ExitCode;
use std::time::Duration;

use tether_e2e::liveness::{Settings, report, run};
use tether_testkit::lab;

fn main() -> ExitCode {
    if let Err(err) = lab::enter() {
        eprintln!("error: the liveness benchmark needs its lab network namespace: {err}");
        return ExitCode::FAILURE;
    }
    let open_files = match tether_testkit::process::raise_open_files() {
        Ok((before, after)) => {
            eprintln!("== open files: {after} (was {before})");
            after
        }
        Err(e) => {
            eprintln!("warning: cannot raise the limit of open files: {e}");
            0
        }
    };
    let mut sizes = Vec::new();
    let (mut probes, mut steady, mut attach_at_join, mut in_flight) = (20usize, 60u64, false, 1000usize);
    let (mut attach_rate, mut api_servers, mut approved_retention) = (None, 1usize, None);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |flag: &str| {
            args.next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or_else(|| panic!("{flag} needs a number"))
        };
        match a.as_str() {
            "--attach-at-join" => attach_at_join = true,
            "--probes" => probes = value("--probes") as usize,
            "--in-flight" => in_flight = value("--in-flight").max(1) as usize,
            "--steady" => steady = value("--steady"),
            "--api-servers" => api_servers = value("--api-servers").max(1) as usize,
            "--approved-request-retention" => {
                approved_retention = Some(Duration::from_secs(value("--approved-request-retention")));
            }
            "--attach-rate" => {
                attach_rate = Some(
                    args.next()
                        .and_then(|v| v.parse::<f64>().ok())
                        .unwrap_or_else(|| panic!("--attach-rate needs a number")),
                );
            }
            n => sizes.push(
                n.parse::<usize>()
                    .unwrap_or_else(|_| panic!("not a member count: {n}")),
            ),
        }
    }
    if sizes.is_empty() {
        sizes = vec![1000, 5000, 10_000];
    }
    // NB: kube-apiserver holds two descriptors per member with its tunnel, and more while a
    // failover's tunnels come back; short of them it fails new connections ("too many open
    // files") and the members whose tunnels it cannot carry get marked.
    let most = sizes.iter().max().copied().unwrap_or(0) as u64;
    let per_api_server = most.div_ceil(api_servers as u64);
    if open_files > 0 && open_files < per_api_server * 2 + 4000 {
        eprintln!(
            "warning: {open_files} open files are too few for a kube-apiserver with {per_api_server} members \
             and their tunnels (about {}); its failover figures will show it (try --api-servers)",
            per_api_server * 2 + 4000
        );
    }
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let cpus = std::thread::available_parallelism().map_or(0, |p| p.get());
    let binary = std::env::var("TETHER_BIN_DIR").unwrap_or_else(|_| "target/debug".into());
    eprintln!("== liveness benchmark: N = {sizes:?} on {cpus} CPUs; leader binary from {binary}");
    for n in sizes {
        let settings = Settings {
            members: n,
            concurrency: n.min(in_flight),
            probes: probes.min(n / 4),
            steady: Duration::from_secs(steady),
            failover_window: Duration::from_secs(120),
            attach_at_join,
            attach_rate: [attach_rate; 2],
            api_servers,
            approved_retention,
        };
        let outcome = rt.block_on(run(&settings));
        println!("{}", report(&outcome));
    }
    ExitCode::SUCCESS
}
