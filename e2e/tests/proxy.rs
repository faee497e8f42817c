//! Member access through the leader, on real clusters: a leader whose kube-apiserver runs the
//! aggregation layer, the leader controller serving `proxy.multicluster.tether.dev` on the lab
//! bridge, and two members whose agents dial their tunnels out. Every identity rule is proven
//! against the real API servers: the leader's RBAC on `managedclusters/proxy`, the member's own
//! RBAC on the impersonated or passed-through identity, forged headers, another member's agent,
//! a watch longer than the leader's `--request-timeout`, an upgraded stream, a member whose
//! agent is gone, a rotated front-proxy CA (trusted and then dropped without a restart) and an
//! unusable one (the last good trust kept), the serving certificate renewed from the same CA
//! while serving (and a renewal the API server refuses, retried a minute later while the
//! front-proxy trust is still followed), a failover of the leader replica, and an agent Role
//! of an earlier version (no attach rule) that the new leader brings up to date.
//!
//! This binary has its own `main` (libtest-mimic): it moves into its lab network namespace
//! first, so every address it uses lives in namespaces this run creates.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use http::header::{CONNECTION, UPGRADE};
use http::{Request, StatusCode};
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Endpoints, Namespace, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::Role;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tether_e2e::access::{
    allow_impersonation, apply, get, grant_proxy, leader_metric, sealed, through, wait_tunnel,
};
use tether_e2e::fleet::{self, LeaderSide, MemberSide};
use tether_e2e::sim::{HOME, join_token, ns_of};
use tether_testkit::{TestCluster, eventually, free_port, lab};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn main() -> ExitCode {
    tether_e2e::lab_main(
        "the member-access test",
        "members_are_reached_through_the_leader_and_their_own_rbac_decides",
        member_access,
    )
}

fn step(what: &str) {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let t = START.get_or_init(Instant::now).elapsed();
    eprintln!("== [{:6.1}s] {what}", t.as_secs_f64());
}

/// A serving certificate this short is renewed (at 40 s) while the test runs.
const CERT_VALIDITY: &str = "--proxy-cert-validity=1m";
/// The leader's request timeout: the watch below must outlive it.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

