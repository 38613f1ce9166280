//! Host-owned state tables (`sluice:nf@0.4.0` `state`).
//!
//! Declare tables in [`NetworkFunction::init`](crate::NetworkFunction::init)
//! with [`declare`]; keep the returned handles in the NF value. Every call
//! takes many keys at once, so gather a batch's keys first and make one call
//! per table per batch. Errors are values ([`StateError`]): a full table or
//! a used-up budget never traps.
//!
//! ```no_run
//! use sluice_sdk::state::{self, Counters, Merge, TableSpec};
//!
//! # fn init() -> Result<Counters, sluice_sdk::state::StateError> {
//! // Bytes per source host, summed over workers every 100 ms of packet time.
//! let per_host = Counters::declare(TableSpec::eventual_counter("bytes-by-host", Merge::Sum, 100_000_000))?;
//! per_host.add(&[0x0a00_0001], &[1500])?;
//! # Ok(per_host) }
//! ```
//!
//! List a table with `scan` (a page of at most [`MAX_SCAN`] entries in
//! ascending key order, resumed from the page's cursor) or its largest
//! counters with [`Counters::top_k`], instead of reading every key:
//!
//! ```no_run
//! # fn f(ports: sluice_sdk::state::Counters) -> Result<(), sluice_sdk::state::StateError> {
//! let top5 = ports.top_k(5)?; // [(443, 5120), (80, 4410), ...]: 6 state operations
//! for entry in ports.entries(0) {
//!     let (port, packets) = entry?;
//! #   let _ = (port, packets, &top5);
//! }
//! # Ok(()) }
//! ```
//!
//! The same calls work when the NF is compiled natively into a host (the
//! benchmarks' baseline): they then reach the tables the host installed for
//! the call.

pub use crate::wit::sluice::nf::state::{
    Access, Consistency, EventualSpec, Merge, PoolSpec, ScanPage, Scope, SingleWriterSpec, StateError, TableSpec,
    ValueKind,
};
pub use sluice_wire::abi::{frames, push_frame};

/// A table handle, as `declare` returned it.
pub type Table = u32;

/// Most entries one [`scan`](Counters::scan) page holds and most pairs one
/// [`top_k`](Counters::top_k) returns: the host bounds `limit` and `k` to
/// it (a `limit` of 0 asks for it).
pub const MAX_SCAN: u32 = 1024;

/// Every entry of a table in ascending key order, read one `scan` page at
/// a time: what [`Counters::entries`], [`Bytes::entries`] and
/// [`Pool::entries`] return. A failed call ends it after its error.
#[derive(Debug)]
pub struct Entries<T> {
    table: Table,
    limit: u32,
    cursor: Vec<u8>,
    page: std::vec::IntoIter<T>,
    done: bool,
    decode: fn(ScanPage) -> Vec<T>,
}

impl<T> Entries<T> {
    fn new(table: Table, limit: u32, decode: fn(ScanPage) -> Vec<T>) -> Self {
        Entries { table, limit, cursor: Vec::new(), page: Vec::new().into_iter(), done: false, decode }
    }
}

impl<T> Iterator for Entries<T> {
    type Item = Result<T, StateError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(item) = self.page.next() {
                return Some(Ok(item));
            }
            if self.done {
                return None;
            }
            match imp::scan(self.table, &self.cursor, self.limit) {
                Ok(mut page) => {
                    self.cursor = std::mem::take(&mut page.cursor);
                    self.done = self.cursor.is_empty();
                    self.page = (self.decode)(page).into_iter();
                }
                Err(e) => {
                    self.done = true;
                    return Some(Err(e));
                }
            }
        }
    }
}

/// The `(key, value)` pairs of a page's framed entries.
fn byte_pairs(page: &ScanPage) -> Vec<(Vec<u8>, Vec<u8>)> {
    let items: Vec<&[u8]> = frames(&page.entries).filter_map(Result::ok).collect();
    items.chunks_exact(2).filter_map(|kv| Some((kv.first()?.to_vec(), kv.get(1)?.to_vec()))).collect()
}

