//! The attach pace at a failover, on a real control plane: the liveness benchmark's harness with
//! 20 members simulated through the agent's own code, each holding a real tunnel through the
//! leader's kube-apiserver, and a standby replica pacing attaches at one every 2 s (the first
//! replica at the default, so that the members join quickly).
//!
//! The serving replica is killed for a standby. The fleet redials at once (within ~22 s of the
//! standby serving, unpaced), so the standby must answer most of them `503` with a turn in
//! `Retry-After`, through the API server's aggregator, and admit them one per slot: every
//! tunnel is back no sooner than the pace allows, and no member is marked Unknown while it
//! waits for its turn (the leader's grace follows a fleet that keeps coming back).
//!
//! This binary has its own `main` (libtest-mimic): the leader's proxy listens on the lab bridge.

use std::process::ExitCode;
use std::time::Duration;

use tether_e2e::liveness::{Settings, report, run};

fn main() -> ExitCode {
    tether_e2e::lab_main(
        "the attach-pace test",
        "a_failover_reattaches_the_fleet_at_the_leaders_pace_and_blames_no_member_waiting_its_turn",
        pace,
    )
}

/// Members, and agents killed and as many frozen before the failover (not live after).
const MEMBERS: usize = 20;
const PROBES: usize = 1;
/// Attaches a second the leader's replicas allow.
const RATE: f64 = 0.5;

async fn pace() {
    let o = run(&Settings {
        members: MEMBERS,
        concurrency: MEMBERS,
        probes: PROBES,
        steady: Duration::from_secs(5),
        failover_window: Duration::from_secs(75),
        attach_at_join: true,
        attach_rate: [None, Some(RATE)],
    })
    .await;
    let table = report(&o);
    println!("{table}");
    let live = MEMBERS - 2 * PROBES;
    let (Some(back), Some(first)) = (o.reattach, o.first_reattach) else {
        panic!("every tunnel back within the window\n{table}");
    };
    // NB: one admission per 2 s from the standby's first on (its burst is one): the last of
    // `live` is admitted no sooner than (live - 1) slots after the first. Both are read once a
    // second, hence the 2 s. Unpaced, the fleet is back within ~22 s of the standby serving.
    let spread = back - first;
    let slowest = Duration::from_secs_f64((live - 1) as f64 / RATE - 2.0);
    assert!(
        spread >= slowest,
        "{live} tunnels back {spread:?} after the first, faster than the pace allows ({slowest:?})\n{table}"
    );
    assert!(
        o.paced >= (live / 2) as f64,
        "most of the fleet asked before its turn and was told it: {} turns\n{table}",
        o.paced
    );
    assert_eq!(
        o.marked_unknown, 0,
        "no member waiting for its turn is marked\n{table}"
    );
}
