//! Which flows' state changed: what a host in a group replicates.
//!
//! A worker's per-flow state (its flow-state bytes and per-flow table
//! entries) notes every flow it writes, imports or forgets here, once
//! tracking is on, so the replication looks at those flows only instead of
//! comparing the clocks of every flow a batch touched.

use sluice_wire::FlowKey;

/// Notes kept between two takes at most; past it, every flow counts as
/// changed (the taker compares clocks instead).
pub const MAX_NOTED: usize = 1 << 20;

/// The flows whose state changed since the last [`take`](Self::take).
#[derive(Debug, Default, Clone)]
pub struct FlowChanges {
    on: bool,
    keys: Vec<FlowKey>,
    overflow: bool,
}

impl FlowChanges {
    /// Starts noting changes (off by default: a lone host keeps nothing).
    pub fn track(&mut self) {
        self.on = true;
    }

    /// Whether changes are noted.
    pub fn tracking(&self) -> bool {
        self.on
    }

    /// Notes that flow `key`'s state changed.
    #[inline]
    pub fn note(&mut self, key: &FlowKey) {
        if !self.on || self.overflow {
            return;
        }
        if self.keys.len() < MAX_NOTED {
            self.keys.push(*key);
        } else {
            self.overflow = true;
            self.keys.clear();
        }
    }

    /// Appends the flows noted since the last call to `out` (a flow may
    /// appear more than once); `false` if too many were noted to keep, and
    /// any flow may have changed.
    pub fn take(&mut self, out: &mut Vec<FlowKey>) -> bool {
        out.append(&mut self.keys);
        !std::mem::take(&mut self.overflow)
    }
}

/// A pool resource whose binding changed, with its binding now (`None`:
/// free).
pub type PoolChange = (u64, Option<Vec<u8>>);

/// The pool resources a worker's calls bound or released since the last
/// [`take`](Self::take), by table index: a lane with output commit sends
/// their bindings to the blocks' next owners before its packets leave.
#[derive(Debug, Default, Clone)]
pub struct PoolChanges {
    on: bool,
    items: Vec<(u32, u64)>,
    overflow: bool,
}

impl PoolChanges {
    /// Starts noting changes (off by default: only output commit needs them).
    pub fn track(&mut self) {
        self.on = true;
    }

    /// Notes that resources of the pool at table index `table` changed.
    pub fn note(&mut self, table: u32, resources: impl IntoIterator<Item = u64>) {
        if !self.on || self.overflow {
            return;
        }
        for r in resources {
            if self.items.len() >= MAX_NOTED {
                self.overflow = true;
                self.items.clear();
                return;
            }
            self.items.push((table, r));
        }
    }

    /// Appends the (table, resource) pairs noted since the last call to
    /// `out`; `false` if too many were noted to keep, and any binding may
    /// have changed.
    pub fn take(&mut self, out: &mut Vec<(u32, u64)>) -> bool {
        out.append(&mut self.items);
        !std::mem::take(&mut self.overflow)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn notes_only_when_tracking_and_says_when_it_lost_count() {
        let mut c = FlowChanges::default();
        let k = FlowKey::default();
        c.note(&k);
        let mut out = Vec::new();
        assert!(c.take(&mut out) && out.is_empty());
        c.track();
        c.note(&k);
        assert!(c.take(&mut out));
        assert_eq!(out, vec![k]);
        for _ in 0..=MAX_NOTED {
            c.note(&k);
        }
        out.clear();
        assert!(!c.take(&mut out));
        assert!(out.is_empty());
        assert!(c.take(&mut out));
    }

    #[test]
    fn pool_changes_are_noted_only_when_tracking_and_overflow_says_so() {
        let mut c = PoolChanges::default();
        c.note(1, [5]);
        let mut out = Vec::new();
        assert!(c.take(&mut out) && out.is_empty());
        c.track();
        c.note(1, [5, 6]);
        assert!(c.take(&mut out));
        assert_eq!(out, vec![(1, 5), (1, 6)]);
        c.note(0, 0..=MAX_NOTED as u64);
        out.clear();
        assert!(!c.take(&mut out));
        assert!(out.is_empty());
        assert!(c.take(&mut out));
    }
}
