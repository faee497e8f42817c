//! Many simulated member agents in one process, against a real leader.
//!
//! Each simulated member does what `tether-agent` does, with the agent's own library code:
//! pin-checked discovery (`discovery`), registration with the join token (`register::register`),
//! one heartbeat Lease renewal per interval (`heartbeat::renew`, the intervals the leader asks
//! for: the long one while the member's tunnel is attached, jittered as the agent jitters them), a ManagedCluster status built by `report::summarize` and written by
//! `report::write_status`, credential renewal (`renewal::renewal_delay`, `renewal::request_token`:
//! one TokenRequest with a third of the lifetime left, jittered), and leave (`deregister`).
//!
//! What differs from N real agents, on purpose: all members share one HTTP connection pool
//! (each request still carries the member's own token), so that 10,000 members do not open
//! 10,000 TLS connections to an API server on the same small machine; and there is no member
//! cluster behind them (their nodes are synthetic), so a renewed credential is kept in memory, not
//! written to a member Secret.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeStatus};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::Api;
use kube::client::ConfigExt;
use kube::client::retry::RetryPolicy;
use tether_agent::heartbeat::{Intervals, jittered, renew};
use tether_agent::link::Link;
use tether_agent::register::{Registration, Target, register};
use tether_agent::renewal::{renewal_delay, request_token};
use tether_agent::report::{Report, status, summarize, write_status};
use tether_agent::state::Stored;
use tether_api::managedcluster::ApiServerHealth;
use tether_api::{ManagedCluster, MemberClusterAnnounce};
use tether_join::discovery::{self, Trust};
use tether_join::settle::Settle;
use tokio_util::sync::CancellationToken;
use tower::retry::RetryLayer;
use tower::{BoxError, ServiceBuilder};

/// What can go wrong.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The agent library failed (discovery, registration, denial, …).
    #[error(transparent)]
    Agent(#[from] tether_agent::Error),
    /// The leader's CA could not be fetched or does not match the pin.
    #[error(transparent)]
    Discovery(#[from] discovery::DiscoveryError),
    /// A call to the leader failed.
    #[error("{op}: {source}")]
    Leader {
        /// What was attempted.
        op: &'static str,
        /// The cause.
        source: kube::Error,
    },
}

/// Where the simulated members join. Its `Debug` never prints the join token.
#[derive(Clone)]
pub struct Join {
    /// The leader API server URL.
    pub leader_url: String,
    /// `sha256:<hex>` pin of the leader's CA.
    pub ca_cert_hash: String,
    /// The join (bootstrap) token.
    pub token: String,
    /// The set's namespace on the leader.
    pub namespace: String,
    /// How long one registration may wait for the leader's decision.
    pub registration_timeout: Duration,
}

impl std::fmt::Debug for Join {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Join")
            .field("leader_url", &self.leader_url)
            .field("ca_cert_hash", &self.ca_cert_hash)
            .field("token", &tether_seal::REDACTED)
            .field("namespace", &self.namespace)
            .field("registration_timeout", &self.registration_timeout)
            .finish()
    }
}

type Http =
    hyper_util::client::legacy::Client<hyper_rustls::HttpsConnector<HttpConnector>, kube::client::Body>;

/// Counters shared by all members.
#[derive(Debug, Default)]
pub struct Stats {
    /// Heartbeats the leader accepted.
    pub heartbeats: AtomicU64,
    /// Heartbeats that failed.
    pub heartbeat_failures: AtomicU64,
    /// Credentials renewed (TokenRequests answered with a token).
    pub renewals: AtomicU64,
    /// Credential renewals that failed (each retried 10 s later).
    pub renewal_failures: AtomicU64,
}

impl Stats {
    /// Heartbeats accepted so far.
    pub fn heartbeats(&self) -> u64 {
        self.heartbeats.load(Ordering::Relaxed)
    }

    /// Heartbeats failed so far.
    pub fn failures(&self) -> u64 {
        self.heartbeat_failures.load(Ordering::Relaxed)
    }

    /// Credentials renewed so far.
    pub fn renewals(&self) -> u64 {
        self.renewals.load(Ordering::Relaxed)
    }

    /// Credential renewals failed so far.
    pub fn renewal_failures(&self) -> u64 {
        self.renewal_failures.load(Ordering::Relaxed)
    }
}

/// The shared side of all simulated members: the verified leader and one connection pool.
pub struct Fleet {
    join: Join,
    reach: Arc<Reach>,
    bootstrap: Client,
    /// Counters of all members of this fleet.
    pub stats: Arc<Stats>,
}

/// How long one member's join took, as the agent sees it.
#[derive(Clone, Copy, Debug)]
pub struct Timings {
    /// From the create call to the unsealed credential (includes the agent's polling).
    pub registered: Duration,
    /// From the create call to the first heartbeat the leader accepted with that credential.
    pub usable: Duration,
}

