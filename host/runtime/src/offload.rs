//! Flow offload (`sluice:nf@0.5.0`, interface `offload`): entries that give
//! the later packets of a flow, in one direction from one ingress port, the
//! fate and header changes its NFs decided, without calling them.
//!
//! An NF asks during `process` ([`Calls`], which the host's `offload`
//! functions fill in the store); its chain makes the entry after the batch
//! when every NF the packet went through asked ([`Table::install`]), and
//! looks each later packet up before it builds the NFs' batch
//! ([`Table::pass`]). When an entry ends, each of its NFs is handed what
//! passed under it ([`Return`]) with its next batch.

use crate::fate::Fate;
use sluice_wire::abi::{NO_L3, NO_L4, packet_flags};
use sluice_wire::{FlowKey, IpAddr128, Layers};

mod entries;

use entries::{Cold, Entries, EntryKey, Hot, Out};

/// Flow keys come off the wire: the map is seeded per process.
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// What an entry costs against its NFs' state budget.
pub const ENTRY_BYTES: u64 = 256;
/// Most header changes one request may list.
pub const MAX_REWRITES: usize = 8;
/// Most returns handed to an NF in one `returned` call or one batch frame
/// (0.7.0); the rest come with the next batch.
pub const MAX_RETURNS_PER_CALL: usize = 4096;
/// Most returns kept for an NF that does not take them; older ones are
/// dropped and counted (`offload_returns_dropped`).
pub const MAX_RETURNS_WAITING: usize = 65_536;
/// Idle entries are looked for at most this often (packet time) ...
const MIN_SWEEP_NS: u64 = 10_000_000;
/// ... and at least this often.
const MAX_SWEEP_NS: u64 = 1_000_000_000;

/// A header change, checked against the packet it was asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RewriteOp {
    /// The sender's address and, for TCP and UDP, port.
    Source(IpAddr128, Option<u16>),
    /// The receiver's address and port.
    Destination(IpAddr128, Option<u16>),
    /// TTL or hop limit minus one.
    DecrementTtl,
    /// DSCP (0–63).
    SetDscp(u8),
}

impl RewriteOp {
    fn port(&self) -> Option<u16> {
        match self {
            RewriteOp::Source(_, p) | RewriteOp::Destination(_, p) => *p,
            RewriteOp::DecrementTtl | RewriteOp::SetDscp(_) => None,
        }
    }
}

/// Why an entry ended (the contract's `end-reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndReason {
    /// A TCP FIN or RST of its flow and direction.
    Closed,
    /// Its packet or byte limit, or a TTL too low to lower.
    Limit,
    /// No packet for its idle timeout.
    Idle,
    /// The NF revoked it.
    Revoked,
    /// The NF was replaced or stopped.
    Replaced,
}

/// The address of a header change: 4 bytes (IPv4) or 16 (IPv6); `None`
/// for another length.
pub(crate) fn address(bytes: &[u8]) -> Option<IpAddr128> {
    match bytes.len() {
        4 => Some(IpAddr128::from_v4(bytes.try_into().ok()?)),
        16 => Some(IpAddr128::from_v6(bytes.try_into().ok()?)),
        _ => None,
    }
}

impl Return {
    /// The record a 0.7.0 batch frame hands it in as.
    pub(crate) fn record(&self, flow: Option<u32>) -> sluice_wire::abi::ReturnRecord {
        sluice_wire::abi::ReturnRecord {
            flow_hash: self.key.hash_normalized(),
            packets: self.packets,
            bytes: self.bytes,
            flow,
            reverse: self.reverse,
            // The contract's `end-reason` cases, in declaration order.
            reason: match self.reason {
                EndReason::Closed => 0,
                EndReason::Limit => 1,
                EndReason::Idle => 2,
                EndReason::Revoked => 3,
                EndReason::Replaced => 4,
            },
            key: self.key.to_bytes(),
        }
    }
}

/// An NF's request, accepted by the `offload` call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Index of the packet in the NF's batch.
    pub packet: u32,
    /// Header changes, in order.
    pub ops: Vec<RewriteOp>,
    /// Idle timeout (packet time); 0: the NF's flow idle timeout.
    pub idle_ns: u64,
    /// Packet limit; 0: none.
    pub max_packets: u64,
    /// Byte limit; 0: none.
    pub max_bytes: u64,
    /// Age limit (packet time); 0: none.
    pub max_age_ns: u64,
    /// Whether the NF is handed what passed when the entry ends.
    pub return_counts: bool,
}

/// What passed under an entry that ended, for one of its NFs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Return {
    /// The flow as that NF saw it, normalized.
    pub key: FlowKey,
    /// Whether the entry was for packets against the normalized direction.
    pub reverse: bool,
    /// Packets that passed under it.
    pub packets: u64,
    /// Their bytes on the wire.
    pub bytes: u64,
    /// Why it ended.
    pub reason: EndReason,
    /// Packet time of the last packet that passed under it (of when it
    /// was made, if none did): the flow was last seen then.
    pub last_ns: u64,
}

/// Why a request was refused at the call (the contract's `offload-error`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Outside `process`.
    NotNow,
    /// No such packet in the batch.
    BadPacket,
    /// The packet cannot be offloaded.
    NotOffloadable(&'static str),
    /// A change the packet cannot take.
    BadRewrite(String),
    /// The state budget holds no more entries.
    OverBudget,
}

/// What an NF's calls of the `offload` import see and leave, kept in its
/// store for the duration of one `process` call.
#[derive(Debug, Default)]
pub struct Calls {
    /// Inside `process`.
    pub(crate) open: bool,
    /// The batch's descriptors (four words per packet; word 3 holds the
    /// flags and offsets a request is checked against).
    pub(crate) words: Vec<u64>,
    /// Entries the NF's budget still holds.
    pub(crate) room: u64,
    /// Accepted requests, in call order.
    pub(crate) requests: Vec<Request>,
    /// Where each packet's request is in `requests` (`u32::MAX`: none).
    slots: Vec<u32>,
    /// Flow hashes whose entries end after the batch.
    pub(crate) revoked: Vec<u64>,
    /// Whether every entry of the NF ends after the batch.
    pub(crate) revoke_all: bool,
    /// Returns handed in for `returned`, with the flow's index in the
    /// batch where it has one.
    pub(crate) returns: Vec<(Return, Option<u32>)>,
}

