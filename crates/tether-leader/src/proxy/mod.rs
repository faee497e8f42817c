//! Member access through the leader: an aggregated API server (`proxy.multicluster.tether.dev`)
//! that only the replica holding the Lease serves. On gaining leadership it reads the API
//! server's front-proxy trust (and follows it while serving: a rotated CA needs no restart),
//! makes sure the shared serving certificate exists and that the APIService trusts it, listens,
//! and points the proxy Service's EndpointSlice at itself. What a caller of the port can make it
//! hold is bounded: a connection cap, handshake and header timeouts, and one short-lived request
//! for a peer that is not the API server's front proxy. While serving it closes every tunnel
//! whose proof no longer holds (`revoke`); on
//! losing it, it stops listening and closes every tunnel so agents reconnect to the new leader.

mod attach;
mod certificate;
pub mod challenge;
pub mod frontproxy;
pub mod identities;
pub mod pace;
mod rejoin;
pub mod revoke;
pub mod server;
pub mod serving;
pub mod shared;
mod trust;
pub mod tunnels;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, Preconditions};
use kube::core::GroupVersionKind;
use tether_api::ManagedCluster;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::Context;
use certificate::{Renewal, ensure_serving};
use frontproxy::{AUTH_CONFIGMAP, AUTH_NAMESPACE, FrontProxy};
use trust::{Trust, follow_trust};
use tunnels::{Change, Tunnels};

/// The field manager of what the proxy writes (its own: the Ready condition is another's).
pub const FIELD_MANAGER: &str = "tether-leader-proxy";
/// How long a caller has to complete the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a caller has to send a request's headers (HTTP/1; also an idle keep-alive).
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a connection without the front proxy's certificate may stay open at all.
const UNAUTHENTICATED_LIFETIME: Duration = Duration::from_secs(10);
/// HTTP/2 pings on the API server's connections, and how long an answer may take.
const H2_KEEPALIVE: (Duration, Duration) = (Duration::from_secs(30), Duration::from_secs(20));
/// How often the serving replica registers the APIService again.
const REREGISTER: Duration = Duration::from_secs(30);
/// How long shutdown waits to withdraw the APIService.
const WITHDRAW_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a refusal at the connection cap is logged at most.
const CAP_LOG_EVERY: Duration = Duration::from_secs(10);

/// Where and how the proxy serves.
#[derive(Clone, Debug)]
pub struct ProxyOptions {
    /// The address to listen on.
    pub addr: SocketAddr,
    /// The address the API server reaches this replica at (its pod IP), for the EndpointSlice.
    pub advertise: IpAddr,
    /// The leader's namespace (proxy Service, EndpointSlice, serving Secret).
    pub namespace: String,
    /// The selector-less Service the APIService points at.
    pub service: String,
    /// The Secret holding the shared serving certificate.
    pub secret: String,
    /// How long each serving certificate is valid; it is renewed at two thirds of that.
    pub cert_validity: Duration,
    /// Most connections open at once (each tunnel is one; the API server's requests share a few).
    pub max_connections: usize,
    /// Most attach challenges a second for agents without a live tunnel (0: unpaced); past it
    /// each is given a turn (`pace`).
    pub attach_rate: f64,
}

/// Why one serving term could not start.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// A call to the API server failed.
    #[error("{op}: {source}")]
    Api {
        /// What was attempted.
        op: &'static str,
        /// The cause.
        source: kube::Error,
    },
    /// The front-proxy trust is unusable.
    #[error(transparent)]
    FrontProxy(#[from] frontproxy::FrontProxyError),
    /// The serving certificate could not be made or used.
    #[error("serving certificate: {0}")]
    Tls(String),
    /// The listen address is taken or not ours.
    #[error("cannot listen on proxy address {addr}: {source} (choose another with --proxy-addr)")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        source: std::io::Error,
    },
}

fn api(op: &'static str) -> impl FnOnce(kube::Error) -> ProxyError {
    move |source| ProxyError::Api { op, source }
}

