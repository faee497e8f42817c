//! The attach pace attacked: a member's agent identity (a token minted for it) asking for attach
//! challenges in a loop while its member has no tunnel, as a compromised agent or a leaked token
//! would, to push every other member's turn out or to make the leader hold a turn per request.
//! The leader of this fixture paces at `ATTACH_RATE`.

use super::*;

/// A client of the leader's API server with `token` that takes a 503 as an answer (kube's
/// default client waits out `Retry-After` and asks again, as a patient agent would).
fn client(w: &World, token: &str) -> kube::Client {
    let mut config = w.leader.cluster.config();
    config.auth_info = kube::config::AuthInfo {
        token: Some(token.to_string().into()),
        ..Default::default()
    };
    config.default_retry = false;
    kube::Client::try_from(config).expect("client")
}

/// The status and `Retry-After` of a challenge GET for member `name`'s attach, through `c`.
async fn ask(c: &kube::Client, name: &str) -> (StatusCode, Option<u64>) {
    let req = Request::get(tether_tunnel::attach_path(&ns_of(name), name))
        .body(kube::client::Body::empty())
        .expect("request");
    let resp = c.send(req).await.expect("send");
    let after = resp
        .headers()
        .get(http::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok()?.parse().ok());
    (resp.status(), after)
}

pub(super) async fn one_member_asking_to_attach_in_a_loop_holds_one_turn_and_pushes_no_other_out(w: &World) {
    let agents = [&w.east, &w.west].map(|m| m.agent.as_ref().expect("agent"));
    // NB: both agents frozen until the leader closes their tunnels as silent: without a live
    // tunnel, a member's attach is paced (a live one's challenge is a proof over a new credential).
    // NB: the replica's own count, not TunnelConnected: two tunnels closing together are a mass
    // close, and the member's condition waits out its grace (45 s) before it says so.
    // NB: thawed when these guards go, also if an assertion below fails: the tests after this one
    // share the fixture and need both tunnels.
    let frozen = agents.map(|a| a.frozen());
    eventually(
        "the leader closed both frozen agents' tunnels",
        Duration::from_secs(60),
        || async {
            match leader_metric_read(&w.leader, "tether_leader_tunnels").await? {
                Some(0.0) => Ok(()),
                other => Err(format!("tunnels: {other:?}")),
            }
        },
    )
    .await;
    let west = client(w, &minted_agent_token(w, "west").await);
    let east = client(w, &minted_agent_token(w, "east").await);
    let series = "tether_leader_proxy_requests_total{result=\"attach_paced\"}";
    // NB: 0 while nothing was paced yet (whether the fixture's own attaches were depends on timing).
    let paced_before = leader_counter(&w.leader, series).await;
    let started = Instant::now();
    let (mut admitted, mut turns) = (0usize, 0usize);
    for _ in 0..300 {
        match ask(&west, "west").await {
            (StatusCode::OK, _) => admitted += 1,
            // NB: asking again never moves the turn: it is never more than one slot away,
            // rounded up to whole seconds.
            (StatusCode::SERVICE_UNAVAILABLE, Some(after)) if after <= 2 => turns += 1,
            other => panic!("west asking again: {other:?} (a challenge, or a turn at most 2 s away)"),
        }
    }
    let took = started.elapsed().as_secs_f64();
    eprintln!("west asked 300 times in {took:.1} s: {admitted} challenges, {turns} turns");
    assert!(
        (admitted as f64) <= took * ATTACH_RATE + 2.0,
        "{admitted} challenges in {took:.1} s: faster than the pace ({ATTACH_RATE}/s)"
    );
    // The next member is not behind 300 turns: its turn is at most one slot after west's.
    let (code, after) = ask(&east, "east").await;
    assert!(
        code == StatusCode::OK || after.is_some_and(|a| a <= 2),
        "east, right after west's 300 asks: {code} after {after:?}"
    );
    let paced = leader_counter(&w.leader, series).await - paced_before;
    assert!(paced >= turns as f64, "{paced} turns counted, {turns} seen");
    assert!(turns >= 250, "most of 300 quick asks were turns: {turns}");
    // The fixture back: both agents thawed; they attach again at the pace.
    drop(frozen);
    for m in ["east", "west"] {
        wait_tunnel(&w.leader, m, "True").await;
    }
    alice_is_served(w, "east").await;
}
