//! Ensures one leader user cannot make the agent hold more than a fixed amount: a request body
//! is read within a deadline and counted against one byte budget that every tunnel of the
//! process shares, and each tunnel serves at most a fixed number of streams at once. Whatever
//! is over a bound is answered at once (413, 408, 429), never queued.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError};

/// The unit the byte budget counts in.
const UNIT: usize = 1024;

/// Bytes of request bodies that may be held at once, shared by every tunnel of a process.
#[derive(Clone, Debug)]
pub struct Budget {
    units: Arc<Semaphore>,
}

/// Bytes of the budget held by one request body until it is dropped.
#[derive(Debug)]
pub struct Held {
    _permits: Vec<OwnedSemaphorePermit>,
}

/// Why a request body was not read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BodyRefusal {
    /// Larger than the per-request limit (413).
    #[error("the request body is larger than {limit} bytes")]
    TooLarge {
        /// The limit.
        limit: usize,
    },
    /// Not received within the deadline (408).
    #[error("the request body did not arrive within {0:?}")]
    Slow(Duration),
    /// The agent already holds as many request bytes as it may (429).
    #[error("the agent is holding as many request bytes as it may; retry shortly")]
    Busy,
    /// The caller's stream failed while sending the body (400).
    #[error("the request body was cut off: {0}")]
    Broken(&'static str),
}

impl BodyRefusal {
    /// The HTTP status to answer with.
    pub fn status(&self) -> http::StatusCode {
        match self {
            Self::TooLarge { .. } => http::StatusCode::PAYLOAD_TOO_LARGE,
            Self::Slow(_) => http::StatusCode::REQUEST_TIMEOUT,
            Self::Busy => http::StatusCode::TOO_MANY_REQUESTS,
            Self::Broken(_) => http::StatusCode::BAD_REQUEST,
        }
    }

    /// A bounded label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Self::TooLarge { .. } => "body_too_large",
            Self::Slow(_) => "body_slow",
            Self::Busy => "body_budget_exhausted",
            Self::Broken(_) => "body_broken",
        }
    }
}

impl Budget {
    /// A budget of `bytes` (rounded up to whole KiB).
    pub fn new(bytes: usize) -> Self {
        Self {
            units: Arc::new(Semaphore::new(bytes.div_ceil(UNIT))),
        }
    }

    /// Bytes not held by any body now.
    pub fn available(&self) -> usize {
        self.units.available_permits() * UNIT
    }

    fn take(&self, bytes: usize) -> Result<OwnedSemaphorePermit, BodyRefusal> {
        let units = u32::try_from(bytes.div_ceil(UNIT)).map_err(|_| BodyRefusal::Busy)?;
        match self.units.clone().try_acquire_many_owned(units) {
            Ok(p) => Ok(p),
            Err(TryAcquireError::NoPermits | TryAcquireError::Closed) => Err(BodyRefusal::Busy),
        }
    }

    /// Reads `body` whole: at most `limit` bytes, within `deadline` from now, each chunk
    /// counted against the budget as it arrives. The bytes stay counted until `Held` drops.
    pub async fn collect<B>(
        &self,
        body: B,
        limit: usize,
        deadline: Duration,
    ) -> Result<(Bytes, Held), BodyRefusal>
    where
        B: http_body::Body<Data = Bytes> + Unpin,
    {
        let read = async {
            let mut body = body;
            let mut buf = BytesMut::new();
            let mut held = Vec::new();
            while let Some(frame) = body.frame().await {
                let frame = frame.map_err(|_| BodyRefusal::Broken("the caller's stream failed"))?;
                let Ok(data) = frame.into_data() else { continue };
                if buf.len() + data.len() > limit {
                    return Err(BodyRefusal::TooLarge { limit });
                }
                held.push(self.take(data.len())?);
                buf.extend_from_slice(&data);
            }
            Ok((buf.freeze(), Held { _permits: held }))
        };
        tokio::time::timeout(deadline, read)
            .await
            .map_err(|_| BodyRefusal::Slow(deadline))?
    }
}

/// Streams one tunnel serves at once; the next is answered 429.
#[derive(Clone, Debug)]
pub struct Streams {
    slots: Arc<Semaphore>,
}

impl Streams {
    /// At most `n` streams at once.
    pub fn new(n: usize) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(n)),
        }
    }

    /// A slot for one stream, held until dropped; `None` when all are taken.
    pub fn enter(&self) -> Option<OwnedSemaphorePermit> {
        self.slots.clone().try_acquire_owned().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipe;

    #[tokio::test]
    async fn a_body_within_every_bound_is_read_and_counted_until_dropped() {
        let budget = Budget::new(64 * 1024);
        let (bytes, held) = budget
            .collect(pipe::full(vec![7u8; 10_000]), 3 << 20, Duration::from_secs(1))
            .await
            .unwrap();
        assert_eq!(bytes.len(), 10_000);
        assert_eq!(budget.available(), 64 * 1024 - 10 * 1024);
        drop(held);
        assert_eq!(budget.available(), 64 * 1024);
    }

    #[tokio::test]
    async fn a_body_over_the_limit_is_refused_without_holding_it() {
        let budget = Budget::new(1 << 20);
        let err = budget
            .collect(pipe::full(vec![0u8; 5000]), 4096, Duration::from_secs(1))
            .await
            .unwrap_err();
        assert_eq!(err, BodyRefusal::TooLarge { limit: 4096 });
        assert_eq!(err.status(), http::StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(budget.available(), 1 << 20);
    }

    #[tokio::test(start_paused = true)]
    async fn a_trickled_body_is_cut_off_at_the_deadline_and_its_bytes_released() {
        let budget = Budget::new(1 << 20);
        let (tx, body) = pipe::channel();
        let trickle = tokio::spawn(async move {
            loop {
                if tx.send(Bytes::from_static(b"x")).await.is_err() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
        let err = budget
            .collect(body, 3 << 20, Duration::from_secs(30))
            .await
            .unwrap_err();
        assert_eq!(err, BodyRefusal::Slow(Duration::from_secs(30)));
        assert_eq!(err.status(), http::StatusCode::REQUEST_TIMEOUT);
        assert_eq!(budget.available(), 1 << 20, "nothing stays held");
        trickle.abort();
    }

    #[tokio::test]
    async fn bodies_past_the_shared_budget_are_answered_busy() {
        let budget = Budget::new(8 * 1024);
        let (_first, held) = budget
            .collect(pipe::full(vec![1u8; 6 * 1024]), 1 << 20, Duration::from_secs(1))
            .await
            .unwrap();
        let err = budget
            .collect(pipe::full(vec![1u8; 4 * 1024]), 1 << 20, Duration::from_secs(1))
            .await
            .unwrap_err();
        assert_eq!(err, BodyRefusal::Busy);
        assert_eq!(err.status(), http::StatusCode::TOO_MANY_REQUESTS);
        drop(held);
        assert!(
            budget
                .collect(pipe::full(vec![1u8; 4 * 1024]), 1 << 20, Duration::from_secs(1))
                .await
                .is_ok()
        );
    }

    #[test]
    fn a_tunnel_serves_at_most_its_streams_at_once() {
        let streams = Streams::new(2);
        let a = streams.enter().unwrap();
        let _b = streams.enter().unwrap();
        assert!(streams.enter().is_none());
        drop(a);
        assert!(streams.enter().is_some());
    }
}
