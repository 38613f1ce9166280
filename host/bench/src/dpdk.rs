//! Host throughput on DPDK virtual devices against DPDK's own forwarding
//! ceiling (`dpdk-testpmd` in io mode) on the same devices, in the same run.
//!
//! Traffic: 64-byte TCP frames from the in-memory generator, written once
//! to a pcap that `net_pcap` loads into memory and replays forever
//! (`infinite_rx=1`; one replaying RX queue per worker, each with its
//! share of the flows, split as symmetric RSS would split them); packets leave by a
//! `net_null` port that discards them (`no-rx=1`). Neither touches a disk
//! or a NIC during the measurement.

use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub(crate) const BENCH_CONFIG: &str = "[nf.firewall]\nconfig-file = \"firewall.json\"\n[nf.firewall-offload]\nconfig-file = \"firewall-offload.json\"\n[nf.nat]\nconfig-file = \"nat.json\"\n[nf.monitor]\nconfig-file = \"monitor.json\"\n";

/// NF configs of the scaling table, by NF.
#[derive(Debug, Clone, Copy)]
pub struct Configs<'a> {
    /// Firewall rules.
    pub firewall: &'a str,
    /// NAT.
    pub nat: &'a str,
    /// Monitor.
    pub monitor: &'a str,
}

/// The capture each of `queues` replaying RX queues holds: the whole trace
/// for one queue; for more, the trace's flows split over the queues by
/// their symmetric hash, as a port with symmetric RSS splits them (every
/// packet of a connection, both ways, on one queue; each queue its own
/// connections), written once beside the trace.
fn queue_traces(trace: &Path, queues: usize) -> Result<Vec<PathBuf>> {
    if queues <= 1 {
        return Ok(vec![trace.to_path_buf()]);
    }
    let paths: Vec<PathBuf> = (0..queues).map(|q| trace.with_extension(format!("q{q}of{queues}.pcap"))).collect();
    if paths.iter().all(|p| p.exists()) {
        return Ok(paths);
    }
    let source = sluice_pcap::Trace::open(trace)?;
    let mut sinks = paths.iter().map(|p| sluice_pcap::PcapSink::create(p)).collect::<Result<Vec<_>, _>>()?;
    for (i, p) in source.packets().iter().enumerate() {
        let data = source.data(p);
        let q = sluice_wire::parse(data).key.map(|k| sluice_traffic::Spread::Flow.worker(&k, queues)).unwrap_or(0);
        if let Some(sink) = sinks.get_mut(q) {
            sink.write(1_000_000 + i as u64, p.wire_len, data)?;
        }
    }
    for sink in sinks {
        sink.finish()?;
    }
    Ok(paths)
}

fn vdevs(trace: &Path, queues: usize) -> Result<Vec<String>> {
    let rx: Vec<String> = queue_traces(trace, queues)?.iter().map(|t| format!("rx_pcap={}", t.display())).collect();
    Ok(vec![format!("--vdev=net_pcap0,{},infinite_rx=1", rx.join(",")), "--vdev=net_null0,no-rx=1".to_string()])
}

pub(crate) fn eal(prefix: &str, trace: &Path, queues: usize) -> Result<Vec<String>> {
    let mut a = vec![
        "--no-huge".to_string(),
        "--no-pci".into(),
        "-m".into(),
        "2048".into(),
        format!("--file-prefix=sluice-bench-{prefix}-{}", std::process::id()),
        "--log-level=lib.eal:error".into(),
    ];
    a.extend(vdevs(trace, queues)?);
    Ok(a)
}

/// Mbufs for a pool that feeds `queues` replaying `net_pcap` queues of
/// `trace`: each queue holds a copy of the whole capture for the run, and
/// each needs room for its descriptors and per-lcore caches beside it
/// (a mempool is best at 2^n - 1 entries). At least 65,535.
pub(crate) fn pool_mbufs(trace: &Path, queues: usize) -> Result<u32> {
    let frames = sluice_pcap::Trace::open(trace)?.packets().len();
    let wanted = queues.max(1) * (frames + 2048) + 8192;
    let pow2 = wanted.checked_next_power_of_two().context("mbuf pool size overflows")?;
    Ok(u32::try_from(pow2 - 1).context("mbuf pool size overflows")?.max(65_535))
}

