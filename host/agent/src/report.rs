//! The host's own account of what it processed, for comparison with what
//! the gateway bills (`sluice-host serve --report`).

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use sluice_control::{MeterRecord, Meters, now_ms};
use std::collections::BTreeMap;
use std::path::Path;

/// Sums of meter records.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Totals {
    /// The metered sums (inlined in the JSON); the gauges are the latest
    /// record's.
    #[serde(flatten)]
    pub sums: Meters,
    /// Records these sums came from.
    pub records: u64,
}

impl Totals {
    /// Adds a record.
    pub fn add(&mut self, r: &MeterRecord) {
        self.sums.add_later(&r.meters);
        self.records += 1;
    }
}

/// One deployment on this host.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeploymentReport {
    /// Deployment name.
    pub name: String,
    /// Tenant id.
    pub tenant: String,
    /// Packets that entered the chain.
    pub packets_in: u64,
    /// Packets that left it forwarded.
    pub packets_out: u64,
    /// Per `<nf>@<version>`: the sums of the meter records produced.
    pub nfs: BTreeMap<String, Totals>,
    /// Time its thread paused because its tenant was over its share of a
    /// core other tenants use, ms.
    #[serde(default)]
    pub paused_ms: u64,
    /// Packets of it a live host refused because its tenant was over its
    /// share of a worker other tenants' packets were waiting for.
    #[serde(default)]
    pub dropped_over_share: u64,
    /// The cores its thread was pinned to, as the OS reports them.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cores: String,
    /// What its chain decided without an NF: frames refused before any
    /// NF ran, later IP fragments that followed their first (or were
    /// dropped without it).
    #[serde(default)]
    pub chain: sluice_runtime::ChainCounters,
}

/// Everything this host process metered.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AgentReport {
    /// Host id.
    pub host: String,
    /// Boot id of the process.
    pub boot: String,
    /// Per deployment id.
    pub deployments: BTreeMap<String, DeploymentReport>,
    /// Traces read from the input (replays included).
    pub traces: u64,
    /// Packets no deployment's attachment claimed (live ports, spooled
    /// captures): handled by the host's unmatched policy, billed to nobody.
    #[serde(default)]
    pub unmatched: u64,
    /// Packets an NF sent to a port its deployment's attachments do not
    /// name (refused).
    #[serde(default)]
    pub refused_egress: u64,
    /// When this report was written, ms since the epoch (rates are
    /// differences of two reports over the difference of this).
    #[serde(default)]
    pub updated_ms: u64,
    /// Packets refused because their tenant was over its share of a live
    /// worker while others' packets waited.
    #[serde(default)]
    pub over_share: u64,
    /// Packets a deployment's attachments claim on a live worker where it
    /// is not running (starting, or its start failed): dropped.
    #[serde(default)]
    pub not_running: u64,
    /// Packets of deployments with `durability = "replicated"` dropped
    /// because their flow's changed state could not be sent to its next
    /// owner, or found no room to wait for it.
    #[serde(default)]
    pub uncommitted: u64,
    /// Live ports: device and per-worker queue counters.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<sluice_engine::PortReport>,
    /// Peer state with the other hosts of the group (live hosts that
    /// replicate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<sluice_peer::PeerCounters>,
    /// Live hosts in a group: each global eventual table merged over the
    /// group's hosts, by `<deployment>/<nf>/<table>` (its 16 largest values).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub global_tables: std::collections::BTreeMap<String, sluice_peer::GlobalTable>,
    /// With `--stage-times`: ns per packet in each stage of the live
    /// workers' batches (see `sluice_runtime::stages`), over all workers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stages: Option<sluice_runtime::StagesPerPacket>,
}

/// Writes the host report to `path` (if the host keeps one), stamped
/// with the time, atomically.
pub(crate) fn write(path: Option<&Path>, report: &Mutex<AgentReport>) {
    let Some(path) = path else { return };
    let json = {
        let mut r = report.lock();
        r.updated_ms = now_ms();
        serde_json::to_vec_pretty(&*r)
    };
    let tmp = path.with_extension("tmp");
    if let Err(e) = json
        .map_err(std::io::Error::other)
        .and_then(|b| std::fs::write(&tmp, b))
        .and_then(|()| std::fs::rename(&tmp, path))
    {
        tracing::warn!(path = %path.display(), "cannot write the host report: {e}");
    }
}
