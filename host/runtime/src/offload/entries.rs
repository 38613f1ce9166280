//! Where a chain's offload entries live: what a packet's lookup reads and
//! writes ([`Hot`]: the key, the counts, the limits, the fate — 128 bytes,
//! one pair of adjacent cache lines) apart from what only making, ending,
//! carrying and revoking an entry read ([`Cold`]: its changes and its
//! NFs), found through a seeded index of slot numbers that stays small
//! enough to be cached while packets stream through.

use super::{Path, RewriteOp};
use crate::fate::Fate;
use hashbrown::HashTable;
use sluice_wire::{FlowKey, IpAddr128};
use std::hash::BuildHasher;

/// Which packets an entry takes: a flow (normalized, as it came in), one
/// direction, one ingress port. The flow key's fields are laid out here
/// with the direction and port beside them (48 bytes, against 64 for a
/// `FlowKey` and two more fields).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub(super) struct EntryKey {
    src: IpAddr128,
    dst: IpAddr128,
    src_port: u16,
    dst_port: u16,
    protocol: u8,
    reverse: bool,
    port: u16,
}

impl std::hash::Hash for EntryKey {
    /// Three words: the addresses, then ports, protocol, direction and
    /// ingress port together.
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        h.write_u128(self.src.0);
        h.write_u128(self.dst.0);
        h.write_u64(
            u64::from(self.src_port)
                | (u64::from(self.dst_port) << 16)
                | (u64::from(self.protocol) << 32)
                | (u64::from(self.reverse) << 40)
                | (u64::from(self.port) << 48),
        );
    }
}

impl EntryKey {
    pub(super) fn new(key: FlowKey, reverse: bool, port: u16) -> Self {
        EntryKey {
            src: key.src,
            dst: key.dst,
            src_port: key.src_port,
            dst_port: key.dst_port,
            protocol: key.protocol,
            reverse,
            port,
        }
    }

    /// The flow, normalized.
    pub(super) fn flow(&self) -> FlowKey {
        FlowKey {
            src: self.src,
            dst: self.dst,
            src_port: self.src_port,
            dst_port: self.dst_port,
            protocol: self.protocol,
        }
    }

    /// Whether it takes packets against the flow's normalized direction.
    pub(super) fn reverse(&self) -> bool {
        self.reverse
    }

    /// The ingress port it takes packets from.
    pub(super) fn port(&self) -> u16 {
        self.port
    }
}

/// An entry's fate, in four bytes: forward to a port, or dropped by the
/// NF at a place of the chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Out(u32);

const DROPPED: u32 = 1 << 31;

impl Out {
    /// `None` for a fate an entry cannot have.
    pub(super) fn of(fate: Fate) -> Option<Self> {
        match fate {
            Fate::Forward(p) => Some(Out(u32::from(p))),
            Fate::Dropped(s) => Some(Out(u32::from(s) | DROPPED)),
            Fate::Refused | Fate::Reassembling => None,
        }
    }

    pub(super) fn fate(self) -> Fate {
        if self.0 & DROPPED == 0 { Fate::Forward(self.0 as u16) } else { Fate::Dropped((self.0 & !DROPPED) as u16) }
    }
}

/// What a packet's lookup reads and writes.
#[derive(Debug, Clone)]
#[repr(C, align(128))]
pub(super) struct Hot {
    pub(super) key: EntryKey,
    pub(super) packets: u64,
    pub(super) bytes: u64,
    pub(super) last_ns: u64,
    pub(super) idle_ns: u64,
    /// Packet limit; 0: none.
    pub(super) max_packets: u64,
    /// Byte limit; 0: none.
    pub(super) max_bytes: u64,
    /// Packet time after which it ends (`u64::MAX`: never).
    pub(super) ends_ns: u64,
    /// The batch it was last used in (its flow state is refreshed once
    /// per batch).
    pub(super) batch: u64,
    pub(super) out: Out,
    pub(super) label: Option<u16>,
    /// Its NFs' places in the chain, as bits, where all are below 32
    /// ([`Hot::WIDE`] otherwise: they are read from its path).
    pub(super) stages: u32,
    /// [`Hot::REWRITES`], [`Hot::WIDE`].
    pub(super) flags: u8,
}

const _: () = assert!(std::mem::size_of::<Hot>() == 128);

impl Hot {
    /// It changes headers.
    pub(super) const REWRITES: u8 = 1;
    /// An NF of its path sits at place 32 or later.
    pub(super) const WIDE: u8 = 2;

