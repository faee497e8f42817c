//! How long a refusal may be the API server's caches catching up rather than a real "no".
//! A bootstrap token used moments after its Secret was created can get 401 (the authenticator
//! reads Secrets from an informer), and a credential used moments after its Role was bound can
//! get 403 (the authorizer's cache lags under load). Both are retried for a bounded time from
//! the first refusal in a row; any other outcome starts the count again.

use std::time::Duration;

// NB: tokio's clock, so that a test with paused time sees a window pass.
use tokio::time::Instant;

/// How long 401s of a join token are taken for a token the API server has not seen yet.
pub const TOKEN_SETTLE: Duration = Duration::from_secs(15);
/// How long 403s are taken for RBAC still on its way rather than a revoked identity.
pub const RBAC_SETTLE: Duration = Duration::from_secs(30);

/// Tolerates one HTTP status for a bounded time from its first occurrence in a row.
#[derive(Debug)]
pub struct Settle {
    code: u16,
    window: Duration,
    since: Option<Instant>,
}

impl Settle {
    /// 401s of a fresh join token.
    pub fn unauthorized() -> Self {
        Self::new(401, TOKEN_SETTLE)
    }

    /// 403s of a freshly granted identity.
    pub fn forbidden() -> Self {
        Self::new(403, RBAC_SETTLE)
    }

    /// Tolerates `code` for `window`.
    pub fn new(code: u16, window: Duration) -> Self {
        Self {
            code,
            window,
            since: None,
        }
    }

    /// Whether `e` is a refusal to retry; any other outcome starts the count again.
    pub fn tolerate(&mut self, e: &kube::Error) -> bool {
        self.tolerate_at(e, Instant::now())
    }

    /// As `tolerate`, at `now`.
    pub fn tolerate_at(&mut self, e: &kube::Error, now: Instant) -> bool {
        match e {
            kube::Error::Api(s) if s.code == self.code => {
                now.saturating_duration_since(*self.since.get_or_insert(now)) < self.window
            }
            _ => {
                self.since = None;
                false
            }
        }
    }

    /// A call succeeded.
    pub fn clear(&mut self) {
        self.since = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16) -> kube::Error {
        kube::Error::Api(kube::core::Status::failure("x", "y").with_code(code).boxed())
    }

    #[test]
    fn a_refusal_is_tolerated_only_within_its_window_from_the_first_in_a_row() {
        for (mut s, code, window) in [
            (Settle::forbidden(), 403, RBAC_SETTLE),
            (Settle::unauthorized(), 401, TOKEN_SETTLE),
        ] {
            let t0 = Instant::now();
            assert!(s.tolerate_at(&status(code), t0));
            assert!(s.tolerate_at(&status(code), t0 + window / 2));
            assert!(
                !s.tolerate_at(&status(code), t0 + window),
                "{code} past its window"
            );
            assert!(
                !s.tolerate_at(&status(500), t0 + window),
                "other errors are not tolerated"
            );
            assert!(
                s.tolerate_at(&status(code), t0 + window * 2),
                "the count starts again"
            );
            let other = if code == 401 { 403 } else { 401 };
            assert!(!s.tolerate_at(&status(other), t0 + window * 2));
        }
    }
}
