//! How a joiner trusts the leader before any secret is sent. The leader publishes its CA in
//! `kube-public/cluster-info` (kubeadm's discovery ConfigMap: a `kubeconfig` key with the server
//! URL and CA), readable by anyone. A joiner reads it anonymously over a connection checked by
//! the pin verifier (`verifier.rs`), requires a CA whose pin matches, and from then on talks TLS
//! verified by that CA only. A CA bundle given directly is the alternative.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use hyper_timeout::TimeoutConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ObjectMeta;
use kube::client::ConfigExt;
use kube::config::{AuthInfo, Kubeconfig};
use kube::{Api, Client, Config};
use tower::BoxError;
use tower_http::trace::TraceLayer;
use tracing::info;

use crate::pin::{self, CaPin, PinError};
use crate::verifier::{ChainError, PinVerifier, Proof};

/// Where the leader publishes its CA for joiners.
pub const DISCOVERY_NAMESPACE: &str = "kube-public";
/// The discovery ConfigMap (kubeadm's name).
pub const DISCOVERY_CONFIGMAP: &str = "cluster-info";
/// Its key holding a kubeconfig with the leader's URL and CA.
pub const DISCOVERY_KEY: &str = "kubeconfig";
/// How long discovery may take in all.
const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(30);

/// Why the leader cannot be trusted (or reached to find out).
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// The leader URL is not a valid URL.
    #[error("leader URL {url:?} is invalid: {reason}")]
    BadUrl {
        /// The URL.
        url: String,
        /// Why.
        reason: String,
    },
    /// The discovery ConfigMap could not be read.
    #[error(
        "cannot read {DISCOVERY_NAMESPACE}/{DISCOVERY_CONFIGMAP} from the leader at {url}: {reason}; \
         check the URL and that the leader is reachable from here, or give the CA with --ca-bundle \
         (caBundle) where anonymous access is off"
    )]
    Unreachable {
        /// The leader URL.
        url: String,
        /// The cause.
        reason: String,
    },
    /// Neither a CA pin nor a CA bundle, and skipping the CA check was not asked for.
    #[error(
        "no way to verify the leader: give its CA pin (caCertHash, `--ca-cert-hash sha256:…` as \
         printed by `tether init`) or its CA bundle (caBundle); only \
         insecureSkipCAVerification: true skips the check, and then the join token can reach \
         anyone who answers at the leader URL"
    )]
    NoTrust,
    /// The discovery data is not a kubeconfig with a CA.
    #[error("the leader's {DISCOVERY_CONFIGMAP} has no usable CA: {0}")]
    NoCa(String),
    /// No CA matches the pin.
    #[error(
        "the leader's CA does not match the pin: expected {expected}, the leader presented {seen}. \
         Nothing was sent. If you trust this leader, take the hash printed by `tether init`, or \
         compute it on the leader: openssl x509 -pubkey -noout -in ca.crt | openssl pkey -pubin \
         -outform der | sha256sum"
    )]
    PinMismatch {
        /// The pin we were given.
        expected: CaPin,
        /// What the leader offered: `subject (pin)` per CA.
        seen: String,
    },
    /// The CA matches, but the server is not one of its certificates.
    #[error("{0}. Nothing was sent: something between here and the leader is not the leader")]
    Chain(#[from] ChainError),
    /// A pin or certificate could not be read.
    #[error(transparent)]
    Pin(#[from] PinError),
}

/// How the agent trusts its leader.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Trust {
    /// A PEM CA bundle, verified (by pin or given directly).
    Ca(String),
    /// No verification at all (`insecureSkipCAVerification`): the token may go to an impostor.
    Insecure,
}

const EXPECTED_URL: &str = "it must be https://<host>[:<port>]";

/// Checks a leader URL as users type it: `https://<host>[:<port>]` (a path is allowed, for a
/// leader behind a proxy), with an error that quotes it and says what is expected.
pub fn leader_uri(url: &str) -> Result<http::Uri, DiscoveryError> {
    let bad = |reason: String| DiscoveryError::BadUrl {
        url: url.to_string(),
        reason,
    };
    let uri: http::Uri = url
        .parse()
        .map_err(|e: http::uri::InvalidUri| bad(format!("{e}; {EXPECTED_URL}")))?;
    if uri.scheme_str() != Some("https") || uri.host().is_none_or(str::is_empty) {
        return Err(bad(EXPECTED_URL.into()));
    }
    Ok(uri)
}