    /// The fields that follow from its path and changes.
    pub(super) fn shape(path: &Path, ops: &[RewriteOp]) -> (u32, u8) {
        let mut stages = 0u32;
        let mut flags = if ops.is_empty() { 0 } else { Hot::REWRITES };
        for s in path {
            match u32::try_from(s.stage).ok().and_then(|b| 1u32.checked_shl(b)) {
                Some(bit) => stages |= bit,
                None => flags |= Hot::WIDE,
            }
        }
        (stages, flags)
    }
}

/// What making, ending, carrying and revoking an entry read.
#[derive(Debug, Clone, Default)]
pub(super) struct Cold {
    pub(super) ops: Vec<RewriteOp>,
    pub(super) path: Path,
    /// The batch it was made in.
    pub(super) made: u64,
    /// Which entry this is among every entry of this host run (carried
    /// entries keep their first host's).
    pub(super) origin: u64,
    /// The last carried entry whose counts this one took in (its origin,
    /// packets, bytes): a later copy of the same entry adds only what
    /// passed since.
    pub(super) took: Option<(u64, u64, u64)>,
}

/// The entries of one chain on one worker, by key.
#[derive(Debug, Default)]
pub(super) struct Entries {
    /// Slot numbers, by a per-process seeded hash of their keys (flow keys
    /// come off the wire).
    index: HashTable<u32>,
    hasher: foldhash::fast::RandomState,
    hot: Vec<Hot>,
    cold: Vec<Cold>,
    /// Whether each slot holds an entry.
    live: Vec<bool>,
    /// Slots free for the next entries.
    free: Vec<u32>,
}

