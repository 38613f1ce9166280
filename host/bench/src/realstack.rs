//! Real TCP through `sluice-host dpdk` against a Linux bridge, on the same
//! veth pairs, in the same run.
//!
//! ```text
//!  netns client           netns wire                          netns server
//!  c0 10.0.0.5/24 ─veth─ h0 ┐  a bridge, or the host on  ┌ h1 ─veth─ s0 198.51.100.7/24
//!                           └ net_af_packet h0 and h1 ──┘
//! ```
//!
//! The middle ends of the pairs, h0 and h1, sit in a namespace of their
//! own, so the bridge's netfilter hooks can be turned off there without
//! touching the machine's settings, and deleting the three namespaces
//! removes every interface. Routes and neighbour entries are static (the host answers no
//! ARP); checksum, segmentation and receive offloads are off on all four
//! ends, so every frame is a whole frame of at most the 1500-byte MTU with
//! its checksums, as on a wire. `iperf3` measures one TCP connection from
//! the client to the server (through the NAT, the server sees the public
//! address 203.0.113.1, reached through the client's MAC).
//!
//! Cleanup: the namespaces, the bridge and every process started in them
//! are removed on drop, so on success and on every error. A watchdog in a
//! process group of its own (out of reach of a terminal's Ctrl-C) waits for
//! this process to exit and removes them too, so a run stopped by a signal,
//! even `kill -9`, leaves nothing behind; should the watchdog itself be
//! killed, the next run removes what is left.

use anyhow::{Context, Result, bail};
use serde_json::Value;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const CLIENT_IP: &str = "10.0.0.5";
const SERVER_IP: &str = "198.51.100.7";
const PUBLIC_IP: &str = "203.0.113.1";
const IPERF_PORT: &str = "5201";
/// Seconds of each iperf3 run.
const SECONDS: u64 = 5;
/// Runs of each path; the median is reported.
const ROUNDS: usize = 3;
/// Namespaces of this section start with this, then the pid.
const NS_PREFIX: &str = "sluice-bench-rs";

/// The `net_af_packet` ring of both ports: deep enough that a TCP window
/// never finds it full (README, "No DPDK NIC?").
const RING: &str = "framecnt=4096";

const OFFLOADS: [&str; 12] = ["tx", "off", "rx", "off", "tso", "off", "gso", "off", "gro", "off", "sg", "off"];

const FIREWALL: &str = r#"
[nf.firewall.config]
default = "deny"
rules = [{ action = "allow", src = "10.0.0.0/24" }]
"#;

const NAT: &str = r#"
[nf.nat.config]
public-ip = "203.0.113.1"
inside = ["10.0.0.0/8"]
"#;

/// One NF chain on the host.
struct Case {
    label: &'static str,
    nfs: &'static [&'static str],
    /// Host configuration (TOML): the NFs' configs, concatenated.
    config: &'static [&'static str],
    /// Whether port 1 is the outside (`--outside-ports 1`).
    outside: bool,
}

const CASES: [Case; 4] = [
    Case { label: "noop", nfs: &["noop"], config: &[], outside: false },
    Case { label: "firewall", nfs: &["firewall"], config: &[FIREWALL], outside: false },
    Case { label: "nat", nfs: &["nat"], config: &[NAT], outside: false },
    Case {
        label: "firewall,nat,monitor (`--outside-ports 1`)",
        nfs: &["firewall", "nat", "monitor"],
        config: &[FIREWALL, NAT],
        outside: true,
    },
];

