//! The liveness benchmark's figures and their report.

use super::*;

/// One run's figures.
#[derive(Debug)]
pub struct Outcome {
    /// Members.
    pub members: usize,
    /// kube-apiservers (their figures are summed).
    pub api_servers: usize,
    /// The API server's measured limit for small writes, /s.
    pub api_limit: f64,
    /// Registrations per second.
    pub registration_rate: f64,
    /// API writes per registration (every client).
    pub writes_per_registration: f64,
    /// Requests per registration by verb and resource while members registered (heartbeats and
    /// the control plane's own requests included), those at 0.05 or more.
    pub registration_mix: BTreeMap<String, f64>,
    /// Per member, KiB / goroutines / fds of kube-apiserver, and KiB of etcd RSS.
    pub per_member: (Held, f64),
    /// The same before the leader deleted the approved requests, and how many were left then.
    pub per_member_with_request: Option<((Held, f64), usize)>,
    /// Per idle tunnel, the same (none when tunnels attached at join: then `per_member` holds both).
    pub per_tunnel: Option<(Held, f64)>,
    /// Whether each member dialled its tunnel as soon as it was in.
    pub attach_at_join: bool,
    /// `apiserver_flowcontrol_current_executing_seats` (all levels) with every tunnel open: max of
    /// `SEAT_SAMPLES` read after the steady window.
    pub seats: f64,
    /// Steady writes/s by kind.
    pub steady_writes: BTreeMap<String, f64>,
    /// Steady CPU (share of a core): leader, kube-apiserver, etcd.
    pub steady_cpu: (f64, f64, f64),
    /// RSS MiB with every tunnel attached: leader, kube-apiserver, etcd.
    pub rss: (f64, f64, f64),
    /// The leader's RSS MiB before any member joined, and with every member in (and their tunnels,
    /// when attached at join).
    pub leader_before: (f64, f64),
    /// Time from tunnels started (or every member in, when attached at join) to all attached.
    pub attach_all: Duration,
    /// Killed agents to Unknown, sorted.
    pub killed: Vec<Duration>,
    /// Frozen agents to Unknown, sorted.
    pub frozen: Vec<Duration>,
    /// The set's detection time and ping timeout.
    pub detection: (Duration, Duration),
    /// The failover: a standby took over from the killed serving replica.
    pub failover: Failover,
}

