//! An NF built against the released `sluice:nf@0.5.0` contract directly
//! (no SDK): the host must keep loading such components, which take the
//! batch as a record of three lists, next to 0.6.0 ones, which take it as
//! one frame, `offload` import included. It forwards everything unchanged
//! and offloads each packet's flow that has a transport header and is not
//! a fragment (the host refuses what it cannot offload); a batch fails if
//! its descriptors and data disagree, or if an offload request is refused
//! for another reason than the packet.

#![allow(unsafe_code, missing_docs)]

wit_bindgen::generate!({
    path: "../../../wit/v0.5.0",
    world: "network-function",
});

use exports::sluice::nf::nf::Guest;
use sluice::nf::offload::{OffloadError, OffloadRequest};
use sluice::nf::types::{Batch, BatchResult, NfInfo};

struct Legacy;

impl Guest for Legacy {
    fn init(_config: Vec<u8>) -> Result<NfInfo, String> {
        Ok(NfInfo { wants_flow_state: false, flow_idle_timeout_ns: 0 })
    }

    fn process(batch: Batch) -> Result<BatchResult, String> {
        let _ = sluice::nf::offload::returned();
        let n = batch.descriptors.len() / 4;
        let mut requests = Vec::new();
        for (i, d) in batch.descriptors.chunks_exact(4).enumerate() {
            let [w0, _, _, w3] = *d else { continue };
            let end = (w0 & 0xffff_ffff) as usize;
            if end > batch.data.len() {
                return Err(format!("packet {i} ends at {end}, past the batch's {} bytes", batch.data.len()));
            }
            let (l4, flags) = ((w3 >> 32) as u16, (w3 >> 56) as u8);
            if l4 != u16::MAX && flags & 2 == 0 {
                requests.push(OffloadRequest {
                    packet: i as u32,
                    rewrites: Vec::new(),
                    idle_timeout_ns: 0,
                    max_packets: 0,
                    max_bytes: 0,
                    max_age_ns: 0,
                    return_counts: true,
                });
            }
        }
        for r in sluice::nf::offload::offload(&requests) {
            match r {
                Ok(()) | Err(OffloadError::BadPacket | OffloadError::NotOffloadable(_) | OffloadError::OverBudget) => {}
                Err(e) => return Err(format!("offload refused: {e:?}")),
            }
        }
        Ok(BatchResult { verdicts: vec![1 << 16; n], rewrites: Vec::new(), flow_updates: Vec::new() })
    }

    fn expired(_table: u32, _entries: Vec<u8>) -> Result<(), String> {
        Ok(())
    }
}

export!(Legacy);

fn main() {}
