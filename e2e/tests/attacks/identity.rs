//! A member is its key (trust invariants 1 and 2): a join-token holder cannot take a silent
//! member's name or cluster ID with another key, and whoever may patch ManagedClusters cannot
//! change the key the leader seals challenges and credentials to.

use std::collections::BTreeMap;

use kube::api::{Patch, PatchParams};
use tether_api::ClusterRegistrationRequest;
use tether_api::registration::{RegistrationReason, RegistrationResult};

use super::replace::east_key;
use super::*;

/// The join token as any member's admin reads it: the Secret the agent joined with.
async fn join_token_of_east(w: &World) -> String {
    let s = Api::<Secret>::namespaced(w.east.admin.clone(), HOME)
        .get("tether-join-token")
        .await
        .expect("east's join token Secret");
    String::from_utf8(s.data.expect("data")["token"].0.clone()).expect("token text")
}

/// Ready (status, reason) of member `name` at the leader.
async fn ready_of(w: &World, name: &str) -> (String, String) {
    let mc = fleet::managed(&w.leader.admin, name).await.expect("member");
    let c = mc
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready").cloned());
    c.map(|c| (c.status, c.reason)).unwrap_or_default()
}

pub(super) async fn a_join_token_holder_cannot_take_a_silent_members_name_or_id(w: &World) {
    let before = fleet::managed(&w.leader.admin, "east").await.expect("east");
    let token = join_token_of_east(w).await;
    let attacker = w
        .leader
        .cluster
        .client_with_token(&token)
        .expect("join-token client");
    let (_, attacker_key) = tether_seal::generate_keypair();
    // East goes silent: its agent frozen, its tunnel open but answering nothing.
    let frozen = w.east.agent.as_ref().expect("east's agent").frozen();
    eventually("east no longer Ready", Duration::from_secs(30), || async {
        match ready_of(w, "east").await {
            (s, _) if s == "True" => Err("still Ready".to_string()),
            other => Ok(other),
        }
    })
    .await;
    // With the set's join token: east's name under a new cluster ID, and east's cluster ID and
    // name with a new key. Both used to be approved as a replacement of the silent member.
    let attempts = [
        ("takeover-name", "east", "id-takeover".to_string()),
        ("takeover-id", "east", before.spec.cluster_id.clone()),
    ];
    for (request, name, id) in &attempts {
        let body = json!({"apiVersion": "multicluster.tether.dev/v1alpha1",
                          "kind": "ClusterRegistrationRequest", "metadata": {"name": request},
                          "spec": {"clusterID": id, "clusterName": name, "publicKey": attacker_key}});
        tether_e2e::create_raw::<ClusterRegistrationRequest>(&attacker, Some(HOME), body)
            .await
            .expect("a join token may file a request");
    }
    let requests = Api::<ClusterRegistrationRequest>::namespaced(w.leader.admin.clone(), HOME);
    for (request, _, _) in &attempts {
        let r = eventually(
            &format!("{request} decided: waiting for an admin"),
            Duration::from_secs(30),
            || async {
                let r = requests.get(request).await.map_err(|e| e.to_string())?;
                match r.status.as_ref().map(|s| (s.result, s.reason)) {
                    Some((RegistrationResult::Pending, RegistrationReason::AwaitingLeader)) | None => {
                        Err(format!("{:?}", r.status))
                    }
                    _ => Ok(r),
                }
            },
        )
        .await;
        let status = r.status.clone().unwrap_or_default();
        assert_eq!(
            (status.result, status.reason),
            (RegistrationResult::Pending, RegistrationReason::ReplacesMember),
            "{request} is never approved by policy: {status:?}"
        );
        assert!(status.credential.is_none(), "{request} got no credential");
        let message = status.message.unwrap_or_default();
        assert!(
            message.contains("member east") && message.contains(&format!("tether approve {request}")),
            "the wait names the member and the command: {message}"
        );
    }
    let after = fleet::managed(&w.leader.admin, "east")
        .await
        .expect("east is still there");
    assert_eq!(
        after.metadata.uid, before.metadata.uid,
        "east's ManagedCluster untouched"
    );
    assert_eq!(
        after.spec.public_key, before.spec.public_key,
        "east's key untouched"
    );
    drop(frozen);
    eventually(
        "east Ready again with its own key",
        Duration::from_secs(60),
        || async {
            match ready_of(w, "east").await {
                (s, r) if s == "True" => Ok(r),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    for (request, _, _) in &attempts {
        let _ = requests.delete(request, &DeleteParams::default()).await;
    }
    wait_tunnel(&w.leader, "east", "True").await;
}

pub(super) async fn a_members_key_cannot_be_changed_by_whoever_may_patch_managedclusters(w: &World) {
    let ns = ns_of("east");
    // The attacker: a ServiceAccount allowed to get and patch ManagedClusters in east's
    // namespace, as a CD tool with write access to Tether's kinds would be.
    let admin = &w.leader.admin;
    apply(
        admin,
        Some(&ns),
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "patcher"}}),
    )
    .await;
    apply(
        admin,
        Some(&ns),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "patcher"},
               "rules": [{"apiGroups": ["multicluster.tether.dev"], "resources": ["managedclusters"],
                          "verbs": ["get", "patch", "update"]}]}),
    )
    .await;
    apply(
        admin,
        Some(&ns),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "patcher"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "patcher"},
               "subjects": [{"kind": "ServiceAccount", "name": "patcher", "namespace": &ns}]}),
    )
    .await;
    let token = tether_e2e::service_account_token(admin, &ns, "patcher")
        .await
        .expect("patcher token");
    let patcher =
        Api::<ManagedCluster>::namespaced(w.leader.cluster.client_with_token(&token).expect("client"), &ns);
    let (attacker_identity, attacker_key) = tether_seal::generate_keypair();
    // The annotation leaders before 0.3 read the key from: anyone who may patch may edit it.
    let legacy = tether_api::annotations::LEGACY_PUBLIC_KEY;
    patcher
        .patch(
            "east",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {legacy: &attacker_key}}})),
        )
        .await
        .expect("an annotation is the patcher's to edit");
    // An anonymous rejoin challenge is still sealed to east's key: the attacker cannot read it
    // (the leader used to seal it to the annotation's key, and answer the proof with east's
    // credential).
    let anonymous = w.leader.cluster.anonymous_client().expect("anonymous client");
    let path = tether_tunnel::rejoin_path(&ns, "east");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let body = get(&anonymous, &path, &[]).await.expect("a challenge");
    let challenge: tether_tunnel::proof::Challenge = serde_json::from_str(&body).expect("a challenge");
    assert!(
        tether_seal::unseal_text(&challenge.sealed, &attacker_identity).is_err(),
        "the patcher's key opens no challenge of east's"
    );
    assert!(
        tether_seal::unseal_text(&challenge.sealed, &east_key(w).await).is_ok(),
        "east's own key does"
    );
    // The key itself: set once at approval; changing or removing it is refused by the API server.
    let key = fleet::managed(admin, "east")
        .await
        .expect("east")
        .spec
        .public_key
        .expect("east's key in its spec");
    let change = patcher
        .patch(
            "east",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"publicKey": &attacker_key}})),
        )
        .await
        .expect_err("changing the key is refused");
    let removal = patcher
        .patch(
            "east",
            &PatchParams::default(),
            &Patch::Json::<()>(
                serde_json::from_value(json!([{"op": "remove", "path": "/spec/publicKey"}])).expect("patch"),
            ),
        )
        .await
        .expect_err("removing the key is refused");
    for err in [change, removal] {
        assert_eq!(tether_e2e::status_code(&err), Some(422), "{err}");
        assert!(
            tether_e2e::message(&err).contains("spec.publicKey is the member's identity"),
            "{err}"
        );
    }
    // A member with no key yet (as a leader before 0.3 left it, until the leader moves its
    // annotation into the spec): the patcher cannot be the one to give it one.
    let legacy_ns = "keys-legacy";
    tether_e2e::create_namespace(admin, legacy_ns)
        .await
        .expect("a namespace");
    for (kind, body) in [
        (
            "Role",
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "patcher"},
               "rules": [{"apiGroups": ["multicluster.tether.dev"], "resources": ["managedclusters"],
                          "verbs": ["get", "patch", "update"]}]}),
        ),
        (
            "RoleBinding",
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "patcher"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "patcher"},
               "subjects": [{"kind": "ServiceAccount", "name": "patcher", "namespace": &ns}]}),
        ),
    ] {
        eprintln!("{kind} for the patcher in {legacy_ns}");
        apply(admin, Some(legacy_ns), body).await;
    }
    let patcher_there = Api::<ManagedCluster>::namespaced(
        w.leader.cluster.client_with_token(&token).expect("client"),
        legacy_ns,
    );
    let keyless = Api::<ManagedCluster>::namespaced(admin.clone(), legacy_ns);
    let mut refused = None;
    for _ in 0..10 {
        // NB: the leader may remove a ManagedCluster of no set at any moment: again if it did.
        let _ = keyless
            .create(
                &Default::default(),
                &serde_json::from_value(json!({"apiVersion": "multicluster.tether.dev/v1alpha1",
                    "kind": "ManagedCluster", "metadata": {"name": "legacy"},
                    "spec": {"clusterID": "id-legacy", "clusterSet": "prod"}}))
                .expect("a keyless ManagedCluster"),
            )
            .await;
        match patcher_there
            .patch(
                "legacy",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"publicKey": &attacker_key}})),
            )
            .await
        {
            Err(e) if tether_e2e::status_code(&e) == Some(404) => continue,
            other => {
                refused = Some(other.expect_err("giving a keyless member a key is refused"));
                break;
            }
        }
    }
    let refused = refused.expect("a keyless ManagedCluster to try on");
    assert!(
        tether_e2e::message(&refused).contains("only the leader records a member's key"),
        "{refused}"
    );
    let _ = keyless.delete("legacy", &DeleteParams::default()).await;

    // Nothing moved: east keeps its key and its tunnel.
    assert_eq!(
        fleet::managed(admin, "east")
            .await
            .expect("east")
            .spec
            .public_key
            .as_deref(),
        Some(key.as_str())
    );
    wait_tunnel(&w.leader, "east", "True").await;
    patcher
        .patch(
            "east",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": BTreeMap::from([(legacy, None::<String>)])}})),
        )
        .await
        .expect("remove the annotation");
}

