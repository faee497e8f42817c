//! Ensures the serving replica knows which members' agent ServiceAccounts exist right now (one
//! UID per member namespace, fed by `revoke::follow_identities`), so that a token of a
//! ServiceAccount that was just deleted cannot attach a tunnel, and says "not yet" until the
//! first list is in.

use std::collections::HashMap;

/// The members' agent ServiceAccounts as the leader last saw them: the UID in each member
/// namespace, once the first list is in.
#[derive(Default)]
pub struct Identities {
    uids: std::sync::Mutex<HashMap<String, String>>,
    pub(super) synced: std::sync::atomic::AtomicBool,
}

impl Identities {
    /// Whether member namespace `ns` has its agent ServiceAccount; `None` before the first list.
    /// NB: a token of a just-deleted ServiceAccount may still authenticate for a moment (the API
    /// server's cache); this is what keeps it from attaching a tunnel.
    pub fn present(&self, ns: &str) -> Option<bool> {
        if !self.synced.load(std::sync::atomic::Ordering::Acquire) {
            return None;
        }
        Some(
            self.uids
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains_key(ns),
        )
    }

    /// The UIDs, to update from the watch.
    pub(super) fn uids(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.uids.lock().unwrap_or_else(|p| p.into_inner())
    }
}
