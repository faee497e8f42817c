//! What a member's ClusterProfile says, as a pure function of its ManagedCluster and its set
//! (docs/design.md, "ClusterProfiles", maps it field by field), and whether a cached profile
//! already says it.

use std::collections::{BTreeMap, HashSet};

use base64::Engine as _;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::ObjectMeta;
use kube::{Resource, ResourceExt};
use tether_api::conditions::{ConditionType, Reason, Status};
use tether_api::inventory::{
    ACCESS_PROVIDER, AccessProvider, CLUSTER_MANAGER, CLUSTER_MANAGER_LABEL, CLUSTER_SET_LABEL,
    CONTROL_PLANE_HEALTHY, ClusterManager, ClusterProfile, ClusterProfileSpec, ClusterProfileStatus,
    ClusterVersion, EXEC_EXTENSION, ExecExtension, JOINED, Property,
};
use tether_api::{ManagedCluster, SetRef, labels};

/// Prefix of the properties Tether adds besides the member's ClusterProperties.
pub const PROPERTY_PREFIX: &str = "multicluster.tether.dev/";

/// A member: its dedicated namespace and ManagedCluster name.
pub(super) type Member = (String, String);

/// The member a profile of Tether's belongs to.
pub(super) fn owner(p: &ClusterProfile) -> Option<Member> {
    let l = p.labels();
    Some((
        l.get(labels::MEMBER_NAMESPACE)?.clone(),
        l.get(labels::CLUSTER_NAME)?.clone(),
    ))
}

/// Where consumers reach members: the leader's API server as members reach it, and its CA.
#[derive(Clone, Debug)]
pub struct Access {
    /// The leader's URL (its certificate must name this host: the upstream access library
    /// ignores `tls-server-name`).
    pub server: String,
    /// The leader's CA bundle (PEM).
    pub ca_pem: String,
}

/// The profile `mc` of set `spec` publishes: metadata and spec, and the status (whose condition
/// times are `now` unless `current` already holds the same verdict).
pub fn profile(
    mc: &ManagedCluster,
    set: &SetRef,
    namespace: &str,
    access: &Access,
    current: Option<&ClusterProfile>,
    now: Timestamp,
) -> (ClusterProfile, ClusterProfileStatus) {
    let member_ns = mc.namespace().unwrap_or_default();
    let name = mc.name_any();
    let meta = ObjectMeta {
        name: Some(name.clone()),
        namespace: Some(namespace.to_string()),
        labels: Some(BTreeMap::from([
            (CLUSTER_MANAGER_LABEL.to_string(), CLUSTER_MANAGER.to_string()),
            (CLUSTER_SET_LABEL.to_string(), set.name.clone()),
            (labels::CLUSTER_SET_NAMESPACE.to_string(), set.namespace.clone()),
            (labels::CLUSTER_NAME.to_string(), name.clone()),
            (labels::MEMBER_NAMESPACE.to_string(), member_ns.clone()),
        ])),
        ..ObjectMeta::default()
    };
    let obj = ClusterProfile {
        metadata: meta,
        spec: ClusterProfileSpec {
            display_name: Some(name.clone()),
            cluster_manager: ClusterManager {
                name: CLUSTER_MANAGER.into(),
            },
        },
        status: None,
    };
    let before = current.and_then(|c| c.status.as_ref());
    let status = ClusterProfileStatus {
        conditions: [joined(mc), control_plane(mc)]
            .into_iter()
            .map(|(type_, status, reason, message)| condition(before, type_, status, reason, message, now))
            .collect(),
        version: mc
            .status
            .as_ref()
            .and_then(|s| s.kubernetes_version.clone())
            .map(|v| ClusterVersion { kubernetes: Some(v) }),
        properties: properties(mc, set),
        access_providers: vec![provider(mc, set, &member_ns, access)],
    };
    (obj, status)
}

/// `Joined`: the member is Ready; pending its first heartbeat; lost; or leaving. The messages
/// are fixed per verdict (a lost member's names Ready's reason), so that a verdict that holds
/// never costs a write when the ManagedCluster's own wording changes.
fn joined(mc: &ManagedCluster) -> (&'static str, Status, &'static str, String) {
    if mc.meta().deletion_timestamp.is_some() {
        return (
            JOINED,
            Status::False,
            "Leaving",
            "the member is leaving the set".into(),
        );
    }
    match ready(mc) {
        Some(c) if c.status == Status::True.as_str() => (
            JOINED,
            Status::True,
            "Joined",
            "the member is Ready: its agent heartbeats".into(),
        ),
        Some(c) if c.reason != Reason::AwaitingHeartbeat => (
            JOINED,
            Status::Unknown,
            "Lost",
            format!(
                "the member is not Ready ({}): the leader lost sight of its agent",
                c.reason
            ),
        ),
        _ => (
            JOINED,
            Status::False,
            "Pending",
            "approved; waiting for the agent's first heartbeat".into(),
        ),
    }
}

/// `ControlPlaneHealthy`: the member's report of its API server's `/livez` and `/readyz`; Unknown
/// while the member is not Ready (its last report may be stale) or has not reported.
fn control_plane(mc: &ManagedCluster) -> (&'static str, Status, &'static str, String) {
    if ready(mc).is_none_or(|c| c.status != Status::True.as_str()) {
        return (
            CONTROL_PLANE_HEALTHY,
            Status::Unknown,
            "MemberNotReady",
            "the member is not Ready, so its last health report may be stale".into(),
        );
    }
    let reported = mc.status.as_ref().and_then(|s| {
        s.conditions
            .iter()
            .find(|c| c.type_ == ConditionType::ApiServerHealthy)
    });
    match reported {
        Some(c) if c.status == Status::True.as_str() => {
            (CONTROL_PLANE_HEALTHY, Status::True, "Healthy", c.message.clone())
        }
        Some(c) if c.status == Status::False.as_str() => (
            CONTROL_PLANE_HEALTHY,
            Status::False,
            "Unhealthy",
            c.message.clone(),
        ),
        _ => (
            CONTROL_PLANE_HEALTHY,
            Status::Unknown,
            "NotReported",
            "the member's agent has not reported its API server's health yet".into(),
        ),
    }
}

