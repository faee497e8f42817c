//! `make demo`: a local leader + two members sandbox of real pods that keeps running after this
//! program exits (in `.sandbox/`). Each cluster has a real node (containerd, kubelet,
//! kube-proxy) that runs the project's image; both charts are installed with `helm install`, and
//! the agents join with the values `tether init` printed. `make demo-down` (`-- down`) stops it.
//!
//! Everything lives in a network namespace of its own (the lab, `tether_testkit::lab`), so the
//! sandbox writes `.sandbox/bin/{kubectl,helm,tether}`: wrappers that run the real tools inside
//! it. `source .sandbox/env` puts them first on PATH.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use tether_e2e::pods::{self, Helm, step};
use tether_testkit::{TestCluster, Tools};

fn main() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let repo = std::fs::canonicalize(&repo).unwrap_or(repo);
    let root = repo.join(".sandbox");
    if std::env::args().nth(1).as_deref() == Some("down") {
        down(&root);
        return;
    }
    if root.exists()
        && std::fs::read_dir(&root)
            .map(|mut d| d.next().is_some())
            .unwrap_or(false)
    {
        eprintln!("A sandbox already exists in .sandbox/: stop it first with `make demo-down`.");
        std::process::exit(1);
    }
    if let Err(err) = tether_testkit::lab::enter() {
        eprintln!(
            "error: the sandbox cannot start its nodes: {err}\n\
             It runs containerd, kubelet and kube-proxy in network, mount and cgroup namespaces of \
             its own; that needs root and `make tools` (which installs containerd, runc and the \
             CNI plugins)."
        );
        std::process::exit(1);
    }
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    runtime.block_on(up(&repo, &root));
}

async fn up(repo: &Path, root: &Path) {
    let start = Instant::now();
    eprintln!(
        "Tether sandbox: one leader and two member clusters on this machine, each a real control \
         plane with a real node\nrunning the image from `make image` (no registry, no daemon).\n"
    );
    std::fs::create_dir_all(root.join("bin")).expect("create .sandbox/bin");
    // A process that holds the lab's network namespace for the wrappers to enter.
    let holder = Command::new("sleep")
        .arg("infinity")
        .spawn()
        .expect("start the lab holder");
    std::fs::write(root.join("lab.pid"), holder.id().to_string()).expect("write lab.pid");
    write_wrappers(repo, root);

    let fleet = pods::up(
        Some(root),
        &[("east", Helm::v4()), ("west", Helm::v4())],
        pods::LeaderInstall::default(),
        start,
    )
    .await;
    let leader = &fleet.leader;
    step(
        start,
        "member access: the leader's admin may view each member through the leader",
    );
    for (name, cluster, helm) in &fleet.members {
        pods::allow_leader_admin(leader, name, cluster, helm, "view", &[]).await;
    }
    for cmd in [
        "kubectl get clusterset -A",
        "kubectl get mcls -A -o wide",
        "tether --cluster east -- get pods -A",
    ] {
        println!("\n$ {cmd}\n{}", pods::text(&pods::shell(leader, cmd)));
    }
    let clusters: Vec<&TestCluster> = std::iter::once(leader)
        .chain(fleet.members.iter().map(|m| &m.1))
        .collect();
    for c in &clusters {
        println!(
            "$ kubectl --context {} get pods -A -o wide\n{}",
            c.name(),
            pods::text(&pods::shell(c, "kubectl get pods -A -o wide"))
        );
    }
    let mut env = format!(
        "# source .sandbox/env: the tools below run inside the sandbox's network namespace\nexport PATH={}:$PATH\n",
        root.join("bin").display()
    );
    let kubeconfigs: Vec<String> = clusters
        .iter()
        .map(|c| c.kubeconfig().display().to_string())
        .collect();
    env.push_str(&format!("export KUBECONFIG={}\n", kubeconfigs.join(":")));
    for c in &clusters {
        env.push_str(&format!(
            "export {}_KUBECONFIG={}\n",
            c.name().to_uppercase(),
            c.kubeconfig().display()
        ));
    }
    std::fs::write(root.join("env"), env).expect("write .sandbox/env");
    std::mem::forget(holder);
    let PodFleetParts { leader, members } = PodFleetParts::from(fleet);
    leader.detach();
    for m in members {
        m.detach();
    }
    step(start, "sandbox is up");
    println!("The sandbox keeps running. Try next:");
    println!("  source .sandbox/env                              # kubectl, helm, tether enter the sandbox");
    println!("  kubectl config get-contexts                      # leader, east, west");
    println!("  kubectl --context leader get mcls -A -w          # live member status");
    println!("  kubectl --context east -n tether-system logs deploy/tether-agent");
    println!("  tether --context leader status");
    println!(
        "  tether --context leader --cluster west -- get pods -A   # kubectl to a member, through the leader"
    );
    println!("  helm --kube-context west -n tether-system uninstall tether-agent   # west leaves");
    println!(
        "Stop it: make demo-down\nTotal time: {:.0}s",
        start.elapsed().as_secs_f64()
    );
}

