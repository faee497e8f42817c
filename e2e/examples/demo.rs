//! `make demo`: a local leader + two members sandbox that keeps running after this program exits
//! (in `.sandbox/`), with live data to look at. `make demo-down` stops it.

use std::path::Path;
use std::time::Instant;

use tether_e2e::demo::{self, step};

#[tokio::main]
async fn main() {
    let start = Instant::now();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let repo = std::fs::canonicalize(&repo).unwrap_or(repo);
    let root = repo.join(".sandbox");
    if root.exists()
        && std::fs::read_dir(&root)
            .map(|mut d| d.next().is_some())
            .unwrap_or(false)
    {
        eprintln!("A sandbox already exists in .sandbox/: stop it first with `make demo-down`.");
        std::process::exit(1);
    }
    eprintln!(
        "Tether sandbox: one leader and two member clusters on this machine (real etcd + kube-apiserver).\n\
         Pods cannot run here, so the controllers run as local processes with the tokens of the\n\
         ServiceAccounts that `helm install` created: exactly the charts' RBAC.\n"
    );
    let sandbox = demo::up(Some(&root), &[("east", 3), ("west", 2)]).await;
    let leader_kubeconfig = sandbox.leader.cluster.kubeconfig().to_path_buf();
    println!(
        "\n$ kubectl get clusterset -A\n{}",
        demo::kubectl(&sandbox.leader.cluster, &["get", "clusterset", "-A"])
    );
    println!(
        "$ kubectl get mcls -A -o wide\n{}",
        demo::kubectl(&sandbox.leader.cluster, &["get", "mcls", "-A", "-o", "wide"])
    );
    let mut env = format!("LEADER_KUBECONFIG={}\n", leader_kubeconfig.display());
    let mut members = String::new();
    for (name, site) in &sandbox.members {
        env.push_str(&format!(
            "{}_KUBECONFIG={}\n",
            name.to_uppercase(),
            site.cluster.kubeconfig().display()
        ));
        members.push_str(&format!("  {name}: {}\n", site.cluster.kubeconfig().display()));
    }
    let first = sandbox
        .members
        .first()
        .map(|(n, s)| (n.clone(), s.cluster.kubeconfig().to_path_buf()));
    // Keep everything running after we exit.
    sandbox.leader.controller.detach();
    sandbox.leader.cluster.detach();
    for (_, site) in sandbox.members {
        site.controller.detach();
        site.cluster.detach();
    }
    let _ = std::fs::write(root.join("env"), env);
    step(start, "sandbox is up");
    println!(
        "The sandbox keeps running. Kubeconfigs:\n  leader: {}\n{members}",
        leader_kubeconfig.display()
    );
    println!("Try next:");
    println!("  export KUBECONFIG={}", leader_kubeconfig.display());
    println!("  kubectl get mcls -A -w                       # live member status");
    println!("  target/debug/tether status                   # the set and its members");
    if let Some((name, kc)) = first {
        println!(
            "  target/debug/tether --kubeconfig {} leave   # {name} leaves",
            kc.display()
        );
    }
    println!("  (variables for all of them: .sandbox/env)");
    println!(
        "Stop it: make demo-down\nTotal time: {:.0}s",
        start.elapsed().as_secs_f64()
    );
}
