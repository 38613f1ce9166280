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
}
