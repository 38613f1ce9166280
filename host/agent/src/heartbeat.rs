//! The host's heartbeat: how each deployment of its group is doing here,
//! its capacity and load, the ownership table it follows; and what it
//! measures between heartbeats to say so.

use crate::config::AgentConfig;
use crate::shared::Shared;
use sluice_control::{Bus, DeploymentStatus, DesiredSet, Heartbeat, now_ms};
use std::time::{Duration, Instant};

/// What a host measures between heartbeats.
pub(crate) struct Pulse {
    boot: String,
    started_ms: u64,
    /// Packets processed (all deployments) at the last measurement.
    last: Option<(Instant, u64)>,
    load_pps: u64,
    table_version: Option<u64>,
}

impl Pulse {
    pub(crate) fn new(boot: &str, started_ms: u64) -> Self {
        Pulse { boot: boot.to_string(), started_ms, last: None, load_pps: 0, table_version: None }
    }

    /// The packet rate since the last measurement, and the version of the
    /// group's ownership table (a read that may not hold up the loop long).
    pub(crate) async fn measure(&mut self, bus: &dyn Bus, group: &str, shared: &Shared, set: &DesiredSet) {
        let packets: u64 = {
            let status = shared.status.lock();
            status.values().filter(|s| set.deployments.iter().any(|d| d.id == s.deployment)).map(|s| s.packets).sum()
        };
        let now = Instant::now();
        if let Some((at, before)) = self.last {
            let secs = now.duration_since(at).as_secs_f64();
            if secs > 0.0 {
                self.load_pps = (packets.saturating_sub(before) as f64 / secs) as u64;
            }
        }
        self.last = Some((now, packets));
        match tokio::time::timeout(Duration::from_millis(500), bus.ownership(group)).await {
            Ok(Ok(t)) => self.table_version = t.map(|t| t.version()),
            Ok(Err(e)) => tracing::debug!(group, "reading the ownership table: {e}"),
            Err(_) => tracing::debug!(group, "reading the ownership table timed out"),
        }
    }
}

/// Publishes the host's heartbeat: its statuses of the deployments of
/// `set`, its capacity and load.
pub(crate) async fn heartbeat(bus: &dyn Bus, cfg: &AgentConfig, pulse: &Pulse, shared: &Shared, set: &DesiredSet) {
    let deployments: Vec<DeploymentStatus> = {
        let status = shared.status.lock();
        status.values().filter(|s| set.deployments.iter().any(|d| d.id == s.deployment)).cloned().collect()
    };
    let hb = Heartbeat {
        host: cfg.host.clone(),
        group: cfg.group.clone(),
        boot: pulse.boot.clone(),
        started_ms: pulse.started_ms,
        sent_ms: now_ms(),
        interval_ms: u64::try_from(cfg.heartbeat.as_millis()).unwrap_or(u64::MAX),
        version: env!("CARGO_PKG_VERSION").to_string(),
        deployments,
        capacity_pps: cfg.capacity_pps,
        load_pps: pulse.load_pps,
        table_version: pulse.table_version,
        memory_slot_mb: cfg.runtime.max_memory_bytes >> 20,
    };
    match bus.heartbeat(&hb).await {
        Ok(()) => shared.vitals.heartbeat_ms.store(hb.sent_ms, std::sync::atomic::Ordering::Relaxed),
        Err(e) => tracing::warn!("heartbeat not sent: {e}"),
    }
}
