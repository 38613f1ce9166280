//! `sluice dev`: a whole cluster in one process: the gateway, one host fed
//! from a spool directory, and the in-process bus between them, with the
//! same API as a real cluster. Metadata lives in an SQLite file under the
//! data directory, so a restart keeps tenants, modules and usage.

use sluice_agent::{AgentConfig, Input};
use sluice_control::LocalBus;
use sluice_gateway::{Gateway, GatewayConfig};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Settings of the dev cluster.
#[derive(Debug, Clone)]
pub struct DevOptions {
    /// HTTP listen address.
    pub listen: String,
    /// Data directory (database, blobs, host state).
    pub data_dir: PathBuf,
    /// Spool directory for traffic (default: `<data>/spool`).
    pub spool: Option<PathBuf>,
    /// Admin token (default: generated, written to `<data>/admin-token`).
    pub admin_token: Option<String>,
    /// Meter window.
    pub window: Duration,
    /// Gateway settings file (billing plan etc.).
    pub config: Option<PathBuf>,
    /// Where to serve `/metrics` (the gateway's and the host's, what a
    /// Prometheus would scrape), `/healthz` and `/readyz`; none: nowhere.
    pub metrics_listen: Option<String>,
    /// The process's Prometheus registry, rendered at `/metrics`.
    pub prometheus: Option<sluice_telemetry::Prometheus>,
}

/// The data directory `sluice dev` uses unless told: `dev/` under the
/// user's data directory (never the directory it was started from, which
/// is often an NF project).
pub fn default_data_dir() -> Result<PathBuf, crate::CliError> {
    Ok(crate::sdk::data_dir()?.join("dev"))
}

/// Runs until `shutdown`; `ready` gets the listening URL.
pub async fn run(
    opts: DevOptions,
    ready: impl FnOnce(&str, &str, &std::path::Path),
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let mut cfg = GatewayConfig::load(opts.config.as_deref())?;
    cfg.listen = opts.listen.clone();
    cfg.data_dir = opts.data_dir.join("gateway");
    std::fs::create_dir_all(&opts.data_dir)?;
    let token_file = opts.data_dir.join("admin-token");
    let token = match opts.admin_token.or(cfg.admin_token.clone()) {
        Some(t) => t,
        None => match std::fs::read_to_string(&token_file) {
            Ok(t) if !t.trim().is_empty() => {
                // A token file from an older run may be readable by others.
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600))?;
                t.trim().to_string()
            }
            _ => {
                let mut b = [0u8; 16];
                getrandom_fill(&mut b)?;
                let t: String = b.iter().map(|x| format!("{x:02x}")).collect();
                write_private(&token_file, &format!("{t}\n"))?;
                t
            }
        },
    };
    cfg.admin_token = Some(token.clone());
    // One host in group `default`, which every tenant may use.
    if cfg.default_groups.is_empty() {
        cfg.default_groups = vec!["default".into()];
    }
    let spool = opts.spool.clone().unwrap_or_else(|| opts.data_dir.join("spool"));
    std::fs::create_dir_all(&spool)?;
    let bus = Arc::new(LocalBus::new());
    let gateway = Gateway::new(cfg, bus.clone())?;
    let registered = gateway.state.store.registered_hosts()?;
    if !registered.iter().any(|h| h.id == "dev") {
        let row = sluice_gateway::store::HostRow {
            id: "dev".into(),
            group: "default".into(),
            nkey: None,
            created_ms: i64::try_from(sluice_control::now_ms()).unwrap_or(0),
            dispatcher: false,
            max_pps: None,
            max_bps: None,
        };
        gateway.state.store.add_host(&row)?;
    }
    let listener = tokio::net::TcpListener::bind(&opts.listen).await?;
    let url = format!("http://{}", listener.local_addr()?);
    let host_cfg = AgentConfig {
        host: "dev".into(),
        group: "default".into(),
        input: Input::Spool { dir: spool.clone() },
        pps: None,
        window: opts.window,
        heartbeat: Duration::from_millis(500),
        capacity_pps: 0,
        state_dir: opts.data_dir.join("host"),
        report: Some(opts.data_dir.join("host-report.json")),
        output: None,
        runtime: sluice_runtime::RuntimeConfig {
            cache_dir: Some(opts.data_dir.join("code-cache")),
            ..sluice_runtime::RuntimeConfig::default()
        },
        batch_size: 32,
        limits: sluice_runtime::NfLimits::default(),
        nf_caps: Default::default(),
        cores: sluice_engine::cores::CoreList::allowed()?,
        peer: None,
        metrics_listen: None,
        prometheus: opts.prometheus.clone(),
    };
    if let Some(addr) = &opts.metrics_listen {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| anyhow::anyhow!("listening on {addr} (--metrics-listen): {e}"))?;
        let app = sluice_gateway::telemetry::operator_router(gateway.state.clone(), opts.prometheus.clone());
        eprintln!("sluice dev: metrics, health and readiness on http://{}/metrics", listener.local_addr()?);
        tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!("the metrics listener stopped: {e}");
            }
        });
    }
    gateway.state.publish_all().await;
    let (stop_host, mut rx1) = tokio::sync::watch::channel(false);
    let (stop_gateway, mut rx2) = tokio::sync::watch::channel(false);
    let host = tokio::spawn(sluice_agent::serve(bus, host_cfg, async move {
        let _ = rx1.wait_for(|s| *s).await;
    }));
    ready(&url, &token, &spool);
    let served = tokio::spawn(gateway.serve(listener, async move {
        let _ = rx2.wait_for(|s| *s).await;
    }));
    shutdown.await;
    // The host first: it flushes its last meter window into the gateway,
    // which is still consuming.
    let _ = stop_host.send(true);
    let report = host.await??;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let _ = stop_gateway.send(true);
    served.await??;
    let packets: u64 = report.deployments.values().map(|d| d.packets_in).sum();
    eprintln!("dev cluster stopped ({packets} packets metered)");
    Ok(())
}

/// Writes a secret readable by its owner only (mode 0600, also when the
/// file existed with wider permissions).
fn write_private(path: &std::path::Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)?;
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    f.write_all(text.as_bytes())?;
    Ok(())
}

fn getrandom_fill(b: &mut [u8]) -> anyhow::Result<()> {
    use std::io::Read;
    std::fs::File::open("/dev/urandom")?.read_exact(b)?;
    Ok(())
}
