//! Any bytes through the whole parser and every header view: nothing may
//! panic, and what the lax parser reports must be readable by the views.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_wire::ethernet::EthernetFrame;
use sluice_wire::icmp::IcmpPacket;
use sluice_wire::ipv4::Ipv4Packet;
use sluice_wire::ipv6::Ipv6Packet;
use sluice_wire::tcp::TcpPacket;
use sluice_wire::udp::UdpPacket;

fuzz_target!(|data: &[u8]| {
    let l = sluice_wire::parse(data);
    if let Some(k) = l.key {
        assert_eq!(k.symmetric_hash(), k.reversed().symmetric_hash());
    }
    if let Ok(e) = EthernetFrame::new_checked(data) {
        let _ = (e.dst(), e.src(), e.network());
    }
    if let Some(off) = l.l3_offset {
        let ip = &data[usize::from(off)..];
        if let Ok(p) = Ipv4Packet::new_checked(ip) {
            let _ = (p.src(), p.dst(), p.payload(), p.verify_checksum(), p.is_fragment());
        }
        if let Ok(p) = Ipv6Packet::new_checked(ip) {
            let _ = (p.src(), p.dst(), p.payload(), p.upper_layer(), p.flow_label());
        }
    }
    if let Some(off) = l.l4_offset {
        let t = &data[usize::from(off)..];
        if let Ok(p) = TcpPacket::new_checked(t) {
            let _ = (p.payload(), p.flags(), p.verify_checksum(0));
            let mut copy = t.to_vec();
            let mut m = TcpPacket::new_unchecked(&mut copy[..]);
            m.set_src_port(1);
            m.update_checksum_for_address(&[1, 2, 3, 4], &[5, 6, 7, 8]);
        }
        if let Ok(p) = UdpPacket::new_checked(t) {
            let _ = (p.payload(), p.verify_checksum(0));
        }
        if let Ok(p) = IcmpPacket::new_checked(t) {
            let _ = (p.echo_ident(), p.is_echo(false));
        }
    }
    if let Ok(b) = sluice_wire::beacon::Beacon::new_checked(data) {
        assert!(!b.host().is_empty());
        let _ = b.seq();
    }
    // Unchecked views on arbitrary bytes must not panic either.
    let _ = Ipv4Packet::new_unchecked(data).payload();
    let _ = TcpPacket::new_unchecked(data).payload();
    let _ = UdpPacket::new_unchecked(data).payload();
});
