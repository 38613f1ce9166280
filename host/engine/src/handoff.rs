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
//! [`CAPACITY`], shared fairly by the homes' owners (the tenants whose
//! lanes translated them: an equal share each when full, at most
//! [`OWNER_ADDRESSES`] brought-in addresses each; refusals are counted).
//! A host with one worker has no handoff; one whose chains never
//! translate pays a channel poll a batch.

use crossbeam_channel::{Receiver, Sender, TrySendError};
use sluice_dpdk::Mbuf;
use sluice_wire::{FlowKey, IpAddr128};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How often a flow's home is published again while it is used.
pub const REFRESH: Duration = Duration::from_secs(1);

/// Packets one worker's inbox holds.
pub const INBOX: usize = 4096;

/// Homes one worker's updates channel holds before others' publications
/// to it are refused (counted).
pub const UPDATES: usize = 1 << 16;

/// Flows homed at most, per worker (about 56 bytes each: 14 MiB): a NAT
/// homes two flows a connection (its translation, and its reply's).
pub const CAPACITY: usize = 1 << 18;

/// How long a home outlives the last packet that refreshed it: the
/// host's default flow idle timeout.
pub const IDLE: Duration = Duration::from_secs(120);

/// A packet on its way to another worker: its mbuf, the index of the
/// port it came in on, and why.
pub struct Handed {
    pub mbuf: Mbuf,
    pub port: usize,
    /// How many workers passed it on so far (an IP fragment looking for
    /// its flow's worker, see [`crate::dispatch`]); `u8::MAX`: handed to
    /// its flow's home.
    pub hops: u8,
}

/// A published home: the flow's symmetric key hash, its worker, whose
/// translation it is (the lane's [`owner`](crate::dispatch::Lane::owner)),
/// and one of the flow's addresses, the one the translation brought in
/// where it brought one: only packets to or from such an address are
/// looked up.
#[derive(Debug, Clone, Copy)]
struct Update {
    hash: u64,
    home: u16,
    owner: u64,
    address: IpAddr128,
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

