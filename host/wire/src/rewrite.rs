//! Rewriting a packet's source or destination endpoint (address and port)
//! with every checksum kept valid — what NAT and load balancers do.
//!
//! The IPv4 header checksum and the TCP/UDP checksums (whose pseudo-header
//! covers the addresses) are updated incrementally (RFC 1624), so the cost
//! does not depend on the payload size. ICMP checksums do not cover the IP
//! header, so only the address changes for ICMP.

use crate::flow::IpAddr128;
use crate::ipv4::Ipv4Packet;
use crate::ipv6::Ipv6Packet;
use crate::parse::{Layers, protocol};
use crate::tcp::TcpPacket;
use crate::udp::UdpPacket;
use crate::{Error, Result};

/// Which endpoint to rewrite.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// The sender.
    Source,
    /// The receiver.
    Destination,
}

/// Sets the address (and, for TCP/UDP, optionally the port) of one endpoint
/// of the IP packet in `frame`, whose layers `l` were parsed from it.
/// The new address must be of the packet's IP version.
pub fn set_endpoint(frame: &mut [u8], l: &Layers, which: Endpoint, addr: IpAddr128, port: Option<u16>) -> Result<()> {
    let l3 = usize::from(l.l3_offset.ok_or(Error::Malformed)?);
    let key = l.key.ok_or(Error::Malformed)?;
    let ip_bytes = frame.get_mut(l3..).ok_or(Error::Truncated)?;
    // The old and new address, in the first 4 or 16 bytes (no allocation
    // per rewritten packet).
    let (old, new, len) = if let Some(v4) = addr.to_v4() {
        let mut ip = Ipv4Packet::new_checked(&mut *ip_bytes)?;
        let old = match which {
            Endpoint::Source => {
                let old = ip.src();
                ip.set_src(v4);
                old
            }
            Endpoint::Destination => {
                let old = ip.dst();
                ip.set_dst(v4);
                old
            }
        };
        (widen(&old), widen(&v4), 4)
    } else {
        let mut ip = Ipv6Packet::new_checked(&mut *ip_bytes)?;
        let v6 = addr.to_v6();
        let old = match which {
            Endpoint::Source => {
                let old = ip.src();
                ip.set_src(v6);
                old
            }
            Endpoint::Destination => {
                let old = ip.dst();
                ip.set_dst(v6);
                old
            }
        };
        (old, v6, 16)
    };
    let (Some(old), Some(new)) = (old.get(..len), new.get(..len)) else { return Err(Error::Malformed) };
    let Some(l4) = l.l4_offset.map(usize::from) else { return Ok(()) };
    let t = frame.get_mut(l4..).ok_or(Error::Truncated)?;
    match key.protocol {
        protocol::TCP => {
            let mut tcp = TcpPacket::new_checked(t)?;
            tcp.update_checksum_for_address(old, new);
            match (which, port) {
                (Endpoint::Source, Some(p)) => tcp.set_src_port(p),
                (Endpoint::Destination, Some(p)) => tcp.set_dst_port(p),
                _ => {}
            }
        }
        protocol::UDP => {
            let mut udp = UdpPacket::new_checked(t)?;
            udp.update_checksum_for_address(old, new);
            match (which, port) {
                (Endpoint::Source, Some(p)) => udp.set_src_port(p),
                (Endpoint::Destination, Some(p)) => udp.set_dst_port(p),
                _ => {}
            }
        }
        _ => {}
    }
    Ok(())
}

/// An IPv4 address in the first four of 16 bytes.
fn widen(a: &[u8; 4]) -> [u8; 16] {
    let mut w = [0u8; 16];
    for (d, s) in w.iter_mut().zip(a) {
        *d = *s;
    }
    w
}

