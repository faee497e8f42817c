//! Benchmark: the agent at idle on a member with 100 Node objects — RSS, CPU, and API writes per
//! minute at steady state (to the leader and to its own cluster), from the audit logs.
//!
//! `cargo build --release -p tether-controller && TETHER_BIN_DIR=target/release \
//!  cargo run --release -p tether-e2e --example agent_bench` (`make bench-agent`).

use std::time::Duration;

use serde_json::json;
use tether_e2e::fleet::{self, add_node, audit_events};
use tether_testkit::{BootstrapToken, CreateToken, TestCluster};

const NODES: usize = 100;
const WINDOW: Duration = Duration::from_secs(120);

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, r)| r.split_whitespace().collect())
        .unwrap_or_default();
    // utime and stime are fields 14 and 15; after the `)` they are at 11 and 12.
    fields.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
        + fields.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
}

fn writes(cluster: &TestCluster, user: &str, from: usize) -> (usize, Vec<(String, usize)>) {
    let events = audit_events(cluster, |e| {
        e["user"]["username"] == user
            && matches!(e["verb"].as_str(), Some("create" | "update" | "patch" | "delete"))
    });
    let mut by: std::collections::BTreeMap<String, usize> = Default::default();
    for e in events.iter().skip(from) {
        let r = &e["objectRef"];
        let what = format!(
            "{} {}{}",
            e["verb"].as_str().unwrap_or_default(),
            r["resource"].as_str().unwrap_or_default(),
            r["subresource"]
                .as_str()
                .map(|s| format!("/{s}"))
                .unwrap_or_default()
        );
        *by.entry(what).or_default() += 1;
    }
    (events.len(), by.into_iter().collect())
}

#[tokio::main]
async fn main() {
    eprintln!(
        "== agent idle benchmark: {NODES} nodes, {}s window",
        WINDOW.as_secs()
    );
    let leader = fleet::leader("bench-agent-leader", json!({})).await;
    let token = BootstrapToken::random();
    token
        .create(&leader.admin, Some(&tether_e2e::sim::home()), None)
        .await
        .expect("token");
    let m = fleet::member("bench-member", &leader, &token, json!({})).await;
    for i in 0..NODES {
        add_node(&m.admin, &format!("node-{i:03}"), "8", "32Gi").await;
    }
    // Let it join, report the 100 nodes, and settle.
    tokio::time::sleep(Duration::from_secs(30)).await;
    let pid = m.agent.as_ref().expect("agent").pid();
    let leader_user = &format!(
        "system:serviceaccount:{}:tether-agent",
        tether_e2e::sim::ns_of("bench-member")
    );
    let member_user = "system:serviceaccount:tether-system:tether-agent";
    let (leader_before, _) = writes(&leader.cluster, leader_user, 0);
    let (member_before, _) = writes(&m.cluster, member_user, 0);
    let ticks_before = cpu_ticks(pid);
    tokio::time::sleep(WINDOW).await;
    let ticks = cpu_ticks(pid) - ticks_before;
    let rss = rss_kib(pid);
    let (leader_after, leader_by) = writes(&leader.cluster, leader_user, leader_before);
    let (member_after, member_by) = writes(&m.cluster, member_user, member_before);
    let minutes = WINDOW.as_secs_f64() / 60.0;
    let hz = 100.0; // USER_HZ on Linux
    println!(
        "\nagent at idle ({NODES} nodes, {}s window, default 10s heartbeat)",
        WINDOW.as_secs()
    );
    println!("| figure | value |\n| --- | --- |");
    println!("| RSS | {:.1} MiB |", rss as f64 / 1024.0);
    println!(
        "| CPU | {:.2}% of one core |",
        ticks as f64 / hz / WINDOW.as_secs_f64() * 100.0
    );
    println!(
        "| writes to the leader | {:.1} /min |",
        (leader_after - leader_before) as f64 / minutes
    );
    for (what, n) in leader_by {
        println!("| … {what} | {:.1} /min |", n as f64 / minutes);
    }
    println!(
        "| writes to its own cluster | {:.1} /min |",
        (member_after - member_before) as f64 / minutes
    );
    for (what, n) in member_by {
        println!("| … {what} | {:.1} /min |", n as f64 / minutes);
    }
    println!(
        "\nbinary: {} ; machine: {} CPUs",
        tether_testkit::controller::binary("tether-controller")
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
        std::thread::available_parallelism().map(|p| p.get()).unwrap_or(0)
    );
}
