//! A controller's watches expire while it cannot read them: its process frozen (SIGSTOP) across
//! a restart of its API server, whose new watch cache no longer holds the controller's resource
//! versions (`410 Gone`). Running again, it lists every kind afresh; what changed meanwhile must
//! be acted on, though no watch event says it. At the leader: each registration request created
//! in the gap is decided (before the fix, one created while the request watch was down could be
//! dropped by the controller and never decided), and a member that left in the gap is removed.
//! At an agent: a membership written in the gap is joined.

use std::future::IntoFuture;
use std::time::{Duration, Instant};

use futures::future::join_all;
use kube::api::Api;
use serde_json::json;
use tether_api::ManagedCluster;
use tether_api::registration::RegistrationResult;
use tether_e2e::fleet::{self, LeaderSide, wait_ready};
use tether_e2e::sim::{self, HOME};
use tether_testkit::{Controller, eventually};

use super::{leader_with_token, timings};

/// Registration requests created while the leader's watches were down.
const IN_THE_GAP: usize = 30;

#[tokio::test]
async fn what_changed_while_the_leaders_watches_were_down_is_acted_on() {
    let mut leader = LeaderSide::named("relist-leader").policy(timings()).start().await;
    let leaves = sim::join(&leader.cluster, &leader.admin, "leaves", "id-leaves").await;
    // Join tokens made beforehand: in the gap, only what an agent does.
    let joiners =
        join_all((0..IN_THE_GAP).map(|_| sim::joiner(&leader.cluster, &leader.admin).into_future())).await;

    leader.controller.freeze();
    leader.cluster.stop_api_server();
    leader
        .cluster
        .start_api_server()
        .await
        .expect("API server restarted");
    let creates = joiners.iter().enumerate().map(|(i, j)| {
        let body = json!({"apiVersion": "multicluster.tether.dev/v1alpha1", "kind": "ClusterRegistrationRequest",
                          "metadata": {"name": format!("gap-{i}")},
                          "spec": {"clusterID": format!("id-gap-{i}"), "clusterName": format!("gap-{i}"),
                                   "publicKey": j.public_key}});
        sim::create_request(j, HOME, body)
    });
    join_all(creates).await;
    leaves.leave().await.expect("leave");
    leader.controller.thaw();
    let thawed = Instant::now();

    let requests = Api::<tether_api::ClusterRegistrationRequest>::namespaced(leader.admin.clone(), HOME);
    eventually(
        &format!("the {IN_THE_GAP} requests created in the gap approved"),
        Duration::from_secs(60),
        || async {
            let undecided: Vec<String> = requests
                .list(&Default::default())
                .await
                .map_err(|e| e.to_string())?
                .items
                .into_iter()
                .filter(|r| r.spec.cluster_name.starts_with("gap-"))
                .filter(|r| r.status.as_ref().map(|s| s.result) != Some(RegistrationResult::Approved))
                .map(|r| {
                    format!(
                        "{}: {:?}",
                        r.spec.cluster_name,
                        r.status.map(|s| (s.result, s.reason))
                    )
                })
                .collect();
            if undecided.is_empty() {
                Ok(())
            } else {
                Err(format!("not approved: {undecided:?}"))
            }
        },
    )
    .await;
    let approved = thawed.elapsed();
    let clusters = Api::<ManagedCluster>::namespaced(leader.admin.clone(), &leaves.namespace);
    eventually(
        "the member that left in the gap removed",
        Duration::from_secs(30),
        || async {
            match clusters.get_opt("leaves").await {
                Ok(None) => Ok(()),
                Ok(Some(_)) => Err("its ManagedCluster is still there".to_string()),
                Err(e) => Err(e.to_string()),
            }
        },
    )
    .await;
    eprintln!(
        "after the relist: {IN_THE_GAP} requests from the gap approved {approved:?} and the member that left removed {:?} after the leader ran again",
        thawed.elapsed()
    );
    assert_expired(&leader.controller, "ClusterRegistrationRequest");
    assert_eq!(leader.controller.exited(), None, "the leader kept running");
}

#[tokio::test]
async fn a_membership_written_while_the_agents_watch_was_down_is_joined() {
    let (leader, token) = leader_with_token("relist-agent-leader").await;
    let mut member = fleet::bare_member("relist-member").await;
    member.start_agent();
    let agent = member.agent.take().expect("agent");
    eventually("the agent's cache synced", Duration::from_secs(30), || async {
        if agent.log().contains("Cache synced") {
            Ok(())
        } else {
            Err(agent.log_tail(5))
        }
    })
    .await;

    agent.freeze();
    member.cluster.stop_api_server();
    member
        .cluster
        .start_api_server()
        .await
        .expect("member API server restarted");
    fleet::write_membership(&member, &leader, &token, json!({})).await;
    agent.thaw();
    let thawed = Instant::now();
    wait_ready(&leader.admin, "relist-member").await;
    eprintln!(
        "after the relist: the membership written in the gap joined and Ready {:?} after the agent ran again",
        thawed.elapsed()
    );
    assert_expired(&agent, "ClusterSet");
    member.agent = Some(agent);
}

/// The path under test was taken: `controller`'s watch of `kind` expired (410) and the kind was
/// listed again.
fn assert_expired(controller: &Controller, kind: &str) {
    let log = controller.log();
    let failures = log
        .lines()
        .filter(|l| l.contains("Watch failed") && l.contains(kind))
        .collect::<Vec<_>>();
    assert!(
        failures
            .iter()
            .any(|l| l.contains("410") || l.contains("Expired") || l.contains("too old")),
        "the {kind} watch expired (410) and was listed again; its watch failures: {failures:#?}"
    );
}
