//! Reports every TCP connection attempt: for each IPv4 TCP packet with SYN
//! set and ACK clear, a `conformance.syn` event (level info, the packet's
//! index, fields `src` and `dst` as `a.b.c.d:port`). A batch's events go
//! to the host in one call. Every packet is forwarded.

use sluice_sdk::{Batch, Event, Level, NetworkFunction, NfInfo, emit};
use std::net::Ipv4Addr;

struct Syns;

impl NetworkFunction for Syns {
    fn init(_config: &[u8]) -> Result<(Self, NfInfo), String> {
        Ok((Syns, NfInfo::stateless()))
    }

    fn process(&mut self, batch: &mut Batch) -> Result<(), String> {
        let mut events = Vec::new();
        for (i, p) in batch.packets().enumerate() {
            let (Some(ip), Some(tcp)) = (p.ipv4(), p.tcp()) else { continue };
            if tcp.syn() && !tcp.ack() {
                events.push(Event {
                    kind: "conformance.syn".into(),
                    level: Level::Info,
                    packet: Some(i as u32),
                    fields: vec![
                        ("src".into(), format!("{}:{}", Ipv4Addr::from(ip.src()), tcp.src_port())),
                        ("dst".into(), format!("{}:{}", Ipv4Addr::from(ip.dst()), tcp.dst_port())),
                    ],
                });
            }
        }
        if !events.is_empty() {
            emit(&events);
        }
        Ok(())
    }
}

sluice_sdk::export_nf!(Syns);
