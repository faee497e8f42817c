//! The Helm charts, with Helm 4 and Helm 3: `helm lint` and `helm template` render what
//! production needs (and refuse bad values with a clear message). Installing them as pods on real
//! nodes is `tests/nodes.rs`.

use std::path::{Path, PathBuf};
use std::process::Output;

use serde::Deserialize;
use serde_json::Value;
use tether_testkit::Tools;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs `bin` (`helm` is Helm 4, `helm3` Helm 3) from the repository root.
fn helm_with(bin: &str, args: &[&str]) -> Output {
    let helm = Tools::locate().expect("tools").path(bin);
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
    "parentURL=https://leader:6443",
    "--set",
    "token=abcdef.0123456789abcdef",
    "--set",
    "caCertHash=sha256:0000000000000000000000000000000000000000000000000000000000000000",
    "--set",
    "cluster.name=east",
];

#[test]
fn charts_lint_render_hardened_pods_and_refuse_bad_values_with_helm_4() {
    lint_render_and_refuse("helm");
}

#[test]
fn charts_lint_render_hardened_pods_and_refuse_bad_values_with_helm_3() {
    lint_render_and_refuse("helm3");
}

fn lint_render_and_refuse(bin: &str) {
    let lint = helm_with(bin, &["lint", "charts/tether-leader", "--set", LEADER_URL]);
    assert!(lint.status.success(), "{}", out(&lint));
    let mut args = vec!["lint", "charts/tether-agent"];
    args.extend(AGENT_VALUES);
    let lint = helm_with(bin, &args);
    assert!(lint.status.success(), "{}", out(&lint));

    for (chart, extra, replicas) in [
        ("charts/tether-leader", vec!["--set", LEADER_URL], 2),
        ("charts/tether-agent", AGENT_VALUES.to_vec(), 1),
    ] {
        let mut args = vec!["template", "t", chart, "-n", "tether-system"];
        args.extend(extra);
        let rendered = helm_with(bin, &args);
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
        &helm_with(
            bin,
            &[
                "template",
                "t",
                "charts/tether-leader",
                "-n",
                "tether-system",
                "--set",
                LEADER_URL,
            ],
        )
        .stdout,
    ));
    assert!(
        leader.iter().any(|d| d["kind"] == "PodDisruptionBudget"),
        "the leader has a PDB"
    );
    let monitored = helm_with(
        bin,
        &[
            "template",
            "t",
            "charts/tether-leader",
            "--set",
            "serviceMonitor.enabled=true",
            "--set",
            LEADER_URL,
        ],
    );
    assert!(out(&monitored).contains("kind: ServiceMonitor"));

    // Bad, missing or unknown values are refused with a message that names the value.
    let token = "token=abcdef.0123456789abcdef";
    let pin = "caCertHash=sha256:0000000000000000000000000000000000000000000000000000000000000000";
    let cases: [(&str, &[&str], &str); 8] = [
        (
            "charts/tether-agent",
            &["cluster.name=east", token, pin],
            "parentURL",
        ),
        (
            "charts/tether-agent",
            &["parentURL=https://l:6443", "cluster.name=east", pin],
            "set token",
        ),
        (
            "charts/tether-agent",
            &["parentURL=https://l:6443", "cluster.name=east", token],
            "set caCertHash",
        ),
        (
            "charts/tether-agent",
            &["parentURL=https://l:6443", "cluster.name=East_1", token, pin],
            "/cluster/name",
        ),
        (
            "charts/tether-agent",
            &[
                "parentURL=https://l:6443",
                "cluster.name=east",
                token,
                "caCertHash=md5:1",
            ],
            "/caCertHash",
        ),
        // A typo (or the old `leader.url`) is an error naming the key, never silently ignored.
        (
            "charts/tether-agent",
            &["parentUrl=https://l:6443", "cluster.name=east", token, pin],
            "parentUrl",
        ),
        (
            "charts/tether-agent",
            &[
                "leader.url=https://l:6443",
                "parentURL=https://l:6443",
                "cluster.name=east",
                token,
                pin,
            ],
            "url",
        ),
        // Members cannot use the leader's in-cluster address: the chart says what to set.
        ("charts/tether-leader", &[], "set leaderURL"),
    ];
    for (chart, values, says) in cases {
        let mut args = vec!["template", "t", chart];
        for v in values {
            args.extend(["--set", v]);
        }
        let o = helm_with(bin, &args);
        // Helm 4 names a value as a JSON pointer (/cluster/name), Helm 3 with dots (cluster.name).
        let dotted = says.trim_start_matches('/').replace('/', ".");
        assert!(
            !o.status.success() && (out(&o).contains(says) || out(&o).contains(&dotted)),
            "expected an error about {says}: {}",
            out(&o)
        );
    }
    // With no membership values the agent chart installs an idle agent (no ClusterSet, no
    // token Secret), which `tether join --config-file` completes.
    let idle = helm_with(bin, &["template", "t", "charts/tether-agent"]);
    assert!(idle.status.success(), "{}", out(&idle));
    assert!(out(&idle).contains("kind: Deployment"), "{}", out(&idle));
    assert!(!out(&idle).contains("kind: ClusterSet"), "{}", out(&idle));
    let joined = helm_with(
        bin,
        &[
            "template",
            "t",
            "charts/tether-agent",
            "--set",
            "parentURL=https://l:6443",
            "--set",
            token,
            "--set",
            pin,
        ],
    );
    assert!(
        !joined.status.success() && out(&joined).contains("set cluster.name"),
        "{}",
        out(&joined)
    );
    let typo = helm_with(
        bin,
        &[
            "template",
            "t",
            "charts/tether-leader",
            "--set",
            LEADER_URL,
            "--set",
            "replica=3",
        ],
    );
    assert!(
        !typo.status.success() && out(&typo).contains("replica"),
        "an unknown leader value is refused: {}",
        out(&typo)
    );
}

