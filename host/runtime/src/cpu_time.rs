//! How much CPU a thread used: what NF deadlines count, so that workers
//! sharing a core are slowed but never trapped for it.

use nix::time::{ClockId, clock_gettime};
use std::time::Duration;

/// CPU time the calling thread has used. A system call (not a vDSO read),
/// so the runtime reads it only when a batch has run for its whole
/// deadline in wall time, never per batch.
pub fn thread_cpu_time() -> Duration {
    clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID).map(Duration::from).unwrap_or_default()
}