impl StateError {
    /// The index of the item a batched call stopped at: for `bad-input`,
    /// `full`, `over-budget` and `too-large`, the key (`counter-add`), the
    /// key-value entry (`put-many`) or the value (`acquire`) the host
    /// refused. The items before it were applied, that one and the ones
    /// after it were not: retry them, or decide their packets another way.
    /// `None` for the other errors (`unknown-table` carries a table
    /// handle, not an item).
    pub fn item(&self) -> Option<u32> {
        match self {
            StateError::BadInput(i) | StateError::Full(i) | StateError::OverBudget(i) | StateError::TooLarge(i) => {
                Some(*i)
            }
            StateError::UnknownTable(_)
            | StateError::NotNow
            | StateError::WrongKind
            | StateError::BadSpec(_)
            | StateError::Incompatible(_) => None,
        }
    }
}

impl TableSpec {
    fn base(name: &str, scope: Scope, access: Access, kind: ValueKind, consistency: Consistency) -> Self {
        TableSpec {
            name: name.to_string(),
            scope,
            access,
            kind,
            consistency,
            key_size: 0,
            max_value_size: 256,
            capacity: 0,
            idle_timeout_ns: 0,
            notify_expired: false,
        }
    }

    /// Byte values per flow, keyed by the batch's flow index.
    pub fn per_flow_bytes(name: &str, max_value_size: u32) -> Self {
        TableSpec {
            max_value_size,
            ..Self::base(name, Scope::PerFlow, Access::ReadWrite, ValueKind::Bytes, Consistency::Local)
        }
    }

    /// Counters per flow, keyed by the batch's flow index.
    pub fn per_flow_counter(name: &str) -> Self {
        Self::base(name, Scope::PerFlow, Access::ReadWrite, ValueKind::Counter, Consistency::Local)
    }

    /// Global counters, one replica per worker, merged with `merge` every
    /// `merge_interval_ns` of packet time.
    pub fn eventual_counter(name: &str, merge: Merge, merge_interval_ns: u64) -> Self {
        Self::base(
            name,
            Scope::Global,
            Access::ReadWrite,
            ValueKind::Counter,
            Consistency::Eventual(EventualSpec { merge, merge_interval_ns }),
        )
    }

    /// Global counters with one owner worker per key (single-writer
    /// consistency). Adds to another worker's keys are forwarded to the
    /// owner as deltas, so none is lost; reads see the owner's value as
    /// published at its last sync plus this worker's own adds since.
    /// Owners sync every `sync_interval_ns` of packet time (0: every batch).
    pub fn single_writer_counter(name: &str, sync_interval_ns: u64) -> Self {
        Self::base(
            name,
            Scope::Global,
            Access::ReadWrite,
            ValueKind::Counter,
            Consistency::SingleWriter(SingleWriterSpec { sync_interval_ns }),
        )
    }

    /// Global byte values with one owner worker per key (single-writer
    /// consistency): writes to another worker's keys are forwarded to the
    /// owner, where the last applied write wins (an empty value removes);
    /// reads see the owner's value as published at its last sync plus this
    /// worker's own writes since. Owners sync every `sync_interval_ns` of
    /// packet time (0: every batch). `key_size` 0 allows keys of 1 to 256
    /// bytes.
    pub fn single_writer_bytes(name: &str, key_size: u32, max_value_size: u32, sync_interval_ns: u64) -> Self {
        TableSpec {
            key_size,
            max_value_size,
            ..Self::base(
                name,
                Scope::Global,
                Access::ReadWrite,
                ValueKind::Bytes,
                Consistency::SingleWriter(SingleWriterSpec { sync_interval_ns }),
            )
        }
    }

    /// Configuration-like byte values written in `init` and replicated to
    /// every worker. `key_size` 0 allows keys of 1 to 256 bytes.
    pub fn read_only_bytes(name: &str, key_size: u32, max_value_size: u32) -> Self {
        TableSpec {
            key_size,
            max_value_size,
            ..Self::base(name, Scope::Global, Access::ReadOnly, ValueKind::Bytes, Consistency::Local)
        }
    }

