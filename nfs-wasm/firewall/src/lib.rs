//! A stateful 5-tuple firewall.
//!
//! Ordered allow/deny rules over protocol, source/destination CIDR and port
//! ranges decide the first packet of a connection; the decision to allow is
//! remembered in host-owned per-flow state so that replies pass without a
//! rule of their own. TCP connections open on SYN and close on RST, or after
//! FINs from both sides and the final ACK; a closed connection's late
//! segments (the other side's FIN, ACK or RST, sent before it saw the
//! close) still pass until its state idles out, as Linux's connection
//! tracking keeps closed connections, and a new SYN on its 5-tuple is
//! decided by the rules again. ICMP errors about a known
//! connection pass too (`related`). See README.md for the config.
//!
//! An ICMP error is another flow than the connection it is about (its own
//! 5-tuple is the router and the host, without ports), and per-flow state,
//! handed in with the batch or kept in a per-flow table, is keyed by the
//! batch's own flows: no NF can read another flow's. So open connections
//! are also indexed by their normalized 5-tuple in `connections`, a global
//! single-writer table that any worker reads: written when a connection
//! opens, again every half idle timeout while it lives (its entries idle
//! out from their last write), emptied when it closes. A batch costs one
//! `put-many` if it opens, refreshes or closes connections and one
//! `get-many` if it holds ICMP errors without state of their own.

mod link;
mod related;
mod rules;

pub use rules::{Action, Config, DEFAULT_RELATED_CAPACITY, Rule};

use sluice_sdk::offload::{Admission, Offload};
use sluice_sdk::state::{Bytes, Counters, Merge, StateError, TableSpec, frames, push_frame};
use sluice_sdk::wire::parse::protocol;
use sluice_sdk::wire::tcp::flags;
use sluice_sdk::{Batch, Event, FlowKey, Level, NetworkFunction, NfInfo, Verdict, emit};
use std::collections::HashMap;

/// A connection's phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Phase {
    /// Allowed and open.
    Open = 1,
    /// FIN seen from the normalized source side.
    FinSrc = 2,
    /// FIN seen from the normalized destination side.
    FinDst = 3,
    /// FIN seen from both sides: the next packet (the final ACK) passes and
    /// closes it.
    Closing = 4,
    /// Closed by RST or the final ACK: late segments without SYN pass, a
    /// SYN is decided by the rules; the state idles out. (A version that
    /// does not know this phase reads no state: the rules decide.)
    Closed = 5,
}

impl Phase {
    fn from_byte(b: u8) -> Option<Phase> {
        match b {
            1 => Some(Phase::Open),
            2 => Some(Phase::FinSrc),
            3 => Some(Phase::FinDst),
            4 => Some(Phase::Closing),
            5 => Some(Phase::Closed),
            _ => None,
        }
    }
}

/// A connection's per-flow state: its phase; the label its allowing rule
/// gave; the refresh period (see [`Index::epoch`]) in which it was last
/// written to `connections`. Encoded as the phase byte, then the label
/// (u16 little-endian) if any, then that period's byte if any: 1 to 4
/// bytes. A label is there exactly when the state has 3 bytes or more, as
/// in versions without the index, so each reads the other's state: theirs
/// as never indexed, ours with the period byte ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ConnState {
    phase: Phase,
    label: Option<u16>,
    indexed: Option<u8>,
}

impl ConnState {
    fn decode(s: &[u8]) -> Option<ConnState> {
        let phase = Phase::from_byte(*s.first()?)?;
        let label = match s.get(1..3) {
            Some(&[a, b]) => Some(u16::from_le_bytes([a, b])),
            _ => None,
        };
        let indexed = match s.len() {
            2 => s.get(1).copied(),
            4 => s.get(3).copied(),
            _ => None,
        };
        Some(ConnState { phase, label, indexed })
    }

    fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(4);
        v.push(self.phase as u8);
        if let Some(l) = self.label {
            v.extend_from_slice(&l.to_le_bytes());
        }
        if let Some(e) = self.indexed {
            v.push(e);
        }
        v
    }
}

