use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, Client};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::*;

/// One answer of the scripted API server: sent after `delay`; a watch stays open afterwards
/// unless `close`.
struct Answer {
    delay: Duration,
    chunks: Vec<String>,
    close: bool,
}

fn answer(chunks: Vec<String>) -> Answer {
    Answer {
        delay: Duration::ZERO,
        chunks,
        close: false,
    }
}

fn cm(name: &str, rv: u32) -> serde_json::Value {
    serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "n", "resourceVersion": rv.to_string()}})
}

fn list(names: &[(&str, u32)], rv: u32, next: Option<&str>) -> Vec<String> {
    let items: Vec<_> = names.iter().map(|(n, v)| cm(n, *v)).collect();
    let mut metadata = serde_json::json!({"resourceVersion": rv.to_string()});
    if let Some(next) = next {
        metadata["continue"] = next.into();
    }
    vec![
        serde_json::json!({"apiVersion": "v1", "kind": "ConfigMapList", "metadata": metadata,
        "items": items})
        .to_string(),
    ]
}

fn event(kind: &str, object: serde_json::Value) -> String {
    format!("{}\n", serde_json::json!({"type": kind, "object": object}))
}

/// A ConfigMap API server on loopback that answers each request with `script(request head,
/// how many lists came before)`.
async fn api_server(script: impl Fn(&str, usize) -> Answer + Send + Sync + 'static) -> Client {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let script = Arc::new(script);
    let lists = Arc::new(AtomicUsize::new(0));
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let (script, lists) = (script.clone(), lists.clone());
            tokio::spawn(async move {
                // NB: kube's client keeps connections alive: serve every request on this one.
                loop {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 4096];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match conn.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let head = String::from_utf8_lossy(&head).into_owned();
                    let watch = head.contains("watch=true");
                    let before = if watch || head.contains("continue=") {
                        lists.load(Ordering::SeqCst)
                    } else {
                        lists.fetch_add(1, Ordering::SeqCst)
                    };
                    let a = script(&head, before);
                    tokio::time::sleep(a.delay).await;
                    let mut out = String::from(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n",
                    );
                    for c in &a.chunks {
                        out.push_str(&format!("{:x}\r\n{c}\r\n", c.len()));
                    }
                    if !watch || a.close {
                        out.push_str("0\r\n\r\n");
                    }
                    if conn.write_all(out.as_bytes()).await.is_err() {
                        return;
                    }
                    if watch && !a.close {
                        // NB: the watch stays open, as the API server's does.
                        tokio::time::sleep(Duration::from_secs(3600)).await;
                    }
                }
            });
        }
    });
    Client::try_from(kube::Config::new(format!("http://{addr}").parse().expect("url"))).expect("client")
}

/// The watch under test: namespace `n`'s ConfigMaps, untrimmed, unobserved.
fn configmaps(client: Client) -> Watch<ConfigMap> {
    watch(
        Api::<ConfigMap>::namespaced(client, "n"),
        watcher::Config::default(),
        |_| {},
        None,
    )
}

fn names(objects: &[ConfigMap]) -> Vec<String> {
    objects
        .iter()
        .map(|c| c.metadata.name.clone().unwrap_or_default())
        .collect()
}

#[tokio::test]
async fn every_subscriber_sees_every_touched_object_and_the_cache_follows() {
    // Lists `a` and `b`; the watch then adds `c` and deletes `a`.
    let client = api_server(|head, _| {
        if head.contains("watch=true") {
            answer(vec![event("ADDED", cm("c", 3)), event("DELETED", cm("a", 4))])
        } else {
            answer(list(&[("a", 1), ("b", 2)], 2, None))
        }
    })
    .await;
    let mut watch = configmaps(client);
    let subscribers = [watch.subscribe(), watch.subscribe()];
    let store = watch.store();
    let running = watch.start();
    for stream in subscribers {
        let seen: Vec<ConfigMap> = tokio::time::timeout(
            Duration::from_secs(10),
            stream.take(4).map(|r| r.expect("object")).collect(),
        )
        .await
        .expect("four objects within 10 s");
        let seen = names(&seen);
        // The list's two (in the cache's order), the watch's addition, then the deletion.
        let listed: BTreeSet<&str> = seen[..2].iter().map(String::as_str).collect();
        assert_eq!(listed, BTreeSet::from(["a", "b"]), "{seen:?}");
        assert_eq!(seen[2..], ["c", "a"]);
    }
    let mut cached = names(
        &store
            .state()
            .iter()
            .map(|c| c.as_ref().clone())
            .collect::<Vec<_>>(),
    );
    cached.sort();
    assert_eq!(cached, ["b", "c"]);
    running.abort();
}