/// `--lcores` for DPDK's main lcore plus `n` worker lcores: lcore 0 (the
/// main one, idle while workers run) shares the first CPU, worker lcore
/// i runs on CPU i-1, so the n workers have n CPUs of their own.
pub(crate) fn lcores(cpus: &[usize], n: usize) -> String {
    let mut m = vec![format!("0@{}", cpus.first().copied().unwrap_or(0))];
    m.extend(cpus.iter().take(n).enumerate().map(|(i, c)| format!("{}@{c}", i + 1)));
    m.join(",")
}

/// One row of the scaling table.
pub(crate) struct Run {
    pub(crate) mpps: f64,
    pub(crate) traps: u64,
}

/// Mpps and traps of `sluice-host dpdk` with `nf` and `workers` (on
/// `workers` CPUs), over `packets` packets.
pub(crate) fn host_run(
    host: &Path,
    nf: &Path,
    dir: &Path,
    trace: &Path,
    cpus: &[usize],
    workers: usize,
    packets: u64,
) -> Result<Run> {
    let r = host_report(host, nf, dir, trace, cpus, workers, packets, &[])?;
    Ok(Run {
        mpps: r.get("mpps").and_then(serde_json::Value::as_f64).context("report without mpps")?,
        traps: r.get("traps").and_then(serde_json::Value::as_u64).context("report without traps")?,
    })
}

/// The report of `sluice-host dpdk` with `nf`, `workers` (on `workers`
/// CPUs) and `extra` flags, over `packets` packets.
#[allow(clippy::too_many_arguments)]
pub(crate) fn host_report(
    host: &Path,
    nf: &Path,
    dir: &Path,
    trace: &Path,
    cpus: &[usize],
    workers: usize,
    packets: u64,
    extra: &[&str],
) -> Result<serde_json::Value> {
    let report = dir.join("dpdk-report.json");
    let mbufs = pool_mbufs(trace, workers)?.to_string();
    let mut child = Command::new(host)
        .env("SLUICE_CACHE_DIR", "")
        .arg("--config")
        .arg(dir.join("host.toml"))
        .args(["dpdk", "--pairs", "--mbufs", &mbufs, "--workers", &workers.to_string()])
        .args(extra)
        .args(["--max-packets", &packets.to_string(), "--nf"])
        .arg(nf)
        .arg("--report")
        .arg(&report)
        .arg("--")
        .args(eal(&format!("host{workers}"), trace, workers)?)
        .args(["--lcores".to_string(), lcores(cpus, workers)])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("running sluice-host dpdk")?;
    // Drained while it runs, so a chatty host never blocks on a full pipe.
    let stderr = child.stderr.take().context("no sluice-host stderr")?;
    let drain = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut std::io::BufReader::new(stderr), &mut s);
        s
    });
    // A run that cannot reach its packet count (a stalled queue, an
    // exhausted pool) is stopped and reported, never waited on forever:
    // 20 s to start, then at least 500,000 packets a second.
    let bound = Duration::from_secs(20 + packets / 500_000);
    let started = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break Some(s);
        }
        if started.elapsed() > bound {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let err = drain.join().unwrap_or_default();
    match status {
        None => bail!(
            "sluice-host dpdk ({workers} workers, {}) did not forward {packets} packets in {} s; its log:\n{err}",
            nf.display(),
            bound.as_secs()
        ),
        Some(s) if !s.success() => bail!("sluice-host dpdk failed: {err}"),
        Some(_) => Ok(serde_json::from_slice(&std::fs::read(&report)?)?),
    }
}

/// testpmd's forwarding rate between the same devices: packets it
/// received, from the moment forwarding starts until it is interrupted,
/// over that time (its own per-period printout is not reliable when its
/// stdin is not a terminal).
fn testpmd_mpps(dir: &Path, trace: &Path, cpus: &[usize], queues: usize) -> Result<f64> {
    testpmd_mpps_with(dir, trace, cpus, queues, &[])
}

