//! IP fragments and the IP length checks the host makes before any NF sees
//! a frame.
//!
//! - [`inspect`] reads, from a frame's IP header only, where the datagram
//!   ends and whether it is a fragment (and which datagram's).
//! - [`Template`] holds what an NF changed in a datagram's first fragment
//!   (link header, addresses, TTL/hop limit, DSCP) and applies the same to
//!   its later fragments, which carry no transport header for an NF to
//!   decide on.
//! - [`split_ipv4`] cuts an IPv4 datagram into fragments that fit an MTU
//!   (RFC 791 §3.2), for a datagram that leaves larger than its port takes.

use crate::bytes::{set_slice, set_u8, set_u16, u8_at, u16_at};
use crate::ipv4::{self, Ipv4Packet};
use crate::ipv6::Ipv6Packet;

pub use crate::parse::{Fragment, FragmentKey, IpFacts};

/// Reads the IP header of an Ethernet frame: `None` for frames that are not
/// IP or whose IP header is malformed (those are left to the NFs, which see
/// them as they are). The same facts as [`crate::parse`]'s `ip`, which
/// reads them in its one pass over the frame.
#[inline]
pub fn inspect(frame: &[u8]) -> Option<IpFacts> {
    crate::parse(frame).ip
}

/// What an NF changed in a first fragment, to change in its datagram's
/// later fragments alike.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    /// The link header (Ethernet and tags) the first fragment left with.
    link: Vec<u8>,
    /// Source and destination addresses (4 or 16 bytes each).
    src: Vec<u8>,
    dst: Vec<u8>,
    /// TTL or hop limit.
    ttl: u8,
    /// DSCP/ECN or traffic class.
    tos: u8,
    v6: bool,
}

impl Template {
    /// The template of a first fragment as it left the chain (`after`).
    /// `None` when it is not IP any more.
    pub fn of(after: &[u8]) -> Option<Template> {
        let facts = inspect(after)?;
        let link = after.get(..facts.l3)?.to_vec();
        let ip = after.get(facts.l3..)?;
        if facts.v6 {
            let p = Ipv6Packet::new_checked(ip).ok()?;
            Some(Template {
                link,
                src: p.src().to_vec(),
                dst: p.dst().to_vec(),
                ttl: p.hop_limit(),
                tos: p.traffic_class(),
                v6: true,
            })
        } else {
            let p = Ipv4Packet::new_checked(ip).ok()?;
            Some(Template { link, src: p.src().to_vec(), dst: p.dst().to_vec(), ttl: p.ttl(), tos: p.tos(), v6: false })
        }
    }

    /// A later fragment of the same datagram with the same changes: its
    /// link header replaced, its addresses, TTL/hop limit and DSCP set as
    /// in the template (the IPv4 header checksum recomputed). `None` when
    /// `later` is not an IP fragment of the template's IP version.
    pub fn apply(&self, later: &[u8]) -> Option<Vec<u8>> {
        let facts = inspect(later)?;
        if facts.v6 != self.v6 {
            return None;
        }
        let ip = later.get(facts.l3..)?;
        let mut out = Vec::with_capacity(self.link.len() + ip.len());
        out.extend_from_slice(&self.link);
        let l3 = out.len();
        out.extend_from_slice(ip);
        let hdr = out.get_mut(l3..)?;
        if self.v6 {
            set_slice(hdr, 8..24, &self.src);
            set_slice(hdr, 24..40, &self.dst);
            set_u8(hdr, 7, self.ttl);
            // Traffic class: the 8 bits after the version nibble.
            let word = u16_at(hdr, 0..2);
            let word = (word & 0xf00f) | (u16::from(self.tos) << 4);
            set_u16(hdr, 0..2, word);
        } else {
            set_slice(hdr, ipv4::field::SRC, &self.src);
            set_slice(hdr, ipv4::field::DST, &self.dst);
            set_u8(hdr, ipv4::field::TTL, self.ttl);
            set_u8(hdr, ipv4::field::TOS, self.tos);
            Ipv4Packet::new_unchecked(hdr).fill_checksum();
        }
        Some(out)
    }
}

