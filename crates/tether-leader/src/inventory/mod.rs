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

use crate::{Context, Error, write};

/// How long a profile whose write failed waits before it is tried again.
const RETRY: Duration = Duration::from_secs(5);
/// Profiles written at once.
const CONCURRENCY: usize = 8;

/// Which members' profiles need a look, shared by the triggers and the writer.
#[derive(Default)]
struct Queue {
    dirty: Mutex<HashSet<Member>>,
    wake: Notify,
}

impl Queue {
    fn push(&self, m: Member) {
        self.dirty.lock().unwrap_or_else(|p| p.into_inner()).insert(m);
        self.wake.notify_one();
    }

    fn take(&self) -> Vec<Member> {
        let mut d = self.dirty.lock().unwrap_or_else(|p| p.into_inner());
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
        let touched = touched.filter_map(|r| async move { r.ok().map(|p| owner(&p)) });
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
                        if let Err(e) = sync(&ctx, &access, &profiles, &m).await
                            && !matches!(e, Error::NotLeader)
                        {
                            warn!(member = %m.1, namespace = %m.0, error = %e,
                                  "Cannot publish the member's ClusterProfile; retrying");
                            ctx.metrics.reconcile_error(e.label());
                            tokio::spawn(async move {
                                tokio::time::sleep(RETRY).await;
                                queue.push(m);
                            });
                        }
                    }
                })
                .await;
        }
    };
    tokio::join!(feed, work);
}

/// Brings member `m`'s profiles to what its ManagedCluster and set say: written where they
/// differ, deleted where the member or the namespace is gone from the set.
async fn sync(
    ctx: &Context,
    access: &Access,
    profiles: &Store<ClusterProfile>,
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
        if let Err(e) = publish(ctx, access, profiles, m, ns, mc, set, now).await {
            failed.get_or_insert(e);
        }
    }
    let stale: Vec<Arc<ClusterProfile>> = profiles
        .state()
        .into_iter()
        .filter(|p| owner(p).as_ref() == Some(m) && !wanted.contains_key(&p.namespace().unwrap_or_default()))
        .collect();
    for p in stale {
        let ns = p.namespace().unwrap_or_default();
        let api: Api<ClusterProfile> = Api::namespaced(ctx.client.clone(), &ns);
        match write::delete(ctx, &api, &p.name_any()).await {
            Ok(()) => {
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

/// Writes member `m`'s profile in inventory namespace `ns` where the cached one differs.
#[allow(clippy::too_many_arguments)]
async fn publish(
    ctx: &Context,
    access: &Access,
    profiles: &Store<ClusterProfile>,
    m: &Member,
    ns: &str,
    mc: &ManagedCluster,
    set: &SetRef,
    now: Timestamp,
) -> Result<(), Error> {
    let current = profiles.get(&ObjectRef::new(&mc.name_any()).within(ns));
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
        write::apply(ctx, &api, &want).await?;
        ctx.metrics.inventory_write("apply");
    }
    write::apply_status::<ClusterProfile, _>(ctx, &api, &mc.name_any(), &status).await?;
    ctx.metrics.inventory_write("status");
    debug!(member = %m.1, namespace = %ns, "ClusterProfile published");
    Ok(())
}
