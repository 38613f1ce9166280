//! Per-NF limits and the failure policy, with why each exists.

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// What happens to a batch whose NF failed (trapped, returned an error, or
/// returned a malformed result).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum FailurePolicy {
    /// Forward every packet of the batch unchanged, as if the NF were not
    /// there. For NFs whose absence is harmless (monitors, counters).
    FailOpen,
    /// Drop every packet of the batch. For NFs that enforce policy
    /// (firewalls, IPS): failing open would let traffic bypass them.
    #[default]
    FailClosed,
}

impl FailurePolicy {
    /// The policy's name, as configured: `fail-open` or `fail-closed`.
    pub fn name(self) -> &'static str {
        match self {
            FailurePolicy::FailOpen => "fail-open",
            FailurePolicy::FailClosed => "fail-closed",
        }
    }
}

/// Limits for one NF instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NfLimits {
    /// CPU deadline of one `process` (or `init`, `expired`) call: a call
    /// that used this much CPU time traps with `deadline`. Time its thread
    /// spent preempted or waiting does not count, so an oversubscribed
    /// host never stops a well-behaved NF; a runaway NF on a core of its
    /// own is stopped about 1.5 deadlines after the call started.
    ///
    /// Why: one NF must not stall the worker it shares with other NFs and
    /// flows; a 32-packet batch takes microseconds, so 10 ms only catches
    /// runaway code. Granularity is the runtime's epoch tick (1 ms).
    pub deadline: Duration,
    /// CPU deadline of starting an instance: instantiation plus `init`
    /// (also when an instance is re-created after a trap, or a new version
    /// is swapped in). A start past it fails with a message naming this
    /// limit.
    ///
    /// Why: language runtimes (CPython, QuickJS) restore a snapshot and
    /// build their heap there, which takes far longer than a batch; the
    /// start must still end, or a hostile `init` would hold a worker.
    pub start_deadline: Duration,
    /// Largest linear memory an instance may grow to, in bytes. Growing past
    /// it traps with `out-of-memory`.
    ///
    /// Why: memory is the resource tenants are billed and hosts sized for;
    /// an unbounded allocation must fail inside the sandbox, not take the
    /// host down. Must not exceed the runtime's pool slot size.
    pub memory_bytes: u64,
    /// Optional fuel (roughly, Wasm instructions) per batch call. Running
    /// out traps with `out-of-fuel`.
    ///
    /// Why: a deterministic budget, independent of machine speed, for
    /// tenants who are billed per work done. Costs some speed on every NF
    /// of the runtime, so it is off unless asked for.
    pub fuel_per_batch: Option<u64>,
    /// What a failed batch becomes.
    pub failure_policy: FailurePolicy,
    /// Largest state value one flow may hold, in bytes. Larger `set`s are
    /// refused and counted.
    ///
    /// Why: per-flow state is host memory the tenant does not see growing;
    /// a small cap keeps a flow table's size predictable (flows × cap).
    pub max_flow_state_bytes: usize,
    /// Most flows with state an NF may hold per worker. New flows past it
    /// get no state (counted as `state_full`).
    ///
    /// Why: a SYN flood would otherwise grow the table without bound.
    pub max_flows: usize,
    /// Bytes of declared state tables (`sluice:nf@0.2.0` `state`) one
    /// instance may hold: keys, values and a fixed overhead per entry.
    /// Writes past it fail with `over-budget`, which the NF handles.
    ///
    /// Why: table memory is host memory billed to the tenant; the budget
    /// makes it a quota rather than an open tab.
    pub state_budget_bytes: usize,
    /// Log lines per second an instance may write (guest stdout/stderr and
    /// `host-log.log`); more are dropped and counted.
    ///
    /// Why: a chatty NF on a 10 Mpps path would flood the host log.
    pub log_lines_per_second: u32,
}

impl NfLimits {
    /// These limits, each resource no larger than in `cap`: the deadline,
    /// memory, fuel, flows, flow-state size, state budget and log rate.
    /// The failure policy is kept.
    pub fn at_most(&self, cap: &NfLimits) -> NfLimits {
        NfLimits {
            deadline: self.deadline.min(cap.deadline),
            start_deadline: self.start_deadline.min(cap.start_deadline),
            memory_bytes: self.memory_bytes.min(cap.memory_bytes),
            fuel_per_batch: match (self.fuel_per_batch, cap.fuel_per_batch) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            },
            failure_policy: self.failure_policy,
            max_flow_state_bytes: self.max_flow_state_bytes.min(cap.max_flow_state_bytes),
            max_flows: self.max_flows.min(cap.max_flows),
            state_budget_bytes: self.state_budget_bytes.min(cap.state_budget_bytes),
            log_lines_per_second: self.log_lines_per_second.min(cap.log_lines_per_second),
        }
    }
}

impl Default for NfLimits {
    fn default() -> Self {
        NfLimits {
            deadline: Duration::from_millis(10),
            start_deadline: Duration::from_secs(1),
            memory_bytes: 64 << 20,
            fuel_per_batch: None,
            failure_policy: FailurePolicy::FailClosed,
            max_flow_state_bytes: 4096,
            max_flows: 1 << 20,
            state_budget_bytes: sluice_state::DEFAULT_BUDGET_BYTES,
            log_lines_per_second: 50,
        }
    }
}
