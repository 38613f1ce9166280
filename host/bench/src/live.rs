//! A host on live ports under the control plane (`sluice-host serve
//! --dpdk`): how long a deployment takes to see its first packet, and the
//! throughput of 1, 2 and 4 tenants' deployments sharing one port against
//! `sluice-host dpdk` running the same NF alone on the same traffic, in
//! the same run — the cost of classification and multi-tenancy.
//!
//! The cluster is real (see [`crate::control`]); traffic is the DPDK
//! section's: 64-byte TCP frames replayed from memory by `net_pcap`
//! (`infinite_rx=1`) into port 0, leaving by a discarding `net_null` port
//! (`--pairs`), here tagged with one 802.1Q VLAN per tenant in turn.

// Gateway answers are `serde_json::Value`s, whose `Index<&str>` yields
// `Null` for a missing key instead of panicking.
#![allow(clippy::indexing_slicing)]

use crate::control::{Cluster, Kill, agent, call, median, wait};
use crate::dpdk::{eal, host_run, lcores};
use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const DEPLOYS: usize = 10;
const TENANTS: [usize; 4] = [1, 2, 4, 16];
const ROUNDS: usize = 3;
/// Rounds of the tenants table: its ratios are what the target is judged
/// by, and one round's ratio moves by ±0.15 on a busy machine.
const TENANT_ROUNDS: usize = 5;
/// Tenants of the stage-by-stage comparison.
const STAGE_TENANTS: [usize; 3] = [1, 4, 16];
/// Stages of a live host's report, in order (`sluice_runtime::stages`).
const STAGES: [&str; 9] =
    ["receive", "read", "classify", "build", "call", "verdicts", "deliver", "transmit", "between"];

/// Each live round's rate over the mean of the baseline runs just before
/// and after it (`alones` holds one more run than `lives`): a change of
/// the machine's speed during a round weighs on both sides alike.
fn bracketed_ratios(lives: &[f64], alones: &[f64]) -> Vec<f64> {
    lives
        .iter()
        .zip(alones.windows(2))
        .map(|(live, pair)| {
            let base = pair.iter().sum::<f64>() / 2.0;
            if base > 0.0 { live / base } else { 0.0 }
        })
        .collect()
}

/// `frames` with an 802.1Q tag each, VLAN `100 + i % vlans`.
fn tagged(frames: &[Vec<u8>], vlans: usize) -> Vec<Vec<u8>> {
    frames
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let vid = 100 + (i % vlans.max(1)) as u16;
            let mut t = Vec::with_capacity(f.len() + 4);
            t.extend_from_slice(f.get(..12).unwrap_or(f));
            t.extend_from_slice(&[0x81, 0x00]);
            t.extend_from_slice(&vid.to_be_bytes());
            t.extend_from_slice(f.get(12..).unwrap_or(&[]));
            t
        })
        .collect()
}

fn write_trace(path: &Path, frames: &[Vec<u8>]) -> Result<()> {
    let mut sink = sluice_pcap::PcapSink::create(path)?;
    for (i, f) in frames.iter().enumerate() {
        sink.write(1_000_000 + i as u64, f.len() as u32, f)?;
    }
    sink.finish()?;
    Ok(())
}

/// The host's report, if it wrote one.
fn report(path: &Path) -> Option<Value> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

/// (packets the deployments ran, report time ms).
fn ran(path: &Path) -> Option<(u64, u64)> {
    let r = report(path)?;
    let n = r["deployments"].as_object()?.values().map(|d| d["packets_in"].as_u64().unwrap_or(0)).sum();
    Some((n, r["updated_ms"].as_u64()?))
}

/// How to start this run's live host.
struct LiveHost<'a> {
    host: &'a Path,
    cluster: &'a Cluster,
    /// `serve` arguments that sign in as the registered host.
    args: &'a [std::ffi::OsString],
    cpus: &'a [usize],
}

