//! How each kind of table keeps its entries on one worker ([`Store`]):
//! local maps for per-flow and global tables, a handle on the domain's
//! view for shared ones.

use crate::HashMap;
use crate::domain::Domain;
use crate::entry::{ENTRY_OVERHEAD, add_delta, stale};
use crate::error::StateError;
use crate::eventual::{EventualShared, Pending};
use crate::pool::Pool;
use crate::single::SingleStore;
use crate::spec::{Consistency, Kind, Scope, TableSpec};
use sluice_wire::FlowKey;
use std::hash::Hash;
use std::sync::Arc;

/// An entry of a local table.
#[derive(Debug, Clone)]
pub(super) struct Slot<V> {
    pub(super) value: V,
    /// Packet time of the last use.
    pub(super) last_ns: u64,
    /// Updates so far: the entry's logical clock.
    pub(super) clock: u64,
}

/// The entries of one table on one worker.
#[derive(Debug)]
pub(super) enum Store {
    Counters(HashMap<u64, Slot<u64>>),
    FlowCounters(HashMap<FlowKey, Slot<u64>>),
    Bytes(HashMap<Box<[u8]>, Slot<Vec<u8>>>),
    FlowBytes(HashMap<FlowKey, Slot<Vec<u8>>>),
    Eventual { pending: HashMap<u64, Pending>, shared: Arc<EventualShared>, last_merge_ns: u64 },
    Pool(Arc<Pool>),
    Single(SingleStore),
}

impl Store {
    pub(super) fn new(spec: &TableSpec, domain: &Domain, worker: usize) -> Store {
        match (spec.scope, spec.kind, spec.consistency) {
            (_, _, Consistency::SingleWriter { sync_interval_ns }) => {
                Store::Single(SingleStore::new(domain.single(spec, sync_interval_ns), worker))
            }
            (_, _, Consistency::Eventual { merge, .. }) => {
                Store::Eventual { pending: HashMap::default(), shared: domain.eventual(spec, merge), last_merge_ns: 0 }
            }
            (_, _, Consistency::Release { first, count, chunk }) => Store::Pool(domain.pool(spec, first, count, chunk)),
            (Scope::PerFlow, Kind::Counter, _) => Store::FlowCounters(HashMap::default()),
            (Scope::PerFlow, Kind::Bytes, _) => Store::FlowBytes(HashMap::default()),
            (Scope::Global, Kind::Counter, _) => Store::Counters(HashMap::default()),
            (Scope::Global, Kind::Bytes, _) => Store::Bytes(HashMap::default()),
        }
    }

    /// Whether the store is the domain's, shared by its workers.
    pub(super) fn is_shared(&self) -> bool {
        matches!(self, Store::Eventual { .. } | Store::Single(_) | Store::Pool(_))
    }

    pub(super) fn len(&self) -> usize {
        match self {
            Store::Counters(m) => m.len(),
            Store::FlowCounters(m) => m.len(),
            Store::Bytes(m) => m.len(),
            Store::FlowBytes(m) => m.len(),
            Store::Eventual { shared, .. } => shared.len(),
            Store::Single(s) => s.len(),
            Store::Pool(_) => 0,
        }
    }

    /// Bytes charged to the budget.
    pub(super) fn cost(&self) -> usize {
        match self {
            Store::Counters(m) => m.len() * (16 + ENTRY_OVERHEAD),
            Store::FlowCounters(m) => m.len() * (FlowKey::ENCODED_LEN + 8 + ENTRY_OVERHEAD),
            Store::Bytes(m) => m.iter().map(|(k, v)| k.len() + v.value.len() + ENTRY_OVERHEAD).sum(),
            Store::FlowBytes(m) => m.values().map(|v| FlowKey::ENCODED_LEN + v.value.len() + ENTRY_OVERHEAD).sum(),
            // Charged to the domain's shared account.
            Store::Eventual { .. } | Store::Pool(_) | Store::Single(_) => 0,
        }
    }

    pub(super) fn clear(&mut self) {
        match self {
            Store::Counters(m) => m.clear(),
            Store::FlowCounters(m) => m.clear(),
            Store::Bytes(m) => m.clear(),
            Store::FlowBytes(m) => m.clear(),
            Store::Eventual { pending, shared, .. } => shared.forget(pending),
            Store::Pool(_) | Store::Single(_) => {}
        }
    }
}

/// Appends the live value of each key (0 if absent or idle), marking the
/// entries read.
pub(super) fn read_counters<K: Hash + Eq>(
    m: &mut HashMap<K, Slot<u64>>,
    keys: &[K],
    now: u64,
    timeout: u64,
    out: &mut Vec<u64>,
) {
    for k in keys {
        out.push(match m.get_mut(k) {
            Some(s) if !stale(s.last_ns, now, timeout) => {
                s.last_ns = now;
                s.value
            }
            _ => 0,
        });
    }
}

/// A copy of a local store (read-only tables are small: configuration).
pub(super) fn clone_local(store: &Store, spec: &TableSpec, domain: &Domain) -> Store {
    match store {
        Store::Counters(m) => Store::Counters(m.clone()),
        Store::FlowCounters(m) => Store::FlowCounters(m.clone()),
        Store::Bytes(m) => Store::Bytes(m.clone()),
        Store::FlowBytes(m) => Store::FlowBytes(m.clone()),
        Store::Eventual { .. } | Store::Pool(_) | Store::Single(_) => Store::new(spec, domain, usize::MAX),
    }
}

/// `counter-add` on a local counter table: adds each delta to its key's
/// counter. An idle entry starts over from 0; an entry's clock goes on
/// counting its updates. A new entry (clock 1) is charged first with
/// `charge(entries, item)`, and the first refusal stops the call (earlier
/// items stay written).
pub(super) fn add_counters<K: Hash + Eq + Copy>(
    m: &mut HashMap<K, Slot<u64>>,
    keys: &[K],
    deltas: &[i64],
    now: u64,
    timeout: u64,
    mut charge: impl FnMut(usize, usize) -> Result<(), StateError>,
) -> Result<(), StateError> {
    for (i, (k, d)) in keys.iter().zip(deltas).enumerate() {
        match m.get_mut(k) {
            Some(s) if !stale(s.last_ns, now, timeout) => {
                s.value = add_delta(s.value, *d);
                s.last_ns = now;
                s.clock += 1;
            }
            existing => {
                let clock = existing.map_or(0, |s| s.clock) + 1;
                if clock == 1 {
                    charge(m.len(), i)?;
                }
                m.insert(*k, Slot { value: add_delta(0, *d), last_ns: now, clock });
            }
        }
    }
    Ok(())
}
