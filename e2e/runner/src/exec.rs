//! Runs one job as a process: its output into its own log, builds niced, the CPU it and its
//! children used counted in a cgroup of its own (where this process may make one), and the
//! whole process tree stopped when it overruns its time.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::plan::{Class, Job};

/// A started job.
pub struct Running {
    /// Its index in the graph.
    pub index: usize,
    /// When it started.
    pub started: Instant,
    /// Its log.
    pub log: PathBuf,
    child: Child,
    cgroup: Option<Cgroup>,
    deadline: Instant,
    stopped: bool,
}

/// How a job ended.
#[derive(Clone, Debug)]
pub struct Ended {
    /// Its index in the graph.
    pub index: usize,
    /// Whether it succeeded.
    pub ok: bool,
    /// Its wall time.
    pub wall: Duration,
    /// CPU time of the job and its children, when a cgroup counted it.
    pub cpu: Option<Duration>,
    /// Stopped for overrunning its timeout.
    pub timed_out: bool,
    /// Its log.
    pub log: PathBuf,
}

/// The log of a job: `target/test-logs/<name with / as ->.log`.
pub fn log_path(logs: &Path, name: &str) -> PathBuf {
    logs.join(format!("{}.log", name.replace('/', "-")))
}

/// Starts `job` with the run's environment `env` and its own: builds under `nice`, tests as they
/// are.
pub fn start(
    index: usize,
    job: &Job,
    env: &[(String, String)],
    logs: &Path,
    cgroups: Option<&Path>,
) -> std::io::Result<Running> {
    let log = log_path(logs, &job.name);
    let out = File::create(&log)?;
    let err = out.try_clone()?;
    let mut argv: Vec<String> = Vec::new();
    if job.class == Class::Build {
        argv.extend(["nice".into(), "-n".into(), "19".into()]);
    }
    argv.extend(job.argv.iter().cloned());
    let cgroup = cgroups.and_then(|root| Cgroup::create(root, &job.name));
    let mut cmd = match &cgroup {
        // The shell moves itself into the cgroup, then becomes the job: nothing it starts escapes.
        Some(cg) => {
            let mut c = Command::new("sh");
            c.arg("-c")
                .arg("echo $$ > \"$0\" && exec \"$@\"")
                .arg(cg.dir.join("cgroup.procs"))
                .args(&argv);
            c
        }
        None => {
            let mut c = Command::new(&argv[0]);
            c.args(&argv[1..]);
            c
        }
    };
    let child = cmd
        .envs(env.iter().chain(&job.env).map(|(k, v)| (k, v)))
        .current_dir(&job.cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err))
        .spawn()?;
    let started = Instant::now();
    Ok(Running {
        index,
        started,
        log,
        child,
        cgroup,
        deadline: started + job.timeout,
        stopped: false,
    })
}

