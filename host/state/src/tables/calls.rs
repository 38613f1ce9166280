//! The state interface's calls on one worker's tables (`counter-add`,
//! `get-many`, `put-many`, `scan`, `acquire`, ...): each checks its input,
//! serves the table whatever its kind, and meters the call.

use super::store::{Slot, Store, add_counters, read_counters};
use super::{Tables, flow_index, idx};
use crate::entry::{ENTRY_OVERHEAD, stale};
use crate::error::StateError;
use crate::eventual::AddRefusal;
use crate::pool::Pool;
use crate::scan::{Largest, ScanPage, Smallest, counter_page, framed_page, page_limit, top_limit, u64_cursor};
use crate::single::Refusal;
use crate::single::SingleStore::{Bytes as SingleBytes, Counters as SingleCounters};
use crate::spec::MAX_KEY_SIZE;
use sluice_wire::FlowKey;
use sluice_wire::abi::{frames, push_frame};
use std::sync::Arc;

impl Tables {
    /// For a per-flow counter table, the flows its keys (batch flow
    /// indices) name; empty for other tables. Resolved before the table is
    /// borrowed mutably.
    fn counter_flow_keys(&self, t: u32, keys: &[u64]) -> Result<Vec<FlowKey>, StateError> {
        match self.tables.get(t as usize).map(|x| &x.store) {
            Some(Store::FlowCounters(_)) => keys
                .iter()
                .enumerate()
                .map(|(item, k)| self.flow(usize::try_from(*k).unwrap_or(usize::MAX), item))
                .collect(),
            _ => Ok(Vec::new()),
        }
    }

    /// `counter-add`.
    pub fn counter_add(&mut self, t: u32, keys: &[u64], deltas: &[i64]) -> Result<(), StateError> {
        let r = self.counter_add_inner(t, keys, deltas);
        self.account(r)
    }

    fn counter_add_inner(&mut self, t: u32, keys: &[u64], deltas: &[i64]) -> Result<(), StateError> {
        self.writable(t)?;
        if keys.len() != deltas.len() {
            return Err(StateError::BadInput(idx(keys.len().min(deltas.len()))));
        }
        let now = self.now_ns;
        let budget = self.budget;
        let mut used = self.used;
        // Per-flow keys are resolved before borrowing the table.
        let flow_keys: Vec<FlowKey> = self.counter_flow_keys(t, keys)?;
        for k in &flow_keys {
            self.changes.note(k);
        }
        let table = self.table(t)?;
        let cap = table.spec.capacity();
        let timeout = table.spec.idle_timeout_ns;
        // Charges a new entry of `cost` bytes to this worker's budget, the
        // table holding `len` entries.
        let mut charge = |cost: usize, len: usize, item: usize| -> Result<(), StateError> {
            used = Self::charge(used, budget, len, cap, cost, item)?;
            Ok(())
        };
        let result = match &mut table.store {
            Store::Counters(m) => {
                add_counters(m, keys, deltas, now, timeout, |len, i| charge(16 + ENTRY_OVERHEAD, len, i))
            }
            Store::FlowCounters(m) => {
                let cost = FlowKey::ENCODED_LEN + 8 + ENTRY_OVERHEAD;
                add_counters(m, &flow_keys, deltas, now, timeout, |len, i| charge(cost, len, i))
            }
            Store::Single(SingleCounters(s)) => s.counter_add(keys, deltas, now).map_err(refusal),
            Store::Eventual { pending, shared, .. } => shared.add(pending, keys, deltas, now).map_err(|r| match r {
                AddRefusal::Full(i) => StateError::Full(idx(i)),
                AddRefusal::OverBudget(i) => StateError::OverBudget(idx(i)),
                AddRefusal::Negative(i) => StateError::BadInput(idx(i)),
            }),
            _ => Err(StateError::WrongKind),
        };
        self.used = used;
        self.meters.ops += keys.len() as u64;
        result
    }

    /// `counter-get`: appends one value per key to `out`.
    pub fn counter_get(&mut self, t: u32, keys: &[u64], out: &mut Vec<u64>) -> Result<(), StateError> {
        let r = self.counter_get_inner(t, keys, out);
        self.account(r)
    }

