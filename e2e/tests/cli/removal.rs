//! `tether leave`/`destroy --force` when the other side is gone, and `tether member remove --ban`.

use super::*;

/// Every teardown works when the other side is gone: `tether leave --force` with no agent to
/// deregister removes the membership here (finalizer, key, credential, property), and `tether
/// destroy --force` with the leader controller dead removes the set, its members and its
/// finalizer by itself.
#[tokio::test]
async fn leave_and_destroy_force_work_when_the_other_side_is_gone() {
    use tether_api::about::ClusterProperty;
    let mut leader = LeaderSide::named("cli-gone")
        .policy(LeaderSpec::default())
        .start()
        .await;
    let token = tether_e2e::sim::join_token(&leader.admin).await;
    let (mut east, mut west) = tokio::join!(
        fleet::member("east", &leader, &token, serde_json::json!({})),
        fleet::member("west", &leader, &token, serde_json::json!({})),
    );
    for name in ["east", "west"] {
        fleet::wait_ready(&leader.admin, name).await;
    }
    let (lk, wk) = (
        leader.cluster.kubeconfig().to_path_buf(),
        west.cluster.kubeconfig().to_path_buf(),
    );

    // West's agent is gone: a plain leave waits for it; --force finishes by hand.
    west.kill_agent();
    let left = ok(&tether(&wk, &["leave", "--clusterset", SET, "--force"]).await);
    assert!(
        left.contains("without telling the leader") && left.contains("tether member remove west"),
        "{left}"
    );
    let sets = Api::<ClusterSet>::namespaced(west.admin.clone(), HOME)
        .list(&ListParams::default())
        .await
        .expect("sets");
    assert!(sets.items.is_empty(), "no ClusterSet left in west");
    let secrets = Api::<Secret>::namespaced(west.admin.clone(), HOME);
    for s in ["tether-agent-key", "tether-agent-credential", "tether-join-token"] {
        assert!(secrets.get_opt(s).await.expect("get").is_none(), "{s} removed");
    }
    assert!(
        Api::<ClusterProperty>::all(west.admin.clone())
            .get_opt("clusterset.k8s.io")
            .await
            .expect("get")
            .is_none(),
        "the clusterset.k8s.io property removed"
    );

    // The leader controller is gone: destroy --force does its part.
    leader.controller.kill();
    let out = ok(&tether(&lk, &["destroy", "--clusterset", SET, "--force", "-y"]).await);
    assert!(out.contains("destroyed"), "{out}");
    assert!(
        Api::<ClusterSet>::namespaced(leader.admin.clone(), HOME)
            .get_opt(SET)
            .await
            .expect("get")
            .is_none()
    );
    let members = Api::<ManagedCluster>::all(leader.admin.clone())
        .list(&ListParams::default())
        .await
        .expect("members");
    assert!(
        members.items.is_empty(),
        "{:?}",
        members
            .items
            .iter()
            .map(|m| m.metadata.name.clone())
            .collect::<Vec<_>>()
    );
    eventually("the member namespaces go", Duration::from_secs(60), || async {
        let left = Api::<Namespace>::all(leader.admin.clone())
            .list(&ListParams::default().labels("app.kubernetes.io/managed-by=tether-leader"))
            .await
            .map_err(|e| e.to_string())?;
        if left.items.is_empty() {
            Ok(())
        } else {
            Err(format!("{} left", left.items.len()))
        }
    })
    .await;
    east.kill_agent();
}

/// `tether member remove|list|unban` as an admin types them: a removed member whose agent still
/// holds a valid join token registers again (a new namespace); removed with `--ban` it is Denied
/// `Banned` (listed, naming the unban); after `unban` it registers again by itself.
#[tokio::test]
async fn member_remove_ban_list_and_unban() {
    use tether_api::registration::{RegistrationReason, RegistrationResult};
    let leader = LeaderSide::named("cli-member")
        .policy(policy("2s", "6s"))
        .start()
        .await;
    let token = tether_e2e::sim::join_token(&leader.admin).await;
    let mut east = fleet::member("east", &leader, &token, serde_json::json!({})).await;
    let ready = |leader: &fleet::LeaderSide| {
        let admin = leader.admin.clone();
        async move {
            fleet::wait_ready(&admin, "east").await;
            fleet::managed(&admin, "east").await.expect("east")
        }
    };
    let first = ready(&leader).await;
    let id = fleet::kube_system_uid(&east).await;
    let lk = leader.cluster.kubeconfig().to_path_buf();

    let out = ok(&tether(&lk, &["member", "remove", "east"]).await);
    assert!(
        out.contains("removed from ClusterSet prod") && out.contains("--ban"),
        "{out}"
    );
    let again = ready(&leader).await;
    assert_ne!(
        again.metadata.uid, first.metadata.uid,
        "removed, then registered again with its token"
    );

    let out = ok(&tether(&lk, &["member", "remove", "east", "--ban"]).await);
    assert!(
        out.contains("banned") && out.contains(&format!("tether member unban {id}")),
        "{out}"
    );
    assert!(
        out.contains("join token") && out.contains("tether token create --clusterset prod"),
        "a ban offers the join token's rotation: {out}"
    );
    eventually(
        "east's new request is Denied: Banned",
        Duration::from_secs(60),
        || async {
            let denied =
                Api::<tether_api::ClusterRegistrationRequest>::namespaced(leader.admin.clone(), HOME)
                    .list(&ListParams::default())
                    .await
                    .map_err(|e| e.to_string())?
                    .items
                    .into_iter()
                    .any(|r| {
                        r.spec.cluster_id == id
                            && r.status.as_ref().is_some_and(|s| {
                                s.result == RegistrationResult::Denied
                                    && s.reason == RegistrationReason::Banned
                            })
                    });
            if denied {
                Ok(())
            } else {
                Err("not yet".to_string())
            }
        },
    )
    .await;
    let listed = ok(&tether(&lk, &["member", "list"]).await);
    assert!(
        listed.contains(&id) && listed.contains("Banned") && listed.contains("tether member unban"),
        "{listed}"
    );
    assert!(
        fleet::managed(&leader.admin, "east").await.is_err(),
        "banned: not a member"
    );

    let out = ok(&tether(&lk, &["member", "unban", &id]).await);
    assert!(out.contains("may register"), "{out}");
    let back = ready(&leader).await;
    assert_ne!(back.metadata.uid, again.metadata.uid);
    let listed = ok(&tether(&lk, &["member", "list", "-o", "json"]).await);
    assert!(
        !listed.contains("\"result\": \"Banned\""),
        "the ban is lifted: {listed}"
    );
    east.kill_agent();
}
