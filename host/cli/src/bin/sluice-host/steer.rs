//! `sluice-host steer`: the flowlet dispatcher, wired to the group's
//! ownership table (over NATS, or a fixed file) and to the signals.

use crate::args::{BusArgs, SteerArgs};
use crate::{finish, stop_on_signals};
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Runs the dispatcher until a signal, `--max-packets` or `--idle-exit-ms`.
pub fn steer(config_path: Option<&Path>, a: SteerArgs) -> anyhow::Result<ExitCode> {
    let config = a.workers.config(config_path)?;
    let stop = stop_on_signals()?;
    let feed = Arc::new(sluice_host::steer::RouteFeed::new(a.to.iter().map(|t| t.host.clone()).collect()));
    let BusArgs { nats, cluster, group, auth } = a.bus;
    // The table follower runs beside the workers, on its own thread.
    let rt = tokio::runtime::Runtime::new().map_err(|e| anyhow::anyhow!("starting the async runtime: {e}"))?;
    let follower = if let Some(path) = &a.table {
        let text = std::fs::read(path).map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
        let t: sluice_control::OwnershipTable = serde_json::from_slice(&text)
            .map_err(|e| anyhow::anyhow!("{} is not an ownership table: {e}", path.display()))?;
        if t.version() == 0 {
            anyhow::bail!("{}: a table's version starts at 1", path.display());
        }
        feed.set(&t);
        None
    } else {
        let id = a.id.clone().unwrap_or_default();
        let (feed, stop) = (feed.clone(), stop.clone());
        let role = sluice_control::Role::Dispatcher { id: id.clone() };
        let who = format!("sluice-host steer {id}");
        let (poll, handover) = (Duration::from_millis(a.table_poll_ms), Duration::from_millis(a.handover_ms));
        Some(rt.spawn(async move {
            let bus = loop {
                match sluice_control::NatsBus::connect(&nats, &cluster, &auth, role.clone(), &who).await {
                    Ok(b) => break b,
                    Err(e) if stop.load(Ordering::Relaxed) => return Err(e.to_string()),
                    Err(e) => {
                        tracing::warn!("connecting to NATS: {e}; trying again");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            };
            sluice_host::steer::follow_table(&bus, &group, &feed, stop, poll, handover).await;
            Ok(())
        }))
    };
    let idle_exit = a.live.idle_exit();
    let opts = sluice_host::steer::SteerOptions {
        ingress: a.ingress,
        to: a.to,
        gap: Duration::from_micros(a.flowlet_gap_us),
        remember: Duration::from_millis(a.remember_ms),
        max_flows: a.max_flows,
        eal_args: a.live.eal,
        mbufs: a.live.mbufs,
        descriptors: a.live.descriptors,
        max_packets: a.live.max_packets,
        idle_exit,
        report: a.report.clone(),
        link_wait: Duration::from_millis(a.link_wait_ms),
        tx_retry: Duration::from_micros(a.tx_retry_us),
        liveness: (a.liveness_ms > 0).then(|| Duration::from_millis(a.liveness_ms)),
        pool_addresses: a.pool_addresses.into_iter().map(sluice_wire::IpAddr128::from).collect(),
    };
    let result = sluice_host::steer::run_steer(&config, &opts, feed, stop.clone());
    stop.store(true, Ordering::Relaxed);
    if let Some(f) = follower {
        f.abort();
    }
    finish(result, sluice_host::steer::SteerReport::summary, a.report)
}