impl Calls {
    /// Checks one request against the batch and the budget, and keeps it.
    pub(crate) fn offload(&mut self, r: Request) -> Result<(), Refusal> {
        if !self.open {
            return Err(Refusal::NotNow);
        }
        let at = (r.packet as usize).saturating_mul(sluice_wire::abi::DESCRIPTOR_WORDS).saturating_add(3);
        let w = *self.words.get(at).ok_or(Refusal::BadPacket)?;
        let flags = (w >> 56) as u8;
        let l3 = (w >> 48) as u8;
        let l4 = (w >> 32) as u16;
        if l3 == NO_L3 {
            return Err(Refusal::NotOffloadable("not an IP packet"));
        }
        if flags & packet_flags::FRAGMENT != 0 {
            return Err(Refusal::NotOffloadable("an IP fragment"));
        }
        if flags & packet_flags::TRUNCATED != 0 {
            return Err(Refusal::NotOffloadable("a truncated capture"));
        }
        if r.ops.len() > MAX_REWRITES {
            return Err(Refusal::BadRewrite(format!("{} changes (at most {MAX_REWRITES})", r.ops.len())));
        }
        let v6 = flags & packet_flags::IPV6 != 0;
        for (i, op) in r.ops.iter().enumerate() {
            match op {
                RewriteOp::Source(a, _) | RewriteOp::Destination(a, _) if a.to_v4().is_some() == v6 => {
                    return Err(Refusal::BadRewrite(format!(
                        "change {i}: an {} address for an {} packet",
                        if v6 { "IPv4" } else { "IPv6" },
                        if v6 { "IPv6" } else { "IPv4" }
                    )));
                }
                _ if op.port().is_some() && l4 == NO_L4 => {
                    return Err(Refusal::BadRewrite(format!("change {i}: a port for a packet without ports")));
                }
                RewriteOp::SetDscp(d) if *d > 63 => {
                    return Err(Refusal::BadRewrite(format!("change {i}: DSCP {d} (0 to 63)")));
                }
                _ => {}
            }
        }
        // A later request for the same packet replaces an earlier one and
        // takes no more room (found in one step: a guest may send any
        // number of requests in one call).
        let slot = r.packet as usize;
        if self.slots.len() <= slot {
            self.slots.resize(self.words.len() / sluice_wire::abi::DESCRIPTOR_WORDS, u32::MAX);
        }
        if let Some(old) = self.slots.get(slot).and_then(|&at| self.requests.get_mut(at as usize)) {
            *old = r;
            return Ok(());
        }
        if self.room == 0 {
            return Err(Refusal::OverBudget);
        }
        self.room -= 1;
        if let Some(at) = self.slots.get_mut(slot) {
            *at = self.requests.len() as u32;
        }
        self.requests.push(r);
        Ok(())
    }

    /// Checks and keeps one request given as the result frame's records
    /// (0.7.0) or converted to them from the `offload` call's (0.5.0 and
    /// later): the packet, its limits and its header changes.
    pub(crate) fn offload_ops(
        &mut self,
        head: &sluice_wire::abi::OffloadRecord<'_>,
        ops: impl Iterator<Item = sluice_wire::abi::OpRecord>,
    ) -> Result<(), Refusal> {
        let mut checked = Vec::new();
        // One change more than allowed is enough for `offload` to refuse.
        for (i, op) in ops.take(MAX_REWRITES + 1).enumerate() {
            let len = usize::from(op.address_len);
            let endpoint = || op.address.get(..len).and_then(address).map(|a| (a, op.port));
            checked.push(match (op.kind, endpoint()) {
                (0, Some((a, p))) => RewriteOp::Source(a, p),
                (1, Some((a, p))) => RewriteOp::Destination(a, p),
                (2, _) => RewriteOp::DecrementTtl,
                (3, _) => RewriteOp::SetDscp(op.dscp),
                (0 | 1, None) => {
                    return Err(Refusal::BadRewrite(format!(
                        "change {i}: an address of {len} bytes (4 for IPv4, 16 for IPv6)"
                    )));
                }
                (k, _) => return Err(Refusal::BadRewrite(format!("change {i}: unknown kind {k}"))),
            });
        }
        self.offload(Request {
            packet: head.packet,
            ops: checked,
            idle_ns: head.idle_timeout_ns,
            max_packets: head.max_packets,
            max_bytes: head.max_bytes,
            max_age_ns: head.max_age_ns,
            return_counts: head.return_counts,
        })
    }

    /// Takes the offload requests of a 0.7.0 result frame, in order, as
    /// the `offload` call would. A refused request makes no entry (the
    /// frame has no answer; an NF that wants one calls `offload`).
    ///
    /// Errors: a request cut short (the result is malformed).
    pub(crate) fn offload_records(&mut self, records: sluice_wire::abi::Offloads<'_>) -> Result<(), String> {
        for r in records {
            let r = r.map_err(|e| e.to_string())?;
            let _refused = self.offload_ops(&r, r.ops());
        }
        Ok(())
    }

    /// Ends the call: what it left, and nothing for the next.
    pub(crate) fn close(&mut self) {
        self.open = false;
        self.words.clear();
        self.slots.clear();
        self.returns.clear();
    }
}

/// What the NFs of a chain asked for one packet of a batch: a step per NF,
/// in the order the packet met them.
#[derive(Debug, Clone, Default)]
pub(crate) struct Pending {
    steps: Path,
    ops: Vec<RewriteOp>,
    idle_ns: u64,
    max_packets: u64,
    max_bytes: u64,
    max_age_ns: u64,
}