impl LiveHost<'_> {
    /// `sluice-host serve --dpdk` on `trace`, one worker.
    fn start(&self, trace: &Path, report: &Path, tag: &str, heartbeat_ms: u32) -> Result<Kill> {
        self.start_with(trace, report, tag, heartbeat_ms, &[])
    }

    /// [`start`](Self::start) with more `serve` arguments.
    fn start_with(&self, trace: &Path, report: &Path, tag: &str, heartbeat_ms: u32, extra: &[&str]) -> Result<Kill> {
        self.start_env(trace, report, tag, heartbeat_ms, extra, &[])
    }

    /// [`start_with`](Self::start_with) with more environment variables.
    fn start_env(
        &self,
        trace: &Path,
        report: &Path,
        tag: &str,
        heartbeat_ms: u32,
        extra: &[&str],
        env: &[(&str, String)],
    ) -> Result<Kill> {
        let child = Command::new(self.host)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .env("SLUICE_CACHE_DIR", self.cluster.dir.join("cache"))
            .env("SLUICE_LOG", "info")
            .args(self.args)
            .args(["--group", "edge", "--dpdk", "--workers", "1", "--pairs", "--mbufs", "65535"])
            .args(["--heartbeat-ms", &heartbeat_ms.to_string(), "--window-ms", "1000", "--report"])
            .arg(report)
            .args(extra)
            .arg("--")
            .args(eal(&format!("live-{tag}"), trace, 1)?)
            .args(["--lcores".to_string(), lcores(self.cpus, 1)])
            .stdout(self.cluster.log(&format!("live-{tag}.log"))?)
            .stderr(self.cluster.log(&format!("live-{tag}.err"))?)
            .spawn()
            .context("starting sluice-host serve --dpdk")?;
        Ok(Kill(child))
    }
}

/// Stops a host with SIGTERM (it flushes its meters) and waits for it.
fn term(mut k: Kill) {
    let _ = Command::new("kill").args(["-TERM", &k.0.id().to_string()]).status();
    let _ = k.0.wait();
}

fn deploy(cluster: &Cluster, key: &str, name: &str, config: &str, attach: &str) -> Result<()> {
    deploy_module(cluster, key, name, "firewall@1", config, attach)
}

fn deploy_module(cluster: &Cluster, key: &str, name: &str, module: &str, config: &str, attach: &str) -> Result<()> {
    let (st, d) =
        call(agent().post(format!("{}/v1/deployments", cluster.base)).header("Authorization", key).send_json(
            json!({"name": name, "group": "edge", "module": module, "config": config, "attach": [attach]}),
        ))?;
    if st != 201 {
        bail!("deploying {name}: {st} {d}");
    }
    Ok(())
}

fn undeploy(cluster: &Cluster, key: &str, name: &str) -> Result<()> {
    call(agent().delete(format!("{}/v1/deployments/{name}", cluster.base)).header("Authorization", key).call())?;
    Ok(())
}

/// The deployment's packets on the first host reporting it.
fn packets_on_host(cluster: &Cluster, key: &str, name: &str) -> u64 {
    call(agent().get(format!("{}/v1/deployments/{name}", cluster.base)).header("Authorization", key).call())
        .ok()
        .and_then(|(_, v)| v["hosts"].as_array().and_then(|h| h.first()).and_then(|h| h["packets"].as_u64()))
        .unwrap_or(0)
}