/// Serves member access while this replica leads, until `shutdown`.
pub async fn run(ctx: Arc<Context>, opts: ProxyOptions, shutdown: CancellationToken) {
    let (tx, rx) = mpsc::unbounded_channel();
    let tunnels = Arc::new(Tunnels::new(tx));
    tokio::spawn(follow_tunnels(ctx.clone(), tunnels.clone(), rx));
    // NB: followed from the start, on a standby too: at a failover, a replica that only began
    // to list 10,000 agents' ServiceAccounts when it gained the lease answered every attach
    // "not yet" for 28 s (at 9,000 members, its API server busy with the fleet's redials).
    let identities = Arc::new(identities::Identities::default());
    let follow = revoke::follow_identities(ctx.clone(), tunnels.clone(), identities.clone());
    let stop_following = shutdown.clone();
    tokio::spawn(async move {
        tokio::select! {
            () = follow => {}
            () = stop_following.cancelled() => {}
        }
    });
    let mut leader = ctx.leader.clone();
    let mut nonce = [0u8; 8];
    rand::RngCore::fill_bytes(&mut rand::rng(), &mut nonce);
    let served_by = format!("{}/{}", opts.advertise, hex::encode(nonce));
    withdraw_stale(&ctx, &opts).await;
    loop {
        tokio::select! {
            r = leader.wait_for(|l| *l) => if r.is_err() { return },
            _ = shutdown.cancelled() => return,
        }
        let stop = shutdown.child_token();
        let term = serve(&ctx, &opts, &served_by, &tunnels, &identities, stop.clone());
        let lost = async {
            let _ = leader.wait_for(|l| !*l).await;
        };
        tokio::select! {
            r = term => if let Err(err) = r {
                error!(error = &err as &dyn std::error::Error, "Member access is not served; retrying in 10 s");
                ctx.metrics.reconcile_error("proxy_serve");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(10)) => {}
                    _ = shutdown.cancelled() => {}
                }
            },
            _ = lost => info!("Lost the lease; member access stops here"),
            _ = shutdown.cancelled() => {}
        }
        stop.cancel();
        tunnels.close_all();
        ctx.metrics.set_tunnels(0);
        ctx.metrics.set_proxy_cert_expiry(0);
        if shutdown.is_cancelled() {
            // NB: a lost lease keeps the registration: the successor re-registers it as its own.
            withdraw(&ctx, |svc| served(svc) == Some(served_by.as_str())).await;
            return;
        }
    }
}

/// Registers the member-access APIService as `registration` says.
async fn register(ctx: &Context, registration: &serde_json::Value) -> Result<(), kube::Error> {
    Api::<DynamicObject>::all_with(ctx.client.clone(), &apiservice_resource())
        .patch(
            tether_tunnel::API_SERVICE,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(registration),
        )
        .await
        .map(|_| ())
}

/// While serving: registers the APIService again every `REREGISTER`, should anyone (an
/// upgrade of the chart that once shipped it, an admin) have removed or changed it.
async fn keep_registered(ctx: Arc<Context>, registration: serde_json::Value) {
    loop {
        tokio::time::sleep(REREGISTER).await;
        if let Err(e) = register(&ctx, &registration).await {
            warn!(
                error = &e as &dyn std::error::Error,
                "Cannot register the member-access APIService again; retrying"
            );
        }
    }
}

/// Who registered the APIService `svc`.
fn served(svc: &DynamicObject) -> Option<&str> {
    svc.metadata
        .annotations
        .as_ref()?
        .get(serving::SERVED_BY)
        .map(String::as_str)
}

/// Deletes the member-access APIService if `ours` says it is this replica's to delete, on the
/// condition that nobody changed it since it was read (a successor's registration stays).
async fn withdraw(ctx: &Context, ours: impl Fn(&DynamicObject) -> bool) {
    let api = Api::<DynamicObject>::all_with(ctx.client.clone(), &apiservice_resource());
    let attempt = async {
        let Some(svc) = api.get_opt(tether_tunnel::API_SERVICE).await? else {
            return Ok::<bool, kube::Error>(false);
        };
        if !ours(&svc) {
            return Ok(false);
        }
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: svc.metadata.resource_version.clone(),
                uid: svc.metadata.uid.clone(),
            }),
            ..DeleteParams::default()
        };
        api.delete(tether_tunnel::API_SERVICE, &dp).await?;
        Ok(true)
    };
    match tokio::time::timeout(WITHDRAW_TIMEOUT, attempt).await {
        Ok(Ok(true)) => {
            info!("Withdrew APIService v1alpha1.proxy.multicluster.tether.dev: no replica serves it now")
        }
        Ok(Ok(false)) => {}
        Ok(Err(e)) => warn!(
            error = &e as &dyn std::error::Error,
            "Cannot withdraw the member-access APIService"
        ),
        Err(_) => warn!("Withdrawing the member-access APIService timed out"),
    }
}

