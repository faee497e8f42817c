//! Registration with the join token: create a ClusterRegistrationRequest carrying the cluster ID,
//! name, labels and public key, wait (with backoff) for the leader's decision, and unseal the
//! credential. Only called once the leader's CA is trusted (discovery.rs).

use std::time::Duration;

use kube::api::{Api, GetParams, ObjectMeta, PostParams};
use kube::{Client, ResourceExt};
use tether_api::registration::RegistrationResult;
use tether_api::{ClusterRegistrationRequest, ClusterRegistrationRequestSpec};
use tether_join::settle::Settle;
use tracing::info;

use crate::state::Stored;
use crate::{Error, VERSION};

/// Where the leader keeps registration requests: the set's home namespace.
pub struct Target<'a> {
    /// A client of the leader with the join token.
    pub bootstrap: Client,
    /// The set's home namespace on the leader (the member ClusterSet's namespace name is not
    /// necessarily the same; the join config carries it).
    pub namespace: &'a str,
}

/// What to register as.
pub struct Registration<'a> {
    /// The cluster ID.
    pub cluster_id: &'a str,
    /// The cluster name.
    pub cluster_name: &'a str,
    /// Labels for the ManagedCluster.
    pub labels: std::collections::BTreeMap<String, String>,
    /// The agent's private key (to unseal).
    pub identity: &'a str,
    /// The agent's public key (to seal to).
    pub recipient: &'a str,
}

fn classify(op: &'static str) -> impl FnOnce(kube::Error) -> Error {
    move |source| match &source {
        kube::Error::Api(s) if s.code == 401 => Error::JoinTokenRejected,
        kube::Error::Api(s) if s.code == 403 => Error::JoinTokenForbidden(s.message.clone()),
        _ => Error::Leader { op, source },
    }
}

