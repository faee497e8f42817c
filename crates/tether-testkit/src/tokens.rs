//! Bootstrap tokens made the way Kubernetes expects them (`kube-system/bootstrap-token-<id>`),
//! for tests that act as a joining member.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};
use rand::Rng;

use crate::Error;

/// Characters Kubernetes allows in bootstrap token IDs and secrets.
const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";

/// A bootstrap token: `<id>.<secret>`, authenticating as `system:bootstrap:<id>`.
#[derive(Clone, Debug)]
pub struct BootstrapToken {
    /// Six-character public ID.
    pub id: String,
    /// Sixteen-character secret.
    pub secret: String,
}

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

    /// The bearer token.
    pub fn token(&self) -> String {
        format!("{}.{}", self.id, self.secret)
    }

    /// The user name the API server gives this token.
    pub fn user(&self) -> String {
        format!("system:bootstrap:{}", self.id)
    }

    /// Creates the token Secret (usable for authentication and for signing `cluster-info`) with
    /// `extra_groups` (each must start with `system:bootstrappers:`) and an optional RFC 3339 expiry.
    pub async fn create(
        &self,
        client: &Client,
        extra_groups: &[&str],
        expiration: Option<&str>,
    ) -> Result<(), Error> {
        let mut data = BTreeMap::from([
            ("token-id".to_string(), self.id.clone()),
            ("token-secret".to_string(), self.secret.clone()),
            ("usage-bootstrap-authentication".to_string(), "true".to_string()),
            ("usage-bootstrap-signing".to_string(), "true".to_string()),
        ]);
        if !extra_groups.is_empty() {
            data.insert("auth-extra-groups".into(), extra_groups.join(","));
        }
        if let Some(exp) = expiration {
            data.insert("expiration".into(), exp.to_string());
        }
        // As `tether` does: the token carries its set's label, so destroying the set removes it.
        let labels = extra_groups
            .iter()
            .find_map(|g| g.strip_prefix("system:bootstrappers:tether:"))
            .map(|set| BTreeMap::from([(tether_api::labels::CLUSTER_SET.to_string(), set.to_string())]));
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(format!("bootstrap-token-{}", self.id)),
                namespace: Some("kube-system".into()),
                labels,
                ..ObjectMeta::default()
            },
            type_: Some("bootstrap.kubernetes.io/token".into()),
            string_data: Some(data),
            ..Secret::default()
        };
        Api::<Secret>::namespaced(client.clone(), "kube-system")
            .create(&PostParams::default(), &secret)
            .await
            .map_err(|source| Error::Api {
                op: "create bootstrap token Secret".into(),
                source,
            })?;
        Ok(())
    }
}
