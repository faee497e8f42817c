//! The leader's Prometheus metrics, registered once and shared by every reconciler: decisions,
//! failures, reconcile durations, members by state and heartbeat ages.

use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tether_api::ManagedCluster;
use tether_api::clusterset::MemberCounts;

mod labels;
pub use labels::{Proxied, Revoked};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabel {
    error: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabel {
    controller: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MemberLabel {
    clusterset: String,
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MemberReadyLabel {
    clusterset: String,
    namespace: String,
    member: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabel {
    op: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

/// Every metric of the leader, cheap to clone.
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    registrations: Family<ResultLabel, Counter>,
    errors: Family<ErrorLabel, Counter>,
    durations: Family<ControllerLabel, Histogram>,
    members: Family<MemberLabel, Gauge>,
    removals: Family<ReasonLabel, Counter>,
    heartbeat_age: Histogram,
    leader: Gauge,
    tunnels: Gauge,
    proxied: Family<ResultLabel, Counter>,
    cert_expiry: Gauge,
    cert_renewals: Family<ResultLabel, Counter>,
    tunnel_replacements: Counter,
    tunnel_revocations: Family<ReasonLabel, Counter>,
    connections: Gauge,
    connections_refused: Counter,
    inventory_writes: Family<OpLabel, Counter>,
    /// The members' cache, read at each scrape for `member_ready` (only when turned on).
    member_ready: Option<Arc<std::sync::OnceLock<kube::runtime::reflector::Store<ManagedCluster>>>>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("tether_leader");
        let registrations = Family::<ResultLabel, Counter>::default();
        let errors = Family::<ErrorLabel, Counter>::default();
        let durations = Family::<ControllerLabel, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.001, 2.0, 14))
        });
        let members = Family::<MemberLabel, Gauge>::default();
        let removals = Family::<ReasonLabel, Counter>::default();
        let heartbeat_age = Histogram::new([1.0, 2.0, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 60.0, 120.0, 300.0]);
        let leader = Gauge::default();
        let tunnels = Gauge::default();
        let proxied = Family::<ResultLabel, Counter>::default();
        let cert_expiry = Gauge::default();
        let cert_renewals = Family::<ResultLabel, Counter>::default();
        let tunnel_replacements = Counter::default();
        let tunnel_revocations = Family::<ReasonLabel, Counter>::default();
        let connections = Gauge::default();
        let connections_refused = Counter::default();
        let inventory_writes = Family::<OpLabel, Counter>::default();
        registry.register(
            "inventory_writes",
            "Writes of members' ClusterProfiles, by operation (apply, status, delete): none at steady state",
            inventory_writes.clone(),
        );
        // NB: these series exist from the start, so that an alert on one sees its first rise.
        for result in ["renewed", "failed"] {
            let _ = cert_renewals.get_or_create(&ResultLabel { result });
        }
        for result in Proxied::ALL {
            let _ = proxied.get_or_create(&ResultLabel {
                result: result.label(),
            });
        }
        for reason in Revoked::ALL {
            let _ = tunnel_revocations.get_or_create(&ReasonLabel {
                reason: reason.label(),
            });
        }
        registry.register(
            "proxy_certificate_expiry_timestamp_seconds",
            "When the member proxy's serving certificate expires (Unix time); 0 while this replica does not serve",
            cert_expiry.clone(),
        );
        registry.register(
            "proxy_certificate_renewals",
            "Renewals of the member proxy's serving certificate while serving, by result (renewed, failed)",
            cert_renewals.clone(),
        );
        registry.register(
            "tunnels",
            "Member tunnels attached to this replica",
            tunnels.clone(),
        );
        registry.register(
            "proxy_requests",
            format!(
                "Requests to the member proxy API, by result ({})",
                Proxied::ALL.map(Proxied::label).join(", ")
            ),
            proxied.clone(),
        );
        registry.register(
            "tunnel_replacements",
            "Live member tunnels replaced by a new attach proven with the member's key",
            tunnel_replacements.clone(),
        );
        registry.register(
            "tunnel_revocations",
            format!(
                "Member tunnels closed because what they were proven with no longer holds, by reason ({})",
                Revoked::ALL.map(Revoked::label).join(", ")
            ),
            tunnel_revocations.clone(),
        );
        registry.register(
            "proxy_connections",
            "Open connections to the member proxy port",
            connections.clone(),
        );
        registry.register(
            "proxy_connections_refused",
            "Connections to the member proxy port closed at once because the cap was reached",
            connections_refused.clone(),
        );
        registry.register(
            "registrations",
            "Registration requests decided, by result (Approved, Rejoined, or the reason of a denial)",
            registrations.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Reconcile failures, by failed operation",
            errors.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Time spent in one reconcile, by controller",
            durations.clone(),
        );
        registry.register("members", "Members of each ClusterSet, by state", members.clone());
        registry.register("member_removals", "Members removed, by reason", removals.clone());
        registry.register(
            "heartbeat_age_seconds",
            "Age of a member's previous heartbeat when the next one arrives",
            heartbeat_age.clone(),
        );
        registry.register(
            "is_leader",
            "1 while this replica holds the lease",
            leader.clone(),
        );
        Self {
            registry: Arc::new(registry),
            registrations,
            errors,
            durations,
            members,
            removals,
            heartbeat_age,
            leader,
            tunnels,
            proxied,
            cert_expiry,
            cert_renewals,
            tunnel_replacements,
            tunnel_revocations,
            connections,
            connections_refused,
            inventory_writes,
            member_ready: None,
        }
    }
}

