//! Benchmark: the agent on a large member — N Node objects as kubelets write them (conditions
//! with heartbeat times, 50 images, volumes in use, addresses, labels), first at idle, then under
//! node status churn (kubelets rewriting their status, `CHURN` per second, with images and
//! volumes changing as pods come and go, and allocatable jittering below the 1% threshold), with a
//! node going NotReady and back a few times in between. Prints the agent's RSS (now and peak),
//! CPU, and its writes per minute to the leader and to its own cluster by kind (from the audit
//! logs); the status writes must be exactly the real changes.
//!
//! `make bench-agent` (N=5000 CHURN=100 by default): `agent_bench <nodes> <churn per second>`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tether_api::clusterset::LeaderSpec;
use tether_e2e::fleet::{self, LeaderSide, audit_events};
use tether_testkit::{BootstrapToken, CreateToken, TestCluster};

const IDLE: Duration = Duration::from_secs(60);
const CHURN_WINDOW: Duration = Duration::from_secs(180);
/// A node goes NotReady (and back 20 s later) this often during the churn window.
const FLAP_EVERY: Duration = Duration::from_secs(45);

fn proc_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
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

/// Writes by `user` in `cluster`'s audit log after the first `from`, by verb and resource.
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
    (events.len().saturating_sub(from), by.into_iter().collect())
}

/// Node `i`'s status as its kubelet writes it at `beat` (a counter): `ready`, ten pods' worth of
/// images and volumes that move with `beat`, and allocatable memory jittering below 1%.
fn kubelet_status(i: usize, beat: u64, ready: bool) -> Value {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let cond = |type_: &str, status: &str, reason: &str| {
        json!({"type": type_, "status": status, "reason": reason, "message": format!("kubelet {reason}"),
               "lastHeartbeatTime": now, "lastTransitionTime": "2026-01-01T00:00:00Z"})
    };
    let images: Vec<Value> = (0..50)
        .map(|k| {
            json!({"names": [format!("registry.example/team-{}/app-{k}@sha256:{:064x}", i % 40, beat + k)],
                   "sizeBytes": 50_000_000 + k * 1_000})
        })
        .collect();
    let volumes: Vec<String> = (0..10)
        .map(|p| format!("kubernetes.io/csi/ebs^vol-{i:05}-{:08}", beat + p))
        .collect();
    let jitter = (beat % 7) * 10; // Mi of 32Gi: well below 1%
    json!({"status": {
        "capacity": {"cpu": "8", "memory": "32Gi", "pods": "110", "ephemeral-storage": "100Gi", "hugepages-2Mi": "0"},
        "allocatable": {"cpu": "7910m", "memory": format!("{}Mi", 31_000 - jitter), "pods": "110",
                        "ephemeral-storage": "92Gi", "hugepages-2Mi": "0"},
        "conditions": [
            cond("MemoryPressure", "False", "KubeletHasSufficientMemory"),
            cond("DiskPressure", "False", "KubeletHasNoDiskPressure"),
            cond("PIDPressure", "False", "KubeletHasSufficientPID"),
            if ready { cond("Ready", "True", "KubeletReady") } else { cond("Ready", "False", "KubeletNotReady") },
        ],
        "addresses": [{"type": "InternalIP", "address": format!("10.{}.{}.{}", i / 65536, (i / 256) % 256, i % 256)},
                      {"type": "Hostname", "address": format!("node-{i:05}")}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        "nodeInfo": {"machineID": format!("{i:032x}"), "systemUUID": format!("{i:032x}"), "bootID": format!("{beat:032x}"),
                     "kernelVersion": "6.1.0-28-cloud-amd64", "osImage": "Debian GNU/Linux 12 (bookworm)",
                     "containerRuntimeVersion": "containerd://1.7.24", "kubeletVersion": "v1.34.2",
                     "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"},
        "images": images,
        "volumesInUse": volumes,
    }})
}

async fn write_status(api: &Api<Node>, i: usize, beat: u64, ready: bool) {
    let name = format!("node-{i:05}");
    if let Err(e) = api
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(kubelet_status(i, beat, ready)),
        )
        .await
    {
        eprintln!("node {name} status: {e}");
    }
}

async fn create_nodes(admin: &Client, n: usize) {
    let api = Api::<Node>::all(admin.clone());
    futures::stream::iter(0..n)
        .for_each_concurrent(32, |i| {
            let api = api.clone();
            async move {
                let name = format!("node-{i:05}");
                let node: Node = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                        "topology.kubernetes.io/zone": format!("zone-{}", i % 3), "node.kubernetes.io/instance-type": "m6i.2xlarge"}}}))
                .expect("node");
                api.create(&PostParams::default(), &node).await.expect("create node");
                write_status(&api, i, 0, true).await;
            }
        })
        .await;
}

struct Sample {
    rss: u64,
    peak: u64,
    cpu: f64,
    leader: (usize, Vec<(String, usize)>),
    member: (usize, Vec<(String, usize)>),
    window: Duration,
}

struct Watch<'a> {
    pid: u32,
    leader: &'a TestCluster,
    member: &'a TestCluster,
    leader_user: String,
    member_user: &'a str,
}

impl Watch<'_> {
    async fn over(&self, window: Duration, during: impl std::future::Future<Output = ()>) -> Sample {
        let l0 = writes(self.leader, &self.leader_user, 0).0;
        let m0 = writes(self.member, self.member_user, 0).0;
        let t0 = cpu_ticks(self.pid);
        let started = Instant::now();
        let _ = tokio::time::timeout(window, during).await;
        tokio::time::sleep(window.saturating_sub(started.elapsed())).await;
        let hz = 100.0; // USER_HZ on Linux
        Sample {
            rss: proc_kib(self.pid, "VmRSS:"),
            peak: proc_kib(self.pid, "VmHWM:"),
            cpu: (cpu_ticks(self.pid) - t0) as f64 / hz / window.as_secs_f64() * 100.0,
            leader: writes(self.leader, &self.leader_user, l0),
            member: writes(self.member, self.member_user, m0),
            window,
        }
    }
}

