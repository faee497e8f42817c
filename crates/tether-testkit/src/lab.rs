//! The lab: a network namespace that belongs to one test process, holding a bridge, every API
//! server of the run and the test process itself. Nodes hang off the bridge in network
//! namespaces of their own, so pods of every cluster reach every API server, and nothing is
//! added to the host's own network namespace: when the test process and its children are gone,
//! the lab is gone too.
//!
//! ```text
//!  host netns: untouched
//!  lab netns (the test process, etcd, kube-apiserver :port on 10.203.0.1 and 127.0.0.1, ...)
//!    tlab0 10.203.0.1/24 ── tnode10 ═ eth0 10.203.0.10  node netns: containerd, kubelet,
//!                        │                               kube-proxy, cni0 10.244.10.1/24, pods
//!                        └─ tnode11 ═ eth0 10.203.0.11  ...
//! ```

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use crate::Error;

/// Where Debian's containernetworking-plugins are.
pub const CNI_BIN_DIR: &str = "/usr/lib/cni";
/// The lab bridge.
pub const BRIDGE: &str = "tlab0";
/// The bridge's address: where nodes and pods reach every API server of the run.
pub const GATEWAY: Ipv4Addr = Ipv4Addr::new(10, 203, 0, 1);
/// Prefix length of the lab network.
pub const PREFIX: u8 = 24;

static ENTERED: AtomicBool = AtomicBool::new(false);
static NEXT_NODE: AtomicU8 = AtomicU8::new(10);

/// Moves the calling process into a new network namespace with a bridge at [`GATEWAY`]. Must be
/// the first thing `main` does, before any thread starts (threads keep the namespace they were
/// started in). Fails with what the node tier needs when the process may not do it.
pub fn enter() -> Result<(), Error> {
    if ENTERED.load(Ordering::SeqCst) {
        return Ok(());
    }
    preflight()?;
    let threads = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Threads:"))
                .and_then(|n| n.trim().parse::<u32>().ok())
        })
        .unwrap_or(1);
    if threads != 1 {
        return Err(lab_error(format!(
            "lab::enter() must run before any thread starts ({threads} threads are running)"
        )));
    }
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).map_err(|e| {
        lab_error(format!(
            "unshare(CLONE_NEWNET) failed: {e}. The node tier needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN) \
             to create its own network namespaces"
        ))
    })?;
    ip(&["link", "set", "lo", "up"])?;
    ip(&["link", "add", BRIDGE, "type", "bridge"])?;
    ip(&["addr", "add", &format!("{GATEWAY}/{PREFIX}"), "dev", BRIDGE])?;
    ip(&["link", "set", BRIDGE, "up"])?;
    ENTERED.store(true, Ordering::SeqCst);
    Ok(())
}

/// Whether this process is in its lab (so clusters may start nodes).
pub fn entered() -> bool {
    ENTERED.load(Ordering::SeqCst)
}

/// The next free node address in the lab (10.203.0.10 and up) and its index.
pub(crate) fn next_node() -> Result<(u8, Ipv4Addr), Error> {
    let n = NEXT_NODE.fetch_add(1, Ordering::SeqCst);
    if n >= 250 {
        return Err(lab_error("more than 240 nodes in one lab".into()));
    }
    Ok((n, Ipv4Addr::new(10, 203, 0, n)))
}

/// Everything the node tier needs from the machine, checked up front so that a missing piece is
/// one clear message instead of a node that never gets Ready.
pub fn preflight() -> Result<(), Error> {
    if !nix::unistd::geteuid().is_root() {
        return Err(lab_error(
            "the node tier runs containerd, kubelet and kube-proxy in network, mount and cgroup \
             namespaces of its own, which needs root: run the tests as root (CI does)"
                .into(),
        ));
    }
    let mut missing = Vec::new();
    for bin in [
        "containerd",
        "containerd-shim-runc-v2",
        "runc",
        "ctr",
        "iptables",
        "ip",
        "unshare",
    ] {
        if which(bin).is_none() {
            missing.push(bin.to_string());
        }
    }
    for plugin in ["bridge", "host-local", "loopback", "portmap"] {
        if !Path::new(CNI_BIN_DIR).join(plugin).is_file() {
            missing.push(format!("{}/{plugin}", CNI_BIN_DIR));
        }
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(lab_error(format!(
            "missing for the node tier: {}; run `make tools` (it installs containerd, runc and the CNI \
             plugins from Debian's packages)",
            missing.join(", ")
        )))
    }
}

fn which(bin: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .chain(["/usr/sbin", "/sbin"])
        .map(|d| Path::new(d).join(bin))
        .find(|p| p.is_file())
}

/// Runs `ip <args>` in the current network namespace.
pub(crate) fn ip(args: &[&str]) -> Result<(), Error> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|source| Error::Spawn {
            name: "ip".into(),
            source,
        })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(lab_error(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

fn lab_error(what: String) -> Error {
    Error::Lab(what)
}