/// Runs a command that must succeed; returns its stdout.
fn must(c: &mut Command) -> Result<String> {
    let o = c.output().with_context(|| format!("{c:?}"))?;
    if !o.status.success() {
        bail!("{c:?}: {}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

fn ip(args: &[&str]) -> Result<()> {
    must(Command::new("ip").args(args)).map(drop)
}

/// Kills every process in namespace `ns` (only this section's) and deletes
/// it, with whatever interfaces it holds.
fn remove_ns(ns: &str) {
    if let Ok(o) = Command::new("ip").args(["netns", "pids", ns]).output() {
        for pid in String::from_utf8_lossy(&o.stdout).split_whitespace() {
            let _ = Command::new("kill").args(["-KILL", pid]).output();
        }
    }
    let _ = Command::new("ip").args(["netns", "del", ns]).output();
}

/// Removes namespaces and EAL runtime directories left by runs of this
/// section whose process no longer exists (killed before cleaning up).
fn sweep_stale() {
    let Ok(o) = Command::new("ip").args(["netns", "list"]).output() else { return };
    for line in String::from_utf8_lossy(&o.stdout).lines() {
        let Some(name) = line.split_whitespace().next() else { continue };
        let Some(pid) = name.strip_prefix(NS_PREFIX).and_then(|r| r.split('-').next()) else { continue };
        if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
            remove_ns(name);
            let _ = std::fs::remove_dir_all(Path::new("/var/run/dpdk").join(format!("{NS_PREFIX}{pid}")));
        }
    }
}

/// Waits for process `$1` to exit, then removes the namespaces `$3...`
/// (killing what runs in them) and the EAL runtime directory `$2`.
const WATCHDOG: &str = r#"
pid=$1; dpdk=$2; shift 2
tail --pid="$pid" -f /dev/null
for ns in "$@"; do
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p"; done
    ip netns del "$ns" 2>/dev/null
done
rm -rf "$dpdk"
"#;

/// The three namespaces and the two veth pairs, removed on drop.
struct Wire {
    client: String,
    /// Holds h0 and h1: the bridge, or the host.
    wire: String,
    server: String,
    /// Removes them if this process exits without dropping the wire.
    watchdog: Option<Child>,
}

impl Wire {
    fn new() -> Result<Wire> {
        sweep_stale();
        let pid = std::process::id();
        let mut w = Wire {
            client: format!("{NS_PREFIX}{pid}-client"),
            wire: format!("{NS_PREFIX}{pid}-wire"),
            server: format!("{NS_PREFIX}{pid}-server"),
            watchdog: None,
        };
        let dpdk = Path::new("/var/run/dpdk").join(format!("{NS_PREFIX}{pid}"));
        let mut c = Command::new("sh");
        c.args(["-c", WATCHDOG, "sh", &pid.to_string(), &dpdk.display().to_string()]);
        c.args([&w.client, &w.wire, &w.server]).process_group(0);
        c.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
        w.watchdog = Some(c.spawn().context("starting the cleanup watchdog")?);
        // Built in place: a failure half-way still removes what exists.
        w.build()?;
        Ok(w)
    }

    fn exec(&self, ns: &str, prog: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns, prog]);
        c
    }

    fn build(&self) -> Result<()> {
        for ns in [&self.client, &self.wire, &self.server] {
            ip(&["netns", "add", ns]).context("creating a network namespace (the section needs root)")?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        // Where br_netfilter is loaded (its settings are per namespace),
        // bridged frames would also run through the (empty) IP hooks:
        // measure the bridge alone.
        if Path::new("/proc/sys/net/bridge").exists() {
            let keys = ["iptables", "ip6tables", "arptables"].map(|k| format!("net.bridge.bridge-nf-call-{k}=0"));
            must(self.exec(&self.wire, "sysctl").arg("-qw").args(&keys))?;
        }
        ip(&["-n", &self.wire, "link", "add", "h0", "type", "veth", "peer", "name", "c0", "netns", &self.client])?;
        ip(&["-n", &self.wire, "link", "add", "h1", "type", "veth", "peer", "name", "s0", "netns", &self.server])?;
        for (ns, dev) in self.ends() {
            // No IPv6 chatter on the wire.
            must(self.exec(ns, "sysctl").args(["-qw", &format!("net.ipv6.conf.{dev}.disable_ipv6=1")]))?;
            must(self.exec(ns, "ethtool").args(["-K", dev]).args(OFFLOADS))?;
            ip(&["-n", ns, "link", "set", dev, "mtu", "1500", "up"])?;
        }
        ip(&["-n", &self.client, "addr", "add", &format!("{CLIENT_IP}/24"), "dev", "c0"])?;
        ip(&["-n", &self.server, "addr", "add", &format!("{SERVER_IP}/24"), "dev", "s0"])?;
        let mac = |ns: &str, dev: &str| -> Result<String> {
            Ok(must(self.exec(ns, "cat").arg(format!("/sys/class/net/{dev}/address")))?.trim().to_string())
        };
        let (c0, s0) = (mac(&self.client, "c0")?, mac(&self.server, "s0")?);
        ip(&["-n", &self.client, "route", "add", "198.51.100.0/24", "dev", "c0"])?;
        ip(&["-n", &self.client, "neigh", "add", SERVER_IP, "lladdr", &s0, "dev", "c0"])?;
        ip(&["-n", &self.server, "route", "add", "10.0.0.0/24", "dev", "s0"])?;
        ip(&["-n", &self.server, "route", "add", &format!("{PUBLIC_IP}/32"), "dev", "s0"])?;
        for to in [CLIENT_IP, PUBLIC_IP] {
            ip(&["-n", &self.server, "neigh", "add", to, "lladdr", &c0, "dev", "s0"])?;
        }
        Ok(())
    }

    /// A bridge joining h0 and h1 (STP off), removed on drop.
    fn bridge(&self) -> Result<Bridge<'_>> {
        ip(&["-n", &self.wire, "link", "add", "br0", "type", "bridge", "stp_state", "0"])?;
        let b = Bridge(self);
        must(self.exec(&self.wire, "sysctl").args(["-qw", "net.ipv6.conf.br0.disable_ipv6=1"]))?;
        for dev in ["h0", "h1"] {
            ip(&["-n", &self.wire, "link", "set", dev, "master", "br0"])?;
        }
        ip(&["-n", &self.wire, "link", "set", "br0", "up"])?;
        Ok(b)
    }

    /// The four veth ends, by namespace.
    fn ends(&self) -> [(&str, &str); 4] {
        [(&self.wire, "h0"), (&self.wire, "h1"), (&self.client, "c0"), (&self.server, "s0")]
    }

    /// Frames the four veth ends could not pass to their peers (their
    /// `tx_dropped`), summed.
    fn veth_dropped(&self) -> Result<u64> {
        let mut n = 0;
        for (ns, dev) in self.ends() {
            let path = format!("/sys/class/net/{dev}/statistics/tx_dropped");
            n += must(self.exec(ns, "cat").arg(&path))?.trim().parse::<u64>().with_context(|| path.clone())?;
        }
        Ok(n)
    }

    /// The `TcpExt` counter `name` of namespace `ns` (`/proc/net/netstat`:
    /// a line of names, then a line of values).
    fn tcp_ext(&self, ns: &str, name: &str) -> Result<u64> {
        let text = must(self.exec(ns, "cat").arg("/proc/net/netstat"))?;
        let mut rows = text.lines().filter(|l| l.starts_with("TcpExt:")).map(|l| l.split_whitespace());
        let (Some(names), Some(values)) = (rows.next(), rows.next()) else { bail!("no TcpExt in /proc/net/netstat") };
        let value = names.zip(values).find(|(n, _)| *n == name).map(|(_, v)| v);
        value.with_context(|| format!("no {name} in /proc/net/netstat"))?.parse().map_err(Into::into)
    }

    /// Waits until a ping from the client gets an answer: the path between
    /// h0 and h1 forwards. `alive` fails if what forwards has died.
    fn wait_path(&self, mut alive: impl FnMut() -> Result<()>) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            alive()?;
            let o = self.exec(&self.client, "ping").args(["-c", "1", "-W", "0.2", SERVER_IP]).output()?;
            if o.status.success() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("no ping answer from {SERVER_IP} through the wire in 30 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Wire {
    fn drop(&mut self) {
        for ns in [&self.client, &self.wire, &self.server] {
            remove_ns(ns);
        }
        // Nothing left to watch: the watchdog's shell and its `tail`, by
        // their process group (the shell's pid).
        if let Some(mut w) = self.watchdog.take() {
            let _ = Command::new("kill").args(["-KILL", "--", &format!("-{}", w.id())]).output();
            let _ = w.wait();
        }
    }
}

struct Bridge<'a>(&'a Wire);

