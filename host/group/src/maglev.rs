//! Weighted Maglev population (Eisenbud et al., NSDI 2016, §3.4).
//!
//! Each member has a permutation of the slots, derived from its name alone
//! (`offset + j * skip mod M`, `M` prime): the same member prefers the same
//! slots in every table it is part of, which is what keeps movement small
//! when membership changes. Members take turns claiming their next
//! preferred free slot; a member's turns are proportional to its weight
//! (a credit of `weight` per round, one slot per `max weight` of credit),
//! so shares follow weights.

use sha2::{Digest, Sha256};

/// A member's permutation of the slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Permutation {
    offset: u64,
    skip: u64,
}

impl Permutation {
    /// The permutation of member `name` over `slots` slots (`slots` prime,
    /// at least 2). Derived from SHA-256 of the name, so it is the same in
    /// every process and every version.
    pub(crate) fn of(name: &str, slots: usize) -> Permutation {
        let d = Sha256::digest(name.as_bytes());
        let word = |i: usize| {
            let mut b = [0u8; 8];
            for (k, out) in b.iter_mut().enumerate() {
                *out = d.get(i * 8 + k).copied().unwrap_or(0);
            }
            u64::from_le_bytes(b)
        };
        let m = slots as u64;
        Permutation { offset: word(0) % m, skip: word(1) % (m - 1).max(1) + 1 }
    }

    fn at(&self, j: u64, slots: u64) -> usize {
        // offset, skip < slots ≤ u32::MAX: no overflow in u128.
        ((u128::from(self.offset) + u128::from(j) * u128::from(self.skip)) % u128::from(slots)) as usize
    }
}

/// Marks a slot no member has claimed.
pub(crate) const FREE: u16 = u16::MAX;

/// Fills `slots` entries with the indices (into `perms`/`weights`) of the
/// members in `members`, by weighted Maglev. Returns `None` when `members`
/// is empty or every weight is 0.
pub(crate) fn populate(perms: &[Permutation], weights: &[u64], members: &[u16], slots: usize) -> Option<Vec<u16>> {
    let max_weight = members.iter().filter_map(|&i| weights.get(usize::from(i))).copied().max()?;
    if max_weight == 0 || slots == 0 {
        return None;
    }
    let m = slots as u64;
    let mut entry = vec![FREE; slots];
    let mut next = vec![0u64; members.len()];
    let mut credit = vec![0u64; members.len()];
    let mut filled = 0usize;
    loop {
        for (k, &i) in members.iter().enumerate() {
            let (Some(perm), Some(&w)) = (perms.get(usize::from(i)), weights.get(usize::from(i))) else {
                continue;
            };
            let (Some(c), Some(n)) = (credit.get_mut(k), next.get_mut(k)) else { continue };
            *c += w;
            while *c >= max_weight {
                *c -= max_weight;
                // A prime slot count makes every permutation visit every
                // slot within `m` steps, and a free slot remains.
                while *n < m {
                    let slot = perm.at(*n, m);
                    *n += 1;
                    if let Some(e) = entry.get_mut(slot)
                        && *e == FREE
                    {
                        *e = i;
                        filled += 1;
                        break;
                    }
                }
                if filled == slots {
                    return Some(entry);
                }
            }
        }
    }
}

/// Whether `n` is prime (for checking a slot count).
pub(crate) fn is_prime(n: usize) -> bool {
    if n < 2 {
        return false;
    }
    let mut d = 2usize;
    while d.saturating_mul(d) <= n {
        if n.is_multiple_of(d) {
            return false;
        }
        d += 1;
    }
    true
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;

    #[test]
    fn permutations_visit_every_slot() {
        let p = Permutation::of("h1", 13);
        let mut seen: Vec<usize> = (0..13).map(|j| p.at(j, 13)).collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..13).collect::<Vec<_>>());
    }

    #[test]
    fn shares_follow_weights() {
        let names = ["a", "b", "c"];
        let perms: Vec<_> = names.iter().map(|n| Permutation::of(n, 4099)).collect();
        let weights = [1u64, 2, 1];
        let e = populate(&perms, &weights, &[0, 1, 2], 4099).unwrap();
        let count = |i: u16| e.iter().filter(|&&x| x == i).count();
        assert!(e.iter().all(|&x| x != FREE));
        assert!((count(1) as f64 / 4099.0 - 0.5).abs() < 0.01, "{}", count(1));
        assert!((count(0) as f64 / 4099.0 - 0.25).abs() < 0.01, "{}", count(0));
    }

    #[test]
    fn primes() {
        assert!(is_prime(16381) && is_prime(2) && is_prime(4099));
        assert!(!is_prime(16383) && !is_prime(1) && !is_prime(0));
    }
}
