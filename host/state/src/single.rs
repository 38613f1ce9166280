//! Single-writer tables: shared read-write state where every key has one
//! owner worker (S6's single-writer objects, Serpens' global state).
//!
//! The table is split into one *shard* per worker the host runs for the
//! NF; a key belongs to shard `hash(key) % shards` and the worker holding
//! that shard is its only writer. The holder keeps the shard's entries in
//! a map of its own ([`Owned`]), which it reads and writes with no lock.
//! Another worker's write to the key is queued in that worker's outbox,
//! handed to the owner's inbox once per batch (one lock per owner written
//! to) and applied by the owner at its next *sync*, in order: one
//! writer's messages by sequence, writers by index. At a sync the owner
//! also publishes the entries it changed to the shard's replica, which the
//! other workers read (one read lock per shard per call, never per key).
//! Until its writes are published, a worker reads them from its own
//! overlay, so it always reads its own writes.
//!
//! Counter tables keep their keys as `u64` and byte tables as inline byte
//! strings ([`SwKey`]): a counter entry is a fifth of the size a byte key
//! would make it, which is what decides how many of a busy table's
//! entries stay in cache.
//!
//! Capacity and the state budget count the whole table and are checked
//! where the write is made: a worker writing a key it has not seen
//! reserves an entry and the bytes of the write on the NF's shared account
//! before forwarding it, and a write refused there is never forwarded. The
//! owner gives each reservation back when it applies the write and charges
//! what the entry really costs, which is never more than was reserved, so
//! the account never passes the budget for a forwarded write.
//!
//! `sluice-host run` syncs every worker at the same packet of the capture
//! (the domain is in *barrier* mode, [`crate::Domain::set_barrier`]);
//! live hosts sync each owner at its first batch after the sync interval.
//!
//! This module holds the table as the workers share it (its shards,
//! inboxes and replicas); a worker's side of it is in [`side`], and the
//! writes a worker keeps until their owner publishes them in [`writes`].

mod side;
mod writes;

use crate::HashMap;
use crate::account::SharedBytes;
use crate::entry::ENTRY_OVERHEAD;
use crate::spec::{Kind, TableSpec};
use parking_lot::{Mutex, RwLock};
use std::fmt::Debug;
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use writes::{Deltas, Put, Writes};

pub(crate) use side::SingleStore;

/// Ownership must not depend on the process (a run's output is the same
/// on every run), so keys are hashed with a fixed seed. A tenant who picks
/// keys that all land on one owner only loads that worker more.
const OWNER_SEED: u64 = 0x51u64 << 56 | 0x0123_4567_89ab;

/// The shard, of `shards`, that owns the key whose bytes (as the contract
/// carries them: a counter key as 8 bytes little-endian) are `key`: the
/// high bits of a fixed-seed hash of the bytes pick it (a multiply, not a
/// division: this runs for every key of every write). The worker of the
/// same index holds the shard while it runs.
pub fn shard_of(key: &[u8], shards: usize) -> usize {
    let h = foldhash::fast::FixedState::with_seed(OWNER_SEED).hash_one(key);
    ((u128::from(h) * shards as u128) >> 64) as usize
}

/// A byte key: up to 24 bytes (addresses, tuples) inline, longer ones on
/// the heap.
pub(crate) type ByteKey = smallvec::SmallVec<[u8; 24]>;

/// The key of a single-writer table as it is kept: `u64` for counter
/// tables, [`ByteKey`] for byte tables.
pub(crate) trait SwKey: Hash + Eq + Clone + Debug + Send + Sync + 'static {
    /// A worker's writes to a key of this kind another worker owns.
    type Writes: Writes;

    /// Calls `f` with the key as the contract's bytes (a counter key as 8
    /// bytes little-endian).
    fn with_bytes<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R;

    /// Length of those bytes.
    fn len(&self) -> usize;
}

impl SwKey for u64 {
    type Writes = Deltas;
    fn with_bytes<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        f(&self.to_le_bytes())
    }

    fn len(&self) -> usize {
        8
    }
}

impl SwKey for ByteKey {
    type Writes = Put;
    fn with_bytes<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        f(self)
    }

    fn len(&self) -> usize {
        self.as_slice().len()
    }
}

/// No worker holds the shard.
const NO_HOLDER: usize = usize::MAX;

/// Entries a worker's maps keep room for between batches: a map grows
/// (allocates and rehashes every entry, a few milliseconds for a large
/// one) after a batch, outside the NF's call and its deadline, rather
/// than inside a call that adds the entry that fills it.
const HEADROOM: usize = 1024;

/// Grows `map` if it has room for fewer than [`HEADROOM`] more entries.
fn make_room<K: Hash + Eq, V>(map: &mut HashMap<K, V>) {
    if map.capacity() - map.len() < HEADROOM {
        map.reserve(HEADROOM.max(map.len()));
    }
}

