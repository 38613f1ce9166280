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
use crate::spec::TableSpec;
use crate::tables::ENTRY_OVERHEAD;
use sluice_wire::abi::push_frame;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard};

/// Ownership must not depend on the process (a run's output is the same
/// on every run), so keys are hashed with a fixed seed. A tenant who picks
/// keys that all land on one owner only loads that worker more.
const OWNER_SEED: u64 = 0x51u64 << 56 | 0x0123_4567_89ab;

/// A key: up to 24 bytes (counters, addresses) inline, longer ones on the
/// heap. Hashes and compares as its bytes, so maps look keys up by slice.
type Key = smallvec::SmallVec<[u8; 24]>;

/// No worker holds the shard.
const NO_HOLDER: usize = usize::MAX;

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
    Bytes(Vec<u8>),
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
}

/// What an entry costs the budget.
fn cost(key: &[u8], value_len: usize) -> usize {
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
enum Change {
    /// Add to a counter.
    Add(i64),
    /// Set a value (empty: remove).
    Put(Vec<u8>),
}

/// A forwarded write with what its writer reserved for it.
#[derive(Debug)]
struct Op {
    key: Key,
    change: Change,
    /// Bytes reserved on the shared account.
    reserved_bytes: usize,
    /// Whether an entry of the capacity was reserved.
    reserved_entry: bool,
}

/// The writes one worker forwarded to one owner in one batch.
#[derive(Debug)]
struct Message {
    sender: usize,
    seq: u64,
    ops: Vec<Op>,
}

/// A shard's entries as its holder keeps them, with the keys changed since
/// the last publication.
#[derive(Debug, Default)]
pub(crate) struct Owned {
    map: HashMap<Key, Entry>,
    /// Keys changed since the last publication: each once while its entry
    /// is in the map (removed keys may repeat).
    dirty: Vec<Key>,
}

impl Owned {
    /// Sets `key` to `value`, marking it for publication.
    fn set(&mut self, key: &[u8], value: Value, now: u64) {
        match self.map.get_mut(key) {
            Some(e) => {
                e.value = value;
                e.last_ns = now;
                if !e.dirty {
                    e.dirty = true;
                    self.dirty.push(key.into());
                }
            }
            None => {
                self.map.insert(key.into(), Entry { value, last_ns: now, dirty: true });
                self.dirty.push(key.into());
            }
        }
    }

    /// Removes `key`, marking it for publication; its value's length.
    fn remove(&mut self, key: &[u8]) -> Option<usize> {
        let e = self.map.remove(key)?;
        self.dirty.push(key.into());
        Some(e.value.len())
    }
}

#[derive(Debug)]
struct Shard {
    /// What the other workers read: the owner's entries at its last sync.
    replica: RwLock<HashMap<Key, Entry>>,
    inbox: Mutex<Vec<Message>>,
    /// Per sender, the sequence number of the last message the owner has
    /// applied and published.
    applied: Mutex<Vec<u64>>,
    /// The worker holding the shard, or [`NO_HOLDER`].
    holder: AtomicUsize,
    /// The entries while no worker holds the shard.
    parked: Mutex<Option<Owned>>,
}

/// A single-writer table of one NF on one host, shared by its workers.
#[derive(Debug)]
pub(crate) struct SingleShared {
    shards: Box<[Shard]>,
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

impl SingleShared {
    pub(crate) fn new(spec: &TableSpec, shards: usize, sync_interval_ns: u64, bytes: Arc<SharedBytes>) -> Self {
        let shards = (0..shards.max(1))
            .map(|_| Shard {
                replica: RwLock::new(HashMap::default()),
                inbox: Mutex::new(Vec::new()),
                applied: Mutex::new(Vec::new()),
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
    pub(crate) fn set_limits(&self, spec: &TableSpec, sync_interval_ns: u64) {
        self.capacity.store(spec.capacity(), Ordering::Relaxed);
        self.idle_timeout_ns.store(spec.idle_timeout_ns, Ordering::Relaxed);
        self.sync_interval_ns.store(sync_interval_ns, Ordering::Relaxed);
    }

    pub(crate) fn sync_interval_ns(&self) -> u64 {
        self.sync_interval_ns.load(Ordering::Relaxed)
    }

    /// Entries of the whole table (writes not yet applied included).
    pub(crate) fn len(&self) -> usize {
        self.entries.load(Ordering::Relaxed)
    }

    fn owner(&self, key: &[u8]) -> usize {
        let n = self.shards.len();
        if n <= 1 {
            return 0;
        }
        (foldhash::fast::FixedState::with_seed(OWNER_SEED).hash_one(key) % n as u64) as usize
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

    /// The contents of the whole table as published, sorted by key (reports
    /// and tests).
    pub(crate) fn snapshot(&self) -> Vec<(Vec<u8>, Value)> {
        let mut v: Vec<(Vec<u8>, Value)> = Vec::new();
        for s in self.shards.iter() {
            v.extend(read(&s.replica).iter().map(|(k, e)| (k.to_vec(), e.value.clone())));
        }
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }
}

/// What a worker has written to a key another worker owns, until the
/// owner publishes it.
#[derive(Debug)]
enum Pending {
    /// Counter deltas by the sequence of the message carrying them.
    Deltas(Vec<(u64, i64)>),
    /// The latest value written (`None`: removed) and its message.
    Value(Option<Vec<u8>>, u64),
}

/// One worker's side of a single-writer table.
#[derive(Debug)]
pub(crate) struct SingleStore {
    shared: Arc<SingleShared>,
    worker: usize,
    /// The shards this worker holds, with their entries.
    owned: Vec<(usize, Owned)>,
    /// Writes to other workers' keys, by owner, not yet handed over.
    outbox: Vec<Vec<Op>>,
    /// Per owner, the sequence number of the next message.
    next_seq: Vec<u64>,
    /// This worker's writes to other workers' keys, until published.
    overlay: HashMap<Key, Pending>,
    /// Per owner, the applied sequence seen at the last prune.
    seen_applied: Vec<u64>,
    pub(crate) last_sync_ns: u64,
}

impl SingleStore {
    pub(crate) fn new(shared: Arc<SingleShared>, worker: usize) -> Self {
        let n = shared.shards.len();
        SingleStore {
            shared,
            worker,
            owned: Vec::new(),
            outbox: (0..n).map(|_| Vec::new()).collect(),
            next_seq: vec![1; n],
            overlay: HashMap::default(),
            seen_applied: vec![0; n],
            last_sync_ns: 0,
        }
    }

    pub(crate) fn shared(&self) -> &Arc<SingleShared> {
        &self.shared
    }

    /// Takes the shard of this worker's index, if no one holds it, and any
    /// shard whose holder left.
    pub(crate) fn claim(&mut self) {
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
    fn route(&self, key: &[u8]) -> Result<usize, usize> {
        let shard = self.shared.owner(key);
        self.owned.iter().position(|(s, _)| *s == shard).ok_or(shard)
    }

    /// Routes `keys` and takes a read guard on every other worker's shard
    /// they touch: one lock per shard per call.
    fn routes<'a>(
        &'a self,
        keys: impl Iterator<Item = &'a [u8]>,
    ) -> (Vec<Result<usize, usize>>, Vec<Option<Guard<'a>>>) {
        let routes: Vec<Result<usize, usize>> = keys.map(|k| self.route(k)).collect();
        let mut guards: Vec<Option<Guard<'a>>> = (0..self.shared.shards.len()).map(|_| None).collect();
        for r in &routes {
            if let Err(shard) = r
                && let (Some(slot), Some(s)) = (guards.get_mut(*shard), self.shared.shards.get(*shard))
                && slot.is_none()
            {
                *slot = Some(read(&s.replica));
            }
        }
        (routes, guards)
    }

    /// The live entry of `key`: this worker's own if it owns the key, else
    /// the owner's published one.
    fn entry<'s: 'g, 'g>(
        &'s self,
        key: &[u8],
        route: Result<usize, usize>,
        guards: &'g [Option<Guard<'s>>],
        now: u64,
    ) -> Option<&'g Entry> {
        let timeout = self.shared.idle_timeout_ns.load(Ordering::Relaxed);
        let e = match route {
            Ok(o) => self.owned.get(o).and_then(|(_, own)| own.map.get(key)),
            Err(shard) => guards.get(shard).and_then(|g| g.as_ref()).and_then(|g| g.get(key)),
        };
        e.filter(|e| !stale(e.last_ns, now, timeout))
    }

    /// `counter-get`: appends one value per key (0: absent or idle).
    pub(crate) fn counter_get(&self, keys: &[u64], now: u64, out: &mut Vec<u64>) {
        let bytes: Vec<[u8; 8]> = keys.iter().map(|k| k.to_le_bytes()).collect();
        let (routes, guards) = self.routes(bytes.iter().map(|k| &k[..]));
        for (key, route) in bytes.iter().zip(routes) {
            let base = self.entry(key, route, &guards, now).map_or(0, |e| e.value.counter());
            out.push(match (route, self.overlay.get(&key[..])) {
                (Err(_), Some(Pending::Deltas(ds))) => ds.iter().fold(base, |v, (_, d)| add(v, *d)),
                _ => base,
            });
        }
    }

    /// `get-many`: appends one framed value per key (empty: absent).
    pub(crate) fn get_many(&self, keys: &[&[u8]], now: u64, out: &mut Vec<u8>) {
        let (routes, guards) = self.routes(keys.iter().copied());
        for (key, route) in keys.iter().zip(routes) {
            if route.is_err()
                && let Some(Pending::Value(v, _)) = self.overlay.get(*key)
            {
                push_frame(out, v.as_deref().unwrap_or(&[]));
                continue;
            }
            match self.entry(key, route, &guards, now).map(|e| &e.value) {
                Some(Value::Bytes(v)) => push_frame(out, v),
                _ => push_frame(out, &[]),
            }
        }
    }

    /// Read guards on the replicas of the shards this worker does not hold.
    fn replicas(&self) -> Vec<Option<Guard<'_>>> {
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
    fn visit<'s>(&'s self, replicas: &'s [Option<Guard<'s>>], now: u64, mut f: impl FnMut(&'s [u8], Seen<'s>)) {
        let timeout = self.shared.idle_timeout_ns.load(Ordering::Relaxed);
        let live = |e: &Entry| !stale(e.last_ns, now, timeout);
        for (_, own) in &self.owned {
            for (k, e) in own.map.iter().filter(|(_, e)| live(e)) {
                f(&k[..], Seen::of(&e.value));
            }
        }
        for replica in replicas.iter().flatten() {
            for (k, e) in replica.iter() {
                let k = &k[..];
                match self.overlay.get(k) {
                    Some(Pending::Value(Some(v), _)) => f(k, Seen::Bytes(v)),
                    Some(Pending::Value(None, _)) => {}
                    Some(Pending::Deltas(ds)) => {
                        let base = if live(e) { e.value.counter() } else { 0 };
                        f(k, Seen::Counter(ds.iter().fold(base, |v, (_, d)| add(v, *d))));
                    }
                    None if live(e) => f(k, Seen::of(&e.value)),
                    None => {}
                }
            }
        }
        for (k, p) in &self.overlay {
            let k = &k[..];
            let shard = self.shared.owner(k);
            let published = replicas.get(shard).and_then(|g| g.as_ref()).is_some_and(|g| g.contains_key(k));
            if published || self.owned.iter().any(|(o, _)| *o == shard) {
                continue;
            }
            match p {
                Pending::Value(Some(v), _) => f(k, Seen::Bytes(v)),
                Pending::Value(None, _) => {}
                Pending::Deltas(ds) => f(k, Seen::Counter(ds.iter().fold(0, |v, (_, d)| add(v, *d)))),
            }
        }
    }

    /// `scan` of a counter table: the `limit` smallest keys after `after`.
    pub(crate) fn scan_counters(&self, after: Option<u64>, limit: usize, now: u64) -> (Vec<(u64, u64)>, bool) {
        let replicas = self.replicas();
        let mut page = Smallest::new(after, limit);
        self.visit(&replicas, now, |k, v| {
            if let (Ok(k), Seen::Counter(c)) = (<[u8; 8]>::try_from(k), v) {
                page.offer(u64::from_le_bytes(k), c);
            }
        });
        page.finish()
    }

    /// `scan` of a byte table: the `limit` smallest keys after `after`.
    pub(crate) fn scan_bytes(&self, after: Option<&[u8]>, limit: usize, now: u64) -> ScanItems {
        let replicas = self.replicas();
        let mut page = Smallest::new(after, limit);
        self.visit(&replicas, now, |k, v| {
            if let Seen::Bytes(b) = v {
                page.offer(k, b);
            }
        });
        let (items, more) = page.finish();
        (items.into_iter().map(|(k, v)| (k.to_vec(), v.to_vec())).collect(), more)
    }

    /// `top-k` of a counter table: offers every live counter to `top`.
    pub(crate) fn top(&self, top: &mut Largest, now: u64) {
        let replicas = self.replicas();
        self.visit(&replicas, now, |k, v| {
            if let (Ok(k), Seen::Counter(c)) = (<[u8; 8]>::try_from(k), v) {
                top.offer(u64::from_le_bytes(k), c);
            }
        });
    }

    /// `counter-add`: applies to owned keys, forwards the rest. Stops at
    /// the first refused item (earlier items stay written).
    pub(crate) fn counter_add(&mut self, keys: &[u64], deltas: &[i64], now: u64) -> Result<(), Refusal> {
        let bytes: Vec<[u8; 8]> = keys.iter().map(|k| k.to_le_bytes()).collect();
        let timeout = self.shared.idle_timeout_ns.load(Ordering::Relaxed);
        let known: Vec<bool> = {
            let (routes, guards) = self.routes(bytes.iter().map(|k| &k[..]));
            bytes
                .iter()
                .zip(&routes)
                .map(|(k, r)| {
                    r.is_err()
                        && (self.entry(k, *r, &guards, now).is_some()
                            || matches!(self.overlay.get(&k[..]), Some(Pending::Deltas(_))))
                })
                .collect()
        };
        let entry_cost = cost(&[0; 8], 8);
        for (i, ((key, d), known)) in bytes.iter().zip(deltas).zip(known).enumerate() {
            match self.route(key) {
                Ok(o) => {
                    let Some((_, own)) = self.owned.get_mut(o) else { continue };
                    match own.map.get_mut(&key[..]) {
                        Some(e) => {
                            let base = if stale(e.last_ns, now, timeout) { 0 } else { e.value.counter() };
                            e.value = Value::Counter(add(base, *d));
                            e.last_ns = now;
                            if !e.dirty {
                                e.dirty = true;
                                own.dirty.push(key[..].into());
                            }
                        }
                        None => {
                            self.shared.reserve(entry_cost, true, i)?;
                            own.map.insert(
                                key[..].into(),
                                Entry { value: Value::Counter(add(0, *d)), last_ns: now, dirty: true },
                            );
                            own.dirty.push(key[..].into());
                        }
                    }
                }
                Err(shard) => {
                    if !known {
                        self.shared.reserve(entry_cost, true, i)?;
                    }
                    let seq = self.next_seq.get(shard).copied().unwrap_or(0);
                    if let Some(out) = self.outbox.get_mut(shard) {
                        out.push(Op {
                            key: key[..].into(),
                            change: Change::Add(*d),
                            reserved_bytes: if known { 0 } else { entry_cost },
                            reserved_entry: !known,
                        });
                    }
                    match self.overlay.entry(key[..].into()).or_insert_with(|| Pending::Deltas(Vec::new())) {
                        Pending::Deltas(ds) => match ds.last_mut() {
                            Some((s, sum)) if *s == seq => *sum = sum.saturating_add(*d),
                            _ => ds.push((seq, *d)),
                        },
                        p @ Pending::Value(..) => *p = Pending::Deltas(vec![(seq, *d)]),
                    }
                }
            }
        }
        Ok(())
    }

    /// `put-many` of checked `(key, value)` items: applies to owned keys,
    /// forwards the rest. Stops at the first refused item.
    pub(crate) fn put_many(&mut self, items: &[(&[u8], &[u8])], now: u64) -> Result<(), Refusal> {
        let known: Vec<bool> = {
            let (routes, guards) = self.routes(items.iter().map(|(k, _)| *k));
            items
                .iter()
                .zip(&routes)
                .map(|((k, _), r)| {
                    r.is_err()
                        && match self.overlay.get(*k) {
                            Some(Pending::Value(v, _)) => v.is_some(),
                            _ => self.entry(k, *r, &guards, now).is_some(),
                        }
                })
                .collect()
        };
        for (i, ((key, value), known)) in items.iter().zip(known).enumerate() {
            match self.route(key) {
                Ok(o) => {
                    let Some((_, own)) = self.owned.get_mut(o) else { continue };
                    let old = own.map.get(*key).map(|e| e.value.len());
                    if value.is_empty() {
                        if let Some(len) = own.remove(key) {
                            self.shared.unreserve(cost(key, len), true);
                        }
                    } else {
                        let new_cost = cost(key, value.len());
                        match old {
                            Some(len) => {
                                // Room for the new value first, then the old
                                // one goes back.
                                self.shared.reserve(new_cost, false, i)?;
                                self.shared.unreserve(cost(key, len), false);
                            }
                            None => self.shared.reserve(new_cost, true, i)?,
                        }
                        own.set(key, Value::Bytes(value.to_vec()), now);
                    }
                }
                Err(shard) => {
                    let (bytes, entry) = if value.is_empty() { (0, false) } else { (cost(key, value.len()), !known) };
                    self.shared.reserve(bytes, entry, i)?;
                    let seq = self.next_seq.get(shard).copied().unwrap_or(0);
                    if let Some(out) = self.outbox.get_mut(shard) {
                        out.push(Op {
                            key: (*key).into(),
                            change: Change::Put(value.to_vec()),
                            reserved_bytes: bytes,
                            reserved_entry: entry,
                        });
                    }
                    let v = (!value.is_empty()).then(|| value.to_vec());
                    self.overlay.insert((*key).into(), Pending::Value(v, seq));
                }
            }
        }
        Ok(())
    }

    /// Hands this batch's forwarded writes to their owners: one lock per
    /// owner written to.
    pub(crate) fn push(&mut self) {
        for (shard, ops) in self.outbox.iter_mut().enumerate() {
            if ops.is_empty() {
                continue;
            }
            let Some(s) = self.shared.shards.get(shard) else { continue };
            let Some(seq) = self.next_seq.get_mut(shard) else { continue };
            lock(&s.inbox).push(Message { sender: self.worker, seq: *seq, ops: std::mem::take(ops) });
            *seq += 1;
        }
    }

    /// A sync of the shards this worker holds: applies the writes
    /// forwarded to them, removes idle entries (appending them to
    /// `expired` as framed key/value pairs when asked), and publishes what
    /// changed. Returns the entries removed for idleness.
    pub(crate) fn sync(&mut self, now: u64, notify: bool, expired: &mut Vec<u8>) -> u64 {
        if self.shared.orphans.load(Ordering::Relaxed) > 0 {
            self.claim();
        }
        let shared = self.shared.clone();
        let timeout = shared.idle_timeout_ns.load(Ordering::Relaxed);
        let mut removed = 0u64;
        let mut notes: Vec<(Key, Value)> = Vec::new();
        for (shard, own) in &mut self.owned {
            let Some(s) = shared.shards.get(*shard) else { continue };
            let mut inbox = std::mem::take(&mut *lock(&s.inbox));
            // Writers in index order, each in the order it sent.
            inbox.sort_by_key(|m| (m.sender, m.seq));
            let mut last: Vec<(usize, u64)> = Vec::new();
            for m in inbox {
                for op in m.ops {
                    apply(&shared, own, op, now, timeout);
                }
                match last.last_mut() {
                    Some((sender, seq)) if *sender == m.sender => *seq = m.seq,
                    _ => last.push((m.sender, m.seq)),
                }
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
                        notes.push((k.clone(), e.value.clone()));
                    }
                    false
                });
            }
            if !own.dirty.is_empty() {
                let mut replica = s.replica.write().unwrap_or_else(std::sync::PoisonError::into_inner);
                for k in own.dirty.drain(..) {
                    match own.map.get_mut(&k) {
                        Some(e) => {
                            e.dirty = false;
                            replica.insert(k, e.clone());
                        }
                        None => {
                            replica.remove(&k);
                        }
                    }
                }
            }
            if !last.is_empty() {
                let mut applied = lock(&s.applied);
                for (sender, seq) in last {
                    if applied.len() <= sender {
                        applied.resize(sender + 1, 0);
                    }
                    if let Some(a) = applied.get_mut(sender) {
                        *a = (*a).max(seq);
                    }
                }
            }
        }
        if !notes.is_empty() {
            notes.sort_by(|a, b| a.0.cmp(&b.0));
            for (k, v) in notes {
                push_frame(expired, &k);
                match v {
                    Value::Counter(c) => push_frame(expired, &c.to_le_bytes()),
                    Value::Bytes(b) => push_frame(expired, &b),
                }
            }
        }
        self.last_sync_ns = now;
        removed
    }

    /// Forgets the overlay entries the owners have published.
    pub(crate) fn prune(&mut self) {
        if self.overlay.is_empty() {
            return;
        }
        let mut changed = false;
        for (shard, s) in self.shared.shards.iter().enumerate() {
            let applied = lock(&s.applied).get(self.worker).copied().unwrap_or(0);
            if let Some(seen) = self.seen_applied.get_mut(shard)
                && *seen != applied
            {
                *seen = applied;
                changed = true;
            }
        }
        if !changed {
            return;
        }
        let shared = self.shared.clone();
        let seen = &self.seen_applied;
        self.overlay.retain(|k, p| {
            let applied = seen.get(shared.owner(k)).copied().unwrap_or(0);
            match p {
                Pending::Deltas(ds) => {
                    ds.retain(|(seq, _)| *seq > applied);
                    !ds.is_empty()
                }
                Pending::Value(_, seq) => *seq > applied,
            }
        });
    }

    /// This worker leaves: its forwarded writes go to their owners and its
    /// shards wait for another worker.
    pub(crate) fn leave(&mut self) {
        self.push();
        for (shard, own) in self.owned.drain(..) {
            if let Some(s) = self.shared.shards.get(shard) {
                *lock(&s.parked) = Some(own);
                s.holder.store(NO_HOLDER, Ordering::Release);
                self.shared.orphans.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

type Guard<'a> = RwLockReadGuard<'a, HashMap<Key, Entry>>;

/// A scanned byte page: `(key, value)` items and whether more follow.
pub(crate) type ScanItems = (Vec<(Vec<u8>, Vec<u8>)>, bool);

/// A value as a scan sees it.
#[derive(Debug, Clone, Copy)]
enum Seen<'a> {
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
fn apply(shared: &SingleShared, own: &mut Owned, op: Op, now: u64, timeout: u64) {
    let Op { key, change, reserved_bytes, reserved_entry } = op;
    shared.unreserve(reserved_bytes, reserved_entry);
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
            own.set(&key, Value::Bytes(v), now);
        }
    }
}