/// Runs the measurements and returns the Markdown section.
pub fn section(host: &Path, nfs: &Path, frames: &[Vec<u8>], firewall_config: &str) -> Result<String> {
    let cluster = Cluster::start(host, "live", "[groups.edge]\nports = [0, 1]\n")?;
    let dir = cluster.dir.clone();
    std::fs::write(dir.join("firewall.json"), firewall_config)?;
    std::fs::write(dir.join("host.toml"), "[nf.firewall]\nconfig-file = \"firewall.json\"\n")?;
    let cpus = sluice_engine::cores::CoreList::allowed()?.cores().to_vec();
    let fw_path = nfs.join("firewall.wasm");
    let fw = std::fs::read(&fw_path).context("firewall.wasm (make nfs)")?;
    let host_args = cluster.register_host("live", "edge")?;
    let mut tenants = Vec::new();
    for t in 0..TENANTS.iter().copied().max().unwrap_or(1) {
        let (key, _) = cluster.tenant(&format!("tenant{t}"), &["edge"])?;
        cluster.upload(&key, "firewall", "1", &fw)?;
        tenants.push(key);
    }
    let key0 = tenants.first().cloned().unwrap_or_default();

    // Deploy → first packet on a running live host with traffic on its port.
    let untagged: PathBuf = dir.join("untagged.pcap");
    write_trace(&untagged, frames)?;
    let rep = dir.join("live-first.json");
    let live_host = LiveHost { host, cluster: &cluster, args: &host_args, cpus: &cpus };
    let live = live_host.start(&untagged, &rep, "first", 20)?;
    cluster.wait_host()?;
    let (mut running_ms, mut first_ms) = (Vec::new(), Vec::new());
    for i in 0..=DEPLOYS {
        let name = format!("first{i}");
        let t0 = Instant::now();
        deploy(&cluster, &key0, &name, firewall_config, "port=0")?;
        let mut running = None;
        wait("a live deployment's first packet", 30, || {
            if running.is_none()
                && call(
                    agent()
                        .get(format!("{}/v1/deployments/{name}", cluster.base))
                        .header("Authorization", &key0)
                        .call(),
                )
                .is_ok_and(|(_, v)| v["status"] == "running")
            {
                running = Some(t0.elapsed());
            }
            packets_on_host(&cluster, &key0, &name) > 0
        })?;
        let first = t0.elapsed();
        if i > 0 {
            running_ms.push(running.unwrap_or(first).as_secs_f64() * 1e3);
            first_ms.push(first.as_secs_f64() * 1e3);
        }
        undeploy(&cluster, &key0, &name)?;
    }
    term(live);

    // Throughput: n tenants' deployments, one VLAN each, on one port,
    // against `sluice-host dpdk` with the firewall alone on the same trace.
    let mut rows = Vec::new();
    for n in TENANTS {
        let trace = dir.join(format!("vlans{n}.pcap"));
        write_trace(&trace, &tagged(frames, n))?;
        for (t, key) in tenants.iter().take(n).enumerate() {
            deploy(&cluster, key, &format!("fw{t}"), firewall_config, &format!("port=0,vlan={}", 100 + t))?;
        }
        // Alternating rounds, medians: the machine's noise hits both. A
        // `dpdk` run before the first round and after each: every live
        // window lies between two of them.
        let (mut lives, mut alones, mut traps) = (Vec::new(), Vec::new(), 0);
        let alone = host_run(host, &fw_path, &dir, &trace, &cpus, 1, 4_000_000)?;
        alones.push(alone.mpps);
        traps += alone.traps;
        for round in 0..TENANT_ROUNDS {
            let rep = dir.join(format!("live-{n}-{round}.json"));
            let live = live_host.start(&trace, &rep, &format!("t{n}r{round}"), 1000)?;
            wait("the live host to run traffic", 60, || ran(&rep).is_some_and(|(p, _)| p > 0))?;
            std::thread::sleep(Duration::from_millis(1500));
            let (p0, t0) = ran(&rep).context("no host report")?;
            // One read after the window: nothing polls while it runs.
            std::thread::sleep(Duration::from_millis(6000));
            let (p1, t1) = ran(&rep).context("no host report")?;
            if t1 <= t0 {
                bail!("the live host wrote no report for 6 s");
            }
            lives.push((p1 - p0) as f64 / ((t1 - t0) as f64 * 1e3));
            traps += report(&rep)
                .and_then(|r| {
                    r["deployments"].as_object().map(|d| {
                        d.values()
                            .flat_map(|d| d["nfs"].as_object().into_iter().flat_map(|m| m.values()))
                            .map(|t| t["traps"].as_u64().unwrap_or(0))
                            .sum::<u64>()
                    })
                })
                .unwrap_or(0);
            term(live);
            let alone = host_run(host, &fw_path, &dir, &trace, &cpus, 1, 4_000_000)?;
            alones.push(alone.mpps);
            traps += alone.traps;
        }
        for (t, key) in tenants.iter().take(n).enumerate() {
            undeploy(&cluster, key, &format!("fw{t}"))?;
        }
        let ratios = bracketed_ratios(&lives, &alones);
        let (mpps, alone, ratio) = (median(lives), median(alones), median(ratios));
        rows.push((n, mpps, alone, ratio, traps));
    }

    // Where the difference goes: both paths timed stage by stage on the
    // same trace, the live host over its steady window.
    let mut stage_rows: Vec<(String, f64, Value)> = Vec::new();
    for n in STAGE_TENANTS {
        let trace = dir.join(format!("vlans{n}.pcap"));
        write_trace(&trace, &tagged(frames, n))?;
        for (t, key) in tenants.iter().take(n).enumerate() {
            deploy(&cluster, key, &format!("fw{t}"), firewall_config, &format!("port=0,vlan={}", 100 + t))?;
        }
        let alone = crate::dpdk::host_report(host, &fw_path, &dir, &trace, &cpus, 1, 4_000_000, &["--stage-times"])?;
        let mpps = alone.get("mpps").and_then(Value::as_f64).unwrap_or(0.0);
        stage_rows.push((
            format!("`dpdk`, the firewall alone ({n} VLAN{})", if n > 1 { "s" } else { "" }),
            mpps,
            alone["stages"].clone(),
        ));
        let rep = dir.join(format!("live-stages-{n}.json"));
        let live = live_host.start_with(&trace, &rep, &format!("s{n}"), 1000, &["--stage-times"])?;
        let (mpps, _) = rate(&rep, Duration::from_millis(1500), 6)?;
        let stages = report(&rep).map(|r| r["stages"].clone()).unwrap_or(Value::Null);
        stage_rows.push((format!("`serve --dpdk`, {n} tenant{}", if n > 1 { "s" } else { "" }), mpps, stages));
        term(live);
        for (t, key) in tenants.iter().take(n).enumerate() {
            undeploy(&cluster, key, &format!("fw{t}"))?;
        }
    }

    let (run, first) = (median(running_ms), median(first_ms));
    let mut s = String::new();
    s.push_str("\n## Live host: tenants sharing a DPDK port (`serve --dpdk`)\n\n");
    s.push_str(&format!(
        "The control-plane cluster above with one `sluice-host serve --dpdk` (one worker on a CPU of its own) in a group whose operator exposes ports 0 and 1. \
         Traffic: 64-byte TCP frames replayed from memory by `net_pcap` into port 0 and sent to a discarding `net_null` port 1 (`--pairs`). \
         **Deploy → first packet**: `POST /v1/deployments` of the firewall attached to port 0 on a host already receiving traffic, until `GET` shows the host counted packets for it \
         (KV update, module fetch, compile from the code cache, an instance per worker, the classifier updated, packets, then the next status report — workers report every 50 ms, the host heartbeats every 20 ms here, so the figure includes up to ~70 ms of reporting); median of {DEPLOYS} after one warm-up. \
         **Throughput**: N tenants each deploy the firewall attached to their own VLAN (`port=0,vlan=100+i`), the frames carry those VLANs in turn; the host's rate is the packets its deployments ran between two of its reports ≥ 6 s apart (after 1.5 s of warm-up; nothing polls in between). \
         The baseline is `sluice-host dpdk --nf firewall` (the same NF alone, no classification) on the same trace and CPUs (4 M packets); the two alternate, {TENANT_ROUNDS} live rounds with a `dpdk` run before the first and after each, medians shown; **ratio** is the median of the rounds' ratios (each round's live rate over the mean of the two `dpdk` runs around it); target ≥ 0.9×.\n\n"
    ));
    s.push_str("| measurement | value |\n|---|---:|\n");
    s.push_str(&format!(
        "| deploy → running (live host) | {run:.0} ms |\n| deploy → first packet processed | {first:.0} ms |\n\n"
    ));
    s.push_str(
        "| tenants on the port | serve --dpdk Mpps | dpdk alone Mpps | ratio | traps |\n|---:|---:|---:|---:|---:|\n",
    );
    for (n, live, alone, ratio, traps) in rows {
        s.push_str(&format!("| {n} | {live:.2} | {alone:.2} | {ratio:.2} | {traps} |\n"));
    }
    s.push_str(
        "\n**Stage by stage** (`--stage-times` on both, one run each, the same traces; ns per packet; the live host's over its whole run, warm-up included; \
         **classify** is which deployment's lane each packet takes and the lanes' parts of the batch, **verdicts** includes the live host's checks of each lane's \
         results against its attachments, **between** the worker's loop between batches: commands, meter ticks, reports, peer state):\n\n",
    );
    s.push_str(&format!(
        "| path | Mpps | {} | total |\n|---|---:|{}---:|\n",
        STAGES.join(" | "),
        "---:|".repeat(STAGES.len())
    ));
    for (path, mpps, st) in &stage_rows {
        s.push_str(&format!("| {path} | {mpps:.2} |"));
        for k in STAGES {
            s.push_str(&format!(" {:.1} |", st[k].as_f64().unwrap_or(0.0)));
        }
        s.push_str(&format!(" {:.1} |\n", st["total"].as_f64().unwrap_or(0.0)));
    }
    Ok(s)
}

