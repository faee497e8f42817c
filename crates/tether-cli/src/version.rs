//! `tether version`: which versions run, not only which this CLI is. The controllers' replicas in
//! the namespace (each pod's `tether_build_info` read through the API server's pod proxy, else
//! its image tag; which one leads), and on a leader every member's agent as the agent reported it.

use std::time::Duration;

use futures::AsyncReadExt as _;
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
        if let Some(text) = read_metrics(client, path).await
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

/// How long `tether version` waits for one pod's metrics.
const METRICS_TIMEOUT: Duration = Duration::from_secs(5);
/// How much of one pod's metrics it reads (a whole page is a few tens of KiB).
const METRICS_LIMIT: u64 = 1 << 20;

/// The metrics text at `path` (a pod proxy URL), at most `METRICS_LIMIT` bytes of it, or `None`
/// after `METRICS_TIMEOUT`: a wedged or hostile pod can neither hold the command nor fill its
/// memory.
async fn read_metrics(client: &Client, path: String) -> Option<String> {
    read_bounded(client, path, METRICS_TIMEOUT, METRICS_LIMIT).await
}

/// At most `limit` bytes of the body at `path`, or `None` when it took longer than `timeout`.
async fn read_bounded(client: &Client, path: String, timeout: Duration, limit: u64) -> Option<String> {
    let req = http::Request::get(path).body(Vec::new()).ok()?;
    let read = async {
        let body = client.request_stream(req).await.ok()?;
        let mut buf = Vec::new();
        Box::pin(body).take(limit).read_to_end(&mut buf).await.ok()?;
        Some(String::from_utf8_lossy(&buf).into_owned())
    };
    tokio::time::timeout(timeout, read).await.ok().flatten()
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

    /// A pod's port that answers `headers`, then writes `body_chunk` over and over (or nothing,
    /// if empty) until the reader goes: what a wedged or hostile pod behind the pod proxy does.
    async fn hostile(body_chunk: &'static [u8]) -> Client {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                tokio::spawn(async move {
                    // The request first: hyper refuses an answer that comes before it.
                    let mut seen = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                        match conn.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => seen.extend_from_slice(&buf[..n]),
                        }
                    }
                    let head =
                        b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n\r\n";
                    if conn.write_all(head).await.is_err() {
                        return;
                    }
                    if body_chunk.is_empty() {
                        tokio::time::sleep(Duration::from_secs(3600)).await;
                    }
                    let chunk = [
                        format!("{:x}\r\n", body_chunk.len()).as_bytes(),
                        body_chunk,
                        b"\r\n",
                    ]
                    .concat();
                    while conn.write_all(&chunk).await.is_ok() {}
                });
            }
        });
        let config = kube::Config::new(format!("http://{addr}").parse().expect("url"));
        Client::try_from(config).expect("client")
    }

    #[tokio::test]
    async fn a_pod_that_streams_forever_is_read_only_up_to_the_limit() {
        let client = hostile(b"tether_build_info{version=\"0.3.0\"} 1\n").await;
        let text = read_bounded(&client, "/metrics".into(), Duration::from_secs(10), 64 << 10)
            .await
            .expect("the first 64 KiB");
        assert_eq!(text.len(), 64 << 10);
        assert_eq!(build_version(&text).as_deref(), Some("0.3.0"));
    }

    #[tokio::test]
    async fn a_pod_that_never_answers_is_given_up_after_the_timeout() {
        let client = hostile(b"").await;
        let start = std::time::Instant::now();
        let read = read_bounded(&client, "/metrics".into(), Duration::from_millis(300), 1 << 20).await;
        assert!(read.is_none());
        // NB: it waited (the pod answered, then held), and no longer than the timeout.
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_millis(300) && waited < Duration::from_secs(2),
            "{waited:?}"
        );
    }

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
