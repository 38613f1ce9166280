//! Release pools split between a group's hosts.
//!
//! A release pool (a NAT's public ports, say) is global: one resource is
//! held by one flow at a time on the whole group. The group splits it by
//! *blocks* of [`POOL_BLOCK`] consecutive resources (by absolute value, so
//! a port's block is known without knowing the pool): a block belongs to
//! the owner of the table slot its hash falls in, exactly like a flow. So
//! the blocks follow the table's capacity weights and move as little as
//! flows do when members come and go, and a dispatcher sends a packet for
//! a pooled resource (a reply to a NAT's public port) to the host that
//! owns the resource's block ([`block_hash`] in place of the flow hash).

use crate::OwnershipTable;

/// Resources per block.
pub const POOL_BLOCK: u64 = 16;

/// The block of a resource.
pub fn block_of(resource: u64) -> u64 {
    resource / POOL_BLOCK
}

/// The resources of a block: `start..end`.
pub fn block_range(block: u64) -> (u64, u64) {
    (block.saturating_mul(POOL_BLOCK), block.saturating_mul(POOL_BLOCK).saturating_add(POOL_BLOCK))
}

/// The hash a block is placed by (in place of a flow's hash): consecutive
/// blocks land on unrelated slots (splitmix64).
pub fn block_hash(block: u64) -> u64 {
    let mut z = block.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl OwnershipTable {
    /// The hosts of a block in preference order: owner first, then the
    /// hosts that take it over.
    pub fn block_preferences(&self, block: u64) -> impl Iterator<Item = &str> + '_ {
        self.preferences(self.slot_of(block_hash(block)))
    }

    /// The owner of a block.
    pub fn block_owner(&self, block: u64) -> Option<&str> {
        self.block_preferences(block).next()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::Member;

    fn table(version: u64, hosts: &[&str]) -> OwnershipTable {
        let members: Vec<Member> = hosts.iter().map(|h| Member { host: (*h).to_string(), weight: 1 }).collect();
        OwnershipTable::build("g", version, 0, &members, crate::DEFAULT_SLOTS, 2).unwrap()
    }

    #[test]
    fn blocks_spread_over_members_and_move_little() {
        let three = table(1, &["a", "b", "c"]);
        let four = table(2, &["a", "b", "c", "d"]);
        // The ports 1024..65536 of a NAT.
        let blocks = block_of(1024)..block_of(65536);
        let n = blocks.end - blocks.start;
        for h in ["a", "b", "c"] {
            let mine = blocks.clone().filter(|b| three.block_owner(*b) == Some(h)).count() as f64;
            assert!((mine / n as f64 - 1.0 / 3.0).abs() < 0.05, "{h}: {mine} of {n}");
        }
        let moved = blocks.clone().filter(|b| three.block_owner(*b) != four.block_owner(*b)).count() as f64;
        assert!(moved / (n as f64) < 0.3, "{moved} of {n} blocks moved");
        // Nearly all of those that moved went to the newcomer (Maglev moves
        // a few slots between the others too).
        let to_d =
            blocks.filter(|b| three.block_owner(*b) != four.block_owner(*b) && four.block_owner(*b) == Some("d"));
        assert!(to_d.count() as f64 >= 0.9 * moved, "{moved} moved");
    }

    #[test]
    fn a_resource_is_in_one_block() {
        assert_eq!(block_of(1023), 63);
        assert_eq!(block_range(64), (1024, 1040));
        assert!((1024..1040).all(|r| block_of(r) == 64));
    }
}
