//! What kube-apiserver and etcd hold: RSS, live heap, goroutines, file descriptors, tunnels.

use super::*;

/// What kube-apiserver or etcd holds at one moment.
#[derive(Clone, Copy, Debug, Default)]
pub struct Held {
    /// Resident memory, MiB.
    pub rss: f64,
    /// Go heap in use, MiB (`go_memstats_heap_inuse_bytes`; kube-apiserver only): live objects,
    /// garbage not yet collected and fragmentation.
    pub heap: f64,
    /// Live heap, MiB: `go_memstats_heap_alloc_bytes` read just after a forced garbage
    /// collection, so it also counts what was allocated in between (milliseconds; sampled at
    /// rest). kube-apiserver only; NaN if it does not serve `/debug/pprof`.
    pub live: f64,
    /// Past events kube-apiserver's watch caches hold room for (`watch_cache_capacity`, summed
    /// over resources). Each holds a full object; a burst of writes grows them and only later
    /// writes shrink them again (`watchCacheHistory.resizeCacheLocked`).
    pub history: f64,
    /// Goroutines (kube-apiserver only).
    pub goroutines: f64,
    /// Open file descriptors.
    pub fds: f64,
}

impl Held {
    /// Both figures added (e.g. a member's and its tunnel's share).
    pub(super) fn plus(self, other: Held) -> Held {
        Held {
            rss: self.rss + other.rss,
            heap: self.heap + other.heap,
            live: self.live + other.live,
            history: self.history + other.history,
            goroutines: self.goroutines + other.goroutines,
            fds: self.fds + other.fds,
        }
    }

    pub(super) fn minus(self, other: Held, per: usize) -> Held {
        let per = per.max(1) as f64;
        Held {
            rss: (self.rss - other.rss) * 1024.0 / per,
            heap: (self.heap - other.heap) * 1024.0 / per,
            live: (self.live - other.live) * 1024.0 / per,
            history: (self.history - other.history) / per,
            goroutines: (self.goroutines - other.goroutines) / per,
            fds: (self.fds - other.fds) / per,
        }
    }
}

pub(super) async fn apiserver_metrics(admin: &Client) -> String {
    let req = http::Request::get("/metrics").body(vec![]).expect("request");
    admin.request_text(req).await.unwrap_or_default()
}

pub(super) fn fds(pid: u32) -> f64 {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count()) as f64
}

/// What the kube-apiservers (all of them, summed) and etcd hold now.
pub(super) async fn held(apis: &Apis, etcd: u32) -> (Held, f64) {
    let collected = apis.collect_garbage().await;
    let texts = apis.metrics().await;
    let sum = |series: &str| texts.iter().filter_map(|t| metric(t, series)).sum::<f64>();
    let api_held = Held {
        rss: apis.rss(),
        heap: sum("go_memstats_heap_inuse_bytes") / 1024.0 / 1024.0,
        live: if collected {
            sum("go_memstats_heap_alloc_bytes") / 1024.0 / 1024.0
        } else {
            f64::NAN
        },
        history: texts.iter().map(|t| sum_of(t, "watch_cache_capacity")).sum(),
        goroutines: sum("go_goroutines"),
        fds: apis.pids().into_iter().map(fds).sum(),
    };
    (api_held, rss_mib(etcd, "VmRSS"))
}

/// The sum of a metric's series (every label set) in Prometheus text.
pub(super) fn sum_of(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// Waits `settle`, then samples what the API servers and etcd hold three times, 5 s apart, and
/// keeps the median of each figure (a GC between samples moves the heap).
pub(super) async fn held_settled(apis: &Apis, etcd: u32, settle: Duration) -> (Held, f64) {
    tokio::time::sleep(settle).await;
    let mut samples = Vec::new();
    for i in 0..3 {
        if i > 0 {
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
        samples.push(held(apis, etcd).await);
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    (
        Held {
            rss: median(samples.iter().map(|s| s.0.rss).collect()),
            heap: median(samples.iter().map(|s| s.0.heap).collect()),
            live: median(samples.iter().map(|s| s.0.live).collect()),
            history: median(samples.iter().map(|s| s.0.history).collect()),
            goroutines: median(samples.iter().map(|s| s.0.goroutines).collect()),
            fds: median(samples.iter().map(|s| s.0.fds).collect()),
        },
        median(samples.iter().map(|s| s.1).collect()),
    )
}

/// Waits until the leader deleted every approved registration request (at most `within`);
/// returns how many there were when called.
pub(super) async fn requests_gone(admin: &Client, within: Duration) -> usize {
    let api = Api::<tether_api::ClusterRegistrationRequest>::namespaced(admin.clone(), crate::sim::HOME);
    let t0 = Instant::now();
    let mut first = None;
    loop {
        let left = api
            .list_metadata(&Default::default())
            .await
            .map_or(usize::MAX, |l| l.items.len());
        let first = *first.get_or_insert(left);
        if left == 0 {
            eprintln!(
                "   every approved request ({first}) deleted after {:.0?}",
                t0.elapsed()
            );
            return first;
        }
        assert!(
            t0.elapsed() < within,
            "{left} requests still there after {within:?}"
        );
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}

pub(super) async fn tunnels_at(leader: &tether_testkit::Controller) -> f64 {
    match leader.admin_get("/metrics").await {
        Ok((200, text)) => metric(&text, "tether_leader_tunnels").unwrap_or(0.0),
        _ => 0.0,
    }
}

/// When this process (the simulated fleet's runtime) ran a second or more late, and by how much.
pub(super) struct Late {
    seen: Arc<Mutex<Vec<(Instant, Duration)>>>,
    stop: CancellationToken,
}

impl Late {
    pub(super) fn watch() -> Self {
        let (seen, stop) = (Arc::new(Mutex::new(Vec::new())), CancellationToken::new());
        let record = seen.clone();
        tokio::spawn(tether_process::stall::watch_with(stop.clone(), move |late| {
            record
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((Instant::now(), late))
        }));
        Self { seen, stop }
    }

    /// Prints what it saw, in seconds after `since`, and stops watching.
    pub(super) fn tell(self, since: Instant) {
        self.stop.cancel();
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let worst = seen.iter().map(|(_, d)| *d).max().unwrap_or_default();
        let when: Vec<String> = seen
            .iter()
            .take(20)
            .map(|(at, d)| {
                format!(
                    "+{:.1}s by {:.1}s",
                    at.duration_since(since).as_secs_f64(),
                    d.as_secs_f64()
                )
            })
            .collect();
        eprintln!(
            "   the benchmark's own runtime (the simulated fleet's) ran late {} times (worst {worst:.1?}){}{}",
            seen.len(),
            if when.is_empty() { "" } else { ": " },
            when.join(", ")
        );
    }
}
