//! Join tokens for tests that act as a joining member, made by the production builder
//! (`tether_join::BootstrapToken::secret`), so the tests exercise exactly what `tether init`
//! and `tether token create` create.

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, PostParams};
use tether_api::SetRef;
pub use tether_join::BootstrapToken;
use tether_join::token::TOKEN_NAMESPACE;

use crate::Error;

/// Creating a token's Secret in a cluster.
pub trait CreateToken {
    /// Creates the token Secret, in the join group of `set` when given, expiring at `expires`.
    fn create(
        &self,
        client: &Client,
        set: Option<&SetRef>,
        expires: Option<Timestamp>,
    ) -> impl std::future::Future<Output = Result<(), Error>> + Send;
}

impl CreateToken for BootstrapToken {
    async fn create(
        &self,
        client: &Client,
        set: Option<&SetRef>,
        expires: Option<Timestamp>,
    ) -> Result<(), Error> {
        Api::<Secret>::namespaced(client.clone(), TOKEN_NAMESPACE)
            .create(&PostParams::default(), &self.secret(set, expires))
            .await
            .map_err(|source| Error::Api {
                op: "create bootstrap token Secret".into(),
                source,
            })?;
        Ok(())
    }
}
