//! The batch an NF sees in one `process` call, and what it decides.

use crate::{BatchResult, FlowUpdate, Packet, Rewrite, StateOp};
use sluice_wire::abi::{BatchFrame, DESCRIPTOR_BYTES, Descriptor, NO_FLOW, Verdict, seal_frame, split_flow_states};
use std::ops::Range;

/// One batch of packets with their flow state, plus the NF's decisions.
///
/// Verdicts default to `Forward(0)`. Flow state read with
/// [`flow_state`](Self::flow_state) reflects changes made earlier in the same
/// batch, so two packets of one flow in one batch see each other's updates.
pub struct Batch {
    /// The batch frame as the host handed it in (`sluice:nf@0.6.0`).
    frame: Vec<u8>,
    /// Where its parts are.
    data: Range<usize>,
    descriptors: Range<usize>,
    /// Each flow's state bytes, in `frame`.
    states: Vec<Range<usize>>,
    verdicts: Vec<u32>,
    rewrites: Vec<Rewrite>,
    pending: Vec<Option<StateOp>>,
    offloads: Vec<crate::offload::OffloadRequest>,
    returns: Option<Vec<crate::offload::OffloadReturn>>,
}

std::thread_local! {
    /// Whether this instance ever asked to offload with counts returned:
    /// a batch the NF did not look at then takes what ended anyway, so the
    /// host keeps nothing for ever.
    static OFFLOADED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl Batch {
    /// A batch of the three parts of a frame: packet bytes, descriptor
    /// words and framed flow states (tests and native builds of an NF make
    /// batches this way).
    pub fn new(data: Vec<u8>, descriptors: &[u64], flow_states: &[u8]) -> Self {
        let mut frame = data;
        seal_frame(&mut frame, descriptors, flow_states);
        // A frame sealed here always parses.
        Self::from_frame(frame).unwrap_or_else(|_| Self::from_parts(Vec::new(), 0..0, 0..0, 0..0))
    }

    /// Wraps a batch frame as the host hands it to `process`
    /// (`sluice:nf@0.6.0`).
    ///
    /// Errors: a frame whose trailer disagrees with its length (the host
    /// never sends one), as a message for `process` to return.
    pub fn from_frame(frame: Vec<u8>) -> Result<Self, String> {
        let f = BatchFrame::parse(&frame).map_err(|e| e.to_string())?;
        let data = 0..f.data.len();
        let first = data.end.next_multiple_of(8);
        let descriptors = first..first + f.descriptors.len();
        let states = descriptors.end..descriptors.end + f.flow_states.len();
        Ok(Self::from_parts(frame, data, descriptors, states))
    }

    fn from_parts(frame: Vec<u8>, data: Range<usize>, descriptors: Range<usize>, states: Range<usize>) -> Self {
        let n = descriptors.len() / DESCRIPTOR_BYTES;
        let base = states.start;
        let states: Vec<Range<usize>> = split_flow_states(frame.get(states).unwrap_or(&[]))
            .into_iter()
            .map(|r| r.start + base..r.end + base)
            .collect();
        Batch {
            verdicts: vec![Verdict::Forward(0).encode(); n],
            rewrites: Vec::new(),
            pending: (0..states.len()).map(|_| None).collect(),
            states,
            frame,
            data,
            descriptors,
            offloads: Vec::new(),
            returns: None,
        }
    }

    /// Descriptor `i`.
    fn descriptor(&self, i: usize) -> Option<Descriptor> {
        Descriptor::decode_le(self.frame.get(self.descriptors.clone())?, i)
    }

    /// Number of packets.
    pub fn len(&self) -> usize {
        self.verdicts.len()
    }

    /// Whether the batch holds no packets.
    pub fn is_empty(&self) -> bool {
        self.verdicts.is_empty()
    }

    /// The `i`-th packet, or `None` past the end.
    pub fn packet(&self, i: usize) -> Option<Packet<'_>> {
        let d = self.descriptor(i)?;
        let start = if i == 0 { 0 } else { self.descriptor(i - 1)?.end as usize };
        let data = self.frame.get(self.data.clone()).unwrap_or(&[]);
        let bytes = data.get(start..d.end as usize).unwrap_or(&[]);
        Some(Packet::new(bytes, d))
    }

    /// All packets in order.
    pub fn packets(&self) -> impl Iterator<Item = Packet<'_>> {
        (0..self.len()).filter_map(|i| self.packet(i))
    }

    /// Number of distinct flows in the batch (zero if the NF asked for no
    /// flow state).
    pub fn flow_count(&self) -> usize {
        self.states.len()
    }

    /// The state of flow `flow` as of now: what the host handed in, or what
    /// this batch set since. `None` if it has none.
    pub fn flow_state(&self, flow: u32) -> Option<&[u8]> {
        if flow == u32::from(NO_FLOW) {
            return None;
        }
        match self.pending.get(flow as usize) {
            Some(Some(StateOp::Set(v))) => Some(v.as_slice()),
            Some(Some(StateOp::Remove)) => None,
            _ => {
                let s = self.frame.get(self.states.get(flow as usize)?.clone())?;
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

    /// Offloads the flow of a packet of this batch (see
    /// [`crate::offload`]): its later packets in its direction get its
    /// verdict and the request's changes without a call. The requests go
    /// to the host in one call when `process` returns; a refused one (an IP
    /// fragment, a change that does not fit the packet, a full budget)
    /// simply makes no entry. Call [`crate::offload::offload`] directly to
    /// see refusals.
    pub fn offload(&mut self, request: crate::offload::Offload) {
        self.offloads.push(request.0);
    }

    /// What passed under this NF's offload entries that ended since the
    /// last batch (FIN/RST, limits, idle, revoked, replaced), one per
    /// entry: its flow (the index in this batch when a packet of it is
    /// here), direction, packets and bytes. Add them to whatever the NF
    /// counts per packet.
    pub fn offload_returns(&mut self) -> &[crate::offload::OffloadReturn] {
        // Asked of the host whenever the NF looks: entries of another host
        // carried here with their flows return to an instance that never
        // asked for any.
        self.returns.get_or_insert_with(crate::offload::returned)
    }

    /// Turns the decisions into the result the host expects.
    pub fn finish(self) -> BatchResult {
        let flow_updates = self
            .pending
            .into_iter()
            .enumerate()
            .filter_map(|(i, op)| op.map(|op| FlowUpdate { flow: i as u32, op }))
            .collect();
        if !self.offloads.is_empty() {
            if self.offloads.iter().any(|r| r.return_counts) {
                OFFLOADED.set(true);
            }
            let _ = crate::offload::offload(&self.offloads);
        }
        if self.returns.is_none() && OFFLOADED.get() {
            // Not looked at: taken anyway, so the host keeps none for ever.
            let _ = crate::offload::returned();
        }
        BatchResult { verdicts: self.verdicts, rewrites: self.rewrites, flow_updates }
    }
}
