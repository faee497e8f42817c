//! Certificates and keys for a test cluster: one CA, the API server's serving certificate, an
//! admin client certificate (system:masters) and the ServiceAccount token signing key.

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
    KeyPair, KeyUsagePurpose, PublicKeyData, SanType,
};
use sha2::{Digest, Sha256};

use crate::Error;

/// PEM material of one cluster.
pub struct Pki {
    /// Signs further client certificates (nodes, the API server's kubelet client).
    issuer: Issuer<'static, KeyPair>,
    /// CA certificate (PEM).
    pub ca_cert: String,
    /// kubeadm-style pin of the CA: `sha256:` + hex SHA-256 of its SubjectPublicKeyInfo.
    pub ca_cert_hash: String,
    /// API server serving certificate (PEM), valid for 127.0.0.1 and localhost.
    pub serving_cert: String,
    /// API server serving key (PEM).
    pub serving_key: String,
    /// Admin client certificate (PEM), CN=tether-admin, O=system:masters.
    pub admin_cert: String,
    /// Admin client key (PEM).
    pub admin_key: String,
    /// ServiceAccount token signing key (PEM, PKCS#8 ECDSA P-256).
    pub service_account_key: String,
    /// Its public key (PEM), which the API server verifies tokens with.
    pub service_account_pub: String,
}

impl Pki {
    /// Generates a fresh CA and everything signed by it.
    pub fn generate(cluster: &str) -> Result<Self, Error> {
        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.distinguished_name = name(&format!("tether-test-ca-{cluster}"), None);
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let ca_cert_hash = spki_pin(&ca_key.subject_public_key_info());
        let issuer = Issuer::new(ca_params, ca_key);

        let serving_key = KeyPair::generate()?;
        // Reachable as localhost, from the lab bridge (node tier) and, in pods, as the
        // `kubernetes` Service (10.0.0.1 and its DNS names).
        let mut serving = CertificateParams::new(
            [
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ]
            .map(String::from)
            .to_vec(),
        )?;
        for ip in [[127, 0, 0, 1], crate::lab::GATEWAY.octets(), [10, 0, 0, 1]] {
            serving.subject_alt_names.push(SanType::IpAddress(ip.into()));
        }
        serving.distinguished_name = name("kube-apiserver", None);
        serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let serving_cert = serving.signed_by(&serving_key, &issuer)?;

        let admin_key = KeyPair::generate()?;
        let mut admin = CertificateParams::new(Vec::<String>::new())?;
        admin.distinguished_name = name("tether-admin", Some("system:masters"));
        admin.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let admin_cert = admin.signed_by(&admin_key, &issuer)?;

        let sa_key = KeyPair::generate()?;
        Ok(Self {
            issuer,
            ca_cert: ca_cert.pem(),
            ca_cert_hash,
            serving_cert: serving_cert.pem(),
            serving_key: serving_key.serialize_pem(),
            admin_cert: admin_cert.pem(),
            admin_key: admin_key.serialize_pem(),
            service_account_key: sa_key.serialize_pem(),
            service_account_pub: sa_key.public_key_pem(),
        })
    }
}

impl Pki {
    /// A client certificate and key (PEM) for `common_name` in `organization`, signed by the CA.
    pub fn client_cert(
        &self,
        common_name: &str,
        organization: Option<&str>,
    ) -> Result<(String, String), Error> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name = name(common_name, organization);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok((cert.pem(), key.serialize_pem()))
    }
}

/// `sha256:<hex>` of a DER SubjectPublicKeyInfo, the format of kubeadm's `--discovery-token-ca-cert-hash`.
pub fn spki_pin(spki_der: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(spki_der)))
}

fn name(common_name: &str, organization: Option<&str>) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    if let Some(org) = organization {
        dn.push(DnType::OrganizationName, org);
    }
    dn
}