/// Client configuration for the leader at `url` with `trust`, authenticating with `token` if any.
pub fn leader_config(url: &str, trust: &Trust, token: Option<&str>) -> Result<Config, DiscoveryError> {
    let mut config = Config::new(leader_uri(url)?);
    match trust {
        Trust::Ca(pem_bundle) => {
            config.root_cert = Some(
                pin::certificates(pem_bundle)?
                    .into_iter()
                    .map(|c| c.der)
                    .collect(),
            );
        }
        Trust::Insecure => config.accept_invalid_certs = true,
    }
    config.auth_info = AuthInfo {
        token: token.map(|t| t.to_string().into()),
        ..AuthInfo::default()
    };
    config.connect_timeout = Some(Duration::from_secs(10));
    config.read_timeout = Some(Duration::from_secs(30));
    Ok(config)
}

/// A client of the leader from `config`, the stack `Client::try_from` builds (timeouts, retries of
/// 429/503/504 honouring Retry-After, auth, extra headers, debug spans per request) with
/// TCP_NODELAY on its connections; a request marked `retry::Once` is sent once.
/// NB: kube's own connector leaves Nagle on; on a tunnel carrying small HTTP/2 frames to a peer
/// that delays ACKs that costs up to 40 ms per exchange, so every client that talks to the
/// leader is built here.
pub fn leader_client(config: Config) -> Result<Client, kube::Error> {
    let mut tcp = HttpConnector::new();
    tcp.enforce_http(false);
    tcp.set_nodelay(true);
    let mut timed = TimeoutConnector::new(config.rustls_https_connector_with_connector(tcp)?);
    timed.set_connect_timeout(config.connect_timeout);
    timed.set_read_timeout(config.read_timeout);
    timed.set_write_timeout(config.write_timeout);
    let pool = hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build(timed);
    let retry = config.default_retry.then(crate::retry::layer);
    let service = tower::ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(retry)
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .layer(TraceLayer::new_for_http())
        .map_err(BoxError::from)
        .service(pool);
    Ok(Client::new(service, config.default_namespace))
}

/// The leader's discovery ConfigMap, publishing `url` and `ca_pem`.
pub fn cluster_info(ca_pem: &str, url: &str, labels: BTreeMap<String, String>) -> ConfigMap {
    let ca = B64.encode(ca_pem);
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: \"\"\n  cluster:\n    certificate-authority-data: {ca}\n    \
         server: {url}\ncontexts: []\nusers: []\n"
    );
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(DISCOVERY_CONFIGMAP.into()),
            namespace: Some(DISCOVERY_NAMESPACE.into()),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(DISCOVERY_KEY.to_string(), kubeconfig)])),
        ..ConfigMap::default()
    }
}

/// The CA PEM of the first cluster in a kubeconfig.
pub fn ca_from_kubeconfig(text: &str) -> Result<String, DiscoveryError> {
    let kubeconfig = Kubeconfig::from_yaml(text).map_err(|e| DiscoveryError::NoCa(e.to_string()))?;
    let data = kubeconfig
        .clusters
        .first()
        .and_then(|c| c.cluster.as_ref())
        .and_then(|c| c.certificate_authority_data.clone())
        .ok_or_else(|| DiscoveryError::NoCa("no certificate-authority-data".into()))?;
    let pem = B64
        .decode(data.trim())
        .map_err(|e| DiscoveryError::NoCa(format!("certificate-authority-data: {e}")))?;
    String::from_utf8(pem).map_err(|e| DiscoveryError::NoCa(e.to_string()))
}

/// The server URL of the first cluster in a kubeconfig, if it has one.
pub fn server_from_kubeconfig(text: &str) -> Option<String> {
    Kubeconfig::from_yaml(text)
        .ok()?
        .clusters
        .first()
        .and_then(|c| c.cluster.as_ref())
        .and_then(|c| c.server.clone())
        .filter(|s| !s.trim().is_empty())
}

/// The URL this cluster publishes for joiners in `kube-public/cluster-info` (kubeadm's control
/// plane endpoint, or the leader chart's `leaderURL`), read with `client`'s credentials. `None`
/// when there is no such ConfigMap or it cannot be read.
pub async fn published_url(client: &Client) -> Option<String> {
    published(client).await?.url
}

/// What a cluster publishes for joiners in `kube-public/cluster-info`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Published {
    /// The API server URL, if the kubeconfig names one.
    pub url: Option<String>,
    /// The CA bundle (PEM), if the kubeconfig carries one.
    pub ca: Option<String>,
}

