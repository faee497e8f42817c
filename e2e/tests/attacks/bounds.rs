//! What a hostile caller can make the leader hold, and how soon a revoked tunnel closes.

use super::*;

/// A TLS client of the proxy port that trusts the serving CA and presents no certificate.
async fn anonymous_tls(w: &World) -> tokio_rustls::TlsConnector {
    use rustls::pki_types::{CertificateDer, pem::PemObject};
    let secret = Api::<Secret>::namespaced(w.leader.admin.clone(), HOME)
        .get("tether-leader-proxy-serving")
        .await
        .expect("proxy serving Secret");
    let ca = secret.data.expect("data")["ca.crt"].0.clone();
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(&ca) {
        roots.add(c.expect("CA")).expect("CA");
    }
    let config =
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

/// Sends `path` as a keep-alive HTTP/1.1 GET without a client certificate; what was read until
/// the server closed, or `None` when it kept the connection open for 15 s.
async fn anonymous_get(w: &World, path: &str) -> Option<String> {
    let tls = anonymous_tls(w).await;
    let name =
        rustls::pki_types::ServerName::try_from(format!("tether-leader-proxy.{HOME}.svc")).expect("name");
    let tcp = tokio::net::TcpStream::connect(w.proxy).await.expect("connect");
    let mut s = tls
        .connect(name, tcp)
        .await
        .expect("TLS without a client certificate");
    let host = w.proxy;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes())
        .await
        .expect("write");
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(15), s.read_to_end(&mut out)).await;
    read.is_ok().then(|| String::from_utf8_lossy(&out).to_string())
}

pub(super) async fn a_peer_without_the_front_proxy_certificate_gets_health_only_then_is_closed(w: &World) {
    let health = anonymous_get(w, "/healthz")
        .await
        .expect("closed after the health answer");
    assert!(
        health.starts_with("HTTP/1.1 200") && health.ends_with("ok"),
        "{health}"
    );
    let api = format!("/apis/{}/{}", tether_tunnel::GROUP, tether_tunnel::VERSION);
    let refused = anonymous_get(w, &api).await.expect("closed after the refusal");
    assert!(refused.starts_with("HTTP/1.1 401"), "{refused}");
}

pub(super) async fn six_hundred_idle_connections_are_closed_within_30_s_without_a_restart(w: &World) {
    let pid = w.leader.controller.pid();
    let refused_before = leader_counter(&w.leader, "tether_leader_proxy_connections_refused_total").await;
    let started = Instant::now();
    let mut conns = Vec::new();
    for _ in 0..600 {
        conns.push(tokio::net::TcpStream::connect(w.proxy).await.expect("connect"));
    }
    let opened = started.elapsed();
    // Each never sends a byte; each must see its connection closed within 30 s of the start.
    let waits = conns.into_iter().map(|mut c| async move {
        let mut buf = [0u8; 64];
        let left = Duration::from_secs(30).saturating_sub(started.elapsed());
        match tokio::time::timeout(left, c.read(&mut buf)).await {
            Ok(_) => Some(started.elapsed()),
            Err(_) => None,
        }
    });
    let closed: Vec<Option<Duration>> = futures::future::join_all(waits).await;
    let open = closed.iter().filter(|c| c.is_none()).count();
    let last = closed.iter().flatten().max().copied().unwrap_or_default();
    eprintln!("600 idle connections opened in {opened:?}; all closed by {last:?}, {open} still open at 30 s");
    assert_eq!(open, 0, "idle connections held past 30 s");
    let refused = leader_counter(&w.leader, "tether_leader_proxy_connections_refused_total").await;
    assert!(
        refused - refused_before >= (600 - MAX_CONNECTIONS) as f64,
        "past the cap of {MAX_CONNECTIONS}, connections are closed at once: {refused_before} → {refused}"
    );
    assert_eq!(w.leader.controller.pid(), pid);
    assert!(w.leader.cluster.pid("kube-apiserver").is_some());
    alice_is_served(w, "east").await;
}

/// What one trickled POST got: its status, or why it got none.
async fn trickled_post(w: &World, path: &str) -> Result<u16, String> {
    use kube::client::ConfigExt;
    let config = w
        .leader
        .cluster
        .user_config("alice", None)
        .await
        .expect("user config");
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config.rustls_client_config().expect("tls config")));
    let host = config.cluster_url.host().expect("host").to_string();
    let port = config.cluster_url.port_u16().expect("port");
    let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|e| e.to_string())?;
    let server = rustls::pki_types::ServerName::try_from(host.clone()).expect("server name");
    let s = tls.connect(server, tcp).await.map_err(|e| e.to_string())?;
    let (mut rd, mut wr) = tokio::io::split(s);
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        3 * 1024 * 1024
    );
    let writer = async move {
        wr.write_all(head.as_bytes()).await?;
        wr.write_all(&vec![b' '; 1024 * 1024]).await?;
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            wr.write_all(&[b' '; 1024]).await?;
        }
        #[allow(unreachable_code)]
        Ok::<(), std::io::Error>(())
    };
    let reader = async move {
        let mut buf = vec![0u8; 4096];
        let n = rd.read(&mut buf).await.map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&buf[..n]).to_string();
        text.split_whitespace()
            .nth(1)
            .and_then(|c| c.parse::<u16>().ok())
            .ok_or_else(|| format!("no status line: {text:?}"))
    };
    tokio::select! {
        r = tokio::time::timeout(Duration::from_secs(45), reader) => r.map_err(|_| "no answer within 45 s".to_string())?,
        w = writer => Err(format!("the connection closed while sending: {w:?}")),
    }
}

