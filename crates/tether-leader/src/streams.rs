//! One watch per kind. Each kind is watched once; the watch fills the kind's cache (trimmed of
//! what no controller reads) and its touched objects — applied *and* deleted — are fanned out to
//! every controller that needs them as a primary or a trigger. kube-runtime's shared streams
//! would do the fan-out but pass on no deletions, and a deleted announce is how a member leaves.

use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::runtime::reflector::{self, Store};
use kube::runtime::utils::Backoff;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource};
use rand::Rng;
use serde::de::DeserializeOwned;
use tracing::warn;

/// How many touched objects may wait for the slowest consumer before the watch waits too.
const BUFFER: usize = 4096;

/// A kind's cache, the task that drives its watch, and one stream of its touched objects per
/// consumer.
pub struct Watched<K: Resource + 'static>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    /// The cache.
    pub store: Store<K>,
    /// The task driving the watch (abort it to stop watching).
    pub driver: tokio::task::JoinHandle<()>,
    /// One stream per consumer, in the order asked for.
    pub streams: Vec<futures::stream::BoxStream<'static, Result<K, watcher::Error>>>,
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

/// Watches `api` once with `config` (in a task of its own), caching objects after `trim`, and
/// fans touched objects out to `consumers` streams. `sight`, if given, hears every event
/// (`true`) and failure (`false`).
pub fn watch<K>(
    api: Api<K>,
    config: watcher::Config,
    trim: impl FnMut(&mut K) + Send + 'static,
    consumers: usize,
    sight: Option<Sight>,
) -> Watched<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    let (store, writer) = reflector::store();
    let events = reflector::reflector(writer, watcher(api, config).modify(trim)).backoff(Retry::default());
    let (mut tx, rx) = async_broadcast::broadcast::<K>(BUFFER);
    // NB: no overflow: a slow consumer holds the watch back rather than losing an object.
    tx.set_overflow(false);
    tx.set_await_active(false);
    let streams = (0..consumers).map(|_| rx.clone().map(Ok).boxed()).collect();
    drop(rx);
    let tell = move |working: bool| {
        if let Some(sight) = &sight {
            sight(working);
        }
    };
    let driver = tokio::spawn(events.for_each(move |r| {
        let touched = match r {
            Ok(watcher::Event::Apply(obj) | watcher::Event::Delete(obj) | watcher::Event::InitApply(obj)) => {
                tell(true);
                Some(obj)
            }
            Ok(watcher::Event::InitDone) => {
                tell(true);
                None
            }
            Ok(watcher::Event::Init) => None,
            Err(err) => {
                tell(false);
                warn!(kind = %K::kind(&()), error = &err as &dyn std::error::Error,
                      "Watch failed; retrying with backoff");
                None
            }
        };
        let tx = tx.clone();
        async move {
            if let Some(obj) = touched {
                // Fails only once every consumer is gone (shutdown).
                let _ = tx.broadcast_direct(obj).await;
            }
        }
    }));
    Watched {
        store,
        driver,
        streams,
    }
}

/// Takes the next consumer stream (each is handed out once).
pub fn take<K>(
    streams: &mut Vec<futures::stream::BoxStream<'static, Result<K, watcher::Error>>>,
) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static
where
    K: Send + 'static,
{
    // NB: `watch` makes exactly as many streams as `run` takes; an empty one would be a bug in
    // `run`, and it then simply never triggers.
    if streams.is_empty() {
        futures::stream::empty().boxed()
    } else {
        streams.remove(0)
    }
}
