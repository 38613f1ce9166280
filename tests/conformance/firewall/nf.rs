//! A stateful firewall: connections from inside (`inside=<IPv4 CIDR>` in
//! the config) may go out, and their replies come back; ARP passes (the
//! hosts on a link must find each other's addresses to talk at all);
//! anything else is dropped. Each allowed flow keeps one byte of per-flow
//! state; a TCP RST forgets it.

use sluice_sdk::matchers::Cidr;
use sluice_sdk::wire::abi::NO_FLOW;
use sluice_sdk::{Batch, IpAddr128, NetworkFunction, NfInfo, Verdict, config_value};

struct Firewall {
    inside: Cidr,
}

impl NetworkFunction for Firewall {
    fn init(config: &[u8]) -> Result<(Self, NfInfo), String> {
        let text = std::str::from_utf8(config).map_err(|_| "config is not UTF-8".to_string())?;
        let inside = config_value(text, "inside").ok_or("config: missing inside=<IPv4 CIDR>")?;
        let inside = Cidr::parse(inside).map_err(|e| format!("config: inside: {e}"))?;
        Ok((Firewall { inside }, NfInfo::with_flow_state(0)))
    }

    fn process(&mut self, batch: &mut Batch) -> Result<(), String> {
        for i in 0..batch.len() {
            let Some(p) = batch.packet(i) else { continue };
            let flow = u32::from(p.descriptor().flow);
            let from_inside = p.ipv4().is_some_and(|ip| self.inside.contains(IpAddr128::from_v4(ip.src())));
            let rst = p.tcp().is_some_and(|t| t.rst());
            if flow == u32::from(NO_FLOW) {
                // Not IP: ARP (EtherType 0x0806) passes, the rest drops.
                if p.bytes().get(12..14) != Some(&[0x08, 0x06][..]) {
                    batch.set_verdict(i, Verdict::Drop);
                }
            } else if batch.flow_state(flow).is_some() {
                if rst {
                    batch.remove_flow_state(flow);
                }
            } else if from_inside {
                batch.set_flow_state(flow, vec![1]);
                if rst {
                    batch.remove_flow_state(flow);
                }
            } else {
                batch.set_verdict(i, Verdict::Drop);
            }
        }
        Ok(())
    }
}

sluice_sdk::export_nf!(Firewall);