pub(super) async fn trickled_request_bodies_are_bounded_and_others_are_served(w: &World) {
    let agent = w.east.agent.as_ref().expect("east's agent").pid();
    let before = tether_e2e::probe::procfs::rss_mib(agent, "VmRSS");
    let path = format!(
        "{}/api/v1/namespaces/default/configmaps",
        tether_tunnel::proxy_path(&ns_of("east"), "east")
    );
    let posts: Vec<_> = (0..32).map(|_| trickled_post(w, &path)).collect();
    let attack = futures::future::join_all(posts);
    tokio::pin!(attack);
    // While they trickle: another caller is served, east stays Ready, the agent's memory is read.
    let alice = through(&w.leader, "alice", None, "east").await;
    let mut peak = before;
    let mut served = Vec::new();
    let results = loop {
        tokio::select! {
            r = &mut attack => break r,
            _ = tokio::time::sleep(Duration::from_secs(2)) => {
                peak = peak.max(tether_e2e::probe::procfs::rss_mib(agent, "VmRSS"));
                let t = Instant::now();
                let ok = get(&alice, "/api/v1/namespaces/default", &[]).await.is_ok();
                served.push((ok, t.elapsed()));
            }
        }
    };
    let codes: Vec<String> = results.iter().map(|r| format!("{r:?}")).collect();
    eprintln!(
        "32 trickled 3 MiB bodies: {codes:?}; agent RSS {before:.1} MiB before, peak {peak:.1} MiB; \
         other caller: {served:?}"
    );
    assert!(
        results.iter().all(|r| matches!(r, Ok(408 | 429))),
        "every trickle is answered 408 or 429: {codes:?}"
    );
    assert!(
        results.iter().any(|r| matches!(r, Ok(429))),
        "past the byte budget: 429: {codes:?}"
    );
    assert!(
        peak < 64.0,
        "the agent stays under its 64 MiB limit: peak {peak:.1} MiB"
    );
    assert!(
        !served.is_empty() && served.iter().all(|(ok, t)| *ok && *t < Duration::from_secs(2)),
        "{served:?}"
    );
    let mc = Api::<ManagedCluster>::namespaced(w.leader.admin.clone(), &ns_of("east"))
        .get("east")
        .await
        .expect("east");
    let ready = mc
        .status
        .as_ref()
        .and_then(|s| {
            tether_api::conditions::find(&s.conditions, tether_api::conditions::ConditionType::Ready)
        })
        .map(|c| c.status.clone());
    assert_eq!(ready.as_deref(), Some("True"), "east's heartbeats kept it Ready");
}

/// Waits until the leader's revocation counter for `reason` rises above `before`; how long it took.
async fn revoked(w: &World, reason: &str, before: f64, since: Instant) -> Duration {
    let series = format!("tether_leader_tunnel_revocations_total{{reason=\"{reason}\"}}");
    eventually(
        &format!("a {reason} revocation"),
        Duration::from_secs(10),
        || async {
            let now = leader_metric_read(&w.leader, &series).await?.unwrap_or(0.0);
            if now > before {
                Ok(since.elapsed())
            } else {
                Err(format!("{series} = {now}"))
            }
        },
    )
    .await
}

async fn revocations(w: &World, reason: &str) -> f64 {
    let series = format!("tether_leader_tunnel_revocations_total{{reason=\"{reason}\"}}");
    leader_counter(&w.leader, &series).await
}

pub(super) async fn deleting_the_agents_service_account_closes_its_tunnel_within_10_s(w: &World) {
    let before = revocations(w, "identity_deleted").await;
    let since = Instant::now();
    Api::<ServiceAccount>::namespaced(w.leader.admin.clone(), &ns_of("east"))
        .delete("tether-agent", &DeleteParams::default())
        .await
        .expect("delete east's agent ServiceAccount");
    let took = revoked(w, "identity_deleted", before, since).await;
    eprintln!("east's tunnel closed {took:?} after its agent ServiceAccount was deleted");
    assert!(took <= Duration::from_secs(10));
    // Nothing restarted: the agent registers again as the same member and is served again.
    alice_is_served(w, "east").await;
    assert!(w.east.agent.as_ref().is_some());
}

pub(super) async fn removing_a_member_closes_its_tunnel_within_10_s(w: &World) {
    let alice = through(&w.leader, "alice", None, "west").await;
    get(&alice, "/api/v1/namespaces", &[])
        .await
        .expect("west served before");
    let before = revocations(w, "member_removed").await;
    let since = Instant::now();
    Api::<ManagedCluster>::namespaced(w.leader.admin.clone(), &ns_of("west"))
        .delete("west", &DeleteParams::default())
        .await
        .expect("remove west");
    let took = revoked(w, "member_removed", before, since).await;
    eprintln!("west's tunnel closed {took:?} after its ManagedCluster was deleted");
    assert!(took <= Duration::from_secs(10));
    let err = get(&alice, "/api/v1/namespaces", &[])
        .await
        .expect_err("west is not served once removed");
    assert!(matches!(err.0, 403 | 404 | 503), "{err:?}");
    assert!(w.west.agent.is_some(), "nothing was restarted");
}
