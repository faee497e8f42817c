//! What the tunnel and the heartbeat tell each other: whether the tunnel is attached (the
//! heartbeat renews rarely while it is) and whether its first dial ended (the first renewal
//! waits for it), and the ping interval the leader asks for (read from each heartbeat, used by
//! the tunnel).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::watch;

/// How often the tunnel is pinged until the leader says otherwise (the sets' default).
pub const DEFAULT_PING: Duration = Duration::from_secs(5);

/// What the tunnel and the heartbeat tell each other: whether the tunnel is attached, and the
/// ping interval the leader asks for.
#[derive(Debug)]
pub struct Link {
    attached: watch::Sender<bool>,
    dialled: watch::Sender<bool>,
    ping_millis: AtomicU64,
}

impl Default for Link {
    fn default() -> Self {
        Self {
            attached: watch::Sender::new(false),
            dialled: watch::Sender::new(false),
            ping_millis: AtomicU64::new(DEFAULT_PING.as_millis() as u64),
        }
    }
}

impl Link {
    /// The tunnel attached (`true`) or was lost.
    pub fn set_attached(&self, attached: bool) {
        self.attached
            .send_if_modified(|a| std::mem::replace(a, attached) != attached);
    }

    /// Whether the tunnel is attached now, and a receiver of changes.
    pub fn attached(&self) -> watch::Receiver<bool> {
        self.attached.subscribe()
    }

    /// A dial of the tunnel ended, attached or not (after `set_attached(true)` when it did).
    pub fn set_dialled(&self) {
        self.dialled.send_if_modified(|d| !std::mem::replace(d, true));
    }

    /// Whether a dial of the tunnel has ended yet, and a receiver of that.
    pub fn dialled(&self) -> watch::Receiver<bool> {
        self.dialled.subscribe()
    }

    /// How often to ping the tunnel.
    pub fn ping(&self) -> Duration {
        Duration::from_millis(self.ping_millis.load(Ordering::Relaxed))
    }

    /// The leader asks for pings every `ping`.
    pub fn set_ping(&self, ping: Duration) {
        self.ping_millis.store(ping.as_millis() as u64, Ordering::Relaxed);
    }
}
