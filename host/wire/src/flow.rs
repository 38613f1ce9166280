//! Flow keys: the 5-tuple, its direction-normalized form and a symmetric hash.

/// An IP address in 128 bits; IPv4 is stored IPv4-mapped (`::ffff:a.b.c.d`)
/// so that keys of both families have one fixed size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct IpAddr128(pub u128);

const V4_MAPPED_PREFIX: u128 = 0xffff_0000_0000;

impl IpAddr128 {
    /// An IPv4 address.
    #[inline]
    pub const fn from_v4(a: [u8; 4]) -> Self {
        IpAddr128(V4_MAPPED_PREFIX | u32::from_be_bytes(a) as u128)
    }

    /// An IPv6 address.
    pub const fn from_v6(a: [u8; 16]) -> Self {
        IpAddr128(u128::from_be_bytes(a))
    }

    /// The IPv4 address, if this is an IPv4-mapped address.
    pub const fn to_v4(self) -> Option<[u8; 4]> {
        if self.0 >> 32 == V4_MAPPED_PREFIX >> 32 { Some((self.0 as u32).to_be_bytes()) } else { None }
    }

    /// The 16 bytes of the address.
    pub const fn to_v6(self) -> [u8; 16] {
        self.0.to_be_bytes()
    }

    /// High 64 bits (the `hi` of the WIT `ip-addr`).
    #[inline]
    pub const fn hi(self) -> u64 {
        (self.0 >> 64) as u64
    }

    /// Low 64 bits (the `lo` of the WIT `ip-addr`).
    #[inline]
    pub const fn lo(self) -> u64 {
        self.0 as u64
    }

    /// Builds an address from the WIT `ip-addr` halves.
    pub const fn from_parts(hi: u64, lo: u64) -> Self {
        IpAddr128(((hi as u128) << 64) | lo as u128)
    }

    /// The address as a `u64` key for counter tables: an IPv4 address as
    /// its 32-bit number (readable in reports), an IPv6 address as a 63-bit
    /// hash with the top bit set (so the two never collide).
    pub const fn key64(self) -> u64 {
        match self.to_v4() {
            Some(v4) => u32::from_be_bytes(v4) as u64,
            None => (self.hi() ^ self.lo().rotate_left(17)).wrapping_mul(0x9e37_79b9_7f4a_7c15) | (1 << 63),
        }
    }
}

impl core::fmt::Display for IpAddr128 {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.to_v4() {
            Some(v4) => core::fmt::Display::fmt(&std::net::Ipv4Addr::from(v4), f),
            None => core::fmt::Display::fmt(&std::net::Ipv6Addr::from(self.to_v6()), f),
        }
    }
}

impl From<std::net::IpAddr> for IpAddr128 {
    fn from(a: std::net::IpAddr) -> Self {
        match a {
            std::net::IpAddr::V4(v4) => IpAddr128::from_v4(v4.octets()),
            std::net::IpAddr::V6(v6) => IpAddr128::from_v6(v6.octets()),
        }
    }
}

/// The 5-tuple of an IP packet in the packet's own direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct FlowKey {
    /// Sender address.
    pub src: IpAddr128,
    /// Receiver address.
    pub dst: IpAddr128,
    /// Sender port (TCP/UDP), echo identifier (ICMP echo), else 0.
    pub src_port: u16,
    /// Receiver port (TCP/UDP), echo identifier (ICMP echo), else 0.
    pub dst_port: u16,
    /// IP protocol number.
    pub protocol: u8,
}

impl FlowKey {
    /// The same flow seen from the other side.
    #[inline]
    pub const fn reversed(&self) -> FlowKey {
        FlowKey {
            src: self.dst,
            dst: self.src,
            src_port: self.dst_port,
            dst_port: self.src_port,
            protocol: self.protocol,
        }
    }

    /// Whether this key is already in normalized order: the endpoint with
    /// the lower (address, port) is the source.
    #[inline]
    pub fn is_normalized(&self) -> bool {
        (self.src, self.src_port) <= (self.dst, self.dst_port)
    }

    /// The direction-normalized key: both directions of a connection give
    /// the same value.
    #[inline]
    pub fn normalized(&self) -> FlowKey {
        if self.is_normalized() { *self } else { self.reversed() }
    }

    /// A hash of the normalized key. Both directions of a connection hash
    /// the same, so the host can pin a connection to one worker. The
    /// function is fixed (not seeded) so host and guests agree on it.
    pub fn symmetric_hash(&self) -> u64 {
        self.normalized().hash_normalized()
    }

    /// The normalized key and whether this key was reversed to get it
    /// (i.e. whether the packet travels against the normalized direction).
    #[inline]
    pub fn normalize(&self) -> (FlowKey, bool) {
        if self.is_normalized() { (*self, false) } else { (self.reversed(), true) }
    }

    /// [`symmetric_hash`](Self::symmetric_hash) of a key that is already
    /// normalized (saves normalizing twice on the hot path).
    #[inline]
    pub fn hash_normalized(&self) -> u64 {
        let fold = |a: IpAddr128| a.hi() ^ a.lo().rotate_left(29);
        let ports = (u64::from(self.src_port) << 24) | (u64::from(self.dst_port) << 8) | u64::from(self.protocol);
        let h = mix(mix(fold(self.src), fold(self.dst)), ports);
        // Zero means "no flow" in the batch metadata.
        if h == 0 { 1 } else { h }
    }