const LEADER_URL: &str = "leaderURL=https://leader.example:6443";

/// The leader's admission policy renders by default where the API server serves it, scoped to
/// the release's own ServiceAccount, and not where it does not (Kubernetes before 1.30) or when
/// turned off; the NetworkPolicy renders only when asked, with the sources given.
#[test]
fn the_leader_chart_scopes_its_service_account_and_offers_a_network_policy() {
    let vap = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy";
    let render = |extra: &[&str]| {
        let mut args = vec![
            "template",
            "t",
            "charts/tether-leader",
            "-n",
            "fleet",
            "--set",
            "leaderURL=https://leader:6443",
        ];
        args.extend_from_slice(extra);
        let o = helm_with("helm", &args);
        assert!(o.status.success(), "{}", out(&o));
        docs(&String::from_utf8_lossy(&o.stdout))
    };
    let kinds = |d: &[Value]| -> Vec<String> {
        d.iter()
            .filter_map(|v| v["kind"].as_str().map(str::to_string))
            .collect()
    };
    let served = render(&["--api-versions", vap]);
    let policy = served
        .iter()
        .find(|v| v["kind"] == "ValidatingAdmissionPolicy")
        .expect("the policy by default");
    let condition = policy["spec"]["matchConditions"][0]["expression"]
        .as_str()
        .unwrap_or_default();
    assert!(
        condition.contains("'system:serviceaccount:fleet:tether-leader'"),
        "bound to the release's ServiceAccount: {condition}"
    );
    assert!(kinds(&served).contains(&"ValidatingAdmissionPolicyBinding".to_string()));
    assert!(
        !kinds(&served).contains(&"NetworkPolicy".to_string()),
        "off by default"
    );
    let off = render(&["--api-versions", vap, "--set", "admissionPolicy.enabled=false"]);
    assert!(!kinds(&off).iter().any(|k| k.starts_with("ValidatingAdmission")));
    let old = render(&[]);
    assert!(
        !kinds(&old).iter().any(|k| k.starts_with("ValidatingAdmission")),
        "not where the API server does not serve it"
    );
    let np = render(&[
        "--set",
        "networkPolicy.enabled=true",
        "--set-json",
        r#"networkPolicy.proxyFrom=[{"ipBlock":{"cidr":"10.0.0.0/24"}}]"#,
    ]);
    let np = np
        .iter()
        .find(|v| v["kind"] == "NetworkPolicy")
        .expect("NetworkPolicy");
    let ingress = np["spec"]["ingress"].as_array().expect("ingress");
    assert_eq!(ingress[0]["ports"][0]["port"], 8443);
    assert_eq!(ingress[0]["from"][0]["ipBlock"]["cidr"], "10.0.0.0/24");
    assert_eq!(ingress[1]["ports"][0]["port"], 8080);
    assert!(
        ingress[1].get("from").is_none(),
        "the admin port from anywhere unless listed"
    );
}

