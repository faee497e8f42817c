//! Members published as SIG-Multicluster ClusterProfiles, on real clusters: a leader serving
//! member access with `--cluster-profiles` (the upstream CRD applied by `tether crds apply
//! --cluster-profiles`, the leader bound to exactly `config/rbac/leader-inventory.yaml` and a
//! write RoleBinding in each inventory namespace) and two members with real agents.
//!
//! - Each member gets one profile per inventory namespace, saying what the issue asks field by
//!   field: manager, labels, `Joined`, `ControlPlaneHealthy`, version, properties, and the
//!   `tether` access provider (the leader's proxy path for the member, the leader's CA, the exec
//!   extension).
//! - At steady state nothing is written (resourceVersions stay).
//! - A namespace the set stops listing loses its profiles; one the leader may not write in gets
//!   none (and nothing else breaks).
//! - A killed agent flips `Joined` and `ControlPlaneHealthy` to Unknown within the detection
//!   time; a member that leaves loses its profiles within 5 s of its removal.
//!
//! This binary has its own `main` (libtest-mimic): the leader's proxy listens on the lab bridge.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use base64::Engine as _;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tether_api::ClusterSet;
use tether_api::about::ClusterProperty;
use tether_api::clusterset::{InventoryNamespace, InventorySpec, LeaderSpec};
use tether_api::inventory::{ClusterProfile, EXEC_EXTENSION, ExecExtension};
use tether_e2e::access::wait_tunnel;
use tether_e2e::create_namespace;
use tether_e2e::fleet::{self, LeaderSide, duration, managed};
use tether_e2e::inventory::{
    CONSUMER, INVENTORY, OUTSIDER, a_profile_naming_another_server_collects_no_consumer_token,
    consumers_reach_members, profiles, tether, upstream_consumer_sees_every_member,
};
use tether_e2e::sim::{HOME, SET, join_token, ns_of};
use tether_testkit::{TestCluster, eventually, free_port, lab};

fn main() -> ExitCode {
    tether_e2e::lab_main(
        "the inventory test",
        "members_are_published_as_cluster_profiles_written_only_on_change",
        inventory,
    )
}

fn step(what: &str) {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let t = START.get_or_init(Instant::now).elapsed();
    eprintln!("== [{:6.1}s] {what}", t.as_secs_f64());
}

/// The inventory namespaces: `INVENTORY` and this one the leader may write in, one it may not.
const KUEUE: &str = "kueue-system";
const FORBIDDEN: &str = "not-granted";
/// Pings every second, lost after two unanswered: a member is Unknown 3 s after its tunnel closes.
const DETECTION: Duration = Duration::from_secs(3);
const SLACK: Duration = Duration::from_secs(4);

/// The type, status and reason of `p`'s condition `type_`.
fn condition(p: &ClusterProfile, type_: &str) -> Option<(String, String)> {
    p.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone()))
}

async fn wait_condition(
    admin: &Client,
    ns: &str,
    name: &str,
    type_: &str,
    status: &str,
    within: Duration,
) -> Duration {
    let start = Instant::now();
    eventually(&format!("{ns}/{name}: {type_}={status}"), within, || async {
        let p = profiles(admin, ns).get(name).await.map_err(|e| e.to_string())?;
        match condition(&p, type_) {
            Some((s, _)) if s == status => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    start.elapsed()
}

async fn wait_absent(admin: &Client, ns: &str, name: &str, within: Duration) -> Duration {
    let start = Instant::now();
    eventually(&format!("{ns}/{name} removed"), within, || async {
        match profiles(admin, ns)
            .get_opt(name)
            .await
            .map_err(|e| e.to_string())?
        {
            None => Ok(()),
            Some(_) => Err("still there".to_string()),
        }
    })
    .await;
    start.elapsed()
}

/// Every profile's `namespace/name` and resourceVersion.
async fn versions(admin: &Client) -> Vec<(String, String)> {
    let mut all: Vec<(String, String)> = Api::<ClusterProfile>::all(admin.clone())
        .list(&ListParams::default())
        .await
        .expect("list profiles")
        .items
        .iter()
        .map(|p| {
            (
                format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()),
                p.resource_version().unwrap_or_default(),
            )
        })
        .collect();
    all.sort();
    all
}

async fn set_inventory(admin: &Client, namespaces: &[&str]) {
    Api::<ClusterSet>::namespaced(admin.clone(), HOME)
        .patch(
            SET,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"leader": {"inventory": {"namespaces": namespaces}}}})),
        )
        .await
        .expect("set the inventory namespaces");
}

