//! Per-invocation meters: what billing aggregates.
//!
//! Every `process` call updates an instance's [`Meters`] (the one set of
//! counters, defined in `sluice-meters`, that a meter window, a meter
//! record and a bill are made of); nothing is sampled, so the sums equal
//! what the host processed. This module adds what only an instance knows:
//! the counters of its state store.

pub use sluice_meters::Meters;

/// Takes the counters of an instance's state store (cumulative over the
/// instance's life) and the bytes its tables hold into `m`.
pub(crate) fn take_table_meters(m: &mut Meters, t: &sluice_state::StateMeters, bytes: usize) {
    m.table_calls = t.calls;
    m.table_ops = t.ops;
    m.table_errors = t.errors;
    m.table_rejected = t.rejected;
    m.table_expired = t.expired;
    m.table_bytes = bytes as u64;
}
