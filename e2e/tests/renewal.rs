//! Member credentials at their shortest lifetime (10 minutes, the least the API server issues),
//! on real clusters with both controllers as real processes:
//! - an agent that runs renews before expiry, twice, with no failed heartbeat;
//! - an agent stopped past its credential's expiry comes back by itself as the same member while
//!   its join token is valid;
//! - one whose join token has expired meanwhile says what to do, in its status and an Event.
//!
//! It takes about 14 minutes, so it is ignored by a plain `cargo test`; `make test` runs it with
//! `--ignored` beside the other tests.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Event;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, ListParams};
use serde_json::json;
use tether_api::clusterset::LeaderSpec;
use tether_e2e::fleet::{
    self, LeaderSide, credential_expiry, duration, kube_system_uid, managed, policy, ready, requests_for,
    wait_ready,
};
use tether_e2e::sim::{HOME, SET, ns_of};
use tether_testkit::{BootstrapToken, Controller, CreateToken, eventually};

/// Whether member `name` registered a second time and has heartbeated since `since`.
async fn rejoined(admin: &kube::Client, name: &str, id: &str, since: Timestamp) -> bool {
    let beat = tether_e2e::fleet::renewed_after(admin, name, since).await;
    beat && requests_for(admin, id).await == 2
}

/// The value of `name{result="<result>"}` on the agent's /metrics (0 when absent).
async fn metric(agent: &Controller, name: &str, result: &str) -> f64 {
    let (_, body) = agent.admin_get("/metrics").await.expect("metrics");
    let prefix = format!("{name}{{result=\"{result}\"}} ");
    body.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test]
#[ignore = "about 14 minutes; `make test` runs it with --ignored beside the other tests"]
async fn credentials_renew_before_expiry_and_agents_offline_past_it_come_back() {
    let leader = LeaderSide::named("renewal-leader")
        .policy(LeaderSpec {
            credential_ttl: duration("10m"),
            ..policy("5s", "15s")
        })
        .start()
        .await;
    let home = tether_e2e::sim::home();
    let token = BootstrapToken::random();
    token
        .create(&leader.admin, Some(&home), None)
        .await
        .expect("token");
    // Valid when `late` joins, expired when it comes back after its credential expired.
    let short = BootstrapToken::random();
    let short_expiry = Timestamp::now() + SignedDuration::from_secs(240);
    short
        .create(&leader.admin, Some(&home), Some(short_expiry))
        .await
        .expect("short token");
    let (steady, mut sleeper, mut late) = tokio::join!(
        fleet::member("steady", &leader, &token, json!({})),
        fleet::member("sleeper", &leader, &token, json!({})),
        fleet::member("late", &leader, &short, json!({})),
    );
    for name in ["steady", "sleeper", "late"] {
        wait_ready(&leader.admin, name).await;
    }
    let sleeper_uid = managed(&leader.admin, "sleeper")
        .await
        .expect("sleeper")
        .metadata
        .uid;
    let ids = (
        kube_system_uid(&steady).await,
        kube_system_uid(&sleeper).await,
        kube_system_uid(&late).await,
    );
    let first_expiry = credential_expiry(&steady).await;
    // Two agents stop; they come back once their credentials have expired.
    sleeper.kill_agent();
    late.kill_agent();
    let back_after = credential_expiry(&sleeper)
        .await
        .max(credential_expiry(&late).await)
        .max(short_expiry)
        + SignedDuration::from_secs(5);
    eprintln!(
        "credentials expire at {first_expiry}; the stopped agents come back after {back_after} (join token for late expired at {short_expiry})"
    );

    let agent = steady.agent.as_ref().expect("steady's agent");
    let started = Instant::now();
    let mut restarted: Option<Instant> = None;
    let mut sleeper_back: Option<Duration> = None;
    loop {
        let failed = metric(agent, "tether_agent_heartbeats_total", "failed").await;
        assert_eq!(failed, 0.0, "no failed heartbeat; log:\n{}", agent.log_tail(30));
        let renewed = metric(agent, "tether_agent_credential_renewals_total", "ok").await;
        if restarted.is_none() && Timestamp::now() > back_after {
            sleeper.start_agent();
            late.start_agent();
            restarted = Some(Instant::now());
        }
        if let Some(at) = restarted
            && sleeper_back.is_none()
            && rejoined(&leader.admin, "sleeper", &ids.1, back_after).await
        {
            sleeper_back = Some(at.elapsed());
        }
        if renewed >= 2.0 && restarted.is_some() {
            eprintln!(
                "steady renewed twice in {:?} with no failed heartbeat",
                started.elapsed()
            );
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(17 * 60),
            "two renewals within 17 minutes; saw {renewed}; log:\n{}",
            agent.log_tail(30)
        );
        tokio::time::sleep(Duration::from_secs(5)).await;
    }

    // The running agent: renewed, never failed, heartbeats kept landing past the first expiry.
    assert_eq!(
        metric(agent, "tether_agent_credential_renewals_total", "failed").await,
        0.0
    );
    assert!(credential_expiry(&steady).await > first_expiry + SignedDuration::from_secs(600));
    let log = agent.log();
    assert!(!log.contains("Heartbeat failed"), "{log}");
    assert!(log.matches("Credential renewed").count() >= 2, "{log}");
    let mc = managed(&leader.admin, "steady").await.expect("steady");
    assert_eq!(ready(&mc).as_deref(), Some("True"), "{:?}", mc.status);
    let beat = tether_e2e::fleet::heartbeat_time(&leader.admin, "steady").await;
    assert!(
        beat.is_some_and(|t| t > first_expiry),
        "heartbeats after the first credential expired: {beat:?}"
    );
    assert_eq!(
        requests_for(&leader.admin, &ids.0).await,
        1,
        "steady registered once"
    );

    // The sleeper registered again by itself, as the same member.
    wait_ready(&leader.admin, "sleeper").await;
    eventually(
        "the sleeper's own status Ready",
        Duration::from_secs(60),
        || async {
            let s = sleeper.set().await.and_then(|s| s.status).ok_or("no status")?;
            if s.state.as_deref() == Some("Ready") {
                Ok(())
            } else {
                Err(format!("{:?}", s.state))
            }
        },
    )
    .await;
    eprintln!(
        "the sleeper heartbeated again as a rejoined member {} after it came back (polled every 5 s)",
        sleeper_back.map_or("(only seen after the renewals)".into(), |d| format!("{d:.1?}"))
    );
    let mc = managed(&leader.admin, "sleeper").await.expect("sleeper");
    assert_eq!(mc.metadata.uid, sleeper_uid, "the same ManagedCluster");
    assert_eq!(mc.metadata.namespace.as_deref(), Some(ns_of("sleeper").as_str()));
    assert_eq!(
        requests_for(&leader.admin, &ids.1).await,
        2,
        "one new registration, a rejoin"
    );

    // Late: its token expired while it was away; it says so and what to do.
    late.wait_join_token_expired().await;
    let events = Api::<Event>::namespaced(late.admin.clone(), HOME)
        .list(&ListParams::default())
        .await
        .expect("events");
    let said = events.items.iter().any(|e| {
        e.involved_object.name.as_deref() == Some(SET)
            && e.reason.as_deref() == Some("JoinTokenExpired")
            && e.message
                .as_deref()
                .is_some_and(|m| m.contains("tether token create"))
    });
    assert!(said, "an Event says what to do: {:?}", events.items);
    assert_eq!(
        requests_for(&leader.admin, &ids.2).await,
        1,
        "an expired token registers nothing"
    );
}