async fn install_cluster_profiles(leader: &LeaderSide) {
    let out = tether(
        leader,
        &["crds", "apply", "--side", "leader", "--cluster-profiles"],
    )
    .await;
    assert!(
        out.status.success(),
        "tether crds apply --cluster-profiles: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("CRD clusterprofiles.multicluster.x-k8s.io created"),
        "{said}"
    );
    let admin = &leader.admin;
    tether_e2e::allow_inventory(admin, &[INVENTORY, KUEUE])
        .await
        .expect("inventory RBAC");
    create_namespace(admin, FORBIDDEN).await.expect("namespace");
}

/// What the profile of member `name` must say, field by field, once its agent reported.
async fn check_profile(leader: &LeaderSide, member: &fleet::MemberSide, name: &str, ns: &str) {
    let admin = &leader.admin;
    let p = profiles(admin, ns).get(name).await.expect("profile");
    let labels = p.labels();
    assert_eq!(
        labels.get("x-k8s.io/cluster-manager").map(String::as_str),
        Some("tether")
    );
    assert_eq!(
        labels.get("multicluster.x-k8s.io/clusterset").map(String::as_str),
        Some(SET)
    );
    assert_eq!(p.spec.cluster_manager.name, "tether");
    assert_eq!(p.spec.display_name.as_deref(), Some(name));
    let status = p.status.clone().expect("status");
    assert_eq!(
        condition(&p, "Joined").map(|c| c.0).as_deref(),
        Some("True"),
        "{status:?}"
    );
    let mc = managed(admin, name).await.expect("managed cluster");
    let reported = mc.status.clone().expect("member status");
    let version = member.admin.apiserver_version().await.expect("member version");
    assert_eq!(
        status.version.as_ref().and_then(|v| v.kubernetes.clone()),
        Some(version.git_version.clone()),
        "the member's version"
    );
    assert_eq!(
        reported.kubernetes_version.as_deref(),
        Some(version.git_version.as_str())
    );
    let prop = |n: &str| {
        status
            .properties
            .iter()
            .find(|p| p.name == n)
            .map(|p| p.value.clone())
    };
    assert_eq!(
        prop("cluster.clusterset.k8s.io"),
        Some(mc.spec.cluster_id.clone())
    );
    assert_eq!(prop("clusterset.k8s.io").as_deref(), Some(SET));
    for (resource, q) in &reported.capacity {
        assert_eq!(
            prop(&format!("multicluster.tether.dev/capacity.{resource}")),
            Some(q.0.clone())
        );
    }
    assert!(!reported.capacity.is_empty(), "the member reported its capacity");
    let [provider] = status.access_providers.as_slice() else {
        panic!("one access provider: {:?}", status.access_providers)
    };
    assert_eq!(provider.name, "tether");
    let server = provider.cluster.server.clone().expect("server");
    assert_eq!(
        server,
        format!(
            "{}{}",
            leader.cluster.url(),
            tether_tunnel::proxy_path(&ns_of(name), name)
        )
    );
    let ca = base64::engine::general_purpose::STANDARD
        .decode(
            provider
                .cluster
                .certificate_authority_data
                .as_deref()
                .expect("CA"),
        )
        .expect("base64 CA");
    // NB: the same PEM, whichever line ends it was read with.
    assert_eq!(
        String::from_utf8(ca).expect("PEM").replace("\r\n", "\n"),
        leader.cluster.ca_pem().replace("\r\n", "\n")
    );
    let ext = provider
        .cluster
        .extensions
        .iter()
        .flatten()
        .find(|e| e.name == EXEC_EXTENSION)
        .expect("the exec extension");
    let ext: ExecExtension = serde_json::from_value(ext.extension.clone()).expect("extension");
    assert_eq!(
        ext,
        ExecExtension {
            cluster_name: name.into(),
            cluster_set: SET.into(),
            namespace: ns_of(name),
        }
    );
}

