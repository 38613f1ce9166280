//! Host-owned state of network functions: the tables an NF declares through
//! `sluice:nf@0.2.0`'s `state` interface (and lists with `@0.4.0`'s `scan`
//! and `top-k`, [`scan`]).
//!
//! The host, not the sandbox, owns this memory, so state survives a guest
//! trap, a re-instantiation and a version swap, can be exported per flow to
//! another host, and is metered. The crate is plain Rust with no Wasm in
//! it: the runtime serves it to Wasm guests through the WIT imports, and
//! the SDK serves it to the same NF compiled natively (the benchmarks'
//! baseline) through [`with_installed`], so both run the same state code.
//!
//! Categories follow Serpens (§III-A): per-flow tables live on the worker
//! that owns the flow; read-only global tables are replicated to every
//! worker; global read-write tables are *eventual* (per-worker
//! replicas merged with sum/max/min, [`Merge`]) or *release* (a pool of
//! integer resources split into per-worker shares that are rebalanced when
//! one runs dry, [`pool`]), or *single-writer* (every key has one owner
//! worker that applies the others' forwarded writes, `single`). Idle expiry runs on packet time, as
//! StatelessNF's timers do, and can hand expired entries back to the NF.

mod account;
pub mod changes;
mod domain;
mod entry;
mod error;
mod eventual;
pub mod pool;
pub mod scan;
mod single;
mod spec;
mod tables;

pub use changes::{FlowChanges, PoolChange, PoolChanges};
pub use domain::Domain;
pub use entry::ENTRY_OVERHEAD;
pub use error::StateError;
pub use pool::PoolStats;
pub use scan::{MAX_SCAN, ScanPage};
pub use single::shard_of;
pub use spec::{
    Access, Consistency, DEFAULT_CAPACITY, Kind, MAX_KEY_SIZE, MAX_POOL, MAX_TABLES, MAX_VALUE_SIZE, Merge, Scope,
    TableSpec,
};
pub use tables::{Checkpoint, DEFAULT_BUDGET_BYTES, FlowTableEntry, StateMeters, Tables};

/// Keys come from packets: seeded per process against hash flooding.
pub(crate) type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
pub(crate) type HashSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;

use std::cell::RefCell;

thread_local! {
    static CURRENT: RefCell<Option<Box<Tables>>> = const { RefCell::new(None) };
}

/// Runs `f` with `tables` as this thread's current tables, for an NF
/// compiled natively into the host: its state calls reach them through
/// [`with_current`]. The tables are moved in and back out (no copy).
pub fn with_installed<R>(tables: &mut Option<Box<Tables>>, f: impl FnOnce() -> R) -> R {
    let previous = CURRENT.with(|c| std::mem::replace(&mut *c.borrow_mut(), tables.take()));
    let r = f();
    *tables = CURRENT.with(|c| std::mem::replace(&mut *c.borrow_mut(), previous));
    r
}

/// Calls `f` on this thread's current tables; `None` if none are installed
/// (a native NF run outside a host).
pub fn with_current<R>(f: impl FnOnce(&mut Tables) -> R) -> Option<R> {
    CURRENT.with(|c| c.borrow_mut().as_mut().map(|t| f(t)))
}
