//! One stream of the tunnel becomes one request to the member's API server, as whom `authorize`
//! decides: the caller's own member credential (pass-through) or the allow-listed, prefixed
//! impersonation of the leader-verified caller, never with anything the caller forged. The
//! answer is relayed back (`tether_tunnel::relay`); an accepted upgrade is spliced with the
//! stream.

use std::convert::Infallible;

use http::header::{AUTHORIZATION, CONNECTION, UPGRADE};
use http::{HeaderName, HeaderValue, Request, Response, StatusCode, Version};
use hyper::body::Incoming;
use kube::Client;
use kube::client::Body as KubeBody;
use tether_tunnel::headers::{self, MEMBER_AUTHORIZATION, REMOTE_GROUP, REMOTE_USER, strip_untrusted};
use tether_tunnel::identity::{Caller, impersonate};
use tether_tunnel::limits::Streams;
use tether_tunnel::passthrough;
use tether_tunnel::pipe::{self, Body};
use tether_tunnel::relay::{self, Hop};
use tether_tunnel::status;

use tracing::debug;

use super::{BODY_DEADLINE, MAX_REQUEST_BODY, MAX_STREAMS, MemberAccess};

/// Who this member is, for impersonation names, sealed credentials and messages. No `Debug`:
/// it holds the private key.
#[derive(Clone)]
pub(super) struct Member {
    pub(super) set: String,
    pub(super) namespace: String,
    pub(super) name: String,
    pub(super) key: String,
    pub(super) access: MemberAccess,
    pub(super) streams: Streams,
}

/// Serves one stream of the tunnel: one request to the member API server.
pub(super) async fn forward(req: Request<Incoming>, m: Member) -> Result<Response<Body>, Infallible> {
    let Some(slot) = m.streams.enter() else {
        m.access.metrics.proxied("streams_full");
        return Ok(status(
            StatusCode::TOO_MANY_REQUESTS,
            &format!(
                "member {}'s tunnel is serving {MAX_STREAMS} requests already; retry shortly",
                m.name
            ),
        ));
    };
    let (mut parts, body) = req.into_parts();
    let upgrade = parts.headers.remove(headers::UPGRADE);
    let client = match authorize(&mut parts.headers, &m) {
        Ok(c) => c,
        Err((code, why)) => {
            m.access.metrics.proxied(if code == StatusCode::UNAUTHORIZED {
                "unauthorized"
            } else {
                "forbidden"
            });
            return Ok(status(code, &why));
        }
    };
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str()).to_string();
    let Ok(uri) = path.parse() else {
        return Ok(status(
            StatusCode::BAD_REQUEST,
            "the member path is not a valid URI",
        ));
    };
    parts.uri = uri;
    parts.version = Version::HTTP_11;
    let Some(protocol) = upgrade else {
        let (bytes, _held) = match m
            .access
            .budget
            .collect(body, MAX_REQUEST_BODY, BODY_DEADLINE)
            .await
        {
            Ok(b) => b,
            Err(refusal) => {
                m.access.metrics.proxied(refusal.label());
                debug!(member = %m.name, reason = refusal.label(), "Refused a request body");
                return Ok(status(refusal.status(), &refusal.to_string()));
            }
        };
        let resp = client
            .send(Request::from_parts(parts, KubeBody::from(bytes)))
            .await;
        return Ok(match resp {
            Ok(r) => {
                m.access.metrics.proxied("ok");
                // NB: a watch holds its stream slot for as long as it streams.
                relay::answer(r, Hop::Tunnel).map(|b| pipe::holding(b, slot))
            }
            Err(e) => {
                m.access.metrics.proxied("member_error");
                status(
                    StatusCode::BAD_GATEWAY,
                    &format!("member {}'s API server did not answer: {e}", m.name),
                )
            }
        });
    };
    parts
        .headers
        .insert(CONNECTION, HeaderValue::from_static("Upgrade"));
    parts.headers.insert(UPGRADE, protocol);
    let mut resp = match client.send(Request::from_parts(parts, KubeBody::empty())).await {
        Ok(r) => r,
        Err(e) => {
            m.access.metrics.proxied("member_error");
            return Ok(status(
                StatusCode::BAD_GATEWAY,
                &format!("member {}'s API server did not answer: {e}", m.name),
            ));
        }
    };
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        return Ok(relay::answer(resp, Hop::Tunnel));
    }
    m.access.metrics.proxied("upgraded");
    let switched_to = resp
        .headers()
        .get(UPGRADE)
        .cloned()
        .unwrap_or_else(|| HeaderValue::from_static("unknown"));
    let mut out = relay::switched(resp.headers(), switched_to, Hop::Tunnel);
    let (to_leader, out_body) = pipe::channel();
    *out.body_mut() = out_body;
    relay::splice_upgraded(hyper::upgrade::on(&mut resp), to_leader, body, slot);
    Ok(out)
}

