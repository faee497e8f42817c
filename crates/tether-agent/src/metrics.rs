//! The agent's Prometheus metrics: heartbeats, status writes, credential renewals, registrations
//! and whether the leader is reachable.

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabel {
    error: &'static str,
}

/// The results of tunnel attaches and key proofs.
const ATTACH_RESULTS: [&str; 5] = ["attached", "proven", "paced", "refused", "unreachable"];

/// Every metric of the agent, cheap to clone.
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    heartbeats: Family<ResultLabel, Counter>,
    registrations: Family<ResultLabel, Counter>,
    status_writes: Counter,
    renewals: Family<ResultLabel, Counter>,
    reachable: Gauge,
    leader: Gauge,
    proxied: Family<ResultLabel, Counter>,
    attaches: Family<ResultLabel, Counter>,
    tunnel_attached: Gauge,
    credential_expiry: Gauge,
    last_heartbeat: Gauge,
    failures: Family<ErrorLabel, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("tether_agent");
        let m = Self {
            registry: Arc::default(),
            heartbeats: Family::default(),
            registrations: Family::default(),
            status_writes: Counter::default(),
            renewals: Family::default(),
            reachable: Gauge::default(),
            leader: Gauge::default(),
            proxied: Family::default(),
            attaches: Family::default(),
            tunnel_attached: Gauge::default(),
            credential_expiry: Gauge::default(),
            last_heartbeat: Gauge::default(),
            failures: Family::default(),
        };
        registry.register(
            "heartbeats",
            "Heartbeats (renewals of the member's Lease on the leader, or of its announce with a leader \
             older than the Lease), by result (ok, failed)",
            m.heartbeats.clone(),
        );
        registry.register(
            "registrations",
            "Registrations, by result (Approved, Rejoined, Failed)",
            m.registrations.clone(),
        );
        registry.register(
            "status_writes",
            "ManagedCluster status writes to the leader",
            m.status_writes.clone(),
        );
        registry.register(
            "credential_renewals",
            "Credential renewals, by result (ok, failed)",
            m.renewals.clone(),
        );
        registry.register(
            "leader_reachable",
            "1 while heartbeats reach the leader",
            m.reachable.clone(),
        );
        registry.register(
            "is_leader",
            "1 while this replica holds the lease",
            m.leader.clone(),
        );
        registry.register(
            "proxied_requests",
            "Requests served through the tunnel, by result (ok, upgraded, forbidden, unauthorized, \
             streams_full, body_too_large, body_slow, body_budget_exhausted, body_broken, member_error)",
            m.proxied.clone(),
        );
        registry.register(
            "tunnel_attaches",
            format!(
                "Tunnel attaches and key proofs, by result ({})",
                ATTACH_RESULTS.join(", ")
            ),
            m.attaches.clone(),
        );
        registry.register(
            "tunnel_attached",
            "1 while this replica's tunnel to the leader is attached (0 with the tunnel off, on a \
             replica that does not lead, and between attaches)",
            m.tunnel_attached.clone(),
        );
        registry.register(
            "credential_expiry_timestamp_seconds",
            "When the credential the agent holds on the leader expires (Unix seconds; 0 before the \
             first); it is renewed with a third of its lifetime left",
            m.credential_expiry.clone(),
        );
        registry.register(
            "last_heartbeat_timestamp_seconds",
            "When a heartbeat last reached the leader (Unix seconds; 0 before the first)",
            m.last_heartbeat.clone(),
        );
        // NB: the series that alerts watch exist from the start at 0, so that an alert's
        // `increase()` sees the first failure.
        for result in ["ok", "failed"] {
            let _ = m.heartbeats.get_or_create(&ResultLabel { result });
            let _ = m.renewals.get_or_create(&ResultLabel { result });
        }
        for result in ATTACH_RESULTS {
            let _ = m.attaches.get_or_create(&ResultLabel { result });
        }
        registry.register(
            "session_failures",
            "Member sessions that failed and start again, by what failed (the error's label: \
             leader_unreachable, pin_mismatch, credential_rejected, join_token_expired, ...)",
            m.failures.clone(),
        );
        Self {
            registry: Arc::new(registry),
            ..m
        }
    }
}

impl Metrics {
    /// Counts a heartbeat.
    pub fn heartbeat(&self, ok: bool) {
        let result = if ok { "ok" } else { "failed" };
        self.heartbeats.get_or_create(&ResultLabel { result }).inc();
        self.reachable.set(ok.into());
        if ok {
            self.last_heartbeat
                .set(k8s_openapi::jiff::Timestamp::now().as_second());
        }
    }

    /// Records when the credential held now expires.
    pub fn set_credential_expiry(&self, at: Option<k8s_openapi::jiff::Timestamp>) {
        self.credential_expiry.set(at.map_or(0, |t| t.as_second()));
    }

    /// One series of every family, labelled as the agent labels it: what docs/metrics.md is
    /// generated from (`make generate`).
    pub fn documented() -> Self {
        let m = Self::default();
        m.heartbeat(true);
        m.registration("Approved");
        m.status_write();
        m.renewal(true);
        m.proxied("ok");
        m.attach("attached");
        m.set_tunnel_attached(true);
        m.set_leader(true);
        m.set_credential_expiry(None);
        m.session_failure("leader_unreachable");
        m
    }

    /// Counts a failed session, by its error's label.
    pub fn session_failure(&self, error: &'static str) {
        self.failures.get_or_create(&ErrorLabel { error }).inc();
    }

    /// Counts a registration outcome.
    pub fn registration(&self, result: &'static str) {
        self.registrations.get_or_create(&ResultLabel { result }).inc();
    }

    /// Counts a status write.
    pub fn status_write(&self) {
        self.status_writes.inc();
    }

    /// Counts a credential renewal.
    pub fn renewal(&self, ok: bool) {
        let result = if ok { "ok" } else { "failed" };
        self.renewals.get_or_create(&ResultLabel { result }).inc();
    }

    /// Counts a request served through the tunnel.
    pub fn proxied(&self, result: &'static str) {
        self.proxied.get_or_create(&ResultLabel { result }).inc();
    }

    /// Counts a tunnel attach or key proof.
    pub fn attach(&self, result: &'static str) {
        self.attaches.get_or_create(&ResultLabel { result }).inc();
    }

    /// Records whether the tunnel is attached.
    pub fn set_tunnel_attached(&self, attached: bool) {
        self.tunnel_attached.set(attached.into());
    }

    /// Records whether this replica leads.
    pub fn set_leader(&self, leader: bool) {
        self.leader.set(leader.into());
    }

    /// The metrics in Prometheus text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heartbeats_set_reachability() {
        let m = Metrics::default();
        m.heartbeat(true);
        m.heartbeat(false);
        m.status_write();
        let text = m.encode();
        for want in [
            "tether_agent_heartbeats_total{result=\"ok\"} 1",
            "tether_agent_heartbeats_total{result=\"failed\"} 1",
            "tether_agent_leader_reachable 0",
            "tether_agent_status_writes_total 1",
            "tether_agent_credential_renewals_total{result=\"failed\"} 0",
            "tether_agent_tunnel_attaches_total{result=\"refused\"} 0",
        ] {
            assert!(text.contains(want), "missing {want} in\n{text}");
        }
    }
}
