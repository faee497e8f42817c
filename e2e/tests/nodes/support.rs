//! What the real-node test checks between its steps: chart pods, leases, denials, member access through the leader, port-forward.

use super::*;

pub(super) async fn lease_holder(cluster: &TestCluster, lease: &str) -> String {
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
pub(super) async fn assert_members_kept(
    leader: &TestCluster,
    before: &(BTreeMap<String, String>, usize),
    what: &str,
) {
    assert_eq!(ready_members(leader).await.len(), 2, "no member lost in {what}");
    assert_eq!(
        &pods::identities(leader).await,
        before,
        "no second registration in {what}"
    );
}

/// No log line of any pod of `app` (debug level since the upgrade, so every API error is logged)
/// shows a 403: the chart's RBAC is all the controllers need.
pub(super) async fn assert_no_denials(cluster: &TestCluster, app: &str) {
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
pub(super) async fn assert_chart_pods(cluster: &TestCluster, app: &str, want: usize, image: &str) {
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
pub(super) async fn leader_set_uid(leader: &TestCluster) -> Option<String> {
    Api::<ClusterSet>::namespaced(leader.client().expect("client"), NAMESPACE)
        .get("prod")
        .await
        .expect("ClusterSet prod")
        .metadata
        .uid
}

/// With `check` true, whether the ClusterSet CRD's schema has `spec.leader.bannedClusterIDs`;
/// with `check` false, removes that field from the schema, as an older release's CRD lacked it.
pub(super) async fn set_banned_field(cluster: &TestCluster, check: bool) -> bool {
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
pub(super) fn run_notes(cluster: &TestCluster, helm: &Helm, release: &str) {
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
pub(super) async fn member_access(
    start: Instant,
    leader: &TestCluster,
    members: &[(String, TestCluster, Helm)],
) {
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
pub(super) fn first_streamed_line(
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
pub(super) async fn port_forward_livez(kubeconfig: &std::path::Path, agent_pod: &str, websockets: &str) {
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
