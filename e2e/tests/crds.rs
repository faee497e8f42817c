//! Tether's CRDs on a real API server: they install, accept valid objects, reject invalid ones
//! with messages a user can act on, and print the designed columns in `kubectl get`.

use std::time::Duration;

use kube::api::{Api, Patch, PatchParams};
use kube::{Client, CustomResourceExt};
use serde_json::{Value, json};
use tether_api::about::ClusterProperty;
use tether_api::{ClusterRegistrationRequest, ClusterSet, ManagedCluster, MemberClusterAnnounce};
use tether_e2e::{create_raw, dynamic, message, status_code};
use tether_testkit::{TestCluster, eventually, install_tether_crds};

#[path = "crds/invalid.rs"]
mod invalid;

#[path = "crds/columns.rs"]
mod columns;

const AGE_KEY: &str = "age1ql3z7hjy54pw3hyww5ayyfg7zqgvc7w3j2elw8zmrj2kg5sfn9aqmcac8p";
const CA_HASH: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

async fn cluster_with_crds(name: &str) -> (TestCluster, Client) {
    let cluster = TestCluster::builder(name)
        .controller_manager(false)
        .start()
        .await
        .expect("cluster starts");
    let client = cluster.client().expect("admin client");
    install_tether_crds(&client)
        .await
        .expect("CRDs install and become Established");
    (cluster, client)
}

async fn namespace(client: &Client, name: &str) {
    tether_e2e::create_namespace(client, name)
        .await
        .expect("namespace");
}

fn leader_set(name: &str) -> Value {
    json!({"apiVersion": "multicluster.tether.dev/v1alpha1", "kind": "ClusterSet",
           "metadata": {"name": name}, "spec": {"role": "Leader"}})
}

fn member_set(name: &str, member: Value) -> Value {
    json!({"apiVersion": "multicluster.tether.dev/v1alpha1", "kind": "ClusterSet",
           "metadata": {"name": name}, "spec": {"role": "Member", "member": member}})
}

fn member_spec() -> Value {
    json!({"leaderURL": "https://leader.example:6443", "caCertHash": CA_HASH,
           "joinTokenSecretRef": {"name": "tether-join-token"}, "clusterName": "east"})
}

fn request(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "multicluster.tether.dev/v1alpha1", "kind": "ClusterRegistrationRequest",
           "metadata": {"name": name}, "spec": spec})
}

fn request_spec() -> Value {
    json!({"clusterID": "6b0f1c1e-8d0a-4f39-9a53-0d5d4f7e2a11", "clusterName": "east", "publicKey": AGE_KEY})
}

fn managed(name: &str, id: &str) -> Value {
    json!({"apiVersion": "multicluster.tether.dev/v1alpha1", "kind": "ManagedCluster",
           "metadata": {"name": name}, "spec": {"clusterID": id, "clusterSet": "prod"}})
}

fn announce(name: &str, id: &str) -> Value {
    json!({"apiVersion": "multicluster.tether.dev/v1alpha1", "kind": "MemberClusterAnnounce",
           "metadata": {"name": name}, "spec": {"clusterID": id, "renewTime": "2026-11-29T10:00:00.000000Z"}})
}

fn with(mut base: Value, pointer: &str, value: Value) -> Value {
    let (parent, key) = pointer.rsplit_once('/').expect("pointer has a parent");
    base.pointer_mut(parent).expect("parent exists")[key] = value;
    base
}

