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
use tether_api::managedcluster::{
    ApiServerHealth, MAX_PROPERTIES, MAX_PROPERTY_VALUE, NodeCounts, PropertyValue,
};
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
    /// The member's `about.k8s.io` ClusterProperties, by name.
    pub properties: Vec<PropertyValue>,
}

/// The ClusterProperties worth reporting: sorted by name, at most `MAX_PROPERTIES`, none with an
/// empty value or one longer than `MAX_PROPERTY_VALUE` characters.
pub fn properties(all: impl IntoIterator<Item = (String, String)>) -> Vec<PropertyValue> {
    let mut kept: Vec<PropertyValue> = all
        .into_iter()
        .filter(|(name, value)| {
            !name.is_empty() && !value.is_empty() && value.chars().count() <= MAX_PROPERTY_VALUE as usize
        })
        .map(|(name, value)| PropertyValue { name, value })
        .collect();
    kept.sort();
    kept.truncate(MAX_PROPERTIES as usize);
    kept
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

/// Of a Node only what `summarize` reads: its name, its Ready condition's status (no times, no
/// message) and the summed resources of its capacity and allocatable. The node cache holds one
/// per node of the member, and kubelets rewrite the rest (heartbeat times, images, volumes)
/// every few seconds.
pub fn trim_node(node: &mut Node) {
    let meta = &mut node.metadata;
    *meta = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        name: meta.name.take(),
        namespace: meta.namespace.take(),
        ..Default::default()
    };
    node.spec = None;
    if let Some(status) = node.status.take() {
        let keep = |m: Option<BTreeMap<String, Quantity>>| {
            m.map(|m| {
                m.into_iter()
                    .filter(|(k, _)| RESOURCES.contains(&k.as_str()))
                    .collect::<BTreeMap<_, _>>()
            })
        };
        let ready = status
            .conditions
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == "Ready")
            .map(|c| k8s_openapi::api::core::v1::NodeCondition {
                type_: c.type_,
                status: c.status,
                ..Default::default()
            });
        node.status = Some(k8s_openapi::api::core::v1::NodeStatus {
            conditions: ready.map(|c| vec![c]),
            capacity: keep(status.capacity),
            allocatable: keep(status.allocatable),
            ..Default::default()
        });
    }
}

/// A fingerprint of what `summarize` reads of a trimmed node: equal fingerprints mean an update
/// that changes no report (a kubelet's heartbeat), so nothing needs recounting.
pub fn node_fingerprint(node: &Node) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    if let Some(s) = node.status.as_ref() {
        for c in s.conditions.iter().flatten() {
            (&c.type_, &c.status).hash(&mut h);
        }
        for m in [&s.capacity, &s.allocatable] {
            0u8.hash(&mut h);
            for (k, v) in m.iter().flatten() {
                (k, &v.0).hash(&mut h);
            }
        }
    }
    h.finish()
}

