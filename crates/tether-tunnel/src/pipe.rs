//! Ensures bytes flow through the tunnel as streams, never as whole bodies: one body type for
//! both ends, a channel-fed body with a small bound (the back-pressure that makes a stalled
//! reader stop its own sender and no one else), and `splice`, which joins an upgraded
//! connection (exec, attach, port-forward) with one HTTP/2 stream in both directions.

use std::convert::Infallible;

use bytes::Bytes;
use futures::StreamExt;
use http_body::Frame;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full, StreamBody};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

/// Any error a body may carry.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// The body type of every request and response the tunnel carries.
pub type Body = UnsyncBoxBody<Bytes, BoxError>;

/// Chunks in flight per direction of a spliced stream before the reader waits.
const CHANNEL_CHUNKS: usize = 8;
/// Largest chunk read from an upgraded connection at once.
const CHUNK: usize = 32 * 1024;

/// A body of `bytes`.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|e: Infallible| match e {})
        .boxed_unsync()
}

/// An empty body.
pub fn empty() -> Body {
    Empty::<Bytes>::new()
        .map_err(|e: Infallible| match e {})
        .boxed_unsync()
}

/// Boxes any body whose errors convert to [`BoxError`].
pub fn boxed<B>(body: B) -> Body
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    body.map_err(Into::into).boxed_unsync()
}

/// `body`, keeping `guard` alive until the body is dropped (a stream slot held for as long as a
/// watch streams).
pub fn holding<G: Send + 'static>(body: Body, guard: G) -> Body {
    body.map_frame(move |frame| {
        let _ = &guard;
        frame
    })
    .boxed_unsync()
}

/// A body fed through the returned sender; it ends when the sender is dropped.
pub fn channel() -> (mpsc::Sender<Bytes>, Body) {
    let (tx, rx) = mpsc::channel::<Bytes>(CHANNEL_CHUNKS);
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, BoxError>(Frame::data(b)), rx))
    });
    (tx, StreamBody::new(stream).boxed_unsync())
}

/// Copies `io` both ways with one HTTP/2 stream: what `io` reads goes to `to_stream` (the
/// stream's outgoing body); what `from_stream` (its incoming body) yields is written to `io`.
/// Each direction closes on its own (half-close); returns when both have.
pub async fn splice<I, B>(io: I, to_stream: mpsc::Sender<Bytes>, mut from_stream: B)
where
    I: AsyncRead + AsyncWrite + Unpin,
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let (mut rd, mut wr) = tokio::io::split(io);
    let up = async move {
        let mut buf = vec![0u8; CHUNK];
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if to_stream.send(Bytes::copy_from_slice(&buf[..n])).await.is_err() {
                        break;
                    }
                }
            }
        }
        // NB: dropping the sender ends the stream's body: the peer sees end-of-stream.
        drop(to_stream);
    };
    let down = async move {
        while let Some(frame) = from_stream.frame().await {
            match frame {
                Ok(f) => {
                    if let Ok(data) = f.into_data()
                        && wr.write_all(&data).await.is_err()
                    {
                        break;
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, "Tunnel stream ended with an error");
                    break;
                }
            }
        }
        let _ = wr.shutdown().await;
    };
    futures::join!(up, down);
}

/// Reads a whole (small) body, for error messages; gives up past `limit` bytes.
pub async fn collect_limited<B>(body: B, limit: usize) -> Bytes
where
    B: http_body::Body<Data = Bytes> + Unpin,
{
    let mut out = Vec::new();
    let mut s = http_body_util::BodyStream::new(body);
    while let Some(Ok(frame)) = s.next().await {
        if let Ok(d) = frame.into_data() {
            out.extend_from_slice(&d);
            if out.len() > limit {
                out.truncate(limit);
                break;
            }
        }
    }
    out.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn splice_copies_both_ways_and_half_closes() {
        let (mut far, near) = tokio::io::duplex(64);
        let (tx, mut outgoing) = channel();
        let (in_tx, incoming) = channel();
        let task = tokio::spawn(splice(near, tx, incoming));
        far.write_all(b"from the caller").await.unwrap();
        let got = outgoing.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(&got[..], b"from the caller");
        in_tx.send(Bytes::from_static(b"from the member")).await.unwrap();
        let mut buf = vec![0u8; 15];
        far.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"from the member");
        drop(in_tx);
        let mut rest = Vec::new();
        far.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty(), "the member's end closes the caller's read side");
        far.shutdown().await.unwrap();
        drop(far);
        assert!(
            outgoing.frame().await.is_none(),
            "the caller's end closes the stream"
        );
        task.await.unwrap();
    }
}