    /// Configuration-like counters written in `init`.
    pub fn read_only_counter(name: &str) -> Self {
        Self::base(name, Scope::Global, Access::ReadOnly, ValueKind::Counter, Consistency::Local)
    }

    /// A pool of the integers `first..first + count` split between workers
    /// (release consistency), each bound to a value of up to
    /// `max_value_size` bytes while held.
    pub fn pool(name: &str, first: u64, count: u64, max_value_size: u32) -> Self {
        TableSpec {
            max_value_size,
            ..Self::base(
                name,
                Scope::Global,
                Access::ReadWrite,
                ValueKind::Bytes,
                Consistency::Release(PoolSpec { first, count, chunk: 0 }),
            )
        }
    }

    /// Most entries per worker (eventual and single-writer tables: in the
    /// whole table, over every worker).
    pub fn capacity(mut self, capacity: u32) -> Self {
        self.capacity = capacity;
        self
    }

    /// Removes entries idle for this long (packet time).
    pub fn idle_timeout_ns(mut self, ns: u64) -> Self {
        self.idle_timeout_ns = ns;
        self
    }

    /// Hands expired entries to [`NetworkFunction::expired`](crate::NetworkFunction::expired).
    pub fn notify_expired(mut self) -> Self {
        self.notify_expired = true;
        self
    }

    /// Pools: how many resources a worker takes from the free list at a
    /// time (0, the default: the host chooses). Other tables ignore it.
    pub fn chunk(mut self, chunk: u32) -> Self {
        if let Consistency::Release(pool) = &mut self.consistency {
            pool.chunk = chunk;
        }
        self
    }
}

/// A counter table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counters(pub Table);

impl Counters {
    /// Declares a counter table (in `init`).
    pub fn declare(spec: TableSpec) -> Result<Self, StateError> {
        declare(spec).map(Counters)
    }

    /// Adds `deltas[i]` to `keys[i]` (for max/min tables: offers the value).
    pub fn add(&self, keys: &[u64], deltas: &[i64]) -> Result<(), StateError> {
        imp::counter_add(self.0, keys, deltas)
    }

    /// Reads counters (0 for absent keys).
    pub fn get(&self, keys: &[u64]) -> Result<Vec<u64>, StateError> {
        imp::counter_get(self.0, keys)
    }

    /// One page of the table in ascending key order: up to `limit` pairs
    /// (0 or more than [`MAX_SCAN`]: [`MAX_SCAN`]) whose key comes after
    /// `cursor` (empty: from the start) in `counters`, and the cursor of
    /// the next page in `cursor` (empty: the scan is done). Per-flow
    /// tables refuse it (`wrong-kind`). Costs one state operation per
    /// pair plus one.
    pub fn scan(&self, cursor: &[u8], limit: u32) -> Result<ScanPage, StateError> {
        imp::scan(self.0, cursor, limit)
    }

    /// Every `(key, value)` of the table in ascending key order, one
    /// [`scan`](Self::scan) page of `limit` at a time.
    pub fn entries(&self, limit: u32) -> Entries<(u64, u64)> {
        Entries::new(self.0, limit, |page| page.counters)
    }

    /// The `k` (at most [`MAX_SCAN`]) largest counters as `(key, value)`,
    /// largest first, equal values by ascending key, selected by the host
    /// without the NF reading every key. Costs one state operation per
    /// pair plus one.
    pub fn top_k(&self, k: u32) -> Result<Vec<(u64, u64)>, StateError> {
        imp::top_k(self.0, k)
    }
}

/// A byte table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bytes(pub Table);

impl Bytes {
    /// Declares a byte table (in `init`).
    pub fn declare(spec: TableSpec) -> Result<Self, StateError> {
        declare(spec).map(Bytes)
    }

    /// Reads values: `keys` framed (see [`push_frame`]); the result has one
    /// frame per key, empty for absent ones.
    pub fn get_many(&self, keys: &[u8]) -> Result<Vec<u8>, StateError> {
        imp::get_many(self.0, keys)
    }