/// Renders `chart` with Helm 4 and `extra` values; the documents.
fn render(chart: &str, extra: &[&str]) -> Vec<Value> {
    let mut args = vec!["template", "t", chart, "-n", "fleet"];
    if chart.ends_with("tether-leader") {
        args.extend(["--set", LEADER_URL]);
    } else {
        args.extend(AGENT_VALUES);
    }
    args.extend_from_slice(extra);
    let o = helm_with("helm", &args);
    assert!(o.status.success(), "helm {args:?}: {}", out(&o));
    docs(&String::from_utf8_lossy(&o.stdout))
}

fn kind<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

/// What production clusters set on both charts renders where Kubernetes reads it: pod labels, a
/// PriorityClass, extra env, volumes and mounts, probe timing, ServiceAccount annotations, the
/// image by digest, the security contexts (OpenShift-style: no fixed UID or group), and the
/// leader's replicas spread over nodes by default.
#[test]
fn both_charts_take_production_values() {
    let digest = format!("sha256:{}", "ab".repeat(32));
    for (chart, name) in [
        ("charts/tether-leader", "tether-leader"),
        ("charts/tether-agent", "tether-agent"),
    ] {
        let image_digest = format!("image.digest={digest}");
        let d = render(
            chart,
            &[
                "--set",
                "podLabels.team=platform",
                "--set",
                "priorityClassName=system-cluster-critical",
                "--set-json",
                r#"extraEnv=[{"name":"HTTPS_PROXY","value":"http://proxy:3128"}]"#,
                "--set-json",
                r#"extraVolumes=[{"name":"ca","configMap":{"name":"corp-ca"}}]"#,
                "--set-json",
                r#"extraVolumeMounts=[{"name":"ca","mountPath":"/etc/corp-ca","readOnly":true}]"#,
                "--set",
                "livenessProbe.timeoutSeconds=5",
                "--set",
                "readinessProbe.failureThreshold=6",
                "--set",
                "serviceAccount.annotations.iam\\.example/role=tether",
                "--set",
                &image_digest,
                "--set",
                "podSecurityContext.runAsUser=null",
                "--set",
                "podSecurityContext.runAsGroup=null",
                "--set",
                "podSecurityContext.fsGroup=null",
            ],
        );
        let dep = kind(&d, "Deployment", name);
        let pod = &dep["spec"]["template"];
        assert_eq!(pod["metadata"]["labels"]["team"], "platform", "{chart}");
        assert_eq!(
            pod["metadata"]["labels"]["app.kubernetes.io/name"], name,
            "the selector labels stay"
        );
        let spec = &pod["spec"];
        assert_eq!(spec["priorityClassName"], "system-cluster-critical", "{chart}");
        let c = &spec["containers"][0];
        assert_eq!(
            c["image"],
            format!("ghcr.io/tether-dev/tether@{digest}"),
            "{chart}"
        );
        let env: Vec<&Value> = c["env"]
            .as_array()
            .expect("env")
            .iter()
            .map(|e| &e["name"])
            .collect();
        assert!(env.contains(&&Value::from("HTTPS_PROXY")), "{chart}: {env:?}");
        assert!(
            env.contains(&&Value::from("POD_NAME")),
            "{chart}: the chart's own env stays: {env:?}"
        );
        assert_eq!(c["volumeMounts"][0]["mountPath"], "/etc/corp-ca", "{chart}");
        assert_eq!(spec["volumes"][0]["configMap"]["name"], "corp-ca", "{chart}");
        assert_eq!(c["livenessProbe"]["timeoutSeconds"], 5, "{chart}");
        assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/livez", "{chart}");
        assert_eq!(c["readinessProbe"]["failureThreshold"], 6, "{chart}");
        let psc = &spec["securityContext"];
        assert!(
            psc.get("runAsUser").is_none() && psc.get("runAsGroup").is_none(),
            "{chart}: null drops the fixed UID and group (OpenShift's SCC assigns them): {psc}"
        );
        assert_eq!(psc["runAsNonRoot"], true, "{chart}");
        assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true, "{chart}");
        let sa = kind(&d, "ServiceAccount", name);
        assert_eq!(
            sa["metadata"]["annotations"]["iam.example/role"], "tether",
            "{chart}"
        );
        assert_eq!(sa["metadata"]["namespace"], "fleet", "{chart}");
        // The hook Jobs run under the same security context.
        for job in d.iter().filter(|v| v["kind"] == "Job") {
            let jsc = &job["spec"]["template"]["spec"]["securityContext"];
            assert!(jsc.get("runAsUser").is_none(), "{chart}: {job}");
        }

        // Defaults: the fixed non-root UID, and the leader's two replicas spread over nodes.
        let d = render(chart, &[]);
        let spec = &kind(&d, "Deployment", name)["spec"]["template"]["spec"];
        assert_eq!(spec["securityContext"]["runAsUser"], 65532, "{chart}");
        assert!(spec.get("priorityClassName").is_none(), "{chart}");
        let spread = &spec["topologySpreadConstraints"];
        if name == "tether-leader" {
            assert_eq!(spread[0]["topologyKey"], "kubernetes.io/hostname", "{spread}");
            assert_eq!(spread[0]["whenUnsatisfiable"], "ScheduleAnyway", "{spread}");
            assert_eq!(
                spread[0]["labelSelector"]["matchLabels"]["app.kubernetes.io/name"],
                name
            );
        } else {
            assert!(spread.is_null(), "one agent replica: no spread: {spread}");
        }
        let sa = kind(&d, "ServiceAccount", name);
        assert!(sa["metadata"].get("annotations").is_none(), "{sa}");
    }
    // A digest that is not one, and a typo in the new keys, are refused.
    for bad in [
        "image.digest=latest",
        "podLabel.team=x",
        "livenessProbe.periodSecond=3",
    ] {
        let o = helm_with(
            "helm",
            &[
                "template",
                "t",
                "charts/tether-leader",
                "--set",
                LEADER_URL,
                "--set",
                bad,
            ],
        );
        assert!(!o.status.success(), "{bad} accepted");
    }
}

