//! Fragments put back together before the NFs see them.
//!
//! In [`FragmentMode::Reassemble`](crate::fragments::FragmentMode) a chain
//! keeps every IP fragment until its datagram is whole, as Linux's
//! `nf_defrag` does for conntrack: the NFs see the datagram once, with its
//! transport header and all its data, in the place of the fragment that
//! completed it; the other fragments leave no result of their own
//! ([`Fate::Reassembling`](crate::chain::Fate::Reassembling)). A forwarded
//! datagram is cut again into fragments no larger than the largest it came
//! in (see [`sluice_wire::reassembly::split`]).
//!
//! The buffers belong to one chain instance, so a deployment's fragments
//! never use another's room, and are bounded: at most [`MAX_BYTES`] in
//! all, [`MAX_BYTES_PER_SOURCE`] and [`MAX_DATAGRAMS_PER_SOURCE`] per
//! source address (so one sender cannot take the room of the others), each
//! datagram forgotten [`TIMEOUT_NS`] of packet time after its first
//! fragment came (Linux's `ipfrag_time`). A fragment that does not fit is
//! refused, never another sender's datagram evicted for it.

use sluice_wire::IpAddr128;
use sluice_wire::fragment::{FragmentKey, IpFacts};
use sluice_wire::reassembly::{Added, Cut, Datagram, FragmentError};
use std::collections::VecDeque;

type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// Bytes of fragments one chain instance holds at most.
pub const MAX_BYTES: usize = 4 << 20;
/// Bytes of fragments held at most for one source address.
pub const MAX_BYTES_PER_SOURCE: usize = 512 << 10;
/// Incomplete datagrams held at most for one source address.
pub const MAX_DATAGRAMS_PER_SOURCE: usize = 64;
/// How long a datagram's fragments are kept, ns of packet time.
pub const TIMEOUT_NS: u64 = 30_000_000_000;

/// What became of one fragment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Held until the rest of its datagram comes.
    Held,
    /// It completed its datagram: the whole datagram (a frame), and how to
    /// cut it again.
    Complete(Vec<u8>, Cut),
    /// Not taken (counted in [`Tally`]).
    Refused(Refusal),
}

/// Why a fragment was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// It contradicts its datagram (the datagram is discarded with it).
    Invalid(FragmentError),
    /// The same bytes came before.
    Duplicate,
    /// Its source, or the chain, holds as many fragments as it may.
    NoRoom,
}

/// What happened to held fragments, for the chain's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// Held fragments thrown away: their datagram timed out or was
    /// invalidated by a later fragment.
    pub discarded: u64,
}

#[derive(Debug)]
struct Pending {
    datagram: Datagram,
    since_ns: u64,
    bytes: usize,
}

#[derive(Debug, Default, Clone, Copy)]
struct SourceUse {
    bytes: usize,
    datagrams: usize,
}

/// The incomplete datagrams of one chain instance.
#[derive(Debug, Default)]
pub struct Reassembler {
    pending: HashMap<FragmentKey, Pending>,
    /// Keys in arrival order of their first fragment, to expire them.
    order: VecDeque<(FragmentKey, u64)>,
    sources: HashMap<IpAddr128, SourceUse>,
    bytes: usize,
}

impl Reassembler {
    /// Takes one fragment (`frame`, which [`sluice_wire::fragment::inspect`]
    /// described as `facts`) at packet time `now_ns`.
    pub fn add(&mut self, key: FragmentKey, frame: &[u8], facts: &IpFacts, now_ns: u64, tally: &mut Tally) -> Outcome {
        self.expire(now_ns, tally);
        let usage = self.sources.get(&key.src).copied().unwrap_or_default();
        // At most what the datagram can grow by with this fragment: its
        // buffer reaches the fragment's end.
        let held = self.pending.get(&key).map_or(0, |p| p.bytes);
        let reach =
            facts.fragment.map_or(0, |f| f.offset as usize) + facts.end.saturating_sub(facts.l3) + facts.l3 + 64;
        let grows = reach.saturating_sub(held);
        let new = !self.pending.contains_key(&key);
        if self.bytes + grows > MAX_BYTES
            || usage.bytes + grows > MAX_BYTES_PER_SOURCE
            || (new && usage.datagrams >= MAX_DATAGRAMS_PER_SOURCE)
        {
            return Outcome::Refused(Refusal::NoRoom);
        }
        let entry = self.pending.entry(key).or_insert_with(|| Pending {
            datagram: Datagram::default(),
            since_ns: now_ns,
            bytes: 0,
        });
        if new {
            self.order.push_back((key, now_ns));
            self.sources.entry(key.src).or_default().datagrams += 1;
        }
        let added = entry.datagram.add(frame, facts);
        // Merged ranges can make it hold less than before.
        let (before, now_bytes) = (entry.bytes, entry.datagram.held_bytes());
        entry.bytes = now_bytes;
        self.bytes = self.bytes.saturating_sub(before).saturating_add(now_bytes);
        if let Some(u) = self.sources.get_mut(&key.src) {
            u.bytes = u.bytes.saturating_sub(before).saturating_add(now_bytes);
        }
        match added {
            Ok(Added::Kept) => Outcome::Held,
            Ok(Added::Duplicate) => Outcome::Refused(Refusal::Duplicate),
            Ok(Added::Complete) => {
                let whole = self.pending.get(&key).and_then(|p| p.datagram.assemble().map(|d| (d, p.datagram.cut())));
                self.forget(&key);
                match whole {
                    Some((d, cut)) => Outcome::Complete(d, cut),
                    None => Outcome::Refused(Refusal::Invalid(FragmentError::Malformed)),
                }
            }
            Err(e) => {
                if let Some(p) = self.forget(&key) {
                    tally.discarded += u64::from(p.datagram.fragments());
                }
                Outcome::Refused(Refusal::Invalid(e))
            }
        }
    }

