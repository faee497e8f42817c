//! The objects an approved member gets on the leader, built as pure values: its namespace, its
//! ServiceAccount, a Role confining it to its own ManagedCluster status, its announce, its
//! heartbeat Lease and its own token renewal, the ManagedCluster, the MemberClusterAnnounce slot
//! and the heartbeat Lease.

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::ResourceExt;
use kube::api::ObjectMeta;
use tether_api::clusterset::LeaderSpec;
use tether_api::{
    ClusterRegistrationRequest, ManagedCluster, ManagedClusterSpec, MemberClusterAnnounce,
    MemberClusterAnnounceSpec, SetRef, annotations, labels,
};

use crate::naming::{AGENT_ROLE, AGENT_SERVICE_ACCOUNT};

/// The field manager of everything the leader writes.
pub const FIELD_MANAGER: &str = "tether-leader";

/// Everything one member needs on the leader.
pub struct MemberObjects {
    /// The dedicated namespace.
    pub namespace: Namespace,
    /// The agent's identity.
    pub service_account: ServiceAccount,
    /// What the agent may do.
    pub role: Role,
    /// Binds the Role to the ServiceAccount.
    pub role_binding: RoleBinding,
    /// The leader's record of the member.
    pub managed_cluster: ManagedCluster,
    /// The member's record of who it is (and, for agents from before Leases, its heartbeat).
    pub announce: MemberClusterAnnounce,
    /// The heartbeat the agent renews.
    pub lease: Lease,
}

/// The annotations of a heartbeat Lease that tell the agent the set's intervals.
pub const LEASE_ANNOTATIONS: [&str; 3] = [
    annotations::HEARTBEAT_INTERVAL,
    annotations::TUNNEL_HEARTBEAT_INTERVAL,
    annotations::TUNNEL_PING_INTERVAL,
];

/// Member `name`'s heartbeat Lease (named as the member, in its namespace): held by its cluster
/// ID, valid for the set's grace period, and annotated with the intervals the agent renews it
/// and pings its tunnel at. The agent may only renew it (`update`/`patch` by name).
pub fn heartbeat_lease(set: &SetRef, namespace: &str, name: &str, id: &str, policy: &LeaderSpec) -> Lease {
    let seconds = |d: std::time::Duration| d.as_secs().max(1).to_string();
    Lease {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(namespace.to_string()),
            labels: Some(member_labels(set, name, id)),
            annotations: Some(BTreeMap::from([
                (
                    annotations::HEARTBEAT_INTERVAL.to_string(),
                    seconds(policy.heartbeat()),
                ),
                (
                    annotations::TUNNEL_HEARTBEAT_INTERVAL.to_string(),
                    seconds(policy.tunnel_heartbeat()),
                ),
                (
                    annotations::TUNNEL_PING_INTERVAL.to_string(),
                    seconds(policy.ping()),
                ),
            ])),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(id.to_string()),
            lease_duration_seconds: Some(policy.grace().as_secs().clamp(1, i32::MAX as u64) as i32),
            ..LeaseSpec::default()
        }),
    }
}

/// Labels identifying a member's objects: its set (namespace and name), its name and ID.
pub fn member_labels(set: &SetRef, name: &str, id: &str) -> BTreeMap<String, String> {
    let mut l = set.labels();
    l.extend([
        (labels::CLUSTER_NAME.to_string(), name.to_string()),
        (labels::MANAGED_BY.to_string(), FIELD_MANAGER.to_string()),
    ]);
    // NB: label values are limited to 63 characters; longer IDs (allowed up to 128) are only in specs.
    if id.len() <= 63 {
        l.insert(labels::CLUSTER_ID.to_string(), id.to_string());
    }
    l
}

