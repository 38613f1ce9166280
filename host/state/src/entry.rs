//! What every table entry shares, whatever its table: the bytes it costs
//! besides its key and value, when it is idle, and how a counter takes a
//! delta.

/// Bytes an entry costs besides its key and value (map slot, timestamps):
/// what the memory budget charges per entry.
pub const ENTRY_OVERHEAD: usize = 48;

/// Whether an entry last used at `last_ns` is idle at `now`.
pub(crate) fn stale(last_ns: u64, now: u64, timeout: u64) -> bool {
    timeout > 0 && now.saturating_sub(last_ns) > timeout
}

/// Counter `v` with delta `d` added, saturating at both ends.
pub(crate) fn add_delta(v: u64, d: i64) -> u64 {
    if d >= 0 { v.saturating_add(d.unsigned_abs()) } else { v.saturating_sub(d.unsigned_abs()) }
}
