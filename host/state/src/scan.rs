//! Listing a table (`sluice:nf@0.4.0`): `scan` pages in ascending key
//! order and `top-k`.
//!
//! No table keeps its keys in order (they are hash maps, one per worker
//! or shard), so each call makes one pass over the entries the worker
//! reads and keeps only what it returns: the `limit` smallest keys after
//! the cursor in a bounded ordered map ([`Smallest`]), or the `k` largest
//! counters in a bounded heap ([`Largest`]). A call's work is therefore
//! one pass over the table (its capacity bounds it) plus O(page · log
//! page), and its memory is the page. The cursor is the page's last key,
//! so nothing is kept between calls and a key is never returned twice in
//! one scan: every page starts strictly after the previous one's last key.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

/// Most entries one `scan` page holds and most pairs one `top-k` returns,
/// whatever the NF asks for: a call's result (and the guest memory the
/// host writes it into) stays bounded, 16 KiB of counter pairs or at most
/// 1024 byte entries, while a full scan of a default-capacity table
/// (65,536 entries) still takes only 64 calls.
pub const MAX_SCAN: usize = 1024;

/// One page of a scan (mirrors `sluice:nf/state.scan-page`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScanPage {
    /// Counter tables: `(key, value)`, keys ascending.
    pub counters: Vec<(u64, u64)>,
    /// Byte tables: framed key, value, ... (keys ascending bytewise);
    /// pools: framed 8-byte little-endian resource, value, ...
    pub entries: Vec<u8>,
    /// The cursor of the next page: the page's last key; empty when no
    /// entry comes after it.
    pub cursor: Vec<u8>,
    /// Entries in the page (what the meters count).
    pub len: usize,
}

/// The entries a page holds for a requested `limit`: 0 or more than
/// [`MAX_SCAN`] ask for [`MAX_SCAN`].
pub fn page_limit(limit: u32) -> usize {
    match usize::try_from(limit) {
        Ok(0) | Err(_) => MAX_SCAN,
        Ok(n) => n.min(MAX_SCAN),
    }
}

/// The pairs a `top-k` returns for a requested `k`: at most [`MAX_SCAN`].
pub fn top_limit(k: u32) -> usize {
    usize::try_from(k).map_or(MAX_SCAN, |k| k.min(MAX_SCAN))
}

/// The `limit` smallest distinct keys offered that come after `after`,
/// with their values, and whether any other key after `after` was
/// offered.
#[derive(Debug)]
pub(crate) struct Smallest<K: Ord, V> {
    after: Option<K>,
    limit: usize,
    page: BTreeMap<K, V>,
    more: bool,
}

impl<K: Ord, V> Smallest<K, V> {
    /// A selection of at most `limit` (at least 1) keys after `after`.
    pub(crate) fn new(after: Option<K>, limit: usize) -> Self {
        Smallest { after, limit: limit.max(1), page: BTreeMap::new(), more: false }
    }

    /// Offers one entry; each key at most once per pass.
    pub(crate) fn offer(&mut self, key: K, value: V) {
        if self.after.as_ref().is_some_and(|a| key <= *a) {
            return;
        }
        if self.page.len() < self.limit {
            self.page.insert(key, value);
            return;
        }
        // Full: the key goes in if it is smaller than the largest kept,
        // which then leaves; either way a key after the page exists.
        if self.page.last_key_value().is_some_and(|(max, _)| key < *max) {
            if self.page.insert(key, value).is_none() {
                self.page.pop_last();
                self.more = true;
            }
        } else if self.page.last_key_value().is_some_and(|(max, _)| key > *max) {
            self.more = true;
        }
    }

    /// The page, keys ascending, and whether keys come after it.
    pub(crate) fn finish(self) -> (Vec<(K, V)>, bool) {
        (self.page.into_iter().collect(), self.more)
    }
}

