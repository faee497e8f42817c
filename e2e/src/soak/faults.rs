//! The faults of a soak and what it counts of them: `Soak` is the run's world (the leader, the
//! fleet, the running members, the write windows), `Fault::inject` does one fault to it, and
//! `Tally` records how long the set took to recover from each.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Client;
use kube::api::{Api, ListParams};
use rand::seq::SliceRandom;
use tether_api::ManagedCluster;
use tether_sim::{Fleet, Member, join_all};
use tether_testkit::Controller;

use super::{Fault, Leader, Life, Running, Settings, run_member, stop_member};
use crate::probe::prom::request_counts;
use crate::scale::{classify, set_counts};

/// What a soak runs on and keeps across its faults.
pub(super) struct Soak {
    pub(super) settings: Settings,
    pub(super) leader: Leader,
    pub(super) admin: Client,
    pub(super) fleet: Fleet,
    /// The members heartbeating now, by name.
    pub(super) running: HashMap<String, Running>,
    /// The number in the next new member's name.
    pub(super) next_name: usize,
    /// Writes so far by kind, and the API server's counters at the start of this window (an API
    /// server restart resets them).
    pub(super) writes: BTreeMap<String, f64>,
    pub(super) since: BTreeMap<String, f64>,
    pub(super) window: Instant,
    /// Each leader process that ended, in order.
    pub(super) lives: Vec<Life>,
}

impl Soak {
    /// Members `names` join and heartbeat.
    pub(super) async fn join(&mut self, names: Vec<String>, at_once: usize) {
        let running = &mut self.running;
        join_all(&self.fleet, names, at_once, |member, _| {
            running.insert(member.name.clone(), run_member(member));
        })
        .await
        .expect("members join");
    }

    /// The names of `k` running members, at random.
    fn pick(&self, k: usize) -> Vec<String> {
        let mut names: Vec<String> = self.running.keys().cloned().collect();
        names.shuffle(&mut rand::rng());
        names.truncate(k);
        names
    }

    /// Adds the writes of the window that ends now.
    pub(super) async fn close_window(&mut self) {
        let now = request_counts(&self.admin).await;
        let secs = self.window.elapsed().as_secs_f64();
        for (kind, per_second) in classify(&self.since, &now, secs) {
            *self.writes.entry(kind).or_default() += per_second * secs;
        }
        self.since = now;
        self.window = Instant::now();
    }
}

impl Fault {
    /// Does this fault to `soak`; returns when it is over (not when the set recovered).
    pub(super) async fn inject(self, soak: &mut Soak) {
        match self {
            Fault::LeaderKilled => {
                let life = soak.leader.restart().await;
                soak.lives.push(life);
            }
            Fault::ApiServerRestarted => {
                soak.close_window().await;
                let cluster = &mut soak.leader.side.cluster;
                cluster.stop_api_server();
                cluster.start_api_server().await.expect("API server back");
                // NB: the restarted API server counts from zero.
                soak.since = BTreeMap::new();
            }
            Fault::EtcdPaused => {
                let cluster = &soak.leader.side.cluster;
                cluster.pause_etcd().expect("pause etcd");
                tokio::time::sleep(soak.settings.etcd_pause).await;
                cluster.resume_etcd().expect("resume etcd");
            }
            Fault::MembersRestarted => {
                let stopping: Vec<Running> = soak
                    .pick((soak.running.len() / 20).max(1))
                    .iter()
                    .filter_map(|name| soak.running.remove(name))
                    .collect();
                let stopped: Vec<Member> =
                    futures::future::join_all(stopping.into_iter().map(stop_member)).await;
                tokio::time::sleep(soak.settings.interval * 2).await;
                for m in stopped {
                    soak.running.insert(m.name.clone(), run_member(m));
                }
            }
            Fault::Churn => {
                let k = (soak.running.len() / 50).max(1);
                for name in soak.pick(k) {
                    if let Some(r) = soak.running.remove(&name) {
                        stop_member(r).await.leave().await.expect("leave");
                    }
                }
                let new = (soak.next_name..soak.next_name + k)
                    .map(|i| format!("soak-{i:05}"))
                    .collect();
                soak.next_name += k;
                soak.join(new, k).await;
            }
        }
    }
}