/// Lowers the TTL (IPv4, header checksum updated incrementally) or hop
/// limit (IPv6) of the IP packet in `frame` by one. `Ok(false)`, and the
/// frame unchanged, when it is 1 or 0 already: a router answers such a
/// packet instead of forwarding it.
pub fn decrement_ttl(frame: &mut [u8], l: &Layers) -> Result<bool> {
    let l3 = usize::from(l.l3_offset.ok_or(Error::Malformed)?);
    let ip_bytes = frame.get_mut(l3..).ok_or(Error::Truncated)?;
    if l.ethertype == crate::ethernet::ethertype::IPV6 {
        let mut ip = Ipv6Packet::new_checked(ip_bytes)?;
        let h = ip.hop_limit();
        if h <= 1 {
            return Ok(false);
        }
        ip.set_hop_limit(h - 1);
    } else {
        let mut ip = Ipv4Packet::new_checked(ip_bytes)?;
        let t = ip.ttl();
        if t <= 1 {
            return Ok(false);
        }
        ip.set_ttl(t - 1);
    }
    Ok(true)
}

/// Sets the DSCP (the six high bits of the IPv4 TOS or IPv6 traffic class
/// byte; the two ECN bits are kept) of the IP packet in `frame`, with the
/// IPv4 header checksum updated incrementally. `dscp` above 63 is refused.
pub fn set_dscp(frame: &mut [u8], l: &Layers, dscp: u8) -> Result<()> {
    if dscp > 63 {
        return Err(Error::Malformed);
    }
    let l3 = usize::from(l.l3_offset.ok_or(Error::Malformed)?);
    let ip_bytes = frame.get_mut(l3..).ok_or(Error::Truncated)?;
    if l.ethertype == crate::ethernet::ethertype::IPV6 {
        Ipv6Packet::new_checked(&mut *ip_bytes)?;
        // Traffic class: the low 4 bits of byte 0 and the high 4 of byte 1.
        let (Some(&b0), Some(&b1)) = (ip_bytes.first(), ip_bytes.get(1)) else { return Err(Error::Truncated) };
        let tc = (b0 << 4) | (b1 >> 4);
        let tc = (dscp << 2) | (tc & 0x3);
        if let Some(b) = ip_bytes.get_mut(0) {
            *b = (b0 & 0xf0) | (tc >> 4);
        }
        if let Some(b) = ip_bytes.get_mut(1) {
            *b = (b1 & 0x0f) | (tc << 4);
        }
    } else {
        let ip = Ipv4Packet::new_checked(&mut *ip_bytes)?;
        let old_checksum = ip.checksum();
        let (Some(&b0), Some(&tos)) = (ip_bytes.first(), ip_bytes.get(1)) else { return Err(Error::Truncated) };
        let new_tos = (dscp << 2) | (tos & 0x3);
        let c =
            crate::checksum::update_u16(old_checksum, u16::from_be_bytes([b0, tos]), u16::from_be_bytes([b0, new_tos]));
        if let Some(b) = ip_bytes.get_mut(1) {
            *b = new_tos;
        }
        if let Some(c_bytes) = ip_bytes.get_mut(10..12) {
            c_bytes.copy_from_slice(&c.to_be_bytes());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::{FrameSpec, Transport};
    use crate::checksum;
    use crate::parse::parse;

    fn transport_ok(frame: &[u8]) -> bool {
        let l = parse(frame);
        let k = l.key.unwrap();
        let l3 = usize::from(l.l3_offset.unwrap());
        let l4 = usize::from(l.l4_offset.unwrap());
        let t = &frame[l4..];
        let pseudo = match (k.src.to_v4(), k.dst.to_v4()) {
            (Some(s), Some(d)) => {
                assert!(Ipv4Packet::new_checked(&frame[l3..]).unwrap().verify_checksum());
                checksum::pseudo_header_v4(s, d, k.protocol, t.len() as u16)
            }
            _ => checksum::pseudo_header_v6(k.src.to_v6(), k.dst.to_v6(), k.protocol, t.len() as u32),
        };
        match k.protocol {
            protocol::TCP => TcpPacket::new_checked(t).unwrap().verify_checksum(pseudo),
            _ => UdpPacket::new_checked(t).unwrap().verify_checksum(pseudo),
        }
    }

    #[test]
    fn ttl_and_dscp_keep_the_ipv4_checksum_valid() {
        let mut f = FrameSpec::tcp4([10, 0, 0, 1], 1234, [203, 0, 113, 10], 80, 0x10).build();
        let l = parse(&f);
        let l3 = usize::from(l.l3_offset.unwrap());
        let ttl = Ipv4Packet::new_checked(&f[l3..]).unwrap().ttl();
        assert!(decrement_ttl(&mut f, &l).unwrap());
        set_dscp(&mut f, &l, 46).unwrap();
        let ip = Ipv4Packet::new_checked(&f[l3..]).unwrap();
        assert_eq!((ip.ttl(), ip.tos() >> 2), (ttl - 1, 46));
        assert!(ip.verify_checksum());
        assert!(transport_ok(&f));
        assert!(set_dscp(&mut f, &l, 64).is_err());
        f[l3 + 8] = 1;
        let before = f.clone();
        assert!(!decrement_ttl(&mut f, &l).unwrap());
        assert_eq!(f, before);
    }

    #[test]
    fn hop_limit_and_traffic_class_of_ipv6() {
        let a = IpAddr128::from_v6([0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        let b = IpAddr128::from_v6([0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
        let mut f = FrameSpec {
            src: a,
            dst: b,
            transport: Transport::Tcp { src_port: 1000, dst_port: 443, flags: 0x10 },
            payload: vec![1, 2, 3],
            vlan: None,
        }
        .build();
        let l = parse(&f);
        let l3 = usize::from(l.l3_offset.unwrap());
        let hop = Ipv6Packet::new_checked(&f[l3..]).unwrap().hop_limit();
        assert!(decrement_ttl(&mut f, &l).unwrap());
        set_dscp(&mut f, &l, 0x2e).unwrap();
        let ip = Ipv6Packet::new_checked(&f[l3..]).unwrap();
        assert_eq!((ip.hop_limit(), ip.traffic_class() >> 2, ip.version()), (hop - 1, 0x2e, 6));
        assert!(transport_ok(&f));
    }

    #[test]
    fn checksums_stay_valid_for_v4_tcp_and_udp() {
        for spec in [
            FrameSpec::tcp4([10, 0, 0, 1], 1234, [203, 0, 113, 10], 80, 2).with_payload(b"GET /".to_vec()),
            FrameSpec::udp4([10, 0, 0, 1], 1234, [203, 0, 113, 10], 53).with_payload(b"query".to_vec()),
        ] {
            let mut f = spec.build();
            assert!(transport_ok(&f));
            let l = parse(&f);
            set_endpoint(&mut f, &l, Endpoint::Destination, IpAddr128::from_v4([10, 1, 0, 7]), Some(8080)).unwrap();
            let k = parse(&f).key.unwrap();
            assert_eq!((k.dst, k.dst_port), (IpAddr128::from_v4([10, 1, 0, 7]), 8080));
            assert!(transport_ok(&f));
            let l = parse(&f);
            set_endpoint(&mut f, &l, Endpoint::Source, IpAddr128::from_v4([198, 51, 100, 1]), None).unwrap();
            assert_eq!(parse(&f).key.unwrap().src_port, 1234);
            assert!(transport_ok(&f));
        }
    }

    #[test]
    fn checksums_stay_valid_for_v6() {
        let a = IpAddr128::from_v6([0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        let b = IpAddr128::from_v6([0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
        let c = IpAddr128::from_v6([0x20, 1, 0xd, 0xb8, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9]);
        let mut f = FrameSpec {
            src: a,
            dst: b,
            transport: Transport::Tcp { src_port: 5, dst_port: 443, flags: 2 },
            payload: vec![1, 2, 3],
            vlan: None,
        }
        .build();
        let l = parse(&f);
        set_endpoint(&mut f, &l, Endpoint::Destination, c, Some(8443)).unwrap();
        assert!(transport_ok(&f));
        // A v4 address on a v6 packet is refused, not half-applied.
        let l = parse(&f);
        assert!(set_endpoint(&mut f, &l, Endpoint::Source, IpAddr128::from_v4([1, 2, 3, 4]), None).is_err());
    }
}
