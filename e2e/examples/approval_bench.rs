//! Benchmark: request → Approved latency (p50/p99) and leader API writes per registration, on a
//! real control plane with the leader controller running as its own ServiceAccount.
//!
//! `cargo run --release -p tether-e2e --example approval_bench -- [N] [CONCURRENCY]`
//! (`make bench-leader`). Writes are counted from the API server's audit log (user = the
//! leader's ServiceAccount, verbs create/update/patch/delete).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use tether_api::ClusterRegistrationRequest;
use tether_api::registration::RegistrationResult;
use tether_e2e::create_raw;
use tether_e2e::sim::{HOME, Leader};
use tether_testkit::{BootstrapToken, CreateToken, TestCluster};

const LEADER_USER: &str = "system:serviceaccount:tether-system:tether-leader";

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(200);
    let concurrency: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(10);
    eprintln!("== approval benchmark: {n} registrations, {concurrency} at a time");

    let cluster = TestCluster::builder("bench-approval")
        .audit_log(true)
        .start()
        .await
        .expect("cluster");
    let l = Leader::on(cluster).start().await;
    let token = BootstrapToken::random();
    token
        .create(&l.admin, Some(&tether_e2e::sim::home()), None)
        .await
        .expect("token");
    let joiner = l.cluster.client_with_token(&token.token()).expect("joiner");

    // Watch for approvals, recording when each request is first seen Approved.
    let approved: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let seen = approved.clone();
    let api = Api::<ClusterRegistrationRequest>::namespaced(l.admin.clone(), HOME);
    tokio::spawn(async move {
        let mut events = watcher(api, watcher::Config::default()).applied_objects().boxed();
        while let Ok(Some(r)) = events.try_next().await {
            if r.status.as_ref().map(|s| s.result) == Some(RegistrationResult::Approved) {
                seen.lock()
                    .unwrap()
                    .entry(r.name_any())
                    .or_insert_with(Instant::now);
            }
        }
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    let audit_start = std::fs::metadata(l.cluster.audit_log())
        .map(|m| m.len())
        .unwrap_or(0);

    let keys: Vec<String> = (0..n).map(|_| tether_seal::generate_keypair().1).collect();
    let started = Instant::now();
    let created: Vec<(String, Instant)> = futures::stream::iter(keys.into_iter().enumerate())
        .map(|(i, key)| {
            let joiner = joiner.clone();
            let approved = approved.clone();
            async move {
                let name = format!("member-{i:04}");
                let body = json!({"apiVersion": "multicluster.tether.dev/v1alpha1",
                                  "kind": "ClusterRegistrationRequest", "metadata": {"name": name},
                                  "spec": {"clusterID": format!("id-{i:04}"), "clusterName": name, "publicKey": key}});
                let t0 = Instant::now();
                create_raw::<ClusterRegistrationRequest>(&joiner, Some(HOME), body)
                    .await
                    .expect("create request");
                // Pace each slot on its own approval, as agents wait for theirs.
                wait_approved(&approved, &name, Duration::from_secs(120)).await;
                (name, t0)
            }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    let wall = started.elapsed();
    let approvals = approved.lock().unwrap().clone();
    let mut latencies: Vec<Duration> = created
        .iter()
        .map(|(name, t0)| approvals[name].saturating_duration_since(*t0))
        .collect();
    latencies.sort();

    // Let trailing writes (ClusterSet status, Events, Ready conditions) land before counting.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let writes = leader_writes(&l.cluster, audit_start);
    let total: usize = writes.values().sum();

    let pct =
        |p: f64| latencies[((latencies.len() as f64 * p).ceil() as usize).clamp(1, latencies.len()) - 1];
    println!("\napproval benchmark ({n} registrations, {concurrency} concurrent)");
    println!("| figure | value |\n| --- | --- |");
    println!(
        "| request → Approved p50 | {:.0} ms |",
        pct(0.50).as_secs_f64() * 1000.0
    );
    println!(
        "| request → Approved p99 | {:.0} ms |",
        pct(0.99).as_secs_f64() * 1000.0
    );
    println!(
        "| request → Approved max | {:.0} ms |",
        latencies[latencies.len() - 1].as_secs_f64() * 1000.0
    );
    println!(
        "| throughput | {:.1} registrations/s |",
        n as f64 / wall.as_secs_f64()
    );
    println!(
        "| leader API writes per registration | {:.2} |",
        total as f64 / n as f64
    );
    for (what, count) in &writes {
        println!("| … {what} | {:.2} |", *count as f64 / n as f64);
    }
    println!(
        "\nmachine: {} CPUs, {} (a test control plane on the same machine)",
        std::thread::available_parallelism().map(|p| p.get()).unwrap_or(0),
        std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| m.lines().next().map(|l| l
                .split_whitespace()
                .skip(1)
                .collect::<Vec<_>>()
                .join(" ")))
            .map(|m| format!("MemTotal {m}"))
            .unwrap_or_default()
    );
}

async fn wait_approved(approved: &Mutex<HashMap<String, Instant>>, name: &str, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while !approved.lock().unwrap().contains_key(name) {
        assert!(
            Instant::now() < deadline,
            "{name} not approved within {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The leader's writes in the audit log after byte `from`, by `verb resource[/subresource]`.
fn leader_writes(cluster: &TestCluster, from: u64) -> BTreeMap<String, usize> {
    let text = std::fs::read(cluster.audit_log()).expect("audit log");
    let mut out = BTreeMap::new();
    for line in text[from as usize..].split(|b| *b == b'\n') {
        let Ok(ev) = serde_json::from_slice::<serde_json::Value>(line) else {
            continue;
        };
        let verb = ev["verb"].as_str().unwrap_or_default();
        if ev["stage"] != "ResponseComplete"
            || ev["user"]["username"] != LEADER_USER
            || !matches!(
                verb,
                "create" | "update" | "patch" | "delete" | "deletecollection"
            )
        {
            continue;
        }
        let r = &ev["objectRef"];
        let mut what = format!("{verb} {}", r["resource"].as_str().unwrap_or_default());
        if let Some(sub) = r["subresource"].as_str() {
            what = format!("{what}/{sub}");
        }
        *out.entry(what).or_default() += 1;
    }
    out
}
