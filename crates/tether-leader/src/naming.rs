//! Deterministic names of what the leader creates for a member, so that every replica and every
//! restart arrives at the same objects.

use sha2::{Digest, Sha256};

/// Prefix of every member namespace, so a member can never take over an unrelated namespace.
const PREFIX: &str = "tether-";
/// Kubernetes' limit for namespace names (DNS-1123 label).
const MAX: usize = 63;

/// The ServiceAccount an agent acts as, in its dedicated namespace.
pub const AGENT_SERVICE_ACCOUNT: &str = "tether-agent";
/// The Role (and RoleBinding) that confines the agent to its own objects.
pub const AGENT_ROLE: &str = "tether-agent";

/// `tether-<set>-<name>`; when that exceeds 63 characters, a truncated form plus an 8-hex hash
/// of `set/name`, so that different members never share a namespace.
pub fn member_namespace(set: &str, name: &str) -> String {
    let full = format!("{PREFIX}{set}-{name}");
    if full.len() <= MAX {
        return full;
    }
    let hash = hex::encode(Sha256::digest(format!("{set}/{name}").as_bytes()));
    let keep = MAX - 9; // room for "-" + 8 hex digits
    let head = full[..keep].trim_end_matches('-');
    format!("{head}-{}", &hash[..8])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_namespace_is_readable_when_short_and_bounded_when_long() {
        let long = "a".repeat(63);
        let cases: &[(&str, &str, Option<&str>)] = &[
            ("prod", "east", Some("tether-prod-east")),
            ("p", "x", Some("tether-p-x")),
            ("prod", &long, None),
            (&long, "east", None),
        ];
        for (set, name, want) in cases {
            let got = member_namespace(set, name);
            assert!(got.len() <= 63, "{got} is too long");
            assert!(
                got.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            );
            assert!(!got.ends_with('-') && got.starts_with("tether-"));
            if let Some(want) = want {
                assert_eq!(&got, want);
            }
        }
    }

    #[test]
    fn long_names_that_share_a_prefix_get_different_namespaces() {
        let a = member_namespace("prod", &format!("{}-a", "x".repeat(60)));
        let b = member_namespace("prod", &format!("{}-b", "x".repeat(60)));
        assert_ne!(a, b);
        assert_eq!(
            a,
            member_namespace("prod", &format!("{}-a", "x".repeat(60))),
            "deterministic"
        );
    }
}
