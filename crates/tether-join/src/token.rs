//! Join tokens and what they may do. A join token is a Kubernetes bootstrap token
//! (`kube-system/bootstrap-token-<id>`) whose extra group names its set, namespace included:
//! `system:bootstrappers:tether:<namespace>:<set>`. The join RBAC lets exactly that group (and
//! the set's fallback ServiceAccount) create and read registration requests in the set's home
//! namespace, nothing else. The CLI, the leader's cleanup and the tests all use these builders.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::jiff::Timestamp;
use kube::api::ObjectMeta;
use rand::Rng;
use tether_api::{SetRef, labels};

/// Where bootstrap-token Secrets live.
pub const TOKEN_NAMESPACE: &str = "kube-system";
/// The Secret type of bootstrap tokens.
pub const TOKEN_SECRET_TYPE: &str = "bootstrap.kubernetes.io/token";
/// Prefix of every join group.
const GROUP_PREFIX: &str = "system:bootstrappers:tether:";
/// Characters Kubernetes allows in bootstrap token IDs and secrets.
const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
/// Who manages the join objects.
pub const MANAGER: &str = "tether-cli";

/// A bootstrap token: `<6 chars>.<16 chars>`, lowercase letters and digits.
#[derive(Clone, PartialEq, Eq)]
pub struct BootstrapToken {
    /// The public ID (`system:bootstrap:<id>`).
    pub id: String,
    secret: String,
}

impl std::fmt::Debug for BootstrapToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // NB: never the secret part, also not in logs of Debug-printed values.
        write!(f, "BootstrapToken({}.****************)", self.id)
    }
}

/// Why a text is not a bootstrap token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "not a join token: expected <6 characters>.<16 characters> of lowercase letters and digits \
     (as printed by `tether init` or `tether token create`)"
)]
pub struct TokenFormatError;

impl BootstrapToken {
    /// A random token.
    pub fn random() -> Self {
        let mut rng = rand::rng();
        let mut pick = |n: usize| -> String {
            (0..n)
                .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
                .collect()
        };
        Self {
            id: pick(6),
            secret: pick(16),
        }
    }

    /// The bearer token, `<id>.<secret>`.
    pub fn token(&self) -> String {
        format!("{}.{}", self.id, self.secret)
    }

    /// The user name the API server gives this token.
    pub fn user(&self) -> String {
        format!("system:bootstrap:{}", self.id)
    }

    /// The name of its Secret in `kube-system`.
    pub fn secret_name(&self) -> String {
        secret_name(&self.id)
    }

    /// The token's Secret: usable for authentication (and for signing `cluster-info`), in the
    /// join group of `set` when given, expiring at `expires` when given, labelled with its set so
    /// that destroying the set removes it.
    pub fn secret(&self, set: Option<&SetRef>, expires: Option<Timestamp>) -> Secret {
        let mut data = BTreeMap::from([
            ("token-id".to_string(), self.id.clone()),
            ("token-secret".to_string(), self.secret.clone()),
            ("usage-bootstrap-authentication".to_string(), "true".to_string()),
            ("usage-bootstrap-signing".to_string(), "true".to_string()),
        ]);
        if let Some(set) = set {
            data.insert("auth-extra-groups".into(), join_group(set));
            data.insert(
                "description".into(),
                format!("tether join token for ClusterSet {set}"),
            );
        }
        if let Some(t) = expires {
            data.insert("expiration".into(), t.to_string());
        }
        Secret {
            metadata: ObjectMeta {
                name: Some(self.secret_name()),
                namespace: Some(TOKEN_NAMESPACE.into()),
                labels: set.map(set_labels),
                ..ObjectMeta::default()
            },
            type_: Some(TOKEN_SECRET_TYPE.into()),
            string_data: Some(data),
            ..Secret::default()
        }
    }
}

impl std::str::FromStr for BootstrapToken {
    type Err = TokenFormatError;

    fn from_str(text: &str) -> Result<Self, TokenFormatError> {
        let ok = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| ALPHABET.contains(&b));
        match text.trim().split_once('.') {
            Some((id, secret)) if ok(id, 6) && ok(secret, 16) => Ok(Self {
                id: id.into(),
                secret: secret.into(),
            }),
            _ => Err(TokenFormatError),
        }
    }
}

/// The Secret name of the bootstrap token with ID `id`.
pub fn secret_name(id: &str) -> String {
    format!("bootstrap-token-{id}")
}

/// Reads one key of a Secret as text (from `data`, or `stringData` before the API server merged it).
pub fn secret_text(secret: &Secret, key: &str) -> Option<String> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .and_then(|v| String::from_utf8(v.0.clone()).ok())
        .or_else(|| secret.string_data.as_ref().and_then(|d| d.get(key).cloned()))
}

/// The group of `set`'s join tokens: `system:bootstrappers:tether:<namespace>:<set>`. Neither a
/// namespace nor a set ID contains `:`, so the group names exactly one set on the leader.
pub fn join_group(set: &SetRef) -> String {
    format!("{GROUP_PREFIX}{}:{}", set.namespace, set.name)
}

