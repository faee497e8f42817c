//! What this replica wrote that its cache may not show yet. A joining member's ManagedCluster
//! changes several times within milliseconds (approved, first heartbeat, tunnel, first report),
//! and each change, or a Lease or tunnel event, starts another look. A look that runs before
//! the watch delivered the previous look's own write judges the object from before it, and
//! writes again what the API server already holds (a ManagedCluster's Ready and its Event, a
//! ClusterProfile's status), or deletes what is already deleted: each a request that changes
//! nothing.
//!
//! A write is remembered with what the API server returned. While the cache shows an older
//! version, the written object stands for the cached one; as soon as it shows the write itself
//! or a later version (by anyone), the cache is the truth again and the record is dropped. So a
//! record never hides a change the cache has seen. Versions are compared as Kubernetes defines
//! it (KEP-5504, `CompareResourceVersion`: decimal integers; GA in 1.35, and how every etcd-backed
//! API server numbers them). Where a version is not such a number, or for a delete (whose result
//! has no version), "older" is only what the cache could show from before the write: the version
//! the write was made on. Records the cache never looked up again (an object deleted since) go
//! after `KEEP`: at most the objects written in the last `KEEP` are held.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::{Resource, ResourceExt};

/// How long a record may wait for the cache. A watch that lags longer is broken; the cache
/// is then used as it is (at worst one write that changes nothing).
const KEEP: Duration = Duration::from_secs(30);

struct Wrote<K> {
    /// Versions the cache may still show from before the write (`None`: no object).
    before: Vec<Option<String>>,
    /// The object as the API server returned it (`None`: deleted).
    after: Option<Arc<K>>,
    at: Instant,
}

struct Records<K> {
    by_key: HashMap<String, Wrote<K>>,
    /// When records past `KEEP` were last dropped.
    pruned: Option<Instant>,
}

/// The writes of one kind, by `namespace/name` (`write::key`).
pub struct Written<K> {
    all: Mutex<Records<K>>,
}

impl<K> Default for Written<K> {
    fn default() -> Self {
        Self {
            all: Mutex::new(Records {
                by_key: HashMap::new(),
                pruned: None,
            }),
        }
    }
}

fn version<K: Resource>(o: Option<&K>) -> Option<String> {
    o.and_then(|o| o.resource_version())
}

