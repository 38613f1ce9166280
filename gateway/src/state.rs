//! The gateway's shared state and its side of the control plane: it keeps
//! each host group's desired deployments on the bus, follows heartbeats,
//! and stores meter records.

use crate::config::GatewayConfig;
use crate::store::{DeploymentRow, Store};
use futures::StreamExt;
use sluice_control::{Bus, DeploymentSpec, DesiredSet, Heartbeat, NfPlacement};
use sluice_runtime::Runtime;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

/// A host as last heard from.
#[derive(Debug, Clone)]
pub struct HostSeen {
    /// Its last heartbeat.
    pub heartbeat: Heartbeat,
    /// When it arrived.
    pub at: Instant,
}

impl HostSeen {
    /// Whether the host is considered up (fewer than three heartbeats missed).
    pub fn alive(&self) -> bool {
        let limit = Duration::from_millis(self.heartbeat.interval_ms.saturating_mul(3)).max(Duration::from_secs(3));
        self.at.elapsed() < limit
    }
}

/// Everything handlers share.
#[derive(Clone)]
pub struct AppState {
    /// Metadata.
    pub store: Arc<Store>,
    /// Settings.
    pub config: Arc<GatewayConfig>,
    /// Control plane.
    pub bus: Arc<dyn Bus>,
    /// The host's own loader, for checking uploads.
    pub runtime: Arc<Runtime>,
    /// Hosts by id.
    pub hosts: Arc<RwLock<HashMap<String, HostSeen>>>,
    /// SHA-256 of the admin token.
    pub admin_hash: String,
    /// Module blobs, by digest.
    pub blobs: PathBuf,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState").field("blobs", &self.blobs).finish_non_exhaustive()
    }
}

/// The resolved chain stored with a deployment.
pub fn stored_nfs(row: &DeploymentRow) -> Vec<NfPlacement> {
    match serde_json::from_str(&row.spec) {
        Ok(nfs) => nfs,
        Err(e) => {
            tracing::error!(deployment = %row.id, "stored deployment spec is unreadable: {e}");
            Vec::new()
        }
    }
}

impl AppState {
    /// Path of a blob.
    pub fn blob_path(&self, digest: &str) -> PathBuf {
        self.blobs.join(format!("{digest}.wasm"))
    }

    /// Snapshot of the hosts.
    pub fn hosts(&self) -> Vec<HostSeen> {
        let mut v: Vec<HostSeen> =
            self.hosts.read().unwrap_or_else(PoisonError::into_inner).values().cloned().collect();
        v.sort_by(|a, b| a.heartbeat.host.cmp(&b.heartbeat.host));
        v
    }

    /// Puts a group's deployments (and their modules) on the bus.
    pub async fn publish_group(&self, group: &str) -> Result<(), String> {
        let rows = self.store.group_deployments(group).map_err(|e| e.to_string())?;
        let mut set = DesiredSet { group: group.to_string(), deployments: Vec::new() };
        for row in rows {
            let nfs = stored_nfs(&row);
            for nf in &nfs {
                let bytes = tokio::fs::read(self.blob_path(&nf.module.digest))
                    .await
                    .map_err(|e| format!("module blob {} is missing: {e}", nf.module.digest))?;
                self.bus.put_module(&nf.module.digest, &bytes).await.map_err(|e| e.to_string())?;
            }
            set.deployments.push(DeploymentSpec {
                id: row.id.clone(),
                tenant: row.tenant_id.clone(),
                name: row.name.clone(),
                revision: u64::try_from(row.revision).unwrap_or(0),
                nfs,
            });
        }
        self.bus.set_desired(&set).await.map_err(|e| e.to_string())
    }