impl Fleet {
    /// Reads the leader's CA over a connection proven to end at the pinned CA before anything is
    /// sent with the token, exactly as the agent does.
    pub async fn connect(join: Join) -> Result<Self, Error> {
        let pin = join
            .ca_cert_hash
            .parse()
            .map_err(discovery::DiscoveryError::from)?;
        let pem = discovery::fetch_leader_ca(&join.leader_url, &pin).await?;
        let trust = Trust::Ca(pem);
        let config = discovery::leader_config(&join.leader_url, &trust, None)?;
        // NB: TCP_NODELAY as on the agent's own leader connections (discovery::leader_client).
        let mut tcp = HttpConnector::new();
        tcp.enforce_http(false);
        tcp.set_nodelay(true);
        let connector = config
            .rustls_https_connector_with_connector(tcp)
            .map_err(|source| Error::Leader {
                op: "build TLS connector",
                source,
            })?;
        let http = hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build(connector);
        let reach = Arc::new(Reach {
            url: join.leader_url.clone(),
            trust,
            http,
            metrics: tether_agent::Metrics::default(),
        });
        let bootstrap = reach.client(&join.token)?;
        Ok(Self {
            join,
            reach,
            bootstrap,
            stats: Arc::default(),
        })
    }

    /// Registers the member `name` (also its cluster ID) with the agent's registration code,
    /// sends its first heartbeat and its first status report.
    pub async fn join(&self, name: &str) -> Result<(Member, Timings), Error> {
        let (identity, recipient) = tether_seal::generate_keypair();
        let started = Instant::now();
        let stored = register(
            &Target {
                bootstrap: self.bootstrap.clone(),
                namespace: &self.join.namespace,
            },
            &Registration {
                cluster_id: name,
                cluster_name: name,
                // NB: not under tether.dev: that prefix is the leader's alone.
                labels: [("simulated".to_string(), "true".to_string())].into(),
                identity: &identity,
                recipient: &recipient,
            },
            self.join.registration_timeout,
        )
        .await?;
        let registered = started.elapsed();
        let client = self.reach.client(&stored.credential.token)?;
        let ns = stored.credential.namespace.as_str();
        let mut member = Member {
            name: name.to_string(),
            namespace: ns.to_string(),
            announce: Api::namespaced(client.clone(), ns),
            lease: Api::namespaced(client.clone(), ns),
            cluster: Api::namespaced(client.clone(), ns),
            client: tokio::sync::watch::channel(client).0,
            intervals: Intervals::default(),
            link: Arc::new(Link::default()),
            stats: self.stats.clone(),
            stored,
            reach: self.reach.clone(),
            key: identity,
        };
        // As the agent does: a fresh credential's 403 may be RBAC still reaching the authorizer.
        let mut forbidden = Settle::forbidden();
        member.intervals = loop {
            match renew(&member.lease, &member.name, Timestamp::now()).await {
                Ok(interval) => break interval,
                Err(e) if forbidden.tolerate(&e) => tokio::time::sleep(Duration::from_secs(1)).await,
                Err(source) => {
                    return Err(Error::Leader {
                        op: "first heartbeat",
                        source,
                    });
                }
            }
        };
        member.stats.heartbeats.fetch_add(1, Ordering::Relaxed);
        let usable = started.elapsed();
        member.report().await?;
        Ok((member, Timings { registered, usable }))
    }
}

/// The verified leader and the connection pool all members share.
struct Reach {
    url: String,
    trust: Trust,
    http: Http,
    /// What every simulated tunnel counts into.
    metrics: tether_agent::Metrics,
}

impl Reach {
    /// A client of the leader with `token`, over the shared connection pool.
    fn client(&self, token: &str) -> Result<Client, Error> {
        client(&self.url, &self.trust, &self.http, token)
    }
}

/// A client of the leader with `token`, over the shared connection pool `http`.
fn client(url: &str, trust: &Trust, http: &Http, token: &str) -> Result<Client, Error> {
    let config = discovery::leader_config(url, trust, Some(token))?;
    let auth = config.auth_layer().map_err(|source| Error::Leader {
        op: "build auth layer",
        source,
    })?;
    // NB: the same stack as the agent's `Client::try_from(config)`, retries of 429/503/504
    // (honouring Retry-After) included; only the connection pool is shared.
    let retry = config
        .default_retry
        .then(|| RetryLayer::new(RetryPolicy::server_retry()));
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(retry)
        .option_layer(auth)
        .map_err(BoxError::from)
        .service(http.clone());
    Ok(Client::new(service, "default"))
}