    /// Writes values: framed key, value, key, value, ... (empty value:
    /// remove).
    pub fn put_many(&self, entries: &[u8]) -> Result<(), StateError> {
        imp::put_many(self.0, entries)
    }

    /// The framed key of flow `flow` of the batch, for per-flow tables.
    pub fn flow_key(out: &mut Vec<u8>, flow: u32) {
        push_frame(out, &flow.to_le_bytes());
    }

    /// One page of the table in ascending (bytewise) key order: up to
    /// `limit` entries (0 or more than [`MAX_SCAN`]: [`MAX_SCAN`]) whose
    /// key comes after `cursor` (empty: from the start), framed key,
    /// value, ... in `entries`, and the cursor of the next page in
    /// `cursor` (empty: the scan is done). Per-flow tables refuse it
    /// (`wrong-kind`).
    pub fn scan(&self, cursor: &[u8], limit: u32) -> Result<ScanPage, StateError> {
        imp::scan(self.0, cursor, limit)
    }

    /// Every `(key, value)` of the table in ascending key order, one
    /// [`scan`](Self::scan) page of `limit` at a time.
    pub fn entries(&self, limit: u32) -> Entries<(Vec<u8>, Vec<u8>)> {
        Entries::new(self.0, limit, |page| byte_pairs(&page))
    }
}

/// A pool of integer resources (release consistency).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pool(pub Table);

impl Pool {
    /// Declares a pool (in `init`).
    pub fn declare(spec: TableSpec) -> Result<Self, StateError> {
        declare(spec).map(Pool)
    }

    /// Takes one resource per framed value; fewer when the pool is used up.
    pub fn acquire(&self, values: &[u8]) -> Result<Vec<u64>, StateError> {
        imp::acquire(self.0, values)
    }

    /// The framed values bound to resources (empty: not held).
    pub fn lookup(&self, resources: &[u64]) -> Result<Vec<u8>, StateError> {
        imp::lookup(self.0, resources)
    }

    /// Gives resources back.
    pub fn release(&self, resources: &[u64]) -> Result<(), StateError> {
        imp::release(self.0, resources)
    }

    /// One page of the resources held on every worker, ascending: up to
    /// `limit` (0 or more than [`MAX_SCAN`]: [`MAX_SCAN`]) after `cursor`
    /// (empty: from the start), each a framed 8-byte little-endian
    /// resource and its framed value in `entries`, and the cursor of the
    /// next page (empty: done).
    pub fn scan(&self, cursor: &[u8], limit: u32) -> Result<ScanPage, StateError> {
        imp::scan(self.0, cursor, limit)
    }

    /// Every held `(resource, value)`, ascending, page by page.
    pub fn entries(&self, limit: u32) -> Entries<(u64, Vec<u8>)> {
        Entries::new(self.0, limit, |page| {
            byte_pairs(&page)
                .into_iter()
                .filter_map(|(k, v)| Some((u64::from_le_bytes(<[u8; 8]>::try_from(k.as_slice()).ok()?), v)))
                .collect()
        })
    }
}

/// Declares a table, or finds the one declared earlier under this name.
/// Only in `init`.
pub fn declare(spec: TableSpec) -> Result<Table, StateError> {
    imp::declare(spec)
}

#[cfg(target_arch = "wasm32")]
mod imp {
    use super::{ScanPage, StateError, Table, TableSpec};
    use crate::wit::sluice::nf::state as host;