/// [`testpmd_mpps`] with `extra` devices after the two of [`eal`].
pub(crate) fn testpmd_mpps_with(
    dir: &Path,
    trace: &Path,
    cpus: &[usize],
    queues: usize,
    extra: &[String],
) -> Result<f64> {
    use std::io::BufRead;
    let testpmd = which("dpdk-testpmd").context("dpdk-testpmd not found (Debian package dpdk-dev)")?;
    // stdbuf: testpmd's stdout is a pipe here, which stdio would buffer
    // until exit; line buffering lets us see when forwarding starts.
    let mut child = Command::new("stdbuf")
        .arg("-oL")
        .arg(testpmd)
        .args(eal(&format!("testpmd{queues}"), trace, queues)?)
        .args(extra)
        .args(["--lcores".to_string(), lcores(cpus, queues), "--".into()])
        .args(["-a", "--forward-mode=io", &format!("--total-num-mbufs={}", pool_mbufs(trace, queues)?)])
        .args([format!("--rxq={queues}"), format!("--txq={queues}"), format!("--nb-cores={queues}")])
        .current_dir(dir)
        // Held open for the run: testpmd treats end of input as "stop".
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting dpdk-testpmd")?;
    let stdout = child.stdout.take().context("no testpmd stdout")?;
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut lines = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    let started = loop {
        let line = rx.recv_timeout(Duration::from_secs(30)).context("testpmd did not start forwarding")?;
        let go = line.contains("start packet forwarding");
        lines.push(line);
        if go {
            break Instant::now();
        }
        if Instant::now() > deadline {
            bail!("testpmd did not start forwarding:\n{}", lines.join("\n"));
        }
    };
    std::thread::sleep(Duration::from_secs(5));
    let _ = Command::new("kill").args(["-INT", &child.id().to_string()]).status();
    let elapsed = started.elapsed().as_secs_f64();
    // It prints its totals and exits; one that does not within 20 s is
    // killed (and its missing totals reported below).
    let stop = Instant::now();
    while child.try_wait()?.is_none() {
        if stop.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let _ = child.wait();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = reader.join();
    lines.extend(rx.try_iter());
    // The block after "Accumulated forward statistics for all ports" holds
    // the total received over all ports.
    let total = lines
        .iter()
        .skip_while(|l| !l.contains("Accumulated forward statistics for all ports"))
        .find_map(|l| {
            l.trim().strip_prefix("RX-packets:").and_then(|r| r.split_whitespace().next()?.parse::<f64>().ok())
        })
        .with_context(|| format!("testpmd printed no totals:\n{}", lines.join("\n")))?;
    Ok(total / elapsed / 1e6)
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| Path::new(d).join(name)).find(|p| p.exists())
}

/// Worker counts of the scaling table: 1, 2, 4, ... up to `cores`.
pub(crate) fn worker_counts(cores: usize) -> Vec<usize> {
    let mut v: Vec<usize> =
        std::iter::successors(Some(1usize), |n| n.checked_mul(2)).take_while(|&n| n <= cores).collect();
    if v.last().is_some_and(|&l| l < cores) {
        v.push(cores);
    }
    v
}

