//! Production values of both charts.

use super::*;

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
