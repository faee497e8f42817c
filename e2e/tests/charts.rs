//! The Helm charts, with Helm 4 and Helm 3: `helm lint` and `helm template` render what
//! production needs (and refuse bad values with a clear message). Installing them as pods on real
//! nodes is `tests/nodes.rs`.

use std::path::{Path, PathBuf};
use std::process::Output;

use serde::Deserialize;
use serde_json::Value;
use tether_testkit::Tools;

#[path = "charts/production.rs"]
mod production;

#[path = "charts/observability.rs"]
mod observability;

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
    // The member-key policy exempts the release's own ServiceAccount, no other.
    let keys = served
        .iter()
        .find(|v| v["kind"] == "ValidatingAdmissionPolicy" && v["metadata"]["name"] == "tether-member-keys")
        .expect("the member-key policy");
    assert!(
        keys["spec"]["matchConditions"][0]["expression"]
            .as_str()
            .is_some_and(|c| c.contains("!= 'system:serviceaccount:fleet:tether-leader'")),
        "{keys}"
    );
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
