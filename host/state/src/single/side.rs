//! One worker's side of a single-writer table ([`SingleStore`]): the
//! shards it owns and writes with no lock, its overlay of writes to keys
//! other workers own, their hand-over to the owners' inboxes, and the
//! owner's sync that applies and publishes them.

use super::writes::{Put, Seen, Writes};
use super::{
    ByteKey, Change, Entry, NO_HOLDER, Op, Owned, Refusal, Replica, SingleShared, SingleTable, SwKey, UNSENT, Value,
    cost, make_room,
};
use crate::HashMap;
use crate::entry::{add_delta, stale};
use crate::scan::{Largest, Smallest};
use parking_lot::RwLockReadGuard;
use sluice_wire::abi::push_frame;
use std::sync::Arc;
use std::sync::atomic::Ordering;

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
    /// Packet time of the last sweep for idle entries.
    last_sweep_ns: u64,
    /// Packet time of the last hand-over.
    last_push_ns: u64,
}

type Guard<'a, K> = RwLockReadGuard<'a, Replica<K>>;

/// The read guard on `shard`'s replica, taken on first use.
///
/// A call reads keys in the order the NF gives them, so it may want shard
/// 2 while it holds shard 5. It never waits for one shard while it holds
/// another: an owner waiting to publish holds new readers back, and two
/// such owners and two such readers would wait on each other for ever
/// (the firewall's `connections` table did, at 8 workers). When the shard
/// is not free at once, every guard is let go first.
fn guard<'g, 'v, K>(
    shared: &'g SingleShared<K>,
    guards: &'v mut Vec<Option<Guard<'g, K>>>,
    shard: usize,
) -> Option<&'v Guard<'g, K>> {
    if guards.is_empty() {
        guards.extend((0..shared.shards.len()).map(|_| None));
    }
    let s = shared.shards.get(shard)?;
    if guards.get(shard)?.is_none() {
        let g = match s.replica.try_read() {
            Some(g) => g,
            None => {
                guards.iter_mut().for_each(|g| *g = None);
                s.replica.read()
            }
        };
        *guards.get_mut(shard)? = Some(g);
    }
    guards.get(shard)?.as_ref()
}

/// The index in `owned` of the shard holding `key`, if the worker holds
/// it; else the owner shard.
fn route<K: SwKey>(shared: &SingleShared<K>, owned: &[(usize, Owned<K>)], key: &K) -> Result<usize, usize> {
    let shard = shared.owner(key);
    owned.iter().position(|(s, _)| *s == shard).ok_or(shard)
}