/// A `connections` value: 1 for a connection without a label, else 1
/// and the label (u16 little-endian), which its ICMP errors get too.
fn encode_index(label: Option<u16>) -> Vec<u8> {
    let mut v = vec![1];
    if let Some(l) = label {
        v.extend_from_slice(&l.to_le_bytes());
    }
    v
}

/// The label of a `connections` value; `None` if the connection is not
/// indexed.
fn decode_index(v: &[u8]) -> Option<Option<u16>> {
    match v {
        [] => None,
        [_, a, b] => Some(Some(u16::from_le_bytes([*a, *b]))),
        _ => Some(None),
    }
}

/// The `connections` index and what this batch changes in it.
#[derive(Debug)]
struct Index {
    table: Bytes,
    /// Half the idle timeout: a connection's entry is written again in
    /// each such period that has packets of it.
    refresh_s: u64,
    /// This batch's writes: a connection's normalized key and its value
    /// (`None`: remove), in order.
    writes: Vec<(FlowKey, Option<Option<u16>>)>,
}

impl Index {
    /// The refresh period of packet time `ts_ns`, modulo 256. An entry
    /// idles out a whole timeout (two periods) after its last write, and
    /// is written again at the first packet of a later period: it outlives
    /// the connection's last packet by at least half the timeout. Two
    /// periods 256 apart look alike, but no connection lives that long
    /// without a packet.
    fn epoch(&self, ts_ns: u64) -> u8 {
        (ts_ns / 1_000_000_000 / self.refresh_s % 256) as u8
    }
}

/// The firewall NF.
#[derive(Debug)]
pub struct Firewall {
    config: Config,
    /// Connections decided per rule, summed over workers (`rule-hits`).
    hits: Counters,
    /// This batch's hits per rule key, folded into one `counter-add`.
    batch_hits: Vec<(u64, i64)>,
    /// Open connections by 5-tuple, for ICMP errors (`related-icmp`).
    index: Option<Index>,
    /// Established packets per connection direction, until offloaded
    /// (`offload-after`).
    admission: Option<Admission>,
}

/// Key of `rule-hits` for connections decided by the default action.
pub const DEFAULT_RULE_KEY: u64 = u32::MAX as u64;

/// Key of `rule-hits` for ICMP errors passed because their connection is
/// known (decided by no rule).
pub const RELATED_RULE_KEY: u64 = u32::MAX as u64 - 1;

/// Key of `rule-hits` for link protocols (ARP, neighbour and multicast
/// listener discovery) passed by `allow-link-protocols` (decided by no
/// rule).
pub const LINK_RULE_KEY: u64 = u32::MAX as u64 - 2;

impl NetworkFunction for Firewall {
    fn init(config: &[u8]) -> Result<(Self, NfInfo), String> {
        let config = Config::parse(config)?;
        let timeout = config.idle_timeout_ns();
        let hits = Counters::declare(TableSpec::eventual_counter("rule-hits", Merge::Sum, 1_000_000_000))
            .map_err(|e| format!("firewall: cannot declare table 'rule-hits': {e}"))?;
        let index = if config.related_icmp {
            let idle_s = config.idle_timeout_s();
            // Synced every batch: an ICMP error comes a round trip or more
            // after the packet that opened its connection.
            let spec = TableSpec::single_writer_bytes("connections", FlowKey::ENCODED_LEN as u32, 3, 0)
                .capacity(config.related_capacity)
                .idle_timeout_ns(idle_s.saturating_mul(1_000_000_000));
            let table =
                Bytes::declare(spec).map_err(|e| format!("firewall: cannot declare table 'connections': {e}"))?;
            let refresh_s = (idle_s / 2).max(1);
            Some(Index { table, refresh_s, writes: Vec::new() })
        } else {
            None
        };
        let admission = config.offload.then(|| Admission::new(config.offload_after));
        Ok((Firewall { config, hits, batch_hits: Vec::new(), index, admission }, NfInfo::with_flow_state(timeout)))
    }

