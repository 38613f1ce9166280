//! The gateway's shared state and its side of the control plane: it keeps
//! each host group's desired deployments on the bus, follows heartbeats,
//! and stores meter records.

use crate::config::GatewayConfig;
use crate::groups::Controller;
use crate::intake::{check_events, check_heartbeat, check_meter_bounds, check_meter_origin, check_placement};
use crate::model::SeenHosts;
use crate::store::{DeploymentRow, Store};
use futures::StreamExt;
use sluice_control::{Bus, BusError, DeploymentSpec, DesiredSet, MeterRecord, NfPlacement};
use sluice_runtime::Runtime;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use crate::model::HostSeen;

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
    pub hosts: SeenHosts,
    /// SHA-256 of the admin token.
    pub admin_hash: String,
    /// Module blobs, by digest.
    pub blobs: PathBuf,
    /// Messages from hosts that were refused.
    pub rejects: Arc<crate::intake::Rejects>,
    /// Groups whose desired state could not be published yet.
    pub unpublished: Arc<parking_lot::Mutex<std::collections::BTreeSet<String>>>,
    /// Turns to compile modules (`quotas.compiles`).
    pub compiles: Arc<tokio::sync::Semaphore>,
    /// Uploads being checked, per tenant.
    pub uploads: Arc<parking_lot::Mutex<HashMap<String, u32>>>,
    /// Held while a module blob is written with its row, or a row removed
    /// with its unused blob.
    pub blob_lock: Arc<tokio::sync::Mutex<()>>,
    /// The group controller.
    pub groups: Arc<crate::groups::Groups>,
    /// Dashboard sign-in tickets and sessions.
    pub signins: Arc<crate::signin::SignIns>,
    /// Deployments that cannot be published (not transiently), and why.
    pub publish_errors: Arc<parking_lot::Mutex<HashMap<String, String>>>,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState").field("blobs", &self.blobs).finish_non_exhaustive()
    }
}

/// One upload of a tenant being checked; counted until dropped.
pub struct UploadTurn {
    uploads: Arc<parking_lot::Mutex<HashMap<String, u32>>>,
    tenant: String,
}

impl AppState {
    /// How long a host may stay silent before it is gone.
    pub fn silence(&self) -> Duration {
        Duration::from_millis(self.config.host_silence_ms)
    }

    /// The group controller over this state's store, bus and hosts.
    pub fn controller(&self) -> Controller {
        Controller {
            store: self.store.clone(),
            bus: self.bus.clone(),
            hosts: self.hosts.clone(),
            groups: self.groups.clone(),
            silence: self.silence(),
            default_capacity_pps: self.config.default_capacity_pps,
        }
    }

    /// Counts an upload of `tenant`, unless it has `limit` in flight.
    pub fn upload_turn(&self, tenant: &str, limit: u32) -> Option<UploadTurn> {
        let mut map = self.uploads.lock();
        let n = map.entry(tenant.to_string()).or_insert(0);
        if *n >= limit {
            return None;
        }
        *n += 1;
        Some(UploadTurn { uploads: self.uploads.clone(), tenant: tenant.to_string() })
    }
}

impl Drop for UploadTurn {
    fn drop(&mut self) {
        let mut map = self.uploads.lock();
        if let Some(n) = map.get_mut(&self.tenant) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                map.remove(&self.tenant);
            }
        }
    }
}

