//! What travels between hosts and the gateway (JSON on the wire).

use serde::{Deserialize, Serialize};
pub use sluice_meters::Meters;
use std::collections::BTreeMap;

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// A module as a deployment names it: hosts fetch it by `digest`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModuleRef {
    /// Gateway id of the module.
    pub id: String,
    /// Module name given at upload.
    pub name: String,
    /// Module version given at upload.
    pub version: String,
    /// SHA-256 of the component, hex: the blob's name in the module store.
    pub digest: String,
    /// Size in bytes.
    pub size: u64,
}

/// Per-NF limits a deployment may set; unset ones take the host's defaults.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NfLimitsSpec {
    /// `fail-open` or `fail-closed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_policy: Option<String>,
    /// CPU deadline per batch, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<u64>,
    /// Memory cap, MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u64>,
    /// CPU deadline of instantiation plus `init` (and of re-creating an
    /// instance after a trap), ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_deadline_ms: Option<u64>,
    /// Fuel per batch call; 0 or unset: unlimited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fuel: Option<u64>,
    /// Most flows with state per worker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_flows: Option<u64>,
    /// Largest state value of one flow, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_flow_state_bytes: Option<u64>,
    /// State memory budget of the NF, MiB: each instance's own tables and
    /// per-flow state, and once more the NF's shared (global) tables on a
    /// host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_budget_mb: Option<u64>,
    /// Log lines per second per instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_lines_per_second: Option<u32>,
}

/// One NF of a deployed chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NfPlacement {
    /// Name of the NF in the chain (unique within the deployment).
    pub name: String,
    /// The component to run.
    pub module: ModuleRef,
    /// The NF's configuration, handed to its `init` verbatim.
    #[serde(default)]
    pub config: String,
    /// The NF that gets this one's forwarded packets; none: they leave.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
    /// Label → NF that gets packets this NF labels so.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<u16, String>,
    /// Limits.
    #[serde(default)]
    pub limits: NfLimitsSpec,
}

/// A deployment as hosts see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeploymentSpec {
    /// Gateway id.
    pub id: String,
    /// Owning tenant's id: meter records are billed to it.
    pub tenant: String,
    /// Name given by the tenant.
    pub name: String,
    /// Incremented on every update; hosts report the revision they run.
    pub revision: u64,
    /// The chain, in order (every route goes forward).
    pub nfs: Vec<NfPlacement>,
    /// The traffic that is this deployment's on each host of its group
    /// (ports, VLANs, destination prefixes); none: a development
    /// deployment, which sees every packet of a replayed or spooled
    /// capture and no live traffic.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<sluice_traffic::Attachment>,
    /// What its NFs see of fragmented IP datagrams (absent: `follow`).
    #[serde(default, skip_serializing_if = "is_follow")]
    pub fragments: sluice_traffic::FragmentMode,
    /// What a host's death may lose of its flows' state (absent:
    /// `periodic`).
    #[serde(default, skip_serializing_if = "Durability::is_periodic")]
    pub durability: Durability,
}

fn is_follow(m: &sluice_traffic::FragmentMode) -> bool {
    *m == sluice_traffic::FragmentMode::Follow
}

/// What a host's death may lose of a deployment's flow state, in a group
/// whose hosts replicate it to each flow's next owner.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Durability {
    /// Changed state is sent every replication interval: a kill loses the
    /// changes of the last interval, and packets never wait for it.
    #[default]
    Periodic,
    /// Output commit: a packet whose processing changed its flow's state
    /// leaves only once the flow's next owner holds the change, so a kill
    /// loses no state that a packet out of the host depended on; those
    /// packets wait about a round trip to the next owner.
    Replicated,
}

impl Durability {
    /// Its name in configuration and the API.
    pub fn name(self) -> &'static str {
        match self {
            Durability::Periodic => "periodic",
            Durability::Replicated => "replicated",
        }
    }

    fn is_periodic(&self) -> bool {
        *self == Durability::Periodic
    }
}

impl std::fmt::Display for Durability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Durability {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "periodic" => Ok(Durability::Periodic),
            "replicated" => Ok(Durability::Replicated),
            other => Err(format!("durability '{other}': expected 'periodic' or 'replicated'")),
        }
    }
}

impl DeploymentSpec {
    /// SHA-256 (hex) of the spec as encoded on the wire. Hosts apply a
    /// spec whose digest differs from the one they run even at the same
    /// revision, and report the digest they run.
    pub fn digest(&self) -> String {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(serde_json::to_vec(self).unwrap_or_default()))
    }
}

/// Everything that should run on the hosts of one group. Sent whole, so a
/// host that missed an update converges on the next one.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DesiredSet {
    /// The host group.
    pub group: String,
    /// Deployments.
    pub deployments: Vec<DeploymentSpec>,
    /// The W3C trace context (header name to value) of the change that
    /// last wrote each deployment, by deployment id: a host's work on the
    /// deployment joins that trace. Carried in message headers, not in
    /// the body.
    #[serde(skip)]
    pub traces: BTreeMap<String, BTreeMap<String, String>>,
}

