use super::*;

/// The front-proxy CA rotates: the serving leader trusts the new CA without a restart.
pub(crate) async fn a_rotated_front_proxy_ca_is_trusted_without_a_restart(w: &World) {
    let leader = w.leader.lock().await;
    let alice = alice(&leader).await;
    let proxy_at = w.proxy_a;
    let (rotated, identity) = rotated_front_proxy();
    let before = front_proxy_get(&leader, proxy_at, &identity).await;
    assert!(
        !before.starts_with("HTTP/1.1 200"),
        "a certificate of an unknown CA is refused: {before}"
    );
    let trust = FrontProxyTrust::read(&leader).await;
    let (old_ca, set_ca) = (trust.old_ca.clone(), |pem| trust.set(pem));
    set_ca(format!("{}\n{}", old_ca.trim_end(), rotated.ca_cert)).await;
    eventually(
        "the proxy trusts the added CA",
        Duration::from_secs(30),
        || async {
            let answer = front_proxy_get(&leader, proxy_at, &identity).await;
            if answer.starts_with("HTTP/1.1 200") && answer.contains(tether_tunnel::GROUP) {
                Ok(())
            } else {
                Err(answer)
            }
        },
    )
    .await;
    get(&alice, "/api/v1/namespaces", &[])
        .await
        .expect("the API server's own front-proxy certificate still works");
    set_ca(old_ca.clone()).await;
    eventually(
        "the proxy stops trusting the removed CA",
        Duration::from_secs(30),
        || async {
            let answer = front_proxy_get(&leader, proxy_at, &identity).await;
            if answer.starts_with("HTTP/1.1 200") {
                Err(answer)
            } else {
                Ok(())
            }
        },
    )
    .await;
}

/// A front-proxy ConfigMap that cannot be used: the proxy keeps the last good trust.
pub(crate) async fn an_unusable_front_proxy_configmap_keeps_the_last_good_trust(w: &World) {
    let leader = w.leader.lock().await;
    let alice = alice(&leader).await;
    let proxy_at = w.proxy_a;
    let (_, identity) = rotated_front_proxy();
    let trust = FrontProxyTrust::read(&leader).await;
    let (old_ca, set_ca) = (trust.old_ca.clone(), |pem| trust.set(pem));
    set_ca("not a certificate".into()).await;
    eventually(
        "the leader sees the unusable ConfigMap and keeps its trust",
        Duration::from_secs(30),
        || async {
            let log = leader.controller.log();
            if log.contains("cannot be used; keeping the previous one") {
                Ok(())
            } else {
                Err(leader.controller.log_tail(5))
            }
        },
    )
    .await;
    get(&alice, "/api/v1/namespaces", &[])
        .await
        .expect("the API server's front proxy is still trusted");
    let refused = front_proxy_get(&leader, proxy_at, &identity).await;
    assert!(
        !refused.starts_with("HTTP/1.1 200"),
        "the removed CA stays refused: {refused}"
    );
    set_ca(old_ca.clone()).await;
}

/// The serving certificate is renewed from the same CA while serving (1m, at 40 s).
pub(crate) async fn the_serving_certificate_is_renewed_from_the_same_ca_while_serving(w: &World) {
    let leader = w.leader.lock().await;
    let alice = alice(&leader).await;
    let proxy_at = w.proxy_a;
    let first = serving_secret(&leader).await;
    let unix_now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock after 1970")
            .as_secs_f64()
    };
    let first_expiry = leader_metric(&leader, CERT_EXPIRY).await;
    assert!(
        first_expiry > unix_now() && first_expiry <= unix_now() + 61.0,
        "the expiry metric names the served 1m certificate: {first_expiry} (now {})",
        unix_now()
    );
    let renewed = eventually(
        "the leader renews its serving certificate and serves the new one",
        Duration::from_secs(60),
        || async {
            let now = serving_secret(&leader).await;
            if now.0 == first.0 {
                return Err("not renewed yet".to_string());
            }
            let served = served_certificate(proxy_at, &now.1).await?;
            if served == now.0 {
                Ok(now)
            } else {
                Err("renewed, not yet served".to_string())
            }
        },
    )
    .await;
    assert_eq!(
        renewed.1, first.1,
        "the CA (the APIService's caBundle) stays the same"
    );
    let expiry = leader_metric(&leader, CERT_EXPIRY).await;
    assert!(
        expiry > first_expiry && expiry <= unix_now() + 61.0,
        "the expiry metric follows the renewal: {first_expiry} → {expiry} (now {})",
        unix_now()
    );
    assert!(
        leader_metric(
            &leader,
            "tether_leader_proxy_certificate_renewals_total{result=\"renewed\"}"
        )
        .await
            >= 1.0,
        "the renewal is counted"
    );
    get(&alice, "/api/v1/namespaces", &[])
        .await
        .expect("the API server trusts the renewed certificate");
}

