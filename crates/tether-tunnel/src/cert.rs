//! Serving certificates made on the spot: a CA of its own and a leaf for one name, for
//! endpoints whose clients are handed the CA directly (the leader's proxy API through the
//! APIService's caBundle, the CLI's local pass-through endpoint through its kubeconfig).

/// A serving certificate, its key and the CA that signed it (PEM). Its `Debug` never prints
/// the key.
#[derive(Clone, PartialEq, Eq)]
pub struct Serving {
    /// The leaf certificate.
    pub cert: String,
    /// Its private key.
    pub key: String,
    /// The CA that clients trust.
    pub ca: String,
}

/// A CA kept to sign the next serving certificate: a leaf renewed from the same CA needs no
/// change on the clients that trust the CA. Its `Debug` never prints the key.
#[derive(Clone, PartialEq, Eq)]
pub struct Authority {
    /// The CA certificate (PEM).
    pub cert: String,
    /// Its private key (PEM).
    pub key: String,
}

/// What a `Debug` of a private key prints in its place.
pub const REDACTED: &str = "<redacted>";

impl std::fmt::Debug for Serving {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Serving")
            .field("cert", &self.cert)
            .field("key", &REDACTED)
            .field("ca", &self.ca)
            .finish()
    }
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authority")
            .field("cert", &self.cert)
            .field("key", &REDACTED)
            .finish()
    }
}

impl Authority {
    /// A new CA named `<ca_name>@<unix time>`, valid for `valid`.
    pub fn generate(ca_name: &str, valid: time::Duration) -> Result<Self, rcgen::Error> {
        let now = time::OffsetDateTime::now_utc();
        let key = rcgen::KeyPair::generate()?;
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new())?;
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
        ca.distinguished_name.push(
            rcgen::DnType::CommonName,
            format!("{ca_name}@{}", now.unix_timestamp()),
        );
        ca.not_before = now;
        ca.not_after = now + valid;
        let cert = ca.self_signed(&key)?;
        Ok(Self {
            cert: cert.pem(),
            key: key.serialize_pem(),
        })
    }

    /// A serving certificate for `name` (a DNS name or an IP address) signed by this CA, valid
    /// for `valid` from now.
    pub fn issue(&self, name: &str, valid: time::Duration) -> Result<Serving, rcgen::Error> {
        let now = time::OffsetDateTime::now_utc();
        let issuer = rcgen::Issuer::from_ca_cert_pem(&self.cert, rcgen::KeyPair::from_pem(&self.key)?)?;
        let key = rcgen::KeyPair::generate()?;
        let mut leaf = rcgen::CertificateParams::new(vec![name.to_string()])?;
        leaf.distinguished_name.push(rcgen::DnType::CommonName, name);
        leaf.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        leaf.not_before = now;
        leaf.not_after = now + valid;
        let cert = leaf.signed_by(&key, &issuer)?;
        Ok(Serving {
            cert: cert.pem(),
            key: key.serialize_pem(),
            ca: self.cert.clone(),
        })
    }
}

/// Generates a CA (`<ca_name>@<unix time>`) and a serving certificate for `name` (a DNS name or
/// an IP address), both valid for `valid`; the CA's key is dropped.
pub fn generate(ca_name: &str, name: &str, valid: time::Duration) -> Result<Serving, rcgen::Error> {
    Authority::generate(ca_name, valid)?.issue(name, valid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_of_a_certificate_or_its_ca_never_prints_a_private_key() {
        let ca = Authority::generate("test-ca", time::Duration::days(1)).unwrap();
        let leaf = ca.issue("example.svc", time::Duration::days(1)).unwrap();
        for text in [
            format!("{ca:?}"),
            format!("{ca:#?}"),
            format!("{leaf:?}"),
            format!("{leaf:#?}"),
        ] {
            assert!(!text.contains("PRIVATE KEY"), "{text}");
            assert!(text.contains(REDACTED) && text.contains("CERTIFICATE"), "{text}");
        }
    }
}
