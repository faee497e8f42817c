//! The approval decision for a registration request: a pure function of the request, its
//! ClusterSet and the set's current members, so every rule is unit-tested without an API server.
//!
//! The rules, in order: no Leader set, a set being deleted, a banned cluster and an unusable key
//! are refused; a request naming a member's cluster ID or name with another key (or its key and
//! ID under another name) is never approved by policy: refused as a duplicate while that member
//! is alive, waiting for an administrator's `tether approve`/`deny` while it is silent; the very
//! member registering again (same name, ID and key) is a rejoin, approved in every mode; anything
//! else follows the set's approval mode.

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
    // NB: a cluster reports its own ID and name: a ban also names the key it registered with.
    if let Some(ban) = leader.ban_of(&spec.cluster_id, &spec.cluster_name, Some(&spec.public_key)) {
        let set_name = set.metadata.name.as_deref().unwrap_or_default();
        let set_ns = set.metadata.namespace.as_deref().unwrap_or_default();
        return deny(
            RegistrationReason::Banned,
            format!(
                "{ban} is banned from ClusterSet {set_name}: an admin lifts the ban with \
                 `tether member unban {} --clusterset {set_name} -n {set_ns}`",
                ban.unban,
            ),
        );
    }
    if tether_seal::parse_recipient(&spec.public_key).is_err() {
        return deny(
            RegistrationReason::InvalidPublicKey,
            "spec.publicKey is not an age X25519 recipient (age1...)".into(),
        );
    }

    // NB: a member is its key (DESIGN.md, trust invariant 1): from approval until an admin
    // removes it, its name and cluster ID are bound to the key it registered with, whatever its
    // health. Another key naming either is never approved by policy: against a live member it is
    // a duplicate; against a silent one it waits for an administrator, who decides whether this
    // is that cluster with a new key.
    let admin = req
        .status
        .as_ref()
        .and_then(|s| s.decision.as_ref())
        .map(|d| (d.action, d.message.clone()));
    let held = req
        .status
        .as_ref()
        .is_some_and(|s| s.reason == RegistrationReason::ReplacesMember);
    let rejoin = match collision(spec, members) {
        // NB: a request once held as another member's replacement stays held after that member
        // is gone (removed by an admin, say): it was filed against it, and only an admin says
        // whether it is that cluster.
        None if held && admin.is_none() => {
            return Decision::Wait {
                reason: RegistrationReason::ReplacesMember,
                message: format!(
                    "{} was filed against member {}, which held that name with another key; the \
                     member is gone, and this still waits for an administrator: `tether approve {} \
                     -n {}` or `tether deny {}`",
                    req_name(req),
                    spec.cluster_name,
                    req_name(req),
                    req.metadata.namespace.as_deref().unwrap_or_default(),
                    req_name(req)
                ),
            };
        }
        None => false,
        Some(Collision::Same) => true,
        Some(Collision::Other { member, by_id }) => {
            return collided(req, member, by_id, admin);
        }
        // NB: nothing an admin could approve: a second member of one cluster ID, or one
        // member's ID with another's name (approving it replaced the live one).
        Some(Collision::Renamed(m)) => {
            return deny(
                RegistrationReason::DuplicateClusterID,
                format!(
                    "cluster ID {} is member {}: a member cannot change its name; leave and join \
                     again to use {}",
                    spec.cluster_id, m.name, spec.cluster_name
                ),
            );
        }
        Some(Collision::Straddles { by_id, by_name }) => {
            return deny(
                RegistrationReason::DuplicateClusterID,
                format!(
                    "cluster ID {} is member {} and cluster name {} is member {}: a request names \
                     one member or none",
                    spec.cluster_id, by_id.name, spec.cluster_name, by_name.name
                ),
            );
        }
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
        ApprovalMode::Manual => match admin {
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
        },
    }
}

fn req_name(req: &ClusterRegistrationRequest) -> &str {
    req.metadata.name.as_deref().unwrap_or_default()
}

/// How a request's name, ID and key meet the set's members.
enum Collision<'a> {
    /// The very member registering again: same name, ID and key.
    Same,
    /// It names `member`'s cluster ID under another name (whatever its key): a member cannot
    /// change its name, and approving it would make a second member of one cluster ID.
    Renamed(&'a Member),
    /// Its cluster ID is one member's and its name another's: nothing an admin could approve.
    Straddles {
        /// The member whose ID it names.
        by_id: &'a Member,
        /// The member whose name it names.
        by_name: &'a Member,
    },
    /// It names `member`'s cluster ID and name (`by_id`), or only its name, with another key.
    Other {
        /// The member it collides with.
        member: &'a Member,
        /// Whether the collision is on the cluster ID (else on the name).
        by_id: bool,
    },
}