/// How a deployment is doing on one host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HostState {
    /// Accepted, modules being fetched or compiled.
    Pending,
    /// Processing traffic.
    Running,
    /// Could not start (or an update could not be applied): see `reason`.
    Failed,
}

/// A deployment's status on one host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeploymentStatus {
    /// Deployment id.
    pub deployment: String,
    /// The revision the state refers to.
    pub revision: u64,
    /// State.
    pub state: HostState,
    /// Why it failed (or why an update was refused while the old revision runs on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Packets processed so far on this host.
    #[serde(default)]
    pub packets: u64,
    /// [`DeploymentSpec::digest`] of the spec the state refers to: the
    /// gateway counts a host as running a revision only if this is the
    /// digest of what it published.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
}

/// A host's periodic sign of life, with the status of what runs on it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Heartbeat {
    /// Host id.
    pub host: String,
    /// Host group.
    pub group: String,
    /// Random per process start: tells a restart from a hiccup.
    pub boot: String,
    /// When the process started (ms since epoch).
    pub started_ms: u64,
    /// When this heartbeat was sent (ms since epoch).
    pub sent_ms: u64,
    /// Time to the next heartbeat; three missed ones mean the host is gone.
    pub interval_ms: u64,
    /// Host software version.
    pub version: String,
    /// Every deployment of the group, as it is on this host.
    pub deployments: Vec<DeploymentStatus>,
    /// Packets per second this host can take (its declared capacity, the
    /// weight of its share of the group's flows; 0: not declared).
    #[serde(default)]
    pub capacity_pps: u64,
    /// Packets per second it processed since its previous heartbeat.
    #[serde(default)]
    pub load_pps: u64,
    /// The version of its group's flow-ownership table it has read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table_version: Option<u64>,
    /// The most linear memory one NF instance may have on this host (its
    /// runtime's pool slot), MiB; 0: not reported. The gateway refuses a
    /// deployment that asks any NF for more than the smallest slot of its
    /// group's live hosts.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub memory_slot_mb: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The sums of the per-invocation meters of one NF of one deployment on
/// one host over one window. `id` is unique: a record delivered twice is
/// stored once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MeterRecord {
    /// `<host>-<secret>-<sequence>`: the secret is random per host process
    /// and never published elsewhere, so no one else can claim an id first.
    pub id: String,
    /// Host that processed the packets.
    pub host: String,
    /// Tenant billed.
    pub tenant: String,
    /// Deployment id.
    pub deployment: String,
    /// NF name in the chain.
    pub nf: String,
    /// Module name.
    pub module: String,
    /// Module version.
    pub version: String,
    /// Module digest.
    pub digest: String,
    /// Window start (ms since epoch, inclusive).
    pub window_start_ms: u64,
    /// Window end (ms since epoch, exclusive).
    pub window_end_ms: u64,
    /// What was metered over the window (inlined in the JSON); its gauges
    /// (`table_bytes`, `flow_state_bytes`) are the state the NF held on
    /// this host at the window's end: the latest record of a deployment's
    /// NF tells its size.
    #[serde(flatten)]
    pub meters: Meters,
}

/// An event an NF emitted (an IDS alert, a firewall deny, ...), as the
/// tenant sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NfEvent {
    /// Tenant.
    pub tenant: String,
    /// Deployment id.
    pub deployment: String,
    /// NF name in the chain.
    pub nf: String,
    /// Module version.
    pub version: String,
    /// Event kind, e.g. `firewall.deny`.
    pub kind: String,
    /// `debug`, `info`, `warn` or `error`.
    pub level: String,
    /// Packet time, ns.
    pub timestamp_ns: u64,
    /// Flow of the packet, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flow: Option<String>,
    /// The NF's fields.
    #[serde(default)]
    pub fields: BTreeMap<String, String>,
}

/// Events of one host over one window. Events are best effort (their count
/// is metered exactly); a host sends at most a bounded number per
/// deployment and window and counts the rest in `dropped`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventBatch {
    /// Host.
    pub host: String,
    /// Events.
    pub events: Vec<NfEvent>,
    /// Events left out of this batch.
    pub dropped: u64,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_meter_record_is_one_flat_json_object() {
        let rec = MeterRecord {
            id: "h-b-7".into(),
            host: "h".into(),
            tenant: "t".into(),
            deployment: "d".into(),
            nf: "fw".into(),
            module: "firewall".into(),
            version: "1".into(),
            digest: "x".into(),
            window_start_ms: 1,
            window_end_ms: 2,
            meters: Meters { packets: 32, invocations: 1, ..Default::default() },
        };
        let v: serde_json::Value = serde_json::to_value(&rec).unwrap();
        assert_eq!(v["packets"], 32);
        assert_eq!(v["invocations"], 1);
        assert!(v.get("sums").is_none());
        assert_eq!(serde_json::from_value::<MeterRecord>(v).unwrap(), rec);
        let mut t = Meters::default();
        assert!(t.is_empty());
        t.add(&rec.meters);
        t.add(&rec.meters);
        assert_eq!((t.packets, t.invocations), (64, 2));
    }
}
