//! Publishes every member as a SIG-Multicluster ClusterProfile (KEP-4322) in each inventory
//! namespace its set lists, so that tools outside Tether (Argo CD, Kueue MultiKueue,
//! multicluster-runtime) find it and reach it through the leader's proxy with `tether
//! credential` as their exec plugin. What a profile says is a pure function of the member's
//! ManagedCluster and its set (`profile.rs`); the loop here (`run`) writes only what differs
//! from the cached profile, so a heartbeat or an unchanged report costs no write, and removes
//! the profiles of members that left and of namespaces the set no longer lists.

mod profile;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use tether_api::clusterset::LeaderSpec;
use tether_api::inventory::ClusterProfile;
use tether_api::{ManagedCluster, SetRef};
use tokio::sync::Notify;
use tracing::{debug, warn};

pub use profile::{Access, PROPERTY_PREFIX, profile, up_to_date};
use profile::{Member, labels_hold, owner};

use crate::written::Written;
use crate::{Context, Error, write};

/// How long a member whose profile could not be written waits before it is tried again: this,
/// doubled after each failure in a row up to `RETRY_MAX`. NB: a namespace the leader may not
/// write in fails for every member; a fixed short retry would cost the API server N refused
/// writes every few seconds.
const RETRY: Duration = Duration::from_secs(5);
const RETRY_MAX: Duration = Duration::from_secs(300);
/// Profiles written at once.
const CONCURRENCY: usize = 8;

/// Which members' profiles need a look, shared by the triggers and the writer; how often each
/// failed in a row; and the namespaces Tether's profiles were seen in (where a stale one of a
/// member may be, so that finding it is a lookup per namespace, not a scan of every profile);
/// and the writes the cache may not show yet.
#[derive(Default)]
struct Queue {
    dirty: Mutex<HashSet<Member>>,
    wake: Notify,
    failures: Mutex<HashMap<Member, u32>>,
    namespaces: Mutex<BTreeSet<String>>,
    written: Written<ClusterProfile>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // NB: every update is one insert or remove: consistent under a panic elsewhere.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Queue {
    /// How long `m` waits after one more failure in a row.
    fn failed(&self, m: &Member) -> Duration {
        let mut f = lock(&self.failures);
        let n = f.entry(m.clone()).or_insert(0);
        *n = n.saturating_add(1);
        RETRY.saturating_mul(1 << (*n - 1).min(6)).min(RETRY_MAX)
    }

    fn succeeded(&self, m: &Member) {
        lock(&self.failures).remove(m);
    }

    fn saw_namespace(&self, ns: String) {
        lock(&self.namespaces).insert(ns);
    }

    fn namespaces(&self) -> Vec<String> {
        lock(&self.namespaces).iter().cloned().collect()
    }

    fn push(&self, m: Member) {
        lock(&self.dirty).insert(m);
        self.wake.notify_one();
    }

    fn take(&self) -> Vec<Member> {
        let mut d = lock(&self.dirty);
        let mut all: Vec<Member> = d.drain().collect();
        all.sort();
        all
    }
}

