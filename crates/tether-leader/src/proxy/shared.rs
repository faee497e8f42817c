//! What every request handler of the aggregated server shares, and the answers they share:
//! the live tunnels, the leader's caches, this term's attach challenges and pace, which member
//! identities exist, and the one way to look up a member the leader made.

use std::sync::Arc;

use http::header::CONTENT_TYPE;
use http::{HeaderValue, Response};
use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};
use tether_api::{ManagedCluster, labels};
use tether_tunnel::pipe::{self, Body};
use tokio_util::sync::CancellationToken;

use super::challenge::Challenges;
use super::identities::Identities;
use super::pace::Pace;
use super::tunnels::{MemberKey, Tunnels};
use crate::Context;

/// What every connection's handler shares.
pub struct Shared {
    /// Live tunnels.
    pub tunnels: Arc<Tunnels>,
    /// The leader's caches (ManagedClusters with their registered keys, sets), recorder and metrics.
    pub ctx: Arc<Context>,
    /// Attach challenges of this serving term.
    pub challenges: Challenges,
    /// The pace of this term's attaches (`pace`).
    pub pace: std::sync::Mutex<Pace>,
    /// Which members' agent ServiceAccounts exist.
    pub identities: Arc<Identities>,
    /// Cancelled when this replica stops serving: every tunnel closes at once.
    pub stop: CancellationToken,
    /// A key nobody holds: rejoin challenges for members that may not rejoin are sealed to it.
    pub decoy: String,
}

/// Seconds since the Unix epoch, as proof tokens count time.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The ManagedCluster of `m`, if the leader created it (not an object anyone could make).
pub fn member_cluster(clusters: &Store<ManagedCluster>, m: &MemberKey) -> Option<Arc<ManagedCluster>> {
    clusters
        .get(&ObjectRef::new(&m.name).within(&m.namespace))
        .filter(|mc| {
            mc.labels().get(labels::MANAGED_BY).map(String::as_str) == Some(crate::provision::FIELD_MANAGER)
        })
}

/// The key member `mc` registered with: what its agent must prove to attach. Read from the spec
/// field the leader sets once at approval, which no one can change afterwards (CEL), never from
/// anything a ManagedCluster patcher could edit.
pub fn registered_key(mc: &ManagedCluster) -> Option<&str> {
    mc.spec.public_key.as_deref().filter(|k| !k.is_empty())
}

/// A JSON answer.
pub fn json(v: &serde_json::Value) -> Response<Body> {
    let mut r = Response::new(pipe::full(v.to_string()));
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}