/// The watch expires (`410 Gone`) and the kind is listed again, in two pages, the second slow.
/// Meanwhile `a` was deleted and `c`, `d` created. Every object a consumer is handed must be in
/// the cache by then (kube's controllers drop a reconcile whose object is not: a registration
/// request created while the watch was down was never decided), and `a`'s deletion must reach
/// the consumers though no watch event says it.
#[tokio::test]
async fn a_list_after_the_watch_expired_hands_out_its_objects_once_cached_and_its_deletions() {
    let client = api_server(|head, lists| {
        if head.contains("watch=true") {
            if lists == 1 {
                let gone = serde_json::json!({"apiVersion": "v1", "kind": "Status", "status": "Failure",
                    "reason": "Expired", "code": 410, "message": "too old resource version: 2 (5)"});
                Answer {
                    close: true,
                    ..answer(vec![event("ERROR", gone)])
                }
            } else {
                answer(Vec::new())
            }
        } else if head.contains("continue=") {
            Answer {
                delay: Duration::from_millis(500),
                ..answer(list(&[("d", 6)], 6, None))
            }
        } else if lists == 0 {
            answer(list(&[("a", 1), ("b", 2)], 2, None))
        } else {
            answer(list(&[("b", 2), ("c", 5)], 6, Some("page2")))
        }
    })
    .await;
    let mut watch = configmaps(client);
    let stream = watch.subscribe();
    let store = watch.store();
    let running = watch.start();
    // Each object handed out, and whether the cache held it at that moment.
    let seen: Vec<(String, bool)> = tokio::time::timeout(
        Duration::from_secs(10),
        stream
            .take(6)
            .map(|r| {
                let cm = r.expect("object");
                let cached = store.get(&ObjectRef::from_obj(&cm)).is_some();
                (cm.metadata.name.unwrap_or_default(), cached)
            })
            .collect(),
    )
    .await
    .expect("six objects within 10 s: the first list's two, the second's three and a deletion");
    let first: BTreeSet<_> = seen[..2].iter().cloned().collect();
    assert_eq!(
        first,
        BTreeSet::from([("a".to_string(), true), ("b".to_string(), true)]),
        "{seen:?}"
    );
    let second: BTreeSet<_> = seen[2..].iter().cloned().collect();
    let expected = [("a", false), ("b", true), ("c", true), ("d", true)];
    assert_eq!(
        second,
        expected.iter().map(|(n, c)| (n.to_string(), *c)).collect(),
        "after the relist: b, c, d handed out once cached, a as deleted: {seen:?}"
    );
    running.abort();
}

#[test]
fn a_failed_watch_waits_from_a_quarter_second_doubling_and_never_longer_than_the_longest_retry() {
    let mut r = Retry::default();
    let delays: Vec<Duration> = (0..40).map(|_| r.next().expect("a delay")).collect();
    assert!(delays[0] >= Duration::from_millis(200) && delays[0] <= Duration::from_millis(300));
    assert!(delays.iter().all(|d| *d <= LONGEST_RETRY), "{delays:?}");
    assert!(
        delays[10..].iter().all(|d| *d >= Duration::from_millis(3200)),
        "{delays:?}"
    );
    r.reset();
    assert!(r.next().expect("a delay") <= Duration::from_millis(300));
}
