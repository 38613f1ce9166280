//! The replicas a host keeps for its peers: flows whose owner named this
//! host as the one that would take them next. Nothing here runs NF code;
//! a replica waits until its flow arrives at this host (it is then taken
//! and imported, see [`crate::LanePeer`]) or until it is not refreshed
//! for the replica lifetime.
//!
//! Bounded in flows and bytes for the whole host: a replica past either
//! bound is refused and counted, never an allocation without end.

use crate::wire::{NfPart, PeerBatch};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use sluice_wire::FlowKey;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// What holding one replica costs besides its values: key, sender name,
/// time, map slot.
pub const REPLICA_OVERHEAD: usize = 128;

/// One flow's state as its owner last sent it.
#[derive(Debug, Clone)]
pub struct Replica {
    /// The host that sent it.
    pub from: String,
    /// When it arrived.
    pub at: Instant,
    /// Its state per NF.
    pub nfs: Vec<NfPart>,
    /// Its offload entries on its owner, as last sent.
    pub offload: Vec<crate::wire::OffloadPart>,
    bytes: usize,
}

/// The counts of a store, for the host report.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreCounters {
    /// Messages read.
    pub batches_received: u64,
    /// Messages refused (malformed, over a bound), each logged with why.
    pub batches_refused: u64,
    /// Flows received (replicas stored or refreshed).
    pub flows_received: u64,
    /// Flows refused because the store was at its flow or byte bound.
    pub flows_refused_full: u64,
    /// Replicas forgotten because their owner said the flow ended.
    pub flows_ended: u64,
    /// Replicas dropped after the replica lifetime without a refresh.
    pub replicas_expired: u64,
    /// Replicas taken because their flow arrived here.
    pub replicas_taken: u64,
    /// Replicas held now.
    pub replicas_held: u64,
    /// Bytes they hold (values plus [`REPLICA_OVERHEAD`] each).
    pub bytes_held: u64,
}

#[derive(Debug, Default)]
struct Inner {
    deployments: HashMap<String, HashMap<FlowKey, Replica>>,
    bytes: usize,
    counters: StoreCounters,
}

/// The replicas of one host, for all its deployments.
#[derive(Debug)]
pub struct PeerStore {
    inner: Mutex<Inner>,
    held: AtomicUsize,
    /// Counts up with every message taken in (see [`Self::arrivals`]).
    arrivals: AtomicU64,
    max_flows: usize,
    max_bytes: usize,
    lifetime: Duration,
}

impl PeerStore {
    /// A store of at most `max_flows` replicas and `max_bytes` bytes,
    /// each kept `lifetime` after its last refresh.
    pub fn new(max_flows: usize, max_bytes: usize, lifetime: Duration) -> Self {
        PeerStore {
            inner: Mutex::new(Inner::default()),
            held: AtomicUsize::new(0),
            arrivals: AtomicU64::new(0),
            max_flows,
            max_bytes,
            lifetime,
        }
    }

    /// Replicas held now (a read without the lock: workers skip the store
    /// while it is empty).
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// A number that changes whenever a message of flows was taken in: a
    /// worker waiting for flows looks again only when it changed.
    pub fn arrivals(&self) -> u64 {
        self.arrivals.load(Ordering::Acquire)
    }

    /// Whether a replica of this (normalized) flow of `deployment` is held.
    pub fn holds(&self, deployment: &str, key: &FlowKey) -> bool {
        self.held() > 0 && self.inner.lock().deployments.get(deployment).is_some_and(|m| m.contains_key(key))
    }

    /// Counts a message that could not be read.
    pub fn refused(&self) {
        let mut g = self.inner.lock();
        g.counters.batches_received += 1;
        g.counters.batches_refused += 1;
    }

