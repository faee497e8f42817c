//! Wiring: one watch per kind (`tether_process::streams`) feeding the caches and the three
//! controllers, the discovery publisher, and the readiness signal.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::controller::{self, Controller};
use kube::runtime::events::Reporter;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt, predicates, watcher};
use kube::{Api, Client, ResourceExt};
use tether_api::inventory::{CLUSTER_MANAGER, CLUSTER_MANAGER_LABEL, ClusterProfile};
use tether_api::{
    ClusterRegistrationRequest, ClusterSet, ManagedCluster, MemberClusterAnnounce, SetRef, labels,
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use tether_process::leadership::gained;

use crate::{
    Context, Options, PROVISIONING_SLOTS, clusterset, discovery, error_policy, health, inventory, members,
    registration, slim, slim_cluster,
};
use tether_process::streams;

/// Runs the leader's controllers until `shutdown` is cancelled.
pub async fn run(client: Client, opts: Options, shutdown: CancellationToken) {
    let cfg = controller::Config::default().concurrency(16);
    let all = watcher::Config::default();
    let members_only = watcher::Config::default().labels(labels::CLUSTER_SET);

    // Requests: primary of the registration controller, trigger of the set controller.
    // NB: cached without the sealed credential, which the leader never reads back (only when
    // it expires: retention.rs).
    let mut requests = streams::watch(
        Api::<ClusterRegistrationRequest>::all(client.clone()),
        all.clone(),
        |r: &mut ClusterRegistrationRequest| {
            slim(r);
            if let Some(c) = r.status.as_mut().and_then(|s| s.credential.as_mut()) {
                c.sealed = String::new();
            }
        },
        None,
    );
    // Sets: primary of the set controller; their spec changes re-queue their requests.
    let mut sets = streams::watch(Api::<ClusterSet>::all(client.clone()), all, slim, None);
    // ManagedClusters: primary of the member controller, trigger of the set controller.
    let mut clusters = streams::watch(
        Api::<ManagedCluster>::all(client.clone()),
        members_only.clone(),
        if opts.cluster_profiles {
            crate::slim_cluster_for_inventory
        } else {
            slim_cluster
        },
        None,
    );
    // The members' ClusterProfiles (only Tether's): the publisher's cache and trigger.
    let mut profiles = opts.cluster_profiles.then(|| {
        streams::watch(
            Api::<ClusterProfile>::all(client.clone()),
            watcher::Config::default().labels(&format!("{CLUSTER_MANAGER_LABEL}={CLUSTER_MANAGER}")),
            slim,
            None,
        )
    });
    // Announces: the member controller's trigger (a heartbeat, or a leave when deleted). Whether
    // this watch works says whether the leader can see heartbeats at all.
    let health = Arc::new(health::Tracker::default());
    let sight: streams::Sight = {
        let health = health.clone();
        Box::new(move |working| sight_of(&health, working))
    };
    let announce_sight: streams::Sight = {
        let health = health.clone();
        Box::new(move |working| sight_of(&health, working))
    };
    let mut announces = streams::watch(
        Api::<MemberClusterAnnounce>::all(client.clone()),
        members_only.clone(),
        slim,
        Some(announce_sight),
    );
    // Heartbeat Leases: the member controller's trigger (a renewal). Cached as `slim_lease`
    // leaves them: the agent may write anything into its own Lease.
    let mut leases = streams::watch(
        Api::<Lease>::all(client.clone()),
        members_only,
        crate::slim_lease,
        Some(sight),
    );
    // Tunnel changes at the serving replica: the member controller's trigger too.
    let (nudge, nudged) = futures::channel::mpsc::unbounded();

    let reporter = Reporter {
        controller: "tether-leader".into(),
        instance: opts.instance.clone(),
    };
    // NB: `Store::wait_until_ready` wakes only its latest waiter, so one task waits for the
    // caches and publishes the result on a watch channel that any number of reconciles can await.
    let (synced_tx, synced) = watch::channel(false);
    opts.metrics.follow_members(clusters.store());
    let ctx = Arc::new(Context {
        client: client.clone(),
        sets: sets.store(),
        clusters: clusters.store(),
        written_clusters: Default::default(),
        written_requests: Default::default(),
        announces: announces.store(),
        leases: leases.store(),
        nudge,
        requests: requests.store(),
        health,
        events: crate::write::Events::new(client.clone(), reporter),
        leader_ca: opts.leader_ca.clone(),
        metrics: opts.metrics.clone(),
        leader: opts.leader.clone(),
        synced,
        provisioning: tokio::sync::Semaphore::new(PROVISIONING_SLOTS),
        status_throttle: clusterset::Throttle::default(),
        denied_retention: opts.denied_retention,
        approved_retention: opts.approved_retention,
    });

    // A ClusterSet created or changed re-queues every request of its namespace. Only spec
    // changes (generation) matter: status writes, once a second while members join, would
    // otherwise re-queue every request each time.
    let requests_of_set = {
        let requests = requests.store();
        move |set: ClusterSet| {
            let ns = set.namespace();
            requests
                .state()
                .into_iter()
                .filter(move |r| r.namespace() == ns)
                .map(|r| ObjectRef::from_obj(r.as_ref()))
                .collect::<Vec<_>>()
        }
    };
    // A set's spec change (a ban written into it, a new policy) re-queues its members too, so
    // that a banned member is removed, and its tunnel closed, at once rather than at its next
    // heartbeat.
    let members_of_set = {
        let ctx = ctx.clone();
        move |set: ClusterSet| {
            ctx.members_of(&SetRef::of(&set))
                .iter()
                .map(|mc| ObjectRef::from_obj(mc.as_ref()))
                .collect::<Vec<_>>()
        }
    };
    let set_specs = sets
        .subscribe()
        .predicate_filter(predicates::generation, Default::default());
    let set_specs_for_members = sets
        .subscribe()
        .predicate_filter(predicates::generation, Default::default());
    // NB: no concurrency limit here: kube-runtime holds the reconciles it cannot start in a
    // HashSet and picks from it in hash order, which starved early requests for minutes at 3,000
    // simultaneous registrations (p99 226 s at p50 9 s). Reconciles of decided requests return at
    // once; Pending ones wait for a FIFO semaphore (`Context::provisioning`) instead.
    let registration = Controller::for_stream(requests.subscribe(), requests.store())
        .with_config(cfg.clone().concurrency(0))
        .watches_stream(set_specs, requests_of_set)
        .reconcile_all_on(gained(opts.leader.clone()))
        .graceful_shutdown_on(shutdown.clone().cancelled_owned())
        .run(registration::reconcile, error_policy, ctx.clone())
        .for_each(|_| async {});

    let members = Controller::for_stream(clusters.subscribe(), clusters.store())
        .with_config(cfg.clone())
        .watches_stream(announces.subscribe(), members::owner)
        .watches_stream(leases.subscribe(), members::owner)
        .watches_stream(nudged.map(Ok), |mc: ManagedCluster| {
            Some(ObjectRef::from_obj(&mc))
        })
        .watches_stream(set_specs_for_members, members_of_set)
        .reconcile_all_on(gained(opts.leader.clone()))
        .graceful_shutdown_on(shutdown.clone().cancelled_owned())
        .run(members::reconcile, error_policy, ctx.clone())
        .for_each(|_| async {});

    // Member and request changes wake their set; its status is recomputed (at most once a
    // second) and written if it changed.
    let set_of_member = {
        let ctx = ctx.clone();
        move |mc: ManagedCluster| {
            ctx.set_of(&mc)
                .and_then(|set| ctx.leader_set(&set))
                .map(|s| clusterset::set_ref(&s))
        }
    };
    let set_of_request = {
        let sets = sets.store();
        move |r: ClusterRegistrationRequest| {
            clusterset::set_in(&sets, &r.namespace().unwrap_or_default()).map(|s| clusterset::set_ref(&s))
        }
    };
    let sets_ctl = Controller::for_stream(sets.subscribe(), sets.store())
        .with_config(cfg)
        .watches_stream(clusters.subscribe(), set_of_member)
        .watches_stream(requests.subscribe(), set_of_request)
        .reconcile_all_on(gained(opts.leader.clone()))
        .graceful_shutdown_on(shutdown.clone().cancelled_owned())
        .run(clusterset::reconcile, error_policy, ctx.clone())
        .for_each(|_| async {});

    // Members published as ClusterProfiles, when the upstream CRD is installed.
    let inventory = match profiles.as_mut() {
        Some(profiles) => {
            let access = inventory::Access {
                server: opts.leader_url.clone(),
                ca_pem: opts.leader_ca.clone(),
            };
            let set_specs = sets
                .subscribe()
                .predicate_filter(predicates::generation, Default::default());
            let store = profiles.store();
            let run = inventory::run(
                ctx.clone(),
                access,
                store.clone(),
                clusters.subscribe(),
                set_specs,
                profiles.subscribe(),
                gained(opts.leader.clone()),
            );
            Some(tokio::spawn(async move {
                let _ = store.wait_until_ready().await;
                run.await
            }))
        }
        None => None,
    };
    let publish = tokio::spawn(publish_discovery(
        ctx.clone(),
        opts.leader_url.clone(),
        opts.leader.clone(),
    ));
    let roles = tokio::spawn(crate::roles::on_each_term(ctx.clone(), opts.leader.clone()));
    let terms = tokio::spawn(end_terms(ctx.clone(), opts.leader.clone()));
    let proxy = opts.proxy.clone().map(|p| {
        let ctx = ctx.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            ctx.wait_ready().await;
            crate::proxy::run(ctx, p, shutdown).await;
        })
    });
    let ready = {
        let ctx = ctx.clone();
        async move {
            ctx.wait_caches().await;
            info!("Caches synced; ready");
            synced_tx.send_replace(true);
            opts.ready.send_replace(true);
        }
    };
    // NB: every consumer has subscribed; the watches start now, so none misses an object.
    let mut drivers = vec![
        requests.start(),
        sets.start(),
        clusters.start(),
        announces.start(),
        leases.start(),
    ];
    drivers.extend(profiles.map(streams::Watch::start));
    futures::join!(registration, members, sets_ctl, ready);
    publish.abort();
    if let Some(i) = inventory {
        i.abort();
    }
    roles.abort();
    terms.abort();
    if let Some(p) = proxy {
        let _ = p.await;
    }
    for driver in drivers {
        driver.abort();
    }
    info!("Leader controllers stopped");
}

