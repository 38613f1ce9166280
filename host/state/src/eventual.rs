//! Eventual tables: per-worker replicas of a global read-write counter
//! table, merged with sum/max/min ([`Merge`]) into one view per host, and
//! with the views of the group's other hosts when the host is in a group.
//!
//! A worker updates its own replica (its pending updates) with no lock and
//! folds it into the host's merged view once per merge interval; reads
//! merge the view with the worker's unmerged updates.

use crate::HashMap;
use crate::account::SharedBytes;
use crate::entry::{ENTRY_OVERHEAD, stale};
use crate::spec::{Merge, TableSpec};
use parking_lot::{Mutex, MutexGuard};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Bytes one entry of an eventual table costs: key, value and overhead.
pub(crate) const EVENTUAL_ENTRY: usize = 16 + ENTRY_OVERHEAD;

/// One worker's unmerged update of an eventual table.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pending {
    pub(crate) value: u64,
    /// The key was new when the update was made: its entry is reserved
    /// (counted against the capacity and charged) until the merge.
    pub(crate) reserved: bool,
    /// Updated since the last merge. A merged entry stays (clean) until
    /// the next merge, so that a key updated every interval takes no lock.
    pub(crate) dirty: bool,
}

#[derive(Debug, Clone, Copy)]
struct Merged {
    value: u64,
    last_ns: u64,
}

#[derive(Debug, Default)]
struct EventualInner {
    /// This host's view: its workers' updates, merged.
    values: HashMap<u64, Merged>,
    /// Keys of `values` merged since they were last taken for the group's
    /// other hosts ([`EventualShared::take_changed`]).
    changed: HashMap<u64, ()>,
    /// The views of the group's other hosts (each their own workers'
    /// merged updates, as they last sent them), by host; a read merges
    /// them with this host's. Each host's is bounded by the capacity.
    remote: HashMap<String, HashMap<u64, Merged>>,
    /// New keys in workers' pending updates, not merged yet.
    reserved: usize,
    capacity: usize,
    idle_timeout_ns: u64,
    last_sweep_ns: u64,
    /// When all live keys were last taken for the other hosts.
    last_refresh_ns: u64,
}

/// The merged view of one eventual table. Capacity, idle expiry and the
/// state budget apply to this view, the table the NF sees: a worker's
/// update of a key the view lacks reserves an entry there first.
#[derive(Debug)]
pub(crate) struct EventualShared {
    pub(crate) merge: Merge,
    bytes: Arc<SharedBytes>,
    track: Arc<AtomicBool>,
    inner: Mutex<EventualInner>,
}

/// What [`EventualShared::add`] refused, at which item.
pub(crate) enum AddRefusal {
    Full(usize),
    OverBudget(usize),
    Negative(usize),
}

impl EventualShared {
    /// A new, empty view merging with `merge`, charged to `bytes`; it notes
    /// the keys merged while `track` is on.
    pub(crate) fn new(merge: Merge, bytes: Arc<SharedBytes>, track: Arc<AtomicBool>) -> Self {
        EventualShared { merge, bytes, track, inner: Mutex::new(EventualInner::default()) }
    }

    /// Capacity and expiry follow the latest declaration.
    pub(crate) fn set_limits(&self, spec: &TableSpec) {
        let mut e = self.inner.lock();
        e.capacity = spec.capacity();
        e.idle_timeout_ns = spec.idle_timeout_ns;
    }

    fn identity(&self) -> u64 {
        match self.merge {
            Merge::Min => u64::MAX,
            Merge::Sum | Merge::Max => 0,
        }
    }

