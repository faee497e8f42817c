//! What one write of each kind Tether relies on costs the API server (`make bench-costs`): a
//! Lease heartbeat, the agent's announce heartbeat (a custom resource) and a credential renewal
//! (TokenRequest), each with 32 writers on one real control plane; then what credential
//! renewals cost at 10,000 members for a few `credentialTTL`s; then the ceiling of registration
//! throughput: a registration's writes alone, replayed, against the API server's write limit
//! (`tether_e2e::scale::registration_ceiling`).
//!
//! `cargo run --release -p tether-e2e --example write_costs -- [WINDOW_SECONDS]` (default 20).

use std::time::Duration;

use tether_e2e::scale::{registration_ceiling, write_costs, write_limit};
use tether_testkit::{TestCluster, install_tether_crds};

#[tokio::main]
async fn main() {
    let window = std::env::args()
        .nth(1)
        .map(|a| a.parse::<u64>().expect("WINDOW_SECONDS is a number"))
        .unwrap_or(20);
    // NB: the controller-manager runs (idle until the replay): a new namespace's own writes are
    // part of a registration's cost.
    let cluster = TestCluster::builder("costs")
        .start()
        .await
        .expect("control plane");
    install_tether_crds(&cluster.client().expect("admin"))
        .await
        .expect("CRDs");
    eprintln!("== 32 writers per kind, {window} s each");
    let costs = write_costs(&cluster, Duration::from_secs(window)).await;
    let lease = costs
        .first()
        .map(|c| (c.rate, c.api_cpu_ms + c.etcd_cpu_ms))
        .unwrap_or((1.0, 1.0));
    println!(
        "| write | writes/s | kube-apiserver CPU per write | etcd CPU per write | vs Lease (rate / CPU) |"
    );
    println!("| --- | --- | --- | --- | --- |");
    for c in &costs {
        println!(
            "| {} | {:.0} | {:.2} ms | {:.2} ms | {:.2}× / {:.2}× |",
            c.what,
            c.rate,
            c.api_cpu_ms,
            c.etcd_cpu_ms,
            c.rate / lease.0,
            (c.api_cpu_ms + c.etcd_cpu_ms) / lease.1
        );
    }
    let token_rate = costs.last().map(|c| c.rate).unwrap_or(1.0);
    println!(
        "\nCredential renewals at 10,000 members (the agent renews with a third of the lifetime left):\n"
    );
    println!("| credentialTTL | TokenRequests/s | share of the measured TokenRequest limit |");
    println!("| --- | --- | --- |");
    for (ttl, label) in [(600.0, "10m"), (3600.0, "1h (default)"), (86400.0, "24h")] {
        let rate = 10_000.0 / (ttl * 2.0 / 3.0);
        println!("| {label} | {rate:.2} | {:.2} % |", 100.0 * rate / token_rate);
    }

    let writers = 32;
    eprintln!(
        "== the API server's write limit, then registrations replayed by {writers} writers, {window} s each"
    );
    let admin = cluster.client().expect("admin");
    let limit = write_limit(&admin, Duration::from_secs(window)).await;
    let lease_cpu = costs.first().map(|c| c.api_cpu_ms + c.etcd_cpu_ms).unwrap_or(1.0);
    let c = registration_ceiling(&cluster, writers, Duration::from_secs(window)).await;
    let share = 100.0 * c.rate * c.writes / limit;
    println!(
        "\nA registration's writes alone, replayed ({writers} at once, {window} s; no reads, watches, leader or fleet):\n"
    );
    println!("| figure | value |");
    println!("| --- | --- |");
    println!("| API server write limit (Lease merge patches) | {limit:.0} /s |");
    println!("| registrations replayed | {:.1} /s |", c.rate);
    println!(
        "| writes per registration (the controller-manager's counted) | {:.1} |",
        c.writes
    );
    println!(
        "| kube-apiserver + etcd CPU per registration | {:.1} ms ({:.1} Lease patches; {:.2} per write) |",
        c.cpu_ms,
        c.cpu_ms / lease_cpu,
        c.cpu_ms / lease_cpu / c.writes
    );
    println!("| **ceiling: share of what the limit allows for these writes** | **{share:.0} %** |");
}