/// Tells the health tracker that a heartbeat watch works (`true`) or failed.
fn sight_of(health: &health::Tracker, working: bool) {
    if working {
        health.saw_event(Instant::now());
    } else {
        health.lost_sight(Instant::now());
    }
}

/// Ends the health tracker's term each time this replica loses leadership: what it saw of
/// tunnels no longer counts, and the next term starts with its grace (`health::TERM_GRACE`).
async fn end_terms(ctx: Arc<Context>, mut leader: watch::Receiver<bool>) {
    loop {
        if leader.wait_for(|l| *l).await.is_err() || leader.wait_for(|l| !*l).await.is_err() {
            return;
        }
        ctx.health.end_term();
    }
}

/// Publishes the discovery ConfigMap once this replica leads a set, retrying until it works.
/// NB: not before there is a Leader ClusterSet: after `tether uninstall` removed the sets and
/// cluster-info, a replica that takes over while the chart is being removed must not put it back.
async fn publish_discovery(ctx: Arc<Context>, url: String, mut leader: watch::Receiver<bool>) {
    loop {
        if leader.wait_for(|l| *l).await.is_err() {
            return;
        }
        let leads_a_set = ctx
            .sets
            .state()
            .iter()
            .any(|s| s.spec.role == tether_api::clusterset::ClusterSetRole::Leader);
        if !leads_a_set {
            tokio::time::sleep(Duration::from_secs(2)).await;
            continue;
        }
        match discovery::publish(&ctx.client, &ctx.leader_ca, &url).await {
            Ok(()) => return,
            Err(err) => warn!(
                error = &err as &dyn std::error::Error,
                "Cannot publish cluster-info; retrying"
            ),
        }
        tokio::time::sleep(Duration::from_secs(10)).await;
    }
}
