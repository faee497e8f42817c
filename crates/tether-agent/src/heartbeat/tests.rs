use super::*;
use std::collections::BTreeMap;

fn lease(annotations: &[(&str, &str)]) -> Lease {
    let mut l = Lease::default();
    l.metadata.annotations = Some(
        annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>(),
    );
    l
}

#[test]
fn intervals_come_from_the_lease_with_defaults_for_what_is_missing_or_bad() {
    let l = lease(&[
        (annotations::HEARTBEAT_INTERVAL, "2"),
        (annotations::TUNNEL_HEARTBEAT_INTERVAL, "120"),
        (annotations::TUNNEL_PING_INTERVAL, "0"),
    ]);
    let i = Intervals::of(&l);
    assert_eq!(i.alone, Duration::from_secs(2));
    assert_eq!(i.tunneled, Duration::from_secs(120));
    assert_eq!(i.ping, Duration::from_secs(5), "0 is not an interval");
    assert_eq!(Intervals::of(&lease(&[])), Intervals::default());
    assert_eq!(
        Intervals::of(&lease(&[(annotations::HEARTBEAT_INTERVAL, "ten")])).alone,
        Duration::from_secs(10)
    );
    assert_eq!(i.next(true), Duration::from_secs(120));
    assert_eq!(i.next(false), Duration::from_secs(2));
}

#[tokio::test(start_paused = true)]
async fn the_first_renewal_waits_for_the_tunnels_first_dial_or_the_wait_ends() {
    // `attached`: whether the dial attached; `None`: it never ends.
    async fn first(attached: Option<bool>, after: Duration) -> (bool, Duration) {
        let link = std::sync::Arc::new(Link::default());
        let dialling = {
            let link = link.clone();
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                match attached {
                    Some(true) => link.set_attached(true),
                    Some(false) => {}
                    None => return,
                }
                link.set_dialled();
            })
        };
        let start = tokio::time::Instant::now();
        let attached = first_attach(&link, FIRST_ATTACH_WAIT).await;
        let waited = start.elapsed();
        dialling.await.expect("dial");
        (attached, waited)
    }
    let ms = Duration::from_millis;
    assert_eq!(
        first(Some(true), ms(700)).await,
        (true, ms(700)),
        "attached: renew at once"
    );
    assert_eq!(
        first(Some(false), ms(300)).await,
        (false, ms(300)),
        "refused: renew at once"
    );
    assert_eq!(
        first(None, ms(0)).await,
        (false, FIRST_ATTACH_WAIT),
        "no longer than the wait"
    );
    let link = Link::default();
    link.set_attached(true);
    link.set_dialled();
    let start = tokio::time::Instant::now();
    assert!(first_attach(&link, FIRST_ATTACH_WAIT).await);
    assert_eq!(start.elapsed(), Duration::ZERO, "already attached: no wait");
}

#[tokio::test(start_paused = true)]
async fn a_lost_tunnel_brings_the_next_renewal_forward_but_not_at_once() {
    let link = Link::default();
    link.set_attached(true);
    let mut attached = link.attached();
    let i = Intervals {
        alone: Duration::from_secs(10),
        tunneled: Duration::from_secs(300),
        ping: Duration::from_secs(5),
    };
    let start = tokio::time::Instant::now();
    let waiting = tokio::spawn(async move { wait(&mut attached, i).await });
    tokio::time::sleep(Duration::from_secs(60)).await;
    link.set_attached(false);
    waiting.await.expect("wait");
    let waited = start.elapsed();
    // Lost at 60 s: renewed 27–33 s later, not at 300 s and not at once.
    assert!(
        waited >= Duration::from_secs(87) && waited <= Duration::from_secs(93),
        "{waited:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_tunnel_back_within_the_wait_keeps_the_long_interval_and_one_attached_late_gets_it() {
    let link = Link::default();
    link.set_attached(true);
    let i = Intervals {
        alone: Duration::from_secs(10),
        tunneled: Duration::from_secs(300),
        ping: Duration::from_secs(5),
    };
    let timed = |lost: u64, back: u64| {
        let (link, mut attached) = (&link, link.attached());
        async move {
            let start = tokio::time::Instant::now();
            let waiting = tokio::spawn(async move {
                wait(&mut attached, i).await;
                start.elapsed()
            });
            tokio::time::sleep(Duration::from_secs(lost)).await;
            link.set_attached(false);
            tokio::time::sleep(Duration::from_secs(back - lost)).await;
            link.set_attached(true);
            waiting.await.expect("wait")
        }
    };
    // Lost at 60 s, back at 75 s (a failover): renewed on the old schedule, 270–330 s.
    let waited = timed(60, 75).await;
    assert!(
        waited >= Duration::from_secs(270) && waited <= Duration::from_secs(330),
        "{waited:?}"
    );
    // Lost at 60 s and back only after the wait ran out: renewed at 87–93 s as before.
    let waited = timed(60, 95).await;
    assert!(
        waited >= Duration::from_secs(87) && waited <= Duration::from_secs(93),
        "{waited:?}"
    );
}

use crate::testing::{self, count, failure};
use serde_json::json;
use tether_api::conditions::ConditionType;

const LEASE: &str = "PATCH /apis/coordination.k8s.io/v1/namespaces/ns/leases/east";
const ANNOUNCE: &str =
    "PATCH /apis/multicluster.tether.dev/v1alpha1/namespaces/ns/memberclusterannounces/east";

fn renewed_lease() -> (u16, serde_json::Value) {
    (
        200,
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
               "metadata": {"name": "east", "namespace": "ns",
                            "annotations": {annotations::HEARTBEAT_INTERVAL: "10"}},
               "spec": {}}),
    )
}

