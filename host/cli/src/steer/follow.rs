//! Following the group's ownership table over NATS: what feeds a
//! dispatcher's [`RouteFeed`] while its workers steer.

use super::feed::RouteFeed;
use sluice_control::Bus;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Reads `group`'s table from `bus` every `poll` (at least 10 ms) and
/// offers each new version to `feed`, which steers by a planned change
/// `handover` after first seeing it and by a lost host at once; applies
/// the changes that fall due every 10 ms. Returns when `stop` is set.
pub async fn follow_table(
    bus: &impl Bus,
    group: &str,
    feed: &RouteFeed,
    stop: Arc<AtomicBool>,
    poll: Duration,
    handover: Duration,
) {
    let poll = poll.max(Duration::from_millis(10));
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    let mut last_read: Option<Instant> = None;
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        let now = Instant::now();
        if feed.apply_due(now, handover) {
            tracing::info!(version = feed.version(), "steering by the new ownership table");
        }
        if last_read.is_some_and(|at| now.duration_since(at) < poll) {
            continue;
        }
        last_read = Some(now);
        match bus.ownership(group).await {
            Ok(Some(t)) => {
                let (version, hosts) = (t.version(), t.members().iter().map(|m| m.host.clone()).collect::<Vec<_>>());
                if feed.offer(t, Instant::now(), handover) {
                    tracing::info!(version, ?hosts, "steering by the new ownership table");
                }
            }
            Ok(None) => tracing::debug!(group, "no ownership table published yet"),
            Err(e) => tracing::warn!(group, "reading the ownership table: {e}"),
        }
    }
}