/// Runs the publisher while the process runs: `clusters` and `profiles` are every touched
/// ManagedCluster and ClusterProfile, `sets` every touched ClusterSet, `gained` each start of a
/// leadership term.
pub async fn run(
    ctx: Arc<Context>,
    access: Access,
    profiles: Store<ClusterProfile>,
    clusters: impl Stream<Item = Result<ManagedCluster, watcher::Error>> + Send + 'static,
    sets: impl Stream<Item = Result<tether_api::ClusterSet, watcher::Error>> + Send + 'static,
    touched: impl Stream<Item = Result<ClusterProfile, watcher::Error>> + Send + 'static,
    gained: impl Stream<Item = ()> + Send + 'static,
) {
    let queue = Arc::new(Queue::default());
    let everyone = {
        let (ctx, profiles) = (ctx.clone(), profiles.clone());
        move || -> Vec<Member> {
            let mut all: BTreeSet<Member> = ctx
                .clusters
                .state()
                .iter()
                .map(|mc| (mc.namespace().unwrap_or_default(), mc.name_any()))
                .collect();
            all.extend(profiles.state().iter().filter_map(|p| owner(p)));
            all.into_iter().collect()
        }
    };
    let feed = {
        let (queue, ctx, everyone) = (queue.clone(), ctx.clone(), everyone.clone());
        let clusters = clusters.filter_map(|r| async move {
            r.ok()
                .map(|mc| Some((mc.namespace().unwrap_or_default(), mc.name_any())))
        });
        let touched = touched.filter_map({
            let queue = queue.clone();
            move |r| {
                let m = r.ok().map(|p| {
                    queue.saw_namespace(p.namespace().unwrap_or_default());
                    owner(&p)
                });
                async move { m }
            }
        });
        let sets = sets.filter_map(|r| async move { r.ok() }).flat_map({
            let ctx = ctx.clone();
            move |set| {
                let set = SetRef::of(&set);
                let members: Vec<Option<Member>> = ctx
                    .clusters
                    .state()
                    .iter()
                    .filter(|mc| ctx.set_of(mc).as_ref() == Some(&set))
                    .map(|mc| Some((mc.namespace().unwrap_or_default(), mc.name_any())))
                    .collect();
                futures::stream::iter(members)
            }
        });
        let gained = gained.flat_map(move |()| futures::stream::iter(everyone().into_iter().map(Some)));
        futures::stream::select(
            futures::stream::select(clusters, touched),
            futures::stream::select(sets, gained),
        )
        .for_each(move |m| {
            if let Some(m) = m {
                queue.push(m);
            }
            async {}
        })
    };
    let work = async {
        ctx.wait_ready().await;
        for p in profiles.state() {
            queue.saw_namespace(p.namespace().unwrap_or_default());
        }
        loop {
            let batch = queue.take();
            if batch.is_empty() {
                queue.wake.notified().await;
                continue;
            }
            futures::stream::iter(batch)
                .for_each_concurrent(CONCURRENCY, |m| {
                    let (ctx, access, profiles, queue) =
                        (ctx.clone(), access.clone(), profiles.clone(), queue.clone());
                    async move {
                        // NB: a replica that is not leading writes nothing; its next term re-queues all.
                        match sync(&ctx, &access, &profiles, &queue, &m).await {
                            Ok(()) => queue.succeeded(&m),
                            Err(Error::NotLeader) => {}
                            Err(e) => {
                                let wait = queue.failed(&m);
                                warn!(member = %m.1, namespace = %m.0, error = %e, retry_seconds = wait.as_secs(),
                                      "Cannot publish the member's ClusterProfile; retrying");
                                ctx.metrics.reconcile_error(&e.label());
                                tokio::spawn(async move {
                                    tokio::time::sleep(wait).await;
                                    queue.push(m);
                                });
                            }
                        }
                    }
                })
                .await;
        }
    };
    tokio::join!(feed, work);
}

