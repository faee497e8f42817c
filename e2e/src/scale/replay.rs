//! The ceiling of registration throughput on this machine: a registration's API writes, and
//! nothing else, replayed as fast as the API server takes them (`make bench-costs`).
//!
//! `make bench-liveness` puts the registration rate it measures against what the API server's
//! write limit (Lease merge patches, the cheapest write) allows for a registration's writes.
//! A registration's writes are dearer than a Lease patch (creates, server-side applies, status
//! writes of custom resources, a namespace the controller-manager reacts to), so even a leader
//! and fleet that cost nothing could not reach 100 % of that figure. This measures how far they
//! could go: the same writes, made by the leader's and the agent's own builders, with no reads,
//! no watches, no leader logic and no fleet.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Resource, ResourceExt};
use tether_api::clusterset::LeaderSpec;
use tether_api::conditions::{ConditionType, Reason, Status, condition};
use tether_api::registration::{RegistrationReason, RegistrationResult, SealedCredential};
use tether_api::{
    ClusterRegistrationRequest, ClusterRegistrationRequestSpec, ManagedCluster, ManagedClusterStatus,
    MemberClusterAnnounce, RegistrationStatus, SetRef, status_apply,
};
use tether_leader::provision::{FIELD_MANAGER, member_objects};
use tether_testkit::TestCluster;

use super::*;

/// Writes one replayed registration makes itself: the request, the member's seven objects,
/// a TokenRequest, the request's status, two Events and two status writes of the ManagedCluster
/// (the leader's verdict and the agent's report).
pub const REPLAYED_WRITES: f64 = 15.0;

/// What a registration's writes alone reach on this machine.
pub struct Ceiling {
    /// Registrations replayed per second.
    pub rate: f64,
    /// Writes per registration: `REPLAYED_WRITES` plus the controller-manager's writes in the new
    /// namespace, counted.
    pub writes: f64,
    /// kube-apiserver and etcd CPU per registration, in milliseconds.
    pub cpu_ms: f64,
}