/// A value of a single-writer table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Value {
    /// A counter.
    Counter(u64),
    /// A byte string (never empty: empty means absent).
    Bytes(Box<[u8]>),
}

impl Value {
    fn len(&self) -> usize {
        match self {
            Value::Counter(_) => 8,
            Value::Bytes(v) => v.len(),
        }
    }

    fn counter(&self) -> u64 {
        match self {
            Value::Counter(v) => *v,
            Value::Bytes(_) => 0,
        }
    }

    /// The value as the contract's bytes (a counter as 8 bytes
    /// little-endian).
    pub(crate) fn into_bytes(self) -> Vec<u8> {
        match self {
            Value::Counter(c) => c.to_le_bytes().to_vec(),
            Value::Bytes(b) => b.into_vec(),
        }
    }
}

/// What an entry costs the budget.
fn cost<K: SwKey>(key: &K, value_len: usize) -> usize {
    key.len() + value_len + ENTRY_OVERHEAD
}

#[derive(Debug, Clone)]
struct Entry {
    value: Value,
    /// Packet time of the last applied write.
    last_ns: u64,
    /// Changed since the owner last published (its key is in `dirty`).
    dirty: bool,
}

/// One change to a key.
#[derive(Debug)]
pub(crate) enum Change {
    /// Add to a counter.
    Add(i64),
    /// Set a value (empty: remove).
    Put(Vec<u8>),
}

/// A forwarded write with what its writer reserved for it.
#[derive(Debug)]
struct Op<K> {
    key: K,
    change: Change,
    /// Bytes reserved on the shared account.
    reserved_bytes: usize,
    /// Whether an entry of the capacity was reserved.
    reserved_entry: bool,
}

/// Writes forwarded to one owner and not yet applied, each with its
/// sender, in the order they were handed over. Senders append and the
/// owner swaps the vector for its emptied one, so neither allocates once
/// both have grown to the traffic.
#[derive(Debug)]
struct Inbox<K> {
    ops: Vec<(usize, Op<K>)>,
    /// How many times the owner has taken the inbox: what is in it now is
    /// applied by take `generation + 1`.
    generation: u64,
}

/// The sequence of a write in a worker's overlay that is not handed over
/// yet.
const UNSENT: u64 = u64::MAX;

/// A shard's entries as its holder keeps them, with the keys changed since
/// the last publication.
#[derive(Debug)]
pub(crate) struct Owned<K> {
    map: HashMap<K, Entry>,
    /// Keys changed since the last publication: each once while its entry
    /// is in the map (removed keys may repeat).
    dirty: Vec<K>,
}

impl<K> Default for Owned<K> {
    fn default() -> Self {
        Owned { map: HashMap::default(), dirty: Vec::new() }
    }
}

impl<K: SwKey> Owned<K> {
    /// Sets `key` to `value`, marking it for publication.
    fn set(&mut self, key: &K, value: Value, now: u64) {
        match self.map.get_mut(key) {
            Some(e) => {
                e.value = value;
                e.last_ns = now;
                if !e.dirty {
                    e.dirty = true;
                    self.dirty.push(key.clone());
                }
            }
            None => {
                self.map.insert(key.clone(), Entry { value, last_ns: now, dirty: true });
                self.dirty.push(key.clone());
            }
        }
    }

    /// Removes `key`, marking it for publication; its value's length.
    fn remove(&mut self, key: &K) -> Option<usize> {
        let e = self.map.remove(key)?;
        self.dirty.push(key.clone());
        Some(e.value.len())
    }
}

/// A shard's entries as published, with the take of the inbox they
/// include: a reader counts only its own writes of later takes on top, so
/// it never counts a write twice, whenever the owner publishes.
#[derive(Debug)]
struct Replica<K> {
    map: HashMap<K, Entry>,
    take: u64,
}

#[derive(Debug)]
struct Shard<K> {
    /// What the other workers read: the owner's entries at its last sync.
    replica: RwLock<Replica<K>>,
    inbox: Mutex<Inbox<K>>,
    /// The last take of the inbox whose writes the owner has applied and
    /// published.
    published: AtomicU64,
    /// The worker holding the shard, or [`NO_HOLDER`].
    holder: AtomicUsize,
    /// The entries while no worker holds the shard.
    parked: Mutex<Option<Owned<K>>>,
}

/// A single-writer table of one NF on one host, shared by its workers.
#[derive(Debug)]
pub(crate) struct SingleShared<K> {
    shards: Box<[Shard<K>]>,
    /// Entries of the whole table, reservations included.
    entries: AtomicUsize,
    capacity: AtomicUsize,
    idle_timeout_ns: AtomicU64,
    sync_interval_ns: AtomicU64,
    /// Shards no worker holds.
    orphans: AtomicUsize,
    bytes: Arc<SharedBytes>,
}

/// Why a write was refused, at which item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The table is at capacity.
    Full(usize),
    /// The state budget is used up.
    OverBudget(usize),
}

