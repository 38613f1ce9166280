//! Why an NF trapped ([`TrapCause`]), read from wasmtime's error.

use wasmtime::Trap;

/// Why a trap happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TrapCause {
    /// The batch ran past its CPU deadline.
    Deadline,
    /// The batch ran out of fuel.
    OutOfFuel,
    /// Memory growth past the NF's cap.
    OutOfMemory,
    /// Wasm stack exhausted (deep recursion).
    StackOverflow,
    /// The guest panicked or aborted (`unreachable`).
    Panic,
    /// An out-of-bounds memory access (in Rust/C guests also the symptom
    /// of a shadow-stack overflow).
    MemoryFault,
    /// Any other trap (bad memory access, division by zero, ...).
    Other,
}

impl std::fmt::Display for TrapCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TrapCause::Deadline => "deadline exceeded",
            TrapCause::OutOfFuel => "out of fuel",
            TrapCause::OutOfMemory => "out of memory",
            TrapCause::StackOverflow => "stack overflow",
            TrapCause::Panic => "panic",
            TrapCause::MemoryFault => "memory fault",
            TrapCause::Other => "trap",
        })
    }
}

/// One line about a trap: the trap itself, without the guest backtrace.
pub(crate) fn trap_summary(err: &wasmtime::Error) -> String {
    match err.downcast_ref::<Trap>() {
        Some(t) => t.to_string(),
        None => format!("{err}").lines().next().unwrap_or("trap").to_string(),
    }
}

/// The cause of a trap.
pub(crate) fn classify(err: &wasmtime::Error) -> TrapCause {
    match err.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => TrapCause::Deadline,
        Some(Trap::OutOfFuel) => TrapCause::OutOfFuel,
        Some(Trap::StackOverflow) => TrapCause::StackOverflow,
        Some(Trap::UnreachableCodeReached) => TrapCause::Panic,
        Some(Trap::AllocationTooLarge) => TrapCause::OutOfMemory,
        Some(Trap::MemoryOutOfBounds) => TrapCause::MemoryFault,
        _ => {
            let text = format!("{err:#}");
            if text.contains("memory") && (text.contains("grow") || text.contains("limit")) {
                TrapCause::OutOfMemory
            } else {
                TrapCause::Other
            }
        }
    }
}
