//! `sluice-gateway`: the HTTP API of a Sluice cluster over NATS.

use anyhow::Context;
use clap::Parser;
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Parser)]
#[command(
    name = "sluice-gateway",
    version,
    about = "The Sluice gateway: tenants, modules, deployments, usage and bills over HTTP; hosts over NATS"
)]
struct Cli {
    /// Configuration file (TOML); SLUICE_* variables override it. See gateway/src/config.rs.
    #[arg(long, env = "SLUICE_GATEWAY_CONFIG")]
    config: Option<PathBuf>,
    /// Listen address (overrides the config).
    #[arg(long)]
    listen: Option<String>,
    /// Data directory: gateway.db and module blobs (overrides the config).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// NATS URL (overrides the config).
    #[arg(long)]
    nats: Option<String>,
    /// Cluster name (overrides the config).
    #[arg(long)]
    cluster: Option<String>,
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SLUICE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::from(1)
        }
    }
}

fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let mut cfg = sluice_gateway::GatewayConfig::load(cli.config.as_deref())?;
    if let Some(v) = cli.listen {
        cfg.listen = v;
    }
    if let Some(v) = cli.data_dir {
        cfg.data_dir = v;
    }
    if let Some(v) = cli.nats {
        cfg.nats = v;
    }
    if let Some(v) = cli.cluster {
        cfg.cluster = v;
    }
    let rt = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    rt.block_on(async move {
        let bus = sluice_control::NatsBus::connect(&cfg.nats, &cfg.cluster, "sluice-gateway").await?;
        let listen = cfg.listen.clone();
        let gateway = sluice_gateway::Gateway::new(cfg, Arc::new(bus))?;
        gateway.state.publish_all().await;
        let listener =
            tokio::net::TcpListener::bind(&listen).await.with_context(|| format!("listening on {listen}"))?;
        let addr = listener.local_addr()?;
        tracing::info!("gateway listening on http://{addr} (dashboard /dashboard, API docs /docs)");
        println!("listening on http://{addr}");
        gateway.serve(listener, sluice_control::shutdown_signal()).await.context("serving HTTP")?;
        anyhow::Ok(())
    })
}
