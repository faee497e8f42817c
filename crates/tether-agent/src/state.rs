//! What the agent keeps in its own cluster so that restarts, reinstalls and upgrades change
//! nothing: the cluster ID (from `spec.clusterID`, else the `cluster.clusterset.k8s.io`
//! ClusterProperty, else the UID of `kube-system`), its X25519 key pair and its leader credential
//! (Secrets in its namespace), and the `about.k8s.io` ClusterProperties it publishes.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams};
use kube::{Client, ResourceExt};
use tether_api::about::{ClusterProperty, v1alpha1::ClusterPropertySpec};
use tether_api::properties;
use tether_seal::MemberCredential;

use crate::{Error, FIELD_MANAGER};

/// The Secret holding the agent's private key.
pub const KEY_SECRET: &str = tether_api::agent_secrets::KEY;
/// The Secret holding the agent's leader credential.
pub const CREDENTIAL_SECRET: &str = tether_api::agent_secrets::CREDENTIAL;

fn api_err(op: &'static str, name: &str) -> impl FnOnce(kube::Error) -> Error {
    let name = name.to_string();
    move |source| Error::Member { op, name, source }
}

pub use tether_join::token::secret_text;

async fn apply_secret(
    client: &Client,
    ns: &str,
    name: &str,
    data: BTreeMap<String, String>,
) -> Result<(), Error> {
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            labels: Some(BTreeMap::from([(
                tether_api::labels::MANAGED_BY.into(),
                FIELD_MANAGER.into(),
            )])),
            ..ObjectMeta::default()
        },
        type_: Some("Opaque".into()),
        data: Some(
            data.into_iter()
                .map(|(k, v)| (k, ByteString(v.into_bytes())))
                .collect(),
        ),
        ..Secret::default()
    };
    Api::<Secret>::namespaced(client.clone(), ns)
        .patch(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&secret),
        )
        .await
        .map_err(api_err("store Secret", name))?;
    Ok(())
}

/// The agent's key pair `(identity, recipient)`, created once and kept in `KEY_SECRET`.
pub async fn key_pair(client: &Client, ns: &str) -> Result<(String, String), Error> {
    let api = Api::<Secret>::namespaced(client.clone(), ns);
    let existing = api
        .get_opt(KEY_SECRET)
        .await
        .map_err(api_err("read Secret", KEY_SECRET))?;
    if let Some(s) = existing
        && let (Some(identity), Some(recipient)) = (secret_text(&s, "identity"), secret_text(&s, "recipient"))
    {
        return Ok((identity, recipient));
    }
    let (identity, recipient) = tether_seal::generate_keypair();
    let data = BTreeMap::from([
        ("identity".into(), identity.clone()),
        ("recipient".into(), recipient.clone()),
    ]);
    apply_secret(client, ns, KEY_SECRET, data).await?;
    Ok((identity, recipient))
}

/// A credential as stored, with the registration request it came from.
#[derive(Clone, Debug)]
pub struct Stored {
    /// The credential.
    pub credential: MemberCredential,
    /// Its lifetime in seconds when it was issued (renewals ask for the same).
    pub ttl_seconds: i64,
}

impl Stored {
    /// A credential just issued: its lifetime is what is left of it now (at least the 10 minutes
    /// the API server issues at the least).
    pub fn issued(credential: MemberCredential) -> Self {
        let ttl_seconds = credential
            .expiration_timestamp
            .parse::<k8s_openapi::jiff::Timestamp>()
            .map(|exp| (exp - k8s_openapi::jiff::Timestamp::now()).get_seconds().max(600))
            .unwrap_or(3600);
        Self {
            credential,
            ttl_seconds,
        }
    }

    /// When the credential expires (`None` if its time does not parse).
    pub fn expiry(&self) -> Option<k8s_openapi::jiff::Timestamp> {
        self.credential.expiration_timestamp.parse().ok()
    }

    /// Whether it expired, or does within 30 s.
    pub fn expired(&self) -> bool {
        let soon = k8s_openapi::jiff::Timestamp::now() + k8s_openapi::jiff::SignedDuration::from_secs(30);
        self.expiry().is_none_or(|e| e <= soon)
    }
}

