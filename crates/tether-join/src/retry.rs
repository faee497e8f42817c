//! Retries of requests to the leader: kube's own policy (429, 503 and 504 sent again with
//! exponential backoff, honouring Retry-After), except for a request marked [`Once`].
//!
//! kube's policy retries a request up to 15 times, the last waits growing to minutes. A caller
//! with its own schedule marks its requests `Once`: a tunnel dial answered 503 while no leader
//! replica serves (a failover) must come back to the agent's jittered redial at once, not wait
//! deep in a backoff it cannot see (at 9,000 members that wait was most of a 100 s failover).

use http::{Request, Response};
use kube::client::Body;
use kube::client::retry::RetryPolicy;
use tower::BoxError;
use tower::retry::{Policy, RetryLayer};

/// Marks a request (as an extension) that the client sends once: its caller retries it on its
/// own schedule.
#[derive(Clone, Copy, Debug)]
pub struct Once;

/// kube's retry policy, sending requests marked [`Once`] once.
#[derive(Clone)]
pub struct Retry(RetryPolicy);

/// The retry layer of every client of the leader.
pub fn layer() -> RetryLayer<Retry> {
    RetryLayer::new(Retry(RetryPolicy::server_retry()))
}

impl<Res> Policy<Request<Body>, Response<Res>, BoxError> for Retry {
    type Future = <RetryPolicy as Policy<Request<Body>, Response<Res>, BoxError>>::Future;

    fn retry(
        &mut self,
        req: &mut Request<Body>,
        result: &mut Result<Response<Res>, BoxError>,
    ) -> Option<Self::Future> {
        if req.extensions().get::<Once>().is_some() {
            return None;
        }
        self.0.retry(req, result)
    }

    fn clone_request(&mut self, req: &Request<Body>) -> Option<Request<Body>> {
        // NB: no copy kept, so the layer sends it once and hands back whatever came.
        if req.extensions().get::<Once>().is_some() {
            return None;
        }
        <RetryPolicy as Policy<Request<Body>, Response<Res>, BoxError>>::clone_request(&mut self.0, req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unavailable() -> Result<Response<()>, BoxError> {
        Ok(Response::builder().status(503).body(()).expect("response"))
    }

    // NB: a retry's backoff is a tokio sleep, made at once: it needs a runtime.
    #[tokio::test]
    async fn a_request_marked_once_is_neither_kept_nor_sent_again_and_others_are() {
        let mut policy = layer_policy();
        let mut plain = Request::get("/x").body(Body::empty()).expect("request");
        let mut once = Request::get("/x").body(Body::empty()).expect("request");
        once.extensions_mut().insert(Once);
        let clone = |p: &mut Retry, r: &Request<Body>| {
            <Retry as Policy<Request<Body>, Response<()>, BoxError>>::clone_request(p, r)
        };
        assert!(clone(&mut policy, &plain).is_some());
        assert!(clone(&mut policy, &once).is_none());
        assert!(policy.retry(&mut plain, &mut unavailable()).is_some());
        assert!(policy.retry(&mut once, &mut unavailable()).is_none());
    }

    fn layer_policy() -> Retry {
        Retry(RetryPolicy::server_retry())
    }

    /// A server on loopback answering every request 503 (as the aggregator does while no
    /// leader replica serves), counting them.
    async fn unavailable_server() -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        use std::sync::atomic::Ordering;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        let seen = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = seen.clone();
        tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                let counted = counted.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 16 * 1024];
                    while let Ok(n) = sock.read(&mut buf).await
                        && n > 0
                    {
                        // NB: bodiless GETs: each header block's end is one request.
                        let requests = buf[..n].windows(4).filter(|w| *w == b"\r\n\r\n").count();
                        for _ in 0..requests {
                            counted.fetch_add(1, Ordering::SeqCst);
                            let answer = b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n";
                            if sock.write_all(answer).await.is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        (url, seen)
    }

    #[tokio::test]
    async fn the_leader_client_sends_a_request_marked_once_once_and_resends_the_others() {
        use std::sync::atomic::Ordering;
        let (url, seen) = unavailable_server().await;
        let config = kube::Config::new(url.parse().expect("url"));
        let client = crate::discovery::leader_client(config).expect("client");

        let mut once = Request::get("/apis/x").body(Body::empty()).expect("request");
        once.extensions_mut().insert(Once);
        let answer = tokio::time::timeout(std::time::Duration::from_secs(5), client.send(once))
            .await
            .expect("handed back at once, not resent")
            .expect("an answer");
        assert_eq!(answer.status(), 503);
        assert_eq!(seen.load(Ordering::SeqCst), 1, "sent once, answer handed back");

        seen.store(0, Ordering::SeqCst);
        let plain = Request::get("/apis/x").body(Body::empty()).expect("request");
        let still_retrying =
            tokio::time::timeout(std::time::Duration::from_secs(1), client.send(plain)).await;
        assert!(still_retrying.is_err(), "kube's retries go on past a second");
        assert!(
            seen.load(Ordering::SeqCst) >= 3,
            "an unmarked request is resent: {}",
            seen.load(Ordering::SeqCst)
        );
    }
}
