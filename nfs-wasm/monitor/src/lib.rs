//! A traffic monitor: packets and bytes per flow, per sending host and in
//! total, kept in host-owned *eventual* counter tables so that every worker
//! counts locally and the host merges the replicas (sum), or on request in
//! *single-writer* tables (each key counted by its owner worker). Every
//! `report-interval-s` of packet time it emits a `monitor.report` event
//! with the top talkers it has seen; the host's run report holds the
//! merged tables. See README.md.

use serde::Deserialize;
use sluice_sdk::offload::Offload;
use sluice_sdk::state::{Counters, Merge, StateError, TableSpec};
use sluice_sdk::{Batch, Event, FlowKey, IpAddr128, Level, NetworkFunction, NfInfo, emit};
use std::collections::HashMap;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawConfig {
    #[serde(default = "default_interval")]
    report_interval_s: u64,
    #[serde(default = "default_top")]
    top: usize,
    #[serde(default = "default_merge")]
    merge_interval_ms: u64,
    #[serde(default = "default_capacity")]
    max_entries: u32,
    /// `eventual` (per-worker replicas merged) or `single-writer` (one
    /// owner per key; reports read exact values as of the last sync).
    #[serde(default = "default_consistency")]
    consistency: String,
    /// Hand every flow to the host (`sluice:nf@0.5.0` offload) and count
    /// what passed under its entries when they end.
    #[serde(default)]
    offload: bool,
}

fn default_consistency() -> String {
    "eventual".into()
}

fn default_interval() -> u64 {
    10
}
fn default_top() -> usize {
    10
}
fn default_merge() -> u64 {
    100
}
fn default_capacity() -> u32 {
    1 << 20
}

/// Key of `totals`: all packets.
pub const TOTAL_PACKETS: u64 = 0;
/// Key of `totals`: all bytes (on the wire).
pub const TOTAL_BYTES: u64 = 1;

/// A host's key in the per-host tables (see [`IpAddr128::key64`]).
pub fn host_key(a: IpAddr128) -> u64 {
    a.key64()
}

/// The monitor.
#[derive(Debug)]
pub struct Monitor {
    flow_packets: Counters,
    flow_bytes: Counters,
    host_packets: Counters,
    host_bytes: Counters,
    totals: Counters,
    interval_ns: u64,
    top: usize,
    next_report_ns: u64,
    /// Hosts seen since the last report, with their addresses (for names).
    seen: HashMap<u64, IpAddr128>,
    /// Whether flows are offloaded (see `offload` in README.md).
    offload: bool,
    // Reused per batch.
    keys: Vec<u64>,
    deltas: Vec<i64>,
}

impl Monitor {
    /// Adds the batch's (key, delta) pairs to a table, one call, with
    /// equal keys folded first.
    fn add(
        table: Counters,
        pairs: &mut Vec<(u64, i64)>,
        keys: &mut Vec<u64>,
        deltas: &mut Vec<i64>,
    ) -> Result<(), String> {
        pairs.sort_unstable_by_key(|p| p.0);
        keys.clear();
        deltas.clear();
        for (k, d) in pairs.drain(..) {
            match (keys.last(), deltas.last_mut()) {
                (Some(last), Some(sum)) if *last == k => *sum += d,
                _ => {
                    keys.push(k);
                    deltas.push(d);
                }
            }
        }
        if keys.is_empty() {
            return Ok(());
        }
        match table.add(keys, deltas) {
            // A full table or a used-up budget: keys past that point are not
            // counted (the host meters the refusal); the traffic still passes.
            Ok(()) | Err(StateError::Full(_) | StateError::OverBudget(_)) => Ok(()),
            Err(e) => Err(format!("monitor: counting: {e}")),
        }
    }

    fn report(&mut self, now_ns: u64) -> Result<(), String> {
        let hosts: Vec<u64> = self.seen.keys().copied().collect();
        if hosts.is_empty() {
            return Ok(());
        }
        let bytes = self.host_bytes.get(&hosts).map_err(|e| format!("monitor: reading: {e}"))?;
        let packets = self.host_packets.get(&hosts).map_err(|e| format!("monitor: reading: {e}"))?;
        let mut rows: Vec<(u64, u64, u64)> =
            hosts.iter().zip(bytes.iter().zip(&packets)).map(|(h, (b, p))| (*h, *b, *p)).collect();
        rows.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut fields = vec![("at-ns".to_string(), now_ns.to_string()), ("hosts".into(), hosts.len().to_string())];
        for (rank, (h, b, p)) in rows.iter().take(self.top).enumerate() {
            let name = self.seen.get(h).map(|a| a.to_string()).unwrap_or_else(|| format!("{h:#x}"));
            fields.push((format!("top{}", rank + 1), format!("{name} {b} bytes {p} packets")));
        }
        emit(&[Event { kind: "monitor.report".into(), level: Level::Info, packet: None, fields }]);
        self.seen.clear();
        Ok(())
    }
}