impl Pending {
    /// Adds NF `stage`'s request, made for the packet whose flow that NF
    /// saw as `flow` (normalized, and whether the packet runs against it).
    pub(crate) fn add(&mut self, stage: usize, flow: (FlowKey, bool), r: Request, default_idle_ns: u64) {
        let (key, reverse) = flow;
        let nonzero_min = |a: u64, b: u64| match (a, b) {
            (0, b) => b,
            (a, 0) => a,
            (a, b) => a.min(b),
        };
        let idle = if r.idle_ns == 0 { default_idle_ns } else { r.idle_ns };
        self.idle_ns = nonzero_min(self.idle_ns, idle);
        self.max_packets = nonzero_min(self.max_packets, r.max_packets);
        self.max_bytes = nonzero_min(self.max_bytes, r.max_bytes);
        self.max_age_ns = nonzero_min(self.max_age_ns, r.max_age_ns);
        self.ops.extend(r.ops);
        self.steps.push(Step { stage, key, reverse, protocol: key.protocol, returns: r.return_counts });
    }

    /// How many NFs asked.
    pub(crate) fn steps(&self) -> usize {
        self.steps.len()
    }

    /// The NFs that asked.
    pub(crate) fn stages(&self) -> impl Iterator<Item = usize> + '_ {
        self.steps.iter().map(|s| s.stage)
    }
}

/// One NF of an entry's path, and the flow as it saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Step {
    pub(crate) stage: usize,
    pub(crate) key: FlowKey,
    reverse: bool,
    protocol: u8,
    /// Whether the NF asked for what passed when the entry ends.
    returns: bool,
}

impl Step {
    /// Whether its NF asked for what passed when the entry ends.
    pub(crate) fn wants_counts(&self) -> bool {
        self.returns
    }
}

/// An entry's NFs: chains are short, so no allocation per entry.
type Path = smallvec::SmallVec<[Step; 2]>;

/// An entry as it leaves its host with its flow's state, for the flow's
/// next owner ([`crate::Chain::carry_offloads`]): the decision, the limits
/// left, and what passed under it that its NFs were not yet handed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Carried {
    /// Which entry this is (the same for every copy of one entry).
    pub origin: u64,
    /// Whether it takes packets against the flow's normalized direction.
    pub reverse: bool,
    /// The ingress port it takes packets from.
    pub port: u16,
    /// The port its packets leave by; `None`: dropped by its last NF.
    pub forward: Option<u16>,
    /// The label its packets leave with.
    pub label: Option<u16>,
    /// Header changes, in order.
    pub ops: Vec<RewriteOp>,
    /// Its NFs, in the order its packets meet them.
    pub path: Vec<CarriedStep>,
    /// Idle timeout (packet time).
    pub idle_ns: u64,
    /// Packet limit (0: none), counting `packets`.
    pub max_packets: u64,
    /// Byte limit (0: none), counting `bytes`.
    pub max_bytes: u64,
    /// Packet time left of its age limit after its last packet
    /// (`u64::MAX`: none).
    pub age_left_ns: u64,
    /// Packets that passed under it, not yet handed to its NFs.
    pub packets: u64,
    /// Their bytes.
    pub bytes: u64,
}

/// One NF of a [`Carried`] entry's path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CarriedStep {
    /// The NF's name in its chain.
    pub nf: String,
    /// The flow as that NF saw it, normalized.
    pub key: FlowKey,
    /// Whether the entry's packets run against that key's direction.
    pub reverse: bool,
    /// Whether the NF asked for what passed when the entry ends.
    pub returns: bool,
}

/// Why a carried entry was not taken in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CarryRefusal {
    /// An NF of its path is not in this chain, or cannot offload here.
    UnknownNf(String),
    /// Its path or changes do not fit an entry.
    Malformed(&'static str),
    /// An NF of its path has no room in its state budget.
    OverBudget(String),
}

/// The key a packet finds its entry by, and its hash ([`Table::probe`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Probe {
    key: EntryKey,
    hash: u64,
}

/// What [`Table::pass`] did with a packet.
#[derive(Debug)]
pub(crate) enum Pass {
    /// No entry: the packet goes to the NFs.
    Miss,
    /// Decided by an entry: its fate, label and new bytes (when the entry
    /// changes headers).
    Hit { fate: Fate, label: Option<u16>, data: Option<Vec<u8>> },
}

/// Counts of a chain's offload entries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OffloadCounters {
    /// Entries made.
    pub installed: u64,
    /// Requests that made no entry: another NF of the chain did not ask
    /// for the packet too, the packet's fate was not forward or drop, or a
    /// change did not fit the packet.
    pub declined: u64,
    /// Entries ended, for any reason.
    pub ended: u64,
    /// Packets that passed under entries.
    pub packets: u64,
}

impl OffloadCounters {
    /// Adds another worker's counters.
    pub fn add(&mut self, o: &OffloadCounters) {
        self.installed += o.installed;
        self.declined += o.declined;
        self.ended += o.ended;
        self.packets += o.packets;
    }
}

/// A chain's offload entries on one worker.
#[derive(Debug, Default)]
pub(crate) struct Table {
    entries: Entries,
    /// Entries by (NF, hash of the flow as that NF saw it), for `revoke`
    /// (usually both directions of one flow).
    by_hash: HashMap<(usize, u64), smallvec::SmallVec<[EntryKey; 2]>>,
    next_sweep: u64,
    batch: u64,
    pub(crate) counters: OffloadCounters,
    /// Ingress ports entries were made for (an entry's flow is found by
    /// looking it up on each).
    ports: smallvec::SmallVec<[u16; 4]>,
    /// Entries made so far (with `seed`, their origins).
    made: u64,
    seed: u64,
    /// Flows whose entries changed (made, used, ended) since the last
    /// [`take_changes`](Self::take_changes), when noted; `None`: not noted.
    changes: Option<Vec<FlowKey>>,
    /// Whether more changed than `changes` holds.
    changes_overflow: bool,
}

