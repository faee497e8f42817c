//! What the agent reports about its cluster, as pure values: node counts and capacity summed from
//! the node cache, and the rule that decides whether a new report is worth a write (allocatable
//! may jitter by up to 1% without one; anything else that changes is written).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PatchParams};
use kube_quantity::ParsedQuantity;
use tether_api::conditions::{ConditionType, Reason, Status, condition};
use tether_api::managedcluster::{ApiServerHealth, NodeCounts};
use tether_api::{ManagedCluster, ManagedClusterStatus};

use crate::{FIELD_MANAGER, VERSION};

/// Resources summed over nodes (others are ignored to keep the status small).
const RESOURCES: [&str; 4] = ["cpu", "memory", "pods", "ephemeral-storage"];
/// Relative change of an allocatable resource below which no write happens.
pub const ALLOCATABLE_THRESHOLD: f64 = 0.01;

/// One report about the member cluster (everything but timestamps).
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Report {
    /// Node counts.
    pub nodes: NodeCounts,
    /// Capacity summed over nodes.
    pub capacity: BTreeMap<String, Quantity>,
    /// Allocatable summed over nodes.
    pub allocatable: BTreeMap<String, Quantity>,
    /// The member API server's gitVersion.
    pub kubernetes_version: Option<String>,
    /// The member API server's os/arch.
    pub platform: Option<String>,
    /// `/livez` and `/readyz` of the member API server.
    pub health: ApiServerHealth,
}

/// Counts nodes by their Ready condition and sums their capacity and allocatable.
pub fn summarize<'a>(
    nodes: impl IntoIterator<Item = &'a Node>,
) -> (NodeCounts, BTreeMap<String, Quantity>, BTreeMap<String, Quantity>) {
    let mut counts = NodeCounts::default();
    let mut capacity: BTreeMap<&str, ParsedQuantity> = BTreeMap::new();
    let mut allocatable: BTreeMap<&str, ParsedQuantity> = BTreeMap::new();
    for node in nodes {
        counts.total += 1;
        let ready = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
            .map(|c| c.status.as_str());
        match ready {
            Some("True") => counts.ready += 1,
            Some("False") => counts.not_ready += 1,
            _ => counts.unknown += 1,
        }
        let status = node.status.as_ref();
        add(&mut capacity, status.and_then(|s| s.capacity.as_ref()));
        add(&mut allocatable, status.and_then(|s| s.allocatable.as_ref()));
    }
    counts.summary = format!("{}/{}", counts.ready, counts.total);
    (counts, to_quantities(capacity), to_quantities(allocatable))
}

fn add(sum: &mut BTreeMap<&'static str, ParsedQuantity>, values: Option<&BTreeMap<String, Quantity>>) {
    for name in RESOURCES {
        // NB: an unparsable quantity from a node is skipped rather than failing the whole report.
        if let Some(q) = values
            .and_then(|v| v.get(name))
            .and_then(|q| ParsedQuantity::try_from(q).ok())
        {
            let total = sum.remove(name).map_or(q.clone(), |t| t + q);
            sum.insert(name, total);
        }
    }
}

fn to_quantities(sum: BTreeMap<&str, ParsedQuantity>) -> BTreeMap<String, Quantity> {
    sum.into_iter()
        .map(|(k, v)| (k.to_string(), Quantity::from(v)))
        .collect()
}

/// Whether `next` differs enough from the last written report to be written.
pub fn worth_writing(last: Option<&Report>, next: &Report) -> bool {
    let Some(last) = last else { return true };
    last.nodes != next.nodes
        || last.capacity != next.capacity
        || last.kubernetes_version != next.kubernetes_version
        || last.platform != next.platform
        || last.health != next.health
        || allocatable_moved(&last.allocatable, &next.allocatable)
}

fn allocatable_moved(last: &BTreeMap<String, Quantity>, next: &BTreeMap<String, Quantity>) -> bool {
    if last.keys().ne(next.keys()) {
        return true;
    }
    last.iter().any(|(name, old)| {
        let value = |q: &Quantity| ParsedQuantity::try_from(q).ok().and_then(|p| p.to_bytes_f64());
        match (value(old), next.get(name).and_then(value)) {
            (Some(0.0), Some(b)) => b != 0.0,
            (Some(a), Some(b)) => ((b - a) / a).abs() > ALLOCATABLE_THRESHOLD,
            _ => old != &next[name],
        }
    })
}

/// The ManagedCluster status the agent owns for report `r`: what it observed, when it last
/// heartbeat (`last_heartbeat`), and an `ApiServerHealthy` condition whose transition time stays
/// as in `previous` while its status does not change.
pub fn status(
    r: &Report,
    url: &str,
    previous: &[Condition],
    last_heartbeat: Option<Timestamp>,
    now: Timestamp,
) -> ManagedClusterStatus {
    let healthy = r.health.livez && r.health.readyz;
    let reason = if healthy {
        Reason::LivezReadyzOK
    } else {
        Reason::HealthCheckFailed
    };
    ManagedClusterStatus {
        kubernetes_version: r.kubernetes_version.clone(),
        platform: r.platform.clone(),
        api_server_url: Some(url.to_string()),
        agent_version: Some(VERSION.into()),
        nodes: Some(r.nodes.clone()),
        capacity: r.capacity.clone(),
        allocatable: r.allocatable.clone(),
        api_server_health: Some(r.health.clone()),
        last_heartbeat_time: last_heartbeat.map(Time),
        last_report_time: Some(Time(now)),
        conditions: vec![condition(
            previous,
            ConditionType::ApiServerHealthy,
            Status::of(healthy),
            reason,
            format!("livez={} readyz={}", r.health.livez, r.health.readyz),
            now,
        )],
    }
}