struct PodFleetParts {
    leader: TestCluster,
    members: Vec<TestCluster>,
}

impl From<pods::PodFleet> for PodFleetParts {
    fn from(f: pods::PodFleet) -> Self {
        Self {
            leader: f.leader,
            members: f.members.into_iter().map(|m| m.1).collect(),
        }
    }
}

/// `.sandbox/bin/<tool>`: runs the real tool inside the lab's network namespace.
fn write_wrappers(repo: &Path, root: &Path) {
    let tools = Tools::locate().expect("tools");
    let tether = tether_testkit::controller::binary("tether").expect("tether binary");
    let bins: [(&str, PathBuf); 4] = [
        ("kubectl", tools.path("kubectl")),
        ("helm", tools.path("helm")),
        ("helm3", tools.path("helm3")),
        ("tether", tether),
    ];
    for (name, bin) in bins {
        let path = root.join("bin").join(name);
        let script = format!(
            "#!/bin/sh\n# Runs {name} inside the Tether sandbox's network namespace (made by `make demo`).\n\
             pid=$(cat {lab}) && [ -d /proc/\"$pid\" ] || {{ echo 'the sandbox is not running: make demo' >&2; exit 1; }}\n\
             cd {repo} 2>/dev/null; exec nsenter --net=/proc/\"$pid\"/ns/net -- {bin} \"$@\"\n",
            lab = root.join("lab.pid").display(),
            repo = repo.display(),
            bin = bin.display(),
        );
        std::fs::write(&path, script).expect("write wrapper");
        let _ = Command::new("chmod").arg("+x").arg(&path).status();
    }
}

/// Stops the sandbox: its nodes (pods included, through their cgroups), every process it
/// recorded, the lab holder, and removes `.sandbox`.
fn down(root: &Path) {
    // Nodes first, even without `.sandbox`: their cgroups outlive a deleted folder.
    tether_testkit::node::kill_sandbox_nodes();
    if !root.exists() {
        println!("no sandbox running");
        return;
    }
    let mut pids = Vec::new();
    for dir in std::fs::read_dir(root).into_iter().flatten().flatten() {
        let children = std::fs::read_to_string(dir.path().join("children")).unwrap_or_default();
        pids.extend(children.lines().map(str::trim).map(str::to_string));
    }
    if let Ok(holder) = std::fs::read_to_string(root.join("lab.pid")) {
        pids.push(holder.trim().to_string());
    }
    for signal in ["-TERM", "-KILL"] {
        for pid in &pids {
            let _ = Command::new("kill")
                .arg(signal)
                .arg(pid)
                .stderr(std::process::Stdio::null())
                .status();
        }
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
    let _ = std::fs::remove_dir_all(root);
    println!("sandbox stopped");
}
