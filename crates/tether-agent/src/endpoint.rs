//! The leader as this member reaches it: its URL and the trust established in its CA (the pin
//! checked at discovery, a CA bundle, or explicitly none). Every client of the leader the agent
//! makes (anonymous for rejoin, with the join token, with the member credential) comes from here.

use kube::Client;
use tether_join::discovery::{self, Trust};

use crate::Error;

/// Where and how the agent reaches its leader.
pub struct LeaderEndpoint {
    /// The leader's API server URL.
    pub url: String,
    /// How its serving certificate is verified.
    pub trust: Trust,
}

impl LeaderEndpoint {
    /// A client of the leader sending `token`, or no credentials at all.
    pub fn client(&self, token: Option<&str>) -> Result<Client, Error> {
        let config = discovery::leader_config(&self.url, &self.trust, token)?;
        discovery::leader_client(config).map_err(|source| Error::Leader {
            op: "build client",
            source,
        })
    }
}
