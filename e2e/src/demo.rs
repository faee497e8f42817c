//! The sandbox flow behind `make demo` and its e2e test: a leader and two member clusters on the
//! real control plane, both charts installed with `helm install` as a user would, the controllers
//! run as local processes with tokens of the chart-created ServiceAccounts (pods cannot run
//! here), `tether init`, and each member joined by the agent chart alone.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use kube::Client;
use kube::api::Api;
use tether_api::ManagedCluster;
use tether_testkit::{Controller, TestCluster, Tools, eventually, token_kubeconfig};

use crate::fleet::add_node;
use crate::service_account_token_for;

/// Namespace both charts are installed in.
pub const NAMESPACE: &str = "tether-system";
/// Lifetime of the controllers' ServiceAccount tokens in the sandbox.
const TOKEN_SECONDS: i64 = 7 * 24 * 3600;

/// One cluster of the sandbox and its controller.
pub struct Site {
    /// The cluster.
    pub cluster: TestCluster,
    /// Admin client.
    pub admin: Client,
    /// Its Tether controller (leader or agent).
    pub controller: Controller,
}

/// The running sandbox.
pub struct Sandbox {
    /// The leader.
    pub leader: Site,
    /// The members, by name.
    pub members: Vec<(String, Site)>,
    /// What `tether init` printed.
    pub init_output: String,
}

