//! The messages one host sends another: the state of some flows of one
//! deployment, per NF, each part with its logical clock
//! ([`PeerBatch`]); or the sender's own values of the global eventual
//! tables of one NF ([`GlobalBatch`]); or a request for the state of
//! flows moved to the sender without it, and the answer for those the
//! receiver holds none of ([`FlowRequest`]); or bindings of a release pool
//! split between the hosts, handed over or replicated with their blocks
//! ([`PoolBindings`]), and releases for a block's owner ([`PoolRelease`]).
//! A flow's state carries its offload entries too ([`OffloadPart`]).
//!
//! Encoded with `postcard` behind a version byte. A message comes from
//! another host of the group (the subject names the sender and NATS
//! permissions hold it to its own name), yet it is decoded as untrusted
//! input: every count and length is bounded, and a message over a bound is
//! refused whole with the reason.

use serde::{Deserialize, Serialize};
use sluice_runtime::ExportedFlow;
use sluice_runtime::instance::FlowExport;
use sluice_state::FlowTableEntry;
use sluice_wire::FlowKey;

/// The format version this host writes and reads (2: flows carry their
/// offload entries).
pub const VERSION: u8 = 2;
/// Flows in one message at most.
pub const MAX_FLOWS: usize = 65_536;
/// NFs of one flow at most (a chain's stages).
pub const MAX_NFS: usize = 16;
/// Table entries of one flow in one NF at most.
pub const MAX_TABLES: usize = 64;
/// Bytes of one value at most (the host's largest per-flow state).
pub const MAX_VALUE: usize = 65_536;
/// Bytes of a deployment id, NF or table name at most.
pub const MAX_NAME: usize = 128;
/// Eventual tables in one message at most.
pub const MAX_GLOBAL_TABLES: usize = 64;
/// Entries of one eventual table in one message at most.
pub const MAX_ENTRIES: usize = 32_768;
/// Flows of one request (or answer) at most.
pub const MAX_REQUEST: usize = 1024;
/// Pool bindings or resources of one message at most.
pub const MAX_BINDINGS: usize = 16_384;
/// Blocks of one handover message at most.
pub const MAX_BLOCKS: usize = 65_536;
/// Bytes of one binding at most.
pub const MAX_BINDING: usize = 4096;
/// Offload entries of one flow at most (a direction per ingress port).
pub const MAX_OFFLOADS: usize = 16;

/// Why a message was refused.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// Empty, or written by another format version.
    #[error("peer message of format version {0:?}; this host reads version {VERSION}")]
    Version(Option<u8>),
    /// Not a message of this format.
    #[error("malformed peer message: {0}")]
    Malformed(#[from] postcard::Error),
    /// Over a bound.
    #[error("peer message refused: {0}")]
    Bound(String),
}

/// Per-flow table entry of a flow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TablePart {
    /// Table name.
    pub table: String,
    /// Value.
    pub value: Vec<u8>,
    /// Logical clock.
    pub clock: u64,
}

/// A flow's flow-state bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatePart {
    /// Value.
    pub value: Vec<u8>,
    /// Logical clock.
    pub clock: u64,
    /// Packet time of the flow's last packet on the sender.
    pub last_seen_ns: u64,
}

/// One NF's state of a flow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NfPart {
    /// The NF's name in its deployment's chain.
    pub nf: String,
    /// Flow-state bytes, if any.
    pub state: Option<StatePart>,
    /// Per-flow table entries.
    pub tables: Vec<TablePart>,
}

/// One flow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerFlow {
    /// The normalized flow key ([`FlowKey::to_bytes`]).
    pub key: Vec<u8>,
    /// Its state in each NF that holds some.
    pub nfs: Vec<NfPart>,
    /// Its offload entries on the sender (sent by the flow's owner).
    pub offload: Vec<OffloadPart>,
}

/// A header change of an offload entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum OpPart {
    /// New source address (128 bits, IPv4 mapped) and port.
    Source(u128, Option<u16>),
    /// New destination address and port.
    Destination(u128, Option<u16>),
    /// TTL or hop limit minus one.
    DecrementTtl,
    /// New DSCP.
    SetDscp(u8),
}

