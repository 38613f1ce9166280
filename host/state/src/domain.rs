//! What the workers of one host share for one NF: the merged views of its
//! eventual tables, its release pools ([`crate::pool`]) and its
//! single-writer tables, with the byte account they are charged to.
//!
//! Every access takes one lock per state call (so one per batch, not per
//! packet); between calls a worker works on its own replica or share.

use crate::HashMap;
use crate::account::SharedBytes;
use crate::eventual::EventualShared;
use crate::pool::{Pool, PoolStats};
use crate::single::SingleTable;
use crate::spec::{Merge, TableSpec};
use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

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
        self.inner.lock().single.values().map(|s| s.sync_interval_ns()).min()
    }

    /// Single-writer table `spec.name`, created on first use with one
    /// shard per planned worker; its limits follow the latest declaration.
    pub(crate) fn single(&self, spec: &TableSpec, sync_interval_ns: u64) -> SingleTable {
        let mut d = self.inner.lock();
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
        let s = self.inner.lock().single.get(name).cloned()?;
        Some(s.snapshot().into_iter().map(|(k, v)| (k, v.into_bytes())).collect())
    }

    /// Registers a worker and returns its index.
    pub(crate) fn attach(&self) -> usize {
        let mut d = self.inner.lock();
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
        self.bytes.set_budget(bytes);
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
        let mut d = self.inner.lock();
        let shared = d
            .eventual
            .entry(spec.name.clone())
            .or_insert_with(|| Arc::new(EventualShared::new(merge, self.bytes.clone(), self.track.clone())))
            .clone();
        shared.set_limits(spec);
        shared
    }

    /// Pool `name`, created on first use.
    pub(crate) fn pool(&self, spec: &TableSpec, first: u64, count: u64, chunk: u32) -> Arc<Pool> {
        let mut d = self.inner.lock();
        let workers = d.workers.max(1);
        d.pools
            .entry(spec.name.clone())
            .or_insert_with(|| Arc::new(Pool::new(self.bytes.clone(), first, count, chunk, workers)))
            .clone()
    }

    /// The merged contents of eventual table `name` (what the workers have
    /// merged so far), sorted by key.
    pub fn eventual_snapshot(&self, name: &str) -> Option<Vec<(u64, u64)>> {
        let shared = self.inner.lock().eventual.get(name).cloned()?;
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
            self.inner.lock().eventual.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
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
        let shared = self.inner.lock().eventual.get(table).cloned();
        shared.map_or(0, |t| t.set_remote(host, entries, now_ns))
    }

    /// The number of keys of eventual table `name` merged over the group,
    /// and its `n` largest values, largest first (cheap on a large table).
    pub fn eventual_top(&self, name: &str, n: usize) -> Option<(usize, Vec<(u64, u64)>)> {
        let shared = self.inner.lock().eventual.get(name).cloned()?;
        Some(shared.top(n))
    }

    /// Names of the eventual tables.
    pub fn eventual_tables(&self) -> Vec<String> {
        let mut v: Vec<String> = self.inner.lock().eventual.keys().cloned().collect();
        v.sort();
        v
    }

    /// Statistics of every pool, by name.
    pub fn pool_stats(&self) -> Vec<(String, PoolStats)> {
        let pools: Vec<(String, Arc<Pool>)> =
            self.inner.lock().pools.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        let mut v: Vec<(String, PoolStats)> = pools.into_iter().map(|(k, p)| (k, p.stats())).collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// Names of the pools, sorted.
    pub fn pools(&self) -> Vec<String> {
        let mut v: Vec<String> = self.inner.lock().pools.keys().cloned().collect();
        v.sort();
        v
    }

    /// Pool `name`'s resources: `first..end`.
    pub fn pool_range(&self, name: &str) -> Option<(u64, u64)> {
        Some(self.pool_named(name)?.range())
    }

    fn pool_named(&self, name: &str) -> Option<Arc<Pool>> {
        self.inner.lock().pools.get(name).cloned()
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
        Some(self.pool_named(name)?.bindings_where(&|_| true))
    }
}
