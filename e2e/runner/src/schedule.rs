//! Which jobs start now: a pure function of the graph, what has run and what runs, so every rule
//! is table-tested. Longest remaining path first (a job that gates long tests goes before a
//! short one); builds share their own slots, tests the test slots by weight, downloads run
//! freely; a job whose need failed is skipped, never run on a half-built machine.

use std::time::Duration;

use crate::plan::{Class, Job};

/// Where a job is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum State {
    /// Not started.
    Waiting,
    /// Started, not ended.
    Running,
    /// Ended; `true` when it succeeded.
    Done(bool),
    /// Not run because this need of it failed or was skipped.
    Skipped(String),
}

/// How much may run at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Builds at once (each takes every core it can).
    pub builds: u32,
    /// Test slots (a test takes its weight of them).
    pub tests: u32,
    /// Downloads at once.
    pub fetches: u32,
}

/// Each job's longest path to the end of the graph (itself included), by estimate: the order
/// in which ready jobs start.
pub fn ranks(jobs: &[Job]) -> Vec<Duration> {
    let mut rank: Vec<Option<Duration>> = vec![None; jobs.len()];
    fn visit(i: usize, jobs: &[Job], rank: &mut Vec<Option<Duration>>, depth: usize) -> Duration {
        if let Some(r) = rank[i] {
            return r;
        }
        let mut longest = Duration::ZERO;
        if depth <= jobs.len() {
            for (k, j) in jobs.iter().enumerate() {
                if j.needs.iter().any(|n| *n == jobs[i].name) {
                    longest = longest.max(visit(k, jobs, rank, depth + 1));
                }
            }
        }
        let r = jobs[i].estimate + longest;
        rank[i] = Some(r);
        r
    }
    (0..jobs.len()).map(|i| visit(i, jobs, &mut rank, 0)).collect()
}

/// Jobs that can never run because a need failed, was skipped or does not exist, with that need.
pub fn doomed(jobs: &[Job], states: &[State]) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (i, j) in jobs.iter().enumerate() {
        if states[i] != State::Waiting {
            continue;
        }
        for n in &j.needs {
            match jobs.iter().position(|k| k.name == *n) {
                None => out.push((i, format!("{n} (no such job)"))),
                Some(k) if matches!(states[k], State::Done(false) | State::Skipped(_)) => {
                    out.push((i, n.clone()))
                }
                Some(_) => continue,
            }
            break;
        }
    }
    out
}