/// One NF of an offload entry's path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepPart {
    /// The NF's name in its deployment's chain.
    pub nf: String,
    /// The flow as that NF saw it ([`FlowKey::to_bytes`], normalized).
    pub key: Vec<u8>,
    /// Whether the entry's packets run against that key's direction.
    pub reverse: bool,
    /// Whether the NF asked for what passed when the entry ends.
    pub returns: bool,
}

/// An offload entry of a flow, as its owner holds it
/// ([`sluice_runtime::offload::Carried`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OffloadPart {
    /// Which entry (the same in every copy of it).
    pub origin: u64,
    /// Whether it takes packets against the flow's normalized direction.
    pub reverse: bool,
    /// Ingress port.
    pub port: u16,
    /// Egress port; `None`: dropped by the path's last NF.
    pub forward: Option<u16>,
    /// Label.
    pub label: Option<u16>,
    /// Header changes, in order.
    pub ops: Vec<OpPart>,
    /// Its NFs, in the order its packets meet them.
    pub path: Vec<StepPart>,
    /// Idle timeout, ns.
    pub idle_ns: u64,
    /// Packet limit (0: none).
    pub max_packets: u64,
    /// Byte limit (0: none).
    pub max_bytes: u64,
    /// Age left after its last packet, ns (`u64::MAX`: no limit).
    pub age_left_ns: u64,
    /// Packets that passed under it, not yet handed to its NFs.
    pub packets: u64,
    /// Their bytes.
    pub bytes: u64,
}

impl OffloadPart {
    /// The part for an entry carried by the runtime.
    pub fn of(c: &sluice_runtime::offload::Carried) -> Self {
        use sluice_runtime::offload::RewriteOp;
        OffloadPart {
            origin: c.origin,
            reverse: c.reverse,
            port: c.port,
            forward: c.forward,
            label: c.label,
            ops: c
                .ops
                .iter()
                .map(|op| match *op {
                    RewriteOp::Source(a, p) => OpPart::Source(a.0, p),
                    RewriteOp::Destination(a, p) => OpPart::Destination(a.0, p),
                    RewriteOp::DecrementTtl => OpPart::DecrementTtl,
                    RewriteOp::SetDscp(d) => OpPart::SetDscp(d),
                })
                .collect(),
            path: c
                .path
                .iter()
                .map(|s| StepPart {
                    nf: s.nf.clone(),
                    key: s.key.to_bytes().to_vec(),
                    reverse: s.reverse,
                    returns: s.returns,
                })
                .collect(),
            idle_ns: c.idle_ns,
            max_packets: c.max_packets,
            max_bytes: c.max_bytes,
            age_left_ns: c.age_left_ns,
            packets: c.packets,
            bytes: c.bytes,
        }
    }

