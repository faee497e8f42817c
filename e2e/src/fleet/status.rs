//! A member as the leader sees it: its ManagedCluster, its Ready condition, its heartbeat.

use std::time::Duration;

use kube::Client;
use kube::api::Api;
use tether_api::ManagedCluster;
use tether_testkit::eventually;

/// The ManagedCluster `name` at the leader (in its member namespace).
pub async fn managed(admin: &Client, name: &str) -> Result<ManagedCluster, String> {
    Api::<ManagedCluster>::namespaced(admin.clone(), &crate::sim::ns_of(name))
        .get(name)
        .await
        .map_err(|e| e.to_string())
}

/// Waits up to a minute for the ManagedCluster `name` to pass `check`.
pub async fn wait_mc(
    admin: &Client,
    name: &str,
    what: &str,
    check: impl Fn(&ManagedCluster) -> bool,
) -> ManagedCluster {
    eventually(&format!("{name}: {what}"), Duration::from_secs(60), || async {
        let mc = managed(admin, name).await?;
        if check(&mc) {
            Ok(mc)
        } else {
            Err(format!("{:?}", mc.status))
        }
    })
    .await
}

/// Waits up to a minute for the ManagedCluster `name` to be Ready.
pub async fn wait_ready(admin: &Client, name: &str) -> ManagedCluster {
    wait_mc(admin, name, "Ready", |mc| ready(mc).as_deref() == Some("True")).await
}

/// The status of a ManagedCluster's Ready condition.
pub fn ready(mc: &ManagedCluster) -> Option<String> {
    mc.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == tether_api::conditions::ConditionType::Ready)
        .map(|c| c.status.clone())
}

/// The node summary a ManagedCluster reports (e.g. `2/2`).
pub fn nodes(mc: &ManagedCluster) -> Option<String> {
    mc.status.as_ref()?.nodes.as_ref().map(|n| n.summary.clone())
}

/// Whether member `name` (of the tests' set) heartbeated after `since`.
pub async fn renewed_after(admin: &Client, name: &str, since: k8s_openapi::jiff::Timestamp) -> bool {
    heartbeat_time(admin, name).await.is_some_and(|t| t > since)
}

/// When member `name` (of the tests' set) last heartbeated: the later renewal of its Lease and
/// its announce (which agents from before heartbeat Leases renew).
pub async fn heartbeat_time(admin: &Client, name: &str) -> Option<k8s_openapi::jiff::Timestamp> {
    let ns = crate::sim::ns_of(name);
    let announce = Api::<tether_api::MemberClusterAnnounce>::namespaced(admin.clone(), &ns)
        .get_opt(name)
        .await
        .ok()
        .flatten()
        .and_then(|a| a.spec.renew_time);
    let lease = Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(admin.clone(), &ns)
        .get_opt(name)
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec?.renew_time);
    announce.into_iter().chain(lease).map(|t| t.0).max()
}
