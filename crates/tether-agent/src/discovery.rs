//! Trusting the leader before any secret is sent: the leader's CA comes from its public discovery
//! ConfigMap (`kube-public/cluster-info`, read anonymously, as `kubeadm join` does) and must match
//! the pin — `sha256:` + hex SHA-256 of the CA's SubjectPublicKeyInfo — or from a CA bundle given
//! directly. Every later connection verifies the leader's serving chain against that CA only.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::config::{AuthInfo, Kubeconfig};
use kube::{Api, Client, Config};
use sha2::{Digest, Sha256};

/// Where the leader publishes its CA for joiners.
pub const DISCOVERY_NAMESPACE: &str = "kube-public";
/// The discovery ConfigMap (kubeadm's name), with a `kubeconfig` key.
pub const DISCOVERY_CONFIGMAP: &str = "cluster-info";

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
        "cannot read {DISCOVERY_NAMESPACE}/{DISCOVERY_CONFIGMAP} from the leader at {url}: {source}; \
         check the URL and that the leader is reachable from here, or give the CA with --ca-bundle \
         (caBundle) where anonymous access is off"
    )]
    Unreachable {
        /// The leader URL.
        url: String,
        /// The cause.
        source: kube::Error,
    },
    /// The discovery data is not a kubeconfig with a CA.
    #[error("the leader's {DISCOVERY_CONFIGMAP} has no usable CA: {0}")]
    NoCa(String),
    /// No CA in the bundle matches the pin.
    #[error(
        "the leader's CA does not match the pin: expected {expected}, the leader presented {seen}. \
         Nothing was sent. If you trust this leader, take the hash printed by `tether init`, or \
         compute it on the leader: openssl x509 -pubkey -noout -in ca.crt | openssl pkey -pubin \
         -outform der | sha256sum"
    )]
    PinMismatch {
        /// The pin we were given.
        expected: String,
        /// What the leader offered: `subject (hash)` per CA.
        seen: String,
    },
    /// A PEM bundle could not be parsed.
    #[error("invalid CA certificate: {0}")]
    BadCertificate(String),
}

/// One CA certificate: its subject and its pin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaPin {
    /// The certificate's subject, for messages.
    pub subject: String,
    /// `sha256:<hex>` of its SubjectPublicKeyInfo.
    pub pin: String,
}

/// The subject and pin of every certificate in a PEM bundle.
pub fn pins(pem_bundle: &str) -> Result<Vec<CaPin>, DiscoveryError> {
    let blocks = pem::parse_many(pem_bundle).map_err(|e| DiscoveryError::BadCertificate(e.to_string()))?;
    let certs: Vec<_> = blocks.iter().filter(|p| p.tag() == "CERTIFICATE").collect();
    if certs.is_empty() {
        return Err(DiscoveryError::BadCertificate(
            "no CERTIFICATE in the PEM data".into(),
        ));
    }
    certs
        .into_iter()
        .map(|p| {
            let (_, cert) = x509_parser::parse_x509_certificate(p.contents())
                .map_err(|e| DiscoveryError::BadCertificate(e.to_string()))?;
            Ok(CaPin {
                subject: cert.subject().to_string(),
                pin: format!("sha256:{}", hex::encode(Sha256::digest(cert.public_key().raw))),
            })
        })
        .collect()
}

/// Checks that a certificate of `pem_bundle` has `pin`; the error says what was seen instead.
pub fn check_pin(pem_bundle: &str, pin: &str) -> Result<(), DiscoveryError> {
    let seen = pins(pem_bundle)?;
    if seen.iter().any(|c| c.pin.eq_ignore_ascii_case(pin)) {
        return Ok(());
    }
    Err(DiscoveryError::PinMismatch {
        expected: pin.to_string(),
        seen: seen
            .iter()
            .map(|c| format!("{} ({})", c.subject, c.pin))
            .collect::<Vec<_>>()
            .join(", "),
    })
}

/// How the agent trusts its leader.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Trust {
    /// A PEM CA bundle, verified (by pin or given directly).
    Ca(String),
    /// No verification at all (`insecureSkipCAVerification`): the token may go to an impostor.
    Insecure,
}