/// Why a datagram could not be cut to fit an MTU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SplitError {
    /// Not an IPv4 datagram (IPv6 is fragmented only by its source).
    NotIpv4,
    /// Its Don't Fragment bit is set.
    DontFragment,
    /// The MTU leaves no room for 8 bytes of data after the header.
    MtuTooSmall,
}

/// Cuts the IPv4 datagram in `frame` into frames whose IP part is at most
/// `mtu` bytes, each with the frame's link header, in order. Options
/// marked "copied" go into every fragment, the others only into the first
/// (RFC 791 §3.1). A datagram that already fits is returned whole.
pub fn split_ipv4(frame: &[u8], mtu: usize) -> Result<Vec<Vec<u8>>, SplitError> {
    let facts = inspect(frame).filter(|f| !f.v6).ok_or(SplitError::NotIpv4)?;
    let l3 = facts.l3;
    let (Some(link), Some(ip)) = (frame.get(..l3), frame.get(l3..facts.end.min(frame.len()))) else {
        return Err(SplitError::NotIpv4);
    };
    let p = Ipv4Packet::new_checked(ip).map_err(|_| SplitError::NotIpv4)?;
    if ip.len() <= mtu {
        return Ok(vec![frame.to_vec()]);
    }
    let flags = u16_at(ip, ipv4::field::FLG_OFF);
    if flags & 0x4000 != 0 {
        return Err(SplitError::DontFragment);
    }
    let hl = p.header_len();
    let (Some(header), Some(data)) = (ip.get(..hl), ip.get(hl..)) else { return Err(SplitError::NotIpv4) };
    let later_header = copied_options(header);
    let base_offset = usize::from(p.frag_offset());
    let more_after = p.more_frags();
    let mut out = Vec::new();
    let mut at = 0usize;
    while at < data.len() {
        let h = if at == 0 { header } else { &later_header[..] };
        // Every fragment but the last carries a multiple of 8 bytes.
        let room = mtu.checked_sub(h.len()).map(|r| r & !7).filter(|&r| r >= 8).ok_or(SplitError::MtuTooSmall)?;
        let take = room.min(data.len() - at);
        let last = at + take >= data.len();
        let chunk = data.get(at..at + take).unwrap_or(&[]);
        let mut f = Vec::with_capacity(link.len() + h.len() + take);
        f.extend_from_slice(link);
        f.extend_from_slice(h);
        f.extend_from_slice(chunk);
        if let Some(hdr) = f.get_mut(l3..) {
            let offset = u16::try_from((base_offset + at) / 8).unwrap_or(0x1fff) & 0x1fff;
            let more = if last { more_after } else { true };
            set_u16(hdr, ipv4::field::FLG_OFF, (flags & 0x8000) | if more { 0x2000 } else { 0 } | offset);
            let mut v = Ipv4Packet::new_unchecked(hdr);
            v.set_total_len(u16::try_from(h.len() + take).unwrap_or(u16::MAX));
            v.fill_checksum();
        }
        out.push(f);
        at += take;
    }
    Ok(out)
}