    /// Records a worker's updates in `pending`; a key neither pending nor
    /// in the merged view (live) reserves an entry, if the capacity and
    /// the budget allow. Keys already pending take no lock; the first
    /// other key takes the view's lock for the rest of the call.
    pub(crate) fn add(
        &self,
        pending: &mut HashMap<u64, Pending>,
        keys: &[u64],
        deltas: &[i64],
        now: u64,
    ) -> Result<(), AddRefusal> {
        let mut guard: Option<MutexGuard<'_, EventualInner>> = None;
        for (i, (k, d)) in keys.iter().zip(deltas).enumerate() {
            if *d < 0 {
                return Err(AddRefusal::Negative(i));
            }
            let d = d.unsigned_abs();
            if let Some(p) = pending.get_mut(k) {
                let base = if p.dirty { p.value } else { self.identity() };
                p.value = self.merge.apply(base, d);
                p.dirty = true;
                continue;
            }
            let e = guard.get_or_insert_with(|| self.inner.lock());
            let timeout = e.idle_timeout_ns;
            let live = e.values.get(k).is_some_and(|m| !stale(m.last_ns, now, timeout));
            if !live {
                if e.values.len() + e.reserved >= e.capacity {
                    return Err(AddRefusal::Full(i));
                }
                if !self.bytes.try_charge(EVENTUAL_ENTRY) {
                    return Err(AddRefusal::OverBudget(i));
                }
                e.reserved += 1;
            }
            pending.insert(*k, Pending { value: self.merge.apply(self.identity(), d), reserved: !live, dirty: true });
        }
        Ok(())
    }

    /// Folds a worker's pending updates into the merged view.
    pub(crate) fn merge_in(&self, pending: &mut HashMap<u64, Pending>, now: u64) {
        // Keys not updated since the last merge leave the worker's set;
        // the others are folded in and stay, clean.
        pending.retain(|_, p| p.dirty);
        if pending.is_empty() {
            return;
        }
        let identity = self.identity();
        let mut e = self.inner.lock();
        let timeout = e.idle_timeout_ns;
        for (&k, p) in pending.iter_mut() {
            let was_reserved = p.reserved;
            let value = p.value;
            *p = Pending { value: identity, reserved: false, dirty: false };
            if was_reserved {
                e.reserved = e.reserved.saturating_sub(1);
            }
            let p = Pending { value, reserved: was_reserved, dirty: true };
            if self.track.load(Ordering::Relaxed) {
                e.changed.insert(k, ());
            }
            match e.values.get_mut(&k) {
                Some(m) => {
                    // An idle entry the sweep has not reached yet starts over.
                    let base = if stale(m.last_ns, now, timeout) { identity } else { m.value };
                    m.value = self.merge.apply(base, p.value);
                    m.last_ns = now;
                    if p.reserved {
                        // Another worker's update created it first.
                        self.bytes.free(EVENTUAL_ENTRY);
                    }
                }
                None => {
                    if !p.reserved {
                        // The key expired after this update was made: keep
                        // the update, charged now.
                        self.bytes.charge(EVENTUAL_ENTRY);
                    }
                    e.values.insert(k, Merged { value: self.merge.apply(identity, p.value), last_ns: now });
                }
            }
        }
    }

    /// Gives back the reservations of pending updates that will never be
    /// merged (the worker's tables are dropped or cleared).
    pub(crate) fn forget(&self, pending: &mut HashMap<u64, Pending>) {
        let n = pending.drain().filter(|(_, p)| p.reserved).count();
        if n > 0 {
            let mut e = self.inner.lock();
            e.reserved = e.reserved.saturating_sub(n);
            self.bytes.free(n * EVENTUAL_ENTRY);
        }
    }

    /// Reads keys from the merged view (this host's, merged with the
    /// group's other hosts' views), combined with the worker's pending
    /// updates; a read keeps a live entry from idling out.
    pub(crate) fn read(&self, keys: &[u64], pending: &HashMap<u64, Pending>, now: u64, out: &mut Vec<u64>) {
        let mut e = self.inner.lock();
        let timeout = e.idle_timeout_ns;
        let identity = self.identity();
        for k in keys {
            let mut merged = match e.values.get_mut(k) {
                Some(m) if !stale(m.last_ns, now, timeout) => {
                    m.last_ns = now;
                    Some(m.value)
                }
                _ => None,
            };
            for host in e.remote.values() {
                if let Some(m) = host.get(k).filter(|m| !stale(m.last_ns, now, timeout)) {
                    merged = Some(self.merge.apply(merged.unwrap_or(identity), m.value));
                }
            }
            let local = pending.get(k).filter(|p| p.dirty).map(|p| p.value);
            out.push(match (merged, local) {
                (Some(m), Some(l)) => self.merge.apply(m, l),
                (Some(v), None) | (None, Some(v)) => v,
                (None, None) => 0,
            });
        }
    }

