//! `tether-sim`: N simulated member agents in one process against a real Tether leader.
//! See the library documentation for what is simulated and how.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use tether_sim::{Fleet, Join, join_all, quantile};
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

/// Simulate N member agents against a Tether leader: each registers with the join token through
/// the agent's own code, reports a status, then heartbeats at the interval the leader sets.
/// Ctrl-C (or SIGTERM) stops them; with --leave they deregister first.
#[derive(Parser, Debug)]
#[command(name = "tether-sim", version)]
struct Args {
    /// The leader's API server URL (https).
    #[arg(long, env = "TETHER_LEADER_URL")]
    leader_url: String,
    /// The join (bootstrap) token, as printed by `tether init` or `tether token create`.
    #[arg(long, env = "TETHER_JOIN_TOKEN", hide_env_values = true)]
    token: String,
    /// The leader CA pin, `sha256:<hex>`, as printed by `tether init`.
    #[arg(long)]
    ca_cert_hash: String,
    /// The ClusterSet's namespace on the leader.
    #[arg(long, default_value = "tether-system")]
    namespace: String,
    /// How many members to simulate.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    members: u32,
    /// How many registrations are in flight at once.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    concurrency: u32,
    /// Member names are `<prefix>-<n>` (also their cluster IDs); must be a DNS-1123 label start.
    #[arg(long, default_value = "sim")]
    prefix: String,
    /// Deregister every member on exit.
    #[arg(long)]
    leave: bool,
    /// Also keep each member's tunnel attached (member access), starting this long after all
    /// members joined (e.g. 0s); default: no tunnels.
    #[arg(long, value_parser = tether_api::duration::parse)]
    tunnels_after: Option<Duration>,
    /// The ClusterSet the members join (the prefix of impersonated names).
    #[arg(long, default_value = "prod")]
    clusterset: String,
    /// Exit after this long heartbeating (e.g. 10m); default: until Ctrl-C.
    #[arg(long, value_parser = tether_api::duration::parse)]
    duration: Option<Duration>,
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,tether_sim=info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e}");
            eprintln!("tether-sim: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), tether_sim::Error> {
    let fleet = Fleet::connect(Join {
        leader_url: args.leader_url.clone(),
        ca_cert_hash: args.ca_cert_hash.clone(),
        token: args.token.clone(),
        namespace: args.namespace.clone(),
        registration_timeout: Duration::from_secs(600),
    })
    .await?;
    let n = args.members as usize;
    let names = (0..n).map(|i| format!("{}-{i:05}", args.prefix)).collect();
    let started = Instant::now();
    let step = (n / 20).max(1);
    let cancel = CancellationToken::new();
    let mut tasks = Vec::with_capacity(n);
    let mut usable = Vec::with_capacity(n);
    let mut tunnels = Vec::new();
    join_all(&fleet, names, args.concurrency as usize, |member, timings| {
        if args.tunnels_after.is_some() {
            tunnels.push(member.tunnel(&args.clusterset));
        }
        tasks.push(tokio::spawn(member.heartbeat_until(cancel.clone())));
        usable.push(timings.usable);
        let k = usable.len();
        if k % step == 0 || k == n {
            info!(
                joined = k,
                of = n,
                elapsed_s = started.elapsed().as_secs(),
                "Registering"
            );
        }
    })
    .await?;
    let wall = started.elapsed();
    usable.sort();
    println!(
        "registered {n} members in {:.1}s ({:.1}/s); request → usable credential p50 {:.0} ms, p99 {:.0} ms",
        wall.as_secs_f64(),
        n as f64 / wall.as_secs_f64(),
        quantile(&usable, 0.5).as_secs_f64() * 1000.0,
        quantile(&usable, 0.99).as_secs_f64() * 1000.0
    );

    let tunnel_tasks = args.tunnels_after.map(|after| {
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            let n = tunnels.len();
            let running: Vec<_> = tunnels.into_iter().map(tokio::spawn).collect();
            println!("tunnels: {n} started");
            futures::future::join_all(running).await;
        })
    });
    let stats = fleet.stats.clone();
    let report = {
        let stats = Arc::clone(&stats);
        tokio::spawn(async move {
            let mut last = (Instant::now(), stats.heartbeats());
            loop {
                tokio::time::sleep(Duration::from_secs(30)).await;
                let now = (Instant::now(), stats.heartbeats());
                let rate = (now.1 - last.1) as f64 / (now.0 - last.0).as_secs_f64();
                info!(
                    heartbeats_per_s = format!("{rate:.1}"),
                    failures = stats.failures(),
                    "Heartbeating"
                );
                last = now;
            }
        })
    };
    let stop = async {
        match args.duration {
            Some(d) => tokio::time::sleep(d).await,
            None => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    };
    tokio::select! {
        _ = stop => {}
        _ = sigterm() => {}
    }
    cancel.cancel();
    report.abort();
    if let Some(t) = tunnel_tasks {
        t.abort();
    }
    let mut members = Vec::with_capacity(tasks.len());
    for t in tasks {
        if let Ok(m) = t.await {
            members.push(m);
        }
    }
    println!(
        "heartbeats: {} accepted, {} failed",
        stats.heartbeats(),
        stats.failures()
    );
    if args.leave {
        use futures::StreamExt;
        let failed = futures::stream::iter(&members)
            .map(|m| m.leave())
            .buffer_unordered(args.concurrency as usize)
            .filter(|r| futures::future::ready(r.is_err()))
            .count()
            .await;
        println!("left: {} members, {failed} failed", members.len() - failed);
    }
    Ok(())
}

async fn sigterm() {
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut s) => {
            s.recv().await;
        }
        Err(_) => std::future::pending().await,
    }
}