async fn member_access() {
    let cluster = TestCluster::builder("leader")
        .request_timeout(REQUEST_TIMEOUT)
        .start()
        .await
        .expect("leader cluster");
    let addr = |port| std::net::SocketAddr::from((lab::GATEWAY, port));
    let (port_a, port_b) = (free_port().expect("port"), free_port().expect("port"));
    let mut leader = fleet::leader_with_proxy(
        cluster,
        json!({"heartbeatInterval": "2s", "gracePeriod": "6s"}),
        addr(port_a),
        4,
        &[CERT_VALIDITY],
    )
    .await;
    let token = join_token(&leader.admin).await;
    let east = fleet::member_with_args(
        "east",
        &leader,
        &token,
        json!({}),
        &[
            "--impersonate-users=alice,bob-unlisted-not",
            "--impersonate-groups=devs",
        ],
    )
    .await;
    let mut west = fleet::member("west", &leader, &token, json!({})).await;
    step("both tunnels attach");
    for m in ["east", "west"] {
        wait_tunnel(&leader, m, "True").await;
    }

    step("leader RBAC: who may use managedclusters/proxy");
    grant_proxy(&leader, "east", &["alice", "bob", "carol"]).await;
    // West's grant as the README says to make it: `tether grant` writes the leader's side and
    // prints the member's.
    let admin_kubeconfig = leader.cluster.kubeconfig().to_path_buf();
    let granted = tether_as(
        &admin_kubeconfig,
        &["grant", "--cluster", "west", "--user", "alice"],
    );
    let printed = String::from_utf8_lossy(&granted.stdout).to_string();
    assert!(granted.status.success(), "{granted:?}");
    assert!(
        printed.contains("--set 'proxy.impersonate.users={alice}'")
            && printed.contains("--clusterrole=view --user=tether:prod:alice")
            // NB: alice may not list ManagedClusters: the line printed for her names the namespace.
            && printed.contains("tether --cluster west --member-namespace tether-prod-west-"),
        "the member's side, and alice's line: {printed}"
    );
    let again = tether_as(
        &admin_kubeconfig,
        &["grant", "--cluster", "west", "--user", "alice"],
    );
    assert!(again.status.success(), "idempotent: {again:?}");
    member_rbac(&east).await;

    let alice = through(&leader, "alice", Some("devs"), "east").await;
    let names = list_namespaces(&alice)
        .await
        .expect("alice lists east's namespaces");
    assert!(names.contains(&"kube-system".to_string()), "{names:?}");

    step("the member's RBAC decides: the impersonated tether:prod:alice may not read Secrets");
    let err = get(&alice, "/api/v1/namespaces/kube-system/secrets", &[])
        .await
        .unwrap_err();
    assert!(err.0 == 403 && err.1.contains("tether:prod:alice"), "{err:?}");

    step("a leader user without managedclusters/proxy gets the leader's 403");
    let mallory = through(&leader, "mallory", None, "east").await;
    let err = get(&mallory, "/api/v1/namespaces", &[]).await.unwrap_err();
    assert!(err.0 == 403 && err.1.contains("managedclusters/proxy"), "{err:?}");

    step("a user not on the member's allow-list is never impersonated");
    let bob = through(&leader, "bob", None, "east").await;
    let err = get(&bob, "/api/v1/namespaces", &[]).await.unwrap_err();
    assert!(err.0 == 403 && err.1.contains("allow-list"), "{err:?}");

    step("forged identity headers are refused or stripped");
    let forged = [
        ("tether-remote-user", "system:admin"),
        ("tether-remote-group", "system:masters"),
        ("x-remote-user", "system:admin"),
        ("x-remote-group", "system:masters"),
    ];
    let err = get(&alice, "/api/v1/namespaces/kube-system/secrets", &forged)
        .await
        .unwrap_err();
    assert!(err.0 == 403 && err.1.contains("tether:prod:alice"), "{err:?}");
    get(&alice, "/api/v1/namespaces", &forged)
        .await
        .expect("alice still lists namespaces");
    let err = get(
        &alice,
        "/api/v1/namespaces",
        &[
            ("impersonate-group", "system:masters"),
            ("impersonate-user", "admin"),
        ],
    )
    .await
    .unwrap_err();
    assert_eq!(
        err.0, 403,
        "the leader refuses alice's own impersonation: {err:?}"
    );

    step("pass-through: a member credential decides, the leader identity does not");
    let reader = member_token(&east, "reader").await;
    let nobody = member_token(&east, "nobody").await;
    let carol = through(&leader, "carol", None, "east").await;
    let bearer = sealed(&leader, "east", "carol", &reader).await;
    get(
        &carol,
        "/api/v1/namespaces",
        &[("tether-member-authorization", &bearer)],
    )
    .await
    .expect("the reader token lists namespaces");
    let err = get(
        &alice,
        "/api/v1/namespaces",
        &[("tether-member-authorization", &bearer)],
    )
    .await
    .unwrap_err();
    assert!(
        err.0 == 401 && err.1.contains("another leader user"),
        "carol's sealed token is hers alone: {err:?}"
    );
    let bearer = sealed(&leader, "east", "carol", &nobody).await;
    let err = get(
        &carol,
        "/api/v1/namespaces",
        &[("tether-member-authorization", &bearer)],
    )
    .await
    .unwrap_err();
    assert!(
        err.0 == 403 && err.1.contains("system:serviceaccount:default:nobody"),
        "{err:?}"
    );

    step("pass-through from kubectl: tether --cluster east --member-token-file");
    // NB: the CLI finds the member's namespace by listing ManagedClusters, as fleet users may.
    apply(&leader.admin, None, json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "mcls-viewer"},
        "rules": [{"apiGroups": [tether_api::GROUP], "resources": ["managedclusters"], "verbs": ["get", "list"]}]})).await;
    apply(
        &leader.admin,
        None,
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "mcls-viewer"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "mcls-viewer"},
        "subjects": [{"kind": "User", "name": "carol", "apiGroup": "rbac.authorization.k8s.io"}]}),
    )
    .await;
    let carol_kubeconfig = leader.cluster.dir().join("carol.kubeconfig");
    leader
        .cluster
        .write_user_kubeconfig("carol", None, &carol_kubeconfig)
        .expect("carol's kubeconfig");
    let token_file = |name: &str, token: &str| {
        let path = leader.cluster.dir().join(format!("{name}.token"));
        std::fs::write(&path, token).expect("token file");
        path
    };
    let o = kubectl_through(
        &carol_kubeconfig,
        &token_file("reader", &reader),
        &["get", "ns", "-o", "name"],
    );
    assert!(
        o.status.success() && String::from_utf8_lossy(&o.stdout).contains("namespace/kube-system"),
        "{o:?}"
    );
    let o = kubectl_through(&carol_kubeconfig, &token_file("nobody", &nobody), &["get", "ns"]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success()
            && stderr.contains("forbidden")
            && stderr.contains("system:serviceaccount:default:nobody"),
        "{o:?}"
    );

    step("a user granted only managedclusters/proxy in east's namespace: --member-namespace");
    let alice_kubeconfig = leader.cluster.dir().join("alice.kubeconfig");
    leader
        .cluster
        .write_user_kubeconfig("alice", Some("devs"), &alice_kubeconfig)
        .expect("alice's kubeconfig");
    let o = tether_as(
        &alice_kubeconfig,
        &["--cluster", "east", "--", "get", "ns", "-o", "name"],
    );
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && stderr.contains("--member-namespace"),
        "without the namespace, listing ManagedClusters is refused and the error says what to pass: {o:?}"
    );
    let east_ns = ns_of("east");
    let o = tether_as(
        &alice_kubeconfig,
        &[
            "--cluster",
            "east",
            "--member-namespace",
            &east_ns,
            "--",
            "get",
            "ns",
            "-o",
            "name",
        ],
    );
    assert!(
        o.status.success() && String::from_utf8_lossy(&o.stdout).contains("namespace/kube-system"),
        "{o:?}"
    );
    // `tether kubeconfig`: -o is the format, as in kubectl; --output-file writes it, private.
    let o = tether_as(
        &alice_kubeconfig,
        &[
            "kubeconfig",
            "--cluster",
            "east",
            "--member-namespace",
            &east_ns,
            "-o",
            "json",
        ],
    );
    let kc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {o:?}"));
    let server = kc["clusters"][0]["cluster"]["server"]
        .as_str()
        .unwrap_or_default();
    assert!(
        server.contains(&format!("/namespaces/{east_ns}/managedclusters/east/proxy")),
        "{kc}"
    );
    let file = std::env::temp_dir().join(format!("tether-proxy-east-{}.kubeconfig", std::process::id()));
    let o = tether_as(
        &alice_kubeconfig,
        &[
            "kubeconfig",
            "--cluster",
            "east",
            "--member-namespace",
            &east_ns,
            "--output-file",
            file.to_str().expect("path"),
        ],
    );
    assert!(o.status.success(), "{o:?}");
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&file).expect("written").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "the kubeconfig holds a credential");
    }
    let o = kubectl_with(&file, &["get", "ns", "kube-system", "-o", "name"]);
    assert!(
        o.status.success() && String::from_utf8_lossy(&o.stdout).contains("namespace/kube-system"),
        "kubectl with the written kubeconfig reaches east: {o:?}"
    );
    let _ = std::fs::remove_file(&file);
    // Pass-through by a user who may not read the ManagedCluster: the key comes from the leader.
    let reader_file = token_file("reader-alice", &reader);
    let o = tether_as(
        &alice_kubeconfig,
        &[
            "--cluster",
            "east",
            "--member-namespace",
            &east_ns,
            "--member-token-file",
            reader_file.to_str().expect("path"),
            "--",
            "get",
            "ns",
            "-o",
            "name",
        ],
    );
    assert!(
        o.status.success() && String::from_utf8_lossy(&o.stdout).contains("namespace/kube-system"),
        "{o:?}"
    );
    let o = tether_as(
        &carol_kubeconfig,
        &[
            "kubeconfig",
            "--cluster",
            "east",
            "--member-namespace",
            "tether-no-such-ns",
        ],
    );
    assert!(
        !o.status.success() && String::from_utf8_lossy(&o.stderr).contains("no member \"east\" in namespace"),
        "{o:?}"
    );

    step("agent west cannot serve east's tunnel");
    let west_token = leader_sa_token(&leader, &ns_of("west")).await;
    let (code, body) = attach_as(&leader, &west_token, "east").await;
    assert_eq!(code, StatusCode::FORBIDDEN, "the leader's RBAC refuses: {body}");
    grant_attach(&leader, "east", &ns_of("west")).await;
    let (code, body) = eventually(
        "the proxy itself refuses west's agent",
        Duration::from_secs(20),
        || async {
            let (code, body) = attach_as(&leader, &west_token, "east").await;
            if body.contains("only member east's agent") {
                Ok((code, body))
            } else {
                Err(format!("{code}: {body}"))
            }
        },
    )
    .await;
    assert_eq!(code, StatusCode::FORBIDDEN, "{body}");
    get(&alice, "/api/v1/namespaces", &[])
        .await
        .expect("east's own tunnel still serves");

    step("a watch through the proxy outlives the leader's --request-timeout");
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

    step("an upgraded stream (a member Service that speaks an upgrade protocol) passes through");
    let echo = EchoServer::start().await;
    expose_echo(&east, echo.port).await;
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

    step("an upgrade the member refuses: its answer reaches the caller and the connection closes");
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

    step("a member whose agent is gone: 503 that names it, TunnelConnected=False");
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

    step("tether grant --revoke: the leader refuses alice on west, and only on west");
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

    step("the front-proxy CA rotates: the serving leader trusts the new CA without a restart");
    let proxy_at = addr(port_a);
    let rotated = tether_testkit::pki::Pki::generate("rotated-front-proxy").expect("new CA");
    let identity = rotated
        .client_cert(tether_testkit::cluster::FRONT_PROXY_CLIENT, None)
        .expect("client cert");
    let before = front_proxy_get(&leader, proxy_at, &identity).await;
    assert!(
        !before.starts_with("HTTP/1.1 200"),
        "a certificate of an unknown CA is refused: {before}"
    );
    let configmaps = Api::<ConfigMap>::namespaced(leader.admin.clone(), "kube-system");
    let trust = configmaps
        .get("extension-apiserver-authentication")
        .await
        .expect("front-proxy ConfigMap");
    let old_ca = trust
        .data
        .as_ref()
        .and_then(|d| d.get("requestheader-client-ca-file"))
        .cloned()
        .expect("requestheader CA");
    let set_ca = |pem: String| {
        let configmaps = configmaps.clone();
        async move {
            configmaps
                .patch(
                    "extension-apiserver-authentication",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"data": {"requestheader-client-ca-file": pem}})),
                )
                .await
                .expect("patch the front-proxy CA bundle");
        }
    };
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

    step("a front-proxy ConfigMap that cannot be used: the proxy keeps the last good trust");
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

    step("the serving certificate is renewed from the same CA while serving (1m, at 40 s)");
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

    step(
        "a renewal the API server refuses: counted, retried after 1 min; the front-proxy watch goes on meanwhile",
    );
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

    step("west's agent Role as a leader before member access made it: no attach rule");
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

    step("the leading replica is killed: the standby serves and the tunnels come back");
    let args = fleet::proxy_args(addr(port_b), 4, &[CERT_VALIDITY]);
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

    step("the new leader gives west's agent Role its attach rule back, and west's tunnel attaches");
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
    step("done");
    drop(east);
}

