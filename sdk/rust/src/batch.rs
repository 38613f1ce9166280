//! The batch an NF sees in one `process` call, and what it decides.

use crate::wit::sluice::nf::types as t;
use crate::{BatchResult, FlowKey, FlowUpdate, Packet, Rewrite, StateOp, Verdict};

/// One batch of packets with their flow state, plus the NF's decisions.
///
/// Verdicts default to `Forward(0)`. Flow state read with
/// [`flow_state`](Self::flow_state) reflects changes made earlier in the same
/// batch, so two packets of one flow in one batch see each other's updates.
pub struct Batch {
    inner: t::Batch,
    verdicts: Vec<Verdict>,
    rewrites: Vec<Rewrite>,
    pending: Vec<Option<StateOp>>,
}

impl Batch {
    /// Wraps a batch as the host delivers it.
    pub fn new(inner: t::Batch) -> Self {
        let n = inner.packets.len();
        let flows = inner.flows.len();
        Batch {
            inner,
            verdicts: vec![Verdict::Forward(0); n],
            rewrites: Vec::new(),
            pending: (0..flows).map(|_| None).collect(),
        }
    }

    /// Number of packets.
    pub fn len(&self) -> usize {
        self.inner.packets.len()
    }

    /// Whether the batch holds no packets.
    pub fn is_empty(&self) -> bool {
        self.inner.packets.is_empty()
    }

    /// The `i`-th packet, or `None` past the end.
    pub fn packet(&self, i: usize) -> Option<Packet<'_>> {
        let meta = self.inner.packets.get(i)?;
        let start = meta.offset as usize;
        let bytes = self.inner.data.get(start..start + meta.len as usize).unwrap_or(&[]);
        Some(Packet::new(meta, bytes))
    }

    /// All packets in order.
    pub fn packets(&self) -> impl Iterator<Item = Packet<'_>> {
        (0..self.len()).filter_map(|i| self.packet(i))
    }

    /// Number of distinct flows in the batch (zero if the NF asked for no
    /// flow state).
    pub fn flow_count(&self) -> usize {
        self.inner.flows.len()
    }

    /// The normalized key of flow `flow`.
    pub fn flow_key(&self, flow: u32) -> Option<FlowKey> {
        self.inner.flows.get(flow as usize).map(|f| crate::packet::key_from_wit(&f.key))
    }

    /// The state of flow `flow` as of now: what the host handed in, or what
    /// this batch set since.
    pub fn flow_state(&self, flow: u32) -> Option<&[u8]> {
        match self.pending.get(flow as usize) {
            Some(Some(StateOp::Set(v))) => Some(v.as_slice()),
            Some(Some(StateOp::Remove)) => None,
            _ => self.inner.flows.get(flow as usize).and_then(|f| f.state.as_deref()),
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
            *slot = v;
        }
    }

    /// The verdict packet `i` has so far.
    pub fn verdict(&self, i: usize) -> Option<Verdict> {
        self.verdicts.get(i).copied()
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
