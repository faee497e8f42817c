//! Pass-through from kubectl. The leader forwards a member credential only in the
//! `Tether-Member-Authorization` header, which kubectl cannot send; so `tether --cluster east
//! --member-token-file t -- get ns` runs kubectl against a local endpoint that forwards each
//! request to the member's proxy path on the leader, with the leader credentials of the
//! kubeconfig and the member token in that header, sealed for each request to the member's
//! registered key with this leader user's name and the time (`tether_tunnel::passthrough`), so
//! nothing on the leader can read it. The member's RBAC decides as that token.
//!
//! The endpoint listens on loopback only, speaks TLS with a CA made for this run, and accepts
//! only a bearer token made for this run; kubectl gets both in a private (0600) kubeconfig, so
//! no other local user can borrow the leader credentials or the member token through it. The
//! member token is read from a file (never from the command line, where `ps` shows it) and is
//! neither logged nor written anywhere.

use std::convert::Infallible;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use anyhow::Context as _;
use http::header::{AUTHORIZATION, CONNECTION, HOST, UPGRADE};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use kube::Client;
use tether_tunnel::headers::{self, MEMBER_AUTHORIZATION};
use tether_tunnel::passthrough;
use tether_tunnel::pipe::{self, Body};
use tether_tunnel::status;

/// Largest request body forwarded (the API server's own limit for a request body is 3 MiB).
const MAX_REQUEST_BODY: usize = 3 * 1024 * 1024;
/// How long the local endpoint's certificate is valid.
const CERT_VALID: time::Duration = time::Duration::days(1);

/// What a client of the local endpoint needs.
pub struct Endpoint {
    /// `https://127.0.0.1:<port>`.
    pub server: String,
    /// The CA of the endpoint's certificate (PEM).
    pub ca_pem: String,
    /// The bearer token the endpoint accepts.
    pub token: String,
}

/// To whom, for which member and as which leader user a member token is sealed.
#[derive(Clone, Debug)]
pub struct Sealing {
    /// The member's registered key.
    pub recipient: String,
    /// The member's namespace on the leader.
    pub namespace: String,
    /// The member's name.
    pub name: String,
    /// This leader user, as the leader's API server authenticates it.
    pub user: String,
}

impl Sealing {
    /// Finds what sealing for member `name` in `namespace` needs: this user's name (a
    /// SelfSubjectReview), and the member's key, `recipient` when the caller could read it from
    /// the ManagedCluster, else from the leader's answer to a GET of the member's `/version`.
    pub async fn find(
        leader: &Client,
        namespace: &str,
        name: &str,
        recipient: Option<String>,
    ) -> anyhow::Result<Self> {
        use k8s_openapi::api::authentication::v1::SelfSubjectReview;
        let review = kube::Api::<SelfSubjectReview>::all(leader.clone())
            .create(&kube::api::PostParams::default(), &SelfSubjectReview::default())
            .await
            .context("cannot ask the leader who you are (SelfSubjectReview)")?;
        let user = review
            .status
            .and_then(|s| s.user_info)
            .and_then(|u| u.username)
            .context("the leader did not say who you are")?;
        let recipient = match recipient {
            Some(r) => r,
            None => {
                let path = format!("{}/version", tether_tunnel::proxy_path(namespace, name));
                let req = Request::get(path)
                    .body(kube::client::Body::empty())
                    .context("cannot build a request")?;
                let resp = leader.send(req).await.context("cannot reach the leader")?;
                resp.headers()
                    .get(passthrough::RECIPIENT)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string)
                    .with_context(|| {
                        format!(
                            "the leader did not give member {name}'s key ({}): is it a member that \
                             registered with this version, and may you use managedclusters/proxy in {namespace}?",
                            resp.status()
                        )
                    })?
            }
        };
        Ok(Self {
            recipient,
            namespace: namespace.to_string(),
            name: name.to_string(),
            user,
        })
    }

    /// The header value for `token`, sealed now.
    fn seal(&self, token: &str) -> anyhow::Result<HeaderValue> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        passthrough::seal(
            &self.recipient,
            &self.namespace,
            &self.name,
            &self.user,
            token,
            now,
        )
        .context("cannot seal the member token to the member's key")
    }
}

