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
    /// `flow` (default), `source` or `group-source`.
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

/// Group-wide per-source budgets: packets and bytes each source sent per
/// window, in eventual tables merged by sum over the workers and the hosts
/// of a group (keyed by source and window number).
#[derive(Debug, Clone, Copy)]
struct PerSourceGroup {
    packets: Counters,
    bytes: Counters,
}

/// The key of a source's count in window `window` (splitmix64 of both).
fn window_key(source: u64, window: u64) -> u64 {
    let mut z = source ^ window.rotate_left(32) ^ 0x9e37_79b9_7f4a_7c15;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Where one packet's counts are, per bucket (packets, bytes): this
/// window's key, the last window's key, and the last one's weight.
type Windows = [Option<(u64, u64, f64)>; 2];

/// A bucket as a sliding window: `burst` per window of `burst / rate`
/// seconds. The window (ns) and the two keys a packet at `now` reads (this
/// window's, the previous one's) with the weight of the previous one.
fn window_of(b: Bucket, source: u64, now: u64) -> (u64, u64, f64) {
    let w = ((b.burst / b.rate) * 1e9).max(1.0) as u64;
    let idx = now / w;
    let into = (now % w) as f64 / w as f64;
    (window_key(source, idx), window_key(source, idx.wrapping_sub(1)), 1.0 - into)
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
    per_group: Option<PerSourceGroup>,
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
            Some("group-source") => None,
            Some(other) => {
                return Err(format!("ratelimit config: per = '{other}': use \"flow\", \"source\" or \"group-source\""));
            }
        };
        let per_group = if raw.per.as_deref() == Some("group-source") {
            let merge_ns = raw.merge_interval_ms.unwrap_or(10).saturating_mul(1_000_000);
            // A count is read for its window and the next: it lives two
            // windows, then idles out.
            let longest = [packets, bytes].iter().flatten().map(|b| b.burst / b.rate).fold(0.0, f64::max);
            let expiry = ((longest * 2e9) as u64).max(1_000_000_000);
            let table = |name: &str| {
                let spec = TableSpec::eventual_counter(name, Merge::Sum, merge_ns).idle_timeout_ns(expiry);
                Counters::declare(spec).map_err(|e| format!("ratelimit: cannot declare table '{name}': {e}"))
            };
            Some(PerSourceGroup { packets: table("group-source-packets")?, bytes: table("group-source-bytes")? })
        } else {
            None
        };
        let stateless = per_source.is_some() || per_group.is_some();
        let info = if stateless { NfInfo::stateless() } else { NfInfo::with_flow_state(timeout) };
        let nf = RateLimiter {
            packets,
            bytes,
            report_every: raw.report_every,
            dropped: 0,
            next_report: raw.report_every,
            per_source,
            per_group,
        };
        Ok((nf, info))
    }

    fn process(&mut self, batch: &mut Batch) -> Result<(), String> {
        if let Some(ps) = self.per_source {
            self.police_sources(batch, ps)?;
        } else if let Some(pg) = self.per_group {
            self.police_group_sources(batch, pg)?;
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

    /// Per source over the group: each packet reads its source's count in
    /// this window and the last (one read a table for the batch), passes
    /// if the sliding estimate (this window's count plus the part of the
    /// last one's still inside the sliding window) leaves room for it, and
    /// what passed is added (one write a table).
    fn police_group_sources(&mut self, batch: &mut Batch, pg: PerSourceGroup) -> Result<(), String> {
        // Per packet and bucket: (this window's key, last window's key, weight).
        let mut plan: Vec<Option<Windows>> = Vec::with_capacity(batch.len());
        let mut keys: [Vec<u64>; 2] = [Vec::new(), Vec::new()];
        for i in 0..batch.len() {
            let Some(p) = batch.packet(i) else {
                plan.push(None);
                continue;
            };
            let Some(src) = p.key().map(|k| k.src.key64()) else {
                plan.push(None);
                continue;
            };
            let now = p.timestamp_ns();
            let w = [self.packets, self.bytes].map(|b| b.map(|b| window_of(b, src, now)));
            for (k, w) in keys.iter_mut().zip(&w) {
                if let Some((cur, last, _)) = w {
                    k.extend([*cur, *last]);
                }
            }
            plan.push(Some(w));
        }
        if plan.iter().all(Option::is_none) {
            return Ok(());
        }
        let err = |e: StateError| format!("ratelimit: source state: {e}");
        let tables = [pg.packets, pg.bytes];
        let mut counts: [std::collections::HashMap<u64, u64>; 2] = Default::default();
        for ((k, t), c) in keys.iter_mut().zip(tables).zip(counts.iter_mut()) {
            k.sort_unstable();
            k.dedup();
            if !k.is_empty() {
                let values = t.get(k).map_err(err)?;
                c.extend(k.iter().copied().zip(values));
            }
        }
        let mut added: [std::collections::HashMap<u64, i64>; 2] = Default::default();
        let buckets = [self.packets, self.bytes];
        for (i, w) in plan.iter().enumerate() {
            let (Some(w), Some(p)) = (w, batch.packet(i)) else { continue };
            let costs = [1.0, f64::from(p.wire_len())];
            let fits = (0..2).all(|j| {
                let (Some(Some((cur, last, weight))), Some(Some(b))) = (w.get(j), buckets.get(j)) else { return true };
                let Some(c) = counts.get(j) else { return true };
                let seen = |k: &u64| c.get(k).copied().unwrap_or(0) as f64;
                seen(cur) + seen(last) * weight + costs.get(j).copied().unwrap_or(0.0) <= b.burst
            });
            if !fits {
                batch.set_verdict(i, Verdict::Drop);
                self.dropped += 1;
                continue;
            }
            for j in 0..2 {
                let Some(Some((cur, _, _))) = w.get(j) else { continue };
                let cost = costs.get(j).copied().unwrap_or(0.0) as u64;
                if let Some(c) = counts.get_mut(j) {
                    *c.entry(*cur).or_default() += cost;
                }
                if let Some(a) = added.get_mut(j) {
                    *a.entry(*cur).or_default() += cost as i64;
                }
            }
        }
        // A full table leaves new sources unpoliced for now; the host counts it.
        for (t, a) in tables.iter().zip(added) {
            if a.is_empty() {
                continue;
            }
            let (k, d): (Vec<u64>, Vec<i64>) = a.into_iter().unzip();
            match t.add(&k, &d) {
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