/// Reads `kube-public/cluster-info` with `client`'s credentials (and its trust: read over a
/// verified connection, it is what the leader itself says). `None` when there is no such
/// ConfigMap or it cannot be read.
pub async fn published(client: &Client) -> Option<Published> {
    let cm = Api::<ConfigMap>::namespaced(client.clone(), DISCOVERY_NAMESPACE)
        .get_opt(DISCOVERY_CONFIGMAP)
        .await
        .ok()??;
    let text = cm.data.as_ref()?.get(DISCOVERY_KEY)?;
    Some(Published {
        url: server_from_kubeconfig(text),
        ca: ca_from_kubeconfig(text).ok(),
    })
}

/// Checks that a certificate of `pem_bundle` has `pin`; the error says what was seen instead.
pub fn check_pin(pem_bundle: &str, pin: &CaPin) -> Result<pin::Ca, DiscoveryError> {
    let cas = pin::certificates(pem_bundle)?;
    let seen = cas
        .iter()
        .map(|c| format!("{} ({})", c.subject, c.pin))
        .collect::<Vec<_>>()
        .join(", ");
    cas.into_iter()
        .find(|c| &c.pin == pin)
        .ok_or_else(|| DiscoveryError::PinMismatch {
            expected: pin.clone(),
            seen,
        })
}

