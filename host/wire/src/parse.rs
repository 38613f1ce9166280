//! One-pass, lax parsing of a whole frame into the layer offsets and flow key
//! the host puts into batch metadata.
//!
//! "Lax" in the sense of etherparse's `LaxSlicedPacket`: a packet whose
//! transport header is cut off still yields its IP layer, and the first error
//! is recorded with the layer it happened in, so an IDS or monitor can still
//! account for damaged traffic.

use crate::bytes::{u16_at, u32_at};
use crate::checksum;
use crate::ethernet::{EthernetFrame, ethertype};
use crate::flow::{FlowKey, IpAddr128};
use crate::icmp::IcmpPacket;
use crate::ipv4::Ipv4Packet;
use crate::ipv6::Ipv6Packet;
use crate::tcp::TcpPacket;
use crate::udp::UdpPacket;
use crate::{Error, Result};

/// IP protocol numbers.
pub mod protocol {
    /// ICMP.
    pub const ICMP: u8 = 1;
    /// TCP.
    pub const TCP: u8 = 6;
    /// UDP.
    pub const UDP: u8 = 17;
    /// ICMPv6.
    pub const ICMPV6: u8 = 58;
}

/// The layer a parse error happened in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layer {
    /// Ethernet or VLAN tags.
    Link,
    /// IPv4 or IPv6.
    Network,
    /// TCP, UDP or ICMP.
    Transport,
}

/// What one pass over a frame found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Layers {
    /// Outer VLAN id, if tagged.
    pub vlan: Option<u16>,
    /// EtherType after VLAN tags (0 when the Ethernet header is missing).
    pub ethertype: u16,
    /// Offset of the IP header.
    pub l3_offset: Option<u16>,
    /// Offset of the TCP/UDP/ICMP header (absent for later fragments).
    pub l4_offset: Option<u16>,
    /// The 5-tuple (ports are 0 when the transport header is missing).
    pub key: Option<FlowKey>,
    /// Whether the IP packet is a fragment.
    pub fragment: bool,
    /// TCP flags, when the packet is TCP with a readable header.
    pub tcp_flags: Option<u8>,
    /// What the IP header says of the datagram (where it ends, which
    /// fragment it is): the facts of [`crate::fragment::inspect`], read in
    /// the same pass. Absent when the frame is not IP or its IP header is
    /// malformed.
    pub ip: Option<IpFacts>,
    /// The first error met, and in which layer. The fields above hold
    /// everything read before it.
    pub error: Option<(Layer, Error)>,
}

/// Parses an Ethernet frame. Never panics, whatever the input.
#[inline]
pub fn parse(frame: &[u8]) -> Layers {
    match parse_common(frame) {
        Some(l) => l,
        None => parse_general(frame),
    }
}

/// The general parse: every link, network and transport layer the host
/// knows, with the first error recorded.
fn parse_general(frame: &[u8]) -> Layers {
    let mut out = Layers::default();
    if let Err(e) = parse_into(frame, &mut out) {
        out.error = Some(e);
    }
    out
}

/// The frame nearly every packet is, read in straight-line code: Ethernet,
/// untagged or with one 802.1Q tag (a live port's tenants are told apart
/// by VLAN), IPv4 that is not a fragment, a whole TCP or UDP header.
/// `None` for anything else (or anything [`parse_general`] would find an
/// error in), which then takes the general path; when `Some`, the result
/// is exactly the general path's (a property test holds the two equal).
#[inline]
fn parse_common(frame: &[u8]) -> Option<Layers> {
    const UNTAGGED: usize = crate::ethernet::HEADER_LEN;
    const TAG: usize = 4;
    let u16_at = |at: usize| frame.get(at..at + 2).and_then(|b| <[u8; 2]>::try_from(b).ok()).map(u16::from_be_bytes);
    let (l3, vlan) = match u16_at(UNTAGGED - 2)? {
        ethertype::IPV4 => (UNTAGGED, None),
        ethertype::VLAN if u16_at(UNTAGGED + TAG - 2)? == ethertype::IPV4 => {
            (UNTAGGED + TAG, Some(u16_at(UNTAGGED)? & 0x0fff))
        }
        _ => return None,
    };
    // The views' accessors read fixed offsets; with the link header and a
    // minimal IPv4 header present they never fall back to zero.
    if frame.len() < l3 + crate::ipv4::MIN_HEADER_LEN {
        return None;
    }
    let ip = Ipv4Packet::new_unchecked(frame.get(l3..)?);
    let header_len = ip.header_len();
    if ip.version() != 4
        || header_len < crate::ipv4::MIN_HEADER_LEN
        || usize::from(ip.total_len()) < header_len
        || ip.is_fragment()
    {
        return None;
    }
    let l4 = l3 + header_len;
    let t = frame.get(l4..)?;
    let (src_port, dst_port, tcp_flags) = match ip.protocol() {
        protocol::TCP => {
            let tcp = TcpPacket::new_unchecked(t);
            if t.len() < crate::tcp::MIN_HEADER_LEN
                || tcp.header_len() < crate::tcp::MIN_HEADER_LEN
                || t.len() < tcp.header_len()
            {
                return None;
            }
            (tcp.src_port(), tcp.dst_port(), Some(tcp.flags()))
        }
        protocol::UDP => {
            let udp = UdpPacket::new_unchecked(t);
            if t.len() < crate::udp::HEADER_LEN || usize::from(udp.len()) < crate::udp::HEADER_LEN {
                return None;
            }
            (udp.src_port(), udp.dst_port(), None)
        }
        _ => return None,
    };
    let (src, dst) = (IpAddr128::from_v4(ip.src()), IpAddr128::from_v4(ip.dst()));
    Some(Layers {
        vlan,
        ethertype: ethertype::IPV4,
        l3_offset: Some(l3 as u16),
        l4_offset: u16::try_from(l4).ok(),
        key: Some(FlowKey { src, dst, src_port, dst_port, protocol: ip.protocol() }),
        fragment: false,
        tcp_flags,
        ip: Some(IpFacts { l3, end: l3 + usize::from(ip.total_len()), v6: false, fragment: None }),
        error: None,
    })
}