/// One simulated member, registered.
pub struct Member {
    /// Its cluster name and ID.
    pub name: String,
    /// Its namespace on the leader.
    pub namespace: String,
    announce: Api<MemberClusterAnnounce>,
    lease: Api<Lease>,
    cluster: Api<ManagedCluster>,
    /// The heartbeat intervals the leader asked for last.
    pub intervals: Intervals,
    /// Whether its tunnel is attached (the long interval applies then).
    link: Arc<Link>,
    stats: Arc<Stats>,
    /// The current client (replaced on each renewal; the tunnel dials with the latest).
    client: tokio::sync::watch::Sender<Client>,
    /// The credential as registration or the last renewal left it.
    stored: Stored,
    reach: Arc<Reach>,
    /// Its private key (proves the member at each tunnel attach).
    key: String,
}

impl Member {
    /// One heartbeat (the agent's `heartbeat::renew`); returns the intervals the leader asks for.
    pub async fn beat(&self) -> Result<Intervals, Error> {
        let r = renew(&self.lease, &self.name, Timestamp::now()).await;
        let counter = if r.is_ok() {
            &self.stats.heartbeats
        } else {
            &self.stats.heartbeat_failures
        };
        counter.fetch_add(1, Ordering::Relaxed);
        r.map_err(|source| Error::Leader {
            op: "heartbeat",
            source,
        })
    }

    /// Writes the ManagedCluster status of a healthy 3-node cluster, built and written by the
    /// agent's report code.
    pub async fn report(&self) -> Result<(), Error> {
        let nodes: Vec<Node> = (0..3).map(|_| synthetic_node()).collect();
        let (counts, capacity, allocatable) = summarize(nodes.iter());
        let report = Report {
            nodes: counts,
            capacity,
            allocatable,
            kubernetes_version: Some("v1.34.4".into()),
            platform: Some("linux/amd64".into()),
            health: ApiServerHealth {
                livez: true,
                readyz: true,
            },
            // NB: the leader derives the cluster ID and set from the ManagedCluster itself.
            properties: Vec::new(),
        };
        let url = format!("https://{}.sim.invalid:6443", self.name);
        let status = status(&report, &url, &[], Some(Timestamp::now()), Timestamp::now());
        write_status(&self.cluster, &self.name, &status)
            .await
            .map(drop)
            .map_err(|source| Error::Leader {
                op: "report status",
                source,
            })
    }

    /// When the current credential expires (RFC 3339).
    pub fn credential_expiry(&self) -> &str {
        &self.stored.credential.expiration_timestamp
    }

    /// The member's ServiceAccount on the leader (the credential's identity).
    pub fn service_account(&self) -> &str {
        &self.stored.credential.service_account
    }