/// Whether `next` differs enough from the last written report to be written.
pub fn worth_writing(last: Option<&Report>, next: &Report) -> bool {
    let Some(last) = last else { return true };
    last.nodes != next.nodes
        || last.capacity != next.capacity
        || last.kubernetes_version != next.kubernetes_version
        || last.platform != next.platform
        || last.health != next.health
        || last.properties != next.properties
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
        properties: r.properties.clone(),
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
    #[test]
    fn cluster_properties_are_reported_sorted_bounded_and_never_empty() {
        let long = "x".repeat(1025);
        let mut all = vec![
            ("zone.example.com".to_string(), "eu-west-1a".to_string()),
            ("cluster.clusterset.k8s.io".to_string(), "id-1".to_string()),
            ("empty.example.com".to_string(), String::new()),
            ("long.example.com".to_string(), long),
        ];
        let got = super::properties(all.clone());
        let names: Vec<&str> = got.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["cluster.clusterset.k8s.io", "zone.example.com"]);
        for i in 0..100 {
            all.push((format!("p{i:03}.example.com"), "v".into()));
        }
        assert_eq!(super::properties(all).len(), 64);
    }

    #[test]
    fn a_new_or_changed_cluster_property_is_worth_a_write() {
        let last = super::Report::default();
        let mut next = last.clone();
        next.properties = super::properties([("zone.example.com".to_string(), "a".to_string())]);
        assert!(super::worth_writing(Some(&last), &next));
        let mut changed = next.clone();
        changed.properties[0].value = "b".into();
        assert!(super::worth_writing(Some(&next), &changed));
        assert!(!super::worth_writing(Some(&next), &next.clone()));
    }

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

    /// A node as a kubelet writes it: heartbeat times, images, addresses, labels, other conditions.
    fn kubelet_node(name: &str, ready: &str, beat: i64) -> Node {
        use k8s_openapi::api::core::v1::{ContainerImage, NodeAddress};
        let mut n = node(Some(ready), "8", "32Gi", "31Gi");
        n.metadata.name = Some(name.into());
        n.metadata.labels = Some([("kubernetes.io/hostname".to_string(), name.to_string())].into());
        n.metadata.resource_version = Some(beat.to_string());
        let st = n.status.as_mut().expect("status");
        let at = Time(Timestamp::from_second(beat).expect("time"));
        let cs = st.conditions.as_mut().expect("conditions");
        cs[0].last_heartbeat_time = Some(at.clone());
        cs[0].message = Some(format!("kubelet is posting ready status {beat}"));
        cs.push(NodeCondition {
            type_: "MemoryPressure".into(),
            status: "False".into(),
            last_heartbeat_time: Some(at),
            ..NodeCondition::default()
        });
        st.images = Some(
            (0..50)
                .map(|i| ContainerImage {
                    names: Some(vec![format!("registry.example/app-{i}@sha256:{beat:064}")]),
                    size_bytes: Some(1 << 20),
                })
                .collect(),
        );
        st.addresses = Some(vec![NodeAddress {
            type_: "InternalIP".into(),
            address: "10.0.0.1".into(),
        }]);
        n
    }

    #[test]
    fn a_trimmed_node_counts_the_same_and_a_heartbeat_does_not_change_its_fingerprint() {
        let full = [kubelet_node("a", "True", 10), kubelet_node("b", "False", 10)];
        let mut trimmed = full.clone();
        trimmed.iter_mut().for_each(trim_node);
        assert_eq!(summarize(full.iter()), summarize(trimmed.iter()));
        let t = &trimmed[0];
        assert_eq!(t.metadata.name.as_deref(), Some("a"));
        assert!(t.metadata.labels.is_none() && t.metadata.resource_version.is_none());
        let st = t.status.as_ref().expect("status");
        assert!(st.images.is_none() && st.addresses.is_none());
        assert_eq!(st.conditions.as_ref().map(Vec::len), Some(1));
        assert!(
            st.capacity
                .as_ref()
                .is_some_and(|c| !c.contains_key("hugepages-2Mi"))
        );
        let small = serde_json::to_vec(t).expect("json").len();
        let large = serde_json::to_vec(&full[0]).expect("json").len();
        assert!(small * 10 < large, "trimmed {small} bytes of {large}");

        let mut beat = kubelet_node("a", "True", 20);
        trim_node(&mut beat);
        assert_eq!(
            node_fingerprint(&beat),
            node_fingerprint(t),
            "a heartbeat changes nothing"
        );
        let mut down = kubelet_node("a", "False", 20);
        trim_node(&mut down);
        assert_ne!(node_fingerprint(&down), node_fingerprint(t), "readiness does");
        let mut bigger = kubelet_node("a", "True", 20);
        bigger
            .status
            .as_mut()
            .and_then(|s| s.allocatable.as_mut())
            .expect("alloc")
            .insert("pods".into(), Quantity("250".into()));
        trim_node(&mut bigger);
        assert_ne!(node_fingerprint(&bigger), node_fingerprint(t), "allocatable does");
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