/// A renewal the API server refuses: counted, retried after 1 min; the front-proxy watch goes on meanwhile.
pub(crate) async fn a_refused_renewal_is_counted_and_retried_while_the_trust_is_followed(w: &World) {
    let leader = w.leader.lock().await;
    let alice = alice(&leader).await;
    let proxy_at = w.proxy_a;
    let (rotated, _) = rotated_front_proxy();
    let trust = FrontProxyTrust::read(&leader).await;
    let (old_ca, set_ca) = (trust.old_ca.clone(), |pem| trust.set(pem));
    let roles = Api::<Role>::namespaced(leader.admin.clone(), HOME);
    let granted = roles.get("tether-leader").await.expect("the leader's Role");
    let mut revoked = granted.rules.clone().unwrap_or_default();
    for rule in &mut revoked {
        if rule
            .resource_names
            .as_ref()
            .is_some_and(|n| n.iter().any(|n| n == "tether-leader-proxy-serving"))
        {
            rule.verbs.retain(|v| v != "update");
        }
    }
    let set_rules = |rules: serde_json::Value| {
        let roles = roles.clone();
        async move {
            roles
                .patch(
                    "tether-leader",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"rules": rules})),
                )
                .await
                .expect("patch the leader's Role");
        }
    };
    set_rules(json!(revoked)).await;
    let renewals = |result: &'static str| {
        let leader = &leader;
        async move {
            let series = format!("tether_leader_proxy_certificate_renewals_total{{result=\"{result}\"}}");
            leader_metric(leader, &series).await
        }
    };
    let renewed_before = renewals("renewed").await;
    assert_eq!(
        renewals("failed").await,
        0.0,
        "no renewal failed before the Role lost update"
    );
    eventually(
        "the next renewal (40 s after the last) is refused and counted",
        Duration::from_secs(60),
        || async {
            if renewals("failed").await >= 1.0 {
                Ok(())
            } else {
                Err(leader.controller.log_tail(3))
            }
        },
    )
    .await;
    assert!(
        leader
            .controller
            .log()
            .contains("Cannot renew the proxy serving certificate; retrying in 1 min"),
        "the log says why and when it retries: {}",
        leader.controller.log_tail(5)
    );
    const TRUST_CHANGED: &str = "The API server's front-proxy trust changed; new connections";
    let changes = leader.controller.log().matches(TRUST_CHANGED).count();
    set_ca(format!("{}\n{}", old_ca.trim_end(), rotated.ca_cert)).await;
    eventually(
        "the front-proxy ConfigMap is followed while the renewal waits to retry",
        Duration::from_secs(20),
        || async {
            let now = leader.controller.log().matches(TRUST_CHANGED).count();
            if now > changes { Ok(()) } else { Err(now) }
        },
    )
    .await;
    set_ca(old_ca.clone()).await;
    assert_eq!(
        (renewals("failed").await, renewals("renewed").await),
        (1.0, renewed_before),
        "one failure, not retried at once (the retry waits 1 min)"
    );
    set_rules(json!(granted.rules)).await;
    eventually(
        "the retry renews the certificate and serves it",
        Duration::from_secs(90),
        || async {
            let now = serving_secret(&leader).await;
            if renewals("renewed").await <= renewed_before {
                return Err("not renewed yet".to_string());
            }
            let served = served_certificate(proxy_at, &now.1).await?;
            if served == now.0 {
                Ok(())
            } else {
                Err("renewed, not yet served".to_string())
            }
        },
    )
    .await;
    eventually(
        "the API server reaches the proxy again",
        Duration::from_secs(30),
        || get(&alice, "/api/v1/namespaces", &[]),
    )
    .await;
}

/// After a failover the standby serves and brings an old agent Role up to date.
pub(crate) async fn after_a_failover_the_standby_serves_and_updates_an_old_agent_role(w: &World) {
    let mut leader = w.leader.lock().await;
    let alice = alice(&leader).await;
    let alice_west = through(&leader, "alice", Some("devs"), "west").await;
    let west_roles = Api::<Role>::namespaced(leader.admin.clone(), &ns_of("west"));
    let mut role = west_roles.get("tether-agent").await.expect("west's agent Role");
    let full = role.rules.clone();
    role.rules
        .as_mut()
        .expect("rules")
        .retain(|r| !r.resources.iter().flatten().any(|x| x.ends_with("/attach")));
    assert_ne!(role.rules, full, "the attach rule was there");
    west_roles
        .replace("tether-agent", &PostParams::default(), &role)
        .await
        .expect("strip the attach rule");

    // The leading replica is killed: the standby serves and the tunnels come back.
    let args = fleet::proxy_args(w.proxy_b, 4, &[CERT_VALIDITY]);
    let b = leader.start_replica("leader-b", &args).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let killed = Instant::now();
    leader.controller.kill();
    eventually(
        "east answers through the new leader",
        Duration::from_secs(60),
        || async { get(&alice, "/api/v1/namespaces", &[]).await.map(|_| ()) },
    )
    .await;
    let back = killed.elapsed();
    eprintln!("member access back {back:.1?} after the leading replica was killed (lease 4 s)");

    // The new leader gives west's agent Role its attach rule back, and west's tunnel attaches.
    eventually(
        "west's agent Role is current again",
        Duration::from_secs(60),
        || async {
            let now = west_roles.get("tether-agent").await.map_err(|e| e.to_string())?;
            if now.rules != full {
                Err(format!("{:?}", now.rules))
            } else if !b.log().contains("Updated the agent Role to this version's rules") {
                Err(format!("the new leader does not say so: {}", b.log_tail(20)))
            } else {
                Ok(())
            }
        },
    )
    .await;
    eventually(
        "west answers through the new leader (its agent refuses alice: it impersonates no one)",
        Duration::from_secs(60),
        || async {
            match get(&alice_west, "/api/v1/namespaces", &[]).await {
                Err((403, body)) if body.contains("member west allows no impersonation") => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
}

/// A front-proxy CA the API server does not know, and a front-proxy client certificate of it.
fn rotated_front_proxy() -> (tether_testkit::pki::Pki, (String, String)) {
    let rotated = tether_testkit::pki::Pki::generate("rotated-front-proxy").expect("new CA");
    let identity = rotated
        .client_cert(tether_testkit::cluster::FRONT_PROXY_CLIENT, None)
        .expect("client cert");
    (rotated, identity)
}
