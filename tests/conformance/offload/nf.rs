//! A stateful firewall that offloads established flows: connections from
//! inside (`inside=<IPv4 CIDR>`) may go out and their replies come back;
//! anything else is dropped; a TCP RST forgets the flow's one byte of
//! state. With `dscp=<0..63>` every forwarded packet gets that DSCP (the
//! IPv4 header checksum updated incrementally). Forwarded packets and their
//! bytes on the wire are counted in the eventual counter table `forwarded`
//! (key 0: packets, key 1: bytes), one `counter-add` per batch.
//!
//! With `offload=true`, a forwarded TCP or UDP packet of a flow that had
//! state before it, carrying none of SYN, FIN, RST, has its flow offloaded
//! in its direction (the same DSCP change, counts returned), and the
//! packets and bytes of every ended entry are added to `forwarded`: the
//! output and the table are the same with offload and without. With
//! `offload-after=<n>` a direction is offloaded at its nth such packet
//! (default 1: at its first), counted with `offload::Admission`.
//! A FIN marks the flow closing (state byte 2): nothing of it is
//! offloaded after that; a SYN on it opens it again.

use sluice_sdk::matchers::Cidr;
use sluice_sdk::offload::{Admission, Offload};
use sluice_sdk::state::{Counters, Merge, TableSpec};
use sluice_sdk::wire::abi::NO_FLOW;
use sluice_sdk::wire::checksum::update_u16;
use sluice_sdk::{Batch, IpAddr128, NetworkFunction, NfInfo, Verdict, config_bool, config_int, config_value};

/// A flow's state: allowed, and allowed with a FIN seen (no offload from
/// then on: what is left of the connection is a few packets).
const OPEN: u8 = 1;
const CLOSING: u8 = 2;

struct Firewall {
    inside: Cidr,
    dscp: Option<u8>,
    offload: bool,
    gate: Admission,
    forwarded: Counters,
}

impl NetworkFunction for Firewall {
    fn init(config: &[u8]) -> Result<(Self, NfInfo), String> {
        let text = std::str::from_utf8(config).map_err(|_| "config is not UTF-8".to_string())?;
        let inside = config_value(text, "inside").ok_or("config: missing inside=<IPv4 CIDR>")?;
        let inside = Cidr::parse(inside).map_err(|e| format!("config: inside: {e}"))?;
        let dscp = match config_int(text, "dscp", -1)? {
            -1 => None,
            d @ 0..=63 => Some(d as u8),
            d => return Err(format!("config: dscp = {d}: not 0 to 63")),
        };
        let offload = config_bool(text, "offload", false)?;
        let gate = match config_int(text, "offload-after", 1)? {
            n @ 0..=1_000_000 => Admission::new(n as u32),
            n => return Err(format!("config: offload-after = {n}: not 0 to 1000000")),
        };
        let forwarded = Counters::declare(TableSpec::eventual_counter("forwarded", Merge::Sum, 0))
            .map_err(|e| format!("declaring forwarded: {e:?}"))?;
        Ok((Firewall { inside, dscp, offload, gate, forwarded }, NfInfo::with_flow_state(0)))
    }

    fn process(&mut self, batch: &mut Batch) -> Result<(), String> {
        let (mut packets, mut bytes) = (0i64, 0i64);
        for r in batch.offload_returns() {
            packets += r.packets as i64;
            bytes += r.bytes as i64;
        }
        for i in 0..batch.len() {
            let Some(p) = batch.packet(i) else { continue };
            let flow = u32::from(p.descriptor().flow);
            let from_inside = p.ipv4().is_some_and(|ip| self.inside.contains(IpAddr128::from_v4(ip.src())));
            let flags = p.tcp().map(|t| (t.syn(), t.fin(), t.rst()));
            let rst = flags.is_some_and(|f| f.2);
            let state = if flow != u32::from(NO_FLOW) { batch.flow_state(flow).map(|s| s.first().copied()) } else { None };
            let (wire_len, known, closing) = (p.wire_len(), state.is_some(), state == Some(Some(CLOSING)));
            let udp = p.udp().is_some();
            let (hash, reverse) = (p.flow_hash(), p.is_reverse());
            if flow == u32::from(NO_FLOW) {
                batch.set_verdict(i, Verdict::Drop);
                continue;
            } else if known {
                if rst {
                    batch.remove_flow_state(flow);
                }
                if flags.is_some_and(|(syn, _, _)| syn) {
                    // A new connection on the flow's 5-tuple.
                    if closing {
                        batch.set_flow_state(flow, vec![OPEN]);
                    }
                    self.gate.forget(hash);
                } else if flags.is_some_and(|(_, fin, _)| fin) && !closing {
                    batch.set_flow_state(flow, vec![CLOSING]);
                }
            } else if from_inside {
                batch.set_flow_state(flow, vec![OPEN]);
                self.gate.forget(hash);
                if rst {
                    batch.remove_flow_state(flow);
                }
            } else {
                batch.set_verdict(i, Verdict::Drop);
                continue;
            }
            packets += 1;
            bytes += i64::from(wire_len);
            if let Some(dscp) = self.dscp {
                set_dscp(batch, i, dscp);
            }
            let eligible = udp || flags.is_some_and(|(syn, fin, rst)| !syn && !fin && !rst);
            if self.offload && known && !closing && eligible && self.gate.admit(hash, reverse) {
                let request = Offload::packet(i);
                batch.offload(match self.dscp {
                    Some(d) => request.dscp(d),
                    None => request,
                });
            }
        }
        if packets > 0 {
            self.forwarded.add(&[0, 1], &[packets, bytes]).map_err(|e| format!("counting: {e:?}"))?;
        }
        Ok(())
    }
}

/// Sets the DSCP of IPv4 packet `i`, updating the header checksum (RFC 1624).
fn set_dscp(batch: &mut Batch, i: usize, dscp: u8) {
    let Some(p) = batch.packet(i) else { return };
    if p.ipv4().is_none() {
        return;
    }
    let l3 = usize::from(p.descriptor().l3_offset);
    let mut d = p.bytes().to_vec();
    let (Some(&b0), Some(&tos)) = (d.get(l3), d.get(l3 + 1)) else { return };
    let new_tos = (dscp << 2) | (tos & 3);
    let (Some(&c0), Some(&c1)) = (d.get(l3 + 10), d.get(l3 + 11)) else { return };
    let sum = update_u16(u16::from_be_bytes([c0, c1]), u16::from_be_bytes([b0, tos]), u16::from_be_bytes([b0, new_tos]));
    if let Some(b) = d.get_mut(l3 + 1) {
        *b = new_tos;
    }
    if let Some(c) = d.get_mut(l3 + 10..l3 + 12) {
        c.copy_from_slice(&sum.to_be_bytes());
    }
    batch.rewrite(i, d);
}

sluice_sdk::export_nf!(Firewall);
