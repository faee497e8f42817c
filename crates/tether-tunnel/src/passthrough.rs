//! Ensures a member credential passed through the leader is never readable on the way: the
//! caller seals it to the member's registered key, so neither the leader's API server (which
//! logs the headers it forwards at `--v=7`) nor the leader proxy can read it, and only that
//! member's agent opens it. What is sealed names the member and the leader user who sends it
//! and when, so a sealed value copied out of a log works for nobody else, nowhere else, and not
//! for long. A plain `Bearer` value is refused: it has already crossed the leader in clear.
//!
//! Wire format: `Tether-Member-Authorization: Sealed <base64 of a binary age message>`.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use http::{HeaderName, HeaderValue};
use serde::{Deserialize, Serialize};

/// The scheme of a sealed member credential.
pub const SCHEME: &str = "Sealed";
/// On a proxied answer: the member's registered key, to seal credentials to (public).
pub const RECIPIENT: HeaderName = HeaderName::from_static("tether-member-recipient");
/// How long a sealed credential is accepted after it was sealed (and how far clocks may differ).
pub const MAX_AGE_SECONDS: u64 = 300;
/// Largest header value accepted (a member token is a few KiB).
const MAX_VALUE: usize = 32 * 1024;

/// What is sealed. No `Debug`: it holds the token.
#[derive(Serialize, Deserialize)]
struct Sealed {
    /// `<namespace>/<name>` of the member on the leader.
    member: String,
    /// The leader user who sends it.
    user: String,
    /// Unix seconds when it was sealed.
    issued: u64,
    /// The member credential (a bearer token of the member cluster).
    token: String,
}

/// Why a passed-through credential was refused (401 at the agent).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// A plain `Bearer` value: it crossed the leader readable.
    #[error(
        "a member credential must be sealed to the member's key (Tether-Member-Authorization: Sealed \
         …); a plain Bearer token is readable in the leader API server's logs. `tether --cluster \
         <member> --member-token-file <file>` seals it; nothing was sent to the member"
    )]
    Plain,
    /// Not a sealed value this member's key opens.
    #[error("the member credential is not sealed to this member's key; nothing was sent to the member")]
    Unreadable,
    /// Sealed for another member.
    #[error("the member credential was sealed for another member; nothing was sent to the member")]
    OtherMember,
    /// Sealed by another leader user than the one sending it.
    #[error("the member credential was sealed by another leader user; nothing was sent to the member")]
    OtherUser,
    /// Sealed too long ago (or in the future).
    #[error("the member credential was sealed more than 5 minutes ago; seal it again")]
    Stale,
    /// What is inside is not a well-formed bearer token.
    #[error("the sealed member credential is not a bearer token; nothing was sent to the member")]
    NotBearer,
}

impl Refusal {
    /// A bounded label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Plain => "credential_plain",
            Self::Unreadable => "credential_unreadable",
            Self::OtherMember => "credential_other_member",
            Self::OtherUser => "credential_other_user",
            Self::Stale => "credential_stale",
            Self::NotBearer => "credential_not_bearer",
        }
    }
}

