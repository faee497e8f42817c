//! The README's configuration reference matches the real chart values and controller flags:
//! every value key and every flag is documented, and nothing documented is made up.

use std::collections::BTreeSet;
use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// Values that are Kubernetes objects as a whole (documented by their key, not field by field).
const OBJECTS: [&str; 6] = [
    "resources",
    "podSecurityContext",
    "securityContext",
    "livenessProbe",
    "readinessProbe",
    "dashboard.labels",
];

/// Dotted keys of a values file; free-form maps (Kubernetes objects, labels, selectors) are leaves.
fn keys(prefix: &str, v: &Value, out: &mut BTreeSet<String>) {
    match v {
        Value::Object(map) if !map.is_empty() && !OBJECTS.contains(&prefix) => {
            for (k, child) in map {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                keys(&key, child, out);
            }
        }
        _ => {
            out.insert(prefix.to_string());
        }
    }
}

/// The backquoted names in the first column of the README table under `heading`.
fn documented(readme: &str, heading: &str) -> BTreeSet<String> {
    let section = readme
        .split(heading)
        .nth(1)
        .unwrap_or_else(|| panic!("README has no {heading}"));
    section
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .filter_map(|l| l.split('|').nth(1))
        .flat_map(|cell| {
            cell.split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn readme_documents_every_chart_value_and_nothing_else() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README");
    for chart in ["tether-leader", "tether-agent"] {
        let text =
            std::fs::read_to_string(root().join(format!("charts/{chart}/values.yaml"))).expect("values");
        let values = Value::deserialize(serde_norway::Deserializer::from_str(&text)).expect("yaml");
        let mut real = BTreeSet::new();
        keys("", &values, &mut real);
        let docs = documented(&readme, &format!("### `charts/{chart}` values"));
        let missing: Vec<_> = real.difference(&docs).collect();
        let invented: Vec<_> = docs.difference(&real).collect();
        assert!(
            missing.is_empty(),
            "{chart} values missing from the README: {missing:?}"
        );
        assert!(
            invented.is_empty(),
            "README documents {chart} values that do not exist: {invented:?}"
        );
    }
}

#[test]
fn readme_documents_every_controller_flag_and_nothing_else() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README");
    let bin = tether_testkit::controller::binary("tether-controller").expect("tether-controller binary");
    let mut real = BTreeSet::new();
    for role in ["leader", "agent"] {
        let help = std::process::Command::new(&bin)
            .args([role, "--help"])
            .output()
            .expect("help");
        for line in String::from_utf8_lossy(&help.stdout).lines() {
            let flag = line
                .trim_start()
                .strip_prefix("--")
                .and_then(|f| f.split_whitespace().next());
            if let Some(flag) = flag.filter(|f| *f != "help" && *f != "version") {
                real.insert(format!("--{flag}"));
            }
        }
    }
    let docs = documented(&readme, "### `tether-controller` flags");
    assert!(real.len() >= 10, "parsed the flags: {real:?}");
    let missing: Vec<_> = real.difference(&docs).collect();
    let invented: Vec<_> = docs
        .iter()
        .filter(|d| d.starts_with("--"))
        .filter(|d| !real.contains(*d))
        .collect();
    assert!(missing.is_empty(), "flags missing from the README: {missing:?}");
    assert!(
        invented.is_empty(),
        "README documents flags that do not exist: {invented:?}"
    );
}
