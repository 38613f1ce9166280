//! Building well-formed frames: for tests, benchmarks and synthetic traces.
//!
//! The builder writes correct lengths and checksums, so a frame it produces
//! parses back to the same flow key and passes `tshark` checksum validation.

use crate::checksum;
use crate::flow::IpAddr128;
use crate::parse::protocol;

/// Transport of a built frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// TCP with the given flag byte (see [`crate::tcp::flags`]).
    Tcp {
        /// Source port.
        src_port: u16,
        /// Destination port.
        dst_port: u16,
        /// Flag byte.
        flags: u8,
    },
    /// UDP.
    Udp {
        /// Source port.
        src_port: u16,
        /// Destination port.
        dst_port: u16,
    },
    /// ICMP (ICMPv6 when the addresses are IPv6) echo request.
    IcmpEcho {
        /// Echo identifier.
        ident: u16,
    },
    /// ICMP (ICMPv6) echo reply.
    IcmpEchoReply {
        /// Echo identifier.
        ident: u16,
    },
}

/// A frame to build: Ethernet, optional VLAN tag, IPv4 or IPv6, transport.
#[derive(Debug, Clone)]
pub struct FrameSpec {
    /// Source address (IPv4-mapped means IPv4).
    pub src: IpAddr128,
    /// Destination address; must be of the same family as `src`.
    pub dst: IpAddr128,
    /// Transport header.
    pub transport: Transport,
    /// Payload bytes after the transport header.
    pub payload: Vec<u8>,
    /// 802.1Q VLAN id, if tagged.
    pub vlan: Option<u16>,
}

impl FrameSpec {
    /// A TCP frame between IPv4 endpoints.
    pub fn tcp4(src: [u8; 4], sp: u16, dst: [u8; 4], dp: u16, flags: u8) -> Self {
        FrameSpec {
            src: IpAddr128::from_v4(src),
            dst: IpAddr128::from_v4(dst),
            transport: Transport::Tcp { src_port: sp, dst_port: dp, flags },
            payload: Vec::new(),
            vlan: None,
        }
    }

    /// A UDP frame between IPv4 endpoints.
    pub fn udp4(src: [u8; 4], sp: u16, dst: [u8; 4], dp: u16) -> Self {
        FrameSpec {
            src: IpAddr128::from_v4(src),
            dst: IpAddr128::from_v4(dst),
            transport: Transport::Udp { src_port: sp, dst_port: dp },
            payload: Vec::new(),
            vlan: None,
        }
    }

    /// Sets the payload.
    pub fn with_payload(mut self, payload: impl Into<Vec<u8>>) -> Self {
        self.payload = payload.into();
        self
    }

    /// Pads or sets the payload so the whole frame is `len` bytes (at least
    /// the headers).
    pub fn with_frame_len(mut self, len: usize) -> Self {
        let hdr = self.build().len() - self.payload.len();
        self.payload = vec![0xab; len.saturating_sub(hdr)];
        self
    }

    /// Adds an 802.1Q tag.
    pub fn with_vlan(mut self, id: u16) -> Self {
        self.vlan = Some(id);
        self
    }

