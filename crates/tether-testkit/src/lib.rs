//! Test support for Tether: real Kubernetes control planes started from the binaries that
//! `make tools` installs, plus helpers that tests share (CRD install, bootstrap tokens, polling
//! with a deadline). Used as a dev-dependency only.

pub mod args;
mod cgroup;
pub mod cluster;
pub mod controller;
mod kubeconfig;
pub mod lab;
pub mod node;
pub mod pki;
pub mod process;
pub mod tokens;
pub mod tools;
mod wait;

use std::path::PathBuf;

pub use cluster::{ClusterBuilder, TestCluster};
pub use controller::{Controller, token_kubeconfig};
pub use node::Node;
pub use tokens::{BootstrapToken, CreateToken};
pub use tools::Tools;
pub use wait::{eventually, install_crds, install_tether_crds};

/// What can go wrong while starting or using a test cluster.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `make tools` has not been run (or `TETHER_TOOLS_BIN` points elsewhere).
    #[error("test tools missing in {dir}: {missing}; run `make tools` (it builds and installs them)")]
    ToolsMissing {
        /// Where they were looked for.
        dir: PathBuf,
        /// Which are missing.
        missing: String,
    },
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A process could not be started.
    #[error("cannot start {name}: {source}")]
    Spawn {
        /// The process.
        name: String,
        /// The cause.
        source: std::io::Error,
    },
    /// A process exited during start-up.
    #[error("{name} exited during start-up ({status}); last log lines:\n{log}")]
    Exited {
        /// The process.
        name: String,
        /// Its exit status.
        status: String,
        /// Its last log lines.
        log: String,
    },
    /// A chosen port was taken by someone else before the process bound it.
    #[error("{name} could not bind its port")]
    PortInUse {
        /// The process.
        name: String,
    },
    /// The cluster did not become ready in time.
    #[error("cluster {name} not ready: {what}")]
    NotReady {
        /// The cluster.
        name: String,
        /// What was last seen.
        what: String,
    },
    /// The lab (the node tier's network namespace) could not be set up.
    #[error("node tier: {0}")]
    Lab(String),
    /// Certificate generation failed.
    #[error("certificates: {0}")]
    Pki(#[from] rcgen::Error),
    /// The kubeconfig could not be loaded.
    #[error("kubeconfig: {0}")]
    Kubeconfig(String),
    /// A client could not be built.
    #[error("client: {0}")]
    Client(#[source] kube::Error),
    /// An API call failed.
    #[error("{op}: {source}")]
    Api {
        /// What was attempted.
        op: String,
        /// The cause.
        source: kube::Error,
    },
}

/// A free TCP port on 127.0.0.1 (bound and released; the caller binds it again).
pub fn free_port() -> Result<u16, Error> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|source| Error::Io {
        path: PathBuf::from("127.0.0.1:0"),
        source,
    })?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|source| Error::Io {
            path: PathBuf::from("127.0.0.1:0"),
            source,
        })
}
