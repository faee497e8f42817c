//! What the member-access scenarios share: requests through the leader, kubectl and `tether`
//! as a user, tokens, the serving certificate, and an echo server on a member.

use super::*;

/// The leader's gauge of when the proxy's serving certificate expires.
pub(crate) const CERT_EXPIRY: &str = "tether_leader_proxy_certificate_expiry_timestamp_seconds";

/// The leaf certificate (DER) and CA (PEM) in the proxy serving Secret.
pub(crate) async fn serving_secret(leader: &LeaderSide) -> (Vec<u8>, Vec<u8>) {
    use rustls::pki_types::{CertificateDer, pem::PemObject};
    let secret = Api::<Secret>::namespaced(leader.admin.clone(), HOME)
        .get("tether-leader-proxy-serving")
        .await
        .expect("proxy serving Secret");
    let data = secret.data.expect("data");
    let leaf = CertificateDer::pem_slice_iter(&data["tls.crt"].0)
        .next()
        .expect("tls.crt")
        .expect("tls.crt PEM");
    (leaf.to_vec(), data["ca.crt"].0.clone())
}

/// The leaf certificate (DER) the proxy at `at` serves, verified against `ca` for the Service name.
pub(crate) async fn served_certificate(at: std::net::SocketAddr, ca: &[u8]) -> Result<Vec<u8>, String> {
    use rustls::pki_types::{CertificateDer, pem::PemObject};
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca) {
        roots
            .add(c.map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    }
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from(format!("tether-leader-proxy.{HOME}.svc"))
        .map_err(|e| e.to_string())?;
    let handshake = async {
        let tcp = tokio::net::TcpStream::connect(at).await?;
        tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
            .connect(name, tcp)
            .await
    };
    let tls = tokio::time::timeout(Duration::from_secs(10), handshake)
        .await
        .map_err(|_| "no TLS handshake within 10 s".to_string())?
        .map_err(|e| e.to_string())?;
    tls.get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.to_vec())
        .ok_or_else(|| "no server certificate".to_string())
}

/// `tether --cluster east --member-token-file <token> -- <args>` with `kubeconfig` for the leader.
pub(crate) fn kubectl_through(
    kubeconfig: &std::path::Path,
    token: &std::path::Path,
    args: &[&str],
) -> std::process::Output {
    let token = token.display().to_string();
    let mut all = vec!["--cluster", "east", "--member-token-file", &token, "--"];
    all.extend_from_slice(args);
    tether_as(kubeconfig, &all)
}

/// `tether <args>` with `kubeconfig` for the leader.
pub(crate) fn kubectl_with(kubeconfig: &std::path::Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(tether_testkit::Tools::locate().expect("tools").path("kubectl"))
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(args)
        .output()
        .expect("kubectl")
}

pub(crate) fn tether_as(kubeconfig: &std::path::Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(tether_testkit::controller::binary("tether").expect("tether"))
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(args)
        .env(
            "KUBECTL",
            tether_testkit::Tools::locate().expect("tools").path("kubectl"),
        )
        .output()
        .expect("tether")
}

/// A misconfiguration: the agent ServiceAccount of `other_ns` may attach member `name` too.
pub(crate) async fn grant_attach(leader: &LeaderSide, name: &str, other_ns: &str) {
    let ns = ns_of(name);
    apply(&leader.admin, Some(&ns), json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "stray-attach", "namespace": ns},
        "rules": [{"apiGroups": [tether_tunnel::GROUP], "resources": ["managedclusters/attach"], "verbs": ["get"]}]})).await;
    apply(
        &leader.admin,
        Some(&ns),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "stray-attach", "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "stray-attach"},
        "subjects": [{"kind": "ServiceAccount", "name": "tether-agent", "namespace": other_ns}]}),
    )
    .await;
}

/// The member side of east, as its admin would set it: the agent may impersonate exactly
/// tether:prod:alice and tether:prod:devs; tether:prod:alice may list namespaces and proxy to
/// Services; a `reader` ServiceAccount may list namespaces, `nobody` may do nothing.
pub(crate) async fn member_rbac(m: &MemberSide) {
    let c = &m.admin;
    allow_impersonation(m, &["alice"], &["devs"]).await;
    apply(
        c,
        None,
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "namespace-reader"},
        "rules": [{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]},
                  {"apiGroups": [""], "resources": ["services/proxy"], "verbs": ["get", "create"]}]}),
    )
    .await;
    apply(c, None, json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "namespace-reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "namespace-reader"},
        "subjects": [{"kind": "Group", "name": "tether:prod:devs", "apiGroup": "rbac.authorization.k8s.io"},
                     {"kind": "ServiceAccount", "name": "reader", "namespace": "default"}]})).await;
    for sa in ["reader", "nobody"] {
        apply(
            c,
            Some("default"),
            json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": sa, "namespace": "default"}}),
        )
        .await;
    }
}

/// A token of ServiceAccount `default/<sa>` on member `m`.
pub(crate) async fn member_token(m: &MemberSide, sa: &str) -> String {
    tether_e2e::service_account_token(&m.admin, "default", sa)
        .await
        .expect("member token")
}

