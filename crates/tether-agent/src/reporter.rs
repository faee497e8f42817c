//! The member's status on its ManagedCluster at the leader: nodes, capacity, the member API
//! server's version and health, and its ClusterProperties, written only when the report changed
//! (plus a full refresh every few minutes). A node cache trimmed to what the report reads is
//! woken only by node changes that matter; the API server is probed every `HEALTH_EVERY`. A
//! rejected credential ends the loop so the session gets a new one; refusals that may be caches
//! settling are retried for a bounded time (`tether_join::settle`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::Api;
use kube::runtime::reflector;
use kube::runtime::{WatchStreamExt, watcher};
use tether_api::ManagedCluster;
use tether_join::settle::Settle;
use tokio::sync::{Notify, watch};
use tracing::warn;

use crate::report::{Report, node_fingerprint, summarize, trim_node, worth_writing};
use crate::status::StatusSink;
use crate::{Error, Metrics};

/// The member cluster the reporter describes.
pub(crate) struct Member<'a> {
    /// Its API server, as the agent.
    pub client: &'a Client,
    /// Its URL as the agent reaches it (reported).
    pub api_server_url: &'a str,
    /// The agent's metrics.
    pub metrics: &'a Metrics,
}

/// A full ManagedCluster status refresh happens at least this often, changed or not.
const FULL_REFRESH: Duration = Duration::from_secs(300);
/// How often the member API server's health is checked.
const HEALTH_EVERY: Duration = Duration::from_secs(30);
/// Reads of the ManagedCluster, one per `HEALTH_EVERY`, waiting for the leader's version verdict.
const VERDICT_READS: u32 = 10;

/// Reports the member's status to its ManagedCluster on the leader until the credential is
/// rejected: on a change of the report (`worth_writing`), else every `FULL_REFRESH`.
pub(crate) async fn run(
    ctx: Member<'_>,
    sink: &StatusSink,
    client: watch::Receiver<Client>,
    ns: &str,
    name: &str,
) -> Result<(), Error> {
    let member = ctx.client.clone();
    let (nodes, writer) = reflector::store::<Node>();
    let changed = Arc::new(Notify::new());
    let stream = reflector::reflector(
        writer,
        watcher(Api::<Node>::all(member.clone()), watcher::Config::default()).modify(trim_node),
    )
    .default_backoff()
    .scan(NodeChanges::default(), {
        let changed = changed.clone();
        move |seen, event| {
            if let Ok(event) = event
                && seen.changed(&event)
            {
                changed.notify_one();
            }
            futures::future::ready(Some(()))
        }
    })
    .for_each(|_| async {});
    let drive = tokio::spawn(stream);
    let _stop = AbortOnDrop(drive);
    let _ = nodes.wait_until_ready().await;

    let mut last: Option<Report> = None;
    // NB: the condition's transition time survives agent restarts: start from what is written.
    let leader = client.borrow().clone();
    let mut conditions = Api::<ManagedCluster>::namespaced(leader, ns)
        .get_opt(name)
        .await
        .ok()
        .flatten()
        .and_then(|mc| mc.status)
        .map(|s| s.conditions)
        .unwrap_or_default();
    let mut judged = mirror_version_verdict(sink, &conditions).await;
    let mut verdict_reads = VERDICT_READS;
    let mut forbidden = Settle::forbidden();
    let mut last_write = Instant::now();
    let mut probed = probe(&member).await;
    let mut probed_at = Instant::now();
    loop {
        if probed_at.elapsed() >= HEALTH_EVERY {
            probed = probe(&member).await;
            probed_at = Instant::now();
        }
        let next = report_of(&nodes, &probed);
        let full = last_write.elapsed() >= FULL_REFRESH;
        if worth_writing(last.as_ref(), &next) || full {
            let api = Api::<ManagedCluster>::namespaced(client.borrow().clone(), ns);
            let status = crate::report::status(
                &next,
                ctx.api_server_url,
                &conditions,
                sink.last_beat(),
                Timestamp::now(),
            );
            match crate::report::write_status(&api, name, &status).await {
                Ok(written) => {
                    let all = written.status.map(|s| s.conditions).unwrap_or_default();
                    judged = mirror_version_verdict(sink, &all).await;
                    conditions = status.conditions;
                    forbidden.clear();
                    ctx.metrics.status_write();
                    last = Some(next);
                    last_write = Instant::now();
                }
                Err(e) => {
                    let settling = forbidden.tolerate(&e);
                    let err = Error::rejected("report status", e);
                    if matches!(err, Error::CredentialRejected(_)) && !settling {
                        return Err(err);
                    }
                    warn!(
                        error = &err as &dyn std::error::Error,
                        "Status report failed; retrying"
                    );
                }
            }
        }
        if !judged && verdict_reads > 0 {
            // NB: the leader judges the version the first report carried a moment after it;
            // read it back (only until it is there: later verdicts come with each write), a few
            // times at most, so an older leader that never judges costs no read per agent forever.
            verdict_reads -= 1;
            let api = Api::<ManagedCluster>::namespaced(client.borrow().clone(), ns);
            if let Ok(Some(mc)) = api.get_opt(name).await {
                let all = mc.status.map(|s| s.conditions).unwrap_or_default();
                judged = mirror_version_verdict(sink, &all).await;
            }
        }
        tokio::select! {
            _ = changed.notified() => tokio::time::sleep(Duration::from_secs(1)).await,
            // NB: until the next probe is due, not a whole period from now (which let a probe,
            // and a ClusterProperty change, wait up to two periods).
            _ = tokio::time::sleep(HEALTH_EVERY.saturating_sub(probed_at.elapsed())) => {}
        }
    }
}

