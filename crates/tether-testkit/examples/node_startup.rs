//! Measures the node tier: `cargo run -p tether-testkit --example node_startup -- [N]` (as root,
//! after `make tools image`). Starts N clusters with one real node each at once, then runs one
//! pod of the project's image in each, and prints per cluster: start-up time until its node is
//! Ready, time from creating a pod to the pod Ready, and the memory of every process of the
//! cluster (control plane, node, pod).

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use tether_testkit::TestCluster;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tether_testkit::lab::enter()?;
    tokio::runtime::Runtime::new()?.block_on(run())
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let n: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(2);
    let t = Instant::now();
    let clusters = futures::future::join_all(
        (0..n).map(|i| async move { TestCluster::builder(&format!("n{i}")).nodes(1).start().await }),
    )
    .await;
    println!(
        "{n} clusters with one node each, started at once: all Ready in {:.1?}",
        t.elapsed()
    );
    let clusters: Vec<TestCluster> = clusters.into_iter().collect::<Result<_, _>>()?;
    for c in &clusters {
        let pods: Api<Pod> = Api::namespaced(c.client()?, "default");
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "probe"},
            "spec": {"containers": [{
                "name": "tether", "image": "ghcr.io/tether-dev/tether:0.2.0", "imagePullPolicy": "Never",
                "args": ["agent", "--help"], "command": ["/usr/local/bin/tether-controller"]
            }], "restartPolicy": "Never"}
        }))?;
        let t = Instant::now();
        pods.create(&PostParams::default(), &pod).await?;
        let phase = loop {
            let phase = pods
                .get("probe")
                .await?
                .status
                .and_then(|s| s.phase)
                .unwrap_or_default();
            if phase == "Succeeded" || phase == "Failed" || t.elapsed() > Duration::from_secs(60) {
                break phase;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        println!(
            "  {}: start-up {:.1?}; a pod of the image ran to {phase} in {:.1?}; memory {} MiB",
            c.name(),
            c.startup_time(),
            t.elapsed(),
            memory_mib(c)
        );
    }
    Ok(())
}

/// Resident memory of every process that runs from the cluster's folder or in its node cgroups.
fn memory_mib(c: &TestCluster) -> u64 {
    let dir = c.dir().to_string_lossy().into_owned();
    let mut kib = 0;
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let p = entry.path();
        let cmdline = std::fs::read(p.join("cmdline")).unwrap_or_default();
        let cgroup = std::fs::read_to_string(p.join("cgroup")).unwrap_or_default();
        let folder = c
            .dir()
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(&dir)
            || (!folder.is_empty() && cgroup.contains(&folder))
        {
            let status = std::fs::read_to_string(p.join("status")).unwrap_or_default();
            kib += status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    kib / 1024
}
