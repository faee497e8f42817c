//! The real control plane behaves as Tether relies on: bootstrap tokens authenticate with their
//! extra groups and get exactly their Role, expire, are cleaned up and sign `cluster-info`;
//! namespaces are deleted with their contents; clusters started together are independent.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::jiff::{Timestamp, ToSpan};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;
use tether_api::SetRef;
use tether_api::{ClusterRegistrationRequest, ClusterSet};
use tether_e2e::{create_raw, message, status_code};
use tether_join::token::join_group;
use tether_testkit::{BootstrapToken, CreateToken, TestCluster, eventually, install_tether_crds};

fn set() -> SetRef {
    SetRef::new("tether-system", "prod")
}
const AGE_KEY: &str = "age1ql3z7hjy54pw3hyww5ayyfg7zqgvc7w3j2elw8zmrj2kg5sfn9aqmcac8p";

fn meta(name: &str, ns: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: ns.map(Into::into),
        ..Default::default()
    }
}

async fn namespace(client: &Client, name: &str) {
    tether_e2e::create_namespace(client, name)
        .await
        .expect("namespace");
}

fn request(name: &str) -> serde_json::Value {
    json!({"apiVersion": "multicluster.tether.dev/v1alpha1", "kind": "ClusterRegistrationRequest",
           "metadata": {"name": name},
           "spec": {"clusterID": "id-1", "clusterName": "east", "publicKey": AGE_KEY}})
}

async fn whoami(client: &Client) -> Result<(String, Vec<String>), kube::Error> {
    let review = SelfSubjectReview::default();
    let got = Api::<SelfSubjectReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await?;
    let user = got.status.and_then(|s| s.user_info).unwrap_or_default();
    Ok((user.username.unwrap_or_default(), user.groups.unwrap_or_default()))
}

fn rfc3339_in(seconds: i64) -> Timestamp {
    Timestamp::now() + seconds.seconds()
}

#[tokio::test]
async fn bootstrap_token_authenticates_with_its_set_group_and_gets_only_its_role() {
    let cluster = TestCluster::builder("bootstrap-rbac")
        .controller_manager(false)
        .start()
        .await
        .expect("cluster");
    let admin = cluster.client().expect("admin");
    install_tether_crds(&admin).await.expect("crds");
    namespace(&admin, "tether-system").await;
    namespace(&admin, "elsewhere").await;
    tether_e2e::join_role(&admin, &set()).await.expect("join RBAC");
    let token = BootstrapToken::random();
    token
        .create(&admin, Some(&set()), Some(rfc3339_in(3600)))
        .await
        .expect("token");
    let joiner = cluster.client_with_token(&token.token()).expect("token client");

    let (user, groups) = eventually("the token to authenticate", Duration::from_secs(10), || {
        whoami(&joiner)
    })
    .await;
    assert_eq!(user, token.user());
    for g in [
        "system:bootstrappers",
        &join_group(&set()),
        "system:authenticated",
    ] {
        assert!(groups.iter().any(|x| x == g), "group {g} missing from {groups:?}");
    }

    // What the Role allows.
    create_raw::<ClusterRegistrationRequest>(&joiner, Some("tether-system"), request("east-1"))
        .await
        .expect("the join token may create a registration request in the home namespace");
    let mine = Api::<ClusterRegistrationRequest>::namespaced(joiner.clone(), "tether-system");
    mine.get("east-1").await.expect("and read it back");

    // Everything else is forbidden.
    let secrets = Api::<Secret>::namespaced(joiner.clone(), "kube-system")
        .list(&ListParams::default())
        .await;
    let elsewhere =
        create_raw::<ClusterRegistrationRequest>(&joiner, Some("elsewhere"), request("east-2")).await;
    let sets = Api::<ClusterSet>::namespaced(joiner.clone(), "tether-system")
        .list(&ListParams::default())
        .await;
    let list = mine.list(&ListParams::default()).await;
    let delete = mine.delete("east-1", &DeleteParams::default()).await.map(drop);
    let approve = mine
        .patch_status(
            "east-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"result": "Approved"}})),
        )
        .await;
    let outcomes: Vec<(&str, Option<u16>)> = vec![
        (
            "list Secrets in kube-system",
            secrets.err().as_ref().and_then(status_code),
        ),
        (
            "create a request in another namespace",
            elsewhere.err().as_ref().and_then(status_code),
        ),
        ("list ClusterSets", sets.err().as_ref().and_then(status_code)),
        ("list every request", list.err().as_ref().and_then(status_code)),
        ("delete a request", delete.err().as_ref().and_then(status_code)),
        (
            "approve itself through the status subresource",
            approve.err().as_ref().and_then(status_code),
        ),
    ];
    for (what, code) in outcomes {
        assert_eq!(code, Some(403), "the join token must not {what}");
    }
}

