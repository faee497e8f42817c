//! The leader controller on a real API server, running with exactly the RBAC of
//! `config/rbac/leader.yaml`, against simulated members that hold a bootstrap token.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tether_api::clusterset::ApprovalMode;
use tether_api::registration::{RegistrationReason, RegistrationResult};
use tether_api::{ClusterRegistrationRequest, ClusterSet, ManagedCluster, MemberClusterAnnounce};
use tether_e2e::sim::{self, HOME, Joiner, Leader, register};
use tether_e2e::{create_raw, message, service_account_token, status_code};
use tether_testkit::eventually;

#[path = "leader/confinement.rs"]
mod confinement;

async fn leader(name: &str, mode: ApprovalMode) -> Leader {
    Leader::named(name).policy(sim::approving(mode)).start().await
}

async fn joiner(l: &Leader) -> Joiner {
    sim::joiner(&l.cluster, &l.admin).await
}

fn result(r: &ClusterRegistrationRequest) -> (RegistrationResult, RegistrationReason) {
    let s = r.status.clone().unwrap_or_default();
    (s.result, s.reason)
}

#[tokio::test]
async fn approved_member_gets_a_sealed_credential_confined_to_its_own_namespace() {
    let l = leader("leader-approve", ApprovalMode::Automatic).await;
    let east = joiner(&l).await;
    let west = joiner(&l).await;
    let e = register(&east, "east-1", "east", "id-east").await;
    let w = register(&west, "west-1", "west", "id-west").await;
    assert_eq!(
        result(&e),
        (RegistrationResult::Approved, RegistrationReason::Approved),
        "{:?}",
        e.status
    );
    assert_eq!(result(&w).0, RegistrationResult::Approved);

    // The credential opens only with east's key, and nothing usable is in clear text.
    let sealed = e
        .status
        .as_ref()
        .and_then(|s| s.credential.as_ref())
        .expect("credential")
        .sealed
        .clone();
    let cred = tether_seal::unseal(&sealed, &east.identity).expect("east unseals its credential");
    assert!(
        tether_seal::unseal(&sealed, &west.identity).is_err(),
        "another member cannot unseal it"
    );
    // A second bootstrap-token holder reads east's request: nothing in it is usable.
    let reader = joiner(&l).await;
    let read = Api::<ClusterRegistrationRequest>::namespaced(reader.client.clone(), HOME)
        .get("east-1")
        .await
        .expect("a joiner may read a request by name");
    let visible = serde_json::to_string(&read).expect("json");
    assert!(
        !visible.contains(&cred.token),
        "the token must not be readable in the request"
    );
    let sealed_seen = read.status.and_then(|s| s.credential).expect("credential").sealed;
    assert!(
        tether_seal::unseal(&sealed_seen, &reader.identity).is_err(),
        "a reader cannot unseal another member's credential"
    );
    assert_eq!(cred.namespace, tether_e2e::sim::ns_of("east"));
    assert_eq!(cred.ca_cert, l.cluster.ca_pem());

    // The leader created the member's objects.
    let ns = Api::<Namespace>::all(l.admin.clone())
        .get(&tether_e2e::sim::ns_of("east"))
        .await
        .expect("namespace");
    assert_eq!(
        ns.labels()
            .get(tether_api::labels::CLUSTER_SET)
            .map(String::as_str),
        Some("prod")
    );
    let mc = Api::<ManagedCluster>::namespaced(l.admin.clone(), &tether_e2e::sim::ns_of("east"))
        .get("east")
        .await
        .expect("mcls");
    assert_eq!(mc.spec.cluster_id, "id-east");

    // The member's token does its job...
    let member = l.cluster.client_with_token(&cred.token).expect("member client");
    let own = &tether_e2e::sim::ns_of("east");
    let pp = PatchParams::default();
    Api::<ManagedCluster>::namespaced(member.clone(), own)
        .patch_status(
            "east",
            &pp,
            &Patch::Merge(json!({"status": {"kubernetesVersion": "v1.34.4"}})),
        )
        .await
        .expect("member reports its ManagedCluster status");
    Api::<MemberClusterAnnounce>::namespaced(member.clone(), own)
        .patch(
            "east",
            &pp,
            &Patch::Merge(json!({"spec": {"renewTime": "2026-11-29T10:00:00.000000Z"}})),
        )
        .await
        .expect("member renews its announce");
    let renewal = json!({"spec": {"renewTime": "2026-11-29T10:00:00.000000Z"}});
    let own_lease = Api::<Lease>::namespaced(member.clone(), own)
        .patch("east", &pp, &Patch::Merge(&renewal))
        .await
        .expect("member renews its heartbeat Lease, which the leader made");
    assert_eq!(
        own_lease
            .annotations()
            .get(tether_api::annotations::TUNNEL_PING_INTERVAL)
            .map(String::as_str),
        Some("5"),
        "the Lease tells the agent the set's intervals"
    );
    service_account_token(&member, own, &cred.service_account)
        .await
        .expect("member renews its own token");

    // ...and nothing else.
    let other = &tether_e2e::sim::ns_of("west");
    let checks = vec![
        (
            "read another member's ManagedCluster",
            Api::<ManagedCluster>::namespaced(member.clone(), other)
                .get("west")
                .await
                .err(),
        ),
        (
            "write another member's status",
            Api::<ManagedCluster>::namespaced(member.clone(), other)
                .patch_status("west", &pp, &Patch::Merge(json!({"status": {"platform": "x"}})))
                .await
                .err(),
        ),
        (
            "renew another member's announce",
            Api::<MemberClusterAnnounce>::namespaced(member.clone(), other)
                .patch(
                    "west",
                    &pp,
                    &Patch::Merge(json!({"spec": {"renewTime": "2026-11-29T10:00:00.000000Z"}})),
                )
                .await
                .err(),
        ),
        (
            "renew another member's heartbeat Lease",
            Api::<Lease>::namespaced(member.clone(), other)
                .patch("west", &pp, &Patch::Merge(&renewal))
                .await
                .err(),
        ),
        (
            "create another Lease in its own namespace (a decoy heartbeat)",
            Api::<Lease>::namespaced(member.clone(), own)
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(json!({"metadata": {"name": "west"}})).expect("lease"),
                )
                .await
                .err(),
        ),
        (
            "delete its own heartbeat Lease",
            Api::<Lease>::namespaced(member.clone(), own)
                .delete("east", &Default::default())
                .await
                .err(),
        ),
        (
            "list the Leases of its namespace",
            Api::<Lease>::namespaced(member.clone(), own)
                .list(&ListParams::default())
                .await
                .err(),
        ),
        (
            "change its own ManagedCluster spec",
            Api::<ManagedCluster>::namespaced(member.clone(), own)
                .patch(
                    "east",
                    &pp,
                    &Patch::Merge(json!({"spec": {"clusterSet": "other"}})),
                )
                .await
                .err(),
        ),
        (
            "read its own namespace's Secrets",
            Api::<Secret>::namespaced(member.clone(), own)
                .list(&ListParams::default())
                .await
                .err(),
        ),
        (
            "write the ClusterSet spec",
            Api::<ClusterSet>::namespaced(member.clone(), HOME)
                .patch(
                    "prod",
                    &pp,
                    &Patch::Merge(json!({"spec": {"leader": {"heartbeatInterval": "1s"}}})),
                )
                .await
                .err(),
        ),
        (
            "read registration requests",
            Api::<ClusterRegistrationRequest>::namespaced(member.clone(), HOME)
                .get("west-1")
                .await
                .err(),
        ),
    ];
    for (what, err) in checks {
        let err: Option<kube::Error> = err;
        assert_eq!(
            err.as_ref().and_then(status_code),
            Some(403),
            "a member must not {what}: {:?}",
            err.map(|e| message(&e))
        );
    }
    let other_token = service_account_token(&member, other, "tether-agent").await;
    assert_eq!(
        other_token.err().as_ref().and_then(status_code),
        Some(403),
        "a member must not mint another's token"
    );
}