/// What member `name`'s agent may do on the leader: read the member records, write only its own
/// status, announce and heartbeat Lease, renew its own token and attach its own tunnel.
pub fn agent_rules(name: &str) -> Vec<PolicyRule> {
    let rule = |resources: &[&str], verbs: &[&str], names: Option<&str>, group: &str| PolicyRule {
        api_groups: Some(vec![group.to_string()]),
        resources: Some(resources.iter().map(|r| r.to_string()).collect()),
        verbs: verbs.iter().map(|v| v.to_string()).collect(),
        resource_names: names.map(|n| vec![n.to_string()]),
        ..PolicyRule::default()
    };
    let group = tether_api::GROUP;
    vec![
        rule(&["managedclusters"], &["get", "list", "watch"], None, group),
        rule(
            &["managedclusters/status"],
            &["get", "patch", "update"],
            Some(name),
            group,
        ),
        rule(
            &["memberclusterannounces"],
            &["get", "list", "watch"],
            None,
            group,
        ),
        rule(
            &["memberclusterannounces"],
            &["patch", "update", "delete"],
            Some(name),
            group,
        ),
        // NB: update and patch only: the leader creates the Lease, so the agent needs no
        // `create` (which RBAC cannot confine to one name).
        rule(
            &["leases"],
            &["get", "patch", "update"],
            Some(name),
            "coordination.k8s.io",
        ),
        rule(
            &["serviceaccounts/token"],
            &["create"],
            Some(AGENT_SERVICE_ACCOUNT),
            "",
        ),
        // Member access: the agent attaches the tunnel of its own member only.
        rule(
            &[&format!("{}/{}", tether_tunnel::RESOURCE, tether_tunnel::ATTACH)],
            &["get"],
            Some(name),
            tether_tunnel::GROUP,
        ),
    ]
}