/// The stored credential, if any.
pub async fn load_credential(client: &Client, ns: &str) -> Result<Option<Stored>, Error> {
    let api = Api::<Secret>::namespaced(client.clone(), ns);
    let Some(s) = api
        .get_opt(CREDENTIAL_SECRET)
        .await
        .map_err(api_err("read Secret", CREDENTIAL_SECRET))?
    else {
        return Ok(None);
    };
    let text = |k: &str| secret_text(&s, k).unwrap_or_default();
    if text("token").is_empty() {
        return Ok(None);
    }
    Ok(Some(Stored {
        credential: MemberCredential {
            token: text("token"),
            expiration_timestamp: text("expiration"),
            namespace: text("namespace"),
            service_account: text("serviceAccount"),
            ca_cert: text("ca.crt"),
        },
        ttl_seconds: text("ttlSeconds").parse().unwrap_or(3600),
    }))
}

/// Stores the credential in `CREDENTIAL_SECRET`.
pub async fn store_credential(client: &Client, ns: &str, stored: &Stored) -> Result<(), Error> {
    let c = &stored.credential;
    let data = BTreeMap::from([
        ("token".into(), c.token.clone()),
        ("expiration".into(), c.expiration_timestamp.clone()),
        ("namespace".into(), c.namespace.clone()),
        ("serviceAccount".into(), c.service_account.clone()),
        ("ca.crt".into(), c.ca_cert.clone()),
        ("ttlSeconds".into(), stored.ttl_seconds.to_string()),
    ]);
    apply_secret(client, ns, CREDENTIAL_SECRET, data).await
}

/// Deletes one of the agent's Secrets; one already gone is fine.
pub async fn delete_secret(client: &Client, ns: &str, name: &str) -> Result<(), Error> {
    match Api::<Secret>::namespaced(client.clone(), ns)
        .delete(name, &DeleteParams::default())
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(api_err("delete Secret", name)(e)),
    }
}

/// This cluster's ID: `explicit`, else the ClusterProperty, else the UID of `kube-system`.
/// A ClusterProperty that disagrees with an explicit ID is an error, never silently replaced.
pub async fn cluster_id(client: &Client, explicit: Option<&str>) -> Result<String, Error> {
    let property = read_property(client, properties::CLUSTER_ID).await?;
    match (explicit, property) {
        (Some(id), Some(p)) if p != id => Err(Error::ClusterIdConflict {
            explicit: id.to_string(),
            property: p,
        }),
        (Some(id), _) => Ok(id.to_string()),
        (None, Some(p)) => Ok(p),
        (None, None) => {
            let ns = Api::<Namespace>::all(client.clone())
                .get("kube-system")
                .await
                .map_err(api_err("read namespace", "kube-system"))?;
            ns.uid().ok_or(Error::Invariant("kube-system has no UID"))
        }
    }
}

/// The value of an `about.k8s.io` ClusterProperty; None if absent or if the CRD is not installed.
pub async fn read_property(client: &Client, name: &str) -> Result<Option<String>, Error> {
    match Api::<ClusterProperty>::all(client.clone()).get_opt(name).await {
        Ok(p) => Ok(p.map(|p| p.spec.value)),
        // NB: 404 on the resource itself means the ClusterProperty CRD is not installed.
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        Err(e) => Err(api_err("read ClusterProperty", name)(e)),
    }
}

/// Writes a ClusterProperty if the CRD exists; returns whether it does.
pub async fn write_property(client: &Client, name: &str, value: &str) -> Result<bool, Error> {
    let mut p = ClusterProperty::new(name, ClusterPropertySpec { value: value.into() });
    p.metadata.labels = Some(BTreeMap::from([(
        tether_api::labels::MANAGED_BY.into(),
        FIELD_MANAGER.into(),
    )]));
    match Api::<ClusterProperty>::all(client.clone())
        .patch(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&p),
        )
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(api_err("write ClusterProperty", name)(e)),
    }
}

/// Deletes a ClusterProperty (absent or no CRD is fine).
pub async fn delete_property(client: &Client, name: &str) -> Result<(), Error> {
    match Api::<ClusterProperty>::all(client.clone())
        .delete(name, &DeleteParams::default())
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(api_err("delete ClusterProperty", name)(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_of_a_stored_credential_never_prints_its_token() {
        let s = Stored {
            credential: MemberCredential {
                token: "eyJhbGciOi.secret-token".into(),
                expiration_timestamp: "2026-12-04T00:00:00Z".into(),
                namespace: "tether-prod-east".into(),
                service_account: "tether-agent".into(),
                ca_cert: "ca".into(),
            },
            ttl_seconds: 3600,
        };
        let text = format!("{s:?} {s:#?}");
        assert!(!text.contains("secret-token"), "{text}");
        assert!(text.contains("tether-prod-east"), "{text}");
    }
}