    /// Calls `f` once per live key of the view a worker reads (this host's
    /// merged view, the group's other hosts' views and the worker's own
    /// unmerged updates) with its value as `read` gives it, without
    /// refreshing the entries (a scan is not a use).
    pub(crate) fn visit(&self, pending: &HashMap<u64, Pending>, now: u64, mut f: impl FnMut(u64, u64)) {
        let e = self.inner.lock();
        let timeout = e.idle_timeout_ns;
        let identity = self.identity();
        let hosts: Vec<&HashMap<u64, Merged>> = e.remote.values().collect();
        let value = |k: &u64| {
            let mut merged = e.values.get(k).filter(|m| !stale(m.last_ns, now, timeout)).map(|m| m.value);
            for host in &hosts {
                if let Some(m) = host.get(k).filter(|m| !stale(m.last_ns, now, timeout)) {
                    merged = Some(self.merge.apply(merged.unwrap_or(identity), m.value));
                }
            }
            match (merged, pending.get(k).filter(|p| p.dirty).map(|p| p.value)) {
                (Some(m), Some(l)) => Some(self.merge.apply(m, l)),
                (Some(v), None) | (None, Some(v)) => Some(v),
                (None, None) => None,
            }
        };
        for k in e.values.keys() {
            if let Some(v) = value(k) {
                f(*k, v);
            }
        }
        for (i, host) in hosts.iter().enumerate() {
            for k in host.keys() {
                // Each key once: skip it where an earlier view has it.
                if e.values.contains_key(k) || hosts.iter().take(i).any(|h| h.contains_key(k)) {
                    continue;
                }
                if let Some(v) = value(k) {
                    f(*k, v);
                }
            }
        }
        for (k, p) in pending {
            if p.dirty && !e.values.contains_key(k) && !hosts.iter().any(|h| h.contains_key(k)) {
                f(*k, p.value);
            }
        }
    }

    /// Entries in the merged view.
    pub(crate) fn len(&self) -> usize {
        self.inner.lock().values.len()
    }

    /// This host's values of the keys merged since the last call, for
    /// the group's other hosts; of all its live keys every half idle
    /// timeout.
    pub(crate) fn take_changed(&self, now: u64) -> Vec<(u64, u64)> {
        let mut e = self.inner.lock();
        let inner = &mut *e;
        let timeout = inner.idle_timeout_ns;
        let refresh = timeout > 0 && now.saturating_sub(inner.last_refresh_ns) >= timeout / 2;
        let mut out: Vec<(u64, u64)> = if refresh {
            inner.last_refresh_ns = now;
            inner.values.iter().filter(|(_, m)| !stale(m.last_ns, now, timeout)).map(|(k, m)| (*k, m.value)).collect()
        } else {
            inner.changed.keys().filter_map(|k| inner.values.get(k).map(|m| (*k, m.value))).collect()
        };
        inner.changed.clear();
        out.sort_unstable();
        out
    }

    /// Takes host `host`'s view of some keys (its values replace what it
    /// sent before). A key new to that host's view needs room within the
    /// table's capacity for it and the NF's state budget; returns how many
    /// were refused for want of either.
    pub(crate) fn set_remote(&self, host: &str, entries: &[(u64, u64)], now: u64) -> u64 {
        let mut e = self.inner.lock();
        let capacity = e.capacity;
        let view = e.remote.entry(host.to_string()).or_default();
        let mut refused = 0;
        for &(k, value) in entries {
            if let Some(m) = view.get_mut(&k) {
                *m = Merged { value, last_ns: now };
                continue;
            }
            if view.len() >= capacity || !self.bytes.try_charge(EVENTUAL_ENTRY) {
                refused += 1;
                continue;
            }
            view.insert(k, Merged { value, last_ns: now });
        }
        refused
    }

