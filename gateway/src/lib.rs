//! The Sluice gateway: how tenants reach Sluice.
//!
//! What it owns, and why here: tenants and their API keys, uploaded
//! modules (checked with the host's own loader, stored by digest),
//! deployments onto host groups (published to the hosts over the control
//! [`Bus`]), the meter records hosts send back (stored idempotently in
//! SQLite), usage and billing reports priced by the configured plan, and a
//! dashboard. Everything a tenant sees is scoped to it: another tenant's
//! object is a 404.
//!
//! Modules: [`api`] (the HTTP handlers under `/v1`, one file per
//! resource; OpenAPI at `/openapi.json`, Swagger UI at `/docs`), [`store`]
//! (SQLite, one file per resource), [`state`] (shared state and the
//! gateway side of the control plane), [`groups`] (the group controller),
//! [`model`] (plain data the store, controller and API share), [`auth`]
//! (who is calling), [`secrets`] (keys, tokens and their hashes),
//! [`billing`] (pricing), [`config`] (settings), [`dashboard`] (the tenant
//! page).

pub mod api;
pub mod auth;
pub mod billing;
pub mod config;
pub mod dashboard;
pub mod error;
pub mod groups;
pub mod intake;
pub mod model;
pub mod money;
pub mod nats_auth;
pub mod secrets;
pub mod signin;
pub mod state;
pub mod store;
pub mod telemetry;
pub mod whole;

use axum::Router;
use axum::routing::get;
use sluice_control::Bus;
use sluice_runtime::{Runtime, RuntimeConfig};
use state::AppState;
use std::sync::Arc;
use std::time::Duration;
use utoipa::OpenApi;

pub use api::ApiDoc;
pub use config::GatewayConfig;

/// Errors that stop the gateway from starting.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// Configuration.
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    /// Database.
    #[error(transparent)]
    Store(#[from] store::StoreError),
    /// The module checker.
    #[error(transparent)]
    Runtime(#[from] sluice_runtime::RuntimeError),
    /// The NATS authorization file could not be written.
    #[error("NATS authorization: {0}")]
    NatsAuth(#[from] nats_auth::NatsAuthError),
    /// Files.
    #[error("{what} {path}: {source}")]
    Io {
        /// What.
        what: &'static str,
        /// Path.
        path: std::path::PathBuf,
        /// Cause.
        source: std::io::Error,
    },
}

/// A gateway ready to serve.
pub struct Gateway {
    /// Shared state (tests and `sluice dev` reach the store through it).
    pub state: AppState,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway").finish_non_exhaustive()
    }
}

impl Gateway {
    /// Opens the database and blob directory and checks the settings.
    pub fn new(config: GatewayConfig, bus: Arc<dyn Bus>) -> Result<Self, GatewayError> {
        config.validate()?;
        let io = |what, path: &std::path::Path| {
            let path = path.to_path_buf();
            move |source| GatewayError::Io { what, path, source }
        };
        let blobs = config.data_dir.join("blobs");
        std::fs::create_dir_all(&blobs).map_err(io("creating", &blobs))?;
        let store = store::Store::open(&config.data_dir.join("gateway.db"))?;
        let runtime = Runtime::new(RuntimeConfig {
            cache_dir: Some(config.data_dir.join("code-cache")),
            ..RuntimeConfig::default()
        })?;
        let admin_hash = secrets::hash(config.admin_token.as_deref().unwrap_or_default());
        let compiles = usize::try_from(config.quotas.compiles).unwrap_or(1).max(1);
        nats_auth::write(&config, &store)?;
        Ok(Gateway {
            state: AppState {
                store: Arc::new(store),
                config: Arc::new(config),
                bus,
                runtime: Arc::new(runtime),
                hosts: Arc::default(),
                admin_hash,
                blobs,
                rejects: Arc::default(),
                unpublished: Arc::default(),
                publish_errors: Arc::default(),
                blob_lock: Arc::default(),
                compiles: Arc::new(tokio::sync::Semaphore::new(compiles)),
                uploads: Arc::default(),
                groups: Arc::default(),
                signins: Arc::default(),
            },
        })
    }

    /// The HTTP routes.
    pub fn router(&self) -> Router {
        use axum::http::{HeaderValue, header};
        use tower_http::set_header::SetResponseHeaderLayer;
        Router::new()
            .nest("/v1", api::router())
            .route("/healthz", get(|| async { "ok" }))
            .route("/readyz", get(api::readyz))
            .route("/", get(dashboard::redirect))
            .route("/dashboard", get(dashboard::page))
            .merge(utoipa_swagger_ui::SwaggerUi::new("/docs").url("/openapi.json", ApiDoc::openapi()))
            // Unknown paths and methods get the JSON error body too.
            .fallback(error::no_route)
            .method_not_allowed_fallback(error::method_not_allowed)
            .with_state(self.state.clone())
            .layer(axum::middleware::from_fn(telemetry::observe_requests))
            // A body that trickles in is cut off (uploads included).
            .layer(tower_http::timeout::RequestBodyTimeoutLayer::new(BODY_TIMEOUT))
            .layer(SetResponseHeaderLayer::if_not_present(
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ))
            .layer(SetResponseHeaderLayer::if_not_present(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")))
            .layer(SetResponseHeaderLayer::if_not_present(
                header::REFERRER_POLICY,
                HeaderValue::from_static("no-referrer"),
            ))
    }

    /// Serves on `listener` until `shutdown`, with the control-plane tasks
    /// (heartbeats, meters, desired-state reconciliation) running beside.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let tasks = [
            tokio::spawn(state::follow_heartbeats(self.state.clone())),
            tokio::spawn(state::consume_meters(self.state.clone())),
            tokio::spawn(state::follow_events(self.state.clone())),
            tokio::spawn(state::reconcile(self.state.clone(), Duration::from_secs(10))),
            tokio::spawn(groups::control(self.state.controller())),
            tokio::spawn(telemetry::sample(self.state.clone())),
        ];
        let result = serve_http(listener, self.router(), shutdown).await;
        for t in tasks {
            t.abort();
        }
        result
    }
}

/// How long a client may take to send a request's headers; also how long
/// an idle keep-alive connection stays open.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a client may take to send a request's body.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(60);

/// Serves `app` on `listener` until `shutdown`, then lets open requests
/// finish. Connections that do not send their headers within
/// [`HEADER_TIMEOUT`] (slowloris) or stay idle that long are closed.
async fn serve_http(
    listener: tokio::net::TcpListener,
    app: Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    use tower::ServiceExt;
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(HEADER_TIMEOUT);
    builder.http2().timer(TokioTimer::new()).keep_alive_interval(HEADER_TIMEOUT).keep_alive_timeout(HEADER_TIMEOUT);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, _peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(c) => c,
                Err(e) => {
                    // Out of descriptors and the like: wait, do not spin.
                    tracing::warn!("accepting a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let app = app.clone();
        let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
            app.clone().oneshot(req.map(axum::body::Body::new))
        });
        let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), service).into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!("HTTP connection: {e}");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(Duration::from_secs(10), graceful.shutdown()).await.is_err() {
        tracing::warn!("some HTTP connections were still open 10 s after shutdown began");
    }
    Ok(())
}