    fn process(&mut self, batch: &mut Batch) -> Result<(), String> {
        let mut denied: Vec<Event> = Vec::new();
        // ICMP errors without state of their own, their connections, and
        // how many index writes the batch had made before them: decided
        // after one read of the index, as of their place in the batch.
        let mut errors: Vec<(usize, FlowKey, usize)> = Vec::new();
        // (flow, direction) offloaded in this batch: one request each.
        let mut offloaded: Vec<(u32, bool)> = Vec::new();
        // Link protocols pass and open nothing: without them the hosts on
        // either side of the link cannot reach each other at all.
        let link = self.config.allow_link_protocols;
        for i in 0..batch.len() {
            let Some(p) = batch.packet(i) else { continue };
            let Some(key) = p.key() else {
                if link && link::is_arp(&p) {
                    self.count_hit(LINK_RULE_KEY);
                } else if !self.config.allow_non_ip {
                    // Other non-IP traffic (LLDP, ...) is decided by config.
                    batch.set_verdict(i, Verdict::Drop);
                }
                continue;
            };
            if link && key.protocol == protocol::ICMPV6 && link::is_icmpv6_link(&p) {
                self.count_hit(LINK_RULE_KEY);
                continue;
            }
            let tcp_flags = p.tcp().map(|t| t.flags());
            let flow = p.flow();
            let state = flow.and_then(|f| batch.flow_state(f)).and_then(ConnState::decode);
            let from_src = key.is_normalized();
            let ts_ns = p.timestamp_ns();
            let hash = p.flow_hash();

            if let (Some(st), Some(f)) = (state, flow) {
                // A known, allowed connection: pass (with its label), and
                // follow TCP teardown.
                if st.phase == Phase::Closed {
                    // A new connection on a closed one's 5-tuple.
                    if tcp_flags.is_some_and(|fl| fl & flags::SYN != 0 && fl & flags::ACK == 0) {
                        self.decide_new(batch, i, &mut denied);
                    } else if let Some(l) = st.label {
                        batch.set_verdict(i, Verdict::Label(l));
                    }
                    continue;
                }
                if let Some(l) = st.label {
                    batch.set_verdict(i, Verdict::Label(l));
                }
                let mut next = st;
                let closed = match tcp_flags {
                    Some(fl) if fl & flags::RST != 0 => true,
                    Some(fl) if fl & flags::FIN != 0 => {
                        next.phase = match (st.phase, from_src) {
                            (Phase::Open, true) => Phase::FinSrc,
                            (Phase::Open, false) => Phase::FinDst,
                            (Phase::FinSrc, false) | (Phase::FinDst, true) => Phase::Closing,
                            (p, _) => p,
                        };
                        false
                    }
                    Some(_) => st.phase == Phase::Closing,
                    None => false,
                };
                if closed {
                    // Kept, closed, for the other side's late segments.
                    batch.set_flow_state(f, ConnState { phase: Phase::Closed, ..st }.encode());
                    if let Some(ix) = &mut self.index {
                        ix.writes.push((key.normalized(), None));
                    }
                    continue;
                }
                if let Some(ix) = &mut self.index {
                    let epoch = ix.epoch(ts_ns);
                    if st.indexed != Some(epoch) {
                        next.indexed = Some(epoch);
                        ix.writes.push((key.normalized(), Some(st.label)));
                    }
                }
                if next != st {
                    batch.set_flow_state(f, next.encode());
                }
                // An established connection (no SYN, FIN or RST in this
                // packet): the host passes its later packets this way
                // until FIN or RST; with the ICMP index on, they come back
                // once per refresh period to keep it written.
                let established = next.phase == Phase::Open
                    && tcp_flags.is_none_or(|fl| fl & (flags::SYN | flags::FIN | flags::RST) == 0);
                if established
                    && let Some(gate) = &mut self.admission
                    && gate.admit(hash, !from_src)
                    && !offloaded.contains(&(f, from_src))
                {
                    offloaded.push((f, from_src));
                    let age = self.index.as_ref().map_or(0, |ix| ix.refresh_s.saturating_mul(1_000_000_000));
                    batch.offload(Offload::packet(i).max_age_ns(age).without_counts());
                }
                continue;
            }

            if self.index.is_some()
                && let Some(icmp) = p.icmp()
                && related::is_error(icmp.msg_type(), p.ipv6().is_some())
                && let Some(conn) =
                    related::connection(p.bytes(), usize::from(p.descriptor().l4_offset), p.ipv6().is_some(), key.dst)
            {
                errors.push((i, conn, self.index.as_ref().map_or(0, |ix| ix.writes.len())));
                continue;
            }
            self.decide_new(batch, i, &mut denied);
        }

        if !errors.is_empty() {
            let found = self.lookup(&errors);
            for ((i, _, _), label) in errors.iter().zip(found) {
                match label {
                    Some(label) => {
                        if let Some(l) = label {
                            batch.set_verdict(*i, Verdict::Label(l));
                        }
                        self.count_hit(RELATED_RULE_KEY);
                    }
                    None => self.decide_new(batch, *i, &mut denied),
                }
            }
        }
        self.flush_index();
        if !denied.is_empty() {
            emit(&denied);
        }
        self.flush_hits()
    }
}