    /// A hash of the two addresses alone, the same both ways: every
    /// connection between the same two hosts hashes the same (what a NIC's
    /// RSS gives when it hashes IP addresses only). Fixed, like
    /// [`symmetric_hash`](Self::symmetric_hash).
    pub fn address_hash(&self) -> u64 {
        let fold = |a: IpAddr128| a.hi() ^ a.lo().rotate_left(29);
        let (lo, hi) = if self.src <= self.dst { (self.src, self.dst) } else { (self.dst, self.src) };
        let h = mix(mix(fold(lo), fold(hi)), 0x5bd1_e995);
        if h == 0 { 1 } else { h }
    }

    /// Length of [`to_bytes`](Self::to_bytes).
    pub const ENCODED_LEN: usize = 37;

    /// The key as 37 bytes: source and destination address (16 bytes each,
    /// IPv4 as `::ffff:a.b.c.d`), source and destination port (big-endian),
    /// protocol. This is how `sluice:nf@0.2.0` names a flow to an NF (the
    /// `expired` export) and how exported flow state names its flow.
    pub fn to_bytes(&self) -> [u8; Self::ENCODED_LEN] {
        let mut out = [0u8; Self::ENCODED_LEN];
        let (src, rest) = out.split_at_mut(16);
        src.copy_from_slice(&self.src.0.to_be_bytes());
        let (dst, rest) = rest.split_at_mut(16);
        dst.copy_from_slice(&self.dst.0.to_be_bytes());
        let (sp, rest) = rest.split_at_mut(2);
        sp.copy_from_slice(&self.src_port.to_be_bytes());
        let (dp, proto) = rest.split_at_mut(2);
        dp.copy_from_slice(&self.dst_port.to_be_bytes());
        if let Some(p) = proto.first_mut() {
            *p = self.protocol;
        }
        out
    }

    /// The inverse of [`to_bytes`](Self::to_bytes); `None` unless `b` is
    /// exactly 37 bytes.
    pub fn from_bytes(b: &[u8]) -> Option<FlowKey> {
        let b: &[u8; Self::ENCODED_LEN] = b.try_into().ok()?;
        let (src, rest) = b.split_first_chunk::<16>()?;
        let (dst, rest) = rest.split_first_chunk::<16>()?;
        let (sp, rest) = rest.split_first_chunk::<2>()?;
        let (dp, rest) = rest.split_first_chunk::<2>()?;
        Some(FlowKey {
            src: IpAddr128(u128::from_be_bytes(*src)),
            dst: IpAddr128(u128::from_be_bytes(*dst)),
            src_port: u16::from_be_bytes(*sp),
            dst_port: u16::from_be_bytes(*dp),
            protocol: *rest.first()?,
        })
    }
}

/// A 64-bit mixing step (multiply-xorshift, as in wyhash/FxHash family).
#[inline]
fn mix(a: u64, b: u64) -> u64 {
    let m = u128::from(a ^ 0x9e37_79b9_7f4a_7c15).wrapping_mul(u128::from(b ^ 0xe703_7ed1_a0b4_28db));
    ((m >> 64) as u64) ^ (m as u64)
}

impl core::fmt::Display for FlowKey {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{} {}:{} -> {}:{}", self.protocol, self.src, self.src_port, self.dst, self.dst_port)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(a: u8, b: u8, sp: u16, dp: u16) -> FlowKey {
        FlowKey {
            src: IpAddr128::from_v4([10, 0, 0, a]),
            dst: IpAddr128::from_v4([10, 0, 0, b]),
            src_port: sp,
            dst_port: dp,
            protocol: 6,
        }
    }

    #[test]
    fn v4_mapping_round_trips() {
        let a = IpAddr128::from_v4([192, 0, 2, 1]);
        assert_eq!(a.to_v4(), Some([192, 0, 2, 1]));
        assert_eq!(a.to_string(), "192.0.2.1");
        assert_eq!(IpAddr128::from_v6([0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]).to_v4(), None);
        assert_eq!(IpAddr128::from_parts(a.hi(), a.lo()), a);
    }

    proptest::proptest! {
        #[test]
        fn both_directions_hash_alike(a in 0u8..255, b in 0u8..255, sp in proptest::num::u16::ANY, dp in proptest::num::u16::ANY) {
            let k = key(a, b, sp, dp);
            proptest::prop_assert_eq!(k.symmetric_hash(), k.reversed().symmetric_hash());
            proptest::prop_assert_eq!(k.address_hash(), k.reversed().address_hash());
            let other_ports = FlowKey { src_port: k.src_port ^ 1, dst_port: k.dst_port ^ 7, ..k };
            proptest::prop_assert_eq!(k.address_hash(), other_ports.address_hash());
            proptest::prop_assert_eq!(k.normalized(), k.reversed().normalized());
            proptest::prop_assert!(k.normalized().is_normalized());
        }

        #[test]
        fn bytes_round_trip(src in proptest::num::u128::ANY, dst in proptest::num::u128::ANY, sp in proptest::num::u16::ANY, dp in proptest::num::u16::ANY, p in proptest::num::u8::ANY) {
            let k = FlowKey { src: IpAddr128(src), dst: IpAddr128(dst), src_port: sp, dst_port: dp, protocol: p };
            proptest::prop_assert_eq!(FlowKey::from_bytes(&k.to_bytes()), Some(k));
            proptest::prop_assert_eq!(FlowKey::from_bytes(&k.to_bytes()[..36]), None);
        }
    }
}
