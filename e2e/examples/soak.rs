//! The soak (`make soak`): a leader with N simulated members for a set time while faults are
//! injected at random, bounded intervals; prints what was lost, duplicated and how fast every
//! member was Ready again after each fault, against the targets. Exits 1 if a target is missed.
//!
//! `cargo run --release -p tether-e2e --example soak -- [--members N] [--duration 30m]
//!  [--interval 10s] [--gap-min 60s] [--gap-max 120s] [--etcd-pause 20s]
//!  [--without leader-killed,etcd-paused,...]`

use std::process::ExitCode;
use std::time::Duration;

use tether_e2e::soak::{Settings, run};

#[tokio::main]
async fn main() -> ExitCode {
    let mut settings = Settings {
        members: 1000,
        duration: Duration::from_secs(30 * 60),
        interval: Duration::from_secs(10),
        gap: (Duration::from_secs(60), Duration::from_secs(120)),
        etcd_pause: Duration::from_secs(20),
        without: Vec::new(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let Some(value) = args.next() else {
            eprintln!("error: {flag} needs a value");
            return ExitCode::from(2);
        };
        let duration = || tether_api::duration::parse(&value);
        let parsed = match flag.as_str() {
            "--members" => value
                .parse()
                .map(|n| settings.members = n)
                .map_err(|e| format!("{e}")),
            "--duration" => duration().map(|d| settings.duration = d),
            "--interval" => duration().map(|d| settings.interval = d),
            "--gap-min" => duration().map(|d| settings.gap.0 = d),
            "--gap-max" => duration().map(|d| settings.gap.1 = d),
            "--etcd-pause" => duration().map(|d| settings.etcd_pause = d),
            "--without" => value
                .split(',')
                .map(str::parse)
                .collect::<Result<Vec<_>, _>>()
                .map(|f| settings.without = f),
            other => Err(format!("unknown flag {other}")),
        };
        if let Err(e) = parsed {
            eprintln!("error: {flag} {value}: {e}");
            return ExitCode::from(2);
        }
    }
    if settings.without.len() >= 5 {
        eprintln!("error: --without leaves no fault to inject");
        return ExitCode::from(2);
    }
    if settings.gap.0 > settings.gap.1 || settings.interval.is_zero() || settings.members == 0 {
        eprintln!("error: need --gap-min ≤ --gap-max, a non-zero --interval and at least one member");
        return ExitCode::from(2);
    }
    let outcome = run(&settings).await;
    let table = outcome.table();
    println!("{table}");
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/soak");
    let _ = std::fs::create_dir_all(&dir);
    let _ = std::fs::write(dir.join(format!("soak-{}.md", settings.members)), &table);
    if outcome.passed() {
        ExitCode::SUCCESS
    } else {
        eprintln!("soak: a target was missed (see the table)");
        ExitCode::FAILURE
    }
}
