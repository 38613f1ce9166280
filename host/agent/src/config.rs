//! How the agent runs: where its traffic comes from, its host and group,
//! its state directory, the engine's settings and limits, peer state.

use crate::error::AgentError;
use sluice_runtime::{NfLimits, RuntimeConfig};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where traffic comes from.
#[derive(Debug, Clone)]
pub enum Input {
    /// No traffic (deployments start and idle).
    None,
    /// Replay a capture through every deployment when it starts, `loops`
    /// times (0: forever).
    Replay {
        /// The capture.
        path: PathBuf,
        /// Passes.
        loops: u32,
    },
    /// Watch a directory; each capture put there (write it elsewhere and
    /// rename it in) goes through every running deployment, then moves to
    /// `done/` (or `failed/` with the reason next to it).
    Spool {
        /// The directory.
        dir: PathBuf,
    },
}

/// How the agent runs.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// Host id (unique in the cluster; `[A-Za-z0-9_-]`).
    pub host: String,
    /// Host group it serves.
    pub group: String,
    /// Traffic.
    pub input: Input,
    /// Replay rate limit, packets per second.
    pub pps: Option<u64>,
    /// Meter window.
    pub window: Duration,
    /// Heartbeat interval.
    pub heartbeat: Duration,
    /// Packets per second this host can take, declared to the group
    /// controller (the weight of its share of the group's flows; 0: not
    /// declared, the controller assumes its default).
    pub capacity_pps: u64,
    /// Module cache and meter outbox.
    pub state_dir: PathBuf,
    /// Where to write the host's own report (updated as it goes).
    pub report: Option<PathBuf>,
    /// Where each deployment writes the packets it forwards
    /// (`<dir>/<deployment>.pcap`, appended across restarts).
    pub output: Option<PathBuf>,
    /// Engine settings.
    pub runtime: RuntimeConfig,
    /// Packets per NF call.
    pub batch_size: usize,
    /// Default NF limits (a deployment may override some).
    pub limits: NfLimits,
    /// Caps for the NFs of a name, whatever their deployment asks
    /// (the host config's `[nf.<name>]` sections).
    pub nf_caps: BTreeMap<String, NfLimits>,
    /// Cores deployment threads are pinned to: each takes the core fewest
    /// others hold.
    pub cores: sluice_engine::cores::CoreList,
    /// Peer state with the group's other hosts (live hosts only; none:
    /// flows are not replicated).
    pub peer: Option<PeerConfig>,
    /// Where to serve `/metrics`, `/healthz` and `/readyz` (none: nowhere).
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// The process's Prometheus registry, rendered at `/metrics`.
    pub prometheus: Option<sluice_telemetry::Prometheus>,
}

impl AgentConfig {
    /// Refuses a host or group id that is not a subject token, and a batch
    /// size out of range.
    pub(crate) fn check(&self) -> Result<(), AgentError> {
        sluice_control::subjects::check_token("host", &self.host).map_err(|e| AgentError::Config(e.to_string()))?;
        sluice_control::subjects::check_token("group", &self.group).map_err(|e| AgentError::Config(e.to_string()))?;
        if self.batch_size == 0 || self.batch_size > 4096 {
            return Err(AgentError::Config(format!("batch size {} is out of range 1..=4096", self.batch_size)));
        }
        Ok(())
    }

    /// The spool directory, if traffic comes from one.
    pub(crate) fn spool_dir(&self) -> Option<&Path> {
        match &self.input {
            Input::Spool { dir } => Some(dir.as_path()),
            _ => None,
        }
    }
}

/// How a live host replicates its flows' state to its group's other hosts.
#[derive(Debug, Clone)]
pub struct PeerConfig {
    /// How often a worker sends the state of the flows it touched. Keep it
    /// under half the dispatcher's flowlet gap: a flow then moves only
    /// after its last update was sent.
    pub interval: Duration,
    /// Replicas kept for peers, at most.
    pub max_flows: usize,
    /// Bytes of replicas kept for peers, at most.
    pub max_bytes: usize,
    /// A replica not refreshed for this long is dropped (its flow went
    /// idle on its owner).
    pub lifetime: Duration,
    /// How often the group's ownership table is read.
    pub table_poll: Duration,
    /// How long the packets of a flow moved here without its state wait
    /// for it from the host that had it (then they run without it).
    pub pull_wait: Duration,
    /// Where this host receives its group's peer-link datagrams (a pull's
    /// request and answer, probes; see `sluice_peer::link`): an address
    /// its peers reach it at, port 0 for any free one. `None`: those
    /// messages take the bus like the rest.
    pub link: Option<std::net::SocketAddr>,
}

impl Default for PeerConfig {
    fn default() -> Self {
        PeerConfig {
            interval: Duration::from_millis(1),
            max_flows: 1 << 20,
            max_bytes: 256 << 20,
            lifetime: Duration::from_secs(120),
            table_poll: Duration::from_millis(100),
            pull_wait: Duration::from_millis(5),
            link: None,
        }
    }
}