/// The leader's gauge of when the proxy's serving certificate expires.
const CERT_EXPIRY: &str = "tether_leader_proxy_certificate_expiry_timestamp_seconds";

/// The leaf certificate (DER) and CA (PEM) in the proxy serving Secret.
async fn serving_secret(leader: &LeaderSide) -> (Vec<u8>, Vec<u8>) {
    use rustls::pki_types::{CertificateDer, pem::PemObject};
    let secret = Api::<Secret>::namespaced(leader.admin.clone(), HOME)
        .get("tether-leader-proxy-serving")
        .await
        .expect("proxy serving Secret");
    let data = secret.data.expect("data");
    let leaf = CertificateDer::pem_slice_iter(&data["tls.crt"].0)
        .next()
        .expect("tls.crt")
        .expect("tls.crt PEM");
    (leaf.to_vec(), data["ca.crt"].0.clone())
}

/// The leaf certificate (DER) the proxy at `at` serves, verified against `ca` for the Service name.
async fn served_certificate(at: std::net::SocketAddr, ca: &[u8]) -> Result<Vec<u8>, String> {
    use rustls::pki_types::{CertificateDer, pem::PemObject};
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca) {
        roots
            .add(c.map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    }
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from(format!("tether-leader-proxy.{HOME}.svc"))
        .map_err(|e| e.to_string())?;
    let handshake = async {
        let tcp = tokio::net::TcpStream::connect(at).await?;
        tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
            .connect(name, tcp)
            .await
    };
    let tls = tokio::time::timeout(Duration::from_secs(10), handshake)
        .await
        .map_err(|_| "no TLS handshake within 10 s".to_string())?
        .map_err(|e| e.to_string())?;
    tls.get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.to_vec())
        .ok_or_else(|| "no server certificate".to_string())
}

