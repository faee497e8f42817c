//! Ensures the agent impersonates on its member only what the member allowed: a leader user
//! becomes `tether:<set>:<user>`, its groups `tether:<set>:<group>`, `system:` groups are
//! dropped, and only names on the agent's allow-list are ever sent. The member's RBAC (which
//! names the same list as `resourceNames`) is the enforcement; this list keeps requests from
//! failing on groups the member does not care about.

use std::collections::BTreeSet;

use crate::IMPERSONATION_PREFIX;

/// Who called, as the leader's API server authenticated them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The leader user name.
    pub user: String,
    /// Its groups.
    pub groups: Vec<String>,
}

/// The leader users and groups this member lets the agent impersonate (unprefixed names).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList {
    /// Users.
    pub users: BTreeSet<String>,
    /// Groups.
    pub groups: BTreeSet<String>,
}

impl AllowList {
    /// Whether impersonation is on at all (anyone listed).
    pub fn is_enabled(&self) -> bool {
        !self.users.is_empty()
    }
}

/// The identity to impersonate on the member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Impersonation {
    /// `Impersonate-User`.
    pub user: String,
    /// `Impersonate-Group` values.
    pub groups: Vec<String>,
}

/// Why a caller is not impersonated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The member allows no impersonation.
    #[error(
        "member {member} allows no impersonation: pass a member credential in the \
         Tether-Member-Authorization header, or list the user in the agent chart's \
         proxy.impersonate.users"
    )]
    Disabled {
        /// The member.
        member: String,
    },
    /// The user is not on the member's allow-list.
    #[error(
        "user {user:?} is not on member {member}'s impersonation allow-list (agent chart value \
         proxy.impersonate.users)"
    )]
    NotAllowed {
        /// The leader user.
        user: String,
        /// The member.
        member: String,
    },
}

/// The prefixed name of leader user or group `name` of set `set` on a member.
pub fn prefixed(set: &str, name: &str) -> String {
    format!("{IMPERSONATION_PREFIX}:{set}:{name}")
}

/// Maps `caller` of set `set` to the identity the agent of `member` impersonates.
pub fn impersonate(
    set: &str,
    member: &str,
    caller: &Caller,
    allow: &AllowList,
) -> Result<Impersonation, Refusal> {
    if !allow.is_enabled() {
        return Err(Refusal::Disabled {
            member: member.to_string(),
        });
    }
    if caller.user.is_empty() || !allow.users.contains(&caller.user) {
        return Err(Refusal::NotAllowed {
            user: caller.user.clone(),
            member: member.to_string(),
        });
    }
    let groups: BTreeSet<String> = caller
        .groups
        .iter()
        .filter(|g| !g.starts_with("system:") && allow.groups.contains(*g))
        .map(|g| prefixed(set, g))
        .collect();
    Ok(Impersonation {
        user: prefixed(set, &caller.user),
        groups: groups.into_iter().collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allow(users: &[&str], groups: &[&str]) -> AllowList {
        AllowList {
            users: users.iter().map(|s| s.to_string()).collect(),
            groups: groups.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn caller(user: &str, groups: &[&str]) -> Caller {
        Caller {
            user: user.into(),
            groups: groups.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn listed_users_are_prefixed_and_only_listed_non_system_groups_follow() {
        let got = impersonate(
            "prod",
            "east",
            &caller(
                "alice",
                &["devs", "system:masters", "system:authenticated", "ops"],
            ),
            &allow(&["alice"], &["devs", "system:masters"]),
        )
        .unwrap();
        assert_eq!(got.user, "tether:prod:alice");
        assert_eq!(got.groups, vec!["tether:prod:devs".to_string()]);
    }

    #[test]
    fn unlisted_users_and_disabled_members_are_refused() {
        let a = allow(&["alice"], &[]);
        for (who, want) in [
            (
                caller("bob", &["devs"]),
                Refusal::NotAllowed {
                    user: "bob".into(),
                    member: "east".into(),
                },
            ),
            (
                caller("", &[]),
                Refusal::NotAllowed {
                    user: "".into(),
                    member: "east".into(),
                },
            ),
        ] {
            assert_eq!(impersonate("prod", "east", &who, &a), Err(want));
        }
        let off = impersonate("prod", "east", &caller("alice", &[]), &AllowList::default());
        assert!(matches!(off, Err(Refusal::Disabled { .. })));
        assert!(
            off.unwrap_err()
                .to_string()
                .contains("Tether-Member-Authorization")
        );
    }
}
