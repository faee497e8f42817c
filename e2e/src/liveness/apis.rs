//! The leader's kube-apiservers as the liveness benchmark reads them: one, or several in front
//! of the same etcd (`--api-servers`, as a highly available control plane runs), their figures
//! summed.

use super::*;
use crate::probe::prom::request_counts_within;

/// Every kube-apiserver of the leader's control plane: an admin client of each, and its pid.
#[derive(Clone)]
pub(super) struct Apis {
    servers: Vec<(Client, u32)>,
}

impl Apis {
    /// `clients` and `pids` of the same API servers, in the same order.
    pub(super) fn new(clients: Vec<Client>, pids: Vec<u32>) -> Self {
        assert_eq!(
            clients.len(),
            pids.len(),
            "a client and a pid for each API server"
        );
        Self {
            servers: clients.into_iter().zip(pids).collect(),
        }
    }

    /// How many.
    pub(super) fn len(&self) -> usize {
        self.servers.len()
    }

    /// Their process IDs.
    pub(super) fn pids(&self) -> Vec<u32> {
        self.servers.iter().map(|(_, pid)| *pid).collect()
    }

    /// Writes by resource, summed over every API server.
    pub(super) async fn request_counts(&self) -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        for (client, _) in &self.servers {
            add(&mut out, request_counts(client).await);
        }
        out
    }

    /// `request_counts`, or `None` if one of them does not answer within `within`.
    pub(super) async fn request_counts_within(&self, within: Duration) -> Option<BTreeMap<String, f64>> {
        let mut out = BTreeMap::new();
        for (client, _) in &self.servers {
            add(&mut out, request_counts_within(client, within).await?);
        }
        Some(out)
    }

    /// Requests by verb and resource, summed over every API server.
    pub(super) async fn request_mix(&self) -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        for (client, _) in &self.servers {
            add(&mut out, request_mix(client).await);
        }
        out
    }

    /// The `/metrics` text of each.
    pub(super) async fn metrics(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (client, _) in &self.servers {
            out.push(apiserver_metrics(client).await);
        }
        out
    }

    /// Has each collect its garbage now (a heap profile with `gc=1`, read and dropped); false
    /// if one does not serve `/debug/pprof` (started without `--profiling`).
    pub(super) async fn collect_garbage(&self) -> bool {
        use http_body_util::BodyExt;
        let mut all = true;
        for (client, _) in &self.servers {
            let req = http::Request::get("/debug/pprof/heap?gc=1")
                .body(kube::client::Body::empty())
                .expect("request");
            all &= match client.send(req).await {
                Ok(r) if r.status().is_success() => r.into_body().collect().await.is_ok(),
                _ => false,
            };
        }
        all
    }

    /// CPU time of all of them, in clock ticks.
    pub(super) fn cpu_ticks(&self) -> u64 {
        self.servers.iter().map(|(_, pid)| cpu_ticks(*pid)).sum()
    }

    /// Resident memory of all of them, MiB.
    pub(super) fn rss(&self) -> f64 {
        self.servers.iter().map(|(_, pid)| rss_mib(*pid, "VmRSS")).sum()
    }
}

fn add(into: &mut BTreeMap<String, f64>, from: BTreeMap<String, f64>) {
    for (k, v) in from {
        *into.entry(k).or_default() += v;
    }
}