/// `tether --cluster east --member-token-file <token> -- <args>` with `kubeconfig` for the leader.
fn kubectl_through(
    kubeconfig: &std::path::Path,
    token: &std::path::Path,
    args: &[&str],
) -> std::process::Output {
    let token = token.display().to_string();
    let mut all = vec!["--cluster", "east", "--member-token-file", &token, "--"];
    all.extend_from_slice(args);
    tether_as(kubeconfig, &all)
}

/// `tether <args>` with `kubeconfig` for the leader.
fn kubectl_with(kubeconfig: &std::path::Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(tether_testkit::Tools::locate().expect("tools").path("kubectl"))
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(args)
        .output()
        .expect("kubectl")
}

fn tether_as(kubeconfig: &std::path::Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(tether_testkit::controller::binary("tether").expect("tether"))
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(args)
        .env(
            "KUBECTL",
            tether_testkit::Tools::locate().expect("tools").path("kubectl"),
        )
        .output()
        .expect("tether")
}

/// A misconfiguration: the agent ServiceAccount of `other_ns` may attach member `name` too.
async fn grant_attach(leader: &LeaderSide, name: &str, other_ns: &str) {
    let ns = ns_of(name);
    apply(&leader.admin, Some(&ns), json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "stray-attach", "namespace": ns},
        "rules": [{"apiGroups": [tether_tunnel::GROUP], "resources": ["managedclusters/attach"], "verbs": ["get"]}]})).await;
    apply(
        &leader.admin,
        Some(&ns),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "stray-attach", "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "stray-attach"},
        "subjects": [{"kind": "ServiceAccount", "name": "tether-agent", "namespace": other_ns}]}),
    )
    .await;
}