    /// The entry to hand the runtime (its keys were checked at decoding;
    /// `None` if one is not a key).
    pub fn to_carried(&self) -> Option<sluice_runtime::offload::Carried> {
        use sluice_runtime::offload::{Carried, CarriedStep, RewriteOp};
        use sluice_wire::IpAddr128;
        let path = self
            .path
            .iter()
            .map(|s| {
                Some(CarriedStep {
                    nf: s.nf.clone(),
                    key: FlowKey::from_bytes(&s.key)?,
                    reverse: s.reverse,
                    returns: s.returns,
                })
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Carried {
            origin: self.origin,
            reverse: self.reverse,
            port: self.port,
            forward: self.forward,
            label: self.label,
            ops: self
                .ops
                .iter()
                .map(|op| match *op {
                    OpPart::Source(a, p) => RewriteOp::Source(IpAddr128(a), p),
                    OpPart::Destination(a, p) => RewriteOp::Destination(IpAddr128(a), p),
                    OpPart::DecrementTtl => RewriteOp::DecrementTtl,
                    OpPart::SetDscp(d) => RewriteOp::SetDscp(d),
                })
                .collect(),
            path,
            idle_ns: self.idle_ns,
            max_packets: self.max_packets,
            max_bytes: self.max_bytes,
            age_left_ns: self.age_left_ns,
            packets: self.packets,
            bytes: self.bytes,
        })
    }

    /// What holding it costs, roughly.
    pub fn bytes(&self) -> usize {
        96 + self.ops.len() * 24 + self.path.iter().map(|s| 48 + s.nf.len()).sum::<usize>()
    }

    fn check(&self) -> Result<(), String> {
        if self.ops.len() > sluice_runtime::offload::MAX_REWRITES {
            return Err(format!("an offload entry with {} header changes", self.ops.len()));
        }
        if self.path.is_empty() || self.path.len() > MAX_NFS {
            return Err(format!("an offload entry with {} NFs (1-{MAX_NFS})", self.path.len()));
        }
        for s in &self.path {
            if s.nf.is_empty() || s.nf.len() > MAX_NAME {
                return Err(format!("an offload entry's NF name of {} bytes (1-{MAX_NAME})", s.nf.len()));
            }
            if FlowKey::from_bytes(&s.key).is_none() {
                return Err(format!("an offload entry's flow key of {} bytes", s.key.len()));
            }
        }
        if self.ops.iter().any(|o| matches!(o, OpPart::SetDscp(d) if *d > 63)) {
            return Err("an offload entry's DSCP over 63".into());
        }
        Ok(())
    }
}

/// One message: flows of one deployment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerBatch {
    /// The deployment's id.
    pub deployment: String,
    /// The ownership table version the sender chose the receiver by.
    pub table_version: u64,
    /// The flows.
    pub flows: Vec<PeerFlow>,
}

/// One eventual table's values on the sending host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableValues {
    /// Table name.
    pub table: String,
    /// (key, the sender's merged value).
    pub entries: Vec<(u64, u64)>,
}

/// The sending host's values of eventual tables of one NF of one
/// deployment: they replace what it sent before (each host sends its own
/// workers' merged updates; receivers merge the hosts' values on read).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GlobalBatch {
    /// The deployment's id.
    pub deployment: String,
    /// The NF's name in its chain.
    pub nf: String,
    /// The tables.
    pub tables: Vec<TableValues>,
}

/// Flows of one deployment, by key: the flows a host asks another for
/// ([`PeerMessage::Pull`]), or those it holds no state of
/// ([`PeerMessage::NotHeld`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowRequest {
    /// The deployment's id.
    pub deployment: String,
    /// Normalized flow keys ([`FlowKey::to_bytes`]).
    pub keys: Vec<Vec<u8>>,
}

/// Why pool bindings are sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum BindingsKind {
    /// The blocks moved to the receiver: it takes their bindings in, and
    /// hands out their free resources from now on.
    Handover,
    /// Changes of bindings in blocks the receiver takes over if the sender
    /// goes: it keeps them aside until then.
    Replica,
}

/// Bindings of one release pool of one NF of one deployment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolBindings {
    /// The deployment's id.
    pub deployment: String,
    /// The NF's name in its chain.
    pub nf: String,
    /// The pool's name.
    pub pool: String,
    /// Why they are sent.
    pub kind: BindingsKind,
    /// Handover: the blocks handed over (those without bindings too).
    pub blocks: Vec<u64>,
    /// (resource, its binding; `None`: no longer bound, replicas only).
    pub entries: Vec<(u64, Option<Vec<u8>>)>,
}

/// Resources of one release pool released by the sender's flows but
/// bound on the receiver, which owns their block.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolRelease {
    /// The deployment's id.
    pub deployment: String,
    /// The NF's name in its chain.
    pub nf: String,
    /// The pool's name.
    pub pool: String,
    /// The resources.
    pub resources: Vec<u64>,
}

fn check_names(names: [&String; 3]) -> Result<(), WireError> {
    for name in names {
        if name.is_empty() || name.len() > MAX_NAME {
            return Err(WireError::Bound(format!("a name of {} bytes (1-{MAX_NAME})", name.len())));
        }
    }
    Ok(())
}

