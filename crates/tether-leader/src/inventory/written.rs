//! The profiles this replica wrote that its cache may not show yet. A joining member's
//! ManagedCluster changes several times within milliseconds (approved, first heartbeat, first
//! report); a sync that runs before the watch delivered the previous sync's own write compares
//! against the profile from before it, and writes again what the API server already holds (or
//! deletes one already deleted). Each such write is a request that changes nothing.
//!
//! A write is remembered with the resource versions the cache may still show from before it;
//! while the cache shows one of those, the written object stands for the profile. As soon as
//! the cache shows anything else (the write itself, or a later one by anyone), the cache is
//! the truth again and the record is dropped. So a record never hides a change the cache has
//! seen, and there is at most one per profile.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kube::ResourceExt;
use tether_api::inventory::ClusterProfile;

/// A profile's namespace and name.
pub(super) type Key = (String, String);

/// The key of profile `p`.
pub(super) fn key(p: &ClusterProfile) -> Key {
    (p.namespace().unwrap_or_default(), p.name_any())
}

struct Wrote {
    /// Versions the cache may still show from before the write (`None`: no profile).
    before: Vec<Option<String>>,
    /// The profile as the API server returned it (`None`: deleted).
    after: Option<Arc<ClusterProfile>>,
}

#[derive(Default)]
pub(super) struct Written(Mutex<HashMap<Key, Wrote>>);

fn version(p: Option<&ClusterProfile>) -> Option<String> {
    p.and_then(|p| p.resource_version())
}

impl Written {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Wrote>> {
        // NB: every update is one insert or remove: consistent under a panic elsewhere.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Profile `key` as the API server holds it, as far as this replica knows: what it last
    /// wrote while the cache (`cached`) still shows a version from before that write; else the
    /// cached one.
    pub(super) fn current(
        &self,
        key: &Key,
        cached: Option<Arc<ClusterProfile>>,
    ) -> Option<Arc<ClusterProfile>> {
        let mut all = self.lock();
        if let Some(w) = all.get(key) {
            if w.before.contains(&version(cached.as_deref())) {
                return w.after.clone();
            }
            all.remove(key);
        }
        cached
    }

    /// Remembers a write of profile `key` made on top of `seen` (what `current` gave), whose
    /// result is `after` (`None`: deleted).
    pub(super) fn wrote(&self, key: Key, seen: Option<&ClusterProfile>, after: Option<ClusterProfile>) {
        let mut all = self.lock();
        // NB: a write on top of a remembered one keeps what the cache may show from before both.
        let mut before = all.remove(&key).map(|w| w.before).unwrap_or_default();
        let seen = version(seen);
        if !before.contains(&seen) {
            before.push(seen);
        }
        all.insert(
            key,
            Wrote {
                before,
                after: after.map(Arc::new),
            },
        );
    }

    /// The cache now shows `p` (a watch event): a write it caught up with is forgotten.
    pub(super) fn seen(&self, p: &ClusterProfile) {
        let key = key(p);
        let mut all = self.lock();
        if all
            .get(&key)
            .is_some_and(|w| !w.before.contains(&version(Some(p))))
        {
            all.remove(&key);
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::ObjectMeta;
    use tether_api::inventory::{ClusterManager, ClusterProfileSpec};

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
        let w = Written::default();
        let k: Key = ("inventory".into(), "east".into());
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

        // Someone else wrote after this replica: their version wins at once.
        w.wrote(k.clone(), Some(&at("11", "cached")), Some(at("12", "ours")));
        assert_eq!(
            note(w.current(&k, Some(Arc::new(at("13", "theirs"))))),
            Some("theirs".into())
        );
        assert_eq!(w.len(), 0);

        // Deleted: gone while the cache still shows it, and forgotten once the watch says so.
        w.wrote(k.clone(), Some(&at("13", "theirs")), None);
        assert_eq!(note(w.current(&k, Some(Arc::new(at("13", "theirs"))))), None);
        assert_eq!(w.len(), 1);
        w.seen(&at("13", "theirs"));
        assert_eq!(w.len(), 1, "an event from before the delete keeps the record");
        w.seen(&at("14", "deleted"));
        assert_eq!(w.len(), 0, "the delete's own event drops it");
        assert_eq!(note(w.current(&k, None)), None);
    }
}
