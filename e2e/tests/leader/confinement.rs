//! What a compromised leader can and cannot reach.

use super::*;

/// The leader chart's ValidatingAdmissionPolicy, proven with the leader's own ServiceAccount
/// token as a compromised leader pod would use it: the cluster-wide verbs its ClusterRole needs
/// reach only the namespaces it created for members, while registration works as before.
#[tokio::test]
async fn a_compromised_leader_cannot_reach_beyond_its_members_namespaces() {
    use k8s_openapi::api::authentication::v1::TokenRequest;
    use k8s_openapi::api::core::v1::ServiceAccount;
    use k8s_openapi::api::rbac::v1::RoleBinding;
    use kube::api::PostParams;

    let l = leader("leader-scope", ApprovalMode::Automatic).await;
    let east = sim::join(&l.cluster, &l.admin, "east", "id-east").await;
    let token = sim::leader_token(&l.admin).await;
    let pod = l.cluster.client_with_token(&token).expect("leader client");
    let pp = PostParams::default();
    let refused = |what: &str, r: Result<(), kube::Error>| match r {
        Err(e) if status_code(&e) == Some(403) && message(&e).contains("tether-leader may") => Ok(()),
        other => Err(format!("{what}: {other:?}")),
    };
    let mint = |ns: &str, sa: &str| {
        let api = Api::<ServiceAccount>::namespaced(pod.clone(), ns);
        let sa = sa.to_string();
        async move {
            api.create_token_request(&sa, &PostParams::default(), &TokenRequest::default())
                .await
                .map(drop)
        }
    };
    eventually(
        "kube-system/default to exist",
        Duration::from_secs(30),
        || async {
            Api::<ServiceAccount>::namespaced(l.admin.clone(), "kube-system")
                .get("default")
                .await
                .map(drop)
                .map_err(|e| e.to_string())
        },
    )
    .await;
    // NB: a new policy takes a moment to be enforced.
    eventually(
        "a token for a kube-system ServiceAccount is refused",
        Duration::from_secs(30),
        || async {
            refused(
                "token for kube-system/default",
                mint("kube-system", "default").await,
            )
        },
    )
    .await;
    // NB: RBAC's escalation check already stops a grant of more than the leader holds; what it
    // holds (its own ClusterRole, cluster-wide) is what a stolen token would hand out.
    let binding = |ns: &str| {
        serde_json::from_value::<RoleBinding>(json!({
            "metadata": {"name": "take-over", "namespace": ns},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "tether-leader"},
            "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": "kube-system"}]}))
        .expect("binding")
    };
    let bindings = |ns: &str| Api::<RoleBinding>::namespaced(pod.clone(), ns);
    refused(
        "a RoleBinding in default",
        bindings("default")
            .create(&pp, &binding("default"))
            .await
            .map(drop),
    )
    .unwrap();
    refused(
        "a RoleBinding of the leader's ClusterRole in east's namespace",
        bindings(&east.namespace)
            .create(&pp, &binding(&east.namespace))
            .await
            .map(drop),
    )
    .unwrap();
    // Its ClusterRole may write Leases anywhere (members' heartbeat Leases live in namespaces
    // made at approval); the policy keeps it off every other Lease, e.g. a control-plane
    // component's leader election.
    let victim: Lease = serde_json::from_value(json!({"metadata": {"name": "kube-scheduler"},
        "spec": {"holderIdentity": "scheduler-a"}}))
    .expect("lease");
    Api::<Lease>::namespaced(l.admin.clone(), "kube-system")
        .create(&pp, &victim)
        .await
        .expect("a control-plane Lease");
    let leases = Api::<Lease>::namespaced(pod.clone(), "kube-system");
    refused(
        "taking over a control-plane component's Lease",
        leases
            .patch(
                "kube-scheduler",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"holderIdentity": "tether-leader"}})),
            )
            .await
            .map(drop),
    )
    .unwrap();
    let decoy: Lease = serde_json::from_value(json!({"metadata": {"name": "decoy"}})).expect("lease");
    refused(
        "a Lease in kube-system",
        leases.create(&pp, &decoy).await.map(drop),
    )
    .unwrap();
    let namespaces = Api::<Namespace>::all(pod.clone());
    // NB: the API server itself never deletes `default` (NamespaceLifecycle); a team's namespace
    // is what the policy keeps.
    let err = namespaces
        .delete("default", &Default::default())
        .await
        .expect_err("default kept");
    assert_eq!(status_code(&err), Some(403), "{err}");
    tether_e2e::create_namespace(&l.admin, "team-a")
        .await
        .expect("a team's namespace");
    refused(
        "deleting a team's namespace",
        namespaces.delete("team-a", &Default::default()).await.map(drop),
    )
    .unwrap();
    let adopt = json!({"metadata": {"labels": {"app.kubernetes.io/managed-by": "tether-leader"}}});
    refused(
        "labelling namespace default as its own",
        namespaces
            .patch("default", &PatchParams::default(), &Patch::Merge(&adopt))
            .await
            .map(drop),
    )
    .unwrap();
    let sa =
        serde_json::from_value::<ServiceAccount>(json!({"metadata": {"name": "tether-agent"}})).expect("sa");
    refused(
        "a ServiceAccount in default",
        Api::<ServiceAccount>::namespaced(pod.clone(), "default")
            .create(&pp, &sa)
            .await
            .map(drop),
    )
    .unwrap();
    refused(
        "a token for another ServiceAccount in east's namespace",
        mint(&east.namespace, "default").await,
    )
    .unwrap();
    // It may create APIServices (RBAC cannot name an object in `create`), but only its own.
    let apiservices = Api::<kube::api::DynamicObject>::all_with(
        pod.clone(),
        &kube::api::ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk("apiregistration.k8s.io", "v1", "APIService"),
            "apiservices",
        ),
    );
    let apiservice = |name: &str, group: &str, version: &str, ns: &str| {
        serde_json::from_value::<kube::api::DynamicObject>(json!({
            "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
            "metadata": {"name": name},
            "spec": {"group": group, "version": version, "groupPriorityMinimum": 1000, "versionPriority": 15,
                     "service": {"name": "tether-leader-proxy", "namespace": ns, "port": 443},
                     "insecureSkipTLSVerify": true}}))
        .expect("apiservice")
    };
    refused(
        "an APIService for another group (intercepting its requests)",
        apiservices
            .create(
                &pp,
                &apiservice("v1.evil.example.com", "evil.example.com", "v1", "tether-system"),
            )
            .await
            .map(drop),
    )
    .unwrap();
    refused(
        "its own APIService pointed at another namespace's Service",
        apiservices
            .create(
                &pp,
                &apiservice(
                    tether_tunnel::API_SERVICE,
                    tether_tunnel::GROUP,
                    tether_tunnel::VERSION,
                    "default",
                ),
            )
            .await
            .map(drop),
    )
    .unwrap();
    // What registration needs still works: a token for east's own agent.
    mint(&east.namespace, "tether-agent")
        .await
        .expect("a token for east's tether-agent");
    let kept = Api::<Namespace>::all(l.admin.clone())
        .get("team-a")
        .await
        .expect("the team's namespace is still there");
    assert!(kept.metadata.deletion_timestamp.is_none());
}