/// Writes `status` as the ManagedCluster `name`'s status (server-side apply of the agent's
/// fields) and returns the ManagedCluster as the leader now has it.
pub async fn write_status(
    api: &Api<ManagedCluster>,
    name: &str,
    status: &ManagedClusterStatus,
) -> Result<ManagedCluster, kube::Error> {
    api.patch_status(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &tether_api::status_apply::<ManagedCluster, _>(status),
    )
    .await
}

/// The leader's judgement of this agent's version on its ManagedCluster (`AgentVersionSupported`,
/// see the leader's `skew.rs`), as the member ClusterSet shows it; None while the leader has not
/// judged (or cannot tell, or is older than the condition).
pub fn version_supported(conditions: &[Condition]) -> Option<crate::view::State> {
    let c = tether_api::conditions::find(conditions, ConditionType::AgentVersionSupported)?;
    let ok = match c.status.as_str() {
        "True" => true,
        "False" => false,
        _ => return None,
    };
    let reason = c.reason.parse().ok()?;
    Some((ok, reason, c.message.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus};

    fn node(ready: Option<&str>, cpu: &str, mem: &str, alloc_mem: &str) -> Node {
        let q = |pairs: &[(&str, &str)]| {
            Some(
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                    .collect(),
            )
        };
        Node {
            status: Some(NodeStatus {
                conditions: ready.map(|s| {
                    vec![NodeCondition {
                        type_: "Ready".into(),
                        status: s.into(),
                        ..NodeCondition::default()
                    }]
                }),
                capacity: q(&[
                    ("cpu", cpu),
                    ("memory", mem),
                    ("pods", "110"),
                    ("hugepages-2Mi", "0"),
                ]),
                allocatable: q(&[("cpu", cpu), ("memory", alloc_mem), ("pods", "110")]),
                ..NodeStatus::default()
            }),
            ..Node::default()
        }
    }

    #[test]
    fn nodes_are_counted_by_readiness_and_summed() {
        let nodes = [
            node(Some("True"), "4", "16Gi", "15Gi"),
            node(Some("False"), "2", "8Gi", "7Gi"),
            node(None, "500m", "1Gi", "1Gi"),
        ];
        let (counts, capacity, allocatable) = summarize(&nodes);
        assert_eq!(
            (counts.total, counts.ready, counts.not_ready, counts.unknown),
            (3, 1, 1, 1)
        );
        assert_eq!(counts.summary, "1/3");
        let bytes = |m: &BTreeMap<String, Quantity>, k: &str| {
            ParsedQuantity::try_from(&m[k]).unwrap().to_bytes_f64().unwrap()
        };
        assert_eq!(bytes(&capacity, "cpu"), 6.5);
        assert_eq!(bytes(&capacity, "memory"), 25.0 * 1024.0 * 1024.0 * 1024.0);
        assert_eq!(bytes(&allocatable, "memory"), 23.0 * 1024.0 * 1024.0 * 1024.0);
        assert_eq!(bytes(&capacity, "pods"), 330.0);
        assert!(
            !capacity.contains_key("hugepages-2Mi"),
            "only the summed resources"
        );
    }

    #[test]
    fn small_allocatable_jitter_is_not_written_but_real_changes_are() {
        let report = |nodes: &[Node]| {
            let (n, c, a) = summarize(nodes);
            Report {
                nodes: n,
                capacity: c,
                allocatable: a,
                ..Report::default()
            }
        };
        let base = report(&[node(Some("True"), "4", "16Gi", "15000Mi")]);
        assert!(worth_writing(None, &base), "the first report is written");
        assert!(!worth_writing(Some(&base), &base.clone()), "nothing changed");
        let jitter = report(&[node(Some("True"), "4", "16Gi", "15050Mi")]);
        assert!(!worth_writing(Some(&base), &jitter), "0.3% allocatable jitter");
        let drop = report(&[node(Some("True"), "4", "16Gi", "14000Mi")]);
        assert!(worth_writing(Some(&base), &drop), "6.7% allocatable drop");
        let added = report(&[
            node(Some("True"), "4", "16Gi", "15000Mi"),
            node(Some("True"), "4", "16Gi", "15000Mi"),
        ]);
        assert!(worth_writing(Some(&base), &added), "a new node");
        let not_ready = report(&[node(Some("False"), "4", "16Gi", "15000Mi")]);
        assert!(worth_writing(Some(&base), &not_ready), "a node went NotReady");
        let mut unhealthy = base.clone();
        unhealthy.health.readyz = !base.health.readyz;
        assert!(
            worth_writing(Some(&base), &unhealthy),
            "the API server's health changed"
        );
    }

    #[test]
    fn api_server_healthy_keeps_its_transition_time_until_health_changes() {
        let t0 = Timestamp::from_second(1_000).unwrap();
        let t1 = Timestamp::from_second(1_300).unwrap();
        let mut r = Report {
            health: ApiServerHealth {
                livez: true,
                readyz: true,
            },
            ..Report::default()
        };
        let first = status(&r, "https://m", &[], None, t0);
        // The 5-minute refresh writes again with nothing changed: the condition stays put.
        let refresh = status(&r, "https://m", &first.conditions, Some(t1), t1);
        assert_eq!(refresh.conditions, first.conditions);
        assert_eq!(refresh.last_report_time, Some(Time(t1)));
        assert_eq!(refresh.last_heartbeat_time, Some(Time(t1)));
        r.health.readyz = false;
        let sick = status(&r, "https://m", &refresh.conditions, None, t1);
        assert_eq!(sick.conditions[0].last_transition_time, Time(t1));
        assert_eq!(sick.conditions[0].reason, Reason::HealthCheckFailed);
    }
}