    /// Keeps the flows of a message from host `from`. A flow without NF
    /// parts or offload entries ended on its owner: its replica is
    /// forgotten. Per NF, a part older (by logical clock) than the one held
    /// is ignored; offload entries are those of the newest message. Returns how
    /// many flows it refused (the store full).
    pub fn insert(&self, from: &str, batch: PeerBatch, now: Instant) -> usize {
        let mut refused = 0;
        let mut g = self.inner.lock();
        // Counted while the lock is held: a worker that sees the new count
        // and then locks finds the flows.
        self.arrivals.fetch_add(1, Ordering::Release);
        let inner = &mut *g;
        inner.counters.batches_received += 1;
        let map = inner.deployments.entry(batch.deployment).or_default();
        for f in batch.flows {
            let Some(key) = FlowKey::from_bytes(&f.key) else { continue };
            if f.nfs.is_empty() && f.offload.is_empty() {
                if let Some(old) = map.remove(&key) {
                    inner.bytes = inner.bytes.saturating_sub(old.bytes);
                    inner.counters.flows_ended += 1;
                    self.held.fetch_sub(1, Ordering::Relaxed);
                }
                continue;
            }
            inner.counters.flows_received += 1;
            let mut nfs = f.nfs;
            let old = map.remove(&key);
            if let Some(old) = &old {
                inner.bytes = inner.bytes.saturating_sub(old.bytes);
                for part in &mut nfs {
                    if let Some(held) = old.nfs.iter().find(|p| p.nf == part.nf)
                        && clock(held) > clock(part)
                    {
                        part.clone_from(held);
                    }
                }
            }
            let offload = f.offload;
            let bytes = REPLICA_OVERHEAD
                + nfs.iter().map(NfPart::bytes).sum::<usize>()
                + offload.iter().map(crate::wire::OffloadPart::bytes).sum::<usize>();
            let count = self.held.load(Ordering::Relaxed).saturating_sub(usize::from(old.is_some()));
            if count >= self.max_flows || inner.bytes + bytes > self.max_bytes {
                inner.counters.flows_refused_full += 1;
                refused += 1;
                if old.is_some() {
                    self.held.fetch_sub(1, Ordering::Relaxed);
                }
                continue;
            }
            if old.is_none() {
                self.held.fetch_add(1, Ordering::Relaxed);
            }
            inner.bytes += bytes;
            map.insert(key, Replica { from: from.to_string(), at: now, nfs, offload, bytes });
        }
        refused
    }

    /// Takes the replicas of `keys` (normalized) of a deployment: their
    /// flows arrived here. Appends them to `out`.
    pub fn take(&self, deployment: &str, keys: &[FlowKey], out: &mut Vec<(FlowKey, Replica)>) {
        let mut g = self.inner.lock();
        let inner = &mut *g;
        let Some(map) = inner.deployments.get_mut(deployment) else { return };
        for k in keys {
            if let Some(r) = map.remove(k) {
                inner.bytes = inner.bytes.saturating_sub(r.bytes);
                inner.counters.replicas_taken += 1;
                self.held.fetch_sub(1, Ordering::Relaxed);
                out.push((*k, r));
            }
        }
    }

    /// Drops replicas not refreshed within the lifetime, and deployments
    /// left without any.
    pub fn expire(&self, now: Instant) {
        let mut g = self.inner.lock();
        let inner = &mut *g;
        let mut dropped = 0usize;
        let mut freed = 0usize;
        for map in inner.deployments.values_mut() {
            map.retain(|_, r| {
                let keep = now.saturating_duration_since(r.at) < self.lifetime;
                if !keep {
                    dropped += 1;
                    freed += r.bytes;
                }
                keep
            });
        }
        inner.deployments.retain(|_, m| !m.is_empty());
        inner.bytes = inner.bytes.saturating_sub(freed);
        inner.counters.replicas_expired += dropped as u64;
        self.held.fetch_sub(dropped, Ordering::Relaxed);
    }

    /// Forgets a deployment's replicas (it was removed).
    pub fn remove_deployment(&self, deployment: &str) {
        let mut g = self.inner.lock();
        if let Some(map) = g.deployments.remove(deployment) {
            let freed: usize = map.values().map(|r| r.bytes).sum();
            g.bytes = g.bytes.saturating_sub(freed);
            self.held.fetch_sub(map.len(), Ordering::Relaxed);
        }
    }

