//! The node tier's killed agent pod: lost within the detection time, back when kubelet restarts it.

use super::*;

/// Member `name`'s Ready condition at the leader (status, reason), if it has one.
async fn ready_of(leader: &TestCluster, name: &str) -> Result<(String, String), String> {
    let mcs: Api<tether_api::ManagedCluster> = Api::all(leader.client().expect("client"));
    let list = mcs.list(&Default::default()).await.map_err(|e| e.to_string())?;
    let mc = list
        .items
        .into_iter()
        .find(|m| m.name_any() == name)
        .ok_or("no ManagedCluster")?;
    let status = mc.status.unwrap_or_default();
    let c = tether_api::conditions::find(&status.conditions, tether_api::conditions::ConditionType::Ready)
        .ok_or("no Ready condition")?;
    Ok((c.status.clone(), c.reason.clone()))
}

async fn wait_ready_of(leader: &TestCluster, name: &str, want: (&str, &str), within: Duration) -> Duration {
    let t = Instant::now();
    eventually(
        &format!("{name}: Ready={} ({})", want.0, want.1),
        within,
        || async {
            match ready_of(leader, name).await? {
                (s, r) if s == want.0 && r == want.1 => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    t.elapsed()
}

/// East's agent pod killed: its container sent `SIGKILL` while east's kubelet is held, so that
/// nothing brings it back (an agent crashed on a node that cannot restart it). The leader sees the
/// tunnel close and marks east `Ready=Unknown` (`TunnelLost`) within the set's detection time.
/// Once kubelet goes on, it restarts the container and east is Ready on its tunnel again, with
/// its identity (the failover step after this one checks that nobody registered again).
pub(super) async fn killed_agent_pod(start: Instant, leader: &TestCluster, east: &TestCluster) {
    /// What the leader may take beyond the detection time to see the close and write the status,
    /// and this test to read it.
    const SLACK: Duration = Duration::from_secs(5);
    let detection = Api::<ClusterSet>::namespaced(leader.client().expect("client"), NAMESPACE)
        .get("prod")
        .await
        .expect("ClusterSet prod")
        .spec
        .leader
        .unwrap_or_default()
        .tunnel_detection();
    step(
        start,
        &format!(
            "east's agent pod killed (SIGKILL, its kubelet held): Unknown (TunnelLost) within the detection time ({detection:?})"
        ),
    );
    // NB: member access just replaced east's agent pod (a helm upgrade): let it settle.
    wait_ready_of(leader, "east", ("True", "TunnelAlive"), Duration::from_secs(60)).await;
    let pods = chart_pods(east, "tether-agent").await;
    let [(pod, _, before)] = pods.as_slice() else {
        panic!(
            "one agent pod in east: {:?}",
            pods.iter().map(|p| &p.0).collect::<Vec<_>>()
        );
    };
    let container = |p: &Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|c| c.first())
            .map(|c| (c.container_id.clone().unwrap_or_default(), c.restart_count))
            .unwrap_or_default()
    };
    let (id, restarts) = container(before);
    let id = id
        .strip_prefix("containerd://")
        .expect("a containerd container")
        .to_string();
    let node = east.nodes().first().expect("east's node");
    node.hold_kubelet(true).expect("hold east's kubelet");
    let killed = node
        .ctr()
        .args(["tasks", "kill", "--signal", "SIGKILL", &id])
        .output()
        .expect("ctr");
    assert!(killed.status.success(), "ctr tasks kill {id}: {}", text(&killed));
    let seen = wait_ready_of(
        leader,
        "east",
        ("Unknown", "TunnelLost"),
        detection + Duration::from_secs(60),
    )
    .await;
    step(
        start,
        &format!("  east Unknown (TunnelLost) {seen:.1?} after the kill"),
    );
    assert!(
        seen <= detection + SLACK,
        "east seen lost after {seen:?}, detection {detection:?}"
    );

    step(
        start,
        "east's kubelet goes on: the agent container restarts and east is Ready on its tunnel again",
    );
    node.hold_kubelet(false).expect("let east's kubelet go on");
    let back = wait_ready_of(leader, "east", ("True", "TunnelAlive"), Duration::from_secs(120)).await;
    step(
        start,
        &format!("  east Ready (TunnelAlive) {back:.1?} after kubelet went on"),
    );
    let pods = chart_pods(east, "tether-agent").await;
    let after: Vec<(String, i32)> = pods
        .iter()
        .map(|(name, _, p)| (name.clone(), container(p).1))
        .collect();
    assert_eq!(
        after,
        vec![(pod.clone(), restarts + 1)],
        "the same pod, its container restarted once"
    );
}