/// Packets per second of a live host between two of its reports `secs`
/// apart, after `warm` of warm-up; and the flows it replicated per second.
fn rate(rep: &Path, warm: Duration, secs: u64) -> Result<(f64, f64)> {
    rate_reports(rep, warm, secs).map(|(pps, fps, _)| (pps, fps))
}

/// [`rate`], with the two reports it was taken between.
fn rate_reports(rep: &Path, warm: Duration, secs: u64) -> Result<(f64, f64, (Value, Value))> {
    wait("the live host to run traffic", 60, || ran(rep).is_some_and(|(p, _)| p > 0))?;
    std::thread::sleep(warm);
    let sent = |r: &Value| r["peer"]["flows_sent"].as_u64().unwrap_or(0);
    let r0 = report(rep).context("no host report")?;
    let (p0, t0) = ran(rep).context("no host report")?;
    std::thread::sleep(Duration::from_secs(secs));
    let r1 = report(rep).context("no host report")?;
    let (p1, t1) = ran(rep).context("no host report")?;
    if t1 <= t0 {
        bail!("the live host wrote no report for {secs} s");
    }
    let ms = (t1 - t0) as f64;
    let fps = (sent(&r1).saturating_sub(sent(&r0))) as f64 / (ms / 1e3);
    Ok(((p1 - p0) as f64 / (ms * 1e3), fps, (r0, r1)))
}

