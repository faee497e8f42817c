//! Ensures a tunnel nobody uses costs both ends almost nothing. When both ends say so at attach
//! ([`START_HEADER`]), the tunnel carries one-byte pings and their answers only, until the leader
//! has a first request for the member: then it sends [`START`], the agent answers [`STARTED`],
//! and from the byte after those HTTP/2 runs on the connection as on a tunnel that started with
//! it. Either end pings at its interval with one ping outstanding, and gives the tunnel up when a
//! ping stays unanswered for its timeout: liveness is the same as HTTP/2 PING gives, without the
//! HTTP/2 connection's buffers (about 40 KiB a tunnel at the leader). The agent leaves out its
//! ping in an interval in which the leader's arrived: that ping and its answer already proved
//! the tunnel both ways, so a tunnel carries two one-byte records per interval rather than four
//! (each relayed by kube-apiserver). An end that did not say so (an agent or a leader from before)
//! gets HTTP/2 from the first byte, as before.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::sync::Notify;
use tokio::time::Instant;

/// The attach header by which the agent offers, and the leader's 101 answer confirms, that
/// HTTP/2 starts on the first request instead of at once.
pub const START_HEADER: &str = "tether-tunnel-start";
/// Its one value.
pub const ON_DEMAND: &str = "on-demand";

/// Either end: are you there?
const PING: u8 = 0x01;
/// Either end: yes.
const PONG: u8 = 0x02;
/// Leader: start HTTP/2 now; nothing but HTTP/2 follows from me once you answer.
const START: u8 = 0x03;
/// Agent: started; nothing but HTTP/2 follows from me.
const STARTED: u8 = 0x04;

/// Pings a peer may send in one [`FLOOD_WINDOW`] before the tunnel counts as abused: a peer
/// pings at most once a second (the shortest ping interval a set allows, and the next ping only
/// an interval after the answer), whatever interval either end last read; each ping is a write
/// of ours.
const MAX_PINGS_PER_WINDOW: u32 = 8;
const FLOOD_WINDOW: Duration = Duration::from_secs(1);
/// A quiet end leaves its ping out when the peer's came within this many of its intervals: more
/// than one, so that two ends on the same interval whose pings drift together do not take turns.
const QUIET_WITHIN: f64 = 1.5;

/// Why an idle tunnel ended.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The peer left a ping (or the start) unanswered for this long.
    #[error("the peer answered nothing for {0:?}")]
    Silent(Duration),
    /// The peer closed the connection.
    #[error("the peer closed the tunnel")]
    Closed,
    /// The peer sent a byte an idle tunnel never carries.
    #[error("the peer sent {0:#04x}, which an idle tunnel never carries")]
    Unexpected(u8),
    /// The peer sent more than [`MAX_PINGS_PER_WINDOW`] pings in one [`FLOOD_WINDOW`].
    #[error("the peer sent more than {MAX_PINGS_PER_WINDOW} pings in {FLOOD_WINDOW:?}")]
    Flood,
    /// Reading or writing failed.
    #[error(transparent)]
    Io(std::io::Error),
}

impl Error {
    /// Whether the peer went silent (rather than closing or failing): the member counts as lost.
    pub fn is_timeout(&self) -> bool {
        matches!(self, Error::Silent(_))
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            Error::Closed
        } else {
            Error::Io(e)
        }
    }
}

/// One end's pings: one outstanding at a time, the next one an interval after the answer.
struct Pinger {
    interval: Duration,
    timeout: Duration,
    /// Leaves out a ping when the peer's arrived within [`QUIET_WITHIN`] intervals (the agent's end).
    quiet: bool,
    /// When the peer pinged last.
    heard: Option<Instant>,
    /// When to ping, or (while `waiting`) when the ping counts as unanswered.
    due: Instant,
    waiting: bool,
    /// The peer's pings in the flood window that ends at `window`.
    pinged: u32,
    window: Instant,
}

impl Pinger {
    fn new(interval: Duration, timeout: Duration, quiet: bool) -> Self {
        Self {
            interval,
            timeout,
            quiet,
            heard: None,
            due: Instant::now() + interval,
            waiting: false,
            pinged: 0,
            window: Instant::now() + FLOOD_WINDOW,
        }
    }

    /// The peer pinged: fine unless it is flooding.
    fn pinged(&mut self) -> Result<(), Error> {
        self.count()?;
        self.heard = Some(Instant::now());
        Ok(())
    }

    /// Counts a byte of the peer's that asks for work: an error past the flood limit.
    fn count(&mut self) -> Result<(), Error> {
        let now = Instant::now();
        if now >= self.window {
            self.window = now + FLOOD_WINDOW;
            self.pinged = 0;
        }
        self.pinged += 1;
        if self.pinged > MAX_PINGS_PER_WINDOW {
            return Err(Error::Flood);
        }
        Ok(())
    }

    /// `due` passed: the ping went unanswered (an error), or the next one is to be sent now
    /// (`true`) or left out (`false`: a quiet end that heard the peer's lately).
    /// NB: a quiet end notices a peer gone silent within 2.5 intervals and its timeout.
    fn fire(&mut self) -> Result<bool, Error> {
        if self.waiting {
            return Err(Error::Silent(self.timeout));
        }
        let now = Instant::now();
        if self.quiet
            && self
                .heard
                .is_some_and(|at| now - at <= self.interval.mul_f64(QUIET_WITHIN))
        {
            self.due = now + self.interval;
            return Ok(false);
        }
        self.waiting = true;
        self.due = now + self.timeout;
        Ok(true)
    }