/// Most flows noted as changed between two takes; past it every flow
/// counts as changed.
const MAX_CHANGES: usize = 65_536;

impl Table {
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Starts a batch.
    pub(crate) fn begin_batch(&mut self) {
        self.batch = self.batch.wrapping_add(1);
    }

    /// The key packet `p` (parsed into `layers`) would find its entry by,
    /// and its hash (see [`pass`](Self::pass)); `None` for a packet no
    /// entry takes.
    #[inline]
    pub(crate) fn probe(&self, p: &crate::batch::RawPacket<'_>, layers: &Layers) -> Option<Probe> {
        let k = layers.key.filter(|_| !layers.fragment)?;
        let (key, reverse) = k.normalize();
        let key = EntryKey::new(key, reverse, p.ingress_port);
        Some(Probe { key, hash: self.entries.hash(&key) })
    }

    /// Passes packet `p` (parsed into `layers`, probed as `probe`) under
    /// its entry, if it has one. A packet that ends its entry (FIN or RST,
    /// a limit, a TTL too low) goes to the NFs, and `ended` gets what
    /// passed under the entry. On a hit, `on_step` is called for each NF
    /// of the entry's path with its place in the chain and the packet's
    /// bytes. The NFs' flow state is not touched (see
    /// [`last_packet`](Self::last_packet)).
    pub(crate) fn pass(
        &mut self,
        probe: &Probe,
        p: &crate::batch::RawPacket<'_>,
        layers: &Layers,
        ended: &mut Vec<(Step, Return)>,
        mut on_step: impl FnMut(usize, u64),
    ) -> Pass {
        let (data, wire_len, now) = (p.data, p.wire_len, p.timestamp_ns);
        let ek = probe.key;
        let Some(slot) = self.entries.find_hashed(probe.hash, &ek) else { return Pass::Miss };
        let Some(e) = self.entries.hot_mut(slot) else { return Pass::Miss };
        let bytes = u64::from(wire_len.max(u32::try_from(data.len()).unwrap_or(u32::MAX)));
        let closing =
            layers.tcp_flags.is_some_and(|f| f & (sluice_wire::tcp::flags::FIN | sluice_wire::tcp::flags::RST) != 0);
        let over = (e.max_packets != 0 && e.packets + 1 > e.max_packets)
            || (e.max_bytes != 0 && e.bytes.saturating_add(bytes) > e.max_bytes)
            || now >= e.ends_ns;
        // Idle past its timeout but not yet swept: the sweep runs only
        // every eighth of the timeout, and an NF may hold state that idled
        // out with the flow (a NAT's mapping and its port).
        let idle = e.idle_ns != 0 && now.saturating_sub(e.last_ns) >= e.idle_ns;
        let mut out = None;
        let end = if idle {
            Some(EndReason::Idle)
        } else if closing {
            Some(EndReason::Closed)
        } else if over {
            Some(EndReason::Limit)
        } else if e.flags & Hot::REWRITES == 0 {
            None
        } else {
            let mut d = data.to_vec();
            let fits = self.entries.cold(slot).is_some_and(|c| apply(&mut d, layers, &c.ops));
            out = Some(d);
            (!fits).then_some(EndReason::Limit)
        };
        if let Some(reason) = end {
            self.end(ek, reason, ended);
            return Pass::Miss;
        }
        let Some(e) = self.entries.hot_mut(slot) else { return Pass::Miss };
        self.counters.packets += 1;
        e.packets += 1;
        e.bytes = e.bytes.saturating_add(bytes);
        e.last_ns = e.last_ns.max(now);
        let first = e.batch != self.batch;
        e.batch = self.batch;
        let (fate, label, stages, wide) = (e.out.fate(), e.label, e.stages, e.flags & Hot::WIDE != 0);
        let mut bits = stages;
        while bits != 0 {
            on_step(bits.trailing_zeros() as usize, bytes);
            bits &= bits - 1;
        }
        if wide {
            for s in self.entries.cold(slot).map(|c| c.path.as_slice()).unwrap_or_default() {
                if s.stage >= 32 {
                    on_step(s.stage, bytes);
                }
            }
        }
        if first {
            note(&mut self.changes, &mut self.changes_overflow, ek.flow());
        }
        Pass::Hit { fate, label, data: out }
    }