/// Client configuration for the leader at `url` with `trust`, authenticating with `token` if any.
pub fn leader_config(url: &str, trust: &Trust, token: Option<&str>) -> Result<Config, DiscoveryError> {
    let uri = url
        .parse()
        .map_err(|e: http::uri::InvalidUri| DiscoveryError::BadUrl {
            url: url.to_string(),
            reason: e.to_string(),
        })?;
    let mut config = Config::new(uri);
    match trust {
        Trust::Ca(pem_bundle) => {
            let ders = pem::parse_many(pem_bundle)
                .map_err(|e| DiscoveryError::BadCertificate(e.to_string()))?
                .into_iter()
                .filter(|p| p.tag() == "CERTIFICATE")
                .map(|p| p.into_contents())
                .collect();
            config.root_cert = Some(ders);
        }
        Trust::Insecure => config.accept_invalid_certs = true,
    }
    config.auth_info = AuthInfo {
        token: token.map(|t| t.to_string().into()),
        ..AuthInfo::default()
    };
    config.connect_timeout = Some(std::time::Duration::from_secs(10));
    config.read_timeout = Some(std::time::Duration::from_secs(30));
    Ok(config)
}

/// Reads the leader's CA from its discovery ConfigMap without credentials and without verifying
/// TLS (nothing secret is sent); the caller must check it against a pin before trusting it.
pub async fn fetch_leader_ca(url: &str) -> Result<String, DiscoveryError> {
    let config = leader_config(url, &Trust::Insecure, None)?;
    let client = Client::try_from(config).map_err(|source| DiscoveryError::Unreachable {
        url: url.to_string(),
        source,
    })?;
    let cm = Api::<ConfigMap>::namespaced(client, DISCOVERY_NAMESPACE)
        .get(DISCOVERY_CONFIGMAP)
        .await
        .map_err(|source| DiscoveryError::Unreachable {
            url: url.to_string(),
            source,
        })?;
    let text = cm
        .data
        .and_then(|d| d.get("kubeconfig").cloned())
        .ok_or_else(|| DiscoveryError::NoCa("no `kubeconfig` key".into()))?;
    ca_from_kubeconfig(&text)
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

/// Resolves how to trust the leader from a member spec: the CA bundle, else the discovery CA
/// checked against the pin, else (explicitly) nothing.
pub async fn trust_for(spec: &tether_api::clusterset::MemberSpec) -> Result<Trust, DiscoveryError> {
    if let Some(bundle) = &spec.ca_bundle {
        if let Some(pin) = &spec.ca_cert_hash {
            check_pin(bundle, pin)?;
        }
        pins(bundle)?;
        return Ok(Trust::Ca(bundle.clone()));
    }
    if let Some(pin) = &spec.ca_cert_hash {
        let ca = fetch_leader_ca(&spec.leader_url).await?;
        check_pin(&ca, pin)?;
        return Ok(Trust::Ca(ca));
    }
    Ok(Trust::Insecure)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ca(cn: &str) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(rcgen::DnType::CommonName, cn);
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let cert = params.self_signed(&key).unwrap();
        let pin = format!(
            "sha256:{}",
            hex::encode(Sha256::digest(rcgen::PublicKeyData::subject_public_key_info(
                &key
            )))
        );
        (cert.pem(), pin)
    }

    #[test]
    fn the_pin_is_the_sha256_of_the_subject_public_key_info() {
        let (pem, pin) = ca("leader-ca");
        let got = pins(&pem).unwrap();
        assert_eq!(got[0].pin, pin);
        assert!(got[0].subject.contains("leader-ca"));
        check_pin(&pem, &pin).unwrap();
        check_pin(&pem, &pin.to_uppercase().replace("SHA256", "sha256")).unwrap();
    }

    #[test]
    fn a_wrong_pin_names_what_was_seen_and_how_to_get_the_right_one() {
        let (pem, pin) = ca("leader-ca");
        let (_, other) = ca("impostor");
        let err = check_pin(&pem, &other).unwrap_err().to_string();
        assert!(err.contains(&pin) && err.contains("leader-ca"), "{err}");
        assert!(
            err.contains("Nothing was sent") && err.contains("tether init"),
            "{err}"
        );
    }

    #[test]
    fn a_bundle_with_several_cas_matches_any_of_them() {
        let (a, _) = ca("old");
        let (b, pin_b) = ca("new");
        check_pin(&format!("{a}{b}"), &pin_b).unwrap();
    }

    #[test]
    fn garbage_is_a_clear_error() {
        assert!(matches!(
            pins("not a pem"),
            Err(DiscoveryError::BadCertificate(_))
        ));
        assert!(ca_from_kubeconfig("clusters: []").is_err());
        let (pem, _) = ca("leader-ca");
        let kc = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: x\n  cluster:\n    server: https://l:6443\n    \
             certificate-authority-data: {}\n",
            B64.encode(&pem)
        );
        assert_eq!(ca_from_kubeconfig(&kc).unwrap(), pem);
        assert!(leader_config("not a url with spaces", &Trust::Insecure, None).is_err());
    }
}
