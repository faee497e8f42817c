//! The proxy's shared serving certificate (a Secret in the leader's namespace): read, or made
//! by whichever replica leads first, and renewed from the same CA during a serving term.

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use tracing::info;

use super::{ProxyError, ProxyOptions, api, serving};
use crate::metrics::Metrics;

/// The shared serving certificate: read, or made by whichever replica leads first; replaced
/// when it is due (see `serving::is_due`) before this term serves it.
pub(super) async fn ensure_serving(
    secrets: &Api<Secret>,
    opts: &ProxyOptions,
) -> Result<serving::Stored, ProxyError> {
    let found = secrets
        .get_opt(&opts.secret)
        .await
        .map_err(api("read the proxy serving Secret"))?;
    match found {
        Some(s) => match serving::from_secret(&s) {
            Some(stored) if !serving::is_due(&stored, time::OffsetDateTime::now_utc()) => Ok(stored),
            Some(stored) => renew(secrets, opts, &s, &stored).await,
            None => Err(ProxyError::Tls(format!(
                "Secret {} is incomplete (tls.crt, tls.key, ca.crt): delete it and the leader makes a new one",
                opts.secret
            ))),
        },
        None => {
            let made = serving::next(None, &dns(opts), opts.cert_validity)
                .map_err(|e| ProxyError::Tls(e.to_string()))?;
            match secrets
                .create(
                    &PostParams::default(),
                    &serving::secret(&opts.namespace, &opts.secret, &made),
                )
                .await
            {
                Ok(_) => {
                    info!(secret = %opts.secret, "Created the proxy serving certificate");
                    Ok(made)
                }
                Err(kube::Error::Api(e)) if e.code == 409 => read_serving(secrets, opts).await,
                Err(e) => Err(ProxyError::Api {
                    op: "create the proxy serving Secret",
                    source: e,
                }),
            }
        }
    }
}

fn dns(opts: &ProxyOptions) -> String {
    serving::service_dns(&opts.namespace, &opts.service)
}

async fn read_serving(secrets: &Api<Secret>, opts: &ProxyOptions) -> Result<serving::Stored, ProxyError> {
    let s = secrets
        .get(&opts.secret)
        .await
        .map_err(api("read the proxy serving Secret"))?;
    serving::from_secret(&s).ok_or_else(|| ProxyError::Tls(format!("Secret {} is incomplete", opts.secret)))
}

/// Replaces the Secret `current` (holding `stored`) with the next certificate, from the same
/// CA when its key is kept. The write is conditional on `current`'s resourceVersion: when
/// another replica renewed first, its certificate is the one used.
async fn renew(
    secrets: &Api<Secret>,
    opts: &ProxyOptions,
    current: &Secret,
    stored: &serving::Stored,
) -> Result<serving::Stored, ProxyError> {
    let made = serving::next(Some(stored), &dns(opts), opts.cert_validity)
        .map_err(|e| ProxyError::Tls(e.to_string()))?;
    let mut secret = serving::secret(&opts.namespace, &opts.secret, &made);
    secret.metadata.resource_version = current.resource_version();
    match secrets
        .replace(&opts.secret, &PostParams::default(), &secret)
        .await
    {
        Ok(_) => {
            let ca = if made.serving.ca == stored.serving.ca {
                "same CA"
            } else {
                "new CA"
            };
            info!(secret = %opts.secret, ca, "Renewed the proxy serving certificate");
            Ok(made)
        }
        Err(kube::Error::Api(e)) if e.code == 409 => read_serving(secrets, opts).await,
        Err(e) => Err(ProxyError::Api {
            op: "renew the proxy serving certificate (update its Secret)",
            source: e,
        }),
    }
}

/// What renewing the serving certificate during a term needs.
pub(super) struct Renewal<'a> {
    pub(super) secrets: Api<Secret>,
    pub(super) opts: &'a ProxyOptions,
    pub(super) stored: serving::Stored,
    pub(super) metrics: Metrics,
    /// When to try again after a failed renewal.
    pub(super) retry: Option<tokio::time::Instant>,
}

/// How long a failed renewal waits before the next try.
const RENEW_RETRY: Duration = Duration::from_secs(60);

impl Renewal<'_> {
    /// Waits until the certificate served is due, or until a failed renewal is tried again.
    pub(super) async fn due(&self) {
        if let Some(at) = self.retry {
            return tokio::time::sleep_until(at).await;
        }
        let now = time::OffsetDateTime::now_utc();
        let wait = serving::renew_at(&self.stored.serving.cert)
            .map(|at| (at - now).max(time::Duration::ZERO))
            .unwrap_or(time::Duration::ZERO);
        tokio::time::sleep(wait.try_into().unwrap_or(Duration::ZERO)).await;
    }

    /// Renews the certificate (same CA), unless another replica did; what to serve from now on.
    /// A failure is counted and tried again after [`RENEW_RETRY`].
    pub(super) async fn renew(&mut self) -> Result<serving::Stored, ProxyError> {
        match self.next().await {
            Ok(next) => {
                self.retry = None;
                self.metrics.proxy_cert_renewal("renewed");
                self.metrics
                    .set_proxy_cert_expiry(serving::expires_at(&next.serving.cert).unwrap_or(0));
                self.stored = next.clone();
                Ok(next)
            }
            Err(e) => {
                self.retry = Some(tokio::time::Instant::now() + RENEW_RETRY);
                self.metrics.proxy_cert_renewal("failed");
                Err(e)
            }
        }
    }

    async fn next(&self) -> Result<serving::Stored, ProxyError> {
        let next = ensure_serving(&self.secrets, self.opts).await?;
        // NB: a new CA (someone replaced the Secret by hand) is served only once the APIService
        // trusts it; the leaf of the same CA is trusted already.
        if next.serving.ca != self.stored.serving.ca {
            return Err(ProxyError::Tls(format!(
                "Secret {} now holds another CA; the next leadership term serves it",
                self.opts.secret
            )));
        }
        Ok(next)
    }
}
