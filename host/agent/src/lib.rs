//! The cluster side of a Sluice host (`sluice-host serve`, and the host
//! half of `sluice dev`).
//!
//! What it owns, and why here: joining a host group over the control
//! [`Bus`](sluice_control::Bus) (heartbeats carrying each deployment's
//! status), converging on the group's desired deployments (fetching modules
//! by digest, compiling them once, hot-swapping NFs on updates), feeding
//! them traffic, and turning the runtime's per-invocation meters into meter
//! records per window, published through a crash-safe outbox. The packet
//! path itself is `sluice-runtime`'s; this crate only schedules it.
//!
//! Traffic comes from live ports ([`serve_live`], `sluice-host serve
//! --dpdk`: the host's workers run every deployment, each packet going to
//! the deployment whose traffic attachment claims it; see [`live`]) or,
//! for development, from pcap files: replayed from a file
//! (`Input::Replay`, e.g. for load tests) or picked up from a spool
//! directory (`Input::Spool`; a capture moves to `done/` once every
//! deployment has finished it). A deployment with attachments gets its
//! share of a capture, one without (a development deployment) all of it.
//! Forwarded packets of captures go to one capture per deployment under
//! `output`, if set. A killed host resumes every deployment where its
//! [`journal`] says it was, and bills exactly the output it kept.

mod config;
mod converge;
pub mod deployment;
mod error;
mod heartbeat;
pub mod journal;
pub mod live;
pub mod outbox;
mod peer;
pub mod prepare;
pub mod probes;
pub mod report;
pub mod retry;
mod serve;
pub mod shared;
mod spool;

pub use config::{AgentConfig, Input, PeerConfig};
pub use error::AgentError;
pub use live::LiveInput;
pub use serve::{serve, serve_live};
