//! An elastic group under live traffic (SNF §6, S6 §5): what moving flows
//! between hosts costs the traffic, measured on the packets themselves.
//!
//! Real processes, as an operator runs them: the control-plane cluster
//! (nats-server, gateway), four `sluice-host serve --dpdk` hosts with the
//! stateful firewall attached (`net_memif` links from the dispatcher, the
//! output written by `net_pcap`), the flowlet dispatcher
//! (`sluice-host steer`) taking a veth pair with `net_af_packet`, a paced
//! sender (`tests/tools/paced-send.py`) on the pair's other end, and each
//! host's output port a veth pair (`net_af_packet`) whose other ends a
//! receiver reads (`tests/tools/paced-recv.py`, kernel receive
//! timestamps). Every frame is unique, so each one's latency (when it
//! left its host against when it was due at the sender, one clock) and
//! whether it was lost are known.
//!
//! Two runs:
//! - **replicating** (the defaults): 240 connections, a packet every 25 ms
//!   each; a standby host joins at 1.5 s, one is drained at 3 s, one is
//!   killed (`kill -9`) at 4.5 s.
//! - **pulling**: proactive replication slowed to a minute, three hosts;
//!   one is drained at 1.5 s, so every moved flow's state is pulled from
//!   the drained host while its packets wait.
//!
//! Needs root and iproute2 (the veth pair), python3, and the DPDK `memif`,
//! `af_packet` and `pcap` drivers.

// Reports are `serde_json::Value`s, whose `Index<&str>` yields `Null` for
// a missing key instead of panicking.
#![allow(clippy::indexing_slicing)]

use crate::control::{ADMIN, Cluster, Kill, agent, call, wait};
use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use sluice_wire::build::FrameSpec;
use sluice_wire::tcp::flags;
use std::collections::HashMap;
use std::io::BufRead;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const SENDER: &str = include_str!("../../../tests/tools/paced-send.py");
const RECEIVER: &str = include_str!("../../../tests/tools/paced-recv.py");
/// Clients of 10.0.0.0/8 may open connections to port 80; a server's
/// packet passes only where its connection's state is.
const FIREWALL: &str =
    r#"{"default":"deny","rules":[{"action":"allow","proto":"tcp","src":"10.0.0.0/8","dst-ports":"80"}]}"#;
const CONNS: u32 = 240;
const SECS: f64 = 8.0;
/// Each connection sends a packet every this long, by turns each way.
const EVERY: f64 = 0.025;
const SILENCE_MS: u64 = 1500;
/// The dispatcher treats a host as gone when it heard no liveness beacon
/// from it for this long (hosts send one every [`BEACON_US`]).
const LIVENESS_MS: u64 = 10;
const BEACON_US: u64 = 1000;

/// A veth pair (removed on drop).
struct Veth {
    a: String,
    b: String,
}

impl Veth {
    fn new(tag: &str) -> Result<Veth> {
        let id = std::process::id() % 100_000;
        let v = Veth { a: format!("sle{id}{tag}a"), b: format!("sle{id}{tag}b") };
        // A pair left by an earlier run that was killed.
        let _ = Command::new("ip").args(["link", "del", &v.a]).output();
        let ip = |args: &[&str]| -> Result<()> {
            let o = Command::new("ip").args(args).output().context("`ip` (iproute2) is needed for a veth pair")?;
            if !o.status.success() {
                bail!("ip {args:?}: {} (a veth pair needs root)", String::from_utf8_lossy(&o.stderr).trim());
            }
            Ok(())
        };
        ip(&["link", "add", &v.a, "type", "veth", "peer", "name", &v.b])?;
        for n in [&v.a, &v.b] {
            let _ = Command::new("sysctl").args(["-qw", &format!("net.ipv6.conf.{n}.disable_ipv6=1")]).output();
            ip(&["link", "set", n, "up"])?;
        }
        Ok(v)
    }
}

impl Drop for Veth {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "del", &self.a]).output();
    }
}

/// One frame of the schedule.
struct Frame {
    due: f64,
    bytes: Vec<u8>,
    flow: u32,
}

