//! What NFs see of fragmented IP datagrams ([`FragmentMode`]), and
//! fragments that follow their first fragment.
//!
//! Only the first fragment of a fragmented IP datagram carries the
//! transport header an NF decides on (ports, TCP flags). The chain runs the
//! NFs on it like on any packet; its later fragments do not reach the NFs:
//! they get the first fragment's fate (forwarded by the same port, or
//! dropped) and the same changes to their link and IP headers (addresses,
//! TTL/hop limit, DSCP; see [`Template`]), as stateless firewalls and
//! Linux's `nf_conntrack` do for fragments. A later fragment whose first
//! fragment the worker has not seen (it came first, or was lost) is
//! dropped and counted.
//!
//! The table is per chain instance and bounded: at most [`MAX_DATAGRAMS`]
//! datagrams, each forgotten [`TIMEOUT_NS`] of packet time after its first
//! fragment (Linux's `ipfrag_time`), the oldest first when full.

use crate::fate::{Fate, PacketResult};
use sluice_wire::fragment::{FragmentKey, Template};
use std::collections::VecDeque;

type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

pub use sluice_traffic::FragmentMode;

/// Datagrams a chain instance remembers the first fragment of.
pub const MAX_DATAGRAMS: usize = 4096;
/// How long a datagram's later fragments may follow its first, ns.
pub const TIMEOUT_NS: u64 = 30_000_000_000;

/// What a datagram's first fragment got.
#[derive(Debug, Clone)]
struct Decided {
    fate: Fate,
    label: Option<u16>,
    /// Its changes, when an NF rewrote it.
    template: Option<Template>,
    at_ns: u64,
}

/// The first fragments a chain instance decided recently.
#[derive(Debug, Default)]
pub struct Followers {
    decided: HashMap<FragmentKey, Decided>,
    /// Keys in the order they were decided (with their time), to expire
    /// and evict the oldest.
    order: VecDeque<(FragmentKey, u64)>,
}

impl Followers {
    /// Remembers what the first fragment of `key`'s datagram got.
    pub fn decide(&mut self, key: FragmentKey, result: &PacketResult, at_ns: u64) {
        self.expire(at_ns);
        while self.decided.len() >= MAX_DATAGRAMS {
            let Some((old, _)) = self.order.pop_front() else { break };
            self.decided.remove(&old);
        }
        let template = match (&result.fate, &result.data) {
            (Fate::Forward(_), Some(after)) => Template::of(after),
            _ => None,
        };
        // A rewrite that left no IP header: the later fragments cannot
        // follow it, so they are dropped.
        let fate = if result.data.is_some() && template.is_none() { Fate::Refused } else { result.fate };
        if self.decided.insert(key, Decided { fate, label: result.label, template, at_ns }).is_none() {
            self.order.push_back((key, at_ns));
        }
    }

    /// The result of a later fragment (`frame`) of `key`'s datagram:
    /// `None` when its first fragment was not seen (or long ago).
    pub fn follow(&mut self, key: &FragmentKey, frame: &[u8], at_ns: u64) -> Option<PacketResult> {
        let d = self.decided.get(key)?;
        if at_ns.saturating_sub(d.at_ns) > TIMEOUT_NS {
            return None;
        }
        let data = match (&d.fate, &d.template) {
            (Fate::Forward(_), Some(t)) => match t.apply(frame) {
                Some(out) => Some(out),
                None => return Some(PacketResult::of(Fate::Refused)),
            },
            _ => None,
        };
        Some(PacketResult { fate: d.fate, data, label: d.label, fragments: None })
    }

    /// Datagrams remembered.
    pub fn len(&self) -> usize {
        self.decided.len()
    }

    /// Whether none is remembered.
    pub fn is_empty(&self) -> bool {
        self.decided.is_empty()
    }

    fn expire(&mut self, now_ns: u64) {
        while let Some(&(key, at)) = self.order.front() {
            if now_ns.saturating_sub(at) <= TIMEOUT_NS {
                break;
            }
            self.order.pop_front();
            if self.decided.get(&key).is_some_and(|d| d.at_ns == at) {
                self.decided.remove(&key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_wire::IpAddr128;

    fn key(ident: u32) -> FragmentKey {
        FragmentKey {
            src: IpAddr128::from_v4([10, 0, 0, 1]),
            dst: IpAddr128::from_v4([10, 0, 0, 2]),
            protocol: 17,
            ident,
        }
    }

    #[test]
    fn later_fragments_get_the_first_ones_fate_until_it_is_forgotten() {
        let mut f = Followers::default();
        let dropped = PacketResult::of(Fate::Dropped(1));
        f.decide(key(1), &dropped, 0);
        assert_eq!(f.follow(&key(1), &[], 5).map(|r| r.fate), Some(Fate::Dropped(1)));
        assert_eq!(f.follow(&key(2), &[], 5), None);
        assert_eq!(f.follow(&key(1), &[], TIMEOUT_NS + 1), None);
        f.decide(key(3), &dropped, TIMEOUT_NS + 2);
        assert_eq!(f.len(), 1, "the expired datagram is forgotten");
    }

    #[test]
    fn the_table_is_bounded() {
        let mut f = Followers::default();
        let fwd = PacketResult::of(Fate::Forward(0));
        for i in 0..(MAX_DATAGRAMS as u32 + 10) {
            f.decide(key(i), &fwd, 1);
        }
        assert_eq!(f.len(), MAX_DATAGRAMS);
        assert_eq!(f.follow(&key(0), &[], 1), None, "the oldest went first");
        assert!(f.follow(&key(MAX_DATAGRAMS as u32 + 9), &[], 1).is_some());
    }
}
