//! `make test` as one job graph (`plan`): the tools, the builds, the lints, the image and every
//! test binary, each started as soon as what it needs is done (`schedule`). Builds run niced
//! beside the tests, which spend most of their time waiting on clusters and timeouts, so the
//! CPU they leave idle builds what later tests need. Each job writes its own log
//! (`target/test-logs/`); the run ends with the table of where the time went, also in
//! `target/test-times.txt`, and `tests: N passed, N failed`.

pub mod exec;
pub mod plan;
pub mod report;
pub mod schedule;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use plan::Job;
use report::{Row, clock};
use schedule::{Limits, State};

/// What the command line asked for.
#[derive(Debug, PartialEq, Eq)]
pub struct Options {
    /// Test slots (`--slots`, `TETHER_TEST_SLOTS`).
    pub slots: u32,
    /// Builds at once (`--builds`).
    pub builds: u32,
    /// Only the jobs whose names contain one of these, and what they need.
    pub only: Vec<String>,
    /// Print the graph, run nothing.
    pub plan: bool,
}

const USAGE: &str = "usage: tether-testrun [--slots N] [--builds N] [--plan] [JOB-NAME-PART...]
  Runs `make test`'s job graph. JOB-NAME-PART: run only the jobs whose names contain it (e.g.
  e2e/agent, unit/, clippy) and what they need. --slots: test slots (default TETHER_TEST_SLOTS or
  6; a test takes about as many as it runs clusters at once); --builds: builds at once (2);
  --plan: print the jobs and what each needs.";

/// Parses the arguments (without the program name).
pub fn parse(args: &[String], slots_env: Option<&str>) -> Result<Options, String> {
    let mut o = Options {
        slots: slots_env.and_then(|s| s.parse().ok()).unwrap_or(6),
        builds: 2,
        only: Vec::new(),
        plan: false,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut number = |flag: &str| -> Result<u32, String> {
            it.next()
                .and_then(|v| v.parse().ok())
                .filter(|n| *n > 0)
                .ok_or_else(|| format!("{flag} takes a number above 0\n{USAGE}"))
        };
        match a.as_str() {
            "--slots" => o.slots = number("--slots")?,
            "--builds" => o.builds = number("--builds")?,
            "--plan" => o.plan = true,
            "-h" | "--help" => return Err(USAGE.into()),
            s if s.starts_with('-') => return Err(format!("unknown flag {s}\n{USAGE}")),
            s => o.only.push(s.to_string()),
        }
    }
    Ok(o)
}

/// The repository's root (this crate is `e2e/runner`).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap_or_else(|_| PathBuf::from("."))
}

/// Keeps the jobs named in `only` and everything they need.
fn select(jobs: Vec<Job>, only: &[String]) -> Vec<Job> {
    if only.is_empty() {
        return jobs;
    }
    let mut keep: Vec<String> = jobs
        .iter()
        .filter(|j| only.iter().any(|o| j.name.contains(o.as_str())))
        .map(|j| j.name.clone())
        .collect();
    let mut i = 0;
    while i < keep.len() {
        if let Some(j) = jobs.iter().find(|j| j.name == keep[i]) {
            for n in &j.needs {
                if !keep.contains(n) {
                    keep.push(n.clone());
                }
            }
        }
        i += 1;
    }
    jobs.into_iter().filter(|j| keep.contains(&j.name)).collect()
}

/// The e2e test jobs of `plan::TESTS`, before the build says where their binaries are.
fn planned_tests(root: &Path) -> Vec<Job> {
    plan::TESTS
        .iter()
        .map(|(name, _)| {
            let a = plan::Artifact {
                package: "tether-e2e".into(),
                target: name.to_string(),
                kind: "test".into(),
                dir: root.join("e2e"),
                executable: PathBuf::new(),
            };
            let mut j = plan::test_job(&a, root, &mut Vec::new());
            j.argv.clear();
            j
        })
        .collect()
}

/// A run in progress.
struct Run {
    jobs: Vec<Job>,
    states: Vec<State>,
    rows: Vec<Row>,
    ended_at: BTreeMap<String, Duration>,
    begin: Instant,
    only: Vec<String>,
    logs: PathBuf,
    root: PathBuf,
}

impl Run {
    fn say(&self, text: &str) {
        println!("[test {:>6}] {text}", clock(self.begin.elapsed()));
    }

    fn add(&mut self, job: Job) {
        self.rows.push(Row {
            name: job.name.clone(),
            what: job.what.clone(),
            result: "not run".into(),
            ..Row::default()
        });
        self.jobs.push(job);
        self.states.push(State::Waiting);
    }