/// What replicating flow state to a peer costs a live host: an NF on one
/// worker of a host in a two-host group, with `--replicate-us` 0 (off)
/// against on, alternating, on the same trace. The firewall, whose state
/// of a connection changes when it opens and closes, and the IDS, whose
/// state of a flow (its rules' stream matchers) changes with every packet.
pub fn replication_section(
    host: &Path,
    nfs: &Path,
    frames: &[Vec<u8>],
    firewall_config: &str,
    ids_config: &str,
) -> Result<String> {
    let fw = replication_runs(host, nfs, frames, "firewall", firewall_config)?;
    let ids = replication_runs(host, nfs, frames, "ids", ids_config)?;
    let flows: std::collections::HashSet<_> =
        frames.iter().filter_map(|f| sluice_wire::parse(f).key.map(|k| k.normalized())).collect();
    let mut s = String::new();
    s.push_str("\n## Peer state: what replication costs a host\n\n");
    s.push_str(&format!(
        "A group of two hosts under the control-plane cluster: the measured `sluice-host serve --dpdk` (one worker on a CPU of its own, the NF attached to port 0, \
         the DPDK section's 64-byte TCP trace of {} flows replayed from memory) and a second member, a live host whose ports receive nothing, so every flow has a next owner \
         that keeps replicas and answers commits. Each worker sends the state of the flows whose state changed every `--replicate-us` (`0`: off) or, with the \
         deployment's `durability = \"replicated\"` (output commit), after every batch, its packets of flows with a change not yet held waiting for the peer's answer; \
         rates between two host reports 6 s apart after 1.5 s of warm-up; the settings alternate, {ROUNDS} rounds each, medians shown. The firewall's state of a \
         connection changes when it opens and closes; the IDS's state of a flow (its stream matchers) changes with every packet. **vs periodic**: against \
         periodic replication at the same interval. **wait p50 / p99**: the time a packet's output was kept for its flow's change to be held (from the message's \
         sending to the peer's answer), upper bounds of quarter-octave buckets. Target: ≤ 10 % cost.\n\n",
        flows.len()
    ));
    s.push_str(
        "| NF | --replicate-us | durability | Mpps | vs off | vs periodic | flows replicated / s | packets that waited | wait p50 / p99 µs |\n\
         |---|---:|---|---:|---:|---:|---:|---:|---:|\n",
    );
    for (nf, runs) in [("firewall", fw), ("ids", ids)] {
        let base = runs.first().map(|r| median(r.mpps.clone())).unwrap_or(0.0);
        let periodic = |us: u64| runs.iter().find(|r| r.us == us && !r.replicated).map(|r| median(r.mpps.clone()));
        for r in &runs {
            let m = median(r.mpps.clone());
            let ratio = |b: f64| if b > 0.0 { m / b } else { 0.0 };
            let (waited, wait, vs_periodic) = if r.replicated {
                let (p50, p99) = (median(r.p50.clone()), median(r.p99.clone()));
                let wait = if p50 > 0.0 { format!("≤ {p50:.0} / ≤ {p99:.0}") } else { "none waited".to_string() };
                let vs = periodic(r.us).map_or("–".to_string(), |p| format!("{:.2}", ratio(p)));
                (format!("{:.1} %", 100.0 * median(r.waited.clone())), wait, vs)
            } else {
                ("–".to_string(), "–".to_string(), "–".to_string())
            };
            s.push_str(&format!(
                "| {nf} | {} | {} | {m:.2} | {:.2} | {vs_periodic} | {:.0} | {waited} | {wait} |\n",
                if r.us == 0 { "0 (off)".to_string() } else { r.us.to_string() },
                if r.replicated { "replicated" } else { "periodic" },
                ratio(base),
                median(r.sent.clone())
            ));
        }
    }
    Ok(s)
}

