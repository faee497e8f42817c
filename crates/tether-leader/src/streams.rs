//! One watch per kind. Each kind is watched once; the watch fills the kind's cache (trimmed of
//! what no controller reads) and its touched objects — applied *and* deleted — are fanned out to
//! every controller that needs them as a primary or a trigger. kube-runtime's shared streams
//! would do the fan-out but pass on no deletions, and a deleted announce is how a member leaves.

use futures::{Stream, StreamExt};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource};
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

/// Watches `api` once with `config` (in a task of its own), caching objects after `trim`, and
/// fans touched objects out to `consumers` streams.
pub fn watch<K>(
    api: Api<K>,
    config: watcher::Config,
    trim: impl FnMut(&mut K) + Send + 'static,
    consumers: usize,
) -> Watched<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    let (store, writer) = reflector::store();
    let touched = reflector::reflector(writer, watcher(api, config).modify(trim))
        .default_backoff()
        .touched_objects();
    let (mut tx, rx) = async_broadcast::broadcast::<K>(BUFFER);
    // NB: no overflow: a slow consumer holds the watch back rather than losing an object.
    tx.set_overflow(false);
    tx.set_await_active(false);
    let streams = (0..consumers).map(|_| rx.clone().map(Ok).boxed()).collect();
    drop(rx);
    let driver = tokio::spawn(touched.for_each(move |r| {
        let tx = tx.clone();
        async move {
            match r {
                Ok(obj) => {
                    // Fails only once every consumer is gone (shutdown).
                    let _ = tx.broadcast_direct(obj).await;
                }
                Err(err) => warn!(kind = %K::kind(&()), error = &err as &dyn std::error::Error,
                                      "Watch failed; retrying with backoff"),
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
