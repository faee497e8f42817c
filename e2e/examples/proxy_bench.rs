//! Member access benchmark (`make bench-proxy`): proxy vs direct to the same member, side by side
//! in one run, on real clusters in this run's lab network namespace (needs root).
//!
//! - latency of a small GET (p50/p99), direct to the member and through the leader, interleaved;
//! - throughput of a large list (MiB/s, median of 5), both ways;
//! - one stalled reader (a large list whose body is never read) beside a second stream: the
//!   second stream's latency with and without the staller;
//! - leader memory and CPU per idle tunnel: N simulated members (tether-sim's code, default
//!   1,000) attach tunnels; leader RSS and CPU over a minute before and after.
//!
//! `cargo run --release -p tether-e2e --example proxy_bench -- [N] [latency]` (`latency`: only the
//! small-GET figures and where their time goes).

use std::process::ExitCode;
use std::time::{Duration, Instant};
use tether_e2e::fleet::{LeaderSide, policy};

use http::Request;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};
use serde_json::json;
use tether_e2e::access::{apply, grant_proxy, through, wait_tunnel};
use tether_e2e::fleet;
use tether_e2e::probe::procfs::{CLOCK_TICKS, cpu_ns, cpu_ticks, rss_mib};
use tether_e2e::scale::sim_join;
use tether_e2e::sim::{HOME, join_token};
use tether_sim::{Fleet, join_all, quantile};
use tether_testkit::{TestCluster, free_port, lab};

fn main() -> ExitCode {
    if let Err(err) = lab::enter() {
        eprintln!("error: the proxy benchmark needs its lab network namespace: {err}");
        return ExitCode::FAILURE;
    }
    let tunnels: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1000);
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let latency_only = std::env::args().nth(2).as_deref() == Some("latency");
    rt.block_on(bench(tunnels, latency_only));
    ExitCode::SUCCESS
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

async fn timed_get(c: &Client, path: &str) -> Duration {
    let t = Instant::now();
    let req = Request::get(path).body(Vec::new()).expect("request");
    c.request_text(req).await.expect("GET");
    t.elapsed()
}

/// On-CPU time per request, in µs, of each of `procs` while `c` GETs `path` `n` times.
async fn cpu_per_get(c: &Client, path: &str, n: u32, procs: &[(&str, u32)]) -> Vec<f64> {
    let before: Vec<u64> = procs.iter().map(|(_, p)| cpu_ns(*p)).collect();
    for _ in 0..n {
        timed_get(c, path).await;
    }
    procs
        .iter()
        .zip(before)
        .map(|((_, p), b)| cpu_ns(*p).saturating_sub(b) as f64 / 1000.0 / f64::from(n))
        .collect()
}