/// Runs the DPDK measurements and returns the Markdown section: worker
/// counts `workers` (those the machine has CPUs for), or
/// [`worker_counts`] when empty.
pub fn section(host: &Path, nfs: &Path, frames: &[Vec<u8>], configs: Configs<'_>, workers: &[usize]) -> Result<String> {
    let dir = prepare(frames, configs)?;
    let trace = dir.join("bench64.pcap");
    let cpus = sluice_engine::cores::CoreList::allowed()?.cores().to_vec();
    let counts: Vec<usize> = if workers.is_empty() {
        worker_counts(cpus.len())
    } else {
        workers.iter().copied().filter(|&w| (1..=cpus.len()).contains(&w)).collect()
    };

    let nf_names = ["noop", "firewall", "nat", "monitor"];
    // (nf, workers, host run, testpmd Mpps at that many cores)
    let mut rows: Vec<(&str, usize, Run, f64)> = Vec::new();
    for &workers in &counts {
        let ceiling = testpmd_mpps(&dir, &trace, &cpus, workers)?;
        eprintln!("testpmd on {workers} cores: {ceiling:.2} Mpps");
        for nf in nf_names {
            let run = host_run(
                host,
                &nfs.join(format!("{nf}.wasm")),
                &dir,
                &trace,
                &cpus,
                workers,
                4_000_000 * workers as u64,
            )?;
            eprintln!("{nf} on {workers} workers: {:.2} Mpps (testpmd {ceiling:.2})", run.mpps);
            rows.push((nf, workers, run, ceiling));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    let one = |nf: &str| rows.iter().find(|r| r.0 == nf && r.1 == 1).map(|r| r.2.mpps).unwrap_or(0.0);
    let mut s = String::new();
    s.push_str("\n## DPDK: scaling over cores, against DPDK's forwarding ceiling\n\n");
    s.push_str(&format!("64-byte TCP frames from the in-memory generator, replayed from memory by `net_pcap` (`infinite_rx=1`, one replaying RX queue per worker, each holding its share of the trace's 1,024 connections, split by their symmetric hash as a port with symmetric RSS splits them) and sent to a discarding `net_null` port; EAL with `--no-huge --no-pci`, `--lcores` giving N workers N CPUs of their own (the idle main lcore shares the first). The ceiling is `dpdk-testpmd --forward-mode=io` with the same devices and N forwarding cores, measured in the same run (packets received from the start of forwarding until it is stopped, over that time). **scaling** is the host's Mpps at N workers over its Mpps at 1 (target: ≥ 0.8 × N); **traps** counts deadline traps of these well-behaved NFs (target: 0). The machine has {} CPUs.\n\n", cpus.len()));
    s.push_str("| NF | workers | host Mpps | scaling | traps | testpmd Mpps | host/testpmd |\n|---|---:|---:|---:|---:|---:|---:|\n");
    for (nf, w, run, c) in &rows {
        let base = one(nf);
        let scaling = if base > 0.0 { run.mpps / base } else { 0.0 };
        s.push_str(&format!(
            "| {nf} | {w} | {:.2} | {scaling:.2}× | {} | {c:.2} | {:.2} |\n",
            run.mpps,
            run.traps,
            if *c > 0.0 { run.mpps / c } else { 0.0 }
        ));
    }
    Ok(s)
}

/// Stages of the per-stage table, in a batch's order (the report's keys).
const STAGES: [&str; 8] = ["receive", "read", "build", "call", "verdicts", "deliver", "transmit", "between"];

/// Where a packet's time goes on one worker: `sluice-host dpdk
/// --stage-times` per NF, beside testpmd's whole cost per packet on the
/// same devices, measured in the same run. Each NF runs `rounds` times,
/// interleaved; the table shows the round with the median total.
pub fn stages_section(host: &Path, nfs: &Path, frames: &[Vec<u8>], configs: Configs<'_>) -> Result<String> {
    let dir = prepare(frames, configs)?;
    let trace = dir.join("bench64.pcap");
    let cpus = sluice_engine::cores::CoreList::allowed()?.cores().to_vec();
    // The firewall again, offloading its established connections: the
    // same component under another name, with its own config.
    std::fs::copy(nfs.join("firewall.wasm"), dir.join("firewall-offload.wasm"))?;
    let nf_names = ["noop", "firewall", "firewall-offload", "nat", "monitor"];
    let nf_path = |nf: &str| {
        if nf == "firewall-offload" { dir.join("firewall-offload.wasm") } else { nfs.join(format!("{nf}.wasm")) }
    };
    let rounds = 3;
    let mut runs: Vec<Vec<serde_json::Value>> = vec![Vec::new(); nf_names.len()];
    let mut ceilings = Vec::new();
    for _ in 0..rounds {
        ceilings.push(testpmd_mpps(&dir, &trace, &cpus, 1)?);
        for (i, nf) in nf_names.iter().enumerate() {
            let r = host_report(host, &nf_path(nf), &dir, &trace, &cpus, 1, 8_000_000, &["--stage-times"])?;
            if let Some(v) = runs.get_mut(i) {
                v.push(r);
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    let stage = |r: &serde_json::Value, k: &str| {
        r.get("stages").and_then(|s| s.get(k)).and_then(serde_json::Value::as_f64).unwrap_or(0.0)
    };
    let total = |r: &serde_json::Value| stage(r, "total");
    ceilings.sort_by(f64::total_cmp);
    let ceiling = ceilings.get(ceilings.len() / 2).copied().unwrap_or(0.0);
    let mut s = String::new();
    s.push_str("\n## DPDK: where a packet's time goes, stage by stage\n\n");
    s.push_str(&format!("`sluice-host dpdk --stage-times` on one worker over the devices of the scaling table below (64-byte TCP frames replayed from memory by `net_pcap`, sent to `net_null`), 8 M packets per run, {rounds} rounds interleaved with `dpdk-testpmd --forward-mode=io` on the same devices; each row is the NF's round with the median total. Stages (docs/run-report.md): **receive** the device's receive burst, **read** lengths and bytes out of the buffers, **build** the batch record (parse, descriptor, flow key and hash), **call** the NF's `process` call (flow state, lowering, guest code, lifting), **verdicts** fates from verdicts, routes and rewrites, **deliver** packets to output queues, **transmit** the device's transmit burst, **between** the worker's loop between batches; ns per packet. **firewall-offload** is the firewall with `offload = true`: each direction of a connection is offloaded at its fourth established packet (the default `offload-after`), and its later packets pass under the host's entry without a call (the entry's lookup and the packet's fate are in **build**). testpmd forwards a packet in {:.1} ns ({ceiling:.2} Mpps, median of the rounds): its whole cost is about this table's receive and transmit.\n\n", if ceiling > 0.0 { 1e3 / ceiling } else { 0.0 }));
    s.push_str("| NF | Mpps | receive | read | build | call | verdicts | deliver | transmit | between | total | host/testpmd |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (nf, v) in nf_names.iter().zip(runs.iter_mut()) {
        v.sort_by(|a, b| total(a).total_cmp(&total(b)));
        let Some(r) = v.get(v.len() / 2) else { continue };
        let mpps = r.get("mpps").and_then(serde_json::Value::as_f64).unwrap_or(0.0);
        s.push_str(&format!("| {nf} | {mpps:.2} |"));
        for k in STAGES {
            s.push_str(&format!(" {:.1} |", stage(r, k)));
        }
        s.push_str(&format!(" {:.1} | {:.2} |\n", total(r), if ceiling > 0.0 { mpps / ceiling } else { 0.0 }));
    }
    Ok(s)
}

/// A temporary folder with the trace of `frames` and the NFs' configs.
fn prepare(frames: &[Vec<u8>], configs: Configs<'_>) -> Result<PathBuf> {
    let dir = tempfile_dir()?;
    let mut sink = sluice_pcap::PcapSink::create(&dir.join("bench64.pcap"))?;
    for (i, f) in frames.iter().enumerate() {
        sink.write(1_000_000 + i as u64, f.len() as u32, f)?;
    }
    sink.finish()?;
    std::fs::write(dir.join("firewall.json"), configs.firewall)?;
    let offload = match configs.firewall.trim_end().strip_suffix('}') {
        Some(body) => format!("{body},\"offload\":true}}"),
        None => anyhow::bail!("the firewall config is no JSON object"),
    };
    std::fs::write(dir.join("firewall-offload.json"), offload)?;
    std::fs::write(dir.join("nat.json"), configs.nat)?;
    std::fs::write(dir.join("monitor.json"), configs.monitor)?;
    std::fs::write(dir.join("host.toml"), BENCH_CONFIG)?;
    Ok(dir)
}

pub(crate) fn tempfile_dir() -> Result<PathBuf> {
    let d = std::env::temp_dir().join(format!("sluice-bench-{}", std::process::id()));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}