impl Running {
    /// Whether it ended (reaped), stopping it first when it overran its time.
    pub fn poll(&mut self) -> Option<Ended> {
        if !self.stopped && Instant::now() > self.deadline {
            self.stopped = true;
            stop_tree(self.child.id());
        }
        let status = self.child.try_wait().ok()??;
        // Whatever it left running in its cgroup is stopped with it (orphans have left the
        // process tree by now).
        if let Some(cg) = &self.cgroup {
            let left = cg.procs();
            if !left.is_empty() {
                signal("KILL", &left);
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        let cpu = self.cgroup.as_ref().and_then(Cgroup::usage);
        if let Some(cg) = &self.cgroup {
            cg.remove();
        }
        Some(Ended {
            index: self.index,
            ok: status.success() && !self.stopped,
            wall: self.started.elapsed(),
            cpu,
            timed_out: self.stopped,
            log: self.log.clone(),
        })
    }

    /// Stops it and everything it started (the run is being given up).
    pub fn stop(&mut self) {
        stop_tree(self.child.id());
        let _ = self.child.wait();
        if let Some(cg) = &self.cgroup {
            cg.remove();
        }
    }
}

/// The pids below `root` in the process tree (from /proc), children first, then `root`.
fn tree(root: u32) -> Vec<u32> {
    let mut parent_of: Vec<(u32, u32)> = Vec::new();
    if let Ok(entries) = fs::read_dir("/proc") {
        for e in entries.filter_map(Result::ok) {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let Ok(stat) = fs::read_to_string(e.path().join("stat")) else {
                continue;
            };
            // "pid (comm) state ppid …": comm may hold spaces and parentheses.
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            if let Some(ppid) = ppid {
                parent_of.push((pid, ppid));
            }
        }
    }
    let mut out = vec![root];
    let mut i = 0;
    while i < out.len() {
        let p = out[i];
        out.extend(parent_of.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    out.reverse();
    out
}

/// Sends TERM to `root` and everything below it, then KILL to what is left after 10 s.
fn stop_tree(root: u32) {
    let pids = tree(root);
    if pids.len() <= 1 && !Path::new(&format!("/proc/{root}")).exists() {
        return;
    }
    signal("TERM", &pids);
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until && pids.iter().any(|p| alive(*p)) {
        std::thread::sleep(Duration::from_millis(200));
    }
    signal("KILL", &tree(root).into_iter().chain(pids).collect::<Vec<_>>());
}

fn alive(pid: u32) -> bool {
    // A zombie (ended, not yet reaped) counts as gone.
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, r)| !r.trim_start().starts_with('Z')))
        .unwrap_or(false)
}

fn signal(sig: &str, pids: &[u32]) {
    if pids.is_empty() {
        return;
    }
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .args(pids.iter().map(u32::to_string))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// A cgroup counting one job's CPU time (cgroup v1 `cpuacct`, or v2).
struct Cgroup {
    dir: PathBuf,
    v2: bool,
}

/// Where this run's job cgroups go, if this process may make them: a fresh folder under the
/// `cpuacct` hierarchy (cgroup v1) or the unified one (v2).
pub fn cgroup_root(run: &str) -> Option<PathBuf> {
    let candidates = [
        (Path::new("/sys/fs/cgroup/cpuacct"), "cpuacct.usage"),
        (Path::new("/sys/fs/cgroup"), "cgroup.controllers"),
    ];
    for (base, marker) in candidates {
        if !base.join(marker).exists() && !base.join("cgroup.procs").exists() {
            continue;
        }
        let dir = base.join("tether-testrun").join(run);
        if fs::create_dir_all(&dir).is_ok() {
            return Some(dir);
        }
    }
    None
}

impl Cgroup {
    fn create(root: &Path, name: &str) -> Option<Self> {
        let dir = root.join(name.replace('/', "-"));
        fs::create_dir_all(&dir).ok()?;
        let v2 = dir.join("cpu.stat").exists() && !dir.join("cpuacct.usage").exists();
        Some(Self { dir, v2 })
    }

    fn usage(&self) -> Option<Duration> {
        if self.v2 {
            let stat = fs::read_to_string(self.dir.join("cpu.stat")).ok()?;
            let usec = stat
                .lines()
                .find_map(|l| l.strip_prefix("usage_usec "))?
                .trim()
                .parse()
                .ok()?;
            Some(Duration::from_micros(usec))
        } else {
            let ns = fs::read_to_string(self.dir.join("cpuacct.usage"))
                .ok()?
                .trim()
                .parse()
                .ok()?;
            Some(Duration::from_nanos(ns))
        }
    }

    fn procs(&self) -> Vec<u32> {
        fs::read_to_string(self.dir.join("cgroup.procs"))
            .map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }

    fn remove(&self) {
        let _ = fs::remove_dir(&self.dir);
    }
}

/// Removes the run's cgroup folder (its job cgroups are gone by then).
pub fn remove_cgroup_root(dir: &Path) {
    let _ = fs::remove_dir(dir);
    if let Some(parent) = dir.parent() {
        let _ = fs::remove_dir(parent);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_tree_is_listed_below_its_root_and_stopped_whole() {
        let mut child = Command::new("sh")
            .args(["-c", "sleep 30 & sleep 30 & wait"])
            .spawn()
            .expect("sh");
        let deadline = Instant::now() + Duration::from_secs(5);
        while tree(child.id()).len() < 3 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let pids = tree(child.id());
        assert_eq!(pids.len(), 3, "sh and its two sleeps: {pids:?}");
        assert_eq!(pids.last(), Some(&child.id()), "the root comes last");
        stop_tree(child.id());
        let _ = child.wait();
        assert!(pids.iter().all(|p| !alive(*p)), "all stopped: {pids:?}");
    }

    #[test]
    fn log_names_are_flat() {
        assert_eq!(
            log_path(Path::new("/l"), "unit/tether-cli/tether"),
            PathBuf::from("/l/unit-tether-cli-tether.log")
        );
    }
}
