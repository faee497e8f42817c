//! The leader CA pin, kubeadm's format: `sha256:` + hex SHA-256 of the CA certificate's
//! SubjectPublicKeyInfo. Parsed once, compared in canonical (lowercase) form.

use sha2::{Digest, Sha256};

/// A CA pin.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CaPin([u8; 32]);

/// Why a pin or a certificate could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PinError {
    /// The text is not `sha256:<64 hex digits>`.
    #[error(
        "invalid CA pin {0:?}: expected sha256:<64 hex digits>, as printed by `tether init` \
         (or kubeadm's --discovery-token-ca-cert-hash)"
    )]
    Malformed(String),
    /// PEM data held no usable certificate.
    #[error("invalid CA certificate: {0}")]
    BadCertificate(String),
}

impl CaPin {
    /// The pin of a DER-encoded SubjectPublicKeyInfo.
    pub fn of_spki(spki_der: &[u8]) -> Self {
        Self(Sha256::digest(spki_der).into())
    }

    /// The pin of a DER-encoded certificate.
    pub fn of_certificate(der: &[u8]) -> Result<Self, PinError> {
        let (_, cert) =
            x509_parser::parse_x509_certificate(der).map_err(|e| PinError::BadCertificate(e.to_string()))?;
        Ok(Self::of_spki(cert.public_key().raw))
    }
}

impl std::str::FromStr for CaPin {
    type Err = PinError;

    fn from_str(text: &str) -> Result<Self, PinError> {
        let t = text.trim();
        let hex_part = t
            .get(..7)
            .filter(|p| p.eq_ignore_ascii_case("sha256:"))
            .and_then(|_| t.get(7..))
            .ok_or_else(|| PinError::Malformed(text.to_string()))?;
        let mut bytes = [0u8; 32];
        match hex::decode_to_slice(hex_part, &mut bytes) {
            Ok(()) => Ok(Self(bytes)),
            Err(_) => Err(PinError::Malformed(text.to_string())),
        }
    }
}

impl std::fmt::Display for CaPin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "sha256:{}", hex::encode(self.0))
    }
}

/// One CA certificate of a bundle: its subject, its pin and its DER.
#[derive(Clone, Debug)]
pub struct Ca {
    /// The certificate's subject, for messages.
    pub subject: String,
    /// Its pin.
    pub pin: CaPin,
    /// The certificate.
    pub der: Vec<u8>,
}

/// Every certificate of a PEM bundle.
pub fn certificates(pem_bundle: &str) -> Result<Vec<Ca>, PinError> {
    let blocks = pem::parse_many(pem_bundle).map_err(|e| PinError::BadCertificate(e.to_string()))?;
    let cas = blocks
        .into_iter()
        .filter(|p| p.tag() == "CERTIFICATE")
        .map(|p| {
            let der = p.into_contents();
            let (_, cert) = x509_parser::parse_x509_certificate(&der)
                .map_err(|e| PinError::BadCertificate(e.to_string()))?;
            Ok(Ca {
                subject: cert.subject().to_string(),
                pin: CaPin::of_spki(cert.public_key().raw),
                der: der.clone(),
            })
        })
        .collect::<Result<Vec<_>, PinError>>()?;
    if cas.is_empty() {
        return Err(PinError::BadCertificate("no CERTIFICATE in the PEM data".into()));
    }
    Ok(cas)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A self-signed CA: (PEM, its issuer, its certificate, its pin).
    pub fn ca(
        cn: &str,
    ) -> (
        String,
        rcgen::Issuer<'static, rcgen::KeyPair>,
        rcgen::Certificate,
        CaPin,
    ) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(rcgen::DnType::CommonName, cn);
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let cert = params.self_signed(&key).unwrap();
        let pin = CaPin::of_spki(&rcgen::PublicKeyData::subject_public_key_info(&key));
        (cert.pem(), rcgen::Issuer::new(params, key), cert, pin)
    }

    #[test]
    fn the_pin_is_the_sha256_of_the_subject_public_key_info_and_prints_canonically() {
        let (pem, _, _, pin) = ca("leader-ca");
        let got = certificates(&pem).unwrap();
        assert_eq!(got[0].pin, pin);
        assert!(got[0].subject.contains("leader-ca"));
        let upper = pin.to_string().to_uppercase();
        assert_eq!(upper.parse::<CaPin>().unwrap(), pin);
        assert_eq!(upper.parse::<CaPin>().unwrap().to_string(), pin.to_string());
        assert!(pin.to_string().starts_with("sha256:") && pin.to_string().len() == 71);
    }

    #[test]
    fn malformed_pins_say_what_is_expected() {
        for bad in [
            "",
            "sha256:",
            "sha1:abcd",
            "sha256:xyz",
            &format!("sha256:{}", "a".repeat(63)),
        ] {
            let err = bad.parse::<CaPin>().unwrap_err().to_string();
            assert!(err.contains("64 hex digits"), "{bad}: {err}");
        }
        assert!(certificates("not a pem").is_err());
    }

    proptest! {
        #[test]
        fn parsing_any_text_never_panics_and_round_trips_what_it_accepts(text in "\\PC*") {
            if let Ok(pin) = text.parse::<CaPin>() {
                prop_assert_eq!(pin.to_string().parse::<CaPin>().unwrap(), pin);
            }
        }

        #[test]
        fn every_well_formed_pin_parses(bytes in proptest::array::uniform32(any::<u8>())) {
            let text = format!("sha256:{}", hex::encode(bytes));
            prop_assert_eq!(text.parse::<CaPin>().unwrap().to_string(), text);
        }
    }
}