async fn inventory() {
    let cluster = TestCluster::builder("inv-leader")
        .start()
        .await
        .expect("leader cluster");
    let addr = std::net::SocketAddr::from((lab::GATEWAY, free_port().expect("port")));
    let policy = LeaderSpec {
        tunnel_ping_interval: duration("1s"),
        tunnel_ping_misses: 2,
        inventory: Some(InventorySpec {
            namespaces: vec![InventoryNamespace(INVENTORY.into())],
        }),
        ..LeaderSpec::default()
    };
    let leader = LeaderSide::on(cluster)
        .policy(policy)
        .proxy(addr, 4)
        .args(&["--cluster-profiles"])
        .start()
        .await;
    install_cluster_profiles(&leader).await;
    let admin = leader.admin.clone();
    let token = join_token(&admin).await;
    let allowed = format!("--impersonate-users={CONSUMER},{OUTSIDER}");
    let args = [allowed.as_str()];
    let (east, west) = futures::join!(
        fleet::member_with_args("east", &leader, &token, json!({}), &args),
        fleet::member_with_args("west", &leader, &token, json!({}), &args),
    );
    let mut east = east;
    fleet::add_node(&east.admin, "east-node", "4", "8Gi").await;
    fleet::add_node(&west.admin, "west-node", "2", "4Gi").await;
    // A KEP-2149 ClusterProperty of east's own, which its profile carries as it is.
    Api::<ClusterProperty>::all(east.admin.clone())
        .create(
            &Default::default(),
            &ClusterProperty::new(
                "zone.example.com",
                tether_api::about::v1alpha1::ClusterPropertySpec {
                    value: "eu-west-1a".into(),
                },
            ),
        )
        .await
        .expect("east's ClusterProperty");

    step("each member has a profile in the inventory namespace, saying what its ManagedCluster says");
    for (m, side) in [("east", &east), ("west", &west)] {
        wait_tunnel(&leader, m, "True").await;
        wait_condition(&admin, INVENTORY, m, "Joined", "True", Duration::from_secs(60)).await;
        wait_condition(
            &admin,
            INVENTORY,
            m,
            "ControlPlaneHealthy",
            "True",
            Duration::from_secs(60),
        )
        .await;
        eventually(&format!("{m}'s profile"), Duration::from_secs(30), || async {
            let p = profiles(&admin, INVENTORY)
                .get(m)
                .await
                .map_err(|e| e.to_string())?;
            let props = p.status.as_ref().map(|s| s.properties.len()).unwrap_or_default();
            // The member's ID and set, then its capacity and allocatable (cpu, memory, pods).
            (props >= 8).then_some(()).ok_or(format!("{props} properties"))
        })
        .await;
        check_profile(&leader, side, m, INVENTORY).await;
    }
    eventually(
        "east's own ClusterProperty in its profile",
        Duration::from_secs(60),
        || async {
            let p = profiles(&admin, INVENTORY)
                .get("east")
                .await
                .map_err(|e| e.to_string())?;
            let zone = p
                .status
                .iter()
                .flat_map(|s| &s.properties)
                .find(|p| p.name == "zone.example.com")
                .map(|p| p.value.clone());
            (zone.as_deref() == Some("eu-west-1a"))
                .then_some(())
                .ok_or(format!("{zone:?}"))
        },
    )
    .await;

    step(
        "a consumer ServiceAccount reaches each member through its profile with tether credential, as itself",
    );
    consumers_reach_members(&leader, &[("east", &east), ("west", &west)]).await;

    step("cluster-inventory-api's own access library reaches every member through its profile");
    upstream_consumer_sees_every_member(&leader, &[("east", &east), ("west", &west)]).await;

    step("a profile rewritten to name the attacker's server collects no consumer token");
    a_profile_naming_another_server_collects_no_consumer_token(&leader, "east").await;

    step("nothing is written at steady state");
    let before = versions(&admin).await;
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert_eq!(before, versions(&admin).await, "no profile changed in 12 s");

    step("a second namespace gets both members; one the leader may not write in gets none");
    set_inventory(&admin, &[INVENTORY, KUEUE, FORBIDDEN]).await;
    for m in ["east", "west"] {
        wait_condition(&admin, KUEUE, m, "Joined", "True", Duration::from_secs(30)).await;
        check_profile(&leader, if m == "east" { &east } else { &west }, m, KUEUE).await;
    }
    let denied = profiles(&admin, FORBIDDEN)
        .list(&ListParams::default())
        .await
        .expect("list");
    assert!(
        denied.items.is_empty(),
        "no profile where the leader may not write"
    );
    set_inventory(&admin, &[INVENTORY]).await;
    for m in ["east", "west"] {
        wait_absent(&admin, KUEUE, m, Duration::from_secs(10)).await;
    }

    step("a killed agent: Joined and ControlPlaneHealthy Unknown within the detection time");
    east.kill_agent();
    let seen = wait_condition(
        &admin,
        INVENTORY,
        "east",
        "Joined",
        "Unknown",
        DETECTION + SLACK * 2,
    )
    .await;
    eprintln!("killed agent: Joined=Unknown after {seen:.1?} (detection {DETECTION:?})");
    assert!(seen <= DETECTION + SLACK, "seen after {seen:?}");
    let p = profiles(&admin, INVENTORY).get("east").await.expect("profile");
    assert_eq!(
        condition(&p, "ControlPlaneHealthy").map(|c| c.0).as_deref(),
        Some("Unknown")
    );
    // The profile turns with the member's Ready condition, not a detection time later.
    let turned = |conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition], type_: &str| {
        let c = conditions.iter().find(|c| c.type_ == type_);
        c.map(|c| c.last_transition_time.0.as_second()).expect(type_)
    };
    let joined_at = turned(&p.status.clone().unwrap_or_default().conditions, "Joined");
    let mc = managed(&admin, "east").await.expect("east");
    let ready_at = turned(&mc.status.unwrap_or_default().conditions, "Ready");
    assert!(
        (joined_at - ready_at).abs() <= 1,
        "Joined turned at {joined_at}, Ready at {ready_at} (Unix seconds)"
    );
    east.start_agent();
    wait_condition(
        &admin,
        INVENTORY,
        "east",
        "Joined",
        "True",
        Duration::from_secs(60),
    )
    .await;

    step("a member that leaves loses its profile within 5 s of its removal");
    Api::<ClusterSet>::namespaced(west.admin.clone(), HOME)
        .delete(SET, &Default::default())
        .await
        .expect("west leaves");
    eventually("west removed on the leader", Duration::from_secs(60), || async {
        match managed(&admin, "west").await {
            Err(_) => Ok(()),
            Ok(_) => Err("still a member".to_string()),
        }
    })
    .await;
    let gone = wait_absent(&admin, INVENTORY, "west", Duration::from_secs(10)).await;
    eprintln!("left member's profile removed {gone:.1?} after its ManagedCluster");
    assert!(gone <= Duration::from_secs(5), "removed after {gone:?}");
    assert!(
        profiles(&admin, INVENTORY)
            .get_opt("east")
            .await
            .expect("get")
            .is_some(),
        "east keeps its profile"
    );
}
