//! What /proc says of a process: CPU time (ticks, ns), age, and memory (`VmRSS`, `VmHWM`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// CPU time of processes at one instant.
pub struct Cpu {
    at: Instant,
    ticks: Vec<u64>,
}

impl Cpu {
    /// The CPU time of `procs` now.
    pub fn sample(procs: &[(&'static str, u32)]) -> Self {
        Self {
            at: Instant::now(),
            ticks: procs.iter().map(|(_, pid)| cpu_ticks(*pid)).collect(),
        }
    }

    /// CPU used since the sample, as a share of one core, by process.
    pub fn shares(&self, procs: &[(&'static str, u32)]) -> BTreeMap<&'static str, f64> {
        let secs = self.at.elapsed().as_secs_f64();
        procs
            .iter()
            .zip(&self.ticks)
            .map(|((name, pid), before)| {
                let used = cpu_ticks(*pid).saturating_sub(*before) as f64 / CLOCK_TICKS;
                (*name, used / secs)
            })
            .collect()
    }
}

/// `USER_HZ`: Linux reports process times in 1/100 s.
pub const CLOCK_TICKS: f64 = 100.0;

/// The numeric fields of `/proc/<pid>/stat` after the command name (field 3 on), 0 where
/// unreadable.
fn stat_fields(pid: u32) -> Vec<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // NB: the command name (field 2) may contain spaces; fields after its ')' are fixed.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    rest.split_whitespace().map(|f| f.parse().unwrap_or(0)).collect()
}

/// utime + stime of `pid`, in clock ticks.
pub fn cpu_ticks(pid: u32) -> u64 {
    let fields = stat_fields(pid);
    // utime and stime are fields 14 and 15, i.e. 11 and 12 after the ')'.
    fields.get(11).unwrap_or(&0) + fields.get(12).unwrap_or(&0)
}

/// How long ago `pid` started (its `starttime`, field 22, against `/proc/uptime`).
pub fn process_age(pid: u32) -> Duration {
    let started = stat_fields(pid).get(19).copied().unwrap_or(0) as f64 / CLOCK_TICKS;
    let uptime: f64 = std::fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|u| u.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    Duration::from_secs_f64((uptime - started).max(0.0))
}

/// Time `pid`'s live threads have spent on a CPU, in nanoseconds (`/proc/<pid>/task/*/schedstat`;
/// finer than `cpu_ticks`, but a thread that exited is no longer counted).
pub fn cpu_ns(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .filter_map(Result::ok)
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next().and_then(|n| n.parse::<u64>().ok()))
        .sum()
}

/// A memory figure (`VmRSS`, `VmHWM`) of `pid` in MiB.
pub fn rss_mib(pid: u32, field: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(&format!("{field}:")))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kib| kib.parse::<f64>().ok())
        .map(|kib| kib / 1024.0)
        .unwrap_or(0.0)
}

/// Sets the nice value of every thread of `pids` to `nice` (threads they start later inherit
/// it from the thread that starts them). Needs root to lower it.
pub fn renice(pids: &[u32], nice: i32) {
    let tids: Vec<String> = pids
        .iter()
        .filter_map(|p| std::fs::read_dir(format!("/proc/{p}/task")).ok())
        .flatten()
        .filter_map(Result::ok)
        .map(|t| t.file_name().to_string_lossy().into_owned())
        .collect();
    let done = std::process::Command::new("renice")
        .args(["-n", &nice.to_string(), "-p"])
        .args(&tids)
        .stdout(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(done, "renice -n {nice} the threads of {pids:?}");
}
