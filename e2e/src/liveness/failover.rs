//! The failover of the liveness benchmark: a standby takes over from the killed serving replica
//! while every member's tunnel re-attaches to it.

use super::*;

/// How long one read of the timeline waits for an answer.
const READ_WITHIN: Duration = Duration::from_secs(2);

/// What a failover showed.
#[derive(Clone, Debug)]
pub struct Failover {
    /// Kill → every live tunnel attached to the standby.
    pub reattach: Option<Duration>,
    /// Kill → the first tunnel seen at the standby (read once a second).
    pub first: Option<Duration>,
    /// Live members marked anything but Ready=True.
    pub marked: usize,
    /// Live members whose Ready condition changed at all (status or reason): a member waiting
    /// for its tunnel's turn that is judged by its heartbeat meanwhile turns `HeartbeatReceived`
    /// and back, two writes and a false "tunnel lost".
    pub moved: usize,
    /// Peak writes in one second, and all writes.
    pub writes: (f64, f64),
    /// The standby's RSS once every tunnel attached, MiB.
    pub standby_rss: f64,
    /// Attach challenges the standby answered with a turn (`tether_leader::proxy::pace`).
    pub paced: f64,
}

/// Starts a standby replica, kills the serving one, and watches `s.failover_window`: time until
/// every live tunnel is attached to the standby, live members marked anything but Ready, the
/// peak and total writes. Returns them and the leader side, the standby now its serving replica.
pub(super) async fn failover(
    s: &Settings,
    mut leader: LeaderSide,
    standby_at: std::net::SocketAddr,
    apis: &Apis,
    transitions: &Transitions,
    running: &[Running],
) -> (Failover, LeaderSide) {
    let live: HashSet<String> = running
        .iter()
        .filter(|r| r.tunnel.is_some())
        .map(|r| r.name.clone())
        .collect();
    let n = live.len();
    eprintln!("== [{n} live] failover: a standby starts, the serving replica is killed");
    let rate = rate_args(s.attach_rate[1]);
    let args = fleet::proxy_args(
        standby_at,
        15,
        &rate.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let standby = leader.start_replica("leader-b", &args).await;
    behind_the_fleet(&leader.cluster, &[standby.pid()]);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let first = apis.request_counts().await;
    let (mut last, mut last_at) = (first.clone(), Instant::now());
    let (mut peak, mut reattach, mut first_seen) = (0f64, None, None);
    let late = Late::watch();
    leader.controller.kill();
    let killed = Instant::now();
    eprintln!("   killed at {}", k8s_openapi::jiff::Timestamp::now());
    let (mut tick, mut rate) = (0u64, 0f64);
    while killed.elapsed() < s.failover_window {
        tokio::time::sleep(Duration::from_secs(1)).await;
        // NB: every read of the busy API server is time-boxed, and a write rate is taken over
        // the time since the last read that answered: the timeline keeps its pace.
        if let Some(now) = apis.request_counts_within(READ_WITHIN).await {
            let secs = last_at.elapsed().as_secs_f64();
            rate = classify(&last, &now, secs).values().sum();
            peak = peak.max(rate);
            (last, last_at) = (now, Instant::now());
        }
        // NB: None when the standby's /metrics did not answer in time (never "all attached").
        let attached = tokio::time::timeout(READ_WITHIN, tunnels_at(&standby)).await.ok();
        tick += 1;
        // NB: the timeline of the take-over, every 5 s: where the time to re-attach goes.
        if tick.is_multiple_of(5) {
            let available = tokio::time::timeout(READ_WITHIN, api_service_available(&leader.admin)).await;
            eprintln!(
                "   +{:>5.1?}: {} tunnels at the standby, APIService available: {}, {rate:.0} writes/s",
                killed.elapsed(),
                attached.map_or("no answer".into(), |a| a.to_string()),
                available.unwrap_or_else(|_| "no answer".into()),
            );
        }
        if first_seen.is_none() && attached.is_some_and(|a| a >= 1.0) {
            first_seen = Some(killed.elapsed());
        }
        if reattach.is_none() && attached.is_some_and(|a| a >= n as f64) {
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
    let marked = transitions.changed_since(&live, killed, |status, _| status != "True");
    let moved = transitions.changed_since(&live, killed, |_, _| true).len();
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
    let paced = match standby.admin_get("/metrics").await {
        Ok((200, text)) => metric(&text, PACED).unwrap_or(0.0),
        _ => 0.0,
    };
    eprintln!("   the standby gave {paced:.0} turns to attach");
    let standby_rss = rss_mib(standby.pid(), "VmRSS");
    leader.controller = standby;
    let seen = Failover {
        reattach,
        first: first_seen,
        marked: marked.len(),
        moved,
        writes: (peak, total),
        standby_rss,
        paced,
    };
    (seen, leader)
}

/// The standby's count of attach challenges answered with a turn.
const PACED: &str = "tether_leader_proxy_requests_total{result=\"attach_paced\"}";

/// The leader flag that sets attach pace `rate` (none: the leader's default).
pub(super) fn rate_args(rate: Option<f64>) -> Vec<String> {
    rate.map(|r| format!("--proxy-attach-rate={r}"))
        .into_iter()
        .collect()
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
