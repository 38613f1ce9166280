//! What the workers of one host share for one NF: the merged views of its
//! eventual tables and the free lists and bindings of its release pools.
//!
//! Every access takes one lock per state call (so one per batch, not per
//! packet); between calls a worker works on its own replica or share.

use crate::HashMap;
use crate::spec::{Merge, TableSpec};
use std::sync::{Arc, Mutex, MutexGuard};

/// Shared state of one NF across the workers of a host. Create one per NF
/// (per chain stage) and attach every worker's instance to it.
#[derive(Debug, Default)]
pub struct Domain {
    inner: Mutex<DomainInner>,
}

#[derive(Debug, Default)]
struct DomainInner {
    workers: usize,
    eventual: HashMap<String, Arc<EventualShared>>,
    pools: HashMap<String, Arc<Pool>>,
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

    /// Registers a worker and returns its index.
    pub(crate) fn attach(&self) -> usize {
        let mut d = lock(&self.inner);
        d.workers += 1;
        d.workers - 1
    }

    /// The shared view of eventual table `name`, created on first use.
    pub(crate) fn eventual(&self, name: &str, merge: Merge) -> Arc<EventualShared> {
        let mut d = lock(&self.inner);
        d.eventual
            .entry(name.to_string())
            .or_insert_with(|| Arc::new(EventualShared { merge, values: Mutex::new(HashMap::default()) }))
            .clone()
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
                    inner: Mutex::new(PoolInner {
                        first,
                        end: first + count,
                        next: first,
                        free: Vec::new(),
                        shares: Vec::new(),
                        bound: HashMap::default(),
                        chunk: chunk as usize,
                        rebalances: 0,
                        exhausted: 0,
                    }),
                })
            })
            .clone()
    }

    /// The merged contents of eventual table `name` (what the workers have
    /// merged so far), sorted by key.
    pub fn eventual_snapshot(&self, name: &str) -> Option<Vec<(u64, u64)>> {
        let shared = lock(&self.inner).eventual.get(name).cloned()?;
        let mut v: Vec<(u64, u64)> = lock(&shared.values).iter().map(|(k, v)| (*k, *v)).collect();
        v.sort_unstable();
        Some(v)
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

/// The merged view of one eventual table.
#[derive(Debug)]
pub(crate) struct EventualShared {
    pub(crate) merge: Merge,
    pub(crate) values: Mutex<HashMap<u64, u64>>,
}

impl EventualShared {
    /// Folds a worker's pending updates into the merged view.
    pub(crate) fn merge_in(&self, pending: &mut HashMap<u64, u64>) {
        if pending.is_empty() {
            return;
        }
        let mut values = lock(&self.values);
        for (k, v) in pending.drain() {
            let e = values.entry(k).or_insert(match self.merge {
                Merge::Min => u64::MAX,
                Merge::Sum | Merge::Max => 0,
            });
            *e = self.merge.apply(*e, v);
        }
    }

    /// Reads keys from the merged view, combined with the worker's pending
    /// updates.
    pub(crate) fn read(&self, keys: &[u64], pending: &HashMap<u64, u64>, out: &mut Vec<u64>) {
        let values = lock(&self.values);
        for k in keys {
            let merged = values.get(k).copied();
            let local = pending.get(k).copied();
            out.push(match (merged, local) {
                (Some(m), Some(l)) => self.merge.apply(m, l),
                (Some(v), None) | (None, Some(v)) => v,
                (None, None) => 0,
            });
        }
    }
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
    /// Resources from `next` to `end` were never handed out.
    next: u64,
    /// Resources given back to the host.
    free: Vec<u64>,
    /// Each worker's share: resources it may hand out without asking.
    shares: Vec<Vec<u64>>,
    bound: HashMap<u64, Binding>,
    chunk: usize,
    rebalances: u64,
    exhausted: u64,
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

    /// Refills `worker`'s share: from resources never handed out, then the
    /// free list, then half of the largest other share.
    fn refill(&mut self, worker: usize) {
        let chunk = self.chunk;
        let mut taken: Vec<u64> = Vec::with_capacity(chunk);
        while taken.len() < chunk && self.next < self.end {
            taken.push(self.next);
            self.next += 1;
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
    inner: Mutex<PoolInner>,
}

impl Pool {
    /// Takes one resource per value for `worker` and binds it. Returns the
    /// resources and how many values got none.
    pub(crate) fn acquire<'a>(&self, worker: usize, values: impl Iterator<Item = &'a [u8]>, out: &mut Vec<u64>) -> u64 {
        let mut p = lock(&self.inner);
        let mut short = 0;
        for value in values {
            let mut r = p.share(worker).pop();
            if r.is_none() {
                p.refill(worker);
                r = p.share(worker).pop();
            }
            match r {
                Some(r) => {
                    p.bound.insert(r, Binding { value: value.to_vec(), worker });
                    out.push(r);
                }
                None => short += 1,
            }
        }
        p.exhausted += short;
        short
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
            if p.bound.remove(r).is_some() {
                p.share(worker).push(*r);
                released += 1;
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
}