    /// Makes the entry for a packet (as it came in) whose NFs all asked,
    /// with the chain's result for it. `false` (and no entry) when it
    /// cannot be made (counted as declined) or another packet of the batch
    /// made it already. An entry made in an earlier batch is replaced (what
    /// passed under it is returned as revoked).
    /// `port` is its ingress port; its flow as it came in is the flow
    /// the first NF of `p` saw (the first NF it met saw it as it came in).
    pub(crate) fn install(
        &mut self,
        port: u16,
        result: &crate::fate::PacketResult,
        p: Pending,
        now: u64,
        ended: &mut Vec<(Step, Return)>,
    ) -> bool {
        let label = result.label;
        let fits = p.steps.iter().all(|s| {
            let has_ports = matches!(s.protocol, sluice_wire::parse::protocol::TCP | sluice_wire::parse::protocol::UDP);
            has_ports || !p.ops.iter().any(|o| o.port().is_some())
        });
        let first = p.steps.first().map(|s| (s.key, s.reverse)).filter(|_| fits);
        let Some(((key, reverse), out)) = first.zip(Out::of(result.fate)) else {
            self.counters.declined += 1;
            return false;
        };
        let ek = EntryKey::new(key, reverse, port);
        // What the entry it replaces took in from carried copies, it
        // keeps: a later copy then adds only what is new.
        let took = match self.entries.get(&ek) {
            // Several packets of the flow asked in this batch: the first
            // made the entry.
            Some((_, e)) if e.made == self.batch => return false,
            Some((_, e)) => {
                let took = e.took;
                self.end(ek, EndReason::Revoked, ended);
                took
            }
            None => None,
        };
        if !self.ports.contains(&port) {
            self.ports.push(port);
        }
        note(&mut self.changes, &mut self.changes_overflow, key);
        self.made += 1;
        let origin = self.origin();
        for s in &p.steps {
            self.by_hash.entry((s.stage, s.key.hash_normalized())).or_default().push(ek);
        }
        let sweep = (p.idle_ns / 8).clamp(MIN_SWEEP_NS, MAX_SWEEP_NS);
        if self.entries.is_empty() || now.saturating_add(sweep) < self.next_sweep {
            self.next_sweep = now.saturating_add(sweep);
        }
        let (stages, flags) = Hot::shape(&p.steps, &p.ops);
        self.entries.insert(
            Hot {
                key: ek,
                packets: 0,
                bytes: 0,
                last_ns: now,
                idle_ns: p.idle_ns,
                max_packets: p.max_packets,
                max_bytes: p.max_bytes,
                ends_ns: if p.max_age_ns == 0 { u64::MAX } else { now.saturating_add(p.max_age_ns) },
                batch: self.batch,
                out,
                label,
                stages,
                flags,
            },
            Cold { ops: p.ops, path: p.steps, made: self.batch, origin, took },
        );
        self.counters.installed += 1;
        true
    }

    /// A new entry's origin: unique within this run (and, seeded at
    /// random, among hosts).
    fn origin(&mut self) -> u64 {
        if self.seed == 0 {
            use std::hash::BuildHasher;
            self.seed = foldhash::fast::RandomState::default().hash_one(0x5eed_u64) | 1;
        }
        self.seed.wrapping_add(self.made.wrapping_mul(0x9e37_79b9_7f4a_7c15))
    }

    /// The entries of flow `key` (normalized, as it came in).
    fn of_flow(&self, key: &FlowKey) -> smallvec::SmallVec<[EntryKey; 2]> {
        let mut v = smallvec::SmallVec::new();
        for &port in &self.ports {
            for reverse in [false, true] {
                let ek = EntryKey::new(*key, reverse, port);
                if self.entries.contains(&ek) {
                    v.push(ek);
                }
            }
        }
        v
    }

    /// A number that changes whenever an entry of flow `key` is made,
    /// passes a packet or ends (0: none and none ever).
    pub(crate) fn flow_sum(&self, key: &FlowKey) -> u64 {
        if self.entries.is_empty() {
            return 0;
        }
        self.of_flow(key)
            .iter()
            .filter_map(|ek| self.entries.get(ek))
            .fold(0u64, |a, (h, c)| a.wrapping_add(c.origin).wrapping_add(h.packets))
    }

    /// Copies of flow `key`'s entries, to go with its state; `name` gives
    /// each NF's name by its place in the chain.
    pub(crate) fn carry(&self, key: &FlowKey, name: impl Fn(usize) -> Option<String>) -> Vec<Carried> {
        let mut out = Vec::new();
        for ek in self.of_flow(key) {
            let Some((e, c)) = self.entries.get(&ek) else { continue };
            let path: Option<Vec<CarriedStep>> = c
                .path
                .iter()
                .map(|s| name(s.stage).map(|nf| CarriedStep { nf, key: s.key, reverse: s.reverse, returns: s.returns }))
                .collect();
            let Some(path) = path else { continue };
            out.push(Carried {
                origin: c.origin,
                reverse: ek.reverse(),
                port: ek.port(),
                forward: match e.out.fate() {
                    Fate::Forward(p) => Some(p),
                    _ => None,
                },
                label: e.label,
                ops: c.ops.clone(),
                path,
                idle_ns: e.idle_ns,
                max_packets: e.max_packets,
                max_bytes: e.max_bytes,
                age_left_ns: if e.ends_ns == u64::MAX { u64::MAX } else { e.ends_ns.saturating_sub(e.last_ns) },
                packets: e.packets,
                bytes: e.bytes,
            });
        }
        out
    }

    /// Ends flow `key`'s entries without handing their NFs what passed
    /// (it went with copies of them); the NFs of the ended entries go to
    /// `ended_on`.
    pub(crate) fn hand_over(&mut self, key: &FlowKey, ended_on: &mut Vec<(Step, Return)>) {
        for ek in self.of_flow(key) {
            self.end(ek, EndReason::Replaced, ended_on);
        }
    }

    /// Packet time of the last packet that passed under a live entry of
    /// flow `key` (normalized, as NF `stage` sees it) whose path holds
    /// that NF, if one does. The NFs' flow state is not refreshed for
    /// every packet under an entry: it is brought up to this time where
    /// it would look idle (before a batch's packets of the flow reach the
    /// NF, and by sweeps) and when the entry ends.
    pub(crate) fn last_packet(&self, stage: usize, key: &FlowKey) -> Option<u64> {
        let eks = self.by_hash.get(&(stage, key.hash_normalized()))?;
        eks.iter()
            .filter_map(|ek| self.entries.get(ek))
            .filter(|(_, c)| c.path.iter().any(|s| s.stage == stage && s.key == *key))
            .map(|(h, _)| h.last_ns)
            .max()
    }