impl Drop for Bridge<'_> {
    fn drop(&mut self) {
        // Releases h0 and h1, which stay up.
        let _ = Command::new("ip").args(["-n", &self.0.wire, "link", "del", "br0"]).output();
    }
}

/// A background process, killed on drop.
struct Bg(Child);

impl Drop for Bg {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What one iperf3 run measured.
#[derive(Debug, Clone, Copy)]
struct Tcp {
    /// Received by the server, Gbit/s.
    gbps: f64,
    /// Retransmitted segments (sender).
    retransmits: u64,
    /// Of the retransmitted segments, those the server reported it had
    /// received already (D-SACK): retransmitted without need.
    dsacked: u64,
    /// Frames the four veth ends could not pass to their peers.
    veth_dropped: u64,
}

/// One run through the host.
#[derive(Debug, Clone, Copy)]
struct HostRun {
    tcp: Tcp,
    /// Ring drops of both ports (`imissed`).
    imissed: u64,
    /// Frames the NFs dropped.
    nf_dropped: u64,
    /// Frames the host took and did not send: full TX queues, other drops,
    /// too big, and the ports' send errors (`oerrors`).
    unsent: u64,
    /// The host process's CPU time over the iperf3 run, in cores.
    cpu: f64,
}

/// iperf3 from the client to the server, [`SECONDS`] long.
fn iperf(w: &Wire, dir: &Path) -> Result<Tcp> {
    let out = dir.join("iperf.json");
    let veth0 = w.veth_dropped()?;
    let dsack0 = w.tcp_ext(&w.client, "TCPDSACKRecvSegs")?;
    let mut c = w.exec(&w.client, "iperf3");
    c.args(["-c", SERVER_IP, "-p", IPERF_PORT, "-t", &SECONDS.to_string(), "-J", "--connect-timeout", "3000"]);
    c.stdout(std::fs::File::create(&out)?).stderr(Stdio::null());
    let mut child = Bg(c.spawn().context("starting iperf3")?);
    let deadline = Instant::now() + Duration::from_secs(SECONDS + 20);
    let status = loop {
        if let Some(s) = child.0.try_wait()? {
            break s;
        }
        if Instant::now() > deadline {
            bail!("iperf3 did not finish in {} s", SECONDS + 20);
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let text = std::fs::read_to_string(&out)?;
    let j: Value = serde_json::from_str(&text).with_context(|| format!("iperf3 ({status}) printed: {text}"))?;
    if let Some(e) = j.get("error") {
        bail!("iperf3: {e}");
    }
    let end = j.get("end").context("iperf3 output without `end`")?;
    let field = |sum: &str, key: &str| end.get(sum).and_then(|s| s.get(key));
    Ok(Tcp {
        gbps: field("sum_received", "bits_per_second").and_then(Value::as_f64).context("no receiver rate")? / 1e9,
        retransmits: field("sum_sent", "retransmits").and_then(Value::as_u64).unwrap_or(0),
        dsacked: w.tcp_ext(&w.client, "TCPDSACKRecvSegs")? - dsack0,
        veth_dropped: w.veth_dropped()? - veth0,
    })
}

fn bridge_run(w: &Wire, dir: &Path) -> Result<Tcp> {
    let _bridge = w.bridge()?;
    w.wait_path(|| Ok(()))?;
    iperf(w, dir)
}

/// User plus system time of process `pid` (all its threads), seconds.
fn cpu_seconds(pid: u32, ticks: f64) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name, which ends with the last ')': state
    // is field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).context("odd /proc stat")?;
    let f: Vec<f64> = rest.split_whitespace().skip(11).take(2).filter_map(|v| v.parse().ok()).collect();
    Ok(f.iter().sum::<f64>() / ticks)
}

/// A running `sluice-host dpdk`: stopped with SIGINT by [`Host::stop`],
/// killed on drop otherwise.
struct Host {
    child: Bg,
    report: PathBuf,
    err: PathBuf,
    prefix: String,
}

impl Host {
    fn start(w: &Wire, host: &Path, nfs: &Path, dir: &Path, case: &Case) -> Result<Host> {
        let cfg = dir.join("host.toml");
        std::fs::write(&cfg, case.config.concat())?;
        let chain: Vec<String> = case.nfs.iter().map(|n| nfs.join(format!("{n}.wasm")).display().to_string()).collect();
        let report = dir.join("report.json");
        let _ = std::fs::remove_file(&report);
        let err = dir.join("host.err");
        let prefix = format!("{NS_PREFIX}{}", std::process::id());
        let mut c = w.exec(&w.wire, &host.display().to_string());
        c.env("SLUICE_CACHE_DIR", "").env("SLUICE_LOG", "warn").env_remove("SLUICE_CONFIG");
        c.arg("--config").arg(&cfg).args(["dpdk", "--nf", &chain.join(","), "--pairs", "--workers", "1"]);
        if case.outside {
            c.args(["--outside-ports", "1"]);
        }
        c.arg("--report").arg(&report).arg("--");
        c.args(["--no-huge", "--no-pci", "-m", "512", "--log-level=lib.eal:error"]);
        c.arg(format!("--file-prefix={prefix}"));
        c.args([format!("--vdev=net_af_packet0,iface=h0,{RING}"), format!("--vdev=net_af_packet1,iface=h1,{RING}")]);
        c.stdout(Stdio::null()).stderr(std::fs::File::create(&err)?);
        let child = Bg(c.spawn().context("starting sluice-host")?);
        Ok(Host { child, report, err, prefix })
    }

    fn pid(&self) -> u32 {
        self.child.0.id()
    }

    fn alive(&mut self) -> Result<()> {
        if let Some(s) = self.child.0.try_wait()? {
            bail!("sluice-host exited ({s}): {}", std::fs::read_to_string(&self.err).unwrap_or_default());
        }
        Ok(())
    }

    /// Stops the host as a user would (SIGINT) and returns its report.
    fn stop(mut self) -> Result<Value> {
        must(Command::new("kill").args(["-INT", &self.pid().to_string()]))?;
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(s) = self.child.0.try_wait()? {
                break s;
            }
            if Instant::now() > deadline {
                bail!("sluice-host did not stop within 30 s of SIGINT");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        if !status.success() {
            bail!("sluice-host stopped with {status}: {}", std::fs::read_to_string(&self.err).unwrap_or_default());
        }
        let r = std::fs::read(&self.report).context("the host's report")?;
        Ok(serde_json::from_slice(&r)?)
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(Path::new("/var/run/dpdk").join(&self.prefix));
    }
}

fn count(v: &Value, key: &str) -> u64 {
    v.get(key).and_then(Value::as_u64).unwrap_or(0)
}

/// One iperf3 run through the host with `case`; also returns the core its
/// worker ran on.
fn host_run(w: &Wire, host: &Path, nfs: &Path, dir: &Path, case: &Case, ticks: f64) -> Result<(HostRun, String)> {
    let mut h = Host::start(w, host, nfs, dir, case)?;
    w.wait_path(|| h.alive())?;
    let (cpu0, t0) = (cpu_seconds(h.pid(), ticks)?, Instant::now());
    let tcp = iperf(w, dir)?;
    let cpu = (cpu_seconds(h.pid(), ticks)? - cpu0) / t0.elapsed().as_secs_f64();
    let r = h.stop()?;
    let ports = r.get("ports").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let imissed = ports.iter().map(|p| count(p, "imissed")).sum();
    let oerrors: u64 = ports.iter().map(|p| count(p, "oerrors")).sum();
    let unsent =
        ["dropped_tx_full", "dropped_other", "dropped_too_big"].iter().map(|k| count(&r, k)).sum::<u64>() + oerrors;
    let nf_dropped = count(&r, "dropped_by_nf");
    let cores = r
        .get("worker_cores")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(" "))
        .unwrap_or_default();
    Ok((HostRun { tcp, imissed, nf_dropped, unsent, cpu }, cores))
}

fn median(mut v: Vec<f64>) -> f64 {
    crate::median(&mut v)
}

fn which(name: &str) -> bool {
    std::env::var_os("PATH")
        .and_then(|p| p.to_str().map(|p| p.split(':').any(|d| Path::new(d).join(name).exists())))
        .unwrap_or(false)
}

/// Runs the section and returns its Markdown.
pub fn section(host: &Path, nfs: &Path) -> Result<String> {
    for tool in ["iperf3", "ethtool", "ping", "ip"] {
        if !which(tool) {
            bail!("{tool} not found (Debian packages iperf3, ethtool, iputils-ping, iproute2)");
        }
    }
    for nf in ["noop", "firewall", "nat", "monitor"] {
        let p = nfs.join(format!("{nf}.wasm"));
        if !p.exists() {
            bail!("{} missing: run `make nfs`", p.display());
        }
    }
    let started = Instant::now();
    let load = std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default();
    let ticks = must(Command::new("getconf").arg("CLK_TCK"))?.trim().parse::<f64>().unwrap_or(100.0);
    let dir = crate::dpdk::tempfile_dir()?.join("realstack");
    std::fs::create_dir_all(&dir)?;
    let w = Wire::new()?;
    let mut server = w.exec(&w.server, "iperf3");
    server.args(["-s", "-B", SERVER_IP, "-p", IPERF_PORT]).stdout(Stdio::null()).stderr(Stdio::null());
    let mut iperf_server = Bg(server.spawn().context("starting the iperf3 server")?);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !must(w.exec(&w.server, "ss").args(["-Hltn", &format!("sport = :{IPERF_PORT}")]))?.contains(IPERF_PORT) {
        if let Some(s) = iperf_server.0.try_wait()? {
            bail!("the iperf3 server exited: {s}");
        }
        if Instant::now() > deadline {
            bail!("the iperf3 server does not listen after 10 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }

    // Per case: its bridge runs and host runs, interleaved.
    let mut bridge: Vec<Vec<Tcp>> = vec![Vec::new(); CASES.len()];
    let mut hosted: Vec<Vec<HostRun>> = vec![Vec::new(); CASES.len()];
    let mut cores = String::new();
    for round in 1..=ROUNDS {
        for (i, case) in CASES.iter().enumerate() {
            let b = bridge_run(&w, &dir)?;
            let (h, c) = host_run(&w, host, nfs, &dir, case, ticks)?;
            eprintln!(
                "  round {round}/{ROUNDS}: bridge {:.2} Gbit/s, host with {} {:.2} Gbit/s (imissed {}, not sent {})",
                b.gbps,
                case.nfs.join(","),
                h.tcp.gbps,
                h.imissed,
                h.unsent
            );
            if let (Some(bs), Some(hs)) = (bridge.get_mut(i), hosted.get_mut(i)) {
                bs.push(b);
                hs.push(h);
            }
            cores = c;
        }
    }
    drop(iperf_server);
    drop(w);
    let _ = std::fs::remove_dir_all(&dir);
    let took = started.elapsed().as_secs_f64();
    Ok(render(&bridge, &hosted, &cores, &load, took))
}

fn list(v: impl Iterator<Item = String>) -> String {
    v.collect::<Vec<_>>().join(" / ")
}

fn render(bridge: &[Vec<Tcp>], hosted: &[Vec<HostRun>], cores: &str, load: &str, took: f64) -> String {
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let mut s = String::new();
    s.push_str("\n## Real TCP through the host against a Linux bridge\n\n");
    s.push_str(&format!("A client (10.0.0.5) and a server (198.51.100.7) in two network namespaces, with the kernel's own TCP stacks, each joined by a veth pair to a third namespace that holds the other ends, h0 and h1: MTU 1500; checksum, segmentation and receive offloads off on all four ends (every frame a whole frame with its checksums, none longer than the MTU); static routes and neighbour entries. Between h0 and h1, in turn, on the same pairs: **bridge**, a Linux bridge with h0 and h1 as its ports (STP off, bridge netfilter hooks off in that namespace), which the kernel runs in softirq context on the CPU that received the frame; **host**, `sluice-host dpdk --pairs --workers 1` with `net_af_packet` on h0 (port 0, inside) and h1 (port 1, outside), a `{RING}` ring, EAL `--no-huge --no-pci`: one worker thread busy-polls both ports' packet-socket rings and sends each frame out of the other port after the NF chain (the firewall allows 10.0.0.0/24 and denies the rest; the NAT maps 10.0.0.0/8 to 203.0.113.1; in the three-NF chain, frames from port 1 run it last NF first). Traffic: `iperf3 -c 198.51.100.7 -t {SECONDS}` in the client, one TCP connection client → server. **Gbit/s**: what the server received; **retransmits**: the sender's count; **D-SACKed**: how many of those the server reported it already had (D-SACK, the client's `TCPDSACKRecvSegs`): sent again though nothing was lost. Each host run follows a bridge run of its own, {ROUNDS} rounds; medians shown; **vs bridge** is the host's median over the median of its bridge runs. **veth drops**: frames the four veth ends could not pass to their peers (their `tx_dropped`), during the iperf3 run. **imissed**: frames the kernel dropped because a port's ring was full, both ports; **not sent**: frames the host took and did not send (full TX queue, too long, other drops, send errors); both over the host's whole run (its start-up pings and the iperf3 run). **host CPU**: the host process's user + system time during the iperf3 run, all its threads, in cores. The same CPUs also run both TCP stacks, iperf3 and the veths' softirq work, in both cases.\n\n"));
    s.push_str("| path | Gbit/s | vs bridge | runs, Gbit/s | retransmits | D-SACKed | veth drops | imissed | not sent | host CPU |\n|---|---:|---:|---|---|---|---|---|---|---:|\n");
    for (i, case) in CASES.iter().enumerate() {
        let (Some(b), Some(h)) = (bridge.get(i), hosted.get(i)) else { continue };
        let bm = median(b.iter().map(|r| r.gbps).collect());
        let hm = median(h.iter().map(|r| r.tcp.gbps).collect());
        s.push_str(&format!(
            "| bridge (paired with {}) | {bm:.2} | 1.00 | {} | {} | {} | {} | | | |\n",
            case.nfs.join(","),
            list(b.iter().map(|r| format!("{:.2}", r.gbps))),
            list(b.iter().map(|r| r.retransmits.to_string())),
            list(b.iter().map(|r| r.dsacked.to_string())),
            list(b.iter().map(|r| r.veth_dropped.to_string())),
        ));
        s.push_str(&format!(
            "| host, {} | {hm:.2} | {:.2} | {} | {} | {} | {} | {} | {} | {:.2} |\n",
            case.label,
            if bm > 0.0 { hm / bm } else { 0.0 },
            list(h.iter().map(|r| format!("{:.2}", r.tcp.gbps))),
            list(h.iter().map(|r| r.tcp.retransmits.to_string())),
            list(h.iter().map(|r| r.tcp.dsacked.to_string())),
            list(h.iter().map(|r| r.tcp.veth_dropped.to_string())),
            list(h.iter().map(|r| r.imissed.to_string())),
            list(h.iter().map(|r| r.unsent.to_string())),
            median(h.iter().map(|r| r.cpu).collect()),
        ));
    }
    let nf_dropped: Vec<String> = CASES
        .iter()
        .zip(hosted)
        .map(|(c, h)| format!("{} {}", c.nfs.join(","), list(h.iter().map(|r| r.nf_dropped.to_string()))))
        .collect();
    let nf_dropped = nf_dropped.join("; ");
    s.push_str(&format!(
        "\nFrames the NFs dropped, per run: {nf_dropped}. Machine: {}, {cpus} CPUs, load average {load} at the start; the host's worker ran on CPU {cores}. The section took {took:.0} s.\n",
        crate::cpu_model(),
    ));
    s
}
