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
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use tether_api::ManagedClusterSpec;

    fn cond(type_: ConditionType, status: Status, reason: Reason) -> Condition {
        Condition {
            type_: type_.as_str().into(),
            status: status.as_str().into(),
            reason: reason.as_str().into(),
            message: "m".into(),
            last_transition_time: Time(Timestamp::UNIX_EPOCH),
            observed_generation: None,
        }
    }

    fn member(conditions: Vec<Condition>, deleting: bool) -> ManagedCluster {
        let mut mc = ManagedCluster::new(
            "east",
            ManagedClusterSpec {
                cluster_id: "id-east".into(),
                cluster_set: "prod".into(),
            },
        );
        mc.metadata.namespace = Some("tether-prod-east-1".into());
        if deleting {
            mc.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        }
        mc.status = Some(tether_api::ManagedClusterStatus {
            conditions,
            kubernetes_version: Some("v1.37.2".into()),
            capacity: BTreeMap::from([("cpu".into(), Quantity("4".into()))]),
            allocatable: BTreeMap::from([("cpu".into(), Quantity("3900m".into()))]),
            properties: [
                ("zone.example.com", "eu-west-1a"),
                // What a member may not claim: another ID, another set, Tether's own names.
                ("cluster.clusterset.k8s.io", "someone-else"),
                ("clusterset.k8s.io", "other-set"),
                ("multicluster.tether.dev/capacity.cpu", "9999"),
            ]
            .map(|(name, value)| tether_api::managedcluster::PropertyValue {
                name: name.into(),
                value: value.into(),
            })
            .to_vec(),
            ..Default::default()
        });
        mc
    }

    fn set() -> SetRef {
        SetRef {
            namespace: "tether-system".into(),
            name: "prod".into(),
        }
    }

    fn access() -> Access {
        Access {
            server: "https://leader.example:6443/".into(),
            ca_pem: "PEM".into(),
        }
    }

    fn verdict(p: &ClusterProfileStatus, type_: &str) -> (String, String) {
        let c = p.conditions.iter().find(|c| c.type_ == type_).expect("condition");
        (c.status.clone(), c.reason.clone())
    }

    #[test]
    fn joined_and_control_plane_follow_the_member() {
        use ConditionType::{ApiServerHealthy, Ready};
        let healthy = cond(ApiServerHealthy, Status::True, Reason::LivezReadyzOK);
        let sick = cond(ApiServerHealthy, Status::False, Reason::HealthCheckFailed);
        let ready = cond(Ready, Status::True, Reason::TunnelAlive);
        let lost = cond(Ready, Status::Unknown, Reason::TunnelLost);
        let pending = cond(Ready, Status::Unknown, Reason::AwaitingHeartbeat);
        let table = [
            (
                vec![ready.clone(), healthy.clone()],
                false,
                ("True", "Joined"),
                ("True", "Healthy"),
            ),
            (
                vec![ready.clone(), sick],
                false,
                ("True", "Joined"),
                ("False", "Unhealthy"),
            ),
            (
                vec![ready.clone()],
                false,
                ("True", "Joined"),
                ("Unknown", "NotReported"),
            ),
            (
                vec![lost, healthy.clone()],
                false,
                ("Unknown", "Lost"),
                ("Unknown", "MemberNotReady"),
            ),
            (
                vec![pending],
                false,
                ("False", "Pending"),
                ("Unknown", "MemberNotReady"),
            ),
            (vec![], false, ("False", "Pending"), ("Unknown", "MemberNotReady")),
            (
                vec![ready, healthy],
                true,
                ("False", "Leaving"),
                ("True", "Healthy"),
            ),
        ];
        for (conditions, deleting, joined, plane) in table {
            let mc = member(conditions.clone(), deleting);
            let (_, status) = profile(&mc, &set(), "inv", &access(), None, Timestamp::UNIX_EPOCH);
            let s = |(a, b): (&str, &str)| (a.to_string(), b.to_string());
            assert_eq!(
                verdict(&status, JOINED),
                s(joined),
                "{conditions:?} deleting={deleting}"
            );
            assert_eq!(
                verdict(&status, CONTROL_PLANE_HEALTHY),
                s(plane),
                "{conditions:?}"
            );
        }
    }

    #[test]
    fn a_profile_names_the_member_its_set_and_the_way_in() {
        let mc = member(vec![], false);
        let (obj, status) = profile(&mc, &set(), "inv", &access(), None, Timestamp::UNIX_EPOCH);
        assert_eq!(obj.name_any(), "east");
        assert_eq!(obj.namespace().as_deref(), Some("inv"));
        assert_eq!(obj.labels()[CLUSTER_MANAGER_LABEL], "tether");
        assert_eq!(obj.labels()[CLUSTER_SET_LABEL], "prod");
        assert_eq!(owner(&obj), Some(("tether-prod-east-1".into(), "east".into())));
        assert_eq!(obj.spec.cluster_manager.name, "tether");
        assert_eq!(
            status.version.and_then(|v| v.kubernetes).as_deref(),
            Some("v1.37.2")
        );
        let props: Vec<(&str, &str)> = status
            .properties
            .iter()
            .map(|p| (p.name.as_str(), p.value.as_str()))
            .collect();
        assert_eq!(
            props,
            [
                ("cluster.clusterset.k8s.io", "id-east"),
                ("clusterset.k8s.io", "prod"),
                ("zone.example.com", "eu-west-1a"),
                ("multicluster.tether.dev/capacity.cpu", "4"),
                ("multicluster.tether.dev/allocatable.cpu", "3900m"),
            ]
        );
        let [p] = status.access_providers.as_slice() else {
            panic!()
        };
        assert_eq!(p.name, "tether");
        assert_eq!(
            p.cluster.server.as_deref(),
            Some(
                "https://leader.example:6443/apis/proxy.multicluster.tether.dev/v1alpha1/namespaces/tether-prod-east-1/managedclusters/east/proxy"
            )
        );
        assert_eq!(p.cluster.certificate_authority_data.as_deref(), Some("UEVN"));
        let ext = &p.cluster.extensions.as_ref().expect("extensions")[0];
        assert_eq!(ext.name, EXEC_EXTENSION);
        assert_eq!(
            ext.extension,
            serde_json::json!({"clusterName": "east", "clusterSet": "prod", "namespace": "tether-prod-east-1"})
        );
    }

    #[test]
    fn an_unchanged_verdict_keeps_its_time_and_needs_no_write() {
        let mc = member(
            vec![cond(ConditionType::Ready, Status::True, Reason::TunnelAlive)],
            false,
        );
        let t0 = Timestamp::UNIX_EPOCH;
        let (mut current, status) = profile(&mc, &set(), "inv", &access(), None, t0);
        current.status = Some(status);
        let later = Timestamp::from_second(1_000).expect("time");
        let (want, again) = profile(&mc, &set(), "inv", &access(), Some(&current), later);
        assert!(again.conditions.iter().all(|c| c.last_transition_time.0 == t0));
        assert!(up_to_date(&current, &want, &again), "nothing to write");

        let lost = member(
            vec![cond(ConditionType::Ready, Status::Unknown, Reason::TunnelLost)],
            false,
        );
        let (want, changed) = profile(&lost, &set(), "inv", &access(), Some(&current), later);
        assert!(!up_to_date(&current, &want, &changed));
        let joined = changed
            .conditions
            .iter()
            .find(|c| c.type_ == JOINED)
            .expect("Joined");
        assert_eq!(joined.last_transition_time.0, later, "a new verdict, a new time");
    }
}
