//! The credential a leader hands a newly approved member, sealed with `age` to the X25519 key in
//! the member's registration request: only the holder of the private key can read it, so a
//! registration request is safe to show to anyone who can read it.

use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// What the leader gives an approved member. Its `Debug` never prints the token.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemberCredential {
    /// ServiceAccount token for the member's identity on the leader.
    pub token: String,
    /// When the token expires (RFC 3339).
    pub expiration_timestamp: String,
    /// The member's dedicated namespace on the leader.
    pub namespace: String,
    /// The ServiceAccount the token belongs to (in `namespace`); the agent renews through it.
    pub service_account: String,
    /// PEM CA bundle of the leader's API server.
    pub ca_cert: String,
}

impl std::fmt::Debug for MemberCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemberCredential")
            .field("token", &REDACTED)
            .field("expiration_timestamp", &self.expiration_timestamp)
            .field("namespace", &self.namespace)
            .field("service_account", &self.service_account)
            .field("ca_cert", &self.ca_cert)
            .finish()
    }
}

/// What a `Debug` of a type holding a secret prints in its place.
pub const REDACTED: &str = "<redacted>";

/// Why sealing or unsealing failed.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    /// The recipient is not an `age1…` X25519 public key.
    #[error("not an age X25519 recipient: {0}")]
    InvalidRecipient(String),
    /// The private key is not an `AGE-SECRET-KEY-1…` X25519 identity.
    #[error("not an age X25519 identity: {0}")]
    InvalidIdentity(String),
    /// Encryption failed.
    #[error("sealing failed: {0}")]
    Encrypt(#[from] age::EncryptError),
    /// Decryption failed: wrong key or a tampered message.
    #[error("unsealing failed (wrong key or tampered credential): {0}")]
    Decrypt(#[from] age::DecryptError),
    /// The plaintext is not UTF-8 text.
    #[error("the sealed message is not text")]
    NotText,
    /// The plaintext is not a credential.
    #[error("sealed credential is malformed: {0}")]
    Payload(#[from] serde_json::Error),
}

/// Checks that `recipient` is a usable `age` X25519 public key.
pub fn parse_recipient(recipient: &str) -> Result<age::x25519::Recipient, SealError> {
    age::x25519::Recipient::from_str(recipient).map_err(|e| SealError::InvalidRecipient(e.to_string()))
}

/// Seals a credential to `recipient`, as ASCII-armored `age`.
pub fn seal(credential: &MemberCredential, recipient: &str) -> Result<String, SealError> {
    let recipient = parse_recipient(recipient)?;
    let plaintext = serde_json::to_vec(credential)?;
    Ok(age::encrypt_and_armor(&recipient, &plaintext)?)
}

/// Opens a sealed credential with the member's private key (`AGE-SECRET-KEY-1…`).
pub fn unseal(sealed: &str, identity: &str) -> Result<MemberCredential, SealError> {
    let identity =
        age::x25519::Identity::from_str(identity).map_err(|e| SealError::InvalidIdentity(e.to_string()))?;
    let plaintext = age::decrypt(&identity, sealed.as_bytes())?;
    Ok(serde_json::from_slice(&plaintext)?)
}

/// Seals any short text to `recipient`, as ASCII-armored `age` (the tunnel's attach challenge).
pub fn seal_text(text: &str, recipient: &str) -> Result<String, SealError> {
    let recipient = parse_recipient(recipient)?;
    Ok(age::encrypt_and_armor(&recipient, text.as_bytes())?)
}

/// Opens a text sealed with `seal_text`. NB: callers must check what the text says before they
/// use it, so that the key never serves as a decryption oracle for anything else.
pub fn unseal_text(sealed: &str, identity: &str) -> Result<String, SealError> {
    let identity =
        age::x25519::Identity::from_str(identity).map_err(|e| SealError::InvalidIdentity(e.to_string()))?;
    let plaintext = age::decrypt(&identity, sealed.as_bytes())?;
    String::from_utf8(plaintext).map_err(|_| SealError::NotText)
}

/// Seals `bytes` to `recipient` as a binary `age` message (for a header, base64-encoded).
pub fn seal_binary(bytes: &[u8], recipient: &str) -> Result<Vec<u8>, SealError> {
    let recipient = parse_recipient(recipient)?;
    Ok(age::encrypt(&recipient, bytes)?)
}

/// Opens a binary `age` message sealed with `seal_binary`.
pub fn unseal_binary(sealed: &[u8], identity: &str) -> Result<Vec<u8>, SealError> {
    let identity =
        age::x25519::Identity::from_str(identity).map_err(|e| SealError::InvalidIdentity(e.to_string()))?;
    Ok(age::decrypt(&identity, sealed)?)
}

/// A new key pair: (private identity, public recipient), both as `age` strings.
pub fn generate_keypair() -> (String, String) {
    use age::secrecy::ExposeSecret;
    let identity = age::x25519::Identity::generate();
    let public = identity.to_public().to_string();
    (identity.to_string().expose_secret().to_string(), public)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn debug_of_a_credential_never_prints_its_token() {
        let c = MemberCredential {
            token: "eyJhbGciOi.secret-token".into(),
            expiration_timestamp: "2026-12-04T00:00:00Z".into(),
            namespace: "tether-prod-east".into(),
            service_account: "tether-agent".into(),
            ca_cert: "ca".into(),
        };
        let text = format!("{c:?} {c:#?}");
        assert!(!text.contains("secret-token"), "{text}");
        assert!(
            text.contains(REDACTED) && text.contains("tether-prod-east"),
            "{text}"
        );
    }

    proptest! {
        #[test]
        fn any_public_key_text_is_checked_without_panicking(text in "\\PC*") {
            if let Err(e) = parse_recipient(&text) {
                prop_assert!(!e.to_string().is_empty());
            }
        }

        #[test]
        fn any_sealed_text_and_identity_are_refused_without_panicking(sealed in "\\PC*", identity in "\\PC{0,80}") {
            prop_assert!(unseal(&sealed, &identity).is_err());
        }
    }

    #[test]
    fn generated_keys_parse() {
        let (_, recipient) = generate_keypair();
        assert!(parse_recipient(&recipient).is_ok());
        let err = parse_recipient("age1nope").unwrap_err().to_string();
        assert!(err.contains("public key") || err.contains("recipient"), "{err}");
    }

    fn credential() -> MemberCredential {
        MemberCredential {
            token: "eyJhbGciOi.secret".into(),
            expiration_timestamp: "2026-11-29T12:00:00Z".into(),
            namespace: "tether-prod-east".into(),
            service_account: "tether-agent".into(),
            ca_cert: "-----BEGIN CERTIFICATE-----\n...".into(),
        }
    }

    #[test]
    fn sealed_credential_opens_with_the_matching_key_only() {
        let (identity, recipient) = generate_keypair();
        let (other_identity, _) = generate_keypair();
        let sealed = seal(&credential(), &recipient).unwrap();
        assert!(sealed.starts_with("-----BEGIN AGE ENCRYPTED FILE-----"));
        assert!(
            !sealed.contains("secret"),
            "the token must not appear in clear text"
        );
        assert_eq!(unseal(&sealed, &identity).unwrap(), credential());
        assert!(matches!(
            unseal(&sealed, &other_identity),
            Err(SealError::Decrypt(_))
        ));
    }

    #[test]
    fn tampered_credential_is_rejected() {
        let (identity, recipient) = generate_keypair();
        let sealed = seal(&credential(), &recipient).unwrap();
        let mut lines: Vec<String> = sealed.lines().map(str::to_string).collect();
        let mid = lines.len() / 2;
        lines[mid] = lines[mid].chars().rev().collect();
        assert!(unseal(&lines.join("\n"), &identity).is_err());
    }

    #[test]
    fn bad_keys_are_reported_as_such() {
        let cases = [
            ("", "empty"),
            ("age1notakey", "short"),
            ("ssh-ed25519 AAAAC3Nza", "ssh key"),
        ];
        for (key, what) in cases {
            assert!(
                matches!(seal(&credential(), key), Err(SealError::InvalidRecipient(_))),
                "{what}"
            );
        }
        assert!(matches!(
            unseal("x", "AGE-SECRET-KEY-1BAD"),
            Err(SealError::InvalidIdentity(_))
        ));
    }
}
