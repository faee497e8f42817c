//! Ensures each member has at most one live tunnel at the leader, keyed by its dedicated
//! namespace and name: a new attach replaces the old one, a closed tunnel removes only itself,
//! and every change is announced so the TunnelConnected condition follows it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use hyper::client::conn::http2::SendRequest;
use tether_tunnel::pipe::Body;
use tokio::sync::mpsc;

/// A member: its dedicated namespace and ManagedCluster name.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub struct MemberKey {
    /// The dedicated namespace.
    pub namespace: String,
    /// The ManagedCluster name.
    pub name: String,
}

/// A tunnel opened or closed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    /// Whose.
    pub member: MemberKey,
    /// Whether a tunnel is now connected.
    pub connected: bool,
}

struct Entry {
    id: u64,
    send: SendRequest<Body>,
}

/// The live tunnels of this replica.
pub struct Tunnels {
    live: Mutex<HashMap<MemberKey, Entry>>,
    next: AtomicU64,
    changes: mpsc::UnboundedSender<Change>,
}

impl Tunnels {
    /// An empty registry announcing changes on `changes`.
    pub fn new(changes: mpsc::UnboundedSender<Change>) -> Self {
        Self {
            live: Mutex::default(),
            next: AtomicU64::new(1),
            changes,
        }
    }

    fn live(&self) -> std::sync::MutexGuard<'_, HashMap<MemberKey, Entry>> {
        // NB: the map stays consistent under a panic elsewhere (every update is one insert or remove).
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers `send` as `member`'s tunnel, replacing (and so closing) any older one; returns
    /// the id to `remove` it with.
    pub fn insert(&self, member: MemberKey, send: SendRequest<Body>) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.live().insert(member.clone(), Entry { id, send });
        let _ = self.changes.send(Change {
            member,
            connected: true,
        });
        id
    }

    /// Removes `member`'s tunnel if it is still the one registered as `id`.
    pub fn remove(&self, member: &MemberKey, id: u64) {
        let removed = {
            let mut live = self.live();
            match live.get(member) {
                Some(e) if e.id == id => live.remove(member).is_some(),
                _ => false,
            }
        };
        if removed {
            let _ = self.changes.send(Change {
                member: member.clone(),
                connected: false,
            });
        }
    }

    /// A sender on `member`'s tunnel, if one is connected and open.
    pub fn get(&self, member: &MemberKey) -> Option<SendRequest<Body>> {
        self.live()
            .get(member)
            .filter(|e| !e.send.is_closed())
            .map(|e| e.send.clone())
    }

    /// Closes every tunnel (this replica stops leading or shuts down).
    pub fn close_all(&self) {
        let gone: Vec<MemberKey> = self.live().drain().map(|(k, _)| k).collect();
        for member in gone {
            let _ = self.changes.send(Change {
                member,
                connected: false,
            });
        }
    }

    /// How many tunnels are connected.
    pub fn len(&self) -> usize {
        self.live().len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