fn ready(mc: &ManagedCluster) -> Option<&Condition> {
    mc.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == ConditionType::Ready))
}

/// A condition with the transition time of `before`'s condition of the same type if that one
/// says the same, else `now`.
fn condition(
    before: Option<&ClusterProfileStatus>,
    type_: &str,
    status: Status,
    reason: &str,
    message: String,
    now: Timestamp,
) -> Condition {
    let same = before
        .and_then(|b| b.conditions.iter().find(|c| c.type_ == type_))
        .filter(|c| c.status == status.as_str() && c.reason == reason);
    Condition {
        type_: type_.into(),
        status: status.as_str().into(),
        reason: reason.into(),
        // NB: upstream bounds a message to 32 KiB; the member's own text is much shorter.
        message: message.chars().take(1024).collect(),
        last_transition_time: same.map(|c| c.last_transition_time.clone()).unwrap_or(Time(now)),
        observed_generation: None,
    }
}

/// The member's ID and set as the leader knows them (`cluster.clusterset.k8s.io`,
/// `clusterset.k8s.io`), then the member's other KEP-2149 ClusterProperties as its agent reports
/// them, then its capacity and allocatable resources, each as
/// `multicluster.tether.dev/capacity.<resource>` and `multicluster.tether.dev/allocatable.<resource>`,
/// and its platform. NB: a member reports what it likes; the names the leader vouches for (the ID,
/// the set, and `multicluster.tether.dev/`) are never taken from it.
fn properties(mc: &ManagedCluster, set: &SetRef) -> Vec<Property> {
    let status = mc.status.as_ref();
    let owned = |name: &str| {
        name == tether_api::properties::CLUSTER_ID
            || name == tether_api::properties::CLUSTER_SET
            || name.starts_with(PROPERTY_PREFIX)
    };
    let mut props = vec![
        Property {
            name: tether_api::properties::CLUSTER_ID.into(),
            value: mc.spec.cluster_id.clone(),
        },
        Property {
            name: tether_api::properties::CLUSTER_SET.into(),
            value: set.name.clone(),
        },
    ];
    props.extend(
        status
            .iter()
            .flat_map(|s| &s.properties)
            .filter(|p| !owned(&p.name))
            .map(|p| Property {
                name: p.name.clone(),
                value: p.value.clone(),
            }),
    );
    if let Some(s) = status {
        for (kind, map) in [("capacity", &s.capacity), ("allocatable", &s.allocatable)] {
            for (resource, q) in map {
                props.push(Property {
                    name: format!("{PROPERTY_PREFIX}{kind}.{resource}"),
                    value: q.0.clone(),
                });
            }
        }
        if let Some(p) = s.platform.as_ref().filter(|p| !p.is_empty()) {
            props.push(Property {
                name: format!("{PROPERTY_PREFIX}platform"),
                value: p.clone(),
            });
        }
    }
    // NB: upstream bounds names to 253 and values to 1,024 characters, requires both, and keys
    // the list by name.
    let mut seen = HashSet::new();
    props.retain(|p| {
        !p.value.is_empty()
            && p.value.chars().count() <= 1024
            && p.name.len() <= 253
            && seen.insert(p.name.clone())
    });
    props
}

/// The `tether` access provider: the member's proxy path on the leader, the leader's CA, and
/// what `tether credential` is told of the member.
fn provider(mc: &ManagedCluster, set: &SetRef, member_ns: &str, access: &Access) -> AccessProvider {
    let ext = ExecExtension {
        cluster_name: mc.name_any(),
        cluster_set: set.name.clone(),
        namespace: member_ns.to_string(),
    };
    let cluster = kube::config::Cluster {
        server: Some(format!(
            "{}{}",
            access.server.trim_end_matches('/'),
            tether_tunnel::proxy_path(member_ns, &mc.name_any())
        )),
        certificate_authority_data: Some(base64::engine::general_purpose::STANDARD.encode(&access.ca_pem)),
        extensions: Some(vec![kube::config::NamedExtension {
            name: EXEC_EXTENSION.into(),
            extension: serde_json::to_value(&ext).unwrap_or_default(),
        }]),
        ..kube::config::Cluster::default()
    };
    AccessProvider {
        name: ACCESS_PROVIDER.into(),
        cluster,
    }
}

/// Whether `current` already says what `want` and `status` say (condition times aside).
pub fn up_to_date(current: &ClusterProfile, want: &ClusterProfile, status: &ClusterProfileStatus) -> bool {
    let verdicts = |s: &ClusterProfileStatus| -> Vec<(String, String, String, String)> {
        s.conditions
            .iter()
            .map(|c| {
                (
                    c.type_.clone(),
                    c.status.clone(),
                    c.reason.clone(),
                    c.message.clone(),
                )
            })
            .collect()
    };
    let have = current.status.clone().unwrap_or_default();
    labels_hold(current, want)
        && current.spec == want.spec
        && verdicts(&have) == verdicts(status)
        && have.version == status.version
        && have.properties == status.properties
        && have.access_providers == status.access_providers
}

/// Whether `current` carries every label `want` sets.
pub(super) fn labels_hold(current: &ClusterProfile, want: &ClusterProfile) -> bool {
    want.labels()
        .iter()
        .all(|(k, v)| current.labels().get(k) == Some(v))
}

#[cfg(test)]
mod tests;