    /// Takes in a carried copy of an entry of flow `key` (normalized, as it
    /// comes in here). `stage` finds an NF by name and says whether it has
    /// room for an entry. Where this host has an entry of the same flow,
    /// direction and port, the copy adds to its counts what it holds beyond
    /// what an earlier copy of the same entry added; otherwise it becomes
    /// an entry of this host (which an NF's new request for the flow
    /// replaces, handing it the counts). Returns the NFs it was made for.
    pub(crate) fn import(
        &mut self,
        key: FlowKey,
        c: Carried,
        now: u64,
        stage: impl Fn(&str) -> Result<usize, CarryRefusal>,
    ) -> Result<Option<Path>, CarryRefusal> {
        if c.path.is_empty() || c.path.len() > 16 {
            return Err(CarryRefusal::Malformed("a path of no NF or more than 16"));
        }
        if c.ops.len() > MAX_REWRITES {
            return Err(CarryRefusal::Malformed("more header changes than an entry holds"));
        }
        let ek = EntryKey::new(key, c.reverse, c.port);
        if let Some((e, cold)) = self.entries.get_mut(&ek) {
            let (p0, b0) = match cold.took {
                Some((o, p, b)) if o == c.origin => (p, b),
                _ => (0, 0),
            };
            e.packets = e.packets.saturating_add(c.packets.saturating_sub(p0));
            e.bytes = e.bytes.saturating_add(c.bytes.saturating_sub(b0));
            cold.took = Some((c.origin, c.packets.max(p0), c.bytes.max(b0)));
            note(&mut self.changes, &mut self.changes_overflow, key);
            return Ok(None);
        }
        let mut path = Path::new();
        for s in &c.path {
            let at = stage(&s.nf)?;
            if path.iter().any(|p: &Step| p.stage == at) {
                return Err(CarryRefusal::Malformed("an NF twice on one path"));
            }
            path.push(Step { stage: at, key: s.key, reverse: s.reverse, protocol: s.key.protocol, returns: s.returns });
        }
        let has_ports = path
            .iter()
            .all(|s| matches!(s.protocol, sluice_wire::parse::protocol::TCP | sluice_wire::parse::protocol::UDP));
        if !has_ports && c.ops.iter().any(|o| o.port().is_some()) {
            return Err(CarryRefusal::Malformed("a port change for a flow without ports"));
        }
        let fate = match (c.forward, path.last()) {
            (Some(p), _) => Fate::Forward(p),
            (None, Some(last)) => {
                Fate::Dropped(u16::try_from(last.stage).map_err(|_| CarryRefusal::Malformed("a stage past any chain"))?)
            }
            (None, None) => return Err(CarryRefusal::Malformed("no NF dropped it")),
        };
        let out = Out::of(fate).ok_or(CarryRefusal::Malformed("a fate an entry cannot have"))?;
        for s in &path {
            self.by_hash.entry((s.stage, s.key.hash_normalized())).or_default().push(ek);
        }
        if !self.ports.contains(&c.port) {
            self.ports.push(c.port);
        }
        let sweep = (c.idle_ns / 8).clamp(MIN_SWEEP_NS, MAX_SWEEP_NS);
        if self.entries.is_empty() || now.saturating_add(sweep) < self.next_sweep {
            self.next_sweep = now.saturating_add(sweep);
        }
        note(&mut self.changes, &mut self.changes_overflow, key);
        let (stages, flags) = Hot::shape(&path, &c.ops);
        self.entries.insert(
            Hot {
                key: ek,
                packets: c.packets,
                bytes: c.bytes,
                last_ns: now,
                idle_ns: c.idle_ns,
                max_packets: c.max_packets,
                max_bytes: c.max_bytes,
                ends_ns: if c.age_left_ns == u64::MAX { u64::MAX } else { now.saturating_add(c.age_left_ns) },
                batch: self.batch.wrapping_sub(1),
                out,
                label: c.label,
                stages,
                flags,
            },
            Cold {
                ops: c.ops,
                path: path.clone(),
                // Made "before" this batch: an NF's request for the flow
                // in this batch replaces it.
                made: self.batch.wrapping_sub(1),
                origin: c.origin,
                took: Some((c.origin, c.packets, c.bytes)),
            },
        );
        self.counters.installed += 1;
        Ok(Some(path))
    }

    /// Starts noting the flows whose entries change.
    pub(crate) fn track_changes(&mut self) {
        if self.changes.is_none() {
            self.changes = Some(Vec::new());
        }
    }

    /// Appends the flows (normalized, as they come in) whose entries
    /// changed since the last call; `false` if more changed than were
    /// noted (any may have).
    pub(crate) fn take_changes(&mut self, out: &mut Vec<FlowKey>) -> bool {
        if let Some(c) = self.changes.as_mut() {
            out.append(c);
        }
        !std::mem::take(&mut self.changes_overflow)
    }