/// A token of member `ns`'s agent ServiceAccount on the leader.
pub(crate) async fn leader_sa_token(leader: &LeaderSide, ns: &str) -> String {
    let req = TokenRequest::default();
    Api::<ServiceAccount>::namespaced(leader.admin.clone(), ns)
        .create_token_request("tether-agent", &PostParams::default(), &req)
        .await
        .expect("token request")
        .status
        .expect("status")
        .token
}

pub(crate) async fn list_namespaces(c: &Client) -> Result<Vec<String>, (u16, String)> {
    let text = get(c, "/api/v1/namespaces", &[]).await?;
    let list: k8s_openapi::List<Namespace> = serde_json::from_str(&text).map_err(|e| (0, e.to_string()))?;
    Ok(list.items.iter().map(|n| n.name_any()).collect())
}

/// Tries to attach member `name`'s tunnel with `token`; returns the status and body.
pub(crate) async fn attach_as(leader: &LeaderSide, token: &str, name: &str) -> (StatusCode, String) {
    let c = leader.cluster.client_with_token(token).expect("client");
    let req = Request::get(tether_tunnel::attach_path(&ns_of(name), name))
        .header(CONNECTION, "Upgrade")
        .header(UPGRADE, tether_tunnel::UPGRADE_PROTOCOL)
        .body(kube::client::Body::empty())
        .expect("request");
    let resp = c.send(req).await.expect("send");
    let code = resp.status();
    let body = tether_tunnel::pipe::collect_limited(resp.into_body(), 4096).await;
    (code, String::from_utf8_lossy(&body).to_string())
}

/// Opens an upgraded connection to `path` through `c` with a `method` request.
pub(crate) async fn upgrade(
    c: &Client,
    method: http::Method,
    path: &str,
) -> hyper_util::rt::TokioIo<hyper::upgrade::Upgraded> {
    let mut req = Request::builder().method(method.clone()).uri(path);
    if method == http::Method::POST {
        req = req.header(http::header::CONTENT_LENGTH, "0");
    }
    let req = req
        .header(CONNECTION, "Upgrade")
        .header(UPGRADE, "tether-echo")
        .body(kube::client::Body::empty())
        .expect("request");
    let mut resp = c.send(req).await.expect("send");
    assert_eq!(
        resp.status(),
        StatusCode::SWITCHING_PROTOCOLS,
        "{:?}",
        resp.headers()
    );
    hyper_util::rt::TokioIo::new(hyper::upgrade::on(&mut resp).await.expect("upgraded"))
}

/// Sends an upgrade request for member `name`'s `path` as `user` (group devs) on a connection of its own to
/// the leader's API server, and reads until the server closes it (so a kept-alive connection
/// hangs the caller's timeout). Returns everything read.
pub(crate) async fn raw_upgrade(leader: &LeaderSide, user: &str, name: &str, path: &str) -> String {
    use kube::client::ConfigExt;
    let config = leader
        .cluster
        .user_config(user, Some("devs"))
        .await
        .expect("user config");
    let tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(
        config.rustls_client_config().expect("tls config"),
    ));
    let host = config.cluster_url.host().expect("host").to_string();
    let port = config.cluster_url.port_u16().expect("port");
    let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
        .await
        .expect("connect");
    let server = rustls::pki_types::ServerName::try_from(host.clone()).expect("server name");
    let mut s = tls.connect(server, tcp).await.expect("tls");
    let target = format!("{}{path}", tether_tunnel::proxy_path(&ns_of(name), name));
    s.write_all(
        format!(
            "GET {target} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: Upgrade\r\nUpgrade: tether-echo\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .expect("write");
    let mut out = Vec::new();
    // NB: a TLS peer may close without close_notify; what was read before counts.
    let _ = s.read_to_end(&mut out).await;
    String::from_utf8_lossy(&out).to_string()
}

/// GETs the proxy's discovery document straight from the leader replica at `at` (not through
/// the API server), presenting `identity` (certificate and key PEM) as the front proxy's client
/// certificate: the answer's text, or what failed.
pub(crate) async fn front_proxy_get(
    leader: &LeaderSide,
    at: std::net::SocketAddr,
    identity: &(String, String),
) -> String {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
    let secret = Api::<Secret>::namespaced(leader.admin.clone(), HOME)
        .get("tether-leader-proxy-serving")
        .await
        .expect("proxy serving Secret");
    let ca = secret
        .data
        .as_ref()
        .and_then(|d| d.get("ca.crt"))
        .expect("ca.crt")
        .0
        .clone();
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(&ca) {
        roots.add(c.expect("serving CA")).expect("serving CA");
    }
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(identity.0.as_bytes())
        .collect::<Result<_, _>>()
        .expect("client certificate");
    let key = PrivateKeyDer::from_pem_slice(identity.1.as_bytes()).expect("client key");
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("TLS versions")
    .with_root_certificates(roots)
    .with_client_auth_cert(chain, key)
    .expect("client auth");
    let tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let name = rustls::pki_types::ServerName::try_from(format!("tether-leader-proxy.{HOME}.svc"))
        .expect("server name");
    let attempt = async {
        let tcp = tokio::net::TcpStream::connect(at).await?;
        let mut s = tls.connect(name, tcp).await?;
        s.write_all(
            format!(
                "GET /apis/{}/{} HTTP/1.1\r\nHost: {at}\r\nX-Remote-User: rotation-check\r\nConnection: close\r\n\r\n",
                tether_tunnel::GROUP,
                tether_tunnel::VERSION
            )
            .as_bytes(),
        )
        .await?;
        let mut out = Vec::new();
        // NB: a TLS peer may close without close_notify; what was read before counts.
        let read = s.read_to_end(&mut out).await;
        if out.is_empty() {
            read?;
        }
        Ok::<_, std::io::Error>(String::from_utf8_lossy(&out).to_string())
    };
    match tokio::time::timeout(Duration::from_secs(10), attempt).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(e)) => format!("failed: {e}"),
        Err(_) => "failed: no answer within 10 s".to_string(),
    }
}

