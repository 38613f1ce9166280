//! A DNS filter: queries for blocked domains (and their subdomains) are
//! dropped, or answered on the spot with NXDOMAIN so clients fail fast
//! instead of timing out. Stateless. See README.md.

pub mod dns;

use serde::Deserialize;
use sluice_sdk::wire::checksum;
use sluice_sdk::wire::ethernet::EthernetFrame;
use sluice_sdk::wire::ipv4::Ipv4Packet;
use sluice_sdk::wire::ipv6::Ipv6Packet;
use sluice_sdk::wire::udp::UdpPacket;
use sluice_sdk::{Batch, Event, Level, NetworkFunction, NfInfo, Packet, Verdict, emit};

/// What happens to a blocked query.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Answer it with NXDOMAIN (sent back the way it came).
    #[default]
    Nxdomain,
    /// Drop it.
    Drop,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawConfig {
    block: Vec<String>,
    #[serde(default)]
    action: Action,
    #[serde(default = "default_port")]
    port: u16,
    #[serde(default = "yes")]
    log: bool,
}

fn default_port() -> u16 {
    53
}

fn yes() -> bool {
    true
}

/// The DNS filter.
#[derive(Debug)]
pub struct DnsFilter {
    block: Vec<String>,
    action: Action,
    port: u16,
    log: bool,
}

impl DnsFilter {
    fn blocked(&self, name: &str) -> bool {
        self.block.iter().any(|s| dns::matches_suffix(name, s))
    }
}

/// The NXDOMAIN answer to a query packet: addresses and ports swapped,
/// lengths and checksums recomputed. `None` if the packet is not a plain
/// Ethernet/IP/UDP query it can answer.
fn answer(p: &Packet<'_>, q: &dns::Query) -> Option<Vec<u8>> {
    let mut f = p.bytes().to_vec();
    let l3 = usize::from(p.descriptor().l3_offset);
    let l4 = usize::from(p.descriptor().l4_offset);
    let dns_at = l4 + sluice_sdk::wire::udp::HEADER_LEN;
    let dns_len = dns::nxdomain_in_place(f.get_mut(dns_at..)?, q)?;
    f.truncate(dns_at + dns_len);
    let udp_len = u16::try_from(sluice_sdk::wire::udp::HEADER_LEN + dns_len).ok()?;
    {
        let mut eth = EthernetFrame::new_checked(f.as_mut_slice()).ok()?;
        let (src, dst) = (eth.src(), eth.dst());
        eth.set_src(dst);
        eth.set_dst(src);
    }
    let pseudo = if let Some(ip) = p.ipv4() {
        let (src, dst) = (ip.src(), ip.dst());
        let mut ip = Ipv4Packet::new_checked(f.get_mut(l3..)?).ok()?;
        let header = ip.header_len();
        ip.set_src(dst);
        ip.set_dst(src);
        ip.set_total_len(u16::try_from(header).ok()? + udp_len);
        ip.fill_checksum();
        checksum::pseudo_header_v4(dst, src, 17, udp_len)
    } else {
        let ip = p.ipv6()?;
        let (src, dst) = (ip.src(), ip.dst());
        let mut ip = Ipv6Packet::new_checked(f.get_mut(l3..)?).ok()?;
        ip.set_src(dst);
        ip.set_dst(src);
        ip.set_payload_len(u16::try_from(l4 - l3 - sluice_sdk::wire::ipv6::HEADER_LEN).ok()? + udp_len);
        checksum::pseudo_header_v6(dst, src, 17, u32::from(udp_len))
    };
    let mut udp = UdpPacket::new_checked(f.get_mut(l4..)?).ok()?;
    let (sp, dp) = (udp.src_port(), udp.dst_port());
    udp.set_src_port(dp);
    udp.set_dst_port(sp);
    udp.set_len(udp_len);
    udp.fill_checksum(pseudo);
    Some(f)
}

impl NetworkFunction for DnsFilter {
    fn init(config: &[u8]) -> Result<(Self, NfInfo), String> {
        let raw: RawConfig = serde_json::from_slice(config).map_err(|e| format!("dns-filter config: {e}"))?;
        let mut block = Vec::with_capacity(raw.block.len());
        for d in raw.block {
            let d = d.trim().trim_end_matches('.').to_ascii_lowercase();
            if d.is_empty() || d.len() > dns::MAX_NAME || !d.split('.').all(|l| !l.is_empty() && l.len() <= 63) {
                return Err(format!("dns-filter config: '{d}' is not a domain name"));
            }
            block.push(d);
        }
        if block.is_empty() {
            return Err("dns-filter config: block lists no domain".into());
        }
        Ok((DnsFilter { block, action: raw.action, port: raw.port, log: raw.log }, NfInfo::stateless()))
    }

    fn process(&mut self, batch: &mut Batch) -> Result<(), String> {
        let mut events = Vec::new();
        for i in 0..batch.len() {
            let Some(p) = batch.packet(i) else { continue };
            if p.udp().is_none_or(|u| u.dst_port() != self.port) {
                continue;
            }
            let Some(q) = dns::parse_query(p.payload()) else { continue };
            if !self.blocked(&q.name) {
                continue;
            }
            // The answer goes back out of the port the query came in on
            // (verdict port k is the k-th port; 0 would be the default
            // output, which on a host with paired ports is the other one).
            let back_out = p.ingress_port().checked_add(1).map_or(Verdict::Forward(0), Verdict::Forward);
            let response = match self.action {
                Action::Nxdomain => answer(&p, &q),
                Action::Drop => None,
            };
            if self.log {
                events.push(Event {
                    kind: "dns.blocked".into(),
                    level: Level::Info,
                    packet: Some(i as u32),
                    fields: vec![
                        ("name".into(), q.name.clone()),
                        ("action".into(), if response.is_some() { "nxdomain" } else { "dropped" }.into()),
                    ],
                });
            }
            match response {
                Some(r) => {
                    batch.rewrite(i, r);
                    batch.set_verdict(i, back_out);
                }
                None => batch.set_verdict(i, Verdict::Drop),
            }
        }
        if !events.is_empty() {
            emit(&events);
        }
        Ok(())
    }
}

sluice_sdk::export_nf!(DnsFilter);
