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
//! at that worker, and the home is published to every other worker
//! before the rewritten packet leaves. Each worker keeps its own copy of
//! the homes ([`Homes`]: a lookup takes no lock and writes nothing another
//! core reads), takes in what was published at each receive, and hands a
//! received packet of a flow homed at another worker to that worker's
//! bounded inbox (its mbuf and ingress port); the home takes it in ahead
//! of its queues at its next batch, runs it through its chain and sends
//! it from its own queues. A direction keeps its order (one queue, one
//! path); a full inbox keeps the packet where it came in.
//!
//! Homes are published again at most every [`REFRESH`] while the flow's
//! packets are rewritten, kept alive by the replies they send on, and
//! forgotten after [`IDLE`] without either; a worker keeps at most
//! [`CAPACITY`] (refusals are counted). A host with one worker has no
//! handoff; one whose chains never translate pays a channel poll a batch.

use crossbeam_channel::{Receiver, Sender, TrySendError};
use sluice_dpdk::Mbuf;
use sluice_wire::{FlowKey, IpAddr128};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How often a flow's home is published again while it is used.
pub const REFRESH: Duration = Duration::from_secs(1);

/// Packets one worker's inbox holds.
pub const INBOX: usize = 4096;

/// Homes one worker's updates channel holds before others' publications
/// to it are refused (counted).
pub const UPDATES: usize = 1 << 16;

/// Flows homed at most, per worker (about 40 bytes each: 10 MiB): a NAT
/// homes two flows a connection (its translation, and its reply's).
pub const CAPACITY: usize = 1 << 18;

/// How long a home outlives the last packet that refreshed it: the
/// host's default flow idle timeout.
pub const IDLE: Duration = Duration::from_secs(120);

/// A packet on its way to another worker: its mbuf and the index of the
/// port it came in on.
pub struct Handed {
    pub mbuf: Mbuf,
    pub port: usize,
}

/// A published home: the flow's symmetric key hash, its worker, and the
/// addresses the translation brought in (none when it changed only
/// ports): only packets to or from those are looked up.
#[derive(Debug, Clone, Copy)]
struct Update {
    hash: u64,
    home: u16,
    addresses: [Option<IpAddr128>; 2],
}

/// What a host's workers share to hand each other packets: each worker's
/// inbox of packets and its channel of homes the others published (see
/// the module documentation). Each worker keeps its own [`Homes`], so a
/// lookup takes no lock and writes nothing another core reads.
pub struct Handoff {
    inboxes: Box<[(Sender<Handed>, Receiver<Handed>)]>,
    updates: Box<[(Sender<Update>, Receiver<Update>)]>,
    start: Instant,
    capacity: usize,
    idle_ns: u64,
    /// Homes not taken: a worker's updates channel or table was full.
    refused: AtomicU64,
}

impl std::fmt::Debug for Handoff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handoff").field("workers", &self.inboxes.len()).finish_non_exhaustive()
    }
}

impl Handoff {
    /// The inboxes and channels of `workers` workers.
    pub fn new(workers: usize) -> Handoff {
        Handoff::with_limits(workers, CAPACITY, IDLE)
    }

    /// With another capacity (flows a worker keeps homes of) and idle
    /// time.
    pub fn with_limits(workers: usize, capacity: usize, idle: Duration) -> Handoff {
        Handoff {
            inboxes: (0..workers).map(|_| crossbeam_channel::bounded(INBOX)).collect(),
            updates: (0..workers).map(|_| crossbeam_channel::bounded(UPDATES)).collect(),
            start: Instant::now(),
            capacity,
            idle_ns: u64::try_from(idle.as_nanos()).unwrap_or(u64::MAX),
            refused: AtomicU64::new(0),
        }
    }

    /// How long a home lives unused.
    pub fn idle_ns(&self) -> u64 {
        self.idle_ns
    }