    /// The number of keys in the merged view over the group and its `n`
    /// largest values (key, value), largest first; allocates O(n), not
    /// O(table).
    pub(crate) fn top(&self, n: usize) -> (usize, Vec<(u64, u64)>) {
        use std::cmp::Reverse;
        let e = self.inner.lock();
        let identity = self.identity();
        let merged = |k: &u64| {
            let mut v = e.values.get(k).map(|m| m.value);
            for host in e.remote.values() {
                if let Some(m) = host.get(k) {
                    v = Some(self.merge.apply(v.unwrap_or(identity), m.value));
                }
            }
            v.unwrap_or(0)
        };
        let mut count = 0usize;
        let mut heap: std::collections::BinaryHeap<Reverse<(u64, Reverse<u64>)>> = std::collections::BinaryHeap::new();
        let mut consider = |k: &u64| {
            count += 1;
            heap.push(Reverse((merged(k), Reverse(*k))));
            if heap.len() > n {
                heap.pop();
            }
        };
        for k in e.values.keys() {
            consider(k);
        }
        let hosts: Vec<&HashMap<u64, Merged>> = e.remote.values().collect();
        for (i, host) in hosts.iter().enumerate() {
            for k in host.keys() {
                // Each key once: skip it where an earlier view has it.
                if e.values.contains_key(k) || hosts.iter().take(i).any(|h| h.contains_key(k)) {
                    continue;
                }
                consider(k);
            }
        }
        let mut top: Vec<(u64, u64)> = heap.into_iter().map(|Reverse((v, Reverse(k)))| (k, v)).collect();
        top.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        (count, top)
    }

    /// The merged view over the group (this host's and the others'), sorted
    /// by key.
    pub(crate) fn snapshot(&self) -> Vec<(u64, u64)> {
        let e = self.inner.lock();
        if e.remote.is_empty() {
            let mut v: Vec<(u64, u64)> = e.values.iter().map(|(k, m)| (*k, m.value)).collect();
            v.sort_unstable();
            return v;
        }
        let mut all: HashMap<u64, u64> = e.values.iter().map(|(k, m)| (*k, m.value)).collect();
        for host in e.remote.values() {
            for (k, m) in host {
                let v = all.entry(*k).or_insert(self.identity());
                *v = self.merge.apply(*v, m.value);
            }
        }
        let mut v: Vec<(u64, u64)> = all.into_iter().collect();
        v.sort_unstable();
        v
    }

    /// Removes entries idle for longer than the table's timeout, if a
    /// sweep is due (one worker sweeps for all). Returns how many were
    /// removed and, if `notify`, the removed `(key, value)` pairs.
    pub(crate) fn sweep(&self, now: u64, notify: bool, notes: &mut Vec<(u64, u64)>) -> u64 {
        let mut e = self.inner.lock();
        let timeout = e.idle_timeout_ns;
        if timeout == 0 || now.saturating_sub(e.last_sweep_ns) < (timeout / 8).max(1_000_000) {
            return 0;
        }
        e.last_sweep_ns = now;
        let mut n = 0u64;
        let inner = &mut *e;
        inner.values.retain(|k, m| {
            if !stale(m.last_ns, now, timeout) {
                return true;
            }
            n += 1;
            inner.changed.remove(k);
            if notify {
                notes.push((*k, m.value));
            }
            false
        });
        let mut gone = 0usize;
        for host in e.remote.values_mut() {
            let before = host.len();
            host.retain(|_, m| !stale(m.last_ns, now, timeout));
            gone += before - host.len();
        }
        e.remote.retain(|_, h| !h.is_empty());
        self.bytes.free((n as usize + gone) * EVENTUAL_ENTRY);
        n
    }
}
