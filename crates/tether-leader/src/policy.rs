//! The approval decision for a registration request: a pure function of the request, its
//! ClusterSet and the set's current members, so every rule is unit-tested without an API server.

use tether_api::clusterset::{ApprovalMode, ClusterSetRole};
use tether_api::registration::{DecisionAction, RegistrationReason};
use tether_api::{ClusterRegistrationRequest, ClusterSet};

/// What the leader knows of an existing member of the set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// Cluster name (the ManagedCluster's name).
    pub name: String,
    /// Cluster ID.
    pub cluster_id: String,
    /// The public key the member registered with.
    pub public_key: String,
    /// Whether the member is alive (its Ready condition is not Unknown).
    pub alive: bool,
}

/// The leader's answer to a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Admit the member; `rejoin` when it is a known member registering again (same ID and key).
    Approve {
        /// A re-registration of an existing member.
        rejoin: bool,
    },
    /// Wait (manual approval).
    Wait {
        /// Why.
        reason: RegistrationReason,
        /// What to do.
        message: String,
    },
    /// Refuse.
    Deny {
        /// Why, machine-readable.
        reason: RegistrationReason,
        /// Why, for humans, with what to do.
        message: String,
    },
}

fn deny(reason: RegistrationReason, message: String) -> Decision {
    Decision::Deny { reason, message }
}

/// Decides a request. `set` is the Leader ClusterSet of the request's namespace, if any.
pub fn decide(req: &ClusterRegistrationRequest, set: Option<&ClusterSet>, members: &[Member]) -> Decision {
    let spec = &req.spec;
    let Some(set) = set.filter(|s| s.spec.role == ClusterSetRole::Leader) else {
        return deny(
            RegistrationReason::ClusterSetNotFound,
            "no Leader ClusterSet in this namespace: create it with `tether init`, or register in the set's namespace"
                .into(),
        );
    };
    if set.metadata.deletion_timestamp.is_some() {
        return deny(
            RegistrationReason::ClusterSetDeleting,
            "the ClusterSet is being deleted".into(),
        );
    }
    let leader = set.spec.leader.clone().unwrap_or_default();
    if leader.is_banned(&spec.cluster_id) {
        return deny(
            RegistrationReason::Banned,
            format!(
                "cluster ID {} is banned from ClusterSet {}: an admin lifts the ban with \
                 `tether member unban {} --clusterset {} -n {}`",
                spec.cluster_id,
                set.metadata.name.as_deref().unwrap_or_default(),
                spec.cluster_id,
                set.metadata.name.as_deref().unwrap_or_default(),
                set.metadata.namespace.as_deref().unwrap_or_default(),
            ),
        );
    }
    if tether_seal::parse_recipient(&spec.public_key).is_err() {
        return deny(
            RegistrationReason::InvalidPublicKey,
            "spec.publicKey is not an age X25519 recipient (age1...)".into(),
        );
    }

    let same_id = members.iter().find(|m| m.cluster_id == spec.cluster_id);
    let same_name = members.iter().find(|m| m.name == spec.cluster_name);
    let rejoin = match (same_id, same_name) {
        (Some(m), _) if m.public_key != spec.public_key && m.alive => {
            return deny(
                RegistrationReason::DuplicateClusterID,
                format!(
                    "cluster ID {} already belongs to live member {} with another key; \
                     if this is the same cluster, remove the old member first",
                    spec.cluster_id, m.name
                ),
            );
        }
        (_, Some(m)) if m.cluster_id != spec.cluster_id && m.alive => {
            return deny(
                RegistrationReason::DuplicateClusterName,
                format!(
                    "cluster name {} is taken by live member with ID {}; choose another --name",
                    spec.cluster_name, m.cluster_id
                ),
            );
        }
        (Some(m), _) => m.public_key == spec.public_key && m.name == spec.cluster_name,
        _ => false,
    };

    let policy = leader.approval;
    match policy.mode {
        ApprovalMode::Automatic => Decision::Approve { rejoin },
        ApprovalMode::AllowList => {
            let allowed = policy
                .allowed_clusters
                .unwrap_or_default()
                .iter()
                .any(|c| c.0 == spec.cluster_name || c.0 == spec.cluster_id);
            if allowed || rejoin {
                Decision::Approve { rejoin }
            } else {
                deny(
                    RegistrationReason::NotAllowed,
                    format!("{} is not in the ClusterSet's allowedClusters", spec.cluster_name),
                )
            }
        }
        ApprovalMode::Manual => {
            let decision = req.status.as_ref().and_then(|s| s.decision.as_ref());
            match decision.map(|d| (d.action, d.message.clone())) {
                Some((DecisionAction::Approve, _)) => Decision::Approve { rejoin },
                Some((DecisionAction::Deny, message)) => deny(
                    RegistrationReason::DeniedByAdmin,
                    message.unwrap_or_else(|| "denied by an administrator".into()),
                ),
                None if rejoin => Decision::Approve { rejoin },
                None => Decision::Wait {
                    reason: RegistrationReason::AwaitingApproval,
                    message: format!("waiting for an administrator: `tether approve {}`", req_name(req)),
                },
            }
        }
    }
}