    /// The flows (normalized, as they come in) that have entries.
    pub(crate) fn flows(&self) -> impl Iterator<Item = FlowKey> + '_ {
        self.entries.iter().map(|(h, _)| h.key.flow())
    }

    /// Ends entry `ek`: what passed under it goes to `ended`, one per NF.
    fn end(&mut self, ek: EntryKey, reason: EndReason, ended: &mut Vec<(Step, Return)>) {
        let Some((e, c)) = self.entries.remove(&ek) else { return };
        self.counters.ended += 1;
        note(&mut self.changes, &mut self.changes_overflow, ek.flow());
        for s in &c.path {
            let h = (s.stage, s.key.hash_normalized());
            if let Some(v) = self.by_hash.get_mut(&h) {
                v.retain(|k| *k != ek);
                if v.is_empty() {
                    self.by_hash.remove(&h);
                }
            }
            let r = Return {
                key: s.key,
                reverse: s.reverse,
                packets: e.packets,
                bytes: e.bytes,
                reason,
                last_ns: e.last_ns,
            };
            ended.push((*s, r));
        }
    }

    /// Ends NF `stage`'s entries of flows with these hashes (as it saw
    /// them), or all of its entries.
    pub(crate) fn revoke(&mut self, stage: usize, hashes: &[u64], all: bool, ended: &mut Vec<(Step, Return)>) {
        let doomed: Vec<EntryKey> = if all {
            self.entries.iter().filter(|(_, c)| c.path.iter().any(|s| s.stage == stage)).map(|(h, _)| h.key).collect()
        } else {
            hashes.iter().filter_map(|h| self.by_hash.get(&(stage, *h))).flatten().copied().collect()
        };
        for ek in doomed {
            self.end(ek, EndReason::Revoked, ended);
        }
    }

    /// Ends every entry whose path holds NF `stage` (`None`: every entry).
    pub(crate) fn end_all(&mut self, stage: Option<usize>, reason: EndReason, ended: &mut Vec<(Step, Return)>) {
        let doomed: Vec<EntryKey> = self
            .entries
            .iter()
            .filter(|(_, c)| stage.is_none_or(|st| c.path.iter().any(|s| s.stage == st)))
            .map(|(h, _)| h.key)
            .collect();
        for ek in doomed {
            self.end(ek, reason, ended);
        }
    }

    /// Ends the entries idle at `now` (at most every eighth of the
    /// shortest idle timeout, between 10 ms and 1 s of packet time).
    pub(crate) fn sweep(&mut self, now: u64, ended: &mut Vec<(Step, Return)>) {
        if self.entries.is_empty() || now < self.next_sweep {
            return;
        }
        let mut shortest = u64::MAX;
        let doomed: Vec<EntryKey> = self
            .entries
            .iter()
            .filter(|(e, _)| {
                shortest = shortest.min(e.idle_ns);
                now.saturating_sub(e.last_ns) >= e.idle_ns
            })
            .map(|(e, _)| e.key)
            .collect();
        for ek in doomed {
            self.end(ek, EndReason::Idle, ended);
        }
        self.next_sweep = now.saturating_add((shortest / 8).clamp(MIN_SWEEP_NS, MAX_SWEEP_NS));
    }
}

/// Notes flow `key` as changed, where changes are noted.
#[inline]
fn note(changes: &mut Option<Vec<FlowKey>>, overflow: &mut bool, key: FlowKey) {
    if let Some(c) = changes {
        if c.len() < MAX_CHANGES {
            c.push(key);
        } else {
            *overflow = true;
        }
    }
}

