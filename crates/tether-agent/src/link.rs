//! What the tunnel and the heartbeat tell each other: whether the tunnel is attached (the
//! heartbeat renews rarely while it is), and the ping interval the leader asks for (read from
//! each heartbeat, used by the tunnel).

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
    ping_millis: AtomicU64,
    /// Whether the agent dials a tunnel at all (member access on).
    dials: bool,
}

impl Default for Link {
    fn default() -> Self {
        Self {
            attached: watch::Sender::new(false),
            ping_millis: AtomicU64::new(DEFAULT_PING.as_millis() as u64),
            dials: false,
        }
    }
}

impl Link {
    /// The link of an agent that dials a tunnel (member access on).
    pub fn dialing() -> Self {
        Self {
            dials: true,
            ..Self::default()
        }
    }

    /// Waits until the tunnel is attached, at most `at_most`; at once for an agent that dials
    /// none.
    pub async fn tunnel_within(&self, at_most: Duration) {
        if !self.dials {
            return;
        }
        let mut rx = self.attached.subscribe();
        let _ = tokio::time::timeout(at_most, rx.wait_for(|a| *a)).await;
    }

    /// The tunnel attached (`true`) or was lost.
    pub fn set_attached(&self, attached: bool) {
        self.attached
            .send_if_modified(|a| std::mem::replace(a, attached) != attached);
    }

    /// Whether the tunnel is attached now, and a receiver of changes.
    pub fn attached(&self) -> watch::Receiver<bool> {
        self.attached.subscribe()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_wait_for_the_tunnel_ends_when_it_attaches_at_most_after_the_bound_and_at_once_without_one() {
        let start = tokio::time::Instant::now();
        Link::default().tunnel_within(Duration::from_secs(5)).await;
        assert_eq!(start.elapsed(), Duration::ZERO, "no tunnel to wait for");

        let link = std::sync::Arc::new(Link::dialing());
        let attaching = link.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            attaching.set_attached(true);
        });
        link.tunnel_within(Duration::from_secs(5)).await;
        assert_eq!(start.elapsed(), Duration::from_secs(1), "attached after 1 s");

        let start = tokio::time::Instant::now();
        Link::dialing().tunnel_within(Duration::from_secs(5)).await;
        assert_eq!(
            start.elapsed(),
            Duration::from_secs(5),
            "never attached: the bound"
        );
    }
}