/// Brings member `m`'s profiles to what its ManagedCluster and set say: written where they
/// differ, deleted where the member or the namespace is gone from the set (looked for in the
/// namespaces where Tether's profiles were seen). What the profiles hold is the cache's, or
/// this replica's own write that the cache does not show yet.
async fn sync(
    ctx: &Context,
    access: &Access,
    profiles: &Store<ClusterProfile>,
    queue: &Queue,
    m: &Member,
) -> Result<(), Error> {
    if !ctx.is_leader() {
        return Err(Error::NotLeader);
    }
    let mc = ctx.clusters.get(&ObjectRef::new(&m.1).within(&m.0));
    let wanted: HashMap<String, (Arc<ManagedCluster>, SetRef)> = mc
        .and_then(|mc| {
            let set = ctx.set_of(&mc)?;
            let spec: LeaderSpec = ctx.leader_set(&set)?.spec.leader.clone().unwrap_or_default();
            Some(
                spec.inventory_namespaces()
                    .map(|ns| (ns.to_string(), (mc.clone(), set.clone())))
                    .collect(),
            )
        })
        .unwrap_or_default();
    let now = Timestamp::now();
    // NB: a namespace the leader may not write in (or that does not exist) must not keep the
    // member's other namespaces from being written: every one is tried, the first error returned.
    let mut failed = None;
    for (ns, (mc, set)) in &wanted {
        let current = queue.written.current(
            &format!("{ns}/{}", m.1),
            profiles.get(&ObjectRef::new(&m.1).within(ns)),
        );
        if let Err(e) = publish(ctx, access, &queue.written, current, m, ns, mc, set, now).await {
            failed.get_or_insert(e);
        }
    }
    // NB: a profile is named as its member, so a stale one is found by name in each namespace
    // profiles were seen in (a few), never by scanning every profile (as many as the members).
    let stale: Vec<Arc<ClusterProfile>> = queue
        .namespaces()
        .into_iter()
        .filter(|ns| !wanted.contains_key(ns))
        .filter_map(|ns| {
            let cached = profiles.get(&ObjectRef::new(&m.1).within(&ns));
            queue.written.current(&format!("{ns}/{}", m.1), cached)
        })
        .filter(|p| owner(p).as_ref() == Some(m))
        .collect();
    for p in stale {
        let ns = p.namespace().unwrap_or_default();
        let api: Api<ClusterProfile> = Api::namespaced(ctx.client.clone(), &ns);
        match write::delete(ctx, &api, &p.name_any()).await {
            Ok(()) => {
                queue.written.wrote(write::key(p.as_ref()), Some(&p), None);
                ctx.metrics.inventory_write("delete");
                debug!(member = %m.1, namespace = %ns, "ClusterProfile removed");
            }
            Err(e) => {
                failed.get_or_insert(e);
            }
        }
    }
    failed.map_or(Ok(()), Err)
}

/// Writes member `m`'s profile in inventory namespace `ns` where the `current` one differs,
/// and remembers each write in `written`.
#[allow(clippy::too_many_arguments)]
async fn publish(
    ctx: &Context,
    access: &Access,
    written: &Written<ClusterProfile>,
    mut current: Option<Arc<ClusterProfile>>,
    m: &Member,
    ns: &str,
    mc: &ManagedCluster,
    set: &SetRef,
    now: Timestamp,
) -> Result<(), Error> {
    let key = format!("{ns}/{}", m.1);
    if let Some(c) = current.as_ref().filter(|c| owner(c).as_ref() != Some(m)) {
        warn!(profile = %c.name_any(), namespace = %ns,
              "A ClusterProfile of that name exists that Tether does not own for this member; left alone");
        return Ok(());
    }
    let (want, status) = profile(mc, set, ns, access, current.as_deref(), now);
    if current.as_ref().is_some_and(|c| up_to_date(c, &want, &status)) {
        return Ok(());
    }
    let api: Api<ClusterProfile> = Api::namespaced(ctx.client.clone(), ns);
    if current
        .as_ref()
        .is_none_or(|c| c.spec != want.spec || !labels_hold(c, &want))
    {
        let applied = write::apply(ctx, &api, &want).await?;
        ctx.metrics.inventory_write("apply");
        written.wrote(key.clone(), current.as_deref(), Some(applied.clone()));
        current = Some(Arc::new(applied));
    }
    let after = write::apply_status::<ClusterProfile, _>(ctx, &api, &mc.name_any(), &status).await?;
    ctx.metrics.inventory_write("status");
    written.wrote(key, current.as_deref(), Some(after));
    debug!(member = %m.1, namespace = %ns, "ClusterProfile published");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_that_keeps_failing_waits_longer_each_time_up_to_five_minutes() {
        let q = Queue::default();
        let m: Member = ("tether-prod-east-1".into(), "east".into());
        let waits: Vec<u64> = (0..10).map(|_| q.failed(&m).as_secs()).collect();
        assert_eq!(waits, [5, 10, 20, 40, 80, 160, 300, 300, 300, 300]);
        q.succeeded(&m);
        assert_eq!(q.failed(&m).as_secs(), 5, "a success starts over");
        let other: Member = ("tether-prod-west-1".into(), "west".into());
        assert_eq!(q.failed(&other).as_secs(), 5, "each member counts its own");
    }
}
