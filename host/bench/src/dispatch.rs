//! Host groups: what building ownership tables costs and how many slots
//! move, and the flowlet dispatcher's throughput (`sluice-host steer`)
//! against `dpdk-testpmd` forwarding the same ingress on the same devices.

use crate::dpdk::{eal, lcores, tempfile_dir, testpmd_mpps_with, worker_counts};
use anyhow::{Context, Result, bail};
use sluice_group::{DEFAULT_SLOTS, Member, OwnershipTable};
use std::path::Path;
use std::process::Command;
use std::time::Instant;

fn members(n: usize) -> Vec<Member> {
    (0..n).map(|i| Member { host: format!("host-{i}"), weight: 1_000_000 }).collect()
}

/// Build time and movement of tables over `n` hosts.
fn table_row(n: usize) -> Result<String> {
    let depth = 3;
    let start = Instant::now();
    let before = OwnershipTable::build("g", 1, 0, &members(n), DEFAULT_SLOTS, depth)?;
    let build_ms = start.elapsed().as_secs_f64() * 1e3;
    let mut grown = members(n);
    grown.push(Member { host: format!("host-{n}"), weight: 1_000_000 });
    let after = OwnershipTable::build("g", 2, 0, &grown, DEFAULT_SLOTS, depth)?;
    let joined = after.moved_from(&before) as f64 / DEFAULT_SLOTS as f64;
    let mut shrunk = members(n);
    shrunk.remove(0);
    let lost = OwnershipTable::build("g", 3, 0, &shrunk, DEFAULT_SLOTS, depth)?;
    let owned = before.shares().first().map(|(_, s)| *s).unwrap_or(0.0);
    let left = lost.moved_from(&before) as f64 / DEFAULT_SLOTS as f64 - owned;
    Ok(format!(
        "| {n} | {} | {build_ms:.1} | {:.1}% | {:.1}% | {:.2}% |\n",
        before.depth(),
        100.0 / (n + 1) as f64,
        joined * 100.0,
        left.max(0.0) * 100.0
    ))
}

/// One dispatcher run: Mpps and flowlets.
fn steer_run(host: &Path, dir: &Path, trace: &Path, cpus: &[usize], workers: usize, extra: &[String]) -> Result<f64> {
    let report = dir.join("steer-report.json");
    let out = Command::new(host)
        .args(["steer", "--table"])
        .arg(dir.join("table.json"))
        .args(["--ingress", "0", "--to", "host-0=1", "--to", "host-1=2", "--to", "host-2=3"])
        .args(["--mbufs", "65535", "--workers", &workers.to_string(), "--max-packets", "20000000", "--report"])
        .arg(&report)
        .arg("--")
        .args(eal(&format!("steer{workers}"), trace, workers)?)
        .args(extra)
        .args(["--lcores".to_string(), lcores(cpus, workers)])
        .output()
        .context("running sluice-host steer")?;
    if !out.status.success() {
        bail!("sluice-host steer failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&report)?)?;
    if r.get("no_route").and_then(serde_json::Value::as_u64) != Some(0) {
        bail!("the dispatcher dropped packets for want of a route: {r}");
    }
    r.get("mpps").and_then(serde_json::Value::as_f64).context("report without mpps")
}

/// Runs the measurements and returns the Markdown section (the dispatcher
/// table only with `host`).
pub fn section(host: Option<&Path>, frames: &[Vec<u8>]) -> Result<String> {
    let mut s = String::from("## Host groups: ownership tables and the flowlet dispatcher\n\n");
    s.push_str(&format!("Tables of {DEFAULT_SLOTS} slots with a preference order of 3 (2 above 64 hosts), equal weights, built as the gateway builds them. **joined** is the share of slots that change owner when one host joins (ideal: the newcomer's share); **other slots moved** the share of slots not owned by a host that leaves which change owner all the same (ideal: 0; the leaver's own slots go to their next owners).\n\n"));
    s.push_str("| hosts | depth | build ms | newcomer's share | joined | other slots moved when one leaves |\n|---:|---:|---:|---:|---:|---:|\n");
    for n in [3, 4, 8, 16, 64] {
        s.push_str(&table_row(n)?);
    }
    s.push('\n');
    let Some(host) = host else { return Ok(s) };
    let dir = tempfile_dir()?;
    let trace = dir.join("steer64.pcap");
    let mut sink = sluice_pcap::PcapSink::create(&trace)?;
    for (i, f) in frames.iter().enumerate() {
        sink.write(1_000_000 + i as u64, f.len() as u32, f)?;
    }
    sink.finish()?;
    let table = OwnershipTable::build("bench", 1, 0, &members(3), DEFAULT_SLOTS, 3)?;
    std::fs::write(dir.join("table.json"), serde_json::to_vec(&table)?)?;
    // Ports 1-3 towards three hosts: discarding net_null devices.
    let extra: Vec<String> = (1..3).map(|i| format!("--vdev=net_null{i},no-rx=1")).collect();
    let cpus = sluice_engine::cores::CoreList::allowed()?.cores().to_vec();
    s.push_str(&format!("`sluice-host steer --table` (a fixed table of three equal hosts) on the DPDK scaling table's devices: 64-byte TCP frames replayed from memory by `net_pcap` into port 0, three discarding `net_null` ports towards the hosts; each packet parsed, its flow looked up in the worker's flowlet tracker (1,024 flows, 2 ms gap) and sent to its owner's port. The ceiling is `dpdk-testpmd --forward-mode=io` on the same four devices and cores in the same run. The machine has {} CPUs.\n\n", cpus.len()));
    s.push_str("| workers | dispatcher Mpps | testpmd Mpps | dispatcher/testpmd |\n|---:|---:|---:|---:|\n");
    for workers in worker_counts(cpus.len()) {
        let ceiling = testpmd_mpps_with(&dir, &trace, &cpus, workers, &extra)?;
        let mpps = steer_run(host, &dir, &trace, &cpus, workers, &extra)?;
        s.push_str(&format!("| {workers} | {mpps:.2} | {ceiling:.2} | {:.2} |\n", mpps / ceiling));
    }
    s.push('\n');
    Ok(s)
}
