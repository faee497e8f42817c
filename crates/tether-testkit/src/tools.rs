//! Finds the pinned control-plane binaries installed by `make tools`, or says how to get them.

use std::path::{Path, PathBuf};

use crate::Error;

/// The binaries a test cluster needs.
const REQUIRED: [&str; 3] = ["etcd", "kube-apiserver", "kube-controller-manager"];

/// Paths of the installed tools.
#[derive(Clone, Debug)]
pub struct Tools {
    /// The Kubernetes binaries and etcd of the chosen version.
    kubernetes: PathBuf,
    /// Everything else (kubectl, helm): `.tools/bin`.
    bin: PathBuf,
}

impl Tools {
    /// Finds `.tools/bin` (or `$TETHER_TOOLS_BIN`) and checks that every required binary is there.
    pub fn locate() -> Result<Self, Error> {
        Self::locate_version(None)
    }

    /// As `locate`, with the Kubernetes binaries of `version` (`.tools/k8s/<version>`, which
    /// `make tools` fills for the versions in `e2e/versions.env`) when one is given.
    pub fn locate_version(version: Option<&str>) -> Result<Self, Error> {
        let bin = match std::env::var_os("TETHER_TOOLS_BIN") {
            Some(dir) => PathBuf::from(dir),
            None => repo_root().join(".tools/bin"),
        };
        let kubernetes = match version {
            Some(v) => repo_root().join(".tools/k8s").join(v),
            None => bin.clone(),
        };
        let missing: Vec<&str> = REQUIRED
            .into_iter()
            .filter(|t| !kubernetes.join(t).is_file())
            .collect();
        if missing.is_empty() {
            Ok(Self { kubernetes, bin })
        } else {
            Err(Error::ToolsMissing {
                dir: kubernetes,
                missing: missing.join(", "),
            })
        }
    }

    /// Path of one tool (etcd, kube-apiserver, kube-controller-manager, kubelet, kubectl, helm):
    /// the chosen Kubernetes version's if it has that tool, else `.tools/bin`'s.
    pub fn path(&self, tool: &str) -> PathBuf {
        let own = self.kubernetes.join(tool);
        if own.exists() { own } else { self.bin.join(tool) }
    }

    /// The folder holding the chosen Kubernetes version's binaries.
    pub fn dir(&self) -> &Path {
        &self.kubernetes
    }
}

/// The repository root (this crate lives at `crates/tether-testkit`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A setting of `e2e/versions.env` (the one file that pins every tool version), e.g.
/// `KUBERNETES_OLDEST`; None if the file or the key is missing.
pub fn pinned(key: &str) -> Option<String> {
    let text = std::fs::read_to_string(repo_root().join("e2e/versions.env")).ok()?;
    text.lines()
        .filter_map(|l| l.split_once('='))
        .find(|(k, _)| k.trim() == key)
        .map(|(_, v)| v.trim().trim_matches('"').to_string())
}

#[cfg(test)]
mod tests {
    use super::pinned;

    #[test]
    fn pinned_reads_versions_env() {
        let default = pinned("KUBERNETES_VERSION").expect("KUBERNETES_VERSION");
        assert!(default.starts_with("v1."), "{default}");
        let all = pinned("KUBERNETES_VERSIONS").expect("KUBERNETES_VERSIONS");
        assert!(
            all.split_whitespace().any(|v| v == default),
            "{all} lacks {default}"
        );
        let oldest = pinned("KUBERNETES_OLDEST").expect("KUBERNETES_OLDEST");
        assert_eq!(all.split_whitespace().next(), Some(oldest.as_str()));
        assert_eq!(pinned("NO_SUCH_KEY"), None);
    }
}
