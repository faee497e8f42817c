//! Graceful shutdown: SIGTERM (what Kubernetes sends) or Ctrl-C cancels one token that every
//! task of the process watches.

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// A token cancelled on the first SIGTERM or SIGINT.
pub fn shutdown_token() -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        info!("Shutdown signal received; stopping");
        t.cancel();
    });
    token
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
                return;
            }
            Err(err) => warn!(
                error = &err as &dyn std::error::Error,
                "Cannot watch SIGTERM; only Ctrl-C stops"
            ),
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
