//! Measures how long test clusters take to start: `cargo run -p tether-testkit --example startup -- [N]`.
//! Starts N clusters one after another, then N at once, and prints each start-up time.

use std::time::Instant;

use tether_testkit::TestCluster;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(3);
    println!(
        "sequential ({n} clusters, etcd + kube-apiserver + kube-controller-manager, until controllers run):"
    );
    for i in 0..n {
        let cluster = TestCluster::start(&format!("seq{i}")).await?;
        println!("  seq{i}: {:.2?}", cluster.startup_time());
    }
    let t = Instant::now();
    let clusters =
        futures_join((0..n).map(|i| async move { TestCluster::start(&format!("par{i}")).await })).await;
    println!("parallel ({n} at once): all ready in {:.2?}", t.elapsed());
    for c in clusters {
        let c = c?;
        println!("  {}: {:.2?}", c.name(), c.startup_time());
    }
    Ok(())
}

async fn futures_join<F: std::future::Future>(futs: impl Iterator<Item = F>) -> Vec<F::Output> {
    let handles: Vec<_> = futs.collect();
    let mut out = Vec::new();
    // Start-up is mostly waiting on child processes, so polling them concurrently is enough.
    let joined = futures::future::join_all(handles).await;
    out.extend(joined);
    out
}