/// Where requests go and with what.
struct Forward {
    /// The leader, with the kubeconfig's credentials.
    leader: Client,
    /// The member's proxy path on the leader (no trailing slash).
    base: String,
    /// The member token.
    token: String,
    /// How it is sealed.
    sealing: Sealing,
    /// `Bearer <local token>`.
    local: Vec<u8>,
}

/// Reads the member token from `path`: one line, not empty.
pub fn read_member_token(path: &std::path::Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the member token from {}", path.display()))?;
    let token = text.trim();
    anyhow::ensure!(
        !token.is_empty() && !token.contains(char::is_whitespace),
        "{} must hold one member token (a bearer token of the member cluster), nothing else",
        path.display()
    );
    Ok(token.to_string())
}

/// Starts the local endpoint for the member at `base` (its proxy path on `leader`), passing
/// `member_token` through, sealed as `sealing` says; it serves until the returned task is
/// dropped or aborted.
pub async fn start(
    leader: Client,
    base: String,
    member_token: &str,
    sealing: Sealing,
) -> anyhow::Result<(Endpoint, tokio::task::JoinHandle<()>)> {
    HeaderValue::from_str(&format!("Bearer {member_token}"))
        .context("the member token holds characters no HTTP header may carry")?;
    sealing.seal(member_token)?;
    let token = local_token();
    let serving = tether_tunnel::cert::generate("tether-cli-local", "127.0.0.1", CERT_VALID)
        .context("cannot make the local endpoint's certificate")?;
    let listener = tokio::net::TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
        .await
        .context("cannot listen on 127.0.0.1")?;
    let addr = listener.local_addr().context("cannot read the local address")?;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls_config(&serving)?));
    let forward = Arc::new(Forward {
        leader,
        base: base.trim_end_matches('/').to_string(),
        token: member_token.to_string(),
        sealing,
        local: format!("Bearer {token}").into_bytes(),
    });
    let task = tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let _ = tcp.set_nodelay(true);
            let acceptor = acceptor.clone();
            let forward = forward.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let svc = hyper::service::service_fn(move |req| {
                    let forward = forward.clone();
                    async move { Ok::<_, Infallible>(handle(req, &forward).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), svc)
                    .with_upgrades()
                    .await;
            });
        }
    });
    Ok((
        Endpoint {
            server: format!("https://{addr}"),
            ca_pem: serving.ca,
            token,
        },
        task,
    ))
}

