//! Names of what the leader creates for a member. A member namespace is readable
//! (`tether-<set>-<member>-…`) and always ends in a hash of the full identity (set namespace,
//! set, member), so that no two members of any sets share one, whatever `-` their names hold.
//! The name is computed once, at first approval; afterwards the member's namespace is read from
//! its ManagedCluster, so a change here never moves an existing member.

use sha2::{Digest, Sha256};
use tether_api::SetRef;

/// Prefix of every member namespace, so a member can never take over an unrelated namespace.
const PREFIX: &str = "tether-";
/// Kubernetes' limit for namespace names (DNS-1123 label).
const MAX: usize = 63;
/// Hex digits of the identity hash at the end of every member namespace.
const HASH_LEN: usize = 8;

/// The ServiceAccount an agent acts as, in its dedicated namespace.
pub const AGENT_SERVICE_ACCOUNT: &str = "tether-agent";
/// The Role (and RoleBinding) that confines the agent to its own objects.
pub const AGENT_ROLE: &str = "tether-agent";

/// `tether-<set>-<name>-<hash>`, the readable part cut so the whole fits 63 characters. The hash
/// is of `<set namespace>/<set>/<name>`: `/` cannot occur in any of the three, so different
/// identities hash different inputs.
pub fn member_namespace(set: &SetRef, name: &str) -> String {
    let identity = format!("{}/{}/{}", set.namespace, set.name, name);
    let hash = hex::encode(Sha256::digest(identity.as_bytes()));
    let head: String = format!("{PREFIX}{}-{name}", set.name)
        .chars()
        .take(MAX - HASH_LEN - 1)
        .collect();
    format!("{}-{}", head.trim_end_matches('-'), &hash[..HASH_LEN])
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn dns_label() -> impl Strategy<Value = String> {
        // Dash-heavy on purpose: dashes are what made `tether-<set>-<name>` ambiguous.
        "[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
    }

    #[test]
    fn member_namespace_is_readable_and_hashed() {
        let got = member_namespace(&SetRef::new("tether-system", "prod"), "east");
        assert!(got.starts_with("tether-prod-east-"), "{got}");
        assert_eq!(got.len(), "tether-prod-east-".len() + HASH_LEN);
    }

    #[test]
    fn the_sets_that_collided_before_get_different_namespaces() {
        // Reproduced on a real leader: both were given tether-prod-us-east-00000.
        let a = member_namespace(&SetRef::new("tether-system", "prod"), "us-east-00000");
        let b = member_namespace(&SetRef::new("tether-us", "prod-us"), "east-00000");
        assert_ne!(a, b);
        // The same set ID in two namespaces.
        let c = member_namespace(&SetRef::new("team-a", "prod"), "east");
        let d = member_namespace(&SetRef::new("team-b", "prod"), "east");
        assert_ne!(c, d);
    }

    proptest! {
        #[test]
        fn member_namespaces_are_valid_labels(ns in dns_label(), set in dns_label(), name in dns_label()) {
            let got = member_namespace(&SetRef::new(ns, set), &name);
            prop_assert!(got.len() <= MAX, "{} is too long", got);
            prop_assert!(got.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'));
            prop_assert!(got.starts_with(PREFIX));
            prop_assert!(got.chars().last().is_some_and(|c| c.is_ascii_alphanumeric()));
        }

        #[test]
        fn different_identities_never_share_a_namespace(
            a in (dns_label(), dns_label(), dns_label()),
            b in (dns_label(), dns_label(), dns_label()),
        ) {
            prop_assume!(a != b);
            let na = member_namespace(&SetRef::new(a.0.clone(), a.1.clone()), &a.2);
            let nb = member_namespace(&SetRef::new(b.0.clone(), b.1.clone()), &b.2);
            prop_assert_ne!(na, nb);
        }

        #[test]
        fn splitting_the_same_text_differently_gives_different_namespaces(
            words in proptest::collection::vec("[a-z0-9]{1,8}", 3..7), cut1 in 1usize..6, cut2 in 1usize..6,
        ) {
            // `set` + `-` + `name` reads the same for every cut: exactly the old collision.
            let n = words.len();
            let (c1, c2) = (cut1 % (n - 1) + 1, cut2 % (n - 1) + 1);
            prop_assume!(c1 != c2);
            let split = |c: usize| (words[..c].join("-"), words[c..].join("-"));
            let ((s1, m1), (s2, m2)) = (split(c1), split(c2));
            let a = member_namespace(&SetRef::new("tether-system", s1), &m1);
            let b = member_namespace(&SetRef::new("tether-system", s2), &m2);
            prop_assert_ne!(a, b);
        }
    }
}