/// The header of a later fragment: the fixed header and the options whose
/// "copied" bit is set, padded to a multiple of 4 bytes.
fn copied_options(header: &[u8]) -> Vec<u8> {
    let mut h: Vec<u8> = header.get(..ipv4::MIN_HEADER_LEN).unwrap_or(&[]).to_vec();
    let mut opts = header.get(ipv4::MIN_HEADER_LEN..).unwrap_or(&[]);
    while let Some(&kind) = opts.first() {
        let len = match kind {
            0 => break,
            1 => 1,
            _ => usize::from(u8_at(opts, 1)).max(2),
        };
        let Some(opt) = opts.get(..len) else { break };
        if kind & 0x80 != 0 {
            h.extend_from_slice(opt);
        }
        opts = opts.get(len..).unwrap_or(&[]);
    }
    while !h.len().is_multiple_of(4) {
        h.push(0);
    }
    let ihl = u8::try_from(h.len() / 4).unwrap_or(5);
    set_u8(&mut h, ipv4::field::VER_IHL, 0x40 | ihl);
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::FrameSpec;
    use crate::flow::IpAddr128;

    /// An IPv4 UDP frame with `payload` bytes of UDP data, no DF.
    fn udp(payload: usize) -> Vec<u8> {
        let mut f = FrameSpec::udp4([10, 0, 0, 1], 5000, [10, 0, 0, 2], 53).with_payload(vec![7u8; payload]).build();
        let ip = &mut f[14..];
        ip[6] = 0;
        ip[7] = 0;
        Ipv4Packet::new_unchecked(ip).fill_checksum();
        f
    }

    #[test]
    fn a_datagram_is_cut_on_8_byte_boundaries_and_put_back_together() {
        let f = udp(3000);
        let frags = split_ipv4(&f, 1500).unwrap();
        assert_eq!(frags.len(), 3);
        let mut data = Vec::new();
        for (i, fr) in frags.iter().enumerate() {
            let facts = inspect(fr).unwrap();
            assert!(fr.len() - 14 <= 1500);
            let frag = facts.fragment.unwrap();
            assert_eq!(frag.more, i < 2);
            assert_eq!(frag.offset as usize, data.len());
            assert_eq!(frag.offset % 8, 0);
            let p = Ipv4Packet::new_checked(&fr[14..]).unwrap();
            assert!(p.verify_checksum());
            data.extend_from_slice(p.payload());
        }
        assert_eq!(&data[..], &f[34..]);
        assert_eq!(split_ipv4(&udp(100), 1500).unwrap(), vec![udp(100)]);
    }

    #[test]
    fn dont_fragment_and_ipv6_are_not_cut() {
        let mut f = udp(3000);
        f[14 + 6] = 0x40;
        assert_eq!(split_ipv4(&f, 1500), Err(SplitError::DontFragment));
        assert_eq!(split_ipv4(&udp(3000), 20), Err(SplitError::MtuTooSmall));
        assert_eq!(split_ipv4(&[0u8; 60], 1500), Err(SplitError::NotIpv4));
    }

    #[test]
    fn later_fragments_take_the_first_fragments_changes() {
        let frags = split_ipv4(&udp(3000), 1500).unwrap();
        let mut first = frags[0].clone();
        first[0..6].copy_from_slice(&[2, 0, 0, 0, 0, 9]);
        let mut ip = Ipv4Packet::new_unchecked(&mut first[14..]);
        ip.set_src([203, 0, 113, 1]);
        ip.set_ttl(9);
        let t = Template::of(&first).unwrap();
        let later = t.apply(&frags[1]).unwrap();
        assert_eq!(&later[0..6], &[2, 0, 0, 0, 0, 9]);
        let p = Ipv4Packet::new_checked(&later[14..]).unwrap();
        assert_eq!(p.src(), [203, 0, 113, 1]);
        assert_eq!(p.ttl(), 9);
        assert!(p.verify_checksum());
        assert_eq!(p.payload(), Ipv4Packet::new_checked(&frags[1][14..]).unwrap().payload());
        assert_eq!(
            inspect(&later).unwrap().fragment,
            inspect(&frags[1])
                .unwrap()
                .fragment
                .map(|f| Fragment { key: FragmentKey { src: IpAddr128::from_v4([203, 0, 113, 1]), ..f.key }, ..f })
        );
    }

    #[test]
    fn a_frame_shorter_than_its_datagram_is_cut_short() {
        let f = udp(3000);
        let facts = inspect(&f[..1982]).unwrap();
        assert!(facts.cut_short(1982));
        assert!(!inspect(&f).unwrap().cut_short(f.len()));
        assert_eq!(inspect(&[0u8; 10]), None);
    }

    proptest::proptest! {
        #[test]
        fn inspecting_and_splitting_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200), mtu in 0usize..200) {
            let _ = inspect(&bytes);
            let _ = split_ipv4(&bytes, mtu);
            if let Some(t) = Template::of(&bytes) {
                let _ = t.apply(&bytes);
            }
        }
    }
}
