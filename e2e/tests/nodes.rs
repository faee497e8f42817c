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

fn main() -> ExitCode {
    tether_e2e::lab_main(
        "the node tier",
        "charts_run_as_real_pods_join_fail_over_upgrade_and_uninstall_cleanly",
        real_pods,
    )
}

async fn lease_holder(cluster: &TestCluster, lease: &str) -> String {
    Api::<Lease>::namespaced(cluster.client().expect("client"), NAMESPACE)
        .get(lease)
        .await
        .ok()
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .unwrap_or_default()
}

/// Both members are Ready with the same ManagedCluster UIDs and registration count as `before`:
/// nobody was lost or registered again across `what`.
async fn assert_members_kept(leader: &TestCluster, before: &(BTreeMap<String, String>, usize), what: &str) {
    assert_eq!(ready_members(leader).await.len(), 2, "no member lost in {what}");
    assert_eq!(
        &pods::identities(leader).await,
        before,
        "no second registration in {what}"
    );
}

/// No log line of any pod of `app` (debug level since the upgrade, so every API error is logged)
/// shows a 403: the chart's RBAC is all the controllers need.
async fn assert_no_denials(cluster: &TestCluster, app: &str) {
    let pods: Api<Pod> = Api::namespaced(cluster.client().expect("client"), NAMESPACE);
    let running = chart_pods(cluster, app).await;
    assert!(!running.is_empty(), "{app} pods in {}", cluster.name());
    for (name, _, _) in running {
        let log = pods
            .logs(&name, &Default::default())
            .await
            .unwrap_or_else(|e| panic!("logs of {name}: {e}"));
        assert!(
            !log.is_empty() && !log.contains("orbidden") && !log.contains("\"code\":403"),
            "{app} pod {name} in {} needed more than its chart's RBAC (or logged nothing):\n{log}",
            cluster.name()
        );
    }
}

/// Every pod of a chart is Running and Ready, `want` of them, all running `image`, under the
/// charted security context.
async fn assert_chart_pods(cluster: &TestCluster, app: &str, want: usize, image: &str) {
    eventually(
        &format!("{want} Ready {app} pods running {image}"),
        Duration::from_secs(120),
        || async {
            let pods = chart_pods(cluster, app).await;
            let good = pods
                .iter()
                .filter(|(_, ready, p)| {
                    *ready
                        && p.spec
                            .as_ref()
                            .is_some_and(|s| s.containers[0].image.as_deref() == Some(image))
                })
                .count();
            if good == want && pods.len() == want {
                Ok(pods)
            } else {
                Err(pods
                    .iter()
                    .map(|(n, r, _)| format!("{n} ready={r}"))
                    .collect::<Vec<_>>())
            }
        },
    )
    .await;
    for (name, _, pod) in chart_pods(cluster, app).await {
        let spec = pod.spec.expect("spec");
        let psc = spec.security_context.expect("pod securityContext");
        assert_eq!(psc.run_as_non_root, Some(true), "{name}");
        // The leader's pods run under the UID a restricted SCC assigns, with no fixed group
        // (pods::RESTRICTED_LEADER_VALUES); the agents' under the chart's default.
        let (uid, gid) = if app == "tether-leader" {
            (pods::RESTRICTED_UID, None)
        } else {
            (65532, Some(65532))
        };
        assert_eq!((psc.run_as_user, psc.run_as_group), (Some(uid), gid), "{name}");
        assert_eq!(
            psc.seccomp_profile.map(|s| s.type_).as_deref(),
            Some("RuntimeDefault"),
            "{name}"
        );
        let csc = spec.containers[0]
            .security_context
            .clone()
            .expect("container securityContext");
        assert_eq!(csc.read_only_root_filesystem, Some(true), "{name}");
        assert_eq!(csc.allow_privilege_escalation, Some(false), "{name}");
        assert_eq!(
            csc.capabilities.and_then(|c| c.drop).unwrap_or_default(),
            vec!["ALL".to_string()],
            "{name}"
        );
        let status = pod.status.expect("status");
        let restarts: i32 = status
            .container_statuses
            .unwrap_or_default()
            .iter()
            .map(|c| c.restart_count)
            .sum();
        assert_eq!(restarts, 0, "{name} restarted: its probes or start-up failed");
    }
}

/// The UID of the leader's ClusterSet `prod`.
async fn leader_set_uid(leader: &TestCluster) -> Option<String> {
    Api::<ClusterSet>::namespaced(leader.client().expect("client"), NAMESPACE)
        .get("prod")
        .await
        .expect("ClusterSet prod")
        .metadata
        .uid
}