/// Shows the leader's verdict on this agent's version (on the ManagedCluster) as the member
/// ClusterSet's `AgentVersionSupported` condition, with a warning when it is outside the skew.
/// Whether there was a verdict.
async fn mirror_version_verdict(
    sink: &StatusSink,
    conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
) -> bool {
    let Some(verdict) = crate::report::version_supported(conditions) else {
        return false;
    };
    if !verdict.0 {
        warn!(message = %verdict.2, "The leader does not support this agent's version");
    }
    sink.update(move |v| v.version_supported = Some(verdict));
    true
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);
impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What the agent learns of the member API server itself, every `HEALTH_EVERY`.
struct Probed {
    version: Option<k8s_openapi::apimachinery::pkg::version::Info>,
    health: tether_api::managedcluster::ApiServerHealth,
    properties: Vec<tether_api::managedcluster::PropertyValue>,
}

/// The member's `about.k8s.io` ClusterProperties (none when the CRD is not installed or the
/// list fails; a page of `MAX_PROPERTIES` at most).
async fn cluster_properties(member: &Client) -> Vec<tether_api::managedcluster::PropertyValue> {
    use tether_api::about::ClusterProperty;
    let lp = kube::api::ListParams::default().limit(tether_api::managedcluster::MAX_PROPERTIES);
    match Api::<ClusterProperty>::all(member.clone()).list(&lp).await {
        Ok(list) => crate::report::properties(
            list.items
                .into_iter()
                .map(|p| (kube::ResourceExt::name_any(&p), p.spec.value)),
        ),
        // NB: 404 is a member without the ClusterProperty CRD: nothing to report.
        Err(kube::Error::Api(e)) if e.code == 404 => Vec::new(),
        Err(e) => {
            warn!(
                error = &e as &dyn std::error::Error,
                "Cannot list this cluster's ClusterProperties; reporting none"
            );
            Vec::new()
        }
    }
}

/// The member API server's version and health (`/livez`, `/readyz`).
async fn probe(member: &Client) -> Probed {
    let version = member.apiserver_version().await.ok();
    let get = |path: &'static str| async move {
        let req = http::Request::get(path).body(vec![]);
        match req {
            Ok(r) => member.request_text(r).await.is_ok(),
            Err(_) => false,
        }
    };
    let (livez, readyz, properties) =
        futures::join!(get("/livez"), get("/readyz"), cluster_properties(member));
    Probed {
        version,
        health: tether_api::managedcluster::ApiServerHealth { livez, readyz },
        properties,
    }
}

/// A report from the node cache and the last probe.
fn report_of(nodes: &reflector::Store<Node>, probed: &Probed) -> Report {
    let state = nodes.state();
    let (counts, capacity, allocatable) = summarize(state.iter().map(|n| n.as_ref()));
    Report {
        nodes: counts,
        capacity,
        allocatable,
        kubernetes_version: probed.version.as_ref().map(|v| v.git_version.clone()),
        platform: probed.version.as_ref().map(|v| v.platform.clone()),
        health: probed.health.clone(),
        properties: probed.properties.clone(),
    }
}

/// Which node watch events change a report: a node's arrival or departure, a (re)list, or an
/// update whose trimmed form differs (`node_fingerprint`). Kubelets rewrite their Node every few
/// seconds; those updates wake nothing.
#[derive(Default)]
struct NodeChanges {
    seen: HashMap<String, u64>,
    listing: Option<HashMap<String, u64>>,
}