fn schedule() -> Vec<Frame> {
    let server = [192, 0, 2, 1];
    let mut v = Vec::new();
    for i in 0..CONNS {
        let client = [10, 4, (i / 200) as u8, (i % 200) as u8 + 1];
        let port = 30000 + i as u16;
        let mut t = f64::from(i) / f64::from(CONNS);
        let mut seq = 0u32;
        while t < SECS {
            let from_server = seq % 2 == 1;
            let f = match (seq, from_server) {
                (0, _) => FrameSpec::tcp4(client, port, server, 80, flags::SYN),
                (_, true) => FrameSpec::tcp4(server, 80, client, port, flags::ACK),
                (_, false) => FrameSpec::tcp4(client, port, server, 80, flags::ACK),
            };
            let payload = [i.to_be_bytes(), seq.to_be_bytes()].concat();
            v.push(Frame { due: t, bytes: f.with_payload(payload).build(), flow: i });
            seq += 1;
            t += EVERY;
        }
    }
    v.sort_by(|a, b| a.due.total_cmp(&b.due));
    v
}

fn now_s() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

fn report(path: &Path) -> Value {
    std::fs::read(path).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or(Value::Null)
}

/// The group's hosts that hold a share of its table, and its version.
fn table(cluster: &Cluster) -> (u64, Vec<String>) {
    let r = call(
        agent()
            .get(format!("{}/v1/groups/edge", cluster.base))
            .header("Authorization", format!("Bearer {ADMIN}"))
            .call(),
    )
    .map(|(_, v)| v)
    .unwrap_or(Value::Null);
    let mut hosts: Vec<String> = r["members"]
        .as_array()
        .map(|m| {
            m.iter()
                .filter(|m| m["share"].as_f64().is_some_and(|s| s > 0.0))
                .filter_map(|m| m["host"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    hosts.sort();
    (r["table_version"].as_u64().unwrap_or(0), hosts)
}

/// Waits for a table newer than `after` of exactly `hosts`; its version.
fn wait_table(cluster: &Cluster, after: u64, hosts: &[&str]) -> Result<u64> {
    let mut version = 0;
    wait(&format!("a table of {hosts:?}"), 30, || {
        let (v, h) = table(cluster);
        version = v;
        v > after && h == hosts
    })?;
    Ok(version)
}

fn drain(cluster: &Cluster, host: &str, on: bool) -> Result<()> {
    let url = format!("{}/v1/groups/edge/hosts/{host}/drain", cluster.base);
    let (st, v) = if on {
        call(agent().post(url).header("Authorization", format!("Bearer {ADMIN}")).send_json(json!({})))?
    } else {
        call(agent().delete(url).header("Authorization", format!("Bearer {ADMIN}")).call())?
    };
    if st >= 300 {
        bail!("drain {host} {on}: {st} {v}");
    }
    Ok(())
}

/// What one run found.
struct Run {
    frames: Vec<Frame>,
    /// Per frame: output timestamp (s since the epoch) and host, once each.
    out: Vec<Vec<(f64, usize)>>,
    /// Wall time the schedule counts from.
    t0: f64,
    peers: Vec<Value>,
    steer: Value,
    /// When the controller's table dropped the killed host (wall time).
    killed_out: Option<f64>,
}

/// Runs the schedule through a group of `hosts` (with `extra` host
/// arguments); `act` makes the events at their times and returns them.
fn run(
    host: &Path,
    nfs: &Path,
    tag: &str,
    hosts: &[&str],
    extra: &[&str],
    act: impl FnOnce(&Cluster, &mut Vec<Kill>, f64) -> Result<Option<f64>>,
) -> Result<Run> {
    let gateway_toml = format!("host-silence-ms = {SILENCE_MS}\n[groups.edge]\nports = [0, 1]\n");
    let cluster = Cluster::start(host, &format!("elastic-{tag}"), &gateway_toml)?;
    let dir = cluster.dir.clone();
    let veth = Veth::new(tag)?;
    let outs: Vec<Veth> = (0..hosts.len()).map(|i| Veth::new(&format!("{tag}{i}"))).collect::<Result<_>>()?;
    let mut receiver = Command::new("python3")
        .args(["-c", RECEIVER])
        .arg(dir.join("received.bin"))
        .args(outs.iter().map(|v| &v.b))
        .stdout(Stdio::piped())
        .spawn()
        .context("python3 is needed for the receiver")?;
    let mut received = std::io::BufReader::new(receiver.stdout.take().context("receiver output")?).lines();
    if received.next().transpose()?.as_deref() != Some("ready") {
        bail!("the receiver did not start");
    }
    let cpus = sluice_engine::cores::CoreList::allowed()?.cores().to_vec();
    let cpu = |i: usize| cpus.get(i % cpus.len().max(1)).copied().unwrap_or(0).to_string();
    let mut procs = Vec::new();
    for (i, h) in hosts.iter().enumerate() {
        let args = cluster.register_host(h, "edge")?;
        let child = Command::new(host)
            .env("SLUICE_CACHE_DIR", dir.join("cache"))
            .args(&args)
            .args(["--group", "edge", "--dpdk", "--workers", "1", "--window-ms", "200", "--heartbeat-ms", "300"])
            .args(["--capacity-pps", "1000", "--beacon", "0", "--beacon-us", &BEACON_US.to_string(), "--report"])
            .arg(dir.join(format!("{h}.json")))
            .args(extra)
            .args(["--", "--no-huge", "--no-pci", "-m", "256", "-l", &cpu(i + 1), "--log-level=lib.eal:error"])
            .arg(format!("--file-prefix=sluice-bench-{}-{h}", std::process::id()))
            .arg(format!("--vdev=net_memif0,role=server,socket={}", dir.join(format!("{h}.sock")).display()))
            .arg(format!("--vdev=net_af_packet1,iface={}", outs.get(i).map_or("", |v| v.a.as_str())))
            .stdout(cluster.log(&format!("{h}.log"))?)
            .stderr(cluster.log(&format!("{h}.err"))?)
            .spawn()
            .with_context(|| format!("starting host {h}"))?;
        procs.push(Kill(child));
    }
    let (key, _) = cluster.tenant("acme", &["edge"])?;
    cluster.upload(&key, "firewall", "1", &std::fs::read(nfs.join("firewall.wasm")).context("firewall.wasm")?)?;
    let (st, d) = call(agent().post(format!("{}/v1/deployments", cluster.base)).header("Authorization", &key).send_json(
        json!({"name": "fw", "group": "edge", "module": "firewall@1", "config": FIREWALL, "attach": ["port=0,out=1"]}),
    ))?;
    if st != 201 {
        bail!("deploying the firewall: {st} {d}");
    }
    wait("the firewall to run", 60, || {
        call(agent().get(format!("{}/v1/deployments/fw", cluster.base)).header("Authorization", &key).call())
            .is_ok_and(|(_, d)| d["status"] == "running")
    })?;
    let mut all: Vec<&str> = hosts.to_vec();
    all.sort_unstable();
    let version = wait_table(&cluster, 0, &all)?;
    // A standby host, when the run has four.
    let version = if hosts.len() == 4 {
        drain(&cluster, "h4", true)?;
        wait_table(&cluster, version, &["h1", "h2", "h3"])?
    } else {
        version
    };
    let steer_args = cluster.register_dispatcher("d1", "edge")?;
    let steer_report = dir.join("steer.json");
    let mut steer = Command::new(host);
    steer
        .args(&steer_args)
        .args(["--group", "edge", "--ingress", "0", "--workers", "1", "--batch", "32", "--idle-exit-ms", "3000"])
        .args(["--tx-retry-us", "50000", "--liveness-ms", &LIVENESS_MS.to_string(), "--report"])
        .arg(&steer_report);
    for (i, h) in hosts.iter().enumerate() {
        steer.args(["--to", &format!("{h}={}", i + 1)]);
    }
    steer
        .args(["--", "--no-huge", "--no-pci", "-m", "512", "-l", &cpu(0), "--log-level=lib.eal:error"])
        .arg(format!("--file-prefix=sluice-bench-{}-d1", std::process::id()))
        .arg(format!("--vdev=net_af_packet0,iface={}", veth.a));
    for (i, h) in hosts.iter().enumerate() {
        steer.arg(format!("--vdev=net_memif{},role=client,socket={}", i + 1, dir.join(format!("{h}.sock")).display()));
    }
    let steer = Kill(
        steer
            .stdout(cluster.log("steer.log")?)
            .stderr(cluster.log("steer.err")?)
            .spawn()
            .context("starting the dispatcher")?,
    );
    wait("the dispatcher to steer by the table", 30, || {
        report(&steer_report)["table_version"].as_u64() == Some(version)
    })?;

    let frames = schedule();
    let mut file = Vec::new();
    for f in &frames {
        file.extend_from_slice(&((f.due * 1e6) as u64).to_le_bytes());
        file.extend_from_slice(&(f.bytes.len() as u32).to_le_bytes());
        file.extend_from_slice(&f.bytes);
    }
    std::fs::write(dir.join("schedule.bin"), file)?;
    let mut sender = Command::new("python3")
        .args(["-c", SENDER])
        .arg(dir.join("schedule.bin"))
        .arg(&veth.b)
        .stdout(Stdio::piped())
        .spawn()
        .context("python3 is needed for the paced sender")?;
    let mut lines = std::io::BufReader::new(sender.stdout.take().context("sender output")?).lines();
    let start = lines.next().transpose()?.unwrap_or_default();
    let t0: f64 = start.strip_prefix("start ").and_then(|s| s.parse().ok()).context("the sender did not start")?;
    let killed_out = act(&cluster, &mut procs, t0)?;
    let done = lines.next().transpose()?.unwrap_or_default();
    sender.wait()?;
    eprintln!("{tag}: sender {done}");
    let mut steer = steer;
    steer.0.wait()?;
    // The hosts report; the receiver writes what it got.
    std::thread::sleep(Duration::from_millis(1500));
    let peers: Vec<Value> = hosts.iter().map(|h| report(&dir.join(format!("{h}.json")))["peer"].clone()).collect();
    Command::new("kill").args(["-TERM", &receiver.id().to_string()]).status()?;
    let done = received.next().transpose()?.unwrap_or_default();
    receiver.wait()?;
    eprintln!("{tag}: receiver {done}");
    let index: HashMap<&[u8], usize> = frames.iter().enumerate().map(|(i, f)| (f.bytes.as_slice(), i)).collect();
    let mut out = vec![Vec::new(); frames.len()];
    let bytes = std::fs::read(dir.join("received.bin")).context("the receiver's record")?;
    let mut rest = bytes.as_slice();
    // (arrival ns, interface = host index, length, bytes) each.
    while let (Some(ns), Some(which), Some(len)) = (rest.get(..8), rest.get(8..12), rest.get(12..16)) {
        let ns = u64::from_le_bytes(ns.try_into()?);
        let which = u32::from_le_bytes(which.try_into()?) as usize;
        let len = u32::from_le_bytes(len.try_into()?) as usize;
        let Some(frame) = rest.get(16..16 + len) else { break };
        if let Some(&i) = index.get(frame)
            && let Some(o) = out.get_mut(i)
        {
            o.push((ns as f64 / 1e9, which));
        }
        rest = rest.get(16 + len..).unwrap_or_default();
    }
    let steer = report(&steer_report);
    drop(procs);
    Ok(Run { frames, out, t0, peers, steer, killed_out })
}

/// Sleeps until `secs` after the schedule's start.
fn at(t0: f64, secs: f64) {
    let d = t0 + secs - now_s();
    if d > 0.0 {
        std::thread::sleep(Duration::from_secs_f64(d));
    }
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v.get(i).copied().unwrap_or(0.0)
}

/// Latency and loss of the frames due in [from, to) s: a table row.
fn window(r: &Run, name: &str, from: f64, to: f64) -> String {
    let mut lat = Vec::new();
    let (mut sent, mut lost, mut twice) = (0u64, 0u64, 0u64);
    for (f, o) in r.frames.iter().zip(&r.out) {
        if f.due < from || f.due >= to {
            continue;
        }
        sent += 1;
        match o.as_slice() {
            [] => lost += 1,
            [(ts, _)] => lat.push((ts - (r.t0 + f.due)) * 1e3),
            _ => twice += 1,
        }
    }
    let max = lat.iter().copied().fold(0.0, f64::max);
    format!(
        "| {name} | {from:.1}–{to:.1} s | {sent} | {lost} | {twice} | {:.2} | {:.2} | {max:.2} |\n",
        percentile(&mut lat, 0.5),
        percentile(&mut lat, 0.99)
    )
}

fn sum(peers: &[Value], k: &str) -> u64 {
    peers.iter().map(|p| p[k].as_u64().unwrap_or(0)).sum()
}

/// The Markdown section.
pub fn section(host: &Path, nfs: &Path) -> Result<String> {
    let mut killed_at = 0.0;
    let four = ["h1", "h2", "h3", "h4"];
    let rep = run(host, nfs, "r", &four, &[], |cluster, procs, t0| {
        at(t0, 1.5);
        drain(cluster, "h4", false)?;
        at(t0, 3.0);
        drain(cluster, "h3", true)?;
        at(t0, 4.5);
        killed_at = now_s();
        if let Some(k) = procs.get_mut(1) {
            k.0.kill()?;
        }
        let (before, _) = table(cluster);
        wait_table(cluster, before, &["h1", "h4"])?;
        Ok(Some(now_s()))
    })?;
    let kill = failover(&rep, killed_at, 1, "h2");
    // Run 2 twice: pulls through NATS, then on the hosts' peer links.
    let drained = |tag: &str, extra: &[&str]| {
        let mut args = vec!["--replicate-us", "60000000", "--pull-wait-us", "20000"];
        args.extend_from_slice(extra);
        run(host, nfs, tag, &["h1", "h2", "h3"], &args, |cluster, _, t0| {
            at(t0, 1.5);
            drain(cluster, "h3", true)?;
            Ok(None)
        })
    };
    let by_bus = drained("p", &[])?;
    let pulled = drained("l", &["--peer-link", "127.0.0.1:0"])?;

    let moved = sum(&rep.peers, "flowlets_moved_in");
    let with = sum(&rep.peers, "moved_with_state");
    let mut s = String::new();
    s.push_str("\n## Elastic group under live traffic: scale-out, drain, failover, pulls\n\n");
    s.push_str(&format!(
        "The stateful firewall on `serve --dpdk` hosts behind the flowlet dispatcher, under the control-plane cluster (silence bound {SILENCE_MS} ms); \
         {CONNS} TCP connections, each sending a unique frame every {:.0} ms by turns each way ({:.0} frames/s) for {SECS:.0} s from a paced sender on a veth pair \
         (`net_af_packet`) into the dispatcher, `net_memif` links to the hosts; each process on its own CPU where the machine has enough, else sharing. \
         Each host's output port is a veth pair (`net_af_packet`) read by a receiver: a frame's latency is its kernel receive timestamp there against the \
         moment it was due at the sender (one clock), through python, a veth pair, the dispatcher, a memif link, the host, its NF and a second veth pair. \
         A frame passes only where its connection's state is, so a lost server frame after a move is lost state. Run `sluice-bench --elastic-only --host target/release/sluice-host` (root).\n\n",
        EVERY * 1e3,
        f64::from(CONNS) / EVERY
    ));
    s.push_str("**Run 1: standby host joins, a host is drained, a host is killed** (replication every 1 ms)\n\n");
    s.push_str("| window | due | frames | lost | twice | p50 ms | p99 ms | max ms |\n|---|---|---:|---:|---:|---:|---:|---:|\n");
    s.push_str(&window(&rep, "steady, 3 hosts", 0.5, 1.5));
    s.push_str(&window(&rep, "h4 joins (3 → 4)", 1.5, 3.0));
    // The kill at 4.5 s loses what h2 held: frames due a little before.
    s.push_str(&window(&rep, "h3 drained (4 → 3)", 3.0, 4.4));
    s.push_str(&window(&rep, "h2 killed at 4.5 s", 4.4, 6.0));
    s.push_str(&window(&rep, "after", 6.0, SECS));
    s.push_str(&format!(
        "\nMoved flowlets that started without waiting for state: **{with} of {moved}** ({:.1} %; SNF: 90.43 %, target ≥ 95 %). \
         The controller's table dropped h2 {:.2} s after the kill. The dispatcher's report of the kill (its link to h2 down): {} packets sent to h2 in the \
         20 ms before (what could be lost with it), {} flowlets moved away since; flowlets moved away from h2 over the run {}, from h3 {}.\n\n",
        if moved > 0 { with as f64 * 100.0 / moved as f64 } else { 0.0 },
        rep.killed_out.map_or(0.0, |t| t - killed_at),
        link_down(&rep.steer, "h2", "sent_before"),
        link_down(&rep.steer, "h2", "flowlets_moved"),
        host_count(&rep.steer, "h2", "moved_away"),
        host_count(&rep.steer, "h3", "moved_away"),
    ));
    s.push_str(&kill.markdown());
    s.push_str(
        "**Run 2: a host drained with proactive replication slowed to 60 s** (every moved flow's state pulled; \
         `--pull-wait-us 20000`; the hosts run with `--peer-link 127.0.0.1:0`: a pull's request and answer are one \
         datagram each way; the same run through NATS follows the table)\n\n",
    );
    s.push_str("| window | due | frames | lost | twice | p50 ms | p99 ms | max ms |\n|---|---|---:|---:|---:|---:|---:|---:|\n");
    s.push_str(&window(&pulled, "steady, 3 hosts", 0.5, 1.5));
    s.push_str(&window(&pulled, "h3 drained", 1.5, 3.0));
    s.push_str(&window(&pulled, "after", 3.0, SECS));
    s.push_str(&format!("\n{}", pulls(&pulled, "on the peer links")));
    s.push_str(&format!("\nThe same run through NATS (no `--peer-link`): {}", pulls(&by_bus, "through NATS")));
    Ok(s)
}

/// What a drained host's pulls did in run `r`, sent `way`.
fn pulls(r: &Run, way: &str) -> String {
    let waited = sum(&r.peers, "moved_waited");
    // The hosts' wait histograms, added.
    let mut waits: Vec<u64> = Vec::new();
    for p in &r.peers {
        for (i, n) in p["wait_us"].as_array().into_iter().flatten().enumerate() {
            if waits.len() <= i {
                waits.resize(i + 1, 0);
            }
            if let Some(w) = waits.get_mut(i) {
                *w += n.as_u64().unwrap_or(0);
            }
        }
    }
    format!(
        "Moved flowlets that waited for their state: {waited}; state arrived for {}, h3 held none for {}, timed out {} (state that came later imported for {}); \
         state-recovery time (the wait: request, answer, import; {way}) **{:.0} µs on average**, {} µs at most \
         (median under {} µs, 90 % under {} µs; SNF: 140 µs on bare metal for its output logger), of which {:.0} µs on average on h3, from a request's arrival to its answer \
         ({} requests; the rest is the way both ways and the import); {} packets held while waiting, {} dropped over the hold bounds; \
         peer-link datagrams sent {}, received {}, refused {}.\n",
        sum(&r.peers, "waits_with_state"),
        sum(&r.peers, "waits_not_held"),
        sum(&r.peers, "waits_timed_out"),
        sum(&r.peers, "late_state_imported"),
        sum(&r.peers, "wait_us_total") as f64 / waited.max(1) as f64,
        r.peers.iter().map(|p| p["wait_us_max"].as_u64().unwrap_or(0)).max().unwrap_or(0),
        sluice_peer::wait_quantile(&waits, 0.5),
        sluice_peer::wait_quantile(&waits, 0.9),
        sum(&r.peers, "pull_answer_us_total") as f64 / sum(&r.peers, "pulls_answered").max(1) as f64,
        sum(&r.peers, "pulls_answered"),
        sum(&r.peers, "packets_held"),
        sum(&r.peers, "packets_held_dropped"),
        sum(&r.peers, "link_sent"),
        sum(&r.peers, "link_received"),
        sum(&r.peers, "link_refused"),
    )
}

/// What a kill did to the killed host's flows: a flow is the dead host's
/// when its last frame out before the kill came out of that host.
struct Failover {
    /// The dead host's flows.
    flows: usize,
    /// Per flow that came out of another host after the kill: seconds
    /// from the kill to its first frame out there.
    recovered: Vec<f64>,
    /// Per such first frame: its latency (out against due), seconds.
    first_latency: Vec<f64>,
    /// Per flow: seconds from the kill until it ran elsewhere: the
    /// dispatcher's detection when the flow's first frame due after it
    /// came out of another host, else the due time of its first frame
    /// that did (frames lost after detection count against it).
    ready: Vec<f64>,
    /// Of those, flows whose first frame due after detection was lost.
    lost_after_detection: usize,
    /// Why the dispatcher took the host's link down (`link`, `beacons`).
    cause: String,
    /// Down events of the other hosts' links (live hosts taken for dead):
    /// host, seconds into the schedule, cause.
    false_downs: Vec<String>,
    /// Flows with no frame out of another host after the kill.
    not_recovered: usize,
    /// Frames of its flows lost since each flow's last frame out before
    /// the kill: their due times against the kill, seconds.
    lost_due: Vec<f64>,
    /// Seconds from the kill to the dispatcher's link-down event for the
    /// host, and to the dispatcher's first table without it.
    detected: Option<f64>,
    table: Option<f64>,
}

/// [`Failover`] of host index `dead` (named `name` in the dispatcher's
/// report), killed at wall time `killed_at`.
fn failover(r: &Run, killed_at: f64, dead: usize, name: &str) -> Failover {
    let frames_of = |flow: u32| r.frames.iter().zip(&r.out).filter(move |(f, _)| f.flow == flow);
    let mut flows: Vec<u32> = r.frames.iter().map(|f| f.flow).collect();
    flows.sort_unstable();
    flows.dedup();
    let mut out = Failover {
        flows: 0,
        recovered: Vec::new(),
        first_latency: Vec::new(),
        ready: Vec::new(),
        lost_after_detection: 0,
        cause: r.steer["links"]
            .as_array()
            .and_then(|l| l.iter().rev().find(|x| x["host"] == name && x["up"] == false))
            .and_then(|x| x["cause"].as_str())
            .unwrap_or("")
            .to_string(),
        false_downs: r.steer["links"].as_array().map_or(Vec::new(), |l| {
            l.iter()
                .filter(|x| x["host"] != name && x["up"] == false)
                .map(|x| {
                    let at = x["at_unix_us"].as_u64().map_or(0.0, |us| us as f64 / 1e6 - r.t0);
                    format!("{} at {at:.2} s ({})", x["host"].as_str().unwrap_or(""), x["cause"].as_str().unwrap_or(""))
                })
                .collect()
        }),
        not_recovered: 0,
        lost_due: Vec::new(),
        detected: link_down_at(&r.steer, name).map(|t| t - killed_at),
        table: table_without_at(&r.steer, name).map(|t| t - killed_at),
    };
    for flow in flows {
        // Its last frame out before the kill: where, and which frame.
        let last = frames_of(flow)
            .enumerate()
            .flat_map(|(i, (_, o))| o.iter().map(move |&(ts, h)| (ts, h, i)))
            .filter(|&(ts, _, _)| ts < killed_at)
            .max_by(|a, b| a.0.total_cmp(&b.0));
        let Some((_, host, last_i)) = last else { continue };
        if host != dead {
            continue;
        }
        out.flows += 1;
        let first = frames_of(flow)
            .flat_map(|(f, o)| o.iter().map(move |&(ts, h)| (ts, h, f.due)))
            .filter(|&(ts, h, _)| h != dead && ts >= killed_at)
            .min_by(|a, b| a.0.total_cmp(&b.0));
        match first {
            Some((ts, _, due)) => {
                out.recovered.push(ts - killed_at);
                out.first_latency.push(ts - (r.t0 + due));
            }
            None => out.not_recovered += 1,
        }
        for (_, (f, o)) in frames_of(flow).enumerate().filter(|&(i, _)| i > last_i) {
            if o.is_empty() {
                out.lost_due.push(r.t0 + f.due - killed_at);
            }
        }
        if let Some(detected) = out.detected {
            let after: Vec<(f64, bool)> = frames_of(flow)
                .map(|(f, o)| (r.t0 + f.due - killed_at, o.iter().any(|&(_, h)| h != dead)))
                .filter(|&(due, _)| due >= detected)
                .collect();
            match after.first() {
                Some(&(_, true)) => out.ready.push(detected),
                Some(_) => {
                    out.lost_after_detection += 1;
                    if let Some(&(due, _)) = after.iter().find(|&&(_, elsewhere)| elsewhere) {
                        out.ready.push(due);
                    }
                }
                None => {}
            }
        }
    }
    out
}

impl Failover {
    fn markdown(&self) -> String {
        let ms = |v: Option<f64>| v.map_or("not seen".to_string(), |t| format!("{:.1} ms", t * 1e3));
        let mut rec = self.recovered.clone();
        let mut lat = self.first_latency.clone();
        let lost = self.lost_due.len();
        let (lo, hi) = self.lost_due.iter().fold((f64::MAX, f64::MIN), |(a, b), &t| (a.min(t), b.max(t)));
        let split = |from: Option<f64>, to: Option<f64>| {
            self.lost_due.iter().filter(|&&t| from.is_none_or(|f| t >= f) && to.is_none_or(|e| t < e)).count()
        };
        let before_detection = split(None, self.detected);
        let before_table = split(self.detected, self.table.filter(|_| self.detected.is_some()));
        let after = lost - before_detection - before_table;
        let mut ready = self.ready.clone();
        let ready_line = format!(
            "**Every flow of h2 ran elsewhere {:.1} ms after the kill at the median, {:.1} ms at p99, {:.1} ms at most** ({} flows; a flow runs elsewhere from the \
             dispatcher's detection when its first frame due after it came out of another host, which held for {} of them, else from the due time of its first \
             frame that did). The dispatcher took h2's link down for `{}` ({}); links of live hosts taken down over the run: {}.\n\n",
            percentile(&mut ready, 0.5) * 1e3,
            percentile(&mut ready, 0.99) * 1e3,
            ready.last().copied().unwrap_or(0.0) * 1e3,
            self.ready.len(),
            self.ready.len() - self.lost_after_detection.min(self.ready.len()),
            self.cause,
            if self.cause == "beacons" {
                format!("no liveness beacon for {LIVENESS_MS} ms; hosts send one every {} ms", BEACON_US / 1000)
            } else {
                "its memif link went down before the beacons' bound passed".to_string()
            },
            if self.false_downs.is_empty() { "none".to_string() } else { self.false_downs.join(", ") },
        );
        ready_line
            + &format!(
                "**The kill of h2**, measured on its flows (a flow is h2's when its last frame out before the kill came out of h2: {} connections). \
             Time from the kill until each came out of another host: p50 **{:.1} ms**, p99 **{:.1} ms**, max **{:.1} ms** over the {} that did ({} never did); \
             those first frames' latency against when they were due: p50 {:.1} ms, p99 {:.1} ms (a connection sends a frame every {:.0} ms by turns each way, \
             so a flow's first frame after the kill is due up to {:.0} ms later). The dispatcher saw h2's link go down {} after the kill and steered by a table \
             without h2 {} after it. Frames of h2's flows lost (after each flow's last frame out before the kill): **{lost}**, due from {:.1} ms to {:.1} ms \
             after the kill: {before_detection} due before the dispatcher saw the link down (sent to h2, in flight or queued there), \
             {before_table} due between that and the table change, {after} due after both (lost in the move: state, queues).\n\n",
                self.flows,
                percentile(&mut rec, 0.5) * 1e3,
                percentile(&mut rec, 0.99) * 1e3,
                rec.last().copied().unwrap_or(0.0) * 1e3,
                self.recovered.len(),
                self.not_recovered,
                percentile(&mut lat, 0.5) * 1e3,
                percentile(&mut lat, 0.99) * 1e3,
                EVERY * 1e3,
                EVERY * 1e3,
                ms(self.detected),
                ms(self.table),
                if lost > 0 { lo * 1e3 } else { 0.0 },
                if lost > 0 { hi * 1e3 } else { 0.0 },
            )
    }
}

/// Wall time (s) of the latest down event of `host`'s link in the
/// dispatcher's report.
fn link_down_at(steer: &Value, host: &str) -> Option<f64> {
    steer["links"]
        .as_array()?
        .iter()
        .rev()
        .find(|x| x["host"] == host && x["up"] == false)
        .and_then(|x| x["at_unix_us"].as_u64())
        .map(|us| us as f64 / 1e6)
}

/// Wall time (s) of the first table the dispatcher steered by that lost
/// `host`.
fn table_without_at(steer: &Value, host: &str) -> Option<f64> {
    steer["tables"]
        .as_array()?
        .iter()
        .find(|t| t["left"].as_array().is_some_and(|l| l.iter().any(|h| h == host)))
        .and_then(|t| t["at_unix_us"].as_u64())
        .map(|us| us as f64 / 1e6)
}

/// A counter of the latest down event of `host`'s link.
fn link_down(steer: &Value, host: &str, k: &str) -> u64 {
    steer["links"]
        .as_array()
        .and_then(|l| l.iter().rev().find(|x| x["host"] == host && x["up"] == false))
        .and_then(|x| x[k].as_u64())
        .unwrap_or(0)
}

fn host_count(steer: &Value, host: &str, k: &str) -> u64 {
    steer["hosts"]
        .as_array()
        .and_then(|h| h.iter().find(|x| x["host"] == host))
        .and_then(|x| x[k].as_u64())
        .unwrap_or(0)
}