fn renewed_announce(interval: i32) -> (u16, serde_json::Value) {
    (
        200,
        json!({"apiVersion": "multicluster.tether.dev/v1alpha1", "kind": "MemberClusterAnnounce",
               "metadata": {"name": "east", "namespace": "ns"},
               "spec": {"clusterID": "id-1", "heartbeatIntervalSeconds": interval}}),
    )
}

/// Runs the heartbeat against `leader` for `secs` of (paused) time; its result if it ended.
async fn beat_for(leader: kube::Client, secs: u64, sink: &StatusSink) -> Option<Result<(), Error>> {
    let (_tx, rx) = watch::channel(leader);
    let link = Link::default();
    let metrics = Metrics::default();
    tokio::time::timeout(
        Duration::from_secs(secs),
        run(&metrics, sink, rx, &link, false, "ns", "east"),
    )
    .await
    .ok()
}

#[tokio::test(start_paused = true)]
async fn a_failing_leader_is_retried_with_backoff_and_shown_unreachable_until_it_answers() {
    let (leader, calls) = testing::client(|_, _, n| if n < 2 { failure(500) } else { renewed_lease() });
    let (sink, owner, writes) = testing::sink(false);
    // Fails at 0 s and 2 s (backoff 2 s, then 4 s), renews at 6 s, next at 15–17 s.
    assert!(beat_for(leader, 14, &sink).await.is_none(), "still beating");
    assert_eq!(count(&calls, LEASE), 3);
    drop(sink);
    owner.await.expect("owner");
    assert_eq!(
        testing::reasons(&writes, ConditionType::LeaderReachable),
        ["LeaderUnreachable", "HeartbeatOK"]
    );
}

#[tokio::test(start_paused = true)]
async fn a_refusal_is_taken_for_rbac_settling_for_30_s_then_ends_the_session() {
    // 403 on the Lease and on the announce: a cold RBAC cache, or a revoked identity.
    let (leader, calls) = testing::client(|_, _, _| failure(403));
    let (sink, _owner, _) = testing::sink(false);
    let start = tokio::time::Instant::now();
    let ended = beat_for(leader, 120, &sink).await.expect("ended");
    assert!(matches!(ended, Err(Error::CredentialRejected(_))), "{ended:?}");
    let after = start.elapsed();
    assert!(
        after >= Duration::from_secs(30) && after < Duration::from_secs(45),
        "{after:?}"
    );
    assert!(count(&calls, LEASE) >= 4, "retried meanwhile");
}

#[tokio::test(start_paused = true)]
async fn an_unauthorized_credential_ends_the_session_at_once() {
    let (leader, calls) = testing::client(|_, _, _| failure(401));
    let (sink, _owner, _) = testing::sink(false);
    let ended = beat_for(leader, 120, &sink).await.expect("ended");
    assert!(matches!(ended, Err(Error::CredentialRejected(_))), "{ended:?}");
    assert_eq!(count(&calls, LEASE), 1);
}

#[tokio::test(start_paused = true)]
async fn a_leader_without_heartbeat_leases_gets_the_announce_renewed_at_its_interval() {
    let (leader, calls) = testing::client(|_, path, _| {
        if path.contains("/leases/") {
            failure(404)
        } else {
            renewed_announce(20)
        }
    });
    let (sink, _owner, _) = testing::sink(false);
    // The Lease once (404), the announce at 0 s and every 18–22 s: at 0, ~20, ~40 s.
    assert!(beat_for(leader, 50, &sink).await.is_none());
    assert_eq!(count(&calls, LEASE), 1, "not tried again before LEASE_RETRY");
    assert_eq!(count(&calls, ANNOUNCE), 3);
}
