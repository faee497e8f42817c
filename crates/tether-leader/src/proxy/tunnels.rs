//! Ensures each member has at most one live tunnel at the leader, keyed by its dedicated
//! namespace and name, and that each tunnel lives only while what it was proven with holds: the
//! member's key it proved and a deadline its credential sets (renewed by a new proof). A new
//! attach replaces (and closes) the old one, a closed tunnel removes only itself, a revoked one
//! is closed at once, and every change is announced so the TunnelConnected condition follows.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use hyper::client::conn::http2::SendRequest;
use tether_tunnel::pipe::Body;
use tokio::sync::{Notify, mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::health::Close;

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
    /// `None`: a tunnel is now connected; else how it closed.
    pub closed: Option<Close>,
}

/// How requests reach one tunnel: its HTTP/2 sender once HTTP/2 runs on it, and the way to ask
/// an idle tunnel to start it (`tether_tunnel::idle`).
#[derive(Clone)]
pub struct Line {
    ready: watch::Receiver<Option<SendRequest<Body>>>,
    start: Arc<Notify>,
}

/// The tunnel task's end of a [`Line`].
pub struct Carrier {
    /// Given the sender once HTTP/2 runs; dropped when the tunnel closes.
    pub ready: watch::Sender<Option<SendRequest<Body>>>,
    /// Notified when a request waits for HTTP/2.
    pub start: Arc<Notify>,
}

impl Line {
    /// A line whose HTTP/2 sender is `send` if it runs already (or is handed over later), and
    /// the tunnel task's end of it.
    pub fn new(send: Option<SendRequest<Body>>) -> (Line, Carrier) {
        let (ready, rx) = watch::channel(send);
        let start = Arc::new(Notify::new());
        (
            Line {
                ready: rx,
                start: start.clone(),
            },
            Carrier { ready, start },
        )
    }

    /// Whether the tunnel closed.
    fn is_closed(&self) -> bool {
        self.ready.has_changed().is_err() || self.ready.borrow().as_ref().is_some_and(|s| s.is_closed())
    }

    /// The HTTP/2 sender, starting HTTP/2 on an idle tunnel first; `None` once it closed.
    pub async fn sender(&mut self) -> Option<SendRequest<Body>> {
        loop {
            if let Some(s) = self.ready.borrow_and_update().clone() {
                return (!s.is_closed()).then_some(s);
            }
            self.start.notify_one();
            self.ready.changed().await.ok()?;
        }
    }
}

struct Entry {
    id: u64,
    send: Line,
    /// The member key (age recipient) the tunnel was proven with.
    key: String,
    /// When the tunnel closes unless proven again over a renewed credential.
    deadline: Instant,
    /// Cancelled to close the tunnel's connection.
    close: CancellationToken,
}

/// A live tunnel as the revocation check sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Live {
    /// Whose.
    pub member: MemberKey,
    /// The key it was proven with.
    pub key: String,
    /// When it closes unless proven again.
    pub deadline: Instant,
}

/// What `insert` did.
#[derive(Debug)]
pub struct Inserted {
    /// The id to `remove` it with.
    pub id: u64,
    /// Cancelled when the tunnel is replaced or revoked: its connection must close.
    pub close: CancellationToken,
    /// Whether a live tunnel of the same member was replaced (and closed).
    pub replaced: bool,
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

    /// Registers `send` as `member`'s tunnel, proven with `key` until `deadline`, replacing
    /// (and closing) any older one.
    pub fn insert(&self, member: MemberKey, send: Line, key: String, deadline: Instant) -> Inserted {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let close = CancellationToken::new();
        let old = self.live().insert(
            member.clone(),
            Entry {
                id,
                send,
                key,
                deadline,
                close: close.clone(),
            },
        );
        let replaced = old.is_some_and(|old| {
            old.close.cancel();
            !old.send.is_closed()
        });
        let _ = self.changes.send(Change { member, closed: None });
        Inserted { id, close, replaced }
    }

    /// Moves `member`'s deadline to `deadline` if its live tunnel was proven with `key`.
    pub fn renew(&self, member: &MemberKey, key: &str, deadline: Instant) -> bool {
        match self.live().get_mut(member) {
            Some(e) if e.key == key && !e.send.is_closed() => {
                e.deadline = deadline;
                true
            }
            _ => false,
        }
    }

    /// Every live tunnel, for the revocation check.
    pub fn snapshot(&self) -> Vec<Live> {
        self.live()
            .iter()
            .map(|(member, e)| Live {
                member: member.clone(),
                key: e.key.clone(),
                deadline: e.deadline,
            })
            .collect()
    }

    /// Closes `member`'s tunnel now (it was revoked); returns whether one was live.
    pub fn revoke(&self, member: &MemberKey) -> bool {
        let gone = self.live().remove(member);
        let Some(e) = gone else { return false };
        e.close.cancel();
        let _ = self.changes.send(Change {
            member: member.clone(),
            closed: Some(Close::Closed),
        });
        true
    }

    /// Removes `member`'s tunnel if it is still the one registered as `id`.
    pub fn remove(&self, member: &MemberKey, id: u64, how: Close) {
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
                closed: Some(how),
            });
        }
    }

    /// The line to `member`'s tunnel, if one is connected and open.
    pub fn get(&self, member: &MemberKey) -> Option<Line> {
        self.live()
            .get(member)
            .filter(|e| !e.send.is_closed())
            .map(|e| e.send.clone())
    }

    /// Closes every tunnel (this replica stops leading or shuts down).
    pub fn close_all(&self) {
        let gone: Vec<(MemberKey, Entry)> = self.live().drain().collect();
        for (member, e) in gone {
            e.close.cancel();
            let _ = self.changes.send(Change {
                member,
                closed: Some(Close::Closed),
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