/// The source and destination addresses of an untagged or singly tagged
/// IPv4 or IPv6 frame, read at their fixed offsets: a look at who a packet
/// is between without parsing it. `None` for anything else (more tags,
/// another protocol, a header cut short); when `Some`, they are the
/// addresses of [`parse`]'s key (a property test holds them equal).
#[inline]
pub fn ip_addresses(frame: &[u8]) -> Option<(IpAddr128, IpAddr128)> {
    let u16_at = |at: usize| frame.get(at..at + 2).and_then(|b| <[u8; 2]>::try_from(b).ok()).map(u16::from_be_bytes);
    let l3 = match u16_at(12)? {
        ethertype::VLAN => 18,
        _ => 14,
    };
    let bytes = |at: usize, n: usize| frame.get(l3 + at..l3 + at + n);
    match u16_at(l3 - 2)? {
        ethertype::IPV4 if frame.get(l3)? >> 4 == 4 && frame.get(l3)? & 0x0f >= 5 && frame.len() >= l3 + 20 => {
            let a = |at| bytes(at, 4).and_then(|b| <[u8; 4]>::try_from(b).ok()).map(IpAddr128::from_v4);
            Some((a(12)?, a(16)?))
        }
        ethertype::IPV6 if frame.get(l3)? >> 4 == 6 && frame.len() >= l3 + crate::ipv6::HEADER_LEN => {
            let a = |at| bytes(at, 16).and_then(|b| <[u8; 16]>::try_from(b).ok()).map(IpAddr128::from_v6);
            Some((a(8)?, a(24)?))
        }
        _ => None,
    }
}

/// The ethertype of `frame` and where its network header starts, untagged
/// or behind one 802.1Q tag; `None` behind more tags (not read here).
#[inline]
fn fixed_network(frame: &[u8]) -> Option<(Option<u16>, usize)> {
    let u16_at = |at: usize| frame.get(at..at + 2).and_then(|b| <[u8; 2]>::try_from(b).ok()).map(u16::from_be_bytes);
    let l3 = match u16_at(12) {
        Some(ethertype::VLAN) => match u16_at(16) {
            Some(ethertype::VLAN | ethertype::QINQ) => return None,
            _ => 18,
        },
        Some(ethertype::QINQ) => return None,
        _ => 14,
    };
    Some((u16_at(l3 - 2), l3))
}

/// Whether `frame` may be an IP fragment, read at fixed offsets: false
/// only for frames [`parse`] finds no fragment in (a property test holds
/// it), so only the frames it says true of need parsing to know. An IPv4
/// header with More Fragments or an offset, an IPv6 header followed by a
/// fragment header, or by an extension header that may precede one, and
/// any frame behind more than one VLAN tag are true.
#[inline]
pub fn may_be_fragment(frame: &[u8]) -> bool {
    let Some((ethertype, l3)) = fixed_network(frame) else { return true };
    let u16_at = |at: usize| frame.get(at..at + 2).and_then(|b| <[u8; 2]>::try_from(b).ok()).map(u16::from_be_bytes);
    match ethertype {
        Some(ethertype::IPV4) => u16_at(l3 + 6).is_none_or(|f| f & 0x3fff != 0),
        // Hop-by-hop, routing, fragment, destination options.
        Some(ethertype::IPV6) => frame.get(l3 + 6).is_none_or(|next| matches!(next, 0 | 43 | 44 | 60)),
        _ => false,
    }
}

