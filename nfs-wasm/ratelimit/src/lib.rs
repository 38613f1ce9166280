//! A rate limiter / policer: a token bucket per flow, in packets and/or
//! bytes per second, refilled by packet timestamps so that pcap replays
//! give the same result every time. Packets beyond the bucket are dropped
//! (policing) and counted in events. See README.md.

use serde::Deserialize;
use sluice_sdk::state::{Counters, Merge, StateError, TableSpec};
use sluice_sdk::{Batch, Event, Level, NetworkFunction, NfInfo, Verdict, emit};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawConfig {
    #[serde(default)]
    packets_per_second: Option<f64>,
    #[serde(default)]
    packet_burst: Option<f64>,
    #[serde(default)]
    bytes_per_second: Option<f64>,
    #[serde(default)]
    byte_burst: Option<f64>,
    #[serde(default)]
    report_every: u64,
    #[serde(default)]
    idle_timeout_s: Option<u64>,
    /// `flow` (default) or `source`.
    #[serde(default)]
    per: Option<String>,
    /// Per-source mode: how often workers' views are merged, ms.
    #[serde(default)]
    merge_interval_ms: Option<u64>,
}

/// Per-source policing state: GCRA "theoretical arrival times" (ns) per
/// source in eventual tables merged with `max`, so workers that police the
/// same source combine by taking the latest.
#[derive(Debug, Clone, Copy)]
struct PerSource {
    packets_tat: Counters,
    bytes_tat: Counters,
}

/// GCRA: the packet conforms if, after adding its cost, the arrival time
/// it books is no further ahead of now than the burst allows. Returns the
/// new arrival time if it conforms.
fn gcra(tat: u64, now: u64, cost: f64, b: Bucket) -> Option<u64> {
    // Integer nanoseconds: timestamps near 2^60 lose precision as f64.
    let interval = 1e9 / b.rate;
    let cost_ns = (cost * interval).round() as u64;
    let tolerance_ns = (b.burst * interval).round() as u64;
    let booked = tat.max(now).saturating_add(cost_ns);
    (booked.saturating_sub(now) <= tolerance_ns).then_some(booked)
}

/// One token bucket's parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bucket {
    /// Tokens per second.
    pub rate: f64,
    /// Capacity (the burst).
    pub burst: f64,
}

/// A flow's buckets, stored in host-owned flow state: last refill time,
/// packet tokens, byte tokens (3 × 8 bytes, little-endian).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Tokens {
    at_ns: u64,
    packets: f64,
    bytes: f64,
}

impl Tokens {
    fn decode(b: &[u8]) -> Option<Tokens> {
        let b: &[u8; 24] = b.try_into().ok()?;
        let word = |i: usize| b.get(i * 8..i * 8 + 8).and_then(|w| <[u8; 8]>::try_from(w).ok());
        Some(Tokens {
            at_ns: u64::from_le_bytes(word(0)?),
            packets: f64::from_le_bytes(word(1)?),
            bytes: f64::from_le_bytes(word(2)?),
        })
    }

    fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(24);
        v.extend_from_slice(&self.at_ns.to_le_bytes());
        v.extend_from_slice(&self.packets.to_le_bytes());
        v.extend_from_slice(&self.bytes.to_le_bytes());
        v
    }
}

/// The rate limiter.
#[derive(Debug)]
pub struct RateLimiter {
    packets: Option<Bucket>,
    bytes: Option<Bucket>,
    report_every: u64,
    dropped: u64,
    next_report: u64,
    per_source: Option<PerSource>,
}

fn bucket(rate: Option<f64>, burst: Option<f64>, what: &str) -> Result<Option<Bucket>, String> {
    match (rate, burst) {
        (None, None) => Ok(None),
        (None, Some(_)) => Err(format!("ratelimit config: {what} burst without a rate")),
        (Some(r), b) => {
            if !(r.is_finite() && r > 0.0) {
                return Err(format!("ratelimit config: {what} rate must be positive, got {r}"));
            }
            let burst = b.unwrap_or(r);
            if !(burst.is_finite() && burst >= 1.0) {
                return Err(format!("ratelimit config: {what} burst must be at least 1, got {burst}"));
            }
            Ok(Some(Bucket { rate: r, burst }))
        }
    }
}

impl NetworkFunction for RateLimiter {
    fn init(config: &[u8]) -> Result<(Self, NfInfo), String> {
        let raw: RawConfig = serde_json::from_slice(config).map_err(|e| format!("ratelimit config: {e}"))?;
        let packets = bucket(raw.packets_per_second, raw.packet_burst, "packet")?;
        let bytes = bucket(raw.bytes_per_second, raw.byte_burst, "byte")?;
        if packets.is_none() && bytes.is_none() {
            return Err("ratelimit config: set packets-per-second and/or bytes-per-second".into());
        }
        let timeout = raw.idle_timeout_s.map(|s| s.saturating_mul(1_000_000_000)).unwrap_or(0);
        let per_source = match raw.per.as_deref() {
            None | Some("flow") => None,
            Some("source") => {
                let merge_ns = raw.merge_interval_ms.unwrap_or(10).saturating_mul(1_000_000);
                let table = |name: &str| {
                    let mut spec = TableSpec::eventual_counter(name, Merge::Max, merge_ns);
                    if timeout > 0 {
                        spec = spec.idle_timeout_ns(timeout);
                    }
                    Counters::declare(spec).map_err(|e| format!("ratelimit: cannot declare table '{name}': {e}"))
                };
                Some(PerSource { packets_tat: table("source-packets-tat")?, bytes_tat: table("source-bytes-tat")? })
            }
            Some(other) => return Err(format!("ratelimit config: per = '{other}': use \"flow\" or \"source\"")),
        };
        let info = if per_source.is_some() { NfInfo::stateless() } else { NfInfo::with_flow_state(timeout) };
        let nf = RateLimiter {
            packets,
            bytes,
            report_every: raw.report_every,
            dropped: 0,
            next_report: raw.report_every,
            per_source,
        };
        Ok((nf, info))
    }

