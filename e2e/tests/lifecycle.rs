//! The leader cluster stays healthy while no leader replica serves member access: with the only
//! replica stopped as a scale to 0 stops it (SIGTERM) for 3 minutes, the serving replica has
//! withdrawn the APIService, so `kubectl delete namespace` of an unrelated namespace completes
//! within 30 s (the namespace controller waits on discovery of every API group) and `helm
//! upgrade` of an unrelated release works; when a replica serves again, the APIService is back
//! and the member's tunnel attaches again.

use std::process::{ExitCode, Output};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, ObjectMeta, PostParams};
use kube::core::GroupVersionKind;
use serde_json::json;
use tether_e2e::access::wait_tunnel;
use tether_e2e::fleet::{self, LeaderSide, policy};
use tether_e2e::sim::join_token;
use tether_testkit::{TestCluster, Tools, eventually, free_port, lab};

/// How long the leader stays down.
const OUTAGE: Duration = Duration::from_secs(180);
/// How long an unrelated namespace may take to go meanwhile.
const DELETE_WITHIN: Duration = Duration::from_secs(30);

fn main() -> ExitCode {
    tether_e2e::lab_main(
        "the leader-lifecycle test",
        "the_leader_cluster_stays_healthy_while_no_leader_replica_serves",
        lifecycle,
    )
}

fn step(what: &str) {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let t = START.get_or_init(Instant::now).elapsed();
    eprintln!("== [{:6.1}s] {what}", t.as_secs_f64());
}

fn apiservices(admin: &Client) -> Api<DynamicObject> {
    Api::all_with(
        admin.clone(),
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("apiregistration.k8s.io", "v1", "APIService"),
            "apiservices",
        ),
    )
}

async fn registered(admin: &Client) -> bool {
    apiservices(admin)
        .get_opt(tether_tunnel::API_SERVICE)
        .await
        .expect("read APIServices")
        .is_some()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Creates namespace `name` with a ConfigMap in it, then deletes it with kubectl as a user
/// types it and returns how long that took.
async fn delete_namespace(leader: &LeaderSide, name: &str) -> Duration {
    Api::<Namespace>::all(leader.admin.clone())
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: ObjectMeta {
                    name: Some(name.into()),
                    ..ObjectMeta::default()
                },
                ..Namespace::default()
            },
        )
        .await
        .expect("namespace");
    Api::<ConfigMap>::namespaced(leader.admin.clone(), name)
        .create(
            &PostParams::default(),
            &ConfigMap {
                metadata: ObjectMeta {
                    name: Some("data".into()),
                    ..ObjectMeta::default()
                },
                ..ConfigMap::default()
            },
        )
        .await
        .expect("configmap");
    let started = Instant::now();
    let mut kubectl = leader.cluster.kubectl().expect("kubectl");
    kubectl.args([
        "delete",
        "namespace",
        name,
        &format!("--timeout={}s", DELETE_WITHIN.as_secs()),
    ]);
    let out = tokio::task::spawn_blocking(move || kubectl.output())
        .await
        .expect("join")
        .expect("run kubectl");
    let took = started.elapsed();
    assert!(
        out.status.success(),
        "kubectl delete namespace {name} within {DELETE_WITHIN:?}: {}",
        text(&out)
    );
    took
}

fn helm(leader: &LeaderSide, chart: &std::path::Path, args: &[&str]) -> Output {
    let tmp = std::env::temp_dir();
    std::process::Command::new(Tools::locate().expect("tools").path("helm"))
        .args(args)
        .arg(chart)
        .arg(format!("--kubeconfig={}", leader.cluster.kubeconfig().display()))
        .env("HELM_CACHE_HOME", tmp.join("tether-helm-cache"))
        .env("HELM_CONFIG_HOME", tmp.join("tether-helm-config"))
        .env("HELM_DATA_HOME", tmp.join("tether-helm-data"))
        .output()
        .expect("run helm")
}

async fn lifecycle() {
    let cluster = TestCluster::builder("lifecycle-leader")
        .controller_manager(true)
        .start()
        .await
        .expect("leader cluster");
    let addr = std::net::SocketAddr::from((lab::GATEWAY, free_port().expect("port")));
    let proxy_args = fleet::proxy_args(addr, 4, &[]);
    let mut leader = LeaderSide::on(cluster)
        .policy(policy("2s", "8s"))
        .proxy(addr, 4)
        .start()
        .await;
    let token = join_token(&leader.admin).await;
    let _east = fleet::member("east", &leader, &token, json!({})).await;
    step("the serving replica registers the APIService; east's tunnel attaches");
    wait_tunnel(&leader, "east", "True").await;
    assert!(registered(&leader.admin).await);

    let chart = tempfile::tempdir().expect("tmp");
    std::fs::create_dir_all(chart.path().join("templates")).expect("chart dir");
    std::fs::write(
        chart.path().join("Chart.yaml"),
        "apiVersion: v2\nname: unrelated\nversion: 0.1.0\n",
    )
    .expect("Chart.yaml");
    std::fs::write(
        chart.path().join("templates/cm.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: unrelated\ndata:\n  v: {{ .Values.v | default \"1\" | quote }}\n",
    )
    .expect("template");
    let out = helm(
        &leader,
        chart.path(),
        &["upgrade", "--install", "unrelated", "-n", "default"],
    );
    assert!(out.status.success(), "helm install: {}", text(&out));

    step("the only leader replica stops (SIGTERM, as a scale to 0 does) and withdraws the APIService");
    let stopped = Instant::now();
    leader.controller.terminate();
    eventually("the APIService is withdrawn", Duration::from_secs(10), || async {
        if registered(&leader.admin).await {
            Err("still registered".to_string())
        } else {
            Ok(())
        }
    })
    .await;

    step("meanwhile an unrelated namespace is deleted and an unrelated release upgraded");
    let first = delete_namespace(&leader, "scratch-1").await;
    let out = helm(
        &leader,
        chart.path(),
        &["upgrade", "unrelated", "-n", "default", "--set", "v=2"],
    );
    assert!(out.status.success(), "helm upgrade: {}", text(&out));
    // The second one near the end of the outage, with the leader gone for minutes.
    tokio::time::sleep(OUTAGE.saturating_sub(stopped.elapsed() + Duration::from_secs(15))).await;
    let last = delete_namespace(&leader, "scratch-2").await;
    tokio::time::sleep(OUTAGE.saturating_sub(stopped.elapsed())).await;
    eprintln!(
        "with no leader replica for {:?}: namespaces deleted in {first:?} and {last:?} (at most {DELETE_WITHIN:?}); helm upgrade worked",
        stopped.elapsed()
    );

    step("a replica serves again: the APIService is back and east's tunnel attaches again");
    leader.controller = leader.start_replica("leader-b", &proxy_args).await;
    eventually(
        "the APIService is registered again",
        Duration::from_secs(60),
        || async {
            if registered(&leader.admin).await {
                Ok(())
            } else {
                Err("not registered".to_string())
            }
        },
    )
    .await;
    wait_tunnel(&leader, "east", "True").await;
}
