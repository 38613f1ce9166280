//! Building the columnar batch record the NF receives from raw packets.
//!
//! All packet bytes go into one buffer and every per-packet field into an
//! integer column, so lowering the batch into guest memory is one copy per
//! column. Flows are deduplicated per batch so the host looks each flow's
//! state up once, whatever the packet count.

use crate::bindings::Batch;
use sluice_wire::FlowKey;
use sluice_wire::abi::{NO_FLOW, NO_OFFSET, packet_flags};
use std::collections::HashMap;

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

impl Default for Batch {
    fn default() -> Self {
        Batch {
            data: Vec::new(),
            ends: Vec::new(),
            wire_lens: Vec::new(),
            timestamps: Vec::new(),
            ingress_ports: Vec::new(),
            l3_offsets: Vec::new(),
            l4_offsets: Vec::new(),
            packet_flags: Vec::new(),
            flow_hashes: Vec::new(),
            flows: Vec::new(),
            state_data: Vec::new(),
            state_ends: Vec::new(),
        }
    }
}

/// Builds [`Batch`] records, reusing their buffers between batches.
#[derive(Debug, Default)]
pub struct BatchBuilder {
    batch: Batch,
    flow_index: HashMap<FlowKey, u32>,
    /// Normalized key of each distinct flow of the batch.
    flow_keys: Vec<FlowKey>,
    /// Largest packet timestamp of the batch.
    max_ts: u64,
    with_flows: bool,
}

impl BatchBuilder {
    /// A builder; `with_flows` decides whether distinct flows are collected
    /// (needed only when some NF wants flow state).
    pub fn new(with_flows: bool) -> Self {
        BatchBuilder { with_flows, ..Default::default() }
    }

    /// Starts a new batch.
    pub fn clear(&mut self) {
        let b = &mut self.batch;
        b.data.clear();
        b.ends.clear();
        b.wire_lens.clear();
        b.timestamps.clear();
        b.ingress_ports.clear();
        b.l3_offsets.clear();
        b.l4_offsets.clear();
        b.packet_flags.clear();
        b.flow_hashes.clear();
        b.flows.clear();
        b.state_data.clear();
        b.state_ends.clear();
        self.flow_index.clear();
        self.flow_keys.clear();
        self.max_ts = 0;
    }

    /// Appends a packet, parsing it for the metadata columns.
    pub fn push(&mut self, p: RawPacket<'_>) {
        let b = &mut self.batch;
        b.data.extend_from_slice(p.data);
        let captured = u32::try_from(p.data.len()).unwrap_or(u32::MAX);
        b.ends.push(u32::try_from(b.data.len()).unwrap_or(u32::MAX));
        b.wire_lens.push(p.wire_len.max(captured));
        b.timestamps.push(p.timestamp_ns);
        b.ingress_ports.push(p.ingress_port);
        let layers = sluice_wire::parse(p.data);
        b.l3_offsets.push(layers.l3_offset.unwrap_or(NO_OFFSET));
        b.l4_offsets.push(layers.l4_offset.unwrap_or(NO_OFFSET));
        let mut flags = 0u8;
        if p.wire_len > captured {
            flags |= packet_flags::TRUNCATED;
        }
        if layers.fragment {
            flags |= packet_flags::FRAGMENT;
        }
        if layers.ethertype == sluice_wire::ethernet::ethertype::IPV6 {
            flags |= packet_flags::IPV6;
        }
        match layers.key {
            Some(k) => {
                if !k.is_normalized() {
                    flags |= packet_flags::REVERSE;
                }
                b.flow_hashes.push(k.symmetric_hash());
                let flow = if self.with_flows {
                    let norm = k.normalized();
                    let next = self.flow_keys.len() as u32;
                    let idx = *self.flow_index.entry(norm).or_insert(next);
                    if idx == next {
                        self.flow_keys.push(norm);
                    }
                    idx
                } else {
                    NO_FLOW
                };
                b.flows.push(flow);
            }
            None => {
                b.flow_hashes.push(0);
                b.flows.push(NO_FLOW);
            }
        }
        b.packet_flags.push(flags);
        self.max_ts = self.max_ts.max(p.timestamp_ns);
    }

    /// Number of packets so far.
    pub fn len(&self) -> usize {
        self.batch.ends.len()
    }

    /// Whether the batch is empty.
    pub fn is_empty(&self) -> bool {
        self.batch.ends.is_empty()
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

    /// Bytes of packet `i` in the batch buffer.
    pub fn packet_bytes(&self, i: usize) -> &[u8] {
        packet_bytes(&self.batch, i)
    }
}

/// Bytes of packet `i` of a batch.
pub fn packet_bytes(b: &Batch, i: usize) -> &[u8] {
    let start = if i == 0 { 0 } else { b.ends.get(i - 1).copied().unwrap_or(0) as usize };
    let end = b.ends.get(i).copied().unwrap_or(0) as usize;
    b.data.get(start..end).unwrap_or(&[])
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
            bb.push(RawPacket { data: d, wire_len: d.len() as u32, timestamp_ns: 5, ingress_port: 0 });
        }
        let batch = bb.batch();
        assert_eq!(bb.flow_keys().len(), 2);
        assert_eq!(batch.flows, vec![0, 0, 1, NO_FLOW]);
        assert_eq!(batch.flow_hashes[0], batch.flow_hashes[1]);
        assert_eq!(batch.packet_flags[0] & packet_flags::REVERSE, 0);
        assert_eq!(batch.packet_flags[1] & packet_flags::REVERSE, packet_flags::REVERSE);
        assert_eq!(bb.packet_bytes(2), &c[..]);
        assert_eq!(bb.packet_bytes(3), &[0u8; 3][..]);
        assert_eq!(batch.flow_hashes[3], 0);
        assert_eq!(batch.l3_offsets[3], NO_OFFSET);
        assert_eq!(batch.l4_offsets[0], 34);
    }
}
