//! Smoke run of the scale benchmark (`make bench`) with N = 50, so that the simulator and the
//! harness keep working. It checks what the benchmark is for, not how fast it goes: every
//! simulated member joins through the agent's code and becomes Ready, each heartbeat costs
//! exactly one announce write, nothing else writes at steady state, a silent member is not
//! marked lost before its grace period, and join/leave show in the ClusterSet status.

use std::time::Duration;

use tether_e2e::scale::{Settings, run};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_benchmark_smoke_run() {
    let o = run(&Settings {
        members: 50,
        concurrency: 50,
        interval: Some(2),
        steady: Duration::from_secs(20),
        limit_window: Duration::from_secs(5),
    })
    .await;
    let table = o.table();
    println!("{table}");

    assert_eq!(o.approved.len(), 50, "every request was seen Approved");
    assert_eq!(
        o.usable.len(),
        50,
        "every member heartbeat with its own credential"
    );
    assert!(o.api_limit > 0.0, "the API server limit was measured");
    // 50 members every 2 s ± 10% is 25 heartbeats per second.
    assert!(
        (20.0..=30.0).contains(&o.heartbeats),
        "heartbeats/s {}\n{table}",
        o.heartbeats
    );
    assert!(
        (0.95..=1.05).contains(&o.writes_per_heartbeat()),
        "one announce write per heartbeat\n{table}"
    );
    for kind in ["ManagedCluster status", "ClusterSet status"] {
        assert_eq!(
            o.writes.get(kind).copied(),
            Some(0.0),
            "no {kind} write without a change\n{table}"
        );
    }
    assert_eq!(o.heartbeat_failures, 0, "{table}");
    assert!(
        o.detection >= Duration::from_secs(o.grace),
        "a silent member is not marked lost before its grace period\n{table}"
    );
    assert!(o.leader_rss > 0.0 && o.leader_peak_rss >= o.leader_rss, "{table}");
    assert!(
        o.steady_cpu.contains_key("tether leader") && o.steady_cpu.contains_key("kube-apiserver"),
        "{table}"
    );
}
