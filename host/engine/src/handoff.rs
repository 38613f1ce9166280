//! Packets handed between the workers of one host, so that a translated
//! connection's replies run where its state is.
//!
//! Workers get their packets by a symmetric hash of each packet's own
//! addresses and ports (RSS, or the kernel's fanout for `net_af_packet`),
//! which sends both directions of a connection to one worker, and with
//! them the flow state of the NFs that worker runs. An NF that translates
//! addresses or ports (a NAT, a load balancer) breaks that: a reply comes
//! to the translated addresses, which hash apart from the connection it
//! answers, and may reach a worker whose NFs have no state of it (the
//! firewall before the NAT drops it).
//!
//! So each worker notes the flows its chain rewrote into other addresses
//! or ports: the rewritten flow (both directions, normalized) is *homed*
//! at that worker in a table all workers share. A worker that receives a
//! packet of a homed flow whose home is another worker hands it over
//! (its mbuf and ingress port, through the home's bounded inbox); the
//! home takes it in with its next batch, runs it through its chain and
//! sends it from its own queues. A packet of one direction keeps its
//! order (one queue, one path); a full inbox keeps the packet where it
//! came in (counted).
//!
//! Homes are refreshed at most every [`REFRESH`] by the flow's rewritten
//! packets and by its handed replies, and forgotten after
//! [`Handoff::idle`] without either; the table holds at most
//! [`Handoff::capacity`] flows (refused registrations are counted). A
//! host with one worker, or a chain that never translates, pays nothing
//! but one atomic load a batch.

use crossbeam_channel::{Receiver, Sender, TrySendError};
use parking_lot::RwLock;
use sluice_dpdk::Mbuf;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Table shards: a lookup takes one shard's read lock.
const SHARDS: usize = 64;

/// How often a flow's home is written again while it is used.
pub const REFRESH: Duration = Duration::from_secs(1);

/// Packets one worker's inbox holds.
pub const INBOX: usize = 4096;

/// Flows homed at most (about 40 bytes each).
pub const CAPACITY: usize = 1 << 20;

/// How long a home outlives the last packet that refreshed it: the
/// host's default flow idle timeout.
pub const IDLE: Duration = Duration::from_secs(120);

#[derive(Debug, Clone, Copy)]
struct Home {
    worker: u16,
    /// When it was last refreshed, in ns since the table's start.
    at_ns: u64,
}

/// A packet on its way to another worker: its mbuf and the index of the
/// port it came in on.
pub struct Handed {
    pub mbuf: Mbuf,
    pub port: usize,
}

/// The homes of translated flows and each worker's inbox (see the module
/// documentation). Shared by a host's workers.
pub struct Handoff {
    homes: Box<[RwLock<HashMap<u64, Home, foldhash::fast::FixedState>>]>,
    entries: AtomicUsize,
    senders: Box<[Sender<Handed>]>,
    receivers: Box<[Receiver<Handed>]>,
    start: Instant,
    capacity: usize,
    idle_ns: u64,
    /// Registrations refused for a full table.
    refused: AtomicU64,
}

