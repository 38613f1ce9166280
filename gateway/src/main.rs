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
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Serve the API (what runs without a subcommand).
    Serve,
    /// Write the NATS servers' authorization block (`nats-auth-file`: the
    /// gateway and every registered host, with their subject permissions)
    /// and exit. Run it once before the first start of nats-server.
    NatsAuth,
    /// Keep a NATS server's authorization block in step with a gateway's
    /// host registry, beside a server the gateway does not share a machine
    /// with (the sidecar of each NATS pod in Kubernetes): writes the block
    /// with the gateway alone if there is none yet, then asks the gateway
    /// (`GET /v1/nats-authorization`) every `--every-ms`, rewrites the block
    /// when it changed and signals the server to reload.
    NatsAuthSync {
        /// The gateway's API base URL.
        #[arg(long, value_name = "URL")]
        gateway: String,
        /// A file holding the admin token (or set SLUICE_ADMIN_TOKEN).
        #[arg(long, value_name = "FILE")]
        token_file: Option<PathBuf>,
        /// The gateway's nkey public key (`sluice-gateway keygen` prints it).
        #[arg(long, value_name = "KEY")]
        gateway_public_key: String,
        /// The authorization block the server includes.
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
        /// nats-server's `pid_file`, to signal it to reload after a change.
        #[arg(long, value_name = "FILE")]
        pid_file: Option<PathBuf>,
        /// How often to ask, in milliseconds.
        #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u64).range(100..=3_600_000))]
        every_ms: u64,
        /// One round, then exit (an init container): the bootstrap block
        /// when there is none, then the gateway's answer if it gives one.
        #[arg(long)]
        once: bool,
    },
    /// Write a new nkey seed (mode 0600) for the gateway's NATS identity
    /// and print its public key.
    Keygen {
        /// Where to write the seed (never overwritten).
        #[arg(long)]
        out: PathBuf,
    },
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // The configuration names the cluster the telemetry reports on; an
    // error in it is reported once logging runs.
    let cfg = config(&cli);
    let serving = matches!(cli.command, None | Some(Command::Serve));
    let settings = sluice_telemetry::Settings {
        service: if serving { "sluice-gateway" } else { "" },
        log_default: "info",
        attributes: cfg.as_ref().map(|c| vec![("sluice.cluster", c.cluster.clone())]).unwrap_or_default(),
        prometheus: serving && cfg.as_ref().is_ok_and(|c| c.metrics_listen.is_some()),
    };
    let telemetry = match sluice_telemetry::start(settings) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {e}");
            return std::process::ExitCode::from(1);
        }
    };
    let prometheus = telemetry.prometheus();
    let code = match cfg.and_then(|cfg| run(cli, cfg, prometheus)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::from(1)
        }
    };
    // What is buffered is exported before the process ends (SIGTERM
    // included: serving returns when it arrives).
    telemetry.shutdown();
    code
}

/// The configuration: the file, `SLUICE_*` variables, then the flags.
fn config(cli: &Cli) -> anyhow::Result<sluice_gateway::GatewayConfig> {
    let mut cfg = sluice_gateway::GatewayConfig::load(cli.config.as_deref())?;
    if let Some(v) = &cli.listen {
        cfg.listen.clone_from(v);
    }
    if let Some(v) = &cli.data_dir {
        cfg.data_dir.clone_from(v);
    }
    if let Some(v) = &cli.nats {
        cfg.nats.clone_from(v);
    }
    if let Some(v) = &cli.cluster {
        cfg.cluster.clone_from(v);
    }
    Ok(cfg)
}

fn run(
    cli: Cli,
    cfg: sluice_gateway::GatewayConfig,
    prometheus: Option<sluice_telemetry::Prometheus>,
) -> anyhow::Result<()> {
    match cli.command.unwrap_or(Command::Serve) {
        Command::Serve => {}
        Command::NatsAuth => {
            let path = cfg.nats_auth_file.clone().context("nats-auth-file is not set in the config")?;
            write_nats_auth(&cfg)?;
            println!("wrote {}", path.display());
            return Ok(());
        }
        Command::NatsAuthSync { gateway, token_file, gateway_public_key, out, pid_file, every_ms, once } => {
            let token = match token_file {
                Some(f) => std::fs::read_to_string(&f)
                    .with_context(|| format!("reading the admin token from {}", f.display()))?
                    .trim()
                    .to_string(),
                None => {
                    cfg.admin_token.clone().context("no admin token: pass --token-file or set SLUICE_ADMIN_TOKEN")?
                }
            };
            let follower = sluice_gateway::nats_auth::Follower {
                gateway,
                token,
                cluster: cfg.cluster.clone(),
                gateway_key: gateway_public_key,
                out,
                pid_file,
            };
            if follower.bootstrap()? {
                println!("wrote {} (the gateway alone, until it answers)", follower.out.display());
            }
            if once {
                match follower.round() {
                    Ok(r) => println!("{}: {r:?}", follower.out.display()),
                    Err(e) => eprintln!("warning: {e}; {} stays as it is", follower.out.display()),
                }
                return Ok(());
            }
            follower.run(std::time::Duration::from_millis(every_ms));
        }
        Command::Keygen { out } => {
            let public = sluice_control::auth::write_new_seed(&out).map_err(anyhow::Error::msg)?;
            println!("{public}");
            return Ok(());
        }
    }
    // The servers must know the gateway before it connects.
    write_nats_auth(&cfg)?;
    let rt = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    rt.block_on(async move {
        let mut stop = Box::pin(sluice_control::shutdown_signal());
        let role = sluice_control::Role::Gateway { replicas: cfg.nats_replicas };
        let auth = cfg.nats_auth();
        let connect = sluice_control::NatsBus::connect(&cfg.nats, &cfg.cluster, &auth, role, "sluice-gateway");
        let bus = tokio::select! {
            bus = connect => bus?,
            _ = &mut stop => return anyhow::Ok(()),
        };
        let listen = cfg.listen.clone();
        let metrics_listen = cfg.metrics_listen.clone();
        let gateway = sluice_gateway::Gateway::new(cfg, Arc::new(bus))?;
        gateway.state.publish_all().await;
        if let Some(addr) = metrics_listen {
            let listener = tokio::net::TcpListener::bind(&addr)
                .await
                .with_context(|| format!("listening on {addr} (metrics-listen)"))?;
            tracing::info!("metrics, health and readiness on http://{}", listener.local_addr()?);
            let app = sluice_gateway::telemetry::operator_router(gateway.state.clone(), prometheus);
            tokio::spawn(async move {
                if let Err(e) = axum::serve(listener, app).await {
                    tracing::error!("the metrics listener stopped: {e}");
                }
            });
        }
        let listener =
            tokio::net::TcpListener::bind(&listen).await.with_context(|| format!("listening on {listen}"))?;
        let addr = listener.local_addr()?;
        tracing::info!("gateway listening on http://{addr} (dashboard /dashboard, API docs /docs)");
        println!("listening on http://{addr}");
        gateway.serve(listener, stop).await.context("serving HTTP")?;
        anyhow::Ok(())
    })
}

fn write_nats_auth(cfg: &sluice_gateway::GatewayConfig) -> anyhow::Result<()> {
    if cfg.nats_auth_file.is_none() {
        return Ok(());
    }
    std::fs::create_dir_all(&cfg.data_dir).with_context(|| format!("creating {}", cfg.data_dir.display()))?;
    let store = sluice_gateway::store::Store::open(&cfg.data_dir.join("gateway.db"))?;
    Ok(sluice_gateway::nats_auth::write(cfg, &store)?)
}