/// One setting's measurements, a value per round: Mpps, flows sent per
/// second; with output commit, the share of packets whose output waited
/// and the upper bounds of the waits' p50 and p99 (µs, see
/// [`sluice_peer::wait_quantile`]).
#[derive(Default)]
struct Setting {
    us: u64,
    replicated: bool,
    mpps: Vec<f64>,
    sent: Vec<f64>,
    waited: Vec<f64>,
    p50: Vec<f64>,
    p99: Vec<f64>,
}

/// A host report's peer counter `k`.
fn peer_count(r: &Value, k: &str) -> u64 {
    r["peer"][k].as_u64().unwrap_or(0)
}

/// Sets the deployment's durability (an update of the same chain).
fn set_durability(
    cluster: &Cluster,
    key: &str,
    name: &str,
    module: &str,
    config: &str,
    replicated: bool,
) -> Result<()> {
    let durability = if replicated { "replicated" } else { "periodic" };
    let (st, d) = call(
        agent().put(format!("{}/v1/deployments/{name}", cluster.base)).header("Authorization", key).send_json(
            json!({"group": "edge", "module": module, "config": config, "attach": ["port=0"], "durability": durability}),
        ),
    )?;
    if st != 200 {
        bail!("setting {name}'s durability: {st} {d}");
    }
    Ok(())
}

