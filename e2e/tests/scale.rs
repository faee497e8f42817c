//! Smoke run of the scale benchmark (`make bench`) with N = 50, so that the simulator and the
//! harness keep working. It checks what the benchmark is for, not how fast it goes: every
//! simulated member joins through the agent's code and becomes Ready, each heartbeat costs
//! exactly one announce write, nothing else writes at steady state, a silent member is not
//! marked lost before its grace period, and join/leave show in the ClusterSet status. The members
//! are also published as ClusterProfiles: none is written at steady state nor by a new leader,
//! and a member's change costs one write.

use std::time::Duration;
use tether_api::clusterset::LeaderSpec;
use tether_api::clusterset::MemberCounts;
use tether_e2e::fleet::{LeaderSide, duration, policy};

use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::Api;
use tether_api::ClusterRegistrationRequest;
use tether_e2e::scale::{Settings, run};
use tether_e2e::sim::{HOME, join_token, wait_counts};
use tether_sim::Fleet;
use tether_testkit::controller::binary;
use tether_testkit::eventually;

/// The directory of the workspace's `tether-controller`.
fn workspace_bins() -> std::path::PathBuf {
    binary("tether-controller")
        .expect("tether-controller")
        .parent()
        .expect("its directory")
        .to_path_buf()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_benchmark_smoke_run() {
    let o = run(&Settings {
        members: 50,
        concurrency: 50,
        interval: Some(2),
        steady: Duration::from_secs(20),
        limit_window: Duration::from_secs(5),
        failover_window: Duration::from_secs(10),
        failovers: 2,
        // The workspace's own build, named as a benchmark comparing builds names its directories.
        failover_bins: vec![workspace_bins()],
        credential_ttl: None,
        cluster_profiles: true,
    })
    .await;
    let table = o.table();
    println!("{table}");

    assert_eq!(o.approved.len(), 50, "every request was seen Approved");
    assert_eq!(
        o.usable.len(),
        50,
        "every member heartbeat with its own credential"
    );
    assert!(o.api_limit > 0.0, "the API server limit was measured");
    // 50 members every 2 s ± 10% is 25 heartbeats per second.
    assert!(
        (20.0..=30.0).contains(&o.heartbeats),
        "heartbeats/s {}\n{table}",
        o.heartbeats
    );
    assert!(
        (0.95..=1.05).contains(&o.writes_per_heartbeat()),
        "one announce write per heartbeat\n{table}"
    );
    for kind in ["ManagedCluster status", "ClusterSet status"] {
        assert_eq!(
            o.writes.get(kind).copied(),
            Some(0.0),
            "no {kind} write without a change\n{table}"
        );
    }
    // NB: a look that ran before the cache showed the last one's status write declared members
    // Ready twice (up to 14 of 50; the leader's written.rs).
    assert_eq!(
        o.declared.0,
        o.members + o.declared.1,
        "each member declared Ready once (MemberReady, MemberLost)\n{table}"
    );
    let p = o.profiles.clone().expect("ClusterProfile writes counted");
    assert_eq!(p.steady, 0.0, "no ClusterProfile write per heartbeat\n{table}");
    // Created with its status (2), then one status write each for the agent's first report
    // (version, capacity) and for its first heartbeat (Joined), which may land together.
    assert!(
        (2.0..=4.0).contains(&p.per_registration),
        "a profile created and its status written as the member comes up\n{table}"
    );
    assert_eq!(
        p.silent_member, 1.0,
        "one status write when a member goes Unknown\n{table}"
    );
    assert!(
        (3.0..=6.0).contains(&p.join_and_leave),
        "a joining member's profile written, then deleted as it leaves\n{table}"
    );
    assert_eq!(p.failover, 0.0, "a new leader rewrites no profile\n{table}");
    assert_eq!(o.heartbeat_failures, 0, "{table}");
    assert!(
        o.detection >= Duration::from_secs(o.grace),
        "a silent member is not marked lost before its grace period\n{table}"
    );
    assert!(o.leader_rss > 0.0 && o.leader_peak_rss >= o.leader_rss, "{table}");
    assert_eq!(
        o.failovers.len(),
        2,
        "two failovers, one after the other\n{table}"
    );
    for f in &o.failovers {
        assert!(f.peak_rss > 0.0 && f.ready < Duration::from_secs(10), "{table}");
        assert_eq!(
            f.bin,
            Some(workspace_bins()),
            "each new leader ran the named build\n{table}"
        );
        assert_eq!(
            f.writes.get("ManagedCluster status").copied(),
            Some(0.0),
            "a new leader rewrites no member status\n{table}"
        );
    }
    assert!(
        o.steady_cpu.contains_key("tether leader") && o.steady_cpu.contains_key("kube-apiserver"),
        "{table}"
    );
}

/// The `tether-sim` binary against a leader process: a wrong pin sends nothing and says so;
/// then five members join, heartbeat and leave again with `--leave`.
#[tokio::test]
async fn tether_sim_binary_joins_heartbeats_and_leaves() {
    let leader = LeaderSide::named("sim-binary")
        .policy(policy("2s", "8s"))
        .start()
        .await;
    let token = join_token(&leader.admin).await;
    // The leader publishes its CA for anonymous discovery shortly after it starts.
    let anonymous = leader.cluster.anonymous_client().expect("anonymous client");
    eventually(
        "cluster-info readable anonymously",
        Duration::from_secs(30),
        || async {
            Api::<ConfigMap>::namespaced(anonymous.clone(), "kube-public")
                .get("cluster-info")
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        },
    )
    .await;
    let sim = |pin: &str, extra: &[&str]| {
        let mut cmd = std::process::Command::new(binary("tether-sim").expect("tether-sim binary"));
        cmd.args(["--leader-url", leader.cluster.url(), "--ca-cert-hash", pin])
            .args(["--members", "5", "--prefix", "bin"])
            .args(extra)
            .env("TETHER_JOIN_TOKEN", token.token());
        cmd
    };

    let wrong = format!("sha256:{}", "0".repeat(64));
    let out = sim(&wrong, &[]).output().expect("run tether-sim");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(&wrong), "names the pin it expected: {stderr}");
    let requests = Api::<ClusterRegistrationRequest>::namespaced(leader.admin.clone(), HOME)
        .list(&Default::default())
        .await
        .expect("list requests");
    assert!(requests.items.is_empty(), "a wrong pin sends no request");

    let child = sim(leader.cluster.ca_cert_hash(), &["--duration", "6s", "--leave"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start tether-sim");
    wait_counts(
        &leader.admin,
        MemberCounts {
            total: 5,
            ready: 5,
            ..MemberCounts::default()
        },
        Duration::from_secs(60),
    )
    .await;
    let out = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .expect("join")
        .expect("tether-sim output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("registered 5 members"), "{stdout}");
    assert!(stdout.contains("left: 5 members, 0 failed"), "{stdout}");
    let accepted: u64 = stdout
        .split("heartbeats: ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .expect("heartbeat count");
    // Five members, one beat at join, then one every 2 s ± 10% for 6 s.
    assert!(accepted >= 10, "{stdout}");
    wait_counts(&leader.admin, MemberCounts::default(), Duration::from_secs(60)).await;
}

/// A simulated member renews its credential with the agent's code (one TokenRequest, then every
/// request on the new token), and a renewal the leader refuses is counted as failed.
#[tokio::test]
async fn a_simulated_member_renews_its_credential_with_the_agents_code() {
    let leader = LeaderSide::named("sim-renewal")
        .policy(LeaderSpec {
            credential_ttl: duration("10m"),
            ..policy("2s", "8s")
        })
        .start()
        .await;
    let token = join_token(&leader.admin).await;
    let join = tether_e2e::scale::sim_join(&leader, &token);
    let sim = eventually("the leader's CA published", Duration::from_secs(30), || async {
        Fleet::connect(join.clone()).await.map_err(|e| e.to_string())
    })
    .await;
    let (mut member, _) = sim.join("renewer").await.expect("member joins");
    let first: Timestamp = member.credential_expiry().parse().expect("expiry");
    let now = Timestamp::now();
    assert!(
        first > now + SignedDuration::from_secs(540) && first <= now + SignedDuration::from_secs(610),
        "the credential lives 10 minutes: {first}"
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    member.renew().await.expect("renewal");
    let renewed: Timestamp = member.credential_expiry().parse().expect("expiry");
    assert!(renewed > first, "a new credential: {first} → {renewed}");
    assert_eq!((sim.stats.renewals(), sim.stats.renewal_failures()), (1, 0));
    member
        .beat()
        .await
        .expect("a heartbeat on the renewed credential");

    Api::<ServiceAccount>::namespaced(leader.admin.clone(), &member.namespace)
        .delete(member.service_account(), &Default::default())
        .await
        .expect("delete the member's ServiceAccount");
    let refused = member
        .renew()
        .await
        .expect_err("no renewal without the ServiceAccount");
    assert!(refused.to_string().contains("renew credential"), "{refused}");
    assert_eq!((sim.stats.renewals(), sim.stats.renewal_failures()), (1, 1));
}