/// Decides as whom a stream reaches the member, and sets the headers for it: the caller's own
/// member credential when one is passed (sealed to this member's key by that caller, recently,
/// holding a well-formed Bearer token, else 401), or else the
/// allow-listed, prefixed impersonation of the leader-verified caller (else 403). Every header
/// the caller could forge is gone afterwards. Returns the client to send with.
fn authorize<'a>(headers: &mut http::HeaderMap, m: &'a Member) -> Result<&'a Client, (StatusCode, String)> {
    let caller = Caller {
        user: header_text(headers, &REMOTE_USER).unwrap_or_default(),
        groups: headers
            .get_all(&REMOTE_GROUP)
            .iter()
            .filter_map(|v| v.to_str().ok().map(str::to_string))
            .collect(),
    };
    let member_credential = headers.remove(MEMBER_AUTHORIZATION);
    strip_untrusted(headers, false);
    if let Some(credential) = member_credential {
        // NB: only a sealed, well-formed bearer token: an empty or non-Bearer Authorization is
        // system:anonymous to the member, and a plain one crossed the leader readable.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let token = passthrough::open(&credential, &m.key, &m.namespace, &m.name, &caller.user, now)
            .map_err(|refusal| (StatusCode::UNAUTHORIZED, refusal.to_string()))?;
        let value = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
            (
                StatusCode::UNAUTHORIZED,
                "the member credential is not a valid header".into(),
            )
        })?;
        headers.insert(AUTHORIZATION, value);
        return Ok(&m.access.bare);
    }
    let who = impersonate(&m.set, &m.name, &caller, &m.access.allow).map_err(|refusal| {
        debug!(user = %caller.user, "Refused to impersonate");
        (StatusCode::FORBIDDEN, refusal.to_string())
    })?;
    let user = HeaderValue::from_str(&who.user).map_err(|_| {
        (
            StatusCode::BAD_REQUEST,
            "the user name is not a valid header".to_string(),
        )
    })?;
    headers.insert(HeaderName::from_static("impersonate-user"), user);
    for g in who.groups.iter().filter_map(|g| HeaderValue::from_str(g).ok()) {
        headers.append(HeaderName::from_static("impersonate-group"), g);
    }
    Ok(&m.access.agent)
}