/// At start, before serving: an APIService whose EndpointSlice names this replica's own
/// address was left by this pod's previous container (a crash, an OOM kill): nobody serves it
/// now, so it goes until this replica serves again.
async fn withdraw_stale(ctx: &Context, opts: &ProxyOptions) {
    let slices = Api::<EndpointSlice>::namespaced(ctx.client.clone(), &opts.namespace);
    // NB: the address and the port: two replicas may share an address (host networking, or
    // the tests' lab), and a standby must not withdraw what the serving replica registered.
    let points_here = match slices.get_opt(&opts.service).await {
        Ok(Some(slice)) => {
            let port_matches = opts.addr.port() == 0
                || slice
                    .ports
                    .iter()
                    .flatten()
                    .any(|p| p.port == Some(i32::from(opts.addr.port())));
            port_matches
                && slice.endpoints.iter().any(|e| {
                    e.addresses
                        .iter()
                        .any(|a| a.parse::<IpAddr>().ok() == Some(opts.advertise))
                })
        }
        _ => false,
    };
    if points_here {
        withdraw(ctx, |_| true).await;
    }
}

/// One term of serving: set up, then accept until `stop`.
async fn serve(
    ctx: &Arc<Context>,
    opts: &ProxyOptions,
    served_by: &str,
    tunnels: &Arc<Tunnels>,
    identities: &Arc<identities::Identities>,
    stop: CancellationToken,
) -> Result<(), ProxyError> {
    let client = &ctx.client;
    let configmaps = Api::<ConfigMap>::namespaced(client.clone(), AUTH_NAMESPACE);
    let cm = configmaps
        .get(AUTH_CONFIGMAP)
        .await
        .map_err(api("read kube-system/extension-apiserver-authentication"))?;
    let front = FrontProxy::from_configmap(&cm)?;
    let secrets = Api::<Secret>::namespaced(client.clone(), &opts.namespace);
    let stored = ensure_serving(&secrets, opts).await?;
    ctx.metrics
        .set_proxy_cert_expiry(serving::expires_at(&stored.serving.cert).unwrap_or(0));
    let first = Trust::new(front, &stored.serving)?;
    let listener = tokio::net::TcpListener::bind(opts.addr)
        .await
        .map_err(|source| ProxyError::Listen {
            addr: opts.addr,
            source,
        })?;
    let bound = listener.local_addr().map_err(|source| ProxyError::Listen {
        addr: opts.addr,
        source,
    })?;
    let slice = serving::endpoint_slice(&opts.namespace, &opts.service, opts.advertise, bound.port());
    Api::<EndpointSlice>::namespaced(client.clone(), &opts.namespace)
        .patch(
            &opts.service,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&slice),
        )
        .await
        .map_err(api("point the proxy EndpointSlice at this replica"))?;
    // NB: the aggregator of Kubernetes 1.33 and older routes by Endpoints.
    let minor = client
        .apiserver_version()
        .await
        .map(|v| v.minor)
        .unwrap_or_default();
    if serving::routes_by_endpoints(&minor) {
        let endpoints = serving::endpoints(&opts.namespace, &opts.service, opts.advertise, bound.port());
        Api::<k8s_openapi::api::core::v1::Endpoints>::namespaced(client.clone(), &opts.namespace)
            .patch(
                &opts.service,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&endpoints),
            )
            .await
            .map_err(api(
                "point the proxy Endpoints at this replica (Kubernetes before 1.34)",
            ))?;
    }
    // NB: registered only now that a replica listens behind it: an APIService without a
    // serving replica fails discovery for its group, and namespace deletion everywhere in the
    // cluster waits on discovery (the metrics-server outage). It is withdrawn on shutdown.
    let registration = serving::api_service(&stored.serving.ca, &opts.namespace, &opts.service, served_by);
    register(ctx, &registration)
        .await
        .map_err(api("register APIService v1alpha1.proxy.multicluster.tether.dev"))?;
    let kept = keep_registered(ctx.clone(), registration);
    tokio::pin!(kept);
    info!(addr = %bound, advertise = %opts.advertise, "Serving member access (proxy.multicluster.tether.dev)");
    // NB: the front-proxy CA rotates without a restart of anything: new connections are
    // verified against what the ConfigMap says now; open ones keep the trust they were
    // verified with, as the API server's own aggregated servers do.
    let (trust_tx, trust) = watch::channel(Arc::new(first));
    let follow = follow_trust(
        configmaps,
        Renewal {
            secrets,
            opts,
            stored,
            metrics: ctx.metrics.clone(),
            retry: None,
        },
        trust_tx,
    );
    tokio::pin!(follow);
    let shared = Arc::new(shared::Shared {
        tunnels: tunnels.clone(),
        ctx: ctx.clone(),
        challenges: challenge::Challenges::default(),
        pace: std::sync::Mutex::new(pace::Pace::new(opts.attach_rate)),
        identities: identities.clone(),
        stop: stop.clone(),
        decoy: tether_seal::generate_keypair().1,
    });
    let revoked = revoke::sweep(ctx.clone(), tunnels.clone(), identities.clone());
    tokio::pin!(revoked);
    let slots = Arc::new(Semaphore::new(opts.max_connections));
    let mut cap_logged: Option<tokio::time::Instant> = None;
    loop {
        let (tcp, peer) = tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            _ = &mut follow => continue,
            _ = &mut revoked => continue,
            _ = &mut kept => continue,
            a = listener.accept() => match a {
                Ok(a) => a,
                Err(e) => { warn!(error = %e, "Accept failed"); continue }
            },
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            // NB: closed at once, before TLS: a flood costs a file descriptor for microseconds.
            drop(tcp);
            ctx.metrics.proxy_connection_refused();
            if cap_logged.is_none_or(|t| t.elapsed() >= CAP_LOG_EVERY) {
                cap_logged = Some(tokio::time::Instant::now());
                warn!(%peer, max = opts.max_connections,
                      "Member proxy connection cap reached; closing new connections (--proxy-max-connections)");
            }
            continue;
        };
        // NB: small HTTP/2 frames (a GET, a ping) must not wait for Nagle's delayed ACK.
        let _ = tcp.set_nodelay(true);
        let (current, shared) = (trust.borrow().clone(), shared.clone());
        let (stop, metrics) = (stop.clone(), ctx.metrics.clone());
        tokio::spawn(async move {
            let _open = Open::new(slot, metrics);
            let Ok(Ok(tls)) = tokio::time::timeout(HANDSHAKE_TIMEOUT, current.acceptor.accept(tcp)).await
            else {
                return;
            };
            let front: Result<Arc<FrontProxy>, Arc<str>> = current
                .front
                .check(tls.get_ref().1.peer_certificates())
                .map(|()| current.front.clone())
                .map_err(Arc::from);
            let trusted = front.is_ok();
            let svc =
                hyper::service::service_fn(move |req| server::handle(req, front.clone(), shared.clone()));
            let io = TokioIo::new(tls);
            if !trusted {
                // Not the API server's front proxy: one request (health, or a 401), then closed.
                let conn = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_TIMEOUT)
                    .keep_alive(false)
                    .serve_connection(io, svc);
                let _ = tokio::time::timeout(UNAUTHENTICATED_LIFETIME, conn).await;
                return;
            }
            let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT);
            builder
                .http2()
                .timer(TokioTimer::new())
                .keep_alive_interval(H2_KEEPALIVE.0)
                .keep_alive_timeout(H2_KEEPALIVE.1);
            let conn = builder.serve_connection_with_upgrades(io, svc);
            tokio::select! {
                _ = conn => {}
                _ = stop.cancelled() => {}
            }
        });
        ctx.metrics.set_tunnels(tunnels.len());
    }
}

