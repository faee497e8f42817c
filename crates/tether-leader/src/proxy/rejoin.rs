//! Ensures a member outlives any leader outage without a long-lived secret: an agent whose
//! credential expired (and whose join token may have expired too) gets a new credential by
//! proving the key the member registered with, over a path it reaches with no token at all.
//!
//! `GET .../rejoin` answers anyone a challenge sealed to the member's registered key; a caller
//! who names a member that does not exist, was removed or banned, gets a challenge sealed to a
//! throwaway key instead, so the answer reveals nothing about who is a member. `GET .../rejoin`
//! with the proof read out of the challenge answers a credential of the member's own agent
//! ServiceAccount (the set's `credentialTTL`), sealed to the same key. Nothing is stored per
//! caller: challenges are this replica's HMAC tokens (`challenge.rs`).

use std::sync::Arc;

use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use tether_api::ManagedCluster;
use tether_api::conditions::EventReason;
use tether_tunnel::pipe::Body;
use tether_tunnel::proof::{self, ATTACH_PROOF, Challenge, Rejoined};
use tether_tunnel::{REJOIN, status, status_because};
use tracing::{info, warn};

use super::challenge::{Purpose, Refused};
use super::shared::{Shared, json, member_cluster, registered_key, unix_now};
use super::tunnels::MemberKey;
use crate::metrics::Proxied;
use crate::registration::mint_credential;

/// The member `m` and the key it may rejoin with, when it may: the leader made it, it is not
/// being deleted, its set exists and is not being deleted, and neither its cluster ID, its name
/// nor its key is banned.
fn eligible(sh: &Shared, m: &MemberKey) -> Option<(Arc<ManagedCluster>, String, std::time::Duration)> {
    let mc = member_cluster(&sh.ctx.clusters, m)?;
    if mc.meta().deletion_timestamp.is_some() {
        return None;
    }
    let set = sh.ctx.set_of(&mc).and_then(|s| sh.ctx.leader_set(&s))?;
    if set.meta().deletion_timestamp.is_some() {
        return None;
    }
    let policy = set.spec.leader.clone().unwrap_or_default();
    if policy
        .ban_of(&mc.spec.cluster_id, &m.name, mc.spec.public_key.as_deref())
        .is_some()
    {
        return None;
    }
    let key = registered_key(&mc)?.to_string();
    Some((mc, key, policy.credential_lifetime()))
}

/// `rejoin`, as anyone: a challenge, or with a proof of the member's key a new credential.
pub(super) async fn rejoin(req: Request<Incoming>, m: MemberKey, sh: &Arc<Shared>) -> Response<Body> {
    if req.method() != Method::GET {
        return status(StatusCode::METHOD_NOT_ALLOWED, &format!("{REJOIN} takes GET"));
    }
    let member = eligible(sh, &m);
    let now = unix_now();
    let Some(given) = req.headers().get(ATTACH_PROOF) else {
        // NB: the same kind of answer (age pads each with a random-length stanza) whether or not
        // `m` may rejoin: only its key holder can tell them apart.
        let key = member.as_ref().map_or(sh.decoy.as_str(), |(_, k, _)| k.as_str());
        let token = sh.challenges.issue(&m, Purpose::Rejoin, now);
        sh.ctx.metrics.proxied(Proxied::RejoinChallenge);
        return match tether_seal::seal_text(&proof::plaintext(&m.namespace, &m.name, &token), key) {
            Ok(sealed) => json(&serde_json::json!(Challenge { sealed })),
            Err(e) => status(
                StatusCode::INTERNAL_SERVER_ERROR,
                &format!("cannot seal a challenge: {e}"),
            ),
        };
    };
    let given = match given.to_str() {
        Ok(p) if p.len() <= proof::MAX_PROOF => p,
        _ => "",
    };
    if let Err(why) = sh.challenges.redeem(&m, Purpose::Rejoin, given, now) {
        sh.ctx.metrics.proxied(Proxied::Refused(why));
        warn!(member = %m.name, namespace = %m.namespace, reason = why.label(), "Refused a rejoin proof");
        return refused_proof(&m, why);
    }
    // NB: on a 5xx below, the proof is released: the agent (or its client's own retry of a
    // 503) may send it again, and is not told its key was refused.
    let unavailable = |message: &str| {
        sh.challenges.release(&m, Purpose::Rejoin, given);
        status(StatusCode::SERVICE_UNAVAILABLE, message)
    };
    // NB: a valid proof came from a challenge sealed to the registered key, so the member was
    // eligible a moment ago; it may have been removed or banned since.
    let Some((mc, key, ttl)) = member else {
        sh.ctx.metrics.proxied(Proxied::RejoinRefused);
        return status(
            StatusCode::FORBIDDEN,
            &format!(
                "member {} may no longer rejoin (removed or banned); register with a join token",
                m.name
            ),
        );
    };
    match sh.identities.present(&m.namespace) {
        Some(true) => {}
        Some(false) => {
            sh.ctx.metrics.proxied(Proxied::RejoinRefused);
            return status(
                StatusCode::FORBIDDEN,
                &format!(
                    "member {}'s agent ServiceAccount no longer exists; register with a join token",
                    m.name
                ),
            );
        }
        None => {
            return unavailable(
                "this leader replica is still reading the members' identities; retry shortly",
            );
        }
    }
    let (credential, expiry) = match mint_credential(&sh.ctx, &m.namespace, ttl).await {
        Ok(c) => c,
        Err(e) => {
            sh.ctx.metrics.proxied(Proxied::RejoinError);
            warn!(member = %m.name, error = &e as &dyn std::error::Error, "Cannot mint a rejoin credential");
            return unavailable(&format!("cannot mint a credential: {e}"));
        }
    };
    let sealed = match tether_seal::seal(&credential, &key) {
        Ok(s) => s,
        Err(e) => {
            return status(
                StatusCode::INTERNAL_SERVER_ERROR,
                &format!("member {}'s registered key cannot be sealed to: {e}", m.name),
            );
        }
    };
    sh.ctx.metrics.proxied(Proxied::Rejoined);
    sh.ctx.metrics.registrations("Rejoined");
    info!(member = %m.name, namespace = %m.namespace, cluster_id = %mc.spec.cluster_id, expires = %expiry.0,
          "Member rejoined with its registered key");
    crate::write::event(
        &sh.ctx,
        mc.as_ref(),
        EventType::Normal,
        EventReason::Rejoined,
        "Rejoin",
        &format!(
            "the agent proved member {}'s registered key without a valid credential; new credential until {}",
            mc.name_any(),
            expiry.0
        ),
    )
    .await;
    json(&serde_json::json!(Rejoined { sealed }))
}

/// The 403 of a refused proof: its Status reason tells the agent to ask for a new challenge.
pub(super) fn refused_proof(m: &MemberKey, why: Refused) -> Response<Body> {
    status_because(
        StatusCode::FORBIDDEN,
        proof::PROOF_REFUSED,
        &format!("member {}: {why}", m.name),
    )
}
