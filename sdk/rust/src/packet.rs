//! A typed view of one packet of a batch.

use crate::PacketMeta;
use crate::wit::sluice::nf::types as t;
use sluice_wire::icmp::IcmpPacket;
use sluice_wire::ipv4::Ipv4Packet;
use sluice_wire::ipv6::Ipv6Packet;
use sluice_wire::tcp::TcpPacket;
use sluice_wire::udp::UdpPacket;
use sluice_wire::{FlowKey, IpAddr128};

/// One packet: its bytes and what the host parsed. The header views use the
/// offsets the host found, so an NF does not parse Ethernet/IP again.
#[derive(Clone, Copy)]
pub struct Packet<'a> {
    meta: &'a PacketMeta,
    bytes: &'a [u8],
}

pub(crate) fn key_from_wit(k: &t::FlowKey) -> FlowKey {
    FlowKey {
        src: IpAddr128::from_parts(k.src.hi, k.src.lo),
        dst: IpAddr128::from_parts(k.dst.hi, k.dst.lo),
        src_port: k.src_port,
        dst_port: k.dst_port,
        protocol: k.protocol,
    }
}

impl<'a> Packet<'a> {
    pub(crate) fn new(meta: &'a PacketMeta, bytes: &'a [u8]) -> Self {
        Packet { meta, bytes }
    }

    /// The captured bytes.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// The host's metadata.
    pub fn meta(&self) -> &'a PacketMeta {
        self.meta
    }

    /// Arrival time (ns since the Unix epoch).
    pub fn timestamp_ns(&self) -> u64 {
        self.meta.timestamp_ns
    }

    /// Port the packet came in on.
    pub fn ingress_port(&self) -> u16 {
        self.meta.ingress_port
    }

    /// The 5-tuple in the packet's direction, for IP packets.
    pub fn key(&self) -> Option<FlowKey> {
        self.meta.key.as_ref().map(key_from_wit)
    }

    /// Index of this packet's flow in the batch (for flow state).
    pub fn flow(&self) -> Option<u32> {
        self.meta.flow
    }

    /// Symmetric hash of the flow (0 for packets without a flow).
    pub fn flow_hash(&self) -> u64 {
        self.meta.flow_hash
    }

    fn l3(&self) -> Option<&'a [u8]> {
        self.bytes.get(usize::from(self.meta.l3_offset?)..)
    }

    fn l4(&self) -> Option<&'a [u8]> {
        self.bytes.get(usize::from(self.meta.l4_offset?)..)
    }

    /// The IPv4 header, if this is an IPv4 packet.
    pub fn ipv4(&self) -> Option<Ipv4Packet<&'a [u8]>> {
        Ipv4Packet::new_checked(self.l3()?).ok()
    }

    /// The IPv6 header, if this is an IPv6 packet.
    pub fn ipv6(&self) -> Option<Ipv6Packet<&'a [u8]>> {
        Ipv6Packet::new_checked(self.l3()?).ok()
    }

    /// The TCP header, if this is a TCP packet with a readable header.
    pub fn tcp(&self) -> Option<TcpPacket<&'a [u8]>> {
        if self.meta.key.as_ref()?.protocol != sluice_wire::parse::protocol::TCP {
            return None;
        }
        TcpPacket::new_checked(self.l4()?).ok()
    }

    /// The UDP header, if this is a UDP packet with a readable header.
    pub fn udp(&self) -> Option<UdpPacket<&'a [u8]>> {
        if self.meta.key.as_ref()?.protocol != sluice_wire::parse::protocol::UDP {
            return None;
        }
        UdpPacket::new_checked(self.l4()?).ok()
    }

    /// The ICMP/ICMPv6 header, if present.
    pub fn icmp(&self) -> Option<IcmpPacket<&'a [u8]>> {
        let p = self.meta.key.as_ref()?.protocol;
        if p != sluice_wire::parse::protocol::ICMP && p != sluice_wire::parse::protocol::ICMPV6 {
            return None;
        }
        IcmpPacket::new_checked(self.l4()?).ok()
    }

    /// The transport payload (TCP/UDP data), if any.
    pub fn payload(&self) -> &'a [u8] {
        if let Some(t) = self.tcp() {
            let off = usize::from(self.meta.l4_offset.unwrap_or(0)) + t.header_len();
            return self.bytes.get(off..).unwrap_or(&[]);
        }
        if let Some(u) = self.udp() {
            let start = usize::from(self.meta.l4_offset.unwrap_or(0)) + sluice_wire::udp::HEADER_LEN;
            let end = (start + usize::from(u.len()).saturating_sub(8)).min(self.bytes.len());
            return self.bytes.get(start..end).unwrap_or(&[]);
        }
        &[]
    }
}