/// A deployment as hosts are given it.
pub fn desired_spec(row: &DeploymentRow) -> DeploymentSpec {
    DeploymentSpec {
        id: row.id.clone(),
        tenant: row.tenant_id.clone(),
        name: row.name.clone(),
        revision: u64::try_from(row.revision).unwrap_or(0),
        nfs: stored_nfs(row),
        attachments: row.attachments.clone(),
        fragments: row.fragments,
        durability: row.durability,
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
        let mut v: Vec<HostSeen> = self.hosts.read().values().cloned().collect();
        v.sort_by(|a, b| a.heartbeat.host.cmp(&b.heartbeat.host));
        v
    }

    /// Why a deployment cannot be published, if it cannot.
    pub fn publish_error(&self, deployment: &str) -> Option<String> {
        self.publish_errors.lock().get(deployment).cloned()
    }

    /// Puts a group's deployments (and their modules) on the bus. A
    /// deployment that cannot be published (a module blob lost, too large
    /// for the server) is left out and marked, not the group's others; a
    /// bus that does not answer is an error (the group is retried).
    pub async fn publish_group(&self, group: &str) -> Result<(), String> {
        let rows = self.store.group_deployments(group).map_err(|e| e.to_string())?;
        let mut set = DesiredSet { group: group.to_string(), ..Default::default() };
        let mut failed = HashMap::new();
        'rows: for row in rows {
            let spec = desired_spec(&row);
            for nf in &spec.nfs {
                let bytes = match tokio::fs::read(self.blob_path(&nf.module.digest)).await {
                    Ok(b) => b,
                    Err(e) => {
                        failed.insert(row.id.clone(), format!("module blob {} is missing: {e}", nf.module.digest));
                        continue 'rows;
                    }
                };
                self.bus.put_module(&nf.module.digest, &bytes).await.map_err(|e| e.to_string())?;
            }
            set.deployments.push(spec);
        }
        let result = match self.bus.set_desired(&set).await {
            Ok(()) => Ok(()),
            Err(BusError::TooLarge { deployment, size, max }) => {
                failed.insert(
                    deployment,
                    format!("it encodes to {size} bytes, over the NATS server's max_payload of {max}"),
                );
                Ok(())
            }
            Err(e) => Err(e.to_string()),
        };
        if result.is_ok() {
            let mut errors = self.publish_errors.lock();
            errors.retain(|id, _| !set.deployments.iter().any(|d| &d.id == id));
            for (id, why) in failed {
                tracing::error!(deployment = %id, group, "deployment cannot be published: {why}");
                errors.insert(id, why);
            }
        }
        result
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
                tracing::warn!(group = %g, "cannot publish desired deployments (retrying): {e}");
                self.unpublished.lock().insert(g);
            }
        }
    }
}

/// Runs a database call off the async threads; its error and a failed
/// task both come back as text.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, crate::store::StoreError> + Send + 'static,
) -> Result<T, String> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    }
}

