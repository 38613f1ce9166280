//! An NF built against the `sluice:nf@0.7.0` contract directly (no SDK):
//! it reads the batch frame with its returns and answers with a result
//! frame, as an interpreted language's SDK does. Its configuration picks
//! what it answers:
//! - `ok`: forwards everything unchanged and offloads each packet's flow
//!   that has a transport header and is not a fragment, counts returned;
//!   each batch emits one `seen` event with the packets it saw and the
//!   packets and bytes its returns carried, and fails if a return's flow
//!   index is not one of the batch's flows;
//! - `lengths`: a result frame whose trailer does not add up;
//! - `cut`: a rewrite whose length runs past its part;
//! - `flood`: 65,536 offload requests per batch, most naming packets the
//!   batch does not have, with more header changes than allowed, unknown
//!   change kinds, DSCPs above 63 and addresses of odd lengths;
//! - `verdicts`: one verdict fewer than the batch's packets.

#![allow(unsafe_code, missing_docs)]

wit_bindgen::generate!({
    path: "../../../wit/v0.7.0",
    world: "network-function",
});

use exports::sluice::nf::nf::Guest;
use sluice::nf::types::{Event, Level, NfInfo};
use sluice_wire::abi::{BatchFrame, OffloadRecord, OpRecord, ResultFrameWriter, ReturnRecord, Verdict};
use std::sync::atomic::{AtomicU8, Ordering};

static MODE: AtomicU8 = AtomicU8::new(0);
const MODES: [&str; 5] = ["ok", "lengths", "cut", "flood", "verdicts"];

struct Frames;

impl Guest for Frames {
    fn init(config: Vec<u8>) -> Result<NfInfo, String> {
        let text = String::from_utf8_lossy(&config);
        let mode = text.trim();
        let mode = if mode.is_empty() { "ok" } else { mode };
        let at = MODES.iter().position(|m| *m == mode).ok_or_else(|| format!("unknown mode {mode:?}"))?;
        MODE.store(at as u8, Ordering::Relaxed);
        Ok(NfInfo { wants_flow_state: true, flow_idle_timeout_ns: 0 })
    }

    fn process(frame: Vec<u8>) -> Result<Vec<u8>, String> {
        let f = BatchFrame::parse(&frame).map_err(|e| e.to_string())?;
        let n = f.len();
        let flows = sluice_wire::abi::split_flow_states(f.flow_states).len();
        let forward = vec![Verdict::Forward(0).encode(); n];
        let mut w = ResultFrameWriter::default();
        match MODES.get(usize::from(MODE.load(Ordering::Relaxed))).copied().unwrap_or("ok") {
            "lengths" => {
                let mut out = w.finish(&forward);
                out.push(0);
                Ok(out)
            }
            "cut" => {
                w.rewrite(0, b"abcd");
                let mut out = w.finish(&forward);
                let at = 4 * n + 4;
                if let Some(b) = out.get_mut(at..at + 4) {
                    b.copy_from_slice(&1000u32.to_le_bytes());
                }
                Ok(out)
            }
            "verdicts" => Ok(w.finish(forward.get(1..).unwrap_or_default())),
            "flood" => {
                let mut address = [0u8; 16];
                address[..5].copy_from_slice(&[10, 0, 0, 1, 9]);
                let odd = OpRecord { kind: 0, address_len: 5, address, port: Some(1), dscp: 0 };
                let unknown = OpRecord { kind: 77, address_len: 0, address, port: None, dscp: 0 };
                let dscp = OpRecord { kind: 3, address_len: 0, address, port: None, dscp: 200 };
                for k in 0..65_536u32 {
                    let ops: &[OpRecord] = match k % 4 {
                        0 => &[odd],
                        1 => &[unknown],
                        2 => &[dscp; 12],
                        _ => &[],
                    };
                    w.offload(&OffloadRecord::new(k % 4096, true, [1, 0, 0, 0]), ops);
                }
                Ok(w.finish(&forward))
            }
            _ => {
                let (mut packets, mut bytes) = (0u64, 0u64);
                for k in 0..f.returns.len() / sluice_wire::abi::RETURN_BYTES {
                    let r = ReturnRecord::decode(f.returns, k).ok_or("a return cut short")?;
                    if r.flow.is_some_and(|i| i as usize >= flows) {
                        return Err(format!("return {k}: flow {:?} of {flows}", r.flow));
                    }
                    packets += r.packets;
                    bytes += r.bytes;
                }
                for i in 0..n {
                    let d = f.descriptor(i).ok_or("a descriptor cut short")?;
                    if d.end as usize > f.data.len() {
                        return Err(format!("packet {i} ends at {}, past the batch's {} bytes", d.end, f.data.len()));
                    }
                    if d.l4_offset != sluice_wire::abi::NO_L4 && d.flags & 2 == 0 {
                        w.offload(&OffloadRecord::new(i as u32, true, [0; 4]), &[]);
                    }
                }
                sluice::nf::host_log::emit(&[Event {
                    kind: "seen".into(),
                    level: Level::Info,
                    packet: None,
                    fields: vec![
                        ("packets".into(), n.to_string()),
                        ("returned-packets".into(), packets.to_string()),
                        ("returned-bytes".into(), bytes.to_string()),
                    ],
                }]);
                Ok(w.finish(&forward))
            }
        }
    }

    fn expired(_table: u32, _entries: Vec<u8>) -> Result<(), String> {
        Ok(())
    }
}

export!(Frames);

fn main() {}