/// How the set recovered from each fault.
#[derive(Default)]
pub(super) struct Tally {
    /// Time from each fault's end until every member was Ready again, by fault.
    pub(super) recoveries: BTreeMap<Fault, Vec<Duration>>,
    /// The most members seen not Ready during a recovery, by fault.
    pub(super) unready: BTreeMap<Fault, usize>,
    /// Faults the set did not recover from in time, and what it looked like.
    pub(super) timeouts: Vec<(Fault, String)>,
}

impl Tally {
    /// Records how the set recovered from `fault`, which lasted `lasted`.
    pub(super) fn record(
        &mut self,
        fault: Fault,
        lasted: Duration,
        recovered: Result<(Duration, usize), String>,
        t: f64,
    ) {
        match recovered {
            Ok((took, not_ready)) => {
                eprintln!(
                    "   [{t:>5.0}s] {fault:?} (lasted {lasted:.1?}): every member heartbeated and Ready {took:.1?} \
                     after it ended; at most {not_ready} seen not Ready"
                );
                self.recoveries.entry(fault).or_default().push(took);
                let worst = self.unready.entry(fault).or_default();
                *worst = (*worst).max(not_ready);
            }
            Err(last) => {
                eprintln!("   {fault:?}: members not all Ready in time: {last}");
                self.timeouts.push((fault, last));
            }
        }
    }
}

/// Waits until the leader has demonstrably recovered from a fault that ended at `since`: it
/// answers ready, every member in `expected` has heartbeated since and is `Ready=True`, and the
/// ClusterSet counts exactly them. Returns the time that took and the most members seen not
/// Ready meanwhile.
pub(super) async fn wait_recovered(
    admin: &Client,
    leader: &Controller,
    expected: &HashSet<String>,
    since: Instant,
    timeout: Duration,
) -> Result<(Duration, usize), String> {
    let wall_since = Timestamp::now() - SignedDuration::try_from(since.elapsed()).unwrap_or_default();
    let n = expected.len();
    let mut worst = 0;
    loop {
        let ready_leader = matches!(leader.admin_get("/readyz").await, Ok((200, _)));
        let clusters = Api::<ManagedCluster>::all(admin.clone())
            .list(&ListParams::default())
            .await;
        // NB: simulated members heartbeat on their Lease (labelled with their cluster ID).
        let leases = Api::<Lease>::all(admin.clone())
            .list(&ListParams::default().labels(tether_api::labels::CLUSTER_SET))
            .await;
        let (mut ready, mut beat) = (0, 0);
        if let (Ok(clusters), Ok(leases)) = (&clusters, &leases) {
            ready = clusters
                .items
                .iter()
                .filter(|mc| expected.contains(&mc.spec.cluster_id))
                .filter(|mc| {
                    mc.status
                        .iter()
                        .flat_map(|s| &s.conditions)
                        .any(|c| c.type_ == "Ready" && c.status == "True")
                })
                .count();
            beat = leases
                .items
                .iter()
                .filter_map(|l| l.spec.as_ref())
                .filter(|l| l.holder_identity.as_ref().is_some_and(|id| expected.contains(id)))
                .filter(|l| l.renew_time.as_ref().is_some_and(|t| t.0 > wall_since))
                .count();
            worst = worst.max(n - ready.min(n));
        }
        let counts = set_counts(admin).await;
        if ready_leader && ready == n && beat == n && counts == Some((n, n)) {
            return Ok((since.elapsed(), worst));
        }
        if since.elapsed() > timeout {
            return Err(format!(
                "leader ready: {ready_leader}, Ready {ready}/{n}, heartbeated since {beat}/{n}, set counts {counts:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
