//! Building the batch record the NF receives from raw packets.
//!
//! All packet bytes go into one buffer and all per-packet metadata into
//! fixed-size descriptors (`sluice_wire::abi`), so lowering the batch into
//! guest memory is three copies whatever the packet count. Flows are
//! deduplicated per batch so the host looks each flow's state up once.

use crate::bindings::Batch;
use sluice_wire::FlowKey;
use sluice_wire::abi::{Descriptor, MAX_BATCH, NO_FLOW, NO_L3, NO_L4, packet_flags};
/// Flow keys come off the wire, so the maps are seeded per process (no
/// hash flooding), with foldhash rather than SipHash for speed.
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// A packet as it arrives from packet I/O.
#[derive(Debug, Clone, Copy)]
pub struct RawPacket<'a> {
    /// Captured bytes.
    pub data: &'a [u8],
    /// Length on the wire (≥ `data.len()`).
    pub wire_len: u32,
    /// Arrival time, ns since the Unix epoch.
    pub timestamp_ns: u64,
    /// Ingress port.
    pub ingress_port: u16,
}

/// Builds [`Batch`] records, reusing their buffers between batches.
#[derive(Debug)]
pub struct BatchBuilder {
    batch: Batch,
    flow_index: FlowIndex,
    /// Normalized key of each distinct flow of the batch.
    flow_keys: Vec<FlowKey>,
    /// Largest packet timestamp of the batch.
    max_ts: u64,
    with_flows: bool,
}

impl Default for BatchBuilder {
    fn default() -> Self {
        Self::new(false)
    }
}

impl BatchBuilder {
    /// A builder; `with_flows` decides whether distinct flows are collected
    /// (needed only when some NF wants flow state).
    pub fn new(with_flows: bool) -> Self {
        BatchBuilder {
            batch: Batch { data: Vec::new(), descriptors: Vec::new(), flow_states: Vec::new() },
            flow_index: FlowIndex::default(),
            flow_keys: Vec::new(),
            max_ts: 0,
            with_flows,
        }
    }

    /// Whether it collects the batch's distinct flows.
    pub fn collects_flows(&self) -> bool {
        self.with_flows
    }

    /// Starts a new batch.
    pub fn clear(&mut self) {
        self.batch.data.clear();
        self.batch.descriptors.clear();
        self.batch.flow_states.clear();
        self.flow_index.clear();
        self.flow_keys.clear();
        self.max_ts = 0;
    }

    /// Appends a packet, parsing it for its descriptor. Returns `false`
    /// (and adds nothing) when the batch already holds
    /// [`MAX_BATCH`] packets.
    pub fn push(&mut self, p: RawPacket<'_>) -> bool {
        self.push_parsed(p, &sluice_wire::parse(p.data))
    }

    /// [`push`](Self::push) of a packet already parsed into `layers`
    /// (what [`sluice_wire::parse`] gives for `p.data`).
    #[inline]
    pub fn push_parsed(&mut self, p: RawPacket<'_>, layers: &sluice_wire::Layers) -> bool {
        if self.len() >= MAX_BATCH {
            return false;
        }
        self.batch.data.extend_from_slice(p.data);
        let captured = u32::try_from(p.data.len()).unwrap_or(u32::MAX);
        let mut d = Descriptor {
            end: u32::try_from(self.batch.data.len()).unwrap_or(u32::MAX),
            wire_len: p.wire_len.max(captured),
            timestamp_ns: p.timestamp_ns,
            flow_hash: 0,
            flow: NO_FLOW,
            ingress_port: p.ingress_port,
            l4_offset: layers.l4_offset.unwrap_or(NO_L4),
            l3_offset: layers.l3_offset.and_then(|o| u8::try_from(o).ok()).unwrap_or(NO_L3),
            flags: 0,
        };
        if p.wire_len > captured {
            d.flags |= packet_flags::TRUNCATED;
        }
        if layers.fragment {
            d.flags |= packet_flags::FRAGMENT;
        }
        if layers.ethertype == sluice_wire::ethernet::ethertype::IPV6 {
            d.flags |= packet_flags::IPV6;
        }
        if let Some(k) = layers.key {
            let (norm, reversed) = k.normalize();
            if reversed {
                d.flags |= packet_flags::REVERSE;
            }
            d.flow_hash = norm.hash_normalized();
            if self.with_flows {
                d.flow = self.flow_index.find_or_add(&mut self.flow_keys, norm, d.flow_hash);
            }
        }
        self.batch.descriptors.extend_from_slice(&d.encode());
        self.max_ts = self.max_ts.max(p.timestamp_ns);
        true
    }

