//! What every Tether controller process needs, so that the leader and the agent start, log,
//! elect a leader, report health and stop the same way: the common flags, JSON or plain logs,
//! an admin HTTP port (`/metrics`, `/livez`, `/readyz`), SIGTERM handling, Lease election, a
//! warning when the process itself ran late, and watches whose consumers only ever see objects
//! already cached.

pub mod admin;
pub mod leadership;
pub mod logging;
pub mod signals;
pub mod stall;
pub mod streams;

use std::net::SocketAddr;

/// Flags every controller process takes.
#[derive(clap::Args, Clone, Debug)]
pub struct ProcessArgs {
    /// Address of the admin HTTP server (/metrics, /livez, /readyz).
    #[arg(long, env = "TETHER_ADMIN_ADDR", default_value = "0.0.0.0:8080")]
    pub admin_addr: SocketAddr,
    /// Log format: json for machines, plain for people.
    #[arg(long, env = "TETHER_LOG_FORMAT", value_enum, default_value_t = logging::LogFormat::Json)]
    pub log_format: logging::LogFormat,
    /// Log filter, e.g. `info` or `info,tether_leader=debug` (RUST_LOG syntax).
    #[arg(long, env = "TETHER_LOG_LEVEL", default_value = "info")]
    pub log_level: String,
    /// Elect one active replica through a Lease; off only for a single replica.
    #[arg(long, env = "TETHER_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    /// Namespace of the Lease (in a pod: its own namespace).
    #[arg(long, env = "POD_NAMESPACE", default_value = "tether-system")]
    pub lease_namespace: String,
    /// This replica's identity in the Lease (in a pod: its name).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// Seconds a Lease stays valid without renewal; a failed leader is replaced after this.
    #[arg(long, env = "TETHER_LEASE_DURATION", default_value_t = 15, value_parser = clap::value_parser!(u64).range(2..=300))]
    pub lease_duration: u64,
}