/// Replays registrations with `writers` at once for `window` on `cluster` (Tether CRDs
/// installed, controller-manager running): each makes the writes an approved registration makes,
/// in the leader's order.
pub async fn registration_ceiling(cluster: &TestCluster, writers: usize, window: Duration) -> Ceiling {
    let admin = cluster.client().expect("admin");
    let requests_ns = "bench-replay";
    crate::create_namespace(&admin, requests_ns)
        .await
        .expect("namespace");
    let procs: Vec<(&'static str, u32)> = [("kube-apiserver", "kube-apiserver"), ("etcd", "etcd")]
        .into_iter()
        .filter_map(|(label, p)| cluster.pid(p).map(|pid| (label, pid)))
        .collect();
    let (_, recipient) = tether_seal::generate_keypair();
    let sealed = tether_seal::seal_text(&"x".repeat(1200), &recipient).expect("seal");
    let reporter = Reporter {
        controller: FIELD_MANAGER.into(),
        instance: Some("replay".into()),
    };
    let next = AtomicU64::new(0);
    let kcm_before = controller_manager_writes(&admin).await;
    let cpu = Cpu::sample(&procs);
    let deadline = Instant::now() + window;
    let started = Instant::now();
    let done: Vec<u64> = futures::future::join_all((0..writers).map(|_| {
        let (admin, recipient, sealed, reporter, next) = (&admin, &recipient, &sealed, &reporter, &next);
        async move {
            let mut done = 0u64;
            while Instant::now() < deadline {
                let i = next.fetch_add(1, Ordering::Relaxed);
                register(admin, requests_ns, i, recipient, sealed, reporter).await;
                done += 1;
            }
            done
        }
    }))
    .await;
    let secs = started.elapsed().as_secs_f64();
    let registrations = done.iter().sum::<u64>() as f64;
    // NB: the controller-manager writes two objects in each new namespace (its `default`
    // ServiceAccount and the `kube-root-ca.crt` ConfigMap), each controller at most 20/s (its
    // client's default rate), so it falls behind the replay without slowing it. Its writes are
    // a registration's too: wait until it has caught up (no new write for 3 s, at most 60 s),
    // count them, and take the CPU over the whole time.
    let mut kcm = controller_manager_writes(&admin).await;
    let caught_up = Instant::now() + Duration::from_secs(60);
    while Instant::now() < caught_up {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let now = controller_manager_writes(&admin).await;
        if now == kcm {
            break;
        }
        kcm = now;
    }
    let busy = started.elapsed().as_secs_f64();
    let used: f64 = cpu.shares(&procs).values().sum::<f64>() * busy;
    Ceiling {
        rate: registrations / secs,
        writes: REPLAYED_WRITES + kcm.saturating_sub(kcm_before) as f64 / registrations.max(1.0),
        cpu_ms: used * 1000.0 / registrations.max(1.0),
    }
}

/// The objects the controller-manager writes in every namespace (its `default` ServiceAccount
/// and the `kube-root-ca.crt` ConfigMap), counted over all namespaces.
async fn controller_manager_writes(admin: &kube::Client) -> usize {
    let by_name = |n: &str| ListParams::default().fields(&format!("metadata.name={n}"));
    let accounts = Api::<ServiceAccount>::all(admin.clone())
        .list_metadata(&by_name("default"))
        .await
        .expect("list ServiceAccounts");
    let maps = Api::<ConfigMap>::all(admin.clone())
        .list_metadata(&by_name("kube-root-ca.crt"))
        .await
        .expect("list ConfigMaps");
    accounts.items.len() + maps.items.len()
}

/// One registration's writes, in the order the leader and the agent make them.
async fn register(
    admin: &kube::Client,
    requests_ns: &str,
    i: u64,
    recipient: &str,
    sealed: &str,
    reporter: &Reporter,
) {
    let name = format!("r-{i}");
    let requests = Api::<ClusterRegistrationRequest>::namespaced(admin.clone(), requests_ns);
    let mut req = ClusterRegistrationRequest::new(
        "",
        ClusterRegistrationRequestSpec {
            cluster_id: format!("00000000-0000-4000-8000-{i:012}"),
            cluster_name: name.clone(),
            public_key: recipient.into(),
            agent_version: Some("0.0.0-replay".into()),
            labels: Default::default(),
        },
    );
    req.metadata.generate_name = Some(format!("{name}-"));
    let req = requests
        .create(&PostParams::default(), &req)
        .await
        .expect("create request");
    let set = SetRef::new(requests_ns, "replay");
    let namespace = format!("replay-{name}");
    let objs = member_objects(&req, &set, &namespace, &LeaderSpec::default());
    let apply = PatchParams::apply(FIELD_MANAGER).force();
    let (c, ns) = (admin.clone(), namespace.as_str());
    put(Api::<Namespace>::all(c.clone()), &objs.namespace).await;
    // NB: in the leader's three round trips (`registration::provision`).
    futures::join!(
        put(
            Api::<ServiceAccount>::namespaced(c.clone(), ns),
            &objs.service_account
        ),
        put(Api::<Role>::namespaced(c.clone(), ns), &objs.role),
        put(
            Api::<MemberClusterAnnounce>::namespaced(c.clone(), ns),
            &objs.announce
        ),
        put(Api::<Lease>::namespaced(c.clone(), ns), &objs.lease),
    );
    let clusters = Api::<ManagedCluster>::namespaced(c.clone(), ns);
    let token = k8s_openapi::api::authentication::v1::TokenRequest {
        spec: k8s_openapi::api::authentication::v1::TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..Default::default()
        },
        ..Default::default()
    };
    let accounts = Api::<ServiceAccount>::namespaced(c.clone(), ns);
    let (agent, post) = (objs.service_account.name_any(), PostParams::default());
    let (_, mc, token) = futures::join!(
        put(Api::<RoleBinding>::namespaced(c.clone(), ns), &objs.role_binding),
        put(clusters.clone(), &objs.managed_cluster),
        accounts.create_token_request(&agent, &post, &token),
    );
    token.expect("TokenRequest");
    let granted = RegistrationStatus {
        result: RegistrationResult::Approved,
        reason: RegistrationReason::Approved,
        message: Some(format!("joined ClusterSet replay; namespace {namespace}")),
        namespace: Some(namespace.clone()),
        credential: Some(SealedCredential {
            sealed: sealed.into(),
            expiration_time: Some(Time(Timestamp::now())),
        }),
        ..RegistrationStatus::default()
    };
    requests
        .patch_status(
            &req.name_any(),
            &apply,
            &status_apply::<ClusterRegistrationRequest, _>(&granted),
        )
        .await
        .expect("request status");
    publish(admin, reporter, &req, "RegistrationApproved", "Register").await;
    let now = Timestamp::now();
    let verdict = ManagedClusterStatus {
        conditions: vec![
            condition(
                &[],
                ConditionType::Ready,
                Status::True,
                Reason::TunnelAlive,
                "tunnel alive".into(),
                now,
            ),
            condition(
                &[],
                ConditionType::AgentVersionSupported,
                Status::True,
                Reason::WithinSkew,
                "within skew".into(),
                now,
            ),
        ],
        last_heartbeat_time: Some(Time(now)),
        ..ManagedClusterStatus::default()
    };
    clusters
        .patch_status(&name, &apply, &status_apply::<ManagedCluster, _>(&verdict))
        .await
        .expect("leader's status");
    publish(admin, reporter, &mc, "MemberReady", "Judge").await;
    tether_agent::report::write_status(&clusters, &name, &tether_sim::healthy_status(&name))
        .await
        .expect("agent's status");
}

/// Server-side applies `obj` as the leader does.
async fn put<K>(api: Api<K>, obj: &K) -> K
where
    K: Resource<DynamicType = ()> + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let apply = PatchParams::apply(FIELD_MANAGER).force();
    api.patch(&obj.name_any(), &apply, &Patch::Apply(obj))
        .await
        .unwrap_or_else(|e| panic!("apply {} {}: {e}", K::kind(&()), obj.name_any()))
}

/// Publishes one Event about `obj` through a recorder that keeps nothing, as the leader does
/// for one-time Events.
async fn publish<K: Resource<DynamicType = ()>>(
    admin: &kube::Client,
    reporter: &Reporter,
    obj: &K,
    reason: &str,
    action: &str,
) {
    let ev = Event {
        type_: EventType::Normal,
        reason: reason.into(),
        note: Some(format!("replayed {reason}")),
        action: action.into(),
        secondary: None,
    };
    Recorder::new(admin.clone(), reporter.clone())
        .publish(&ev, &obj.object_ref(&()))
        .await
        .expect("Event");
}