/// Whether `frame` may be ICMP or ICMPv6, read at fixed offsets: false
/// only for frames [`parse`] finds another protocol in (a property test
/// holds it); any frame behind more than one VLAN tag is true.
#[inline]
pub fn may_be_icmp(frame: &[u8]) -> bool {
    let Some((ethertype, l3)) = fixed_network(frame) else { return true };
    match ethertype {
        Some(ethertype::IPV4) => frame.get(l3 + 9).is_none_or(|&p| p == protocol::ICMP),
        // ICMPv6 behind extension headers too.
        Some(ethertype::IPV6) => frame.get(l3 + 6).is_none_or(|&n| matches!(n, protocol::ICMPV6 | 0 | 43 | 60)),
        _ => false,
    }
}

/// The flow an ICMP or ICMPv6 error in `frame` is about: the key of the
/// packet it quotes, as that packet went (from the error's destination),
/// with the ports of the quote's first transport bytes (an echo's
/// identifier). `None` for anything else, and for a quote of a later
/// fragment or of an IPv6 packet with extension headers.
pub fn quoted_key(frame: &[u8]) -> Option<FlowKey> {
    let l = parse(frame);
    let key = l.key?;
    let v6 = l.ip?.v6;
    let icmp = frame.get(usize::from(l.l4_offset?)..)?;
    let error = match (v6, key.protocol) {
        (false, protocol::ICMP) => matches!(icmp.first()?, 3 | 4 | 5 | 11 | 12),
        (true, protocol::ICMPV6) => matches!(icmp.first()?, 1..=4),
        _ => false,
    };
    if !error {
        return None;
    }
    let q = icmp.get(8..)?;
    let word = |b: &[u8], at: usize| Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]));
    let (proto, src, dst, l4) = if v6 {
        if q.first()? >> 4 != 6 {
            return None;
        }
        let a = |at: usize| q.get(at..at + 16).and_then(|b| <[u8; 16]>::try_from(b).ok()).map(IpAddr128::from_v6);
        (*q.get(6)?, a(8)?, a(24)?, q.get(crate::ipv6::HEADER_LEN..)?)
    } else {
        let v = *q.first()?;
        if v >> 4 != 4 || v & 0x0f < 5 || word(q, 6)? & 0x1fff != 0 {
            return None;
        }
        let a = |at: usize| q.get(at..at + 4).and_then(|b| <[u8; 4]>::try_from(b).ok()).map(IpAddr128::from_v4);
        (*q.get(9)?, a(12)?, a(16)?, q.get(usize::from(v & 0x0f) * 4..)?)
    };
    let (src_port, dst_port) = match proto {
        protocol::TCP | protocol::UDP => (word(l4, 0)?, word(l4, 2)?),
        protocol::ICMP if matches!(l4.first()?, 0 | 8) => (word(l4, 4)?, word(l4, 4)?),
        protocol::ICMPV6 if matches!(l4.first()?, 128 | 129) => (word(l4, 4)?, word(l4, 4)?),
        protocol::ICMP | protocol::ICMPV6 => (0, 0),
        _ => return None,
    };
    Some(FlowKey { src, dst, src_port, dst_port, protocol: proto })
}

fn parse_into(frame: &[u8], out: &mut Layers) -> core::result::Result<(), (Layer, Error)> {
    let eth = EthernetFrame::new_checked(frame).map_err(|e| (Layer::Link, e))?;
    let (ethertype, l3, vlan) = eth.network().map_err(|e| (Layer::Link, e))?;
    out.vlan = vlan;
    out.ethertype = ethertype;
    let ip_bytes = frame.get(l3..).unwrap_or(&[]);
    let (proto, l4_rel, src, dst, fragment, later_fragment) = match ethertype {
        ethertype::IPV4 => {
            let ip = Ipv4Packet::new_checked(ip_bytes).map_err(|e| (Layer::Network, e))?;
            let src = IpAddr128::from_v4(ip.src());
            let dst = IpAddr128::from_v4(ip.dst());
            let frag = ip.is_fragment();
            let offset = ip.frag_offset();
            let fragment = frag.then(|| Fragment {
                key: FragmentKey { src, dst, protocol: ip.protocol(), ident: u32::from(ip.ident()) },
                offset: u32::from(offset),
                more: ip.more_frags(),
            });
            out.ip = Some(IpFacts { l3, end: l3 + usize::from(ip.total_len()), v6: false, fragment });
            (ip.protocol(), ip.header_len(), src, dst, frag, offset != 0)
        }
        ethertype::IPV6 => {
            let ip = Ipv6Packet::new_checked(ip_bytes).map_err(|e| (Layer::Network, e))?;
            let src = IpAddr128::from_v6(ip.src());
            let dst = IpAddr128::from_v6(ip.dst());
            let end = l3 + crate::ipv6::HEADER_LEN + usize::from(ip.payload_len());
            out.ip = Some(IpFacts { l3, end, v6: true, fragment: None });
            out.l3_offset = u16::try_from(l3).ok();
            let ul = match ip.upper_layer() {
                Ok(v) => v,
                Err(e) => {
                    out.key = Some(FlowKey { src, dst, src_port: 0, dst_port: 0, protocol: ip.next_header() });
                    return Err((Layer::Network, e));
                }
            };
            if let Some(facts) = out.ip.as_mut() {
                facts.fragment = ipv6_fragment(ip_bytes, ul.fragment_header, src, dst);
            }
            (ul.protocol, ul.offset, src, dst, ul.fragment, ul.later_fragment)
        }
        _ => return Ok(()),
    };
    out.l3_offset = u16::try_from(l3).ok();
    out.fragment = fragment;
    let mut key = FlowKey { src, dst, src_port: 0, dst_port: 0, protocol: proto };
    out.key = Some(key);
    if later_fragment {
        return Ok(());
    }
    let l4 = l3 + l4_rel;
    let l4_bytes = frame.get(l4..).unwrap_or(&[]);
    let ports =
        transport_ports(proto, l4_bytes, ethertype == ethertype::IPV6, out).map_err(|e| (Layer::Transport, e))?;
    if let Some((sp, dp)) = ports {
        key.src_port = sp;
        key.dst_port = dp;
        out.key = Some(key);
        out.l4_offset = u16::try_from(l4).ok();
    }
    Ok(())
}

