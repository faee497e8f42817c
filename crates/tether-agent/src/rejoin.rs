//! Ensures a member comes back by itself after any leader outage, however long: an agent whose
//! credential expired (or was refused) proves the key the member registered with, over the
//! leader's `rejoin` path that it reaches with no token at all, and gets a new credential of its
//! own ServiceAccount, as the same member. No join token is needed, so one that expired during
//! the outage strands nobody. A member the leader removed or banned is refused (its challenge
//! is sealed to a key nobody holds), and only then does the agent fall back to its join token.

use http::{Request, StatusCode};
use kube::Client;
use kube::client::Body as KubeBody;
use tether_seal::MemberCredential;
use tether_tunnel::pipe;
use tether_tunnel::proof::{ATTACH_PROOF, Rejoined};
use tether_tunnel::rejoin_path;
use tracing::info;

use crate::Error;
use crate::tunnel::{Dial, MAX_CHALLENGE, proof_refused, read_challenge, refused, send};

/// Who rejoins.
pub struct Member<'a> {
    /// The member's namespace on the leader (from its last credential).
    pub namespace: &'a str,
    /// The member's name.
    pub name: &'a str,
    /// The agent's private key.
    pub identity: &'a str,
}

/// How many challenges one rejoin asks for while the leader refuses the proofs themselves.
const CHALLENGES: usize = 3;

fn classify(d: Dial) -> Error {
    match d {
        Dial::Unreachable(cause) => Error::RejoinUnreachable(cause),
        Dial::Refused(why) => Error::RejoinRefused(why),
        turn @ Dial::Turn(_) => Error::RejoinUnreachable(turn.to_string().into()),
    }
}

/// Gets a new credential over `anonymous`, a client of the leader (CA verified) with no
/// credentials of its own. `RejoinRefused` means the leader will not take this member back this
/// way (removed, banned, member access off, anonymous access off); `RejoinUnreachable` that it
/// could not answer now.
pub async fn rejoin(anonymous: &Client, m: &Member<'_>) -> Result<MemberCredential, Error> {
    let path = rejoin_path(m.namespace, m.name);
    let mut asked = 0;
    let body = loop {
        asked += 1;
        let proof = read_challenge(anonymous, &path, m.namespace, m.name, m.identity)
            .await
            .map_err(classify)?;
        let req = Request::get(path.as_str())
            .header(ATTACH_PROOF, proof)
            .body(KubeBody::empty())
            .map_err(|e| Error::RejoinRefused(e.to_string()))?;
        let resp = send(anonymous, req).await.map_err(classify)?;
        let code = resp.status();
        let body = pipe::collect_limited(resp.into_body(), MAX_CHALLENGE).await;
        match code {
            StatusCode::OK => break body,
            // NB: the proof, not the member, was refused (it expired in flight, a failover put
            // another replica behind the API, or a resent request found it used): a new one.
            _ if proof_refused(code, &body) && asked < CHALLENGES => {
                info!(member = %m.name, "The leader refused a rejoin proof; asking for a new challenge");
            }
            _ => return Err(classify(refused(code, &body))),
        }
    };
    let answer: Rejoined = serde_json::from_slice(&body)
        .map_err(|e| Error::RejoinRefused(format!("the leader's rejoin answer is not readable: {e}")))?;
    let credential = tether_seal::unseal(&answer.sealed, m.identity)?;
    if credential.namespace != m.namespace {
        return Err(Error::RejoinRefused(format!(
            "the leader's credential is for namespace {}, not {}",
            credential.namespace, m.namespace
        )));
    }
    info!(namespace = %m.namespace, member = %m.name, expires = %credential.expiration_timestamp,
          "Rejoined with the member's registered key");
    Ok(credential)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing;
    use serde_json::{Value, json};
    use tether_tunnel::proof::{PROOF_REFUSED, plaintext};

    const NS: &str = "tether-prod-east-1";

    /// A leader that answers every challenge GET (even calls) with a challenge sealed to
    /// `public`, and each proof (odd calls) with `proofs(n)` for the n-th proof.
    fn leader(
        public: String,
        proofs: impl Fn(usize) -> (u16, Value) + Send + Sync + 'static,
    ) -> (Client, testing::Calls) {
        testing::client(move |_, _, n| {
            if n % 2 == 0 {
                let sealed = tether_seal::seal_text(&plaintext(NS, "east", &format!("token-{n}")), &public)
                    .expect("seal a challenge");
                (200, json!({"sealed": sealed}))
            } else {
                proofs(n / 2)
            }
        })
    }

    fn refused_proof() -> (u16, Value) {
        (
            403,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 403,
                   "reason": PROOF_REFUSED, "message": "member east: the attach proof was used already"}),
        )
    }

    fn credential(public: &str) -> (u16, Value) {
        let c = MemberCredential {
            token: "new-token".into(),
            expiration_timestamp: "2030-01-01T00:00:00Z".into(),
            namespace: NS.into(),
            service_account: "tether-agent".into(),
            ca_cert: String::new(),
        };
        (
            200,
            json!({"sealed": tether_seal::seal(&c, public).expect("seal")}),
        )
    }

    #[tokio::test]
    async fn a_refused_proof_gets_a_new_challenge_and_the_member_back() {
        let (identity, public) = tether_seal::generate_keypair();
        let key = public.clone();
        let (client, calls) = leader(public, move |proof| {
            if proof == 0 {
                refused_proof()
            } else {
                credential(&key)
            }
        });
        let m = Member {
            namespace: NS,
            name: "east",
            identity: &identity,
        };
        let c = rejoin(&client, &m)
            .await
            .expect("rejoined on the second challenge");
        assert_eq!(c.token, "new-token");
        assert_eq!(testing::count(&calls, "GET"), 4, "two challenges, two proofs");
    }

    #[tokio::test]
    async fn proofs_refused_every_time_leave_the_member_to_try_later_not_removed() {
        let (identity, public) = tether_seal::generate_keypair();
        let (client, calls) = leader(public, |_| refused_proof());
        let m = Member {
            namespace: NS,
            name: "east",
            identity: &identity,
        };
        let err = rejoin(&client, &m).await.expect_err("refused");
        assert!(
            matches!(err, Error::RejoinUnreachable(_)),
            "kept for later: {err}"
        );
        assert_eq!(testing::count(&calls, "GET"), 2 * CHALLENGES, "bounded");
    }

    #[tokio::test]
    async fn a_refused_member_is_refused_at_once() {
        let (identity, public) = tether_seal::generate_keypair();
        let (client, calls) = leader(public, |_| testing::failure(403));
        let m = Member {
            namespace: NS,
            name: "east",
            identity: &identity,
        };
        let err = rejoin(&client, &m).await.expect_err("refused");
        assert!(matches!(err, Error::RejoinRefused(_)), "{err}");
        assert_eq!(testing::count(&calls, "GET"), 2, "no second challenge");
    }
}
