use super::*;

/// A watch through the proxy outlives the leader's --request-timeout.
pub(crate) async fn a_watch_through_the_proxy_outlives_the_leaders_request_timeout(w: &World) {
    let leader = w.leader.lock().await;
    let east = &w.east;
    let alice = alice(&leader).await;
    let started = Instant::now();
    let ns_api = Api::<Namespace>::all(alice.clone());
    let mut stream = ns_api
        .watch(&WatchParams::default().timeout(120), "0")
        .await
        .expect("watch")
        .boxed();
    let creator = {
        let admin = east.admin.clone();
        tokio::spawn(async move {
            tokio::time::sleep(REQUEST_TIMEOUT + Duration::from_secs(5)).await;
            let ns = Namespace {
                metadata: ObjectMeta {
                    name: Some("late".into()),
                    ..ObjectMeta::default()
                },
                ..Namespace::default()
            };
            Api::<Namespace>::all(admin)
                .create(&PostParams::default(), &ns)
                .await
                .expect("create");
        })
    };
    let late = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(ev) = stream.try_next().await.expect("watch event") {
            if let WatchEvent::Added(ns) = ev
                && ns.name_any() == "late"
            {
                return started.elapsed();
            }
        }
        panic!("the watch ended before namespace late appeared");
    })
    .await
    .expect("namespace late seen through the watch");
    creator.await.expect("creator");
    assert!(late > REQUEST_TIMEOUT, "seen after {late:?}");
    eprintln!("watch event after {late:.1?} (leader --request-timeout {REQUEST_TIMEOUT:?})");
}

/// An upgraded stream (a member Service that speaks an upgrade protocol) passes through.
pub(crate) async fn an_upgraded_stream_passes_through_both_ways(w: &World) {
    let leader = w.leader.lock().await;
    let alice = alice(&leader).await;
    // NB: SPDY upgrades (kubectl exec, attach, port-forward without WebSockets) are POSTs
    // with `Content-Length: 0`; WebSocket upgrades are GETs.
    for method in [http::Method::GET, http::Method::POST] {
        let mut io = upgrade(
            &alice,
            method.clone(),
            "/api/v1/namespaces/default/services/http:echo:80/proxy/",
        )
        .await;
        for msg in [&b"ping"[..], &b"second message"[..]] {
            io.write_all(msg).await.expect("write");
            let mut buf = vec![0u8; msg.len()];
            tokio::time::timeout(Duration::from_secs(10), io.read_exact(&mut buf))
                .await
                .unwrap_or_else(|_| panic!("{method} upgrade: no echo within 10 s"))
                .expect("read echo");
            assert_eq!(buf, msg, "{method} upgrade");
        }
    }
}

/// An upgrade the member refuses: its answer reaches the caller and the connection closes.
pub(crate) async fn an_upgrade_the_member_refuses_reaches_the_caller_and_closes(w: &World) {
    let leader = w.leader.lock().await;
    let answer = tokio::time::timeout(
        Duration::from_secs(30),
        raw_upgrade(
            &leader,
            "alice",
            "east",
            "/api/v1/namespaces/default/services/http:echo:80/proxy/refuse",
        ),
    )
    .await
    .expect("the connection closes after a non-101 answer to an upgrade");
    assert!(
        answer.starts_with("HTTP/1.1 403") && answer.contains(EchoServer::REFUSAL),
        "{answer}"
    );
}

/// A member whose agent is gone: 503 that names it, TunnelConnected=False.
pub(crate) async fn a_member_whose_agent_is_gone_answers_503_naming_it(w: &World) {
    let leader = w.leader.lock().await;
    let mut west = w.west.lock().await;
    west.kill_agent();
    wait_tunnel(&leader, "west", "False").await;
    let alice_west = through(&leader, "alice", Some("devs"), "west").await;
    let err = get(&alice_west, "/api/v1/namespaces", &[]).await.unwrap_err();
    assert!(
        err.0 == 503 && err.1.contains("member west is not reachable"),
        "{err:?}"
    );
    west.start_agent();
    wait_tunnel(&leader, "west", "True").await;
}

/// Tether grant --revoke: the leader refuses alice on west, and only on west.
pub(crate) async fn tether_grant_revoke_refuses_alice_on_west_and_only_there(w: &World) {
    let leader = w.leader.lock().await;
    let alice = alice(&leader).await;
    let alice_west = through(&leader, "alice", Some("devs"), "west").await;
    let admin_kubeconfig = leader.cluster.kubeconfig().to_path_buf();
    let revoked = tether_as(
        &admin_kubeconfig,
        &["grant", "--cluster", "west", "--user", "alice", "--revoke"],
    );
    assert!(revoked.status.success(), "{revoked:?}");
    // The leader's RBAC refuses her now (before the grant, the request reached west's agent,
    // which impersonates no one).
    let err = get(&alice_west, "/api/v1/namespaces", &[]).await.unwrap_err();
    assert!(
        err.0 == 403
            && err.1.contains("User \"alice\" cannot")
            && err.1.contains("managedclusters/proxy")
            && !err.1.contains("allows no impersonation"),
        "{err:?}"
    );
    get(&alice, "/api/v1/namespaces", &[])
        .await
        .expect("alice still reaches east");
    let nothing = tether_as(
        &admin_kubeconfig,
        &["grant", "--cluster", "west", "--user", "alice", "--revoke"],
    );
    assert!(
        nothing.status.success() && String::from_utf8_lossy(&nothing.stdout).contains("nothing to do"),
        "{nothing:?}"
    );
    // Granted again through her group: the leader lets devs through to west.
    let group = tether_as(
        &admin_kubeconfig,
        &["grant", "--cluster", "west", "--group", "devs"],
    );
    assert!(
        group.status.success() && String::from_utf8_lossy(&group.stdout).contains("--group=tether:prod:devs"),
        "{group:?}"
    );
    eventually(
        "alice reaches west's agent again, as a member of devs",
        Duration::from_secs(10),
        || async {
            match get(&alice_west, "/api/v1/namespaces", &[]).await {
                Err((403, body)) if body.contains("member west allows no impersonation") => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
}
