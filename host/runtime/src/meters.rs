//! Per-invocation meters: what billing aggregates.
//!
//! Every `process` call updates these; nothing is sampled, so the sums equal
//! what the host processed.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Counters of one NF (one instance, or summed over workers).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NfMeters {
    /// `process` calls (one per batch).
    pub invocations: u64,
    /// Packets handed to the NF.
    pub packets: u64,
    /// Bytes handed to the NF (captured bytes).
    pub bytes: u64,
    /// Nanoseconds spent inside the guest (wall time of the calls on a
    /// dedicated worker thread).
    pub cpu_ns: u64,
    /// Traps (panic, deadline, out of memory, stack overflow, ...).
    pub traps: u64,
    /// Batches the NF refused with `err(...)` or answered malformed.
    pub errors: u64,
    /// Packets whose verdict came from the failure policy.
    pub policy_packets: u64,
    /// Packets the NF forwarded or labelled.
    pub forwarded: u64,
    /// Packets the NF dropped.
    pub dropped: u64,
    /// Packets the NF rewrote.
    pub rewritten: u64,
    /// Flow-state lookups and updates the host did for the NF.
    pub state_ops: u64,
    /// Flow-state sets refused (value too large, or table full).
    pub state_rejected: u64,
    /// Events emitted.
    pub events: u64,
    /// Log lines dropped by the rate limit.
    pub log_dropped: u64,
    /// Instances created (1 + re-creations after traps).
    pub instantiations: u64,
    /// Calls into the `state` import (`sluice:nf@0.2.0` tables).
    #[serde(default)]
    pub table_calls: u64,
    /// Keys and resources those calls read or wrote.
    #[serde(default)]
    pub table_ops: u64,
    /// State calls that returned an error to the NF.
    #[serde(default)]
    pub table_errors: u64,
    /// Items refused for capacity, memory budget, size or an exhausted pool.
    #[serde(default)]
    pub table_rejected: u64,
    /// Table entries removed for idleness.
    #[serde(default)]
    pub table_expired: u64,
    /// Bytes of table state held (at the last batch), charged against the
    /// NF's state budget; what billing charges for state.
    #[serde(default)]
    pub table_bytes: u64,
    /// Bytes of per-flow state held (at the last batch), charged against
    /// the same state budget as the tables.
    #[serde(default)]
    pub flow_state_bytes: u64,
    /// Traps by cause (`deadline exceeded`, `out of memory`, ...); sums to
    /// `traps`.
    #[serde(default)]
    pub trap_causes: BTreeMap<String, u64>,
}

impl NfMeters {
    /// Adds another set of counters (e.g. another worker's).
    pub fn add(&mut self, o: &NfMeters) {
        self.invocations += o.invocations;
        self.packets += o.packets;
        self.bytes += o.bytes;
        self.cpu_ns += o.cpu_ns;
        self.traps += o.traps;
        self.errors += o.errors;
        self.policy_packets += o.policy_packets;
        self.forwarded += o.forwarded;
        self.dropped += o.dropped;
        self.rewritten += o.rewritten;
        self.state_ops += o.state_ops;
        self.state_rejected += o.state_rejected;
        self.events += o.events;
        self.log_dropped += o.log_dropped;
        self.instantiations += o.instantiations;
        self.table_calls += o.table_calls;
        self.table_ops += o.table_ops;
        self.table_errors += o.table_errors;
        self.table_rejected += o.table_rejected;
        self.table_expired += o.table_expired;
        self.table_bytes += o.table_bytes;
        self.flow_state_bytes += o.flow_state_bytes;
        for (cause, n) in &o.trap_causes {
            *self.trap_causes.entry(cause.clone()).or_default() += n;
        }
    }

    /// Counts one trap.
    pub fn count_trap(&mut self, cause: impl std::fmt::Display) {
        self.traps += 1;
        *self.trap_causes.entry(cause.to_string()).or_default() += 1;
    }

    /// What was counted since `base` (an earlier copy of these meters):
    /// every counter's difference, traps by cause included; the bytes
    /// held (`table_bytes`, `flow_state_bytes`) as they are now.
    pub fn since(&self, base: &NfMeters) -> NfMeters {
        let d = |f: fn(&NfMeters) -> u64| f(self).saturating_sub(f(base));
        NfMeters {
            invocations: d(|m| m.invocations),
            packets: d(|m| m.packets),
            bytes: d(|m| m.bytes),
            cpu_ns: d(|m| m.cpu_ns),
            traps: d(|m| m.traps),
            errors: d(|m| m.errors),
            policy_packets: d(|m| m.policy_packets),
            forwarded: d(|m| m.forwarded),
            dropped: d(|m| m.dropped),
            rewritten: d(|m| m.rewritten),
            state_ops: d(|m| m.state_ops),
            state_rejected: d(|m| m.state_rejected),
            events: d(|m| m.events),
            log_dropped: d(|m| m.log_dropped),
            instantiations: d(|m| m.instantiations),
            table_calls: d(|m| m.table_calls),
            table_ops: d(|m| m.table_ops),
            table_errors: d(|m| m.table_errors),
            table_rejected: d(|m| m.table_rejected),
            table_expired: d(|m| m.table_expired),
            table_bytes: self.table_bytes,
            flow_state_bytes: self.flow_state_bytes,
            trap_causes: self.trap_causes_since(base),
        }
    }

    /// Traps by cause since `base` (an earlier copy of these meters).
    pub fn trap_causes_since(&self, base: &NfMeters) -> BTreeMap<String, u64> {
        self.trap_causes
            .iter()
            .filter_map(|(k, v)| {
                let d = v.saturating_sub(base.trap_causes.get(k).copied().unwrap_or(0));
                (d > 0).then(|| (k.clone(), d))
            })
            .collect()
    }

    /// Takes the table counters (cumulative over the instance's life).
    pub fn set_tables(&mut self, m: &sluice_state::StateMeters, bytes: usize) {
        self.table_calls = m.calls;
        self.table_ops = m.ops;
        self.table_errors = m.errors;
        self.table_rejected = m.rejected;
        self.table_expired = m.expired;
        self.table_bytes = bytes as u64;
    }
}
