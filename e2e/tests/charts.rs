//! The Helm charts: `helm lint` and `helm template` render what production needs (and refuse bad
//! values with a clear message), and a real `helm install` of both charts into real clusters is
//! all a member needs to join — the controllers run as local processes with tokens of the
//! ServiceAccounts the charts created (pods cannot run here), so any RBAC gap fails the test.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use kube::api::Api;
use serde::Deserialize;
use serde_json::Value;
use tether_testkit::{Tools, eventually};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn helm(args: &[&str]) -> Output {
    let helm = Tools::locate().expect("tools").path("helm");
    std::process::Command::new(helm)
        .args(args)
        .current_dir(root())
        .env("HELM_CACHE_HOME", std::env::temp_dir().join("tether-helm-cache"))
        .env(
            "HELM_CONFIG_HOME",
            std::env::temp_dir().join("tether-helm-config"),
        )
        .env("HELM_DATA_HOME", std::env::temp_dir().join("tether-helm-data"))
        .output()
        .expect("run helm")
}

fn out(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn docs(yaml: &str) -> Vec<Value> {
    serde_norway::Deserializer::from_str(yaml)
        .filter_map(|d| Value::deserialize(d).ok())
        .filter(|v| !v.is_null())
        .collect()
}

const AGENT_VALUES: [&str; 8] = [
    "--set",
    "leader.url=https://leader:6443",
    "--set",
    "leader.token=abcdef.0123456789abcdef",
    "--set",
    "leader.caCertHash=sha256:0000000000000000000000000000000000000000000000000000000000000000",
    "--set",
    "cluster.name=east",
];

#[test]
fn charts_lint_render_hardened_pods_and_refuse_bad_values() {
    let lint = helm(&["lint", "charts/tether-leader"]);
    assert!(lint.status.success(), "{}", out(&lint));
    let mut args = vec!["lint", "charts/tether-agent"];
    args.extend(AGENT_VALUES);
    let lint = helm(&args);
    assert!(lint.status.success(), "{}", out(&lint));

    for (chart, extra, replicas) in [
        ("charts/tether-leader", vec![], 2),
        ("charts/tether-agent", AGENT_VALUES.to_vec(), 1),
    ] {
        let mut args = vec!["template", "t", chart, "-n", "tether-system"];
        args.extend(extra);
        let rendered = helm(&args);
        assert!(rendered.status.success(), "{}", out(&rendered));
        let all = docs(&String::from_utf8_lossy(&rendered.stdout));
        let deploy = all
            .iter()
            .find(|d| d["kind"] == "Deployment")
            .expect("Deployment");
        assert_eq!(deploy["spec"]["replicas"], replicas, "{chart}");
        let pod = &deploy["spec"]["template"]["spec"];
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true, "{chart}");
        assert_eq!(
            pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault",
            "{chart}"
        );
        let c = &pod["containers"][0];
        assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true, "{chart}");
        assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false, "{chart}");
        assert_eq!(c["securityContext"]["capabilities"]["drop"][0], "ALL", "{chart}");
        assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/livez", "{chart}");
        assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz", "{chart}");
        assert!(
            c["resources"]["limits"]["memory"].is_string(),
            "{chart}: memory limit"
        );
        assert!(
            c["resources"]["requests"]["cpu"].is_string(),
            "{chart}: cpu request"
        );
        // The RBAC is exactly config/rbac's.
        let file = if chart.ends_with("leader") {
            "leader.yaml"
        } else {
            "agent.yaml"
        };
        let want = docs(&std::fs::read_to_string(root().join("config/rbac").join(file)).expect("rbac"));
        for w in &want {
            let found = all.iter().any(|d| {
                d["kind"] == w["kind"] && d["metadata"] == w["metadata"] && d["rules"] == w["rules"]
            });
            assert!(
                found,
                "{chart} renders {} {} as in config/rbac/{file}",
                w["kind"], w["metadata"]["name"]
            );
        }
    }
    let leader = docs(&String::from_utf8_lossy(
        &helm(&["template", "t", "charts/tether-leader", "-n", "tether-system"]).stdout,
    ));
    assert!(
        leader.iter().any(|d| d["kind"] == "PodDisruptionBudget"),
        "the leader has a PDB"
    );
    let monitored = helm(&[
        "template",
        "t",
        "charts/tether-leader",
        "--set",
        "serviceMonitor.enabled=true",
    ]);
    assert!(out(&monitored).contains("kind: ServiceMonitor"));

    // Bad or missing values are refused with a message that names the value.
    let cases: [(&[&str], &str); 4] = [
        (
            &[
                "--set",
                "cluster.name=east",
                "--set",
                "leader.token=abcdef.0123456789abcdef",
            ],
            "/leader/url",
        ),
        (
            &["--set", "leader.url=https://l:6443", "--set", "cluster.name=east"],
            "leader.token",
        ),
        (
            &[
                "--set",
                "leader.url=https://l:6443",
                "--set",
                "cluster.name=East_1",
                "--set",
                "leader.token=abcdef.0123456789abcdef",
            ],
            "/cluster/name",
        ),
        (
            &[
                "--set",
                "leader.url=https://l:6443",
                "--set",
                "cluster.name=east",
                "--set",
                "leader.token=abcdef.0123456789abcdef",
                "--set",
                "leader.caCertHash=md5:1",
            ],
            "/leader/caCertHash",
        ),
    ];
    for (values, says) in cases {
        let mut args = vec!["template", "t", "charts/tether-agent"];
        args.extend(values);
        let o = helm(&args);
        assert!(
            !o.status.success() && out(&o).contains(says),
            "expected an error about {says}: {}",
            out(&o)
        );
    }
}

#[tokio::test]
async fn helm_install_alone_joins_members_with_nothing_beyond_the_charts_rbac() {
    // The `make demo` flow, non-interactively.
    let sandbox = tether_e2e::demo::up(None, &[("east", 2), ("west", 1)]).await;
    assert!(
        sandbox.init_output.contains("tether join --leader"),
        "{}",
        sandbox.init_output
    );
    eventually(
        "kubectl get clusterset shows 2 ready",
        Duration::from_secs(15),
        || async {
            let sets = tether_e2e::demo::kubectl(&sandbox.leader.cluster, &["get", "clusterset", "-A"]);
            let row = sets
                .lines()
                .find(|l| l.contains("prod"))
                .unwrap_or_default()
                .to_string();
            let cols: Vec<&str> = row.split_whitespace().collect();
            if cols.len() > 5 && cols[2..].contains(&"2") && row.contains("Leader") {
                Ok(())
            } else {
                Err(sets)
            }
        },
    )
    .await;
    let mcls = tether_e2e::demo::kubectl(&sandbox.leader.cluster, &["get", "mcls", "-A"]);
    assert!(
        mcls.contains("east") && mcls.contains("2/2") && mcls.contains("west") && mcls.contains("1/1"),
        "{mcls}"
    );
    let mut logs = vec![("leader".to_string(), sandbox.leader.controller.log())];
    for (name, site) in &sandbox.members {
        logs.push((name.clone(), site.controller.log()));
        let member_set = Api::<tether_api::ClusterSet>::namespaced(site.admin.clone(), "tether-system")
            .get("prod")
            .await
            .expect("the chart created the Member ClusterSet");
        assert_eq!(
            member_set.status.and_then(|s| s.state).as_deref(),
            Some("Ready"),
            "{name}"
        );
    }
    for (who, log) in logs {
        assert!(
            !log.contains("orbidden"),
            "{who} needed more than its chart's RBAC:\n{log}"
        );
    }
}