    fn counter_get_inner(&mut self, t: u32, keys: &[u64], out: &mut Vec<u64>) -> Result<(), StateError> {
        let now = self.now_ns;
        let flow_keys: Vec<FlowKey> = self.counter_flow_keys(t, keys)?;
        let table = self.table(t)?;
        let timeout = table.spec.idle_timeout_ns;
        match &mut table.store {
            Store::Counters(m) => read_counters(m, keys, now, timeout, out),
            Store::FlowCounters(m) => read_counters(m, &flow_keys, now, timeout, out),
            Store::Eventual { pending, shared, .. } => shared.read(keys, pending, now, out),
            Store::Single(SingleCounters(s)) => s.counter_get(keys, now, out),
            _ => return Err(StateError::WrongKind),
        }
        self.meters.ops += keys.len() as u64;
        Ok(())
    }

    /// `get-many`: appends one framed value per framed key to `out`.
    pub fn get_many(&mut self, t: u32, keys: &[u8], out: &mut Vec<u8>) -> Result<(), StateError> {
        let r = self.get_many_inner(t, keys, out);
        self.account(r)
    }

    fn get_many_inner(&mut self, t: u32, keys: &[u8], out: &mut Vec<u8>) -> Result<(), StateError> {
        let now = self.now_ns;
        let flows = std::mem::take(&mut self.flows);
        let result = (|| {
            let table = self.table(t)?;
            let timeout = table.spec.idle_timeout_ns;
            let mut n = 0u64;
            match &mut table.store {
                Store::Single(SingleBytes(s)) => {
                    let keys: Vec<&[u8]> = frames(keys).collect::<Result<_, _>>().map_err(StateError::BadInput)?;
                    n = keys.len() as u64;
                    s.get_many(&keys, now, out);
                }
                Store::Bytes(m) => {
                    for key in frames(keys) {
                        let key = key.map_err(StateError::BadInput)?;
                        n += 1;
                        match m.get_mut(key) {
                            Some(s) if !stale(s.last_ns, now, timeout) => {
                                s.last_ns = now;
                                push_frame(out, &s.value);
                            }
                            _ => push_frame(out, &[]),
                        }
                    }
                }
                Store::FlowBytes(m) => {
                    for (item, key) in frames(keys).enumerate() {
                        let key = key.map_err(StateError::BadInput)?;
                        n += 1;
                        let flow = flow_index(key).and_then(|i| flows.get(i)).ok_or(StateError::BadInput(idx(item)))?;
                        match m.get_mut(flow) {
                            Some(s) if !stale(s.last_ns, now, timeout) => {
                                s.last_ns = now;
                                push_frame(out, &s.value);
                            }
                            _ => push_frame(out, &[]),
                        }
                    }
                }
                _ => return Err(StateError::WrongKind),
            }
            Ok(n)
        })();
        self.flows = flows;
        let n = result?;
        self.meters.ops += n;
        Ok(())
    }

    /// `put-many`.
    pub fn put_many(&mut self, t: u32, entries: &[u8]) -> Result<(), StateError> {
        let r = self.put_many_inner(t, entries);
        self.account(r)
    }

