//! The gateway's traces and metrics: a span per API request, in which the
//! writes it makes to NATS carry its trace to the hosts; HTTP requests by
//! route and status (a layer on
//! the API router), meter records stored (counted where they are), the
//! meter consumer's lag, deployments by status and hosts by group
//! (sampled every [`SAMPLE_EVERY`]); and the operator's listener
//! (`metrics-listen`) that serves them to Prometheus beside `/healthz` and
//! `/readyz`. The names are declared in [`sluice_telemetry::metrics`].

use crate::state::AppState;
use axum::Router;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use opentelemetry::KeyValue;
use sluice_telemetry::metrics;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tracing::Instrument;

/// How often the gauges are sampled.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(5);

/// Traces a request (continuing the caller's W3C trace context, if it
/// sends one) and counts it by its route's pattern (never the raw path:
/// ids in paths would make a series per id), method and status.
pub async fn observe_requests(request: Request, next: Next) -> Response {
    let (counting, tracing_on) = (metrics::enabled(), sluice_telemetry::context::recording());
    if !counting && !tracing_on {
        return next.run(request).await;
    }
    let route = request.extensions().get::<MatchedPath>().map_or("unmatched", MatchedPath::as_str).to_string();
    let method = request.method().as_str().to_string();
    let started = Instant::now();
    // Probes are counted, not traced: an orchestrator asks every few seconds.
    let traced = tracing_on && !matches!(route.as_str(), "/healthz" | "/readyz");
    let response = if traced {
        let span = tracing::info_span!(
            "HTTP request",
            otel.name = %format!("{method} {route}"),
            http.request.method = %method,
            http.route = %route,
            http.response.status_code = tracing::field::Empty,
        );
        let carrier = sluice_telemetry::context::from_headers(
            request.headers().iter().filter_map(|(k, v)| v.to_str().ok().map(|v| (k.as_str(), v))),
        );
        sluice_telemetry::context::set_parent(&span, &carrier);
        let response = next.run(request).instrument(span.clone()).await;
        span.record("http.response.status_code", response.status().as_u16());
        response
    } else {
        next.run(request).await
    };
    if !counting {
        return response;
    }
    let m = metrics::gateway();
    let status = i64::from(response.status().as_u16());
    m.request_duration.record(started.elapsed().as_secs_f64(), &[KeyValue::new("route", route.clone())]);
    m.requests
        .add(1, &[KeyValue::new("route", route), KeyValue::new("method", method), KeyValue::new("status", status)]);
    response
}

/// Samples the gauges every [`SAMPLE_EVERY`] (runs beside the API).
pub async fn sample(state: AppState) {
    if !metrics::enabled() {
        return;
    }
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    let mut seen_statuses: BTreeMap<String, ()> = BTreeMap::new();
    let mut seen_groups: BTreeMap<String, ()> = BTreeMap::new();
    loop {
        tick.tick().await;
        let m = metrics::gateway();
        match state.bus.meter_lag().await {
            Ok(Some(lag)) => m.meter_lag.record(lag, &[]),
            Ok(None) => {}
            Err(e) => tracing::debug!("the meter consumer's lag: {e}"),
        }
        let st = state.clone();
        let counted = tokio::task::spawn_blocking(move || deployments_by_status(&st)).await;
        match counted {
            Ok(Ok(by_status)) => {
                // A status that no deployment has any more reads 0.
                for s in seen_statuses.keys() {
                    if !by_status.contains_key(s) {
                        m.deployments.record(0, &[KeyValue::new("status", s.clone())]);
                    }
                }
                for (s, n) in &by_status {
                    m.deployments.record(*n, &[KeyValue::new("status", s.clone())]);
                    seen_statuses.insert(s.clone(), ());
                }
            }
            Ok(Err(e)) => tracing::warn!("counting deployments for the metrics: {e}"),
            Err(e) => tracing::warn!("counting deployments for the metrics: {e}"),
        }
        let mut hosts: BTreeMap<String, u64> = seen_groups.keys().map(|g| (g.clone(), 0)).collect();
        for h in state.hosts().into_iter().filter(|h| h.alive(state.silence())) {
            *hosts.entry(h.heartbeat.group.clone()).or_default() += 1;
        }
        for (g, n) in hosts {
            m.hosts.record(n, &[KeyValue::new("group", g.clone())]);
            seen_groups.insert(g, ());
        }
    }
}

fn deployments_by_status(st: &AppState) -> Result<BTreeMap<String, u64>, crate::store::StoreError> {
    let mut out = BTreeMap::new();
    for group in st.store.groups()? {
        for row in st.store.group_deployments(&group)? {
            *out.entry(crate::api::deployment_out(st, row).status).or_default() += 1;
        }
    }
    Ok(out)
}

#[derive(Clone)]
struct Operator {
    state: AppState,
    prometheus: Option<sluice_telemetry::Prometheus>,
}

/// The operator's listener: `/metrics`, `/healthz`, `/readyz`.
pub fn operator_router(state: AppState, prometheus: Option<sluice_telemetry::Prometheus>) -> Router {
    Router::new()
        .route("/metrics", get(render))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready))
        .with_state(Operator { state, prometheus })
}

async fn render(State(o): State<Operator>) -> Response {
    match &o.prometheus {
        Some(p) => ([(header::CONTENT_TYPE, sluice_telemetry::Prometheus::CONTENT_TYPE)], p.render()).into_response(),
        None => (StatusCode::NOT_FOUND, "no metrics are collected in this process\n").into_response(),
    }
}

async fn ready(State(o): State<Operator>) -> Response {
    crate::api::readyz(State(o.state)).await
}
