//! Ensures only the holder of a member's registered key can attach or keep its tunnel, however
//! its token was obtained: each challenge is a proof token bound to one member, minted from an
//! HMAC key that lives only in this replica's memory (so nothing is stored per challenge and a
//! caller cannot make the leader hold any), sealed to the key recorded at approval, valid for a
//! minute and redeemable once.

use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::Sha256;

use super::tunnels::MemberKey;

/// What a proof is good for: one purpose's proof is refused for the other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// Attaching (or keeping) the member's tunnel.
    Attach,
    /// A new credential for a member whose credential expired.
    Rejoin,
}

impl Purpose {
    fn as_str(self) -> &'static str {
        match self {
            Self::Attach => "attach",
            Self::Rejoin => "rejoin",
        }
    }
}

/// How long a proof token may be redeemed after it was minted.
pub const VALID: Duration = Duration::from_secs(60);

/// Why a proof was not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// Not of the form this replica mints.
    #[error("the attach proof is malformed")]
    Malformed,
    /// Not minted by this replica for this member.
    #[error("the attach proof was not issued for this member by this leader replica")]
    Forged,
    /// Minted too long ago (or in the future).
    #[error("the attach proof expired; ask for a new challenge")]
    Expired,
    /// Already redeemed.
    #[error("the attach proof was used already; ask for a new challenge")]
    Reused,
}

impl Refused {
    /// A bounded label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Malformed => "proof_malformed",
            Self::Forged => "proof_forged",
            Self::Expired => "proof_expired",
            Self::Reused => "proof_reused",
        }
    }
}

/// Redeemed MACs, and the same in the order they stop being redeemable (with that second).
/// Bounded by how many proofs can be minted and redeemed within `VALID`, which only members'
/// agents can do.
#[derive(Default)]
struct Used {
    seen: HashSet<[u8; 32]>,
    order: VecDeque<(u64, [u8; 32])>,
}

/// Mints and redeems proof tokens.
pub struct Challenges {
    key: [u8; 32],
    used: Mutex<Used>,
}

impl Default for Challenges {
    fn default() -> Self {
        let mut key = [0u8; 32];
        rand::rng().fill_bytes(&mut key);
        Self {
            key,
            used: Mutex::default(),
        }
    }
}

impl Challenges {
    fn mac(&self, m: &MemberKey, purpose: Purpose, issued: u64, nonce: &str) -> [u8; 32] {
        // NB: new_from_slice accepts any key length for HMAC.
        let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(&self.key) else {
            return [0; 32];
        };
        mac.update(format!("{}:{}/{}.{issued}.{nonce}", purpose.as_str(), m.namespace, m.name).as_bytes());
        mac.finalize().into_bytes().into()
    }

    /// A fresh proof token for member `m` and `purpose`, minted at `now` (Unix seconds).
    pub fn issue(&self, m: &MemberKey, purpose: Purpose, now: u64) -> String {
        let mut nonce = [0u8; 16];
        rand::rng().fill_bytes(&mut nonce);
        let nonce = hex::encode(nonce);
        let mac = hex::encode(self.mac(m, purpose, now, &nonce));
        format!("{now}.{nonce}.{mac}")
    }

    /// Accepts `token` for member `m` and `purpose` at `now` once: minted here, for both,
    /// within `VALID`.
    pub fn redeem(&self, m: &MemberKey, purpose: Purpose, token: &str, now: u64) -> Result<(), Refused> {
        let mut parts = token.split('.');
        let (Some(issued), Some(nonce), Some(mac), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(Refused::Malformed);
        };
        let issued: u64 = issued.parse().map_err(|_| Refused::Malformed)?;
        let mut given = [0u8; 32];
        hex::decode_to_slice(mac, &mut given).map_err(|_| Refused::Malformed)?;
        if nonce.len() != 32 || !nonce.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(Refused::Malformed);
        }
        let expected = self.mac(m, purpose, issued, nonce);
        // NB: compared in constant time, as a MAC must be.
        let differs = expected
            .iter()
            .zip(given.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        if differs != 0 {
            return Err(Refused::Forged);
        }
        if issued > now || now - issued > VALID.as_secs() {
            return Err(Refused::Expired);
        }
        let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        while used.order.front().is_some_and(|(until, _)| *until < now) {
            if let Some((_, old)) = used.order.pop_front() {
                used.seen.remove(&old);
            }
        }
        if !used.seen.insert(expected) {
            return Err(Refused::Reused);
        }
        used.order.push_back((issued + VALID.as_secs(), expected));
        Ok(())
    }

