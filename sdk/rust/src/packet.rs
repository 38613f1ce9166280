//! A typed view of one packet of a batch.

use sluice_wire::abi::{Descriptor, NO_FLOW, NO_L3, NO_L4, packet_flags};
use sluice_wire::icmp::IcmpPacket;
use sluice_wire::ipv4::Ipv4Packet;
use sluice_wire::ipv6::Ipv6Packet;
use sluice_wire::parse::protocol;
use sluice_wire::tcp::TcpPacket;
use sluice_wire::udp::UdpPacket;
use sluice_wire::{FlowKey, IpAddr128};

/// One packet: its bytes and what the host parsed. The header views use the
/// offsets the host found, so an NF does not walk Ethernet/VLAN again.
#[derive(Clone, Copy, Debug)]
pub struct Packet<'a> {
    bytes: &'a [u8],
    d: Descriptor,
}

impl<'a> Packet<'a> {
    pub(crate) fn new(bytes: &'a [u8], d: Descriptor) -> Self {
        Packet { bytes, d }
    }

    /// The host's descriptor of the packet.
    pub fn descriptor(&self) -> &Descriptor {
        &self.d
    }

    /// The captured bytes.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// Length on the wire (≥ captured length).
    pub fn wire_len(&self) -> u32 {
        self.d.wire_len
    }

    /// Arrival time (ns since the Unix epoch).
    pub fn timestamp_ns(&self) -> u64 {
        self.d.timestamp_ns
    }

    /// Port the packet came in on.
    pub fn ingress_port(&self) -> u16 {
        self.d.ingress_port
    }

    /// Whether the packet travels against its flow's normalized direction.
    pub fn is_reverse(&self) -> bool {
        self.d.flags & packet_flags::REVERSE != 0
    }

    /// Whether this is an IP fragment.
    pub fn is_fragment(&self) -> bool {
        self.d.flags & packet_flags::FRAGMENT != 0
    }

    /// Whether the capture holds fewer bytes than were on the wire.
    pub fn is_truncated(&self) -> bool {
        self.d.flags & packet_flags::TRUNCATED != 0
    }

    /// Index of this packet's flow in the batch (for flow state), if it is
    /// an IP packet and the NF asked for flow state.
    pub fn flow(&self) -> Option<u32> {
        (self.d.flow != NO_FLOW).then_some(u32::from(self.d.flow))
    }

    /// Symmetric hash of the flow (0 for packets without a flow).
    pub fn flow_hash(&self) -> u64 {
        self.d.flow_hash
    }

    fn l3(&self) -> Option<&'a [u8]> {
        (self.d.l3_offset != NO_L3).then(|| self.bytes.get(usize::from(self.d.l3_offset)..)).flatten()
    }

    fn l4(&self) -> Option<&'a [u8]> {
        (self.d.l4_offset != NO_L4).then(|| self.bytes.get(usize::from(self.d.l4_offset)..)).flatten()
    }

    /// The IPv4 header, if this is an IPv4 packet.
    pub fn ipv4(&self) -> Option<Ipv4Packet<&'a [u8]>> {
        if self.d.flags & packet_flags::IPV6 != 0 {
            return None;
        }
        Ipv4Packet::new_checked(self.l3()?).ok()
    }

    /// The IPv6 header, if this is an IPv6 packet.
    pub fn ipv6(&self) -> Option<Ipv6Packet<&'a [u8]>> {
        if self.d.flags & packet_flags::IPV6 == 0 {
            return None;
        }
        Ipv6Packet::new_checked(self.l3()?).ok()
    }

    /// IP protocol number, for IP packets.
    pub fn protocol(&self) -> Option<u8> {
        let l3 = self.l3()?;
        if self.d.flags & packet_flags::IPV6 == 0 {
            Ipv4Packet::new_checked(l3).ok().map(|p| p.protocol())
        } else {
            Ipv6Packet::new_checked(l3).ok().and_then(|p| p.upper_layer().ok()).map(|u| u.protocol)
        }
    }

    /// The 5-tuple in the packet's direction, for IP packets. Ports are 0
    /// when the transport header is absent; for ICMP echo both hold the
    /// identifier (as in the host's flow key).
    pub fn key(&self) -> Option<FlowKey> {
        let l3 = self.l3()?;
        let (src, dst, proto) = if self.d.flags & packet_flags::IPV6 == 0 {
            let ip = Ipv4Packet::new_checked(l3).ok()?;
            (IpAddr128::from_v4(ip.src()), IpAddr128::from_v4(ip.dst()), ip.protocol())
        } else {
            let ip = Ipv6Packet::new_checked(l3).ok()?;
            let proto = ip.upper_layer().map(|u| u.protocol).unwrap_or(ip.next_header());
            (IpAddr128::from_v6(ip.src()), IpAddr128::from_v6(ip.dst()), proto)
        };
        let (src_port, dst_port) = match (proto, self.l4()) {
            (protocol::TCP, Some(l4)) => {
                TcpPacket::new_checked(l4).map(|t| (t.src_port(), t.dst_port())).unwrap_or((0, 0))
            }
            (protocol::UDP, Some(l4)) => {
                UdpPacket::new_checked(l4).map(|u| (u.src_port(), u.dst_port())).unwrap_or((0, 0))
            }
            (protocol::ICMP | protocol::ICMPV6, Some(l4)) => IcmpPacket::new_checked(l4)
                .ok()
                .filter(|i| i.is_echo(proto == protocol::ICMPV6))
                .map(|i| (i.echo_ident(), i.echo_ident()))
                .unwrap_or((0, 0)),
            _ => (0, 0),
        };
        Some(FlowKey { src, dst, src_port, dst_port, protocol: proto })
    }

    /// The TCP header, if this is a TCP packet with a readable header.
    pub fn tcp(&self) -> Option<TcpPacket<&'a [u8]>> {
        if self.protocol()? != protocol::TCP {
            return None;
        }
        TcpPacket::new_checked(self.l4()?).ok()
    }

    /// The UDP header, if this is a UDP packet with a readable header.
    pub fn udp(&self) -> Option<UdpPacket<&'a [u8]>> {
        if self.protocol()? != protocol::UDP {
            return None;
        }
        UdpPacket::new_checked(self.l4()?).ok()
    }

    /// The ICMP/ICMPv6 header, if present.
    pub fn icmp(&self) -> Option<IcmpPacket<&'a [u8]>> {
        let p = self.protocol()?;
        if p != protocol::ICMP && p != protocol::ICMPV6 {
            return None;
        }
        IcmpPacket::new_checked(self.l4()?).ok()
    }

    /// The transport payload (TCP/UDP data), if any.
    pub fn payload(&self) -> &'a [u8] {
        let l4 = usize::from(self.d.l4_offset);
        if let Some(t) = self.tcp() {
            return self.bytes.get(l4 + t.header_len()..).unwrap_or(&[]);
        }
        if let Some(u) = self.udp() {
            let start = l4 + sluice_wire::udp::HEADER_LEN;
            let end = (start + usize::from(u.len()).saturating_sub(8)).min(self.bytes.len());
            return self.bytes.get(start..end).unwrap_or(&[]);
        }
        &[]
    }
}
