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

    #[test]
    fn a_request_marked_once_is_neither_kept_nor_sent_again_and_others_are() {
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
}
