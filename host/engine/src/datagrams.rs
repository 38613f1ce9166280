//! Memories of IP datagrams by their fragments' key: where a datagram's
//! first fragment went, so that its later fragments follow.

/// A datagram's hash, from its fragments' key: how the memories of where
/// a datagram's first fragment went ([`Datagrams`]) name it.
pub fn datagram_hash(key: &sluice_wire::parse::FragmentKey) -> u64 {
    use std::hash::BuildHasher;
    foldhash::fast::FixedState::with_seed(0x000f_4a95).hash_one(key)
}

/// A worker's memory of where the first fragments of datagrams went in
/// the last [`DATAGRAM_NS`], so that their later fragments follow: a
/// direct-mapped table of (datagram hash, what the worker noted, when),
/// allocated at the first note. The dispatcher notes the datagrams it
/// passed on to the next worker, the DPDK I/O the home worker it handed
/// one to. A datagram that shares a slot with a newer one loses its entry
/// (its later fragments stay where they come in and are counted unmatched
/// by the chain).
#[derive(Debug)]
pub struct Datagrams<T> {
    slots: Vec<(u64, T, u64)>,
}

impl<T> Default for Datagrams<T> {
    fn default() -> Self {
        Datagrams { slots: Vec::new() }
    }
}

/// Slots of a worker's [`Datagrams`].
const DATAGRAM_SLOTS: usize = 1024;
/// How long a worker remembers a datagram, ns.
pub const DATAGRAM_NS: u64 = 1_000_000_000;

impl<T: Copy + Default> Datagrams<T> {
    /// Notes `value` for `datagram` at `now_ns`.
    pub fn note(&mut self, datagram: u64, value: T, now_ns: u64) {
        if self.slots.is_empty() {
            self.slots = vec![(0, T::default(), 0); DATAGRAM_SLOTS];
        }
        if let Some(s) = self.slots.get_mut(datagram as usize % DATAGRAM_SLOTS) {
            *s = (datagram, value, now_ns.max(1));
        }
    }

    /// What was noted for `datagram` within [`DATAGRAM_NS`] of `now_ns`.
    pub fn get(&self, datagram: u64, now_ns: u64) -> Option<T> {
        self.slots
            .get(datagram as usize % DATAGRAM_SLOTS)
            .filter(|&&(d, _, at)| d == datagram && at != 0 && now_ns.saturating_sub(at) < DATAGRAM_NS)
            .map(|&(_, v, _)| v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_datagram_is_remembered_for_a_second_and_loses_its_slot_to_a_newer_one() {
        let mut d = Datagrams::<u16>::default();
        assert_eq!(d.get(7, 1), None, "nothing noted yet");
        d.note(7, 3, 1_000);
        assert_eq!(d.get(7, 2_000), Some(3));
        assert_eq!(d.get(8, 2_000), None, "another datagram");
        assert_eq!(d.get(7, 1_000 + DATAGRAM_NS), None, "a second later");
        d.note(7 + DATAGRAM_SLOTS as u64, 1, 3_000);
        assert_eq!(d.get(7, 4_000), None, "its slot went to a newer datagram");
        assert_eq!(d.get(7 + DATAGRAM_SLOTS as u64, 4_000), Some(1));
    }
}