/// Service `default/echo` of member `m`, backed by `echo_port` on the lab bridge. NB: the API
/// server proxies only to endpoints that name a pod with that IP, so a pod object stands for the
/// echo server (this member has no node: it stays Pending with the lab address as its IP).
pub(crate) async fn expose_echo(m: &MemberSide, echo_port: u16) {
    let ip = lab::GATEWAY.to_string();
    let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(m.admin.clone(), "default");
    let pod = serde_json::from_value(json!({"metadata": {"name": "echo", "namespace": "default"},
        "spec": {"containers": [{"name": "echo", "image": "echo"}]}}))
    .expect("pod");
    pods.create(&PostParams::default(), &pod).await.expect("pod");
    pods.patch_status(
        "echo",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({"status": {"podIP": ip, "podIPs": [{"ip": ip}]}})),
    )
    .await
    .expect("pod status");
    apply(
        &m.admin,
        Some("default"),
        json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "echo", "namespace": "default"},
        "spec": {"ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}}),
    )
    .await;
    let ep: Endpoints = serde_json::from_value(json!({"metadata": {"name": "echo", "namespace": "default"},
        "subsets": [{"addresses": [{"ip": lab::GATEWAY.to_string(),
                                    "targetRef": {"kind": "Pod", "name": "echo", "namespace": "default"}}],
                     "ports": [{"name": "http", "port": echo_port, "protocol": "TCP"}]}]}))
    .expect("endpoints");
    Api::<Endpoints>::namespaced(m.admin.clone(), "default")
        .create(&PostParams::default(), &ep)
        .await
        .expect("endpoints");
    // NB: newer API servers (1.37 here) proxy to a Service through its EndpointSlices, which no
    // controller mirrors from the Endpoints on this member (it runs no controller manager).
    apply(
        &m.admin,
        Some("default"),
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "echo-1", "namespace": "default", "labels": {"kubernetes.io/service-name": "echo"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [ip], "conditions": {"ready": true},
                       "targetRef": {"kind": "Pod", "name": "echo", "namespace": "default"}}],
        "ports": [{"name": "http", "port": echo_port, "protocol": "TCP"}]}),
    )
    .await;
}

/// A plain-HTTP server that switches any upgrade request to an echo of its bytes, except on a
/// path ending in `/refuse`, which it answers 403 with [`EchoServer::REFUSAL`].
pub(crate) struct EchoServer {
    pub(crate) port: u16,
    pub(crate) task: tokio::task::JoinHandle<()>,
}

impl EchoServer {
    pub(crate) const REFUSAL: &str = "the echo server does not upgrade here";

    pub(crate) async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind((lab::GATEWAY, 0))
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let svc =
                        hyper::service::service_fn(|mut req: Request<hyper::body::Incoming>| async move {
                            if req.uri().path().ends_with("/refuse") {
                                let resp = http::Response::builder()
                                    .status(StatusCode::FORBIDDEN)
                                    .body(http_body_util::Full::new(bytes::Bytes::from(Self::REFUSAL)))
                                    .expect("response");
                                return Ok::<_, std::convert::Infallible>(resp);
                            }
                            let on = hyper::upgrade::on(&mut req);
                            tokio::spawn(async move {
                                if let Ok(up) = on.await {
                                    let (mut r, mut w) = tokio::io::split(hyper_util::rt::TokioIo::new(up));
                                    let _ = tokio::io::copy(&mut r, &mut w).await;
                                }
                            });
                            let resp = http::Response::builder()
                                .status(StatusCode::SWITCHING_PROTOCOLS)
                                .header(CONNECTION, "Upgrade")
                                .header(UPGRADE, "tether-echo")
                                .body(http_body_util::Full::new(bytes::Bytes::new()))
                                .expect("response");
                            Ok(resp)
                        });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tcp), svc)
                        .with_upgrades()
                        .await;
                });
            }
        });
        Self { port, task }
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