fn replication_runs(host: &Path, nfs: &Path, frames: &[Vec<u8>], nf: &str, config: &str) -> Result<Vec<Setting>> {
    const SETTINGS: [(u64, bool); 4] = [(0, false), (1000, false), (5000, false), (1000, true)];
    let cluster = Cluster::start(host, &format!("peer-{nf}"), "[groups.edge]\nports = [0, 1]\n")?;
    let dir = cluster.dir.clone();
    let cpus = sluice_engine::cores::CoreList::allowed()?.cores().to_vec();
    let module = std::fs::read(nfs.join(format!("{nf}.wasm"))).with_context(|| format!("{nf}.wasm (make nfs)"))?;
    let host_args = cluster.register_host("rep", "edge")?;
    let peer_args = cluster.register_host("peer", "edge")?;
    let (key, _) = cluster.tenant("tenant0", &["edge"])?;
    cluster.upload(&key, nf, "1", &module)?;
    deploy_module(&cluster, &key, nf, &format!("{nf}@1"), config, "port=0")?;
    // The other member of the group: a live host whose ports receive
    // nothing. It is in the table, so every flow of the measured host has
    // a next owner, which keeps the replicas (and answers output commits).
    let peer_cpu = cpus.first().copied().unwrap_or(0).to_string();
    let peer = Kill(
        Command::new(host)
            .env("SLUICE_CACHE_DIR", cluster.dir.join("cache"))
            .args(&peer_args)
            .args(["--group", "edge", "--heartbeat-ms", "200", "--dpdk", "--workers", "1"])
            .args(["--", "--no-huge", "--no-pci", "-m", "256", "-l", &peer_cpu, "--log-level=lib.eal:error"])
            .arg(format!("--file-prefix=sluice-bench-peer-{nf}-{}", std::process::id()))
            .args(["--vdev=net_null0,no-rx=1", "--vdev=net_null1,no-rx=1"])
            .stdout(cluster.log("peer.log")?)
            .stderr(cluster.log("peer.err")?)
            .spawn()
            .context("starting the peer host")?,
    );
    let trace = dir.join("trace.pcap");
    write_trace(&trace, frames)?;
    let live_host = LiveHost { host, cluster: &cluster, args: &host_args, cpus: &cpus };
    let mut runs: Vec<Setting> =
        SETTINGS.iter().map(|&(us, replicated)| Setting { us, replicated, ..Setting::default() }).collect();
    let mut replicated_now = false;
    for round in 0..ROUNDS {
        for r in runs.iter_mut() {
            let us = r.us;
            if r.replicated != replicated_now {
                set_durability(&cluster, &key, nf, &format!("{nf}@1"), config, r.replicated)?;
                replicated_now = r.replicated;
            }
            let tag = if r.replicated { "c" } else { "p" };
            let rep = dir.join(format!("rep-{us}{tag}-{round}.json"));
            let arg = us.to_string();
            let live =
                live_host.start_with(&trace, &rep, &format!("rep{us}{tag}r{round}"), 200, &["--replicate-us", &arg])?;
            if us > 0 {
                wait("the host to hold its group's table", 30, || {
                    report(&rep).is_some_and(|r| r["peer"]["table_version"].as_u64().is_some())
                })?;
            }
            let (pps, fps, (before, after)) = rate_reports(&rep, Duration::from_millis(1500), 6)?;
            r.mpps.push(pps);
            r.sent.push(fps);
            if r.replicated {
                let d = |k: &str| peer_count(&after, k).saturating_sub(peer_count(&before, k));
                let packets = |v: &Value| -> u64 {
                    v["deployments"]
                        .as_object()
                        .map_or(0, |m| m.values().map(|d| d["packets_in"].as_u64().unwrap_or(0)).sum())
                };
                let ran = packets(&after).saturating_sub(packets(&before)).max(1);
                r.waited.push(d("packets_deferred") as f64 / ran as f64);
                let hist = |v: &Value| -> Vec<u64> {
                    v["peer"]["commit_wait_us"]
                        .as_array()
                        .map(|a| a.iter().map(|x| x.as_u64().unwrap_or(0)).collect())
                        .unwrap_or_default()
                };
                let (h0, h1) = (hist(&before), hist(&after));
                let delta: Vec<u64> =
                    h1.iter().enumerate().map(|(i, n)| n.saturating_sub(h0.get(i).copied().unwrap_or(0))).collect();
                r.p50.push(sluice_peer::wait_quantile(&delta, 0.5) as f64);
                r.p99.push(sluice_peer::wait_quantile(&delta, 0.99) as f64);
            }
            term(live);
        }
    }
    drop(peer);
    Ok(runs)
}

