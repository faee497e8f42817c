//! Writes every CRD to `config/crd/` (`make generate`); `--check` fails if a committed file differs.

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let check = std::env::args().any(|a| a == "--check");
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../config/crd");
    let mut stale = Vec::new();
    for (file, crd) in tether_api::crds::all() {
        let yaml = match tether_api::crds::to_yaml(&crd) {
            Ok(yaml) => yaml,
            Err(err) => {
                eprintln!("error: cannot render {file}: {err}");
                return ExitCode::FAILURE;
            }
        };
        let path = dir.join(file);
        if check {
            if std::fs::read_to_string(&path).ok().as_deref() != Some(yaml.as_str()) {
                stale.push(file);
            }
        } else if let Err(err) = std::fs::write(&path, yaml) {
            eprintln!("error: cannot write {}: {err}", path.display());
            return ExitCode::FAILURE;
        }
    }
    if stale.is_empty() {
        ExitCode::SUCCESS
    } else {
        eprintln!(
            "config/crd is stale ({}): run `make generate` and commit the result",
            stale.join(", ")
        );
        ExitCode::FAILURE
    }
}
