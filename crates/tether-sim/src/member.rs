//! One simulated member: its heartbeat, its status report and its credential renewal, each
//! through the agent's own code.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeStatus};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::Api;
use tether_agent::heartbeat::{Intervals, due_after_change, jittered, renew};
use tether_agent::link::Link;
use tether_agent::renewal::{renewal_delay, request_token};
use tether_agent::report::{Report, status, summarize, write_status};
use tether_agent::state::Stored;
use tether_api::managedcluster::ApiServerHealth;
use tether_api::{ManagedCluster, ManagedClusterStatus, MemberClusterAnnounce};
use tokio_util::sync::CancellationToken;

use crate::{Error, Reach, Stats};

/// One simulated member, registered.
pub struct Member {
    /// Its cluster name and ID.
    pub name: String,
    /// Its namespace on the leader.
    pub namespace: String,
    pub(crate) announce: Api<MemberClusterAnnounce>,
    pub(crate) lease: Api<Lease>,
    pub(crate) cluster: Api<ManagedCluster>,
    /// The heartbeat intervals the leader asked for last.
    pub intervals: Intervals,
    /// Whether its tunnel is attached (the long interval applies then).
    pub(crate) link: Arc<Link>,
    pub(crate) stats: Arc<Stats>,
    /// The current client (replaced on each renewal; the tunnel dials with the latest).
    pub(crate) client: tokio::sync::watch::Sender<Client>,
    /// The credential as registration or the last renewal left it.
    pub(crate) stored: Stored,
    pub(crate) reach: Arc<Reach>,
    /// Its private key (proves the member at each tunnel attach).
    pub(crate) key: String,
    /// Its tunnel, when it dialled it as it joined (`Fleet::tunnels_at_join`).
    pub tunnel_task: Option<tokio::task::JoinHandle<()>>,
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
        write_status(&self.cluster, &self.name, &healthy_status(&self.name))
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
    /// ±10%, moved as its tunnel is lost and comes back (`heartbeat::due_after_change`). A failed
    /// heartbeat is counted and retried at the next beat. Renews the credential when the agent
    /// would (`renewal::renewal_delay`); a failed renewal is retried after 10 s.
    pub async fn heartbeat_until(mut self, cancel: CancellationToken) -> Self {
        let mut attached = self.link.attached();
        let mut following = true;
        // NB: the first beat is a random point of an interval: as if the last was one before.
        // NB: one reading of the interval: the tunnel may attach between two, and a shorter
        // second one would make the subtraction underflow.
        let interval = self.interval();
        let first = interval.mul_f64(rand_fraction(&self.name));
        let mut last_beat = Instant::now()
            .checked_sub(interval.saturating_sub(first))
            .unwrap_or_else(Instant::now);
        let mut next_beat = Instant::now() + first;
        let mut next_renewal = Instant::now() + renewal_delay(&self.stored, Timestamp::now());
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return self,
                changed = attached.changed(), if following => match changed {
                    // NB: no tunnel any more (member access off): the intervals as they are.
                    Err(_) => following = false,
                    Ok(()) => {
                        let now = *attached.borrow_and_update();
                        next_beat = due_after_change(next_beat, last_beat, Instant::now(), now, self.intervals);
                    }
                },
                _ = tokio::time::sleep_until(next_beat.into()) => {
                    if let Ok(intervals) = self.beat().await {
                        self.intervals = intervals;
                    }
                    last_beat = Instant::now();
                    next_beat = last_beat + jittered(self.intervals.next(*attached.borrow()));
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

/// The ManagedCluster status the agent of a healthy 3-node cluster `name` writes, built by the
/// agent's report code.
pub fn healthy_status(name: &str) -> ManagedClusterStatus {
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
    let url = format!("https://{name}.sim.invalid:6443");
    status(&report, &url, &[], Some(Timestamp::now()), Timestamp::now())
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
