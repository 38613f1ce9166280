//! What hosts send, checked before the gateway believes it.
//!
//! The bus tells who published a message (the host its subject names,
//! which NATS permissions reserve to that host); the message tells what it
//! is about. Neither alone is trusted: a meter record is billed only when
//! its publisher is a registered host, the record names that host, its id
//! is that host's, and its tenant's deployment was placed on that host's
//! group. Heartbeats and events are checked the same way. What fails is
//! dropped, counted by kind and reason, logged, and listed in
//! `GET /v1/rejects`.

use crate::store::{Store, StoreError};
use parking_lot::Mutex;
use serde::Serialize;
use sluice_control::{EventBatch, FromHost, Heartbeat, MeterRecord, Meters};
use std::collections::{BTreeMap, VecDeque};
use utoipa::ToSchema;

/// Rejects kept for `GET /v1/rejects`.
const RECENT: usize = 100;

/// A message that was refused.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Reject {
    /// When, ms since the epoch.
    pub at_ms: u64,
    /// `meter`, `event` or `heartbeat`.
    pub kind: String,
    /// The publishing host (from the subject).
    pub host: String,
    /// Why.
    pub reason: String,
}

/// Counts of refused messages and the newest ones.
#[derive(Debug, Default)]
pub struct Rejects {
    inner: Mutex<(BTreeMap<String, u64>, VecDeque<Reject>)>,
}

/// What `GET /v1/rejects` shows.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RejectsOut {
    /// Refused messages by kind (`meter`, `event`, `heartbeat`).
    pub counts: BTreeMap<String, u64>,
    /// The newest refusals, newest last.
    pub recent: Vec<Reject>,
}

impl Rejects {
    /// Counts and logs a refusal.
    pub fn record(&self, kind: &str, host: &str, reason: String) {
        tracing::warn!(kind, host, "refused a message from the bus: {reason}");
        if sluice_telemetry::metrics::enabled() {
            let attrs = [
                opentelemetry::KeyValue::new("kind", kind.to_string()),
                opentelemetry::KeyValue::new("host", host.to_string()),
            ];
            sluice_telemetry::metrics::gateway().rejects.add(1, &attrs);
        }
        let mut g = self.inner.lock();
        *g.0.entry(kind.to_string()).or_default() += 1;
        if g.1.len() >= RECENT {
            g.1.pop_front();
        }
        g.1.push_back(Reject {
            at_ms: sluice_control::now_ms(),
            kind: kind.to_string(),
            host: host.to_string(),
            reason,
        });
    }

    /// Refusals of `kind` so far.
    pub fn count(&self, kind: &str) -> u64 {
        self.inner.lock().0.get(kind).copied().unwrap_or(0)
    }

    /// A snapshot.
    pub fn snapshot(&self) -> RejectsOut {
        let g = self.inner.lock();
        RejectsOut { counts: g.0.clone(), recent: g.1.iter().cloned().collect() }
    }
}

/// The registered group of `publisher`, or why it has none.
fn group_of(store: &Store, publisher: &str) -> Result<Result<String, String>, StoreError> {
    Ok(store.host_group(publisher)?.ok_or_else(|| format!("host '{publisher}' is not registered")))
}

/// A meter record is billed only if it passes both of these: what it
/// claims about its origin, and where its deployment was placed.
///
/// The record names its publisher, and its id is one of the publisher's.
pub fn check_meter_origin(publisher: &str, rec: &MeterRecord) -> Result<(), String> {
    if rec.host != publisher {
        return Err(format!("record {} names host '{}'", rec.id, rec.host));
    }
    if !rec.id.strip_prefix(publisher).is_some_and(|rest| rest.starts_with('-')) {
        return Err(format!("record id '{}' is not one of this host's", rec.id));
    }
    let m = &rec.meters;
    let causes = m.trap_causes.values().try_fold(0u64, |a, n| a.checked_add(*n));
    if m.trap_causes.len() > MAX_TRAP_CAUSES
        || m.trap_causes.keys().any(|k| k.is_empty() || k.len() > MAX_TRAP_CAUSE_LEN)
        || causes.is_none_or(|n| n != m.traps)
    {
        return Err(format!("record {}: its trap causes do not add up to its {} traps", rec.id, m.traps));
    }
    // State byte-ms is summed exactly whatever its size; every other
    // amount of one window is far below this, so sums over years of
    // records stay exact in SQLite's 64-bit integers.
    if let Some((name, v)) =
        Meters::COLUMNS.iter().zip(m.values()).find(|(name, v)| **name != "state_byte_ms" && *v > MAX_WINDOW_AMOUNT)
    {
        return Err(format!("record {}: {name} = {v} is more than a host counts in one window", rec.id));
    }
    let s = m;
    let handled = s.forwarded.checked_add(s.dropped).and_then(|n| n.checked_add(s.policy));
    if handled.is_none_or(|n| n > s.packets) || s.rewritten > s.forwarded {
        return Err(format!(
            "record {}: forwarded {}, dropped {} and policy {} exceed its {} packets (or rewritten {} its forwarded)",
            rec.id, s.forwarded, s.dropped, s.policy, s.packets, s.rewritten
        ));
    }
    Ok(())
}

