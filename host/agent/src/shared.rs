//! What the agent shares with the threads that run its deployments (a
//! deployment's own thread, or a live host's workers): the engine, where
//! checkpoints and meter records go, the statuses heartbeats report and
//! the host report.

use crate::probes::Vitals;
use crate::report::AgentReport;
use crate::retry::Retries;
use parking_lot::Mutex;
use sluice_control::{DeploymentSpec, DeploymentStatus, EventBatch, HostState, MeterRecord};
use sluice_runtime::{NfLimits, Runtime};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// What a deployment thread shares with the agent.
#[derive(Clone)]
pub struct Shared {
    /// Engine.
    pub runtime: Arc<Runtime>,
    /// Host id (meter records name it).
    pub host: String,
    /// Checkpoints of deployments.
    pub journal: Arc<crate::journal::Journal>,
    /// Meter records not yet published.
    pub outbox_dir: PathBuf,
    /// Where each deployment writes its forwarded packets
    /// (`<dir>/<deployment>.pcap`), if anywhere.
    pub output_dir: Option<PathBuf>,
    /// The spool directory, if traffic comes from one.
    pub spool_dir: Option<PathBuf>,
    /// Tells the agent a deployment finished a spool capture.
    pub finished: mpsc::UnboundedSender<(String, String)>,
    /// Packets per NF call.
    pub batch_size: usize,
    /// Host default limits.
    pub limits: NfLimits,
    /// Caps for the NFs of a name (`[nf.<name>]` host sections).
    pub nf_caps: BTreeMap<String, NfLimits>,
    /// Meter window.
    pub window: Duration,
    /// Packets per second to replay at (none: as fast as possible).
    pub pps: Option<u64>,
    /// Statuses, reported by heartbeats.
    pub status: Arc<Mutex<BTreeMap<String, DeploymentStatus>>>,
    /// The host report.
    pub report: Arc<Mutex<AgentReport>>,
    /// To the meter publisher.
    pub meters: mpsc::UnboundedSender<MeterRecord>,
    /// To the event publisher.
    pub events: mpsc::UnboundedSender<EventBatch>,
    /// Pokes the heartbeat task after a status change.
    pub changed: Arc<tokio::sync::Notify>,
    /// Cores deployment threads are pinned to.
    pub cores: sluice_engine::cores::CorePool,
    /// CPU shares of the tenants on each core.
    pub fair: sluice_engine::FairShare,
    /// Whether deployments share live workers: a deployment may then ask
    /// for a shorter CPU deadline than the host's, never a longer one (a
    /// batch holds the worker every tenant on it waits for).
    pub live: bool,
    /// Workers a deployment runs on (live hosts: every worker; otherwise
    /// one): the owners of its single-writer tables.
    pub workers: usize,
    /// Deployments whose start failed, retried with back-off.
    pub retries: Retries,
    /// Peer state with the group's other hosts (live hosts that replicate).
    pub peer: Option<Arc<sluice_peer::Peer>>,
    /// What the control loop says about itself (the probes read it).
    pub vitals: Arc<Vitals>,
}

impl Shared {
    /// Records how a deployment is doing on this host (keeping its packet
    /// count), and pokes the heartbeat.
    pub fn set_status(&self, spec: &DeploymentSpec, state: HostState, reason: Option<String>) {
        let mut map = self.status.lock();
        let packets = map.get(&spec.id).map(|s| s.packets).unwrap_or(0);
        map.insert(
            spec.id.clone(),
            DeploymentStatus {
                deployment: spec.id.clone(),
                revision: spec.revision,
                state,
                reason,
                packets,
                digest: Some(spec.digest()),
            },
        );
        drop(map);
        self.changed.notify_one();
    }

    /// Forgets a removed deployment: its status, its retries and its part
    /// of the host report.
    pub fn forget(&self, id: &str) {
        self.status.lock().remove(id);
        self.retries.forget(id);
        self.report.lock().deployments.remove(id);
    }
}
