//! The idle tunnel's tests: both ends on in-memory pipes with a paused clock, and one on a
//! real socket and clock.

use super::*;
use std::sync::Arc;
use tokio::io::duplex;

const PINGS: Duration = Duration::from_secs(5);
const TIMEOUT: Duration = Duration::from_secs(10);

#[tokio::test(start_paused = true)]
async fn both_ends_stay_up_on_pings_alone_and_hand_over_a_clean_stream() {
    let (leader_io, agent_io) = duplex(64);
    let start = Arc::new(Notify::new());
    let go = start.clone();
    let leader = tokio::spawn(async move { lead(leader_io, PINGS, TIMEOUT, &go).await });
    let agent = tokio::spawn(follow(agent_io, Duration::from_secs(3), TIMEOUT));
    // An hour of pings both ways: neither end gives up.
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert!(!leader.is_finished() && !agent.is_finished());
    start.notify_one();
    let mut l = leader.await.expect("leader task").expect("leader hands over");
    let mut a = agent.await.expect("agent task").expect("agent hands over");
    // What follows is the next protocol's, byte for byte, both ways.
    l.write_all(b"PRI * HTTP/2.0").await.expect("write");
    a.write_all(b"\0\0\x12\x04").await.expect("write");
    let mut got = [0u8; 14];
    a.read_exact(&mut got).await.expect("read");
    assert_eq!(&got, b"PRI * HTTP/2.0");
    let mut got = [0u8; 4];
    l.read_exact(&mut got).await.expect("read");
    assert_eq!(&got, b"\0\0\x12\x04");
}

#[tokio::test(start_paused = true)]
async fn an_agent_on_the_shortest_interval_is_no_flood_to_a_leader_on_the_longest() {
    // The set's interval went from 1 s to 1 min: the agent keeps its old one until it reads
    // the new one; the leader must not cut it off meanwhile.
    let (leader_io, agent_io) = duplex(64);
    let leader = tokio::spawn(async move {
        let start = Notify::new();
        lead(
            leader_io,
            Duration::from_secs(60),
            Duration::from_secs(120),
            &start,
        )
        .await
    });
    let agent = tokio::spawn(follow(agent_io, Duration::from_secs(1), Duration::from_secs(2)));
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert!(!leader.is_finished() && !agent.is_finished());
}

/// Reads what is there within `within`, and counts PINGs and PONGs in it.
async fn drain(io: &mut tokio::io::DuplexStream, within: Duration) -> (usize, usize) {
    let (mut pings, mut pongs) = (0, 0);
    let mut buf = [0u8; 64];
    while let Ok(Ok(n)) = tokio::time::timeout(within, io.read(&mut buf)).await {
        assert!(n > 0, "the agent closed the tunnel");
        pings += buf[..n].iter().filter(|b| **b == PING).count();
        pongs += buf[..n].iter().filter(|b| **b == PONG).count();
    }
    (pings, pongs)
}

#[tokio::test(start_paused = true)]
async fn an_agent_the_leader_pings_sends_none_of_its_own_until_the_leader_stops() {
    let (mut leader, agent_io) = duplex(64);
    let agent = tokio::spawn(follow(agent_io, PINGS, TIMEOUT));
    // An hour of the leader pinging every interval: every ping answered, none sent back.
    let (mut pings, mut pongs) = (0, 0);
    for _ in 0..720 {
        leader.write_all(&[PING]).await.expect("write");
        let (i, o) = drain(&mut leader, PINGS).await;
        (pings, pongs) = (pings + i, pongs + o);
    }
    assert_eq!((pings, pongs), (0, 720));
    // The leader stops pinging but answers: the agent pings again, and stays up.
    let mut answered = 0;
    for _ in 0..10 {
        let (i, _) = drain(&mut leader, PINGS).await;
        for _ in 0..i {
            leader.write_all(&[PONG]).await.expect("write");
        }
        answered += i;
    }
    assert!(answered >= 4, "the agent pinged {answered} times in 10 intervals");
    assert!(!agent.is_finished());
    // The leader falls silent: given up within an interval and the timeout (it did not ping
    // lately, so the agent's next ping is due within an interval).
    let t0 = Instant::now();
    let err = agent.await.expect("task").expect_err("silent");
    assert!(err.is_timeout(), "{err}");
    assert!(t0.elapsed() <= PINGS + TIMEOUT, "{:?}", t0.elapsed());
}