/// The member side of east, as its admin would set it: the agent may impersonate exactly
/// tether:prod:alice and tether:prod:devs; tether:prod:alice may list namespaces and proxy to
/// Services; a `reader` ServiceAccount may list namespaces, `nobody` may do nothing.
async fn member_rbac(m: &MemberSide) {
    let c = &m.admin;
    allow_impersonation(m, &["alice"], &["devs"]).await;
    apply(
        c,
        None,
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "namespace-reader"},
        "rules": [{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]},
                  {"apiGroups": [""], "resources": ["services/proxy"], "verbs": ["get", "create"]}]}),
    )
    .await;
    apply(c, None, json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "namespace-reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "namespace-reader"},
        "subjects": [{"kind": "Group", "name": "tether:prod:devs", "apiGroup": "rbac.authorization.k8s.io"},
                     {"kind": "ServiceAccount", "name": "reader", "namespace": "default"}]})).await;
    for sa in ["reader", "nobody"] {
        apply(
            c,
            Some("default"),
            json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": sa, "namespace": "default"}}),
        )
        .await;
    }
}

/// A token of ServiceAccount `default/<sa>` on member `m`.
async fn member_token(m: &MemberSide, sa: &str) -> String {
    tether_e2e::service_account_token(&m.admin, "default", sa)
        .await
        .expect("member token")
}

/// A token of member `ns`'s agent ServiceAccount on the leader.
async fn leader_sa_token(leader: &LeaderSide, ns: &str) -> String {
    let req = TokenRequest::default();
    Api::<ServiceAccount>::namespaced(leader.admin.clone(), ns)
        .create_token_request("tether-agent", &PostParams::default(), &req)
        .await
        .expect("token request")
        .status
        .expect("status")
        .token
}

async fn list_namespaces(c: &Client) -> Result<Vec<String>, (u16, String)> {
    let text = get(c, "/api/v1/namespaces", &[]).await?;
    let list: k8s_openapi::List<Namespace> = serde_json::from_str(&text).map_err(|e| (0, e.to_string()))?;
    Ok(list.items.iter().map(|n| n.name_any()).collect())
}