/// Follows heartbeats forever.
pub async fn follow_heartbeats(state: AppState) {
    loop {
        match state.bus.heartbeats().await {
            Ok(mut s) => {
                while let Some(from) = s.next().await {
                    let publisher = from.host.clone();
                    let store = state.store.clone();
                    let hb = match blocking(move || check_heartbeat(&store, from)).await {
                        Ok(Ok(hb)) => hb,
                        Ok(Err(why)) => {
                            state.rejects.record("heartbeat", &publisher, why);
                            continue;
                        }
                        Err(e) => {
                            tracing::warn!("checking a heartbeat: {e}");
                            continue;
                        }
                    };
                    let mut hosts = state.hosts.write();
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
                let mut broken = false;
                while let Some(items) = feed.next().await {
                    let mut deliveries = Vec::with_capacity(items.len());
                    for item in items {
                        match item {
                            Ok(d) => deliveries.push(d),
                            // A record nobody can read is dropped for good.
                            Err(e @ sluice_control::BusError::Decode { .. }) => tracing::warn!("meter feed: {e}"),
                            // The consumer lost its server or leader: what
                            // was not acked comes again on a new one.
                            Err(e) => {
                                tracing::warn!("meter feed: {e}; consuming again");
                                broken = true;
                            }
                        }
                    }
                    if deliveries.is_empty() {
                        if broken {
                            break;
                        }
                        continue;
                    }
                    let store = state.store.clone();
                    let recs: Vec<_> = deliveries.iter().map(|d| (d.publisher.clone(), d.record.clone())).collect();
                    let bounds = state.config.meters.clone();
                    let stored = tokio::task::spawn_blocking(move || {
                        store_checked(&store, &recs, sluice_control::now_ms(), &bounds)
                    })
                    .await;
                    match stored {
                        Ok(Ok(verdicts)) => {
                            for (d, verdict) in deliveries.into_iter().zip(verdicts) {
                                let done = match verdict {
                                    None => {
                                        if sluice_telemetry::metrics::enabled() {
                                            let tenant =
                                                opentelemetry::KeyValue::new("tenant", d.record.tenant.clone());
                                            sluice_telemetry::metrics::gateway().meter_records.add(1, &[tenant]);
                                        }
                                        d.ack().await
                                    }
                                    Some(why) => {
                                        state.rejects.record("meter", &d.publisher, why);
                                        d.reject().await
                                    }
                                };
                                if let Err(e) = done {
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
                    if broken {
                        break;
                    }
                }
                if !broken {
                    tracing::warn!("the meter feed ended; reconnecting");
                }
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

/// Checks each `(publisher, record)` and stores those that pass, in one
/// transaction; returns per record `None` (stored, or a duplicate) or why
/// it was refused. A burst holds many records of the same host and
/// deployment: each placement and host ceiling is looked up once per batch.
fn store_checked(
    store: &Store,
    recs: &[(String, MeterRecord)],
    now_ms: u64,
    bounds: &crate::config::MeterBounds,
) -> Result<Vec<Option<String>>, crate::store::StoreError> {
    let mut placements: HashMap<(&str, &str, &str), Result<(), String>> = HashMap::new();
    let mut ceilings: HashMap<&str, (u64, u64)> = HashMap::new();
    let mut verdicts = Vec::with_capacity(recs.len());
    let mut good = Vec::with_capacity(recs.len());
    for (publisher, rec) in recs {
        let ceiling = match ceilings.get(publisher.as_str()) {
            Some(c) => *c,
            None => {
                let (pps, bps) = store.host_ceiling(publisher)?.unwrap_or_default();
                let c = (pps.unwrap_or(bounds.host_max_pps), bps.unwrap_or(bounds.host_max_bps));
                ceilings.insert(publisher, c);
                c
            }
        };
        // Who may bill whom first, then whether the amounts are possible.
        let verdict = match check_meter_origin(publisher, rec) {
            Err(why) => Err(why),
            Ok(()) => {
                let key = (publisher.as_str(), rec.tenant.as_str(), rec.deployment.as_str());
                match placements.get(&key) {
                    Some(v) => v.clone(),
                    None => {
                        let v = check_placement(store, publisher, &rec.tenant, &rec.deployment)?;
                        placements.insert(key, v.clone());
                        v
                    }
                }
            }
        }
        .and_then(|()| check_meter_bounds(rec, ceiling, bounds, now_ms));
        match verdict {
            Ok(()) => {
                good.push(rec.clone());
                verdicts.push(None);
            }
            Err(why) => verdicts.push(Some(why)),
        }
    }
    store.insert_meters(&good, i64::try_from(now_ms).unwrap_or(i64::MAX))?;
    Ok(verdicts)
}

/// Events kept per tenant.
pub const EVENTS_KEPT: u64 = 10_000;

/// Stores NF events as they come (best effort, like their delivery).
pub async fn follow_events(state: AppState) {
    loop {
        match state.bus.events().await {
            Ok(mut s) => {
                while let Some(from) = s.next().await {
                    let publisher = from.host.clone();
                    let store = state.store.clone();
                    let batch = match blocking(move || check_events(&store, from)).await {
                        Ok((batch, refused, why)) => {
                            if let Some(why) = why {
                                state.rejects.record("event", &publisher, format!("{refused} event(s): {why}"));
                            }
                            batch
                        }
                        Err(e) => {
                            tracing::warn!("checking events: {e}");
                            continue;
                        }
                    };
                    if batch.events.is_empty() {
                        continue;
                    }
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

/// Republishes desired state every `every`, and groups whose publication
/// failed (a NATS server lost, a stream leader being elected) every second.
pub async fn reconcile(state: AppState, every: Duration) {
    let mut tick = tokio::time::interval(every);
    let mut retry = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = tick.tick() => {
                if let Err(e) = state.bus.maintain().await {
                    tracing::warn!("keeping the bus's streams as configured: {e}");
                }
                state.publish_all().await;
            }
            _ = retry.tick() => {
                let groups: Vec<String> =
                    std::mem::take(&mut *state.unpublished.lock()).into_iter().collect();
                for g in groups {
                    if let Err(e) = state.publish_group(&g).await {
                        tracing::warn!(group = %g, "desired deployments still not published: {e}");
                        state.unpublished.lock().insert(g);
                    } else {
                        tracing::info!(group = %g, "desired deployments published");
                    }
                }
            }
        }
    }
}