async fn bench(tunnels: usize, latency_only: bool) {
    let cluster = TestCluster::builder("leader")
        .start()
        .await
        .expect("leader cluster");
    let addr = std::net::SocketAddr::from((lab::GATEWAY, free_port().expect("port")));
    let leader = LeaderSide::on(cluster)
        .policy(policy("60s", "240s"))
        .proxy(addr, 15)
        .start()
        .await;
    let token = join_token(&leader.admin).await;
    let east =
        fleet::member_with_args("east", &leader, &token, json!({}), &["--impersonate-users=bench"]).await;
    wait_tunnel(&leader, "east", "True").await;
    grant_proxy(&leader, "east", &["bench"]).await;
    apply(&east.admin, None, json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "tether-agent-impersonate"},
        "rules": [{"apiGroups": [""], "resources": ["users"], "verbs": ["impersonate"], "resourceNames": ["tether:prod:bench"]}]})).await;
    apply(&east.admin, None, json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "tether-agent-impersonate"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "tether-agent-impersonate"},
        "subjects": [{"kind": "ServiceAccount", "name": "tether-agent", "namespace": HOME}]})).await;
    {
        apply(&east.admin, None, json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "bench-admin"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"kind": "User", "name": "tether:prod:bench", "apiGroup": "rbac.authorization.k8s.io"}]})).await;
    }
    // The same identity both ways: direct as tether:prod:bench (a client certificate of east),
    // proxied as leader user bench, impersonated as tether:prod:bench by the agent.
    let direct = east
        .cluster
        .user_client("tether:prod:bench", None)
        .await
        .expect("direct client");
    let proxied = through(&leader, "bench", None, "east").await;
    println!("machine: {} cores, {}", num_cpus(), mem_total());

    // 1. Small GET latency, interleaved.
    let path = "/api/v1/namespaces/default";
    for _ in 0..50 {
        timed_get(&direct, path).await;
        timed_get(&proxied, path).await;
    }
    let (mut d, mut p) = (Vec::new(), Vec::new());
    for _ in 0..500 {
        d.push(timed_get(&direct, path).await);
        p.push(timed_get(&proxied, path).await);
    }
    d.sort();
    p.sort();
    let (d50, p50) = (quantile(&d, 0.5), quantile(&p, 0.5));
    // Where the added time goes: a discovery GET that the leader's kube-apiserver answers itself,
    // against one it proxies to the leader proxy (answered there, no tunnel), interleaved.
    let on_leader = leader
        .cluster
        .user_client("bench", None)
        .await
        .expect("leader client");
    let local = format!("/apis/{}/{}", tether_api::GROUP, "v1alpha1");
    let aggregated = format!("/apis/{}/{}", tether_tunnel::GROUP, tether_tunnel::VERSION);
    let (mut l, mut a) = (Vec::new(), Vec::new());
    for _ in 0..500 {
        l.push(timed_get(&on_leader, &local).await);
        a.push(timed_get(&on_leader, &aggregated).await);
    }
    l.sort();
    a.sort();
    let (l50, a50) = (quantile(&l, 0.5), quantile(&a, 0.5));
    println!(
        "small GET (500 pairs): direct p50 {:.2} ms p99 {:.2} ms | proxy p50 {:.2} ms p99 {:.2} ms | proxy adds {:.2} ms at p50",
        ms(d50),
        ms(quantile(&d, 0.99)),
        ms(p50),
        ms(quantile(&p, 0.99)),
        ms(p50.saturating_sub(d50))
    );
    println!(
        "split (500 pairs, p50): leader kube-apiserver discovery {:.2} ms, through the aggregator to the leader proxy {:.2} ms (+{:.2} ms: aggregator hop); \
         the rest of the added time (tunnel, agent, member) {:.2} ms",
        ms(l50),
        ms(a50),
        ms(a50.saturating_sub(l50)),
        ms(p50.saturating_sub(d50)).max(0.0) - ms(a50.saturating_sub(l50)),
    );

    // Where the CPU goes: on-CPU time per small GET in each process on the path (the machine's
    // cores are shared, so on loopback the added latency is mostly this added CPU time).
    let procs = [
        (
            "member kube-apiserver",
            east.cluster.pid("kube-apiserver").unwrap_or(0),
        ),
        ("agent", east.agent.as_ref().map_or(0, |a| a.pid())),
        (
            "leader kube-apiserver",
            leader.cluster.pid("kube-apiserver").unwrap_or(0),
        ),
        ("leader proxy", leader.controller.pid()),
        ("client", std::process::id()),
    ];
    let n = 2000;
    let on_direct = cpu_per_get(&direct, path, n, &procs).await;
    let on_proxy = cpu_per_get(&proxied, path, n, &procs).await;
    let row = |v: &[f64]| {
        let parts: Vec<String> = procs
            .iter()
            .zip(v)
            .filter(|(_, us)| **us >= 1.0)
            .map(|((name, _), us)| format!("{name} {us:.0}"))
            .collect();
        format!("{} (sum {:.0})", parts.join(", "), v.iter().sum::<f64>())
    };
    println!("CPU per small GET ({n} each, µs): direct: {}", row(&on_direct));
    println!("CPU per small GET ({n} each, µs): proxy:  {}", row(&on_proxy));
    if latency_only {
        return;
    }

    // 2. Large list throughput.
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some("bench".into()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    Api::<Namespace>::all(east.admin.clone())
        .create(&PostParams::default(), &ns)
        .await
        .expect("namespace");
    let cms = Api::<ConfigMap>::namespaced(east.admin.clone(), "bench");
    let filler = "x".repeat(4096);
    let created = futures::future::join_all((0..2000).map(|i| {
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(format!("cm-{i:05}")),
                ..ObjectMeta::default()
            },
            data: Some([("data".to_string(), filler.clone())].into()),
            ..ConfigMap::default()
        };
        let cms = cms.clone();
        async move { cms.create(&PostParams::default(), &cm).await.is_ok() }
    }))
    .await;
    assert!(created.iter().all(|c| *c), "2000 ConfigMaps created");
    let list = "/api/v1/namespaces/bench/configmaps";
    let size = {
        let req = Request::get(list).body(Vec::new()).expect("request");
        direct.request_text(req).await.expect("list").len() as f64 / (1024.0 * 1024.0)
    };
    let pid = leader.controller.pid();
    let hwm_before = rss_mib(pid, "VmHWM");
    let mut rates = (Vec::new(), Vec::new());
    for _ in 0..5 {
        rates.0.push(size / timed_get(&direct, list).await.as_secs_f64());
        rates.1.push(size / timed_get(&proxied, list).await.as_secs_f64());
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (rd, rp) = (median(&mut rates.0), median(&mut rates.1));
    println!(
        "large list ({size:.1} MiB, median of 5): direct {rd:.1} MiB/s, proxy {rp:.1} MiB/s ({:.0} % of direct)",
        100.0 * rp / rd
    );
    println!(
        "leader memory while streaming: peak RSS {hwm_before:.1} MiB before the lists, {:.1} MiB after ten {size:.1} MiB lists",
        rss_mib(pid, "VmHWM")
    );

    // 3. A stalled reader beside a second stream.
    let mut before = Vec::new();
    for _ in 0..200 {
        before.push(timed_get(&proxied, path).await);
    }
    before.sort();
    let stalled = proxied
        .send(
            Request::get(list)
                .body(kube::client::Body::empty())
                .expect("request"),
        )
        .await
        .expect("stalled list");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut during = Vec::new();
    for _ in 0..200 {
        during.push(timed_get(&proxied, path).await);
    }
    during.sort();
    let second = size / timed_get(&proxied, list).await.as_secs_f64();
    drop(stalled);
    println!(
        "stalled reader: second stream small GET p50 {:.2} ms before, {:.2} ms while a {size:.1} MiB list sits unread; a second large list meanwhile {second:.1} MiB/s",
        ms(quantile(&before, 0.5)),
        ms(quantile(&during, 0.5)),
    );

    // 4. Idle tunnels at the leader.
    let window = Duration::from_secs(60);
    let measure = || async move {
        let (t0, c0) = (Instant::now(), cpu_ticks(pid));
        tokio::time::sleep(window).await;
        let cpu = (cpu_ticks(pid) - c0) as f64 / CLOCK_TICKS / t0.elapsed().as_secs_f64();
        (rss_mib(pid, "VmRSS"), cpu)
    };
    let join = sim_join(&leader, &token);
    let sim = Fleet::connect(join).await.expect("connect the simulated fleet");
    let mut members = Vec::new();
    let names = (0..tunnels).map(|i| format!("idle-{i:05}")).collect();
    join_all(&sim, names, 50, |m, _| members.push(m))
        .await
        .expect("simulated members join");
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (rss0, cpu0) = measure().await;
    let started: Vec<_> = members.iter().map(|m| tokio::spawn(m.tunnel("prod"))).collect();
    let t = Instant::now();
    let admin = leader.admin.clone();
    loop {
        let attached = Api::<tether_api::ManagedCluster>::all(admin.clone())
            .list(&Default::default())
            .await
            .map(|l| {
                l.items
                    .iter()
                    .filter(|m| {
                        m.status
                            .as_ref()
                            .and_then(|s| {
                                tether_api::conditions::find(
                                    &s.conditions,
                                    tether_api::conditions::ConditionType::TunnelConnected,
                                )
                            })
                            .is_some_and(|c| c.status == "True")
                    })
                    .count()
            })
            .unwrap_or(0);
        if attached > tunnels || t.elapsed() > Duration::from_secs(600) {
            println!("tunnels attached: {attached} in {:.1?}", t.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    tokio::time::sleep(Duration::from_secs(15)).await;
    let (rss1, cpu1) = measure().await;
    println!(
        "idle tunnels: {tunnels} attached; leader RSS {rss0:.1} -> {rss1:.1} MiB ({:.1} KiB per tunnel); leader CPU {:.2} % -> {:.2} % of a core ({:.2} % per 1,000 idle tunnels)",
        (rss1 - rss0) * 1024.0 / tunnels as f64,
        cpu0 * 100.0,
        cpu1 * 100.0,
        (cpu1 - cpu0) * 100.0 * 1000.0 / tunnels as f64
    );
    for s in started {
        s.abort();
    }
    drop(east);
}

fn num_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn mem_total() -> String {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .next()
                .map(|l| l.split_whitespace().nth(1).unwrap_or("?").to_string())
        })
        .and_then(|kib| kib.parse::<f64>().ok())
        .map_or("? memory".into(), |kib| {
            format!("{:.0} GiB", kib / 1024.0 / 1024.0)
        })
}