    /// After the build: the planned e2e tests get their binaries, the unit tests are added.
    fn discover(&mut self) {
        let text = std::fs::read_to_string(self.logs.join(plan::ARTIFACTS_FILE)).unwrap_or_default();
        let mut unknown = Vec::new();
        let mut found = Vec::new();
        for a in plan::artifacts(&text) {
            let job = plan::test_job(&a, &self.root, &mut unknown);
            match self.jobs.iter().position(|j| j.name == job.name) {
                Some(i) => {
                    self.jobs[i].argv = job.argv;
                    self.jobs[i].cwd = job.cwd;
                }
                None => found.push(job),
            }
        }
        plan::unique_names(&mut found);
        for job in found {
            if self.only.is_empty() || self.only.iter().any(|o| job.name.contains(o.as_str())) {
                self.add(job);
            }
        }
        for name in unknown {
            self.say(&format!(
                "warning: e2e/tests/{name}.rs is not in e2e/runner/src/plan.rs TESTS: it runs on the \
                 control plane with two slots; add it there"
            ));
        }
        for i in 0..self.jobs.len() {
            if self.jobs[i].argv.is_empty() && self.states[i] == State::Waiting {
                self.states[i] = State::Done(false);
                self.rows[i].result = "FAILED: the build listed no such test binary".into();
            }
        }
    }

    /// What a job waited for before it could start: the need that ended last, or a slot.
    fn waited_for(&self, i: usize) -> String {
        let now = self.begin.elapsed();
        let last = self.jobs[i]
            .needs
            .iter()
            .filter_map(|n| self.ended_at.get(n).map(|t| (n.clone(), *t)))
            .max_by_key(|(_, t)| *t);
        match last {
            Some((_, t)) if now > t + Duration::from_secs(2) => "a slot".into(),
            Some((n, _)) => n,
            None if now > Duration::from_secs(2) => "a slot".into(),
            None => "-".into(),
        }
    }
}

/// What every job gets in its environment: the commit the binaries are stamped with (one value
/// for every cargo command, so none rebuilds another's crates), the C compiler of the test
/// build's target, and no progress bars in the logs.
fn run_env(root: &Path) -> Vec<(String, String)> {
    let sha = std::env::var("TETHER_GIT_SHA").ok().unwrap_or_else(|| {
        std::process::Command::new("git")
            .args(["rev-parse", "--short", "HEAD"])
            .current_dir(root)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|| "dev".into())
    });
    vec![
        ("TETHER_GIT_SHA".into(), sha),
        ("CC_x86_64_unknown_linux_musl".into(), "musl-gcc".into()),
        ("CARGO_TERM_PROGRESS_WHEN".into(), "never".into()),
    ]
}

/// Runs the graph; the exit code says whether every job succeeded.
pub fn run() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opts = match parse(&args, std::env::var("TETHER_TEST_SLOTS").ok().as_deref()) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let root = root();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut all = plan::fixed_jobs(&root, &cargo);
    all.extend(planned_tests(&root));
    let jobs = select(all, &opts.only);
    if opts.plan {
        for j in &jobs {
            println!(
                "{:<22} {:?} needs [{}]: {}",
                j.name,
                j.class,
                j.needs.join(", "),
                j.what
            );
        }
        return ExitCode::SUCCESS;
    }
    let logs = root.join("target/test-logs");
    let _ = std::fs::remove_dir_all(&logs);
    if let Err(e) = std::fs::create_dir_all(&logs) {
        eprintln!("error: cannot create {}: {e}", logs.display());
        return ExitCode::FAILURE;
    }
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let limits = Limits {
        builds: opts.builds,
        tests: opts.slots,
        fetches: 4,
    };
    let cgroups = exec::cgroup_root(&std::process::id().to_string());
    let env = run_env(&root);
    let mut run = Run {
        jobs: Vec::new(),
        states: Vec::new(),
        rows: Vec::new(),
        ended_at: BTreeMap::new(),
        begin: Instant::now(),
        only: opts.only.clone(),
        logs: logs.clone(),
        root: root.clone(),
    };
    for j in jobs {
        run.add(j);
    }
    run.say(&format!(
        "{} jobs, {} test slots, {} builds at once, {cores} cores; logs in target/test-logs/{}",
        run.jobs.len(),
        limits.tests,
        limits.builds,
        if cgroups.is_some() {
            ""
        } else {
            " (no cgroup: CPU not counted)"
        }
    ));
    let mut running: Vec<exec::Running> = Vec::new();
    let mut last_progress = Instant::now();
    loop {
        for (i, need) in schedule::doomed(&run.jobs, &run.states) {
            run.states[i] = State::Skipped(need.clone());
            run.rows[i].result = format!("skipped: {need} failed");
            run.say(&format!("skip   {} ({need} failed)", run.jobs[i].name));
        }
        let ranks = schedule::ranks(&run.jobs);
        for i in schedule::next(&run.jobs, &run.states, &ranks, limits) {
            run.rows[i].waited_for = run.waited_for(i);
            match exec::start(i, &run.jobs[i], &env, &logs, cgroups.as_deref()) {
                Ok(r) => {
                    run.states[i] = State::Running;
                    run.rows[i].start = Some(run.begin.elapsed());
                    run.say(&format!("start  {}", run.jobs[i].name));
                    running.push(r);
                }
                Err(e) => {
                    run.states[i] = State::Done(false);
                    run.rows[i].result = format!("FAILED to start: {e}");
                    run.say(&format!("FAILED {} could not start: {e}", run.jobs[i].name));
                }
            }
        }
        if running.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
        let mut k = 0;
        while k < running.len() {
            let Some(end) = running[k].poll() else {
                k += 1;
                continue;
            };
            running.swap_remove(k);
            let i = end.index;
            let name = run.jobs[i].name.clone();
            run.states[i] = State::Done(end.ok);
            run.ended_at.insert(name.clone(), run.begin.elapsed());
            let row = &mut run.rows[i];
            row.wall = Some(end.wall);
            row.cpu = end.cpu;
            row.tests = std::fs::read_to_string(&end.log)
                .ok()
                .and_then(|l| report::counts(&l));
            row.result = match (end.ok, end.timed_out) {
                (true, _) => "ok".into(),
                (false, true) => format!("TIMED OUT after {}", clock(run.jobs[i].timeout)),
                (false, false) => "FAILED".into(),
            };
            let tests = row
                .tests
                .map(|(p, f)| format!(", {p} passed, {f} failed"))
                .unwrap_or_default();
            let verdict = if end.ok { "ok    " } else { "FAILED" };
            run.say(&format!("{verdict} {name} in {}{tests}", clock(end.wall)));
            if name == plan::BUILD && end.ok {
                run.discover();
            }
        }
        if last_progress.elapsed() >= Duration::from_secs(60) {
            last_progress = Instant::now();
            let now: Vec<String> = running
                .iter()
                .map(|r| format!("{} {}", run.jobs[r.index].name, clock(r.started.elapsed())))
                .collect();
            let waiting = run.states.iter().filter(|s| **s == State::Waiting).count();
            run.say(&format!("running: {}; {waiting} waiting", now.join(", ")));
        }
    }
    if let Some(dir) = &cgroups {
        exec::remove_cgroup_root(dir);
    }
    finish(&run, cores)
}

