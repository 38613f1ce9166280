//! The shared byte account: what the tables the workers of one host share
//! for an NF (eventual, release and single-writer tables) hold, charged
//! once for all workers against the NF's state budget.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Bytes the NF's shared tables hold on this host, and their budget: one
/// account for every worker, so a table merged from N workers' updates is
/// charged once.
#[derive(Debug, Default)]
pub(crate) struct SharedBytes {
    used: AtomicUsize,
    budget: AtomicUsize,
}

impl SharedBytes {
    /// Charges `cost` bytes if they fit in the budget.
    pub(crate) fn try_charge(&self, cost: usize) -> bool {
        let budget = self.budget.load(Ordering::Relaxed);
        self.used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| u.checked_add(cost).filter(|n| *n <= budget))
            .is_ok()
    }

    /// Charges `cost` bytes whatever the budget (an entry that must be
    /// kept, e.g. one merged after its key expired).
    pub(crate) fn charge(&self, cost: usize) {
        self.used.fetch_add(cost, Ordering::Relaxed);
    }

    /// Gives `cost` bytes back.
    pub(crate) fn free(&self, cost: usize) {
        let _ = self.used.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| Some(u.saturating_sub(cost)));
    }

    /// Bytes charged now.
    pub(crate) fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Sets the budget (the NF's state budget).
    pub(crate) fn set_budget(&self, bytes: usize) {
        self.budget.store(bytes, Ordering::Relaxed);
    }
}
