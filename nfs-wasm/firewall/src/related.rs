//! ICMP errors that belong to a connection: which connection an ICMP or
//! ICMPv6 error is about, read from the packet it quotes.
//!
//! An error (destination unreachable, time exceeded, parameter problem,
//! ICMPv6 packet too big) carries the IP header of the packet that caused
//! it and at least the first 8 bytes of that packet's transport header:
//! enough for the ports, or an echo's identifier. The error goes back to
//! that packet's sender, so its destination must be the quoted source;
//! one that is not is about no connection of the receiver's.

use sluice_sdk::wire::ipv4::Ipv4Packet;
use sluice_sdk::wire::ipv6::Ipv6Packet;
use sluice_sdk::wire::parse::protocol;
use sluice_sdk::{FlowKey, IpAddr128};

/// ICMP header length before the quoted packet.
const HEADER_LEN: usize = 8;

/// Whether `msg_type` is an error message of ICMP (`v6 = false`) or
/// ICMPv6 (`v6 = true`) that quotes the packet it is about.
pub fn is_error(msg_type: u8, v6: bool) -> bool {
    if v6 {
        // Destination unreachable, packet too big, time exceeded,
        // parameter problem.
        matches!(msg_type, 1..=4)
    } else {
        // Destination unreachable, time exceeded, parameter problem.
        matches!(msg_type, 3 | 11 | 12)
    }
}

fn get16(b: &[u8], at: usize) -> Option<u16> {
    match b.get(at..at.checked_add(2)?)? {
        &[x, y] => Some(u16::from_be_bytes([x, y])),
        _ => None,
    }
}

/// The normalized 5-tuple of the connection the ICMP error at `l4` of
/// `frame` is about, if it is an error that quotes a packet from its own
/// destination `to`. Ports as in the host's flow key: TCP/UDP ports, an
/// echo's identifier in both, 0 for other protocols. `None` for other
/// messages, errors about errors, quotes cut short and quoted fragments
/// after the first (no ports).
pub fn connection(frame: &[u8], l4: usize, v6: bool, to: IpAddr128) -> Option<FlowKey> {
    if !is_error(*frame.get(l4)?, v6) {
        return None;
    }
    let at = l4.checked_add(HEADER_LEN)?;
    let quoted = frame.get(at..)?;
    let (src, dst, proto, t) = if v6 {
        let ip = Ipv6Packet::new_checked(quoted).ok()?;
        let ul = ip.upper_layer().ok()?;
        if ul.later_fragment {
            return None;
        }
        (IpAddr128::from_v6(ip.src()), IpAddr128::from_v6(ip.dst()), ul.protocol, ul.offset)
    } else {
        let ip = Ipv4Packet::new_checked(quoted).ok()?;
        if ip.frag_offset() != 0 {
            return None;
        }
        (IpAddr128::from_v4(ip.src()), IpAddr128::from_v4(ip.dst()), ip.protocol(), ip.header_len())
    };
    if src != to {
        return None;
    }
    let head = quoted.get(t..).unwrap_or(&[]);
    let (src_port, dst_port) = match proto {
        protocol::TCP | protocol::UDP => (get16(head, 0)?, get16(head, 2)?),
        protocol::ICMP | protocol::ICMPV6 => {
            let echo = match *head.first()? {
                8 | 0 => proto == protocol::ICMP,
                128 | 129 => proto == protocol::ICMPV6,
                _ => false,
            };
            if !echo {
                return None;
            }
            let id = get16(head, 4)?;
            (id, id)
        }
        _ => (0, 0),
    };
    Some(FlowKey { src, dst, src_port, dst_port, protocol: proto }.normalized())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_sdk::wire::build::{FrameSpec, Transport};

    /// An ICMP(v6) error of `msg_type` from `from` to `to`, quoting the IP
    /// datagram of `quoted` (a built frame) up to `quote` bytes, and the
    /// offset of its ICMP header. (Built as an echo, then retyped: the
    /// checksum does not matter here.)
    fn error(from: IpAddr128, to: IpAddr128, msg_type: u8, quoted: &[u8], quote: usize) -> (Vec<u8>, usize) {
        let payload = quoted[14..(14 + quote).min(quoted.len())].to_vec();
        let mut f =
            FrameSpec { src: from, dst: to, transport: Transport::IcmpEcho { ident: 0 }, payload, vlan: None }.build();
        let l4 = if to.to_v4().is_none() { 14 + 40 } else { 14 + 20 };
        f[l4] = msg_type;
        (f, l4)
    }

    #[test]
    fn a_quoted_udp_packet_names_its_connection() {
        let inside = IpAddr128::from_v4([10, 0, 0, 5]);
        let dns = FrameSpec::udp4([10, 0, 0, 5], 5353, [192, 0, 2, 53], 53).build();
        let (f, l4) = error(IpAddr128::from_v4([192, 0, 2, 53]), inside, 3, &dns, 28);
        let k = connection(&f, l4, false, inside).unwrap();
        let want = FlowKey {
            src: inside,
            dst: IpAddr128::from_v4([192, 0, 2, 53]),
            src_port: 5353,
            dst_port: 53,
            protocol: 17,
        };
        assert_eq!(k, want.normalized());
        // Sent to someone else than the quoted sender: about nothing of ours.
        assert_eq!(connection(&f, l4, false, IpAddr128::from_v4([10, 0, 0, 6])), None);
        // Quoting 4 bytes of the UDP header is too little.
        let (short, l4) = error(IpAddr128::from_v4([192, 0, 2, 53]), inside, 3, &dns, 22);
        assert_eq!(connection(&short, l4, false, inside), None);
        // An echo request is no error.
        let (echo, l4) = error(IpAddr128::from_v4([192, 0, 2, 53]), inside, 8, &dns, 28);
        assert_eq!(connection(&echo, l4, false, inside), None);
    }

    #[test]
    fn v6_packet_too_big_and_quoted_echoes() {
        let a = IpAddr128::from_v6([0x20, 1, 0xd, 0xb8, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7]);
        let b = IpAddr128::from_v6([0x20, 1, 0xd, 0xb8, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        let tcp = FrameSpec {
            src: a,
            dst: b,
            transport: Transport::Tcp { src_port: 50000, dst_port: 443, flags: 0x10 },
            payload: vec![1; 100],
            vlan: None,
        }
        .build();
        let (f, l4) = error(b, a, 2, &tcp, 48);
        let k = connection(&f, l4, true, a).unwrap();
        assert_eq!((k.protocol, k.src_port.max(k.dst_port)), (6, 50000));
        let ping =
            FrameSpec { src: a, dst: b, transport: Transport::IcmpEcho { ident: 9 }, payload: vec![], vlan: None }
                .build();
        let (f, l4) = error(b, a, 3, &ping, 48);
        assert_eq!(connection(&f, l4, true, a).map(|k| (k.src_port, k.dst_port, k.protocol)), Some((9, 9, 58)));
        // An error about an error is about no connection.
        let (inner, _) = error(b, a, 1, &tcp, 48);
        let (f, l4) = error(b, a, 1, &inner, 48);
        assert_eq!(connection(&f, l4, true, a), None);
    }
}