/// With `check` true, whether the ClusterSet CRD's schema has `spec.leader.bannedClusterIDs`;
/// with `check` false, removes that field from the schema, as an older release's CRD lacked it.
async fn set_banned_field(cluster: &TestCluster, check: bool) -> bool {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crds = Api::<CustomResourceDefinition>::all(cluster.client().expect("client"));
    let name = "clustersets.multicluster.tether.dev";
    let crd = crds.get(name).await.expect("ClusterSet CRD");
    let mut v = serde_json::to_value(&crd).expect("json");
    let leader = &mut v["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        ["leader"]["properties"];
    if check {
        return leader.get("bannedClusterIDs").is_some();
    }
    leader
        .as_object_mut()
        .expect("leader properties")
        .remove("bannedClusterIDs");
    let older: CustomResourceDefinition = serde_json::from_value(v).expect("crd");
    crds.replace(name, &Default::default(), &older)
        .await
        .expect("an older CRD");
    true
}

/// Runs every command a chart's NOTES.txt prints for this release, as printed.
fn run_notes(cluster: &TestCluster, helm: &Helm, release: &str) {
    let notes = helm.ok(cluster, &["get", "notes", release, "-n", NAMESPACE]);
    let commands: Vec<&str> = notes
        .lines()
        .map(|l| l.trim().split("  #").next().unwrap_or_default().trim())
        .filter(|l| l.starts_with("kubectl ") || l.starts_with("tether "))
        .collect();
    assert!(commands.len() >= 3, "{release} NOTES print commands:\n{notes}");
    for cmd in commands {
        if cmd.ends_with(" -w") {
            // A watch runs until stopped: it must print the set first.
            let mut words = pods::words(cmd);
            words.push("--request-timeout=3s".into());
            let o = shell(cluster, &words.join(" "));
            assert!(text(&o).contains("prod"), "`{cmd}` printed: {}", text(&o));
            continue;
        }
        let o = shell(cluster, cmd);
        assert!(
            o.status.success(),
            "`{cmd}` from {release}'s NOTES failed: {}",
            text(&o)
        );
        assert!(!o.stdout.is_empty(), "`{cmd}` printed nothing");
    }
}

/// Member access through the leader's pods: the leading replica serves the proxy API, both
/// agents' tunnels attach, and the leader's admin reaches a real pod of east with kubectl exec,
/// logs and port-forward, as the allow-listed `tether:prod:tether-admin` that east's RBAC binds.
async fn member_access(start: Instant, leader: &TestCluster, members: &[(String, TestCluster, Helm)]) {
    step(
        start,
        "member access: both tunnels attach to the leading leader pod",
    );
    eventually(
        "TUNNEL TunnelAttached for east and west",
        Duration::from_secs(90),
        || async {
            let table = text(&shell(leader, "kubectl get mcls -A -o wide"));
            if table.matches("TunnelAttached").count() == 2 {
                Ok(())
            } else {
                Err(table)
            }
        },
    )
    .await;
    let (_, east, helm) = members.iter().find(|m| m.0 == "east").expect("east");
    step(
        start,
        "  east allows the leader's admin: helm upgrade --set proxy.impersonate.users={tether-admin}",
    );
    // NB: the kube client's debug lines (one per heartbeat) give `kubectl attach` output to see.
    let agent_pod = pods::allow_leader_admin(
        leader,
        "east",
        east,
        helm,
        "cluster-admin",
        &["logLevel=info\\,kube_client=debug"],
    )
    .await;
    // kubectl 1.34 speaks WebSockets to the API server and falls back to SPDY; with the
    // fallback forced, each upgrade is proven over both.
    for (protocol, env) in [
        ("WebSocket", ""),
        ("SPDY", "KUBECTL_REMOTE_COMMAND_WEBSOCKETS=false "),
    ] {
        step(
            start,
            &format!("  kubectl exec through the leader into east's agent pod ({protocol})"),
        );
        let o = shell(
            leader,
            &format!(
                "{env}tether --cluster east -- exec -n {NAMESPACE} {agent_pod} -- /usr/local/bin/tether --version"
            ),
        );
        assert!(
            o.status.success() && text(&o).contains("tether"),
            "exec over {protocol}: {}",
            text(&o)
        );
    }
    step(
        start,
        "  pass-through: kubectl exec as a member token of east (--member-token-file)",
    );
    for cmd in [
        "kubectl create serviceaccount ops -n default",
        "kubectl create clusterrolebinding ops --clusterrole=cluster-admin --serviceaccount=default:ops",
    ] {
        let o = shell(east, cmd);
        assert!(o.status.success(), "{cmd}: {}", text(&o));
    }
    let o = shell(east, "kubectl create token ops -n default");
    assert!(o.status.success(), "member token: {}", text(&o));
    let token_file = east.dir().join("ops.token");
    std::fs::write(&token_file, &o.stdout).expect("token file");
    let o = shell(
        leader,
        &format!(
            "tether --cluster east --member-token-file {} -- exec -n {NAMESPACE} {agent_pod} -- /usr/local/bin/tether --version",
            token_file.display()
        ),
    );
    assert!(
        o.status.success() && text(&o).contains("tether"),
        "exec with a member token: {}",
        text(&o)
    );
    step(start, "  kubectl logs -f through the leader streams");
    let first = first_streamed_line(
        leader,
        &["logs", "-f", "-n", NAMESPACE, &agent_pod, "--tail=1"],
        false,
        |l| !l.is_empty(),
    );
    eprintln!("  logs -f: {first}");
    step(
        start,
        "  kubectl attach through the leader streams the agent container's output",
    );
    // NB: the agent logs (JSON lines) to stderr, which attach passes on as its own stderr
    // after kubectl's own warning that the session is recorded.
    let first = first_streamed_line(leader, &["attach", "-n", NAMESPACE, &agent_pod], true, |l| {
        l.starts_with('{')
    });
    assert!(first.contains("\"level\""), "attach streamed a log line: {first}");
    let kubeconfig = east.dir().join("through-leader.kubeconfig");
    let o = shell(
        leader,
        &format!(
            "tether kubeconfig --cluster east --output-file {}",
            kubeconfig.display()
        ),
    );
    assert!(o.status.success(), "tether kubeconfig: {}", text(&o));
    for (protocol, websockets) in [("WebSocket", "true"), ("SPDY", "false")] {
        step(
            start,
            &format!("  kubectl port-forward through the leader to the agent's admin port ({protocol})"),
        );
        port_forward_livez(&kubeconfig, &agent_pod, websockets).await;
    }
}

/// Runs `tether --cluster east -- <args>` against the leader and returns the first line it
/// prints on stdout (on stderr with `stderr`) that is `wanted`, failing unless it arrives within
/// 30 s with the command still streaming.
fn first_streamed_line(
    leader: &TestCluster,
    args: &[&str],
    stderr: bool,
    wanted: fn(&str) -> bool,
) -> String {
    let piped = || std::process::Stdio::piped();
    let null = || std::process::Stdio::null();
    let mut follow =
        std::process::Command::new(tether_testkit::controller::binary("tether").expect("tether"))
            .args(["--cluster", "east", "--"])
            .args(args)
            .env("KUBECONFIG", leader.kubeconfig())
            .env(
                "KUBECTL",
                tether_testkit::Tools::locate().expect("tools").path("kubectl"),
            )
            .stdout(if stderr { null() } else { piped() })
            .stderr(if stderr { piped() } else { null() })
            .spawn()
            .expect("tether --cluster east");
    let out: Box<dyn std::io::Read + Send> = if stderr {
        Box::new(follow.stderr.take().expect("stderr"))
    } else {
        Box::new(follow.stdout.take().expect("stdout"))
    };
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        let mut lines = std::io::BufReader::new(out).lines().map_while(Result::ok);
        if let Some(line) = lines.find(|l| wanted(l)) {
            let _ = tx.send(line);
        }
    });
    let first = rx.recv_timeout(Duration::from_secs(30));
    let still_streaming = follow.try_wait().ok().flatten().is_none();
    let _ = follow.kill();
    let _ = follow.wait();
    let first = first.unwrap_or_else(|_| panic!("{args:?} printed nothing within 30 s"));
    assert!(still_streaming, "{args:?} keeps streaming after: {first}");
    first
}

