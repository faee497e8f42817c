//! The node tier: Tether as real pods. Three clusters (a leader and two members), each with a
//! real node (containerd, kubelet, kube-proxy) running the project's own image from `make
//! image`; both charts installed with `helm install --wait` (the leader with 2 replicas; member
//! `east` with Helm 4 with the values `tether init` printed, `west` with Helm 3 in two steps:
//! idle, then joined with the file `tether init --values-file` wrote), then failover, `helm upgrade`
//! and `helm uninstall` (agents, then the leader, leaving nothing) as users do them.
//!
//! This binary has its own `main` (libtest-mimic): it must move into its lab network namespace
//! (`tether_testkit::lab::enter`) before any thread starts, so every address it uses lives in
//! namespaces this run creates.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};
use tether_api::ClusterSet;
use tether_e2e::pods::{self, Helm, NAMESPACE, PodFleet, chart_pods, ready_members, shell, step, text};
use tether_testkit::{TestCluster, eventually};

#[path = "nodes/killed.rs"]
mod killed;
#[path = "nodes/support.rs"]
mod support;

use killed::killed_agent_pod;
use support::*;

fn main() -> ExitCode {
    tether_e2e::lab_main(
        "the node tier",
        "charts_run_as_real_pods_join_fail_over_upgrade_and_uninstall_cleanly",
        real_pods,
    )
}