/// The `k` largest counters offered, largest first, equal values by
/// ascending key.
#[derive(Debug)]
pub(crate) struct Largest {
    k: usize,
    /// A min-heap of the best so far: the worst kept is on top.
    heap: BinaryHeap<Reverse<(u64, Reverse<u64>)>>,
}

impl Largest {
    pub(crate) fn new(k: usize) -> Self {
        Largest { k, heap: BinaryHeap::with_capacity(k.saturating_add(1).min(MAX_SCAN + 1)) }
    }

    /// Offers one counter; each key at most once per pass.
    pub(crate) fn offer(&mut self, key: u64, value: u64) {
        if self.k == 0 {
            return;
        }
        let rank = (value, Reverse(key));
        if self.heap.len() == self.k {
            match self.heap.peek() {
                Some(Reverse(worst)) if rank > *worst => {
                    self.heap.pop();
                }
                _ => return,
            }
        }
        self.heap.push(Reverse(rank));
    }

    /// `(key, value)`, largest value first, equal values by ascending key.
    pub(crate) fn finish(self) -> Vec<(u64, u64)> {
        let mut v: Vec<(u64, u64)> = self.heap.into_iter().map(|Reverse((value, Reverse(key)))| (key, value)).collect();
        v.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        v
    }
}

/// A counter or pool cursor: empty (the start) or 8 bytes little-endian.
pub(crate) fn u64_cursor(cursor: &[u8]) -> Option<Option<u64>> {
    if cursor.is_empty() {
        return Some(None);
    }
    <[u8; 8]>::try_from(cursor).ok().map(|b| Some(u64::from_le_bytes(b)))
}

/// A page of counters.
pub(crate) fn counter_page(counters: Vec<(u64, u64)>, more: bool) -> ScanPage {
    let cursor = match counters.last() {
        Some((k, _)) if more => k.to_le_bytes().to_vec(),
        _ => Vec::new(),
    };
    ScanPage { len: counters.len(), counters, entries: Vec::new(), cursor }
}

/// A page of framed entries whose last key is `last`.
pub(crate) fn framed_page(entries: Vec<u8>, len: usize, last: Option<&[u8]>, more: bool) -> ScanPage {
    let cursor = match last {
        Some(k) if more => k.to_vec(),
        _ => Vec::new(),
    };
    ScanPage { counters: Vec::new(), entries, cursor, len }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;

    #[test]
    fn a_page_keeps_the_smallest_keys_after_the_cursor_and_says_if_more_follow() {
        let mut s = Smallest::new(Some(3u64), 2);
        for k in [9, 1, 5, 3, 4, 7] {
            s.offer(k, k * 10);
        }
        assert_eq!(s.finish(), (vec![(4, 40), (5, 50)], true));
        let mut s = Smallest::new(Some(5u64), 2);
        for k in [9, 1, 5, 3, 4, 7] {
            s.offer(k, k * 10);
        }
        assert_eq!(s.finish(), (vec![(7, 70), (9, 90)], false));
        let mut s = Smallest::<u64, u64>::new(None, 0);
        s.offer(1, 1);
        s.offer(1, 1);
        assert_eq!(s.finish(), (vec![(1, 1)], false));
    }

    #[test]
    fn the_largest_counters_come_first_and_ties_go_to_the_smaller_key() {
        let mut l = Largest::new(3);
        for (k, v) in [(5, 10), (1, 3), (2, 10), (9, 10), (3, 11), (4, 0)] {
            l.offer(k, v);
        }
        assert_eq!(l.finish(), vec![(3, 11), (2, 10), (5, 10)]);
        let mut l = Largest::new(0);
        l.offer(1, 1);
        assert!(l.finish().is_empty());
    }

    #[test]
    fn limits_are_bounded_by_the_host() {
        assert_eq!(page_limit(0), MAX_SCAN);
        assert_eq!(page_limit(u32::MAX), MAX_SCAN);
        assert_eq!(page_limit(7), 7);
        assert_eq!(top_limit(0), 0);
        assert_eq!(top_limit(u32::MAX), MAX_SCAN);
    }
}
