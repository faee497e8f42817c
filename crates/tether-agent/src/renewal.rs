//! Credential renewal: a new token of the member's ServiceAccount on the leader (one
//! TokenRequest with the current credential) when a third of its lifetime is left, jittered so
//! that credentials issued together drift apart. A rejected credential ends the loop so the
//! session gets a new one by proving the member's key; other failures are retried every 10 s.

use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec, TokenRequestStatus};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, PostParams};
use rand::Rng;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::endpoint::LeaderEndpoint;
use crate::state::{self, Stored};
use crate::status::StatusSink;
use crate::view::time;
use crate::{Error, Metrics};

/// How long to wait at `now` before renewing `stored`: until a third of its lifetime is left,
/// less up to a tenth of that at random (so that credentials issued together, e.g. in a mass
/// rejoin, drift apart), and never less than 5 s.
pub fn renewal_delay(stored: &Stored, now: Timestamp) -> Duration {
    let remaining = stored
        .expiry()
        .map(|e| (e - now).get_seconds().max(0) as u64)
        .unwrap_or(0);
    let third = Duration::from_secs(stored.ttl_seconds.max(0) as u64 / 3);
    let left = third.mul_f64(rand::rng().random_range(0.9..=1.0));
    Duration::from_secs(remaining)
        .saturating_sub(left)
        .max(Duration::from_secs(5))
}

/// Asks the leader for a new token of `stored`'s ServiceAccount with the same lifetime (one
/// TokenRequest, with the current credential); `None` if the answer carried no token.
pub async fn request_token(
    api: &Api<ServiceAccount>,
    stored: &Stored,
) -> Result<Option<TokenRequestStatus>, kube::Error> {
    let req = TokenRequest {
        spec: TokenRequestSpec {
            expiration_seconds: Some(stored.ttl_seconds),
            ..TokenRequestSpec::default()
        },
        ..TokenRequest::default()
    };
    let t = api
        .create_token_request(&stored.credential.service_account, &PostParams::default(), &req)
        .await?;
    Ok(t.status)
}

/// Where a renewed credential is kept: the agent's Secret in its namespace of the member.
pub(crate) struct Keep<'a> {
    /// The member cluster.
    pub client: &'a Client,
    /// The agent's namespace there.
    pub namespace: &'a str,
    /// The agent's metrics.
    pub metrics: &'a Metrics,
}