    /// Forgets that `token`, redeemed a moment ago, was used: the leader could not finish what
    /// it proved (it answered 5xx), so the agent may send the same proof again within its minute
    /// (kube's client resends a request answered 503 by itself).
    pub fn release(&self, m: &MemberKey, purpose: Purpose, token: &str) {
        let mut parts = token.split('.');
        let (Some(issued), Some(nonce)) = (parts.next(), parts.next()) else {
            return;
        };
        let Ok(issued) = issued.parse::<u64>() else {
            return;
        };
        let mac = self.mac(m, purpose, issued, nonce);
        let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        used.seen.remove(&mac);
    }

    /// How many redeemed proofs are remembered (for tests and metrics).
    pub fn remembered(&self) -> usize {
        self.used.lock().map(|u| u.seen.len()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(name: &str) -> MemberKey {
        MemberKey {
            namespace: format!("tether-prod-{name}"),
            name: name.into(),
        }
    }

    #[test]
    fn a_released_proof_may_be_sent_again_and_is_then_used() {
        let c = Challenges::default();
        let east = member("east");
        let t = c.issue(&east, Purpose::Rejoin, 1000);
        assert_eq!(c.redeem(&east, Purpose::Rejoin, &t, 1001), Ok(()));
        c.release(&east, Purpose::Rejoin, &t);
        assert_eq!(
            c.redeem(&east, Purpose::Rejoin, &t, 1002),
            Ok(()),
            "sent again after a 503"
        );
        assert_eq!(c.redeem(&east, Purpose::Rejoin, &t, 1003), Err(Refused::Reused));
        let other = c.issue(&east, Purpose::Rejoin, 1000);
        c.release(&member("west"), Purpose::Rejoin, &other);
        c.release(&east, Purpose::Rejoin, "not.a.token");
        assert_eq!(c.redeem(&east, Purpose::Rejoin, &other, 1001), Ok(()));
        assert_eq!(
            c.redeem(&east, Purpose::Rejoin, &t, 1070),
            Err(Refused::Expired),
            "a release does not extend the minute"
        );
    }

    #[test]
    fn a_proof_is_redeemed_once_for_its_member_within_a_minute() {
        let c = Challenges::default();
        let east = member("east");
        let t = c.issue(&east, Purpose::Attach, 1000);
        assert_eq!(
            c.redeem(&member("west"), Purpose::Attach, &t, 1001),
            Err(Refused::Forged)
        );
        assert_eq!(c.redeem(&east, Purpose::Attach, &t, 1001), Ok(()));
        assert_eq!(c.redeem(&east, Purpose::Attach, &t, 1002), Err(Refused::Reused));
        let other = c.issue(&east, Purpose::Attach, 1000);
        assert_eq!(
            c.redeem(&east, Purpose::Rejoin, &other, 1001),
            Err(Refused::Forged),
            "an attach proof does not rejoin"
        );
        let late = c.issue(&east, Purpose::Attach, 1000);
        assert_eq!(
            c.redeem(&east, Purpose::Attach, &late, 1061),
            Err(Refused::Expired)
        );
        let early = c.issue(&east, Purpose::Attach, 2000);
        assert_eq!(
            c.redeem(&east, Purpose::Attach, &early, 1999),
            Err(Refused::Expired)
        );
    }

    #[test]
    fn proofs_of_another_replica_or_tampered_ones_are_refused() {
        let (a, b) = (Challenges::default(), Challenges::default());
        let east = member("east");
        let t = a.issue(&east, Purpose::Attach, 1000);
        assert_eq!(b.redeem(&east, Purpose::Attach, &t, 1000), Err(Refused::Forged));
        let mut parts: Vec<String> = t.split('.').map(str::to_string).collect();
        parts[0] = "1001".into();
        assert_eq!(
            a.redeem(&east, Purpose::Attach, &parts.join("."), 1001),
            Err(Refused::Forged)
        );
        for bad in [
            "",
            "x",
            "1.2",
            "1.2.3.4",
            "a.0123456789abcdef0123456789abcdef.00",
            "1000.zz.00",
        ] {
            assert_eq!(
                a.redeem(&east, Purpose::Attach, bad, 1000),
                Err(Refused::Malformed),
                "{bad}"
            );
        }
    }

    #[test]
    fn redeemed_proofs_are_forgotten_once_they_could_not_be_redeemed_anyway() {
        let c = Challenges::default();
        let east = member("east");
        for i in 0..100 {
            let t = c.issue(&east, Purpose::Attach, 1000 + i);
            c.redeem(&east, Purpose::Attach, &t, 1000 + i).unwrap();
        }
        assert!(c.remembered() <= 62, "{}", c.remembered());
    }
}