#[tokio::test]
async fn duplicates_are_denied_and_the_same_cluster_rejoins() {
    let l = leader("leader-dupes", ApprovalMode::Automatic).await;
    let east = joiner(&l).await;
    let first = register(&east, "east-1", "east", "id-east").await;
    assert_eq!(result(&first).0, RegistrationResult::Approved);
    // The leader's ManagedCluster store must see east before the next decisions.
    let mcs = Api::<ManagedCluster>::all(l.admin.clone());
    eventually("east's ManagedCluster", Duration::from_secs(10), || async {
        mcs.list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())
            .and_then(|l| {
                if l.items.is_empty() {
                    Err("none yet".to_string())
                } else {
                    Ok(())
                }
            })
    })
    .await;

    let impostor = joiner(&l).await;
    let same_id = register(&impostor, "east-2", "other", "id-east").await;
    assert_eq!(
        result(&same_id),
        (RegistrationResult::Denied, RegistrationReason::DuplicateClusterID)
    );
    let same_name = register(&impostor, "east-3", "east", "id-other").await;
    assert_eq!(
        result(&same_name),
        (
            RegistrationResult::Denied,
            RegistrationReason::DuplicateClusterName
        )
    );
    let message = same_name.status.and_then(|s| s.message).unwrap_or_default();
    assert!(
        message.contains("choose another --name"),
        "denial says what to do: {message}"
    );

    let again = register(&east, "east-4", "east", "id-east").await;
    assert_eq!(
        result(&again).0,
        RegistrationResult::Approved,
        "same ID and key re-registers"
    );
    let cred = tether_seal::unseal(
        &again.status.and_then(|s| s.credential).expect("cred").sealed,
        &east.identity,
    )
    .expect("fresh credential");
    assert_eq!(
        cred.namespace,
        tether_e2e::sim::ns_of("east"),
        "the namespace is reused"
    );
    let namespaces = Api::<Namespace>::all(l.admin.clone())
        .list(&ListParams::default().labels(tether_api::labels::CLUSTER_SET))
        .await
        .expect("list");
    assert_eq!(namespaces.items.len(), 1, "no duplicate namespaces");
}

