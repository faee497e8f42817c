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
    /// The peer left a ping (or the start) unanswered for `after`; `heard` if any byte of its
    /// ever arrived on this tunnel.
    #[error("the peer answered nothing for {after:?}")]
    Silent {
        /// The timeout it went past.
        after: Duration,
        /// Whether the peer was ever heard on this tunnel.
        heard: bool,
    },
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
        matches!(self, Error::Silent { .. })
    }

    /// Whether the peer went silent without a byte of its ever arriving on this tunnel: the
    /// path may never have carried it (a congested relay), rather than the peer having gone.
    pub fn never_heard(&self) -> bool {
        matches!(self, Error::Silent { heard: false, .. })
    }

    /// A silence counts as heard if the peer was.
    fn heard_if(self, spoke: bool) -> Self {
        match self {
            Error::Silent { after, heard } => Error::Silent {
                after,
                heard: heard || spoke,
            },
            e => e,
        }
    }

    fn silent(after: Duration) -> Self {
        Error::Silent { after, heard: false }
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
    /// Whether any byte of the peer's arrived.
    spoke: bool,
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
            spoke: false,
            due: Instant::now() + interval,
            waiting: false,
            pinged: 0,
            window: Instant::now() + FLOOD_WINDOW,
        }
    }

    /// The peer pinged: fine unless it is flooding.
    fn pinged(&mut self) -> Result<(), Error> {
        self.spoke = true;
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
            return Err(Error::Silent {
                after: self.timeout,
                heard: self.spoke,
            });
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
        self.spoke = true;
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
        .map_err(|_| Error::silent(within))?
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
    let mut pinger = Pinger::new(interval, timeout, false);
    let asked = async {
        idle(&mut r, &mut w, &mut pinger, Some(start)).await?;
        put(&mut w, START, timeout).await
    };
    asked.await.map_err(|e| e.heard_if(pinger.spoke))?;
    // NB: what the agent sent before it read START is still idle bytes; none is answered now,
    // since everything the agent reads after START is HTTP/2.
    let started = async {
        loop {
            match get(&mut r).await? {
                STARTED => return Ok(()),
                PING | PONG => pinger.spoke = true,
                other => return Err(Error::Unexpected(other)),
            }
        }
    };
    tokio::time::timeout(timeout, started)
        .await
        .map_err(|_| Error::silent(timeout).heard_if(pinger.spoke))??;
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
    let mut pinger = Pinger::new(interval, timeout, true);
    let asked = async {
        idle(&mut r, &mut w, &mut pinger, None).await?;
        put(&mut w, STARTED, timeout).await
    };
    asked.await.map_err(|e| e.heard_if(pinger.spoke))?;
    Ok(r.unsplit(w))
}

#[cfg(test)]
mod tests;
