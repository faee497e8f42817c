//! Where the time went: one row per job, slowest first, with what it waited for before it
//! started and how much of its time it computed rather than waited; and the tests counted from
//! the logs as libtest prints them.

use std::fmt::Write;
use std::time::Duration;

/// What is known of one job at the end.
#[derive(Clone, Debug, Default)]
pub struct Row {
    /// The job's name.
    pub name: String,
    /// What it is.
    pub what: String,
    /// When it started, from the start of the run.
    pub start: Option<Duration>,
    /// Its wall time.
    pub wall: Option<Duration>,
    /// CPU time it and its children used.
    pub cpu: Option<Duration>,
    /// What it waited for before it started: the need that ended last, or a free slot.
    pub waited_for: String,
    /// ok, FAILED, TIMED OUT, skipped (need), not run.
    pub result: String,
    /// Tests passed and failed, as its log says.
    pub tests: Option<(u64, u64)>,
}

/// `m:ss`, or `h:mm:ss` from an hour.
pub fn clock(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 3600 {
        format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
    } else {
        format!("{}:{:02}", s / 60, s % 60)
    }
}

/// Tests passed and failed in a libtest log (`test result: ok. 3 passed; 1 failed; …`), summed
/// over every `test result` line; None when it has none.
pub fn counts(log: &str) -> Option<(u64, u64)> {
    let mut total: Option<(u64, u64)> = None;
    for line in log.lines() {
        let Some(rest) = line.trim_start().strip_prefix("test result: ") else {
            continue;
        };
        let number = |what: &str| {
            rest.split(';')
                .find_map(|part| {
                    part.trim()
                        .strip_suffix(what)?
                        .split_whitespace()
                        .last()?
                        .parse()
                        .ok()
                })
                .unwrap_or(0u64)
        };
        let (p, f) = total.unwrap_or_default();
        total = Some((p + number(" passed"), f + number(" failed")));
    }
    total
}

/// The table, slowest first, under a line with the run's wall time.
pub fn table(rows: &[Row], wall: Duration, cores: usize) -> String {
    let mut rows: Vec<&Row> = rows.iter().collect();
    rows.sort_by(|a, b| b.wall.cmp(&a.wall).then(a.name.cmp(&b.name)));
    let cpu: Duration = rows.iter().filter_map(|r| r.cpu).sum();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "where the time went: {} wall on {cores} cores; the jobs' CPU {} (busy: CPU per wall of one \
         core; a low figure means it waited: on clusters, timeouts, the network)",
        clock(wall),
        clock(cpu)
    );
    let name_w = rows.iter().map(|r| r.name.len()).max().unwrap_or(4).max(4);
    let _ = writeln!(
        out,
        "{:<name_w$}  {:>7}  {:>7}  {:>7}  {:>5}  {:<16}  result",
        "job", "start", "wall", "CPU", "busy", "waited for"
    );
    for r in rows {
        let busy = match (r.cpu, r.wall) {
            (Some(c), Some(w)) if w.as_millis() > 0 => format!("{}%", c.as_millis() * 100 / w.as_millis()),
            _ => "-".into(),
        };
        let opt = |d: Option<Duration>| d.map(clock).unwrap_or_else(|| "-".into());
        let mut result = r.result.clone();
        if let Some((p, f)) = r.tests {
            let _ = write!(result, " ({p} passed, {f} failed)");
        }
        let _ = writeln!(
            out,
            "{:<name_w$}  {:>7}  {:>7}  {:>7}  {:>5}  {:<16}  {}",
            r.name,
            opt(r.start),
            opt(r.wall),
            opt(r.cpu),
            busy,
            r.waited_for,
            result
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_sum_every_result_line_and_none_without_one() {
        let log = "running 3 tests\ntest a ... ok\n\
                   test result: ok. 3 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 1.2s\n\
                   test result: FAILED. 1 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out\n";
        assert_eq!(counts(log), Some((4, 2)));
        assert_eq!(counts("error: could not compile"), None);
        assert_eq!(
            counts("test result: ok. 0 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out"),
            Some((0, 0))
        );
    }

    #[test]
    fn the_table_puts_the_slowest_first_and_says_how_busy_each_was() {
        let row = |name: &str, wall: u64, cpu: Option<u64>| Row {
            name: name.into(),
            start: Some(Duration::ZERO),
            wall: Some(Duration::from_secs(wall)),
            cpu: cpu.map(Duration::from_secs),
            waited_for: "build".into(),
            result: "ok".into(),
            ..Row::default()
        };
        let t = table(
            &[
                row("quick", 10, Some(10)),
                row("slow", 600, Some(60)),
                row("blind", 30, None),
            ],
            Duration::from_secs(3725),
            2,
        );
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].contains("1:02:05 wall on 2 cores"), "{t}");
        assert!(lines[2].starts_with("slow ") && lines[2].contains("10%"), "{t}");
        assert!(lines[3].starts_with("blind") && lines[3].contains(" - "), "{t}");
        assert!(lines[4].starts_with("quick") && lines[4].contains("100%"), "{t}");
    }

    #[test]
    fn clock_reads_as_minutes_or_hours() {
        assert_eq!(clock(Duration::from_secs(65)), "1:05");
        assert_eq!(clock(Duration::from_secs(3600 + 61)), "1:01:01");
    }
}
