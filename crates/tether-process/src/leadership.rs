//! Lease leader election as a value: a `watch` of "this replica leads" that the controllers read
//! before every write. The replica steps down (publishes `false`) as soon as a renewal fails or
//! another holder takes the Lease, and releases the Lease on shutdown so a peer takes over at once:
//! standbys watch the Lease and try to take it the moment it is released, instead of sleeping
//! until it would have expired.

use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Client};
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::ProcessArgs;

/// How long to wait before retrying after the Lease API failed.
const RETRY: Duration = Duration::from_secs(2);

/// This replica's leadership.
pub struct Leadership {
    rx: watch::Receiver<bool>,
    task: JoinHandle<()>,
}

impl Leadership {
    /// A receiver of "this replica leads".
    pub fn receiver(&self) -> watch::Receiver<bool> {
        self.rx.clone()
    }

    /// Waits until the election task has stepped down and released the Lease (after shutdown).
    pub async fn stopped(self) {
        let _ = self.task.await;
    }
}

/// Emits each time `leader` turns to "this replica leads" (not for its value at the start):
/// what controllers reconcile everything again on. Ends with the sender.
pub fn gained(leader: watch::Receiver<bool>) -> impl futures::Stream<Item = ()> + Send + 'static {
    turns(leader, true)
}

/// Emits each time `leader` turns to "this replica does not lead". Ends with the sender.
pub fn lost(leader: watch::Receiver<bool>) -> impl futures::Stream<Item = ()> + Send + 'static {
    turns(leader, false)
}

fn turns(leader: watch::Receiver<bool>, to: bool) -> impl futures::Stream<Item = ()> + Send + 'static {
    futures::stream::unfold(leader, move |mut rx| async move {
        loop {
            rx.changed().await.ok()?;
            if *rx.borrow_and_update() == to {
                return Some(((), rx));
            }
        }
    })
}

/// This replica's identity in the Lease: `--identity`, else the host name plus the process id.
pub fn identity(args: &ProcessArgs) -> String {
    args.identity.clone().unwrap_or_else(|| {
        // In a pod, the charts set POD_NAME (the downward API); HOSTNAME is the same there.
        let host = std::env::var("POD_NAME")
            .or_else(|_| std::env::var("HOSTNAME"))
            .unwrap_or_else(|_| "tether".into());
        format!("{host}-{}", std::process::id())
    })
}

/// Starts electing through the Lease `lease_name`, or leads alone when `--leader-elect=false`.
pub fn elect(
    client: Client,
    args: &ProcessArgs,
    lease_name: &str,
    shutdown: CancellationToken,
) -> Leadership {
    let (tx, rx) = watch::channel(!args.leader_elect);
    if !args.leader_elect {
        info!("Leader election off: this replica leads");
        let task = tokio::spawn(async move {
            shutdown.cancelled().await;
            tx.send_replace(false);
        });
        return Leadership { rx, task };
    }
    let identity = identity(args);
    let namespace = args.lease_namespace.clone();
    let duration = args.lease_duration;
    // Renew a third of the duration before expiry: a failed renewal leaves time to step down.
    let grace = (duration / 3).max(1);
    let lease_name = lease_name.to_string();
    let task = tokio::spawn(async move {
        loop {
            let built = LeaseManagerBuilder::new(client.clone(), &lease_name)
                .with_namespace(&namespace)
                .with_identity(&identity)
                .with_duration(duration)
                .with_grace(grace)
                .build()
                .await;
            let manager = match built {
                Ok(m) => m,
                Err(err) => {
                    warn!(lease = %lease_name, namespace = %namespace, error = &err as &dyn std::error::Error,
                          "Cannot use the leader-election Lease; retrying");
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(RETRY) => continue,
                    }
                }
            };
            let lease = Api::<Lease>::namespaced(client.clone(), &namespace);
            match follow(&manager, &lease, &lease_name, &tx, &identity, &shutdown).await {
                Next::Stop => return,
                Next::Rebuild => info!(%identity, "The leader released the Lease; taking it over"),
                Next::Retry => {}
            }
        }
    });
    Leadership { rx, task }
}