    fn put_many_inner(&mut self, t: u32, entries: &[u8]) -> Result<(), StateError> {
        self.writable(t)?;
        let now = self.now_ns;
        let budget = self.budget;
        let mut used = self.used;
        let flows = std::mem::take(&mut self.flows);
        let mut n = 0u64;
        let mut changes = std::mem::take(&mut self.changes);
        let result = (|| {
            let table = self.table(t)?;
            let cap = table.spec.capacity();
            let key_size = table.spec.key_size as usize;
            let max_value = table.spec.max_value_size as usize;
            if let Store::Single(s) = &mut table.store {
                let SingleBytes(s) = s else { return Err(StateError::WrongKind) };
                // The items up to a malformed one are written, as for any
                // other table.
                let (items, bad) = single_items(entries, key_size, max_value);
                n = items.len() as u64;
                s.put_many(&items, now).map_err(refusal)?;
                return bad.map_or(Ok(()), Err);
            }
            let mut items = frames(entries);
            let mut item = 0u32;
            loop {
                let Some(key) = items.next() else { return Ok(()) };
                let key = key.map_err(|_| StateError::BadInput(item))?;
                let value = match items.next() {
                    Some(Ok(v)) => v,
                    _ => return Err(StateError::BadInput(item)),
                };
                if value.len() > max_value {
                    return Err(StateError::TooLarge(item));
                }
                n += 1;
                match &mut table.store {
                    Store::Bytes(m) => {
                        if !key_fits(key, key_size) {
                            return Err(StateError::BadInput(item));
                        }
                        let old = m.get(key).map(|s| (s.value.len(), s.clock));
                        if value.is_empty() {
                            if let Some((len, _)) = old {
                                m.remove(key);
                                used = used.saturating_sub(key.len() + len + ENTRY_OVERHEAD);
                            }
                        } else {
                            let (old_cost, clock) = match old {
                                Some((len, clock)) => (key.len() + len + ENTRY_OVERHEAD, clock),
                                None => (0, 0),
                            };
                            let new_cost = key.len() + value.len() + ENTRY_OVERHEAD;
                            let len = if old.is_some() { 0 } else { m.len() };
                            used =
                                Self::charge(used.saturating_sub(old_cost), budget, len, cap, new_cost, item as usize)?;
                            m.insert(key.into(), Slot { value: value.to_vec(), last_ns: now, clock: clock + 1 });
                        }
                    }
                    Store::FlowBytes(m) => {
                        let flow = *flow_index(key).and_then(|i| flows.get(i)).ok_or(StateError::BadInput(item))?;
                        changes.note(&flow);
                        let old = m.get(&flow).map(|s| (s.value.len(), s.clock));
                        let base = FlowKey::ENCODED_LEN + ENTRY_OVERHEAD;
                        if value.is_empty() {
                            if let Some((len, _)) = old {
                                m.remove(&flow);
                                used = used.saturating_sub(base + len);
                            }
                        } else {
                            let (old_cost, clock) = match old {
                                Some((len, clock)) => (base + len, clock),
                                None => (0, 0),
                            };
                            let len = if old.is_some() { 0 } else { m.len() };
                            used = Self::charge(
                                used.saturating_sub(old_cost),
                                budget,
                                len,
                                cap,
                                base + value.len(),
                                item as usize,
                            )?;
                            m.insert(flow, Slot { value: value.to_vec(), last_ns: now, clock: clock + 1 });
                        }
                    }
                    _ => return Err(StateError::WrongKind),
                }
                item += 1;
            }
        })();
        self.changes = changes;
        self.flows = flows;
        self.used = used;
        self.meters.ops += n;
        result
    }

    /// `scan`: one page of table `t` in ascending key order after
    /// `cursor`, at most `limit` entries (see [`crate::scan`]). Metered as
    /// one operation per entry plus one for the call.
    pub fn scan(&mut self, t: u32, cursor: &[u8], limit: u32) -> Result<ScanPage, StateError> {
        let r = self.scan_inner(t, cursor, page_limit(limit));
        self.meters.ops += 1 + r.as_ref().map_or(0, |p| p.len as u64);
        self.account(r)
    }

    fn scan_inner(&mut self, t: u32, cursor: &[u8], limit: usize) -> Result<ScanPage, StateError> {
        let now = self.now_ns;
        let table = self.table(t)?;
        let timeout = table.spec.idle_timeout_ns;
        let key_size = table.spec.key_size as usize;
        let counter_cursor = || u64_cursor(cursor).ok_or(StateError::BadInput(0));
        match &table.store {
            Store::FlowCounters(_) | Store::FlowBytes(_) => Err(StateError::WrongKind),
            Store::Counters(m) => {
                let mut page = Smallest::new(counter_cursor()?, limit);
                for (k, s) in m.iter().filter(|(_, s)| !stale(s.last_ns, now, timeout)) {
                    page.offer(*k, s.value);
                }
                let (counters, more) = page.finish();
                Ok(counter_page(counters, more))
            }
            Store::Eventual { pending, shared, .. } => {
                let mut page = Smallest::new(counter_cursor()?, limit);
                shared.visit(pending, now, |k, v| page.offer(k, v));
                let (counters, more) = page.finish();
                Ok(counter_page(counters, more))
            }
            Store::Single(SingleCounters(s)) => {
                let (counters, more) = s.scan_counters(counter_cursor()?, limit, now);
                Ok(counter_page(counters, more))
            }
            Store::Single(SingleBytes(s)) => {
                let after = byte_cursor(cursor, key_size)?;
                let (items, more) = s.scan_bytes(after, limit, now);
                Ok(framed_entries(&items, more))
            }
            Store::Bytes(m) => {
                let after = byte_cursor(cursor, key_size)?;
                let mut page = Smallest::new(after, limit);
                for (k, s) in m.iter().filter(|(_, s)| !stale(s.last_ns, now, timeout)) {
                    page.offer(&**k, s.value.as_slice());
                }
                let (items, more) = page.finish();
                Ok(framed_entries(&items, more))
            }
            Store::Pool(p) => {
                let (items, more) = p.scan(counter_cursor()?, limit);
                let mut entries = Vec::new();
                for (r, v) in &items {
                    push_frame(&mut entries, &r.to_le_bytes());
                    push_frame(&mut entries, v);
                }
                let last = items.last().map(|(r, _)| r.to_le_bytes());
                Ok(framed_page(entries, items.len(), last.as_ref().map(|l| &l[..]), more))
            }
        }
    }

