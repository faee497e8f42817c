//! Two of the loops a member session runs on its own credential once registered (the heartbeat
//! is heartbeat.rs): ManagedCluster status (written only when the report changed, plus a full
//! refresh), and credential renewal before expiry. A rejected credential
//! ends the loop so the session registers again; refusals that may be caches settling are
//! retried for a bounded time (`tether_join::settle`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec, TokenRequestStatus};
use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, PostParams};
use kube::runtime::reflector;
use kube::runtime::{WatchStreamExt, watcher};
use rand::Rng;
use tether_api::ManagedCluster;
use tether_join::settle::Settle;
use tokio::sync::{Notify, watch};
use tracing::{info, warn};

use crate::Error;
use crate::endpoint::LeaderEndpoint;
use crate::report::{Report, node_fingerprint, summarize, trim_node, worth_writing};
use crate::session::{Shared, expiry, update};
use crate::state::{self, Stored};
use crate::view::time;

/// A full ManagedCluster status refresh happens at least this often, changed or not.
const FULL_REFRESH: Duration = Duration::from_secs(300);
/// How often the member API server's health is checked.
const HEALTH_EVERY: Duration = Duration::from_secs(30);
/// Reads of the ManagedCluster, one per `HEALTH_EVERY`, waiting for the leader's version verdict.
const VERDICT_READS: u32 = 10;

/// A credential error: the leader no longer accepts this identity.
pub(crate) fn rejected(op: &'static str, e: kube::Error) -> Error {
    match &e {
        kube::Error::Api(s) if matches!(s.code, 401 | 403 | 404) => {
            Error::CredentialRejected(format!("{op}: {} {}", s.code, s.message))
        }
        _ => Error::Leader { op, source: e },
    }
}