    /// Number of packets so far.
    pub fn len(&self) -> usize {
        self.batch.descriptors.len() / sluice_wire::abi::DESCRIPTOR_WORDS
    }

    /// Whether the batch is empty.
    pub fn is_empty(&self) -> bool {
        self.batch.descriptors.is_empty()
    }

    /// The batch, its distinct flows' normalized keys, and its latest
    /// timestamp.
    pub fn parts_mut(&mut self) -> (&mut Batch, &[FlowKey], u64) {
        (&mut self.batch, &self.flow_keys, self.max_ts)
    }

    /// The batch.
    pub fn batch(&self) -> &Batch {
        &self.batch
    }

    /// Normalized keys of the batch's distinct flows.
    pub fn flow_keys(&self) -> &[FlowKey] {
        &self.flow_keys
    }

    /// Packet `i`'s flow, normalized, and whether the packet runs against
    /// the normalized direction: from the descriptor where the builder
    /// collected flows, else parsed from its bytes.
    pub fn packet_flow(&self, i: usize) -> Option<(FlowKey, bool)> {
        let d = Descriptor::decode(&self.batch.descriptors, i)?;
        if d.flow != NO_FLOW
            && let Some(k) = self.flow_keys.get(usize::from(d.flow))
        {
            return Some((*k, d.flags & packet_flags::REVERSE != 0));
        }
        if d.flow_hash == 0 {
            return None;
        }
        sluice_wire::parse(self.packet_bytes(i)).key.map(|k| k.normalize())
    }

    /// Bytes of packet `i` in the batch buffer.
    pub fn packet_bytes(&self, i: usize) -> &[u8] {
        packet_bytes(&self.batch, i)
    }
}

/// The distinct flows of a batch, found by the flow hash each
/// descriptor carries anyway: an open-addressed table of flow indices,
/// at most half full. Each slot holds the batch's generation in its top
/// half and a flow index in the bottom half; a slot of another
/// generation is empty, so clearing the table for the next batch costs
/// one increment, not a pass over every slot. Keys whose hashes collide
/// in more than [`PROBES`](Self::PROBES) slots in a row (crafted to) go
/// to a map with a seeded hasher instead, so no batch costs more than
/// a few probes a packet.
#[derive(Debug, Default)]
struct FlowIndex {
    slots: Vec<u32>,
    /// The current batch's generation (never 0, the value of a slot
    /// never written, once the table has slots).
    generation: u16,
    /// The hash of each flow, by index.
    hashes: Vec<u64>,
    spill: HashMap<FlowKey, u16>,
}

impl FlowIndex {
    const PROBES: usize = 8;
    const MIN_SLOTS: usize = 64;

    fn clear(&mut self) {
        self.generation = self.generation.wrapping_add(1);
        if self.generation == 0 {
            // Every 65,536 batches the stamps come round again.
            self.slots.fill(0);
            self.generation = 1;
        }
        self.hashes.clear();
        if !self.spill.is_empty() {
            self.spill.clear();
        }
    }

    /// The flow index in `slot`, if it was written in this batch.
    #[inline]
    fn held(&self, slot: u32) -> Option<u16> {
        (slot >> 16 == u32::from(self.generation)).then_some(slot as u16)
    }

