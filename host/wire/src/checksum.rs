//! Internet checksums (RFC 1071) and their incremental update (RFC 1624).
//!
//! NFs that rewrite an address or port (NAT, load balancers) must fix the IP
//! and transport checksums. Recomputing over the whole segment costs a pass
//! over the payload; the incremental form costs a few additions, which is why
//! the rewrite helpers use it.

/// Adds `data` to a running one's-complement sum (not yet folded).
#[inline]
pub fn sum(mut acc: u32, data: &[u8]) -> u32 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        if let &[a, b] = c {
            acc = acc.wrapping_add(u32::from(u16::from_be_bytes([a, b])));
        }
    }
    if let Some(&last) = chunks.remainder().first() {
        acc = acc.wrapping_add(u32::from(last) << 8);
    }
    acc
}

/// Folds a running sum to 16 bits (without complementing it).
#[inline]
pub fn fold(mut acc: u32) -> u16 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

/// The checksum of `data`: the complement of its folded one's-complement sum.
#[inline]
pub fn checksum(data: &[u8]) -> u16 {
    !fold(sum(0, data))
}

/// Updates `old_checksum` for one 16-bit word changing from `old` to `new`
/// (RFC 1624, eqn. 3: `HC' = ~(~HC + ~m + m')`).
#[inline]
pub fn update_u16(old_checksum: u16, old: u16, new: u16) -> u16 {
    let acc = u32::from(!old_checksum) + u32::from(!old) + u32::from(new);
    !fold(acc)
}

/// Updates `old_checksum` for a byte string (an address, 4 or 16 bytes)
/// changing from `old` to `new`. Both must have the same even length.
#[inline]
pub fn update_bytes(old_checksum: u16, old: &[u8], new: &[u8]) -> u16 {
    let mut acc = u32::from(!old_checksum);
    for c in old.chunks_exact(2) {
        if let &[a, b] = c {
            acc += u32::from(!u16::from_be_bytes([a, b]));
        }
    }
    for c in new.chunks_exact(2) {
        if let &[a, b] = c {
            acc += u32::from(u16::from_be_bytes([a, b]));
        }
        acc = (acc & 0xffff) + (acc >> 16);
    }
    !fold(acc)
}

/// One's-complement sum of the IPv4 pseudo-header for a transport checksum.
#[inline]
pub fn pseudo_header_v4(src: [u8; 4], dst: [u8; 4], protocol: u8, len: u16) -> u32 {
    let mut acc = sum(0, &src);
    acc = sum(acc, &dst);
    acc + u32::from(protocol) + u32::from(len)
}

/// One's-complement sum of the IPv6 pseudo-header for a transport checksum.
#[inline]
pub fn pseudo_header_v6(src: [u8; 16], dst: [u8; 16], next_header: u8, len: u32) -> u32 {
    let mut acc = sum(0, &src);
    acc = sum(acc, &dst);
    acc.wrapping_add(len >> 16).wrapping_add(len & 0xffff).wrapping_add(u32::from(next_header))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc1071_example() {
        // The example bytes of RFC 1071 §3.
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(fold(sum(0, &data)), 0xddf2);
        assert_eq!(checksum(&data), !0xddf2);
    }

    #[test]
    fn odd_length_pads_with_zero() {
        assert_eq!(sum(0, &[0x12]), 0x1200);
    }

    proptest::proptest! {
        #[test]
        fn incremental_matches_full(mut data in proptest::collection::vec(proptest::num::u8::ANY, 4..64), idx in 0usize..30, new in proptest::num::u16::ANY) {
            let words = data.len() / 2;
            let i = (idx % words) * 2;
            let before = checksum(&data);
            let old = u16::from_be_bytes([data[i], data[i + 1]]);
            data[i..i + 2].copy_from_slice(&new.to_be_bytes());
            let after = checksum(&data);
            let inc = update_u16(before, old, new);
            // 0x0000 and 0xffff are the same value in one's complement.
            proptest::prop_assert!(inc == after || (inc == 0xffff && after == 0) || (inc == 0 && after == 0xffff));
        }

        #[test]
        fn incremental_bytes_matches_full(mut data in proptest::collection::vec(proptest::num::u8::ANY, 8..64), new in proptest::array::uniform4(proptest::num::u8::ANY)) {
            let before = checksum(&data);
            let old: [u8; 4] = [data[0], data[1], data[2], data[3]];
            data[0..4].copy_from_slice(&new);
            let after = checksum(&data);
            let inc = update_bytes(before, &old, &new);
            proptest::prop_assert!(inc == after || (inc == 0xffff && after == 0) || (inc == 0 && after == 0xffff));
        }
    }
}