/// What a meter record may claim of its window and its amounts: the
/// window no longer than `bounds.max_window_ms`, ending at most
/// `clock_skew_ms` after `now_ms` and starting at most `max_age_ms` before;
/// its packets and bytes no more than its host's ceiling (`pps`, `bps`)
/// over the window plus one second (batches straddle window ends), so no
/// credential of a host bills more than that host could have processed.
pub fn check_meter_bounds(
    rec: &MeterRecord,
    (pps, bps): (u64, u64),
    bounds: &crate::config::MeterBounds,
    now_ms: u64,
) -> Result<(), String> {
    let (start, end) = (rec.window_start_ms, rec.window_end_ms);
    let len = end.checked_sub(start).ok_or_else(|| format!("record {}: its window ends before it starts", rec.id))?;
    if len > bounds.max_window_ms {
        return Err(format!(
            "record {}: its window of {len} ms is longer than [meters] max-window-ms ({})",
            rec.id, bounds.max_window_ms
        ));
    }
    if end > now_ms.saturating_add(bounds.clock_skew_ms) {
        return Err(format!(
            "record {}: its window ends {} ms after the gateway's clock (more than [meters] clock-skew-ms)",
            rec.id,
            end - now_ms
        ));
    }
    if start.saturating_add(bounds.max_age_ms) < now_ms {
        return Err(format!("record {}: its window started more than [meters] max-age-ms ago", rec.id));
    }
    let span = len.saturating_add(1000);
    let max_packets = pps.saturating_mul(span).div_ceil(1000);
    let max_bytes = (bps / 8).saturating_mul(span).div_ceil(1000);
    if rec.meters.packets > max_packets || rec.meters.bytes > max_bytes {
        return Err(format!(
            "record {}: {} packets and {} bytes in a {len} ms window exceed what host '{}' can process \
             ({pps} packets/s, {bps} bit/s; register it with max_pps/max_bps if it really can)",
            rec.id, rec.meters.packets, rec.meters.bytes, rec.host
        ));
    }
    Ok(())
}

/// The largest amount (counter or gauge) one meter record may carry,
/// `state_byte_ms` aside: 2^50 (about 10^15: a window of the longest
/// allowed length, 10 minutes, at 100 Gbit/s holds 7.5 * 10^12 bytes, and
/// 1,000 cores' guest time 6 * 10^14 ns). Packets and bytes are held to
/// the host's own ceiling besides ([`check_meter_bounds`]).
pub const MAX_WINDOW_AMOUNT: u64 = 1 << 50;

/// Most trap causes a meter record may name (the host knows seven).
pub const MAX_TRAP_CAUSES: usize = 16;
/// Longest trap cause name.
pub const MAX_TRAP_CAUSE_LEN: usize = 64;

/// `publisher` is a registered host, and `tenant`'s `deployment` was placed
/// on its group.
pub fn check_placement(
    store: &Store,
    publisher: &str,
    tenant: &str,
    deployment: &str,
) -> Result<Result<(), String>, StoreError> {
    let group = match group_of(store, publisher)? {
        Ok(g) => g,
        Err(why) => return Ok(Err(why)),
    };
    if !store.was_placed(deployment, tenant, &group)? {
        return Ok(Err(format!(
            "deployment '{deployment}' of tenant '{tenant}' was never placed on group '{group}' of host '{publisher}'"
        )));
    }
    Ok(Ok(()))
}

/// A heartbeat with only what its publisher may say: its own, from its
/// registered group, about deployments placed there.
pub fn check_heartbeat(store: &Store, from: FromHost<Heartbeat>) -> Result<Result<Heartbeat, String>, StoreError> {
    let FromHost { host, message: mut hb } = from;
    if hb.host != host {
        return Ok(Err(format!("heartbeat names host '{}'", hb.host)));
    }
    let group = match group_of(store, &host)? {
        Ok(g) => g,
        Err(why) => return Ok(Err(why)),
    };
    if hb.group != group {
        return Ok(Err(format!("heartbeat claims group '{}'; the host is registered in '{group}'", hb.group)));
    }
    let placed: Vec<String> = store.group_deployments(&group)?.into_iter().map(|d| d.id).collect();
    hb.deployments.retain(|d| placed.contains(&d.deployment));
    Ok(Ok(hb))
}

