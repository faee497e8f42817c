//! `tether version`: which versions run, not only which this CLI is. The controllers' replicas in
//! the namespace (each pod's `tether_build_info` read through the API server's pod proxy, else
//! its image tag; which one leads), and on a leader every member's agent as the agent reported it.

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use serde::Serialize;
use tether_api::{ManagedCluster, annotations};

use crate::VERSION;
use crate::cluster::Target;
use crate::output::{Format, render};

/// One replica of a controller.
#[derive(Serialize, Debug, PartialEq)]
struct Replica {
    controller: &'static str,
    pod: String,
    version: String,
    leading: bool,
}

/// One member's agent, as the leader knows it.
#[derive(Serialize, Debug)]
struct Agent {
    clusterset: String,
    member: String,
    version: String,
    ready: String,
}

#[derive(Serialize)]
struct Versions {
    client: &'static str,
    namespace: String,
    controllers: Vec<Replica>,
    agents: Vec<Agent>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// `tether version [-o table|yaml|json]`.
pub async fn version(target: &Target, output: Format) -> anyhow::Result<()> {
    let mut v = Versions {
        client: VERSION,
        namespace: target.namespace.clone(),
        controllers: vec![],
        agents: vec![],
        error: None,
    };
    match target.client().await {
        Ok(client) => {
            for (controller, app) in [("leader", "tether-leader"), ("agent", "tether-agent")] {
                match replicas(&client, &target.namespace, controller, app).await {
                    Ok(r) => v.controllers.extend(r),
                    Err(e) => v.error = Some(format!("{e:#}")),
                }
            }
            // Members are the leader's to list; elsewhere (a member, or no right to) there are none.
            v.agents = agents(&client).await.unwrap_or_default();
        }
        Err(err) => v.error = Some(format!("no cluster: {err:#}")),
    }
    if output != Format::Table {
        print!("{}", render(output, &[], vec![], &v)?);
        return Ok(());
    }
    println!("tether CLI {VERSION}");
    if let Some(e) = &v.error {
        println!("({e})");
    }
    if v.controllers.is_empty() && v.error.is_none() {
        println!(
            "no Tether controller in namespace {} (pass -n with the namespace the charts were installed in)",
            v.namespace
        );
    }
    let controllers: Vec<Vec<String>> = v
        .controllers
        .iter()
        .map(|r| {
            let leading = if r.leading { "yes" } else { "no" };
            vec![
                r.controller.into(),
                r.pod.clone(),
                r.version.clone(),
                leading.into(),
            ]
        })
        .collect();
    section(&["CONTROLLER", "POD", "VERSION", "LEADING"], controllers)?;
    let agents: Vec<Vec<String>> = v
        .agents
        .iter()
        .map(|a| {
            vec![
                a.clusterset.clone(),
                a.member.clone(),
                a.version.clone(),
                a.ready.clone(),
            ]
        })
        .collect();
    section(&["CLUSTERSET", "MEMBER", "AGENT VERSION", "READY"], agents)?;
    Ok(())
}

/// Prints a blank line and a table of `rows`, if there are any.
fn section(headers: &[&str], rows: Vec<Vec<String>>) -> anyhow::Result<()> {
    if !rows.is_empty() {
        println!();
        print!("{}", render(Format::Table, headers, rows, &())?);
    }
    Ok(())
}

/// The pods of `app` in `ns`, each with its version and whether it holds the Lease. Without
/// pods (a controller run outside the cluster), the Lease holder alone, version unknown.
async fn replicas(
    client: &Client,
    ns: &str,
    controller: &'static str,
    app: &str,
) -> anyhow::Result<Vec<Replica>> {
    let holder = Api::<Lease>::namespaced(client.clone(), ns)
        .get_opt(app)
        .await?
        .and_then(|l| l.spec?.holder_identity)
        .filter(|h| !h.is_empty());
    let pods = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&format!("app.kubernetes.io/name={app}")))
        .await?
        .items;
    let mut out = Vec::new();
    for pod in pods.iter().filter(|p| p.metadata.deletion_timestamp.is_none()) {
        let name = pod.name_any();
        out.push(Replica {
            controller,
            leading: holder.as_deref().is_some_and(|h| holds(h, &name)),
            version: pod_version(client, ns, pod).await,
            pod: name,
        });
    }
    if out.is_empty()
        && let Some(h) = holder
    {
        out.push(Replica {
            controller,
            pod: format!("(not a pod here; Lease held by {h})"),
            version: "unknown".into(),
            leading: true,
        });
    }
    Ok(out)
}