/// Registers `name` / `id` with the set's join token and the key pair (`identity`, `key`), and
/// waits for the leader's decision.
async fn register_as(
    w: &World,
    request: &str,
    name: &str,
    id: &str,
    identity: &str,
    key: &str,
) -> (RegistrationResult, RegistrationReason, String) {
    let token = join_token_of_east(w).await;
    let j = tether_e2e::sim::Joiner {
        client: w
            .leader
            .cluster
            .client_with_token(&token)
            .expect("join-token client"),
        identity: identity.to_string(),
        public_key: key.to_string(),
    };
    let r = tether_e2e::sim::register(&j, request, name, id).await;
    let s = r.status.unwrap_or_default();
    (s.result, s.reason, s.message.unwrap_or_default())
}

pub(super) async fn a_ban_written_into_the_set_closes_the_tunnel_and_holds_whatever_the_cluster_reports(
    w: &World,
) {
    wait_tunnel(&w.leader, "east", "True").await;
    let mc = fleet::managed(&w.leader.admin, "east").await.expect("east");
    let (id, key) = (
        mc.spec.cluster_id.clone(),
        mc.spec.public_key.clone().expect("east's key"),
    );
    let identity = east_key(w).await;
    // As GitOps writes it: the set's spec, with what `tether member list` shows of east.
    let sets = Api::<tether_api::ClusterSet>::namespaced(w.leader.admin.clone(), HOME);
    let since = Instant::now();
    sets.patch(
        tether_e2e::sim::SET,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"leader": {"bans": [
            {"clusterID": &id, "clusterName": "east", "publicKey": &key}]}}})),
    )
    .await
    .expect("write the ban");
    eventually(
        "east removed, its tunnel closed",
        Duration::from_secs(10),
        || async {
            match fleet::managed(&w.leader.admin, "east").await {
                Err(_) => Ok(()),
                Ok(_) => Err("east is still a member".to_string()),
            }
        },
    )
    .await;
    eprintln!(
        "east removed {:?} after the ban was written into the set",
        since.elapsed()
    );
    // The tunnel closes within 10 s of the ban (invariant 7): from then on east is not served.
    let alice = through(&w.leader, "alice", None, "east").await;
    let left = Duration::from_secs(10).saturating_sub(since.elapsed());
    let err = eventually("east not served once banned", left, || async {
        match get(&alice, "/api/v1/namespaces", &[]).await {
            Ok(_) => Err("east still served".to_string()),
            Err(e) => Ok(e),
        }
    })
    .await;
    eprintln!("east not served {:?} after the ban", since.elapsed());
    assert!(matches!(err.0, 403 | 404 | 503), "{err:?}");
    // Whatever the banned cluster reports, one of the three gives it away.
    let (other_identity, other_key) = tether_seal::generate_keypair();
    for (request, name, cluster_id, ident, k, what) in [
        (
            "banned-key",
            "east-again",
            "id-east-again",
            identity.as_str(),
            key.as_str(),
            "key",
        ),
        (
            "banned-id",
            "east-again",
            id.as_str(),
            other_identity.as_str(),
            other_key.as_str(),
            "cluster ID",
        ),
        (
            "banned-name",
            "east",
            "id-east-again",
            other_identity.as_str(),
            other_key.as_str(),
            "cluster name",
        ),
    ] {
        let (result, reason, message) = register_as(w, request, name, cluster_id, ident, k).await;
        assert_eq!(
            (result, reason),
            (RegistrationResult::Denied, RegistrationReason::Banned),
            "a new {} and name: {message}",
            if what == "key" { "ID" } else { what }
        );
        assert!(
            message.contains(what) && message.contains("tether member unban"),
            "{message}"
        );
    }
}