/// The figures of one run, as Markdown lines.
pub fn report(o: &Outcome) -> String {
    let ms = |d: Duration| format!("{:.1} s", d.as_secs_f64());
    let per_member_writes = o.steady_writes.values().sum::<f64>() / o.members as f64;
    let mut out = format!("### N = {}\n\n", o.members);
    if o.api_servers > 1 {
        out.push_str(&format!(
            "{} kube-apiservers in front of one etcd, members taking them in turn; their figures \
             are summed (the write limit is measured through the first)\n\n",
            o.api_servers
        ));
    }
    let mut line = |k: &str, v: String| out.push_str(&format!("| {k} | {v} |\n"));
    line(
        "API server limit (small writes)",
        format!("{:.0} /s", o.api_limit),
    );
    line(
        "registration",
        format!(
            "{:.1} /s; {:.1} writes each (every client); the limit allows {:.1} /s: {:.0} %",
            o.registration_rate,
            o.writes_per_registration,
            o.api_limit / o.writes_per_registration,
            100.0 * o.registration_rate / (o.api_limit / o.writes_per_registration)
        ),
    );
    line(
        "requests per registration while registering",
        o.registration_mix
            .iter()
            .map(|(k, v)| format!("{k} {v:.2}"))
            .collect::<Vec<_>>()
            .join(", "),
    );
    let held = |h: &(Held, f64)| {
        format!(
            "kube-apiserver {:.1} KiB RSS, {:.1} KiB heap ({:.1} KiB live after a forced GC), {:.2} goroutines, \
             {:.2} fds, {:.1} watch-cache history slots; etcd {:.1} KiB RSS",
            h.0.rss, h.0.heap, h.0.live, h.0.goroutines, h.0.fds, h.0.history, h.1
        )
    };
    if let Some((with, left)) = &o.per_member_with_request {
        line(
            &format!("per member before the leader deleted the approved requests ({left} of them left)"),
            held(with),
        );
    }
    match &o.per_tunnel {
        Some(t) => {
            line("per member (no tunnel)", held(&o.per_member));
            line("per idle tunnel", held(t));
            // NB: the members' Lease renewals slow down once their tunnel is attached, and the
            // watch caches' history of them shrinks: the tunnel's share is credited with it.
            // The sum is what a member with its tunnel costs at steady state.
            line(
                "per member with its idle tunnel (the two above added)",
                held(&(o.per_member.0.plus(t.0), o.per_member.1 + t.1)),
            );
        }
        None => line("per member with its idle tunnel", held(&o.per_member)),
    }
    line(
        "executing seats, max of 10 samples after the steady window",
        format!("{:.0}", o.seats),
    );
    line(
        if o.attach_at_join {
            "all tunnels attached, after the last member was in"
        } else {
            "all tunnels attached"
        },
        ms(o.attach_all),
    );
    line(
        "steady writes",
        format!(
            "{} = {:.4} per member per s",
            o.steady_writes
                .iter()
                .map(|(k, v)| format!("{k} {v:.1}/s"))
                .collect::<Vec<_>>()
                .join(", "),
            per_member_writes
        ),
    );
    line(
        "steady CPU (share of a core)",
        format!(
            "leader {:.1} %, kube-apiserver {:.1} %, etcd {:.1} %",
            o.steady_cpu.0 * 100.0,
            o.steady_cpu.1 * 100.0,
            o.steady_cpu.2 * 100.0
        ),
    );
    line(
        "RSS",
        format!(
            "leader {:.0} MiB, kube-apiserver {:.0} MiB, etcd {:.0} MiB",
            o.rss.0, o.rss.1, o.rss.2
        ),
    );
    let (alone, members) = o.leader_before;
    if o.attach_at_join {
        line(
            "leader RSS per member with its tunnel",
            format!(
                "{:.1} KiB ({alone:.0} MiB alone)",
                (o.rss.0 - alone) * 1024.0 / o.members as f64
            ),
        );
    } else {
        line(
            "leader RSS per member, per tunnel",
            format!(
                "{:.1} KiB, {:.1} KiB ({alone:.0} MiB alone, {members:.0} MiB with every member and no tunnel)",
                (members - alone) * 1024.0 / o.members as f64,
                (o.rss.0 - members) * 1024.0 / o.members as f64,
            ),
        );
    }
    line(
        &format!("killed → Unknown ({} agents)", o.killed.len()),
        format!(
            "p50 {}, p99 {} (detection {})",
            ms(quantile(&o.killed, 0.5)),
            ms(quantile(&o.killed, 0.99)),
            ms(o.detection.0)
        ),
    );
    line(
        &format!("frozen → Unknown ({} agents)", o.frozen.len()),
        format!(
            "p50 {}, p99 {} (ping {}, timeout {})",
            ms(quantile(&o.frozen, 0.5)),
            ms(quantile(&o.frozen, 0.99)),
            ms(o.detection.0 - o.detection.1),
            ms(o.detection.1)
        ),
    );
    let f = &o.failover;
    line(
        "failover: every tunnel attached again",
        match (f.reattach, f.first) {
            (None, _) => "not within the window".into(),
            (Some(all), Some(first)) => {
                format!("{} ({} after the first)", ms(all), ms(all.saturating_sub(first)))
            }
            (Some(all), None) => ms(all),
        },
    );
    line(
        "failover: attaches told to wait for a turn",
        format!("{:.0}", f.paced),
    );
    line(
        "failover: live members marked Unknown or False",
        f.marked.to_string(),
    );
    line(
        "failover: live members whose Ready changed at all",
        f.moved.to_string(),
    );
    line(
        "failover: writes",
        format!("peak {:.0} in one second, {:.0} in all", f.writes.0, f.writes.1),
    );
    line(
        "standby RSS with every tunnel",
        format!("{:.0} MiB", f.standby_rss),
    );
    out
}
