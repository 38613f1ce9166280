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

use crate::HashMap;
use crate::scan::{Largest, Smallest};
use crate::shared::{SharedBytes, stale};
use crate::spec::{Kind, TableSpec};
use crate::tables::ENTRY_OVERHEAD;
use sluice_wire::abi::push_frame;
use std::fmt::Debug;
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard};

/// Ownership must not depend on the process (a run's output is the same
/// on every run), so keys are hashed with a fixed seed. A tenant who picks
/// keys that all land on one owner only loads that worker more.
const OWNER_SEED: u64 = 0x51u64 << 56 | 0x0123_4567_89ab;

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

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn read<T>(m: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(std::sync::PoisonError::into_inner)
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

fn add(v: u64, d: i64) -> u64 {
    if d >= 0 { v.saturating_add(d.unsigned_abs()) } else { v.saturating_sub(d.unsigned_abs()) }
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
        let h = key.with_bytes(|b| foldhash::fast::FixedState::with_seed(OWNER_SEED).hash_one(b));
        (h % n as u64) as usize
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
            v.extend(read(&s.replica).map.iter().map(|(k, e)| (k.with_bytes(<[u8]>::to_vec), e.value.clone())));
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

/// What a worker has written to a key another worker owns, until the
/// owner publishes it: writes handed over are tagged with the take of the
/// owner's inbox that applies them; the last may not be handed over yet.
pub(crate) trait Writes: Debug + Default + Send + Sync + 'static {
    /// Whether the last write is not handed over yet.
    fn unsent(&self) -> bool;

    /// What a reader sees of a key whose published value is `base` (as of
    /// take `published`) with these writes on top: `None` when removed or
    /// absent.
    fn seen<'a>(&'a self, base: Option<&'a Value>, published: u64) -> Option<Seen<'a>>;

    /// Hands the unsent write over in take `take`: the change the owner
    /// applies.
    fn hand_over(&mut self, take: u64) -> Change;

    /// Forgets the writes published by take `published`; whether any are
    /// left.
    fn forget(&mut self, published: u64) -> bool;
}

/// A counter's deltas: those handed over by take (take 0: a free slot) and
/// the one not handed over yet. Every hand-over between two takes of the
/// owner adds to one delta, and an owner publishes a take before it takes
/// the next, so at most two takes of a key are unpublished at a time.
#[derive(Debug, Default)]
pub(crate) struct Deltas {
    flight: [(u64, i64); 2],
    unsent: Option<i64>,
}

impl Deltas {
    fn add(&mut self, d: i64) {
        self.unsent = Some(self.unsent.unwrap_or(0).saturating_add(d));
    }

    /// `base` plus the deltas not published by take `published`.
    fn sum(&self, base: u64, published: u64) -> u64 {
        let flight = self.flight.iter().filter(|(take, _)| *take > published).map(|(_, d)| *d);
        flight.chain(self.unsent).fold(base, add)
    }
}

impl Writes for Deltas {
    fn unsent(&self) -> bool {
        self.unsent.is_some()
    }

    fn seen<'a>(&'a self, base: Option<&'a Value>, published: u64) -> Option<Seen<'a>> {
        if self.unsent.is_none() && self.flight.iter().all(|(take, _)| *take <= published) {
            return base.map(Seen::of);
        }
        Some(Seen::Counter(self.sum(base.map_or(0, Value::counter), published)))
    }

    fn hand_over(&mut self, take: u64) -> Change {
        let d = self.unsent.take().unwrap_or(0);
        // The slot of this take, else a free one, else the older one (two
        // takes in flight is the most there can be).
        let slot = match self.flight.iter().position(|(t, _)| *t == take) {
            Some(i) => i,
            None => self
                .flight
                .iter()
                .position(|(t, _)| *t == 0)
                .unwrap_or_else(|| usize::from(self.flight.first().map(|f| f.0) > self.flight.get(1).map(|f| f.0))),
        };
        if let Some(f) = self.flight.get_mut(slot) {
            *f = if f.0 == take { (take, f.1.saturating_add(d)) } else { (take, d) };
        }
        Change::Add(d)
    }

    fn forget(&mut self, published: u64) -> bool {
        for f in &mut self.flight {
            if f.0 <= published {
                *f = (0, 0);
            }
        }
        self.unsent.is_some() || self.flight.iter().any(|(take, _)| *take != 0)
    }
}

/// A byte key's last value written (`None`: removed) and its take
/// ([`UNSENT`] until it is handed over).
#[derive(Debug, Default)]
pub(crate) struct Put {
    value: Option<Box<[u8]>>,
    take: u64,
}

impl Writes for Put {
    fn unsent(&self) -> bool {
        self.take == UNSENT
    }

    fn seen<'a>(&'a self, base: Option<&'a Value>, published: u64) -> Option<Seen<'a>> {
        if self.take > published { self.value.as_deref().map(Seen::Bytes) } else { base.map(Seen::of) }
    }

    fn hand_over(&mut self, take: u64) -> Change {
        self.take = take;
        Change::Put(self.value.as_deref().map(<[u8]>::to_vec).unwrap_or_default())
    }

    fn forget(&mut self, published: u64) -> bool {
        self.take > published
    }
}

/// A key's entry in a worker's overlay.
#[derive(Debug, Default)]
struct Pending<W> {
    writes: W,
    /// What the unsent write reserved on the shared account and capacity.
    reserved_bytes: u32,
    reserved_entry: bool,
    /// Written since the last prune: kept (clean) while the key is in use,
    /// so its next write knows the owner has it without a replica lookup.
    touched: bool,
}

/// One worker's side of a single-writer table.
#[derive(Debug)]
pub(crate) struct Side<K: SwKey> {
    shared: Arc<SingleShared<K>>,
    worker: usize,
    /// The shards this worker holds, with their entries.
    owned: Vec<(usize, Owned<K>)>,
    /// Per owner, the keys of this round's writes to its keys (each once),
    /// whose writes wait in the overlay for the next hand-over.
    round: Vec<Vec<K>>,

    /// This worker's writes to other workers' keys, until published, and
    /// the keys it wrote in the last sync interval.
    overlay: HashMap<K, Pending<K::Writes>>,
    /// Per owner, the published take seen at the last prune.
    seen_published: Vec<u64>,
    /// The inbox being applied (kept for its capacity).
    applying: Vec<(usize, Op<K>)>,
    last_sync_ns: u64,
    /// Packet time of the last hand-over.
    last_push_ns: u64,
}

type Guard<'a, K> = RwLockReadGuard<'a, Replica<K>>;

/// The read guard on `shard`'s replica, taken on first use.
fn guard<'g, 'v, K>(
    shared: &'g SingleShared<K>,
    guards: &'v mut Vec<Option<Guard<'g, K>>>,
    shard: usize,
) -> Option<&'v Guard<'g, K>> {
    if guards.is_empty() {
        guards.extend((0..shared.shards.len()).map(|_| None));
    }
    let s = shared.shards.get(shard)?;
    let slot = guards.get_mut(shard)?;
    Some(slot.get_or_insert_with(|| read(&s.replica)))
}

impl<K: SwKey> Side<K> {
    fn new(shared: Arc<SingleShared<K>>, worker: usize) -> Self {
        let n = shared.shards.len();
        Side {
            shared,
            worker,
            owned: Vec::new(),
            round: (0..n).map(|_| Vec::new()).collect(),
            overlay: HashMap::default(),
            seen_published: vec![0; n],
            applying: Vec::new(),
            last_sync_ns: 0,
            last_push_ns: 0,
        }
    }

    /// Takes the shard of this worker's index, if no one holds it, and any
    /// shard whose holder left.
    fn claim(&mut self) {
        let shared = self.shared.clone();
        let mine = self.worker;
        let adopt = shared.orphans.load(Ordering::Relaxed) > 0;
        for (i, shard) in shared.shards.iter().enumerate() {
            // A worker first claims its own shard; it adopts the shards of
            // workers that left only when its own index has none.
            let wanted = i == mine || (adopt && mine >= shared.shards.len());
            if !wanted || self.owned.iter().any(|(s, _)| *s == i) {
                continue;
            }
            if shard.holder.compare_exchange(NO_HOLDER, mine, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                let owned = lock(&shard.parked).take().unwrap_or_default();
                shared.orphans.fetch_sub(1, Ordering::Relaxed);
                self.owned.push((i, owned));
            }
        }
    }

    /// The index in `owned` of the shard holding `key`, if this worker
    /// holds it; else the owner shard.
    fn route(&self, key: &K) -> Result<usize, usize> {
        let shard = self.shared.owner(key);
        self.owned.iter().position(|(s, _)| *s == shard).ok_or(shard)
    }

    /// Calls `f` with the live entry of `key` and the take it includes:
    /// this worker's own entry if it owns the key (take 0), else the
    /// owner's published one (read through `guards`: one lock per shard per
    /// call, never per key).
    fn with_entry<'g, R>(
        &self,
        shared: &'g SingleShared<K>,
        guards: &mut Vec<Option<Guard<'g, K>>>,
        key: &K,
        route: Result<usize, usize>,
        now: u64,
        f: impl FnOnce(Option<&Entry>, u64) -> R,
    ) -> R {
        let timeout = shared.idle_timeout_ns.load(Ordering::Relaxed);
        let live = |e: &&Entry| !stale(e.last_ns, now, timeout);
        match route {
            Ok(o) => f(self.owned.get(o).and_then(|(_, own)| own.map.get(key)).filter(live), 0),
            Err(shard) => match guard(shared, guards, shard) {
                Some(g) => f(g.map.get(key).filter(live), g.take),
                None => f(None, 0),
            },
        }
    }

    /// Read guards on the replicas of the shards this worker does not hold.
    fn replicas(&self) -> Vec<Option<Guard<'_, K>>> {
        self.shared
            .shards
            .iter()
            .enumerate()
            .map(|(i, s)| (!self.owned.iter().any(|(o, _)| *o == i)).then(|| read(&s.replica)))
            .collect()
    }

    /// Calls `f` once per live key this worker reads, with the value
    /// `counter-get` or `get-many` gives it: its own shards' entries, the
    /// other shards' published ones with its own unpublished writes on top
    /// (a key it removed is skipped), and the keys only its writes hold.
    fn visit<'s>(&'s self, replicas: &'s [Option<Guard<'s, K>>], now: u64, mut f: impl FnMut(&'s K, Seen<'s>)) {
        let timeout = self.shared.idle_timeout_ns.load(Ordering::Relaxed);
        let live = |e: &Entry| !stale(e.last_ns, now, timeout);
        for (_, own) in &self.owned {
            for (k, e) in own.map.iter().filter(|(_, e)| live(e)) {
                f(k, Seen::of(&e.value));
            }
        }
        for replica in replicas.iter().flatten() {
            for (k, e) in replica.map.iter() {
                let base = live(e).then_some(&e.value);
                match self.overlay.get(k).map(|p| p.writes.seen(base, replica.take)) {
                    Some(Some(v)) => f(k, v),
                    Some(None) => {}
                    None => {
                        if let Some(v) = base {
                            f(k, Seen::of(v));
                        }
                    }
                }
            }
        }
        for (k, p) in &self.overlay {
            let shard = self.shared.owner(k);
            if self.owned.iter().any(|(o, _)| *o == shard) {
                continue;
            }
            let replica = replicas.get(shard).and_then(|g| g.as_ref());
            if replica.is_some_and(|g| g.map.contains_key(k)) {
                continue;
            }
            if let Some(v) = p.writes.seen(None, replica.map_or(0, |g| g.take)) {
                f(k, v);
            }
        }
    }

    /// Whether a hand-over is due at packet time `now` on a live host:
    /// every batch for a sync interval of 0, else every quarter interval,
    /// so a forwarded write reaches its owner well before the owner's next
    /// sync and a key's overlay holds a few hand-overs at most.
    fn push_due(&self, now: u64) -> bool {
        let interval = self.shared.sync_interval_ns.load(Ordering::Relaxed);
        interval == 0 || now.saturating_sub(self.last_push_ns) >= interval / 4
    }

    /// Hands this round's writes to their owners: one lock per owner
    /// written to, one operation per key however often it was written
    /// (counter deltas summed, the last value of a byte key).
    fn push(&mut self, now: u64) {
        self.last_push_ns = now;
        for (shard, keys) in self.round.iter_mut().enumerate() {
            if keys.is_empty() {
                continue;
            }
            let Some(s) = self.shared.shards.get(shard) else {
                keys.clear();
                continue;
            };
            let mut inbox = lock(&s.inbox);
            let take = inbox.generation + 1;
            for key in keys.drain(..) {
                let Some(p) = self.overlay.get_mut(&key).filter(|p| p.writes.unsent()) else { continue };
                let change = p.writes.hand_over(take);
                let op = Op {
                    key,
                    change,
                    reserved_bytes: std::mem::take(&mut p.reserved_bytes) as usize,
                    reserved_entry: std::mem::take(&mut p.reserved_entry),
                };
                inbox.ops.push((self.worker, op));
            }
        }
    }

    /// A sync of the shards this worker holds: applies the writes
    /// forwarded to them, removes idle entries (appending them to
    /// `expired` as framed key/value pairs when asked), and publishes what
    /// changed. Returns the entries removed for idleness.
    fn sync(&mut self, now: u64, notify: bool, expired: &mut Vec<u8>) -> u64 {
        if self.shared.orphans.load(Ordering::Relaxed) > 0 {
            self.claim();
        }
        let shared = self.shared.clone();
        let timeout = shared.idle_timeout_ns.load(Ordering::Relaxed);
        let mut removed = 0u64;
        let mut notes: Vec<(Vec<u8>, Value)> = Vec::new();
        for (shard, own) in &mut self.owned {
            let Some(s) = shared.shards.get(*shard) else { continue };
            let take = {
                let mut inbox = lock(&s.inbox);
                std::mem::swap(&mut inbox.ops, &mut self.applying);
                inbox.generation += 1;
                inbox.generation
            };
            // Writers in index order, each in the order it sent (the sort
            // is stable).
            self.applying.sort_by_key(|(sender, _)| *sender);
            for (_, op) in self.applying.drain(..) {
                apply(&shared, own, op, now, timeout);
            }
            if timeout > 0 {
                let dirty = &mut own.dirty;
                own.map.retain(|k, e| {
                    if !stale(e.last_ns, now, timeout) {
                        return true;
                    }
                    removed += 1;
                    shared.unreserve(cost(k, e.value.len()), true);
                    dirty.push(k.clone());
                    if notify {
                        notes.push((k.with_bytes(<[u8]>::to_vec), e.value.clone()));
                    }
                    false
                });
            }
            {
                let mut replica = s.replica.write().unwrap_or_else(std::sync::PoisonError::into_inner);
                for k in own.dirty.drain(..) {
                    match own.map.get_mut(&k) {
                        Some(e) => {
                            e.dirty = false;
                            replica.map.insert(k, e.clone());
                        }
                        None => {
                            replica.map.remove(&k);
                        }
                    }
                }
                replica.take = take;
            }
            s.published.store(take, Ordering::Release);
        }
        if !notes.is_empty() {
            notes.sort_by(|a, b| a.0.cmp(&b.0));
            for (k, v) in notes {
                push_frame(expired, &k);
                push_frame(expired, &v.into_bytes());
            }
        }
        self.last_sync_ns = now;
        removed
    }

    /// Forgets the overlay entries the owners have published.
    fn prune(&mut self) {
        if self.overlay.is_empty() {
            return;
        }
        let mut changed = false;
        for (s, seen) in self.shared.shards.iter().zip(self.seen_published.iter_mut()) {
            let published = s.published.load(Ordering::Acquire);
            changed |= *seen != published;
            *seen = published;
        }
        if !changed {
            return;
        }
        let shared = self.shared.clone();
        let seen = &self.seen_published;
        self.overlay.retain(|k, p| {
            let published = seen.get(shared.owner(k)).copied().unwrap_or(0);
            let left = p.writes.forget(published);
            left || std::mem::take(&mut p.touched)
        });
    }

    /// Grows the maps a batch may add to when they are nearly full.
    fn make_room(&mut self) {
        for (_, own) in &mut self.owned {
            make_room(&mut own.map);
        }
        make_room(&mut self.overlay);
    }

    /// This worker leaves: its forwarded writes go to their owners and its
    /// shards wait for another worker.
    fn leave(&mut self) {
        let now = self.last_push_ns.max(self.last_sync_ns);
        self.push(now);
        for (shard, own) in self.owned.drain(..) {
            if let Some(s) = self.shared.shards.get(shard) {
                *lock(&s.parked) = Some(own);
                s.holder.store(NO_HOLDER, Ordering::Release);
                self.shared.orphans.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

impl Side<u64> {
    /// `counter-get`: appends one value per key (0: absent or idle).
    pub(crate) fn counter_get(&self, keys: &[u64], now: u64, out: &mut Vec<u64>) {
        let shared = self.shared.clone();
        let mut guards = Vec::new();
        for key in keys {
            let route = self.route(key);
            let (base, published) = self.with_entry(&shared, &mut guards, key, route, now, |e, take| {
                (e.map_or(0, |e| e.value.counter()), take)
            });
            out.push(match (route, self.overlay.get(key)) {
                (Err(_), Some(p)) => p.writes.sum(base, published),
                _ => base,
            });
        }
    }

    /// `counter-add`: applies to owned keys, forwards the rest. Stops at
    /// the first refused item (earlier items stay written).
    pub(crate) fn counter_add(&mut self, keys: &[u64], deltas: &[i64], now: u64) -> Result<(), Refusal> {
        let timeout = self.shared.idle_timeout_ns.load(Ordering::Relaxed);
        let entry_cost = cost(&0u64, 8);
        let shared = self.shared.clone();
        let mut guards = Vec::new();
        for (i, (key, d)) in keys.iter().zip(deltas).enumerate() {
            match self.route(key) {
                Ok(o) => {
                    let Some((_, own)) = self.owned.get_mut(o) else { continue };
                    match own.map.get_mut(key) {
                        Some(e) => {
                            let base = if stale(e.last_ns, now, timeout) { 0 } else { e.value.counter() };
                            e.value = Value::Counter(add(base, *d));
                            e.last_ns = now;
                            if !e.dirty {
                                e.dirty = true;
                                own.dirty.push(*key);
                            }
                        }
                        None => {
                            shared.reserve(entry_cost, true, i)?;
                            own.map
                                .insert(*key, Entry { value: Value::Counter(add(0, *d)), last_ns: now, dirty: true });
                            own.dirty.push(*key);
                        }
                    }
                }
                Err(shard) => {
                    // Known: this worker reserved the key with an earlier
                    // add or has seen it published, or the owner has
                    // published it.
                    let known = self.overlay.contains_key(key)
                        || self.with_entry(&shared, &mut guards, key, Err(shard), now, |e, _| e.is_some());
                    if !known {
                        shared.reserve(entry_cost, true, i)?;
                    }
                    let p = self.overlay.entry(*key).or_default();
                    if !p.writes.unsent()
                        && let Some(r) = self.round.get_mut(shard)
                    {
                        r.push(*key);
                    }
                    if !known {
                        p.reserved_bytes = p.reserved_bytes.saturating_add(entry_cost as u32);
                        p.reserved_entry = true;
                    }
                    p.touched = true;
                    p.writes.add(*d);
                }
            }
        }
        Ok(())
    }

    /// `top-k` of a counter table: offers every live counter to `top`.
    pub(crate) fn top(&self, top: &mut Largest, now: u64) {
        let replicas = self.replicas();
        self.visit(&replicas, now, |k, v| {
            if let Seen::Counter(c) = v {
                top.offer(*k, c);
            }
        });
    }

    /// `scan` of a counter table: the `limit` smallest keys after `after`.
    pub(crate) fn scan_counters(&self, after: Option<u64>, limit: usize, now: u64) -> (Vec<(u64, u64)>, bool) {
        let replicas = self.replicas();
        let mut page = Smallest::new(after, limit);
        self.visit(&replicas, now, |k, v| {
            if let Seen::Counter(c) = v {
                page.offer(*k, c);
            }
        });
        page.finish()
    }
}

impl Side<ByteKey> {
    /// `get-many`: appends one framed value per key (empty: absent).
    pub(crate) fn get_many(&self, keys: &[&[u8]], now: u64, out: &mut Vec<u8>) {
        let shared = self.shared.clone();
        let mut guards = Vec::new();
        for key in keys {
            let key = ByteKey::from_slice(key);
            let route = self.route(&key);
            let write = route.is_err().then(|| self.overlay.get(&key)).flatten().map(|p| &p.writes);
            self.with_entry(&shared, &mut guards, &key, route, now, |e, published| {
                let seen = match write {
                    Some(w) => w.seen(e.map(|e| &e.value), published),
                    None => e.map(|e| Seen::of(&e.value)),
                };
                match seen {
                    Some(Seen::Bytes(v)) => push_frame(out, v),
                    _ => push_frame(out, &[]),
                }
            });
        }
    }

    /// `put-many` of checked `(key, value)` items: applies to owned keys,
    /// forwards the rest. Stops at the first refused item.
    pub(crate) fn put_many(&mut self, items: &[(&[u8], &[u8])], now: u64) -> Result<(), Refusal> {
        let shared = self.shared.clone();
        let mut guards = Vec::new();
        let mut result = Ok(());
        for (i, (key, value)) in items.iter().enumerate() {
            let key = ByteKey::from_slice(key);
            match self.route(&key) {
                Ok(o) => {
                    let Some((_, own)) = self.owned.get_mut(o) else { continue };
                    let old = own.map.get(&key).map(|e| e.value.len());
                    if value.is_empty() {
                        if let Some(len) = own.remove(&key) {
                            shared.unreserve(cost(&key, len), true);
                        }
                    } else {
                        let new_cost = cost(&key, value.len());
                        let reserved = match old {
                            Some(len) => {
                                // Room for the new value first, then the old
                                // one goes back.
                                shared.reserve(new_cost, false, i).map(|()| shared.unreserve(cost(&key, len), false))
                            }
                            None => shared.reserve(new_cost, true, i),
                        };
                        if let Err(r) = reserved {
                            result = Err(r);
                            break;
                        }
                        own.set(&key, Value::Bytes((*value).into()), now);
                    }
                }
                Err(shard) => {
                    // Known: this worker's last write kept a value, or (none
                    // pending) the owner has published the key.
                    let known = match self.overlay.get(&key).map(|p| &p.writes) {
                        Some(w) if w.take != 0 => w.value.is_some(),
                        _ => self.with_entry(&shared, &mut guards, &key, Err(shard), now, |e, _| e.is_some()),
                    };
                    let (bytes, entry) = if value.is_empty() { (0, false) } else { (cost(&key, value.len()), !known) };
                    if let Err(r) = shared.reserve(bytes, entry, i) {
                        result = Err(r);
                        break;
                    }
                    let p = self.overlay.entry(key.clone()).or_default();
                    if p.writes.unsent() {
                        // The round's earlier value is never handed over: what
                        // it reserved goes back (an entry is kept once).
                        shared.unreserve(std::mem::take(&mut p.reserved_bytes) as usize, entry && p.reserved_entry);
                    } else if let Some(r) = self.round.get_mut(shard) {
                        r.push(key);
                    }
                    p.reserved_bytes = u32::try_from(bytes).unwrap_or(u32::MAX);
                    p.reserved_entry |= entry;
                    p.touched = true;
                    p.writes = Put { value: (!value.is_empty()).then(|| Box::<[u8]>::from(*value)), take: UNSENT };
                }
            }
        }
        result
    }

    /// `scan` of a byte table: the `limit` smallest keys after `after`.
    pub(crate) fn scan_bytes(&self, after: Option<&[u8]>, limit: usize, now: u64) -> ScanItems {
        let replicas = self.replicas();
        let mut page = Smallest::new(after, limit);
        self.visit(&replicas, now, |k, v| {
            if let Seen::Bytes(b) = v {
                page.offer(k.as_slice(), b);
            }
        });
        let (items, more) = page.finish();
        (items.into_iter().map(|(k, v)| (k.to_vec(), v.to_vec())).collect(), more)
    }
}

/// One worker's side of a single-writer table.
#[derive(Debug)]
pub(crate) enum SingleStore {
    Counters(Side<u64>),
    Bytes(Side<ByteKey>),
}

/// Calls `$f` on the side, whichever its keys.
macro_rules! side {
    ($s:expr, $v:ident => $f:expr) => {
        match $s {
            SingleStore::Counters($v) => $f,
            SingleStore::Bytes($v) => $f,
        }
    };
}

impl SingleStore {
    pub(crate) fn new(table: SingleTable, worker: usize) -> Self {
        match table {
            SingleTable::Counters(s) => SingleStore::Counters(Side::new(s, worker)),
            SingleTable::Bytes(s) => SingleStore::Bytes(Side::new(s, worker)),
        }
    }

    /// Entries of the whole table (writes not yet applied included).
    pub(crate) fn len(&self) -> usize {
        side!(self, s => s.shared.entries.load(Ordering::Relaxed))
    }

    /// Packet time of this worker's last sync.
    pub(crate) fn last_sync_ns(&self) -> u64 {
        side!(self, s => s.last_sync_ns)
    }

    /// Takes this worker's shard, and shards whose holder left.
    pub(crate) fn claim(&mut self) {
        side!(self, s => s.claim())
    }

    /// After a batch: makes room in the maps the next batch may add to,
    /// and on a live host (not `barrier`) hands the round's forwarded
    /// writes to their owners when a hand-over is due.
    pub(crate) fn end_batch(&mut self, now: u64, barrier: bool) {
        side!(self, s => {
            s.make_room();
            if !barrier && s.push_due(now) {
                s.push(now)
            }
        })
    }

    /// Hands every forwarded write to its owner now (a barrier runner's
    /// sync point, the end of a run).
    pub(crate) fn push(&mut self, now: u64) {
        side!(self, s => s.push(now))
    }

    /// Syncs the shards this worker holds (see [`Side::sync`]).
    pub(crate) fn sync(&mut self, now: u64, notify: bool, expired: &mut Vec<u8>) -> u64 {
        side!(self, s => s.sync(now, notify, expired))
    }

    /// Forgets the overlay entries the owners have published.
    pub(crate) fn prune(&mut self) {
        side!(self, s => s.prune())
    }

    /// This worker leaves.
    pub(crate) fn leave(&mut self) {
        side!(self, s => s.leave())
    }
}

/// A scanned byte page: `(key, value)` items and whether more follow.
pub(crate) type ScanItems = (Vec<(Vec<u8>, Vec<u8>)>, bool);

/// A value as a scan sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Seen<'a> {
    Counter(u64),
    Bytes(&'a [u8]),
}

impl<'a> Seen<'a> {
    fn of(v: &'a Value) -> Self {
        match v {
            Value::Counter(c) => Seen::Counter(*c),
            Value::Bytes(b) => Seen::Bytes(b),
        }
    }
}

/// Applies one forwarded write at its owner.
fn apply<K: SwKey>(shared: &SingleShared<K>, own: &mut Owned<K>, op: Op<K>, now: u64, timeout: u64) {
    let Op { key, change, reserved_bytes, reserved_entry } = op;
    shared.unreserve(reserved_bytes, reserved_entry);
    if let Change::Add(d) = change
        && let Some(e) = own.map.get_mut(&key)
        && !stale(e.last_ns, now, timeout)
    {
        // The common case, one lookup: an add to a live counter.
        e.value = Value::Counter(add(e.value.counter(), d));
        e.last_ns = now;
        if !e.dirty {
            e.dirty = true;
            own.dirty.push(key);
        }
        return;
    }
    // (length, counter value) of the live entry.
    let live =
        own.map.get(&key).filter(|e| !stale(e.last_ns, now, timeout)).map(|e| (e.value.len(), e.value.counter()));
    if live.is_none()
        && let Some(len) = own.remove(&key)
    {
        // An idle entry the sweep has not reached: gone before the write.
        shared.unreserve(cost(&key, len), true);
    }
    match change {
        Change::Add(d) => {
            if live.is_none() {
                shared.entries.fetch_add(1, Ordering::Relaxed);
                shared.bytes.charge(cost(&key, 8));
            }
            let v = live.map_or(0, |(_, v)| v);
            own.set(&key, Value::Counter(add(v, d)), now);
        }
        Change::Put(v) if v.is_empty() => {
            if let Some(len) = own.remove(&key) {
                shared.unreserve(cost(&key, len), true);
            }
        }
        Change::Put(v) => {
            match live {
                Some((len, _)) => shared.unreserve(cost(&key, len), false),
                None => {
                    shared.entries.fetch_add(1, Ordering::Relaxed);
                }
            }
            shared.bytes.charge(cost(&key, v.len()));
            own.set(&key, Value::Bytes(v.into_boxed_slice()), now);
        }
    }
}
