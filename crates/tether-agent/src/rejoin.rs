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
