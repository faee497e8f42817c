//! The cgroups test nodes run in: one per node under a top-level cgroup of the test run (reaped
//! when its owner died) or of the sandbox (kept until `make demo-down`), on cgroup v1 or v2.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// Top-level cgroup of test nodes under the default (reaped) root.
pub(crate) const TEST_CGROUP: &str = "tether-testkit";
/// Top-level cgroup of nodes that outlive their creator (the sandbox).
pub(crate) const SANDBOX_CGROUP: &str = "tether-sandbox";
/// File in a cluster folder listing the cgroups of its nodes.
pub(crate) const CGROUPS_FILE: &str = "cgroups";
/// Where the cgroup hierarchies are mounted.
pub(crate) const CGROUP_FS: &str = "/sys/fs/cgroup";

/// The cgroup hierarchies of this machine (cgroup v1: one per controller, plus the hybrid
/// `unified` one where runc also files each container; v2: one).
fn hierarchies() -> Vec<PathBuf> {
    let root = Path::new(CGROUP_FS);
    if root.join("cgroup.procs").is_file() {
        return vec![root.to_path_buf()];
    }
    fs::read_dir(root)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.join("cgroup.procs").is_file())
                .collect()
        })
        .unwrap_or_default()
}

/// Every pid in `dir` and the cgroups below it.
fn pids_below(dir: &Path, out: &mut Vec<i32>) {
    if let Ok(procs) = fs::read_to_string(dir.join("cgroup.procs")) {
        out.extend(procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
    }
    if let Ok(entries) = fs::read_dir(dir) {
        for sub in entries.filter_map(Result::ok).filter(|e| e.path().is_dir()) {
            pids_below(&sub.path(), out);
        }
    }
}

/// Removes `dir` and the cgroups below it, deepest first.
fn remove_below(dir: &Path) {
    if let Ok(entries) = fs::read_dir(dir) {
        for sub in entries.filter_map(Result::ok).filter(|e| e.path().is_dir()) {
            remove_below(&sub.path());
        }
    }
    let _ = fs::remove_dir(dir);
}

/// Kills every process in cgroup `name` (relative to each hierarchy) and removes it.
pub(crate) fn kill_cgroup(name: &str) {
    if name.is_empty() {
        return;
    }
    let dirs: Vec<PathBuf> = hierarchies()
        .into_iter()
        .map(|h| h.join(name))
        .filter(|d| d.is_dir())
        .collect();
    for _ in 0..100 {
        let mut pids = Vec::new();
        for d in &dirs {
            pids_below(d, &mut pids);
        }
        if pids.is_empty() {
            break;
        }
        for pid in pids {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    for _ in 0..40 {
        for d in &dirs {
            remove_below(d);
        }
        if dirs.iter().all(|d| !d.exists()) {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Kills every node of the sandbox (`make demo-down`): all cgroups under the sandbox's top-level one.
pub fn kill_sandbox_nodes() {
    let mut names = std::collections::BTreeSet::new();
    for h in hierarchies() {
        for e in fs::read_dir(h.join(SANDBOX_CGROUP))
            .into_iter()
            .flatten()
            .flatten()
        {
            if e.path().is_dir() {
                names.insert(e.file_name().to_string_lossy().into_owned());
            }
        }
    }
    for name in names {
        kill_cgroup(&format!("{SANDBOX_CGROUP}/{name}"));
    }
}

/// Reaps node cgroups of test runs whose cluster folder (under `root`) is gone or whose owner died.
pub(crate) fn reap_cgroups(root: &Path, owner_alive: impl Fn(&Path) -> bool) {
    let mut seen = std::collections::BTreeSet::new();
    for h in hierarchies() {
        let Ok(entries) = fs::read_dir(h.join(TEST_CGROUP)) else {
            continue;
        };
        for e in entries.filter_map(Result::ok).filter(|e| e.path().is_dir()) {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some((folder, _)) = name.split_once("--") else {
                continue;
            };
            if seen.insert(name.clone()) && !owner_alive(&root.join(folder)) {
                eprintln!("tether-testkit: reaping stray node cgroup {TEST_CGROUP}/{name}");
                kill_cgroup(&format!("{TEST_CGROUP}/{name}"));
            }
        }
    }
}
