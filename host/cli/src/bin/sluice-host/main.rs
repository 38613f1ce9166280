//! `sluice-host`: run WebAssembly network functions over packet batches.
//!
//! A thin binary over the `sluice_host` library: [`args`] holds the
//! command line, [`serve`] and [`steer`] the two daemons' wiring (NATS,
//! signals), and this file dispatches and prints.

mod args;
mod serve;
#[cfg(feature = "dpdk")]
mod steer;

use anyhow::Context;
use args::{Cli, Command, RunArgs, SynthArgs};
use clap::Parser;
use sluice_host::{HostConfig, RunError, RunOptions};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let telemetry = match sluice_telemetry::start(telemetry_settings(&cli)) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(1);
        }
    };
    let prometheus = telemetry.prometheus();
    let code = match real_main(cli, prometheus) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    };
    // Whatever is buffered goes out before the process ends (SIGTERM
    // included: the commands return when it arrives).
    telemetry.shutdown();
    code
}

/// What each command reports and as whom: the long-running ones (`serve`,
/// `steer`, `dpdk`) export over OTLP when the `OTEL_*` variables ask;
/// `run` and the one-shot tools only log.
fn telemetry_settings(cli: &Cli) -> sluice_telemetry::Settings<'static> {
    let mut s = sluice_telemetry::Settings { log_default: "warn", ..Default::default() };
    match &cli.command {
        Command::Serve(a) => {
            s.service = "sluice-host";
            s.prometheus = a.metrics_listen.is_some();
            let host = a.host_id.clone().unwrap_or_else(serve::default_host_id);
            s.attributes = vec![
                ("sluice.cluster", a.bus.cluster.clone()),
                ("sluice.group", a.bus.group.clone()),
                ("host.name", host.clone()),
                ("service.instance.id", host),
            ];
        }
        #[cfg(feature = "dpdk")]
        Command::Steer(a) => {
            s.service = "sluice-steer";
            s.attributes = vec![("sluice.cluster", a.bus.cluster.clone()), ("sluice.group", a.bus.group.clone())];
            s.attributes.extend(a.id.clone().map(|id| ("service.instance.id", id)));
        }
        #[cfg(feature = "dpdk")]
        Command::Dpdk(_) => s.service = "sluice-host",
        _ => {}
    }
    s
}

fn real_main(cli: Cli, prometheus: Option<sluice_telemetry::Prometheus>) -> anyhow::Result<ExitCode> {
    let config_path = cli.config.as_deref();
    match cli.command {
        Command::Run(a) => run(config_path, a),
        #[cfg(feature = "dpdk")]
        Command::Dpdk(a) => dpdk(config_path, a),
        #[cfg(feature = "dpdk")]
        Command::Steer(a) => steer::steer(config_path, a),
        Command::Serve(a) => serve::serve(config_path, a, prometheus),
        Command::Keygen { out, show } => {
            let public = if show {
                sluice_control::nats::read_seed(&out).and_then(|seed| sluice_control::auth::public_key_of(&seed))
            } else {
                sluice_control::auth::write_new_seed(&out)
            };
            println!("{}", public.map_err(anyhow::Error::msg)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Check { modules } => check(config_path, &modules),
        Command::Synth(a) => synth(a),
    }
}

/// `sluice-host run`.
fn run(config_path: Option<&Path>, a: RunArgs) -> anyhow::Result<ExitCode> {
    let mut config = a.workers.config(config_path)?;
    a.traffic.apply(&mut config);
    let opts = RunOptions {
        nfs: a.chain.nfs,
        chain: a.chain.chain,
        swaps: a.swaps,
        input: a.input,
        output: a.output,
        progress: !a.quiet && std::io::stderr().is_terminal(),
    };
    finish(sluice_host::run(&config, &opts), sluice_host::Report::summary, a.report)
}

/// `sluice-host dpdk`.
#[cfg(feature = "dpdk")]
fn dpdk(config_path: Option<&Path>, a: args::DpdkArgs) -> anyhow::Result<ExitCode> {
    let mut config = a.workers.config(config_path)?;
    a.traffic.apply(&mut config);
    if let Some(m) = a.mbuf_size {
        config.mbuf_size = m;
    }
    let stop = stop_on_signals()?;
    let idle_exit = a.live.idle_exit();
    let opts = sluice_host::dpdk::DpdkOptions {
        nfs: a.chain.nfs,
        chain: a.chain.chain,
        ports: a.ports,
        pairs: a.pairs,
        eal_args: a.live.eal,
        max_packets: a.live.max_packets,
        idle_exit,
        mbufs: a.live.mbufs,
        descriptors: a.live.descriptors,
        stage_times: a.stage_times,
    };
    finish(sluice_host::dpdk::run_dpdk(&config, &opts, stop), sluice_host::dpdk::DpdkReport::summary, a.report)
}

/// A flag SIGINT and SIGTERM set: how the DPDK commands are told to stop.
#[cfg(feature = "dpdk")]
fn stop_on_signals() -> anyhow::Result<std::sync::Arc<std::sync::atomic::AtomicBool>> {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).context("installing the signal handler")?;
    }
    Ok(stop)
}

/// `sluice-host check`.
fn check(config_path: Option<&Path>, modules: &[PathBuf]) -> anyhow::Result<ExitCode> {
    let config = HostConfig::load(config_path)?;
    let runtime = sluice_runtime::Runtime::new(config.runtime())?;
    let mut bad = 0;
    for m in modules {
        match runtime.load_file(m) {
            Ok(module) => println!("ok: {} ({} bytes, sha256 {})", m.display(), module.size(), module.digest()),
            Err(e) => {
                bad += 1;
                println!("error: {e}");
            }
        }
    }
    Ok(if bad == 0 { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// `sluice-host synth`.
fn synth(a: SynthArgs) -> anyhow::Result<ExitCode> {
    let frames = match &a.from {
        Some(from) => {
            let text = std::fs::read_to_string(from).with_context(|| format!("reading {}", from.display()))?;
            sluice_host::traffic::parse(&text).with_context(|| format!("{}", from.display()))?
        }
        None => {
            if let Some(v) = a.vlans.iter().find(|v| **v > sluice_engine::classify::MAX_VLAN) {
                anyhow::bail!("VLAN {v} is out of range (0 for untagged, 1..=4094)");
            }
            sluice_host::synth::office_edge_vlans(a.sessions, a.seed, &a.vlans)
        }
    };
    let n = sluice_host::synth::write_pcap(&a.out, &frames)?;
    println!("wrote {n} packets to {}", a.out.display());
    Ok(ExitCode::SUCCESS)
}

/// Prints a run's summary and writes its report; a refused NF config exits
/// with status 2 and the NF's message.
fn finish<R: serde::Serialize>(
    result: Result<R, RunError>,
    summary: fn(&R) -> String,
    report: Option<PathBuf>,
) -> anyhow::Result<ExitCode> {
    let rep = match result {
        Ok(r) => r,
        Err(RunError::Runtime(e @ sluice_runtime::RuntimeError::ConfigRejected { .. })) => {
            eprintln!("error: {e}");
            return Ok(ExitCode::from(2));
        }
        Err(e) => return Err(e.into()),
    };
    print!("{}", summary(&rep));
    if let Some(path) = report {
        sluice_host::write_report(&rep, &path).with_context(|| format!("writing report {}", path.display()))?;
        println!("report: {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}
