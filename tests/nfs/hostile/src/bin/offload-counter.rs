//! A test NF for flow offload (`sluice:nf@0.5.0`), built with the SDK. It
//! forwards every packet with DSCP 46 and its TTL lowered by one, and counts
//! each flow's packets in the eventual counter table `packets` (key: the
//! flow hash). With `offload = 1` in its config it offloads each flow and
//! direction at its first packet without FIN or RST, with the same two
//! changes, and adds what its ended entries return to the same counters:
//! its output and its table must then be those of `offload = 0`.
//! `idle-ms` sets the entries' idle timeout, `max-packets` their limit.
//! With `state-ms` it keeps flow state idling out after that long, and
//! counts in the table `opened` (key: the flow hash) how often a packet
//! found its flow without state. Flows to or from port 9 are never
//! offloaded (packets that reach the NF beside offloaded flows).

#![allow(missing_docs)]
// Only a component exports it: natively nothing constructs the NF.
#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]

use sluice_sdk::offload::Offload;
use sluice_sdk::state::{Counters, Merge, TableSpec};
use sluice_sdk::wire::rewrite::{decrement_ttl, set_dscp};
use sluice_sdk::{Batch, NetworkFunction, NfInfo, config_int};

struct OffloadCounter {
    packets: Counters,
    opened: Option<Counters>,
    offload: bool,
    idle_ns: u64,
    max_packets: u64,
}

impl NetworkFunction for OffloadCounter {
    fn init(config: &[u8]) -> Result<(Self, NfInfo), String> {
        let config = std::str::from_utf8(config).map_err(|e| format!("config: {e}"))?;
        let packets = Counters::declare(TableSpec::eventual_counter("packets", Merge::Sum, 0))
            .map_err(|e| format!("declare: {e}"))?;
        let state_ns = u64::try_from(config_int(config, "state-ms", 0)?).unwrap_or(0) * 1_000_000;
        let opened = if state_ns > 0 {
            Some(
                Counters::declare(TableSpec::eventual_counter("opened", Merge::Sum, 0))
                    .map_err(|e| format!("declare: {e}"))?,
            )
        } else {
            None
        };
        let nf = OffloadCounter {
            packets,
            opened,
            offload: config_int(config, "offload", 0)? != 0,
            idle_ns: u64::try_from(config_int(config, "idle-ms", 0)?).unwrap_or(0) * 1_000_000,
            max_packets: u64::try_from(config_int(config, "max-packets", 0)?).unwrap_or(0),
        };
        let info = if state_ns > 0 { NfInfo::with_flow_state(state_ns) } else { NfInfo::stateless() };
        Ok((nf, info))
    }

    fn process(&mut self, batch: &mut Batch) -> Result<(), String> {
        let mut keys: Vec<u64> = Vec::new();
        let mut deltas: Vec<i64> = Vec::new();
        for r in batch.offload_returns() {
            keys.push(r.flow_hash);
            deltas.push(i64::try_from(r.packets).unwrap_or(i64::MAX));
        }
        let mut asked: Vec<(u64, bool)> = Vec::new();
        let mut opened: Vec<u64> = Vec::new();
        for i in 0..batch.len() {
            let Some(p) = batch.packet(i) else { continue };
            if p.key().is_none() {
                continue;
            }
            let (hash, reverse) = (p.flow_hash(), p.is_reverse());
            let closing = p.tcp().is_some_and(|t| t.fin() || t.rst());
            let discard = p.key().is_some_and(|k| k.src_port == 9 || k.dst_port == 9);
            let flow = p.flow();
            keys.push(hash);
            deltas.push(1);
            let layers = sluice_sdk::wire::parse(p.bytes());
            let fragment = p.is_fragment();
            batch.edit(i, |d| {
                let _ = decrement_ttl(d, &layers);
                let _ = set_dscp(d, &layers, 46);
            });
            if self.opened.is_some()
                && let Some(flow) = flow
                && batch.flow_state(flow).is_none()
            {
                opened.push(hash);
                batch.set_flow_state(flow, vec![1]);
            }
            if self.offload && !closing && !fragment && !discard && !asked.contains(&(hash, reverse)) {
                asked.push((hash, reverse));
                batch.offload(
                    Offload::packet(i)
                        .decrement_ttl()
                        .dscp(46)
                        .idle_timeout_ns(self.idle_ns)
                        .max_packets(self.max_packets),
                );
            }
        }
        if !keys.is_empty() {
            self.packets.add(&keys, &deltas).map_err(|e| format!("count: {e}"))?;
        }
        if let Some(t) = &self.opened
            && !opened.is_empty()
        {
            t.add(&opened, &vec![1; opened.len()]).map_err(|e| format!("count: {e}"))?;
        }
        Ok(())
    }
}

sluice_sdk::export_nf!(OffloadCounter);

fn main() {}
