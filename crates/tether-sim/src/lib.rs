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
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::Api;
use kube::client::ConfigExt;
use tether_agent::heartbeat::{FIRST_ATTACH_WAIT, Intervals, first_attach, renew};
use tether_agent::link::Link;
use tether_agent::register::{Registration, Target, register};
use tether_join::discovery::{self, Trust};
use tether_join::settle::Settle;
use tower::{BoxError, ServiceBuilder};

mod member;

pub use member::{Member, healthy_status};

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

/// Idle connections to the leader the shared pool keeps.
const POOL_IDLE: usize = 256;

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
    /// The leader's API servers (one unless `also_through` added more), each with its own
    /// connection pool and a client with the join token; members take them in turn.
    reaches: Vec<(Arc<Reach>, Client)>,
    next: std::sync::atomic::AtomicUsize,
    /// The set whose members dial their tunnel as they join, if they do (`tunnels_at_join`).
    tunnels_in: Option<String>,
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
        let reach = Arc::new(Reach::new(&join.leader_url, Trust::Ca(pem))?);
        let bootstrap = reach.client(&join.token)?;
        Ok(Self {
            join,
            reaches: vec![(reach, bootstrap)],
            next: Default::default(),
            tunnels_in: None,
            stats: Arc::default(),
        })
    }

    /// Members joining from now on dial their tunnel to set `set` once registered and send their
    /// first heartbeat once its first dial ended (at most `FIRST_ATTACH_WAIT` later), as an agent
    /// with member access does; each keeps it in `Member::tunnel_task`.
    pub fn tunnels_at_join(&mut self, set: &str) {
        self.tunnels_in = Some(set.to_string());
    }

    /// Adds another API server of the same leader control plane (`url`, serving with the same
    /// CA as the pinned one): members joining from now on take the API servers in turn, for
    /// their registration, heartbeats and tunnel, as agents behind a load balancer would.
    pub fn also_through(&mut self, url: &str) -> Result<(), Error> {
        let trust = self.reaches[0].0.trust.clone();
        let reach = Arc::new(Reach::new(url, trust)?);
        let bootstrap = reach.client(&self.join.token)?;
        self.reaches.push((reach, bootstrap));
        Ok(())
    }

    /// Registers the member `name` (also its cluster ID) with the agent's registration code,
    /// (with `tunnels_at_join`, attaches its tunnel,) sends its first heartbeat and its first
    /// status report.
    pub async fn join(&self, name: &str) -> Result<(Member, Timings), Error> {
        let (identity, recipient) = tether_seal::generate_keypair();
        let started = Instant::now();
        let turn = self.next.fetch_add(1, Ordering::Relaxed) % self.reaches.len();
        let (reach, bootstrap) = &self.reaches[turn];
        let stored = register(
            &Target {
                bootstrap: bootstrap.clone(),
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
        let client = reach.client(&stored.credential.token)?;
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
            reach: reach.clone(),
            key: identity,
            tunnel_task: None,
        };
        if let Some(set) = &self.tunnels_in {
            member.tunnel_task = Some(tokio::spawn(member.tunnel(set)));
            first_attach(&member.link, FIRST_ATTACH_WAIT).await;
        }
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
    /// The API server at `url`, trusted by `trust`, with a connection pool of its own.
    fn new(url: &str, trust: Trust) -> Result<Self, Error> {
        let config = discovery::leader_config(url, &trust, None)?;
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
        // NB: hyper keeps every idle connection unless told; a fleet's burst would leave
        // thousands open in this one process, against its open-file limit.
        let http = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(POOL_IDLE)
            .build(connector);
        Ok(Self {
            url: url.to_string(),
            trust,
            http,
            metrics: tether_agent::Metrics::default(),
        })
    }

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
    let retry = config.default_retry.then(tether_join::retry::layer);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(retry)
        .option_layer(auth)
        .map_err(BoxError::from)
        .service(http.clone());
    Ok(Client::new(service, "default"))
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