fn req_name(req: &ClusterRegistrationRequest) -> &str {
    req.metadata.name.as_deref().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::ObjectMeta;
    use tether_api::clusterset::{ApprovalPolicy, ClusterRef, LeaderSpec};
    use tether_api::registration::{AdminDecision, RegistrationStatus};
    use tether_api::{ClusterRegistrationRequestSpec, ClusterSetSpec};

    const KEY_A: &str = "age1ql3z7hjy54pw3hyww5ayyfg7zqgvc7w3j2elw8zmrj2kg5sfn9aqmcac8p";
    static KEY_B_CELL: std::sync::LazyLock<String> =
        std::sync::LazyLock::new(|| tether_seal::generate_keypair().1);

    fn set(mode: ApprovalMode, allowed: &[&str]) -> ClusterSet {
        let approval = ApprovalPolicy {
            mode,
            allowed_clusters: (!allowed.is_empty())
                .then(|| allowed.iter().map(|a| ClusterRef(a.to_string())).collect()),
        };
        let spec = ClusterSetSpec {
            role: ClusterSetRole::Leader,
            leader: Some(LeaderSpec {
                approval,
                ..LeaderSpec::default()
            }),
            member: None,
        };
        ClusterSet::new("prod", spec)
    }

    fn req(name: &str, id: &str, key: &str, decision: Option<DecisionAction>) -> ClusterRegistrationRequest {
        let mut r = ClusterRegistrationRequest::new(
            "east-1",
            ClusterRegistrationRequestSpec {
                cluster_id: id.into(),
                cluster_name: name.into(),
                public_key: key.into(),
                agent_version: None,
                labels: Default::default(),
            },
        );
        r.status = decision.map(|action| RegistrationStatus {
            decision: Some(AdminDecision {
                action,
                message: None,
            }),
            ..RegistrationStatus::default()
        });
        r
    }

    /// (what, set, request, members, expected decision)
    type Case = (
        &'static str,
        Option<ClusterSet>,
        ClusterRegistrationRequest,
        Vec<Member>,
        Decision,
    );

    fn member(name: &str, id: &str, key: &str, alive: bool) -> Member {
        Member {
            name: name.into(),
            cluster_id: id.into(),
            public_key: key.into(),
            alive,
        }
    }

    fn reason(d: &Decision) -> Option<RegistrationReason> {
        match d {
            Decision::Deny { reason, .. } | Decision::Wait { reason, .. } => Some(*reason),
            Decision::Approve { .. } => None,
        }
    }

    #[test]
    fn decisions_follow_the_policy_and_the_membership() {
        use ApprovalMode::*;
        use RegistrationReason::*;
        let east = member("east", "id-1", KEY_A, true);
        let dead_east = member("east", "id-1", KEY_A, false);
        let mut deleting = set(Automatic, &[]);
        deleting.metadata = ObjectMeta {
            deletion_timestamp: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            )),
            ..deleting.metadata
        };
        let mut banned = set(Automatic, &[]);
        if let Some(l) = banned.spec.leader.as_mut() {
            l.banned_cluster_ids = vec![ClusterRef("id-1".into())];
        }
        let mut banned_manual = set(Manual, &[]);
        if let Some(l) = banned_manual.spec.leader.as_mut() {
            l.banned_cluster_ids = vec![ClusterRef("id-1".into())];
        }
        let cases: Vec<Case> = vec![
            (
                "banned ID, automatic, even as a known member",
                Some(banned),
                req("east", "id-1", KEY_A, None),
                vec![east.clone()],
                deny(Banned, String::new()),
            ),
            (
                "banned ID, approved by an admin anyway",
                Some(banned_manual),
                req("east", "id-1", KEY_A, Some(DecisionAction::Approve)),
                vec![],
                deny(Banned, String::new()),
            ),
            (
                "new member, automatic",
                Some(set(Automatic, &[])),
                req("east", "id-1", KEY_A, None),
                vec![],
                Decision::Approve { rejoin: false },
            ),
            (
                "same ID and key rejoins",
                Some(set(Automatic, &[])),
                req("east", "id-1", KEY_A, None),
                vec![east.clone()],
                Decision::Approve { rejoin: true },
            ),
            (
                "same ID, other key, alive",
                Some(set(Automatic, &[])),
                req("west", "id-1", &KEY_B_CELL, None),
                vec![east.clone()],
                deny(DuplicateClusterID, String::new()),
            ),
            (
                "same ID, other key, dead member is replaced",
                Some(set(Automatic, &[])),
                req("east", "id-1", &KEY_B_CELL, None),
                vec![dead_east.clone()],
                Decision::Approve { rejoin: false },
            ),
            (
                "same name, other ID",
                Some(set(Automatic, &[])),
                req("east", "id-2", &KEY_B_CELL, None),
                vec![east.clone()],
                deny(DuplicateClusterName, String::new()),
            ),
            (
                "no set",
                None,
                req("east", "id-1", KEY_A, None),
                vec![],
                deny(ClusterSetNotFound, String::new()),
            ),
            (
                "set being deleted",
                Some(deleting),
                req("east", "id-1", KEY_A, None),
                vec![],
                deny(ClusterSetDeleting, String::new()),
            ),
            (
                "bad key",
                Some(set(Automatic, &[])),
                req("east", "id-1", "age1xyz", None),
                vec![],
                deny(InvalidPublicKey, String::new()),
            ),
            (
                "allow-listed by name",
                Some(set(AllowList, &["east"])),
                req("east", "id-1", KEY_A, None),
                vec![],
                Decision::Approve { rejoin: false },
            ),
            (
                "allow-listed by ID",
                Some(set(AllowList, &["id-1"])),
                req("east", "id-1", KEY_A, None),
                vec![],
                Decision::Approve { rejoin: false },
            ),
            (
                "not allow-listed",
                Some(set(AllowList, &["west"])),
                req("east", "id-1", KEY_A, None),
                vec![],
                deny(NotAllowed, String::new()),
            ),
            (
                "manual waits",
                Some(set(Manual, &[])),
                req("east", "id-1", KEY_A, None),
                vec![],
                Decision::Wait {
                    reason: AwaitingApproval,
                    message: String::new(),
                },
            ),
            (
                "manual approved",
                Some(set(Manual, &[])),
                req("east", "id-1", KEY_A, Some(DecisionAction::Approve)),
                vec![],
                Decision::Approve { rejoin: false },
            ),
            (
                "manual denied",
                Some(set(Manual, &[])),
                req("east", "id-1", KEY_A, Some(DecisionAction::Deny)),
                vec![],
                deny(DeniedByAdmin, String::new()),
            ),
            (
                "manual rejoin needs no new approval",
                Some(set(Manual, &[])),
                req("east", "id-1", KEY_A, None),
                vec![east],
                Decision::Approve { rejoin: true },
            ),
        ];
        for (what, set, req, members, want) in cases {
            let got = decide(&req, set.as_ref(), &members);
            match (&got, &want) {
                (Decision::Approve { rejoin: a }, Decision::Approve { rejoin: b }) => {
                    assert_eq!(a, b, "{what}")
                }
                _ => assert_eq!(reason(&got), reason(&want), "{what}: got {got:?}"),
            }
            if let Decision::Deny { message, .. } | Decision::Wait { message, .. } = &got {
                assert!(!message.is_empty(), "{what}: a refusal must say why");
            }
        }
    }
}