    pub fn declare(spec: TableSpec) -> Result<Table, StateError> {
        host::declare(&spec)
    }
    pub fn counter_add(t: Table, keys: &[u64], deltas: &[i64]) -> Result<(), StateError> {
        host::counter_add(t, keys, deltas)
    }
    pub fn counter_get(t: Table, keys: &[u64]) -> Result<Vec<u64>, StateError> {
        host::counter_get(t, keys)
    }
    pub fn get_many(t: Table, keys: &[u8]) -> Result<Vec<u8>, StateError> {
        host::get_many(t, keys)
    }
    pub fn put_many(t: Table, entries: &[u8]) -> Result<(), StateError> {
        host::put_many(t, entries)
    }
    pub fn acquire(t: Table, values: &[u8]) -> Result<Vec<u64>, StateError> {
        host::acquire(t, values)
    }
    pub fn lookup(t: Table, resources: &[u64]) -> Result<Vec<u8>, StateError> {
        host::lookup(t, resources)
    }
    pub fn release(t: Table, resources: &[u64]) -> Result<(), StateError> {
        host::release(t, resources)
    }
    pub fn scan(t: Table, cursor: &[u8], limit: u32) -> Result<ScanPage, StateError> {
        host::scan(t, cursor, limit)
    }
    pub fn top_k(t: Table, k: u32) -> Result<Vec<(u64, u64)>, StateError> {
        host::top_k(t, k)
    }
}

/// Natively, the calls go to the tables the host installed for this call
/// (`sluice_state::with_installed`); with none installed (a unit test of
/// an NF outside any host) they fail with `not-now`.
#[cfg(not(target_arch = "wasm32"))]
mod imp {
    use super::{Access, Consistency, Merge, ScanPage, Scope, StateError, Table, TableSpec, ValueKind};
    use sluice_state as s;

    fn call<R>(f: impl FnOnce(&mut s::Tables) -> Result<R, s::StateError>) -> Result<R, StateError> {
        match s::with_current(f) {
            Some(r) => r.map_err(from_state),
            None => Err(StateError::NotNow),
        }
    }

    fn from_state(e: s::StateError) -> StateError {
        match e {
            s::StateError::UnknownTable(t) => StateError::UnknownTable(t),
            s::StateError::NotNow => StateError::NotNow,
            s::StateError::WrongKind => StateError::WrongKind,
            s::StateError::BadSpec(m) => StateError::BadSpec(m),
            s::StateError::Incompatible(m) => StateError::Incompatible(m),
            s::StateError::BadInput(i) => StateError::BadInput(i),
            s::StateError::Full(i) => StateError::Full(i),
            s::StateError::OverBudget(i) => StateError::OverBudget(i),
            s::StateError::TooLarge(i) => StateError::TooLarge(i),
        }
    }

    fn to_state(spec: TableSpec) -> s::TableSpec {
        let merge = |m: Merge| match m {
            Merge::Sum => s::Merge::Sum,
            Merge::Max => s::Merge::Max,
            Merge::Min => s::Merge::Min,
        };
        s::TableSpec {
            name: spec.name,
            scope: match spec.scope {
                Scope::PerFlow => s::Scope::PerFlow,
                Scope::Global => s::Scope::Global,
            },
            access: match spec.access {
                Access::ReadOnly => s::Access::ReadOnly,
                Access::ReadWrite => s::Access::ReadWrite,
            },
            kind: match spec.kind {
                ValueKind::Counter => s::Kind::Counter,
                ValueKind::Bytes => s::Kind::Bytes,
            },
            consistency: match spec.consistency {
                Consistency::Local => s::Consistency::Local,
                Consistency::Eventual(e) => {
                    s::Consistency::Eventual { merge: merge(e.merge), merge_interval_ns: e.merge_interval_ns }
                }
                Consistency::Release(p) => s::Consistency::Release { first: p.first, count: p.count, chunk: p.chunk },
                Consistency::SingleWriter(w) => s::Consistency::SingleWriter { sync_interval_ns: w.sync_interval_ns },
            },
            key_size: spec.key_size,
            max_value_size: spec.max_value_size,
            capacity: spec.capacity,
            idle_timeout_ns: spec.idle_timeout_ns,
            notify_expired: spec.notify_expired,
        }
    }