#[tokio::test]
async fn manual_approval_waits_for_an_admin_decision() {
    let l = leader("leader-manual", ApprovalMode::Manual).await;
    let east = joiner(&l).await;
    let body = json!({"apiVersion": "multicluster.tether.dev/v1alpha1", "kind": "ClusterRegistrationRequest",
                      "metadata": {"name": "east-1"},
                      "spec": {"clusterID": "id-east", "clusterName": "east", "publicKey": east.public_key}});
    create_raw::<ClusterRegistrationRequest>(&east.client, Some(HOME), body)
        .await
        .expect("request");
    let api = Api::<ClusterRegistrationRequest>::namespaced(l.admin.clone(), HOME);
    eventually(
        "the request to await approval",
        Duration::from_secs(30),
        || async {
            let r = api.get("east-1").await.map_err(|e| e.to_string())?;
            match result(&r) {
                (RegistrationResult::Pending, RegistrationReason::AwaitingApproval) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    let decision = Patch::Merge(json!({"status": {"decision": {"action": "Approve"}}}));
    api.patch_status("east-1", &PatchParams::default(), &decision)
        .await
        .expect("admin approves");
    eventually("the request to be approved", Duration::from_secs(30), || async {
        let r = api.get("east-1").await.map_err(|e| e.to_string())?;
        if result(&r).0 == RegistrationResult::Approved {
            Ok(())
        } else {
            Err(format!("{:?}", r.status))
        }
    })
    .await;
}

/// A request the policy denied is deleted once the retention has passed since its creation, so
/// that retrying agents do not pile requests up; an admin's denial stays.
#[tokio::test]
async fn policy_denials_are_deleted_after_their_retention_and_admin_denials_stay() {
    let retention = Duration::from_secs(8);
    let l = Leader::named("leader-retention")
        .policy(sim::approving(ApprovalMode::Manual))
        .denied_retention(retention)
        .start()
        .await;
    let east = joiner(&l).await;
    let api = Api::<ClusterRegistrationRequest>::namespaced(l.admin.clone(), HOME);
    let decided = |name: &'static str, want: (RegistrationResult, RegistrationReason)| {
        let api = api.clone();
        async move {
            eventually(&format!("{name} {want:?}"), Duration::from_secs(30), || async {
                let r = api.get(name).await.map_err(|e| e.to_string())?;
                if result(&r) == want {
                    Ok(())
                } else {
                    Err(format!("{:?}", r.status))
                }
            })
            .await
        }
    };
    // NB: the CRD checks the key's shape; its checksum only the leader can (InvalidPublicKey).
    let bad_key = format!("age1{}", "q".repeat(58));
    let bad = json!({"apiVersion": "multicluster.tether.dev/v1alpha1", "kind": "ClusterRegistrationRequest",
                     "metadata": {"name": "bad-key"},
                     "spec": {"clusterID": "id-bad", "clusterName": "bad", "publicKey": bad_key}});
    sim::create_request(&east, HOME, bad).await;
    let created = std::time::Instant::now();
    let by_admin = json!({"apiVersion": "multicluster.tether.dev/v1alpha1", "kind": "ClusterRegistrationRequest",
                          "metadata": {"name": "east-1"},
                          "spec": {"clusterID": "id-east", "clusterName": "east", "publicKey": east.public_key}});
    sim::create_request(&east, HOME, by_admin).await;
    decided(
        "bad-key",
        (RegistrationResult::Denied, RegistrationReason::InvalidPublicKey),
    )
    .await;
    decided(
        "east-1",
        (RegistrationResult::Pending, RegistrationReason::AwaitingApproval),
    )
    .await;
    let deny = Patch::Merge(json!({"status": {"decision": {"action": "Deny", "message": "not this one"}}}));
    api.patch_status("east-1", &PatchParams::default(), &deny)
        .await
        .expect("admin denies");
    decided(
        "east-1",
        (RegistrationResult::Denied, RegistrationReason::DeniedByAdmin),
    )
    .await;

    eventually("bad-key deleted", Duration::from_secs(60), || async {
        match api.get_opt("bad-key").await {
            Ok(None) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let gone_after = created.elapsed();
    assert!(
        gone_after >= retention - Duration::from_secs(1),
        "kept for its retention ({retention:?}), deleted after {gone_after:?}"
    );
    tokio::time::sleep(retention + Duration::from_secs(3)).await;
    let kept = api.get("east-1").await.expect("the admin's denial is kept");
    assert_eq!(
        result(&kept),
        (RegistrationResult::Denied, RegistrationReason::DeniedByAdmin)
    );
}

/// An approved request holds the member's first credential only for its agent to read: it is
/// deleted after its retention once the member heartbeat after it was made, and the member
/// stays as it was. One whose member never heartbeat (its agent may not have read it) stays
/// while the credential in it is valid.
#[tokio::test]
async fn approved_requests_go_after_their_retention_once_their_member_heartbeat() {
    let retention = Duration::from_secs(8);
    let l = Leader::named("leader-approved-retention")
        .policy(sim::approving(ApprovalMode::Automatic))
        .approved_retention(retention)
        .start()
        .await;
    let created = std::time::Instant::now();
    let east = std::sync::Arc::new(sim::join(&l.cluster, &l.admin, "east", "id-east").await);
    let _beating = east.keep_heartbeating(Duration::from_secs(1));
    let silent = joiner(&l).await;
    let w = register(&silent, "west-1", "west", "id-west").await;
    assert_eq!(result(&w).0, RegistrationResult::Approved);
    sim::wait_ready(
        &l.admin,
        &east,
        "True",
        "HeartbeatReceived",
        Duration::from_secs(30),
    )
    .await;

    let api = Api::<ClusterRegistrationRequest>::namespaced(l.admin.clone(), HOME);
    eventually("east-1 deleted", Duration::from_secs(60), || async {
        match api.get_opt("east-1").await {
            Ok(None) => Ok(()),
            other => Err(format!("{:?}", other.map(|r| r.map(|r| r.status)))),
        }
    })
    .await;
    let gone_after = created.elapsed();
    assert!(
        gone_after >= retention - Duration::from_secs(1),
        "kept for its retention ({retention:?}), deleted after {gone_after:?}"
    );
    sim::wait_ready(
        &l.admin,
        &east,
        "True",
        "HeartbeatReceived",
        Duration::from_secs(5),
    )
    .await;
    east.heartbeat()
        .await
        .expect("the member's credential still works without its request");

    tokio::time::sleep(retention + Duration::from_secs(3)).await;
    let kept = api
        .get("west-1")
        .await
        .expect("a request whose member never heartbeat is kept while its credential is valid");
    assert_eq!(result(&kept).0, RegistrationResult::Approved);
}
