//! ICMP through the NAT (RFC 5508): echo identifiers, and the packet an
//! ICMP error carries, rewritten with every checksum kept valid.
//!
//! Byte-level and pure (a frame and offsets in, bytes changed), so the unit
//! tests run natively. Every checksum is updated incrementally (RFC 1624):
//! a rewrite costs the same whatever the packet's length, and is right for
//! the whole datagram even when the NAT sees only its first fragment.
//!
//! An ICMPv4 checksum covers the ICMP message only (no pseudo-header), so
//! changing the outer IP header leaves it alone; but an error's message
//! holds the embedded packet, so every word changed in there (address,
//! port, the embedded header's checksum, the embedded transport checksum)
//! is folded into it. All those words lie at even offsets from the start of
//! the ICMP message (the IP header length is a multiple of 4), which is
//! what makes the word-by-word update exact.

use sluice_sdk::wire::checksum::{fold, sum, update_bytes, update_u16};
use sluice_sdk::wire::ipv4::Ipv4Packet;
use sluice_sdk::wire::rewrite::Endpoint;

/// IP protocol numbers.
pub const ICMP: u8 = 1;
/// TCP.
pub const TCP: u8 = 6;
/// UDP.
pub const UDP: u8 = 17;

/// ICMPv4 echo reply.
pub const ECHO_REPLY: u8 = 0;
/// ICMPv4 destination unreachable (code 4: fragmentation needed, PMTU
/// discovery).
pub const DEST_UNREACHABLE: u8 = 3;
/// ICMPv4 echo request.
pub const ECHO_REQUEST: u8 = 8;
/// ICMPv4 time exceeded (traceroute).
pub const TIME_EXCEEDED: u8 = 11;
/// ICMPv4 parameter problem.
pub const PARAMETER_PROBLEM: u8 = 12;

/// Length of the ICMP header before an error's embedded packet.
const HEADER_LEN: usize = 8;

/// Whether an ICMPv4 type is an error the NAT translates.
pub fn is_error(msg_type: u8) -> bool {
    matches!(msg_type, DEST_UNREACHABLE | TIME_EXCEEDED | PARAMETER_PROBLEM)
}

fn get16(b: &[u8], at: usize) -> Option<u16> {
    match b.get(at..at.checked_add(2)?)? {
        &[x, y] => Some(u16::from_be_bytes([x, y])),
        _ => None,
    }
}

/// Writes `v` at `at`; returns the word it replaced.
fn put16(b: &mut [u8], at: usize, v: u16) -> Option<u16> {
    let old = get16(b, at)?;
    b.get_mut(at..at + 2)?.copy_from_slice(&v.to_be_bytes());
    Some(old)
}

/// The frame up to the end of the IP datagram whose header is at `l3`
/// (without Ethernet padding), as far as it was captured.
pub fn datagram(frame: &[u8], l3: usize) -> &[u8] {
    let end = Ipv4Packet::new_checked(frame.get(l3..).unwrap_or(&[]))
        .map(|ip| l3 + usize::from(ip.total_len()))
        .unwrap_or(frame.len());
    frame.get(..end.min(frame.len())).unwrap_or(frame)
}

/// Whether the ICMP message of the datagram `ip` (its IP header first) has
/// a valid checksum. A message not wholly in hand (a fragment, a cut-short
/// capture) cannot be checked and counts as valid.
pub fn checksum_ok(ip: &[u8]) -> bool {
    let Ok(ip) = Ipv4Packet::new_checked(ip) else { return false };
    let msg = ip.payload();
    if ip.is_fragment() || msg.len() < usize::from(ip.payload_len()) {
        return true;
    }
    fold(sum(0, msg)) == 0xffff
}

/// The packet an ICMP error carries: the IP header of the packet that
/// caused it and the first 8 bytes of its transport header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Embedded {
    /// Its source address.
    pub src: [u8; 4],
    /// Its destination address.
    pub dst: [u8; 4],
    /// TCP/UDP source port; for an ICMP echo, its identifier.
    pub src_port: u16,
    /// TCP/UDP destination port; for an ICMP echo, its identifier.
    pub dst_port: u16,
    /// Its protocol: TCP, UDP or ICMP.
    pub protocol: u8,
    /// For an embedded ICMP echo, its type (request or reply).
    pub echo_type: Option<u8>,
}