impl NetworkFunction for Monitor {
    fn init(config: &[u8]) -> Result<(Self, NfInfo), String> {
        let raw: RawConfig =
            if config.is_empty() { serde_json::from_slice(b"{}") } else { serde_json::from_slice(config) }
                .map_err(|e| format!("monitor config: {e}"))?;
        if raw.top == 0 || raw.top > 100 {
            return Err(format!("monitor config: top must be 1..=100, got {}", raw.top));
        }
        let merge_ns = raw.merge_interval_ms.saturating_mul(1_000_000);
        let single = match raw.consistency.as_str() {
            "eventual" => false,
            "single-writer" => true,
            other => {
                return Err(format!(
                    "monitor config: consistency must be \"eventual\" or \"single-writer\", got {other:?}"
                ));
            }
        };
        let table = |name: &str| {
            let spec = if single {
                TableSpec::single_writer_counter(name, merge_ns)
            } else {
                TableSpec::eventual_counter(name, Merge::Sum, merge_ns)
            };
            Counters::declare(spec.capacity(raw.max_entries))
                .map_err(|e| format!("monitor: cannot declare table '{name}': {e}"))
        };
        Ok((
            Monitor {
                flow_packets: table("flow-packets")?,
                flow_bytes: table("flow-bytes")?,
                host_packets: table("host-packets")?,
                host_bytes: table("host-bytes")?,
                totals: table("totals")?,
                interval_ns: raw.report_interval_s.saturating_mul(1_000_000_000),
                top: raw.top,
                next_report_ns: 0,
                seen: HashMap::new(),
                offload: raw.offload,
                keys: Vec::new(),
                deltas: Vec::new(),
            },
            NfInfo::stateless(),
        ))
    }

    fn process(&mut self, batch: &mut Batch) -> Result<(), String> {
        let mut flows_p = Vec::with_capacity(batch.len());
        let mut flows_b = Vec::with_capacity(batch.len());
        let mut hosts_p = Vec::with_capacity(batch.len());
        let mut hosts_b = Vec::with_capacity(batch.len());
        let (mut packets, mut bytes) = (0i64, 0i64);
        let mut last_ns = 0;
        // What passed under ended entries counts as if it had come now:
        // the packets of a flow in one direction, from one host.
        for r in batch.offload_returns() {
            let (n, b) = (i64::try_from(r.packets).unwrap_or(i64::MAX), i64::try_from(r.bytes).unwrap_or(i64::MAX));
            packets += n;
            bytes += b;
            flows_p.push((r.flow_hash, n));
            flows_b.push((r.flow_hash, b));
            if let Some(key) = FlowKey::from_bytes(&r.key) {
                let h = host_key(if r.reverse { key.dst } else { key.src });
                hosts_p.push((h, n));
                hosts_b.push((h, b));
            }
        }
        let mut offloads = Vec::new();
        for (i, p) in batch.packets().enumerate() {
            let len = i64::from(p.wire_len());
            packets += 1;
            bytes += len;
            last_ns = last_ns.max(p.timestamp_ns());
            let hash = p.flow_hash();
            if hash != 0 {
                flows_p.push((hash, 1));
                flows_b.push((hash, len));
            }
            if let Some(key) = p.key() {
                let h = host_key(key.src);
                hosts_p.push((h, 1));
                hosts_b.push((h, len));
                if self.interval_ns > 0 && self.seen.len() < 65_536 {
                    self.seen.entry(h).or_insert(key.src);
                }
                // Every packet of a flow asks (a chain offloads a packet
                // only where each of its NFs asked for that packet); the
                // counts come back at least once per report interval.
                if self.offload && !p.is_fragment() {
                    offloads.push(Offload::packet(i).max_age_ns(self.interval_ns));
                }
            }
        }
        for o in offloads {
            batch.offload(o);
        }
        let (k, d) = (&mut self.keys, &mut self.deltas);
        Self::add(self.flow_packets, &mut flows_p, k, d)?;
        Self::add(self.flow_bytes, &mut flows_b, k, d)?;
        Self::add(self.host_packets, &mut hosts_p, k, d)?;
        Self::add(self.host_bytes, &mut hosts_b, k, d)?;
        let mut totals = vec![(TOTAL_PACKETS, packets), (TOTAL_BYTES, bytes)];
        Self::add(self.totals, &mut totals, k, d)?;
        if self.interval_ns > 0 && last_ns >= self.next_report_ns {
            if self.next_report_ns != 0 {
                self.report(last_ns)?;
            }
            self.next_report_ns = last_ns.saturating_add(self.interval_ns);
        }
        Ok(())
    }
}

sluice_sdk::export_nf!(Monitor);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_keys_keep_ipv4_readable_and_mark_ipv6() {
        assert_eq!(host_key(IpAddr128::from_v4([10, 0, 0, 1])), 0x0a00_0001);
        let v6 = host_key(IpAddr128::from_v6([0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]));
        assert!(v6 >= 1 << 63);
    }
}