/// The agent Role of member `name` in its namespace.
fn agent_role(namespace: &str, name: &str, labels: BTreeMap<String, String>) -> Role {
    Role {
        metadata: ObjectMeta {
            name: Some(AGENT_ROLE.to_string()),
            namespace: Some(namespace.to_string()),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        rules: Some(agent_rules(name)),
    }
}

/// The Role to apply in place of `existing`, an agent Role an earlier leader version made, when
/// its rules are not this version's (a member approved before member access lacks `attach`);
/// `None` when it is current or not a leader-made agent Role. The labels are the leader's own
/// (whatever an admin added stays theirs), so the apply changes the rules only.
pub fn outdated_agent_role(existing: &Role) -> Option<Role> {
    let l = existing.labels();
    let name = l.get(labels::CLUSTER_NAME)?;
    if existing.metadata.name.as_deref() != Some(AGENT_ROLE)
        || l.get(labels::MANAGED_BY).map(String::as_str) != Some(FIELD_MANAGER)
    {
        return None;
    }
    let want = agent_rules(name);
    if existing.rules.as_ref() == Some(&want) {
        return None;
    }
    let own = [
        labels::CLUSTER_SET,
        labels::CLUSTER_SET_NAMESPACE,
        labels::CLUSTER_NAME,
        labels::CLUSTER_ID,
        labels::MANAGED_BY,
    ];
    let kept = l
        .iter()
        .filter(|(k, _)| own.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    Some(agent_role(&existing.namespace()?, name, kept))
}

/// The labels a request asks for that a member may carry: never a reserved key (the CRD refuses
/// them, but a request made before that rule or under an edited CRD must not plant them either),
/// and the leader's own labels are applied after these, so they win.
fn requested_labels(req: &ClusterRegistrationRequest) -> impl Iterator<Item = (String, String)> + '_ {
    req.spec
        .labels
        .iter()
        .filter(|(k, _)| !labels::is_reserved(k))
        .map(|(k, v)| (k.clone(), v.clone()))
}

/// Builds the member's objects for an approved request.
pub fn member_objects(
    req: &ClusterRegistrationRequest,
    set: &SetRef,
    namespace: &str,
    policy: &LeaderSpec,
) -> MemberObjects {
    let name = req.spec.cluster_name.as_str();
    let id = req.spec.cluster_id.as_str();
    let lbl = member_labels(set, name, id);
    let meta = |n: &str| ObjectMeta {
        name: Some(n.to_string()),
        namespace: Some(namespace.to_string()),
        labels: Some(lbl.clone()),
        ..ObjectMeta::default()
    };
    let role = agent_role(namespace, name, lbl.clone());
    let role_binding = RoleBinding {
        metadata: meta(AGENT_ROLE),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: AGENT_ROLE.into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: AGENT_SERVICE_ACCOUNT.into(),
            namespace: Some(namespace.to_string()),
            ..Subject::default()
        }]),
    };
    let mut managed_cluster = ManagedCluster::new(
        name,
        ManagedClusterSpec {
            cluster_id: id.into(),
            cluster_set: set.name.clone(),
            public_key: Some(req.spec.public_key.clone()),
        },
    );
    let mut mc_annotations = BTreeMap::new();
    if let Some(v) = req.spec.agent_version.as_ref() {
        mc_annotations.insert(annotations::REGISTERED_AGENT_VERSION.to_string(), v.clone());
    }
    managed_cluster.metadata = ObjectMeta {
        annotations: Some(mc_annotations),
        labels: Some(requested_labels(req).chain(lbl.clone()).collect()),
        ..meta(name)
    };
    let mut announce = MemberClusterAnnounce::new(
        name,
        MemberClusterAnnounceSpec {
            cluster_id: id.into(),
            renew_time: None,
            heartbeat_interval_seconds: Some(policy.heartbeat().as_secs().clamp(1, 600) as i32),
        },
    );
    announce.metadata = meta(name);
    let lease = heartbeat_lease(set, namespace, name, id, policy);
    MemberObjects {
        namespace: Namespace {
            metadata: ObjectMeta {
                name: Some(namespace.to_string()),
                labels: Some(lbl.clone()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        },
        service_account: ServiceAccount {
            metadata: meta(AGENT_SERVICE_ACCOUNT),
            ..ServiceAccount::default()
        },
        role,
        role_binding,
        managed_cluster,
        announce,
        lease,
    }
}

/// Whether `ns` is the dedicated namespace the leader created for member `name` of `set`: the
/// leader adopts no other (an admin's namespace, or one of another member or set).
pub fn is_members_namespace(ns: &Namespace, set: &SetRef, name: &str) -> bool {
    let l = ns.labels();
    set.owns(l)
        && l.get(labels::CLUSTER_NAME).map(String::as_str) == Some(name)
        && l.get(labels::MANAGED_BY).map(String::as_str) == Some(FIELD_MANAGER)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tether_api::ClusterRegistrationRequestSpec;

    #[test]
    fn a_request_cannot_plant_another_sets_labels_or_any_reserved_key() {
        let asked = BTreeMap::from(
            [
                (labels::CLUSTER_SET, "prod"),
                (labels::CLUSTER_SET_NAMESPACE, "tether-system"),
                (labels::CLUSTER_NAME, "someone-else"),
                (labels::CLUSTER_ID, "other-id"),
                (labels::MANAGED_BY, "me"),
                ("tether.dev/owner", "x"),
                ("kubernetes.io/hostname", "x"),
                ("k8s.io/x", "x"),
                ("multicluster.x-k8s.io/clusterset", "prod"),
                ("region", "eu"),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string())),
        );
        let req = ClusterRegistrationRequest::new(
            "east-1",
            ClusterRegistrationRequestSpec {
                cluster_id: "id-1".into(),
                cluster_name: "east".into(),
                public_key: "age1...".into(),
                agent_version: None,
                labels: asked,
            },
        );
        let set = SetRef::new("tether-dev", "dev");
        let objs = member_objects(&req, &set, "tether-dev-east", &LeaderSpec::default());
        let mut expected = member_labels(&set, "east", "id-1");
        expected.insert("region".into(), "eu".into());
        assert_eq!(objs.managed_cluster.labels(), &expected);
    }

    #[test]
    fn the_managed_cluster_carries_the_agent_version_it_registered_with() {
        let spec = |v: Option<&str>| ClusterRegistrationRequestSpec {
            cluster_id: "id-1".into(),
            cluster_name: "east".into(),
            public_key: "age1...".into(),
            agent_version: v.map(String::from),
            labels: BTreeMap::new(),
        };
        let set = SetRef::new("tether-system", "prod");
        let version = |v| {
            let req = ClusterRegistrationRequest::new("east-1", spec(v));
            let objs = member_objects(&req, &set, "tether-prod-east", &LeaderSpec::default());
            objs.managed_cluster
                .annotations()
                .get(annotations::REGISTERED_AGENT_VERSION)
                .cloned()
        };
        assert_eq!(version(Some("0.2.0")).as_deref(), Some("0.2.0"));
        assert_eq!(
            version(None),
            None,
            "an agent that sent none: judged from its first report"
        );
    }

    #[test]
    fn agent_role_grants_only_its_own_objects() {
        let req = ClusterRegistrationRequest::new(
            "east-1",
            ClusterRegistrationRequestSpec {
                cluster_id: "id-1".into(),
                cluster_name: "east".into(),
                public_key: "age1...".into(),
                agent_version: None,
                labels: BTreeMap::from([("region".to_string(), "eu".to_string())]),
            },
        );
        let set = SetRef::new("tether-system", "prod");
        let objs = member_objects(&req, &set, "tether-prod-east", &LeaderSpec::default());
        let rules = objs.role.rules.unwrap();
        for r in &rules {
            let writes = r
                .verbs
                .iter()
                .any(|v| !["get", "list", "watch"].contains(&v.as_str()));
            assert!(
                !writes || r.resource_names.is_some(),
                "write rule without resourceNames: {r:?}"
            );
            assert!(
                !r.verbs.contains(&"*".to_string())
                    && !r.resources.as_ref().unwrap().contains(&"*".to_string())
            );
            assert!(
                !r.resources.as_ref().unwrap().iter().any(|x| x == "secrets"),
                "no Secret access"
            );
        }
        assert_eq!(
            objs.managed_cluster.labels().get("region").map(String::as_str),
            Some("eu")
        );
        assert_eq!(
            objs.managed_cluster
                .labels()
                .get(labels::CLUSTER_SET)
                .map(String::as_str),
            Some("prod")
        );
        assert_eq!(objs.announce.spec.heartbeat_interval_seconds, Some(10));
        let leases: Vec<_> = rules
            .iter()
            .filter(|r| r.resources.as_deref() == Some(&["leases".to_string()]))
            .collect();
        assert_eq!(leases.len(), 1, "one Lease rule");
        assert_eq!(
            leases[0].resource_names.as_deref(),
            Some(&["east".to_string()][..])
        );
        assert!(
            !leases[0]
                .verbs
                .iter()
                .any(|v| v == "create" || v == "delete" || v == "list"),
            "the agent only renews its Lease: {:?}",
            leases[0].verbs
        );
        // The Lease tells the agent the set's intervals, and is the member's alone.
        let lease = &objs.lease;
        assert_eq!(lease.metadata.name.as_deref(), Some("east"));
        assert_eq!(lease.metadata.namespace.as_deref(), Some("tether-prod-east"));
        let a = lease.annotations();
        assert_eq!(
            a.get(annotations::HEARTBEAT_INTERVAL).map(String::as_str),
            Some("10")
        );
        assert_eq!(
            a.get(annotations::TUNNEL_HEARTBEAT_INTERVAL).map(String::as_str),
            Some("300")
        );
        assert_eq!(
            a.get(annotations::TUNNEL_PING_INTERVAL).map(String::as_str),
            Some("5")
        );
        let spec = lease.spec.as_ref().unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some("id-1"));
        assert_eq!(spec.lease_duration_seconds, Some(40));
        assert!(spec.renew_time.is_none(), "the agent renews it");
        assert!(objs.namespace.metadata.namespace.is_none());
        assert!(is_members_namespace(&objs.namespace, &set, "east"));
        assert!(!is_members_namespace(
            &objs.namespace,
            &SetRef::new("other", "prod"),
            "east"
        ));
        assert!(!is_members_namespace(&objs.namespace, &set, "west"));
        assert!(
            !is_members_namespace(&Namespace::default(), &set, "east"),
            "an unlabelled namespace is not adopted"
        );
    }

    #[test]
    fn an_agent_role_of_an_earlier_version_is_brought_up_to_date() {
        let set = SetRef::new("tether-system", "prod");
        let ns = "tether-prod-east";
        let mut lbl = member_labels(&set, "east", "id-1");
        let current = agent_role(ns, "east", lbl.clone());
        assert!(
            outdated_agent_role(&current).is_none(),
            "a current Role is left alone"
        );

        // As a leader before member access made it: no `attach` rule; an admin added a label.
        let mut old = current.clone();
        old.rules.as_mut().unwrap().pop();
        old.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("team".into(), "ops".into());
        let fixed = outdated_agent_role(&old).expect("an outdated Role is updated");
        assert_eq!(fixed.rules, current.rules);
        assert_eq!(fixed.metadata.namespace.as_deref(), Some(ns));
        assert_eq!(
            fixed.metadata.labels, current.metadata.labels,
            "only the leader's labels"
        );

        // Not the leader's agent Role: never touched.
        let mut foreign = old.clone();
        foreign.metadata.name = Some("stray-attach".into());
        assert!(outdated_agent_role(&foreign).is_none());
        lbl.remove(labels::MANAGED_BY);
        let mut unmanaged = old;
        unmanaged.metadata.labels = Some(lbl);
        assert!(outdated_agent_role(&unmanaged).is_none());
    }
}