impl Firewall {
    /// Decides packet `i`, of a flow without state, by the rules.
    fn decide_new(&mut self, batch: &mut Batch, i: usize, denied: &mut Vec<Event>) {
        let Some(p) = batch.packet(i) else { return };
        let Some(key) = p.key() else { return };
        let tcp_flags = p.tcp().map(|t| t.flags());
        let flow = p.flow();
        let ts_ns = p.timestamp_ns();
        let hash = p.flow_hash();
        let rule = self.config.matching_rule(&key);
        let hit = rule.map(|(n, _)| n as u64).unwrap_or(DEFAULT_RULE_KEY);
        let action = rule.map(|(_, r)| r.action).unwrap_or(self.config.default);
        let label = rule.and_then(|(_, r)| r.label);
        let rule_name = rule.map(|(n, _)| n.to_string()).unwrap_or_else(|| "default".into());
        self.count_hit(hit);
        match action {
            Action::Allow => {
                if let Some(l) = label {
                    batch.set_verdict(i, Verdict::Label(l));
                }
                // Only a connection opening creates state: a stray TCP
                // segment of an unknown connection passes on the rule
                // alone but does not open the reverse direction.
                let opens = match tcp_flags {
                    Some(fl) => fl & flags::SYN != 0 && fl & (flags::ACK | flags::RST) == 0,
                    None => true,
                };
                if opens && let Some(f) = flow {
                    let indexed = self.index.as_mut().map(|ix| {
                        ix.writes.push((key.normalized(), Some(label)));
                        ix.epoch(ts_ns)
                    });
                    batch.set_flow_state(f, ConnState { phase: Phase::Open, label, indexed }.encode());
                    if let Some(gate) = &mut self.admission {
                        gate.forget(hash);
                    }
                }
            }
            Action::Deny => {
                batch.set_verdict(i, Verdict::Drop);
                if self.config.log_denied {
                    denied.push(Event {
                        kind: "firewall.deny".into(),
                        level: Level::Info,
                        packet: Some(i as u32),
                        fields: vec![("flow".into(), key.to_string()), ("rule".into(), rule_name)],
                    });
                }
            }
        }
    }

    fn count_hit(&mut self, key: u64) {
        match self.batch_hits.iter_mut().find(|(k, _)| *k == key) {
            Some((_, n)) => *n += 1,
            None => self.batch_hits.push((key, 1)),
        }
    }

    /// Whether each connection is known, and its label: the batch's own
    /// writes made before the error (a connection opened, or closed,
    /// earlier in the batch), else one `get-many` for all the others. A
    /// failed read knows no connection: the rules decide.
    fn lookup(&self, errors: &[(usize, FlowKey, usize)]) -> Vec<Option<Option<u16>>> {
        let Some(ix) = &self.index else { return vec![None; errors.len()] };
        let mut written: HashMap<FlowKey, Vec<usize>> = HashMap::new();
        for (at, (k, _)) in ix.writes.iter().enumerate() {
            written.entry(*k).or_default().push(at);
        }
        // The batch's last write of the key before the error, if any.
        let before = |k: &FlowKey, n: usize| {
            let at = written.get(k)?;
            let last = at.get(at.partition_point(|w| *w < n).checked_sub(1)?)?;
            ix.writes.get(*last).map(|(_, v)| *v)
        };
        let mut out = Vec::with_capacity(errors.len());
        let mut ask: Vec<usize> = Vec::new();
        let mut keys = Vec::new();
        for (n, (_, k, writes_before)) in errors.iter().enumerate() {
            match before(k, *writes_before) {
                Some(v) => out.push(v),
                None => {
                    out.push(None);
                    ask.push(n);
                    push_frame(&mut keys, &k.to_bytes());
                }
            }
        }
        if ask.is_empty() {
            return out;
        }
        match ix.table.get_many(&keys) {
            Ok(values) => {
                for (n, v) in ask.iter().zip(frames(&values)) {
                    if let (Some(slot), Ok(v)) = (out.get_mut(*n), v) {
                        *slot = decode_index(v);
                    }
                }
            }
            Err(e) => sluice_sdk::log(Level::Warn, &format!("firewall: reading table 'connections': {e}")),
        }
        out
    }