/// The waiting jobs to start now, in order, given what runs.
pub fn next(jobs: &[Job], states: &[State], ranks: &[Duration], limits: Limits) -> Vec<usize> {
    let done_ok = |name: &String| {
        jobs.iter()
            .position(|k| k.name == *name)
            .is_some_and(|k| states[k] == State::Done(true))
    };
    let mut builds = 0;
    let mut fetches = 0;
    let mut slots = 0;
    for (i, j) in jobs.iter().enumerate() {
        if states[i] == State::Running {
            match j.class {
                Class::Build => builds += 1,
                Class::Fetch => fetches += 1,
                Class::Test { weight } => slots += weight.min(limits.tests),
            }
        }
    }
    // NB: a build whose only unmet needs are downloads, started or about to be (the test build
    // waits for the Rust target's install), keeps its build slot from lower-ranked builds:
    // without that, a ten-minute tool build took the slot in the seconds before it, on the
    // critical path.
    let running_fetch = |name: &String| {
        jobs.iter().position(|k| k.name == *name).is_some_and(|k| {
            matches!(states[k], State::Running | State::Waiting) && jobs[k].class == Class::Fetch
        })
    };
    let about_ready = |i: usize| {
        jobs[i].class == Class::Build
            && jobs[i].needs.iter().any(|n| !done_ok(n))
            && jobs[i].needs.iter().all(|n| done_ok(n) || running_fetch(n))
    };
    let mut ready: Vec<usize> = (0..jobs.len())
        .filter(|&i| states[i] == State::Waiting && (jobs[i].needs.iter().all(done_ok) || about_ready(i)))
        .collect();
    ready.sort_by(|&a, &b| ranks[b].cmp(&ranks[a]).then(a.cmp(&b)));
    let mut start = Vec::new();
    for i in ready {
        match jobs[i].class {
            Class::Build if builds < limits.builds && about_ready(i) => builds += 1,
            Class::Build if builds < limits.builds => {
                builds += 1;
                start.push(i);
            }
            Class::Fetch if fetches < limits.fetches => {
                fetches += 1;
                start.push(i);
            }
            Class::Test { weight } => {
                // A test heavier than the pool runs when the pool is empty.
                let w = weight.min(limits.tests);
                if slots + w <= limits.tests {
                    slots += w;
                    start.push(i);
                }
            }
            _ => {}
        }
    }
    start
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn j(name: &str, class: Class, needs: &[&str], secs: u64) -> Job {
        Job {
            name: name.into(),
            what: String::new(),
            class,
            needs: needs.iter().map(|s| s.to_string()).collect(),
            argv: vec!["true".into()],
            cwd: PathBuf::from("."),
            env: Vec::new(),
            estimate: Duration::from_secs(secs),
            timeout: Duration::from_secs(60),
        }
    }

    const LIMITS: Limits = Limits {
        builds: 1,
        tests: 4,
        fetches: 2,
    };

    fn t(weight: u32) -> Class {
        Class::Test { weight }
    }

    fn names(jobs: &[Job], idx: &[usize]) -> Vec<String> {
        idx.iter().map(|&i| jobs[i].name.clone()).collect()
    }

    #[test]
    fn the_job_gating_the_longest_path_starts_first() {
        let jobs = vec![
            j("lint", Class::Build, &[], 100),
            j("build", Class::Build, &[], 60),
            j("long", t(1), &["build"], 600),
        ];
        let r = ranks(&jobs);
        assert_eq!(r[1], Duration::from_secs(660));
        let states = vec![State::Waiting; 3];
        assert_eq!(names(&jobs, &next(&jobs, &states, &r, LIMITS)), vec!["build"]);
    }

    #[test]
    fn starts_follow_the_limits_of_each_class() {
        // (what, jobs, states, expected starts)
        type Case = (&'static str, Vec<Job>, Vec<State>, Vec<&'static str>);
        let cases: Vec<Case> = vec![
            (
                "a need not done holds a job back",
                vec![j("build", Class::Build, &[], 10), j("t", t(1), &["build"], 10)],
                vec![State::Running, State::Waiting],
                vec![],
            ),
            (
                "a need done lets it start",
                vec![j("build", Class::Build, &[], 10), j("t", t(1), &["build"], 10)],
                vec![State::Done(true), State::Waiting],
                vec!["t"],
            ),
            (
                "tests fill the slots by weight, longest first, and a light one backfills",
                vec![
                    j("a", t(2), &[], 50),
                    j("b", t(2), &[], 40),
                    j("c", t(2), &[], 30),
                    j("d", t(1), &[], 5),
                ],
                vec![State::Waiting, State::Running, State::Waiting, State::Waiting],
                vec!["a"],
            ),
            (
                "a light test takes a slot left over",
                vec![j("a", t(3), &[], 50), j("b", t(2), &[], 40), j("d", t(1), &[], 5)],
                vec![State::Running, State::Waiting, State::Waiting],
                vec!["d"],
            ),
            (
                "a test heavier than the pool runs alone",
                vec![j("huge", t(9), &[], 50), j("d", t(1), &[], 5)],
                vec![State::Waiting, State::Waiting],
                vec!["huge"],
            ),
            (
                "builds wait for a build slot; downloads and tests do not",
                vec![
                    j("image", Class::Build, &[], 50),
                    j("clippy", Class::Build, &[], 40),
                    j("helm", Class::Fetch, &[], 5),
                    j("t", t(1), &[], 5),
                ],
                vec![State::Waiting, State::Waiting, State::Waiting, State::Waiting],
                vec!["image", "helm", "t"],
            ),
            (
                "a build waiting only on a download under way keeps its slot from a lower one",
                vec![
                    j("packages", Class::Fetch, &[], 5),
                    j("build", Class::Build, &["packages"], 50),
                    j("tools", Class::Build, &[], 40),
                ],
                vec![State::Running, State::Waiting, State::Waiting],
                vec![],
            ),
            (
                "and on one about to start, at the very first pick",
                vec![
                    j("packages", Class::Fetch, &[], 5),
                    j("build", Class::Build, &["packages"], 50),
                    j("tools", Class::Build, &[], 40),
                ],
                vec![State::Waiting, State::Waiting, State::Waiting],
                vec!["packages"],
            ),
            (
                "a running build holds the next back",
                vec![
                    j("image", Class::Build, &[], 50),
                    j("clippy", Class::Build, &[], 40),
                ],
                vec![State::Running, State::Waiting],
                vec![],
            ),
            (
                "nothing starts twice or again",
                vec![j("a", t(1), &[], 5), j("b", t(1), &[], 5), j("c", t(1), &[], 5)],
                vec![State::Running, State::Done(true), State::Done(false)],
                vec![],
            ),
        ];
        for (what, jobs, states, want) in cases {
            let r = ranks(&jobs);
            assert_eq!(names(&jobs, &next(&jobs, &states, &r, LIMITS)), want, "{what}");
        }
    }

    #[test]
    fn a_build_about_to_be_ready_keeps_one_build_slot() {
        let two = Limits { builds: 2, ..LIMITS };
        // (what, jobs, states, expected starts)
        type Case = (&'static str, Vec<Job>, Vec<State>, Vec<&'static str>);
        let cases: Vec<Case> = vec![
            (
                "the other slot goes to the next build",
                vec![
                    j("packages", Class::Fetch, &[], 5),
                    j("build", Class::Build, &["packages"], 50),
                    j("tools", Class::Build, &[], 40),
                    j("other", Class::Build, &[], 30),
                ],
                vec![State::Running, State::Waiting, State::Waiting, State::Waiting],
                vec!["tools"],
            ),
            (
                "a build waiting on a build holds nothing",
                vec![
                    j("build", Class::Build, &[], 50),
                    j("image", Class::Build, &["build"], 50),
                    j("tools", Class::Build, &[], 10),
                ],
                vec![State::Running, State::Waiting, State::Waiting],
                vec!["tools"],
            ),
            (
                "a lower-ranked build waiting on a download holds nothing from a higher one",
                vec![
                    j("packages", Class::Fetch, &[], 5),
                    j("small", Class::Build, &["packages"], 5),
                    j("big", Class::Build, &[], 100),
                    j("mid", Class::Build, &[], 50),
                ],
                vec![State::Running, State::Waiting, State::Waiting, State::Waiting],
                vec!["big", "mid"],
            ),
        ];
        for (what, jobs, states, want) in cases {
            let r = ranks(&jobs);
            assert_eq!(names(&jobs, &next(&jobs, &states, &r, two)), want, "{what}");
        }
    }

    #[test]
    fn a_failed_or_missing_need_dooms_what_needs_it() {
        let jobs = vec![
            j("build", Class::Build, &[], 10),
            j("t", t(1), &["build"], 10),
            j("u", t(1), &["t"], 10),
            j("v", t(1), &["nowhere"], 10),
        ];
        let states = vec![State::Done(false), State::Waiting, State::Waiting, State::Waiting];
        let got = doomed(&jobs, &states);
        assert_eq!(
            got,
            vec![(1, "build".to_string()), (3, "nowhere (no such job)".to_string())]
        );
        let states = vec![
            State::Done(false),
            State::Skipped("build".into()),
            State::Waiting,
            State::Skipped("x".into()),
        ];
        assert_eq!(doomed(&jobs, &states), vec![(2, "t".to_string())]);
    }

    #[test]
    fn a_cycle_does_not_hang_the_ranking() {
        let jobs = vec![j("a", t(1), &["b"], 1), j("b", t(1), &["a"], 1)];
        let r = ranks(&jobs);
        assert_eq!(r.len(), 2);
    }
}