/// Prints the failures' logs, the table (also into target/test-times.txt) and the test count.
fn finish(run: &Run, cores: usize) -> ExitCode {
    let failed: Vec<usize> = (0..run.jobs.len())
        .filter(|&i| matches!(run.states[i], State::Done(false)))
        .collect();
    for &i in &failed {
        let log = exec::log_path(&run.logs, &run.jobs[i].name);
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = &lines[lines.len().saturating_sub(120)..];
        println!(
            "\n---- {} FAILED: the last {} lines of {} ----",
            run.jobs[i].name,
            tail.len(),
            log.display()
        );
        for l in tail {
            println!("{l}");
        }
    }
    let table = report::table(&run.rows, run.begin.elapsed(), cores);
    println!("\n{table}");
    let times = run.logs.join("../test-times.txt");
    if let Err(e) = std::fs::write(&times, &table) {
        eprintln!("warning: cannot write {}: {e}", times.display());
    }
    let (passed, failed_tests) = run
        .rows
        .iter()
        .filter_map(|r| r.tests)
        .fold((0, 0), |(p, f), (a, b)| (p + a, f + b));
    println!("tests: {passed} passed, {failed_tests} failed");
    let bad = run
        .states
        .iter()
        .filter(|s| !matches!(s, State::Done(true)))
        .count();
    if bad == 0 {
        ExitCode::SUCCESS
    } else {
        println!(
            "{bad} jobs did not succeed: {}",
            failed
                .iter()
                .map(|&i| run.jobs[i].name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
        ExitCode::FAILURE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn arguments_parse_and_bad_ones_say_how_to_call() {
        let o = parse(&s(&["--slots", "3", "e2e/agent"]), None).expect("ok");
        assert_eq!(
            (o.slots, o.builds, o.only.clone(), o.plan),
            (3, 2, s(&["e2e/agent"]), false)
        );
        assert_eq!(parse(&[], Some("8")).expect("env").slots, 8);
        assert_eq!(parse(&[], Some("x")).expect("bad env ignored").slots, 6);
        for bad in [&["--slots"][..], &["--slots", "0"], &["--frob"]] {
            let e = parse(&s(bad), None).expect_err("refused");
            assert!(e.contains("usage:"), "{e}");
        }
    }

    #[test]
    fn selecting_a_test_keeps_what_it_needs_and_nothing_else() {
        let root = root();
        let mut all = plan::fixed_jobs(&root, "cargo");
        all.extend(planned_tests(&root));
        let got: Vec<String> = select(all, &s(&["e2e/compat"]))
            .into_iter()
            .map(|j| j.name)
            .collect();
        for want in ["e2e/compat", "build", "tools/oldest", "tools/kubernetes"] {
            assert!(got.contains(&want.to_string()), "{want} missing from {got:?}");
        }
        assert!(!got.contains(&"image".to_string()), "{got:?}");
        assert!(!got.contains(&"e2e/agent".to_string()), "{got:?}");
    }
}
