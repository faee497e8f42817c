//! One watch per kind. Each kind is watched once; the watch fills the kind's cache (trimmed of
//! what no controller reads) and its touched objects — applied *and* deleted — are fanned out to
//! every controller that needs them as a primary or a trigger. kube-runtime's shared streams
//! would do the fan-out but pass on no deletions, and a deleted announce is how a member leaves.
//!
//! A list (the first, or again after the watch expired) is handed out only once it is complete
//! and cached, with the objects it no longer holds as deletions: kube's controllers look each
//! object up in the cache and silently drop a reconcile they cannot find, and the reflector
//! caches a list only at its end. A registration request created while the leader's request
//! watch was down was dropped so and never decided (seen at 9,000 members; faults/relist.rs).
//! The agent watches its ClusterSets the same way.

use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::utils::Backoff;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource};
use rand::Rng;
use serde::de::DeserializeOwned;
use tracing::warn;

/// How many touched objects may wait for the slowest consumer before the watch waits too.
/// The queue holds `Arc`s: it is allocated whole up front, 16 bytes a slot whatever the kind
/// (a queue of objects took ≈ 3 MiB per kind).
const BUFFER: usize = 4096;

/// A kind's watch before it runs: its cache, and the consumers subscribed so far. Consumers
/// subscribe here and only here: [`Watch::start`] consumes it, so a consumer that would subscribe
/// after the first object went out (and silently miss it) does not compile.
pub struct Watch<K: Resource + 'static>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    store: Store<K>,
    events: futures::stream::BoxStream<'static, Arc<K>>,
    tx: async_broadcast::Sender<Arc<K>>,
    rx: async_broadcast::Receiver<Arc<K>>,
}

/// Watch retry delays: from `RETRY_MIN` doubling to `RETRY_MAX`, ±20 % jitter, back to the
/// start after any event. kube-runtime's default grows to 30 s: after a minute-long API server
/// outage that left the leader blind to heartbeats for up to 30 s more. A failed attempt costs
/// the API server one refused connection or one 410.
#[derive(Clone, Debug)]
pub struct Retry {
    next: Duration,
}

const RETRY_MIN: Duration = Duration::from_millis(250);
const RETRY_MAX: Duration = Duration::from_secs(4);
/// The longest a failed watch waits before it tries again (`RETRY_MAX` and its jitter): after an
/// outage of the API server longer than a few seconds, a watch sees it back at most this late.
pub const LONGEST_RETRY: Duration = Duration::from_millis(RETRY_MAX.as_millis() as u64 * 6 / 5);

impl Default for Retry {
    fn default() -> Self {
        Self { next: RETRY_MIN }
    }
}

impl Iterator for Retry {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let delay = self.next;
        self.next = (delay * 2).min(RETRY_MAX);
        Some(delay.mul_f64(rand::rng().random_range(0.8..1.2)))
    }
}

impl Backoff for Retry {
    fn reset(&mut self) {
        self.next = RETRY_MIN;
    }
}

/// Told whether a watch works: `true` for each event or completed list, `false` for each failure.
pub type Sight = Box<dyn Fn(bool) + Send + Sync>;

/// Watches `api` once with `config`, caching objects after `trim`; every touched object goes
/// to each stream [`Watch::subscribe`] handed out. `sight`, if given, hears every event (`true`)
/// and failure (`false`). Nothing is read until [`Watch::start`].
pub fn watch<K>(
    api: Api<K>,
    config: watcher::Config,
    trim: impl FnMut(&mut K) + Send + 'static,
    sight: Option<Sight>,
) -> Watch<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    let (store, writer) = reflector::store();
    let tell = move |working: bool| {
        if let Some(sight) = &sight {
            sight(working);
        }
    };
    let cache = store.clone();
    // The cache as it was when the current list began.
    let mut before: Vec<Arc<K>> = Vec::new();
    let events = reflector::reflector(writer, watcher(api, config).modify(trim))
        .backoff(Retry::default())
        .map(move |r| match r {
            Ok(watcher::Event::Apply(obj) | watcher::Event::Delete(obj)) => {
                tell(true);
                (Some(Arc::new(obj)), Vec::new())
            }
            Ok(watcher::Event::Init) => {
                before = cache.state();
                (None, Vec::new())
            }
            // NB: the reflector caches a list's objects only once the list is complete: a
            // consumer handed one now would not find it in the cache, and kube's controllers drop
            // a reconcile whose object they cannot find. They go out with `InitDone`.
            Ok(watcher::Event::InitApply(_)) => {
                tell(true);
                (None, Vec::new())
            }
            Ok(watcher::Event::InitDone) => {
                tell(true);
                (None, listed(&cache, std::mem::take(&mut before)))
            }
            Err(err) => {
                tell(false);
                warn!(kind = %K::kind(&()), error = &err as &dyn std::error::Error,
                      "Watch failed; retrying with backoff");
                (None, Vec::new())
            }
        })
        // NB: one object, or a list's (a watch event allocates no `Vec`).
        .flat_map(|(one, listed)| futures::stream::iter(one.into_iter().chain(listed)))
        .boxed();
    let (mut tx, rx) = async_broadcast::broadcast::<Arc<K>>(BUFFER);
    // NB: no overflow: a slow consumer holds the watch back rather than losing an object.
    tx.set_overflow(false);
    tx.set_await_active(false);
    Watch {
        store,
        events,
        tx,
        rx,
    }
}

impl<K> Watch<K>
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    /// The kind's cache (filled once the watch runs).
    pub fn store(&self) -> Store<K> {
        self.store.clone()
    }

    /// A stream of every object the watch touches (applied or deleted), from its first.
    pub fn subscribe(&mut self) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static {
        // NB: each consumer gets its own copy, as kube's controllers take owned objects.
        self.rx.clone().map(|obj| Ok(Arc::unwrap_or_clone(obj)))
    }

    /// Runs the watch in a task of its own (abort it to stop watching); no one can subscribe
    /// any more.
    pub fn start(self) -> tokio::task::JoinHandle<()> {
        let Watch { events, tx, rx, .. } = self;
        drop(rx);
        tokio::spawn(events.for_each(move |touched| {
            let tx = tx.clone();
            async move {
                // Fails only once every consumer is gone (shutdown).
                let _ = tx.broadcast_direct(touched).await;
            }
        }))
    }
}

/// What a completed list touched, once the cache holds it: every object listed (the cache
/// now), and every object cached before the list that it no longer holds. The API server sends
/// no deletion for an object deleted while the watch was down (it expired with `410 Gone` and
/// was listed again): a member that left meanwhile would go unheard.
fn listed<K>(cache: &Store<K>, before: Vec<Arc<K>>) -> Vec<Arc<K>>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    let mut touched = cache.state();
    touched.extend(
        before
            .into_iter()
            .filter(|old| cache.get(&ObjectRef::from_obj(old.as_ref())).is_none()),
    );
    touched
}

#[cfg(test)]
mod tests;
