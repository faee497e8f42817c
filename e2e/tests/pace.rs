//! The attach pace at a failover, on a real control plane: the liveness benchmark's harness with
//! 8 members simulated through the agent's own code, each holding a real tunnel through the
//! leader's kube-apiserver, and a standby replica pacing attaches at one every 20 s (the first
//! replica at the default, so that the members join quickly).
//!
//! The serving replica is killed for a standby. The fleet redials at once (within ~22 s of the
//! standby serving, unpaced), so the standby must answer most of them `503` with a turn in
//! `Retry-After`, through the API server's aggregator, and admit them one per slot: every
//! tunnel is back no sooner than the pace allows, and no member waiting for its turn is
//! blamed for it: none is marked Unknown, and none is even judged by its heartbeat meanwhile
//! (its Ready condition does not change at all). The slot is longer than the quiet that ends a
//! grace between returns (15 s) and the last turn past the term's fixed grace (45 s), so the
//! grace must follow the turns the standby gave (`health/tunnels.rs`).
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
const MEMBERS: usize = 8;
const PROBES: usize = 1;
/// Attaches a second the standby allows.
const RATE: f64 = 0.05;

async fn pace() {
    let o = run(&Settings {
        members: MEMBERS,
        concurrency: MEMBERS,
        probes: PROBES,
        steady: Duration::from_secs(5),
        failover_window: Duration::from_secs(150),
        attach_at_join: true,
        attach_rate: [None, Some(RATE)],
        // NB: an HA control plane, its members spread over both: the take-over and the pace
        // hold when the agents reach the leader through different kube-apiservers (and
        // `make bench-liveness ARGS="--api-servers 2"`, which the 10,000 figures need here,
        // is kept working).
        api_servers: 2,
        // NB: the leader deletes the approved requests of members that heartbeat (and
        // `make bench-liveness ARGS="--approved-request-retention S"` is kept working).
        approved_retention: Some(Duration::from_secs(20)),
    })
    .await;
    let table = report(&o);
    println!("{table}");
    assert!(
        o.per_member_with_request.is_some(),
        "every approved request deleted\n{table}"
    );
    let live = MEMBERS - 2 * PROBES;
    let f = &o.failover;
    let (Some(back), Some(first)) = (f.reattach, f.first) else {
        panic!("every tunnel back within the window\n{table}");
    };
    // NB: one admission per 20 s from the standby's first on (its burst is one): the last of
    // `live` is admitted no sooner than (live - 1) slots after the first. Both are read once a
    // second, hence the 2 s. Unpaced, the fleet is back within ~22 s of the standby serving.
    let spread = back - first;
    let slowest = Duration::from_secs_f64((live - 1) as f64 / RATE - 2.0);
    assert!(
        spread >= slowest,
        "{live} tunnels back {spread:?} after the first, faster than the pace allows ({slowest:?})\n{table}"
    );
    assert!(
        f.paced >= (live / 2) as f64,
        "most of the fleet asked before its turn and was told it: {} turns\n{table}",
        f.paced
    );
    assert_eq!(f.marked, 0, "no member waiting for its turn is marked\n{table}");
    assert_eq!(
        f.moved, 0,
        "no member waiting for its turn is judged by its heartbeat meanwhile\n{table}"
    );
}
