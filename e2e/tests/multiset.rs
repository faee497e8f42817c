//! Several ClusterSets on one real leader: member namespaces never collide (the reproduced
//! `prod`/`us-east-00000` vs `prod-us`/`east-00000` case, and one set ID in two namespaces), each
//! member keeps exactly its own rights, a join token works for its own set only, leaving one set
//! leaves the others untouched, the leader adopts no namespace it did not create for the member,
//! and a join token works the moment it is created.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tether_api::registration::{RegistrationReason, RegistrationResult};
use tether_api::{ClusterRegistrationRequest, ClusterSet, ManagedCluster, MemberClusterAnnounce, SetRef};
use tether_e2e::fleet;
use tether_e2e::sim::{self, Leader, join, joiner, register_in, wait_ready};
use tether_e2e::{create_namespace, create_raw, join_role, status_code};
use tether_testkit::{BootstrapToken, CreateToken, eventually};

/// Creates a Leader ClusterSet `set` with its join RBAC, as `tether init` does.
async fn add_set(admin: &Client, set: &SetRef) {
    let _ = create_namespace(admin, &set.namespace).await;
    let body = json!({"apiVersion": "multicluster.tether.dev/v1alpha1", "kind": "ClusterSet",
                      "metadata": {"name": set.name}, "spec": {"role": "Leader", "leader": {}}});
    create_raw::<ClusterSet>(admin, Some(&set.namespace), body)
        .await
        .expect("ClusterSet");
    join_role(admin, set).await.expect("join RBAC");
}

async fn forbidden<T: std::fmt::Debug>(what: &str, r: Result<T, kube::Error>) {
    match r {
        Err(e) => assert_eq!(status_code(&e), Some(403), "{what}: {e}"),
        Ok(v) => panic!("{what} must be refused, got {v:?}"),
    }
}

#[tokio::test]
async fn members_of_sets_whose_names_used_to_collide_keep_their_own_namespace_and_rights() {
    let l = Leader::named("multiset")
        .policy(fleet::policy("2s", "8s"))
        .start()
        .await;
    let prod = sim::home();
    let prod_us = SetRef::new("tether-us", "prod-us");
    let prod_b = SetRef::new("team-b", "prod");
    add_set(&l.admin, &prod_us).await;
    add_set(&l.admin, &prod_b).await;
    let heartbeat = json!({"spec": {"leader": {"heartbeatInterval": "2s", "gracePeriod": "8s"}}});
    for set in [&prod_us, &prod_b] {
        Api::<ClusterSet>::namespaced(l.admin.clone(), &set.namespace)
            .patch(&set.name, &PatchParams::default(), &Patch::Merge(&heartbeat))
            .await
            .expect("set timings");
    }

    // Before the fix, a and b were both given tether-prod-us-east-00000.
    let (a, b, c) = tokio::join!(
        join(&l.cluster, &l.admin, "us-east-00000", "id-a").of(&prod),
        join(&l.cluster, &l.admin, "east-00000", "id-b").of(&prod_us),
        join(&l.cluster, &l.admin, "us-east-00000", "id-c").of(&prod_b),
    );
    let (a, b, c) = (Arc::new(a), Arc::new(b), Arc::new(c));
    let mut namespaces = vec![a.namespace.clone(), b.namespace.clone(), c.namespace.clone()];
    namespaces.dedup();
    assert_eq!(
        namespaces.len(),
        3,
        "three members, three namespaces: {namespaces:?}"
    );
    assert!(
        a.namespace.starts_with("tether-prod-us-east-00000-"),
        "{}",
        a.namespace
    );
    let beats: Vec<_> = [&a, &b, &c]
        .iter()
        .map(|m| m.keep_heartbeating(Duration::from_secs(1)))
        .collect();
    for m in [&a, &b, &c] {
        wait_ready(&l.admin, m, "True", "HeartbeatReceived", Duration::from_secs(30)).await;
    }

    // Each member keeps only its own rights: none over the others' objects.
    for (me, others) in [(&a, [&b, &c]), (&b, [&a, &c]), (&c, [&a, &b])] {
        for other in others {
            let what = |op: &str| format!("{} {op} {}'s objects", me.name, other.namespace);
            let mcs = Api::<ManagedCluster>::namespaced(me.client.clone(), &other.namespace);
            forbidden(&what("reads"), mcs.get(&other.name).await).await;
            forbidden(
                &what("writes status of"),
                mcs.patch_status(
                    &other.name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {"platform": "x"}})),
                )
                .await,
            )
            .await;
            let announces = Api::<MemberClusterAnnounce>::namespaced(me.client.clone(), &other.namespace);
            forbidden(
                &what("heartbeats for"),
                announces
                    .patch(
                        &other.name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"spec": {"renewTime": "2026-01-01T00:00:00.000000Z"}})),
                    )
                    .await,
            )
            .await;
            forbidden(
                &what("deletes"),
                announces.delete(&other.name, &Default::default()).await,
            )
            .await;
        }
    }

    // A join token registers in its own set only, even where the set ID is the same.
    let j = joiner(&l.cluster, &l.admin).of(&prod).await;
    let body = json!({"apiVersion": "multicluster.tether.dev/v1alpha1", "kind": "ClusterRegistrationRequest",
                      "metadata": {"name": "sneaky"},
                      "spec": {"clusterID": "id-x", "clusterName": "x", "publicKey": j.public_key}});
    for other in [&prod_us, &prod_b] {
        let r = eventually("the token to be known", Duration::from_secs(15), || async {
            match create_raw::<ClusterRegistrationRequest>(&j.client, Some(&other.namespace), body.clone())
                .await
            {
                Err(e) if status_code(&e) == Some(401) => Err(e.to_string()),
                r => Ok(r),
            }
        })
        .await;
        forbidden(&format!("a token of {prod} registering in {other}"), r).await;
    }

    // Leaving one member leaves the others untouched, also the one whose namespace used to clash.
    b.leave().await.expect("b leaves");
    let namespaces_api = Api::<Namespace>::all(l.admin.clone());
    eventually("b's namespace to go", Duration::from_secs(60), || async {
        match namespaces_api
            .get_opt(&b.namespace)
            .await
            .map_err(|e| e.to_string())?
        {
            Some(ns) if ns.metadata.deletion_timestamp.is_none() => Err("still there".to_string()),
            _ => Ok(()),
        }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(10)).await; // longer than the grace period
    for m in [&a, &c] {
        let ns = namespaces_api.get(&m.namespace).await.expect("namespace kept");
        assert!(ns.metadata.deletion_timestamp.is_none(), "{} kept", m.namespace);
        Api::<ServiceAccount>::namespaced(l.admin.clone(), &m.namespace)
            .get("tether-agent")
            .await
            .expect("identity kept");
        m.heartbeat().await.expect("still heartbeats");
        wait_ready(&l.admin, m, "True", "HeartbeatReceived", Duration::from_secs(5)).await;
    }
    drop(beats);
}

