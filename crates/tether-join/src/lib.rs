//! The join contract between the leader, the agent, the CLI and the tests, each part with one
//! owner: the CA pin (`pin`), the discovery ConfigMap and how a joiner trusts the leader
//! (`discovery`, `verifier`), join tokens, the join group and the join RBAC (`token`), how
//! requests to the leader are retried (`retry`), and how long a fresh token or grant may be
//! refused while the API server's caches catch up (`settle`).

pub mod discovery;
pub mod pin;
pub mod retry;
pub mod settle;
pub mod token;
pub mod verifier;

pub use discovery::{DiscoveryError, Trust};
pub use pin::CaPin;
pub use token::BootstrapToken;
