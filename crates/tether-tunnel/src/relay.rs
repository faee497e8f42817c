//! What both ends do with an answer they relay: drop every header the far side could forge and
//! set the HTTP version of the hop it goes back on (`answer`), build the answer to an upgrade the
//! far side accepted (`switched`), and splice the upgraded connection with its stream once the
//! upgrade completes (`splice_upgraded`). The leader relays the agent's answers to HTTP/1.1
//! callers; the agent relays its member API server's answers into HTTP/2 streams.

use bytes::Bytes;
use http::header::{CONNECTION, HeaderValue, UPGRADE};
use http::{HeaderMap, Response, StatusCode, Version};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::sync::mpsc;

use crate::headers::{self, strip_untrusted};
use crate::pipe::{self, Body};

/// The hop an answer goes back on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hop {
    /// To the leader, as one HTTP/2 stream of the tunnel (the agent's side).
    Tunnel,
    /// To the caller, over HTTP/1.1 (the leader's side).
    Caller,
}

/// An answer relayed back on `hop`: every untrusted header removed, the hop's HTTP version, and
/// the body streamed, never buffered.
pub fn answer<B>(resp: Response<B>, hop: Hop) -> Response<Body>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (mut parts, body) = resp.into_parts();
    strip_untrusted(&mut parts.headers, false);
    parts.version = match hop {
        Hop::Tunnel => Version::HTTP_2,
        Hop::Caller => Version::HTTP_11,
    };
    Response::from_parts(parts, pipe::boxed(body))
}

/// The answer on `hop` to an upgrade the far side accepted with `protocol`, carrying the
/// headers of its 101 that the caller needs (`headers::UPGRADE_RESPONSE_HEADERS`) and nothing
/// else. On the tunnel (HTTP/2 has no 101) it is a 200 whose `tether-upgrade` header names the
/// protocol; to a caller it is the 101 itself.
pub fn switched(far: &HeaderMap, protocol: HeaderValue, hop: Hop) -> Response<Body> {
    let mut out = Response::new(pipe::empty());
    for h in headers::UPGRADE_RESPONSE_HEADERS {
        for v in far.get_all(&h) {
            out.headers_mut().append(h.clone(), v.clone());
        }
    }
    match hop {
        Hop::Tunnel => {
            out.headers_mut().insert(headers::UPGRADE, protocol);
        }
        Hop::Caller => {
            *out.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
            out.headers_mut()
                .insert(CONNECTION, HeaderValue::from_static("Upgrade"));
            out.headers_mut().insert(UPGRADE, protocol);
        }
    }
    out
}

/// Once `upgrade` completes, copies its connection both ways with one stream (`to_stream`, its
/// outgoing body; `from_stream`, its incoming one), holding `guard` until both directions close.
/// An upgrade that does not complete drops everything.
pub fn splice_upgraded<B, G>(upgrade: OnUpgrade, to_stream: mpsc::Sender<Bytes>, from_stream: B, guard: G)
where
    B: http_body::Body<Data = Bytes> + Unpin + Send + 'static,
    B::Error: std::fmt::Display + Send,
    G: Send + 'static,
{
    tokio::spawn(async move {
        let _guard = guard;
        match upgrade.await {
            Ok(io) => pipe::splice(TokioIo::new(io), to_stream, from_stream).await,
            Err(e) => tracing::debug!(error = %e, "The upgrade did not complete"),
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::AUTHORIZATION;
    use http_body_util::BodyExt;

    fn member_answer() -> Response<http_body_util::Full<Bytes>> {
        Response::builder()
            .status(StatusCode::OK)
            .header("content-type", "application/json")
            .header(AUTHORIZATION, "Bearer leaked")
            .header("impersonate-user", "system:admin")
            .header("tether-remote-user", "mallory")
            .header("x-remote-user", "mallory")
            .header("audit-id", "chosen")
            .header("connection", "keep-alive")
            .body(http_body_util::Full::new(Bytes::from_static(
                b"{\"kind\":\"Status\"}",
            )))
            .expect("response")
    }

    #[tokio::test]
    async fn a_relayed_answer_keeps_its_body_and_loses_every_forgeable_header() {
        for (hop, version) in [(Hop::Tunnel, Version::HTTP_2), (Hop::Caller, Version::HTTP_11)] {
            let out = answer(member_answer(), hop);
            assert_eq!(out.version(), version);
            assert_eq!(out.status(), StatusCode::OK);
            let kept: Vec<&str> = out.headers().keys().map(|k| k.as_str()).collect();
            assert_eq!(kept, ["content-type"], "{hop:?}");
            let body = out.into_body().collect().await.expect("body").to_bytes();
            assert_eq!(&body[..], b"{\"kind\":\"Status\"}");
        }
    }

    #[test]
    fn an_accepted_upgrade_carries_only_the_headers_the_caller_needs() {
        let mut far = HeaderMap::new();
        far.insert(
            "sec-websocket-protocol",
            HeaderValue::from_static("v5.channel.k8s.io"),
        );
        far.insert(
            "x-stream-protocol-version",
            HeaderValue::from_static("v4.channel.k8s.io"),
        );
        far.insert("set-cookie", HeaderValue::from_static("session=1"));
        far.insert(AUTHORIZATION, HeaderValue::from_static("Bearer leaked"));
        let proto = HeaderValue::from_static("websocket");
        let on_tunnel = switched(&far, proto.clone(), Hop::Tunnel);
        assert_eq!(on_tunnel.status(), StatusCode::OK, "HTTP/2 has no 101");
        assert_eq!(on_tunnel.headers().get(headers::UPGRADE), Some(&proto));
        assert_eq!(on_tunnel.headers().len(), 3);
        let to_caller = switched(&far, proto.clone(), Hop::Caller);
        assert_eq!(to_caller.status(), StatusCode::SWITCHING_PROTOCOLS);
        assert_eq!(to_caller.headers().get(UPGRADE), Some(&proto));
        assert_eq!(to_caller.headers().get(CONNECTION).unwrap(), "Upgrade");
        assert!(to_caller.headers().get("set-cookie").is_none());
        assert!(to_caller.headers().get(AUTHORIZATION).is_none());
        assert_eq!(
            to_caller.headers().get("sec-websocket-protocol").unwrap(),
            "v5.channel.k8s.io"
        );
    }
}
