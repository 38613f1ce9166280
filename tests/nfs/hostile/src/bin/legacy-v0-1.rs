//! An NF built against the released `sluice:nf@0.1.0` contract directly
//! (no SDK): the host must keep loading such components next to 0.2.0
//! ones. It forwards everything and counts each flow's packets in its
//! flow state (an 8-byte little-endian counter).

#![allow(unsafe_code, missing_docs)]

wit_bindgen::generate!({
    path: "../../../wit/v0.1.0",
    world: "network-function",
});

use exports::sluice::nf::nf::Guest;
use sluice::nf::types::{Batch, BatchResult, FlowUpdate, NfInfo, StateOp};

struct Legacy;

impl Guest for Legacy {
    fn init(_config: Vec<u8>) -> Result<NfInfo, String> {
        Ok(NfInfo { wants_flow_state: true, flow_idle_timeout_ns: 0 })
    }

    fn process(batch: Batch) -> Result<BatchResult, String> {
        let n = batch.descriptors.len() / 4;
        let mut counts: Vec<u64> = sluice_wire::abi::frames(&batch.flow_states)
            .map(|f| f.ok().and_then(|b| <[u8; 8]>::try_from(b).ok()).map(u64::from_le_bytes).unwrap_or(0))
            .collect();
        for d in (0..n).filter_map(|i| sluice_wire::abi::Descriptor::decode(&batch.descriptors, i)) {
            if let Some(c) = counts.get_mut(usize::from(d.flow)) {
                *c += 1;
            }
        }
        let flow_updates = counts
            .iter()
            .enumerate()
            .map(|(i, c)| FlowUpdate { flow: i as u32, op: StateOp::Set(c.to_le_bytes().to_vec()) })
            .collect();
        Ok(BatchResult { verdicts: vec![1 << 16; n], rewrites: Vec::new(), flow_updates })
    }
}

export!(Legacy);

fn main() {}