/// `kubectl port-forward` to east's agent pod's admin port through `kubeconfig` (the leader's
/// proxy path), with `KUBECTL_PORT_FORWARD_WEBSOCKETS=websockets`; GET /livez must say ok.
async fn port_forward_livez(kubeconfig: &std::path::Path, agent_pod: &str, websockets: &str) {
    let port = tether_testkit::free_port().expect("port");
    let kubectl = tether_testkit::Tools::locate().expect("tools").path("kubectl");
    let mut pf = std::process::Command::new(kubectl)
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args([
            "port-forward",
            "-n",
            NAMESPACE,
            agent_pod,
            &format!("{port}:8080"),
        ])
        .env("KUBECTL_PORT_FORWARD_WEBSOCKETS", websockets)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("port-forward");
    let body = eventually(
        "GET /livez through the forwarded port",
        Duration::from_secs(30),
        || async {
            let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .map_err(|e| e.to_string())?;
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            s.write_all(b"GET /livez HTTP/1.0\r\n\r\n")
                .await
                .map_err(|e| e.to_string())?;
            let mut out = String::new();
            s.read_to_string(&mut out).await.map_err(|e| e.to_string())?;
            if out.contains("200") { Ok(out) } else { Err(out) }
        },
    )
    .await;
    let _ = pf.kill();
    let _ = pf.wait();
    assert!(body.ends_with("ok"), "{body}");
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
