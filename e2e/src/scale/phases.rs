//! The phases of a run: registration, steady state, renewals, loss detection and failover,
//! each measured from the API server's request counts and the members' status.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use kube::Client;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tether_api::registration::RegistrationResult;
use tether_api::{ClusterRegistrationRequest, ManagedCluster};
use tether_sim::{Member, join_all};
use tokio_util::sync::CancellationToken;

use crate::fleet::LeaderSide;
use crate::sim::HOME;

use super::*;

/// Kills the leader process and starts a new one with `kubeconfig`: how soon it is ready, its
/// peak memory and its writes over its first `window`.
pub(super) async fn failover(
    leader: &mut LeaderSide,
    kubeconfig: &std::path::Path,
    bin: Option<std::path::PathBuf>,
    window: Duration,
    cluster_profiles: bool,
) -> Failover {
    let before = request_counts(&leader.admin).await;
    leader.controller.kill();
    let killed = Instant::now();
    let mut args = vec!["leader", "--leader-elect=false"];
    if cluster_profiles {
        args.push("--cluster-profiles");
    }
    let binary = match &bin {
        Some(dir) => dir.join("tether-controller"),
        None => tether_testkit::controller::binary("tether-controller").expect("tether-controller"),
    };
    leader.controller = tether_testkit::Controller::start_binary(
        &binary,
        &leader.cluster,
        "tether-leader",
        kubeconfig,
        &args,
    )
    .expect("new leader process");
    loop {
        if let Ok((200, _)) = leader.controller.admin_get("/readyz").await {
            break;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(600),
            "the new leader ready within 10 min"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ready = killed.elapsed();
    tokio::time::sleep(window.saturating_sub(killed.elapsed())).await;
    let after = request_counts(&leader.admin).await;
    let writes = classify(&before, &after, killed.elapsed().as_secs_f64());
    Failover {
        bin,
        ready,
        peak_rss: rss_mib(leader.controller.pid(), "VmHWM"),
        writes,
        profile_writes: profile_writes(&before, &after),
    }
}

/// The members once all have joined, each heartbeating from the moment it was in (as an agent
/// does); the first one separately, to be silenced later.
pub(super) struct Joined {
    pub(super) names: Vec<String>,
    pub(super) usable: Vec<Duration>,
    pub(super) tasks: Vec<tokio::task::JoinHandle<Member>>,
    pub(super) silent: tokio::task::JoinHandle<Member>,
    pub(super) cancel: CancellationToken,
    pub(super) silent_cancel: CancellationToken,
    pub(super) started: Instant,
    pub(super) registration_wall: Duration,
    pub(super) registration_cpu: BTreeMap<&'static str, f64>,
}

pub(super) async fn register_all(settings: &Settings, setup: &Setup) -> Joined {
    let n = settings.members;
    eprintln!(
        "== [{n}] registering {n} members, {} in flight (heartbeat {}s, grace {}s)",
        settings.concurrency, setup.interval, setup.grace
    );
    let cpu = Cpu::sample(&setup.procs);
    let started = Instant::now();
    let step = (n / 10).max(1);
    let cancel = CancellationToken::new();
    let silent_cancel = CancellationToken::new();
    let mut silent = None;
    let mut tasks = Vec::with_capacity(n);
    let mut usable = Vec::with_capacity(n);
    let mut names = Vec::with_capacity(n);
    join_all(
        &setup.fleet,
        (0..n).map(|i| format!("sim-{i:05}")).collect(),
        settings.concurrency,
        |member, timings| {
            usable.push(timings.usable);
            names.push(member.name.clone());
            if silent.is_none() {
                silent = Some(tokio::spawn(member.heartbeat_until(silent_cancel.clone())));
            } else {
                tasks.push(tokio::spawn(member.heartbeat_until(cancel.clone())));
            }
            if names.len() % step == 0 {
                eprintln!(
                    "   {}/{n} joined after {:.0}s",
                    names.len(),
                    started.elapsed().as_secs_f64()
                );
            }
        },
    )
    .await
    .expect("every member joins");
    usable.sort();
    Joined {
        names,
        usable,
        tasks,
        silent: silent.expect("at least one member"),
        cancel,
        silent_cancel,
        started,
        registration_wall: started.elapsed(),
        registration_cpu: cpu.shares(&setup.procs),
    }
}

/// Request → Approved latency of each of `names` (sorted), and the five slowest with their
/// creation rank.
pub(super) fn approval_latencies(
    approvals: &Approvals,
    names: &[String],
) -> (Vec<Duration>, Vec<(String, usize, Duration)>) {
    let seen = approvals.lock().expect("approvals");
    let mut approved: Vec<Duration> = names
        .iter()
        .filter_map(|name| {
            seen.get(name)
                .and_then(|(c, a)| a.map(|a| a.saturating_duration_since(*c)))
        })
        .collect();
    approved.sort();
    let mut order: Vec<(&String, Instant, Duration)> = seen
        .iter()
        .filter_map(|(name, (c, a))| a.map(|a| (name, *c, a.saturating_duration_since(*c))))
        .collect();
    order.sort_by_key(|(_, created, _)| *created);
    let mut slowest: Vec<(String, usize, Duration)> = order
        .iter()
        .enumerate()
        .map(|(i, (name, _, d))| ((*name).clone(), i, *d))
        .collect();
    slowest.sort_by_key(|(_, _, d)| std::cmp::Reverse(*d));
    slowest.truncate(5);
    (approved, slowest)
}

/// What the steady window measured.
pub(super) struct Steady {
    pub(super) writes: BTreeMap<String, f64>,
    /// ClusterProfile writes in the window.
    pub(super) profile_writes: f64,
    pub(super) heartbeats: f64,
    pub(super) cpu: BTreeMap<&'static str, f64>,
    pub(super) leader_rss: f64,
}

pub(super) async fn measure_steady(settings: &Settings, setup: &Setup) -> Steady {
    let before = request_counts(&setup.leader.admin).await;
    let beats = setup.fleet.stats.heartbeats();
    let cpu = Cpu::sample(&setup.procs);
    let window = Instant::now();
    tokio::time::sleep(settings.steady).await;
    let elapsed = window.elapsed().as_secs_f64();
    let cpu = cpu.shares(&setup.procs);
    let heartbeats = (setup.fleet.stats.heartbeats() - beats) as f64 / elapsed;
    let after = request_counts(&setup.leader.admin).await;
    Steady {
        writes: classify(&before, &after, elapsed),
        profile_writes: profile_writes(&before, &after),
        heartbeats,
        cpu,
        leader_rss: rss_mib(setup.leader.controller.pid(), "VmRSS"),
    }
}

/// Waits until every member is past its first renewal (the last one registered at the end of
/// the registration phase renews within ¾ TTL of it), then counts renewals over a window of
/// two minutes or N/10 renewals' worth, whichever is longer. NB: a window shorter than one
/// renewal period samples the members' phases, which follow the registration rate; the long-run
/// mean is the expected rate.
pub(super) async fn measure_renewals(
    settings: &Settings,
    setup: &Setup,
    joined: &Joined,
    ttl: Duration,
) -> Renewals {
    let n = settings.members;
    let expected_rate = n as f64 / (ttl.as_secs_f64() * (1.0 - 0.95 / 3.0));
    let from = joined.started + joined.registration_wall + ttl.mul_f64(0.75) + Duration::from_secs(10);
    eprintln!(
        "== [{n}] credential renewals: waiting {:.0?} until every member renews at its own pace",
        from.saturating_duration_since(Instant::now())
    );
    tokio::time::sleep_until(from.into()).await;
    let window = Duration::from_secs(120).max(Duration::from_secs_f64(n as f64 / 10.0 / expected_rate));
    let before = request_counts(&setup.leader.admin).await;
    let (renewed, failed) = (setup.fleet.stats.renewals(), setup.fleet.stats.failures());
    let cpu = Cpu::sample(&setup.procs);
    let t = Instant::now();
    tokio::time::sleep(window).await;
    let secs = t.elapsed().as_secs_f64();
    let cpu = cpu.shares(&setup.procs);
    let after = request_counts(&setup.leader.admin).await;
    let tokens = after.get(TOKEN_REQUESTS).copied().unwrap_or(0.0)
        - before.get(TOKEN_REQUESTS).copied().unwrap_or(0.0);
    Renewals {
        ttl,
        window,
        api_rate: tokens / secs,
        sim_rate: (setup.fleet.stats.renewals() - renewed) as f64 / secs,
        expected_rate,
        failures: setup.fleet.stats.renewal_failures(),
        heartbeat_failures: setup.fleet.stats.failures() - failed,
        writes: classify(&before, &after, secs).values().sum(),
        cpu,
    }
}

pub(super) type Approvals = Arc<Mutex<HashMap<String, (Instant, Option<Instant>)>>>;

/// Records, by cluster name, when each request is first seen and when it is first seen Approved.
pub(super) fn watch_approvals(admin: &Client) -> Approvals {
    let seen: Approvals = Arc::default();
    let out = seen.clone();
    let api = Api::<ClusterRegistrationRequest>::namespaced(admin.clone(), HOME);
    tokio::spawn(async move {
        let mut events = watcher(api, watcher::Config::default()).applied_objects().boxed();
        while let Ok(Some(r)) = events.try_next().await {
            let now = Instant::now();
            let mut seen = seen.lock().expect("approvals");
            let entry = seen.entry(r.spec.cluster_name.clone()).or_insert((now, None));
            if entry.1.is_none() && r.status.as_ref().map(|s| s.result) == Some(RegistrationResult::Approved)
            {
                entry.1 = Some(now);
            }
        }
    });
    out
}

/// The Events of `reason` in every namespace.
pub(super) async fn events_of(admin: &Client, reason: &str) -> usize {
    let events = Api::<k8s_openapi::api::core::v1::Event>::all(admin.clone());
    let params = kube::api::ListParams::default().fields(&format!("reason={reason}"));
    events.list_metadata(&params).await.expect("Events").items.len()
}

pub(super) async fn wait_total(admin: &Client, total: usize, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let now = set_counts(admin).await;
        if now.map(|c| c.0) == Some(total) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "ClusterSet counts {now:?}, want total {total} within {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub(super) async fn wait_ready_unknown(admin: &Client, ns: &str, name: &str, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    let api = Api::<ManagedCluster>::namespaced(admin.clone(), ns);
    loop {
        let unknown = api.get(name).await.ok().is_some_and(|mc| {
            mc.status
                .iter()
                .flat_map(|s| &s.conditions)
                .any(|c| c.type_ == "Ready" && c.status == "Unknown")
        });
        if unknown {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{ns}/{name} not Ready=Unknown within {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// ClusterProfile writes (`clusterprofiles` and `clusterprofiles/status`) between two counts.
pub(super) fn profile_writes(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>) -> f64 {
    after
        .iter()
        // NB: the namespace controller's collection deletes in a deleted member namespace are
        // not the leader's writes (Tether's profiles live in inventory namespaces).
        .filter(|(k, _)| k.starts_with("clusterprofiles") && !k.ends_with("(collection)"))
        .map(|(k, n)| n - before.get(k).copied().unwrap_or(0.0))
        .sum()
}

/// Writes per second between two counts, by benchmark kind.
pub(crate) fn classify(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
    secs: f64,
) -> BTreeMap<String, f64> {
    let mut out: BTreeMap<String, f64> = [ANNOUNCE, MANAGED_CLUSTER_STATUS, CLUSTER_SET_STATUS, OTHER]
        .into_iter()
        .map(|k| (k.to_string(), 0.0))
        .collect();
    for (what, n) in after {
        let delta = n - before.get(what).copied().unwrap_or(0.0);
        let kind = match what.as_str() {
            "memberclusterannounces" | "leases" => ANNOUNCE,
            "managedclusters/status" => MANAGED_CLUSTER_STATUS,
            "clustersets/status" => CLUSTER_SET_STATUS,
            _ => OTHER,
        };
        *out.entry(kind.to_string()).or_default() += delta / secs;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_counts_keep_writes_by_resource() {
        let text = r#"# HELP apiserver_request_total x
apiserver_request_total{code="200",component="apiserver",dry_run="",group="multicluster.tether.dev",resource="memberclusterannounces",scope="resource",subresource="",verb="PATCH",version="v1alpha1"} 40
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="namespaces",scope="cluster",subresource="",verb="LIST",version="v1"} 7
apiserver_request_total{code="201",component="apiserver",dry_run="",group="multicluster.tether.dev",resource="managedclusters",scope="resource",subresource="status",verb="APPLY",version="v1alpha1"} 3
apiserver_request_total{code="409",component="apiserver",dry_run="",group="multicluster.tether.dev",resource="memberclusterannounces",scope="resource",subresource="",verb="PATCH",version="v1alpha1"} 2
"#;
        let counts = parse_request_counts(text);
        assert_eq!(counts.get("memberclusterannounces"), Some(&42.0));
        assert_eq!(counts.get("managedclusters/status"), Some(&3.0));
        assert_eq!(counts.get("namespaces"), None, "reads are not writes");
        let before = BTreeMap::from([("memberclusterannounces".to_string(), 2.0)]);
        let kinds = classify(&before, &counts, 2.0);
        assert_eq!(kinds[ANNOUNCE], 20.0);
        assert_eq!(kinds[MANAGED_CLUSTER_STATUS], 1.5);
        assert_eq!(kinds[OTHER], 0.0);
    }
}