    /// Its counts now.
    pub fn counters(&self) -> StoreCounters {
        let g = self.inner.lock();
        let mut c = g.counters.clone();
        c.replicas_held = self.held() as u64;
        c.bytes_held = g.bytes as u64;
        c
    }
}

/// The newest clock in a part (flow state first, else its tables').
fn clock(p: &NfPart) -> u64 {
    let tables = p.tables.iter().map(|t| t.clock).max().unwrap_or(0);
    p.state.as_ref().map_or(tables, |s| s.clock.max(tables))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;
    use crate::wire::{PeerFlow, StatePart};

    fn key(n: u16) -> FlowKey {
        FlowKey { src_port: n, dst_port: 80, protocol: 6, ..FlowKey::default() }
    }

    fn flow(n: u16, clock: u64, len: usize) -> PeerFlow {
        PeerFlow {
            key: key(n).to_bytes().to_vec(),
            nfs: vec![NfPart {
                nf: "fw".into(),
                state: Some(StatePart { value: vec![clock as u8; len], clock, last_seen_ns: 0 }),
                tables: vec![],
            }],
            offload: vec![],
        }
    }

    fn batch(flows: Vec<PeerFlow>) -> PeerBatch {
        PeerBatch { deployment: "d".into(), table_version: 1, flows }
    }

    #[test]
    fn replicas_are_taken_once_and_older_parts_never_replace_newer() {
        let s = PeerStore::new(100, 1 << 20, Duration::from_secs(60));
        let now = Instant::now();
        s.insert("h1", batch(vec![flow(1, 5, 1), flow(2, 1, 1)]), now);
        s.insert("h1", batch(vec![flow(1, 3, 1)]), now);
        assert_eq!(s.held(), 2);
        let mut out = Vec::new();
        s.take("d", &[key(1), key(9)], &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].1.nfs[0].state.as_ref().unwrap().clock, 5);
        s.take("d", &[key(1)], &mut out);
        assert_eq!(out.len(), 1);
        s.take("other", &[key(2)], &mut out);
        assert_eq!((out.len(), s.held()), (1, 1));
    }

    #[test]
    fn bounds_hold_and_ended_flows_are_forgotten() {
        let s = PeerStore::new(2, 1 << 20, Duration::from_secs(60));
        let now = Instant::now();
        s.insert("h1", batch(vec![flow(1, 1, 1), flow(2, 1, 1), flow(3, 1, 1)]), now);
        assert_eq!((s.held(), s.counters().flows_refused_full), (2, 1));
        s.insert("h1", batch(vec![PeerFlow { key: key(1).to_bytes().to_vec(), nfs: vec![], offload: vec![] }]), now);
        assert_eq!((s.held(), s.counters().flows_ended), (1, 1));
        let b = PeerStore::new(100, 2 * REPLICA_OVERHEAD + 100, Duration::from_secs(60));
        b.insert("h1", batch(vec![flow(1, 1, 60), flow(2, 1, 60)]), now);
        assert_eq!(b.held(), 1);
        assert!(b.counters().bytes_held <= (2 * REPLICA_OVERHEAD + 100) as u64);
    }

    #[test]
    fn unrefreshed_replicas_expire() {
        let s = PeerStore::new(100, 1 << 20, Duration::from_secs(1));
        let t0 = Instant::now();
        s.insert("h1", batch(vec![flow(1, 1, 1)]), t0);
        s.insert("h1", batch(vec![flow(2, 1, 1)]), t0 + Duration::from_millis(900));
        s.expire(t0 + Duration::from_millis(1500));
        let c = s.counters();
        assert_eq!((s.held(), c.replicas_expired, c.bytes_held), (1, 1, (REPLICA_OVERHEAD + 1) as u64));
        s.remove_deployment("d");
        assert_eq!((s.held(), s.counters().bytes_held), (0, 0));
    }
}