fn print(title: &str, s: &Sample) {
    let minutes = s.window.as_secs_f64() / 60.0;
    println!("\n{title} ({} s window)", s.window.as_secs());
    println!("| figure | value |\n| --- | --- |");
    println!(
        "| RSS at the end / peak since start | {:.1} MiB / {:.1} MiB |",
        s.rss as f64 / 1024.0,
        s.peak as f64 / 1024.0
    );
    println!("| CPU | {:.2}% of one core |", s.cpu);
    println!(
        "| writes to the leader | {:.1} /min |",
        s.leader.0 as f64 / minutes
    );
    for (what, n) in &s.leader.1 {
        println!("| … {what} | {n} in the window |");
    }
    println!(
        "| writes to its own cluster | {:.1} /min |",
        s.member.0 as f64 / minutes
    );
    for (what, n) in &s.member.1 {
        println!("| … {what} | {n} in the window |");
    }
}

fn count(s: &Sample, what: &str) -> usize {
    s.leader.1.iter().filter(|(w, _)| w == what).map(|(_, n)| n).sum()
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let nodes: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(5000);
    let churn: u64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(100);
    eprintln!("== agent benchmark: {nodes} nodes, {churn} node status writes/s of churn");
    let leader = LeaderSide::named("bench-agent-leader")
        .policy(LeaderSpec::default())
        .start()
        .await;
    let token = BootstrapToken::random();
    token
        .create(&leader.admin, Some(&tether_e2e::sim::home()), None)
        .await
        .expect("token");
    let started = Instant::now();
    let m = fleet::member("bench-member", &leader, &token, json!({})).await;
    create_nodes(&m.admin, nodes).await;
    eprintln!("== {nodes} nodes written in {:.0?}", started.elapsed());
    let reported = |want: i64| {
        let admin = leader.admin.clone();
        async move {
            fleet::wait_mc(&admin, "bench-member", "nodes reported", |mc| {
                mc.status
                    .as_ref()
                    .and_then(|s| s.nodes.as_ref())
                    .map(|n| n.total as i64)
                    == Some(want)
            })
            .await
        }
    };
    reported(nodes as i64).await;
    // Settle: the first list, the first reports, the verdict reads.
    tokio::time::sleep(Duration::from_secs(30)).await;
    let pid = m.agent.as_ref().expect("agent").pid();
    let watch = Watch {
        pid,
        leader: &leader.cluster,
        member: &m.cluster,
        leader_user: format!(
            "system:serviceaccount:{}:tether-agent",
            tether_e2e::sim::ns_of("bench-member")
        ),
        member_user: "system:serviceaccount:tether-system:tether-agent",
    };
    let idle = watch.over(IDLE, std::future::pending()).await;

    let api = Api::<Node>::all(m.admin.clone());
    let sent = Arc::new(AtomicU64::new(0));
    let flaps = Arc::new(AtomicU64::new(0));
    let churning = {
        let (api, sent, flaps) = (api.clone(), sent.clone(), flaps.clone());
        async move {
            let flapper = async {
                let mut tick = tokio::time::interval(FLAP_EVERY);
                tick.tick().await;
                loop {
                    tick.tick().await;
                    write_status(&api, 0, u64::MAX / 2, false).await;
                    flaps.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_secs(20)).await;
                    write_status(&api, 0, u64::MAX / 2 + 1, true).await;
                    flaps.fetch_add(1, Ordering::Relaxed);
                }
            };
            let paced = async {
                let begin = tokio::time::Instant::now();
                let mut k = 0u64;
                let api = api.clone();
                let mut inflight = futures::stream::FuturesUnordered::new();
                loop {
                    let due = begin + Duration::from_secs_f64(k as f64 / churn as f64);
                    tokio::select! {
                        _ = tokio::time::sleep_until(due), if inflight.len() < 64 => {
                            let (api, sent) = (api.clone(), sent.clone());
                            let i = 1 + (k as usize % (nodes - 1));
                            let beat = k / nodes as u64 + 1;
                            inflight.push(async move {
                                write_status(&api, i, beat, true).await;
                                sent.fetch_add(1, Ordering::Relaxed);
                            });
                            k += 1;
                        }
                        Some(()) = inflight.next(), if !inflight.is_empty() => {}
                    }
                }
            };
            futures::join!(flapper, paced);
        }
    };
    let under = watch.over(CHURN_WINDOW, churning).await;
    let sent = sent.load(Ordering::Relaxed);
    let flaps = flaps.load(Ordering::Relaxed);

    print(&format!("agent at idle, {nodes} nodes"), &idle);
    print(
        &format!(
            "agent under node status churn, {nodes} nodes: {sent} node status writes ({:.0}/s), {flaps} real changes (a node NotReady and back)",
            sent as f64 / CHURN_WINDOW.as_secs_f64()
        ),
        &under,
    );
    let status = count(&under, "patch managedclusters/status");
    println!(
        "\nManagedCluster status writes under churn: {status} for {flaps} real changes (idle: {})",
        count(&idle, "patch managedclusters/status")
    );
    println!(
        "binary: {} ; machine: {} CPUs",
        tether_testkit::controller::binary("tether-controller")
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
        std::thread::available_parallelism().map(|p| p.get()).unwrap_or(0)
    );
}
