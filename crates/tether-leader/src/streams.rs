//! One watch per kind. Each kind is watched once; the watch fills the kind's cache (trimmed of
//! what no controller reads) and its touched objects — applied *and* deleted — are fanned out to
//! every controller that needs them as a primary or a trigger. kube-runtime's shared streams
//! would do the fan-out but pass on no deletions, and a deleted announce is how a member leaves.

use std::sync::Arc;
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
    events: futures::stream::BoxStream<'static, Option<K>>,
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
    let events = reflector::reflector(writer, watcher(api, config).modify(trim))
        .backoff(Retry::default())
        .map(move |r| match r {
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
        })
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
                if let Some(obj) = touched {
                    // Fails only once every consumer is gone (shutdown).
                    let _ = tx.broadcast_direct(Arc::new(obj)).await;
                }
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures::StreamExt;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::{Api, Client};
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    /// An API server for ConfigMaps that lists `a` and `b`, then in its watch adds `c` and
    /// deletes `a`, and keeps the watch open.
    async fn api_server() -> Client {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let cm = |name: &str, rv: u32| {
            serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": "n", "resourceVersion": rv.to_string()}})
        };
        let list = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMapList",
            "metadata": {"resourceVersion": "2"}, "items": [cm("a", 1), cm("b", 2)]})
        .to_string();
        let events = [
            serde_json::json!({"type": "ADDED", "object": cm("c", 3)}).to_string(),
            serde_json::json!({"type": "DELETED", "object": cm("a", 4)}).to_string(),
        ];
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let (list, events) = (list.clone(), events.clone());
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 4096];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match conn.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let watch = String::from_utf8_lossy(&head).contains("watch=true");
                    let chunk = |s: &str| format!("{:x}\r\n{s}\r\n", s.len());
                    let mut out = String::from(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n",
                    );
                    if watch {
                        for e in &events {
                            out.push_str(&chunk(&format!("{e}\n")));
                        }
                    } else {
                        out.push_str(&chunk(&list));
                        out.push_str("0\r\n\r\n");
                    }
                    if conn.write_all(out.as_bytes()).await.is_ok() && watch {
                        // NB: the watch stays open, as the API server's does.
                        tokio::time::sleep(Duration::from_secs(3600)).await;
                    }
                });
            }
        });
        Client::try_from(kube::Config::new(format!("http://{addr}").parse().expect("url"))).expect("client")
    }

    #[tokio::test]
    async fn every_subscriber_sees_every_touched_object_and_the_cache_follows() {
        let api = Api::<ConfigMap>::namespaced(api_server().await, "n");
        let mut watch = watch(api, watcher::Config::default(), |_| {}, None);
        let subscribers = [watch.subscribe(), watch.subscribe()];
        let store = watch.store();
        let running = watch.start();
        for stream in subscribers {
            let names: Vec<String> = tokio::time::timeout(
                Duration::from_secs(10),
                stream
                    .take(4)
                    .map(|r| r.expect("object").metadata.name.unwrap_or_default())
                    .collect(),
            )
            .await
            .expect("four objects within 10 s");
            // The list's two, the watch's addition, then the deletion.
            assert_eq!(names, ["a", "b", "c", "a"]);
        }
        let mut cached: Vec<String> = store
            .state()
            .iter()
            .filter_map(|c| c.metadata.name.clone())
            .collect();
        cached.sort();
        assert_eq!(cached, ["b", "c"]);
        running.abort();
    }
}
