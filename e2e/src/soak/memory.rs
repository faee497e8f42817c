//! The leader's memory over a soak: one `Life` per leader process, sampled after each full
//! recovery, and whether its growth is judged a leak.

use std::time::Duration;

/// One reading of a leader process's memory, after a full recovery or at its end.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Sample {
    /// Since the process started.
    pub(super) at: Duration,
    /// Resident set, MiB.
    pub(super) rss: f64,
    /// Live heap, MiB: the lowest of a few readings (a `heap-stats` build: `make soak` builds one
    /// unless `HEAP=0`).
    pub(super) heap: Option<f64>,
    /// Whether the process had relisted everything (recovered from an API server restart) by
    /// then. A relist holds the old caches and the new list at once, so it is the working set's
    /// high-water mark: memory counts from the first such sample on.
    pub(super) relisted: bool,
}

/// One leader process: its memory after each full recovery and at its end, and its CPU.
#[derive(Clone, Debug)]
pub(super) struct Life {
    /// After each full recovery, then at the end ([`SETTLE`] after the last recovery).
    pub(super) samples: Vec<Sample>,
    /// CPU seconds (user + system) over the whole process life.
    pub(super) cpu: f64,
    /// Wall time of the whole process life.
    pub(super) up: Duration,
}

/// How one process's memory is judged.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Verdict {
    /// Growth from its first sample after a relist to its end, as a share: RSS, live heap.
    Judged {
        from: Sample,
        rss: f64,
        heap: Option<f64>,
    },
    /// Too little to judge a leak by, and why.
    NotJudged(String),
}

impl Verdict {
    /// Judged and within the target (< +10 %). A leak is memory the program holds, so when the
    /// binary reports its live heap (the default `make soak` build), the heap is judged and RSS
    /// is reported beside it: musl's RSS moves within a band of about 4 MiB around an unchanged
    /// heap (docs/benchmarks.md), 11 % of a 34 MiB leader, so RSS between two moments cannot
    /// tell a leak from the allocator's high-water. Without the heap (`HEAP=0`), RSS is judged.
    pub(super) fn met(&self) -> bool {
        match self {
            Verdict::Judged { rss, heap, .. } => heap.unwrap_or(*rss) < 0.10,
            Verdict::NotJudged(_) => false,
        }
    }
}

impl Life {
    pub(super) fn end(&self) -> Option<&Sample> {
        self.samples.last()
    }

    pub(super) fn verdict(&self) -> Verdict {
        let (Some(from), Some(end)) = (self.samples.iter().find(|s| s.relisted), self.end()) else {
            return Verdict::NotJudged("no relist in its life".into());
        };
        if end.at.saturating_sub(from.at) < MEMORY_JUDGED_AFTER {
            return Verdict::NotJudged(format!(
                "lived < {} s after its first relist",
                MEMORY_JUDGED_AFTER.as_secs()
            ));
        }
        let growth = |a: f64, b: f64| (b - a) / a.max(f64::MIN_POSITIVE);
        Verdict::Judged {
            from: *from,
            rss: growth(from.rss, end.rss),
            heap: from.heap.zip(end.heap).map(|(a, b)| growth(a, b)),
        }
    }
}

/// Whether memory growth met the target (< +10 %): every judged process within it and at least
/// one process judged (no judgement is no proof).
pub(super) fn memory_met(lives: &[Life]) -> bool {
    let verdicts: Vec<Verdict> = lives.iter().map(Life::verdict).collect();
    verdicts.iter().any(Verdict::met)
        && verdicts
            .iter()
            .all(|v| v.met() || matches!(v, Verdict::NotJudged(_)))
}

/// Leader processes that lived less than this after their first relist are reported but not
/// judged on memory growth. Three minutes is at least one more fault (they come every 60–120 s)
/// and 18 heartbeats of every member; with the kill fault in the rounds, a 30-minute soak has a
/// process to judge in about 98 % of its random schedules (300 s: 87 %; simulated). A hunt for
/// a slow leak runs one process for longer (`WITHOUT=leader-killed DURATION=2h`).
pub(super) const MEMORY_JUDGED_AFTER: Duration = Duration::from_secs(180);

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(secs: u64, rss: f64, heap: Option<f64>, relisted: bool) -> Sample {
        Sample {
            at: Duration::from_secs(secs),
            rss,
            heap,
            relisted,
        }
    }

    fn life(samples: Vec<Sample>) -> Life {
        Life {
            samples,
            cpu: 1.0,
            up: Duration::from_secs(600),
        }
    }

    #[test]
    fn memory_counts_from_the_first_relist() {
        // The step before the first relist is warm-up (30 → 34 MiB), not growth.
        let warm = life(vec![
            sample(20, 30.0, None, false),
            sample(100, 34.0, None, true),
            sample(500, 35.0, None, true),
        ]);
        let Verdict::Judged { from, rss, heap } = warm.verdict() else {
            panic!("judged: {:?}", warm.verdict());
        };
        assert_eq!(from.at, Duration::from_secs(100));
        assert!((rss - 1.0 / 34.0).abs() < 1e-9, "{rss}");
        assert_eq!(heap, None);
        assert!(memory_met(&[warm]));
    }

    #[test]
    fn growth_after_the_first_relist_misses_the_target() {
        let leaking = life(vec![sample(100, 40.0, None, true), sample(500, 44.5, None, true)]);
        assert!(!memory_met(&[leaking]));
        // The live heap is judged when the binary reports it: a held heap misses even with RSS
        // flat.
        let heap_leak = life(vec![
            sample(100, 40.0, Some(20.0), true),
            sample(500, 40.0, Some(22.5), true),
        ]);
        assert!(!memory_met(&[heap_leak]));
    }

    #[test]
    fn a_reported_heap_is_judged_rather_than_rss() {
        // Stop 28's default run: RSS 34.2 → 37.6 MiB (+10 %) from the first relist. With the
        // live heap flat, that is the allocator's high-water, not held memory.
        let high_water = life(vec![
            sample(300, 34.2, Some(19.6), true),
            sample(1151, 37.6, Some(19.7), true),
        ]);
        let Verdict::Judged { rss, heap, .. } = high_water.verdict() else {
            panic!("judged: {:?}", high_water.verdict());
        };
        assert!(rss >= 0.099, "{rss}");
        assert!(heap.is_some_and(|h| h < 0.01), "{heap:?}");
        assert!(memory_met(&[high_water]));
        // The same RSS without a heap reading is judged on RSS, and misses.
        let rss_only = life(vec![
            sample(300, 34.2, None, true),
            sample(1151, 37.7, None, true),
        ]);
        assert!(!memory_met(&[rss_only]));
    }

    #[test]
    fn short_or_unrelisted_lives_are_not_judged_and_cannot_pass_alone() {
        let short = life(vec![sample(100, 30.0, None, true), sample(250, 60.0, None, true)]);
        // NB: 150 s after the relist: below MEMORY_JUDGED_AFTER.
        let never = life(vec![
            sample(20, 30.0, None, false),
            sample(900, 60.0, None, false),
        ]);
        assert_eq!(
            short.verdict(),
            Verdict::NotJudged("lived < 180 s after its first relist".into())
        );
        assert_eq!(
            never.verdict(),
            Verdict::NotJudged("no relist in its life".into())
        );
        assert!(!memory_met(&[short.clone(), never.clone()]));
        let judged = life(vec![sample(100, 40.0, None, true), sample(500, 41.0, None, true)]);
        assert!(memory_met(&[short, never, judged]));
    }
}