    /// Bytes held now.
    pub fn held_bytes(&self) -> usize {
        self.bytes
    }

    /// Incomplete datagrams held now.
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Throws away every held fragment (counted in `tally`).
    pub fn clear(&mut self, tally: &mut Tally) {
        tally.discarded += self.pending.values().map(|p| u64::from(p.datagram.fragments())).sum::<u64>();
        self.pending.clear();
        self.order.clear();
        self.sources.clear();
        self.bytes = 0;
    }

    fn forget(&mut self, key: &FragmentKey) -> Option<Pending> {
        let p = self.pending.remove(key)?;
        self.bytes = self.bytes.saturating_sub(p.bytes);
        if let Some(u) = self.sources.get_mut(&key.src) {
            u.bytes = u.bytes.saturating_sub(p.bytes);
            u.datagrams = u.datagrams.saturating_sub(1);
            if u.datagrams == 0 {
                self.sources.remove(&key.src);
            }
        }
        Some(p)
    }

    fn expire(&mut self, now_ns: u64, tally: &mut Tally) {
        while let Some(&(key, at)) = self.order.front() {
            if now_ns.saturating_sub(at) <= TIMEOUT_NS {
                break;
            }
            self.order.pop_front();
            // The key may have completed and come again since.
            if self.pending.get(&key).is_some_and(|p| p.since_ns == at)
                && let Some(p) = self.forget(&key)
            {
                tally.discarded += u64::from(p.datagram.fragments());
            }
        }
        // Completed datagrams leave stale keys behind: keep the queue short.
        if self.order.len() > 4 * self.pending.len() + 1024 {
            let pending = &self.pending;
            self.order.retain(|(k, at)| pending.get(k).is_some_and(|p| p.since_ns == *at));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_wire::build::FrameSpec;
    use sluice_wire::fragment::{inspect, split_ipv4};
    use sluice_wire::ipv4::Ipv4Packet;

    fn fragments(src: [u8; 4], ident: u16, payload: usize) -> Vec<Vec<u8>> {
        let mut f = FrameSpec::udp4(src, 5000, [10, 0, 0, 2], 53).with_payload(vec![1u8; payload]).build();
        let ip = &mut f[14..];
        ip[4..6].copy_from_slice(&ident.to_be_bytes());
        ip[6] = 0;
        Ipv4Packet::new_unchecked(ip).fill_checksum();
        split_ipv4(&f, 1500).unwrap()
    }

    fn add(r: &mut Reassembler, frame: &[u8], now: u64, tally: &mut Tally) -> Outcome {
        let facts = inspect(frame).unwrap();
        r.add(facts.fragment.unwrap().key, frame, &facts, now, tally)
    }

    #[test]
    fn a_datagram_completes_and_leaves_nothing_behind() {
        let (mut r, mut t) = (Reassembler::default(), Tally::default());
        let frags = fragments([10, 0, 0, 1], 1, 3000);
        assert_eq!(add(&mut r, &frags[2], 0, &mut t), Outcome::Held);
        assert_eq!(add(&mut r, &frags[0], 1, &mut t), Outcome::Held);
        assert!(r.held_bytes() > 0);
        assert!(matches!(add(&mut r, &frags[1], 2, &mut t), Outcome::Complete(ref d, _) if d.len() == 14 + 28 + 3000));
        assert_eq!((r.len(), r.held_bytes(), t.discarded), (0, 0, 0));
    }

    #[test]
    fn old_datagrams_time_out_and_are_counted() {
        let (mut r, mut t) = (Reassembler::default(), Tally::default());
        let frags = fragments([10, 0, 0, 1], 1, 3000);
        add(&mut r, &frags[0], 0, &mut t);
        add(&mut r, &frags[1], 1, &mut t);
        let other = fragments([10, 0, 0, 1], 2, 3000);
        assert_eq!(add(&mut r, &other[0], TIMEOUT_NS + 10, &mut t), Outcome::Held);
        assert_eq!(t.discarded, 2);
        assert_eq!(r.len(), 1);
    }

    #[test]
    fn one_source_cannot_take_the_others_room() {
        let (mut r, mut t) = (Reassembler::default(), Tally::default());
        let mut refused = 0;
        for ident in 0..200u16 {
            let f = fragments([10, 0, 0, 66], ident, 3000);
            if add(&mut r, &f[0], 0, &mut t) == Outcome::Refused(Refusal::NoRoom) {
                refused += 1;
            }
        }
        assert_eq!(refused, 200 - MAX_DATAGRAMS_PER_SOURCE.min(MAX_BYTES_PER_SOURCE / 1600));
        let good = fragments([10, 0, 0, 7], 9, 3000);
        for f in &good[..2] {
            assert_eq!(add(&mut r, f, 1, &mut t), Outcome::Held);
        }
        assert!(matches!(add(&mut r, &good[2], 1, &mut t), Outcome::Complete(..)));
        assert!(r.held_bytes() <= MAX_BYTES_PER_SOURCE);
    }

    #[test]
    fn an_overlap_discards_the_datagram() {
        let (mut r, mut t) = (Reassembler::default(), Tally::default());
        let frags = fragments([10, 0, 0, 1], 1, 3000);
        add(&mut r, &frags[0], 0, &mut t);
        let mut bad = frags[1].clone();
        bad[14 + 7] -= 1;
        Ipv4Packet::new_unchecked(&mut bad[14..]).fill_checksum();
        assert_eq!(add(&mut r, &bad, 1, &mut t), Outcome::Refused(Refusal::Invalid(FragmentError::Overlap)));
        assert_eq!((t.discarded, r.len(), r.held_bytes()), (1, 0, 0));
    }
}
