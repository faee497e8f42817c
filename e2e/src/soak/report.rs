//! The soak's report: recovery per fault, members lost, writes, and the leader's memory and
//! CPU against the targets.

use std::fmt::Write as _;
use std::time::Duration;

use tether_sim::quantile;

use super::*;

impl Outcome {
    /// Whether every target was met.
    pub fn passed(&self) -> bool {
        let bound = self.recovery_bound();
        self.lost.is_empty()
            && self.duplicates.is_empty()
            && self.timeouts.is_empty()
            && self.recoveries.values().flatten().all(|d| *d <= bound)
            && memory_met(&self.lives)
    }

    fn recovery_bound(&self) -> Duration {
        self.settings.interval * 5
    }

    /// The report as Markdown.
    pub fn table(&self) -> String {
        let s = &self.settings;
        let mut out = String::new();
        let grace = s.interval * 4;
        let _ = writeln!(
            out,
            "## Soak: {} members, {:?}, heartbeat {:?}, grace {grace:?}, faults every {:?}–{:?}\n\n\
             Leader binary: `{}`.\n",
            s.members, s.duration, s.interval, s.gap.0, s.gap.1, self.binary
        );
        let _ = writeln!(
            out,
            "| fault | times | recovery p50 | recovery p99 | max | most members seen not Ready |"
        );
        let _ = writeln!(out, "| --- | --- | --- | --- | --- | --- |");
        let mut all = Vec::new();
        for (fault, times) in &self.recoveries {
            let mut t = times.clone();
            t.sort();
            all.extend(t.iter().copied());
            let _ = writeln!(
                out,
                "| {fault:?} | {} | {:.1} s | {:.1} s | {:.1} s | {} |",
                t.len(),
                quantile(&t, 0.5).as_secs_f64(),
                quantile(&t, 0.99).as_secs_f64(),
                t.last().copied().unwrap_or_default().as_secs_f64(),
                self.unready.get(fault).copied().unwrap_or_default()
            );
        }
        all.sort();
        let _ = writeln!(
            out,
            "| all | {} | {:.1} s | {:.1} s | {:.1} s | |\n",
            all.len(),
            quantile(&all, 0.5).as_secs_f64(),
            quantile(&all, 0.99).as_secs_f64(),
            all.last().copied().unwrap_or_default().as_secs_f64()
        );
        let mark = |ok: bool| if ok { "ok" } else { "MISSED" };
        let bound = self.recovery_bound();
        let worst = all.last().copied().unwrap_or_default();
        let _ = writeln!(out, "| figure | value | target |");
        let _ = writeln!(out, "| --- | --- | --- |");
        let _ = writeln!(
            out,
            "| members lost | {} {:?} | 0 ({}) |",
            self.lost.len(),
            self.lost.iter().take(5).collect::<Vec<_>>(),
            mark(self.lost.is_empty())
        );
        let _ = writeln!(
            out,
            "| duplicate registrations | {} {:?} | 0 ({}) |",
            self.duplicates.len(),
            self.duplicates.iter().take(5).collect::<Vec<_>>(),
            mark(self.duplicates.is_empty())
        );
        let _ = writeln!(
            out,
            "| recovery, worst | {:.1} s{} | ≤ grace + one heartbeat = {:.0} s ({}) |",
            worst.as_secs_f64(),
            if self.timeouts.is_empty() {
                String::new()
            } else {
                format!(", {} never recovered: {:?}", self.timeouts.len(), self.timeouts)
            },
            bound.as_secs_f64(),
            mark(worst <= bound && self.timeouts.is_empty())
        );
        let _ = writeln!(
            out,
            "| heartbeats failed | {} of {} ({:.2} %; while the API server was down or etcd paused) | — |",
            self.heartbeat_failures,
            self.heartbeats + self.heartbeat_failures,
            100.0 * self.heartbeat_failures as f64
                / (self.heartbeats + self.heartbeat_failures).max(1) as f64
        );
        let by_kind: Vec<String> = self
            .writes_by_kind
            .iter()
            .map(|(k, v)| format!("{k} {v:.0}"))
            .collect();
        let _ = writeln!(
            out,
            "| writes per heartbeat | {:.2} ({}) | — |",
            self.writes / self.heartbeats.max(1) as f64,
            by_kind.join(", ")
        );
        let mib = |v: &[f64]| v.iter().map(|m| format!("{m:.1}")).collect::<Vec<_>>().join(", ");
        let pct = |g: f64| format!("{:+.1} %", 100.0 * g);
        for (i, l) in self.lives.iter().enumerate() {
            let rss: Vec<f64> = l.samples.iter().map(|s| s.rss).collect();
            let heap: Vec<f64> = l.samples.iter().filter_map(|s| s.heap).collect();
            let verdict = l.verdict();
            let (judged, growth) = match &verdict {
                Verdict::Judged { from, rss, heap } => {
                    let (lo, hi) = l
                        .samples
                        .iter()
                        .filter(|s| s.at >= from.at)
                        .fold((f64::MAX, f64::MIN), |(lo, hi), s| (lo.min(s.rss), hi.max(s.rss)));
                    let rss = format!("RSS {} (within {lo:.1}–{hi:.1} MiB)", pct(*rss));
                    (
                        format!(
                            "{} {}",
                            if heap.is_some() { "live heap" } else { "RSS" },
                            mark(verdict.met())
                        ),
                        format!(
                            "from its first relist ({:.0} s in): {}",
                            from.at.as_secs_f64(),
                            match heap {
                                Some(h) => format!("live heap {}; {rss}, reported", pct(*h)),
                                None => rss,
                            }
                        ),
                    )
                }
                Verdict::NotJudged(why) => (format!("not judged: {why}"), "—".to_string()),
            };
            let _ = writeln!(
                out,
                "| leader process {} memory | {growth}; RSS after each recovery and at the end: [{}] MiB{} | < +10 % ({judged}) |",
                i + 1,
                mib(&rss),
                if heap.is_empty() {
                    String::new()
                } else {
                    format!("; live heap: [{}] MiB", mib(&heap))
                },
            );
        }
        if !self
            .lives
            .iter()
            .any(|l| matches!(l.verdict(), Verdict::Judged { .. }))
        {
            let _ = writeln!(
                out,
                "| memory | no leader process lived {} s past its first relist: nothing to judge a leak by | one judged process (MISSED: run longer, or `WITHOUT=leader-killed`) |",
                MEMORY_JUDGED_AFTER.as_secs()
            );
        }
        for (i, l) in self.lives.iter().enumerate() {
            let _ = writeln!(
                out,
                "| leader process {} CPU | {:.1} s over {:.0} s ({:.1} % of a core) | — |",
                i + 1,
                l.cpu,
                l.up.as_secs_f64(),
                100.0 * l.cpu / l.up.as_secs_f64().max(f64::MIN_POSITIVE),
            );
        }
        let _ = writeln!(
            out,
            "\nLeader process restarts: {}. RBAC refusals in the last leader process's log: {} \
             (a restarted API server refuses until its RBAC caches fill; the leader retries).",
            self.leader_restarts, self.denials
        );
        out
    }
}