#[tokio::test]
async fn every_crd_installs_and_is_served_with_its_names() {
    let (cluster, _client) = cluster_with_crds("crds-install").await;
    let out = cluster
        .kubectl()
        .expect("kubectl")
        .args(["api-resources", "--categories=tether", "--no-headers"])
        .output()
        .expect("kubectl runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "kubectl api-resources failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (resource, short) in [
        ("clustersets", None),
        ("clusterregistrationrequests", Some("clsrr")),
        ("managedclusters", Some("mcls")),
        ("memberclusterannounces", Some("mca")),
    ] {
        let line = text.lines().find(|l| l.starts_with(resource)).unwrap_or_else(|| {
            panic!("{resource} is not in the tether category; kubectl api-resources printed:\n{text}")
        });
        if let Some(short) = short {
            assert!(
                line.split_whitespace().any(|w| w == short),
                "{resource} lacks short name {short}: {line}"
            );
        }
    }
    let props = cluster
        .kubectl()
        .expect("kubectl")
        .args(["get", "--raw", "/apis/about.k8s.io"])
        .output()
        .expect("kubectl runs");
    let group: Value = serde_json::from_slice(&props.stdout).expect("about.k8s.io group is served");
    assert_eq!(
        group["preferredVersion"]["version"], "v1beta1",
        "upstream stores ClusterProperty as v1beta1"
    );
    assert_eq!(
        group["versions"].as_array().map(Vec::len),
        Some(2),
        "v1alpha1 and v1beta1 are both served"
    );
}

#[tokio::test]
async fn valid_objects_of_each_kind_are_accepted() {
    let (_cluster, client) = cluster_with_crds("crds-valid").await;
    namespace(&client, "tether-system").await;
    namespace(&client, "member").await;
    namespace(&client, "prod-east").await;
    let home = Some("tether-system");

    let policy = json!({"approval": {"mode": "AllowList", "allowedClusters": ["east", "west"]},
                        "heartbeatInterval": "5s", "gracePeriod": "20s"});
    create_raw::<ClusterSet>(&client, home, with(leader_set("prod"), "/spec/leader", policy))
        .await
        .expect("leader ClusterSet with an allow-list");
    let set = Api::<ClusterSet>::namespaced(client.clone(), "tether-system")
        .get("prod")
        .await
        .expect("get");
    let leader = set.spec.leader.expect("leader spec");
    assert_eq!(
        leader.expiry(),
        std::time::Duration::from_secs(24 * 3600),
        "unset durations are defaulted by the API server"
    );
    assert_eq!(leader.credential_lifetime(), std::time::Duration::from_secs(3600));

    create_raw::<ClusterSet>(&client, Some("member"), member_set("prod", member_spec()))
        .await
        .expect("member set");
    let member = Api::<ClusterSet>::namespaced(client.clone(), "member")
        .get("prod")
        .await
        .expect("get");
    assert_eq!(
        member.spec.member.expect("member spec").join_token_secret_ref.key,
        "token"
    );

    create_raw::<ClusterRegistrationRequest>(&client, home, request("east-1", request_spec()))
        .await
        .expect("registration request");
    create_raw::<ManagedCluster>(
        &client,
        Some("prod-east"),
        managed("east", "6b0f1c1e-8d0a-4f39-9a53-0d5d4f7e2a11"),
    )
    .await
    .expect("managed cluster");
    create_raw::<MemberClusterAnnounce>(&client, Some("prod-east"), announce("east", "6b0f1c1e"))
        .await
        .expect("announce");
    let prop = |version: &str| {
        json!({"apiVersion": format!("about.k8s.io/{version}"), "kind": "ClusterProperty",
               "metadata": {"name": format!("id-{version}")}, "spec": {"value": "6b0f1c1e"}})
    };
    create_raw::<ClusterProperty>(&client, None, prop("v1alpha1"))
        .await
        .expect("ClusterProperty v1alpha1");
    create_raw::<tether_api::about::v1beta1::ClusterProperty>(&client, None, prop("v1beta1"))
        .await
        .expect("ClusterProperty v1beta1");
    let both = Api::<ClusterProperty>::all(client.clone())
        .list(&Default::default())
        .await
        .expect("list");
    assert_eq!(
        both.items.len(),
        2,
        "objects written through either version are read through v1alpha1"
    );
}

#[tokio::test]
async fn registration_request_result_is_pending_from_creation() {
    let (_cluster, client) = cluster_with_crds("crds-pending").await;
    namespace(&client, "tether-system").await;
    create_raw::<ClusterRegistrationRequest>(
        &client,
        Some("tether-system"),
        request("east-1", request_spec()),
    )
    .await
    .expect("valid request is accepted");
    let api = Api::<ClusterRegistrationRequest>::namespaced(client.clone(), "tether-system");
    let got = api.get("east-1").await.expect("get request");
    let status = got.status.expect("status is defaulted by the API server");
    assert_eq!(
        status.result,
        tether_api::registration::RegistrationResult::Pending
    );
    assert_eq!(
        status.reason,
        tether_api::registration::RegistrationReason::AwaitingLeader
    );
}

/// One object the API server must refuse, and a piece of the message it must give.
struct Invalid {
    what: &'static str,
    ns: Option<&'static str>,
    body: Value,
    says: &'static str,
}

async fn create_any(client: &Client, ns: Option<&str>, body: Value) -> Result<(), kube::Error> {
    match body["kind"].as_str() {
        Some("ClusterSet") => create_raw::<ClusterSet>(client, ns, body).await.map(drop),
        Some("ClusterRegistrationRequest") => create_raw::<ClusterRegistrationRequest>(client, ns, body)
            .await
            .map(drop),
        Some("ManagedCluster") => create_raw::<ManagedCluster>(client, ns, body).await.map(drop),
        Some("MemberClusterAnnounce") => create_raw::<MemberClusterAnnounce>(client, ns, body)
            .await
            .map(drop),
        Some("ClusterProperty") => create_raw::<ClusterProperty>(client, ns, body).await.map(drop),
        other => panic!("test case has unknown kind {other:?}"),
    }
}

#[tokio::test]
async fn reserved_label_keys_are_refused_by_the_api_server_naming_the_key() {
    use tether_api::labels::{examples, is_reserved};
    let (_cluster, client) = cluster_with_crds("crd-reserved-labels").await;
    namespace(&client, "reserved").await;
    for (i, key) in examples::RESERVED
        .iter()
        .chain(examples::ALLOWED.iter())
        .enumerate()
    {
        let labels = json!({ *key: "x" });
        let bodies = [
            request(&format!("r-{i}"), with(request_spec(), "/labels", labels.clone())),
            member_set(&format!("m-{i}"), with(member_spec(), "/labels", labels)),
        ];
        for body in bodies {
            let kind = body["kind"].as_str().unwrap_or_default().to_string();
            let created = create_any(&client, Some("reserved"), body).await;
            match created {
                Err(e) => {
                    assert!(is_reserved(key), "{kind} with label {key} refused: {e}");
                    assert_eq!(status_code(&e), Some(422), "{e}");
                    let text = message(&e);
                    assert!(text.contains(&format!("label key {key} is reserved")), "{text}");
                }
                Ok(()) => assert!(!is_reserved(key), "{kind} with reserved label {key} was accepted"),
            }
        }
    }
}

#[tokio::test]
async fn immutable_fields_cannot_change() {
    let (_cluster, client) = cluster_with_crds("crds-immutable").await;
    namespace(&client, "tether-system").await;
    let ns = Some("tether-system");
    let member_with_id = member_set("prod", with(member_spec(), "/clusterID", json!("id-1")));
    create_raw::<ClusterSet>(&client, ns, member_with_id)
        .await
        .expect("member set");
    create_raw::<ManagedCluster>(&client, ns, managed("east", "id-1"))
        .await
        .expect("managed cluster");
    create_raw::<ClusterRegistrationRequest>(&client, ns, request("east-1", request_spec()))
        .await
        .expect("request");

    let pp = PatchParams::default();
    let cases: Vec<(&str, Api<kube::api::DynamicObject>, &str, Value, &str)> = vec![
        (
            "member cluster ID",
            dynamic::<ClusterSet>(&client, ns),
            "prod",
            json!({"spec": {"member": {"clusterID": "id-2"}}}),
            "clusterID is immutable while the cluster is a member",
        ),
        (
            "set role",
            dynamic::<ClusterSet>(&client, ns),
            "prod",
            json!({"spec": {"role": "Leader", "member": null}}),
            "spec.role is immutable",
        ),
        (
            "managed cluster ID",
            dynamic::<ManagedCluster>(&client, ns),
            "east",
            json!({"spec": {"clusterID": "id-2"}}),
            "clusterID is immutable",
        ),
        (
            "request spec",
            dynamic::<ClusterRegistrationRequest>(&client, ns),
            "east-1",
            json!({"spec": {"clusterName": "west"}}),
            "spec is immutable: create a new request instead",
        ),
    ];
    for (what, api, name, patch, says) in cases {
        let err = api.patch(name, &pp, &Patch::Merge(&patch)).await.expect_err(what);
        assert_eq!(status_code(&err), Some(422), "{what}: {}", message(&err));
        assert!(
            message(&err).contains(says),
            "{what}: message {:?} lacks {says:?}",
            message(&err)
        );
    }
}

fn kubectl(cluster: &TestCluster, args: &[&str]) -> String {
    let out = cluster
        .kubectl()
        .expect("kubectl")
        .args(args)
        .output()
        .expect("kubectl runs");
    assert!(
        out.status.success(),
        "kubectl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn header(table: &str) -> Vec<String> {
    let first = table.lines().next().unwrap_or_default();
    // Column titles are separated by two or more spaces; titles may contain one space.
    first
        .split("  ")
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(str::to_string)
        .collect()
}

#[test]
fn every_crd_declares_its_short_names_and_category() {
    assert_eq!(
        ClusterRegistrationRequest::crd().spec.names.short_names,
        Some(vec!["clsrr".to_string()])
    );
    assert_eq!(
        ManagedCluster::crd().spec.names.short_names,
        Some(vec!["mcls".to_string()])
    );
    assert_eq!(
        MemberClusterAnnounce::crd().spec.names.short_names,
        Some(vec!["mca".to_string()])
    );
    for (_, crd) in tether_api::crds::all()
        .into_iter()
        .filter(|(f, _)| f.starts_with("multicluster"))
    {
        assert_eq!(
            crd.spec.names.categories,
            Some(vec!["tether".to_string()]),
            "{}",
            crd.spec.names.kind
        );
    }
}