impl PoolBindings {
    fn check(&self) -> Result<(), WireError> {
        check_names([&self.deployment, &self.nf, &self.pool])?;
        let bound = |what: String| Err(WireError::Bound(what));
        if self.blocks.len() > MAX_BLOCKS {
            return bound(format!("{} blocks (at most {MAX_BLOCKS})", self.blocks.len()));
        }
        if self.entries.len() > MAX_BINDINGS {
            return bound(format!("{} bindings (at most {MAX_BINDINGS})", self.entries.len()));
        }
        if let Some((r, _)) = self.entries.iter().find(|(_, v)| v.as_ref().is_some_and(|v| v.len() > MAX_BINDING)) {
            return bound(format!("the binding of resource {r} is over {MAX_BINDING} bytes"));
        }
        Ok(())
    }
}

impl PoolRelease {
    fn check(&self) -> Result<(), WireError> {
        check_names([&self.deployment, &self.nf, &self.pool])?;
        if self.resources.len() > MAX_BINDINGS {
            return Err(WireError::Bound(format!("{} resources (at most {MAX_BINDINGS})", self.resources.len())));
        }
        Ok(())
    }
}

/// Flows' changed state that packets wait on (output commit): the
/// receiver keeps it as a replica, then acknowledges `seq` to the sender
/// ([`PeerMessage::Held`]), whose lane `lane` then lets those packets go.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitBatch {
    /// The sending lane (unique on its host).
    pub lane: u64,
    /// The message's number in the lane's order.
    pub seq: u64,
    /// The flows.
    pub batch: PeerBatch,
}

/// Bindings of a split release pool that a lane's packets wait on (output
/// commit), to their blocks' next owner: kept as replicas
/// ([`BindingsKind::Replica`] only), then acknowledged like a
/// [`CommitBatch`] ([`PeerMessage::Held`], same lane numbering).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BindingsCommit {
    /// The sending lane (unique on its host).
    pub lane: u64,
    /// The message's number in the lane's order.
    pub seq: u64,
    /// The bindings.
    pub bindings: PoolBindings,
}

/// The receiver holds the flows of a [`CommitBatch`] (or the bindings of a
/// [`BindingsCommit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitAck {
    /// The lane that sent it.
    pub lane: u64,
    /// Its number.
    pub seq: u64,
}

/// A message between the hosts of a group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PeerMessage {
    /// Flows' state, to their next owner, or to a host that asked for it.
    Flows(PeerBatch),
    /// Global eventual tables, to every other host.
    Global(GlobalBatch),
    /// The state of flows the dispatcher moved to the sender from the
    /// receiver, which the sender does not hold: answered with
    /// [`PeerMessage::Flows`] for those the receiver holds, and
    /// [`PeerMessage::NotHeld`] for the rest.
    Pull(FlowRequest),
    /// The flows of a [`PeerMessage::Pull`] the sender holds no state of.
    NotHeld(FlowRequest),
    /// Bindings of a release pool split between the hosts: handed over
    /// with their blocks, or replicated to the blocks' next owner.
    Bindings(PoolBindings),
    /// Resources of a split release pool released by flows that moved to
    /// the sender, to their block's owner.
    Released(PoolRelease),
    /// Flows' changed state that the sender's packets wait on, to their
    /// next owner (a deployment with `durability = "replicated"`).
    Commit(CommitBatch),
    /// The sender holds the flows of a [`PeerMessage::Commit`] or the
    /// bindings of a [`PeerMessage::CommitBindings`].
    Held(CommitAck),
    /// Pool bindings that the sender's packets wait on, to their blocks'
    /// next owner (a deployment with `durability = "replicated"`).
    CommitBindings(BindingsCommit),
    /// The sender takes the receiver for dead (see
    /// [`crate::Peer::suspect`]): answered with [`PeerMessage::Alive`].
    Probe,
    /// The answer to a [`PeerMessage::Probe`].
    Alive,
    /// The sender's peer link, for the receiver's datagrams to it (see
    /// [`crate::link`]); taken from the bus only.
    Offer(crate::link::LinkOffer),
}

