//! Readiness (`/readyz`, on the API's listener and the operator's).

use crate::state::AppState;
use axum::extract::State;
use axum::response::{IntoResponse, Response};

/// Readiness: 200 when the gateway can do its work — NATS connected, the
/// database taking writes —, else 503; the body says each check's result.
/// (`/healthz` is liveness: the process answers.)
pub(crate) async fn readyz(State(state): State<AppState>) -> Response {
    let nats = state.bus.connected();
    let store = state.store.clone();
    let database = tokio::task::spawn_blocking(move || store.check_writable().map_err(|e| e.to_string()))
        .await
        .unwrap_or_else(|e| Err(format!("the check did not finish: {e}")));
    let ready = nats && database.is_ok();
    let body = serde_json::json!({
        "ready": ready,
        "nats": if nats { "connected" } else { "disconnected" },
        "database": match &database { Ok(()) => "writable".to_string(), Err(e) => e.clone() },
    });
    let status = if ready { axum::http::StatusCode::OK } else { axum::http::StatusCode::SERVICE_UNAVAILABLE };
    (status, axum::Json(body)).into_response()
}