/// Registers and returns the unsealed credential; Denied is a permanent error until the spec changes.
pub async fn register(
    target: &Target<'_>,
    reg: &Registration<'_>,
    timeout: Duration,
) -> Result<Stored, Error> {
    let api = Api::<ClusterRegistrationRequest>::namespaced(target.bootstrap.clone(), target.namespace);
    let mut req = ClusterRegistrationRequest::new(
        "",
        ClusterRegistrationRequestSpec {
            cluster_id: reg.cluster_id.into(),
            cluster_name: reg.cluster_name.into(),
            public_key: reg.recipient.into(),
            agent_version: Some(VERSION.into()),
            labels: reg.labels.clone(),
        },
    );
    req.metadata = ObjectMeta {
        generate_name: Some(format!("{}-", reg.cluster_name)),
        ..ObjectMeta::default()
    };
    // NB: a token used moments after its Secret was created can get 401 until the API server's
    // authenticator has seen it (`tether init` and then `helm install` from one script).
    let mut unseen = Settle::unauthorized();
    let created = loop {
        match api.create(&PostParams::default(), &req).await {
            Ok(created) => break created,
            Err(e) if unseen.tolerate(&e) => {
                info!("Join token not accepted yet; retrying while the API server may not have seen it");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(classify("create registration request")(e)),
        }
    };
    let name = created.name_any();
    info!(request = %name, cluster_id = %reg.cluster_id, "Registration request created; waiting for the leader");

    let deadline = tokio::time::Instant::now() + timeout;
    let mut wait = Duration::from_millis(250);
    loop {
        // NB: read from the API server's watch cache (no etcd read per poll, and polls are most
        // of a registration's reads); a request created a moment ago may not be there yet.
        let r = match api.get_with(&name, &GetParams::any()).await {
            Err(kube::Error::Api(s)) if s.code == 404 => api.get(&name).await,
            r => r,
        }
        .map_err(classify("read registration request"))?;
        let status = r.status.unwrap_or_default();
        match status.result {
            RegistrationResult::Approved => {
                let sealed = status
                    .credential
                    .ok_or(Error::Invariant("Approved without a credential"))?
                    .sealed;
                let credential = tether_seal::unseal(&sealed, reg.identity)?;
                info!(request = %name, namespace = %credential.namespace, "Registration approved");
                return Ok(Stored::issued(credential));
            }
            RegistrationResult::Denied => {
                return Err(Error::Denied {
                    reason: format!("{:?}", status.reason),
                    message: status.message.unwrap_or_default(),
                });
            }
            RegistrationResult::Pending => {
                if tokio::time::Instant::now() >= deadline {
                    return Err(Error::RegistrationTimeout {
                        request: name,
                        message: status.message.unwrap_or_else(|| "no decision yet".into()),
                    });
                }
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(5));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use http::{Method, Response};
    use kube::client::Body;
    use serde_json::{Value, json};
    use tether_seal::MemberCredential;

    use super::*;
    use crate::testing;

    fn answer(code: u16, body: Value) -> Response<Body> {
        Response::builder()
            .status(code)
            .header("content-type", "application/json")
            .body(Body::from(serde_json::to_vec(&body).unwrap_or_default()))
            .expect("response")
    }

    fn request(status: Value) -> Value {
        json!({"apiVersion": "multicluster.tether.dev/v1alpha1", "kind": "ClusterRegistrationRequest",
               "metadata": {"name": "east-x1", "namespace": "tether-system"},
               "spec": {"clusterID": "0b1e7c4e-1111-4222-8333-444455556666", "clusterName": "east",
                        "publicKey": "age1x"},
               "status": status})
    }

    /// The request as the API server's watch cache sees it: not yet there (a request created a
    /// moment ago), and as etcd has it: approved.
    #[tokio::test]
    async fn a_request_the_watch_cache_has_not_seen_yet_is_read_from_etcd_instead() {
        let (identity, recipient) = tether_seal::generate_keypair();
        let credential = MemberCredential {
            token: "the-token".into(),
            expiration_timestamp: "2026-12-05T23:00:00Z".into(),
            namespace: "tether-member-east".into(),
            service_account: "tether-agent".into(),
            ca_cert: String::new(),
        };
        let sealed = tether_seal::seal(&credential, &recipient).expect("seal");
        let (leader, seen) = testing::member(move |parts| {
            let cached = parts.uri.query().is_some_and(|q| q.contains("resourceVersion=0"));
            match (&parts.method, cached) {
                (&Method::POST, _) => answer(201, request(json!({}))),
                (&Method::GET, true) => {
                    let (code, body) = testing::failure(404);
                    answer(code, body)
                }
                (&Method::GET, false) => answer(
                    200,
                    request(
                        json!({"result": "Approved", "reason": "Approved", "namespace": "tether-member-east",
                                   "credential": {"sealed": sealed}}),
                    ),
                ),
                _ => answer(405, json!({})),
            }
        });
        let target = Target {
            bootstrap: leader,
            namespace: "tether-system",
        };
        let reg = Registration {
            cluster_id: "0b1e7c4e-1111-4222-8333-444455556666",
            cluster_name: "east",
            labels: Default::default(),
            identity: &identity,
            recipient: &recipient,
        };
        let stored = register(&target, &reg, Duration::from_secs(5))
            .await
            .expect("registered through the consistent read");
        assert_eq!(stored.credential.token, "the-token");
        let reads: Vec<Option<String>> = seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|p| p.method == Method::GET)
            .map(|p| p.uri.query().map(str::to_string))
            .collect();
        assert_eq!(
            reads.len(),
            2,
            "one read from the cache, then one from etcd: {reads:?}"
        );
        assert!(
            reads[0]
                .as_deref()
                .is_some_and(|q| q.contains("resourceVersion=0")),
            "{reads:?}"
        );
        assert!(
            !reads[1]
                .as_deref()
                .unwrap_or_default()
                .contains("resourceVersion"),
            "{reads:?}"
        );
    }
}
