//! An IPv4 prefix translator: every address in `from=<CIDR>` becomes the
//! same host in `to=<CIDR>` (source and destination), with the IPv4 and
//! TCP/UDP checksums updated incrementally (RFC 1624). A UDP checksum of 0
//! (none) stays 0. Other packets pass unchanged.

use sluice_sdk::wire::abi::{NO_L3, NO_L4};
use sluice_sdk::wire::checksum::update_u16;
use sluice_sdk::{Batch, NetworkFunction, NfInfo, config_value};

struct Rewriter {
    from: (u32, u32),
    to: (u32, u32),
}

/// `a.b.c.d/n` as (network, mask).
fn cidr(text: &str) -> Result<(u32, u32), String> {
    let (addr, len) = text.split_once('/').unwrap_or((text, "32"));
    let addr: std::net::Ipv4Addr = addr.parse().map_err(|_| format!("bad IPv4 address in '{text}'"))?;
    let len: u32 = len.parse().ok().filter(|l| *l <= 32).ok_or_else(|| format!("bad prefix length in '{text}'"))?;
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
    Ok((u32::from(addr) & mask, mask))
}

fn be16(d: &[u8], at: usize) -> u16 {
    d.get(at..at + 2).map_or(0, |b| u16::from_be_bytes([b[0], b[1]]))
}

fn put16(d: &mut [u8], at: usize, v: u16) {
    if let Some(b) = d.get_mut(at..at + 2) {
        b.copy_from_slice(&v.to_be_bytes());
    }
}

impl Rewriter {
    /// Rewrites the address at `at` if it is in `from`; fixes the IPv4
    /// checksum at `ip_sum` and the L4 checksum at `l4_sum` (if any).
    fn translate(&self, d: &mut [u8], at: usize, ip_sum: usize, l4_sum: Option<usize>) -> bool {
        let Some(old) = d.get(at..at + 4).map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]])) else {
            return false;
        };
        if old & self.from.1 != self.from.0 {
            return false;
        }
        let new = self.to.0 | (old & !self.to.1);
        for (w, (o, n)) in [((old >> 16) as u16, (new >> 16) as u16), (old as u16, new as u16)].into_iter().enumerate() {
            put16(d, at + 2 * w, n);
            put16(d, ip_sum, update_u16(be16(d, ip_sum), o, n));
            if let Some(s) = l4_sum {
                put16(d, s, update_u16(be16(d, s), o, n));
            }
        }
        true
    }
}

impl NetworkFunction for Rewriter {
    fn init(config: &[u8]) -> Result<(Self, NfInfo), String> {
        let text = std::str::from_utf8(config).map_err(|_| "config is not UTF-8".to_string())?;
        let from = cidr(config_value(text, "from").ok_or("config: missing from=<IPv4 CIDR>")?)?;
        let to = cidr(config_value(text, "to").ok_or("config: missing to=<IPv4 CIDR>")?)?;
        if from.1 != to.1 {
            return Err("config: from and to must have the same prefix length".into());
        }
        Ok((Rewriter { from, to }, NfInfo::stateless()))
    }

    fn process(&mut self, batch: &mut Batch) -> Result<(), String> {
        for i in 0..batch.len() {
            let Some(p) = batch.packet(i) else { continue };
            let d = *p.descriptor();
            let Some(ip) = p.ipv4() else { continue };
            if d.l3_offset == NO_L3 {
                continue;
            }
            let l3 = usize::from(d.l3_offset);
            let l4 = (d.l4_offset != NO_L4).then_some(usize::from(d.l4_offset));
            let l4_sum = match (ip.protocol(), l4) {
                (6, Some(l4)) if l4 + 18 <= p.bytes().len() => Some(l4 + 16),
                (17, Some(l4)) if l4 + 8 <= p.bytes().len() && be16(p.bytes(), l4 + 6) != 0 => Some(l4 + 6),
                _ => None,
            };
            let mut data = p.bytes().to_vec();
            let src = self.translate(&mut data, l3 + 12, l3 + 10, l4_sum);
            let dst = self.translate(&mut data, l3 + 16, l3 + 10, l4_sum);
            if src || dst {
                if ip.protocol() == 17 && l4_sum.is_some_and(|s| be16(&data, s) == 0) {
                    put16(&mut data, l4_sum.unwrap_or_default(), 0xffff);
                }
                batch.rewrite(i, data);
            }
        }
        Ok(())
    }
}

sluice_sdk::export_nf!(Rewriter);
