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
    eprintln!("   killed at {}", k8s_openapi::jiff::Timestamp::now());
    let mut tick = 0u64;
    while killed.elapsed() < s.failover_window {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = request_counts(&leader.admin).await;
        let rate: f64 = classify(&last, &now, 1.0).values().sum();
        peak = peak.max(rate);
        last = now;
        let attached = tunnels_at(&standby).await;
        tick += 1;
        // NB: the timeline of the take-over, every 5 s: where the time to re-attach goes.
        if tick.is_multiple_of(5) {
            eprintln!(
                "   +{:>5.1?}: {attached} tunnels at the standby, APIService available: {}, {rate:.0} writes/s",
                killed.elapsed(),
                api_service_available(&leader.admin).await
            );
        }
        if reattach.is_none() && attached >= n as f64 {
            reattach = Some(killed.elapsed());
            eprintln!(
                "   every tunnel attached to the standby after {:.1?}",
                killed.elapsed()
            );
        }
    }
    let log = standby.log();
    let first_attach = log.lines().find(|l| l.contains("Tunnel connected"));
    for line in log
        .lines()
        .filter(|l| l.contains("Leadership changed") || l.contains("Serving member access"))
        .chain(first_attach)
    {
        eprintln!("   standby: {line}");
    }
    let silent = log.lines().filter(|l| l.contains("stopped answering pings"));
    let (silent, unheard) = silent.fold((0, 0), |(s, u), l| {
        (s + 1, u + usize::from(l.contains("heard=false")))
    });
    eprintln!("   the standby closed {silent} tunnels as silent, {unheard} of them never heard");
    let total: f64 = classify(&first, &last, 1.0).values().sum();
    let marked = transitions.marked_since(&live, killed);
    for (name, changes) in marked.iter().take(10) {
        eprintln!("   marked after the kill: {name}: {}", changes.join(", "));
    }
    late.tell(killed);
    if !marked.is_empty() {
        // NB: whose silence it was: the standby's own account of those tunnels, and whether it
        // ran late (the simulated fleet's lateness is the line above).
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

/// The member-access APIService's `Available` condition: its status and reason.
async fn api_service_available(admin: &Client) -> String {
    let resource = kube::api::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("apiregistration.k8s.io", "v1", "APIService"),
        "apiservices",
    );
    let api = Api::<kube::api::DynamicObject>::all_with(admin.clone(), &resource);
    let Ok(Some(svc)) = api.get_opt(tether_tunnel::API_SERVICE).await else {
        return "absent".into();
    };
    let conditions = svc.data["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    conditions
        .iter()
        .find(|c| c["type"] == "Available")
        .map_or("unknown".into(), |c| {
            format!(
                "{} ({})",
                c["status"].as_str().unwrap_or("?"),
                c["reason"].as_str().unwrap_or("")
            )
        })
}
