//! The mapping from a ManagedCluster to its ClusterProfile, by table.

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
            public_key: None,
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
