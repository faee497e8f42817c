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
    let clusters = futures::future::join_all(
        (0..n).map(|i| async move { TestCluster::start(&format!("par{i}")).await }),
    )
    .await;
    println!("parallel ({n} at once): all ready in {:.2?}", t.elapsed());
    for c in clusters {
        let c = c?;
        println!("  {}: {:.2?}", c.name(), c.startup_time());
    }
    Ok(())
}