/// Whether Lease holder `holder` is pod `pod`: its name, or its name and process id
/// (`<pod>-<pid>`, tether_process::leadership, when no identity is given).
fn holds(holder: &str, pod: &str) -> bool {
    match holder.strip_prefix(pod) {
        Some("") => true,
        Some(rest) => rest
            .strip_prefix('-')
            .is_some_and(|pid| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit())),
        None => false,
    }
}

/// The version `pod` runs: `tether_build_info` from its admin port through the API server's pod
/// proxy, else its image's tag.
async fn pod_version(client: &Client, ns: &str, pod: &Pod) -> String {
    let container = pod.spec.as_ref().and_then(|s| s.containers.first());
    let port = container
        .and_then(|c| c.ports.as_ref())
        .and_then(|ports| ports.iter().find(|p| p.name.as_deref() == Some("admin")))
        .map(|p| p.container_port);
    if let Some(port) = port {
        let path = format!(
            "/api/v1/namespaces/{ns}/pods/{}:{port}/proxy/metrics",
            pod.name_any()
        );
        if let Ok(req) = http::Request::get(path).body(Vec::new())
            && let Ok(text) = client.request_text(req).await
            && let Some(v) = build_version(&text)
        {
            return v;
        }
    }
    container
        .and_then(|c| c.image.as_deref())
        .and_then(image_tag)
        .map(|t| format!("{t} (image tag)"))
        .unwrap_or_else(|| "unknown".into())
}

/// The `version` label of `tether_build_info` in a metrics text.
fn build_version(metrics: &str) -> Option<String> {
    let line = metrics.lines().find(|l| l.starts_with("tether_build_info{"))?;
    let rest = &line[line.find("version=\"")? + "version=\"".len()..];
    Some(rest[..rest.find('"')?].to_string())
}

/// The tag of an image reference (none for one by digest).
fn image_tag(image: &str) -> Option<&str> {
    if image.contains('@') {
        return None;
    }
    let (_, tag) = image.rsplit_once(':')?;
    (!tag.contains('/')).then_some(tag)
}

/// Every member's agent version, as its agent reported it (or registered with), on a leader.
async fn agents(client: &Client) -> anyhow::Result<Vec<Agent>> {
    let mut out: Vec<Agent> = Api::<ManagedCluster>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(|mc| {
            let st = mc.status.clone().unwrap_or_default();
            let ready =
                tether_api::conditions::find(&st.conditions, tether_api::conditions::ConditionType::Ready)
                    .map(|c| c.status.clone())
                    .unwrap_or_else(|| "Unknown".into());
            let version = st
                .agent_version
                .clone()
                .or_else(|| {
                    mc.annotations()
                        .get(annotations::REGISTERED_AGENT_VERSION)
                        .cloned()
                })
                .unwrap_or_else(|| "unknown".into());
            Agent {
                clusterset: mc.spec.cluster_set.clone(),
                member: mc.name_any(),
                version,
                ready,
            }
        })
        .collect();
    out.sort_by(|a, b| (&a.clusterset, &a.member).cmp(&(&b.clusterset, &b.member)));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_read_from_build_info_lease_holders_and_image_tags() {
        let metrics = "# HELP tether_build_info The running build.\n\
                       tether_build_info{version=\"0.3.0\",commit=\"abc\"} 1\n";
        assert_eq!(build_version(metrics).as_deref(), Some("0.3.0"));
        assert_eq!(build_version("tether_leader_tunnels 3\n"), None);
        assert!(holds("tether-leader-7d9f-x2k4-1", "tether-leader-7d9f-x2k4"));
        assert!(!holds("tether-leader-7d9f-x2k4-1", "tether-leader-7d9f"));
        assert!(holds("tether-leader-7d9f-x2k4", "tether-leader-7d9f-x2k4"));
        assert!(!holds("tether-leader-7d9f-x2k4", "tether-leader-7d9f-x2"));
        assert_eq!(image_tag("ghcr.io/tether-dev/tether:0.3.0"), Some("0.3.0"));
        assert_eq!(image_tag("localhost:5000/tether"), None);
        assert_eq!(image_tag("ghcr.io/tether-dev/tether@sha256:ab"), None);
    }
}