    /// `top-k`: the `k` (at most [`MAX_SCAN`](crate::MAX_SCAN)) largest counters of table
    /// `t`, largest first, equal values by ascending key. Metered as one
    /// operation per pair plus one for the call.
    pub fn top_k(&mut self, t: u32, k: u32) -> Result<Vec<(u64, u64)>, StateError> {
        let r = self.top_k_inner(t, top_limit(k));
        self.meters.ops += 1 + r.as_ref().map_or(0, |v| v.len() as u64);
        self.account(r)
    }

    fn top_k_inner(&mut self, t: u32, k: usize) -> Result<Vec<(u64, u64)>, StateError> {
        let now = self.now_ns;
        let table = self.table(t)?;
        let timeout = table.spec.idle_timeout_ns;
        let mut top = Largest::new(k);
        match &table.store {
            Store::Counters(m) => {
                for (key, s) in m.iter().filter(|(_, s)| !stale(s.last_ns, now, timeout)) {
                    top.offer(*key, s.value);
                }
            }
            Store::Eventual { pending, shared, .. } => shared.visit(pending, now, |key, v| top.offer(key, v)),
            Store::Single(SingleCounters(s)) => s.top(&mut top, now),
            _ => return Err(StateError::WrongKind),
        }
        Ok(top.finish())
    }

    fn pool(&mut self, t: u32) -> Result<Arc<Pool>, StateError> {
        match &self.table(t)?.store {
            Store::Pool(p) => Ok(p.clone()),
            _ => Err(StateError::WrongKind),
        }
    }

    /// `acquire`: appends the resources to `out`.
    pub fn acquire(&mut self, t: u32, values: &[u8], out: &mut Vec<u64>) -> Result<(), StateError> {
        let r = (|| {
            let pool = self.pool(t)?;
            let max = self.tables.get(t as usize).map(|x| x.spec.max_value_size as usize).unwrap_or(0);
            let mut items = Vec::new();
            for (i, v) in frames(values).enumerate() {
                let v = v.map_err(StateError::BadInput)?;
                if v.len() > max {
                    return Err(StateError::TooLarge(idx(i)));
                }
                items.push(v);
            }
            self.meters.ops += items.len() as u64;
            let before = out.len();
            let r = match pool.acquire(self.worker, items.iter().copied(), out) {
                Ok(short) => {
                    self.meters.rejected += short;
                    Ok(())
                }
                Err(item) => Err(StateError::OverBudget(idx(item))),
            };
            self.pool_changes.note(t, out.get(before..).unwrap_or_default().iter().copied());
            r
        })();
        self.account(r)
    }

    /// `lookup`: appends one framed value per resource to `out`.
    pub fn lookup(&mut self, t: u32, resources: &[u64], out: &mut Vec<u8>) -> Result<(), StateError> {
        let r = self.pool(t).map(|p| {
            p.lookup(resources, out);
        });
        self.meters.ops += resources.len() as u64;
        self.account(r)
    }

    /// `release`.
    pub fn release(&mut self, t: u32, resources: &[u64]) -> Result<(), StateError> {
        let worker = self.worker;
        let r = self.pool(t).map(|p| {
            p.release(worker, resources);
        });
        if r.is_ok() {
            self.pool_changes.note(t, resources.iter().copied());
        }
        self.meters.ops += resources.len() as u64;
        self.account(r)
    }

    /// Starts noting the pool resources this worker's calls bind or
    /// release, for [`take_pool_changes`](Self::take_pool_changes).
    pub fn track_pool_changes(&mut self) {
        self.pool_changes.track();
    }

