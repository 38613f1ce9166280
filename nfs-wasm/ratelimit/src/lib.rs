//! A rate limiter / policer: a token bucket per flow, in packets and/or
//! bytes per second, refilled by packet timestamps so that pcap replays
//! give the same result every time. Packets beyond the bucket are dropped
//! (policing) and counted in events. See README.md.

use serde::Deserialize;
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
        let nf =
            RateLimiter { packets, bytes, report_every: raw.report_every, dropped: 0, next_report: raw.report_every };
        Ok((nf, NfInfo::with_flow_state(timeout)))
    }

    fn process(&mut self, batch: &mut Batch) -> Result<(), String> {
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

sluice_sdk::export_nf!(RateLimiter);
