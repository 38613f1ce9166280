//! Release pools split between the hosts of a group.
//!
//! A release pool (a NAT's public ports) holds each resource for one flow
//! at a time on the whole group. The group splits it by blocks placed like
//! flows ([`sluice_group::blocks`]): a host hands out only the resources of
//! the blocks it owns in the ownership table, and the dispatcher sends a
//! packet for a pooled resource (a reply to a public port) to the block's
//! owner. When the table changes ([`Peer::pool_tick`], every
//! [`GLOBAL_EVERY`](crate::GLOBAL_EVERY)):
//!
//! - a block this host loses stops being handed out here at once; the
//!   bindings it holds in it go to the block's new owner
//!   ([`BindingsKind::Handover`]), last the list of blocks handed over;
//! - a block it gains from a host still in the group is handed out only
//!   once that host's handover came (or after [`HANDOVER_WAIT`]), so a
//!   resource is never bound twice; one gained from a host that is gone is
//!   handed out at once, with the bindings that host had replicated here;
//! - every replication interval (at most every tick), bindings that
//!   changed go to each block's next owner ([`BindingsKind::Replica`]);
//!   with output commit, those a lane's batch changed went already, before
//!   its packets left ([`crate::commit`]); and a flow that moved here and released
//!   a resource bound on its block's owner has that owner told
//!   ([`PeerMessage::Released`]).

use super::{Outgoing, Peer};
use crate::HashMap;
use crate::counters::PoolCounters;
use crate::wire::{self, BindingsKind, PeerMessage, PoolBindings, PoolRelease};
use sluice_group::{OwnershipTable, POOL_BLOCK, block_of};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// How long a gained block waits for its previous owner's handover.
pub const HANDOVER_WAIT: Duration = Duration::from_millis(500);
/// Replicated bindings kept at most (all pools together).
pub const MAX_REPLICAS: usize = 1 << 20;
/// How long a handover that came before this host saw the table that
/// gives it the blocks is remembered.
const EARLY: Duration = Duration::from_secs(5);

/// (deployment, NF, pool).
type PoolKey = (String, String, String);
/// (resource, its binding; `None`: free).
type Entry = (u64, Option<Vec<u8>>);

/// One pool's split on this host.
#[derive(Debug, Default)]
struct Split {
    /// The table it was split by.
    table: Option<Arc<OwnershipTable>>,
    /// Gained blocks waiting for their previous owner's handover, until when.
    pending: HashMap<u64, Instant>,
    /// Blocks handed over to this host, and when (a handover can come
    /// before the table that gives them).
    arrived: HashMap<u64, Instant>,
    /// Bindings other hosts replicated here: resource → binding.
    replicas: HashMap<u64, Vec<u8>>,
    /// Split again at the next tick.
    dirty: bool,
}

/// The split pools of a host.
#[derive(Debug, Default)]
pub(crate) struct Pools {
    splits: parking_lot::Mutex<HashMap<PoolKey, Split>>,
    /// When changed bindings were last replicated.
    replicated: parking_lot::Mutex<Option<Instant>>,
}

/// Counters of the split pools.
#[derive(Debug, Default)]
pub(crate) struct PoolCounts {
    pub handed_over: std::sync::atomic::AtomicU64,
    pub taken_over: std::sync::atomic::AtomicU64,
    pub replicas_imported: std::sync::atomic::AtomicU64,
    pub released_remote: std::sync::atomic::AtomicU64,
    pub refused: std::sync::atomic::AtomicU64,
    pub handover_waits_timed_out: std::sync::atomic::AtomicU64,
}

impl PoolCounts {
    pub(crate) fn snapshot(&self) -> PoolCounters {
        let l = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        PoolCounters {
            handed_over: l(&self.handed_over),
            taken_over: l(&self.taken_over),
            replicas_imported: l(&self.replicas_imported),
            released_remote: l(&self.released_remote),
            refused: l(&self.refused),
            handover_waits_timed_out: l(&self.handover_waits_timed_out),
        }
    }
}

