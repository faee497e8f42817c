//! Finds the pinned control-plane binaries installed by `make tools`, or says how to get them.

use std::path::{Path, PathBuf};

use crate::Error;

/// The binaries a test cluster needs.
const REQUIRED: [&str; 3] = ["etcd", "kube-apiserver", "kube-controller-manager"];

/// Paths of the installed tools.
#[derive(Clone, Debug)]
pub struct Tools {
    bin: PathBuf,
}

impl Tools {
    /// Finds `.tools/bin` (or `$TETHER_TOOLS_BIN`) and checks that every required binary is there.
    pub fn locate() -> Result<Self, Error> {
        let bin = match std::env::var_os("TETHER_TOOLS_BIN") {
            Some(dir) => PathBuf::from(dir),
            None => repo_root().join(".tools/bin"),
        };
        let missing: Vec<&str> = REQUIRED.into_iter().filter(|t| !bin.join(t).is_file()).collect();
        if missing.is_empty() {
            Ok(Self { bin })
        } else {
            Err(Error::ToolsMissing {
                dir: bin,
                missing: missing.join(", "),
            })
        }
    }

    /// Path of one tool (etcd, kube-apiserver, kube-controller-manager, kubectl, helm).
    pub fn path(&self, tool: &str) -> PathBuf {
        self.bin.join(tool)
    }

    /// The folder holding every tool.
    pub fn dir(&self) -> &Path {
        &self.bin
    }
}

/// The repository root (this crate lives at `crates/tether-testkit`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}