fn header_text(h: &http::HeaderMap, name: &HeaderName) -> Option<String> {
    h.get(name).and_then(|v| v.to_str().ok()).map(str::to_string)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use http_body_util::BodyExt;
    use hyper::client::conn::http2::SendRequest;
    use hyper_util::rt::{TokioExecutor, TokioIo};

    use super::*;
    use crate::testing::{self, Seen};
    use tether_tunnel::identity::AllowList;

    /// The tunnel of member `east` of set `prod`, served in-process over a duplex pipe with a
    /// mock member API server: what the leader's end sends on, and what the member saw.
    async fn tunnel(answer: fn(&http::request::Parts) -> Response<KubeBody>) -> (SendRequest<Body>, Seen) {
        let (agent, seen) = testing::member(answer);
        let (bare, _) = testing::member(|_| Response::new(KubeBody::empty()));
        let allow = AllowList {
            users: BTreeSet::from(["alice".to_string()]),
            groups: BTreeSet::from(["dev".to_string()]),
        };
        let m = Member {
            set: "prod".into(),
            namespace: "tether-prod-east".into(),
            name: "east".into(),
            key: tether_seal::generate_keypair().0,
            access: MemberAccess::new(agent, bare, allow, crate::Metrics::default()),
            streams: Streams::new(MAX_STREAMS),
        };
        let (leader_end, agent_end) = tokio::io::duplex(64 * 1024);
        let svc = hyper::service::service_fn(move |req| forward(req, m.clone()));
        tokio::spawn(
            hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(agent_end), svc),
        );
        let (send, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(leader_end))
                .await
                .expect("HTTP/2 over the pipe");
        tokio::spawn(conn);
        (send, seen)
    }

    /// A request as the leader sends it for `user` in `groups`, with headers a caller forged.
    fn from_leader(user: &str, groups: &[&str]) -> http::request::Builder {
        let mut req = Request::get("http://member/api/v1/namespaces?limit=5")
            .header(REMOTE_USER, user)
            .header("impersonate-user", "system:admin")
            .header("impersonate-group", "system:masters")
            .header(AUTHORIZATION, "Bearer forged")
            .header("x-forwarded-for", "10.0.0.1");
        for g in groups {
            req = req.header(REMOTE_GROUP, *g);
        }
        req
    }

    fn list(_: &http::request::Parts) -> Response<KubeBody> {
        Response::builder()
            .header("content-type", "application/json")
            .header("impersonate-user", "leaked")
            .header("audit-id", "member-chosen")
            .body(KubeBody::from(b"{\"kind\":\"NamespaceList\"}".to_vec()))
            .expect("response")
    }

    #[tokio::test]
    async fn a_stream_reaches_the_member_as_the_prefixed_caller_and_nothing_forged_crosses() {
        let (mut send, seen) = tunnel(list).await;
        let req = from_leader("alice", &["dev", "ops", "system:masters"])
            .body(pipe::empty())
            .expect("request");
        let resp = send.send_request(req).await.expect("answer");
        assert_eq!(resp.status(), StatusCode::OK);
        assert!(
            resp.headers().get("impersonate-user").is_none(),
            "the member's answer is relayed clean"
        );
        assert!(resp.headers().get("audit-id").is_none());
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        assert_eq!(&body[..], b"{\"kind\":\"NamespaceList\"}");
        let seen = seen.lock().unwrap();
        let got = &seen[0];
        assert_eq!(
            got.uri.path_and_query().map(|p| p.as_str()),
            Some("/api/v1/namespaces?limit=5")
        );
        let all = |name: &str| -> Vec<&str> {
            got.headers
                .get_all(name)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .collect()
        };
        assert_eq!(all("impersonate-user"), ["tether:prod:alice"]);
        assert_eq!(
            all("impersonate-group"),
            ["tether:prod:dev"],
            "only allow-listed, never system:"
        );
        assert!(all("authorization").is_empty());
        assert!(all("x-forwarded-for").is_empty());
        assert!(all("tether-remote-user").is_empty());
    }

    #[tokio::test]
    async fn a_caller_not_allowed_is_refused_before_the_member_hears_of_it() {
        let (mut send, seen) = tunnel(list).await;
        for user in ["mallory", "system:admin", ""] {
            let req = from_leader(user, &["dev"]).body(pipe::empty()).expect("request");
            let resp = send.send_request(req).await.expect("answer");
            assert_eq!(resp.status(), StatusCode::FORBIDDEN, "{user:?}");
        }
        assert!(seen.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_forged_member_credential_is_refused_not_sent() {
        let (mut send, seen) = tunnel(list).await;
        let req = from_leader("alice", &[])
            .header(MEMBER_AUTHORIZATION, "Bearer not-sealed")
            .body(pipe::empty())
            .expect("request");
        let resp = send.send_request(req).await.expect("answer");
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
        assert!(seen.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn an_upgrade_the_member_accepts_is_answered_on_the_stream_with_its_protocol() {
        fn switch(req: &http::request::Parts) -> Response<KubeBody> {
            assert_eq!(req.headers.get(UPGRADE).unwrap(), "SPDY/3.1");
            assert_eq!(req.headers.get(CONNECTION).unwrap(), "Upgrade");
            Response::builder()
                .status(StatusCode::SWITCHING_PROTOCOLS)
                .header(UPGRADE, "SPDY/3.1")
                .header("x-stream-protocol-version", "v4.channel.k8s.io")
                .header("set-cookie", "dropped")
                .body(KubeBody::empty())
                .expect("101")
        }
        let (mut send, seen) = tunnel(switch).await;
        let req = from_leader("alice", &[])
            .header(headers::UPGRADE, "SPDY/3.1")
            .body(pipe::empty())
            .expect("request");
        let resp = send.send_request(req).await.expect("answer");
        assert_eq!(
            resp.status(),
            StatusCode::OK,
            "HTTP/2 carries the switch as a header"
        );
        assert_eq!(resp.headers().get(headers::UPGRADE).unwrap(), "SPDY/3.1");
        assert_eq!(
            resp.headers().get("x-stream-protocol-version").unwrap(),
            "v4.channel.k8s.io"
        );
        assert!(resp.headers().get("set-cookie").is_none());
        assert_eq!(seen.lock().unwrap().len(), 1);
    }
}