/// Tries to attach member `name`'s tunnel with `token`; returns the status and body.
async fn attach_as(leader: &LeaderSide, token: &str, name: &str) -> (StatusCode, String) {
    let c = leader.cluster.client_with_token(token).expect("client");
    let req = Request::get(tether_tunnel::attach_path(&ns_of(name), name))
        .header(CONNECTION, "Upgrade")
        .header(UPGRADE, tether_tunnel::UPGRADE_PROTOCOL)
        .body(kube::client::Body::empty())
        .expect("request");
    let resp = c.send(req).await.expect("send");
    let code = resp.status();
    let body = tether_tunnel::pipe::collect_limited(resp.into_body(), 4096).await;
    (code, String::from_utf8_lossy(&body).to_string())
}

/// Opens an upgraded connection to `path` through `c` with a `method` request.
async fn upgrade(
    c: &Client,
    method: http::Method,
    path: &str,
) -> hyper_util::rt::TokioIo<hyper::upgrade::Upgraded> {
    let mut req = Request::builder().method(method.clone()).uri(path);
    if method == http::Method::POST {
        req = req.header(http::header::CONTENT_LENGTH, "0");
    }
    let req = req
        .header(CONNECTION, "Upgrade")
        .header(UPGRADE, "tether-echo")
        .body(kube::client::Body::empty())
        .expect("request");
    let mut resp = c.send(req).await.expect("send");
    assert_eq!(
        resp.status(),
        StatusCode::SWITCHING_PROTOCOLS,
        "{:?}",
        resp.headers()
    );
    hyper_util::rt::TokioIo::new(hyper::upgrade::on(&mut resp).await.expect("upgraded"))
}

/// Sends an upgrade request for member `name`'s `path` as `user` (group devs) on a connection of its own to
/// the leader's API server, and reads until the server closes it (so a kept-alive connection
/// hangs the caller's timeout). Returns everything read.
async fn raw_upgrade(leader: &LeaderSide, user: &str, name: &str, path: &str) -> String {
    use kube::client::ConfigExt;
    let config = leader
        .cluster
        .user_config(user, Some("devs"))
        .await
        .expect("user config");
    let tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(
        config.rustls_client_config().expect("tls config"),
    ));
    let host = config.cluster_url.host().expect("host").to_string();
    let port = config.cluster_url.port_u16().expect("port");
    let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
        .await
        .expect("connect");
    let server = rustls::pki_types::ServerName::try_from(host.clone()).expect("server name");
    let mut s = tls.connect(server, tcp).await.expect("tls");
    let target = format!("{}{path}", tether_tunnel::proxy_path(&ns_of(name), name));
    s.write_all(
        format!(
            "GET {target} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: Upgrade\r\nUpgrade: tether-echo\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .expect("write");
    let mut out = Vec::new();
    // NB: a TLS peer may close without close_notify; what was read before counts.
    let _ = s.read_to_end(&mut out).await;
    String::from_utf8_lossy(&out).to_string()
}

/// GETs the proxy's discovery document straight from the leader replica at `at` (not through
/// the API server), presenting `identity` (certificate and key PEM) as the front proxy's client
/// certificate: the answer's text, or what failed.
async fn front_proxy_get(
    leader: &LeaderSide,
    at: std::net::SocketAddr,
    identity: &(String, String),
) -> String {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
    let secret = Api::<Secret>::namespaced(leader.admin.clone(), HOME)
        .get("tether-leader-proxy-serving")
        .await
        .expect("proxy serving Secret");
    let ca = secret
        .data
        .as_ref()
        .and_then(|d| d.get("ca.crt"))
        .expect("ca.crt")
        .0
        .clone();
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(&ca) {
        roots.add(c.expect("serving CA")).expect("serving CA");
    }
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(identity.0.as_bytes())
        .collect::<Result<_, _>>()
        .expect("client certificate");
    let key = PrivateKeyDer::from_pem_slice(identity.1.as_bytes()).expect("client key");
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("TLS versions")
    .with_root_certificates(roots)
    .with_client_auth_cert(chain, key)
    .expect("client auth");
    let tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let name = rustls::pki_types::ServerName::try_from(format!("tether-leader-proxy.{HOME}.svc"))
        .expect("server name");
    let attempt = async {
        let tcp = tokio::net::TcpStream::connect(at).await?;
        let mut s = tls.connect(name, tcp).await?;
        s.write_all(
            format!(
                "GET /apis/{}/{} HTTP/1.1\r\nHost: {at}\r\nX-Remote-User: rotation-check\r\nConnection: close\r\n\r\n",
                tether_tunnel::GROUP,
                tether_tunnel::VERSION
            )
            .as_bytes(),
        )
        .await?;
        let mut out = Vec::new();
        // NB: a TLS peer may close without close_notify; what was read before counts.
        let read = s.read_to_end(&mut out).await;
        if out.is_empty() {
            read?;
        }
        Ok::<_, std::io::Error>(String::from_utf8_lossy(&out).to_string())
    };
    match tokio::time::timeout(Duration::from_secs(10), attempt).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(e)) => format!("failed: {e}"),
        Err(_) => "failed: no answer within 10 s".to_string(),
    }
}