/// Whether request `spec` names an existing member, and how.
fn collision<'a>(
    spec: &tether_api::ClusterRegistrationRequestSpec,
    members: &'a [Member],
) -> Option<Collision<'a>> {
    let by_id = members.iter().find(|m| m.cluster_id == spec.cluster_id);
    let by_name = members.iter().find(|m| m.name == spec.cluster_name);
    match (by_id, by_name) {
        (None, None) => None,
        (Some(a), Some(b)) if a.name != b.name => Some(Collision::Straddles { by_id: a, by_name: b }),
        (Some(m), _) if m.name != spec.cluster_name => Some(Collision::Renamed(m)),
        (Some(m), _) if m.public_key == spec.public_key => Some(Collision::Same),
        (Some(member), _) => Some(Collision::Other { member, by_id: true }),
        (None, Some(member)) => Some(Collision::Other { member, by_id: false }),
    }
}

/// The answer to a request that names member `m`'s name (and maybe its ID) with another key: a
/// duplicate while `m` is alive; while it is silent, what an admin
/// decided, or a wait naming `m` and the one command that replaces it.
fn collided(
    req: &ClusterRegistrationRequest,
    m: &Member,
    by_id: bool,
    admin: Option<(DecisionAction, Option<String>)>,
) -> Decision {
    let spec = &req.spec;
    let ns = req.metadata.namespace.as_deref().unwrap_or_default();
    let what = if by_id {
        format!("cluster ID {}", spec.cluster_id)
    } else {
        format!("cluster name {}", spec.cluster_name)
    };
    if m.alive {
        let reason = if by_id {
            RegistrationReason::DuplicateClusterID
        } else {
            RegistrationReason::DuplicateClusterName
        };
        let message = format!(
            "{what} belongs to live member {} (ID {}) registered with another key; if this is \
             another cluster, choose another --name; if it is {} itself, an admin removes the \
             member first: `tether member remove {} -n {ns}`",
            m.name, m.cluster_id, m.name, m.name
        );
        return deny(reason, message);
    }
    match admin {
        Some((DecisionAction::Approve, _)) => Decision::Approve { rejoin: false },
        Some((DecisionAction::Deny, message)) => deny(
            RegistrationReason::DeniedByAdmin,
            message.unwrap_or_else(|| "denied by an administrator".into()),
        ),
        None => Decision::Wait {
            reason: RegistrationReason::ReplacesMember,
            message: format!(
                "{what} is member {} (ID {}), which registered with another key and is silent; a \
                 new key is a new identity, so this waits for an administrator. If this cluster is \
                 {} and lost its key, replace the member: `tether approve {} -n {ns}`; if not: \
                 `tether deny {} -n {ns}`",
                m.name,
                m.cluster_id,
                m.name,
                req_name(req),
                req_name(req)
            ),
        },
    }
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
        // A ban as `tether member remove --ban` writes it: ID, name and key.
        let mut banned_all = set(Automatic, &[]);
        if let Some(l) = banned_all.spec.leader.as_mut() {
            l.bans = vec![tether_api::clusterset::Ban {
                cluster_id: Some(ClusterRef("id-1".into())),
                cluster_name: Some(ClusterRef("east".into())),
                public_key: Some(tether_api::clusterset::PublicKey(KEY_A.into())),
            }];
        }
        let cases: Vec<Case> = vec![
            (
                "banned by ID, name and key: its key under a new ID and name",
                Some(banned_all.clone()),
                req("east-2", "id-2", KEY_A, Some(DecisionAction::Approve)),
                vec![],
                deny(Banned, String::new()),
            ),
            (
                "banned by ID, name and key: its name with a new ID and key",
                Some(banned_all.clone()),
                req("east", "id-2", &KEY_B_CELL, None),
                vec![],
                deny(Banned, String::new()),
            ),
            (
                "banned by ID, name and key: its ID with a new name and key",
                Some(banned_all.clone()),
                req("east-2", "id-1", &KEY_B_CELL, None),
                vec![],
                deny(Banned, String::new()),
            ),
            (
                "banned by ID, name and key: another cluster registers",
                Some(banned_all),
                req("west", "id-2", &KEY_B_CELL, None),
                vec![],
                Decision::Approve { rejoin: false },
            ),
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
                "same ID, other key, silent member: waits for an admin, never replaced by policy",
                Some(set(Automatic, &[])),
                req("east", "id-1", &KEY_B_CELL, None),
                vec![dead_east.clone()],
                Decision::Wait {
                    reason: ReplacesMember,
                    message: String::new(),
                },
            ),
            (
                "same ID, other key, silent member, an admin approved the replacement",
                Some(set(Automatic, &[])),
                req("east", "id-1", &KEY_B_CELL, Some(DecisionAction::Approve)),
                vec![dead_east.clone()],
                Decision::Approve { rejoin: false },
            ),
            (
                "same ID, other key, silent member, an admin denied it",
                Some(set(Automatic, &[])),
                req("east", "id-1", &KEY_B_CELL, Some(DecisionAction::Deny)),
                vec![dead_east.clone()],
                deny(DeniedByAdmin, String::new()),
            ),
            (
                "another ID takes a silent member's name: waits for an admin",
                Some(set(Automatic, &[])),
                req("east", "id-2", &KEY_B_CELL, None),
                vec![dead_east.clone()],
                Decision::Wait {
                    reason: ReplacesMember,
                    message: String::new(),
                },
            ),
            (
                "another ID takes a silent member's name, allow-listed by name: still waits",
                Some(set(AllowList, &["east"])),
                req("east", "id-2", &KEY_B_CELL, None),
                vec![dead_east.clone()],
                Decision::Wait {
                    reason: ReplacesMember,
                    message: String::new(),
                },
            ),
            (
                "another ID takes a silent member's name in manual mode: waits with the conflict named",
                Some(set(Manual, &[])),
                req("east", "id-2", &KEY_B_CELL, None),
                vec![dead_east.clone()],
                Decision::Wait {
                    reason: ReplacesMember,
                    message: String::new(),
                },
            ),
            (
                "another ID takes a silent member's name, an admin approved the replacement",
                Some(set(Automatic, &[])),
                req("east", "id-2", &KEY_B_CELL, Some(DecisionAction::Approve)),
                vec![dead_east.clone()],
                Decision::Approve { rejoin: false },
            ),
            (
                "a member's key and ID under another name: a duplicate, alive or not",
                Some(set(Automatic, &[])),
                req("east-2", "id-1", KEY_A, Some(DecisionAction::Approve)),
                vec![dead_east.clone()],
                deny(DuplicateClusterID, String::new()),
            ),
            (
                "a silent member's ID under a new name and key, an admin approved: still refused (it would be a second member of that ID)",
                Some(set(Automatic, &[])),
                req("east-2", "id-1", &KEY_B_CELL, Some(DecisionAction::Approve)),
                vec![dead_east.clone()],
                deny(DuplicateClusterID, String::new()),
            ),
            (
                "a silent member's ID with a live member's name: refused, whatever an admin said",
                Some(set(Automatic, &[])),
                req("west", "id-1", &KEY_B_CELL, Some(DecisionAction::Approve)),
                vec![dead_east.clone(), member("west", "id-9", KEY_A, true)],
                deny(DuplicateClusterID, String::new()),
            ),
            (
                "a silent member's ID with a silent member's name: refused, never a replacement",
                Some(set(Manual, &[])),
                req("west", "id-1", &KEY_B_CELL, None),
                vec![dead_east.clone(), member("west", "id-9", KEY_A, false)],
                deny(DuplicateClusterID, String::new()),
            ),
            (
                "held as a replacement, its member since removed: still waits for an admin",
                Some(set(Automatic, &[])),
                {
                    let mut r = req("east", "id-2", &KEY_B_CELL, None);
                    r.status = Some(RegistrationStatus {
                        reason: ReplacesMember,
                        ..RegistrationStatus::default()
                    });
                    r
                },
                vec![],
                Decision::Wait {
                    reason: ReplacesMember,
                    message: String::new(),
                },
            ),
            (
                "held as a replacement, its member since removed, an admin approved",
                Some(set(Automatic, &[])),
                {
                    let mut r = req("east", "id-2", &KEY_B_CELL, Some(DecisionAction::Approve));
                    if let Some(s) = r.status.as_mut() {
                        s.reason = ReplacesMember;
                    }
                    r
                },
                vec![],
                Decision::Approve { rejoin: false },
            ),
            (
                "a silent member registering again with its key rejoins",
                Some(set(Automatic, &[])),
                req("east", "id-1", KEY_A, None),
                vec![dead_east.clone()],
                Decision::Approve { rejoin: true },
            ),
            (
                "same name, other ID and key, live member: a duplicate even if an admin approved",
                Some(set(Automatic, &[])),
                req("east", "id-2", &KEY_B_CELL, Some(DecisionAction::Approve)),
                vec![east.clone()],
                deny(DuplicateClusterName, String::new()),
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
            if let Decision::Deny {
                reason: Banned,
                message,
            } = &got
            {
                // The unban it names lifts the ban that matched: the ban's ID, not the new one.
                assert!(
                    message.contains("tether member unban id-1 "),
                    "{what}: {message:?}"
                );
            }
            if let Decision::Wait {
                reason: ReplacesMember,
                message,
            } = &got
            {
                for part in ["member east", "tether approve east-1", "tether deny east-1"] {
                    assert!(message.contains(part), "{what}: {message:?} lacks {part:?}");
                }
            }
        }
    }
}