/// The blocks of `first..end`.
fn blocks(first: u64, end: u64) -> impl Iterator<Item = u64> {
    block_of(first)..=block_of(end.saturating_sub(1).max(first))
}

impl Peer {
    fn pool_domains(&self) -> Vec<(PoolKey, Arc<sluice_state::Domain>)> {
        let d = self.domains.lock();
        let mut out = Vec::new();
        for (dep, r) in d.iter() {
            for (nf, dom) in &r.nfs {
                for pool in dom.pools() {
                    out.push(((dep.clone(), nf.clone(), pool), dom.clone()));
                }
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    fn domain_of(&self, deployment: &str, nf: &str) -> Option<Arc<sluice_state::Domain>> {
        let d = self.domains.lock();
        d.get(deployment).and_then(|r| r.nfs.iter().find(|(n, _)| n == nf).map(|(_, dom)| dom.clone()))
    }

    pub(crate) fn post(&self, to: &str, m: &PeerMessage) {
        if let Ok(body) = m.encode() {
            let _ = self.outbox.send(Outgoing { to: to.to_string(), body, flows: 0 });
        }
    }

    /// Splits the release pools of the registered deployments by the
    /// table (see the module docs): hands over lost blocks, waits for
    /// gained ones, replicates changed bindings and sends releases on.
    /// Call every [`GLOBAL_EVERY`](crate::GLOBAL_EVERY) and after a
    /// deployment is registered (its pools hand out nothing until then).
    pub fn pool_tick(&self, now: Instant) {
        let table = self.table();
        // Changed bindings are replicated on the host's replication
        // interval, as flows are (at most every tick).
        let replicate = {
            let mut last = self.pools.replicated.lock();
            let due = last.is_none_or(|l| now.saturating_duration_since(l) >= self.interval);
            if due {
                *last = Some(now);
            }
            due
        };
        let mut splits = self.pools.splits.lock();
        let domains = self.pool_domains();
        splits.retain(|k, _| domains.iter().any(|(d, _)| d == k));
        for (key, dom) in domains {
            let (_, _, pool) = &key;
            let Some((first, end)) = dom.pool_range(pool) else { continue };
            let split = splits.entry(key.clone()).or_default();
            let Some(table) = table.clone() else {
                // No table yet: nothing is this host's to hand out.
                if split.table.is_none() {
                    dom.split_pool(pool, POOL_BLOCK, &|_| false);
                }
                continue;
            };
            let me = self.me.as_str();
            let changed = split.table.as_ref().is_none_or(|t| t.version() != table.version());
            if changed {
                let old = split.table.replace(table.clone());
                self.pool_table_changed(&key, &dom, split, old.as_deref(), &table, (first, end), now);
            }
            let before = split.pending.len();
            split.pending.retain(|_, until| now < *until);
            let timed_out = before - split.pending.len();
            if timed_out > 0 {
                self.pools_counts.handover_waits_timed_out.fetch_add(timed_out as u64, Ordering::Relaxed);
                split.dirty = true;
            }
            split.arrived.retain(|_, at| now.saturating_duration_since(*at) < EARLY);
            if std::mem::take(&mut split.dirty) || changed {
                let pending = &split.pending;
                dom.split_pool(pool, POOL_BLOCK, &|r| {
                    let b = block_of(r);
                    table.block_owner(b) == Some(me) && !pending.contains_key(&b)
                });
            }
            self.pool_send_changes(&key, &dom, &table, replicate);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn pool_table_changed(
        &self,
        key: &PoolKey,
        dom: &sluice_state::Domain,
        split: &mut Split,
        old: Option<&OwnershipTable>,
        table: &OwnershipTable,
        (first, end): (u64, u64),
        now: Instant,
    ) {
        let pool = &key.2;
        let me = self.me.as_str();
        let mine = |t: &OwnershipTable, b: u64| t.block_owner(b) == Some(me);
        let present = |h: &str| table.members().iter().any(|m| m.host == h) || table.finishing().iter().any(|f| f == h);
        // Nothing more is handed out in the blocks lost: split first, then
        // take their bindings, so none is bound after the handover.
        let pending = &split.pending;
        dom.split_pool(pool, POOL_BLOCK, &|r| mine(table, block_of(r)) && !pending.contains_key(&block_of(r)));
        let gone = dom.pool_take_bindings(pool, &|r| mine(table, block_of(r)));
        let mut out: HashMap<String, (Vec<u64>, Vec<Entry>)> = HashMap::default();
        for (r, v) in gone {
            if let Some(to) = table.block_owner(block_of(r)) {
                out.entry(to.to_string()).or_default().1.push((r, Some(v)));
            }
        }
        for b in blocks(first, end) {
            let was = old.and_then(|o| o.block_owner(b));
            let now_owner = table.block_owner(b);
            if was == Some(me) && now_owner != Some(me) {
                if let Some(to) = now_owner {
                    out.entry(to.to_string()).or_default().0.push(b);
                }
            } else if was != Some(me) && now_owner == Some(me) {
                let early = split.arrived.remove(&b).is_some();
                match was {
                    // Its owner is still here: its handover comes.
                    Some(prev) if present(prev) && !early => {
                        split.pending.insert(b, now + HANDOVER_WAIT);
                    }
                    // Its owner is gone: what it replicated here is all
                    // there is.
                    Some(_) if !early => self.take_replicas(dom, pool, split, b),
                    // No table before: the others hand over what they had.
                    None if table.members().len() > 1 && !early => {
                        split.pending.insert(b, now + HANDOVER_WAIT);
                    }
                    _ => {}
                }
            }
        }
        for (to, (lost, entries)) in out {
            self.pools_counts.handed_over.fetch_add(entries.len() as u64, Ordering::Relaxed);
            // Bindings first, then the blocks: the receiver hands out a
            // block's free resources only once its bindings are in.
            for chunk in entries.chunks(wire::MAX_BINDINGS) {
                self.post(
                    &to,
                    &PeerMessage::Bindings(bindings(key, BindingsKind::Handover, Vec::new(), chunk.to_vec())),
                );
            }
            for chunk in lost.chunks(wire::MAX_BLOCKS) {
                self.post(
                    &to,
                    &PeerMessage::Bindings(bindings(key, BindingsKind::Handover, chunk.to_vec(), Vec::new())),
                );
            }
        }
        // The next owners of this host's blocks may have changed: each gets
        // every binding of the blocks it would take over.
        let all = dom.pool_bindings_where(pool, &|r| mine(table, block_of(r)));
        self.send_replicas(key, table, all.into_iter().map(|(r, v)| (r, Some(v))).collect());
    }

    fn take_replicas(&self, dom: &sluice_state::Domain, pool: &str, split: &mut Split, b: u64) {
        let entries: Vec<(u64, Vec<u8>)> =
            split.replicas.iter().filter(|(r, _)| block_of(**r) == b).map(|(r, v)| (*r, v.clone())).collect();
        split.replicas.retain(|r, _| block_of(*r) != b);
        if entries.is_empty() {
            return;
        }
        let refused = dom.pool_import(pool, &entries);
        let c = &self.pools_counts;
        c.replicas_imported.fetch_add(entries.len() as u64 - refused, Ordering::Relaxed);
        c.refused.fetch_add(refused, Ordering::Relaxed);
    }

    fn send_replicas(&self, key: &PoolKey, table: &OwnershipTable, changes: Vec<Entry>) {
        let me = self.me.as_str();
        let mut out: HashMap<String, Vec<Entry>> = HashMap::default();
        for (r, v) in changes {
            let mut prefs = table.block_preferences(block_of(r));
            if prefs.next() != Some(me) {
                continue;
            }
            if let Some(next) = prefs.next() {
                out.entry(next.to_string()).or_default().push((r, v));
            }
        }
        for (to, entries) in out {
            for chunk in entries.chunks(wire::MAX_BINDINGS) {
                self.post(
                    &to,
                    &PeerMessage::Bindings(bindings(key, BindingsKind::Replica, Vec::new(), chunk.to_vec())),
                );
            }
        }
    }

    fn pool_send_changes(&self, key: &PoolKey, dom: &sluice_state::Domain, table: &OwnershipTable, replicate: bool) {
        let (deployment, nf, pool) = key;
        let me = self.me.as_str();
        if replicate {
            let changes = match dom.pool_take_changed(pool) {
                Some(c) => c,
                None => dom
                    .pool_bindings_where(pool, &|r| table.block_owner(block_of(r)) == Some(me))
                    .into_iter()
                    .map(|(r, v)| (r, Some(v)))
                    .collect(),
            };
            if !changes.is_empty() {
                self.send_replicas(key, table, changes);
            }
        }
        let foreign = dom.pool_take_foreign(pool);
        let mut out: HashMap<String, Vec<u64>> = HashMap::default();
        let mut here = Vec::new();
        for r in foreign {
            match table.block_owner(block_of(r)) {
                Some(h) if h == me => here.push(r),
                Some(h) => out.entry(h.to_string()).or_default().push(r),
                None => {}
            }
        }
        if !here.is_empty() {
            dom.pool_release_remote(pool, &here);
        }
        for (to, resources) in out {
            for chunk in resources.chunks(wire::MAX_BINDINGS) {
                let m = PeerMessage::Released(PoolRelease {
                    deployment: deployment.clone(),
                    nf: nf.clone(),
                    pool: pool.clone(),
                    resources: chunk.to_vec(),
                });
                self.post(&to, &m);
            }
        }
    }

    /// Takes another host's bindings of a split pool; returns how many
    /// were refused (no such deployment here, or no room).
    pub(crate) fn take_bindings(&self, b: PoolBindings, now: Instant) -> u64 {
        let c = &self.pools_counts;
        let Some(dom) = self.domain_of(&b.deployment, &b.nf) else {
            c.refused.fetch_add(b.entries.len() as u64, Ordering::Relaxed);
            return b.entries.len() as u64;
        };
        let key = (b.deployment.clone(), b.nf.clone(), b.pool.clone());
        let mut splits = self.pools.splits.lock();
        let total: usize = splits.values().map(|s| s.replicas.len()).sum();
        let split = splits.entry(key).or_default();
        match b.kind {
            BindingsKind::Handover => {
                let entries: Vec<(u64, Vec<u8>)> = b.entries.into_iter().filter_map(|(r, v)| Some((r, v?))).collect();
                let refused = dom.pool_import(&b.pool, &entries);
                c.taken_over.fetch_add(entries.len() as u64 - refused, Ordering::Relaxed);
                c.refused.fetch_add(refused, Ordering::Relaxed);
                for block in b.blocks {
                    split.replicas.retain(|r, _| block_of(*r) != block);
                    if split.pending.remove(&block).is_none() && split.arrived.len() < wire::MAX_BLOCKS {
                        split.arrived.insert(block, now);
                    }
                    split.dirty = true;
                }
                refused
            }
            BindingsKind::Replica => {
                let mut refused = 0;
                for (r, v) in b.entries {
                    match v {
                        Some(v) if total < MAX_REPLICAS || split.replicas.contains_key(&r) => {
                            split.replicas.insert(r, v);
                        }
                        Some(_) => refused += 1,
                        None => {
                            split.replicas.remove(&r);
                        }
                    }
                }
                c.refused.fetch_add(refused, Ordering::Relaxed);
                refused
            }
        }
    }

    /// Takes another host's releases of resources bound here.
    pub(crate) fn take_released(&self, r: PoolRelease) {
        let Some(dom) = self.domain_of(&r.deployment, &r.nf) else { return };
        let n = dom.pool_release_remote(&r.pool, &r.resources);
        self.pools_counts.released_remote.fetch_add(n, Ordering::Relaxed);
    }
}

fn bindings(key: &PoolKey, kind: BindingsKind, blocks: Vec<u64>, entries: Vec<Entry>) -> PoolBindings {
    PoolBindings { deployment: key.0.clone(), nf: key.1.clone(), pool: key.2.clone(), kind, blocks, entries }
}
