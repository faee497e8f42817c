//! Ensures the leader's aggregated server believes an identity header only from its own API
//! server: the client certificate must chain to the request-header CA that the API server
//! publishes in `kube-system/extension-apiserver-authentication`, and its common name must be
//! one of the allowed names there. Everything else is unauthenticated.

use std::sync::Arc;

use http::HeaderMap;
use http::header::HeaderName;
use k8s_openapi::api::core::v1::ConfigMap;
use rustls::RootCertStore;
use rustls::pki_types::CertificateDer;
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;
use tether_tunnel::identity::Caller;

/// Namespace of the API server's front-proxy configuration.
pub const AUTH_NAMESPACE: &str = "kube-system";
/// The ConfigMap in it.
pub const AUTH_CONFIGMAP: &str = "extension-apiserver-authentication";

/// The front-proxy trust the API server publishes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrontProxy {
    roots: Vec<CertificateDer<'static>>,
    allowed_names: Vec<String>,
    user_headers: Vec<HeaderName>,
    group_headers: Vec<HeaderName>,
}

/// Why the front-proxy configuration cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum FrontProxyError {
    /// The ConfigMap has no request-header CA: the API server runs without aggregation.
    #[error(
        "{AUTH_NAMESPACE}/{AUTH_CONFIGMAP} has no requestheader-client-ca-file: start the leader's \
         kube-apiserver with --requestheader-client-ca-file and --proxy-client-cert-file (the API \
         aggregation layer) to reach members through the leader"
    )]
    NoRequestHeaderCa,
    /// A value is not what the API server writes.
    #[error("{AUTH_NAMESPACE}/{AUTH_CONFIGMAP}: {key}: {reason}")]
    Malformed {
        /// The key.
        key: &'static str,
        /// What is wrong.
        reason: String,
    },
}

fn list(cm: &ConfigMap, key: &'static str) -> Result<Vec<String>, FrontProxyError> {
    match cm.data.as_ref().and_then(|d| d.get(key)) {
        None => Ok(Vec::new()),
        Some(text) => serde_json::from_str(text).map_err(|e| FrontProxyError::Malformed {
            key,
            reason: e.to_string(),
        }),
    }
}

fn header_names(
    cm: &ConfigMap,
    key: &'static str,
    default: &str,
) -> Result<Vec<HeaderName>, FrontProxyError> {
    let mut names = list(cm, key)?;
    if names.is_empty() {
        names.push(default.to_string());
    }
    names
        .iter()
        .map(|n| {
            HeaderName::from_bytes(n.to_ascii_lowercase().as_bytes()).map_err(|e| {
                FrontProxyError::Malformed {
                    key,
                    reason: e.to_string(),
                }
            })
        })
        .collect()
}

impl FrontProxy {
    /// Reads the API server's front-proxy trust from its ConfigMap.
    pub fn from_configmap(cm: &ConfigMap) -> Result<Self, FrontProxyError> {
        const CA_KEY: &str = "requestheader-client-ca-file";
        let pem = cm
            .data
            .as_ref()
            .and_then(|d| d.get(CA_KEY))
            .filter(|p| !p.trim().is_empty())
            .ok_or(FrontProxyError::NoRequestHeaderCa)?;
        let roots: Vec<CertificateDer<'static>> = pem::parse_many(pem)
            .map_err(|e| FrontProxyError::Malformed {
                key: CA_KEY,
                reason: e.to_string(),
            })?
            .into_iter()
            .filter(|p| p.tag() == "CERTIFICATE")
            .map(|p| CertificateDer::from(p.into_contents()))
            .collect();
        if roots.is_empty() {
            return Err(FrontProxyError::NoRequestHeaderCa);
        }
        Ok(Self {
            roots,
            allowed_names: list(cm, "requestheader-allowed-names")?,
            user_headers: header_names(cm, "requestheader-username-headers", "X-Remote-User")?,
            group_headers: header_names(cm, "requestheader-group-headers", "X-Remote-Group")?,
        })
    }

    /// A TLS client verifier for these roots. Clients without a certificate may connect (so they
    /// get a 401 that says why rather than a handshake failure); `check` then refuses them.
    pub fn verifier(&self) -> Result<Arc<dyn ClientCertVerifier>, FrontProxyError> {
        let mut store = RootCertStore::empty();
        for c in &self.roots {
            store.add(c.clone()).map_err(|e| FrontProxyError::Malformed {
                key: "requestheader-client-ca-file",
                reason: e.to_string(),
            })?;
        }
        WebPkiClientVerifier::builder_with_provider(
            Arc::new(store),
            Arc::new(rustls::crypto::ring::default_provider()),
        )
        .allow_unauthenticated()
        .build()
        .map_err(|e| FrontProxyError::Malformed {
            key: "requestheader-client-ca-file",
            reason: e.to_string(),
        })
    }

