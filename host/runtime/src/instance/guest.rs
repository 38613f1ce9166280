//! What an instance calls: a running Wasm guest ([`Live`], by contract
//! version) or an NF compiled into the host ([`NativeNf`]).

use crate::bindings::{BatchResult, FlowUpdate, NfInfo, Rewrite, StateOp, v0_1, v0_2, v0_3, v0_4, v0_5, v0_6, v0_7};
use crate::host::HostState;
use sluice_state::Tables;
use wasmtime::Store;

/// The exports of a running instance, by contract version.
pub(super) enum Guest {
    V1(v0_1::NetworkFunction),
    V2(v0_2::NetworkFunction),
    V3(v0_3::NetworkFunction),
    V4(v0_4::NetworkFunction),
    V5(v0_5::NetworkFunction),
    V6(v0_6::NetworkFunction),
    V7(v0_7::NetworkFunction),
}

/// A running Wasm guest: its store and its exports.
pub(super) struct Live {
    pub(super) store: Store<HostState>,
    pub(super) guest: Guest,
}

impl Live {
    pub(super) fn init(&mut self, config: &[u8]) -> wasmtime::Result<Result<NfInfo, String>> {
        match &self.guest {
            Guest::V1(g) => g.sluice_nf_nf().call_init(&mut self.store, config),
            Guest::V2(g) => g.sluice_nf_nf().call_init(&mut self.store, config),
            Guest::V3(g) => g.sluice_nf_nf().call_init(&mut self.store, config),
            Guest::V4(g) => g.sluice_nf_nf().call_init(&mut self.store, config),
            Guest::V5(g) => g.sluice_nf_nf().call_init(&mut self.store, config),
            Guest::V6(g) => g.sluice_nf_nf().call_init(&mut self.store, config),
            Guest::V7(g) => g.sluice_nf_nf().call_init(&mut self.store, config),
        }
    }

    /// Calls `process`. A 0.6.0 guest gets the batch as one frame: its
    /// descriptors, flow states and trailer are appended to `batch.data`
    /// for the call and cut off again after it. A 0.7.0 guest's frame also
    /// carries the returns waiting for it (they are handed in once), and
    /// its result frame is read into the result record and its offload
    /// requests.
    pub(super) fn process(
        &mut self,
        batch: &mut crate::bindings::Batch,
    ) -> wasmtime::Result<Result<BatchResult, String>> {
        match &self.guest {
            Guest::V1(g) => g.sluice_nf_nf().call_process(&mut self.store, batch),
            Guest::V2(g) => g.sluice_nf_nf().call_process(&mut self.store, batch),
            Guest::V3(g) => g.sluice_nf_nf().call_process(&mut self.store, batch),
            Guest::V4(g) => g.sluice_nf_nf().call_process(&mut self.store, batch),
            Guest::V5(g) => g.sluice_nf_nf().call_process(&mut self.store, batch),
            Guest::V6(g) => {
                let data = sluice_wire::abi::seal_frame(&mut batch.data, &batch.descriptors, &batch.flow_states);
                let r = g.sluice_nf_nf().call_process(&mut self.store, &batch.data);
                batch.data.truncate(data);
                r
            }
            Guest::V7(g) => {
                let calls = &mut self.store.data_mut().offload;
                let mut returns = Vec::new();
                for (r, flow) in calls.returns.drain(..) {
                    r.record(flow).push(&mut returns);
                }
                let data = sluice_wire::abi::seal_frame_with_returns(
                    &mut batch.data,
                    &batch.descriptors,
                    &batch.flow_states,
                    &returns,
                );
                let r = g.sluice_nf_nf().call_process(&mut self.store, &batch.data);
                batch.data.truncate(data);
                Ok(r?.and_then(|frame| read_result(&frame, &mut self.store.data_mut().offload)))
            }
        }
    }

    pub(super) fn expired(&mut self, table: u32, entries: &[u8]) -> wasmtime::Result<Result<(), String>> {
        match &self.guest {
            Guest::V1(_) => Ok(Ok(())),
            Guest::V2(g) => g.sluice_nf_nf().call_expired(&mut self.store, table, entries),
            Guest::V3(g) => g.sluice_nf_nf().call_expired(&mut self.store, table, entries),
            Guest::V4(g) => g.sluice_nf_nf().call_expired(&mut self.store, table, entries),
            Guest::V5(g) => g.sluice_nf_nf().call_expired(&mut self.store, table, entries),
            Guest::V6(g) => g.sluice_nf_nf().call_expired(&mut self.store, table, entries),
            Guest::V7(g) => g.sluice_nf_nf().call_expired(&mut self.store, table, entries),
        }
    }

    /// Whether the guest may offload flows (0.5.0 and later).
    pub(super) fn offloads(&self) -> bool {
        matches!(self.guest, Guest::V5(_) | Guest::V6(_) | Guest::V7(_))
    }

    /// Moves the tables into the store for a call.
    pub(super) fn lend(&mut self, tables: &mut Option<Box<Tables>>) {
        self.store.data_mut().tables = tables.take();
    }

    /// Takes them back after the call (also after a trap).
    pub(super) fn reclaim(&mut self, tables: &mut Option<Box<Tables>>) {
        if let Some(t) = self.store.data_mut().tables.take() {
            *tables = Some(t);
        }
    }
}

/// Reads a 0.7.0 result frame: its verdicts, rewrites and flow-state
/// changes into the result record the host checks and applies for every
/// version, its offload requests into `calls` (as the `offload` call
/// would have taken them).
///
/// Errors: a frame whose lengths disagree or whose records are cut short
/// (the result is malformed: the failure policy applies).
fn read_result(frame: &[u8], calls: &mut crate::offload::Calls) -> Result<BatchResult, String> {
    let f = sluice_wire::abi::ResultFrame::parse(frame).map_err(|e| e.to_string())?;
    let rewrites = f
        .rewrites()
        .map(|r| r.map(|(packet, data)| Rewrite { packet, data: data.to_vec() }))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    let flow_updates = f
        .updates()
        .map(|r| {
            r.map(|(flow, bytes)| FlowUpdate {
                flow,
                op: if bytes.is_empty() { StateOp::Remove } else { StateOp::Set(bytes.to_vec()) },
            })
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    calls.offload_records(f.offloads())?;
    Ok(BatchResult { verdicts: f.verdicts().collect(), rewrites, flow_updates })
}

/// An NF compiled into the host and called as a plain Rust function: no
/// sandbox, no limits, no canonical ABI. This is Serpens' unsandboxed model;
/// Sluice uses it as the baseline its benchmarks compare Wasm NFs against.
/// It receives exactly what a Wasm NF receives and is run by the same host
/// code (batch building, flow state, verdicts), so the difference between
/// the two is what the sandbox costs.
pub trait NativeNf: Send {
    /// Like the `init` export.
    fn init(&mut self, config: &[u8]) -> Result<NfInfo, String>;
    /// Like the `process` export. State calls of a native NF reach the
    /// instance's tables through `sluice_state::with_current`.
    fn process(&mut self, batch: &crate::bindings::Batch) -> Result<crate::bindings::BatchResult, String>;
    /// Like the `expired` export.
    fn expired(&mut self, _table: u32, _entries: &[u8]) -> Result<(), String> {
        Ok(())
    }
}