fn transport_ports(proto: u8, l4: &[u8], v6: bool, out: &mut Layers) -> Result<Option<(u16, u16)>> {
    match proto {
        protocol::TCP => {
            let t = TcpPacket::new_checked(l4)?;
            out.tcp_flags = Some(t.flags());
            Ok(Some((t.src_port(), t.dst_port())))
        }
        protocol::UDP => {
            let u = UdpPacket::new_checked(l4)?;
            Ok(Some((u.src_port(), u.dst_port())))
        }
        protocol::ICMP | protocol::ICMPV6 => {
            let i = IcmpPacket::new_checked(l4)?;
            if i.is_echo(v6) {
                let id = i.echo_ident();
                Ok(Some((id, id)))
            } else {
                Ok(Some((0, 0)))
            }
        }
        _ => Ok(None),
    }
}

/// The datagram a fragment belongs to (RFC 791: source, destination,
/// protocol and identification; RFC 8200: source, destination and the
/// fragment header's identification).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FragmentKey {
    /// Source address.
    pub src: IpAddr128,
    /// Destination address.
    pub dst: IpAddr128,
    /// IPv4 protocol (0 for IPv6, whose identification is per address pair).
    pub protocol: u8,
    /// Identification (16 bits for IPv4, 32 for IPv6).
    pub ident: u32,
}

/// One fragment of a datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fragment {
    /// Its datagram.
    pub key: FragmentKey,
    /// Offset of its data in the datagram, bytes (0: the first fragment,
    /// which holds the transport header).
    pub offset: u32,
    /// Whether more fragments follow.
    pub more: bool,
}

/// What the IP header of a frame says, read without the transport layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IpFacts {
    /// Offset of the IP header.
    pub l3: usize,
    /// Where the IP datagram ends in the frame according to its header
    /// (IPv4 total length; IPv6 40 + payload length).
    pub end: usize,
    /// Whether it is IPv6.
    pub v6: bool,
    /// The fragment, if the datagram is one.
    pub fragment: Option<Fragment>,
}

impl IpFacts {
    /// Whether the frame holds fewer bytes than its IP header says the
    /// datagram has: a frame cut short (a capture's snap length, or a
    /// receive buffer smaller than the datagram).
    #[inline]
    pub fn cut_short(&self, frame_len: usize) -> bool {
        self.end > frame_len
    }

    /// Whether this is a fragment other than the first.
    pub fn later_fragment(&self) -> bool {
        self.fragment.is_some_and(|f| f.offset != 0)
    }
}

/// The fragment an IPv6 packet (`ip`, from its fixed header) is, from its
/// fragment header at `at`, if it has one. A fragment header saying
/// "offset 0, no more" is an atomic fragment (RFC 6946): a whole datagram.
fn ipv6_fragment(ip: &[u8], at: Option<usize>, src: IpAddr128, dst: IpAddr128) -> Option<Fragment> {
    let at = at?;
    let h = ip.get(at..at + 8)?;
    let off_flags = u16_at(h, 2..4);
    let f = Fragment {
        key: FragmentKey { src, dst, protocol: 0, ident: u32_at(h, 4..8) },
        offset: u32::from(off_flags & 0xfff8),
        more: off_flags & 1 != 0,
    };
    (f.offset != 0 || f.more).then_some(f)
}