/// Calls `f` with the live entry of `key` that owner shard `shard` has
/// published and the take it includes (read through `guards`: one lock per
/// shard per call, never per key).
fn published<'g, K: SwKey, R>(
    shared: &'g SingleShared<K>,
    guards: &mut Vec<Option<Guard<'g, K>>>,
    key: &K,
    shard: usize,
    now: u64,
    f: impl FnOnce(Option<&Entry>, u64) -> R,
) -> R {
    let timeout = shared.idle_timeout_ns.load(Ordering::Relaxed);
    match guard(shared, guards, shard) {
        Some(g) => f(g.map.get(key).filter(|e| !stale(e.last_ns, now, timeout)), g.take),
        None => f(None, 0),
    }
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
            last_sweep_ns: 0,
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
                let owned = shard.parked.lock().take().unwrap_or_default();
                shared.orphans.fetch_sub(1, Ordering::Relaxed);
                self.owned.push((i, owned));
            }
        }
    }

    /// The index in `owned` of the shard holding `key`, if this worker
    /// holds it; else the owner shard.
    fn route(&self, key: &K) -> Result<usize, usize> {
        route(&self.shared, &self.owned, key)
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
        match route {
            Ok(o) => {
                let timeout = shared.idle_timeout_ns.load(Ordering::Relaxed);
                f(
                    self.owned.get(o).and_then(|(_, own)| own.map.get(key)).filter(|e| !stale(e.last_ns, now, timeout)),
                    0,
                )
            }
            Err(shard) => published(shared, guards, key, shard, now, f),
        }
    }

    /// Read guards on the replicas of the shards this worker does not hold.
    fn replicas(&self) -> Vec<Option<Guard<'_, K>>> {
        self.shared
            .shards
            .iter()
            .enumerate()
            .map(|(i, s)| (!self.owned.iter().any(|(o, _)| *o == i)).then(|| s.replica.read()))
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
            let mut inbox = s.inbox.lock();
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
        // Idle entries are swept at most every eighth of the timeout (and
        // 1 ms) of packet time, as eventual tables are: a sweep visits
        // every entry the worker holds, and a table synced every batch
        // would otherwise pay for its whole size per batch.
        let sweep = timeout > 0 && now.saturating_sub(self.last_sweep_ns) >= (timeout / 8).max(1_000_000);
        if sweep {
            self.last_sweep_ns = now;
        }
        for (shard, own) in &mut self.owned {
            let Some(s) = shared.shards.get(*shard) else { continue };
            let take = {
                let mut inbox = s.inbox.lock();
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
            if sweep {
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
                let mut replica = s.replica.write();
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
                *s.parked.lock() = Some(own);
                s.holder.store(NO_HOLDER, Ordering::Release);
                self.shared.orphans.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

impl Side<u64> {
    /// `counter-get`: appends one value per key (0: absent or idle).
    pub(crate) fn counter_get(&self, keys: &[u64], now: u64, out: &mut Vec<u64>) {
        let shared: &SingleShared<u64> = &self.shared;
        let mut guards = Vec::new();
        for key in keys {
            let route = self.route(key);
            let (base, published) = self
                .with_entry(shared, &mut guards, key, route, now, |e, take| (e.map_or(0, |e| e.value.counter()), take));
            out.push(match (route, self.overlay.get(key)) {
                (Err(_), Some(p)) => p.writes.sum(base, published),
                _ => base,
            });
        }
    }

    /// `counter-add`: applies to owned keys, forwards the rest. Stops at
    /// the first refused item (earlier items stay written).
    pub(crate) fn counter_add(&mut self, keys: &[u64], deltas: &[i64], now: u64) -> Result<(), Refusal> {
        // Borrowed field by field, not through a clone of the `Arc`: a clone
        // per call is an atomic write to a line every worker of the table
        // writes, which bounces between their cores.
        let Side { shared, owned, overlay, round, .. } = self;
        let shared: &SingleShared<u64> = shared;
        let timeout = shared.idle_timeout_ns.load(Ordering::Relaxed);
        let entry_cost = cost(&0u64, 8);
        let mut guards = Vec::new();
        for (i, (key, d)) in keys.iter().zip(deltas).enumerate() {
            match route(shared, owned, key) {
                Ok(o) => {
                    let Some((_, own)) = owned.get_mut(o) else { continue };
                    match own.map.get_mut(key) {
                        Some(e) => {
                            let base = if stale(e.last_ns, now, timeout) { 0 } else { e.value.counter() };
                            e.value = Value::Counter(add_delta(base, *d));
                            e.last_ns = now;
                            if !e.dirty {
                                e.dirty = true;
                                own.dirty.push(*key);
                            }
                        }
                        None => {
                            shared.reserve(entry_cost, true, i)?;
                            own.map.insert(
                                *key,
                                Entry { value: Value::Counter(add_delta(0, *d)), last_ns: now, dirty: true },
                            );
                            own.dirty.push(*key);
                        }
                    }
                }
                Err(shard) => {
                    // The common case, one lookup: a key this worker wrote
                    // or saw published in the last interval (it reserved
                    // the key then, or the owner holds it).
                    let known = match overlay.get_mut(key) {
                        Some(p) => {
                            if !p.writes.unsent()
                                && let Some(r) = round.get_mut(shard)
                            {
                                r.push(*key);
                            }
                            p.touched = true;
                            p.writes.add(*d);
                            continue;
                        }
                        // Known: the owner has published it.
                        None => published(shared, &mut guards, key, shard, now, |e, _| e.is_some()),
                    };
                    if !known {
                        shared.reserve(entry_cost, true, i)?;
                    }
                    let p = overlay.entry(*key).or_default();
                    if let Some(r) = round.get_mut(shard) {
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
        let shared: &SingleShared<ByteKey> = &self.shared;
        let mut guards = Vec::new();
        for key in keys {
            let key = ByteKey::from_slice(key);
            let route = self.route(&key);
            let write = route.is_err().then(|| self.overlay.get(&key)).flatten().map(|p| &p.writes);
            self.with_entry(shared, &mut guards, &key, route, now, |e, published| {
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
        // Field by field, as in `counter_add` (no clone of the `Arc`).
        let Side { shared, owned, overlay, round, .. } = self;
        let shared: &SingleShared<ByteKey> = shared;
        let mut guards = Vec::new();
        let mut result = Ok(());
        for (i, (key, value)) in items.iter().enumerate() {
            let key = ByteKey::from_slice(key);
            match route(shared, owned, &key) {
                Ok(o) => {
                    let Some((_, own)) = owned.get_mut(o) else { continue };
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
                    let known = match overlay.get(&key).map(|p| &p.writes) {
                        Some(w) if w.take != 0 => w.value.is_some(),
                        _ => published(shared, &mut guards, &key, shard, now, |e, _| e.is_some()),
                    };
                    let (bytes, entry) = if value.is_empty() { (0, false) } else { (cost(&key, value.len()), !known) };
                    if let Err(r) = shared.reserve(bytes, entry, i) {
                        result = Err(r);
                        break;
                    }
                    let p = overlay.entry(key.clone()).or_default();
                    if p.writes.unsent() {
                        // The round's earlier value is never handed over: what
                        // it reserved goes back (an entry is kept once).
                        shared.unreserve(std::mem::take(&mut p.reserved_bytes) as usize, entry && p.reserved_entry);
                    } else if let Some(r) = round.get_mut(shard) {
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

/// Applies one forwarded write at its owner.
fn apply<K: SwKey>(shared: &SingleShared<K>, own: &mut Owned<K>, op: Op<K>, now: u64, timeout: u64) {
    let Op { key, change, reserved_bytes, reserved_entry } = op;
    shared.unreserve(reserved_bytes, reserved_entry);
    if let Change::Add(d) = change
        && let Some(e) = own.map.get_mut(&key)
        && !stale(e.last_ns, now, timeout)
    {
        // The common case, one lookup: an add to a live counter.
        e.value = Value::Counter(add_delta(e.value.counter(), d));
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
            own.set(&key, Value::Counter(add_delta(v, d)), now);
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