/// The events of a batch its publisher may report; the rest are counted
/// as refused (returned with the reason of the first).
pub fn check_events(
    store: &Store,
    from: FromHost<EventBatch>,
) -> Result<(EventBatch, u64, Option<String>), StoreError> {
    let FromHost { host, message: mut batch } = from;
    if batch.host != host {
        let n = batch.events.len() as u64;
        batch.events.clear();
        let why = format!("event batch names host '{}'", batch.host);
        return Ok((batch, n, Some(why)));
    }
    let group = match group_of(store, &host)? {
        Ok(g) => g,
        Err(why) => {
            let n = batch.events.len() as u64;
            batch.events.clear();
            return Ok((batch, n, Some(why)));
        }
    };
    let mut ok: BTreeMap<(String, String), bool> = BTreeMap::new();
    let mut refused = 0;
    let mut first = None;
    let mut kept = Vec::with_capacity(batch.events.len());
    for e in std::mem::take(&mut batch.events) {
        let key = (e.deployment.clone(), e.tenant.clone());
        let placed = match ok.get(&key) {
            Some(p) => *p,
            None => {
                let p = store.was_placed(&e.deployment, &e.tenant, &group)?;
                ok.insert(key, p);
                p
            }
        };
        if placed {
            kept.push(e);
        } else {
            refused += 1;
            first.get_or_insert_with(|| {
                format!(
                    "event of deployment '{}' of tenant '{}', not placed on group '{group}'",
                    e.deployment, e.tenant
                )
            });
        }
    }
    batch.events = kept;
    Ok((batch, refused, first))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_control::Meters;

    fn rec(traps: u64, causes: &[(&str, u64)]) -> MeterRecord {
        MeterRecord {
            id: "h1-abc-0-0".into(),
            host: "h1".into(),
            tenant: "t".into(),
            deployment: "d".into(),
            nf: "fw".into(),
            module: "firewall".into(),
            version: "1".into(),
            digest: "x".into(),
            window_start_ms: 1,
            window_end_ms: 2,
            meters: Meters {
                traps,
                trap_causes: causes.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
                ..Default::default()
            },
        }
    }

    #[test]
    fn trap_causes_must_add_up_and_stay_small() {
        assert!(check_meter_origin("h1", &rec(0, &[])).is_ok());
        assert!(check_meter_origin("h1", &rec(3, &[("panic", 1), ("deadline exceeded", 2)])).is_ok());
        let e = check_meter_origin("h1", &rec(3, &[("panic", 1)])).unwrap_err();
        assert!(e.contains("do not add up"), "{e}");
        assert!(check_meter_origin("h1", &rec(u64::MAX, &[("a", u64::MAX), ("b", 1)])).is_err());
        let many: Vec<(String, u64)> = (0..17).map(|i| (format!("c{i}"), 1)).collect();
        let many: Vec<(&str, u64)> = many.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        assert!(check_meter_origin("h1", &rec(17, &many)).is_err());
        let long = "x".repeat(65);
        assert!(check_meter_origin("h1", &rec(1, &[(long.as_str(), 1)])).is_err());
    }

    #[test]
    fn outcomes_cannot_exceed_the_packets() {
        let with = |packets, forwarded, dropped, policy, rewritten| {
            let mut r = rec(0, &[]);
            r.meters = Meters { packets, forwarded, dropped, policy, rewritten, ..Default::default() };
            check_meter_origin("h1", &r)
        };
        assert!(with(10, 6, 3, 1, 6).is_ok());
        assert!(with(10, 0, 0, 0, 0).is_ok(), "records from older hosts carry no outcomes");
        let e = with(10, 6, 3, 2, 0).unwrap_err();
        assert!(e.contains("exceed its 10 packets"), "{e}");
        assert!(with(10, 5, 0, 0, 6).is_err(), "rewritten beyond forwarded");
        assert!(with(u64::MAX, u64::MAX, 1, 0, 0).is_err(), "an overflowing sum is refused, not wrapped");
    }

    #[test]
    fn no_amount_of_a_window_can_overflow_the_sums() {
        for (k, name) in Meters::COLUMNS.iter().enumerate() {
            let mut values = vec![0; Meters::COLUMNS.len()];
            if let Some(v) = values.get_mut(k) {
                *v = MAX_WINDOW_AMOUNT + 1;
            }
            let mut r = rec(0, &[]);
            r.meters = Meters::from_values(&values);
            let verdict = check_meter_origin("h1", &r);
            if *name == "state_byte_ms" {
                assert!(verdict.is_ok(), "state byte-ms is summed exactly: {verdict:?}");
            } else {
                let e = verdict.unwrap_err();
                assert!(e.contains(name), "{name}: {e}");
            }
        }
    }
}
