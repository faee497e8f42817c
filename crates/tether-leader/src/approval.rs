//! What an approved request needs done, decided without the API: a pure function of the
//! request, the member of that name the set already has, and the namespace found where the
//! member lives. `registration.rs` executes the plan.
//!
//! The rules:
//! - a member being deleted, or a namespace being deleted, is waited for;
//! - a member of that name with another cluster ID (an admin approved the replacement; the
//!   policy never does) is replaced: it goes first, since the ManagedCluster's ID is immutable
//!   and its old credential must die;
//! - the leader adopts no namespace it did not create for this very member;
//! - the same cluster with a new key (it lost its local state; an admin approved the new key)
//!   keeps its namespace and everything in it; its ServiceAccount and ManagedCluster are
//!   recreated, which revokes every token issued for the old key and binds the new one.

use k8s_openapi::api::core::v1::Namespace;
use kube::Resource;
use tether_api::registration::RegistrationReason;
use tether_api::{ClusterRegistrationRequest, ManagedCluster, SetRef};

use crate::provision::is_members_namespace;

/// What to do for an approved request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Look again shortly: the old member or its namespace is still being deleted.
    Requeue,
    /// Remove the existing member (another cluster under this name), then look again.
    Replace {
        /// The cluster ID being replaced.
        old_id: String,
    },
    /// Refuse the request.
    Deny {
        /// Why, machine-readable.
        reason: RegistrationReason,
        /// Why, for humans, with what to do.
        message: String,
    },
    /// Create or update the member's objects in its namespace and grant it a credential.
    Provision {
        /// Delete the member's ServiceAccount first: it registers with a new key, and every
        /// token bound to the old ServiceAccount must stop working.
        revoke_key: bool,
        /// A known member registering again.
        rejoin: bool,
    },
}

