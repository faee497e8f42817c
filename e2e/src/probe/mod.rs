//! Reading processes and metrics for the benchmarks: /proc (`procfs`) and Prometheus text
//! (`prom`).

pub mod procfs;
pub mod prom;
