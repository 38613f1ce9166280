//! What the workers of one host share for one NF: the merged views of its
//! eventual tables and the free lists and bindings of its release pools.
//!
//! Every access takes one lock per state call (so one per batch, not per
//! packet); between calls a worker works on its own replica or share.

use crate::single::SingleTable;
use crate::spec::{Merge, TableSpec};
use crate::{HashMap, HashSet};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Shared state of one NF across the workers of a host. Create one per NF
/// (per chain stage) and attach every worker's instance to it.
#[derive(Debug)]
pub struct Domain {
    inner: Mutex<DomainInner>,
    bytes: Arc<SharedBytes>,
    /// The worker whose meters carry the shared tables' bytes (one live
    /// worker at a time; [`NO_BILLER`] when none has claimed it).
    biller: AtomicUsize,
    /// Workers the host runs for the NF: the owners of its single-writer
    /// tables.
    planned: AtomicUsize,
    /// Whether single-writer tables sync only when the runner says
    /// ([`crate::Tables::sync_point`]), at the same packet on every worker.
    barrier: AtomicBool,
    /// Whether eventual tables note the keys merged for the group's other
    /// hosts ([`Domain::eventual_changes`]); off unless the host is in a
    /// group with peers, so that a lone host keeps no such set.
    track: Arc<AtomicBool>,
}

/// No worker bills the shared tables yet.
const NO_BILLER: usize = usize::MAX;

impl Default for Domain {
    fn default() -> Self {
        Domain {
            inner: Mutex::default(),
            bytes: Arc::default(),
            biller: AtomicUsize::new(NO_BILLER),
            planned: AtomicUsize::new(1),
            barrier: AtomicBool::new(false),
            track: Arc::default(),
        }
    }
}

