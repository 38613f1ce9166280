//! The batch an NF sees in one `process` call, and what it decides.

use crate::wit::sluice::nf::types as t;
use crate::{BatchResult, FlowUpdate, Packet, Rewrite, StateOp};
use sluice_wire::abi::{NO_FLOW, Verdict};

/// One batch of packets with their flow state, plus the NF's decisions.
///
/// Verdicts default to `Forward(0)`. Flow state read with
/// [`flow_state`](Self::flow_state) reflects changes made earlier in the same
/// batch, so two packets of one flow in one batch see each other's updates.
pub struct Batch {
    inner: t::Batch,
    verdicts: Vec<u32>,
    rewrites: Vec<Rewrite>,
    pending: Vec<Option<StateOp>>,
}

fn range(ends: &[u32], i: usize) -> Option<std::ops::Range<usize>> {
    let end = *ends.get(i)? as usize;
    let start = if i == 0 { 0 } else { *ends.get(i - 1)? as usize };
    (start <= end).then_some(start..end)
}

impl Batch {
    /// Wraps a batch as the host delivers it.
    pub fn new(inner: t::Batch) -> Self {
        let n = inner.ends.len();
        let flows = inner.state_ends.len();
        Batch {
            inner,
            verdicts: vec![Verdict::Forward(0).encode(); n],
            rewrites: Vec::new(),
            pending: (0..flows).map(|_| None).collect(),
        }
    }

    /// Number of packets.
    pub fn len(&self) -> usize {
        self.inner.ends.len()
    }

    /// Whether the batch holds no packets.
    pub fn is_empty(&self) -> bool {
        self.inner.ends.is_empty()
    }

    /// The `i`-th packet, or `None` past the end.
    pub fn packet(&self, i: usize) -> Option<Packet<'_>> {
        let b = &self.inner;
        let bytes = b.data.get(range(&b.ends, i)?).unwrap_or(&[]);
        Some(Packet::new(
            bytes,
            *b.wire_lens.get(i)?,
            *b.timestamps.get(i)?,
            *b.ingress_ports.get(i)?,
            *b.l3_offsets.get(i)?,
            *b.l4_offsets.get(i)?,
            *b.packet_flags.get(i)?,
            *b.flow_hashes.get(i)?,
            *b.flows.get(i)?,
        ))
    }

    /// All packets in order.
    pub fn packets(&self) -> impl Iterator<Item = Packet<'_>> {
        (0..self.len()).filter_map(|i| self.packet(i))
    }

    /// Number of distinct flows in the batch (zero if the NF asked for no
    /// flow state).
    pub fn flow_count(&self) -> usize {
        self.inner.state_ends.len()
    }

    /// The state of flow `flow` as of now: what the host handed in, or what
    /// this batch set since. `None` if it has none.
    pub fn flow_state(&self, flow: u32) -> Option<&[u8]> {
        if flow == NO_FLOW {
            return None;
        }
        match self.pending.get(flow as usize) {
            Some(Some(StateOp::Set(v))) => Some(v.as_slice()),
            Some(Some(StateOp::Remove)) => None,
            _ => {
                let s = self.inner.state_data.get(range(&self.inner.state_ends, flow as usize)?)?;
                (!s.is_empty()).then_some(s)
            }
        }
    }

    /// Stores `state` for flow `flow` (kept by the host across batches).
    pub fn set_flow_state(&mut self, flow: u32, state: Vec<u8>) {
        if let Some(slot) = self.pending.get_mut(flow as usize) {
            *slot = Some(StateOp::Set(state));
        }
    }

    /// Forgets the state of flow `flow`.
    pub fn remove_flow_state(&mut self, flow: u32) {
        if let Some(slot) = self.pending.get_mut(flow as usize) {
            *slot = Some(StateOp::Remove);
        }
    }

    /// Sets the verdict of packet `i`.
    pub fn set_verdict(&mut self, i: usize, v: Verdict) {
        if let Some(slot) = self.verdicts.get_mut(i) {
            *slot = v.encode();
        }
    }

    /// The verdict packet `i` has so far.
    pub fn verdict(&self, i: usize) -> Option<Verdict> {
        self.verdicts.get(i).copied().and_then(Verdict::decode)
    }

    /// Replaces the bytes of packet `i`.
    pub fn rewrite(&mut self, i: usize, data: Vec<u8>) {
        if i < self.len() {
            self.rewrites.push(Rewrite { packet: i as u32, data });
        }
    }

    /// Copies packet `i`, lets `edit` change the copy, and records it as a
    /// rewrite. Returns `false` if there is no such packet.
    pub fn edit(&mut self, i: usize, edit: impl FnOnce(&mut Vec<u8>)) -> bool {
        let Some(p) = self.packet(i) else { return false };
        let mut data = p.bytes().to_vec();
        edit(&mut data);
        self.rewrite(i, data);
        true
    }

    /// Turns the decisions into the result the host expects.
    pub fn finish(self) -> BatchResult {
        let flow_updates = self
            .pending
            .into_iter()
            .enumerate()
            .filter_map(|(i, op)| op.map(|op| FlowUpdate { flow: i as u32, op }))
            .collect();
        BatchResult { verdicts: self.verdicts, rewrites: self.rewrites, flow_updates }
    }
}
