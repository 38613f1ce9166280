//! Release pools: integer resources (ports, addresses) bound to values,
//! split into per-worker shares that are refilled from the free list and
//! rebalanced when one runs dry, and split between the hosts of a group
//! by aligned blocks.

use crate::account::SharedBytes;
use crate::entry::ENTRY_OVERHEAD;
use crate::scan::Smallest;
use crate::{HashMap, HashSet};
use parking_lot::Mutex;
use sluice_wire::abi::push_frame;
use std::collections::VecDeque;
use std::sync::Arc;

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
    8 + value.len() + ENTRY_OVERHEAD
}

impl Pool {
    /// A new pool of the resources `first..first + count`, charged to
    /// `bytes`, for a host running `workers` workers; a worker takes
    /// `chunk` resources at a time (0: the host picks).
    pub(crate) fn new(bytes: Arc<SharedBytes>, first: u64, count: u64, chunk: u32, workers: usize) -> Self {
        // A chunk is a hint: the host bounds the work (and the
        // allocation) one refill may do inside a call.
        let chunk = if chunk == 0 { (count / (4 * workers as u64)).clamp(1, 256) } else { u64::from(chunk) }
            .clamp(1, MAX_CHUNK)
            .min(count.max(1));
        Pool {
            bytes,
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
        }
    }

    /// The pool's resources: `first..end`.
    pub(crate) fn range(&self) -> (u64, u64) {
        let p = self.inner.lock();
        (p.first, p.end)
    }

    /// Takes one resource per value for `worker` and binds it. Returns how
    /// many values got none (the pool is exhausted), or the index of the
    /// value the state budget had no room for (earlier ones are bound).
    pub(crate) fn acquire<'a>(
        &self,
        worker: usize,
        values: impl Iterator<Item = &'a [u8]>,
        out: &mut Vec<u64>,
    ) -> Result<u64, usize> {
        let mut p = self.inner.lock();
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
        let p = self.inner.lock();
        let mut page = Smallest::new(after, limit);
        for (r, b) in &p.bound {
            page.offer(*r, b.value.as_slice());
        }
        let (items, more) = page.finish();
        (items.into_iter().map(|(r, v)| (r, v.to_vec())).collect(), more)
    }

    /// Appends the framed values bound to `resources`.
    pub(crate) fn lookup(&self, resources: &[u64], out: &mut Vec<u8>) {
        let p = self.inner.lock();
        for r in resources {
            let v = p.bound.get(r).map(|b| b.value.as_slice()).unwrap_or(&[]);
            push_frame(out, v);
        }
    }

    /// Unbinds resources into `worker`'s share; returns surplus beyond two
    /// chunks to the free list.
    pub(crate) fn release(&self, worker: usize, resources: &[u64]) -> u64 {
        let mut p = self.inner.lock();
        let released = self.unbind_all(&mut p, resources, Some(worker));
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
        self.inner.lock().bound.get(&resource).map(|b| b.worker)
    }

    pub(crate) fn stats(&self) -> PoolStats {
        let p = self.inner.lock();
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
        let mut p = self.inner.lock();
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
        let mut p = self.inner.lock();
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
        let p = self.inner.lock();
        let mut v: Vec<(u64, Vec<u8>)> =
            p.bound.iter().filter(|(r, _)| pick(**r)).map(|(r, b)| (*r, b.value.clone())).collect();
        v.sort_unstable_by_key(|e| e.0);
        v
    }

    /// The binding of each of `resources` (`None`: free), deduplicated.
    pub(crate) fn bindings_of(&self, resources: &[u64]) -> Vec<crate::PoolChange> {
        let p = self.inner.lock();
        let mut seen = HashSet::default();
        resources.iter().filter(|r| seen.insert(**r)).map(|r| (*r, p.bound.get(r).map(|b| b.value.clone()))).collect()
    }

    /// Binds resources held by flows of another host (a block taken over):
    /// they are not handed out here until released. Returns how many the
    /// state budget had no room for, or that are outside the pool.
    pub(crate) fn import(&self, entries: &[(u64, Vec<u8>)]) -> u64 {
        let mut p = self.inner.lock();
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
        self.unbind_all(&mut self.inner.lock(), resources, None)
    }

    /// Unbinds `resources`, released by `worker` of this host (`None`: by
    /// another host). One this host hands out again goes to the worker's
    /// share, or to the free list for another host's release. Returns how
    /// many were bound here.
    fn unbind_all(&self, p: &mut PoolInner, resources: &[u64], worker: Option<usize>) -> u64 {
        let mut released = 0;
        for r in resources {
            match self.unbind(p, *r) {
                Some(mine) => {
                    if mine {
                        match worker {
                            Some(w) => p.share(w).push(*r),
                            None => p.free.push(*r),
                        }
                    }
                    released += 1;
                }
                // Released here but bound on the host that owns its block:
                // the flow moved here from there.
                None if worker.is_some() && p.split.is_some() && p.foreign.len() < MAX_FOREIGN => p.foreign.push(*r),
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
        std::mem::take(&mut self.inner.lock().foreign)
    }

    /// Takes the resources whose binding changed since the last call, each
    /// with its binding now (`None`: free); `None` when too many changed
    /// to note: then every binding is to be sent again.
    pub(crate) fn take_changed(&self) -> Option<Vec<(u64, Option<Vec<u8>>)>> {
        let mut p = self.inner.lock();
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