    /// The peer answered; an answer to no ping counts as a ping does toward the flood limit
    /// (reads are served before the timer, so a peer streaming answers must not hold the loop).
    fn answered(&mut self) -> Result<(), Error> {
        if !self.waiting {
            return self.count();
        }
        self.waiting = false;
        self.due = Instant::now() + self.interval;
        Ok(())
    }
}

/// Writes `byte` at once; a peer that takes none within `within` is silent.
async fn put<T: AsyncWrite>(w: &mut WriteHalf<T>, byte: u8, within: Duration) -> Result<(), Error> {
    let write = async {
        w.write_all(&[byte]).await?;
        w.flush().await
    };
    tokio::time::timeout(within, write)
        .await
        .map_err(|_| Error::Silent(within))?
        .map_err(Error::from)
}

async fn get<T: AsyncRead>(r: &mut ReadHalf<T>) -> Result<u8, Error> {
    // NB: one byte per read: cancelled in a select, it consumed nothing or all of its byte.
    r.read_u8().await.map_err(Error::from)
}

/// Keeps an idle tunnel up (pings, answers) until it is to start HTTP/2: the leader's `start`
/// notified, or, at the agent (`start` = `None`), the leader's START read.
async fn idle<T: AsyncRead + AsyncWrite>(
    r: &mut ReadHalf<T>,
    w: &mut WriteHalf<T>,
    pinger: &mut Pinger,
    start: Option<&Notify>,
) -> Result<(), Error> {
    let timeout = pinger.timeout;
    let asked = async {
        match start {
            Some(n) => n.notified().await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(asked);
    loop {
        tokio::select! {
            // NB: what the peer sent is read before the timer is looked at: after this process
            // ran late (its CPU elsewhere), an answer already here and a deadline already passed
            // are both ready, and the answer must win; an unbiased select picks one at random.
            biased;
            b = get(r) => match b? {
                PING => {
                    pinger.pinged()?;
                    put(w, PONG, timeout).await?;
                }
                PONG => pinger.answered()?,
                START if start.is_none() => return Ok(()),
                other => return Err(Error::Unexpected(other)),
            },
            () = &mut asked => return Ok(()),
            () = tokio::time::sleep_until(pinger.due) => {
                if pinger.fire()? {
                    put(w, PING, timeout).await?;
                }
            }
        }
    }
}

/// The leader's end of an idle tunnel: pings every `interval` and fails when one goes unanswered
/// for `timeout`, answers the agent's pings, and once `start` is notified asks the agent to start
/// HTTP/2 and hands the connection back as soon as it has (the next byte is the agent's HTTP/2).
pub async fn lead<T: AsyncRead + AsyncWrite + Unpin>(
    io: T,
    interval: Duration,
    timeout: Duration,
    start: &Notify,
) -> Result<T, Error> {
    let (mut r, mut w) = tokio::io::split(io);
    idle(
        &mut r,
        &mut w,
        &mut Pinger::new(interval, timeout, false),
        Some(start),
    )
    .await?;
    put(&mut w, START, timeout).await?;
    // NB: what the agent sent before it read START is still idle bytes; none is answered now,
    // since everything the agent reads after START is HTTP/2.
    let started = async {
        loop {
            match get(&mut r).await? {
                STARTED => return Ok(()),
                PING | PONG => {}
                other => return Err(Error::Unexpected(other)),
            }
        }
    };
    tokio::time::timeout(timeout, started)
        .await
        .map_err(|_| Error::Silent(timeout))??;
    Ok(r.unsplit(w))
}

/// The agent's end of an idle tunnel: pings every `interval` in which the leader did not, fails
/// when one goes unanswered for `timeout`, answers the leader's pings, and when the leader asks,
/// confirms and hands the connection back to serve HTTP/2 on (the next byte is the leader's
/// HTTP/2).
pub async fn follow<T: AsyncRead + AsyncWrite + Unpin>(
    io: T,
    interval: Duration,
    timeout: Duration,
) -> Result<T, Error> {
    let (mut r, mut w) = tokio::io::split(io);
    idle(&mut r, &mut w, &mut Pinger::new(interval, timeout, true), None).await?;
    put(&mut w, STARTED, timeout).await?;
    Ok(r.unsplit(w))
}

#[cfg(test)]
mod tests {
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
        assert_eq!(t0.elapsed(), PINGS + TIMEOUT);
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
        assert!(!err.is_timeout());

        let (leader_io, mut agent_io) = duplex(64);
        agent_io.write_all(b"G").await.expect("write");
        let err = lead(leader_io, PINGS, TIMEOUT, &Notify::new())
            .await
            .expect_err("stray");
        assert!(matches!(err, Error::Unexpected(b'G')), "{err}");

        // A peer that pings faster than it should is cut off rather than answered.
        let (leader_io, mut agent_io) = duplex(64);
        agent_io.write_all(&[PING; 32]).await.expect("write");
        let err = lead(leader_io, PINGS, TIMEOUT, &Notify::new())
            .await
            .expect_err("flood");
        assert!(matches!(err, Error::Flood), "{err}");

        // Nor answers to no ping.
        let (leader_io, mut agent_io) = duplex(64);
        agent_io.write_all(&[PONG; 32]).await.expect("write");
        let err = lead(leader_io, PINGS, TIMEOUT, &Notify::new())
            .await
            .expect_err("flood");
        assert!(matches!(err, Error::Flood), "{err}");

        // The agent never takes START from itself: only the leader may ask.
        let (mut leader_io, agent_io) = duplex(64);
        leader_io.write_all(&[STARTED]).await.expect("write");
        let err = follow(agent_io, PINGS, TIMEOUT).await.expect_err("stray");
        assert!(matches!(err, Error::Unexpected(STARTED)), "{err}");
    }
}