impl PeerMessage {
    /// The message's bytes.
    pub fn encode(&self) -> Result<Vec<u8>, WireError> {
        let mut out = vec![VERSION];
        out.extend_from_slice(&postcard::to_allocvec(self)?);
        Ok(out)
    }

    /// Reads a message and checks its bounds.
    pub fn decode(bytes: &[u8]) -> Result<PeerMessage, WireError> {
        match bytes.split_first() {
            Some((&VERSION, rest)) => {
                let m: PeerMessage = postcard::from_bytes(rest)?;
                match &m {
                    PeerMessage::Flows(b) => b.check()?,
                    PeerMessage::Global(g) => g.check()?,
                    PeerMessage::Pull(r) | PeerMessage::NotHeld(r) => r.check()?,
                    PeerMessage::Bindings(b) => b.check()?,
                    PeerMessage::Released(r) => r.check()?,
                    PeerMessage::Commit(c) => c.batch.check()?,
                    PeerMessage::Held(_) | PeerMessage::Probe | PeerMessage::Alive => {}
                    PeerMessage::Offer(o) => o.check().map_err(WireError::Bound)?,
                    PeerMessage::CommitBindings(c) => {
                        c.bindings.check()?;
                        if c.bindings.kind != BindingsKind::Replica || !c.bindings.blocks.is_empty() {
                            return Err(WireError::Bound("committed bindings that are not replicas".into()));
                        }
                    }
                }
                Ok(m)
            }
            other => Err(WireError::Version(other.map(|(v, _)| *v))),
        }
    }
}

impl FlowRequest {
    fn check(&self) -> Result<(), WireError> {
        let bound = |what: String| Err(WireError::Bound(what));
        if self.deployment.is_empty() || self.deployment.len() > MAX_NAME {
            return bound(format!("deployment id of {} bytes (1-{MAX_NAME})", self.deployment.len()));
        }
        if self.keys.len() > MAX_REQUEST {
            return bound(format!("a request for {} flows (at most {MAX_REQUEST})", self.keys.len()));
        }
        if let Some(k) = self.keys.iter().find(|k| FlowKey::from_bytes(k).is_none()) {
            return bound(format!("a flow key of {} bytes is not a flow key", k.len()));
        }
        Ok(())
    }

    /// The flow keys it names.
    pub fn flow_keys(&self) -> impl Iterator<Item = FlowKey> + '_ {
        self.keys.iter().filter_map(|k| FlowKey::from_bytes(k))
    }
}

impl GlobalBatch {
    fn check(&self) -> Result<(), WireError> {
        let bound = |what: String| Err(WireError::Bound(what));
        for name in [&self.deployment, &self.nf] {
            if name.is_empty() || name.len() > MAX_NAME {
                return bound(format!("a name of {} bytes (1-{MAX_NAME})", name.len()));
            }
        }
        if self.tables.len() > MAX_GLOBAL_TABLES {
            return bound(format!("{} tables (at most {MAX_GLOBAL_TABLES})", self.tables.len()));
        }
        for t in &self.tables {
            if t.table.is_empty() || t.table.len() > MAX_NAME {
                return bound(format!("a table name of {} bytes (1-{MAX_NAME})", t.table.len()));
            }
            if t.entries.len() > MAX_ENTRIES {
                return bound(format!("table '{}': {} entries (at most {MAX_ENTRIES})", t.table, t.entries.len()));
            }
        }
        Ok(())
    }
}

impl NfPart {
    /// The part of an export that one NF gave.
    pub fn of(nf: &str, e: &FlowExport) -> Self {
        NfPart {
            nf: nf.to_string(),
            state: e.flow.as_ref().map(|f| StatePart {
                value: f.value.clone(),
                clock: f.clock,
                last_seen_ns: f.last_seen_ns,
            }),
            tables: e
                .tables
                .iter()
                .map(|t| TablePart { table: t.table.clone(), value: t.value.clone(), clock: t.clock })
                .collect(),
        }
    }

