//! The printer columns `kubectl get` shows.

use super::*;

#[tokio::test]
async fn kubectl_get_prints_the_designed_columns() {
    let (cluster, client) = cluster_with_crds("crds-columns").await;
    namespace(&client, "tether-system").await;
    namespace(&client, "prod-east").await;
    let home = Some("tether-system");
    create_raw::<ClusterSet>(&client, home, leader_set("prod"))
        .await
        .expect("set");
    create_raw::<ClusterRegistrationRequest>(&client, home, request("east-1", request_spec()))
        .await
        .expect("request");
    let id = "6b0f1c1e-8d0a-4f39-9a53-0d5d4f7e2a11";
    create_raw::<ManagedCluster>(&client, Some("prod-east"), managed("east", id))
        .await
        .expect("managed");
    create_raw::<MemberClusterAnnounce>(&client, Some("prod-east"), announce("east", id))
        .await
        .expect("announce");

    let status = Patch::Merge(json!({"status": {
        "kubernetesVersion": "v1.34.4", "platform": "linux/amd64", "agentVersion": "0.1.0",
        "nodes": {"total": 4, "ready": 3, "notReady": 1, "unknown": 0, "summary": "3/4"},
        "lastHeartbeatTime": "2026-11-29T10:00:00Z",
        "conditions": [{"type": "Ready", "status": "True", "reason": "HeartbeatFresh", "message": "",
                        "lastTransitionTime": "2026-11-29T10:00:00Z"}]}}));
    Api::<ManagedCluster>::namespaced(client.clone(), "prod-east")
        .patch_status("east", &PatchParams::default(), &status)
        .await
        .expect("status patch");
    let set_status = Patch::Merge(json!({"status": {"state": "Active",
        "members": {"total": 1, "ready": 1, "notReady": 0, "pending": 0}}}));
    Api::<ClusterSet>::namespaced(client.clone(), "tether-system")
        .patch_status("prod", &PatchParams::default(), &set_status)
        .await
        .expect("set status patch");

    let expect = [
        (
            "clustersets",
            vec!["NAMESPACE", "NAME", "ROLE", "STATE", "TOTAL", "READY", "AGE"],
            vec!["prod", "Leader", "Active", "1"],
        ),
        (
            "clsrr",
            vec![
                "NAMESPACE",
                "NAME",
                "CLUSTER NAME",
                "CLUSTER ID",
                "RESULT",
                "REASON",
                "AGE",
            ],
            vec!["east-1", "east", id, "Pending", "AwaitingLeader"],
        ),
        (
            "mcls",
            vec![
                "NAMESPACE",
                "NAME",
                "CLUSTER ID",
                "KUBERNETES",
                "NODES",
                "READY",
                "AGE",
            ],
            vec!["east", id, "v1.34.4", "3/4", "True"],
        ),
        (
            "mca",
            vec!["NAMESPACE", "NAME", "CLUSTER ID", "RENEWED", "AGE"],
            vec!["east", id],
        ),
    ];
    for (resource, columns, values) in expect {
        // The request's defaulted status is visible as soon as the watch cache has it.
        let table = eventually(
            &format!("kubectl get {resource}"),
            Duration::from_secs(10),
            || async {
                let t = kubectl(&cluster, &["get", resource, "-A"]);
                if values.iter().all(|v| t.contains(v)) {
                    Ok(t)
                } else {
                    Err(t)
                }
            },
        )
        .await;
        assert_eq!(header(&table), columns, "columns of {resource}:\n{table}");
    }
    let wide = kubectl(&cluster, &["get", "mcls", "-A", "-o", "wide"]);
    assert_eq!(
        header(&wide),
        [
            "NAMESPACE",
            "NAME",
            "CLUSTER ID",
            "KUBERNETES",
            "NODES",
            "READY",
            "AGE",
            "REASON",
            "CLUSTERSET",
            "PLATFORM",
            "AGENT VERSION",
            "LAST HEARTBEAT",
            "TUNNEL"
        ],
        "wide columns of mcls:\n{wide}"
    );
    assert!(
        wide.contains("linux/amd64") && wide.contains("0.1.0") && wide.contains("HeartbeatFresh"),
        "wide values missing:\n{wide}"
    );
    let all = kubectl(&cluster, &["get", "tether", "-A"]);
    for kind in [
        "clusterset",
        "clusterregistrationrequest",
        "managedcluster",
        "memberclusterannounce",
    ] {
        assert!(
            all.contains(&format!("{kind}.multicluster.tether.dev/")),
            "`kubectl get tether` lacks {kind}:\n{all}"
        );
    }
}