    pub fn declare(spec: TableSpec) -> Result<Table, StateError> {
        call(|t| t.declare(to_state(spec)))
    }
    pub fn counter_add(t: Table, keys: &[u64], deltas: &[i64]) -> Result<(), StateError> {
        call(|s| s.counter_add(t, keys, deltas))
    }
    pub fn counter_get(t: Table, keys: &[u64]) -> Result<Vec<u64>, StateError> {
        call(|s| {
            let mut out = Vec::with_capacity(keys.len());
            s.counter_get(t, keys, &mut out).map(|()| out)
        })
    }
    pub fn get_many(t: Table, keys: &[u8]) -> Result<Vec<u8>, StateError> {
        call(|s| {
            let mut out = Vec::new();
            s.get_many(t, keys, &mut out).map(|()| out)
        })
    }
    pub fn put_many(t: Table, entries: &[u8]) -> Result<(), StateError> {
        call(|s| s.put_many(t, entries))
    }
    pub fn acquire(t: Table, values: &[u8]) -> Result<Vec<u64>, StateError> {
        call(|s| {
            let mut out = Vec::new();
            s.acquire(t, values, &mut out).map(|()| out)
        })
    }
    pub fn lookup(t: Table, resources: &[u64]) -> Result<Vec<u8>, StateError> {
        call(|s| {
            let mut out = Vec::new();
            s.lookup(t, resources, &mut out).map(|()| out)
        })
    }
    pub fn release(t: Table, resources: &[u64]) -> Result<(), StateError> {
        call(|s| s.release(t, resources))
    }
    pub fn scan(t: Table, cursor: &[u8], limit: u32) -> Result<ScanPage, StateError> {
        call(|s| s.scan(t, cursor, limit)).map(|p| ScanPage {
            counters: p.counters,
            entries: p.entries,
            cursor: p.cursor,
        })
    }
    pub fn top_k(t: Table, k: u32) -> Result<Vec<(u64, u64)>, StateError> {
        call(|s| s.top_k(t, k))
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;

    /// Runs `f` with fresh tables installed, as a native host would.
    fn with_tables<R>(f: impl FnOnce() -> R) -> R {
        let domain = sluice_state::Domain::new();
        let mut tables = Some(Box::new(sluice_state::Tables::new(&domain, sluice_state::DEFAULT_BUDGET_BYTES)));
        if let Some(t) = tables.as_deref_mut() {
            t.begin_init();
        }
        sluice_state::with_installed(&mut tables, f)
    }

    #[test]
    fn entries_walk_every_page_and_top_k_ranks_by_value_then_key() {
        with_tables(|| {
            let c = Counters::declare(TableSpec::read_only_counter("ports")).unwrap();
            let keys: Vec<u64> = (0..10).rev().collect();
            let counts: Vec<i64> = keys.iter().map(|k| (*k % 4) as i64).collect();
            c.add(&keys, &counts).unwrap();
            let all: Vec<(u64, u64)> = c.entries(3).collect::<Result<_, _>>().unwrap();
            assert_eq!(all, (0..10).map(|k| (k, k % 4)).collect::<Vec<_>>());
            assert_eq!(c.top_k(3).unwrap(), vec![(3, 3), (7, 3), (2, 2)]);
            let page = c.scan(&[], 4).unwrap();
            assert_eq!(page.counters.len(), 4);
            assert_eq!(page.cursor, 3u64.to_le_bytes());

            let b = Bytes::declare(TableSpec::read_only_bytes("names", 0, 8)).unwrap();
            let mut entries = Vec::new();
            for (k, v) in [("b", "2"), ("a", "1"), ("c", "3")] {
                push_frame(&mut entries, k.as_bytes());
                push_frame(&mut entries, v.as_bytes());
            }
            b.put_many(&entries).unwrap();
            let all: Vec<(Vec<u8>, Vec<u8>)> = b.entries(2).collect::<Result<_, _>>().unwrap();
            assert_eq!(all, [("a", "1"), ("b", "2"), ("c", "3")].map(|(k, v)| (k.into(), v.into())));
            assert!(matches!(b.top_k_is_refused(), Err(StateError::WrongKind)));
        });
    }

    impl Bytes {
        /// `top-k` on a byte table, which the host refuses.
        fn top_k_is_refused(&self) -> Result<Vec<(u64, u64)>, StateError> {
            imp::top_k(self.0, 1)
        }
    }
}