    /// Renews the credential as the agent does (one TokenRequest with the current credential,
    /// for the same lifetime) and switches every later request to the new token.
    pub async fn renew(&mut self) -> Result<(), Error> {
        let api = Api::<ServiceAccount>::namespaced(self.client.borrow().clone(), &self.namespace);
        let answer = request_token(&api, &self.stored).await;
        let status = match answer {
            Ok(Some(status)) => status,
            Ok(None) | Err(_) => {
                self.stats.renewal_failures.fetch_add(1, Ordering::Relaxed);
                return Err(Error::Leader {
                    op: "renew credential",
                    source: answer.err().unwrap_or_else(|| {
                        kube::Error::Service("the TokenRequest answer carried no token".into())
                    }),
                });
            }
        };
        self.stored.credential.token = status.token;
        self.stored.credential.expiration_timestamp = status.expiration_timestamp.0.to_string();
        let client = self.reach.client(&self.stored.credential.token)?;
        self.announce = Api::namespaced(client.clone(), &self.namespace);
        self.lease = Api::namespaced(client.clone(), &self.namespace);
        self.cluster = Api::namespaced(client.clone(), &self.namespace);
        self.client.send_replace(client);
        self.stats.renewals.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// The interval until the next heartbeat, without its jitter.
    pub fn interval(&self) -> Duration {
        self.intervals.next(*self.link.attached().borrow())
    }

    /// Heartbeats until `cancel`, as the agent's heartbeat loop does: the first one at a random
    /// point of the interval (so that members started together spread out), then every interval
    /// ±10%. A failed heartbeat is counted and retried at the next beat. Renews the credential
    /// when the agent would (`renewal::renewal_delay`); a failed renewal is retried after 10 s.
    pub async fn heartbeat_until(mut self, cancel: CancellationToken) -> Self {
        let attached = self.link.attached();
        let mut next_beat = Instant::now() + self.interval().mul_f64(rand_fraction(&self.name));
        let mut next_renewal = Instant::now() + renewal_delay(&self.stored, Timestamp::now());
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return self,
                _ = tokio::time::sleep_until(next_beat.into()) => {
                    if let Ok(intervals) = self.beat().await {
                        self.intervals = intervals;
                    }
                    next_beat = Instant::now() + jittered(self.intervals.next(*attached.borrow()));
                }
                _ = tokio::time::sleep_until(next_renewal.into()) => {
                    next_renewal = Instant::now() + match self.renew().await {
                        Ok(()) => renewal_delay(&self.stored, Timestamp::now()),
                        Err(_) => Duration::from_secs(10),
                    };
                }
            }
        }
    }

    /// Keeps the member's tunnel attached to the leader through the agent's own tunnel code
    /// (until the task is dropped). NB: a simulated member has no API server of its own; a
    /// request through its tunnel would reach the leader's API server as the member itself.
    pub fn tunnel(&self, set: &str) -> impl std::future::Future<Output = ()> + Send + use<> {
        let rx = self.client.subscribe();
        let client = self.client.borrow().clone();
        let access = tether_agent::tunnel::MemberAccess::new(
            client.clone(),
            client,
            Default::default(),
            self.reach.metrics.clone(),
        );
        let at = self.attach(set);
        let link = self.link.clone();
        async move {
            let _ = tether_agent::tunnel::run(rx, access, at, &link).await;
            link.set_attached(false);
        }
    }

    /// Who the member is at the leader's `attach`, in set `set`.
    fn attach(&self, set: &str) -> tether_agent::tunnel::Attach {
        tether_agent::tunnel::Attach {
            set: set.to_string(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            key: self.key.clone(),
        }
    }

    /// Attaches the member's tunnel once through the agent's own code and holds it without
    /// serving it: the tunnel of a frozen agent, open but answering nothing (not even pings).
    /// Dropping what the future gives closes it.
    pub fn frozen_tunnel(
        &self,
        set: &str,
    ) -> impl std::future::Future<Output = Result<Box<dyn std::any::Any + Send>, Error>> + Send + use<> {
        let at = self.attach(set);
        let client = self.client.subscribe();
        async move {
            let client = client.borrow().clone();
            tether_agent::tunnel::attach_unserved(&client, &at)
                .await
                .map(|held| Box::new(held) as Box<dyn std::any::Any + Send>)
                .map_err(|why| Error::Leader {
                    op: "attach a frozen tunnel",
                    source: kube::Error::Service(why.into()),
                })
        }
    }

    /// Leaves: the agent's `deregister` (deletes the announce with the member's credential).
    pub async fn leave(&self) -> Result<(), Error> {
        tether_agent::deregister(&self.announce, &self.name)
            .await
            .map_err(|source| Error::Leader {
                op: "deregister",
                source,
            })
    }
}

/// A fraction in [0, 1) derived from `name`, so that start offsets are spread but repeatable.
fn rand_fraction(name: &str) -> f64 {
    let h = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    (h % 10_000) as f64 / 10_000.0
}

fn synthetic_node() -> Node {
    let resources = [("cpu", "4"), ("memory", "16Gi"), ("pods", "110")]
        .into_iter()
        .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
        .collect::<std::collections::BTreeMap<_, _>>();
    Node {
        status: Some(NodeStatus {
            capacity: Some(resources.clone()),
            allocatable: Some(resources),
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: "True".into(),
                ..NodeCondition::default()
            }]),
            ..NodeStatus::default()
        }),
        ..Node::default()
    }
}

/// Joins the members `names`, `concurrency` at a time, handing each to `joined` as soon as it
/// is in (so that it can start heartbeating at once, as an agent does). Stops at the first
/// failure and returns it; otherwise returns how many joined.
pub async fn join_all(
    fleet: &Fleet,
    names: Vec<String>,
    concurrency: usize,
    mut joined: impl FnMut(Member, Timings),
) -> Result<usize, Error> {
    use futures::{StreamExt, TryStreamExt};
    let mut count = 0;
    let mut stream = futures::stream::iter(names)
        .map(|name| async move { fleet.join(&name).await })
        .buffer_unordered(concurrency.max(1));
    while let Some((member, timings)) = stream.try_next().await? {
        count += 1;
        joined(member, timings);
    }
    Ok(count)
}

/// The `p` quantile (0..=1) of sorted `values`, by the nearest-rank method.
pub fn quantile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_of_a_join_never_prints_the_token() {
        let j = Join {
            leader_url: "https://leader:6443".into(),
            ca_cert_hash: "sha256:00".into(),
            token: "abcdef.0123456789abcdef".into(),
            namespace: "tether-system".into(),
            registration_timeout: Duration::from_secs(1),
        };
        let text = format!("{j:?}");
        assert!(
            !text.contains("0123456789abcdef") && text.contains("leader:6443"),
            "{text}"
        );
    }
}