/// Service `default/echo` of member `m`, backed by `echo_port` on the lab bridge. NB: the API
/// server proxies only to endpoints that name a pod with that IP, so a pod object stands for the
/// echo server (this member has no node: it stays Pending with the lab address as its IP).
async fn expose_echo(m: &MemberSide, echo_port: u16) {
    let ip = lab::GATEWAY.to_string();
    let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(m.admin.clone(), "default");
    let pod = serde_json::from_value(json!({"metadata": {"name": "echo", "namespace": "default"},
        "spec": {"containers": [{"name": "echo", "image": "echo"}]}}))
    .expect("pod");
    pods.create(&PostParams::default(), &pod).await.expect("pod");
    pods.patch_status(
        "echo",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({"status": {"podIP": ip, "podIPs": [{"ip": ip}]}})),
    )
    .await
    .expect("pod status");
    apply(
        &m.admin,
        Some("default"),
        json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "echo", "namespace": "default"},
        "spec": {"ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}}),
    )
    .await;
    let ep: Endpoints = serde_json::from_value(json!({"metadata": {"name": "echo", "namespace": "default"},
        "subsets": [{"addresses": [{"ip": lab::GATEWAY.to_string(),
                                    "targetRef": {"kind": "Pod", "name": "echo", "namespace": "default"}}],
                     "ports": [{"name": "http", "port": echo_port, "protocol": "TCP"}]}]}))
    .expect("endpoints");
    Api::<Endpoints>::namespaced(m.admin.clone(), "default")
        .create(&PostParams::default(), &ep)
        .await
        .expect("endpoints");
    // NB: newer API servers (1.37 here) proxy to a Service through its EndpointSlices, which no
    // controller mirrors from the Endpoints on this member (it runs no controller manager).
    apply(
        &m.admin,
        Some("default"),
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "echo-1", "namespace": "default", "labels": {"kubernetes.io/service-name": "echo"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [ip], "conditions": {"ready": true},
                       "targetRef": {"kind": "Pod", "name": "echo", "namespace": "default"}}],
        "ports": [{"name": "http", "port": echo_port, "protocol": "TCP"}]}),
    )
    .await;
}

/// A plain-HTTP server that switches any upgrade request to an echo of its bytes, except on a
/// path ending in `/refuse`, which it answers 403 with [`EchoServer::REFUSAL`].
struct EchoServer {
    port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl EchoServer {
    const REFUSAL: &str = "the echo server does not upgrade here";

    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind((lab::GATEWAY, 0))
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let svc =
                        hyper::service::service_fn(|mut req: Request<hyper::body::Incoming>| async move {
                            if req.uri().path().ends_with("/refuse") {
                                let resp = http::Response::builder()
                                    .status(StatusCode::FORBIDDEN)
                                    .body(http_body_util::Full::new(bytes::Bytes::from(Self::REFUSAL)))
                                    .expect("response");
                                return Ok::<_, std::convert::Infallible>(resp);
                            }
                            let on = hyper::upgrade::on(&mut req);
                            tokio::spawn(async move {
                                if let Ok(up) = on.await {
                                    let (mut r, mut w) = tokio::io::split(hyper_util::rt::TokioIo::new(up));
                                    let _ = tokio::io::copy(&mut r, &mut w).await;
                                }
                            });
                            let resp = http::Response::builder()
                                .status(StatusCode::SWITCHING_PROTOCOLS)
                                .header(CONNECTION, "Upgrade")
                                .header(UPGRADE, "tether-echo")
                                .body(http_body_util::Full::new(bytes::Bytes::new()))
                                .expect("response");
                            Ok(resp)
                        });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tcp), svc)
                        .with_upgrades()
                        .await;
                });
            }
        });
        Self { port, task }
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
