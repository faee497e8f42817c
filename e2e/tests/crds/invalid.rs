//! Invalid objects are rejected by the API server's CRD validation, with messages a user can act on.

use super::*;

#[tokio::test]
async fn invalid_objects_are_rejected_by_the_api_server_with_readable_messages() {
    let (_cluster, client) = cluster_with_crds("crds-invalid").await;
    namespace(&client, "tether-system").await;
    let ns = Some("tether-system");
    let many: Vec<String> = (0..1001).map(|i| format!("c{i}")).collect();
    let labels: serde_json::Map<String, Value> = (0..33).map(|i| (format!("k{i}"), json!("v"))).collect();
    let cases = vec![
        Invalid {
            what: "set ID that is not a DNS label",
            ns,
            body: leader_set("prod.eu"),
            says: "metadata.name is the ClusterSet ID and must be a DNS-1123 label",
        },
        Invalid {
            what: "unknown role",
            ns,
            body: with(leader_set("a"), "/spec/role", json!("Boss")),
            says: "Unsupported value: \"Boss\"",
        },
        Invalid {
            what: "member role without member block",
            ns,
            body: with(leader_set("b"), "/spec/role", json!("Member")),
            says: "a Member ClusterSet needs spec.member",
        },
        Invalid {
            what: "plain-http leader URL",
            ns,
            body: member_set(
                "c",
                with(member_spec(), "/leaderURL", json!("http://leader:6443")),
            ),
            says: "leaderURL must be an https:// URL",
        },
        Invalid {
            what: "no way to verify the leader",
            ns,
            body: member_set("d", with(member_spec(), "/caCertHash", Value::Null)),
            says: "set caCertHash (the sha256:<hex> printed by `tether init`) or caBundle",
        },
        Invalid {
            what: "malformed CA pin",
            ns,
            body: member_set("e", with(member_spec(), "/caCertHash", json!("md5:abc"))),
            says: "spec.member.caCertHash",
        },
        Invalid {
            what: "cluster name with capitals",
            ns,
            body: member_set("f", with(member_spec(), "/clusterName", json!("East"))),
            says: "spec.member.clusterName",
        },
        Invalid {
            what: "too many labels",
            ns,
            body: member_set("g", with(member_spec(), "/labels", Value::Object(labels))),
            says: "must have at most 32 items",
        },
        Invalid {
            what: "heartbeat below a second",
            ns,
            body: with(
                leader_set("h"),
                "/spec/leader",
                json!({"heartbeatInterval": "500ms"}),
            ),
            says: "heartbeatInterval must be between 1s and 10m",
        },
        Invalid {
            what: "grace period shorter than the heartbeat",
            ns,
            body: with(
                leader_set("i"),
                "/spec/leader",
                json!({"heartbeatInterval": "30s", "gracePeriod": "10s"}),
            ),
            says: "gracePeriod must be longer than heartbeatInterval",
        },
        Invalid {
            what: "unknown approval mode",
            ns,
            body: with(
                leader_set("j"),
                "/spec/leader",
                json!({"approval": {"mode": "Sometimes"}}),
            ),
            says: "Unsupported value: \"Sometimes\"",
        },
        Invalid {
            what: "oversized allow-list",
            ns,
            body: with(
                leader_set("k"),
                "/spec/leader",
                json!({"approval": {"mode": "AllowList", "allowedClusters": many}}),
            ),
            says: "must have at most 1000 items",
        },
        Invalid {
            what: "request with a bad cluster ID",
            ns,
            body: request("r1", with(request_spec(), "/clusterID", json!("Not_An_ID"))),
            says: "spec.clusterID",
        },
        Invalid {
            what: "request without a public key",
            ns,
            body: request("r2", with(request_spec(), "/publicKey", Value::Null)),
            says: "spec.publicKey: Required value",
        },
        Invalid {
            what: "request with a key that is not an age recipient",
            ns,
            body: request(
                "r3",
                with(request_spec(), "/publicKey", json!("ssh-ed25519 AAAA")),
            ),
            says: "spec.publicKey",
        },
        Invalid {
            what: "managed cluster without cluster ID",
            ns,
            body: with(managed("m1", "x"), "/spec/clusterID", Value::Null),
            says: "spec.clusterID: Required value",
        },
        Invalid {
            what: "announce with an oversized ID",
            ns,
            body: announce("a1", &"a".repeat(129)),
            says: "spec.clusterID: Too long",
        },
        Invalid {
            what: "empty cluster property",
            ns: None,
            body: json!({"apiVersion": "about.k8s.io/v1alpha1", "kind": "ClusterProperty",
                               "metadata": {"name": "p"}, "spec": {"value": ""}}),
            says: "spec.value",
        },
    ];
    let mut failures = Vec::new();
    for case in cases {
        match create_any(&client, case.ns, case.body).await {
            Ok(()) => failures.push(format!("{}: accepted", case.what)),
            Err(err) if status_code(&err) == Some(422) && message(&err).contains(case.says) => {}
            Err(err) => failures.push(format!(
                "{}: expected 422 containing {:?}, got {}",
                case.what,
                case.says,
                message(&err)
            )),
        }
    }
    assert!(
        failures.is_empty(),
        "API server validation gaps:\n{}",
        failures.join("\n")
    );
}