    /// Homes not taken for want of room.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Nanoseconds since the handoff's start: the clock of homes.
    pub fn now_ns(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Tells every other worker that the flow `to`, which worker `me`'s
    /// chain translated from `from`, is homed at `me`. Sent before the
    /// packet that made it leaves, so no reply can come in before the
    /// others can know.
    pub fn publish(&self, me: usize, from: &FlowKey, to: &FlowKey) {
        let new = |a: IpAddr128| (a != from.src && a != from.dst).then_some(a);
        let u = Update {
            hash: to.symmetric_hash(),
            home: u16::try_from(me).unwrap_or(u16::MAX),
            addresses: [new(to.src), new(to.dst)],
        };
        for (w, (tx, _)) in self.updates.iter().enumerate() {
            if w != me && tx.try_send(u).is_err() {
                self.refused.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Hands `packet` to `worker`'s inbox; gives it back if the inbox is
    /// full (or there is no such worker).
    pub fn hand(&self, worker: usize, packet: Handed) -> Result<(), Handed> {
        let Some((tx, _)) = self.inboxes.get(worker) else { return Err(packet) };
        tx.try_send(packet).map_err(|e| match e {
            TrySendError::Full(p) | TrySendError::Disconnected(p) => p,
        })
    }

    /// Takes one packet from `worker`'s inbox, if any.
    pub fn take(&self, worker: usize) -> Option<Handed> {
        self.inboxes.get(worker)?.1.try_recv().ok()
    }

    /// Empties every inbox (at the end of a run, after the workers
    /// stopped): the packets are freed; returns how many there were.
    pub fn drain(&self) -> u64 {
        let mut n = 0;
        for (_, rx) in self.inboxes.iter() {
            while rx.try_recv().is_ok() {
                n += 1;
            }
        }
        n
    }
}

/// One worker's copy of the homes the other workers published: flow key
/// hash → (home worker, when last published or used, ns of the
/// handoff's clock).
#[derive(Debug, Default)]
pub struct Homes {
    map: HashMap<u64, (u16, u64), foldhash::fast::FixedState>,
    /// The addresses translations brought in (a NAT's public address):
    /// only a packet to or from one of them can be of a homed flow.
    addresses: Vec<IpAddr128>,
    /// Look every packet up: a translation changed only ports, or brought
    /// in more addresses than are worth comparing.
    every: bool,
    /// When a full copy last looked for idle homes to forget.
    swept_ns: u64,
}

/// Addresses compared before a lookup, at most.
const ADDRESSES: usize = 8;

impl Homes {
    /// Whether any flow is homed at another worker.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Whether a packet between `src` and `dst` may be of a homed flow
    /// (and is worth a lookup).
    #[inline]
    pub fn may_hold(&self, src: IpAddr128, dst: IpAddr128) -> bool {
        self.every || self.addresses.iter().any(|a| *a == src || *a == dst)
    }

    /// Takes in what the others published to worker `me` since the last
    /// call, as of `now_ns`.
    pub fn update(&mut self, h: &Handoff, me: usize, now_ns: u64) {
        let Some((_, rx)) = h.updates.get(me) else { return };
        while let Ok(Update { hash, home, addresses }) = rx.try_recv() {
            if addresses.iter().all(Option::is_none) {
                self.every = true;
            }
            for a in addresses.into_iter().flatten() {
                if !self.addresses.contains(&a) {
                    if self.addresses.len() < ADDRESSES {
                        self.addresses.push(a);
                    } else {
                        self.every = true;
                    }
                }
            }
            if self.map.len() >= h.capacity && !self.map.contains_key(&hash) {
                // At most once a second: a full copy costs a pass over it.
                if now_ns.saturating_sub(self.swept_ns) >= REFRESH.as_nanos() as u64 {
                    let idle = h.idle_ns;
                    self.map.retain(|_, e| now_ns.saturating_sub(e.1) < idle);
                    self.swept_ns = now_ns;
                }
                if self.map.len() >= h.capacity {
                    h.refused.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
            }
            self.map.insert(hash, (home, now_ns));
        }
    }

    /// The worker the flow whose key's symmetric hash is `hash` is homed
    /// at, if it is and has not idled out; a use keeps it alive.
    pub fn home_of(&mut self, hash: u64, now_ns: u64, idle_ns: u64) -> Option<usize> {
        let e = self.map.get_mut(&hash)?;
        if now_ns.saturating_sub(e.1) >= idle_ns {
            self.map.remove(&hash);
            return None;
        }
        e.1 = now_ns;
        Some(usize::from(e.0))
    }
}

/// A worker's memory of the flows it rewrote lately, so that a flow's
/// rewritten packets are compared with what came in, and a translated
/// flow published, about once per [`REFRESH`]: a direct-mapped table of
/// (flow key hash, when looked at, ns of the handoff's clock, whether
/// translated). Two flows in one slot are looked at more often, which is
/// harmless.
#[derive(Debug)]
pub struct Homed {
    slots: Box<[(u64, u64, bool)]>,
}

/// Slots of a worker's [`Homed`] (1.5 MiB).
const HOMED_SLOTS: usize = 1 << 16;

impl Default for Homed {
    fn default() -> Self {
        Homed { slots: vec![(0, 0, false); HOMED_SLOTS].into_boxed_slice() }
    }
}

impl Homed {
    /// Whether the rewritten flow hashing to `hash` is due for a look.
    #[inline]
    pub fn due(&self, hash: u64, now_ns: u64) -> bool {
        match self.slots.get(hash as usize % HOMED_SLOTS) {
            Some(&(h, at, _)) => h != hash || now_ns.saturating_sub(at) >= REFRESH.as_nanos() as u64,
            None => true,
        }
    }

    /// Notes the look at the flow hashing to `hash` at `now_ns`.
    pub fn looked(&mut self, hash: u64, now_ns: u64, translated: bool) {
        if let Some(slot) = self.slots.get_mut(hash as usize % HOMED_SLOTS) {
            *slot = (hash, now_ns, translated);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(src: [u8; 4], dst: [u8; 4], sp: u16, dp: u16) -> FlowKey {
        FlowKey { src: IpAddr128::from_v4(src), dst: IpAddr128::from_v4(dst), src_port: sp, dst_port: dp, protocol: 6 }
    }

    #[test]
    fn published_homes_reach_the_other_workers_are_kept_alive_by_use_and_forgotten() {
        let h = Handoff::with_limits(3, 2, Duration::from_secs(10));
        let (mut w0, mut w1) = (Homes::default(), Homes::default());
        let from = key([10, 0, 0, 5], [198, 51, 100, 7], 40000, 80);
        let to = key([203, 0, 113, 1], [198, 51, 100, 7], 2000, 80);
        h.publish(2, &from, &to);
        w0.update(&h, 0, 0);
        w1.update(&h, 1, 0);
        let hash = to.symmetric_hash();
        assert_eq!(w0.home_of(hash, 5, h.idle_ns()), Some(2));
        assert_eq!(w1.home_of(hash, 5, h.idle_ns()), Some(2));
        assert_eq!(w0.home_of(from.symmetric_hash(), 5, h.idle_ns()), None);
        // Only packets to or from the public address are looked up.
        assert!(w0.may_hold(to.dst, to.src));
        assert!(!w0.may_hold(IpAddr128::from_v4([10, 0, 0, 6]), to.dst));
        // Used at 9 s: alive past the first idle end.
        assert_eq!(w0.home_of(hash, 9_000_000_000, h.idle_ns()), Some(2));
        assert_eq!(w0.home_of(hash, 15_000_000_000, h.idle_ns()), Some(2));
        assert_eq!(w0.home_of(hash, 26_000_000_000, h.idle_ns()), None);
        assert!(w0.is_empty());
    }

    #[test]
    fn a_translation_of_ports_alone_has_every_packet_looked_up() {
        let h = Handoff::with_limits(2, 8, Duration::from_secs(10));
        let mut w0 = Homes::default();
        let from = key([10, 0, 0, 5], [10, 0, 0, 7], 40000, 80);
        h.publish(1, &from, &key([10, 0, 0, 5], [10, 0, 0, 7], 40000, 8080));
        w0.update(&h, 0, 0);
        assert!(w0.may_hold(IpAddr128::from_v4([1, 2, 3, 4]), IpAddr128::from_v4([5, 6, 7, 8])));
    }

    #[test]
    fn a_full_copy_refuses_until_homes_idle_out() {
        let h = Handoff::with_limits(2, 2, Duration::from_secs(10));
        let mut w0 = Homes::default();
        let from = key([10, 0, 0, 5], [198, 51, 100, 7], 40000, 80);
        let to = |p| key([203, 0, 113, 1], [198, 51, 100, 7], p, 80);
        for p in [1, 2, 3] {
            h.publish(1, &from, &to(p));
        }
        w0.update(&h, 0, 0);
        assert_eq!(h.refused(), 1);
        assert_eq!(w0.home_of(to(3).symmetric_hash(), 1, h.idle_ns()), None);
        // A known flow is still rehomed; a new one once the others idle out.
        h.publish(1, &from, &to(2));
        h.publish(1, &from, &to(3));
        w0.update(&h, 0, 11_000_000_000);
        assert_eq!(w0.home_of(to(3).symmetric_hash(), 11_000_000_000, h.idle_ns()), Some(1));
        assert_eq!(w0.home_of(to(1).symmetric_hash(), 11_000_000_000, h.idle_ns()), None);
    }

    #[test]
    fn a_worker_looks_at_a_flow_again_only_when_due() {
        let mut m = Homed::default();
        assert!(m.due(1, 0));
        m.looked(1, 0, true);
        assert!(!m.due(1, 500_000_000));
        assert!(m.due(1, 1_000_000_000));
        // Another flow in the same slot is due at once.
        assert!(m.due(1 + HOMED_SLOTS as u64, 500_000_000));
    }
}