/// Whether the TCP or UDP segment of `frame` (parsed into `l`) carries a
/// checksum left for a device to finish: its checksum field holds the
/// folded sum of the pseudo-header alone and the segment does not verify.
/// That is what a Linux interface with transmit checksum offload hands a
/// packet socket (`CHECKSUM_PARTIAL`), and what no receiver accepts.
/// `None` when the frame holds no whole, unfragmented TCP or UDP segment
/// (or a UDP datagram over IPv4 without a checksum).
pub fn checksum_left_for_offload(frame: &[u8], l: &Layers) -> Option<bool> {
    let (ip, at) = (l.ip?, usize::from(l.l4_offset?));
    let protocol = l.key?.protocol;
    let field = match protocol {
        protocol::TCP => 16,
        protocol::UDP => 6,
        _ => return None,
    };
    if ip.fragment.is_some() || ip.cut_short(frame.len()) {
        return None;
    }
    let segment = frame.get(at..ip.end)?;
    let stored = u16::from_be_bytes([*segment.get(field)?, *segment.get(field + 1)?]);
    if protocol == protocol::UDP && stored == 0 && !ip.v6 {
        return None;
    }
    let len = segment.len();
    let pseudo = if ip.v6 {
        let src = frame.get(ip.l3 + 8..ip.l3 + 24)?.try_into().ok()?;
        let dst = frame.get(ip.l3 + 24..ip.l3 + 40)?.try_into().ok()?;
        checksum::pseudo_header_v6(src, dst, protocol, u32::try_from(len).ok()?)
    } else {
        let src = frame.get(ip.l3 + 12..ip.l3 + 16)?.try_into().ok()?;
        let dst = frame.get(ip.l3 + 16..ip.l3 + 20)?.try_into().ok()?;
        checksum::pseudo_header_v4(src, dst, protocol, u16::try_from(len).ok()?)
    };
    Some(stored == checksum::fold(pseudo) && checksum::fold(checksum::sum(pseudo, segment)) != 0xffff)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A TCP segment as a kernel with checksum offload leaves it, and as
    /// it leaves the wire once finished.
    #[test]
    fn a_checksum_left_for_offload_is_told_from_a_finished_one() {
        for v6 in [false, true] {
            let mut spec = if v6 {
                crate::build::FrameSpec {
                    src: crate::IpAddr128::from_v6([0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5]),
                    dst: crate::IpAddr128::from_v6([0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7]),
                    transport: crate::build::Transport::Tcp { src_port: 40000, dst_port: 80, flags: 0x18 },
                    payload: vec![],
                    vlan: None,
                }
            } else {
                crate::build::FrameSpec::tcp4([10, 0, 0, 5], 40000, [10, 0, 0, 7], 80, 0x18)
            };
            spec.payload = b"GET / HTTP/1.1\r\n\r\n".to_vec();
            let finished = spec.build();
            let l = parse(&finished);
            assert_eq!(checksum_left_for_offload(&finished, &l), Some(false), "v6 {v6}");
            // What the kernel leaves: the pseudo-header's folded sum.
            let at = usize::from(l.l4_offset.unwrap()) + 16;
            let segment_len = finished.len() - usize::from(l.l4_offset.unwrap());
            let ip = l.ip.unwrap();
            let pseudo = if v6 {
                crate::checksum::pseudo_header_v6(
                    finished[ip.l3 + 8..ip.l3 + 24].try_into().unwrap(),
                    finished[ip.l3 + 24..ip.l3 + 40].try_into().unwrap(),
                    6,
                    segment_len as u32,
                )
            } else {
                crate::checksum::pseudo_header_v4(
                    finished[ip.l3 + 12..ip.l3 + 16].try_into().unwrap(),
                    finished[ip.l3 + 16..ip.l3 + 20].try_into().unwrap(),
                    6,
                    segment_len as u16,
                )
            };
            let mut partial = finished.clone();
            partial[at..at + 2].copy_from_slice(&crate::checksum::fold(pseudo).to_be_bytes());
            assert_eq!(checksum_left_for_offload(&partial, &parse(&partial)), Some(true), "v6 {v6}");
            // Cut short, or not TCP/UDP: nothing to say.
            let cut = &partial[..partial.len() - 4];
            assert_eq!(checksum_left_for_offload(cut, &parse(cut)), None);
        }
        let ping = crate::build::FrameSpec {
            transport: crate::build::Transport::IcmpEcho { ident: 1 },
            ..crate::build::FrameSpec::udp4([10, 0, 0, 5], 1, [10, 0, 0, 7], 2)
        }
        .build();
        assert_eq!(checksum_left_for_offload(&ping, &parse(&ping)), None);
    }

    use crate::build::{FrameSpec, Transport};
    use crate::tcp::flags;
    use proptest::prelude::*;

    #[test]
    fn tcp_v4_key_and_offsets() {
        let f = FrameSpec::tcp4([10, 0, 0, 1], 1234, [10, 0, 0, 2], 80, flags::SYN).build();
        let l = parse(&f);
        assert_eq!(l.error, None);
        assert_eq!(l.l3_offset, Some(14));
        assert_eq!(l.l4_offset, Some(34));
        assert_eq!(l.tcp_flags, Some(flags::SYN));
        let k = l.key.unwrap();
        assert_eq!((k.src_port, k.dst_port, k.protocol), (1234, 80, 6));
        assert_eq!(k.src, IpAddr128::from_v4([10, 0, 0, 1]));
    }

    #[test]
    fn vlan_udp_v6() {
        let f = FrameSpec {
            src: IpAddr128::from_v6([0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]),
            dst: IpAddr128::from_v6([0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]),
            transport: Transport::Udp { src_port: 53, dst_port: 5353 },
            payload: b"hello".to_vec(),
            vlan: Some(7),
        }
        .build();
        let l = parse(&f);
        assert_eq!(l.error, None);
        assert_eq!(l.vlan, Some(7));
        assert_eq!(l.l3_offset, Some(18));
        assert_eq!(l.l4_offset, Some(58));
        assert_eq!(l.key.unwrap().dst_port, 5353);
    }

    #[test]
    fn icmp_echo_shares_flow_with_reply() {
        let mut spec = FrameSpec::udp4([10, 0, 0, 1], 0, [10, 0, 0, 2], 0);
        spec.transport = Transport::IcmpEcho { ident: 77 };
        let req = parse(&spec.build()).key.unwrap();
        assert_eq!((req.src_port, req.dst_port, req.protocol), (77, 77, 1));
        assert_eq!(req.symmetric_hash(), req.reversed().symmetric_hash());
    }

    #[test]
    fn truncated_transport_keeps_network_layer() {
        let f = FrameSpec::tcp4([10, 0, 0, 1], 1, [10, 0, 0, 2], 2, 0).build();
        let l = parse(&f[..40]);
        assert_eq!(l.error, Some((Layer::Transport, Error::Truncated)));
        assert_eq!(l.l3_offset, Some(14));
        assert_eq!(l.l4_offset, None);
        assert_eq!(l.key.unwrap().src_port, 0);
    }

    #[test]
    fn tcp_and_udp_over_ipv4_untagged_or_with_one_tag_take_the_common_path() {
        let tcp = FrameSpec::tcp4([10, 0, 0, 1], 1234, [10, 0, 0, 2], 80, flags::SYN).build();
        let udp = FrameSpec::udp4([10, 0, 0, 1], 53, [10, 0, 0, 2], 5353).build();
        let mut tagged = FrameSpec::udp4([10, 0, 0, 1], 53, [10, 0, 0, 2], 5353);
        tagged.vlan = Some(7);
        let tagged = tagged.build();
        for f in [&tcp, &udp, &tagged] {
            assert_eq!(parse_common(f), Some(parse_general(f)));
        }
        assert_eq!(parse_common(&tagged).and_then(|l| l.vlan), Some(7));
        let mut icmp = FrameSpec::udp4([10, 0, 0, 1], 0, [10, 0, 0, 2], 0);
        icmp.transport = Transport::IcmpEcho { ident: 77 };
        let mut fragment = udp.clone();
        fragment[14 + 6] |= 0x20;
        // Two tags (the inner one where IPv4's EtherType would be).
        let mut double = tagged.clone();
        double.splice(16..16, [0x81, 0x00, 0x00, 0x09]);
        for f in [icmp.build(), fragment, tcp[..40].to_vec(), double, tagged[..17].to_vec()] {
            assert_eq!(parse_common(&f), None);
        }
    }

    #[test]
    fn non_ip_has_no_key() {
        let mut f = vec![0u8; 60];
        f[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
        let l = parse(&f);
        assert_eq!(l.key, None);
        assert_eq!(l.error, None);
        assert_eq!(l.ethertype, 0x0806);
    }

    fn any_frame() -> impl Strategy<Value = Vec<u8>> {
        (
            any::<[u8; 4]>(),
            any::<[u8; 4]>(),
            any::<u16>(),
            any::<u16>(),
            0u8..3,
            proptest::collection::vec(any::<u8>(), 0..64),
            proptest::option::of(0u16..4095),
        )
            .prop_map(|(s, d, sp, dp, t, payload, vlan)| {
                let mut spec = FrameSpec::udp4(s, sp, d, dp).with_payload(payload);
                spec.vlan = vlan;
                spec.transport = match t {
                    0 => Transport::Tcp { src_port: sp, dst_port: dp, flags: 0x12 },
                    1 => Transport::Udp { src_port: sp, dst_port: dp },
                    _ => Transport::IcmpEcho { ident: sp },
                };
                spec.build()
            })
    }

    #[test]
    fn ip_addresses_of_ipv4_and_ipv6_untagged_and_tagged() {
        let v6 = |a: u8| IpAddr128::from_v6([0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, a]);
        for vlan in [None, Some(100)] {
            let mut four = FrameSpec::udp4([10, 0, 0, 5], 1, [198, 51, 100, 7], 2);
            four.vlan = vlan;
            let mut six = four.clone();
            (six.src, six.dst) = (v6(5), v6(7));
            for spec in [four, six] {
                let f = spec.build();
                let k = parse(&f).key.unwrap();
                assert_eq!(ip_addresses(&f), Some((k.src, k.dst)), "{spec:?}");
            }
        }
        assert_eq!(ip_addresses(&[0u8; 20]), None);
    }

    /// An ICMP error quoting `quoted` (an IP packet, from its IP header).
    fn icmp_error(ty: u8, quoted: &[u8], v6: bool) -> Vec<u8> {
        let mut spec = FrameSpec::udp4([192, 0, 2, 1], 0, [203, 0, 113, 1], 0);
        spec.transport = Transport::IcmpEcho { ident: 0 };
        if v6 {
            spec.src = IpAddr128::from_v6([0x20, 1, 0xd, 0xb8, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
            spec.dst = IpAddr128::from_v6([0x20, 1, 0xd, 0xb8, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5]);
        }
        spec.payload = quoted.to_vec();
        let mut f = spec.build();
        let l4 = usize::from(parse(&f).l4_offset.unwrap());
        f[l4] = ty;
        f
    }

    #[test]
    fn an_icmp_error_names_the_flow_of_the_packet_it_quotes() {
        let tcp = FrameSpec::tcp4([203, 0, 113, 1], 2000, [192, 0, 2, 7], 80, 0x10).build();
        let want = parse(&tcp).key.unwrap();
        // Frag needed, time exceeded: the quote's IP header and 8 bytes.
        for ty in [3, 11] {
            assert_eq!(quoted_key(&icmp_error(ty, &tcp[14..14 + 28], false)), Some(want));
        }
        // An echo request is no error; an echo quoted is by identifier.
        assert_eq!(quoted_key(&icmp_error(8, &tcp[14..14 + 28], false)), None);
        let mut ping = FrameSpec::udp4([203, 0, 113, 1], 0, [192, 0, 2, 8], 0);
        ping.transport = Transport::IcmpEcho { ident: 77 };
        let ping = ping.build();
        let k = quoted_key(&icmp_error(3, &ping[14..14 + 28], false)).unwrap();
        assert_eq!((k.src_port, k.dst_port, k.protocol), (77, 77, 1));
        // IPv6: packet too big about a UDP datagram.
        let mut udp6 = FrameSpec::udp4([0; 4], 5000, [0; 4], 53);
        udp6.src = IpAddr128::from_v6([0x20, 1, 0xd, 0xb8, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5]);
        udp6.dst = IpAddr128::from_v6([0x20, 1, 0xd, 0xb8, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7]);
        let udp6 = udp6.build();
        assert_eq!(quoted_key(&icmp_error(2, &udp6[14..14 + 48], true)), parse(&udp6).key);
        // Cut short: no key.
        assert_eq!(quoted_key(&icmp_error(3, &tcp[14..14 + 22], false)), None);
        assert_eq!(quoted_key(&tcp), None);
    }

    #[test]
    fn fragments_and_whole_datagrams_are_told_apart_at_fixed_offsets() {
        let whole = FrameSpec::udp4([10, 0, 0, 5], 1, [198, 51, 100, 7], 2).build();
        assert!(!may_be_fragment(&whole));
        for (at, v) in [(20, 0x20u8), (21, 1)] {
            // More Fragments; an offset.
            let mut f = whole.clone();
            f[at] |= v;
            assert!(may_be_fragment(&f) && parse(&f).ip.unwrap().fragment.is_some());
        }
        let mut six = FrameSpec::udp4([10, 0, 0, 5], 1, [198, 51, 100, 7], 2);
        six.src = IpAddr128::from_v6([0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5]);
        six.dst = IpAddr128::from_v6([0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7]);
        let mut f = six.build();
        assert!(!may_be_fragment(&f));
        f[20] = 44;
        assert!(may_be_fragment(&f));
        assert!(!may_be_fragment(&[0u8; 60]));
    }

    /// `frame` with the byte at `idx` (modulo its length) set to `byte`,
    /// cut to `cut` bytes (modulo its length + 1).
    fn altered(mut frame: Vec<u8>, idx: usize, byte: u8, cut: usize) -> Vec<u8> {
        let n = frame.len();
        frame[idx % n] = byte;
        frame.truncate(cut % (n + 1));
        frame
    }

    proptest! {
        #[test]
        fn never_panics_on_random_bytes(data in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = parse(&data);
        }

        /// The contract (0.7.0, descriptor word 3) promises an IP header
        /// offset only behind a whole, well-formed header; SDKs rely on it.
        #[test]
        fn an_ip_offset_is_set_only_behind_a_whole_well_formed_header(
            data in proptest::collection::vec(any::<u8>(), 0..128),
            v4 in any::<bool>(),
        ) {
            // Random bytes behind an untagged IPv4 or IPv6 ethertype.
            let mut f = data;
            f.resize(f.len().max(14), 0);
            f[12..14].copy_from_slice(&if v4 { [0x08, 0x00] } else { [0x86, 0xdd] });
            if let Some(l3) = parse(&f).l3_offset.map(usize::from) {
                let ip = &f[l3..];
                if v4 {
                    let hl = usize::from(ip[0] & 0x0f) * 4;
                    prop_assert!(ip[0] >> 4 == 4 && hl >= 20 && ip.len() >= hl);
                    prop_assert!(usize::from(u16::from_be_bytes([ip[2], ip[3]])) >= hl);
                } else {
                    prop_assert!(ip[0] >> 4 == 6 && ip.len() >= 40);
                }
            }
        }

        #[test]
        fn every_truncation_is_safe_and_monotonic(frame in any_frame()) {
            let full = parse(&frame);
            prop_assert_eq!(full.error, None);
            for cut in 0..frame.len() {
                let l = parse(&frame[..cut]);
                // A shorter capture never reveals more layers than the full one.
                prop_assert!(l.l4_offset.is_none() || l.l4_offset == full.l4_offset);
                if l.error.is_none() && l.l4_offset.is_some() {
                    prop_assert_eq!(l.key, full.key);
                }
            }
        }

        #[test]
        fn built_frames_round_trip(frame in any_frame()) {
            let l = parse(&frame);
            let k = l.key.unwrap();
            prop_assert_eq!(k.src.to_v4().is_some(), true);
            prop_assert!(l.l4_offset.is_some());
        }

        #[test]
        fn the_common_path_agrees_with_the_general_one(
            frame in any_frame(),
            idx in any::<usize>(),
            byte in any::<u8>(),
            cut in any::<usize>(),
        ) {
            // Built frames, with one byte set anywhere and cut anywhere:
            // the common path either declines or gives the general result.
            let f = &altered(frame, idx, byte, cut);
            if let Some(fast) = parse_common(f) {
                prop_assert_eq!(fast, parse_general(f));
            }
        }

        #[test]
        fn the_common_path_agrees_on_random_bytes(mut data in proptest::collection::vec(any::<u8>(), 0..128)) {
            // Mostly IPv4 over Ethernet, so that random bytes reach the
            // transport headers.
            if data.len() > 14 {
                data[12] = 0x08;
                data[13] = 0;
                data[14] = 0x45 + (data[14] & 1);
            }
            if let Some(fast) = parse_common(&data) {
                prop_assert_eq!(fast, parse_general(&data));
            }
        }

        #[test]
        fn the_common_path_agrees_on_random_tagged_bytes(mut data in proptest::collection::vec(any::<u8>(), 0..128)) {
            // Mostly IPv4 behind one 802.1Q tag.
            if data.len() > 18 {
                data[12] = 0x81;
                data[13] = 0;
                data[16] = 0x08;
                data[17] = 0;
                data[18] = 0x45 + (data[18] & 1);
            }
            if let Some(fast) = parse_common(&data) {
                prop_assert_eq!(fast, parse_general(&data));
            }
        }

        #[test]
        fn ip_addresses_are_the_keys_wherever_both_read_them(
            frame in any_frame(),
            idx in any::<usize>(),
            byte in any::<u8>(),
            cut in any::<usize>(),
        ) {
            let f = &altered(frame, idx, byte, cut);
            if let (Some((src, dst)), Some(k)) = (ip_addresses(f), parse(f).key) {
                prop_assert_eq!((src, dst), (k.src, k.dst));
            }
        }

        #[test]
        fn a_frame_parse_finds_a_fragment_in_may_be_one(
            frame in any_frame(),
            idx in any::<usize>(),
            byte in any::<u8>(),
            cut in any::<usize>(),
        ) {
            let f = &altered(frame, idx, byte, cut);
            if parse(f).ip.is_some_and(|ip| ip.fragment.is_some()) {
                prop_assert!(may_be_fragment(f));
            }
        }

        #[test]
        fn a_frame_parse_finds_icmp_in_may_be_icmp(
            frame in any_frame(),
            idx in any::<usize>(),
            byte in any::<u8>(),
            cut in any::<usize>(),
        ) {
            let f = &altered(frame, idx, byte, cut);
            if parse(f).key.is_some_and(|k| matches!(k.protocol, protocol::ICMP | protocol::ICMPV6)) {
                prop_assert!(may_be_icmp(f));
            }
        }

        #[test]
        fn quoted_keys_never_panic(frame in any_frame(), idx in any::<usize>(), byte in any::<u8>(), cut in any::<usize>()) {
            let f = altered(frame, idx, byte, cut);
            let _ = quoted_key(&f);
            let _ = quoted_key(&icmp_error(3, f.get(14..).unwrap_or(&[]), false));
        }

        #[test]
        fn bit_flips_never_panic(frame in any_frame(), idx in any::<usize>(), bit in 0u8..8) {
            let mut f = frame;
            let n = f.len();
            f[idx % n] ^= 1 << bit;
            let _ = parse(&f);
        }
    }
}