impl<K: SwKey> SingleShared<K> {
    fn new(spec: &TableSpec, shards: usize, sync_interval_ns: u64, bytes: Arc<SharedBytes>) -> Self {
        let shards = (0..shards.max(1))
            .map(|_| Shard {
                replica: RwLock::new(Replica { map: HashMap::default(), take: 0 }),
                inbox: Mutex::new(Inbox { ops: Vec::new(), generation: 0 }),
                published: AtomicU64::new(0),
                holder: AtomicUsize::new(NO_HOLDER),
                parked: Mutex::new(Some(Owned::default())),
            })
            .collect();
        let s = SingleShared {
            shards,
            entries: AtomicUsize::new(0),
            capacity: AtomicUsize::new(spec.capacity()),
            idle_timeout_ns: AtomicU64::new(spec.idle_timeout_ns),
            sync_interval_ns: AtomicU64::new(sync_interval_ns),
            orphans: AtomicUsize::new(0),
            bytes,
        };
        s.orphans.store(s.shards.len(), Ordering::Relaxed);
        s
    }

    /// Capacity, expiry and the sync interval follow the latest declaration.
    fn set_limits(&self, spec: &TableSpec, sync_interval_ns: u64) {
        self.capacity.store(spec.capacity(), Ordering::Relaxed);
        self.idle_timeout_ns.store(spec.idle_timeout_ns, Ordering::Relaxed);
        self.sync_interval_ns.store(sync_interval_ns, Ordering::Relaxed);
    }

    fn owner(&self, key: &K) -> usize {
        let n = self.shards.len();
        if n <= 1 {
            return 0;
        }
        key.with_bytes(|b| shard_of(b, n))
    }

    /// Reserves a new entry of `bytes` bytes.
    fn reserve(&self, bytes: usize, entry: bool, item: usize) -> Result<(), Refusal> {
        if entry {
            let cap = self.capacity.load(Ordering::Relaxed);
            if self.entries.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| (n < cap).then_some(n + 1)).is_err()
            {
                return Err(Refusal::Full(item));
            }
        }
        if bytes > 0 && !self.bytes.try_charge(bytes) {
            if entry {
                self.entries.fetch_sub(1, Ordering::Relaxed);
            }
            return Err(Refusal::OverBudget(item));
        }
        Ok(())
    }

    fn unreserve(&self, bytes: usize, entry: bool) {
        self.bytes.free(bytes);
        if entry {
            let _ = self.entries.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| Some(n.saturating_sub(1)));
        }
    }

    /// The contents of the whole table as published, sorted by key bytes.
    fn snapshot(&self) -> Vec<(Vec<u8>, Value)> {
        let mut v: Vec<(Vec<u8>, Value)> = Vec::new();
        for s in self.shards.iter() {
            v.extend(s.replica.read().map.iter().map(|(k, e)| (k.with_bytes(<[u8]>::to_vec), e.value.clone())));
        }
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }
}

/// A single-writer table of one NF on one host: counter tables keyed by
/// `u64`, byte tables by bytes.
#[derive(Debug, Clone)]
pub(crate) enum SingleTable {
    Counters(Arc<SingleShared<u64>>),
    Bytes(Arc<SingleShared<ByteKey>>),
}

impl SingleTable {
    pub(crate) fn new(spec: &TableSpec, shards: usize, sync_interval_ns: u64, bytes: Arc<SharedBytes>) -> Self {
        match spec.kind {
            Kind::Counter => SingleTable::Counters(Arc::new(SingleShared::new(spec, shards, sync_interval_ns, bytes))),
            Kind::Bytes => SingleTable::Bytes(Arc::new(SingleShared::new(spec, shards, sync_interval_ns, bytes))),
        }
    }

    /// Whether it keeps the keys of a table of `kind`.
    pub(crate) fn holds(&self, kind: Kind) -> bool {
        matches!((self, kind), (SingleTable::Counters(_), Kind::Counter) | (SingleTable::Bytes(_), Kind::Bytes))
    }

    /// Capacity, expiry and the sync interval follow the latest declaration.
    pub(crate) fn set_limits(&self, spec: &TableSpec, sync_interval_ns: u64) {
        match self {
            SingleTable::Counters(s) => s.set_limits(spec, sync_interval_ns),
            SingleTable::Bytes(s) => s.set_limits(spec, sync_interval_ns),
        }
    }

    pub(crate) fn sync_interval_ns(&self) -> u64 {
        match self {
            SingleTable::Counters(s) => s.sync_interval_ns.load(Ordering::Relaxed),
            SingleTable::Bytes(s) => s.sync_interval_ns.load(Ordering::Relaxed),
        }
    }

    /// The contents of the whole table as published, sorted by key (reports
    /// and tests).
    pub(crate) fn snapshot(&self) -> Vec<(Vec<u8>, Value)> {
        match self {
            SingleTable::Counters(s) => s.snapshot(),
            SingleTable::Bytes(s) => s.snapshot(),
        }
    }
}
