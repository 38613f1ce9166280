//! A host's small HTTP listener (`--metrics-listen`): `/metrics` for
//! Prometheus, `/healthz` for liveness, `/readyz` for readiness. Bind it
//! to an address only the operator's network reaches: the metrics name
//! every tenant and deployment on the host.
//!
//! - `/healthz` is 200 while the agent's control loop turns (it ticks every
//!   second), 503 when it has been stuck for [`STUCK`].
//! - `/readyz` is 200 when NATS is connected, the host has applied the
//!   deployments of its group at least once and none is still starting,
//!   and its state directory takes a write; 503 otherwise, with each
//!   check's result. A deployment that failed (a tenant's bad module)
//!   does not make the host unready: one tenant must not be able to take
//!   a host out of service.

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use parking_lot::Mutex;
use sluice_control::{Bus, DeploymentStatus, HostState, now_ms};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// A control loop silent this long is stuck.
pub const STUCK: Duration = Duration::from_secs(10);

/// What the agent's control loop says about itself.
#[derive(Debug, Default)]
pub struct Vitals {
    /// Wall-clock ms of the control loop's last turn.
    pub loop_ms: AtomicU64,
    /// Wall-clock ms of the last heartbeat published (0: none yet).
    pub heartbeat_ms: AtomicU64,
    /// Whether the host applied its group's deployments once.
    pub converged: AtomicBool,
}

impl Vitals {
    /// Marks a turn of the control loop.
    pub fn turned(&self) {
        self.loop_ms.store(now_ms(), Ordering::Relaxed);
    }
}

#[derive(Clone)]
struct Probe {
    bus: Arc<dyn Bus>,
    /// The deployments' statuses on this host.
    status: Arc<Mutex<BTreeMap<String, DeploymentStatus>>>,
    vitals: Arc<Vitals>,
    prometheus: Option<sluice_telemetry::Prometheus>,
    state_dir: PathBuf,
}

/// Serves the probes on `listener` until `shutdown`.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    bus: Arc<dyn Bus>,
    status: Arc<Mutex<BTreeMap<String, DeploymentStatus>>>,
    vitals: Arc<Vitals>,
    prometheus: Option<sluice_telemetry::Prometheus>,
    state_dir: PathBuf,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let probe = Probe { bus, status, vitals, prometheus, state_dir };
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(probe);
    if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(shutdown).await {
        tracing::error!("the metrics listener stopped: {e}");
    }
}

async fn metrics(State(p): State<Probe>) -> Response {
    match &p.prometheus {
        Some(prom) => {
            let text = prom.render();
            ([(header::CONTENT_TYPE, sluice_telemetry::Prometheus::CONTENT_TYPE)], text).into_response()
        }
        None => (StatusCode::NOT_FOUND, "no metrics are collected in this process\n").into_response(),
    }
}

async fn healthz(State(p): State<Probe>) -> Response {
    let silent = now_ms().saturating_sub(p.vitals.loop_ms.load(Ordering::Relaxed));
    if Duration::from_millis(silent) < STUCK {
        (StatusCode::OK, "ok\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, format!("the control loop has not turned for {silent} ms\n")).into_response()
    }
}

async fn readyz(State(p): State<Probe>) -> Response {
    let nats = p.bus.connected();
    let converged = p.vitals.converged.load(Ordering::Relaxed);
    let (mut running, mut starting, mut failed) = (0u64, 0u64, 0u64);
    for s in p.status.lock().values() {
        match s.state {
            HostState::Running => running += 1,
            HostState::Pending => starting += 1,
            HostState::Failed => failed += 1,
        }
    }
    let dir = p.state_dir.clone();
    let writable =
        tokio::task::spawn_blocking(move || check_writable(&dir)).await.unwrap_or_else(|e| Err(e.to_string()));
    let ready = nats && converged && starting == 0 && writable.is_ok();
    let heartbeat_ms = p.vitals.heartbeat_ms.load(Ordering::Relaxed);
    let body = serde_json::json!({
        "ready": ready,
        "checks": {
            "nats": if nats { "connected".to_string() } else { "not connected".to_string() },
            "deployments": {
                "applied": converged,
                "running": running,
                "starting": starting,
                "failed": failed,
            },
            "state_dir": match &writable { Ok(()) => "writable".to_string(), Err(e) => e.clone() },
            "last_heartbeat_ms_ago": (heartbeat_ms > 0).then(|| now_ms().saturating_sub(heartbeat_ms)),
        }
    });
    let status = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, axum::Json(body)).into_response()
}

/// Writes and removes a file in `dir`.
fn check_writable(dir: &std::path::Path) -> Result<(), String> {
    let path = dir.join(".ready-probe");
    std::fs::write(&path, b"ok").map_err(|e| format!("{} does not take a write: {e}", dir.display()))?;
    std::fs::remove_file(&path).map_err(|e| format!("{}: {e}", path.display()))
}