    /// Whether the peer (its verified chain, if any) is the API server's front proxy.
    pub fn check(&self, peer: Option<&[CertificateDer<'_>]>) -> Result<(), String> {
        let leaf = peer
            .and_then(|c| c.first())
            .ok_or("no client certificate: only the leader's API server may call this server")?;
        if self.allowed_names.is_empty() {
            return Ok(());
        }
        let (_, cert) = x509_parser::parse_x509_certificate(leaf.as_ref())
            .map_err(|e| format!("unreadable client certificate: {e}"))?;
        let cn: Vec<&str> = cert
            .subject()
            .iter_common_name()
            .filter_map(|a| a.as_str().ok())
            .collect();
        if cn.iter().any(|n| self.allowed_names.iter().any(|a| a == n)) {
            Ok(())
        } else {
            Err(format!(
                "client certificate {cn:?} is not one of the API server's requestheader-allowed-names"
            ))
        }
    }

    /// The caller the front proxy vouches for (only after `check` passed).
    pub fn caller(&self, headers: &HeaderMap) -> Option<Caller> {
        let user = self
            .user_headers
            .iter()
            .find_map(|h| headers.get(h).and_then(|v| v.to_str().ok()))
            .filter(|u| !u.is_empty())?
            .to_string();
        let groups = self
            .group_headers
            .iter()
            .flat_map(|h| headers.get_all(h).iter())
            .filter_map(|v| v.to_str().ok())
            .map(str::to_string)
            .collect();
        Some(Caller { user, groups })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn ca_and_client(cn: &str) -> (String, CertificateDer<'static>) {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name.push(rcgen::DnType::CommonName, cn);
        let issuer = rcgen::Issuer::new(ca, ca_key);
        let leaf = p.signed_by(&key, &issuer).unwrap();
        (ca_cert.pem(), leaf.der().clone())
    }

    fn cm(ca: &str, allowed: &str) -> ConfigMap {
        ConfigMap {
            data: Some(BTreeMap::from([
                ("requestheader-client-ca-file".to_string(), ca.to_string()),
                ("requestheader-allowed-names".to_string(), allowed.to_string()),
                (
                    "requestheader-username-headers".to_string(),
                    r#"["X-Remote-User"]"#.to_string(),
                ),
                (
                    "requestheader-group-headers".to_string(),
                    r#"["X-Remote-Group"]"#.to_string(),
                ),
            ])),
            ..ConfigMap::default()
        }
    }

    #[test]
    fn only_allowed_names_are_the_front_proxy() {
        let (ca, front) = ca_and_client("front-proxy-client");
        let (_, other) = ca_and_client("someone-else");
        let fp = FrontProxy::from_configmap(&cm(&ca, r#"["front-proxy-client"]"#)).unwrap();
        assert!(fp.check(Some(std::slice::from_ref(&front))).is_ok());
        let err = fp.check(Some(std::slice::from_ref(&other))).unwrap_err();
        assert!(err.contains("someone-else"), "{err}");
        assert!(fp.check(None).unwrap_err().contains("no client certificate"));
        let any = FrontProxy::from_configmap(&cm(&ca, "[]")).unwrap();
        assert!(any.check(Some(std::slice::from_ref(&other))).is_ok());
        assert!(fp.verifier().is_ok());
    }

    #[test]
    fn identity_comes_from_the_configured_headers() {
        let (ca, _) = ca_and_client("x");
        let fp = FrontProxy::from_configmap(&cm(&ca, "[]")).unwrap();
        let mut h = HeaderMap::new();
        h.insert("x-remote-user", "alice".parse().unwrap());
        h.append("x-remote-group", "devs".parse().unwrap());
        h.append("x-remote-group", "system:authenticated".parse().unwrap());
        let c = fp.caller(&h).unwrap();
        assert_eq!(c.user, "alice");
        assert_eq!(c.groups, ["devs", "system:authenticated"]);
        assert!(fp.caller(&HeaderMap::new()).is_none());
    }

    #[test]
    fn an_api_server_without_aggregation_is_named() {
        let err = FrontProxy::from_configmap(&ConfigMap::default()).unwrap_err();
        assert!(
            err.to_string().contains("--requestheader-client-ca-file"),
            "{err}"
        );
        let bad = FrontProxy::from_configmap(&cm("not pem", "[]")).unwrap_err();
        assert!(matches!(
            bad,
            FrontProxyError::NoRequestHeaderCa | FrontProxyError::Malformed { .. }
        ));
        let (ca, _) = ca_and_client("x");
        let bad_list = FrontProxy::from_configmap(&cm(&ca, "nope")).unwrap_err();
        assert!(
            bad_list.to_string().contains("requestheader-allowed-names"),
            "{bad_list}"
        );
    }
}