impl std::fmt::Debug for Handoff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handoff")
            .field("workers", &self.senders.len())
            .field("entries", &self.entries.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Handoff {
    /// The table and inboxes of `workers` workers.
    pub fn new(workers: usize) -> Handoff {
        Handoff::with_limits(workers, CAPACITY, IDLE)
    }

    /// With another capacity (flows) and idle time.
    pub fn with_limits(workers: usize, capacity: usize, idle: Duration) -> Handoff {
        let (senders, receivers): (Vec<_>, Vec<_>) = (0..workers).map(|_| crossbeam_channel::bounded(INBOX)).unzip();
        Handoff {
            homes: (0..SHARDS).map(|_| RwLock::new(HashMap::default())).collect(),
            entries: AtomicUsize::new(0),
            senders: senders.into(),
            receivers: receivers.into(),
            start: Instant::now(),
            capacity,
            idle_ns: u64::try_from(idle.as_nanos()).unwrap_or(u64::MAX),
            refused: AtomicU64::new(0),
        }
    }

    /// Flows homed now (forgotten ones included until swept).
    pub fn homed(&self) -> usize {
        self.entries.load(Ordering::Relaxed)
    }

    /// Registrations refused because the table was full.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Nanoseconds since the table's start: the clock of homes.
    pub fn now_ns(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    fn shard(&self, hash: u64) -> Option<&RwLock<HashMap<u64, Home, foldhash::fast::FixedState>>> {
        // The high bits: the map hashes the key again with its low ones.
        self.homes.get((hash >> 58) as usize % SHARDS)
    }

    /// Homes the flow whose key's symmetric hash is `hash` at `worker`,
    /// as of `now_ns`. Returns false if the table is full.
    pub fn home(&self, hash: u64, worker: usize, now_ns: u64) -> bool {
        let Some(shard) = self.shard(hash) else { return false };
        let worker = u16::try_from(worker).unwrap_or(u16::MAX);
        let mut map = shard.write();
        if let Some(h) = map.get_mut(&hash) {
            *h = Home { worker, at_ns: now_ns };
            return true;
        }
        if self.entries.load(Ordering::Relaxed) >= self.capacity {
            // Make room from this shard's forgotten homes first.
            let before = map.len();
            let idle = self.idle_ns;
            map.retain(|_, h| now_ns.saturating_sub(h.at_ns) < idle);
            self.entries.fetch_sub(before - map.len(), Ordering::Relaxed);
            if self.entries.load(Ordering::Relaxed) >= self.capacity {
                self.refused.fetch_add(1, Ordering::Relaxed);
                return false;
            }
        }
        map.insert(hash, Home { worker, at_ns: now_ns });
        self.entries.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// The worker the flow hashing to `hash` is homed at, if it is homed
    /// and not forgotten; a home used more than [`REFRESH`] after its last
    /// refresh is refreshed.
    pub fn home_of(&self, hash: u64, now_ns: u64) -> Option<usize> {
        let shard = self.shard(hash)?;
        let h = shard.read().get(&hash).copied()?;
        let age = now_ns.saturating_sub(h.at_ns);
        if age >= self.idle_ns {
            return None;
        }
        if age >= REFRESH.as_nanos() as u64
            && let Some(e) = shard.write().get_mut(&hash)
        {
            e.at_ns = now_ns;
        }
        Some(usize::from(h.worker))
    }

    /// Hands `packet` to `worker`'s inbox; gives it back if the inbox is
    /// full (or there is no such worker).
    pub fn hand(&self, worker: usize, packet: Handed) -> Result<(), Handed> {
        let Some(s) = self.senders.get(worker) else { return Err(packet) };
        s.try_send(packet).map_err(|e| match e {
            TrySendError::Full(p) | TrySendError::Disconnected(p) => p,
        })
    }

    /// Takes one packet from `worker`'s inbox, if any.
    pub fn take(&self, worker: usize) -> Option<Handed> {
        self.receivers.get(worker)?.try_recv().ok()
    }

    /// Empties every inbox (at the end of a run, after the workers
    /// stopped): the packets are freed; returns how many there were.
    pub fn drain(&self) -> u64 {
        let mut n = 0;
        for r in self.receivers.iter() {
            while r.try_recv().is_ok() {
                n += 1;
            }
        }
        n
    }
}

/// A worker's memory of the flows it homed or found untranslated, so
/// that the rewritten packets of a flow reach the shared table about once
/// per [`REFRESH`]: rewritten key hash → (when it was last looked at, ns
/// of the table's clock; whether it is translated).
#[derive(Debug, Default)]
pub struct Homed {
    seen: HashMap<u64, (u64, bool), foldhash::fast::FixedState>,
}

/// Flows a worker remembers before it starts over.
const REMEMBERED: usize = 1 << 16;

impl Homed {
    /// Whether a rewritten packet of the flow hashing to `hash` needs a
    /// look (its original and new keys compared, the home written):
    /// never seen, or seen more than [`REFRESH`] ago and translated.
    pub fn needs_look(&self, hash: u64, now_ns: u64) -> bool {
        match self.seen.get(&hash) {
            None => true,
            Some(&(at, translated)) => translated && now_ns.saturating_sub(at) >= REFRESH.as_nanos() as u64,
        }
    }

    /// Notes the look at the flow hashing to `hash`.
    pub fn looked(&mut self, hash: u64, now_ns: u64, translated: bool) {
        if self.seen.len() >= REMEMBERED {
            self.seen.clear();
        }
        self.seen.insert(hash, (now_ns, translated));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn homes_are_found_refreshed_and_forgotten() {
        let h = Handoff::with_limits(2, 2, Duration::from_secs(10));
        assert!(h.home(7, 1, 0));
        assert_eq!(h.home_of(7, 5), Some(1));
        assert_eq!(h.home_of(8, 5), None);
        // Refreshed by use after a second: alive past the first idle end.
        assert_eq!(h.home_of(7, 9_000_000_000), Some(1));
        assert_eq!(h.home_of(7, 15_000_000_000), Some(1));
        assert_eq!(h.home_of(7, 26_000_000_000), None);
    }

    #[test]
    fn a_full_table_refuses_until_homes_idle_out() {
        let h = Handoff::with_limits(2, 2, Duration::from_secs(10));
        // Same shard (high bits equal), different keys.
        assert!(h.home(1, 0, 0));
        assert!(h.home(2, 0, 0));
        assert!(!h.home(3, 0, 1));
        assert_eq!(h.refused(), 1);
        // A known flow is still rehomed.
        assert!(h.home(2, 1, 1));
        assert!(h.home(3, 0, 11_000_000_000));
        assert_eq!(h.homed(), 1);
    }

    #[test]
    fn a_worker_looks_at_a_flow_again_only_when_translated_and_due() {
        let mut m = Homed::default();
        assert!(m.needs_look(1, 0));
        m.looked(1, 0, false);
        assert!(!m.needs_look(1, 10_000_000_000));
        m.looked(2, 0, true);
        assert!(!m.needs_look(2, 500_000_000));
        assert!(m.needs_look(2, 1_000_000_000));
    }
}