/// What observability costs a live host: the firewall on one worker with
/// nothing collected, with Prometheus metrics (`--metrics-listen`, the
/// guest-time histogram per batch and the counters per window), and with
/// OTLP export of traces, metrics and logs to a real collector as well;
/// alternating, medians of the host's own rates.
pub fn telemetry_section(host: &Path, nfs: &Path, frames: &[Vec<u8>], firewall_config: &str) -> Result<String> {
    let cluster = Cluster::start(host, "telemetry", "[groups.edge]\nports = [0, 1]\n")?;
    let dir = cluster.dir.clone();
    let cpus = sluice_engine::cores::CoreList::allowed()?.cores().to_vec();
    let fw = std::fs::read(nfs.join("firewall.wasm")).context("firewall.wasm (make nfs)")?;
    let host_args = cluster.register_host("otel", "edge")?;
    let (key, _) = cluster.tenant("tenant0", &["edge"])?;
    cluster.upload(&key, "firewall", "1", &fw)?;
    deploy(&cluster, &key, "fw", firewall_config, "port=0")?;
    let trace = dir.join("trace.pcap");
    write_trace(&trace, frames)?;
    // The collector `make setup` builds (deploy/otel/builder.yaml).
    let gopath = Command::new("go").args(["env", "GOPATH"]).output().context("go env GOPATH")?;
    let otelcol = PathBuf::from(String::from_utf8_lossy(&gopath.stdout).trim()).join("bin/otelcol-sluice");
    let port = crate::control::free_port()?;
    let out = dir.join("otel");
    std::fs::create_dir_all(&out)?;
    let config = format!(
        "receivers:\n  otlp:\n    protocols:\n      http:\n        endpoint: 127.0.0.1:{port}\n\
         exporters:\n  file:\n    path: {}\n\
         service:\n  telemetry:\n    metrics:\n      level: none\n  pipelines:\n\
         \x20   traces: {{receivers: [otlp], exporters: [file]}}\n\
         \x20   metrics: {{receivers: [otlp], exporters: [file]}}\n\
         \x20   logs: {{receivers: [otlp], exporters: [file]}}\n",
        out.join("all.jsonl").display()
    );
    std::fs::write(dir.join("collector.yaml"), config)?;
    let collector = Kill(
        Command::new(&otelcol)
            .arg("--config")
            .arg(dir.join("collector.yaml"))
            .stdout(cluster.log("collector.log")?)
            .stderr(cluster.log("collector.err")?)
            .spawn()
            .with_context(|| format!("starting {} (make setup builds it)", otelcol.display()))?,
    );
    let metrics_port = crate::control::free_port()?.to_string();
    let listen = format!("127.0.0.1:{metrics_port}");
    let otlp = vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://127.0.0.1:{port}")),
        ("OTEL_METRIC_EXPORT_INTERVAL", "5000".to_string()),
    ];
    // (name, serve arguments, environment)
    type Setting<'a> = (&'a str, Vec<&'a str>, Vec<(&'a str, String)>);
    let settings: [Setting<'_>; 3] = [
        ("off", vec![], vec![]),
        ("Prometheus (`--metrics-listen`)", vec!["--metrics-listen", &listen], vec![]),
        ("OTLP export + Prometheus", vec!["--metrics-listen", &listen], otlp),
    ];
    let live_host = LiveHost { host, cluster: &cluster, args: &host_args, cpus: &cpus };
    let mut mpps: Vec<Vec<f64>> = vec![Vec::new(); settings.len()];
    for round in 0..ROUNDS {
        for (i, (_, args, env)) in settings.iter().enumerate() {
            let rep = dir.join(format!("otel-{i}-{round}.json"));
            let live = live_host.start_env(&trace, &rep, &format!("otel{i}r{round}"), 200, args, env)?;
            let (pps, _) = rate(&rep, Duration::from_millis(1500), 6)?;
            if let Some(m) = mpps.get_mut(i) {
                m.push(pps);
            }
            term(live);
        }
    }
    drop(collector);
    let exported = std::fs::metadata(out.join("all.jsonl")).map(|m| m.len()).unwrap_or(0);
    let mut s = String::new();
    s.push_str("\n## Observability: what collecting metrics and exporting OTLP costs a host\n\n");
    s.push_str(&format!(
        "The control-plane cluster above with one `sluice-host serve --dpdk` (one worker on a CPU of its own) running the firewall attached to port 0, \
         the DPDK section's 64-byte TCP trace replayed from memory; rates between two host reports 6 s apart after 1.5 s of warm-up; \
         the settings alternate, {ROUNDS} rounds each, medians shown. **off**: no `OTEL_*` variable, no `--metrics-listen` (nothing is collected). \
         **Prometheus**: the metrics are collected (counters per meter window, the guest-time histogram per batch) and served. \
         **OTLP**: the same, and traces, metrics (every 5 s) and logs exported to an OpenTelemetry Collector on the machine \
         ({exported} bytes written by its file exporter). Target ≥ 0.97×.\n\n"
    ));
    s.push_str("| setting | Mpps | vs off |\n|---|---:|---:|\n");
    let base = mpps.first().map(|m| median(m.clone())).unwrap_or(0.0);
    for ((name, _, _), m) in settings.iter().zip(mpps) {
        let m = median(m);
        s.push_str(&format!("| {name} | {m:.2} | {:.2} |\n", if base > 0.0 { m / base } else { 0.0 }));
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_round_is_measured_against_the_baseline_runs_around_it() {
        // A machine that speeds up during the section: the rounds' live
        // rates are 0.9 of the baseline around each.
        let alones = [2.0, 2.0, 3.0, 3.0];
        let lives = [1.8, 2.25, 2.7];
        let r = bracketed_ratios(&lives, &alones);
        assert_eq!(r.len(), 3);
        for x in r {
            assert!((x - 0.9).abs() < 1e-9, "{x}");
        }
        // A failed baseline run gives no ratio rather than infinity.
        assert_eq!(bracketed_ratios(&[1.0], &[0.0, 0.0]), vec![0.0]);
    }
}