    /// The index of `key` (normalized, whose hash is `hash`) in `keys`,
    /// where it is appended if new.
    fn find_or_add(&mut self, keys: &mut Vec<FlowKey>, key: FlowKey, hash: u64) -> u16 {
        if (keys.len() + 1) * 2 > self.slots.len() {
            self.grow(keys);
        }
        if let Some(idx) = self.probe(keys, &key, hash) {
            return idx;
        }
        let idx = keys.len() as u16;
        keys.push(key);
        self.hashes.push(hash);
        self.place(&key, hash, idx);
        idx
    }

    /// Where `key` already is, if it is.
    fn probe(&self, keys: &[FlowKey], key: &FlowKey, hash: u64) -> Option<u16> {
        let mask = self.slots.len().wrapping_sub(1);
        let start = Self::start(hash);
        for n in 0..Self::PROBES {
            match self.slots.get(start.wrapping_add(n) & mask).and_then(|&s| self.held(s)) {
                None => return None,
                Some(i) if keys.get(usize::from(i)) == Some(key) => return Some(i),
                Some(_) => {}
            }
        }
        self.spill.get(key).copied()
    }

    /// The first slot of `hash`'s run: all of its bits mixed in, since
    /// the flows of one worker's batch may share some (spread by them).
    #[inline]
    fn start(hash: u64) -> usize {
        (hash.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as usize
    }

    /// Records that `key` is flow `idx` (not yet recorded).
    fn place(&mut self, key: &FlowKey, hash: u64, idx: u16) {
        let mask = self.slots.len().wrapping_sub(1);
        let start = Self::start(hash);
        let stamp = (u32::from(self.generation) << 16) | u32::from(idx);
        for n in 0..Self::PROBES {
            let at = start.wrapping_add(n) & mask;
            if let Some(&s) = self.slots.get(at)
                && self.held(s).is_none()
                && let Some(slot) = self.slots.get_mut(at)
            {
                *slot = stamp;
                return;
            }
        }
        self.spill.insert(*key, idx);
    }

    /// Doubles the table (at least [`MIN_SLOTS`](Self::MIN_SLOTS)) and
    /// places every flow of `keys` again.
    #[cold]
    fn grow(&mut self, keys: &[FlowKey]) {
        let want = ((keys.len() + 1) * 2).next_power_of_two().max(Self::MIN_SLOTS);
        self.slots.clear();
        self.slots.resize(want, 0);
        self.generation = 1;
        self.spill.clear();
        let hashes = std::mem::take(&mut self.hashes);
        for (i, (k, &h)) in keys.iter().zip(&hashes).enumerate() {
            self.place(k, h, i as u16);
        }
        self.hashes = hashes;
    }
}

/// Bytes of packet `i` of a batch.
pub fn packet_bytes(b: &Batch, i: usize) -> &[u8] {
    let end = Descriptor::decode(&b.descriptors, i).map(|d| d.end as usize);
    let start = if i == 0 { Some(0) } else { Descriptor::decode(&b.descriptors, i - 1).map(|d| d.end as usize) };
    match (start, end) {
        (Some(s), Some(e)) => b.data.get(s..e).unwrap_or(&[]),
        _ => &[],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_wire::build::FrameSpec;

    #[test]
    fn flows_are_deduplicated_across_directions() {
        let a = FrameSpec::tcp4([10, 0, 0, 1], 1000, [10, 0, 0, 2], 80, 2).build();
        let b = FrameSpec::tcp4([10, 0, 0, 2], 80, [10, 0, 0, 1], 1000, 0x12).build();
        let c = FrameSpec::udp4([10, 0, 0, 3], 53, [10, 0, 0, 4], 53).build();
        let mut bb = BatchBuilder::new(true);
        for d in [&a, &b, &c, &[0u8; 3][..]] {
            assert!(bb.push(RawPacket { data: d, wire_len: d.len() as u32, timestamp_ns: 5, ingress_port: 0 }));
        }
        let batch = bb.batch();
        let desc: Vec<Descriptor> = (0..4).map(|i| Descriptor::decode(&batch.descriptors, i).unwrap()).collect();
        assert_eq!(bb.flow_keys().len(), 2);
        assert_eq!(desc.iter().map(|d| d.flow).collect::<Vec<_>>(), vec![0, 0, 1, NO_FLOW]);
        assert_eq!(desc[0].flow_hash, desc[1].flow_hash);
        assert_eq!(desc[0].flags & packet_flags::REVERSE, 0);
        assert_eq!(desc[1].flags & packet_flags::REVERSE, packet_flags::REVERSE);
        assert_eq!(bb.packet_bytes(2), &c[..]);
        assert_eq!(bb.packet_bytes(3), &[0u8; 3][..]);
        assert_eq!(desc[3].flow_hash, 0);
        assert_eq!(desc[3].l3_offset, NO_L3);
        assert_eq!(desc[0].l4_offset, 34);
        assert_eq!(desc[0].l3_offset, 14);
    }

    fn key(n: u32) -> FlowKey {
        FlowKey {
            src: sluice_wire::IpAddr128::from_v4(n.to_be_bytes()),
            dst: sluice_wire::IpAddr128::from_v4([10, 0, 0, 1]),
            src_port: 1000,
            dst_port: 80,
            protocol: 6,
        }
    }

    #[test]
    fn flows_whose_hashes_all_collide_are_told_apart() {
        // A crafted batch: every flow hashes the same.
        let mut index = FlowIndex::default();
        let mut keys = Vec::new();
        for n in 0..300 {
            assert_eq!(index.find_or_add(&mut keys, key(n), 7), n as u16);
        }
        for n in (0..300).rev() {
            assert_eq!(index.find_or_add(&mut keys, key(n), 7), n as u16);
        }
        assert_eq!(keys.len(), 300);
        index.clear();
        keys.clear();
        assert_eq!(index.find_or_add(&mut keys, key(299), 7), 0);
    }

    #[test]
    fn a_cleared_index_forgets_every_flow_also_when_its_generations_come_round() {
        // Flows of one batch must not be found in the next, over more
        // batches than a slot's generation stamp counts.
        let mut index = FlowIndex::default();
        let mut keys = Vec::new();
        for batch in 0..70_000u32 {
            index.clear();
            keys.clear();
            let (a, b) = (key(batch % 5), key(batch % 5 + 1));
            assert_eq!(index.find_or_add(&mut keys, a, u64::from(batch % 5)), 0);
            assert_eq!(index.find_or_add(&mut keys, b, u64::from(batch % 5 + 1)), 1);
            assert_eq!(index.find_or_add(&mut keys, a, u64::from(batch % 5)), 0);
            assert_eq!(keys.len(), 2);
        }
    }

    proptest::proptest! {
        #[test]
        fn the_flow_index_numbers_flows_as_a_map_would(
            flows in proptest::collection::vec(0u32..400, 0..900),
            hashes in 1u64..20,
        ) {
            // Few distinct hashes: runs of collisions, spills, growth.
            let mut index = FlowIndex::default();
            let mut keys = Vec::new();
            let mut model: std::collections::HashMap<u32, u16> = std::collections::HashMap::new();
            for n in flows {
                let next = model.len() as u16;
                let want = *model.entry(n).or_insert(next);
                proptest::prop_assert_eq!(index.find_or_add(&mut keys, key(n), u64::from(n) % hashes), want);
            }
            proptest::prop_assert_eq!(keys.len(), model.len());
        }
    }

    #[test]
    fn batches_are_capped() {
        let f = FrameSpec::udp4([10, 0, 0, 1], 1, [10, 0, 0, 2], 2).build();
        let mut bb = BatchBuilder::new(false);
        for _ in 0..MAX_BATCH {
            assert!(bb.push(RawPacket { data: &f, wire_len: 0, timestamp_ns: 0, ingress_port: 0 }));
        }
        assert!(!bb.push(RawPacket { data: &f, wire_len: 0, timestamp_ns: 0, ingress_port: 0 }));
    }
}