    /// One `put-many` for the batch's index writes. A full table or a
    /// used-up budget only costs those connections their ICMP errors (the
    /// host counts the refusal); traffic goes on.
    fn flush_index(&mut self) {
        let Some(ix) = &mut self.index else { return };
        if ix.writes.is_empty() {
            return;
        }
        let mut entries = Vec::with_capacity(ix.writes.len() * (12 + FlowKey::ENCODED_LEN));
        for (k, v) in ix.writes.drain(..) {
            push_frame(&mut entries, &k.to_bytes());
            push_frame(&mut entries, &v.map(encode_index).unwrap_or_default());
        }
        if let Err(e) = ix.table.put_many(&entries)
            && !matches!(e, StateError::Full(_) | StateError::OverBudget(_))
        {
            sluice_sdk::log(Level::Warn, &format!("firewall: writing table 'connections': {e}"));
        }
    }

    /// One `counter-add` for the batch's rule hits.
    fn flush_hits(&mut self) -> Result<(), String> {
        if self.batch_hits.is_empty() {
            return Ok(());
        }
        let (keys, deltas): (Vec<u64>, Vec<i64>) = self.batch_hits.drain(..).unzip();
        match self.hits.add(&keys, &deltas) {
            // Statistics only: a full table must not stop the traffic (the
            // host counts the refusal).
            Ok(()) | Err(StateError::Full(_) | StateError::OverBudget(_)) => Ok(()),
            Err(e) => Err(format!("firewall: counting rule hits: {e}")),
        }
    }
}

sluice_sdk::export_nf!(Firewall);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_state_reads_every_layout_by_its_length() {
        let all = [
            ConnState { phase: Phase::Open, label: None, indexed: None },
            ConnState { phase: Phase::FinSrc, label: None, indexed: Some(200) },
            ConnState { phase: Phase::FinDst, label: Some(7), indexed: None },
            ConnState { phase: Phase::Closing, label: Some(0xbeef), indexed: Some(3) },
            ConnState { phase: Phase::Closed, label: Some(9), indexed: None },
        ];
        for (st, len) in all.iter().zip([1, 2, 3, 4]) {
            assert_eq!(st.encode().len(), len);
            assert_eq!(ConnState::decode(&st.encode()), Some(*st));
            // What a version without the index reads: the label exactly
            // when there are 3 bytes or more.
            let old_label = st.encode().get(1..3).map(|b| u16::from_le_bytes([b[0], b[1]]));
            assert_eq!(old_label, st.label);
        }
        assert_eq!(ConnState::decode(&[9]), None);
        assert_eq!(decode_index(&encode_index(Some(300))), Some(Some(300)));
        assert_eq!(decode_index(&encode_index(None)), Some(None));
        assert_eq!(decode_index(&[]), None);
    }

    #[test]
    fn refresh_periods_are_half_the_timeout() {
        let ix = Index { table: Bytes(0), refresh_s: 60, writes: Vec::new() };
        let s = 1_000_000_000u64;
        assert_eq!(ix.epoch(0), ix.epoch(59 * s));
        assert_ne!(ix.epoch(59 * s), ix.epoch(60 * s));
        assert_eq!(ix.epoch(0), ix.epoch(256 * 60 * s));
    }
}
