//! What an instance calls: a running Wasm guest ([`Live`], by contract
//! version) or an NF compiled into the host ([`NativeNf`]).

use crate::bindings::{NfInfo, v0_1, v0_2, v0_3, v0_4, v0_5, v0_6};
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
        }
    }

    /// Calls `process`. A 0.6.0 guest gets the batch as one frame: its
    /// descriptors, flow states and trailer are appended to `batch.data`
    /// for the call and cut off again after it.
    pub(super) fn process(
        &mut self,
        batch: &mut crate::bindings::Batch,
    ) -> wasmtime::Result<Result<crate::bindings::BatchResult, String>> {
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
        }
    }

    /// Whether the guest may offload flows (0.5.0 and later).
    pub(super) fn offloads(&self) -> bool {
        matches!(self.guest, Guest::V5(_) | Guest::V6(_))
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