    /// Writes the frame.
    pub fn build(&self) -> Vec<u8> {
        let v4 = self.src.to_v4().zip(self.dst.to_v4());
        let mut l4 = match self.transport {
            Transport::Tcp { src_port, dst_port, flags } => {
                let mut t = vec![0u8; 20];
                t[0..2].copy_from_slice(&src_port.to_be_bytes());
                t[2..4].copy_from_slice(&dst_port.to_be_bytes());
                t[4..8].copy_from_slice(&1000u32.to_be_bytes());
                t[12] = 5 << 4;
                t[13] = flags;
                t[14..16].copy_from_slice(&65535u16.to_be_bytes());
                t
            }
            Transport::Udp { src_port, dst_port } => {
                let mut u = vec![0u8; 8];
                u[0..2].copy_from_slice(&src_port.to_be_bytes());
                u[2..4].copy_from_slice(&dst_port.to_be_bytes());
                let len = (8 + self.payload.len()) as u16;
                u[4..6].copy_from_slice(&len.to_be_bytes());
                u
            }
            Transport::IcmpEcho { ident } | Transport::IcmpEchoReply { ident } => {
                let reply = matches!(self.transport, Transport::IcmpEchoReply { .. });
                let mut i = vec![0u8; 8];
                i[0] = match (v4.is_some(), reply) {
                    (true, false) => 8,
                    (true, true) => 0,
                    (false, false) => 128,
                    (false, true) => 129,
                };
                i[4..6].copy_from_slice(&ident.to_be_bytes());
                i[6..8].copy_from_slice(&1u16.to_be_bytes());
                i
            }
        };
        l4.extend_from_slice(&self.payload);
        let proto = match self.transport {
            Transport::Tcp { .. } => protocol::TCP,
            Transport::Udp { .. } => protocol::UDP,
            Transport::IcmpEcho { .. } | Transport::IcmpEchoReply { .. } if v4.is_some() => protocol::ICMP,
            Transport::IcmpEcho { .. } | Transport::IcmpEchoReply { .. } => protocol::ICMPV6,
        };
        let csum_at = match self.transport {
            Transport::Tcp { .. } => 16,
            Transport::Udp { .. } => 6,
            Transport::IcmpEcho { .. } | Transport::IcmpEchoReply { .. } => 2,
        };
        let mut ip = match v4 {
            Some((s, d)) => {
                let pseudo =
                    if proto == protocol::ICMP { 0 } else { checksum::pseudo_header_v4(s, d, proto, l4.len() as u16) };
                let c = !checksum::fold(checksum::sum(pseudo, &l4));
                let c = if c == 0 && proto == protocol::UDP { 0xffff } else { c };
                l4[csum_at..csum_at + 2].copy_from_slice(&c.to_be_bytes());
                let mut h = vec![0x45, 0, 0, 0, 0, 1, 0x40, 0, 64, proto, 0, 0];
                h[2..4].copy_from_slice(&((20 + l4.len()) as u16).to_be_bytes());
                h.extend_from_slice(&s);
                h.extend_from_slice(&d);
                let c = checksum::checksum(&h);
                h[10..12].copy_from_slice(&c.to_be_bytes());
                h
            }
            None => {
                let (s, d) = (self.src.to_v6(), self.dst.to_v6());
                let pseudo = checksum::pseudo_header_v6(s, d, proto, l4.len() as u32);
                let c = !checksum::fold(checksum::sum(pseudo, &l4));
                let c = if c == 0 && proto == protocol::UDP { 0xffff } else { c };
                l4[csum_at..csum_at + 2].copy_from_slice(&c.to_be_bytes());
                let mut h = vec![0x60, 0, 0, 0, 0, 0, proto, 64];
                h[4..6].copy_from_slice(&(l4.len() as u16).to_be_bytes());
                h.extend_from_slice(&s);
                h.extend_from_slice(&d);
                h
            }
        };
        ip.extend_from_slice(&l4);
        let ethertype: u16 = if v4.is_some() { 0x0800 } else { 0x86dd };
        let mut f = [DST_MAC, SRC_MAC].concat();
        if let Some(id) = self.vlan {
            f.extend_from_slice(&0x8100u16.to_be_bytes());
            f.extend_from_slice(&(id & 0x0fff).to_be_bytes());
        }
        f.extend_from_slice(&ethertype.to_be_bytes());
        f.extend_from_slice(&ip);
        f
    }
}

/// The MAC addresses of built frames: frames go from `SRC_MAC` to
/// `DST_MAC`.
const SRC_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 1];
const DST_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 2];

/// An ARP frame for IPv4 over Ethernet, padded to Ethernet's 60-byte
/// minimum: `sender` asks who has `target` (a broadcast request), or with
/// `reply` tells `target` that `sender` is at the built frames' source MAC.
/// Behind an 802.1Q tag `vlan` if given.
pub fn arp4(sender: [u8; 4], target: [u8; 4], reply: bool, vlan: Option<u16>) -> Vec<u8> {
    let (dst, operation, target_mac) = if reply { (DST_MAC, 2u16, DST_MAC) } else { ([0xff; 6], 1, [0; 6]) };
    let mut f = Vec::with_capacity(64);
    f.extend_from_slice(&dst);
    f.extend_from_slice(&SRC_MAC);
    if let Some(id) = vlan {
        f.extend_from_slice(&0x8100u16.to_be_bytes());
        f.extend_from_slice(&(id & 0x0fff).to_be_bytes());
    }
    f.extend_from_slice(&crate::ethernet::ethertype::ARP.to_be_bytes());
    // Hardware type Ethernet, protocol IPv4, their address lengths.
    f.extend_from_slice(&[0, 1, 0x08, 0x00, 6, 4]);
    f.extend_from_slice(&operation.to_be_bytes());
    f.extend_from_slice(&SRC_MAC);
    f.extend_from_slice(&sender);
    f.extend_from_slice(&target_mac);
    f.extend_from_slice(&target);
    f.resize(f.len().max(60), 0);
    f
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;

    #[test]
    fn arp_frames_parse_as_arp_without_a_flow() {
        for (reply, vlan) in [(false, None), (true, Some(42))] {
            let f = arp4([10, 0, 0, 5], [10, 0, 0, 1], reply, vlan);
            assert_eq!(f.len(), 60);
            let l = crate::parse(&f);
            assert_eq!((l.ethertype, l.vlan, l.key), (crate::ethernet::ethertype::ARP, vlan, None));
            let at = if vlan.is_some() { 18 } else { 14 };
            assert_eq!(&f[at + 6..at + 8], if reply { &[0, 2] } else { &[0, 1] });
            assert_eq!((&f[at + 14..at + 18], &f[at + 24..at + 28]), (&[10, 0, 0, 5][..], &[10, 0, 0, 1][..]));
            assert_eq!(&f[..6], if reply { &DST_MAC } else { &[0xff; 6] });
        }
    }
}