/// Renews the credential before it expires, until the leader rejects it: stores each new one
/// (`keep`) and hands the other loops a client with it.
pub(crate) async fn run(
    keep: Keep<'_>,
    sink: &StatusSink,
    leader: &LeaderEndpoint,
    mut stored: Stored,
    client_tx: watch::Sender<Client>,
) -> Result<(), Error> {
    loop {
        keep.metrics.set_credential_expiry(stored.expiry());
        tokio::time::sleep(renewal_delay(&stored, Timestamp::now())).await;
        let api = Api::<ServiceAccount>::namespaced(client_tx.borrow().clone(), &stored.credential.namespace);
        match request_token(&api, &stored).await {
            Ok(t) => {
                let Some(status) = t else { continue };
                stored.credential.token = status.token;
                stored.credential.expiration_timestamp = status.expiration_timestamp.0.to_string();
                state::store_credential(keep.client, keep.namespace, &stored).await?;
                client_tx.send_replace(leader.client(Some(&stored.credential.token))?);
                keep.metrics.renewal(true);
                info!(expires = %stored.credential.expiration_timestamp, "Credential renewed");
                let exp = stored.expiry().map(time);
                sink.update(move |v| v.membership.credential_expiry = exp);
            }
            Err(e) => {
                keep.metrics.renewal(false);
                let err = Error::rejected("renew credential", e);
                if matches!(err, Error::CredentialRejected(_)) {
                    return Err(err);
                }
                warn!(
                    error = &err as &dyn std::error::Error,
                    "Credential renewal failed; retrying"
                );
                tokio::time::sleep(Duration::from_secs(10)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::SignedDuration;
    use tether_seal::MemberCredential;

    fn stored(expires: &str, ttl_seconds: i64) -> Stored {
        Stored {
            credential: MemberCredential {
                token: "t".into(),
                expiration_timestamp: expires.into(),
                namespace: "ns".into(),
                service_account: "sa".into(),
                ca_cert: String::new(),
            },
            ttl_seconds,
        }
    }

    #[test]
    fn renews_with_a_third_of_the_lifetime_left_less_a_little_jitter() {
        let now: Timestamp = "2026-12-02T00:00:00Z".parse().expect("time");
        let fresh = stored(&(now + SignedDuration::from_secs(600)).to_string(), 600);
        let delays: Vec<u64> = (0..200).map(|_| renewal_delay(&fresh, now).as_secs()).collect();
        // A third of 600 s is 200 s, less up to 20 s: renew 400–420 s after issue.
        assert!(delays.iter().all(|d| (400..=420).contains(d)), "{delays:?}");
        assert!(delays.iter().any(|d| *d != delays[0]), "jittered: {delays:?}");
    }

    #[test]
    fn an_almost_expired_or_unreadable_credential_is_renewed_after_five_seconds() {
        let now: Timestamp = "2026-12-02T00:00:00Z".parse().expect("time");
        let late = stored(&(now + SignedDuration::from_secs(30)).to_string(), 600);
        assert_eq!(renewal_delay(&late, now), Duration::from_secs(5));
        let past = stored(&(now - SignedDuration::from_secs(30)).to_string(), 600);
        assert_eq!(renewal_delay(&past, now), Duration::from_secs(5));
        assert_eq!(
            renewal_delay(&stored("not a time", 600), now),
            Duration::from_secs(5)
        );
    }

    use crate::testing::{self, count, failure};
    use serde_json::json;
    use tether_join::discovery::Trust;

    const TOKEN: &str = "POST /api/v1/namespaces/ns/serviceaccounts/sa/token";
    const SECRET: &str = "PATCH /api/v1/namespaces/tether-system/secrets/";

    fn issued(n: usize) -> (u16, serde_json::Value) {
        let expires = Timestamp::now() + SignedDuration::from_secs(600);
        (
            201,
            json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                   "metadata": {"name": "sa", "namespace": "ns"}, "spec": {"audiences": []},
                   "status": {"token": format!("t{n}"), "expirationTimestamp": expires.to_string()}}),
        )
    }

    /// Runs the renewal of a 600 s credential with 230 s left against `leader` for `secs` of
    /// (paused) time: its result if it ended, the calls the member saw, and the newest leader
    /// client. NB: the delay reads the wall clock, which paused time does not move: each wait is
    /// 30–50 s.
    async fn renew_for(
        leader: Client,
        secs: u64,
    ) -> (Option<Result<(), Error>>, testing::Calls, watch::Receiver<Client>) {
        let (member, member_calls) = testing::client(|_, _, _| {
            (
                200,
                json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "c", "namespace": "tether-system"}}),
            )
        });
        let (sink, _owner, _) = testing::sink(false);
        let (tx, rx) = watch::channel(leader);
        let endpoint = LeaderEndpoint {
            url: "https://127.0.0.1:9".into(),
            trust: Trust::Insecure,
        };
        let metrics = Metrics::default();
        let keep = Keep {
            client: &member,
            namespace: "tether-system",
            metrics: &metrics,
        };
        let expires = Timestamp::now() + SignedDuration::from_secs(230);
        let fresh = stored(&expires.to_string(), 600);
        let ended = tokio::time::timeout(Duration::from_secs(secs), run(keep, &sink, &endpoint, fresh, tx))
            .await
            .ok();
        (ended, member_calls, rx)
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_renewal_is_retried_after_10_s_and_the_new_token_is_kept_and_used() {
        let (leader, calls) = testing::client(|_, _, n| if n == 0 { failure(503) } else { issued(n) });
        // Due after 30–50 s; the failure waits 10 s and the delay again; the renewed one is due
        // 400 s later.
        let (ended, member, rx) = renew_for(leader, 150).await;
        assert!(ended.is_none(), "still renewing: {ended:?}");
        assert_eq!(count(&calls, TOKEN), 2);
        assert_eq!(count(&member, SECRET), 1, "the renewed credential is stored once");
        // The loops got a client of the leader's URL with the new token, not the old client.
        let newest = rx.borrow().clone();
        let _ = newest.apiserver_version().await;
        assert_eq!(count(&calls, ""), 2, "the old client was replaced");
    }

    #[tokio::test(start_paused = true)]
    async fn a_rejected_credential_ends_the_renewal_and_nothing_is_stored() {
        let (leader, calls) = testing::client(|_, _, _| failure(401));
        let (ended, member, _) = renew_for(leader, 150).await;
        assert!(
            matches!(ended, Some(Err(Error::CredentialRejected(_)))),
            "{ended:?}"
        );
        assert_eq!(count(&calls, TOKEN), 1);
        assert_eq!(count(&member, SECRET), 0);
    }
}