impl Entries {
    pub(super) fn len(&self) -> usize {
        self.index.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// The hash entry `key` is found by.
    #[inline]
    pub(super) fn hash(&self, key: &EntryKey) -> u64 {
        self.hasher.hash_one(key)
    }

    /// The slot of entry `key`.
    #[inline]
    pub(super) fn find(&self, key: &EntryKey) -> Option<usize> {
        self.find_hashed(self.hash(key), key)
    }

    /// The slot of entry `key`, whose [`hash`](Self::hash) is `h`.
    #[inline]
    pub(super) fn find_hashed(&self, h: u64, key: &EntryKey) -> Option<usize> {
        let hot = &self.hot;
        self.index.find(h, |&i| hot.get(i as usize).is_some_and(|e| e.key == *key)).map(|&i| i as usize)
    }

    pub(super) fn contains(&self, key: &EntryKey) -> bool {
        self.find(key).is_some()
    }

    pub(super) fn hot_mut(&mut self, slot: usize) -> Option<&mut Hot> {
        self.hot.get_mut(slot)
    }

    /// Entry `key`, both parts.
    pub(super) fn get(&self, key: &EntryKey) -> Option<(&Hot, &Cold)> {
        let i = self.find(key)?;
        Some((self.hot.get(i)?, self.cold.get(i)?))
    }

    /// Entry `key`, both parts.
    pub(super) fn get_mut(&mut self, key: &EntryKey) -> Option<(&mut Hot, &mut Cold)> {
        let i = self.find(key)?;
        Some((self.hot.get_mut(i)?, self.cold.get_mut(i)?))
    }

    /// The cold part of the entry in `slot`.
    pub(super) fn cold(&self, slot: usize) -> Option<&Cold> {
        self.cold.get(slot)
    }

    /// Adds an entry whose key is not in the table (the caller looked).
    pub(super) fn insert(&mut self, hot: Hot, cold: Cold) {
        let h = self.hasher.hash_one(hot.key);
        let slot = match self.free.pop() {
            Some(s) => {
                let i = s as usize;
                if let (Some(hs), Some(cs), Some(l)) = (self.hot.get_mut(i), self.cold.get_mut(i), self.live.get_mut(i))
                {
                    (*hs, *cs, *l) = (hot, cold, true);
                }
                s
            }
            None => {
                // At most one entry per state-budget unit: far below u32.
                let s = u32::try_from(self.hot.len()).unwrap_or(u32::MAX);
                self.hot.push(hot);
                self.cold.push(cold);
                self.live.push(true);
                s
            }
        };
        let (hot, hasher) = (&self.hot, &self.hasher);
        self.index.insert_unique(h, slot, |&i| hot.get(i as usize).map_or(0, |e| hasher.hash_one(e.key)));
    }

    /// Takes entry `key` out.
    pub(super) fn remove(&mut self, key: &EntryKey) -> Option<(Hot, Cold)> {
        let h = self.hasher.hash_one(key);
        let hot = &self.hot;
        let found = self.index.find_entry(h, |&i| hot.get(i as usize).is_some_and(|e| e.key == *key)).ok()?;
        let (slot, _) = found.remove();
        let i = slot as usize;
        let hot = self.hot.get(i)?.clone();
        let cold = std::mem::take(self.cold.get_mut(i)?);
        if let Some(l) = self.live.get_mut(i) {
            *l = false;
        }
        self.free.push(slot);
        Some((hot, cold))
    }

    /// Every entry.
    pub(super) fn iter(&self) -> impl Iterator<Item = (&Hot, &Cold)> {
        self.hot.iter().zip(&self.cold).zip(&self.live).filter(|(_, l)| **l).map(|(e, _)| e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u16, reverse: bool) -> EntryKey {
        let flow = FlowKey {
            src: IpAddr128::from_v4([10, 0, 0, 1]),
            dst: IpAddr128::from_v4([10, 0, 0, 2]),
            src_port: n,
            dst_port: 80,
            protocol: 6,
        };
        EntryKey::new(flow, reverse, 0)
    }

    fn hot(k: EntryKey, packets: u64) -> Hot {
        Hot {
            key: k,
            packets,
            bytes: 0,
            last_ns: 0,
            idle_ns: 0,
            max_packets: 0,
            max_bytes: 0,
            ends_ns: u64::MAX,
            batch: 0,
            out: Out(0),
            label: None,
            stages: 1,
            flags: 0,
        }
    }

    #[test]
    fn slots_are_reused_and_every_entry_is_found_by_its_key() {
        let mut e = Entries::default();
        for n in 0..100 {
            e.insert(hot(key(n, n % 2 == 0), u64::from(n)), Cold::default());
        }
        assert_eq!(e.len(), 100);
        for n in (0..100).step_by(3) {
            assert_eq!(e.remove(&key(n, n % 2 == 0)).map(|(h, _)| h.packets), Some(u64::from(n)));
        }
        assert!(e.remove(&key(0, true)).is_none(), "gone already");
        assert!(!e.contains(&key(1, true)), "the other direction was never made");
        for n in 100..120 {
            e.insert(hot(key(n, false), u64::from(n)), Cold::default());
        }
        assert_eq!(e.hot.len(), 100, "freed slots taken first");
        assert_eq!(e.len(), 100 - 34 + 20);
        assert_eq!(e.iter().count(), e.len());
        for n in 0..120 {
            let want = if n >= 100 { Some(u64::from(n)) } else { (n % 3 != 0).then_some(u64::from(n)) };
            let r = if n >= 100 { false } else { n % 2 == 0 };
            assert_eq!(e.get(&key(n, r)).map(|(h, _)| h.packets), want, "entry {n}");
        }
    }

    proptest::proptest! {
        /// Any sequence of inserts and removes leaves the store holding
        /// what a map would: every key found in its own slot, none twice.
        #[test]
        fn the_store_holds_what_a_map_would(ops in proptest::collection::vec((0u16..40, proptest::bool::ANY, proptest::bool::ANY), 0..400)) {
            let mut e = Entries::default();
            let mut model = std::collections::BTreeMap::new();
            for (n, (port, reverse, add)) in ops.into_iter().enumerate() {
                let k = key(port, reverse);
                let packets = n as u64;
                if add && !model.contains_key(&(port, reverse)) {
                    e.insert(hot(k, packets), Cold { origin: packets, ..Cold::default() });
                    model.insert((port, reverse), packets);
                } else if !add {
                    let got = e.remove(&k).map(|(h, c)| (h.packets, c.origin));
                    proptest::prop_assert_eq!(got, model.remove(&(port, reverse)).map(|p| (p, p)));
                }
                proptest::prop_assert_eq!(e.len(), model.len());
            }
            for (&(port, reverse), &packets) in &model {
                let found = e.get(&key(port, reverse)).map(|(h, c)| (h.packets, c.origin));
                proptest::prop_assert_eq!(found, Some((packets, packets)));
            }
            proptest::prop_assert_eq!(e.iter().count(), model.len());
            proptest::prop_assert!(e.hot.len() <= 80, "slots are reused");
        }
    }

    #[test]
    fn fates_round_trip_and_others_are_refused() {
        for f in
            [Fate::Forward(0), Fate::Forward(u16::MAX), Fate::Dropped(0), Fate::Dropped(31), Fate::Dropped(u16::MAX)]
        {
            assert_eq!(Out::of(f).map(Out::fate), Some(f));
        }
        assert_eq!(Out::of(Fate::Refused), None);
    }

    #[test]
    fn the_flow_comes_back_out_of_the_key() {
        let flow = FlowKey {
            src: IpAddr128::from_v4([192, 0, 2, 1]),
            dst: IpAddr128::from_v4([198, 51, 100, 7]),
            src_port: 1234,
            dst_port: 443,
            protocol: 17,
        };
        let k = EntryKey::new(flow, true, 3);
        assert_eq!((k.flow(), k.reverse(), k.port()), (flow, true, 3));
        assert_eq!(std::mem::size_of::<EntryKey>(), 48);
    }
}
