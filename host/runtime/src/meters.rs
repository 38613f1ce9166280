//! Per-invocation meters: what billing aggregates.
//!
//! Every `process` call updates these; nothing is sampled, so the sums equal
//! what the host processed.

use serde::{Deserialize, Serialize};

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
    }
}