    /// Appends, per pool (by name), the resources this worker's calls bound
    /// or released since the last call, each with its binding now (`None`:
    /// free). When too many changed to note, every binding of every pool.
    pub fn take_pool_changes(&mut self, out: &mut Vec<(String, Vec<crate::PoolChange>)>) {
        let mut noted = Vec::new();
        let complete = self.pool_changes.take(&mut noted);
        for (i, t) in self.tables.iter().enumerate() {
            let Store::Pool(p) = &t.store else { continue };
            let entries: Vec<crate::PoolChange> = if complete {
                let mine: Vec<u64> = noted.iter().filter(|(x, _)| *x as usize == i).map(|(_, r)| *r).collect();
                if mine.is_empty() {
                    continue;
                }
                p.bindings_of(&mine)
            } else {
                p.bindings_where(&|_| true).into_iter().map(|(r, v)| (r, Some(v))).collect()
            };
            if !entries.is_empty() {
                out.push((t.spec.name.clone(), entries));
            }
        }
    }

    /// Notes resources of pool `name` as changed again (their bindings were
    /// not held elsewhere in time: the next take sends them as they are then).
    pub fn renote_pool_changes(&mut self, name: &str, resources: &[u64]) {
        if let Some(i) = self.tables.iter().position(|t| t.spec.name == name) {
            self.pool_changes.note(idx(i), resources.iter().copied());
        }
    }

    /// The worker holding a pool resource (tests, reports).
    pub fn pool_holder(&self, name: &str, resource: u64) -> Option<usize> {
        self.tables.iter().find(|t| t.spec.name == name).and_then(|t| match &t.store {
            Store::Pool(p) => p.holder(resource),
            _ => None,
        })
    }
}

fn refusal(r: Refusal) -> StateError {
    match r {
        Refusal::Full(i) => StateError::Full(idx(i)),
        Refusal::OverBudget(i) => StateError::OverBudget(idx(i)),
    }
}

/// `(key, value)` items of a `put-many`.
type Items<'a> = Vec<(&'a [u8], &'a [u8])>;

/// The `(key, value)` items of a `put-many` on a single-writer byte table,
/// up to the first malformed one, and the error for that one.
fn single_items(entries: &[u8], key_size: usize, max_value: usize) -> (Items<'_>, Option<StateError>) {
    let mut items = Vec::new();
    let mut frames = frames(entries);
    loop {
        let item = idx(items.len());
        let key = match frames.next() {
            None => return (items, None),
            Some(Ok(k)) => k,
            Some(Err(_)) => return (items, Some(StateError::BadInput(item))),
        };
        let Some(Ok(value)) = frames.next() else { return (items, Some(StateError::BadInput(item))) };
        if !key_fits(key, key_size) {
            return (items, Some(StateError::BadInput(item)));
        }
        if value.len() > max_value {
            return (items, Some(StateError::TooLarge(item)));
        }
        items.push((key, value));
    }
}

/// Whether `key` is a key of a byte table whose keys are `key_size` bytes
/// (0: any length up to [`MAX_KEY_SIZE`], not empty).
fn key_fits(key: &[u8], key_size: usize) -> bool {
    if key_size == 0 { !key.is_empty() && key.len() <= MAX_KEY_SIZE as usize } else { key.len() == key_size }
}

/// A byte-table cursor: empty (the start) or a key the table could hold.
fn byte_cursor(cursor: &[u8], key_size: usize) -> Result<Option<&[u8]>, StateError> {
    let ok = if key_size == 0 { cursor.len() <= MAX_KEY_SIZE as usize } else { cursor.len() == key_size };
    match cursor {
        [] => Ok(None),
        c if ok => Ok(Some(c)),
        _ => Err(StateError::BadInput(0)),
    }
}

/// A page of byte entries, framed key, value, ...
fn framed_entries<K: AsRef<[u8]>, V: AsRef<[u8]>>(items: &[(K, V)], more: bool) -> ScanPage {
    let mut entries = Vec::new();
    for (k, v) in items {
        push_frame(&mut entries, k.as_ref());
        push_frame(&mut entries, v.as_ref());
    }
    framed_page(entries, items.len(), items.last().map(|(k, _)| k.as_ref()), more)
}
