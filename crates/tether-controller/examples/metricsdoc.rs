//! Writes docs/metrics.md from the controllers' metric registries; `--check` fails if the file
//! differs (`make generate`, `make check-generated`).

use std::path::Path;

fn main() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/metrics.md");
    let want = tether_controller::metricsdoc::page();
    if std::env::args().any(|a| a == "--check") {
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        if have != want {
            eprintln!("docs/metrics.md is out of date: run `make generate`");
            std::process::exit(1);
        }
        return;
    }
    if let Err(e) = std::fs::write(&path, want) {
        eprintln!("cannot write {}: {e}", path.display());
        std::process::exit(1);
    }
}