/// What `follow` ends with.
enum Next {
    /// Shutdown: the Lease is released if this replica held it.
    Stop,
    /// The Lease API failed; start over after a pause (already taken).
    Retry,
    /// The holder released the Lease: start over at once with fresh state. The manager trusts
    /// its cached expiry and would otherwise sleep until then.
    Rebuild,
}

/// Publishes lease changes until shutdown, an API error or, on a standby, a release seen on the
/// Lease's watch (a transition from a holder to none; the first state seen is only a baseline).
async fn follow(
    manager: &LeaseManager,
    lease: &Api<Lease>,
    lease_name: &str,
    tx: &watch::Sender<bool>,
    identity: &str,
    shutdown: &CancellationToken,
) -> Next {
    let config = watcher::Config::default().fields(&format!("metadata.name={lease_name}"));
    let mut releases = watcher::watcher(lease.clone(), config)
        .default_backoff()
        .filter_map(|event| async move {
            match event {
                Ok(watcher::Event::Apply(l) | watcher::Event::InitApply(l)) => Some(holder(&l)),
                Ok(watcher::Event::Delete(_)) => Some(None),
                Ok(_) => None,
                // Retried with backoff; meanwhile the manager still takes an expired Lease.
                Err(err) => {
                    warn!(
                        error = &err as &dyn std::error::Error,
                        "Cannot watch the Lease; retrying"
                    );
                    None
                }
            }
        })
        .boxed();
    let mut last_holder: Option<Option<String>> = None;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => {
                let was_leader = tx.send_replace(false);
                if was_leader {
                    match manager.release().await {
                        Ok(()) => info!(%identity, "Released the leader Lease"),
                        Err(err) => warn!(error = &err as &dyn std::error::Error, "Cannot release the Lease"),
                    }
                }
                return Next::Stop;
            }
            changed = manager.changed() => match changed {
                Ok(leads) => {
                    tx.send_replace(leads);
                    info!(%identity, leader = leads, "Leadership changed");
                }
                Err(err) => {
                    if tx.send_replace(false) {
                        warn!(%identity, error = &err as &dyn std::error::Error,
                              "Cannot renew the Lease; stepped down");
                    } else {
                        warn!(error = &err as &dyn std::error::Error, "Lease API failed; retrying");
                    }
                    tokio::select! {
                        _ = shutdown.cancelled() => return Next::Stop,
                        _ = tokio::time::sleep(RETRY) => return Next::Retry,
                    }
                }
            },
            Some(now) = releases.next() => {
                let released = matches!(&last_holder, Some(Some(h)) if h != identity) && now.is_none();
                last_holder = Some(now);
                if released && !*tx.borrow() {
                    return Next::Rebuild;
                }
            }
        }
    }
}

/// The Lease's holder; an empty name (as some releases leave it) counts as none.
fn holder(lease: &Lease) -> Option<String> {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.clone())
        .filter(|h| !h.is_empty())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures::StreamExt as _;
    use tokio::sync::watch;

    /// The next item of `s`, or `None` if none came within 100 ms.
    async fn next(s: &mut (impl futures::Stream<Item = ()> + Unpin)) -> Option<()> {
        tokio::time::timeout(Duration::from_millis(100), s.next())
            .await
            .ok()
            .flatten()
    }

    #[tokio::test]
    async fn gained_and_lost_follow_each_turn_and_end_with_the_sender() {
        let (tx, rx) = watch::channel(true);
        let mut gained = Box::pin(super::gained(rx.clone()));
        let mut lost = Box::pin(super::lost(rx));
        // The value at the start is no turn.
        assert_eq!(next(&mut gained).await, None);
        tx.send_replace(false);
        assert_eq!((next(&mut lost).await, next(&mut gained).await), (Some(()), None));
        tx.send_replace(true);
        assert_eq!((next(&mut gained).await, next(&mut lost).await), (Some(()), None));
        drop(tx);
        assert_eq!(gained.next().await, None, "ends with the sender");
        assert_eq!(lost.next().await, None, "ends with the sender");
    }
}
