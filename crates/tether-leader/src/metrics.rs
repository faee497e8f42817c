//! The leader's Prometheus metrics, registered once and shared by every reconciler.

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabel {
    error: &'static str,
}

/// Counters of registrations and reconcile failures.
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    registrations: Family<ResultLabel, Counter>,
    errors: Family<ErrorLabel, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("tether_leader");
        let registrations = Family::<ResultLabel, Counter>::default();
        let errors = Family::<ErrorLabel, Counter>::default();
        registry.register(
            "registrations",
            "Registration requests decided, by result/reason",
            registrations.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Reconcile failures, by failed operation",
            errors.clone(),
        );
        Self {
            registry: Arc::new(registry),
            registrations,
            errors,
        }
    }
}

impl Metrics {
    /// Counts a decided registration (`Approved` or a denial reason).
    pub fn registrations(&self, result: &'static str) {
        self.registrations.get_or_create(&ResultLabel { result }).inc();
    }

    /// Counts a failed reconcile.
    pub fn reconcile_error(&self, error: &'static str) {
        self.errors.get_or_create(&ErrorLabel { error }).inc();
    }

    /// The metrics in Prometheus text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
