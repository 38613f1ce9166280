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
    DeploymentSpec, DeploymentStatus, DesiredSet, Durability, EventBatch, Heartbeat, HostState, MeterRecord, Meters,
    ModuleRef, NfEvent, NfLimitsSpec, NfPlacement, now_ms,
};
pub use nats::{NatsBus, Role};
pub use sluice_group::{Member, OwnershipTable};
pub use subjects::{NameError, Names};

/// Resolves on SIGINT or SIGTERM: how every Sluice daemon is told to stop
/// (it then flushes meters and finishes requests). The handlers are
/// installed when this is called (inside a Tokio runtime), so a signal that
/// arrives while the daemon is still starting is not lost (nor fatal).
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::{SignalKind, signal};
    let term = signal(SignalKind::terminate()).ok();
    let int = signal(SignalKind::interrupt()).ok();
    async move {
        let wait = |s: Option<tokio::signal::unix::Signal>| async move {
            match s {
                Some(mut s) => {
                    s.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = wait(term) => {}
            _ = wait(int) => {}
        }
    }
}
