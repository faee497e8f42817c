//! The benchmark's report: the tables of an `Outcome`, and the capacity table.

use std::fmt::Write as _;
use std::time::Duration;

use tether_sim::quantile;

use super::*;

impl Outcome {
    /// Writes per second the API server took over the steady window, of kind `kind`.
    fn writes_of(&self, kind: &str) -> f64 {
        self.writes.get(kind).copied().unwrap_or(0.0)
    }

    /// All steady writes per second.
    pub fn total_writes(&self) -> f64 {
        self.writes.values().sum()
    }

    /// Heartbeat writes per heartbeat the members sent (the target is 1).
    pub fn writes_per_heartbeat(&self) -> f64 {
        if self.heartbeats == 0.0 {
            return 0.0;
        }
        self.writes_of(ANNOUNCE) / self.heartbeats
    }

    /// Registration throughput (members/s).
    pub fn throughput(&self) -> f64 {
        self.members as f64 / self.registration_wall.as_secs_f64().max(f64::EPSILON)
    }

    /// The table of this run, in Markdown.
    pub fn table(&self) -> String {
        let ms = |d: Duration| format!("{:.0} ms", d.as_secs_f64() * 1000.0);
        let s = |d: Duration| format!("{:.1} s", d.as_secs_f64());
        let pct = |x: f64| format!("{:.0}%", x * 100.0);
        let ratio = |x: f64| format!("{:.1}% of the API server limit", x / self.api_limit * 100.0);
        let mut t = String::new();
        let _ = writeln!(
            t,
            "\n### N = {} (heartbeat {}s, grace {}s, {} registrations in flight)\n",
            self.members, self.interval, self.grace, self.concurrency
        );
        let _ = writeln!(t, "| figure | value | note |\n| --- | --- | --- |");
        let mut row = |a: &str, b: String, c: String| {
            let _ = writeln!(t, "| {a} | {b} | {c} |");
        };
        if let Some(p) = &self.profiles {
            row(
                "ClusterProfile writes",
                format!(
                    "{:.2} per registration, {:.2} /s steady",
                    p.per_registration, p.steady
                ),
                format!(
                    "a member silent → Unknown: {:.0}; one joining and leaving: {:.0}; failover window: {:.0}",
                    p.silent_member, p.join_and_leave, p.failover
                ),
            );
        }
        row(
            "API server limit (small writes)",
            format!("{:.0} writes/s", self.api_limit),
            "Lease updates, same API server + etcd".into(),
        );
        row(
            "registration throughput",
            format!("{:.1} /s", self.throughput()),
            format!(
                "{} members in {}; ≈ {:.0} writes/s, {}",
                self.members,
                s(self.registration_wall),
                self.throughput() * WRITES_PER_REGISTRATION,
                ratio(self.throughput() * WRITES_PER_REGISTRATION)
            ),
        );
        let p50_p99 =
            |sorted: &[Duration]| format!("{} / {}", ms(quantile(sorted, 0.5)), ms(quantile(sorted, 0.99)));
        row(
            "request → Approved p50 / p99",
            p50_p99(&self.approved),
            "seen by a watch on the leader".into(),
        );
        row(
            "request → usable credential p50 / p99",
            p50_p99(&self.usable),
            "first heartbeat accepted; includes the agent's polling".into(),
        );
        for (who, share) in &self.registration_cpu {
            row(
                &format!("CPU during registration: {who}"),
                pct(*share),
                "of one core".into(),
            );
        }
        row(
            "last join → all members Ready in the set status",
            s(self.all_ready),
            "Ready needs the first heartbeat seen".into(),
        );
        row(
            "leader reconcile errors (retried)",
            self.reconcile_errors.to_string(),
            format!(
                "slowest approvals (creation order, latency): {}",
                self.slowest
                    .iter()
                    .map(|(_, i, d)| format!("#{i} {:.1} s", d.as_secs_f64()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        );
        row(
            "heartbeats sent",
            format!("{:.1} /s", self.heartbeats),
            format!("{} failed over the run", self.heartbeat_failures),
        );
        row(
            "announce writes per heartbeat",
            format!("{:.2}", self.writes_per_heartbeat()),
            "target 1".into(),
        );
        for kind in [ANNOUNCE, MANAGED_CLUSTER_STATUS, CLUSTER_SET_STATUS, OTHER] {
            row(
                &format!("steady writes: {kind}"),
                format!("{:.2} /s", self.writes_of(kind)),
                ratio(self.writes_of(kind)),
            );
        }
        row(
            "steady writes: all",
            format!("{:.2} /s", self.total_writes()),
            ratio(self.total_writes()),
        );
        for (who, share) in &self.steady_cpu {
            row(
                &format!("CPU at steady state: {who}"),
                pct(*share),
                "of one core".into(),
            );
        }
        row(
            "leader RSS (steady / peak)",
            format!("{:.0} / {:.0} MiB", self.leader_rss, self.leader_peak_rss),
            "target ≤ 256 MiB at 10,000".into(),
        );
        row(
            "member silent → Ready=Unknown",
            s(self.detection),
            format!("grace period {}s", self.grace),
        );
        row(
            "join → ClusterSet status counts it",
            s(self.join_visible),
            "includes the registration".into(),
        );
        row(
            "leave → ClusterSet status drops it",
            s(self.leave_visible),
            "set status is paced to once a second".into(),
        );
        for (i, f) in self.failovers.iter().enumerate() {
            let mut which = if self.failovers.len() == 1 {
                "leader failover".to_string()
            } else {
                format!("leader failover {}", i + 1)
            };
            if let Some(bin) = &f.bin {
                which.push_str(&format!(" ({})", bin.display()));
            }
            row(
                &format!("{which}: killed → new leader ready"),
                s(f.ready),
                "a new process lists every kind and acts; no Lease wait (election off here)".into(),
            );
            row(
                &format!("{which}: new leader peak RSS"),
                format!("{:.0} MiB", f.peak_rss),
                format!("over its first {}", s(self.failover_window)),
            );
            let total: f64 = f.writes.values().sum();
            row(
                &format!("{which}: writes/s in the new leader's first window"),
                format!("{total:.2} /s"),
                format!(
                    "steady {:.2} /s; by kind: {}",
                    self.total_writes(),
                    f.writes
                        .iter()
                        .map(|(k, v)| format!("{k} {v:.2}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            );
        }
        if let Some(r) = &self.renewals {
            row(
                "credential renewals (TokenRequests/s)",
                format!("{:.2} /s", r.api_rate),
                format!(
                    "credentialTTL {}s, {} window; counted by the API server; members renewed {:.2} /s, \
                     the agent's schedule predicts {:.2} /s; {} renewals failed over the run, {} \
                     heartbeats failed in the window",
                    r.ttl.as_secs(),
                    s(r.window),
                    r.sim_rate,
                    r.expected_rate,
                    r.failures,
                    r.heartbeat_failures
                ),
            );
            row(
                "writes/s while renewing (all)",
                format!("{:.2} /s", r.writes),
                format!(
                    "steady window before it: {:.2} /s (members that joined ¾ TTL before it already renewed there)",
                    self.total_writes()
                ),
            );
            for (who, share) in &r.cpu {
                row(
                    &format!("CPU while renewing: {who}"),
                    pct(*share),
                    "of one core".into(),
                );
            }
        }
        t
    }
}

/// The member count the API server limit implies at each heartbeat interval, if heartbeats may
/// take `HEARTBEAT_SHARE` of it.
pub fn capacity_table(api_limit: f64) -> String {
    let mut t =
        String::from("| heartbeat interval | members (heartbeats at 30% of the limit) |\n| --- | --- |\n");
    for i in [10u64, 30, 60, 120, 300] {
        let _ = writeln!(t, "| {i} s | {:.0} |", api_limit * HEARTBEAT_SHARE * i as f64);
    }
    t
}