/// The set a join group names, if it is one.
pub fn parse_join_group(group: &str) -> Option<SetRef> {
    let (ns, set) = group.strip_prefix(GROUP_PREFIX)?.split_once(':')?;
    let label = |s: &str| {
        !s.is_empty()
            && s.len() <= 63
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    };
    (label(ns) && label(set)).then(|| SetRef::new(ns, set))
}

/// The set a ServiceAccount user name (`system:serviceaccount:<ns>:tether-join-<set>`) joins,
/// for leaders without bootstrap-token authentication.
pub fn parse_join_service_account(user: &str) -> Option<SetRef> {
    let (ns, name) = user.strip_prefix("system:serviceaccount:")?.split_once(':')?;
    let set = name.strip_prefix(JOIN_PREFIX)?;
    (!set.is_empty()).then(|| SetRef::new(ns, set))
}

const JOIN_PREFIX: &str = "tether-join-";

/// The name of `set`'s join Role, RoleBinding and fallback ServiceAccount.
pub fn join_name(set: &SetRef) -> String {
    format!("{JOIN_PREFIX}{}", set.name)
}

fn set_labels(set: &SetRef) -> BTreeMap<String, String> {
    let mut l = set.labels();
    l.insert(labels::MANAGED_BY.into(), MANAGER.into());
    l
}

fn meta(name: &str, set: &SetRef) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some(set.namespace.clone()),
        labels: Some(set_labels(set)),
        ..ObjectMeta::default()
    }
}

/// The join RBAC of `set`: its join group and its fallback ServiceAccount may create and get
/// registration requests in the set's home namespace, nothing else.
pub fn join_rbac(set: &SetRef) -> (Role, RoleBinding) {
    let name = join_name(set);
    let role = Role {
        metadata: meta(&name, set),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![tether_api::GROUP.into()]),
            resources: Some(vec!["clusterregistrationrequests".into()]),
            verbs: vec!["create".into(), "get".into()],
            ..PolicyRule::default()
        }]),
    };
    let binding = RoleBinding {
        metadata: meta(&name, set),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: name.clone(),
        },
        subjects: Some(vec![
            Subject {
                api_group: Some("rbac.authorization.k8s.io".into()),
                kind: "Group".into(),
                name: join_group(set),
                ..Subject::default()
            },
            Subject {
                kind: "ServiceAccount".into(),
                name,
                namespace: Some(set.namespace.clone()),
                ..Subject::default()
            },
        ]),
    };
    (role, binding)
}

/// The ServiceAccount whose tokens join `set` where bootstrap tokens are not enabled.
pub fn join_service_account(set: &SetRef) -> ServiceAccount {
    ServiceAccount {
        metadata: meta(&join_name(set), set),
        ..ServiceAccount::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_join_group_names_one_set_namespace_included() {
        let a = SetRef::new("tether-system", "prod-us");
        let b = SetRef::new("tether-system-prod", "us");
        assert_ne!(join_group(&a), join_group(&b));
        assert_eq!(parse_join_group(&join_group(&a)), Some(a.clone()));
        assert_eq!(
            parse_join_group("system:bootstrappers:tether:prod"),
            None,
            "no namespace"
        );
        assert_eq!(
            parse_join_group("system:bootstrappers:kubeadm:default-node-token"),
            None
        );
        let (_, binding) = join_rbac(&a);
        let subjects = binding.subjects.unwrap();
        assert_eq!(
            subjects[0].name,
            "system:bootstrappers:tether:tether-system:prod-us"
        );
        assert_eq!(
            parse_join_service_account("system:serviceaccount:tether-system:tether-join-prod-us"),
            Some(a)
        );
    }

    #[test]
    fn a_token_secret_carries_its_set_and_never_prints_its_secret() {
        let t = BootstrapToken::random();
        let set = SetRef::new("ns", "prod");
        let s = t.secret(Some(&set), None);
        assert_eq!(s.metadata.namespace.as_deref(), Some(TOKEN_NAMESPACE));
        assert!(set.owns(s.metadata.labels.as_ref().unwrap()));
        assert_eq!(secret_text(&s, "auth-extra-groups"), Some(join_group(&set)));
        assert!(!format!("{t:?}").contains(&t.token()[7..]));
        assert_eq!(t.token().parse::<BootstrapToken>().unwrap(), t);
    }

    #[test]
    fn malformed_tokens_are_refused_with_the_expected_shape() {
        for bad in [
            "",
            "abcdef",
            "abcdef.0123456789abcde",
            "ABCDEF.0123456789abcdef",
            "abcdef:0123456789abcdef",
        ] {
            let err = bad.parse::<BootstrapToken>().unwrap_err().to_string();
            assert!(err.contains("<6 characters>.<16 characters>"), "{bad}: {err}");
        }
    }

    proptest! {
        #[test]
        fn token_parsing_never_panics(text in "\\PC*") {
            let _ = text.parse::<BootstrapToken>();
            let _ = parse_join_group(&text);
            let _ = parse_join_service_account(&text);
        }

        #[test]
        fn join_groups_round_trip(ns in "[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", set in "[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?") {
            let r = SetRef::new(ns, set);
            prop_assert_eq!(parse_join_group(&join_group(&r)), Some(r));
        }
    }
}