    fn process(&mut self, batch: &mut Batch) -> Result<(), String> {
        if let Some(ps) = self.per_source {
            self.police_sources(batch, ps)?;
        } else {
            self.police_flows(batch);
        }
        if self.report_every > 0 && self.dropped >= self.next_report {
            self.next_report = self.dropped + self.report_every;
            emit(&[Event {
                kind: "ratelimit.dropped".into(),
                level: Level::Info,
                packet: None,
                fields: vec![("dropped".into(), self.dropped.to_string())],
            }]);
        }
        Ok(())
    }
}

impl RateLimiter {
    /// Per source: one read and one write per table for the whole batch.
    fn police_sources(&mut self, batch: &mut Batch, ps: PerSource) -> Result<(), String> {
        let sources: Vec<Option<u64>> =
            (0..batch.len()).map(|i| batch.packet(i).and_then(|p| p.key()).map(|k| k.src.key64())).collect();
        let mut keys: Vec<u64> = sources.iter().flatten().copied().collect();
        keys.sort_unstable();
        keys.dedup();
        if keys.is_empty() {
            return Ok(());
        }
        let err = |e: sluice_sdk::state::StateError| format!("ratelimit: source state: {e}");
        let mut ptat = ps.packets_tat.get(&keys).map_err(err)?;
        let mut btat = ps.bytes_tat.get(&keys).map_err(err)?;
        for (i, src) in sources.iter().enumerate() {
            let (Some(src), Some(p)) = (src, batch.packet(i)) else { continue };
            let Ok(k) = keys.binary_search(src) else { continue };
            let now = p.timestamp_ns();
            let (Some(pt), Some(bt)) = (ptat.get(k).copied(), btat.get(k).copied()) else { continue };
            let np = self.packets.map(|b| gcra(pt, now, 1.0, b));
            let nb = self.bytes.map(|b| gcra(bt, now, f64::from(p.wire_len()), b));
            if matches!(np, Some(None)) || matches!(nb, Some(None)) {
                batch.set_verdict(i, Verdict::Drop);
                self.dropped += 1;
                continue;
            }
            if let (Some(Some(t)), Some(slot)) = (np, ptat.get_mut(k)) {
                *slot = t;
            }
            if let (Some(Some(t)), Some(slot)) = (nb, btat.get_mut(k)) {
                *slot = t;
            }
        }
        let as_delta = |v: &[u64]| v.iter().map(|t| i64::try_from(*t).unwrap_or(i64::MAX)).collect::<Vec<_>>();
        // A full table leaves new sources unpoliced for now; the host counts it.
        for (table, tats) in [(ps.packets_tat, &ptat), (ps.bytes_tat, &btat)] {
            match table.add(&keys, &as_delta(tats)) {
                Ok(()) | Err(StateError::Full(_) | StateError::OverBudget(_)) => {}
                Err(e) => return Err(format!("ratelimit: source state: {e}")),
            }
        }
        Ok(())
    }

    /// Per flow: token buckets in the flow state handed in with the batch.
    fn police_flows(&mut self, batch: &mut Batch) {
        for i in 0..batch.len() {
            let Some(p) = batch.packet(i) else { continue };
            let Some(flow) = p.flow() else { continue };
            let now = p.timestamp_ns();
            let size = f64::from(p.wire_len());
            let full = Tokens {
                at_ns: now,
                packets: self.packets.map(|b| b.burst).unwrap_or(0.0),
                bytes: self.bytes.map(|b| b.burst).unwrap_or(0.0),
            };
            let mut t = batch.flow_state(flow).and_then(Tokens::decode).unwrap_or(full);
            // Refill for the time since the last packet (never backwards:
            // captures can be slightly out of order).
            let dt = now.saturating_sub(t.at_ns) as f64 / 1e9;
            t.at_ns = t.at_ns.max(now);
            if let Some(b) = self.packets {
                t.packets = (t.packets + dt * b.rate).min(b.burst);
            }
            if let Some(b) = self.bytes {
                t.bytes = (t.bytes + dt * b.rate).min(b.burst);
            }
            let fits = self.packets.is_none_or(|_| t.packets >= 1.0) && self.bytes.is_none_or(|_| t.bytes >= size);
            if fits {
                if self.packets.is_some() {
                    t.packets -= 1.0;
                }
                if self.bytes.is_some() {
                    t.bytes -= size;
                }
            } else {
                batch.set_verdict(i, Verdict::Drop);
                self.dropped += 1;
            }
            batch.set_flow_state(flow, t.encode());
        }
    }
}

sluice_sdk::export_nf!(RateLimiter);
