//! The API server's own limits on this machine: small writes per second it sustains
//! (`write_limit`), and what each kind of write costs (`write_costs`, `make bench-costs`).

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use tether_testkit::TestCluster;

use super::*;

/// The API server's sustained rate of small writes: 32 writers, each updating its own Lease
/// (a ~300-byte object, like an announce) as fast as the API server answers, for `window`.
pub async fn write_limit(admin: &Client, window: Duration) -> f64 {
    const WRITERS: usize = 32;
    let api = Api::<Lease>::namespaced(admin.clone(), "default");
    for i in 0..WRITERS {
        let lease: Lease = serde_json::from_value(json!({"metadata": {"name": format!("bench-{i}")},
                                                          "spec": {"holderIdentity": "bench"}}))
        .expect("lease");
        api.create(&PostParams::default(), &lease)
            .await
            .expect("create lease");
    }
    let deadline = Instant::now() + window;
    let started = Instant::now();
    let counts = futures::future::join_all((0..WRITERS).map(|i| {
        let api = api.clone();
        async move {
            let mut done = 0u64;
            while Instant::now() < deadline {
                // NB: a changed field, so that every patch is a real write to etcd.
                let body = json!({"spec": {"leaseTransitions": done + 1}});
                match api
                    .patch(
                        &format!("bench-{i}"),
                        &PatchParams::default(),
                        &Patch::Merge(body),
                    )
                    .await
                {
                    Ok(_) => done += 1,
                    Err(e) => panic!("Lease update failed: {e}"),
                }
            }
            done
        }
    }))
    .await;
    let rate = counts.iter().sum::<u64>() as f64 / started.elapsed().as_secs_f64();
    for i in 0..WRITERS {
        let _ = api.delete(&format!("bench-{i}"), &Default::default()).await;
    }
    rate
}

/// What one kind of write costs the API server, measured with 32 writers for a window.
pub struct WriteCost {
    /// What was written.
    pub what: &'static str,
    /// Sustained writes per second.
    pub rate: f64,
    /// kube-apiserver CPU per write, in milliseconds.
    pub api_cpu_ms: f64,
    /// etcd CPU per write, in milliseconds.
    pub etcd_cpu_ms: f64,
}

/// The write kinds `write_costs` compares.
#[derive(Clone, Copy, Debug)]
pub(super) enum Write {
    /// A Lease `spec.renewTime` merge patch (what a Lease-based heartbeat would send).
    Lease,
    /// The agent's own heartbeat: a MemberClusterAnnounce `spec.renewTime` merge patch.
    Announce,
    /// A TokenRequest for a ServiceAccount (what a credential renewal sends).
    TokenRequest,
}

/// Measures, on `cluster` (Tether CRDs installed), the rate and API server/etcd CPU per write of
/// a Lease heartbeat, the agent's announce heartbeat and a credential renewal, each with 32
/// writers for `window`.
pub async fn write_costs(cluster: &TestCluster, window: Duration) -> Vec<WriteCost> {
    const WRITERS: usize = 32;
    let admin = cluster.client().expect("admin");
    let ns = "bench-costs";
    crate::create_namespace(&admin, ns).await.expect("namespace");
    let procs: Vec<(&'static str, u32)> = [("kube-apiserver", "kube-apiserver"), ("etcd", "etcd")]
        .into_iter()
        .filter_map(|(label, p)| cluster.pid(p).map(|pid| (label, pid)))
        .collect();
    let leases = Api::<Lease>::namespaced(admin.clone(), ns);
    let announces = Api::<tether_api::MemberClusterAnnounce>::namespaced(admin.clone(), ns);
    let accounts = Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(admin.clone(), ns);
    for i in 0..WRITERS {
        let name = format!("w-{i}");
        let lease: Lease = serde_json::from_value(json!({"metadata": {"name": name},
            "spec": {"holderIdentity": name, "leaseDurationSeconds": 40}}))
        .expect("lease");
        leases
            .create(&PostParams::default(), &lease)
            .await
            .expect("lease");
        let announce: tether_api::MemberClusterAnnounce = serde_json::from_value(json!({
            "apiVersion": "multicluster.tether.dev/v1alpha1", "kind": "MemberClusterAnnounce",
            "metadata": {"name": name, "labels": {"multicluster.tether.dev/clusterset": "prod",
                "multicluster.tether.dev/cluster-id": format!("0000-{i}"), "app.kubernetes.io/managed-by": "tether-leader"}},
            "spec": {"clusterID": format!("0000-{i}"), "heartbeatIntervalSeconds": 10}}))
        .expect("announce");
        announces
            .create(&PostParams::default(), &announce)
            .await
            .expect("announce");
        let sa: k8s_openapi::api::core::v1::ServiceAccount =
            serde_json::from_value(json!({"metadata": {"name": name}})).expect("sa");
        accounts.create(&PostParams::default(), &sa).await.expect("sa");
    }
    let mut out = Vec::new();
    for kind in [Write::Lease, Write::Announce, Write::TokenRequest] {
        let cpu = Cpu::sample(&procs);
        let deadline = Instant::now() + window;
        let started = Instant::now();
        let counts = futures::future::join_all((0..WRITERS).map(|i| {
            let (leases, announces, accounts) = (leases.clone(), announces.clone(), accounts.clone());
            async move {
                let name = format!("w-{i}");
                let mut done = 0u64;
                while Instant::now() < deadline {
                    let now = k8s_openapi::jiff::Timestamp::now();
                    let ok = match kind {
                        Write::Lease => {
                            let renew = k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(now);
                            let body = json!({"spec": {"renewTime": renew}});
                            leases
                                .patch(&name, &PatchParams::default(), &Patch::Merge(body))
                                .await
                                .map(|_| ())
                        }
                        Write::Announce => tether_agent::heartbeat::beat(&announces, &name, now)
                            .await
                            .map(|_| ()),
                        Write::TokenRequest => {
                            let req = k8s_openapi::api::authentication::v1::TokenRequest {
                                spec: k8s_openapi::api::authentication::v1::TokenRequestSpec {
                                    expiration_seconds: Some(600),
                                    ..Default::default()
                                },
                                ..Default::default()
                            };
                            accounts
                                .create_token_request(&name, &PostParams::default(), &req)
                                .await
                                .map(|_| ())
                        }
                    };
                    if let Err(e) = ok {
                        panic!("{kind:?} write failed: {e}");
                    }
                    done += 1;
                }
                done
            }
        }))
        .await;
        let writes = counts.iter().sum::<u64>() as f64;
        let secs = started.elapsed().as_secs_f64();
        let shares = cpu.shares(&procs);
        let per_write = |p: &str| shares.get(p).copied().unwrap_or(0.0) * secs * 1000.0 / writes.max(1.0);
        out.push(WriteCost {
            what: match kind {
                Write::Lease => "Lease renewTime patch",
                Write::Announce => "MemberClusterAnnounce renewTime patch (the heartbeat)",
                Write::TokenRequest => "TokenRequest (a credential renewal)",
            },
            rate: writes / secs,
            api_cpu_ms: per_write("kube-apiserver"),
            etcd_cpu_ms: per_write("etcd"),
        });
    }
    out
}