/// The plan for request `req` of set `set`, approved (`rejoin` as the policy said), given the
/// member of that name the set has (`existing`) and what is at the member's namespace `found`.
pub fn plan_approval(
    req: &ClusterRegistrationRequest,
    set: &SetRef,
    namespace: &str,
    existing: Option<&ManagedCluster>,
    found: Option<&Namespace>,
    rejoin: bool,
) -> Plan {
    let name = &req.spec.cluster_name;
    let mut revoke_key = false;
    if let Some(old) = existing {
        if old.meta().deletion_timestamp.is_some() {
            return Plan::Requeue;
        }
        if old.spec.cluster_id != req.spec.cluster_id {
            return Plan::Replace {
                old_id: old.spec.cluster_id.clone(),
            };
        }
        revoke_key = old.spec.public_key.as_ref() != Some(&req.spec.public_key);
    }
    match found {
        Some(ns) if ns.metadata.deletion_timestamp.is_some() => Plan::Requeue,
        Some(ns) if !is_members_namespace(ns, set, name) => Plan::Deny {
            reason: RegistrationReason::NamespaceConflict,
            message: format!(
                "namespace {namespace} already exists and was not created by Tether for member {name} of \
                 ClusterSet {set}; the leader does not take over namespaces: remove or rename it, or \
                 register under another cluster name"
            ),
        },
        _ => Plan::Provision {
            revoke_key,
            rejoin: rejoin || revoke_key,
        },
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;
    use kube::api::ObjectMeta;
    use tether_api::{ClusterRegistrationRequestSpec, ManagedClusterSpec, labels};

    use super::*;
    use crate::provision::FIELD_MANAGER;

    const KEY: &str = "key-a";

    fn set() -> SetRef {
        SetRef::new("tether-system", "prod")
    }

    fn req(id: &str, key: &str) -> ClusterRegistrationRequest {
        ClusterRegistrationRequest::new(
            "east-1",
            ClusterRegistrationRequestSpec {
                cluster_id: id.into(),
                cluster_name: "east".into(),
                public_key: key.into(),
                agent_version: None,
                labels: Default::default(),
            },
        )
    }

    fn member(id: &str, key: &str, deleting: bool) -> ManagedCluster {
        let mut mc = ManagedCluster::new(
            "east",
            ManagedClusterSpec {
                cluster_id: id.into(),
                cluster_set: "prod".into(),
                public_key: Some(key.into()),
            },
        );
        mc.metadata.deletion_timestamp = deleting.then(|| Time(Timestamp::now()));
        mc
    }

    /// A namespace labelled for member `owner` of set `set` (none: an admin's own).
    fn namespace(owner: Option<(&SetRef, &str)>, deleting: bool) -> Namespace {
        let mut labels = BTreeMap::new();
        if let Some((set, name)) = owner {
            labels.extend(set.labels());
            labels.insert(labels::CLUSTER_NAME.to_string(), name.to_string());
            labels.insert(labels::MANAGED_BY.to_string(), FIELD_MANAGER.to_string());
        }
        Namespace {
            metadata: ObjectMeta {
                name: Some("tether-m-east".into()),
                labels: Some(labels),
                deletion_timestamp: deleting.then(|| Time(Timestamp::now())),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        }
    }

    /// (what, the member there, the namespace found, approved as a rejoin, the plan wanted)
    type Case = (
        &'static str,
        Option<ManagedCluster>,
        Option<Namespace>,
        bool,
        &'static dyn Fn(&Plan) -> bool,
    );

    fn provision(revoke_key: bool, rejoin: bool) -> Plan {
        Plan::Provision { revoke_key, rejoin }
    }

    #[test]
    fn plans_replace_wait_deny_or_provision() {
        let prod = set();
        let other = SetRef::new("tether-system", "staging");
        let ours = namespace(Some((&prod, "east")), false);
        fn conflict(p: &Plan) -> bool {
            matches!(p, Plan::Deny { reason, .. } if *reason == RegistrationReason::NamespaceConflict)
        }
        let cases: Vec<Case> = vec![
            ("a new member", None, None, false, &|p| {
                *p == provision(false, false)
            }),
            (
                "its own namespace left from before",
                None,
                Some(ours.clone()),
                false,
                &|p| *p == provision(false, false),
            ),
            (
                "the same member again",
                Some(member("id-1", KEY, false)),
                Some(ours.clone()),
                true,
                &|p| *p == provision(false, true),
            ),
            (
                "the same cluster with a new key",
                Some(member("id-1", "key-old", false)),
                Some(ours.clone()),
                false,
                &|p| *p == provision(true, true),
            ),
            (
                "another cluster under the name",
                Some(member("id-0", KEY, false)),
                Some(ours.clone()),
                false,
                &|p| {
                    *p == Plan::Replace {
                        old_id: "id-0".into(),
                    }
                },
            ),
            (
                "the old member is being deleted",
                Some(member("id-0", KEY, true)),
                Some(ours.clone()),
                false,
                &|p| *p == Plan::Requeue,
            ),
            (
                "its namespace is being deleted",
                None,
                Some(namespace(Some((&prod, "east")), true)),
                false,
                &|p| *p == Plan::Requeue,
            ),
            (
                "an admin's namespace",
                None,
                Some(namespace(None, false)),
                false,
                &conflict,
            ),
            (
                "another member's namespace",
                None,
                Some(namespace(Some((&prod, "west")), false)),
                false,
                &conflict,
            ),
            (
                "the namespace of a member of another set",
                None,
                Some(namespace(Some((&other, "east")), false)),
                false,
                &conflict,
            ),
        ];
        let request = req("id-1", KEY);
        for (what, existing, found, rejoin, ok) in cases {
            let plan = plan_approval(
                &request,
                &prod,
                "tether-m-east",
                existing.as_ref(),
                found.as_ref(),
                rejoin,
            );
            assert!(ok(&plan), "{what}: {plan:?}");
        }
    }

    #[test]
    fn a_conflict_says_what_to_do() {
        let plan = plan_approval(
            &req("id-1", KEY),
            &set(),
            "tether-m-east",
            None,
            Some(&namespace(None, false)),
            false,
        );
        let Plan::Deny { message, .. } = plan else {
            panic!("{plan:?}")
        };
        assert!(
            message.contains("namespace tether-m-east already exists"),
            "{message}"
        );
        assert!(
            message.contains("register under another cluster name"),
            "{message}"
        );
    }
}
