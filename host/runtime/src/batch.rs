//! Building the batch record the NF receives from raw packets.
//!
//! All packet bytes go into one buffer so that lowering the batch into guest
//! memory is one allocation and one copy. Flows are deduplicated per batch
//! so the host looks each flow's state up once, whatever the packet count.

use crate::bindings::{Batch, Flow, PacketMeta};
use sluice_wire::FlowKey;
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

/// Builds [`Batch`] records, reusing its buffers between batches.
#[derive(Debug, Default)]
pub struct BatchBuilder {
    batch: Batch,
    flow_index: HashMap<FlowKey, u32>,
    /// Normalized key of each flow of the batch (host-side copy).
    flow_keys: Vec<FlowKey>,
    /// Largest packet timestamp of the batch.
    max_ts: u64,
    with_flows: bool,
}

impl Default for Batch {
    fn default() -> Self {
        Batch { data: Vec::new(), packets: Vec::new(), flows: Vec::new() }
    }
}

impl BatchBuilder {
    /// A builder; `with_flows` decides whether flows are collected (only
    /// needed when some NF wants flow state).
    pub fn new(with_flows: bool) -> Self {
        BatchBuilder { with_flows, ..Default::default() }
    }

    /// Starts a new batch.
    pub fn clear(&mut self) {
        self.batch.data.clear();
        self.batch.packets.clear();
        self.batch.flows.clear();
        self.flow_index.clear();
        self.flow_keys.clear();
        self.max_ts = 0;
    }

    /// Appends a packet, parsing it for the metadata. Packets larger than
    /// 4 GiB in total per batch cannot occur (batches are small), but the
    /// offsets saturate rather than wrap if they did.
    pub fn push(&mut self, p: RawPacket<'_>) {
        let offset = u32::try_from(self.batch.data.len()).unwrap_or(u32::MAX);
        self.batch.data.extend_from_slice(p.data);
        let layers = sluice_wire::parse(p.data);
        let (flow, flow_hash) = match layers.key {
            Some(k) => {
                let hash = k.symmetric_hash();
                let flow = if self.with_flows {
                    let norm = k.normalized();
                    let next = self.flow_keys.len() as u32;
                    let idx = *self.flow_index.entry(norm).or_insert(next);
                    if idx == next {
                        self.flow_keys.push(norm);
                        self.batch.flows.push(Flow { key: norm.into(), state: None });
                    }
                    Some(idx)
                } else {
                    None
                };
                (flow, hash)
            }
            None => (None, 0),
        };
        self.max_ts = self.max_ts.max(p.timestamp_ns);
        self.batch.packets.push(PacketMeta {
            offset,
            len: u32::try_from(p.data.len()).unwrap_or(u32::MAX),
            wire_len: p.wire_len.max(u32::try_from(p.data.len()).unwrap_or(u32::MAX)),
            ingress_port: p.ingress_port,
            timestamp_ns: p.timestamp_ns,
            l3_offset: layers.l3_offset,
            l4_offset: layers.l4_offset,
            key: layers.key.map(Into::into),
            flow,
            flow_hash,
        });
    }

    /// Number of packets so far.
    pub fn len(&self) -> usize {
        self.batch.packets.len()
    }

    /// Whether the batch is empty.
    pub fn is_empty(&self) -> bool {
        self.batch.packets.is_empty()
    }

    /// The batch, its flows' normalized keys, and its latest timestamp.
    pub fn parts_mut(&mut self) -> (&mut Batch, &[FlowKey], u64) {
        (&mut self.batch, &self.flow_keys, self.max_ts)
    }

    /// The batch.
    pub fn batch(&self) -> &Batch {
        &self.batch
    }

    /// Bytes of packet `i` in the batch buffer.
    pub fn packet_bytes(&self, i: usize) -> &[u8] {
        self.batch
            .packets
            .get(i)
            .and_then(|m| self.batch.data.get(m.offset as usize..(m.offset + m.len) as usize))
            .unwrap_or(&[])
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
            bb.push(RawPacket { data: d, wire_len: d.len() as u32, timestamp_ns: 5, ingress_port: 0 });
        }
        let batch = bb.batch();
        assert_eq!(batch.flows.len(), 2);
        let flows: Vec<_> = batch.packets.iter().map(|m| m.flow).collect();
        assert_eq!(flows, vec![Some(0), Some(0), Some(1), None]);
        assert_eq!(batch.packets[0].flow_hash, batch.packets[1].flow_hash);
        assert_eq!(bb.packet_bytes(2), &c[..]);
        assert_eq!(batch.packets[3].flow_hash, 0);
    }
}
