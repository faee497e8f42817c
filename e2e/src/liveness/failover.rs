//! The failover of the liveness benchmark: a standby takes over from the killed serving replica
//! while every member's tunnel re-attaches to it.

use super::*;

/// Starts a standby replica, kills the serving one, and watches `s.failover_window`: time until
/// every live tunnel is attached to the standby, live members marked anything but Ready, the
/// peak and total writes.
pub(super) async fn failover(
    s: &Settings,
    mut leader: LeaderSide,
    standby_at: std::net::SocketAddr,
    transitions: &Transitions,
    running: &[Running],
) -> (Option<Duration>, usize, (f64, f64), f64, LeaderSide) {
    let live: HashSet<String> = running
        .iter()
        .filter(|r| r.tunnel.is_some())
        .map(|r| r.name.clone())
        .collect();
    let n = live.len();
    eprintln!("== [{n} live] failover: a standby starts, the serving replica is killed");
    let args = fleet::proxy_args(standby_at, 15, &[]);
    let standby = leader.start_replica("leader-b", &args).await;
    behind_the_fleet(&leader.cluster, &[standby.pid()]);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let first = request_counts(&leader.admin).await;
    let mut last = first.clone();
    let (mut peak, mut reattach) = (0f64, None);
    let late = Late::watch();
    leader.controller.kill();
    let killed = Instant::now();
    while killed.elapsed() < s.failover_window {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = request_counts(&leader.admin).await;
        peak = peak.max(classify(&last, &now, 1.0).values().sum());
        last = now;
        if reattach.is_none() && tunnels_at(&standby).await >= n as f64 {
            reattach = Some(killed.elapsed());
            eprintln!(
                "   every tunnel attached to the standby after {:.1?}",
                killed.elapsed()
            );
        }
    }
    let total: f64 = classify(&first, &last, 1.0).values().sum();
    let marked = transitions.marked_since(&live, killed);
    for (name, changes) in marked.iter().take(10) {
        eprintln!("   marked after the kill: {name}: {}", changes.join(", "));
    }
    late.tell(killed);
    if !marked.is_empty() {
        // NB: whose silence it was: the standby's own account of those tunnels, and whether it
        // ran late (the simulated fleet's lateness is the line above).
        let log = standby.log();
        for line in log.lines().filter(|l| {
            l.contains("late:") || marked.iter().take(10).any(|(name, _)| l.contains(name.as_str()))
        }) {
            eprintln!("   standby: {line}");
        }
    }
    let marked = marked.len();
    let standby_rss = rss_mib(standby.pid(), "VmRSS");
    leader.controller = standby;
    (reattach, marked, (peak, total), standby_rss, leader)
}
