//! Writes every generated file (`make generate`): the CRDs in `config/crd/`, their copies in each
//! chart's `crds/`, each chart's copy of its controller's RBAC from `config/rbac/`, and the leader
//! chart's copies of `config/proxy/leader-proxy.yaml`, `config/policy/leader-scope.yaml` and
//! `config/rbac/leader-inventory.yaml`. With
//! `--check` it writes nothing and fails if a committed file differs (`make check-generated`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use tether_api::crds::Side;

/// Files under `config/` the leader chart installs, and their copies' names under its `files/`.
const LEADER_FILES: [(&str, &str); 3] = [
    ("proxy/leader-proxy.yaml", "proxy.yaml"),
    ("policy/leader-scope.yaml", "admission-policy.yaml"),
    ("rbac/leader-inventory.yaml", "rbac-inventory.yaml"),
];

/// The charts, the RBAC file each one installs and the side whose CRDs it ships.
const CHARTS: [(&str, &str, Side); 2] = [
    ("tether-leader", "leader.yaml", Side::Leader),
    ("tether-agent", "agent.yaml", Side::Agent),
];

fn main() -> ExitCode {
    let check = std::env::args().any(|a| a == "--check");
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut files: Vec<(PathBuf, String)> = Vec::new();
    for (file, crd) in tether_api::crds::all() {
        let yaml = match tether_api::crds::to_yaml(&crd) {
            Ok(yaml) => yaml,
            Err(err) => {
                eprintln!("error: cannot render {file}: {err}");
                return ExitCode::FAILURE;
            }
        };
        files.push((root.join("config/crd").join(file), yaml.clone()));
        for (chart, _, side) in CHARTS {
            if tether_api::crds::for_side(side).iter().any(|(f, _)| *f == file) {
                files.push((
                    root.join("charts").join(chart).join("crds").join(file),
                    yaml.clone(),
                ));
            }
        }
    }
    // NB: a chart's crds/ holds exactly its side's CRDs: anything else there is stale too.
    let mut extra = Vec::new();
    for (chart, _, _) in CHARTS {
        let dir = root.join("charts").join(chart).join("crds");
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if !files.iter().any(|(p, _)| *p == path) {
                extra.push(path);
            }
        }
    }
    for (chart, rbac, _) in CHARTS {
        let source = root.join("config/rbac").join(rbac);
        match std::fs::read_to_string(&source) {
            Ok(text) => files.push((
                root.join("charts").join(chart).join("files/rbac.yaml"),
                format!("# Generated from config/rbac/{rbac} by `make generate`; do not edit.\n{text}"),
            )),
            Err(err) => {
                eprintln!("error: cannot read {}: {err}", source.display());
                return ExitCode::FAILURE;
            }
        }
    }
    for (source, copy) in LEADER_FILES {
        match std::fs::read_to_string(root.join("config").join(source)) {
            Ok(text) => files.push((
                root.join("charts/tether-leader/files").join(copy),
                format!("# Generated from config/{source} by `make generate`; do not edit.\n{text}"),
            )),
            Err(err) => {
                eprintln!("error: cannot read config/{source}: {err}");
                return ExitCode::FAILURE;
            }
        }
    }
    let mut stale = Vec::new();
    for path in &extra {
        if check {
            stale.push(relative(&root, path));
        } else if let Err(err) = std::fs::remove_file(path) {
            eprintln!("error: cannot remove {}: {err}", path.display());
            return ExitCode::FAILURE;
        }
    }
    for (path, contents) in &files {
        if check {
            if std::fs::read_to_string(path).ok().as_deref() != Some(contents.as_str()) {
                stale.push(relative(&root, path));
            }
        } else if let Err(err) = path
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::write(path, contents))
        {
            eprintln!("error: cannot write {}: {err}", path.display());
            return ExitCode::FAILURE;
        }
    }
    if stale.is_empty() {
        ExitCode::SUCCESS
    } else {
        eprintln!(
            "generated files are stale ({}): run `make generate` and commit the result",
            stale.join(", ")
        );
        ExitCode::FAILURE
    }
}

fn relative(root: &Path, path: &Path) -> String {
    path.strip_prefix(root).unwrap_or(path).display().to_string()
}
