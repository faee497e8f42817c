//! Child processes of a test cluster: logs go to files, every process dies with its handle, and
//! processes left behind by a killed test run are reaped by the next run.
//!
//! NB: without `unsafe` there is no PR_SET_PDEATHSIG, so a test binary killed with SIGKILL
//! cannot take its children along. Each cluster folder therefore records its owner (pid and
//! start time) and its children; the first cluster started by any later run kills the children
//! of owners that no longer exist, after checking that each pid still runs from that folder.

use std::fs::{self, File};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Once;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::Error;

/// File in a cluster folder naming the test process that owns it.
const OWNER_FILE: &str = "owner";
/// File in a cluster folder listing the pids of its processes.
const CHILDREN_FILE: &str = "children";

/// A running child process whose output goes to `<dir>/<name>.log`; killed on drop.
pub struct Proc {
    name: String,
    child: Child,
    log: PathBuf,
}

impl Proc {
    /// Starts `cmd`, appending its stdout and stderr to `<dir>/<name>.log` and recording its pid.
    pub fn spawn(name: &str, mut cmd: Command, dir: &Path) -> Result<Self, Error> {
        let log = dir.join(format!("{name}.log"));
        // NB: appending, so a restarted process keeps the log of the run before it.
        let out = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|source| Error::Io {
                path: log.clone(),
                source,
            })?;
        let err = out.try_clone().map_err(|source| Error::Io {
            path: log.clone(),
            source,
        })?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|source| Error::Spawn {
                name: name.to_string(),
                source,
            })?;
        let children = dir.join(CHILDREN_FILE);
        fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&children)
            .and_then(|mut f| writeln!(f, "{}", child.id()))
            .map_err(|source| Error::Io {
                path: children,
                source,
            })?;
        Ok(Self {
            name: name.to_string(),
            child,
            log,
        })
    }

    /// The process's name in logs and errors.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The log file of this process.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// `Some(status)` if the process has exited.
    pub fn exited(&mut self) -> Option<String> {
        match self.child.try_wait() {
            Ok(Some(status)) => Some(status.to_string()),
            Ok(None) => None,
            Err(err) => Some(format!("unknown ({err})")),
        }
    }

    /// The last `lines` lines of the log.
    pub fn log_tail(&self, lines: usize) -> String {
        tail(&self.log, lines)
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` to the process.
    pub fn signal(&self, signal: Signal) -> nix::Result<()> {
        kill(
            Pid::from_raw(i32::try_from(self.pid()).unwrap_or(i32::MAX)),
            signal,
        )
    }

    /// Waits for the process to exit; its exit status.
    pub fn wait(&mut self) -> Option<String> {
        self.child.wait().ok().map(|s| s.to_string())
    }

    /// Kills the process and waits for it.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The last `lines` lines of a file, or a note that it cannot be read.
pub fn tail(path: &Path, lines: usize) -> String {
    match File::open(path) {
        Ok(f) => {
            let all: Vec<String> = BufReader::new(f).lines().map_while(Result::ok).collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(err) => format!("(cannot read {}: {err})", path.display()),
    }
}

/// Records the current process as the owner of a cluster folder.
pub fn claim(dir: &Path) -> Result<(), Error> {
    let me = std::process::id();
    let owner = format!("{me} {}", start_time(me).unwrap_or_default());
    let path = dir.join(OWNER_FILE);
    fs::write(&path, owner).map_err(|source| Error::Io { path, source })
}

/// Once per test process: kills processes of cluster folders under `root` whose owner is gone,
/// and removes those folders.
pub fn reap_strays(root: &Path) {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // Nodes first: their processes (pods included) are found through their cgroups.
        crate::cgroup::reap_cgroups(root, owner_alive);
        let Ok(entries) = fs::read_dir(root) else { return };
        for dir in entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.is_dir())
        {
            if owner_alive(&dir) {
                continue;
            }
            let children = fs::read_to_string(dir.join(CHILDREN_FILE)).unwrap_or_default();
            for pid in children.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                if runs_from(pid, &dir) {
                    eprintln!("tether-testkit: reaping stray process {pid} of {}", dir.display());
                    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                }
            }
            let _ = fs::remove_dir_all(&dir);
        }
    });
}

fn owner_alive(dir: &Path) -> bool {
    let Ok(owner) = fs::read_to_string(dir.join(OWNER_FILE)) else {
        // A folder being set up right now has no owner file yet; leave folders younger than a minute.
        return fs::metadata(dir)
            .and_then(|m| m.modified())
            .map(|t| t.elapsed().map(|e| e.as_secs() < 60).unwrap_or(true))
            .unwrap_or(false);
    };
    let mut parts = owner.split_whitespace();
    let (Some(pid), start) = (parts.next().and_then(|p| p.parse::<u32>().ok()), parts.next()) else {
        return false;
    };
    match start_time(pid) {
        Some(now) => start.is_none_or(|s| s == now),
        None => false,
    }
}

/// Whether process `pid` has `dir` in its command line (so it is ours, not a recycled pid).
fn runs_from(pid: i32, dir: &Path) -> bool {
    let Ok(cmdline) = fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let dir = dir.to_string_lossy();
    String::from_utf8_lossy(&cmdline).contains(dir.as_ref())
}

/// Start time of a process in clock ticks since boot (field 22 of /proc/<pid>/stat).
fn start_time(pid: u32) -> Option<String> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces; fields after it are separated by spaces.
    let rest = stat.rsplit_once(')')?.1;
    rest.split_whitespace().nth(19).map(str::to_string)
}

/// Raises this process's limit of open files (soft and hard) as far as the kernel allows
/// (`fs.nr_open`; the soft limit alone up to the hard one without root), for it and every
/// process it starts from now on; returns the limit before and after. A cluster's kube-apiserver
/// holds two file descriptors per member with its tunnel: 10,000 members need more than the
/// 20,000 a sandbox may give, where a real control plane runs with about a million
/// (containerd's and systemd's default for kube-apiserver).
pub fn raise_open_files() -> nix::Result<(u64, u64)> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    let most = fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(hard);
    if setrlimit(Resource::RLIMIT_NOFILE, most, most).is_ok() {
        return Ok((soft, most));
    }
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
    Ok((soft, hard))
}
