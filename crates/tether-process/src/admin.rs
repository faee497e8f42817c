//! The admin HTTP port: `/metrics` (OpenMetrics text), `/livez` (the process serves) and
//! `/readyz` (caches synced), for probes and Prometheus. Nothing here changes state.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

/// What the admin port reports.
#[derive(Clone)]
pub struct Health {
    /// Renders the metrics.
    pub metrics: Arc<dyn Fn() -> String + Send + Sync>,
    /// True once the process can do its job (caches synced).
    pub ready: watch::Receiver<bool>,
}

/// The admin port cannot be opened.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on admin address {addr}: {source} (choose another with --admin-addr)")]
pub struct AdminError {
    addr: SocketAddr,
    source: std::io::Error,
}

/// Binds `addr` and serves until `shutdown`; returns the bound address (port 0 picks one).
pub async fn start(
    addr: SocketAddr,
    health: Health,
    shutdown: CancellationToken,
) -> Result<(SocketAddr, JoinHandle<()>), AdminError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| AdminError { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| AdminError { addr, source })?;
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/livez", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(health);
    info!(addr = %bound, "Admin server listening");
    let task = tokio::spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(shutdown.cancelled_owned())
            .await;
        if let Err(err) = served {
            error!(error = &err as &dyn std::error::Error, "Admin server failed");
        }
    });
    Ok((bound, task))
}

async fn metrics(State(h): State<Health>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        (h.metrics)(),
    )
}

async fn readyz(State(h): State<Health>) -> impl IntoResponse {
    if *h.ready.borrow() {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "caches not synced yet")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(addr: SocketAddr, path: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn readyz_follows_readiness_and_metrics_are_served() {
        let (tx, rx) = watch::channel(false);
        let health = Health {
            metrics: Arc::new(|| "# TYPE up gauge\nup 1\n# EOF\n".to_string()),
            ready: rx,
        };
        let stop = CancellationToken::new();
        let (addr, task) = start("127.0.0.1:0".parse().unwrap(), health, stop.clone())
            .await
            .unwrap();
        assert!(get(addr, "/readyz").await.starts_with("HTTP/1.0 503"));
        tx.send(true).unwrap();
        assert!(get(addr, "/readyz").await.starts_with("HTTP/1.0 200"));
        assert!(get(addr, "/livez").await.starts_with("HTTP/1.0 200"));
        let m = get(addr, "/metrics").await;
        assert!(m.contains("openmetrics") && m.contains("up 1"), "{m}");
        assert!(get(addr, "/nope").await.starts_with("HTTP/1.0 404"));
        stop.cancel();
        task.await.unwrap();
    }

    #[tokio::test]
    async fn a_taken_port_is_a_clear_error() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (_, rx) = watch::channel(true);
        let health = Health {
            metrics: Arc::new(String::new),
            ready: rx,
        };
        let err = start(l.local_addr().unwrap(), health, CancellationToken::new())
            .await
            .err()
            .unwrap();
        assert!(err.to_string().contains("--admin-addr"), "{err}");
    }
}