/// Reads the packet embedded in the ICMP error whose ICMP header is at
/// `l4` of `msg` (a frame cut at the end of its datagram, see
/// [`datagram`]). `None` if it is cut short, a fragment after the first
/// (no transport header), or neither TCP, UDP nor an ICMP echo (the NAT
/// translates nothing else, and never an error about an error).
pub fn embedded(msg: &[u8], l4: usize) -> Option<Embedded> {
    let at = l4.checked_add(HEADER_LEN)?;
    let ip = Ipv4Packet::new_checked(msg.get(at..)?).ok()?;
    if ip.frag_offset() != 0 {
        return None;
    }
    let t = at + ip.header_len();
    let head = msg.get(t..t + 8)?;
    let (src_port, dst_port, echo_type) = match ip.protocol() {
        TCP | UDP => (get16(head, 0)?, get16(head, 2)?, None),
        ICMP => {
            let ty = *head.first()?;
            if ty != ECHO_REQUEST && ty != ECHO_REPLY {
                return None;
            }
            let id = get16(head, 4)?;
            (id, id, Some(ty))
        }
        _ => return None,
    };
    Some(Embedded { src: ip.src(), dst: ip.dst(), src_port, dst_port, protocol: ip.protocol(), echo_type })
}

/// Sets the identifier of the ICMP echo message at `l4`, updating its
/// checksum.
pub fn set_echo_ident(frame: &mut [u8], l4: usize, ident: u16) -> Option<()> {
    let old = put16(frame, l4 + 4, ident)?;
    let c = get16(frame, l4 + 2)?;
    put16(frame, l4 + 2, update_u16(c, old, ident))?;
    Some(())
}

