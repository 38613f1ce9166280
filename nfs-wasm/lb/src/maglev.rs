//! Maglev consistent hashing (Eisenbud et al., NSDI '16, §3.4): a lookup
//! table of prime size M in which every backend owns about M/N entries,
//! filled from per-backend permutations so that adding or removing one
//! backend moves only about 1/N of the entries.

/// A fixed, unseeded 64-bit hash (FNV-1a then a final mix), so every
/// instance of the NF builds the same table from the same backends.
pub fn hash(bytes: &[u8], seed: u64) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ seed;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^ (h >> 33)
}

/// The lookup table: entry → backend index.
#[derive(Debug, Clone)]
pub struct Table {
    entries: Vec<u32>,
}

impl Table {
    /// Builds the table for backends named by `names` (their identity, e.g.
    /// "10.1.0.1:80"); `size` must be prime and larger than the backend
    /// count.
    pub fn build(names: &[String], size: usize) -> Result<Table, String> {
        if names.is_empty() {
            return Err("no backends".into());
        }
        if size <= names.len() || !is_prime(size) {
            return Err(format!("table size {size} must be a prime larger than the number of backends"));
        }
        let m = size as u64;
        let perms: Vec<(u64, u64)> =
            names.iter().map(|n| (hash(n.as_bytes(), 0xdead) % m, hash(n.as_bytes(), 0xbeef) % (m - 1) + 1)).collect();
        let mut next = vec![0u64; names.len()];
        let mut entries = vec![u32::MAX; size];
        let mut filled = 0;
        'fill: loop {
            for (i, &(offset, skip)) in perms.iter().enumerate() {
                let Some(n) = next.get_mut(i) else { continue };
                // Walk backend i's permutation to its next free entry.
                loop {
                    let c = ((offset + *n * skip) % m) as usize;
                    *n += 1;
                    if let Some(e) = entries.get_mut(c)
                        && *e == u32::MAX
                    {
                        *e = i as u32;
                        filled += 1;
                        break;
                    }
                }
                if filled == size {
                    break 'fill;
                }
            }
        }
        Ok(Table { entries })
    }

    /// The backend index for a flow hash.
    pub fn lookup(&self, flow_hash: u64) -> usize {
        let n = self.entries.len() as u64;
        self.entries.get((flow_hash % n) as usize).map(|&b| b as usize).unwrap_or(0)
    }

    /// How many entries each backend owns.
    pub fn shares(&self, backends: usize) -> Vec<usize> {
        let mut v = vec![0; backends];
        for &e in &self.entries {
            if let Some(c) = v.get_mut(e as usize) {
                *c += 1;
            }
        }
        v
    }
}

fn is_prime(n: usize) -> bool {
    n >= 2 && (2..).take_while(|d| d * d <= n).all(|d| !n.is_multiple_of(d))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("10.1.0.{i}:80")).collect()
    }

    #[test]
    fn shares_are_balanced() {
        let t = Table::build(&names(5), 65537).unwrap();
        for s in t.shares(5) {
            assert!((13000..=13215).contains(&s), "{s}");
        }
    }

    #[test]
    fn adding_a_backend_moves_few_entries() {
        let a = Table::build(&names(5), 65537).unwrap();
        let b = Table::build(&names(6), 65537).unwrap();
        let moved = (0..65537u64).filter(|&h| a.lookup(h) != b.lookup(h)).count();
        // Ideal is 1/6 of the entries; Maglev stays close to it.
        assert!(moved < 65537 * 22 / 100, "{moved}");
    }

    #[test]
    fn bad_sizes_are_refused() {
        assert!(Table::build(&names(3), 100).is_err());
        assert!(Table::build(&names(3), 3).is_err());
        assert!(Table::build(&[], 7).is_err());
    }
}