/// 32 random bytes, hex.
fn local_token() -> String {
    let bytes: [u8; 32] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn tls_config(s: &tether_tunnel::cert::Serving) -> anyhow::Result<rustls::ServerConfig> {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(s.cert.as_bytes())
        .collect::<Result<_, _>>()
        .context("the local certificate")?;
    let key = PrivateKeyDer::from_pem_slice(s.key.as_bytes()).context("the local key")?;
    let mut config =
        rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(certs, key)?;
    // NB: HTTP/1.1 only: kubectl's upgrades (exec, port-forward) need it, and one local client
    // gains nothing from HTTP/2.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// Whether `headers` carry exactly `expected` as Authorization (compared in constant time).
fn authorized(headers: &HeaderMap, expected: &[u8]) -> bool {
    let Some(got) = headers.get(AUTHORIZATION).map(HeaderValue::as_bytes) else {
        return false;
    };
    got.len() == expected.len() && got.iter().zip(expected).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}

/// The headers sent on to the leader: the caller's, less its local credential and anything
/// that names a member identity, plus the member token; hop-by-hop headers only for an upgrade.
fn outgoing_headers(incoming: &HeaderMap, member: &HeaderValue, upgrade: bool) -> HeaderMap {
    let mut out = incoming.clone();
    out.remove(AUTHORIZATION);
    out.remove(HOST);
    out.remove(MEMBER_AUTHORIZATION);
    if !upgrade {
        out.remove(CONNECTION);
        out.remove(UPGRADE);
    }
    out.insert(MEMBER_AUTHORIZATION, member.clone());
    out
}

async fn handle(mut req: Request<Incoming>, f: &Forward) -> Response<Body> {
    if !authorized(req.headers(), &f.local) {
        return status(
            StatusCode::UNAUTHORIZED,
            "this endpoint serves only the kubectl that tether started",
        );
    }
    let upgrade = headers::upgrade_request(req.headers()).is_some();
    let on_caller = upgrade.then(|| hyper::upgrade::on(&mut req));
    let (parts, body) = req.into_parts();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut out = Request::builder()
        .method(parts.method.clone())
        .uri(format!("{}{path}", f.base));
    let member = match f.sealing.seal(&f.token) {
        Ok(v) => v,
        Err(e) => return status(StatusCode::INTERNAL_SERVER_ERROR, &format!("{e:#}")),
    };
    if let Some(h) = out.headers_mut() {
        *h = outgoing_headers(&parts.headers, &member, upgrade);
    }
    // NB: kube's client takes whole request bodies; requests are small (the API server caps
    // them at 3 MiB), responses and upgraded streams are never buffered.
    let bytes = pipe::collect_limited(body, MAX_REQUEST_BODY + 1).await;
    if bytes.len() > MAX_REQUEST_BODY {
        return status(
            StatusCode::PAYLOAD_TOO_LARGE,
            "request bodies are limited to 3 MiB",
        );
    }
    let Ok(out) = out.body(kube::client::Body::from(bytes.to_vec())) else {
        return status(StatusCode::BAD_REQUEST, "cannot forward this request");
    };
    let mut resp = match f.leader.send(out).await {
        Ok(r) => r,
        Err(e) => {
            return status(StatusCode::BAD_GATEWAY, &format!("cannot reach the leader: {e}"));
        }
    };
    if let (StatusCode::SWITCHING_PROTOCOLS, Some(on_caller)) = (resp.status(), on_caller) {
        let on_leader = hyper::upgrade::on(&mut resp);
        let mut answer = Response::new(pipe::empty());
        *answer.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        *answer.headers_mut() = resp.headers().clone();
        tokio::spawn(async move {
            if let (Ok(caller), Ok(leader)) = (on_caller.await, on_leader.await) {
                let _ =
                    tokio::io::copy_bidirectional(&mut TokioIo::new(caller), &mut TokioIo::new(leader)).await;
            }
        });
        return answer;
    }
    let (mut p, body) = resp.into_parts();
    p.headers.remove(CONNECTION);
    Response::from_parts(p, pipe::boxed(body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_local_token_is_accepted() {
        let expected = b"Bearer abc";
        let mut h = HeaderMap::new();
        assert!(!authorized(&h, expected));
        for wrong in ["Bearer abd", "Bearer ab", "Bearer abcd", "abc"] {
            h.insert(AUTHORIZATION, HeaderValue::from_static(wrong));
            assert!(!authorized(&h, expected), "{wrong}");
        }
        h.insert(AUTHORIZATION, HeaderValue::from_static("Bearer abc"));
        assert!(authorized(&h, expected));
    }

    #[test]
    fn the_member_token_replaces_every_caller_credential() {
        let member = HeaderValue::from_static("Bearer member");
        let mut h = HeaderMap::new();
        h.insert(AUTHORIZATION, HeaderValue::from_static("Bearer local"));
        h.insert(MEMBER_AUTHORIZATION, HeaderValue::from_static("Bearer forged"));
        h.insert(HOST, HeaderValue::from_static("127.0.0.1:1"));
        h.insert(CONNECTION, HeaderValue::from_static("Upgrade"));
        h.insert(UPGRADE, HeaderValue::from_static("websocket"));
        h.insert("accept", HeaderValue::from_static("application/json"));
        let out = outgoing_headers(&h, &member, false);
        assert!(out.get(AUTHORIZATION).is_none() && out.get(HOST).is_none());
        assert_eq!(
            out.get_all(MEMBER_AUTHORIZATION).iter().collect::<Vec<_>>(),
            [&member]
        );
        assert!(out.get(CONNECTION).is_none() && out.get(UPGRADE).is_none());
        assert_eq!(out["accept"], "application/json");
        let up = outgoing_headers(&h, &member, true);
        assert_eq!(up[UPGRADE], "websocket");
        assert_eq!(up[CONNECTION], "Upgrade");
    }

    #[test]
    fn a_token_file_holds_one_token() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t");
        std::fs::write(&p, "abc.def\n").unwrap();
        assert_eq!(read_member_token(&p).unwrap(), "abc.def");
        for bad in ["", "\n", "two tokens\n"] {
            std::fs::write(&p, bad).unwrap();
            let err = read_member_token(&p).unwrap_err().to_string();
            assert!(err.contains("one member token"), "{bad:?}: {err}");
        }
        let err = read_member_token(&dir.path().join("missing"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("cannot read the member token"), "{err}");
    }
}