/// A client that talks to `url` only through `verifier`, anonymously.
fn pinned_client(url: &str, verifier: Arc<PinVerifier>) -> Result<Client, DiscoveryError> {
    let config = Config::new(leader_uri(url)?);
    let unreachable = |reason: String| DiscoveryError::Unreachable {
        url: url.to_string(),
        reason,
    };
    let tls = rustls::ClientConfig::builder_with_provider(verifier.provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| unreachable(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_only()
        .enable_http1()
        .build();
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build::<_, kube::client::Body>(https);
    let service = tower::ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .service(http);
    Ok(Client::new(service, "default"))
}

/// Reads the leader's CA bundle from its discovery ConfigMap, proven to come from a server whose
/// chain ends at the CA with `pin`. Nothing but the anonymous read is sent before that proof.
pub async fn fetch_leader_ca(url: &str, pin: &CaPin) -> Result<String, DiscoveryError> {
    let verifier = PinVerifier::new(pin.clone());
    let client = pinned_client(url, verifier.clone())?;
    let unreachable = |reason: String| DiscoveryError::Unreachable {
        url: url.to_string(),
        reason,
    };
    let api = Api::<ConfigMap>::namespaced(client, DISCOVERY_NAMESPACE);
    let cm = tokio::time::timeout(DISCOVERY_TIMEOUT, api.get(DISCOVERY_CONFIGMAP))
        .await
        .map_err(|_| unreachable(format!("no answer within {DISCOVERY_TIMEOUT:?}")))?
        .map_err(|e| unreachable(e.to_string()))?;
    let text = cm
        .data
        .and_then(|d| d.get(DISCOVERY_KEY).cloned())
        .ok_or_else(|| DiscoveryError::NoCa(format!("no `{DISCOVERY_KEY}` key")))?;
    let bundle = ca_from_kubeconfig(&text)?;
    let ca = check_pin(&bundle, pin)?;
    let proof = verifier.confirm(&ca.der)?;
    info!(%pin, ca = %ca.subject, leader = %url, proof = match proof {
        Proof::InHandshake => "pinned CA presented and verified in the TLS handshake",
        Proof::AgainstDiscoveredCa => "serving certificate verified against the pinned CA",
    }, "Leader CA verified against the pin");
    Ok(bundle)
}

/// Resolves how to trust the leader from a member spec: the CA bundle (checked against the pin
/// when both are given), else the discovery CA proven by the pin, else nothing, but only when
/// `insecureSkipCAVerification` says so (the CRD's rule says the same; a spec that slipped past
/// it must not go insecure silently).
pub async fn trust_for(spec: &tether_api::clusterset::MemberSpec) -> Result<Trust, DiscoveryError> {
    let pin = spec
        .ca_cert_hash
        .as_deref()
        .map(str::parse::<CaPin>)
        .transpose()?;
    if let Some(bundle) = &spec.ca_bundle {
        match &pin {
            Some(pin) => drop(check_pin(bundle, pin)?),
            None => drop(pin::certificates(bundle)?),
        }
        return Ok(Trust::Ca(bundle.clone()));
    }
    if let Some(pin) = &pin {
        return Ok(Trust::Ca(fetch_leader_ca(&spec.leader_url, pin).await?));
    }
    if spec.insecure_skip_ca_verification {
        Ok(Trust::Insecure)
    } else {
        Err(DiscoveryError::NoTrust)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pin::tests::ca;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn any_leader_url_is_checked_without_panicking(text in "\\PC*") {
            match leader_uri(&text) {
                Ok(uri) => {
                    prop_assert_eq!(uri.scheme_str(), Some("https"));
                    prop_assert!(uri.host().is_some_and(|h| !h.is_empty()));
                }
                Err(e) => {
                    let msg = e.to_string();
                    prop_assert!(msg.contains(&format!("{text:?}")), "the error quotes the URL: {}", msg);
                }
            }
        }

        #[test]
        fn https_host_port_urls_are_accepted(host in "[a-z][a-z0-9-]{0,20}(\\.[a-z][a-z0-9-]{0,10}){0,3}", port in 1u16..) {
            let url = format!("https://{host}:{port}");
            let uri = leader_uri(&url).unwrap();
            prop_assert_eq!(uri.host(), Some(host.as_str()));
            prop_assert_eq!(uri.port_u16(), Some(port));
        }

        #[test]
        fn kubeconfig_text_of_any_shape_never_panics(text in "\\PC*") {
            let _ = server_from_kubeconfig(&text);
            let _ = ca_from_kubeconfig(&text);
        }

        #[test]
        fn the_server_of_a_kubeconfig_is_read_back(server in "https://[a-z0-9.-]{1,30}(:[0-9]{1,5})?") {
            let text = format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n"
            );
            prop_assert_eq!(server_from_kubeconfig(&text), Some(server));
        }
    }

    #[test]
    fn a_wrong_pin_names_what_was_seen_and_how_to_get_the_right_one() {
        let (pem, _, _, pin) = ca("leader-ca");
        let (_, _, _, other) = ca("impostor");
        let err = check_pin(&pem, &other).unwrap_err().to_string();
        assert!(
            err.contains(&pin.to_string()) && err.contains("leader-ca"),
            "{err}"
        );
        assert!(
            err.contains("Nothing was sent") && err.contains("tether init"),
            "{err}"
        );
    }

    #[test]
    fn a_bundle_with_several_cas_matches_any_of_them() {
        let (a, _, _, _) = ca("old");
        let (b, _, _, pin_b) = ca("new");
        check_pin(&format!("{a}{b}"), &pin_b).unwrap();
    }

    #[test]
    fn the_published_kubeconfig_gives_back_the_ca() {
        let (pem, _, _, _) = ca("leader-ca");
        let cm = cluster_info(&pem, "https://leader:6443", BTreeMap::new());
        let text = &cm.data.unwrap()[DISCOVERY_KEY];
        assert_eq!(ca_from_kubeconfig(text).unwrap(), pem);
        assert!(ca_from_kubeconfig("clusters: []").is_err());
    }

    #[test]
    fn the_published_kubeconfig_gives_back_the_url() {
        let cm = cluster_info("ca", "https://leader:6443", BTreeMap::new());
        let text = &cm.data.unwrap()[DISCOVERY_KEY];
        assert_eq!(
            server_from_kubeconfig(text).as_deref(),
            Some("https://leader:6443")
        );
        assert_eq!(server_from_kubeconfig("not: [yaml"), None);
    }

    #[test]
    fn leader_urls_must_be_https_with_a_host() {
        for bad in [
            "",
            "not a url with spaces",
            "http://leader:6443",
            "leader:6443",
            "https://",
            "https:// leader",
            "ftp://x",
        ] {
            let err = leader_config(bad, &Trust::Insecure, None).err();
            assert!(
                matches!(&err, Some(DiscoveryError::BadUrl { .. }))
                    && err.as_ref().is_some_and(|e| e.to_string().contains(EXPECTED_URL)),
                "{bad}: {err:?}"
            );
        }
        assert!(leader_uri("https://leader.example.com/k8s/clusters/c-1").is_ok());
        assert!(leader_config("https://127.0.0.1:6443", &Trust::Insecure, None).is_ok());
    }

    fn member_spec(insecure: bool) -> tether_api::clusterset::MemberSpec {
        serde_json::from_value(serde_json::json!({
            "leaderURL": "https://127.0.0.1:1",
            "clusterName": "east",
            "joinTokenSecretRef": {"name": "join"},
            "insecureSkipCAVerification": insecure,
        }))
        .unwrap()
    }

    #[tokio::test]
    async fn neither_pin_nor_bundle_is_refused_unless_the_check_is_skipped_explicitly() {
        let err = trust_for(&member_spec(false)).await.err();
        assert!(matches!(err, Some(DiscoveryError::NoTrust)), "{err:?}");
        let text = err.map(|e| e.to_string()).unwrap_or_default();
        assert!(
            text.contains("caCertHash") && text.contains("insecureSkipCAVerification"),
            "{text}"
        );
        assert!(matches!(trust_for(&member_spec(true)).await, Ok(Trust::Insecure)));
    }
}
