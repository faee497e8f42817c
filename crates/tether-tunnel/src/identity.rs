//! Ensures the agent impersonates on its member only what the member allowed: a leader user
//! becomes `tether:<set>:<user>`, a leader ServiceAccount (`system:serviceaccount:<ns>:<name>`,
//! say Argo CD's controller using a ClusterProfile) `tether:<set>:serviceaccount:<ns>:<name>`,
//! its groups `tether:<set>:<group>`; every other `system:` user is refused and `system:` groups
//! are dropped, so no name on the member is ever a `system:` one; and only names on the
//! agent's allow-list are ever sent. The member's RBAC (which
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
    /// A `system:` user other than a ServiceAccount: never impersonated.
    #[error(
        "user {user:?} is a system: identity other than a ServiceAccount; the agent never \
         impersonates those"
    )]
    SystemUser {
        /// The leader user.
        user: String,
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

/// The pass-through credential in `value` when it is a well-formed `Bearer <token>` (RFC 6750's
/// token68 characters, at most 16 KiB): anything else would reach the member as a request it
/// treats as `system:anonymous`, so the agent refuses it instead.
pub fn bearer(value: &http::HeaderValue) -> Option<&str> {
    const MAX: usize = 16 * 1024;
    let text = value.to_str().ok()?;
    let (scheme, token) = text.split_once(' ')?;
    let token68 = |c: char| c.is_ascii_alphanumeric() || "-._~+/".contains(c);
    let body = token.trim_end_matches('=');
    (scheme.eq_ignore_ascii_case("bearer")
        && !body.is_empty()
        && token.len() <= MAX
        && body.chars().all(token68))
    .then_some(token)
}

/// The prefixed name of leader user or group `name` of set `set` on a member.
pub fn prefixed(set: &str, name: &str) -> String {
    format!("{IMPERSONATION_PREFIX}:{set}:{name}")
}

/// The leader's user names of ServiceAccounts begin with this.
pub const SERVICE_ACCOUNT_PREFIX: &str = "system:serviceaccount:";

/// The name leader user `user` of set `set` has on a member: `tether:<set>:<user>`, or for a
/// ServiceAccount `tether:<set>:serviceaccount:<ns>:<name>`. Any other `system:` user, and a
/// malformed ServiceAccount name, has none.
pub fn member_user(set: &str, user: &str) -> Result<String, Refusal> {
    let refused = || Refusal::SystemUser {
        user: user.to_string(),
    };
    match user.strip_prefix(SERVICE_ACCOUNT_PREFIX) {
        Some(sa) => match sa.split_once(':') {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains(':') => {
                Ok(prefixed(set, &format!("serviceaccount:{sa}")))
            }
            _ => Err(refused()),
        },
        None if user.starts_with("system:") => Err(refused()),
        None => Ok(prefixed(set, user)),
    }
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
    let user = member_user(set, &caller.user)?;
    let groups: BTreeSet<String> = caller
        .groups
        .iter()
        .filter(|g| !g.starts_with("system:") && allow.groups.contains(*g))
        .map(|g| prefixed(set, g))
        .collect();
    Ok(Impersonation {
        user,
        groups: groups.into_iter().collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_well_formed_bearer_token_passes_through() {
        let v = |s: &str| http::HeaderValue::from_str(s).unwrap();
        assert_eq!(bearer(&v("Bearer abc.DEF-123_~+/==")), Some("abc.DEF-123_~+/=="));
        assert_eq!(bearer(&v("bearer eyJ0")), Some("eyJ0"));
        for bad in [
            "",
            "Bearer",
            "Bearer ",
            "Bearer  x",
            "Bearer ==",
            "Basic YWxpY2U6cGFzcw==",
            "Token abc",
            "abc",
            "Bearer a b",
            "Bearer a,b",
        ] {
            assert_eq!(bearer(&v(bad)), None, "{bad:?}");
        }
        assert_eq!(bearer(&v(&format!("Bearer {}", "a".repeat(16 * 1024 + 1)))), None);
    }

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
    fn service_accounts_get_a_name_of_their_own_and_other_system_users_none() {
        assert_eq!(member_user("prod", "alice").as_deref(), Ok("tether:prod:alice"));
        assert_eq!(
            member_user(
                "prod",
                "system:serviceaccount:argocd:argocd-application-controller"
            )
            .as_deref(),
            Ok("tether:prod:serviceaccount:argocd:argocd-application-controller")
        );
        for bad in [
            "system:anonymous",
            "system:admin",
            "system:kube-controller-manager",
            "system:node:worker-1",
            "system:serviceaccount:argocd",
            "system:serviceaccount::name",
            "system:serviceaccount:ns:",
            "system:serviceaccount:ns:a:b",
        ] {
            assert!(member_user("prod", bad).is_err(), "{bad}");
        }
        // Listed or not, a system: user other than a ServiceAccount is never impersonated.
        let allowed = allow(&["system:kube-controller-manager"], &[]);
        assert!(matches!(
            impersonate(
                "prod",
                "east",
                &caller("system:kube-controller-manager", &[]),
                &allowed
            ),
            Err(Refusal::SystemUser { .. })
        ));
        let sa = "system:serviceaccount:kueue-system:kueue-controller-manager";
        let got = impersonate(
            "prod",
            "east",
            &caller(
                sa,
                &[
                    "system:serviceaccounts",
                    "system:serviceaccounts:kueue-system",
                    "system:authenticated",
                ],
            ),
            &allow(&[sa], &["system:serviceaccounts"]),
        )
        .unwrap();
        assert_eq!(
            got.user,
            "tether:prod:serviceaccount:kueue-system:kueue-controller-manager"
        );
        assert!(
            got.groups.is_empty(),
            "a ServiceAccount's system: groups never follow"
        );
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