/// A resource version as KEP-5504 orders them: a decimal integer above 0 without leading zeros.
fn comparable(v: Option<&str>) -> Option<u128> {
    let v = v?;
    (!v.starts_with('0') && !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
        .then(|| v.parse().ok())
        .flatten()
}

impl<K: Resource> Wrote<K> {
    /// Whether a cache showing `cached` has not caught up with this write.
    fn ahead_of(&self, cached: Option<&K>) -> bool {
        let cached = version(cached);
        let after = self.after.as_deref().and_then(|a| a.resource_version());
        match (comparable(cached.as_deref()), comparable(after.as_deref())) {
            (Some(c), Some(a)) => c < a,
            _ => self.before.contains(&cached),
        }
    }
}

impl<K: Resource> Written<K> {
    fn lock(&self) -> std::sync::MutexGuard<'_, Records<K>> {
        // NB: every update is one insert or remove: consistent under a panic elsewhere.
        self.all.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Object `key` as the API server holds it, as far as this replica knows: what it last
    /// wrote while the cache (`cached`) still shows a version from before that write; else the
    /// cached one.
    pub fn current(&self, key: &str, cached: Option<Arc<K>>) -> Option<Arc<K>> {
        let mut all = self.lock();
        if let Some(w) = all.by_key.get(key) {
            if w.ahead_of(cached.as_deref()) && w.at.elapsed() < KEEP {
                return w.after.clone();
            }
            all.by_key.remove(key);
        }
        cached
    }

    /// Remembers a write of object `key` made on top of `seen` (what `current` gave), whose
    /// result is `after` (`None`: deleted).
    pub fn wrote(&self, key: String, seen: Option<&K>, after: Option<K>) {
        let now = Instant::now();
        let mut all = self.lock();
        let Records {
            by_key: records,
            pruned,
        } = &mut *all;
        if pruned.is_none_or(|t| now.duration_since(t) >= KEEP) {
            records.retain(|_, w| now.duration_since(w.at) < KEEP);
            *pruned = Some(now);
        }
        // NB: a write on top of a remembered one keeps what the cache may show from before both.
        let mut before = records.remove(&key).map(|w| w.before).unwrap_or_default();
        let seen = version(seen);
        if !before.contains(&seen) {
            before.push(seen);
        }
        records.insert(
            key,
            Wrote {
                before,
                after: after.map(Arc::new),
                at: now,
            },
        );
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().by_key.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::ObjectMeta;
    use tether_api::inventory::{ClusterManager, ClusterProfile, ClusterProfileSpec};

    fn at(version: &str, name: &str) -> ClusterProfile {
        ClusterProfile {
            metadata: ObjectMeta {
                name: Some("east".into()),
                namespace: Some("inventory".into()),
                resource_version: Some(version.into()),
                labels: Some([("note".to_string(), name.to_string())].into()),
                ..ObjectMeta::default()
            },
            spec: ClusterProfileSpec {
                display_name: None,
                cluster_manager: ClusterManager {
                    name: "tether".into(),
                },
            },
            status: None,
        }
    }

    fn note(p: Option<Arc<ClusterProfile>>) -> Option<String> {
        p.map(|p| p.labels()["note"].clone())
    }

    #[test]
    fn a_write_stands_for_the_profile_until_the_cache_shows_it_or_anything_newer() {
        let w = Written::<ClusterProfile>::default();
        let k = "inventory/east".to_string();
        assert_eq!(note(w.current(&k, None)), None, "nothing written: the cache");

        // Created (spec, then status) while the cache still shows nothing.
        w.wrote(k.clone(), None, Some(at("10", "spec")));
        let spec = w.current(&k, None);
        assert_eq!(note(spec.clone()), Some("spec".into()));
        w.wrote(k.clone(), spec.as_deref(), Some(at("11", "status")));
        assert_eq!(
            note(w.current(&k, None)),
            Some("status".into()),
            "cache empty: still lagging"
        );
        assert_eq!(
            note(w.current(&k, Some(Arc::new(at("10", "spec"))))),
            Some("status".into()),
            "the cache shows the write in between: still lagging"
        );
        assert_eq!(w.len(), 1);

        // The cache catches up: the record goes, the cache is the truth.
        assert_eq!(
            note(w.current(&k, Some(Arc::new(at("11", "cached"))))),
            Some("cached".into())
        );
        assert_eq!(w.len(), 0);

        // Another writer's version from between the cached one and this write: still lagging.
        w.wrote(k.clone(), Some(&at("11", "cached")), Some(at("14", "ours")));
        assert_eq!(
            note(w.current(&k, Some(Arc::new(at("12", "agent's"))))),
            Some("ours".into()),
            "version 12 is older than the write (14)"
        );
        assert_eq!(
            note(w.current(&k, Some(Arc::new(at("14", "cached"))))),
            Some("cached".into())
        );
        assert_eq!(w.len(), 0);

        // Someone else wrote after this replica: their version wins at once.
        w.wrote(k.clone(), Some(&at("14", "cached")), Some(at("15", "ours")));
        assert_eq!(
            note(w.current(&k, Some(Arc::new(at("16", "theirs"))))),
            Some("theirs".into())
        );
        assert_eq!(w.len(), 0);

        // Deleted: gone while the cache still shows it, and the cache again once it does not.
        w.wrote(k.clone(), Some(&at("16", "theirs")), None);
        assert_eq!(note(w.current(&k, Some(Arc::new(at("16", "theirs"))))), None);
        assert_eq!(w.len(), 1);
        assert_eq!(note(w.current(&k, None)), None);
        assert_eq!(w.len(), 0);
    }

    #[test]
    fn versions_that_are_not_numbers_compare_only_as_equal() {
        assert_eq!(comparable(Some("42")), Some(42));
        for v in [None, Some(""), Some("0"), Some("007"), Some("12a"), Some("-3")] {
            assert_eq!(comparable(v), None, "{v:?}");
        }
        let w = Written::<ClusterProfile>::default();
        let k = "inventory/east".to_string();
        w.wrote(k.clone(), Some(&at("a", "cached")), Some(at("c", "ours")));
        assert_eq!(
            note(w.current(&k, Some(Arc::new(at("a", "cached"))))),
            Some("ours".into())
        );
        assert_eq!(
            note(w.current(&k, Some(Arc::new(at("b", "other"))))),
            Some("other".into()),
            "not the version the write was made on: the cache"
        );
    }

    #[test]
    fn records_go_after_a_while_looked_up_or_not() {
        let w = Written::<ClusterProfile>::default();
        let long_ago = Instant::now() - KEEP;
        w.wrote("inventory/east".into(), Some(&at("1", "old")), None);
        w.wrote("inventory/gone".into(), Some(&at("2", "old")), None);
        for r in w.lock().by_key.values_mut() {
            r.at = long_ago;
        }
        assert_eq!(
            note(w.current("inventory/east", Some(Arc::new(at("1", "cached"))))),
            Some("cached".into()),
            "a record past KEEP no longer stands for the cache"
        );
        assert_eq!(w.len(), 1, "looked up: dropped");
        w.lock().pruned = Some(long_ago);
        w.wrote("inventory/west".into(), None, Some(at("3", "new")));
        let left: Vec<String> = w.lock().by_key.keys().cloned().collect();
        assert_eq!(
            left,
            ["inventory/west"],
            "never looked up again: pruned at the next write"
        );
    }
}
