//! A scripted API server for the loops' unit tests: a `kube::Client` whose every request is
//! answered in-process by a function of its method and path, and recorded. No cluster, no
//! sockets (kube-rs's own tests use `tower_test` the same way).

use std::sync::{Arc, Mutex};

use http::{Method, Request, Response};
use kube::client::Body;
use serde_json::{Value, json};

/// The requests a mock client saw: `METHOD path`.
pub type Calls = Arc<Mutex<Vec<String>>>;

/// A client answered by `answer(method, path, call number from 0)` with a status code and a
/// JSON body. A watch (`?watch=true`) is never answered: it stays open, as one with no events.
pub fn client(
    answer: impl Fn(&Method, &str, usize) -> (u16, Value) + Send + Sync + 'static,
) -> (kube::Client, Calls) {
    let calls: Calls = Arc::default();
    let seen = calls.clone();
    let service = tower::service_fn(move |req: Request<Body>| {
        let n = {
            let mut calls = seen.lock().unwrap_or_else(|p| p.into_inner());
            calls.push(format!("{} {}", req.method(), req.uri().path()));
            calls.len() - 1
        };
        let watch = req.uri().query().is_some_and(|q| q.contains("watch=true"));
        let (code, body) = answer(req.method(), req.uri().path(), n);
        let response = Response::builder()
            .status(code)
            .header("content-type", "application/json")
            .body(Body::from(serde_json::to_vec(&body).unwrap_or_default()));
        async move {
            if watch {
                std::future::pending::<()>().await;
            }
            response
        }
    });
    (kube::Client::new(service, "default"), calls)
}

/// A Kubernetes `Status` of a failed call with `code`.
pub fn failure(code: u16) -> (u16, Value) {
    (
        code,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": format!("mock {code}"), "reason": "Mock", "code": code}),
    )
}

/// How many of `calls` start with `prefix`.
pub fn count(calls: &Calls, prefix: &str) -> usize {
    calls
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter(|c| c.starts_with(prefix))
        .count()
}

/// The statuses a test's status owner wrote.
pub type Writes = Arc<Mutex<Vec<tether_api::ClusterSetStatus>>>;

/// A status sink whose owner runs as a task and records what it writes (every write succeeds,
/// or with `fail` every write fails).
pub fn sink(fail: bool) -> (crate::status::StatusSink, tokio::task::JoinHandle<()>, Writes) {
    let spec = tether_api::ClusterSetSpec {
        role: tether_api::clusterset::ClusterSetRole::Member,
        leader: None,
        member: None,
    };
    let set = Arc::new(tether_api::ClusterSet::new("prod", spec));
    let writes: Writes = Arc::default();
    let seen = writes.clone();
    let (sink, owner) = crate::status::owner(
        move || set.clone(),
        move |_, status| {
            seen.lock().unwrap_or_else(|p| p.into_inner()).push(status);
            async move {
                if fail {
                    Err(crate::Error::Invariant("the write fails"))
                } else {
                    Ok(())
                }
            }
        },
    );
    (sink, tokio::spawn(owner), writes)
}

/// The reasons of condition `kind` in each status written, in order.
pub fn reasons(writes: &Writes, kind: tether_api::conditions::ConditionType) -> Vec<String> {
    writes
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter_map(|s| tether_api::conditions::find(&s.conditions, kind).map(|c| c.reason.clone()))
        .collect()
}

/// The requests a mock member saw, whole but for their bodies.
pub type Seen = Arc<Mutex<Vec<http::request::Parts>>>;

/// A client of a member API server that answers every request with `answer(request)`.
pub fn member(
    answer: impl Fn(&http::request::Parts) -> Response<Body> + Send + Sync + 'static,
) -> (kube::Client, Seen) {
    let seen: Seen = Arc::default();
    let record = seen.clone();
    let service = tower::service_fn(move |req: Request<Body>| {
        let (parts, _) = req.into_parts();
        let response = answer(&parts);
        record.lock().unwrap_or_else(|p| p.into_inner()).push(parts);
        async move { Ok::<_, std::convert::Infallible>(response) }
    });
    (kube::Client::new(service, "default"), seen)
}