/// The leader chart's alerts, in the order of its PrometheusRule.
const LEADER_ALERTS: [&str; 6] = [
    "TetherMemberLost",
    "TetherNoLeader",
    "TetherRegistrationsFailing",
    "TetherReconcileErrors",
    "TetherProxyCertificateExpiring",
    "TetherProxyCertificateRenewalFailing",
];

/// Runs `.tools/bin/promlint <check> <file>` (e2e/promlint: Prometheus's own rule and PromQL
/// parser); its output.
fn promlint(check: &str, file: &Path) -> Output {
    std::process::Command::new(Tools::locate().expect("tools").path("promlint"))
        .args([check, &file.display().to_string()])
        .output()
        .expect("run promlint")
}

/// The PrometheusRules of both charts and the leader's dashboard render when turned on, and
/// load: Prometheus's rule parser accepts every rule (the check `promtool check rules` makes)
/// and the dashboard is a Grafana dashboard whose every PromQL target parses. The checker
/// itself refuses a broken rule and a broken panel.
#[test]
fn the_alerts_and_the_dashboard_lint() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rules_of = |docs: &[Value], name: &str| {
        let rule = kind(docs, "PrometheusRule", name);
        let file = dir.path().join(format!("{name}.rules.yaml"));
        std::fs::write(&file, serde_json::to_string(&rule["spec"]).expect("json")).expect("write");
        (file, rule["spec"]["groups"][0]["rules"].clone())
    };
    let alerts = |rules: &Value| -> Vec<String> {
        rules
            .as_array()
            .expect("rules")
            .iter()
            .filter_map(|r| r["alert"].as_str().map(str::to_string))
            .collect()
    };
    for (chart, name, extra, want) in [
        (
            "charts/tether-leader",
            "tether-leader",
            vec!["--set", "prometheusRule.enabled=true"],
            LEADER_ALERTS.to_vec(),
        ),
        (
            "charts/tether-leader",
            "tether-leader",
            vec![
                "--set",
                "prometheusRule.enabled=true",
                "--set",
                "memberMetrics=true",
            ],
            LEADER_ALERTS.to_vec(),
        ),
        (
            "charts/tether-agent",
            "tether-agent",
            vec!["--set", "prometheusRule.enabled=true"],
            vec![
                "TetherLeaderUnreachable",
                "TetherAgentCredentialRenewalFailing",
                "TetherTunnelDown",
            ],
        ),
    ] {
        let d = render(chart, &extra);
        let (file, rules) = rules_of(&d, name);
        assert_eq!(alerts(&rules), want, "{chart} {extra:?}");
        let o = promlint("rules", &file);
        assert!(o.status.success(), "{chart} {extra:?}: {}", out(&o));
        assert!(
            out(&o).contains(&format!("{} alerts parsed", want.len())),
            "{}",
            out(&o)
        );
        let text = rules.to_string();
        assert!(
            text.contains("namespace=\\\"fleet\\\""),
            "scoped to the release: {text}"
        );
    }
    let member_lost = |extra: &[&str]| {
        let d = render("charts/tether-leader", extra);
        let (_, rules) = rules_of(&d, "tether-leader");
        rules[0]["expr"].as_str().expect("expr").to_string()
    };
    assert!(
        member_lost(&[
            "--set",
            "prometheusRule.enabled=true",
            "--set",
            "memberMetrics=true"
        ])
        .contains("tether_leader_member_ready")
    );
    assert!(member_lost(&["--set", "prometheusRule.enabled=true"]).contains("state=\"not_ready\""));
    // Off by default; the tunnel's alert goes with the tunnel, the certificate's with member access.
    assert!(
        !render("charts/tether-leader", &[])
            .iter()
            .any(|v| v["kind"] == "PrometheusRule")
    );
    let d = render(
        "charts/tether-agent",
        &[
            "--set",
            "prometheusRule.enabled=true",
            "--set",
            "proxy.tunnel=false",
        ],
    );
    assert!(!alerts(&rules_of(&d, "tether-agent").1).contains(&"TetherTunnelDown".to_string()));
    let d = render(
        "charts/tether-leader",
        &[
            "--set",
            "prometheusRule.enabled=true",
            "--set",
            "memberAccess.enabled=false",
        ],
    );
    assert!(
        !alerts(&rules_of(&d, "tether-leader").1)
            .iter()
            .any(|a| a.contains("Certificate"))
    );

    let d = render("charts/tether-leader", &["--set", "dashboard.enabled=true"]);
    let cm = kind(&d, "ConfigMap", "tether-leader-dashboard");
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1");
    let json = cm["data"]["tether-leader.json"].as_str().expect("dashboard json");
    let board = dir.path().join("dashboard.json");
    std::fs::write(&board, json).expect("write");
    let o = promlint("dashboard", &board);
    assert!(o.status.success(), "{}", out(&o));
    assert!(
        !render("charts/tether-leader", &[])
            .iter()
            .any(|v| v["metadata"]["name"] == "tether-leader-dashboard")
    );

    // The checker is not a rubber stamp: a rule that does not parse, an alert without a
    // severity, and a panel whose PromQL is broken are each refused.
    let broken = dir.path().join("broken.rules.yaml");
    std::fs::write(
        &broken,
        "groups:\n- name: g\n  rules:\n  - alert: A\n    expr: sum(rate(x[5m])\n    labels: {severity: warning}\n    annotations: {summary: s, description: d}\n  - alert: B\n    expr: up == 0\n    annotations: {summary: s, description: d}\n",
    )
    .expect("write");
    let o = promlint("rules", &broken);
    assert!(!o.status.success(), "{}", out(&o));
    assert!(out(&o).contains("no severity label"), "{}", out(&o));
    let mut bad: Value = serde_json::from_str(json).expect("dashboard");
    bad["panels"][0]["targets"][0]["expr"] = "sum(tether_leader_is_leader".into();
    std::fs::write(&board, bad.to_string()).expect("write");
    let o = promlint("dashboard", &board);
    assert!(!o.status.success(), "{}", out(&o));
}