/// The reproduced attack: a `dev` join token files a member under `prod` by asking for
/// `prod`'s set labels. The API server refuses the request; with that rule removed from the
/// CRD (as someone might edit it), the leader still files the member under `dev` alone.
#[tokio::test]
async fn a_join_token_of_one_set_cannot_file_its_member_under_another_by_labels() {
    let l = Leader::named("label-injection").start().await;
    let prod = sim::home();
    let dev = SetRef::new("tether-dev", "dev");
    add_set(&l.admin, &dev).await;
    let j = joiner(&l.cluster, &l.admin).of(&dev).await;
    let body = |name: &str| {
        json!({"apiVersion": "multicluster.tether.dev/v1alpha1", "kind": "ClusterRegistrationRequest",
               "metadata": {"name": name},
               "spec": {"clusterID": format!("id-{name}"), "clusterName": name, "publicKey": j.public_key,
                        "labels": {tether_api::labels::CLUSTER_SET: prod.name,
                                   tether_api::labels::CLUSTER_SET_NAMESPACE: prod.namespace,
                                   "region": "eu"}}})
    };
    let refused = eventually("the token to be known", Duration::from_secs(15), || async {
        match create_raw::<ClusterRegistrationRequest>(&j.client, Some(&dev.namespace), body("sneaky")).await
        {
            Err(e) if status_code(&e) == Some(401) => Err(e.to_string()),
            r => Ok(r),
        }
    })
    .await;
    let err = refused.expect_err("a request for prod's labels is refused at create");
    assert_eq!(status_code(&err), Some(422), "{err}");
    // NB: CEL walks the map in no set order: the message names either key.
    let text = tether_e2e::message(&err);
    assert!(
        [
            tether_api::labels::CLUSTER_SET,
            tether_api::labels::CLUSTER_SET_NAMESPACE
        ]
        .iter()
        .any(|k| text.contains(&format!("label key {k} is reserved"))),
        "{text}"
    );

    // Someone removes the rule from the CRD: the leader's own check still holds.
    let crds = Api::<
        k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    >::all(l.admin.clone());
    let crd_name = "clusterregistrationrequests.multicluster.tether.dev";
    let mut crd = crds.get(crd_name).await.expect("CRD");
    let rules = crd.spec.versions[0]
        .schema
        .as_mut()
        .and_then(|s| s.open_api_v3_schema.as_mut())
        .and_then(|s| s.properties.as_mut())
        .and_then(|p| p.get_mut("spec"))
        .and_then(|s| s.properties.as_mut())
        .and_then(|p| p.get_mut("labels"))
        .and_then(|l| l.x_kubernetes_validations.as_mut())
        .expect("the labels rules");
    rules.retain(|r| !r.rule.contains("matches"));
    crds.replace(crd_name, &Default::default(), &crd)
        .await
        .expect("edited CRD");
    let req = eventually(
        "the edited CRD to take effect",
        Duration::from_secs(30),
        || async {
            match create_raw::<ClusterRegistrationRequest>(&j.client, Some(&dev.namespace), body("sneaky"))
                .await
            {
                Ok(r) => Ok(r),
                Err(e) => Err(e.to_string()),
            }
        },
    )
    .await;
    let api = Api::<ClusterRegistrationRequest>::namespaced(l.admin.clone(), &dev.namespace);
    eventually("the request to be approved", Duration::from_secs(30), || async {
        let r = api.get(&req.name_any()).await.map_err(|e| e.to_string())?;
        match r.status.as_ref().map(|s| s.result) {
            Some(RegistrationResult::Approved) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let mc = eventually("the member's ManagedCluster", Duration::from_secs(30), || async {
        Api::<ManagedCluster>::all(l.admin.clone())
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?
            .items
            .into_iter()
            .find(|m| m.name_any() == "sneaky")
            .ok_or_else(|| "not yet".to_string())
    })
    .await;
    let got = mc.labels();
    assert_eq!(
        SetRef::from_labels(got).as_ref(),
        Some(&dev),
        "filed under dev alone: {got:?}"
    );
    assert_eq!(
        got.get("region").map(String::as_str),
        Some("eu"),
        "its own labels are kept"
    );
    let in_prod = Api::<ManagedCluster>::all(l.admin.clone())
        .list(&kube::api::ListParams::default().labels(&prod.selector()))
        .await
        .expect("list");
    assert!(
        in_prod.items.is_empty(),
        "nothing filed under prod: {:?}",
        in_prod.items
    );
    // prod's status counts no member (it never had one), long after dev's member joined.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let set = Api::<ClusterSet>::namespaced(l.admin.clone(), &prod.namespace)
        .get(&prod.name)
        .await
        .expect("prod");
    let counts = set.status.and_then(|s| s.members).unwrap_or_default();
    assert_eq!(counts.total, 0, "prod counts no member: {counts:?}");
}

#[tokio::test]
async fn an_existing_namespace_is_never_adopted() {
    let l = Leader::named("no-adopt").start().await;
    let ns = sim::ns_of("squatter");
    create_namespace(&l.admin, &ns)
        .await
        .expect("an admin's namespace");
    let j = sim::joiner(&l.cluster, &l.admin).await;
    let req = register_in(&j, sim::HOME, "squatter-1", "squatter", "id-s").await;
    let status = req.status.expect("status");
    assert_eq!(status.result, RegistrationResult::Denied);
    assert_eq!(status.reason, RegistrationReason::NamespaceConflict);
    let message = status.message.unwrap_or_default();
    assert!(
        message.contains(&ns) && message.contains("does not take over"),
        "{message}"
    );
    let kept = Api::<Namespace>::all(l.admin.clone())
        .get(&ns)
        .await
        .expect("kept");
    assert!(
        !kept.labels().keys().any(|k| k.contains("tether")),
        "the leader labelled nothing: {:?}",
        kept.labels()
    );
    let sa = Api::<ServiceAccount>::namespaced(l.admin.clone(), &ns)
        .get_opt("tether-agent")
        .await
        .expect("get");
    assert!(
        sa.is_none(),
        "no identity was created in a namespace the leader does not own"
    );
}

#[tokio::test]
async fn a_join_token_works_the_moment_it_is_created_every_time() {
    let l = Leader::named("fresh-token").start().await;
    let set = sim::home();
    let leader_url = l.cluster.url().to_string();
    let ca = l.cluster.ca_pem().to_string();
    for i in 0..25 {
        // Create the Secret and use it at once, as `tether init` then `helm install` from a script does.
        let token = BootstrapToken::random();
        token.create(&l.admin, Some(&set), None).await.expect("token");
        let trust = tether_join::Trust::Ca(ca.clone());
        let config =
            tether_join::discovery::leader_config(&leader_url, &trust, Some(&token.token())).expect("config");
        let target = tether_agent::register::Target {
            bootstrap: Client::try_from(config).expect("client"),
            namespace: &set.namespace,
        };
        let (identity, recipient) = tether_seal::generate_keypair();
        let name = format!("fresh-{i}");
        let reg = tether_agent::register::Registration {
            cluster_id: &format!("id-{name}"),
            cluster_name: &name,
            labels: Default::default(),
            identity: &identity,
            recipient: &recipient,
        };
        let stored = tether_agent::register::register(&target, &reg, Duration::from_secs(30))
            .await
            .unwrap_or_else(|e| panic!("join {i} with a token created just before: {e}"));
        assert_eq!(stored.credential.namespace, sim::ns_of(&name));
    }
}