/// Observes a reconcile's duration when dropped.
pub struct ReconcileTimer {
    histogram: Histogram,
    start: Instant,
}

impl Drop for ReconcileTimer {
    fn drop(&mut self) {
        self.histogram.observe(self.start.elapsed().as_secs_f64());
    }
}

impl Metrics {
    /// Counts a decided registration (`Approved` or a denial reason).
    pub fn registrations(&self, result: &'static str) {
        self.registrations.get_or_create(&ResultLabel { result }).inc();
    }

    /// Counts a write of a member's ClusterProfile (`apply`, `status`, `delete`).
    pub fn inventory_write(&self, op: &'static str) {
        self.inventory_writes.get_or_create(&OpLabel { op }).inc();
    }

    /// Counts a failed reconcile.
    pub fn reconcile_error(&self, error: &str) {
        self.errors
            .get_or_create(&ErrorLabel {
                error: error.to_string(),
            })
            .inc();
    }

    /// One series of every family, labelled as the leader labels it: what docs/metrics.md is
    /// generated from (`make generate`).
    pub fn documented() -> Self {
        let m = Self::default();
        m.registrations("Approved");
        m.reconcile_error("apply/Role");
        drop(m.reconcile_timer("member"));
        m.set_members("tether-system/prod", &MemberCounts::default());
        m.member_removed("Left");
        m.heartbeat(Duration::from_secs(10));
        m.set_leader(true);
        m.set_tunnels(0);
        m.proxied(Proxied::Ok);
        m.set_proxy_cert_expiry(0);
        m.tunnel_replaced();
        m.tunnel_revoked(Revoked::MemberRemoved);
        m.proxy_connection(0);
        m.proxy_connection_refused();
        m.inventory_write("apply");
        let m = m.with_member_ready();
        let (store, mut writer) = kube::runtime::reflector::store::<ManagedCluster>();
        let mut mc = ManagedCluster::new(
            "east",
            tether_api::ManagedClusterSpec {
                cluster_id: "id".into(),
                cluster_set: "prod".into(),
                public_key: None,
            },
        );
        mc.metadata.namespace = Some("tether-prod-east".into());
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(mc));
        m.follow_members(store);
        m
    }

    /// Starts timing a reconcile of `controller`.
    pub fn reconcile_timer(&self, controller: &'static str) -> ReconcileTimer {
        ReconcileTimer {
            histogram: self
                .durations
                .get_or_create(&ControllerLabel { controller })
                .clone(),
            start: Instant::now(),
        }
    }

    /// Records a set's member counts.
    pub fn set_members(&self, clusterset: &str, counts: &MemberCounts) {
        for (state, n) in [
            ("ready", counts.ready),
            ("not_ready", counts.not_ready),
            ("pending", counts.pending),
        ] {
            self.members
                .get_or_create(&MemberLabel {
                    clusterset: clusterset.to_string(),
                    state,
                })
                .set(n.into());
        }
    }

    /// Counts a removed member.
    pub fn member_removed(&self, reason: &'static str) {
        self.removals.get_or_create(&ReasonLabel { reason }).inc();
    }

    /// Records the time between two heartbeats of a member.
    pub fn heartbeat(&self, interval: Duration) {
        self.heartbeat_age.observe(interval.as_secs_f64());
    }

    /// Records whether this replica leads.
    pub fn set_leader(&self, leader: bool) {
        self.leader.set(leader.into());
    }

    /// Records how many member tunnels are attached.
    pub fn set_tunnels(&self, n: usize) {
        self.tunnels.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// Counts a request to the member proxy API by result.
    pub fn proxied(&self, result: Proxied) {
        self.proxied
            .get_or_create(&ResultLabel {
                result: result.label(),
            })
            .inc();
    }

    /// Records when the served proxy certificate expires (Unix seconds; 0: not serving).
    pub fn set_proxy_cert_expiry(&self, unix_seconds: i64) {
        self.cert_expiry.set(unix_seconds);
    }

    /// Counts a renewal of the proxy serving certificate by result (`renewed`, `failed`).
    pub fn proxy_cert_renewal(&self, result: &'static str) {
        self.cert_renewals.get_or_create(&ResultLabel { result }).inc();
    }

    /// Counts a live tunnel replaced by a new proven attach.
    pub fn tunnel_replaced(&self) {
        self.tunnel_replacements.inc();
    }

    /// Counts a tunnel closed because it was revoked.
    pub fn tunnel_revoked(&self, reason: Revoked) {
        self.tunnel_revocations
            .get_or_create(&ReasonLabel {
                reason: reason.label(),
            })
            .inc();
    }

    /// A connection to the proxy port opened (+1) or closed (-1).
    pub fn proxy_connection(&self, delta: i64) {
        self.connections.inc_by(delta);
    }

    /// Counts a connection closed at once at the cap.
    pub fn proxy_connection_refused(&self) {
        self.connections_refused.inc();
    }

    /// Turns on `tether_leader_member_ready`: one series per member (`--member-metrics`).
    #[must_use]
    pub fn with_member_ready(mut self) -> Self {
        self.member_ready = Some(Arc::default());
        self
    }

    /// Gives the members' cache to `member_ready`, if it is on (`run` does, once the cache exists).
    pub fn follow_members(&self, store: kube::runtime::reflector::Store<ManagedCluster>) {
        if let Some(cell) = self.member_ready.as_ref() {
            let _ = cell.set(store);
        }
    }

    /// The metrics in Prometheus text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        if let Some(store) = self.member_ready.as_ref().and_then(|c| c.get()) {
            // NB: built from the cache at each scrape: a removed member's series goes with it.
            let family = Family::<MemberReadyLabel, Gauge>::default();
            for mc in store.state() {
                let ready = mc
                    .status
                    .as_ref()
                    .and_then(|s| {
                        tether_api::conditions::find(
                            &s.conditions,
                            tether_api::conditions::ConditionType::Ready,
                        )
                    })
                    .is_some_and(|c| c.status == "True");
                let label = MemberReadyLabel {
                    clusterset: mc.spec.cluster_set.clone(),
                    namespace: mc.metadata.namespace.clone().unwrap_or_default(),
                    member: mc.metadata.name.clone().unwrap_or_default(),
                };
                family.get_or_create(&label).set(ready.into());
            }
            let mut registry = Registry::with_prefix("tether_leader");
            registry.register(
                "member_ready",
                "1 while the member's Ready condition is True, else 0: one series per member, so \
                 off unless --member-metrics (the chart's memberMetrics) turns it on",
                family,
            );
            let mut more = String::new();
            let _ = prometheus_client::encoding::text::encode(&mut more, &registry);
            let more = more.trim_end().trim_end_matches("# EOF");
            // NB: OpenMetrics text ends with `# EOF`; a family after it would be ignored.
            let at = out.rfind("# EOF").unwrap_or(out.len());
            out.insert_str(at, more);
        }
        out
    }
}

#[cfg(test)]
mod tests;