async fn real_pods() {
    let start = Instant::now();
    let tag = pods::app_version();
    let image = format!("{}:{tag}", pods::IMAGE_REPOSITORY);
    // The leader installed from its packaged chart through an OCI registry, as a release is; its
    // pods run as OpenShift's restricted-v2 SCC runs them: an arbitrary UID, no fixed group.
    let fleet = pods::up(
        None,
        &[("east", Helm::v4()), ("west", Helm::v3())],
        pods::LeaderInstall {
            values: &pods::RESTRICTED_LEADER_VALUES,
            from_oci: true,
        },
        start,
    )
    .await;
    let PodFleet { leader, members, .. } = &fleet;

    step(
        start,
        "pods Running and Ready through their probes, under the charted security context",
    );
    assert_chart_pods(leader, "tether-leader", 2, &image).await;
    for (_, cluster, _) in members {
        assert_chart_pods(cluster, "tether-agent", 1, &image).await;
    }
    step(
        start,
        "kubectl get clusterset,mcls shows the members Ready with their real nodes",
    );
    let ready = ready_members(leader).await;
    assert_eq!(
        ready,
        vec![
            ("east".to_string(), "1/1".to_string()),
            ("west".to_string(), "1/1".to_string())
        ],
        "members Ready with one real node each"
    );
    let table = text(&shell(leader, "kubectl get clusterset,mcls -A"));
    assert!(
        table.contains("east") && table.contains("west") && table.matches("1/1").count() >= 2,
        "{table}"
    );
    let (ids, requests) = pods::identities(leader).await;
    assert_eq!(ids.len(), 2, "{ids:?}");

    step(start, "every command of both NOTES.txt works as printed");
    run_notes(leader, &Helm::v4(), "tether-leader");
    for (_, cluster, helm) in members {
        run_notes(cluster, helm, "tether-agent");
    }

    step(
        start,
        "tether version: both leader pods' versions (their /metrics through the API server), which leads, and each member's agent",
    );
    let versions = text(&shell(leader, "tether version -o json"));
    let v: serde_json::Value = serde_json::from_str(&versions).expect(&versions);
    let leaders: Vec<&serde_json::Value> = v["controllers"]
        .as_array()
        .expect("controllers")
        .iter()
        .filter(|c| c["controller"] == "leader")
        .collect();
    assert_eq!(leaders.len(), 2, "{versions}");
    let app = env!("CARGO_PKG_VERSION");
    assert!(
        leaders.iter().all(|c| c["version"] == app),
        "read from tether_build_info, not the image tag ({tag}): {versions}"
    );
    assert_eq!(
        leaders.iter().filter(|c| c["leading"] == true).count(),
        1,
        "{versions}"
    );
    let agents: Vec<(&str, &str)> = v["agents"]
        .as_array()
        .expect("agents")
        .iter()
        .map(|a| {
            (
                a["member"].as_str().unwrap_or(""),
                a["version"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(agents, vec![("east", app), ("west", app)], "{versions}");

    member_access(start, leader, members).await;
    let (_, east, _) = members.iter().find(|m| m.0 == "east").expect("east");
    killed_agent_pod(start, leader, east).await;

    step(
        start,
        "delete the leading leader pod: the other replica takes over",
    );
    let holder = lease_holder(leader, "tether-leader").await;
    let leader_pods: Vec<String> = chart_pods(leader, "tether-leader")
        .await
        .into_iter()
        .map(|p| p.0)
        .collect();
    assert!(
        leader_pods.contains(&holder),
        "the Lease holder {holder:?} is a pod: {leader_pods:?}"
    );
    let t = Instant::now();
    Api::<Pod>::namespaced(leader.client().expect("client"), NAMESPACE)
        .delete(&holder, &DeleteParams::default())
        .await
        .expect("delete the leading pod");
    let new_holder = eventually("another replica leads", Duration::from_secs(60), || async {
        let h = lease_holder(leader, "tether-leader").await;
        if !h.is_empty() && h != holder {
            Ok(h)
        } else {
            Err(h)
        }
    })
    .await;
    let took = t.elapsed();
    let now: Vec<String> = chart_pods(leader, "tether-leader")
        .await
        .into_iter()
        .map(|p| p.0)
        .collect();
    step(
        start,
        &format!("  {new_holder} leads, {took:.1?} after the delete"),
    );
    // The standby watches the Lease and takes it when the deleted pod releases it on SIGTERM;
    // were it to wait for expiry, the replacement pod (which starts in about a second) would win.
    assert!(
        leader_pods.contains(&new_holder) && now.contains(&new_holder) && new_holder != holder,
        "the standby replica leads: {new_holder}, replicas before {leader_pods:?}, now {now:?}"
    );
    assert_chart_pods(leader, "tether-leader", 2, &image).await;
    let t = Instant::now();
    eventually(
        "east answers through the new leading pod",
        Duration::from_secs(90),
        || async {
            let o = shell(
                leader,
                &format!("tether --cluster east -- get pods -n {NAMESPACE} -o name"),
            );
            if o.status.success() { Ok(()) } else { Err(text(&o)) }
        },
    )
    .await;
    step(
        start,
        &format!(
            "  member access back through the new leader {:.1?} after the takeover",
            t.elapsed()
        ),
    );
    // Members stay Ready past a heartbeat grace period with the new leader, and nobody registers again.
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_members_kept(leader, &(ids.clone(), requests), "the failover").await;

    step(
        start,
        "helm upgrade both charts: a changed value and a second image tag",
    );
    let new_tag = format!("{tag}-upgrade");
    let new_image = format!("{}:{new_tag}", pods::IMAGE_REPOSITORY);
    for cluster in std::iter::once(leader).chain(members.iter().map(|m| &m.1)) {
        for node in cluster.nodes() {
            let o = node
                .ctr()
                .args(["images", "tag", &image, &new_image])
                .output()
                .expect("ctr");
            assert!(o.status.success(), "ctr images tag: {}", text(&o));
        }
    }
    // The CRDs as an older release left them (a field missing), with objects stored under them:
    // the upgrade's hook brings them to this version's schemas and keeps the objects.
    let prod_uid = leader_set_uid(leader).await;
    for cluster in std::iter::once(leader).chain(members.iter().map(|m| &m.1)) {
        set_banned_field(cluster, false).await;
    }
    let set_tag = format!("image.tag={new_tag}");
    Helm::v4().upgrade_reusing(leader, "tether-leader", &[&set_tag, "logLevel=debug"]);
    for (name, cluster, helm) in members {
        helm.upgrade_reusing(cluster, "tether-agent", &[&set_tag, "leaseDuration=20"]);
        step(start, &format!("  {name} upgraded with helm {}", helm.major));
    }
    assert_chart_pods(leader, "tether-leader", 2, &new_image).await;
    for (_, cluster, _) in members {
        assert_chart_pods(cluster, "tether-agent", 1, &new_image).await;
    }
    // The changed values reached the pods.
    let args_of = |pods: Vec<(String, bool, Pod)>| -> Vec<String> {
        pods.into_iter()
            .flat_map(|(_, _, p)| {
                p.spec
                    .map(|s| s.containers[0].args.clone().unwrap_or_default())
                    .unwrap_or_default()
            })
            .collect()
    };
    assert!(args_of(chart_pods(leader, "tether-leader").await).contains(&"--log-level=debug".to_string()));
    for (_, cluster, _) in members {
        assert!(
            args_of(chart_pods(cluster, "tether-agent").await).contains(&"--lease-duration=20".to_string())
        );
    }
    for cluster in std::iter::once(leader).chain(members.iter().map(|m| &m.1)) {
        assert!(
            set_banned_field(cluster, true).await,
            "{}: helm upgrade applied the ClusterSet CRD's current schema",
            cluster.name()
        );
    }
    assert_eq!(
        leader_set_uid(leader).await,
        prod_uid,
        "the ClusterSet kept across the CRD upgrade"
    );
    assert_members_kept(leader, &(ids.clone(), requests), "the upgrade").await;
    step(
        start,
        "no pod was ever refused by RBAC (each runs with exactly its chart's rules)",
    );
    assert_no_denials(leader, "tether-leader").await;
    for (_, cluster, _) in members {
        assert_no_denials(cluster, "tether-agent").await;
    }

    step(
        start,
        "helm 3 uninstall tether-agent in west, without tether leave first",
    );
    let (_, west, helm3) = members.iter().find(|m| m.0 == "west").expect("west");
    helm3.ok(
        west,
        &[
            "uninstall",
            "tether-agent",
            "-n",
            NAMESPACE,
            "--wait",
            "--timeout",
            "3m",
        ],
    );
    let sets = Api::<ClusterSet>::namespaced(west.client().expect("client"), NAMESPACE)
        .list(&Default::default())
        .await
        .expect("list sets");
    assert!(
        sets.items.is_empty(),
        "no ClusterSet (and so no finalizer) is left in west: {:?}",
        sets.items
            .iter()
            .map(|s| (s.name_any(), s.finalizers().to_vec()))
            .collect::<Vec<_>>()
    );
    assert!(
        chart_pods(west, "tether-agent").await.is_empty(),
        "no agent pod left"
    );
    let hook_pods = text(&shell(
        west,
        &format!("kubectl -n {NAMESPACE} get pods,jobs -o name"),
    ));
    assert!(
        !hook_pods.contains("tether-agent-leave"),
        "the hook Job cleaned up after itself: {hook_pods}"
    );
    eventually(
        "west is removed at the leader",
        Duration::from_secs(60),
        || async {
            let members = ready_members(leader).await;
            let (ids, _) = pods::identities(leader).await;
            if ids.keys().any(|k| k == "west") {
                Err(format!("{members:?}"))
            } else {
                Ok(())
            }
        },
    )
    .await;
    assert_eq!(
        ready_members(leader).await,
        vec![("east".to_string(), "1/1".to_string())],
        "east is untouched"
    );

    step(
        start,
        "helm uninstall tether-leader refuses while east is a member (its pre-delete hook)",
    );
    let uninstall_leader = [
        "uninstall",
        "tether-leader",
        "-n",
        NAMESPACE,
        "--wait",
        "--timeout",
        "3m",
    ];
    let refused = Helm::v4().run(leader, &uninstall_leader);
    assert!(!refused.status.success(), "{}", text(&refused));
    let why = text(&shell(
        leader,
        &format!("kubectl -n {NAMESPACE} logs job/tether-leader-uninstall"),
    ));
    assert!(
        why.contains("has 1 member(s): east") && why.contains("tether destroy"),
        "{why}"
    );
    assert_chart_pods(leader, "tether-leader", 2, &new_image).await;

    step(
        start,
        "the documented order: helm uninstall tether-agent in east, then tether-leader",
    );
    let (_, east, helm4) = members.iter().find(|m| m.0 == "east").expect("east");
    helm4.ok(
        east,
        &[
            "uninstall",
            "tether-agent",
            "-n",
            NAMESPACE,
            "--wait",
            "--timeout",
            "3m",
        ],
    );
    eventually(
        "east is removed at the leader",
        Duration::from_secs(60),
        || async {
            let (ids, _) = pods::identities(leader).await;
            if ids.is_empty() {
                Ok(())
            } else {
                Err(format!("{ids:?}"))
            }
        },
    )
    .await;
    Helm::v4().ok(leader, &uninstall_leader);

    step(
        start,
        "nothing Tether created is left in the leader or the members",
    );
    let mine = "-l app.kubernetes.io/managed-by=tether-leader";
    for (cluster, line) in [
        (leader, "kubectl get clustersets,managedclusters,clusterregistrationrequests,memberclusterannounces -A -o name".to_string()),
        (leader, format!("kubectl get namespaces {mine} -o name")),
        (leader, format!("kubectl -n kube-public get configmaps,roles,rolebindings {mine} -o name")),
        (leader, format!("kubectl -n {NAMESPACE} get secrets,serviceaccounts,roles,rolebindings,deployments,jobs -o name")),
        (leader, format!("kubectl -n {NAMESPACE} get endpointslices -l endpointslice.kubernetes.io/managed-by=tether-leader -o name")),
        (leader, "kubectl -n kube-system get secrets -l multicluster.tether.dev/clusterset -o name".to_string()),
        // NB: the CRDs stay (Helm never deletes them), and with them the API server's own
        // local APIService of their group; the member-access one must be gone.
        (leader, "kubectl get apiservice v1alpha1.proxy.multicluster.tether.dev --ignore-not-found -o name".to_string()),
        (east, "kubectl get clustersets,clusterproperties -A -o name".to_string()),
        (east, format!("kubectl -n {NAMESPACE} get secrets,deployments,jobs -o name")),
        (west, "kubectl get clustersets,clusterproperties -A -o name".to_string()),
        (west, format!("kubectl -n {NAMESPACE} get secrets,deployments,jobs -o name")),
    ] {
        let out = shell(cluster, &line);
        let listed = String::from_utf8_lossy(&out.stdout).to_string();
        let left: Vec<&str> = listed
            .lines()
            .filter(|l| l.contains("tether") && !l.contains("clusterproperty.about.k8s.io/cluster.clusterset.k8s.io"))
            .collect();
        assert!(out.status.success() && left.is_empty(), "{}: `{line}` lists {left:?}: {}", cluster.name(), text(&out));
    }
    step(start, "done");
}
