//! An NF built against the released `sluice:nf@0.4.0` contract directly
//! (no SDK): the host must keep loading such components next to 0.5.0
//! ones, `state` import included. It forwards everything, counts the
//! packets it sees in a single-writer counter table `seen` (key 0) and
//! reads the count back with `top-k`, the call 0.4.0 added: a batch fails
//! if the table does not hold at least what this worker added.

#![allow(unsafe_code, missing_docs)]

wit_bindgen::generate!({
    path: "../../../wit/v0.4.0",
    world: "network-function",
});

use exports::sluice::nf::nf::Guest;
use sluice::nf::state::{Access, Consistency, Scope, SingleWriterSpec, TableSpec, ValueKind};
use sluice::nf::types::{Batch, BatchResult, NfInfo};

struct Legacy;

static TABLE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(u32::MAX);

impl Guest for Legacy {
    fn init(_config: Vec<u8>) -> Result<NfInfo, String> {
        let t = sluice::nf::state::declare(&TableSpec {
            name: "seen".into(),
            scope: Scope::Global,
            access: Access::ReadWrite,
            kind: ValueKind::Counter,
            consistency: Consistency::SingleWriter(SingleWriterSpec { sync_interval_ns: 0 }),
            key_size: 0,
            max_value_size: 8,
            capacity: 0,
            idle_timeout_ns: 0,
            notify_expired: false,
        })
        .map_err(|e| format!("declare: {e:?}"))?;
        TABLE.store(t, std::sync::atomic::Ordering::Relaxed);
        Ok(NfInfo { wants_flow_state: false, flow_idle_timeout_ns: 0 })
    }

    fn process(batch: Batch) -> Result<BatchResult, String> {
        let n = batch.descriptors.len() / 4;
        let t = TABLE.load(std::sync::atomic::Ordering::Relaxed);
        sluice::nf::state::counter_add(t, &[0], &[n as i64]).map_err(|e| format!("count: {e:?}"))?;
        let top = sluice::nf::state::top_k(t, 1).map_err(|e| format!("top-k: {e:?}"))?;
        if n > 0 && !top.first().is_some_and(|(k, v)| *k == 0 && *v >= n as u64) {
            return Err(format!("top-k read {top:?} after adding {n}"));
        }
        Ok(BatchResult { verdicts: vec![1 << 16; n], rewrites: Vec::new(), flow_updates: Vec::new() })
    }

    fn expired(_table: u32, _entries: Vec<u8>) -> Result<(), String> {
        Ok(())
    }
}

export!(Legacy);

fn main() {}
