use super::*;

/// Both tunnels attach.
pub(crate) async fn both_tunnels_attach(w: &World) {
    let leader = w.leader.lock().await;
    for m in ["east", "west"] {
        wait_tunnel(&leader, m, "True").await;
    }
}

/// Leader RBAC: who may use managedclusters/proxy.
pub(crate) async fn the_leaders_rbac_decides_who_may_use_managedclusters_proxy(w: &World) {
    let leader = w.leader.lock().await;
    let east = &w.east;
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
    member_rbac(east).await;

    let alice = through(&leader, "alice", Some("devs"), "east").await;
    let names = list_namespaces(&alice)
        .await
        .expect("alice lists east's namespaces");
    assert!(names.contains(&"kube-system".to_string()), "{names:?}");
}

/// The member's RBAC decides: the impersonated tether:prod:alice may not read Secrets.
pub(crate) async fn the_members_rbac_decides_what_the_impersonated_user_may_do(w: &World) {
    let leader = w.leader.lock().await;
    let alice = alice(&leader).await;
    let err = get(&alice, "/api/v1/namespaces/kube-system/secrets", &[])
        .await
        .unwrap_err();
    assert!(err.0 == 403 && err.1.contains("tether:prod:alice"), "{err:?}");
}

/// A leader user without managedclusters/proxy gets the leader's 403.
pub(crate) async fn a_leader_user_without_managedclusters_proxy_gets_the_leaders_403(w: &World) {
    let leader = w.leader.lock().await;
    let mallory = through(&leader, "mallory", None, "east").await;
    let err = get(&mallory, "/api/v1/namespaces", &[]).await.unwrap_err();
    assert!(err.0 == 403 && err.1.contains("managedclusters/proxy"), "{err:?}");
}

/// A user not on the member's allow-list is never impersonated.
pub(crate) async fn a_user_not_on_the_members_allow_list_is_never_impersonated(w: &World) {
    let leader = w.leader.lock().await;
    let bob = through(&leader, "bob", None, "east").await;
    let err = get(&bob, "/api/v1/namespaces", &[]).await.unwrap_err();
    assert!(err.0 == 403 && err.1.contains("allow-list"), "{err:?}");
}

/// Forged identity headers are refused or stripped.
pub(crate) async fn forged_identity_headers_are_refused_or_stripped(w: &World) {
    let leader = w.leader.lock().await;
    let alice = alice(&leader).await;
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
}

/// Pass-through: a member credential decides, the leader identity does not.
pub(crate) async fn a_passed_through_member_credential_decides_not_the_leader_identity(w: &World) {
    let leader = w.leader.lock().await;
    let east = &w.east;
    let alice = alice(&leader).await;
    let reader = member_token(east, "reader").await;
    let nobody = member_token(east, "nobody").await;
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
}

/// Pass-through from kubectl: tether --cluster east --member-token-file.
pub(crate) async fn kubectl_passes_a_member_token_through_with_member_token_file(w: &World) {
    let leader = w.leader.lock().await;
    let east = &w.east;
    let reader = member_token(east, "reader").await;
    let nobody = member_token(east, "nobody").await;
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
    let o = kubectl_through(
        &carol_kubeconfig,
        &token_file(&leader, "reader", &reader),
        &["get", "ns", "-o", "name"],
    );
    assert!(
        o.status.success() && String::from_utf8_lossy(&o.stdout).contains("namespace/kube-system"),
        "{o:?}"
    );
    let o = kubectl_through(
        &carol_kubeconfig,
        &token_file(&leader, "nobody", &nobody),
        &["get", "ns"],
    );
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success()
            && stderr.contains("forbidden")
            && stderr.contains("system:serviceaccount:default:nobody"),
        "{o:?}"
    );
}

/// A user granted only managedclusters/proxy in east's namespace: --member-namespace.
pub(crate) async fn a_user_granted_only_in_easts_namespace_names_it_with_member_namespace(w: &World) {
    let leader = w.leader.lock().await;
    let east = &w.east;
    let reader = member_token(east, "reader").await;
    let carol_kubeconfig = leader.cluster.dir().join("carol.kubeconfig");
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
    let reader_file = token_file(&leader, "reader-alice", &reader);
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
}

/// Agent west cannot serve east's tunnel.
pub(crate) async fn agent_west_cannot_serve_easts_tunnel(w: &World) {
    let leader = w.leader.lock().await;
    let alice = alice(&leader).await;
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
}