/// Prints a step with the time since `start`.
pub fn step(start: Instant, what: &str) {
    eprintln!("[{:>5.1}s] {what}", start.elapsed().as_secs_f64());
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn helm(cluster: &TestCluster, args: &[&str]) -> Output {
    let helm = Tools::locate().expect("tools").path("helm");
    std::process::Command::new(helm)
        .args(args)
        .arg(format!("--kubeconfig={}", cluster.kubeconfig().display()))
        .current_dir(repo())
        .output()
        .expect("run helm")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

async fn run_as(cluster: &TestCluster, sa: &str, args: &[&str]) -> Controller {
    let admin = cluster.client().expect("admin");
    let token = service_account_token_for(&admin, NAMESPACE, sa, TOKEN_SECONDS)
        .await
        .expect("token of the chart's ServiceAccount");
    let kubeconfig = token_kubeconfig(cluster, sa, &token).expect("kubeconfig");
    Controller::start(cluster, sa, &kubeconfig, args).expect("controller")
}

/// Brings the sandbox up under `root` (None: the test harness's temporary folders).
pub async fn up(root: Option<&Path>, members: &[(&str, usize)]) -> Sandbox {
    let start = Instant::now();
    let builder = |name: &str, kcm: bool| {
        let b = TestCluster::builder(name).controller_manager(kcm);
        match root {
            Some(r) => b.root(r),
            None => b,
        }
    };
    step(
        start,
        &format!(
            "starting {} clusters (etcd + kube-apiserver [+ kube-controller-manager])",
            members.len() + 1
        ),
    );
    let leader = builder("leader", true).start();
    let member_clusters = futures::future::join_all(members.iter().map(|(n, _)| builder(n, false).start()));
    let (leader, member_clusters) = futures::join!(leader, member_clusters);
    let leader = leader.expect("leader cluster");

    step(
        start,
        "helm install tether-leader charts/tether-leader -n tether-system --create-namespace",
    );
    let o = helm(
        &leader,
        &[
            "install",
            "tether-leader",
            "charts/tether-leader",
            "-n",
            NAMESPACE,
            "--create-namespace",
        ],
    );
    assert!(o.status.success(), "helm install tether-leader: {}", text(&o));
    step(
        start,
        "running the leader controller as the chart's ServiceAccount tether-leader (pods cannot run here)",
    );
    let leader_proc = run_as(&leader, "tether-leader", &["leader", "--leader-elect=false"]).await;

    step(start, "tether init --clusterset prod");
    let cli = tether_testkit::controller::binary("tether").expect("tether binary");
    let init = tokio::process::Command::new(cli)
        .args([
            "--kubeconfig",
            &leader.kubeconfig().display().to_string(),
            "init",
            "--clusterset",
            "prod",
        ])
        .output()
        .await
        .expect("tether init");
    let init_output = text(&init);
    assert!(init.status.success(), "tether init: {init_output}");
    let line = init_output
        .lines()
        .find(|l| l.contains("--set leader.token="))
        .expect("helm line")
        .to_string();
    let value = |key: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{key}=")))
            .map(str::to_string)
            .unwrap_or_default()
    };
    let (url, token, hash) = (
        value("leader.url"),
        value("leader.token"),
        value("leader.caCertHash"),
    );

    let mut sites = vec![];
    for ((name, nodes), cluster) in members.iter().zip(member_clusters) {
        let cluster = cluster.expect("member cluster");
        let admin = cluster.client().expect("admin");
        for i in 0..*nodes {
            add_node(&admin, &format!("{name}-node-{i}"), "8", "32Gi").await;
        }
        step(
            start,
            &format!(
                "helm install tether-agent charts/tether-agent (in {name}, with the values init printed)"
            ),
        );
        let sets = [
            format!("leader.url={url}"),
            format!("leader.token={token}"),
            format!("leader.caCertHash={hash}"),
            format!("cluster.name={name}"),
            format!("cluster.labels.site={name}"),
        ];
        let mut args = vec![
            "install",
            "tether-agent",
            "charts/tether-agent",
            "-n",
            NAMESPACE,
            "--create-namespace",
        ];
        for s in &sets {
            args.push("--set");
            args.push(s);
        }
        let o = helm(&cluster, &args);
        assert!(o.status.success(), "helm install tether-agent: {}", text(&o));
        step(
            start,
            &format!("running the agent of {name} as the chart's ServiceAccount tether-agent"),
        );
        let agent = run_as(
            &cluster,
            "tether-agent",
            &["agent", "--leader-elect=false", "--lease-namespace=tether-system"],
        )
        .await;
        sites.push((
            name.to_string(),
            Site {
                cluster,
                admin,
                controller: agent,
            },
        ));
    }

    step(start, "waiting until every member is Ready at the leader");
    let leader_admin = leader.client().expect("admin");
    for (name, nodes) in members {
        let mcs = Api::<ManagedCluster>::namespaced(leader_admin.clone(), &crate::sim::ns_of(name));
        let want = format!("{nodes}/{nodes}");
        eventually(
            &format!("{name} Ready with {want} nodes"),
            Duration::from_secs(120),
            || async {
                let mc = mcs.get(name).await.map_err(|e| e.to_string())?;
                let st = mc.status.clone().unwrap_or_default();
                let ready = st
                    .conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True");
                let n = st.nodes.map(|n| n.summary).unwrap_or_default();
                if ready && n == want {
                    Ok(())
                } else {
                    Err(format!("ready={ready} nodes={n}"))
                }
            },
        )
        .await;
    }
    let sets = Api::<tether_api::ClusterSet>::namespaced(leader_admin.clone(), NAMESPACE);
    let total = members.len() as i32;
    eventually(
        "the ClusterSet to count every member Ready",
        Duration::from_secs(30),
        || async {
            let c = sets
                .get("prod")
                .await
                .map_err(|e| e.to_string())?
                .status
                .and_then(|s| s.members);
            match c {
                Some(c) if c.total == total && c.ready == total => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    step(start, "ready");
    Sandbox {
        leader: Site {
            cluster: leader,
            admin: leader_admin,
            controller: leader_proc,
        },
        members: sites,
        init_output,
    }
}

/// `kubectl <args>` against `cluster`, as text.
pub fn kubectl(cluster: &TestCluster, args: &[&str]) -> String {
    let mut cmd = cluster.kubectl().expect("kubectl");
    let o = cmd.args(args).output().expect("run kubectl");
    text(&o)
}
