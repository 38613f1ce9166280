//! The Sluice control plane, shared by hosts and the gateway.
//!
//! What it owns, and why here:
//! - [`subjects`]: every NATS subject, stream, bucket and key name, built by
//!   functions in one place, so the two sides cannot drift apart.
//! - [`messages`]: what travels: heartbeats (with each host's deployment
//!   status), the desired deployments of a host group, and meter records.
//! - [`auth`]: who may publish and read what on NATS (per-user subject
//!   permissions built from the same names), and how clients authenticate.
//! - [`Bus`]: the operations the two sides need, behind one trait, with
//!   [`NatsBus`] (JetStream: a KV bucket for desired state, an object store
//!   for modules, a stream for meters) for clusters and [`LocalBus`]
//!   (in-process channels) for `sluice dev` and unit tests.

pub mod auth;
pub mod bus;
pub mod local;
pub mod messages;
pub mod nats;
pub mod subjects;

pub use auth::{HostIdentity, NatsAuth, Permissions};
pub use bus::{Bus, BusError, FromHost, MeterDelivery};
pub use local::LocalBus;
pub use messages::{
    DeploymentSpec, DeploymentStatus, DesiredSet, EventBatch, Heartbeat, HostState, MeterRecord, MeterSums, ModuleRef,
    NfEvent, NfLimitsSpec, NfPlacement, now_ms,
};
pub use nats::{NatsBus, Role};
pub use subjects::{NameError, Names};

/// Resolves on SIGINT or SIGTERM: how every Sluice daemon is told to stop
/// (it then flushes meters and finishes requests).
pub async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}