#[test]
fn an_answer_that_came_while_this_end_ran_late_wins_over_the_deadline_that_passed_meanwhile() {
    // NB: a real socket and a real clock, so that the answer and the passed deadline reach
    // the loop in the same turn of the runtime's driver, as they do after a stall. Unbiased,
    // the loop would take the deadline in half the rounds.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (interval, timeout) = (Duration::from_millis(50), Duration::from_millis(200));
    for round in 0..10 {
        let (ours, mut theirs) = std::os::unix::net::UnixStream::pair().expect("socket pair");
        // The agent answers each ping 20 ms later, and confirms the start.
        let agent = std::thread::spawn(move || {
            use std::io::{Read, Write};
            let mut b = [0u8; 1];
            while theirs.read_exact(&mut b).is_ok() {
                std::thread::sleep(Duration::from_millis(20));
                let answer = if b[0] == START { STARTED } else { PONG };
                if theirs.write_all(&[answer]).is_err() || answer == STARTED {
                    break;
                }
            }
        });
        let ended = rt.block_on(async {
            ours.set_nonblocking(true).expect("non-blocking");
            let io = tokio::net::UnixStream::from_std(ours).expect("socket");
            let start = Notify::new();
            let stall = async {
                // Just after the first ping, this runtime's only thread is taken until
                // well past the ping's deadline; the answer arrives meanwhile.
                tokio::time::sleep(interval + Duration::from_millis(10)).await;
                std::thread::sleep(timeout + Duration::from_millis(100));
                tokio::time::sleep(Duration::from_millis(20)).await;
                start.notify_one();
            };
            let (ended, ()) = tokio::join!(lead(io, interval, timeout, &start), stall);
            ended.map(drop)
        });
        agent.join().expect("agent thread");
        if let Err(e) = ended {
            panic!("round {round}: the leader judged an answered ping: {e}");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_start_asked_before_the_loop_runs_is_not_lost() {
    let (leader_io, agent_io) = duplex(64);
    let start = Notify::new();
    start.notify_one();
    let agent = tokio::spawn(follow(agent_io, PINGS, TIMEOUT));
    lead(leader_io, PINGS, TIMEOUT, &start).await.expect("started");
    agent.await.expect("task").expect("agent started");
}

#[tokio::test(start_paused = true)]
async fn a_silent_agent_is_given_up_after_interval_plus_timeout() {
    let (leader_io, _frozen) = duplex(64);
    let t0 = Instant::now();
    let err = lead(leader_io, PINGS, TIMEOUT, &Notify::new())
        .await
        .expect_err("silent");
    assert!(err.is_timeout(), "{err}");
    assert!(err.never_heard(), "not a byte came from it");
    assert_eq!(t0.elapsed(), PINGS + TIMEOUT);
}

#[tokio::test(start_paused = true)]
async fn an_agent_heard_once_then_silent_is_silent_and_heard() {
    for byte in [PING, PONG] {
        let (leader_io, mut agent_io) = duplex(64);
        let leader = tokio::spawn(async move { lead(leader_io, PINGS, TIMEOUT, &Notify::new()).await });
        // One byte of the agent's (its ping, or an answer to the leader's first ping), then
        // nothing: the leader still gives it up, but knows the path once carried it.
        if byte == PONG {
            let mut b = [0u8; 1];
            agent_io.read_exact(&mut b).await.expect("the first ping");
        }
        agent_io.write_all(&[byte]).await.expect("write");
        let err = leader.await.expect("task").expect_err("silent");
        assert!(err.is_timeout(), "{byte:#04x}: {err}");
        assert!(!err.never_heard(), "{byte:#04x}: it was heard");
    }
}

#[tokio::test(start_paused = true)]
async fn a_silent_leader_is_given_up_by_the_agent() {
    let (_frozen, agent_io) = duplex(64);
    let err = follow(agent_io, PINGS, TIMEOUT).await.expect_err("silent");
    assert!(err.is_timeout(), "{err}");
}

#[tokio::test(start_paused = true)]
async fn a_leader_frozen_right_after_its_ping_is_given_up_all_the_same() {
    let (mut leader, agent_io) = duplex(64);
    let t0 = Instant::now();
    leader.write_all(&[PING]).await.expect("write");
    let err = follow(agent_io, PINGS, TIMEOUT).await.expect_err("silent");
    assert!(err.is_timeout(), "{err}");
    assert!(
        t0.elapsed() <= PINGS.mul_f64(QUIET_WITHIN + 1.0) + TIMEOUT,
        "{:?}",
        t0.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn an_agent_that_never_confirms_the_start_is_silent() {
    let (leader_io, mut agent_io) = duplex(64);
    let start = Notify::new();
    start.notify_one();
    // Answers pings but ignores START.
    let fake = tokio::spawn(async move {
        let mut b = [0u8; 1];
        while agent_io.read_exact(&mut b).await.is_ok() {}
    });
    let err = lead(leader_io, PINGS, TIMEOUT, &start).await.expect_err("silent");
    assert!(err.is_timeout(), "{err}");
    assert!(err.never_heard(), "{err}");
    fake.abort();
}

#[tokio::test(start_paused = true)]
async fn a_closed_peer_or_a_stray_byte_ends_the_tunnel_at_once() {
    let (leader_io, agent_io) = duplex(64);
    drop(agent_io);
    let err = lead(leader_io, PINGS, TIMEOUT, &Notify::new())
        .await
        .expect_err("closed");
    assert!(matches!(err, Error::Closed), "{err}");
    assert!(!err.is_timeout() && !err.never_heard());

    let (leader_io, mut agent_io) = duplex(64);
    agent_io.write_all(b"G").await.expect("write");
    let err = lead(leader_io, PINGS, TIMEOUT, &Notify::new())
        .await
        .expect_err("stray");
    assert!(matches!(err, Error::Unexpected(b'G')), "{err}");

    // A peer that pings faster than it should is cut off rather than answered, and so is one
    // that streams answers to no ping.
    for byte in [PING, PONG] {
        let (leader_io, mut agent_io) = duplex(64);
        agent_io.write_all(&[byte; 32]).await.expect("write");
        let err = lead(leader_io, PINGS, TIMEOUT, &Notify::new())
            .await
            .expect_err("flood");
        assert!(matches!(err, Error::Flood), "{byte:#04x}: {err}");
    }

    // The agent never takes START from itself: only the leader may ask.
    let (mut leader_io, agent_io) = duplex(64);
    leader_io.write_all(&[STARTED]).await.expect("write");
    let err = follow(agent_io, PINGS, TIMEOUT).await.expect_err("stray");
    assert!(matches!(err, Error::Unexpected(STARTED)), "{err}");
}
