//! Replacing a member's tunnel with the member's own key: possible (only the key holder can),
//! always a Warning, and a tunnel attached as an agent from before the on-demand start gets
//! HTTP/2 from the first byte.

use super::*;

/// East's private key, as the holder of the member's key (its admin) would read it.
pub(super) async fn east_key(w: &World) -> String {
    let s = Api::<Secret>::namespaced(w.east.admin.clone(), HOME)
        .get(tether_agent::state::KEY_SECRET)
        .await
        .expect("key Secret");
    String::from_utf8(s.data.expect("data")["identity"].0.clone()).expect("key text")
}

/// A proof of east's key for an attach with `token`, read out of a fresh challenge.
async fn east_proof(w: &World, token: &str, key: &str) -> String {
    let (_, body, _) = attach(w, token, "east", None, false).await;
    let challenge: tether_tunnel::proof::Challenge = serde_json::from_str(&body).expect("challenge");
    let text = tether_seal::unseal_text(&challenge.sealed, key).expect("east's key opens it");
    let proof = tether_tunnel::proof::token_in(&text, &ns_of("east"), "east").expect("a challenge for east");
    proof.to_string()
}

pub(super) async fn an_attach_with_the_members_own_key_replaces_the_tunnel_with_a_warning(w: &World) {
    let token = minted_agent_token(w, "east").await;
    let key = east_key(w).await;
    let proof = &east_proof(w, &token, &key).await;
    let (code, body, up) = attach(w, &token, "east", Some(proof), true).await;
    assert_eq!(code, StatusCode::SWITCHING_PROTOCOLS, "{body}");
    let (code, body, _) = attach(w, &token, "east", Some(proof), true).await;
    assert!(
        code == StatusCode::FORBIDDEN && body.contains("used already"),
        "a proof is single-use: {code} {body}"
    );
    // The Status reason, through the aggregator, tells the agent to ask for a new challenge
    // rather than conclude that its member was removed.
    let status: serde_json::Value = serde_json::from_str(&body).expect("a Status");
    assert_eq!(
        status["reason"],
        tether_tunnel::proof::PROOF_REFUSED,
        "a refused proof is marked: {body}"
    );
    let replaced = leader_metric(&w.leader, "tether_leader_tunnel_replacements_total").await;
    assert_eq!(replaced, 1.0, "the replacement is counted");
    eventually(
        "a TunnelReplaced Warning on east",
        Duration::from_secs(15),
        || async {
            let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(
                w.leader.admin.clone(),
                &ns_of("east"),
            )
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?;
            events
                .items
                .iter()
                .find(|e| {
                    e.reason.as_deref() == Some("TunnelReplaced") && e.type_.as_deref() == Some("Warning")
                })
                .map(drop)
                .ok_or_else(|| format!("{} events, none TunnelReplaced", events.items.len()))
        },
    )
    .await;
    drop(up);
    // An agent from before (no on-demand offer at attach) gets HTTP/2 from the first byte. NB:
    // east's agent redials within seconds and replaces it, so until a request lands on it.
    let (alice, marker) = (
        through(&w.leader, "alice", None, "east").await,
        "served-from-the-first-byte",
    );
    let list =
        json!({"kind": "NamespaceList", "apiVersion": "v1", "items": [{"metadata": {"name": marker}}]});
    eventually(
        "a request reaches a tunnel served from the first byte",
        Duration::from_secs(60),
        || async {
            let p = east_proof(w, &token, &key).await;
            let (code, body, up) = attach(w, &token, "east", Some(&p), true).await;
            let served =
                serve_from_the_first_byte(up.ok_or(format!("no tunnel: {code} {body}"))?, list.to_string());
            let answer = get(&alice, "/api/v1/namespaces", &[]).await;
            served.abort();
            answer
                .ok()
                .filter(|t| t.contains(marker))
                .map(drop)
                .ok_or_else(|| "answered by east's own agent".to_string())
        },
    )
    .await;
    // The agent's own tunnel was closed by the replacement; it redials and serves again.
    alice_is_served(w, "east").await;
}