#[tokio::test]
async fn expired_bootstrap_token_is_rejected_and_cleaned_up() {
    let cluster = TestCluster::start("bootstrap-expiry").await.expect("cluster");
    let admin = cluster.client().expect("admin");
    let expired = BootstrapToken::random();
    expired
        .create(&admin, Some(&set()), Some(rfc3339_in(-60)))
        .await
        .expect("expired token");
    let err = whoami(&cluster.client_with_token(&expired.token()).expect("client"))
        .await
        .expect_err("an expired bootstrap token must not authenticate");
    assert_eq!(status_code(&err), Some(401), "expired token: {}", message(&err));

    // The token cleaner of kube-controller-manager deletes it.
    let secrets = Api::<Secret>::namespaced(admin.clone(), "kube-system");
    let name = format!("bootstrap-token-{}", expired.id);
    eventually(
        "the token cleaner to delete the expired token",
        Duration::from_secs(60),
        || async {
            match secrets.get_opt(&name).await {
                Ok(None) => Ok(()),
                other => Err(format!("{:?}", other.map(|s| s.map(|s| s.metadata.name)))),
            }
        },
    )
    .await;
}

#[tokio::test]
async fn bootstrap_signer_signs_cluster_info_for_each_token() {
    let cluster = TestCluster::start("bootstrap-signer").await.expect("cluster");
    let admin = cluster.client().expect("admin");
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: \"\"\n  cluster:\n    server: {}\n",
        cluster.url()
    );
    let info = ConfigMap {
        metadata: meta("cluster-info", Some("kube-public")),
        data: Some(BTreeMap::from([("kubeconfig".to_string(), kubeconfig)])),
        ..Default::default()
    };
    let cms = Api::<ConfigMap>::namespaced(admin.clone(), "kube-public");
    cms.create(&PostParams::default(), &info)
        .await
        .expect("cluster-info");
    let token = BootstrapToken::random();
    token
        .create(&admin, Some(&set()), Some(rfc3339_in(3600)))
        .await
        .expect("token");
    let key = format!("jws-kubeconfig-{}", token.id);
    eventually(
        "the bootstrap signer to sign cluster-info",
        Duration::from_secs(60),
        || async {
            let cm = cms.get("cluster-info").await.map_err(|e| e.to_string())?;
            let data = cm.data.unwrap_or_default();
            if data.contains_key(&key) {
                Ok(())
            } else {
                Err(format!("keys: {:?}", data.keys().collect::<Vec<_>>()))
            }
        },
    )
    .await;
}

#[tokio::test]
async fn deleting_a_namespace_removes_the_tether_objects_in_it() {
    let cluster = TestCluster::start("namespace-deletion").await.expect("cluster");
    let admin = cluster.client().expect("admin");
    install_tether_crds(&admin).await.expect("crds");
    namespace(&admin, "prod-east").await;
    create_raw::<ClusterRegistrationRequest>(&admin, Some("prod-east"), request("east-1"))
        .await
        .expect("request");
    let namespaces = Api::<Namespace>::all(admin.clone());
    namespaces
        .delete("prod-east", &DeleteParams::default())
        .await
        .expect("delete namespace");
    eventually(
        "the namespace controller to finish deleting prod-east",
        Duration::from_secs(60),
        || async {
            match namespaces.get_opt("prod-east").await {
                Ok(None) => Ok(()),
                other => Err(format!(
                    "{:?}",
                    other.map(|n| n.and_then(|n| n.status).and_then(|s| s.phase))
                )),
            }
        },
    )
    .await;
    let left = Api::<ClusterRegistrationRequest>::all(admin.clone())
        .list(&ListParams::default())
        .await
        .expect("list");
    assert!(
        left.items.is_empty(),
        "objects survived their namespace: {:?}",
        left.items
    );
}

#[tokio::test]
async fn two_clusters_started_in_one_test_are_independent() {
    let (a, b) = tokio::join!(
        TestCluster::builder("indep-a").controller_manager(false).start(),
        TestCluster::builder("indep-b").controller_manager(false).start()
    );
    let (a, b) = (a.expect("cluster a"), b.expect("cluster b"));
    let (ca, cb) = (a.client().expect("a"), b.client().expect("b"));
    install_tether_crds(&ca).await.expect("crds in a");
    namespace(&ca, "only-in-a").await;

    let in_b = Api::<Namespace>::all(cb.clone())
        .get_opt("only-in-a")
        .await
        .expect("get in b");
    assert!(
        in_b.is_none(),
        "a namespace created in cluster a appeared in cluster b"
    );
    let sets = Api::<ClusterSet>::all(cb.clone())
        .list(&ListParams::default())
        .await;
    assert_eq!(
        sets.err().as_ref().and_then(status_code),
        Some(404),
        "cluster b must not serve a's CRDs"
    );
    assert_ne!(a.ca_cert_hash(), b.ca_cert_hash(), "each cluster has its own CA");

    // Cluster a's admin credentials mean nothing to cluster b.
    let mut cross = a.config();
    cross.cluster_url = b.url().parse().expect("url");
    cross.root_cert = b.config().root_cert;
    let cross = Client::try_from(cross).expect("cross client");
    let err = Api::<Namespace>::all(cross)
        .list(&ListParams::default())
        .await
        .expect_err("foreign admin cert");
    assert_eq!(
        status_code(&err),
        Some(401),
        "a's admin certificate must not authenticate to b: {}",
        message(&err)
    );
}