impl NodeChanges {
    fn changed(&mut self, event: &watcher::Event<Node>) -> bool {
        let name = |n: &Node| n.metadata.name.clone().unwrap_or_default();
        match event {
            watcher::Event::Init => {
                self.listing = Some(HashMap::new());
                false
            }
            watcher::Event::InitApply(n) => {
                if let Some(l) = self.listing.as_mut() {
                    l.insert(name(n), node_fingerprint(n));
                }
                false
            }
            watcher::Event::InitDone => {
                self.seen = self.listing.take().unwrap_or_default();
                true
            }
            watcher::Event::Apply(n) => {
                self.seen.insert(name(n), node_fingerprint(n)) != Some(node_fingerprint(n))
            }
            watcher::Event::Delete(n) => {
                self.seen.remove(&name(n));
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, ready: &str, resource_version: &str) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some(name.into());
        n.metadata.resource_version = Some(resource_version.into());
        n.status = Some(k8s_openapi::api::core::v1::NodeStatus {
            conditions: Some(vec![k8s_openapi::api::core::v1::NodeCondition {
                type_: "Ready".into(),
                status: ready.into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        n
    }

    #[test]
    fn only_node_events_that_change_a_report_wake_the_reporter() {
        use watcher::Event::*;
        let mut c = NodeChanges::default();
        assert!(!c.changed(&Init));
        assert!(!c.changed(&InitApply(node("a", "True", "1"))));
        assert!(!c.changed(&InitApply(node("b", "True", "1"))));
        assert!(c.changed(&InitDone), "the first list is a change");
        assert!(!c.changed(&Apply(node("a", "True", "2"))), "a kubelet heartbeat");
        assert!(
            c.changed(&Apply(node("a", "False", "3"))),
            "a node going NotReady"
        );
        assert!(c.changed(&Apply(node("c", "True", "1"))), "a new node");
        assert!(c.changed(&Delete(node("b", "True", "1"))), "a node gone");
        assert!(c.changed(&Apply(node("b", "True", "4"))), "and back");
        // A relist (e.g. after a watch expired) is a change, and starts from what it listed.
        assert!(!c.changed(&Init));
        assert!(!c.changed(&InitApply(node("a", "False", "5"))));
        assert!(c.changed(&InitDone));
        assert_eq!(c.seen.len(), 1);
        assert!(!c.changed(&Apply(node("a", "False", "6"))));
    }

    use crate::testing::{self, count, failure};
    use serde_json::json;

    const STATUS: &str =
        "PATCH /apis/multicluster.tether.dev/v1alpha1/namespaces/ns/managedclusters/east/status";

    /// A member with one node, v1.34.0, healthy, without ClusterProperties.
    fn member() -> (Client, testing::Calls) {
        testing::client(|_, path, _| match path {
            "/api/v1/nodes" => (
                200,
                json!({"apiVersion": "v1", "kind": "NodeList", "metadata": {"resourceVersion": "1"},
                       "items": [{"metadata": {"name": "n1", "resourceVersion": "1"},
                                  "status": {"conditions": [{"type": "Ready", "status": "True"}]}}]}),
            ),
            "/version" => (
                200,
                json!({"major": "1", "minor": "34", "gitVersion": "v1.34.0", "gitCommit": "", "gitTreeState": "",
                       "buildDate": "", "goVersion": "", "compiler": "", "platform": "linux/amd64"}),
            ),
            "/livez" | "/readyz" => (200, json!("ok")),
            _ => failure(404),
        })
    }

    fn written() -> (u16, serde_json::Value) {
        (
            200,
            json!({"apiVersion": "multicluster.tether.dev/v1alpha1", "kind": "ManagedCluster",
                   "metadata": {"name": "east", "namespace": "ns"},
                   "spec": {"clusterID": "id-1", "clusterSet": "prod"}}),
        )
    }

    /// Runs the reporter against `leader` for `secs` of (paused) time; its result if it ended.
    async fn report_for(leader: Client, secs: u64) -> Option<Result<(), Error>> {
        let (client, _) = member();
        let metrics = Metrics::default();
        let (sink, _owner, _) = testing::sink(false);
        let (_tx, rx) = watch::channel(leader);
        let m = Member {
            client: &client,
            api_server_url: "https://member:6443",
            metrics: &metrics,
        };
        tokio::time::timeout(Duration::from_secs(secs), run(m, &sink, rx, "ns", "east"))
            .await
            .ok()
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_report_is_retried_while_rbac_settles_then_written_once() {
        let refusals = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let seen = refusals.clone();
        let (leader, calls) = testing::client(move |method, _, _| {
            if method != http::Method::PATCH {
                return failure(404);
            }
            // Refused twice (a Role bound a moment ago), then accepted.
            if seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < 2 {
                failure(403)
            } else {
                written()
            }
        });
        // Refused at once and again a second later (the node list's wake-up), written at the
        // next probe (30 s); then nothing changes before the 300 s refresh.
        assert!(report_for(leader, 200).await.is_none(), "still reporting");
        assert_eq!(count(&calls, STATUS), 3);
        assert_eq!(refusals.load(std::sync::atomic::Ordering::SeqCst), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusal_past_the_settle_time_ends_the_session() {
        let (leader, calls) = testing::client(|method, _, _| {
            if method == http::Method::PATCH {
                failure(403)
            } else {
                failure(404)
            }
        });
        let start = tokio::time::Instant::now();
        let ended = report_for(leader, 200).await.expect("ended");
        assert!(matches!(ended, Err(Error::CredentialRejected(_))), "{ended:?}");
        let after = start.elapsed();
        assert!(
            after >= Duration::from_secs(30) && after < Duration::from_secs(40),
            "{after:?}"
        );
        assert_eq!(
            count(&calls, STATUS),
            3,
            "at once, a second later, and at the next probe"
        );
    }
}