pub(crate) async fn report(
    sh: &Arc<Shared>,
    client: watch::Receiver<Client>,
    ns: &str,
    name: &str,
) -> Result<(), Error> {
    let member = sh.ctx.client.clone();
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
    let mut judged = mirror_version_verdict(sh, &conditions).await;
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
            let beat = *sh.last_beat.lock().unwrap_or_else(|p| p.into_inner());
            let status =
                crate::report::status(&next, &sh.ctx.api_server_url, &conditions, beat, Timestamp::now());
            match crate::report::write_status(&api, name, &status).await {
                Ok(written) => {
                    let all = written.status.map(|s| s.conditions).unwrap_or_default();
                    judged = mirror_version_verdict(sh, &all).await;
                    conditions = status.conditions;
                    forbidden.clear();
                    sh.ctx.metrics.status_write();
                    last = Some(next);
                    last_write = Instant::now();
                }
                Err(e) => {
                    let settling = forbidden.tolerate(&e);
                    let err = rejected("report status", e);
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
                judged = mirror_version_verdict(sh, &all).await;
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
    sh: &Arc<Shared>,
    conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
) -> bool {
    let Some(verdict) = crate::report::version_supported(conditions) else {
        return false;
    };
    if !verdict.0 {
        warn!(message = %verdict.2, "The leader does not support this agent's version");
    }
    update(sh, |v| v.version_supported = Some(verdict)).await;
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

/// How long to wait at `now` before renewing `stored`: until a third of its lifetime is left,
/// less up to a tenth of that at random (so that credentials issued together, e.g. in a mass
/// rejoin, drift apart), and never less than 5 s.
pub fn renewal_delay(stored: &Stored, now: Timestamp) -> Duration {
    let remaining = expiry(stored)
        .map(|e| (e - now).get_seconds().max(0) as u64)
        .unwrap_or(0);
    let third = Duration::from_secs(stored.ttl_seconds.max(0) as u64 / 3);
    let left = third.mul_f64(rand::rng().random_range(0.9..=1.0));
    Duration::from_secs(remaining)
        .saturating_sub(left)
        .max(Duration::from_secs(5))
}

/// Asks the leader for a new token of `stored`'s ServiceAccount with the same lifetime (one
/// TokenRequest, with the current credential); `None` if the answer carried no token.
pub async fn request_token(
    api: &Api<ServiceAccount>,
    stored: &Stored,
) -> Result<Option<TokenRequestStatus>, kube::Error> {
    let req = TokenRequest {
        spec: TokenRequestSpec {
            expiration_seconds: Some(stored.ttl_seconds),
            ..TokenRequestSpec::default()
        },
        ..TokenRequest::default()
    };
    let t = api
        .create_token_request(&stored.credential.service_account, &PostParams::default(), &req)
        .await?;
    Ok(t.status)
}

pub(crate) async fn renew(
    sh: &Arc<Shared>,
    leader: &LeaderEndpoint,
    mut stored: Stored,
    client_tx: watch::Sender<Client>,
) -> Result<(), Error> {
    loop {
        sh.ctx.metrics.set_credential_expiry(expiry(&stored));
        tokio::time::sleep(renewal_delay(&stored, Timestamp::now())).await;
        let api = Api::<ServiceAccount>::namespaced(client_tx.borrow().clone(), &stored.credential.namespace);
        match request_token(&api, &stored).await {
            Ok(t) => {
                let Some(status) = t else { continue };
                stored.credential.token = status.token;
                stored.credential.expiration_timestamp = status.expiration_timestamp.0.to_string();
                state::store_credential(&sh.ctx.client, &sh.ctx.namespace, &stored).await?;
                client_tx.send_replace(leader.client(Some(&stored.credential.token))?);
                sh.ctx.metrics.renewal(true);
                info!(expires = %stored.credential.expiration_timestamp, "Credential renewed");
                let exp = expiry(&stored).map(time);
                update(sh, |v| v.membership.credential_expiry = exp).await;
            }
            Err(e) => {
                sh.ctx.metrics.renewal(false);
                let err = rejected("renew credential", e);
                if matches!(err, Error::CredentialRejected(_)) {
                    return Err(err);
                }
                warn!(
                    error = &err as &dyn std::error::Error,
                    "Credential renewal failed; retrying"
                );
                tokio::time::sleep(Duration::from_secs(10)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::SignedDuration;
    use tether_seal::MemberCredential;

    fn stored(expires: &str, ttl_seconds: i64) -> Stored {
        Stored {
            credential: MemberCredential {
                token: "t".into(),
                expiration_timestamp: expires.into(),
                namespace: "ns".into(),
                service_account: "sa".into(),
                ca_cert: String::new(),
            },
            ttl_seconds,
        }
    }

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

    #[test]
    fn renews_with_a_third_of_the_lifetime_left_less_a_little_jitter() {
        let now: Timestamp = "2026-12-02T00:00:00Z".parse().expect("time");
        let fresh = stored(&(now + SignedDuration::from_secs(600)).to_string(), 600);
        let delays: Vec<u64> = (0..200).map(|_| renewal_delay(&fresh, now).as_secs()).collect();
        // A third of 600 s is 200 s, less up to 20 s: renew 400–420 s after issue.
        assert!(delays.iter().all(|d| (400..=420).contains(d)), "{delays:?}");
        assert!(delays.iter().any(|d| *d != delays[0]), "jittered: {delays:?}");
    }

    #[test]
    fn an_almost_expired_or_unreadable_credential_is_renewed_after_five_seconds() {
        let now: Timestamp = "2026-12-02T00:00:00Z".parse().expect("time");
        let late = stored(&(now + SignedDuration::from_secs(30)).to_string(), 600);
        assert_eq!(renewal_delay(&late, now), Duration::from_secs(5));
        let past = stored(&(now - SignedDuration::from_secs(30)).to_string(), 600);
        assert_eq!(renewal_delay(&past, now), Duration::from_secs(5));
        assert_eq!(
            renewal_delay(&stored("not a time", 600), now),
            Duration::from_secs(5)
        );
    }
}