/// One open connection to the proxy port: its slot under the cap and its count in the gauge,
/// both given back when it closes.
struct Open {
    _slot: OwnedSemaphorePermit,
    metrics: crate::Metrics,
}

impl Open {
    fn new(slot: OwnedSemaphorePermit, metrics: crate::Metrics) -> Self {
        metrics.proxy_connection(1);
        Self { _slot: slot, metrics }
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.metrics.proxy_connection(-1);
    }
}

fn apiservice_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("apiregistration.k8s.io", "v1", "APIService"),
        "apiservices",
    )
}

/// Tells the member health tracker of each tunnel change (while leading) and has the member
/// looked at again: its Ready and TunnelConnected conditions follow its tunnel from there
/// (`members.rs`), so a tunnel that closes and attaches again within the detection time writes
/// nothing.
async fn follow_tunnels(ctx: Arc<Context>, tunnels: Arc<Tunnels>, mut rx: mpsc::UnboundedReceiver<Change>) {
    while let Some(change) = rx.recv().await {
        ctx.metrics.set_tunnels(tunnels.len());
        if !*ctx.leader.borrow() {
            continue;
        }
        let now = std::time::Instant::now();
        ctx.health.start_term(now, k8s_openapi::jiff::Timestamp::now());
        let m = &change.member;
        let key = format!("{}/{}", m.namespace, m.name);
        match change.closed {
            None => ctx.health.tunnel_attached(&key, now),
            Some(how) => ctx.health.tunnel_closed(&key, now, how),
        }
        let mut member = ManagedCluster::new(
            &m.name,
            tether_api::ManagedClusterSpec {
                cluster_id: String::new(),
                cluster_set: String::new(),
                public_key: None,
            },
        );
        member.metadata.namespace = Some(m.namespace.clone());
        let _ = ctx.nudge.unbounded_send(member);
    }
}