/// Translates the ICMP error in `frame` (IP header at `l3`, ICMP header
/// at `l4`): the outer header's `outer` address becomes `outer_addr`, and
/// the embedded packet's endpoint `inner.0` becomes address `inner.1`,
/// port `inner.2` (for an embedded ICMP echo, the port is its identifier).
///
/// Checksums fixed: the outer IP header's, the embedded IP header's, the
/// embedded transport checksum where the error carries it (UDP's always
/// lies in the 8 bytes; TCP's only when more was quoted; an ICMP echo's
/// always), and the ICMP checksum over all of these. `None`, with the
/// frame left half-written, if the error is cut short or carries nothing
/// the NAT translates: the caller then drops the packet.
pub fn rewrite_error(
    frame: &mut [u8],
    l3: usize,
    l4: usize,
    outer: Endpoint,
    outer_addr: [u8; 4],
    inner: (Endpoint, [u8; 4], u16),
) -> Option<()> {
    let (inner, inner_addr, inner_port) = inner;
    let end = datagram(frame, l3).len();
    let msg = frame.get_mut(..end)?;
    let emb = embedded(msg, l4)?;
    {
        let mut ip = Ipv4Packet::new_checked(msg.get_mut(l3..)?).ok()?;
        match outer {
            Endpoint::Source => ip.set_src(outer_addr),
            Endpoint::Destination => ip.set_dst(outer_addr),
        }
    }
    let mut icmp_sum = get16(msg, l4 + 2)?;
    let e = l4 + HEADER_LEN;
    let t = e + usize::from(msg.get(e)? & 0x0f) * 4;
    let (addr_at, port_at) = match inner {
        Endpoint::Source => (e + 12, t),
        Endpoint::Destination => (e + 16, t + 2),
    };

    // The embedded address, and the embedded header's checksum over it.
    let old_addr: [u8; 4] = msg.get(addr_at..addr_at + 4)?.try_into().ok()?;
    msg.get_mut(addr_at..addr_at + 4)?.copy_from_slice(&inner_addr);
    icmp_sum = update_bytes(icmp_sum, &old_addr, &inner_addr);
    let old_ck = get16(msg, e + 10)?;
    let new_ck = update_bytes(old_ck, &old_addr, &inner_addr);
    put16(msg, e + 10, new_ck)?;
    icmp_sum = update_u16(icmp_sum, old_ck, new_ck);

    match emb.protocol {
        TCP | UDP => {
            let old_port = put16(msg, port_at, inner_port)?;
            icmp_sum = update_u16(icmp_sum, old_port, inner_port);
            // The transport checksum covers the whole original segment
            // and a pseudo-header with the addresses; the incremental
            // update is right for it without the rest of the segment.
            let ck_at = if emb.protocol == UDP { t + 6 } else { t + 16 };
            if let Some(old) = get16(msg, ck_at)
                && !(emb.protocol == UDP && old == 0)
            {
                let mut new = update_u16(update_bytes(old, &old_addr, &inner_addr), old_port, inner_port);
                if emb.protocol == UDP && new == 0 {
                    new = 0xffff;
                }
                put16(msg, ck_at, new)?;
                icmp_sum = update_u16(icmp_sum, old, new);
            }
        }
        ICMP => {
            let old_id = put16(msg, t + 4, inner_port)?;
            icmp_sum = update_u16(icmp_sum, old_id, inner_port);
            let old = get16(msg, t + 2)?;
            let new = update_u16(old, old_id, inner_port);
            put16(msg, t + 2, new)?;
            icmp_sum = update_u16(icmp_sum, old, new);
        }
        _ => return None,
    }
    put16(msg, l4 + 2, icmp_sum)?;
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_sdk::wire::build::FrameSpec;
    use sluice_sdk::wire::checksum::{checksum, pseudo_header_v4};
    use sluice_sdk::wire::tcp::TcpPacket;
    use sluice_sdk::wire::udp::UdpPacket;

    const L3: usize = 14;
    const L4: usize = 34;

    /// An ICMP error from `router` to `to` quoting `quoted` (a built
    /// frame) up to `quote` bytes of its IP datagram.
    fn error(router: [u8; 4], to: [u8; 4], msg_type: u8, code: u8, quoted: &[u8], quote: usize) -> Vec<u8> {
        let inner = &quoted[L3..(L3 + quote).min(quoted.len())];
        let mut icmp = vec![msg_type, code, 0, 0, 0, 0, 0x05, 0xdc];
        icmp.extend_from_slice(inner);
        let c = checksum(&icmp);
        icmp[2..4].copy_from_slice(&c.to_be_bytes());
        let mut ip = vec![0x45, 0, 0, 0, 0, 7, 0, 0, 64, ICMP, 0, 0];
        ip[2..4].copy_from_slice(&((20 + icmp.len()) as u16).to_be_bytes());
        ip.extend_from_slice(&router);
        ip.extend_from_slice(&to);
        let c = checksum(&ip);
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        let mut f = quoted[..L3].to_vec();
        f.extend_from_slice(&ip);
        f.extend_from_slice(&icmp);
        f
    }

    fn all_checksums_ok(f: &[u8], quote: usize) {
        let ip = Ipv4Packet::new_checked(&f[L3..]).unwrap();
        assert!(ip.verify_checksum(), "outer IP checksum");
        assert!(checksum_ok(&f[L3..]), "ICMP checksum");
        let inner = Ipv4Packet::new_checked(&f[L4 + 8..]).unwrap();
        assert!(inner.verify_checksum(), "embedded IP checksum");
        if quote >= inner.total_len() as usize {
            // The whole original datagram was quoted: its transport
            // checksum can be checked too.
            let seg = &f[L4 + 8 + 20..];
            let pseudo = pseudo_header_v4(inner.src(), inner.dst(), inner.protocol(), seg.len() as u16);
            match inner.protocol() {
                TCP => assert!(TcpPacket::new_checked(seg).unwrap().verify_checksum(pseudo), "embedded TCP"),
                UDP => assert!(UdpPacket::new_checked(seg).unwrap().verify_checksum(pseudo), "embedded UDP"),
                _ => assert_eq!(fold(sum(0, seg)), 0xffff, "embedded ICMP"),
            }
        }
    }

    #[test]
    fn an_inbound_error_gets_the_inside_endpoint_back_with_every_checksum_valid() {
        let public = [203, 0, 113, 1];
        let quoted = [
            FrameSpec::tcp4(public, 2001, [198, 51, 100, 7], 443, 0x10).with_payload(vec![7; 40]).build(),
            FrameSpec::udp4(public, 2002, [198, 51, 100, 7], 53).with_payload(b"query".to_vec()).build(),
        ];
        for q in &quoted {
            for quote in [28, 48, q.len() - L3] {
                let mut f = error([192, 0, 2, 1], public, DEST_UNREACHABLE, 4, q, quote);
                all_checksums_ok(&f, quote);
                let e = embedded(datagram(&f, L3), L4).unwrap();
                assert_eq!((e.src, e.dst_port), (public, if e.protocol == TCP { 443 } else { 53 }));
                rewrite_error(
                    &mut f,
                    L3,
                    L4,
                    Endpoint::Destination,
                    [10, 0, 0, 5],
                    (Endpoint::Source, [10, 0, 0, 5], 40000),
                )
                .unwrap();
                all_checksums_ok(&f, quote);
                let e = embedded(datagram(&f, L3), L4).unwrap();
                assert_eq!((e.src, e.src_port), ([10, 0, 0, 5], 40000));
                assert_eq!(Ipv4Packet::new_checked(&f[L3..]).unwrap().dst(), [10, 0, 0, 5]);
            }
        }
    }

    #[test]
    fn an_echo_quoted_in_an_error_gets_its_identifier_back() {
        let mut spec = FrameSpec::udp4([10, 0, 0, 5], 0, [198, 51, 100, 7], 0).with_payload(vec![1; 24]);
        spec.transport = sluice_sdk::wire::build::Transport::IcmpEchoReply { ident: 77 };
        let q = spec.build();
        let mut f = error([10, 0, 0, 5], [198, 51, 100, 7], TIME_EXCEEDED, 0, &q, q.len() - L3);
        rewrite_error(
            &mut f,
            L3,
            L4,
            Endpoint::Source,
            [203, 0, 113, 1],
            (Endpoint::Destination, [203, 0, 113, 1], 2500),
        )
        .unwrap();
        all_checksums_ok(&f, q.len() - L3);
        let e = embedded(datagram(&f, L3), L4).unwrap();
        assert_eq!((e.dst, e.dst_port, e.echo_type), ([203, 0, 113, 1], 2500, Some(ECHO_REPLY)));
    }

    #[test]
    fn cut_short_or_untranslatable_errors_are_refused() {
        let q = FrameSpec::udp4([203, 0, 113, 1], 2002, [198, 51, 100, 7], 53).build();
        let f = error([192, 0, 2, 1], [203, 0, 113, 1], DEST_UNREACHABLE, 3, &q, 24);
        assert_eq!(embedded(datagram(&f, L3), L4), None, "4 bytes of UDP header");
        let mut bad = error([192, 0, 2, 1], [203, 0, 113, 1], DEST_UNREACHABLE, 3, &q, 28);
        bad[L4 + 8 + 9] = 47; // GRE
        assert_eq!(embedded(datagram(&bad, L3), L4), None);
        let mut sum_bad = error([192, 0, 2, 1], [203, 0, 113, 1], DEST_UNREACHABLE, 3, &q, 28);
        sum_bad[L4 + 5] ^= 1;
        assert!(!checksum_ok(&sum_bad[L3..]));
        // Ethernet padding after a short error is not part of it.
        let mut padded = error([192, 0, 2, 1], [203, 0, 113, 1], DEST_UNREACHABLE, 3, &q, 28);
        padded.resize(80, 0xee);
        assert!(checksum_ok(datagram(&padded, L3).get(L3..).unwrap()));
    }

    #[test]
    fn echo_identifier_rewrite_keeps_the_checksum() {
        let mut spec = FrameSpec::udp4([10, 0, 0, 5], 0, [198, 51, 100, 7], 0).with_payload(vec![9; 3000]);
        spec.transport = sluice_sdk::wire::build::Transport::IcmpEcho { ident: 1 };
        let mut f = spec.build();
        set_echo_ident(&mut f, L4, 65535).unwrap();
        assert!(checksum_ok(&f[L3..]));
        assert_eq!(get16(&f, L4 + 4), Some(65535));
    }
}
