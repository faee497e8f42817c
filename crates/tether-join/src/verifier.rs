//! Trusting the leader by its CA pin inside TLS, with no unverified connection: a rustls verifier
//! that accepts the leader's chain only when it is signed by the CA whose SubjectPublicKeyInfo
//! hashes to the pin.
//!
//! NB: API servers usually send only their own certificate, not their CA, so the pinned CA is
//! often not in the handshake. Then the handshake proves that the server holds the key of the
//! certificate it showed, and that certificate is recorded; the one request made on such a
//! connection is the anonymous read of the public discovery ConfigMap, and its CA is used only
//! after `confirm` has checked that the recorded certificate chains to the pinned CA. Either way
//! nothing is trusted, and no credential is sent, before the chain is proven to end at the pin.

use std::sync::{Arc, Mutex};

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};

use crate::pin::CaPin;

/// How the leader's chain was proven to end at the pinned CA.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proof {
    /// The leader sent the pinned CA in its chain; the chain was verified in the handshake.
    InHandshake,
    /// The leader's certificate, held by the server in the handshake, was verified against the
    /// pinned CA read from discovery, before that CA was used.
    AgainstDiscoveredCa,
}

/// What the handshake showed.
#[derive(Debug, Clone)]
struct Presented {
    end_entity: CertificateDer<'static>,
    intermediates: Vec<CertificateDer<'static>>,
    server_name: ServerName<'static>,
    proof: Option<Proof>,
}

/// Why the leader's chain does not end at the pin.
#[derive(Debug, thiserror::Error)]
#[error("the leader's serving certificate does not chain to the pinned CA {pin}: {reason}")]
pub struct ChainError {
    /// The pin.
    pub pin: CaPin,
    /// What failed.
    pub reason: String,
}

/// The pin verifier for one leader; see the module docs.
#[derive(Debug)]
pub struct PinVerifier {
    pin: CaPin,
    provider: Arc<CryptoProvider>,
    presented: Mutex<Option<Presented>>,
}

impl PinVerifier {
    /// A verifier for `pin`.
    pub fn new(pin: CaPin) -> Arc<Self> {
        Arc::new(Self {
            pin,
            provider: Arc::new(rustls::crypto::ring::default_provider()),
            presented: Mutex::new(None),
        })
    }

    /// The crypto provider the verifier checks signatures with.
    pub fn provider(&self) -> Arc<CryptoProvider> {
        self.provider.clone()
    }

    fn verify_with_root(&self, root_der: &[u8], p: &Presented, now: UnixTime) -> Result<(), rustls::Error> {
        let mut roots = RootCertStore::empty();
        roots.add(CertificateDer::from(root_der.to_vec()))?;
        let verifier = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), self.provider.clone())
            .build()
            .map_err(|e| rustls::Error::General(e.to_string()))?;
        verifier
            .verify_server_cert(&p.end_entity, &p.intermediates, &p.server_name, &[], now)
            .map(drop)
    }

    /// Proves the recorded chain ends at `ca_der`, a CA certificate whose pin is this verifier's.
    pub fn confirm(&self, ca_der: &[u8]) -> Result<Proof, ChainError> {
        let fail = |reason: String| ChainError {
            pin: self.pin.clone(),
            reason,
        };
        if CaPin::of_certificate(ca_der).map_err(|e| fail(e.to_string()))? != self.pin {
            return Err(fail("the CA offered is not the pinned one".into()));
        }
        let mut slot = self.presented.lock().unwrap_or_else(|p| p.into_inner());
        let presented = slot
            .as_mut()
            .ok_or_else(|| fail("no TLS handshake with the leader took place".into()))?;
        if let Some(proof) = presented.proof {
            return Ok(proof);
        }
        self.verify_with_root(ca_der, presented, UnixTime::now())
            .map_err(|e| fail(e.to_string()))?;
        presented.proof = Some(Proof::AgainstDiscoveredCa);
        Ok(Proof::AgainstDiscoveredCa)
    }
}

impl ServerCertVerifier for PinVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let mut presented = Presented {
            end_entity: end_entity.clone().into_owned(),
            intermediates: intermediates.iter().map(|c| c.clone().into_owned()).collect(),
            server_name: server_name.to_owned(),
            proof: None,
        };
        let pinned = std::iter::once(end_entity)
            .chain(intermediates)
            .find(|c| CaPin::of_certificate(c).is_ok_and(|p| p == self.pin));
        if let Some(ca) = pinned {
            // The pinned CA is in the chain: verify against it now, or fail the handshake.
            self.verify_with_root(ca, &presented, now)?;
            presented.proof = Some(Proof::InHandshake);
        }
        *self.presented.lock().unwrap_or_else(|p| p.into_inner()) = Some(presented);
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pin::tests::ca;

    /// A serving certificate for `host` signed by the CA.
    fn serving(issuer: &rcgen::Issuer<'static, rcgen::KeyPair>, host: &str) -> CertificateDer<'static> {
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec![host.to_string()]).unwrap();
        params.signed_by(&key, issuer).unwrap().der().clone()
    }

    fn name() -> ServerName<'static> {
        ServerName::try_from("leader.example").unwrap()
    }

    #[test]
    fn a_chain_that_carries_the_pinned_ca_is_verified_in_the_handshake() {
        let (_, key, cert, pin) = ca("leader-ca");
        let leaf = serving(&key, "leader.example");
        let v = PinVerifier::new(pin);
        v.verify_server_cert(&leaf, &[cert.der().clone()], &name(), &[], UnixTime::now())
            .unwrap();
        assert_eq!(v.confirm(cert.der()).unwrap(), Proof::InHandshake);
    }

    #[test]
    fn a_chain_signed_by_another_ca_that_carries_the_pinned_one_fails_the_handshake() {
        let (_, key, _, _) = ca("impostor");
        let (_, _, pinned, pin) = ca("leader-ca");
        let leaf = serving(&key, "leader.example");
        let v = PinVerifier::new(pin);
        assert!(
            v.verify_server_cert(&leaf, &[pinned.der().clone()], &name(), &[], UnixTime::now())
                .is_err()
        );
    }

    #[test]
    fn a_leaf_alone_is_confirmed_only_against_the_pinned_ca_that_signed_it() {
        let (_, key, cert, pin) = ca("leader-ca");
        let leaf = serving(&key, "leader.example");
        let v = PinVerifier::new(pin.clone());
        v.verify_server_cert(&leaf, &[], &name(), &[], UnixTime::now())
            .unwrap();
        assert_eq!(v.confirm(cert.der()).unwrap(), Proof::AgainstDiscoveredCa);

        // An impostor serving its own CA in discovery: that CA is not the pinned one.
        let (_, ikey, icert, _) = ca("impostor");
        let ileaf = serving(&ikey, "leader.example");
        let v = PinVerifier::new(pin.clone());
        v.verify_server_cert(&ileaf, &[], &name(), &[], UnixTime::now())
            .unwrap();
        assert!(v.confirm(icert.der()).is_err());
        // ...nor can it pass off the real CA (published anywhere) as its own.
        let err = v.confirm(cert.der()).unwrap_err().to_string();
        assert!(err.contains(&pin.to_string()), "{err}");

        // The right CA, but a certificate for another host.
        let other = serving(&key, "elsewhere.example");
        let v = PinVerifier::new(pin);
        v.verify_server_cert(&other, &[], &name(), &[], UnixTime::now())
            .unwrap();
        assert!(v.confirm(cert.der()).is_err());
    }
}