    /// Republishes every group (at start, and periodically, so a lost
    /// update or a wiped KV heals).
    pub async fn publish_all(&self) {
        let groups = match self.store.groups() {
            Ok(g) => g,
            Err(e) => {
                tracing::error!("listing groups: {e}");
                return;
            }
        };
        for g in groups {
            if let Err(e) = self.publish_group(&g).await {
                tracing::warn!(group = %g, "cannot publish desired deployments: {e}");
            }
        }
    }
}

/// Follows heartbeats forever.
pub async fn follow_heartbeats(state: AppState) {
    loop {
        match state.bus.heartbeats().await {
            Ok(mut s) => {
                while let Some(hb) = s.next().await {
                    let mut hosts = state.hosts.write().unwrap_or_else(PoisonError::into_inner);
                    if !hosts.contains_key(&hb.host) {
                        tracing::info!(host = %hb.host, group = %hb.group, "host joined");
                    }
                    hosts.insert(hb.host.clone(), HostSeen { heartbeat: hb, at: Instant::now() });
                }
            }
            Err(e) => tracing::warn!("heartbeat feed: {e}"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Meter records stored per transaction at most: whatever has arrived
/// when the consumer looks, so a burst costs one commit per batch while a
/// trickle is still stored (and acked) record by record.
const METER_BATCH: usize = 512;

/// Stores meter records as they come, acking each only after the
/// transaction holding it has committed.
pub async fn consume_meters(state: AppState) {
    loop {
        match state.bus.meters().await {
            Ok(feed) => {
                let mut feed = feed.ready_chunks(METER_BATCH);
                while let Some(items) = feed.next().await {
                    let mut deliveries = Vec::with_capacity(items.len());
                    for item in items {
                        match item {
                            Ok(d) => deliveries.push(d),
                            Err(e) => tracing::warn!("meter feed: {e}"),
                        }
                    }
                    if deliveries.is_empty() {
                        continue;
                    }
                    let store = state.store.clone();
                    let recs: Vec<_> = deliveries.iter().map(|d| d.record.clone()).collect();
                    let now = i64::try_from(sluice_control::now_ms()).unwrap_or(i64::MAX);
                    let stored = tokio::task::spawn_blocking(move || store.insert_meters(&recs, now)).await;
                    match stored {
                        Ok(Ok(_)) => {
                            for d in deliveries {
                                if let Err(e) = d.ack().await {
                                    // Not acked: it comes again and is ignored as a duplicate.
                                    tracing::warn!("{e}");
                                }
                            }
                        }
                        Ok(Err(e)) => {
                            tracing::error!(
                                "cannot store {} meter record(s) ({e}); they will be redelivered",
                                deliveries.len()
                            );
                        }
                        Err(e) => tracing::error!("storing meter records: {e}"),
                    }
                }
                tracing::warn!("the meter feed ended; reconnecting");
            }
            Err(sluice_control::BusError::MetersTaken) => {
                tracing::error!("the meter feed is consumed elsewhere in this process");
                return;
            }
            Err(e) => tracing::warn!("meter feed: {e}"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Events kept per tenant.
pub const EVENTS_KEPT: u64 = 10_000;

/// Stores NF events as they come (best effort, like their delivery).
pub async fn follow_events(state: AppState) {
    loop {
        match state.bus.events().await {
            Ok(mut s) => {
                while let Some(batch) = s.next().await {
                    if batch.dropped > 0 {
                        tracing::debug!(host = %batch.host, dropped = batch.dropped, "host left out events over its per-window cap");
                    }
                    let store = state.store.clone();
                    let now = i64::try_from(sluice_control::now_ms()).unwrap_or(i64::MAX);
                    match tokio::task::spawn_blocking(move || store.insert_events(&batch, now, EVENTS_KEPT)).await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => tracing::warn!("storing events: {e}"),
                        Err(e) => tracing::warn!("storing events: {e}"),
                    }
                }
            }
            Err(e) => tracing::warn!("event feed: {e}"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Republishes desired state every `every`.
pub async fn reconcile(state: AppState, every: Duration) {
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        state.publish_all().await;
    }
}
