//! `sluice-host serve`: join the cluster over NATS and run what the
//! gateway deploys to this host's group.

use crate::args::{BusArgs, ServeArgs, ServeDpdkArgs};
use anyhow::Context;
use sluice_host::HostConfig;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Runs the agent until SIGINT or SIGTERM.
pub fn serve(
    config_path: Option<&Path>,
    a: ServeArgs,
    prometheus: Option<sluice_telemetry::Prometheus>,
) -> anyhow::Result<ExitCode> {
    let mut config = HostConfig::load(config_path)?;
    if a.cores.is_some() {
        config.cores = a.cores;
    }
    if let Some(b) = a.batch {
        config.batch_size = b;
    }
    if let Some(w) = a.live.workers {
        config.workers = w;
    }
    if let Some(m) = a.live.mbuf_size {
        config.mbuf_size = m;
    }
    if !a.dpdk && !a.live.eal.is_empty() {
        anyhow::bail!("EAL arguments after `--` need --dpdk");
    }
    let host = a.host_id.unwrap_or_else(default_host_id);
    let input = match a.input {
        None => sluice_agent::Input::None,
        Some(dir) if dir.is_dir() => sluice_agent::Input::Spool { dir },
        Some(path) => sluice_agent::Input::Replay { path, loops: a.loops },
    };
    let state_dir = a.state_dir.unwrap_or_else(|| default_state_dir(&host));
    let BusArgs { nats, cluster, group, auth } = a.bus;
    let (dpdk, live, unmatched) = (a.dpdk, a.live, a.unmatched);
    let cfg = sluice_agent::AgentConfig {
        host: host.clone(),
        group,
        input,
        pps: a.pps,
        window: std::time::Duration::from_millis(a.window_ms.max(10)),
        heartbeat: std::time::Duration::from_millis(a.heartbeat_ms.max(10)),
        capacity_pps: a.capacity_pps,
        state_dir,
        report: a.report,
        output: a.output,
        runtime: config.serve_runtime(),
        batch_size: config.batch_size,
        limits: config.limits(""),
        nf_caps: config.serve_caps(),
        cores: config.worker_cores()?,
        peer: (dpdk && live.replicate_us > 0).then(|| sluice_agent::PeerConfig {
            interval: std::time::Duration::from_micros(live.replicate_us),
            max_bytes: live.peer_max_mb.saturating_mul(1 << 20),
            pull_wait: std::time::Duration::from_micros(live.pull_wait_us),
            link: live.peer_link,
            ..Default::default()
        }),
        metrics_listen: a.metrics_listen,
        prometheus,
    };
    let rt = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    rt.block_on(async move {
        let role = sluice_control::Role::Host { host: host.clone() };
        // Stopping works from the start, also while NATS is unreachable.
        let mut stop = Box::pin(sluice_control::shutdown_signal());
        let who = format!("sluice-host {host}");
        let connect = sluice_control::NatsBus::connect(&nats, &cluster, &auth, role, &who);
        let bus = tokio::select! {
            bus = connect => bus?,
            _ = &mut stop => {
                println!("host {host}: stopped before joining the cluster");
                return anyhow::Ok(());
            }
        };
        let bus = std::sync::Arc::new(bus);
        let report = if dpdk {
            serve_dpdk(bus, cfg, &config, live, unmatched, stop).await?
        } else {
            sluice_agent::serve(bus, cfg, stop).await?
        };
        let packets: u64 = report.deployments.values().map(|d| d.packets_in).sum();
        println!("host {host}: {} deployment(s), {packets} packets metered", report.deployments.len());
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

/// `serve --dpdk`: the agent on live ports.
async fn serve_dpdk(
    bus: std::sync::Arc<sluice_control::NatsBus>,
    cfg: sluice_agent::AgentConfig,
    config: &HostConfig,
    live: ServeDpdkArgs,
    unmatched: sluice_engine::Unmatched,
    stop: impl std::future::Future<Output = ()>,
) -> anyhow::Result<sluice_agent::report::AgentReport> {
    #[cfg(feature = "dpdk")]
    {
        let opts = sluice_host::dpdk::LiveOptions {
            ports: live.ports,
            pairs: live.pairs,
            unmatched,
            eal_args: live.eal,
            mbufs: live.mbufs,
            descriptors: live.descriptors,
            beacon: live.beacon.map(|target| sluice_host::beacon::BeaconOptions {
                target,
                every: std::time::Duration::from_micros(live.beacon_us),
                host: cfg.host.clone(),
            }),
            stage_times: live.stage_times,
        };
        let (input, held) = sluice_host::dpdk::open_live(config, &opts)?;
        let report = sluice_agent::serve_live(bus, cfg, input, stop).await?;
        // The ports close (flushing e.g. pcap output) after every worker is done.
        drop(held);
        Ok(report)
    }
    #[cfg(not(feature = "dpdk"))]
    {
        let _ = (bus, cfg, config, live, unmatched, stop);
        anyhow::bail!("this sluice-host was built without DPDK (cargo feature `dpdk`); --dpdk is not available")
    }
}

/// The machine's hostname, reduced to the characters a host id may hold.
pub fn default_host_id() -> String {
    let raw =
        std::fs::read_to_string("/etc/hostname").ok().or_else(|| std::env::var("HOSTNAME").ok()).unwrap_or_default();
    let id: String = raw
        .trim()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '-' })
        .take(64)
        .collect();
    if id.is_empty() { "host".into() } else { id }
}

/// `$XDG_STATE_HOME/sluice/<host>` or `~/.local/state/sluice/<host>`.
fn default_state_dir(host: &str) -> PathBuf {
    let base = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))
        .unwrap_or_else(|| PathBuf::from("."));
    base.join("sluice").join(host)
}
