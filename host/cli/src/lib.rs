//! The Sluice host as a library: configuration, `run` over pcap files,
//! reports, and synthetic traces. The `sluice-host` binary is a thin CLI
//! over this.

pub mod beacon;
pub mod chain;
pub mod config;
#[cfg(feature = "dpdk")]
pub mod dpdk;
pub mod report;
pub mod run;
#[cfg(feature = "dpdk")]
pub mod steer;
pub mod synth;
pub mod traffic;

pub use config::{ConfigError, HostConfig};
pub use report::Report;
pub use run::{RunError, RunOptions, run, run_observed, write_report};
