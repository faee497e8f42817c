//! What the proxy's TLS listener trusts: the API server's front-proxy CA, followed while serving,
//! with the serving certificate renewed in the same task.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::watch;
use tracing::{error, info, warn};

use super::certificate::Renewal;
use super::frontproxy::{AUTH_CONFIGMAP, AUTH_NAMESPACE, FrontProxy};
use super::{ProxyError, serving};

/// The front-proxy trust of one moment and the TLS acceptor that verifies client certificates
/// against it.
pub(super) struct Trust {
    pub(super) front: Arc<FrontProxy>,
    pub(super) acceptor: tokio_rustls::TlsAcceptor,
}

impl Trust {
    pub(super) fn new(front: FrontProxy, serving: &serving::Serving) -> Result<Self, ProxyError> {
        let tls = tls_config(&front, serving)?;
        Ok(Self {
            front: Arc::new(front),
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(tls)),
        })
    }
}

/// Follows the API server's front-proxy ConfigMap for the rest of the serving term, renews the
/// serving certificate when it is due, and publishes each changed trust. A ConfigMap that
/// cannot be used keeps the last good trust (and says why in the log), so a bad edit never
/// locks the API server out; a watch error is retried with backoff.
pub(super) async fn follow_trust(
    configmaps: Api<ConfigMap>,
    mut renewal: Renewal<'_>,
    trust: watch::Sender<Arc<Trust>>,
) {
    let config = watcher::Config::default().fields(&format!("metadata.name={AUTH_CONFIGMAP}"));
    let mut events = std::pin::pin!(
        watcher::watcher(configmaps, config)
            .default_backoff()
            .applied_objects()
    );
    loop {
        let event = tokio::select! {
            e = events.next() => match e {
                Some(e) => e,
                None => break,
            },
            () = renewal.due() => {
                match renewal.renew().await {
                    // NB: the front is cloned out first: a `borrow()` held across `send_replace`
                    // deadlocks the watch channel (and with it this task's accept loop).
                    Ok(next) => match Trust::new(current_front(&trust), &next.serving) {
                        Ok(t) => {
                            info!("New connections are served the renewed certificate");
                            trust.send_replace(Arc::new(t));
                        }
                        Err(e) => error!(error = &e as &dyn std::error::Error, "Cannot serve the renewed certificate"),
                    },
                    // NB: no sleep here: the front-proxy watch goes on while the retry waits.
                    Err(e) => error!(error = &e as &dyn std::error::Error, "Cannot renew the proxy serving certificate; retrying in 1 min"),
                }
                continue;
            }
        };
        let cm = match event {
            Ok(cm) => cm,
            Err(e) => {
                warn!(
                    error = &e as &dyn std::error::Error,
                    "Cannot watch {AUTH_NAMESPACE}/{AUTH_CONFIGMAP}; retrying"
                );
                continue;
            }
        };
        let next = match FrontProxy::from_configmap(&cm) {
            Ok(front) if front == *trust.borrow().front => continue,
            Ok(front) => Trust::new(front, &renewal.stored.serving),
            Err(e) => Err(e.into()),
        };
        match next {
            Ok(next) => {
                info!("The API server's front-proxy trust changed; new connections are verified against it");
                trust.send_replace(Arc::new(next));
            }
            Err(e) => error!(
                error = &e as &dyn std::error::Error,
                "The API server's front-proxy trust changed to one that cannot be used; keeping the previous one"
            ),
        }
    }
    std::future::pending::<()>().await;
}

fn current_front(trust: &watch::Sender<Arc<Trust>>) -> FrontProxy {
    (*trust.borrow().front).clone()
}

fn tls_config(front: &FrontProxy, s: &serving::Serving) -> Result<rustls::ServerConfig, ProxyError> {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
    let tls = |e: &dyn std::fmt::Display| ProxyError::Tls(e.to_string());
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(s.cert.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| tls(&e))?;
    let key = PrivateKeyDer::from_pem_slice(s.key.as_bytes()).map_err(|e| tls(&e))?;
    let mut config =
        rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| tls(&e))?
            .with_client_cert_verifier(front.verifier()?)
            .with_single_cert(certs, key)
            .map_err(|e| tls(&e))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}