    /// The export to import into the NF's instance for flow `key`.
    pub fn to_export(&self, key: FlowKey) -> FlowExport {
        FlowExport {
            key,
            flow: self.state.as_ref().map(|s| ExportedFlow {
                key,
                value: s.value.clone(),
                clock: s.clock,
                last_seen_ns: s.last_seen_ns,
            }),
            tables: self
                .tables
                .iter()
                .map(|t| FlowTableEntry { table: t.table.clone(), value: t.value.clone(), clock: t.clock })
                .collect(),
        }
    }

    /// Bytes of values it carries (what holding it costs, roughly).
    pub fn bytes(&self) -> usize {
        self.state.as_ref().map_or(0, |s| s.value.len()) + self.tables.iter().map(|t| t.value.len()).sum::<usize>()
    }
}

impl PeerBatch {
    fn check(&self) -> Result<(), WireError> {
        let bound = |what: String| Err(WireError::Bound(what));
        if self.deployment.is_empty() || self.deployment.len() > MAX_NAME {
            return bound(format!("deployment id of {} bytes (1-{MAX_NAME})", self.deployment.len()));
        }
        if self.flows.len() > MAX_FLOWS {
            return bound(format!("{} flows (at most {MAX_FLOWS})", self.flows.len()));
        }
        for f in &self.flows {
            if FlowKey::from_bytes(&f.key).is_none() {
                return bound(format!("a flow key of {} bytes is not a flow key", f.key.len()));
            }
            if f.nfs.len() > MAX_NFS {
                return bound(format!("a flow with {} NFs (at most {MAX_NFS})", f.nfs.len()));
            }
            if f.offload.len() > MAX_OFFLOADS {
                return bound(format!("a flow with {} offload entries (at most {MAX_OFFLOADS})", f.offload.len()));
            }
            for o in &f.offload {
                o.check().map_err(WireError::Bound)?;
            }
            for n in &f.nfs {
                if n.nf.is_empty() || n.nf.len() > MAX_NAME {
                    return bound(format!("NF name of {} bytes (1-{MAX_NAME})", n.nf.len()));
                }
                if n.tables.len() > MAX_TABLES {
                    return bound(format!("NF '{}': {} table entries (at most {MAX_TABLES})", n.nf, n.tables.len()));
                }
                if n.state.as_ref().is_some_and(|s| s.value.len() > MAX_VALUE) {
                    return bound(format!("NF '{}': flow state over {MAX_VALUE} bytes", n.nf));
                }
                for t in &n.tables {
                    if t.table.is_empty() || t.table.len() > MAX_NAME || t.value.len() > MAX_VALUE {
                        return bound(format!("NF '{}': a table entry over its bounds", n.nf));
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;
    use proptest::prelude::*;

    fn key(n: u8) -> FlowKey {
        FlowKey { src_port: u16::from(n), dst_port: 80, protocol: 6, ..FlowKey::default() }
    }

    fn batch() -> PeerBatch {
        PeerBatch {
            deployment: "d-1".into(),
            table_version: 7,
            flows: vec![PeerFlow {
                key: key(1).to_bytes().to_vec(),
                nfs: vec![NfPart {
                    nf: "firewall".into(),
                    state: Some(StatePart { value: vec![1], clock: 3, last_seen_ns: 9 }),
                    tables: vec![TablePart { table: "bytes".into(), value: 5u64.to_le_bytes().to_vec(), clock: 2 }],
                }],
                offload: vec![entry()],
            }],
        }
    }

    fn entry() -> OffloadPart {
        OffloadPart {
            origin: 77,
            reverse: true,
            port: 0,
            forward: Some(1),
            label: None,
            ops: vec![OpPart::Source(0xffff_0a00_0001, Some(4000)), OpPart::DecrementTtl, OpPart::SetDscp(10)],
            path: vec![StepPart {
                nf: "firewall".into(),
                key: key(1).to_bytes().to_vec(),
                reverse: true,
                returns: true,
            }],
            idle_ns: 1_000_000_000,
            max_packets: 0,
            max_bytes: 0,
            age_left_ns: u64::MAX,
            packets: 12,
            bytes: 768,
        }
    }

    #[test]
    fn offload_entries_round_trip_through_the_runtime_s_form_and_are_bounded() {
        let e = entry();
        let c = e.to_carried().unwrap();
        assert_eq!(c.path[0].key, key(1));
        assert_eq!(OffloadPart::of(&c), e);
        let refused = |f: &dyn Fn(&mut OffloadPart)| {
            let mut b = batch();
            f(&mut b.flows[0].offload[0]);
            matches!(PeerMessage::decode(&flows(b)), Err(WireError::Bound(_)))
        };
        assert!(!refused(&|_| {}));
        assert!(refused(&|e| e.ops = vec![OpPart::DecrementTtl; 9]));
        assert!(refused(&|e| e.path.clear()));
        assert!(refused(&|e| e.path[0].key = vec![1, 2, 3]));
        assert!(refused(&|e| e.path[0].nf = "n".repeat(MAX_NAME + 1)));
        assert!(refused(&|e| e.ops = vec![OpPart::SetDscp(64)]));
        let mut many = batch();
        many.flows[0].offload = vec![entry(); MAX_OFFLOADS + 1];
        assert!(matches!(PeerMessage::decode(&flows(many)), Err(WireError::Bound(_))));
        // A host of the previous format is refused with the reason.
        let mut old = flows(batch());
        old[0] = 1;
        assert!(matches!(PeerMessage::decode(&old), Err(WireError::Version(Some(1)))));
    }

    fn flows(b: PeerBatch) -> Vec<u8> {
        PeerMessage::Flows(b).encode().unwrap()
    }

    #[test]
    fn messages_round_trip() {
        let m = PeerMessage::Flows(batch());
        assert_eq!(PeerMessage::decode(&m.encode().unwrap()).unwrap(), m);
        let g = PeerMessage::Global(GlobalBatch {
            deployment: "d-1".into(),
            nf: "monitor".into(),
            tables: vec![TableValues { table: "totals".into(), entries: vec![(0, 7), (1, 448)] }],
        });
        assert_eq!(PeerMessage::decode(&g.encode().unwrap()).unwrap(), g);
        let mut big = g.clone();
        if let PeerMessage::Global(b) = &mut big {
            b.tables[0].entries = vec![(1, 1); MAX_ENTRIES + 1];
        }
        assert!(matches!(PeerMessage::decode(&big.encode().unwrap()), Err(WireError::Bound(_))));
        let r = FlowRequest { deployment: "d-1".into(), keys: vec![key(1).to_bytes().to_vec()] };
        for m in [PeerMessage::Pull(r.clone()), PeerMessage::NotHeld(r.clone())] {
            assert_eq!(PeerMessage::decode(&m.encode().unwrap()).unwrap(), m);
        }
        let mut many = r.clone();
        many.keys = vec![key(1).to_bytes().to_vec(); MAX_REQUEST + 1];
        assert!(matches!(PeerMessage::decode(&PeerMessage::Pull(many).encode().unwrap()), Err(WireError::Bound(_))));
        let mut bad = r;
        bad.keys.push(vec![0; 3]);
        let e = PeerMessage::decode(&PeerMessage::NotHeld(bad).encode().unwrap()).unwrap_err();
        assert!(e.to_string().contains("not a flow key"), "{e}");
    }

    #[test]
    fn commit_messages_round_trip_and_their_flows_are_bounded() {
        let c = PeerMessage::Commit(CommitBatch { lane: 3, seq: 41, batch: batch() });
        assert_eq!(PeerMessage::decode(&c.encode().unwrap()).unwrap(), c);
        let a = PeerMessage::Held(CommitAck { lane: 3, seq: 41 });
        assert_eq!(PeerMessage::decode(&a.encode().unwrap()).unwrap(), a);
        // The flows of a commit are checked as a replica's.
        let mut b = batch();
        b.flows[0].key = vec![1, 2, 3];
        let bad = PeerMessage::Commit(CommitBatch { lane: 3, seq: 42, batch: b });
        assert!(PeerMessage::decode(&bad.encode().unwrap()).is_err());
        // The older messages keep their encoding: a replica reads as before.
        assert_eq!(flows(batch())[1], 0);
    }

    #[test]
    fn an_export_round_trips_through_a_part() {
        let b = batch();
        let part = &b.flows[0].nfs[0];
        let e = part.to_export(key(1));
        assert_eq!(&NfPart::of("firewall", &e), part);
        assert_eq!(part.bytes(), 9);
    }

    #[test]
    fn bad_messages_say_why() {
        assert!(matches!(PeerMessage::decode(&[]), Err(WireError::Version(None))));
        assert!(matches!(PeerMessage::decode(&[VERSION + 1, 0]), Err(WireError::Version(Some(v))) if v == VERSION + 1));
        assert!(matches!(PeerMessage::decode(&[VERSION, 200]), Err(WireError::Malformed(_))));
        let mut b = batch();
        b.flows[0].key = vec![1, 2, 3];
        let e = PeerMessage::decode(&flows(b)).unwrap_err();
        assert!(e.to_string().contains("not a flow key"), "{e}");
        let mut b = batch();
        b.flows[0].nfs[0].state.as_mut().unwrap().value = vec![0; MAX_VALUE + 1];
        assert!(matches!(PeerMessage::decode(&flows(b)), Err(WireError::Bound(_))));
    }

    #[test]
    fn pool_messages_round_trip_and_are_bounded() {
        let b = PoolBindings {
            deployment: "d".into(),
            nf: "nat".into(),
            pool: "ports".into(),
            kind: BindingsKind::Handover,
            blocks: vec![64, 65],
            entries: vec![(1024, Some(vec![1; 13])), (1025, None)],
        };
        let m = PeerMessage::Bindings(b.clone());
        assert_eq!(PeerMessage::decode(&m.encode().unwrap()).unwrap(), m);
        let r = PeerMessage::Released(PoolRelease {
            deployment: "d".into(),
            nf: "nat".into(),
            pool: "ports".into(),
            resources: vec![1024],
        });
        assert_eq!(PeerMessage::decode(&r.encode().unwrap()).unwrap(), r);
        let too_big = PoolBindings { entries: vec![(1, Some(vec![0; MAX_BINDING + 1]))], ..b.clone() };
        let e = PeerMessage::decode(&PeerMessage::Bindings(too_big).encode().unwrap()).unwrap_err();
        assert!(e.to_string().contains("binding of resource 1"), "{e}");
        let too_many = PoolBindings { blocks: vec![0; MAX_BLOCKS + 1], ..b.clone() };
        assert!(matches!(
            PeerMessage::decode(&PeerMessage::Bindings(too_many).encode().unwrap()),
            Err(WireError::Bound(_))
        ));
        let unnamed = PoolBindings { pool: String::new(), ..b.clone() };
        assert!(matches!(
            PeerMessage::decode(&PeerMessage::Bindings(unnamed).encode().unwrap()),
            Err(WireError::Bound(_))
        ));
        // Committed bindings are replicas, and bounded as any.
        let replica = PoolBindings { kind: BindingsKind::Replica, blocks: Vec::new(), ..b.clone() };
        let c = PeerMessage::CommitBindings(BindingsCommit { lane: 2, seq: 9, bindings: replica });
        assert_eq!(PeerMessage::decode(&c.encode().unwrap()).unwrap(), c);
        let handover = PeerMessage::CommitBindings(BindingsCommit { lane: 2, seq: 9, bindings: b });
        let e = PeerMessage::decode(&handover.encode().unwrap()).unwrap_err();
        assert!(e.to_string().contains("not replicas"), "{e}");
    }

    proptest! {
        /// Arbitrary bytes never panic the decoder.
        #[test]
        fn arbitrary_bytes_are_refused_or_read(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = PeerMessage::decode(&bytes);
            let mut v = vec![VERSION];
            v.extend_from_slice(&bytes);
            let _ = PeerMessage::decode(&v);
        }
    }
}