    /// How many workers it connects.
    pub fn workers(&self) -> usize {
        self.inboxes.len()
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
    /// chain translated from `from` for `owner`, is homed at `me`. Sent
    /// before the packet that made it leaves, so no reply can come in
    /// before the others can know.
    pub fn publish(&self, me: usize, owner: u64, from: &FlowKey, to: &FlowKey) {
        let u = Update {
            hash: to.symmetric_hash(),
            home: u16::try_from(me).unwrap_or(u16::MAX),
            owner,
            address: brought_in(from, to),
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

/// The address packets of the flow `to` (translated from `from`) are
/// looked up by: that of an endpoint (address and port) the translation
/// brought in (a NAT's public address, a load balancer's backend, the
/// server of a port forwarded elsewhere), else its receiver's. Every
/// packet of the flow, either way, is to or from it.
fn brought_in(from: &FlowKey, to: &FlowKey) -> IpAddr128 {
    let old = [(from.src, from.src_port), (from.dst, from.dst_port)];
    if old.contains(&(to.src, to.src_port)) { to.dst } else { to.src }
}

/// Addresses one owner's translations may bring in on one worker; a home
/// that would bring in more is refused (counted).
pub const OWNER_ADDRESSES: usize = 256;

/// Addresses compared one by one before a lookup; beyond, a set.
const FEW: usize = 8;

/// A flow homed at another worker.
#[derive(Debug, Clone, Copy)]
struct Home {
    worker: u16,
    /// When last published or used, ns of the handoff's clock.
    at: u64,
    owner: u64,
}

/// What one owner holds of a worker's copy.
#[derive(Debug, Default)]
struct Owned {
    homes: usize,
    /// Its homes' hashes in the order they came (some may be gone): the
    /// oldest goes first when another owner needs room.
    order: VecDeque<u64>,
    addresses: usize,
}

/// One worker's copy of the homes the other workers published, and whose
/// translations they are. When the copy is full, an owner below its equal
/// share takes the room of the one that holds the most, so one tenant's
/// translations cannot crowd out another's on a shared host.
#[derive(Debug, Default)]
pub struct Homes {
    map: HashMap<u64, Home, foldhash::fast::FixedState>,
    owners: HashMap<u64, Owned, foldhash::fast::FixedState>,
    /// The addresses translations brought in, and whose: only a packet to
    /// or from one of them can be of a homed flow.
    addresses: HashMap<IpAddr128, u64, foldhash::fast::FixedState>,
    /// The same while they are [`FEW`]: compared one by one.
    few: Vec<IpAddr128>,
    /// When idle homes were last forgotten.
    swept_ns: u64,
}

impl Homes {
    /// Whether any flow is homed at another worker.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Whether a packet between `src` and `dst` may be of a homed flow
    /// (and is worth a lookup).
    #[inline]
    pub fn may_hold(&self, src: IpAddr128, dst: IpAddr128) -> bool {
        if self.addresses.len() <= FEW {
            self.few.iter().any(|a| *a == src || *a == dst)
        } else {
            self.addresses.contains_key(&src) || self.addresses.contains_key(&dst)
        }
    }

    /// Takes in what the others published to worker `me` since the last
    /// call, as of `now_ns`.
    pub fn update(&mut self, h: &Handoff, me: usize, now_ns: u64) {
        let Some((_, rx)) = h.updates.get(me) else { return };
        let mut swept = false;
        while let Ok(u) = rx.try_recv() {
            if !swept && now_ns.saturating_sub(self.swept_ns) >= h.idle_ns {
                self.sweep(h.idle_ns, now_ns);
                swept = true;
            }
            if !self.take(h, u, now_ns) {
                h.refused.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Takes in one published home; false if it is refused.
    fn take(&mut self, h: &Handoff, u: Update, now_ns: u64) -> bool {
        if let Some(e) = self.map.get_mut(&u.hash) {
            e.worker = u.home;
            e.at = now_ns;
            return true;
        }
        let owned = self.owners.entry(u.owner).or_default();
        if let std::collections::hash_map::Entry::Vacant(e) = self.addresses.entry(u.address) {
            if owned.addresses >= OWNER_ADDRESSES {
                return false;
            }
            owned.addresses += 1;
            e.insert(u.owner);
            if self.addresses.len() <= FEW {
                self.few.push(u.address);
            }
        }
        if self.map.len() >= h.capacity {
            // At most once a second: a full copy costs a pass over it.
            if now_ns.saturating_sub(self.swept_ns) >= REFRESH.as_nanos() as u64 {
                self.sweep(h.idle_ns, now_ns);
            }
            if self.map.len() >= h.capacity && !self.make_room(u.owner, h.capacity) {
                return false;
            }
        }
        self.map.insert(u.hash, Home { worker: u.home, at: now_ns, owner: u.owner });
        let owned = self.owners.entry(u.owner).or_default();
        owned.homes += 1;
        owned.order.push_back(u.hash);
        if owned.order.len() > 2 * owned.homes + 64 {
            let map = &self.map;
            owned.order.retain(|k| map.get(k).is_some_and(|e| e.owner == u.owner));
        }
        true
    }

    /// Forgets the homes of the owner holding the most, oldest first, so
    /// that `owner` gets one: only while `owner` holds less than an equal
    /// share of `capacity`. Returns whether there is room now.
    fn make_room(&mut self, owner: u64, capacity: usize) -> bool {
        let holding = self.owners.values().filter(|o| o.homes > 0).count();
        let mine = self.owners.get(&owner).map_or(0, |o| o.homes);
        let share = capacity / (holding + usize::from(mine == 0)).max(1);
        if mine >= share {
            return false;
        }
        let Some((&most, _)) = self.owners.iter().max_by_key(|(_, o)| o.homes) else { return false };
        let Some(owned) = self.owners.get_mut(&most) else { return false };
        while let Some(k) = owned.order.pop_front() {
            if self.map.get(&k).is_some_and(|e| e.owner == most) {
                self.map.remove(&k);
                owned.homes = owned.homes.saturating_sub(1);
                return true;
            }
        }
        false
    }

    /// Forgets homes idle for `idle_ns`, and the addresses of owners left
    /// without homes.
    fn sweep(&mut self, idle_ns: u64, now_ns: u64) {
        let Homes { map, owners, addresses, few, swept_ns } = self;
        map.retain(|_, e| {
            let keep = now_ns.saturating_sub(e.at) < idle_ns;
            if !keep && let Some(o) = owners.get_mut(&e.owner) {
                o.homes = o.homes.saturating_sub(1);
            }
            keep
        });
        owners.retain(|_, o| o.homes > 0);
        addresses.retain(|_, owner| owners.contains_key(owner));
        few.clear();
        if addresses.len() <= FEW {
            few.extend(addresses.keys().copied());
        }
        *swept_ns = now_ns;
    }

    /// The worker the flow whose key's symmetric hash is `hash` is homed
    /// at, if it is and has not idled out; a use keeps it alive.
    pub fn home_of(&mut self, hash: u64, now_ns: u64, idle_ns: u64) -> Option<usize> {
        let e = self.map.get_mut(&hash)?;
        if now_ns.saturating_sub(e.at) >= idle_ns {
            let owner = e.owner;
            self.map.remove(&hash);
            if let Some(o) = self.owners.get_mut(&owner) {
                o.homes = o.homes.saturating_sub(1);
            }
            return None;
        }
        e.at = now_ns;
        Some(usize::from(e.worker))
    }
}

/// A worker's memory of the flows it rewrote lately, so that a flow's
/// rewritten packets are compared with what came in, and a translated
/// flow published, about once per [`REFRESH`]: a direct-mapped table of
/// (flow key hash, when looked at, ns of the handoff's clock, whether
/// translated). Two flows in one slot are looked at more often, which is
/// harmless.
///
/// It also tells the worker which strays are its own: a first fragment or
/// an ICMP error of a flow this worker translated belongs here, where the
/// translation and the state before it are, although no chain here holds
/// the flow under the key the stray carries (the outside one).
#[derive(Debug)]
pub struct Homed {
    slots: Box<[(u64, u64, bool)]>,
    /// Whether any flow was found translated: until then no stray is
    /// looked up.
    translates: bool,
}

/// Slots of a worker's [`Homed`] (1.5 MiB).
const HOMED_SLOTS: usize = 1 << 16;

impl Default for Homed {
    fn default() -> Self {
        Homed { slots: vec![(0, 0, false); HOMED_SLOTS].into_boxed_slice(), translates: false }
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
        self.translates |= translated;
        if let Some(slot) = self.slots.get_mut(hash as usize % HOMED_SLOTS) {
            *slot = (hash, now_ns, translated);
        }
    }

    /// Whether this worker ever found a flow translated.
    #[inline]
    pub fn translates(&self) -> bool {
        self.translates
    }

    /// Whether the flow hashing to `hash` (either direction: the hash is
    /// symmetric) was translated here and looked at within `idle_ns` of
    /// `now_ns`. A flow whose slot a newer one took is not (its strays
    /// are passed round, as any other worker's).
    #[inline]
    pub fn translated(&self, hash: u64, now_ns: u64, idle_ns: u64) -> bool {
        self.slots
            .get(hash as usize % HOMED_SLOTS)
            .is_some_and(|&(h, at, translated)| translated && h == hash && now_ns.saturating_sub(at) <= idle_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(src: [u8; 4], dst: [u8; 4], sp: u16, dp: u16) -> FlowKey {
        FlowKey { src: IpAddr128::from_v4(src), dst: IpAddr128::from_v4(dst), src_port: sp, dst_port: dp, protocol: 6 }
    }

    #[test]
    fn a_worker_knows_its_own_translations_by_either_direction_until_they_idle() {
        let mut homed = Homed::default();
        let out = key([10, 0, 0, 1], [192, 0, 2, 9], 40_000, 443);
        let translated = key([203, 0, 113, 1], [192, 0, 2, 9], 61_000, 443);
        let reply = key([192, 0, 2, 9], [203, 0, 113, 1], 443, 61_000);
        assert!(!homed.translates());
        homed.looked(out.symmetric_hash(), 1_000, false);
        assert!(!homed.translates(), "a rewrite that kept the flow is no translation");
        homed.looked(translated.symmetric_hash(), 1_000, true);
        assert!(homed.translates());
        assert!(homed.translated(reply.symmetric_hash(), 2_000, 10_000), "the reply's key hashes alike");
        assert!(!homed.translated(out.symmetric_hash(), 2_000, 10_000), "not translated");
        assert!(!homed.translated(translated.symmetric_hash(), 20_000, 10_000), "idle since");
    }

    #[test]
    fn published_homes_reach_the_other_workers_are_kept_alive_by_use_and_forgotten() {
        let h = Handoff::with_limits(3, 2, Duration::from_secs(10));
        let (mut w0, mut w1) = (Homes::default(), Homes::default());
        let from = key([10, 0, 0, 5], [198, 51, 100, 7], 40000, 80);
        let to = key([203, 0, 113, 1], [198, 51, 100, 7], 2000, 80);
        h.publish(2, 1, &from, &to);
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
    fn a_translation_is_looked_up_by_the_address_of_the_endpoint_it_brought_in() {
        let h = Handoff::with_limits(2, 64, Duration::from_secs(10));
        let mut w0 = Homes::default();
        let (client, server) = ([10, 0, 0, 5], [10, 0, 0, 7]);
        let v4 = IpAddr128::from_v4;
        // A port forwarded elsewhere: the server's replies come from 8080.
        let from = key(client, server, 40000, 80);
        h.publish(1, 1, &from, &key(client, server, 40000, 8080));
        w0.update(&h, 0, 0);
        assert!(w0.may_hold(v4(server), v4([10, 0, 0, 9])));
        assert!(!w0.may_hold(v4(client), v4([10, 0, 0, 9])));
        assert!(!w0.may_hold(v4([1, 2, 3, 4]), v4([5, 6, 7, 8])));
        // A load balancer's backends: many addresses, each looked up.
        for b in 0..40u8 {
            h.publish(1, 1, &key(client, [192, 0, 2, 1], 40000, 80), &key(client, [10, 9, 0, b], 40000, 80));
        }
        w0.update(&h, 0, 0);
        assert!((0..40u8).all(|b| w0.may_hold(v4([10, 9, 0, b]), v4(client))));
        assert!(!w0.may_hold(v4([10, 9, 0, 41]), v4([10, 0, 0, 9])));
        assert_eq!(h.refused(), 0);
    }

    #[test]
    fn an_owner_brings_in_at_most_its_quota_of_addresses() {
        let h = Handoff::with_limits(2, 4 * OWNER_ADDRESSES, Duration::from_secs(10));
        let mut w0 = Homes::default();
        let from = key([10, 0, 0, 5], [198, 51, 100, 7], 40000, 80);
        let public = |n: usize| [100, 64, (n >> 8) as u8, n as u8];
        for n in 0..OWNER_ADDRESSES + 10 {
            h.publish(1, 1, &from, &key(public(n), [198, 51, 100, 7], 2000, 80));
        }
        w0.update(&h, 0, 0);
        assert_eq!(h.refused(), 10);
        // Another owner still gets its own.
        h.publish(1, 2, &from, &key([203, 0, 113, 1], [198, 51, 100, 7], 2000, 80));
        w0.update(&h, 0, 0);
        assert_eq!(h.refused(), 10);
        assert!(w0.may_hold(IpAddr128::from_v4([203, 0, 113, 1]), IpAddr128::from_v4([198, 51, 100, 7])));
    }

    #[test]
    fn an_owner_that_fills_the_copy_gives_room_to_another_up_to_an_equal_share() {
        let h = Handoff::with_limits(2, 8, Duration::from_secs(10));
        let mut w0 = Homes::default();
        let from = key([10, 0, 0, 5], [198, 51, 100, 7], 40000, 80);
        let to = |ip: [u8; 4], p| key(ip, [198, 51, 100, 7], p, 80);
        let (hostile, other) = ([203, 0, 113, 66], [203, 0, 113, 1]);
        for p in 0..20 {
            h.publish(1, 66, &from, &to(hostile, p));
        }
        w0.update(&h, 0, 0);
        assert_eq!(h.refused(), 12);
        // The other owner takes the hostile one's oldest homes, up to half.
        for p in 0..6 {
            h.publish(1, 7, &from, &to(other, p));
        }
        w0.update(&h, 0, 1);
        assert_eq!(h.refused(), 12 + 2);
        let homed = |w: &mut Homes, ip, p| w.home_of(to(ip, p).symmetric_hash(), 2, h.idle_ns()).is_some();
        assert!((0..4).all(|p| homed(&mut w0, other, p)));
        assert!(!homed(&mut w0, other, 4));
        assert!((0..4).all(|p| !homed(&mut w0, hostile, p)));
        assert!((4..8).all(|p| homed(&mut w0, hostile, p)));
        // At its share, the hostile owner gets no more room.
        h.publish(1, 66, &from, &to(hostile, 30));
        w0.update(&h, 0, 3);
        assert!(!homed(&mut w0, hostile, 30));
        assert!((0..4).all(|p| homed(&mut w0, other, p)));
    }

    #[test]
    fn a_full_copy_refuses_until_homes_idle_out() {
        let h = Handoff::with_limits(2, 2, Duration::from_secs(10));
        let mut w0 = Homes::default();
        let from = key([10, 0, 0, 5], [198, 51, 100, 7], 40000, 80);
        let to = |p| key([203, 0, 113, 1], [198, 51, 100, 7], p, 80);
        for p in [1, 2, 3] {
            h.publish(1, 1, &from, &to(p));
        }
        w0.update(&h, 0, 0);
        assert_eq!(h.refused(), 1);
        assert_eq!(w0.home_of(to(3).symmetric_hash(), 1, h.idle_ns()), None);
        // A known flow is still rehomed; a new one once the others idle out.
        h.publish(1, 1, &from, &to(2));
        h.publish(1, 1, &from, &to(3));
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