/// Applies `ops` to the frame in `d` (parsed into `l` before the first).
/// `false` when one does not fit it (the TTL is too low, a malformed
/// header): the caller hands the packet to the NFs.
fn apply(d: &mut [u8], l: &Layers, ops: &[RewriteOp]) -> bool {
    use sluice_wire::rewrite::{Endpoint, decrement_ttl, set_dscp, set_endpoint};
    // A change moves no header and keeps the protocol, so the layers
    // parsed before the first hold for every one.
    ops.iter().all(|op| match *op {
        RewriteOp::Source(a, p) => set_endpoint(d, l, Endpoint::Source, a, p).is_ok(),
        RewriteOp::Destination(a, p) => set_endpoint(d, l, Endpoint::Destination, a, p).is_ok(),
        RewriteOp::DecrementTtl => decrement_ttl(d, l).unwrap_or(false),
        RewriteOp::SetDscp(v) => set_dscp(d, l, v).is_ok(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::RawPacket;
    use crate::fate::PacketResult;
    use sluice_wire::abi::Descriptor;
    use sluice_wire::build::FrameSpec;
    use sluice_wire::tcp::flags::{ACK, FIN};

    fn words(frame: &[u8]) -> [u64; 4] {
        let mut b = crate::batch::BatchBuilder::new(true);
        b.push(RawPacket { data: frame, wire_len: frame.len() as u32, timestamp_ns: 0, ingress_port: 0 });
        Descriptor::decode(&b.batch().descriptors, 0).unwrap().encode()
    }

    fn request(packet: u32, ops: Vec<RewriteOp>) -> Request {
        Request { packet, ops, idle_ns: 0, max_packets: 0, max_bytes: 0, max_age_ns: 0, return_counts: true }
    }

    #[test]
    fn requests_are_checked_against_their_packet_and_the_budget() {
        let tcp = FrameSpec::tcp4([10, 0, 0, 1], 1000, [10, 0, 0, 2], 80, ACK).build();
        let mut arp = vec![0xffu8; 42];
        arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
        let mut c = Calls { room: 1, ..Calls::default() };
        assert_eq!(c.offload(request(0, vec![])), Err(Refusal::NotNow));
        c.open = true;
        c.words = [words(&tcp), words(&arp)].concat();
        assert_eq!(c.offload(request(2, vec![])), Err(Refusal::BadPacket));
        assert!(matches!(c.offload(request(1, vec![])), Err(Refusal::NotOffloadable(_))));
        let v6 = IpAddr128::from_v6([0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        assert!(matches!(c.offload(request(0, vec![RewriteOp::Source(v6, None)])), Err(Refusal::BadRewrite(_))));
        assert!(matches!(c.offload(request(0, vec![RewriteOp::SetDscp(64)])), Err(Refusal::BadRewrite(_))));
        assert!(matches!(c.offload(request(0, vec![RewriteOp::DecrementTtl; 9])), Err(Refusal::BadRewrite(_))));
        assert_eq!(c.offload(request(0, vec![RewriteOp::DecrementTtl])), Ok(()));
        // A second request for the same packet replaces the first; another
        // packet finds no room.
        assert_eq!(c.offload(request(0, vec![])), Ok(()));
        assert_eq!(c.requests.len(), 1);
        c.words.extend(words(&tcp));
        assert_eq!(c.offload(request(2, vec![])), Err(Refusal::OverBudget));
        c.close();
        assert_eq!(c.offload(request(0, vec![])), Err(Refusal::NotNow));
    }

    fn entry_for(t: &mut Table, frame: &[u8], now: u64, idle_ns: u64, ended: &mut Vec<(Step, Return)>) {
        let mut p = Pending::default();
        p.add(0, sluice_wire::parse(frame).key.unwrap().normalize(), Request { idle_ns, ..request(0, vec![]) }, 0);
        assert!(t.install(0, &PacketResult::of(Fate::Forward(1)), p, now, ended));
    }

    #[test]
    fn entries_pass_their_direction_until_fin_idle_or_revoke() {
        let out = FrameSpec::tcp4([10, 0, 0, 1], 1000, [10, 0, 0, 2], 80, ACK).build();
        let back = FrameSpec::tcp4([10, 0, 0, 2], 80, [10, 0, 0, 1], 1000, ACK).build();
        let fin = FrameSpec::tcp4([10, 0, 0, 1], 1000, [10, 0, 0, 2], 80, FIN | ACK).build();
        let mut t = Table::default();
        let mut ended = Vec::new();
        entry_for(&mut t, &out, 0, 1_000_000_000, &mut ended);
        let pass = |t: &mut Table, f: &[u8], now: u64, ended: &mut Vec<(Step, Return)>| {
            let raw = RawPacket { data: f, wire_len: f.len() as u32, timestamp_ns: now, ingress_port: 0 };
            let layers = sluice_wire::parse(f);
            let probe = t.probe(&raw, &layers).unwrap();
            matches!(t.pass(&probe, &raw, &layers, ended, |_, _| {}), Pass::Hit { fate: Fate::Forward(1), .. })
        };
        assert!(pass(&mut t, &out, 1, &mut ended));
        assert!(!pass(&mut t, &back, 2, &mut ended), "only the direction offloaded");
        assert!(!pass(&mut t, &fin, 3, &mut ended), "FIN goes to the NF");
        assert_eq!(t.len(), 0);
        assert_eq!(ended.len(), 1);
        assert_eq!((ended[0].1.packets, ended[0].1.reason), (1, EndReason::Closed));
        ended.clear();
        // Idle expiry, at most every 10 ms of packet time.
        entry_for(&mut t, &out, 0, 1_000_000, &mut ended);
        t.sweep(5_000_000, &mut ended);
        assert_eq!(t.len(), 1, "not yet swept");
        t.sweep(20_000_000, &mut ended);
        assert_eq!((t.len(), ended.pop().map(|e| e.1.reason)), (0, Some(EndReason::Idle)));
        // Revoke by the hash the NF saw, and all.
        entry_for(&mut t, &out, 0, 0, &mut ended);
        let hash = sluice_wire::parse(&out).key.unwrap().normalized().hash_normalized();
        t.revoke(0, &[hash ^ 1], false, &mut ended);
        assert_eq!(t.len(), 1);
        t.revoke(0, &[hash], false, &mut ended);
        assert_eq!((t.len(), ended.pop().map(|e| e.1.reason)), (0, Some(EndReason::Revoked)));
        entry_for(&mut t, &out, 0, 0, &mut ended);
        t.revoke(1, &[], true, &mut ended);
        assert_eq!(t.len(), 1, "another NF's revoke-all");
        t.end_all(None, EndReason::Replaced, &mut ended);
        assert_eq!((t.len(), t.by_hash.len()), (0, 0));
    }

    #[test]
    fn carried_copies_of_one_entry_add_only_what_passed_since_the_last_copy() {
        let out = FrameSpec::tcp4([10, 0, 0, 1], 1000, [10, 0, 0, 2], 80, ACK).build();
        let key = sluice_wire::parse(&out).key.unwrap().normalized();
        let mut a = Table::default();
        let mut ended = Vec::new();
        entry_for(&mut a, &out, 0, 1_000_000_000, &mut ended);
        let raw = RawPacket { data: &out, wire_len: out.len() as u32, timestamp_ns: 1, ingress_port: 0 };
        let layers = sluice_wire::parse(&out);
        for _ in 0..5 {
            a.begin_batch();
            assert!(matches!(
                a.pass(&a.probe(&raw, &layers).unwrap(), &raw, &layers, &mut ended, |_, _| {}),
                Pass::Hit { .. }
            ));
        }
        let name = |i: usize| (i == 0).then(|| "nf".to_string());
        let first = a.carry(&key, name);
        assert_eq!((first.len(), first[0].packets, first[0].path[0].nf.as_str()), (1, 5, "nf"));
        assert_eq!(a.len(), 1, "a copy leaves the entry in place");
        // Another host takes the copy in: an entry with the counts so far.
        let mut b = Table::default();
        let stage = |nf: &str| if nf == "nf" { Ok(0) } else { Err(CarryRefusal::UnknownNf(nf.into())) };
        assert!(b.import(key, first[0].clone(), 10, stage).unwrap().is_some());
        // Three more packets pass at the first host; it hands the flow over.
        for _ in 0..3 {
            a.begin_batch();
            a.pass(&a.probe(&raw, &layers).unwrap(), &raw, &layers, &mut ended, |_, _| {});
        }
        let last = a.carry(&key, name);
        let mut on = Vec::new();
        a.hand_over(&key, &mut on);
        let on: Vec<usize> = on.iter().map(|(s, _)| s.stage).collect();
        assert_eq!((a.len(), on, ended.len()), (0, vec![0], 0), "handed over: nothing returned here");
        // The later copy of the same entry adds the 3, not 8.
        assert!(b.import(key, last[0].clone(), 11, stage).unwrap().is_none());
        b.end_all(None, EndReason::Replaced, &mut ended);
        assert_eq!(ended.pop().map(|(_, r)| r.packets), Some(8));
        // Copies naming an NF this chain lacks, or malformed, are refused.
        let mut c = Table::default();
        let mut bad = last[0].clone();
        bad.path[0].nf = "other".into();
        assert_eq!(c.import(key, bad, 0, stage), Err(CarryRefusal::UnknownNf("other".into())));
        let mut bad = last[0].clone();
        bad.ops = vec![RewriteOp::DecrementTtl; MAX_REWRITES + 1];
        assert!(matches!(c.import(key, bad, 0, stage), Err(CarryRefusal::Malformed(_))));
        assert_eq!(c.len(), 0);
    }
}
