//! Ensures a tunnel is attached, and an expired member credential replaced (`rejoin`), only by
//! the holder of the member's registered key, whatever token (or none) reached the leader: the leader seals a fresh challenge to the key it recorded at
//! approval, and only the agent that holds the private half can read it back. This module is
//! the contract both ends compile against: the header, the challenge's JSON and the exact
//! plaintext, which names the member so that the agent never unseals anything else for the
//! leader (its key is no decryption oracle).

use http::HeaderName;
use serde::{Deserialize, Serialize};

/// On an attach or rejoin request: the proof, the token read out of the sealed challenge.
pub const ATTACH_PROOF: HeaderName = HeaderName::from_static("tether-attach-proof");
/// What every challenge plaintext starts with.
const CONTEXT: &str = "tether-attach-challenge.v1";
/// The `reason` of the leader's 403 Status when a proof itself is refused (expired, used
/// already, issued by another replica, malformed) rather than the member: the agent asks for a
/// new challenge and tries again instead of concluding it was removed.
pub const PROOF_REFUSED: &str = "Expired";
/// Longest proof token accepted (the leader's are about 100 characters).
pub const MAX_PROOF: usize = 256;

/// The leader's answer to a plain GET of `attach`: a challenge sealed to the member's key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Challenge {
    /// ASCII-armored `age` message holding `plaintext(namespace, name, token)`.
    pub sealed: String,
}

/// The leader's answer to a proven GET of `attach` without an upgrade: the live tunnel's new
/// deadline (the agent re-proves after renewing its credential).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Renewed {
    /// Seconds until the leader closes the tunnel unless it is proven again.
    pub seconds: u64,
}

/// The leader's answer to a proven GET of `rejoin`: a new member credential (the JSON of a
/// `tether_seal::MemberCredential`) sealed to the member's registered key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rejoined {
    /// ASCII-armored `age` message holding the credential.
    pub sealed: String,
}

/// The plaintext sealed for member `name` in `namespace` carrying proof `token`.
pub fn plaintext(namespace: &str, name: &str, token: &str) -> String {
    format!("{CONTEXT} {namespace}/{name} {token}")
}

/// The proof token in `text`, only when it is a challenge for member `name` in `namespace`.
pub fn token_in<'a>(text: &'a str, namespace: &str, name: &str) -> Option<&'a str> {
    let rest = text.strip_prefix(CONTEXT)?.strip_prefix(' ')?;
    let (member, token) = rest.split_once(' ')?;
    let well_formed = !token.is_empty()
        && token.len() <= MAX_PROOF
        && token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-');
    (member == format!("{namespace}/{name}") && well_formed).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_challenge_is_read_back_only_for_its_own_member() {
        let text = plaintext("tether-prod-east", "east", "1733270000.abc-def.0123");
        assert_eq!(
            token_in(&text, "tether-prod-east", "east"),
            Some("1733270000.abc-def.0123")
        );
        assert_eq!(token_in(&text, "tether-prod-west", "west"), None);
        assert_eq!(token_in(&text, "tether-prod-east", "eas"), None);
        for other in [
            "",
            "tether-attach-challenge.v1",
            "tether-attach-challenge.v1 tether-prod-east/east",
            "tether-attach-challenge.v1 tether-prod-east/east ",
            "tether-attach-challenge.v2 tether-prod-east/east tok",
            "tether-attach-challenge.v1 tether-prod-east/east tok en",
            "tether-attach-challenge.v1 tether-prod-east/east tok\r\nx",
            "{\"token\":\"eyJ...\"}",
        ] {
            assert_eq!(token_in(other, "tether-prod-east", "east"), None, "{other:?}");
        }
        let long = plaintext("n", "m", &"a".repeat(MAX_PROOF + 1));
        assert_eq!(token_in(&long, "n", "m"), None);
    }
}