#[derive(Debug, Default)]
struct DomainInner {
    workers: usize,
    eventual: HashMap<String, Arc<EventualShared>>,
    pools: HashMap<String, Arc<Pool>>,
    single: HashMap<String, SingleTable>,
}

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

    pub(crate) fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A worker that panicked while holding the lock leaves data that is
    // still consistent (every update is a single map operation), so keep
    // going rather than poisoning every other worker.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Domain {
    /// A new, empty domain.
    pub fn new() -> Arc<Self> {
        Arc::new(Domain::default())
    }

    /// A new, empty domain for an NF the host runs on `workers` workers:
    /// its single-writer tables get one owner shard per worker.
    pub fn for_workers(workers: usize) -> Arc<Self> {
        let d = Domain::default();
        d.planned.store(workers.max(1), Ordering::Relaxed);
        Arc::new(d)
    }

    /// Makes single-writer tables sync only at [`crate::Tables::sync_point`],
    /// which the runner calls on every worker at the same packet (`run`:
    /// the output does not depend on thread timing).
    pub fn set_barrier(&self, on: bool) {
        self.barrier.store(on, Ordering::Relaxed);
    }

    pub(crate) fn barrier(&self) -> bool {
        self.barrier.load(Ordering::Relaxed)
    }

    /// The shortest sync interval of the single-writer tables, if there
    /// are any: how often (packet time) a barrier runner must sync.
    pub fn sync_interval_ns(&self) -> Option<u64> {
        lock(&self.inner).single.values().map(|s| s.sync_interval_ns()).min()
    }

    /// Single-writer table `spec.name`, created on first use with one
    /// shard per planned worker; its limits follow the latest declaration.
    pub(crate) fn single(&self, spec: &TableSpec, sync_interval_ns: u64) -> SingleTable {
        let mut d = lock(&self.inner);
        let shards = self.planned.load(Ordering::Relaxed);
        let make = || SingleTable::new(spec, shards, sync_interval_ns, self.bytes.clone());
        let s = d.single.entry(spec.name.clone()).or_insert_with(make);
        // A declaration of another kind under the name is refused before it
        // gets here; should one arrive, it gets a table of its own kind.
        if !s.holds(spec.kind) {
            *s = make();
        }
        let s = s.clone();
        s.set_limits(spec, sync_interval_ns);
        s
    }

    /// The published contents of single-writer table `name`, sorted by
    /// key: counter values as 8 bytes little-endian.
    pub fn single_snapshot(&self, name: &str) -> Option<Vec<(Vec<u8>, Vec<u8>)>> {
        let s = lock(&self.inner).single.get(name).cloned()?;
        Some(s.snapshot().into_iter().map(|(k, v)| (k, v.into_bytes())).collect())
    }

    /// Registers a worker and returns its index.
    pub(crate) fn attach(&self) -> usize {
        let mut d = lock(&self.inner);
        d.workers += 1;
        d.workers - 1
    }

    /// Whether `worker` bills the shared tables' bytes: the first live
    /// worker to ask does, until it leaves.
    pub(crate) fn bills_shared(&self, worker: usize) -> bool {
        match self.biller.compare_exchange(NO_BILLER, worker, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => true,
            Err(current) => current == worker,
        }
    }

    /// A worker's tables are dropped: another worker bills from now on.
    pub(crate) fn leave(&self, worker: usize) {
        let _ = self.biller.compare_exchange(worker, NO_BILLER, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// Sets the budget of the shared tables (the NF's state budget).
    pub fn set_budget(&self, bytes: usize) {
        self.bytes.budget.store(bytes, Ordering::Relaxed);
    }

    /// Bytes the shared tables hold (keys, values and [`ENTRY_OVERHEAD`]
    /// per entry), charged against the NF's state budget once for all
    /// workers.
    ///
    /// [`ENTRY_OVERHEAD`]: crate::ENTRY_OVERHEAD
    pub fn shared_bytes(&self) -> usize {
        self.bytes.used()
    }

    /// The shared view of eventual table `spec.name`, created on first
    /// use; its capacity and expiry follow the latest declaration.
    pub(crate) fn eventual(&self, spec: &TableSpec, merge: Merge) -> Arc<EventualShared> {
        let mut d = lock(&self.inner);
        let shared = d
            .eventual
            .entry(spec.name.clone())
            .or_insert_with(|| {
                Arc::new(EventualShared {
                    merge,
                    bytes: self.bytes.clone(),
                    track: self.track.clone(),
                    inner: Mutex::new(EventualInner::default()),
                })
            })
            .clone();
        shared.set_limits(spec);
        shared
    }

    /// Pool `name`, created on first use.
    pub(crate) fn pool(&self, spec: &TableSpec, first: u64, count: u64, chunk: u32) -> Arc<Pool> {
        let mut d = lock(&self.inner);
        let workers = d.workers.max(1);
        d.pools
            .entry(spec.name.clone())
            .or_insert_with(|| {
                // A chunk is a hint: the host bounds the work (and the
                // allocation) one refill may do inside a call.
                let chunk = if chunk == 0 { (count / (4 * workers as u64)).clamp(1, 256) } else { u64::from(chunk) }
                    .clamp(1, MAX_CHUNK)
                    .min(count.max(1));
                Arc::new(Pool {
                    bytes: self.bytes.clone(),
                    inner: Mutex::new(PoolInner {
                        first,
                        end: first + count,
                        fresh: VecDeque::from([(first, first + count)]),
                        free: Vec::new(),
                        shares: Vec::new(),
                        bound: HashMap::default(),
                        chunk: chunk as usize,
                        rebalances: 0,
                        exhausted: 0,
                        split: None,
                        foreign: Vec::new(),
                        changed: HashSet::default(),
                        changed_all: false,
                        unknown_releases: 0,
                    }),
                })
            })
            .clone()
    }

    /// The merged contents of eventual table `name` (what the workers have
    /// merged so far), sorted by key.
    pub fn eventual_snapshot(&self, name: &str) -> Option<Vec<(u64, u64)>> {
        let shared = lock(&self.inner).eventual.get(name).cloned()?;
        Some(shared.snapshot())
    }

    /// Starts noting the keys of eventual tables that workers merge, for
    /// [`eventual_changes`](Self::eventual_changes) (a host in a group).
    pub fn track_changes(&self) {
        self.track.store(true, Ordering::Relaxed);
    }

    /// Per eventual table, this host's values of the keys its workers
    /// merged since the last call (since [`track_changes`](Self::track_changes)),
    /// and every half idle timeout those of all its live keys: what the
    /// group's other hosts are sent. (A key read here but no longer
    /// updated stays live here; without the refresh it would idle out on
    /// the other hosts.) `now_ns`: the host's packet clock.
    pub fn eventual_changes(&self, now_ns: u64) -> Vec<(String, Vec<(u64, u64)>)> {
        let tables: Vec<(String, Arc<EventualShared>)> =
            lock(&self.inner).eventual.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        let mut out: Vec<(String, Vec<(u64, u64)>)> =
            tables.into_iter().map(|(k, t)| (k, t.take_changed(now_ns))).filter(|(_, v)| !v.is_empty()).collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Takes another host's values of eventual table `table` (they replace
    /// what it sent before; reads merge them with this host's). Returns
    /// how many were refused (the table's capacity for that host, or the
    /// NF's state budget); entries of a table this host has not declared
    /// are ignored.
    pub fn set_eventual_remote(&self, host: &str, table: &str, entries: &[(u64, u64)], now_ns: u64) -> u64 {
        let shared = lock(&self.inner).eventual.get(table).cloned();
        shared.map_or(0, |t| t.set_remote(host, entries, now_ns))
    }

    /// The number of keys of eventual table `name` merged over the group,
    /// and its `n` largest values, largest first (cheap on a large table).
    pub fn eventual_top(&self, name: &str, n: usize) -> Option<(usize, Vec<(u64, u64)>)> {
        let shared = lock(&self.inner).eventual.get(name).cloned()?;
        Some(shared.top(n))
    }

    /// Names of the eventual tables.
    pub fn eventual_tables(&self) -> Vec<String> {
        let mut v: Vec<String> = lock(&self.inner).eventual.keys().cloned().collect();
        v.sort();
        v
    }

    /// Statistics of every pool, by name.
    pub fn pool_stats(&self) -> Vec<(String, PoolStats)> {
        let pools: Vec<(String, Arc<Pool>)> =
            lock(&self.inner).pools.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        let mut v: Vec<(String, PoolStats)> = pools.into_iter().map(|(k, p)| (k, p.stats())).collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// Names of the pools, sorted.
    pub fn pools(&self) -> Vec<String> {
        let mut v: Vec<String> = lock(&self.inner).pools.keys().cloned().collect();
        v.sort();
        v
    }

    /// Pool `name`'s resources: `first..end`.
    pub fn pool_range(&self, name: &str) -> Option<(u64, u64)> {
        let pool = self.pool_named(name)?;
        let p = lock(&pool.inner);
        Some((p.first, p.end))
    }

    fn pool_named(&self, name: &str) -> Option<Arc<Pool>> {
        lock(&self.inner).pools.get(name).cloned()
    }

    /// Splits pool `name` between the hosts of a group: this host hands
    /// out only the resources `owns` allows, tested once per aligned
    /// `block`. Free resources outside are forgotten; blocks it gains are
    /// handed out fresh, but for resources bound here (so a block's
    /// bindings from its previous owner are [imported](Self::pool_import)
    /// before it is allowed).
    pub fn split_pool(&self, name: &str, block: u64, owns: &dyn Fn(u64) -> bool) {
        if let Some(p) = self.pool_named(name) {
            p.split(block, owns);
        }
    }

    /// Removes and returns pool `name`'s bindings of the resources `keep`
    /// does not allow (for the host their block moved to), sorted.
    pub fn pool_take_bindings(&self, name: &str, keep: &dyn Fn(u64) -> bool) -> Vec<(u64, Vec<u8>)> {
        self.pool_named(name).map(|p| p.take_bindings(keep)).unwrap_or_default()
    }

    /// Pool `name`'s bindings of the resources `pick` allows, sorted.
    pub fn pool_bindings_where(&self, name: &str, pick: &dyn Fn(u64) -> bool) -> Vec<(u64, Vec<u8>)> {
        self.pool_named(name).map(|p| p.bindings_where(pick)).unwrap_or_default()
    }

    /// Binds, in pool `name`, resources held by flows of another host; returns
    /// how many were refused (outside the pool, or over the state budget).
    pub fn pool_import(&self, name: &str, entries: &[(u64, Vec<u8>)]) -> u64 {
        self.pool_named(name).map_or(entries.len() as u64, |p| p.import(entries))
    }

    /// Unbinds resources of pool `name` that another host released;
    /// returns how many were bound here.
    pub fn pool_release_remote(&self, name: &str, resources: &[u64]) -> u64 {
        self.pool_named(name).map_or(0, |p| p.release_remote(resources))
    }

    /// Takes pool `name`'s resources released here but bound on another
    /// host, to send to their block's owner.
    pub fn pool_take_foreign(&self, name: &str) -> Vec<u64> {
        self.pool_named(name).map(|p| p.take_foreign()).unwrap_or_default()
    }

    /// Takes pool `name`'s resources whose binding changed since the last
    /// call (split pools), with their binding now (`None`: free); `None`
    /// when every binding is to be sent again.
    pub fn pool_take_changed(&self, name: &str) -> Option<Vec<(u64, Option<Vec<u8>>)>> {
        self.pool_named(name).map_or(Some(Vec::new()), |p| p.take_changed())
    }

    /// The resources currently bound in pool `name`, with their values,
    /// sorted by resource.
    pub fn pool_bindings(&self, name: &str) -> Option<Vec<(u64, Vec<u8>)>> {
        let pool = lock(&self.inner).pools.get(name).cloned()?;
        let p = lock(&pool.inner);
        let mut v: Vec<(u64, Vec<u8>)> = p.bound.iter().map(|(k, b)| (*k, b.value.clone())).collect();
        v.sort_unstable_by_key(|e| e.0);
        Some(v)
    }
}

/// Bytes one entry of an eventual table costs: key, value and overhead.
pub(crate) const EVENTUAL_ENTRY: usize = 16 + crate::tables::ENTRY_OVERHEAD;

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
    fn set_limits(&self, spec: &TableSpec) {
        let mut e = lock(&self.inner);
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
            let e = guard.get_or_insert_with(|| lock(&self.inner));
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
        let mut e = lock(&self.inner);
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
            let mut e = lock(&self.inner);
            e.reserved = e.reserved.saturating_sub(n);
            self.bytes.free(n * EVENTUAL_ENTRY);
        }
    }

    /// Reads keys from the merged view (this host's, merged with the
    /// group's other hosts' views), combined with the worker's pending
    /// updates; a read keeps a live entry from idling out.
    pub(crate) fn read(&self, keys: &[u64], pending: &HashMap<u64, Pending>, now: u64, out: &mut Vec<u64>) {
        let mut e = lock(&self.inner);
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
        let e = lock(&self.inner);
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
        lock(&self.inner).values.len()
    }

    /// This host's values of the keys merged since the last call, for
    /// the group's other hosts; of all its live keys every half idle
    /// timeout.
    pub(crate) fn take_changed(&self, now: u64) -> Vec<(u64, u64)> {
        let mut e = lock(&self.inner);
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
        let mut e = lock(&self.inner);
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
        let e = lock(&self.inner);
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
        let e = lock(&self.inner);
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
        let mut e = lock(&self.inner);
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

/// Whether an entry last used at `last_ns` is idle at `now`.
pub(crate) fn stale(last_ns: u64, now: u64, timeout: u64) -> bool {
    timeout > 0 && now.saturating_sub(last_ns) > timeout
}

/// The most resources a worker takes from a pool at a time, whatever the
/// declared `chunk`.
pub const MAX_CHUNK: u64 = 4096;

/// Counters of a pool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct PoolStats {
    /// Resources in the pool.
    pub size: u64,
    /// Resources held by flows.
    pub bound: u64,
    /// Resources in workers' shares, not held.
    pub in_shares: u64,
    /// Times a worker took resources from another worker's share.
    pub rebalances: u64,
    /// Resources asked for while the whole pool was in use.
    pub exhausted: u64,
}

#[derive(Debug)]
struct Binding {
    value: Vec<u8>,
    worker: usize,
}

#[derive(Debug)]
struct PoolInner {
    first: u64,
    end: u64,
    /// Ranges `start..end` never handed out here, ascending.
    fresh: VecDeque<(u64, u64)>,
    /// Resources given back to the host.
    free: Vec<u64>,
    /// Each worker's share: resources it may hand out without asking.
    shares: Vec<Vec<u64>>,
    bound: HashMap<u64, Binding>,
    chunk: usize,
    rebalances: u64,
    exhausted: u64,
    /// The part of the pool this host may hand out, when the pool is split
    /// between the hosts of a group; `None`: all of it.
    split: Option<Split>,
    /// Resources released here that were bound on another host (a split
    /// pool's flow that moved here), to send to their block's owner.
    foreign: Vec<u64>,
    /// Resources bound or unbound since the last
    /// [`Pool::take_changed`] (split pools only): replicated to the
    /// host that takes their block over.
    changed: HashSet<u64>,
    /// `changed` overflowed: every binding is sent again.
    changed_all: bool,
    /// Releases of resources bound nowhere here and not foreign either.
    unknown_releases: u64,
}

/// Which blocks of a split pool this host hands out.
#[derive(Debug, Clone)]
struct Split {
    /// Resources per block (blocks are aligned on absolute values).
    block: u64,
    first_block: u64,
    owns: Vec<bool>,
}

impl Split {
    fn allows(&self, r: u64) -> bool {
        let i = (r / self.block).saturating_sub(self.first_block);
        usize::try_from(i).ok().and_then(|i| self.owns.get(i)).copied().unwrap_or(false)
    }
}

/// Resources released here for other hosts, kept at most.
pub const MAX_FOREIGN: usize = 65_536;
/// Changed bindings noted at most between two replications.
const MAX_CHANGED: usize = 1 << 20;

/// Cuts `ranges` to the resources `allows` lets through, testing one
/// resource per aligned block of `block`.
fn cut(ranges: impl Iterator<Item = (u64, u64)>, block: u64, allows: impl Fn(u64) -> bool) -> VecDeque<(u64, u64)> {
    let mut out: VecDeque<(u64, u64)> = VecDeque::new();
    for (start, end) in ranges {
        let mut at = start;
        while at < end {
            let stop = ((at / block).saturating_add(1)).saturating_mul(block).min(end);
            if allows(at) {
                match out.back_mut() {
                    Some(last) if last.1 == at => last.1 = stop,
                    _ => out.push_back((at, stop)),
                }
            }
            at = stop;
        }
    }
    out
}

impl PoolInner {
    fn share(&mut self, worker: usize) -> &mut Vec<u64> {
        if self.shares.len() <= worker {
            self.shares.resize_with(worker + 1, Vec::new);
        }
        // The resize above makes the index valid; the fallback is never
        // taken but keeps this free of indexing.
        let len = self.shares.len();
        let idx = worker.min(len.saturating_sub(1));
        match self.shares.get_mut(idx) {
            Some(s) => s,
            None => &mut self.free,
        }
    }

    fn allows(&self, r: u64) -> bool {
        self.split.as_ref().is_none_or(|s| s.allows(r))
    }

    fn note(&mut self, r: u64) {
        if self.split.is_none() || self.changed_all {
            return;
        }
        if self.changed.len() >= MAX_CHANGED {
            self.changed_all = true;
            self.changed.clear();
        } else {
            self.changed.insert(r);
        }
    }

    /// Refills `worker`'s share: from resources never handed out, then the
    /// free list, then half of the largest other share.
    fn refill(&mut self, worker: usize) {
        let chunk = self.chunk;
        let mut taken: Vec<u64> = Vec::with_capacity(chunk);
        while taken.len() < chunk {
            let Some(range) = self.fresh.front_mut() else { break };
            let r = range.0;
            range.0 += 1;
            if range.0 >= range.1 {
                self.fresh.pop_front();
            }
            // Bound here already: taken over from another host.
            if !self.bound.contains_key(&r) {
                taken.push(r);
            }
        }
        while taken.len() < chunk {
            match self.free.pop() {
                Some(r) => taken.push(r),
                None => break,
            }
        }
        if taken.is_empty() {
            let donor = self
                .shares
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != worker)
                .max_by_key(|(_, s)| s.len())
                .map(|(i, _)| i);
            if let Some(d) = donor
                && let Some(share) = self.shares.get_mut(d)
                && !share.is_empty()
            {
                let keep = share.len() / 2;
                taken.extend(share.drain(keep..));
                self.rebalances += 1;
            }
        }
        // Hand out in ascending order: deterministic for replays.
        taken.sort_unstable_by(|a, b| b.cmp(a));
        self.share(worker).extend(taken);
    }
}

/// A release-consistency pool of integer resources.
#[derive(Debug)]
pub(crate) struct Pool {
    /// Bindings are charged here: resource, value and overhead.
    bytes: Arc<SharedBytes>,
    inner: Mutex<PoolInner>,
}

/// Bytes one binding costs.
fn binding_cost(value: &[u8]) -> usize {
    8 + value.len() + crate::tables::ENTRY_OVERHEAD
}

impl Pool {
    /// Takes one resource per value for `worker` and binds it. Returns how
    /// many values got none (the pool is exhausted), or the index of the
    /// value the state budget had no room for (earlier ones are bound).
    pub(crate) fn acquire<'a>(
        &self,
        worker: usize,
        values: impl Iterator<Item = &'a [u8]>,
        out: &mut Vec<u64>,
    ) -> Result<u64, usize> {
        let mut p = lock(&self.inner);
        let mut short = 0;
        for (i, value) in values.enumerate() {
            if !self.bytes.try_charge(binding_cost(value)) {
                p.exhausted += short;
                return Err(i);
            }
            let mut r = p.share(worker).pop();
            if r.is_none() {
                p.refill(worker);
                r = p.share(worker).pop();
            }
            match r {
                Some(r) => {
                    p.bound.insert(r, Binding { value: value.to_vec(), worker });
                    p.note(r);
                    out.push(r);
                }
                None => {
                    self.bytes.free(binding_cost(value));
                    short += 1;
                }
            }
        }
        p.exhausted += short;
        Ok(short)
    }

    /// The `limit` smallest held resources after `after`, with their
    /// values, and whether more are held after them.
    pub(crate) fn scan(&self, after: Option<u64>, limit: usize) -> (Vec<(u64, Vec<u8>)>, bool) {
        let p = lock(&self.inner);
        let mut page = crate::scan::Smallest::new(after, limit);
        for (r, b) in &p.bound {
            page.offer(*r, b.value.as_slice());
        }
        let (items, more) = page.finish();
        (items.into_iter().map(|(r, v)| (r, v.to_vec())).collect(), more)
    }

    /// Appends the framed values bound to `resources`.
    pub(crate) fn lookup(&self, resources: &[u64], out: &mut Vec<u8>) {
        let p = lock(&self.inner);
        for r in resources {
            let v = p.bound.get(r).map(|b| b.value.as_slice()).unwrap_or(&[]);
            sluice_wire::abi::push_frame(out, v);
        }
    }

    /// Unbinds resources into `worker`'s share; returns surplus beyond two
    /// chunks to the free list.
    pub(crate) fn release(&self, worker: usize, resources: &[u64]) -> u64 {
        let mut p = lock(&self.inner);
        let mut released = 0;
        for r in resources {
            match self.unbind(&mut p, *r) {
                Some(mine) => {
                    if mine {
                        p.share(worker).push(*r);
                    }
                    released += 1;
                }
                // Bound on the host that owns its block: the flow moved
                // here from there.
                None if p.split.is_some() && p.foreign.len() < MAX_FOREIGN => p.foreign.push(*r),
                None => p.unknown_releases += 1,
            }
        }
        let chunk = p.chunk;
        let surplus: Vec<u64> = {
            let share = p.share(worker);
            if share.len() > 2 * chunk { share.drain(..share.len() - chunk).collect() } else { Vec::new() }
        };
        p.free.extend(surplus);
        released
    }

    /// Which worker holds each bound resource (for tests and reports).
    pub(crate) fn holder(&self, resource: u64) -> Option<usize> {
        lock(&self.inner).bound.get(&resource).map(|b| b.worker)
    }

    pub(crate) fn stats(&self) -> PoolStats {
        let p = lock(&self.inner);
        PoolStats {
            size: p.end - p.first,
            bound: p.bound.len() as u64,
            in_shares: p.shares.iter().map(|s| s.len() as u64).sum(),
            rebalances: p.rebalances,
            exhausted: p.exhausted,
        }
    }

    /// Splits the pool between hosts: from now on this host hands out only
    /// the resources `owns` allows, tested once per aligned `block` of
    /// resources. Free resources it no longer owns are forgotten (their
    /// block's owner hands them out); blocks it gains are fresh, but for
    /// resources bound here (imported first, see [`Pool::import`]).
    pub(crate) fn split(&self, block: u64, owns: &dyn Fn(u64) -> bool) {
        let block = block.max(1);
        let mut p = lock(&self.inner);
        let (first, end) = (p.first, p.end);
        let first_block = first / block;
        let blocks = ((end.saturating_sub(1)) / block).saturating_sub(first_block).saturating_add(1);
        let split = Split {
            block,
            first_block,
            owns: (0..blocks).map(|i| owns(first_block.saturating_add(i).saturating_mul(block).max(first))).collect(),
        };
        let old = p.split.replace(split.clone());
        p.free.retain(|r| split.allows(*r));
        for share in &mut p.shares {
            share.retain(|r| split.allows(*r));
        }
        let fresh = std::mem::take(&mut p.fresh);
        let mut ranges: Vec<(u64, u64)> = cut(fresh.into_iter(), block, |r| split.allows(r)).into();
        if let Some(old) = old {
            let gained = (0..blocks).filter_map(|i| {
                let at = first_block.saturating_add(i).saturating_mul(block).max(first);
                (split.allows(at) && !old.allows(at))
                    .then(|| (at, (first_block.saturating_add(i).saturating_add(1)).saturating_mul(block).min(end)))
            });
            ranges.extend(gained);
            ranges.sort_unstable();
        }
        p.fresh = cut(ranges.into_iter(), block, |_| true);
    }

    /// Removes and returns the bindings of the resources `keep` does not
    /// allow (their block moved to another host, which takes them in),
    /// sorted by resource.
    pub(crate) fn take_bindings(&self, keep: &dyn Fn(u64) -> bool) -> Vec<(u64, Vec<u8>)> {
        let mut p = lock(&self.inner);
        let gone: Vec<u64> = p.bound.keys().filter(|r| !keep(**r)).copied().collect();
        let mut out = Vec::with_capacity(gone.len());
        for r in gone {
            if let Some(b) = p.bound.remove(&r) {
                self.bytes.free(binding_cost(&b.value));
                p.changed.remove(&r);
                out.push((r, b.value));
            }
        }
        out.sort_unstable_by_key(|e| e.0);
        out
    }

    /// The bindings of the resources `pick` allows, sorted by resource.
    pub(crate) fn bindings_where(&self, pick: &dyn Fn(u64) -> bool) -> Vec<(u64, Vec<u8>)> {
        let p = lock(&self.inner);
        let mut v: Vec<(u64, Vec<u8>)> =
            p.bound.iter().filter(|(r, _)| pick(**r)).map(|(r, b)| (*r, b.value.clone())).collect();
        v.sort_unstable_by_key(|e| e.0);
        v
    }

    /// Binds resources held by flows of another host (a block taken over):
    /// they are not handed out here until released. Returns how many the
    /// state budget had no room for, or that are outside the pool.
    pub(crate) fn import(&self, entries: &[(u64, Vec<u8>)]) -> u64 {
        let mut p = lock(&self.inner);
        let mut refused = 0;
        let mut taken: HashSet<u64> = HashSet::default();
        for (r, value) in entries {
            if !(p.first..p.end).contains(r) {
                refused += 1;
                continue;
            }
            if let Some(old) = p.bound.remove(r) {
                self.bytes.free(binding_cost(&old.value));
            }
            if !self.bytes.try_charge(binding_cost(value)) {
                refused += 1;
                continue;
            }
            p.bound.insert(*r, Binding { value: value.clone(), worker: 0 });
            p.note(*r);
            taken.insert(*r);
        }
        if !taken.is_empty() {
            p.free.retain(|r| !taken.contains(r));
            for share in &mut p.shares {
                share.retain(|r| !taken.contains(r));
            }
        }
        refused
    }

    /// Unbinds resources another host released (flows that moved there):
    /// they become free here. Returns how many were bound here.
    pub(crate) fn release_remote(&self, resources: &[u64]) -> u64 {
        let mut p = lock(&self.inner);
        let mut released = 0;
        for r in resources {
            match self.unbind(&mut p, *r) {
                Some(mine) => {
                    if mine {
                        p.free.push(*r);
                    }
                    released += 1;
                }
                None => p.unknown_releases += 1,
            }
        }
        released
    }

    /// Unbinds `r` if it is bound here: `Some(true)` if this host hands it
    /// out again, `Some(false)` if its block moved to another host while
    /// it was bound here (kept for that host, see [`Pool::take_foreign`]).
    fn unbind(&self, p: &mut PoolInner, r: u64) -> Option<bool> {
        let b = p.bound.remove(&r)?;
        self.bytes.free(binding_cost(&b.value));
        p.note(r);
        if p.allows(r) {
            return Some(true);
        }
        if p.foreign.len() < MAX_FOREIGN {
            p.foreign.push(r);
        }
        Some(false)
    }

    /// Takes the resources released here that are bound elsewhere.
    pub(crate) fn take_foreign(&self) -> Vec<u64> {
        std::mem::take(&mut lock(&self.inner).foreign)
    }

    /// Takes the resources whose binding changed since the last call, each
    /// with its binding now (`None`: free); `None` when too many changed
    /// to note: then every binding is to be sent again.
    pub(crate) fn take_changed(&self) -> Option<Vec<(u64, Option<Vec<u8>>)>> {
        let mut p = lock(&self.inner);
        if std::mem::take(&mut p.changed_all) {
            return None;
        }
        let changed = std::mem::take(&mut p.changed);
        let mut v: Vec<(u64, Option<Vec<u8>>)> =
            changed.into_iter().map(|r| (r, p.bound.get(&r).map(|b| b.value.clone()))).collect();
        v.sort_unstable_by_key(|e| e.0);
        Some(v)
    }
}