fn member(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// The header value that carries `token` for member `name` in `namespace`, sealed to its
/// `recipient` by leader user `user` at `now` (Unix seconds).
pub fn seal(
    recipient: &str,
    namespace: &str,
    name: &str,
    user: &str,
    token: &str,
    now: u64,
) -> Result<HeaderValue, tether_seal::SealError> {
    let plain = Sealed {
        member: member(namespace, name),
        user: user.to_string(),
        issued: now,
        token: token.to_string(),
    };
    let text = serde_json::to_string(&plain)?;
    let sealed = tether_seal::seal_binary(text.as_bytes(), recipient)?;
    // NB: base64 is always a valid header value.
    HeaderValue::from_str(&format!("{SCHEME} {}", B64.encode(sealed)))
        .map_err(|e| tether_seal::SealError::InvalidRecipient(e.to_string()))
}

/// The bearer token in `value`, when it was sealed to this member's `key` for member `name` in
/// `namespace` by `caller` (the leader-verified user) within `MAX_AGE_SECONDS` of `now`.
pub fn open(
    value: &HeaderValue,
    key: &str,
    namespace: &str,
    name: &str,
    caller: &str,
    now: u64,
) -> Result<String, Refusal> {
    let text = value.to_str().map_err(|_| Refusal::Unreadable)?;
    if text.len() > MAX_VALUE {
        return Err(Refusal::Unreadable);
    }
    let Some(sealed) = text.strip_prefix(SCHEME).and_then(|t| t.strip_prefix(' ')) else {
        return Err(if text.to_ascii_lowercase().starts_with("bearer") {
            Refusal::Plain
        } else {
            Refusal::Unreadable
        });
    };
    let bytes = B64.decode(sealed.trim()).map_err(|_| Refusal::Unreadable)?;
    let plain = tether_seal::unseal_binary(&bytes, key).map_err(|_| Refusal::Unreadable)?;
    let s: Sealed = serde_json::from_slice(&plain).map_err(|_| Refusal::Unreadable)?;
    if s.member != member(namespace, name) {
        return Err(Refusal::OtherMember);
    }
    if s.user != caller {
        return Err(Refusal::OtherUser);
    }
    if s.issued.abs_diff(now) > MAX_AGE_SECONDS {
        return Err(Refusal::Stale);
    }
    let header = HeaderValue::from_str(&format!("Bearer {}", s.token)).map_err(|_| Refusal::NotBearer)?;
    crate::identity::bearer(&header)
        .map(str::to_string)
        .ok_or(Refusal::NotBearer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_credential_opens_only_for_its_member_its_sender_and_in_time() {
        let (key, recipient) = tether_seal::generate_keypair();
        let v = seal(&recipient, "ns-east", "east", "alice", "eyJ.tok-en_", 1000).unwrap();
        assert!(
            !v.to_str().unwrap().contains("eyJ"),
            "nothing readable on the wire"
        );
        assert_eq!(
            open(&v, &key, "ns-east", "east", "alice", 1000).unwrap(),
            "eyJ.tok-en_"
        );
        assert_eq!(
            open(&v, &key, "ns-east", "east", "alice", 1299).unwrap(),
            "eyJ.tok-en_"
        );
        assert_eq!(
            open(&v, &key, "ns-west", "west", "alice", 1000),
            Err(Refusal::OtherMember)
        );
        assert_eq!(
            open(&v, &key, "ns-east", "east", "mallory", 1000),
            Err(Refusal::OtherUser)
        );
        assert_eq!(
            open(&v, &key, "ns-east", "east", "alice", 1301),
            Err(Refusal::Stale)
        );
        assert_eq!(
            open(&v, &key, "ns-east", "east", "alice", 699),
            Err(Refusal::Stale)
        );
        let (other, _) = tether_seal::generate_keypair();
        assert_eq!(
            open(&v, &other, "ns-east", "east", "alice", 1000),
            Err(Refusal::Unreadable)
        );
    }

    #[test]
    fn plain_or_malformed_values_are_refused() {
        let (key, recipient) = tether_seal::generate_keypair();
        let h = |s: &str| HeaderValue::from_str(s).unwrap();
        for (value, want) in [
            ("Bearer abc", Refusal::Plain),
            ("bearer abc", Refusal::Plain),
            ("", Refusal::Unreadable),
            ("Sealed", Refusal::Unreadable),
            ("Sealed !!!", Refusal::Unreadable),
            ("Sealed aGVsbG8=", Refusal::Unreadable),
            ("Basic YTpi", Refusal::Unreadable),
        ] {
            assert_eq!(open(&h(value), &key, "n", "m", "u", 1), Err(want), "{value:?}");
        }
        let not_bearer = seal(&recipient, "n", "m", "u", "two words", 1).unwrap();
        assert_eq!(open(&not_bearer, &key, "n", "m", "u", 1), Err(Refusal::NotBearer));
    }
}
