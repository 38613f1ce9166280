//! Meter records on their way to the bus.
//!
//! Every record is written to `<state-dir>/outbox/` ([`store`], by the
//! deployment that closed the window) before it is published, and removed
//! once the bus has stored it, so records survive a NATS outage and a host
//! restart; a record published twice (the host died between publishing
//! and removing it) is dropped by its id downstream.

use sluice_control::{Bus, MeterRecord};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// Publishes records from `rx` until it closes, then returns how many are
/// still unpublished (they stay in the outbox for the next start).
pub async fn run(
    bus: Arc<dyn Bus>,
    dir: PathBuf,
    mut rx: mpsc::UnboundedReceiver<MeterRecord>,
    drain: Duration,
) -> usize {
    if let Err(e) = std::fs::create_dir_all(&dir) {
        tracing::error!(dir = %dir.display(), "cannot create the meter outbox ({e}); records are published without it");
    }
    for (path, rec) in leftovers(&dir) {
        tracing::info!(id = %rec.id, "republishing a meter record left from a previous run");
        if publish(bus.as_ref(), &rec, None).await {
            let _ = std::fs::remove_file(path);
        }
    }
    while let Some(rec) = rx.recv().await {
        let path = dir.join(format!("{}.json", rec.id));
        if publish(bus.as_ref(), &rec, None).await {
            let _ = std::fs::remove_file(&path);
        }
    }
    // Shutting down: give records that failed a last bounded chance.
    let mut left = 0;
    let deadline = tokio::time::Instant::now() + drain;
    for (path, rec) in leftovers(&dir) {
        if publish(bus.as_ref(), &rec, Some(deadline)).await {
            let _ = std::fs::remove_file(path);
        } else {
            left += 1;
        }
    }
    left
}

/// Publishes with retries (backing off up to 5 s) until it works or the
/// deadline passes.
async fn publish(bus: &dyn Bus, rec: &MeterRecord, deadline: Option<tokio::time::Instant>) -> bool {
    let mut wait = Duration::from_millis(100);
    loop {
        match bus.publish_meter(rec).await {
            Ok(()) => return true,
            Err(e) => tracing::warn!(id = %rec.id, "meter record not published yet: {e}; retrying in {wait:?}"),
        }
        if deadline.is_some_and(|d| tokio::time::Instant::now() + wait > d) {
            return false;
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(Duration::from_secs(5));
    }
}

fn leftovers(dir: &Path) -> Vec<(PathBuf, MeterRecord)> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut out = Vec::new();
    for e in entries.flatten() {
        let path = e.path();
        if path.extension().is_none_or(|x| x != "json") {
            continue;
        }
        match std::fs::read(&path)
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice::<MeterRecord>(&b).map_err(|e| e.to_string()))
        {
            Ok(rec) => out.push((path, rec)),
            Err(e) => tracing::warn!(file = %path.display(), "skipping an unreadable outbox entry: {e}"),
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// Writes a record to the outbox (it is then sent to [`run`]).
pub fn store(dir: &Path, rec: &MeterRecord) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(rec).map_err(std::io::Error::other)?;
    write_atomic(&dir.join(format!("{}.json", rec.id)), &bytes)
}

fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

/// Records waiting in the outbox (stored, not yet acknowledged by the bus).
pub fn pending(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .map(|entries| entries.flatten().filter(|e| e.path().extension().is_some_and(|x| x == "json")).count())
        .unwrap_or(0)
}
