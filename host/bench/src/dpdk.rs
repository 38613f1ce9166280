//! Host throughput on DPDK virtual devices against DPDK's own forwarding
//! ceiling (`dpdk-testpmd` in io mode) on the same devices, in the same run.
//!
//! Traffic: 64-byte TCP frames from the in-memory generator, written once
//! to a pcap that `net_pcap` loads into memory and replays forever
//! (`infinite_rx=1`; one replaying RX queue per worker); packets leave by a
//! `net_null` port that discards them (`no-rx=1`). Neither touches a disk
//! or a NIC during the measurement.

use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BENCH_CONFIG: &str = "[nf.firewall]\nconfig-file = \"firewall.json\"\n";

fn vdevs(trace: &Path, queues: usize) -> Vec<String> {
    let rx: Vec<String> = (0..queues).map(|_| format!("rx_pcap={}", trace.display())).collect();
    vec![format!("--vdev=net_pcap0,{},infinite_rx=1", rx.join(",")), "--vdev=net_null0,no-rx=1".to_string()]
}

fn eal(prefix: &str, trace: &Path, queues: usize) -> Vec<String> {
    let mut a = vec![
        "--no-huge".to_string(),
        "--no-pci".into(),
        "-m".into(),
        "2048".into(),
        format!("--file-prefix=sluice-bench-{prefix}-{}", std::process::id()),
        "--log-level=lib.eal:error".into(),
    ];
    a.extend(vdevs(trace, queues));
    a
}

/// Mpps of `sluice-host dpdk` with `nf` and `workers`, over `packets` packets.
fn host_mpps(host: &Path, nf: &Path, dir: &Path, trace: &Path, workers: usize, packets: u64) -> Result<f64> {
    let report = dir.join("dpdk-report.json");
    let out = Command::new(host)
        .env("SLUICE_CACHE_DIR", "")
        .arg("--config")
        .arg(dir.join("host.toml"))
        .args(["dpdk", "--pairs", "--mbufs", "65535", "--workers", &workers.to_string()])
        .args(["--max-packets", &packets.to_string(), "--nf"])
        .arg(nf)
        .arg("--report")
        .arg(&report)
        .arg("--")
        .args(eal(&format!("host{workers}"), trace, workers))
        .output()
        .context("running sluice-host dpdk")?;
    if !out.status.success() {
        bail!("sluice-host dpdk failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&report)?)?;
    r.get("mpps").and_then(serde_json::Value::as_f64).context("report without mpps")
}

/// testpmd's forwarding rate between the same devices: packets it
/// received, from the moment forwarding starts until it is interrupted,
/// over that time (its own per-period printout is not reliable when its
/// stdin is not a terminal).
fn testpmd_mpps(dir: &Path, trace: &Path, queues: usize) -> Result<f64> {
    use std::io::BufRead;
    let testpmd = which("dpdk-testpmd").context("dpdk-testpmd not found (Debian package dpdk-dev)")?;
    // stdbuf: testpmd's stdout is a pipe here, which stdio would buffer
    // until exit; line buffering lets us see when forwarding starts.
    let mut child = Command::new("stdbuf")
        .arg("-oL")
        .arg(testpmd)
        .args(eal(&format!("testpmd{queues}"), trace, queues))
        .args(["-l", "0-1", "--"])
        .args(["-a", "--forward-mode=io", "--total-num-mbufs=65535"])
        .args([format!("--rxq={queues}"), format!("--txq={queues}"), "--nb-cores=1".into()])
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
    let _ = child.wait();
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

/// Runs the DPDK measurements and returns the Markdown section.
pub fn section(host: &Path, nfs: &Path, frames: &[Vec<u8>], firewall_config: &str) -> Result<String> {
    let dir = tempfile_dir()?;
    let trace = dir.join("bench64.pcap");
    let mut sink = sluice_pcap::PcapSink::create(&trace)?;
    for (i, f) in frames.iter().enumerate() {
        sink.write(1_000_000 + i as u64, f.len() as u32, f)?;
    }
    sink.finish()?;
    std::fs::write(dir.join("firewall.json"), firewall_config)?;
    std::fs::write(dir.join("host.toml"), BENCH_CONFIG)?;

    let mut rows = Vec::new();
    for workers in [1usize, 2] {
        let ceiling = testpmd_mpps(&dir, &trace, workers)?;
        for nf in ["noop", "firewall"] {
            let mpps = host_mpps(host, &nfs.join(format!("{nf}.wasm")), &dir, &trace, workers, 4_000_000)?;
            rows.push((nf, workers, mpps, ceiling));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    let mut s = String::new();
    s.push_str("\n## DPDK: host throughput against DPDK's forwarding ceiling\n\n");
    s.push_str("64-byte TCP frames from the in-memory generator, replayed from memory by `net_pcap` (`infinite_rx=1`, one replaying RX queue per worker) and sent to a discarding `net_null` port; EAL with `--no-huge --no-pci`. The ceiling is `dpdk-testpmd --forward-mode=io` with one forwarding core between the same devices, measured in the same run (packets received from the start of forwarding until it is stopped, over that time). The machine has 2 cores, so with 2 workers the host's threads share them with EAL's.\n\n");
    s.push_str("| NF | workers | host Mpps | testpmd Mpps | ratio |\n|---|---:|---:|---:|---:|\n");
    for (nf, w, m, c) in rows {
        s.push_str(&format!("| {nf} | {w} | {m:.2} | {c:.2} | {:.2} |\n", m / c));
    }
    Ok(s)
}

fn tempfile_dir() -> Result<PathBuf> {
    let d = std::env::temp_dir().join(format!("sluice-bench-{}", std::process::id()));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}
