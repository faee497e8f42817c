//! The real `tether-controller leader` binary, two replicas, each with a token of the leader's
//! ServiceAccount (exactly `config/rbac/leader.yaml`): one leads through the Lease, a crash hands
//! over to the other with nothing lost or duplicated, SIGTERM stops cleanly and frees the Lease,
//! and the admin port serves probes and metrics.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ListParams};
use tether_api::ManagedCluster;
use tether_api::clusterset::{LeaderSpec, MemberCounts};
use tether_e2e::sim::{self, HOME, join, wait_counts};
use tether_testkit::{Controller, eventually, token_kubeconfig};

async fn leads(c: &Controller) -> Result<bool, String> {
    let (code, body) = c.admin_get("/metrics").await.map_err(|e| e.to_string())?;
    if code != 200 {
        return Err(format!("/metrics answered {code}"));
    }
    Ok(body.lines().any(|l| l == "tether_leader_is_leader 1"))
}

async fn holder(lease: &Api<Lease>) -> Option<String> {
    lease.get("tether-leader").await.ok()?.spec?.holder_identity
}

#[tokio::test]
async fn two_replicas_elect_one_leader_and_the_other_takes_over_after_a_crash() {
    let (cluster, admin) = sim::leader_cluster("leader-ha", &LeaderSpec::default()).await;
    let token = sim::leader_token(&admin).await;
    let kubeconfig = token_kubeconfig(&cluster, "tether-leader", &token).expect("kubeconfig");
    // NB: `--member-metrics`: both replicas export a series per member from their caches.
    let args = [
        "leader",
        "--lease-duration=6",
        "--lease-namespace=tether-system",
        "--member-metrics",
    ];
    let mut replicas = [
        Controller::start(&cluster, "leader-a", &kubeconfig, &args).expect("replica a"),
        Controller::start(&cluster, "leader-b", &kubeconfig, &args).expect("replica b"),
    ];

    let first = eventually(
        "both replicas ready, exactly one leading",
        Duration::from_secs(30),
        || async {
            let mut leading = vec![];
            for (i, r) in replicas.iter().enumerate() {
                let (code, _) = r.admin_get("/readyz").await.map_err(|e| e.to_string())?;
                if code != 200 {
                    return Err(format!("replica {i} /readyz {code}"));
                }
                if leads(r).await? {
                    leading.push(i);
                }
            }
            match leading.as_slice() {
                [one] => Ok(*one),
                other => Err(format!("leaders: {other:?}")),
            }
        },
    )
    .await;
    let (code, _) = replicas[first].admin_get("/livez").await.expect("livez");
    assert_eq!(code, 200);
    let leases = Api::<Lease>::namespaced(admin.clone(), HOME);
    let names = ["leader-a", "leader-b"];
    assert_eq!(holder(&leases).await.as_deref(), Some(names[first]));

    let east = join(&cluster, &admin, "east", "id-east").await;
    wait_counts(
        &admin,
        MemberCounts {
            total: 1,
            not_ready: 1,
            ..MemberCounts::default()
        },
        Duration::from_secs(15),
    )
    .await;
    // Approved, no heartbeat yet: east's series is 0 on both replicas (the standby's cache too).
    for r in &replicas {
        eventually("east's member_ready series", Duration::from_secs(15), || async {
            let (_, text) = r.admin_get("/metrics").await.map_err(|e| e.to_string())?;
            let series = text
                .lines()
                .find(|l| l.starts_with("tether_leader_member_ready{") && l.contains("member=\"east\""))
                .map(str::to_string);
            match series {
                Some(l) if l.contains("clusterset=\"prod\"") && l.ends_with("} 0") => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
    }

    // Crash the leader; the other replica takes over within the Lease duration.
    replicas[first].kill();
    let crashed = Instant::now();
    let second = 1 - first;
    eventually("the standby to lead", Duration::from_secs(30), || async {
        if leads(&replicas[second]).await? {
            Ok(())
        } else {
            Err("standby".to_string())
        }
    })
    .await;
    eprintln!(
        "takeover {:?} after the leader crashed (lease duration 6s)",
        crashed.elapsed()
    );
    assert_eq!(holder(&leases).await.as_deref(), Some(names[second]));

    // The new leader serves: a new member joins, the old one is intact, nothing is duplicated.
    let west = join(&cluster, &admin, "west", "id-west").await;
    east.heartbeat().await.expect("east's credential still works");
    west.heartbeat().await.expect("west's credential works");
    wait_counts(
        &admin,
        MemberCounts {
            total: 2,
            ready: 2,
            ..MemberCounts::default()
        },
        Duration::from_secs(15),
    )
    .await;
    let namespaces = Api::<Namespace>::all(admin.clone())
        .list(&ListParams::default().labels(tether_api::labels::CLUSTER_SET))
        .await
        .expect("namespaces");
    assert_eq!(
        sim::names(&namespaces.items),
        vec![tether_e2e::sim::ns_of("east"), tether_e2e::sim::ns_of("west")]
    );
    let mcs = Api::<ManagedCluster>::all(admin.clone())
        .list(&ListParams::default())
        .await
        .expect("mcls");
    assert_eq!(mcs.items.len(), 2, "one ManagedCluster per member");

    // A third replica joins as standby. SIGTERM of the leader: a clean exit that releases the
    // Lease, and the standby, watching the Lease, takes it at once instead of at expiry.
    let standby = Controller::start(&cluster, "leader-c", &kubeconfig, &args).expect("replica c");
    eventually(
        "replica c ready as a standby",
        Duration::from_secs(30),
        || async {
            let (code, _) = standby.admin_get("/readyz").await.map_err(|e| e.to_string())?;
            match (code, leads(&standby).await?) {
                (200, false) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    let status = replicas[second].terminate();
    assert_eq!(
        status.as_deref(),
        Some("exit status: 0"),
        "{}",
        replicas[second].log_tail(20)
    );
    let released = Instant::now();
    eventually("replica c to lead", Duration::from_secs(30), || async {
        if leads(&standby).await? {
            Ok(())
        } else {
            Err("standby".to_string())
        }
    })
    .await;
    eprintln!(
        "takeover {:?} after the leader released the Lease",
        released.elapsed()
    );
    assert_eq!(holder(&leases).await.as_deref(), Some("leader-c"));
    assert!(
        standby
            .log()
            .contains("The leader released the Lease; taking it over"),
        "the standby saw the release rather than waiting for expiry:\n{}",
        standby.log_tail(30)
    );
    let mut replicas: Vec<Controller> = replicas.into_iter().chain([standby]).collect();
    let status = replicas[2].terminate();
    assert_eq!(
        status.as_deref(),
        Some("exit status: 0"),
        "{}",
        replicas[2].log_tail(20)
    );
    eventually("the Lease released", Duration::from_secs(10), || async {
        match holder(&leases).await {
            None => Ok(()),
            Some(h) if h.is_empty() => Ok(()),
            Some(h) => Err(h),
        }
    })
    .await;

    // The leader's RBAC was enough for all of this.
    for r in &replicas {
        let log = r.log();
        assert!(
            !log.contains("Forbidden") && !log.contains("forbidden"),
            "RBAC denial in:\n{log}"
        );
    }
}
