//! Real Linux TCP, UDP and ICMP stacks on both sides of `sluice-host dpdk`,
//! and what the kernel saw.
//!
//! ```text
//!  netns client            root netns                         netns server
//!  c0 10.0.0.5/24 ──veth── h0 (port 0, inside) ─┐   ┌─ h1 (port 1, outside) ──veth── s0 198.51.100.7/24
//!                                          sluice-host dpdk --pairs
//! ```
//!
//! The host is a bump in the wire: DPDK's `net_af_packet` on the root ends
//! of two veth pairs, forwarding port 0 to port 1 and back. It answers no
//! ARP, so both sides reach each other through static routes and static
//! neighbour entries that name the far side's MAC; the server reaches the
//! NAT's public address 203.0.113.1 the same way, with the client's MAC.
//! Checksum and segmentation offloads are off on all four veth ends, so
//! every frame carries real checksums and no frame is longer than the MTU.
//!
//! Each test builds its own wire (namespaces and veths named by pid and a
//! counter, removed on drop, also on panic), starts one host, waits until
//! its ports' packet sockets are bound and a connection goes through, runs
//! the traffic, stops the host with SIGINT and reads its `--report`. Tests
//! take turns: a host busy-polls a core, and two at once on a small machine
//! would starve the stacks they carry.

#![cfg(feature = "dpdk")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

use serde_json::Value;
use std::borrow::BorrowMut;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

const CLIENT_IP: &str = "10.0.0.5";
const SERVER_IP: &str = "198.51.100.7";
const PUBLIC_IP: &str = "203.0.113.1";
const SERVER_HTTP: u16 = 8080;
const CLIENT_HTTP: u16 = 8081;
const ECHO_PORT: u16 = 7007;

/// The `net_af_packet` ring of every port: deep enough that a TCP window
/// never finds it full.
const RING: &str = "framecnt=4096";

/// A ring whose frames hold a whole reassembled 3,000-byte datagram: the
/// PMD's socket reassembles IPv4 fragments (`PACKET_FANOUT_FLAG_DEFRAG`)
/// and cuts whatever is longer than a ring frame. The host's mbufs must
/// hold a ring frame ([`MBUF_BIG`]).
const RING_BIG_FRAMES: &str = "blocksz=8192,framesz=4096,framecnt=2048";
const MBUF_BIG: [&str; 2] = ["--mbuf-size", "4096"];

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

/// One host at a time (see the module doc).
static TURN: Mutex<()> = Mutex::new(());
static WIRES: AtomicU32 = AtomicU32::new(0);

fn nf(name: &str) -> PathBuf {
    let dir = std::env::var("SLUICE_NFS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/nfs"));
    let p = dir.join(format!("{name}.wasm"));
    assert!(p.exists(), "{} missing: run `make nfs`", p.display());
    p
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// Runs a command (owned or borrowed) to its end.
fn run(mut c: impl BorrowMut<Command>) -> Output {
    let c = c.borrow_mut();
    c.output().unwrap_or_else(|e| panic!("{c:?}: {e}"))
}

/// Runs a command that must succeed; returns its stdout.
fn must(mut c: impl BorrowMut<Command>) -> String {
    let c = c.borrow_mut();
    let o = run(&mut *c);
    assert!(o.status.success(), "{c:?}: {}", text(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn ip(args: &[&str]) {
    must(Command::new("ip").args(args));
}

/// Waits for `cond` (every 50 ms) until `secs` have passed.
fn wait_for(what: &str, secs: u64, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A process killed on drop (a server in a namespace).
struct Bg(Child);

impl Drop for Bg {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Packets the kernel counted on the host's two interfaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Kernel {
    h0_rx: u64,
    h0_tx: u64,
    h1_rx: u64,
    h1_tx: u64,
}

/// The two namespaces and veth pairs, removed on drop.
struct Wire {
    client: String,
    server: String,
    /// Root end of the client's pair: DPDK port 0, the inside.
    h0: String,
    /// Root end of the server's pair: DPDK port 1, the outside.
    h1: String,
}

impl Wire {
    fn new() -> Wire {
        let n = WIRES.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let w = Wire {
            client: format!("sluice-rs{pid}-{n}-client"),
            server: format!("sluice-rs{pid}-{n}-server"),
            h0: format!("rs{pid}-{n}i"),
            h1: format!("rs{pid}-{n}o"),
        };
        // Built in place, so a failure half-way still removes what exists.
        w.build();
        w
    }

    fn build(&self) {
        for (ns, root, end, addr) in
            [(&self.client, &self.h0, "c0", "10.0.0.5/24"), (&self.server, &self.h1, "s0", "198.51.100.7/24")]
        {
            ip(&["netns", "add", ns]);
            ip(&["link", "add", root, "type", "veth", "peer", "name", end, "netns", ns]);
            // No IPv6 chatter on the wire: the counters must see only the
            // test's traffic.
            must(Command::new("sysctl").args(["-qw", &format!("net.ipv6.conf.{root}.disable_ipv6=1")]));
            must(self.exec(ns, "sysctl", &["-qw", &format!("net.ipv6.conf.{end}.disable_ipv6=1")]));
            must(Command::new("ethtool").args(["-K", root]).args(OFFLOADS));
            must(self.exec(ns, "ethtool", &["-K", end]).args(OFFLOADS));
            ip(&["-n", ns, "addr", "add", addr, "dev", end]);
            ip(&["-n", ns, "link", "set", "lo", "up"]);
            ip(&["-n", ns, "link", "set", end, "up"]);
            ip(&["link", "set", root, "up"]);
        }
        let (c0, s0) = (self.mac(&self.client, "c0"), self.mac(&self.server, "s0"));
        ip(&["-n", &self.client, "route", "add", "198.51.100.0/24", "dev", "c0"]);
        ip(&["-n", &self.client, "neigh", "add", SERVER_IP, "lladdr", &s0, "dev", "c0"]);
        ip(&["-n", &self.server, "route", "add", "10.0.0.0/24", "dev", "s0"]);
        ip(&["-n", &self.server, "route", "add", "203.0.113.1/32", "dev", "s0"]);
        for to in [CLIENT_IP, PUBLIC_IP] {
            ip(&["-n", &self.server, "neigh", "add", to, "lladdr", &c0, "dev", "s0"]);
        }
    }

    fn mac(&self, ns: &str, iface: &str) -> String {
        must(self.exec(ns, "cat", &[&format!("/sys/class/net/{iface}/address")])).trim().to_string()
    }

    fn exec(&self, ns: &str, prog: &str, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns, prog]).args(args);
        c
    }

    fn client(&self, prog: &str, args: &[&str]) -> Command {
        self.exec(&self.client, prog, args)
    }

    fn server(&self, prog: &str, args: &[&str]) -> Command {
        self.exec(&self.server, prog, args)
    }

    /// `python3 -m http.server` on `addr:port` in `ns`, serving `dir`, its
    /// request log going to `log`.
    fn http_server(&self, ns: &str, addr: &str, port: u16, dir: &Path, log: &Path) -> Bg {
        let log = std::fs::File::create(log).unwrap();
        let port = port.to_string();
        let args = ["-u", "-m", "http.server", &port, "--bind", addr, "--directory", dir.to_str().unwrap()];
        Bg(self.exec(ns, "python3", &args).stdout(Stdio::null()).stderr(log).spawn().unwrap())
    }

    fn counter(&self, iface: &str, name: &str) -> u64 {
        let path = format!("/sys/class/net/{iface}/statistics/{name}");
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}")).trim().parse().unwrap()
    }

    fn kernel(&self) -> Kernel {
        Kernel {
            h0_rx: self.counter(&self.h0, "rx_packets"),
            h0_tx: self.counter(&self.h0, "tx_packets"),
            h1_rx: self.counter(&self.h1, "rx_packets"),
            h1_tx: self.counter(&self.h1, "tx_packets"),
        }
    }

    /// Waits until no frame crossed either interface for 300 ms (the last
    /// ACKs and FINs of a transfer), so that stopping the host loses none.
    fn settle(&self) {
        let mut last = self.kernel();
        let mut still = Instant::now();
        wait_for("the wire to fall quiet", 15, || {
            let now = self.kernel();
            if now != last {
                last = now;
                still = Instant::now();
            }
            still.elapsed() >= Duration::from_millis(300)
        });
    }

    fn ifindex(&self, iface: &str) -> String {
        std::fs::read_to_string(format!("/sys/class/net/{iface}/ifindex")).unwrap().trim().to_string()
    }

    /// Whether a packet socket is bound to each of the host's interfaces.
    fn bound(&self) -> bool {
        let sockets = std::fs::read_to_string("/proc/net/packet").unwrap();
        let bound: Vec<&str> = sockets.lines().skip(1).filter_map(|l| l.split_whitespace().nth(4)).collect();
        [&self.h0, &self.h1].iter().all(|i| bound.contains(&self.ifindex(i).as_str()))
    }
}

const OFFLOADS: [&str; 12] = ["tx", "off", "rx", "off", "tso", "off", "gso", "off", "gro", "off", "sg", "off"];

impl Drop for Wire {
    fn drop(&mut self) {
        for ns in [&self.client, &self.server] {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
        for root in [&self.h0, &self.h1] {
            let _ = Command::new("ip").args(["link", "del", root]).output();
        }
    }
}

/// A running `sluice-host dpdk` on the wire's two interfaces, killed on
/// drop if a test failed before stopping it.
struct Host {
    child: Option<Child>,
    report: PathBuf,
    out: PathBuf,
    err: PathBuf,
    /// EAL's `--file-prefix`, the name of its runtime directory.
    prefix: String,
}

impl Host {
    /// Starts the host with the NFs `nfs` (a linear chain), the host
    /// config `config`, more `dpdk` arguments `extra` and the ring
    /// arguments `ring`, and waits until its ports' sockets are bound.
    fn start(w: &Wire, dir: &Path, nfs: &[&str], config: &str, extra: &[&str], ring: &str) -> Host {
        let cfg = dir.join("host.toml");
        std::fs::write(&cfg, config).unwrap();
        let report = dir.join("report.json");
        let (out, err) = (dir.join("host.out"), dir.join("host.err"));
        let chain: Vec<String> = nfs.iter().map(|n| nf(n).to_str().unwrap().to_string()).collect();
        let mut c = Command::new(env!("CARGO_BIN_EXE_sluice-host"));
        c.env("SLUICE_CACHE_DIR", "").env("SLUICE_LOG", "warn").env_remove("SLUICE_CONFIG");
        c.arg("--config").arg(&cfg).args(["dpdk", "--nf", &chain.join(","), "--pairs", "--workers", "1"]);
        c.args(extra).arg("--report").arg(&report).arg("--");
        c.args(["--no-huge", "--no-pci", "-m", "512", "--log-level=lib.eal:error"]);
        let prefix = format!("sluice-{}", w.h0);
        c.arg(format!("--file-prefix={prefix}"));
        c.arg(format!("--vdev=net_af_packet0,iface={},{ring}", w.h0));
        c.arg(format!("--vdev=net_af_packet1,iface={},{ring}", w.h1));
        c.stdout(std::fs::File::create(&out).unwrap()).stderr(std::fs::File::create(&err).unwrap());
        let mut host = Host { child: Some(c.spawn().unwrap()), report, out, err, prefix };
        wait_for("the host's packet sockets", 60, || {
            host.assert_running();
            w.bound()
        });
        host
    }

    fn assert_running(&mut self) {
        if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().unwrap()) {
            panic!("the host exited ({status}):\n{}", self.output());
        }
    }

    fn output(&self) -> String {
        let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
        format!("stdout:\n{}\nstderr:\n{}", read(&self.out), read(&self.err))
    }

    /// Stops the host as a user would (SIGINT) and returns its report.
    fn stop(mut self) -> Value {
        let pid = self.child.as_ref().unwrap().id();
        must(Command::new("kill").args(["-INT", &pid.to_string()]));
        let mut status = None;
        // The child stays in `self` until it exited: killed on drop if not.
        wait_for("the host to stop after SIGINT", 30, || {
            status = self.child.as_mut().unwrap().try_wait().unwrap();
            status.is_some()
        });
        self.child = None;
        assert!(status.is_some_and(|s| s.success()), "the host stopped with {status:?}:\n{}", self.output());
        let r = std::fs::read(&self.report).unwrap_or_else(|e| panic!("report: {e}\n{}", self.output()));
        serde_json::from_slice(&r).unwrap()
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(Path::new("/var/run/dpdk").join(&self.prefix));
    }
}

/// Connects (TCP) or gets an echo (UDP) from `argv[2]:argv[3]`, trying
/// again until it works: the host is forwarding and the server is up.
const PROBE: &str = r#"
import socket, sys, time
proto, addr = sys.argv[1], (sys.argv[2], int(sys.argv[3]))
deadline = time.time() + 30
while time.time() < deadline:
    try:
        if proto == "tcp":
            socket.create_connection(addr, timeout=1).close()
        else:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.settimeout(0.5)
            s.sendto(b"probe", addr)
            while s.recv(65535) != b"probe":
                pass
        sys.exit(0)
    except OSError:
        time.sleep(0.1)
sys.exit(f"no answer from {addr} over {proto}")
"#;

/// Echoes every UDP datagram on `argv[1]:argv[2]`, printing its sender
/// and length.
const UDP_ECHO: &str = r#"
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], int(sys.argv[2])))
while True:
    data, peer = s.recvfrom(65535)
    print(peer[0], len(data), flush=True)
    s.sendto(data, peer)
"#;

/// Sends one datagram of random bytes of each size in `argv[3:]` to
/// `argv[1]:argv[2]` and prints whether it came back intact.
const UDP_SEND: &str = r#"
import os, socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(3)
s.connect((sys.argv[1], int(sys.argv[2])))
for size in map(int, sys.argv[3:]):
    payload = os.urandom(size)
    s.send(payload)
    try:
        back = s.recv(65535)
        print(size, "intact" if back == payload else f"changed ({len(back)} bytes back)")
    except socket.timeout:
        print(size, "lost")
"#;

/// Runs `PROBE` from the client; fails at once if the host exits first.
fn probe(w: &Wire, proto: &str, addr: &str, port: u16, host: &mut Host) {
    let port = port.to_string();
    let mut c = w.client("python3", &["-c", PROBE, proto, addr, &port]);
    let mut p = Bg(c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap());
    let mut done = None;
    wait_for("the probe", 40, || {
        host.assert_running();
        done = p.0.try_wait().unwrap();
        done.is_some()
    });
    let mut err = String::new();
    let _ = std::io::Read::read_to_string(p.0.stderr.as_mut().unwrap(), &mut err);
    assert!(done.is_some_and(|s| s.success()), "{err}\nhost {}", host.output());
}

/// A file of `len` pseudo-random bytes named `name` in `dir`.
fn random_file(dir: &Path, name: &str, len: usize, seed: u64) -> PathBuf {
    let mut x = seed | 1;
    let mut data = Vec::with_capacity(len + 8);
    while data.len() < len {
        // xorshift64*
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        data.extend_from_slice(&x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    data.truncate(len);
    let p = dir.join(name);
    std::fs::write(&p, data).unwrap();
    p
}

fn sha256(p: &Path) -> String {
    let out = must(Command::new("sha256sum").arg(p));
    out.split_whitespace().next().unwrap().to_string()
}

/// Fetches `url` with curl in `ns` into `to`; returns its SHA-256.
fn fetch(w: &Wire, ns: &str, url: &str, to: &Path) -> String {
    let o = run(w.exec(ns, "curl", &["-sS", "--fail", "--max-time", "60", "-o", to.to_str().unwrap(), url]));
    assert!(o.status.success(), "curl {url}: {}", text(&o));
    sha256(to)
}

/// Directories of one test: what the server serves, what the client
/// serves, and downloads.
struct Dirs {
    tmp: tempfile::TempDir,
}

impl Dirs {
    fn new() -> Dirs {
        let d = Dirs { tmp: tempfile::tempdir().unwrap() };
        for sub in ["srv", "cli", "got"] {
            std::fs::create_dir(d.tmp.path().join(sub)).unwrap();
        }
        d
    }

    fn path(&self, sub: &str) -> PathBuf {
        self.tmp.path().join(sub)
    }
}

const MB20: usize = 20_000_000;

fn turn() -> std::sync::MutexGuard<'static, ()> {
    TURN.lock().unwrap_or_else(|e| e.into_inner())
}

fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

/// Nothing the kernel delivered to a port is unaccounted for: every frame
/// `h0`/`h1` received is received by its port or missed; every frame the
/// host received is sent or counted dropped; what a port's queue sent (the
/// host counts sends on the egress port) the device sent or refused, and
/// what it sent is what the kernel sent out of its interface.
fn assert_counters_match(r: &Value, before: Kernel, after: Kernel) {
    let delivered = [after.h0_rx - before.h0_rx, after.h1_rx - before.h1_rx];
    let sent = [after.h0_tx - before.h0_tx, after.h1_tx - before.h1_tx];
    eprintln!("kernel: h0 rx {} tx {}, h1 rx {} tx {}", delivered[0], sent[0], delivered[1], sent[1]);
    let mut queues_tx = 0;
    for i in 0..2 {
        let p = &r["ports"][i];
        let queues = p["queues"].as_array().unwrap();
        assert_eq!(queues.len(), 1, "{r:#}");
        let q = &queues[0];
        assert_eq!(delivered[i], n(&p["ipackets"]) + n(&p["imissed"]), "port {i}: kernel rx = port rx + missed: {r:#}");
        assert_eq!(n(&q["rx"]), n(&p["ipackets"]), "port {i}: {r:#}");
        assert_eq!(n(&q["tx"]), n(&p["opackets"]) + n(&p["oerrors"]), "port {i}: queue tx = device tx + errors: {r:#}");
        assert_eq!(sent[i], n(&p["opackets"]), "port {i}: kernel tx = port tx: {r:#}");
        queues_tx += n(&q["tx"]);
    }
    let drops = ["dropped_by_nf", "dropped_tx_full", "dropped_other", "dropped_too_big"].map(|k| n(&r[k]));
    assert_eq!(n(&r["rx"]), n(&r["ports"][0]["ipackets"]) + n(&r["ports"][1]["ipackets"]), "{r:#}");
    let added = n(&r["fragmented"]);
    assert_eq!(n(&r["rx"]) + added, n(&r["tx"]) + drops.iter().sum::<u64>(), "received = sent + dropped: {r:#}");
    assert_eq!(n(&r["tx"]), queues_tx, "{r:#}");
}

/// Scenario 1 and 7: a 20 MB download each way through `noop`, the bytes
/// unchanged, and the host's port counters equal to what the kernel
/// counted on the two interfaces.
#[test]
fn noop_carries_tcp_both_ways_unchanged_and_its_counters_match_the_kernels() {
    let _turn = turn();
    let w = Wire::new();
    let d = Dirs::new();
    let down = random_file(&d.path("srv"), "blob", MB20, 1);
    let up = random_file(&d.path("cli"), "blob", MB20, 2);
    let _srv = w.http_server(&w.server, SERVER_IP, SERVER_HTTP, &d.path("srv"), &d.path("srv.log"));
    let _cli = w.http_server(&w.client, CLIENT_IP, CLIENT_HTTP, &d.path("cli"), &d.path("cli.log"));

    let before = w.kernel();
    let mut host = Host::start(&w, d.tmp.path(), &["noop"], "", &[], RING);
    probe(&w, "tcp", SERVER_IP, SERVER_HTTP, &mut host);
    let url = format!("http://{SERVER_IP}:{SERVER_HTTP}/blob");
    assert_eq!(fetch(&w, &w.client, &url, &d.path("got/down")), sha256(&down), "client's download");
    let url = format!("http://{CLIENT_IP}:{CLIENT_HTTP}/blob");
    assert_eq!(fetch(&w, &w.server, &url, &d.path("got/up")), sha256(&up), "server's download from the client");
    w.settle();
    let r = host.stop();
    let after = w.kernel();

    assert_eq!(n(&r["dropped_by_nf"]), 0, "{r:#}");
    // 20 MB each way is at least 13,700 full-sized segments each way.
    assert!(n(&r["ports"][0]["ipackets"]) > 13_700 && n(&r["ports"][1]["ipackets"]) > 13_700, "{r:#}");
    assert_counters_match(&r, before, after);
    // A bump in the wire: what came in on one side left by the other.
    for (from, to) in [(0, 1), (1, 0)] {
        let (rx, tx) = (&r["ports"][from]["queues"][0]["rx"], &r["ports"][to]["queues"][0]["tx"]);
        assert_eq!(n(rx), n(tx), "port {from} to port {to}: {r:#}");
    }
}

/// Scenario 2: default deny, allow from 10.0.0.0/24. The client's download
/// passes (its replies on the connection's state); a connection the
/// server opens to the client never gets an answer, and the firewall
/// dropped exactly the SYNs the server sent.
#[test]
fn the_firewall_lets_the_inside_connect_out_and_drops_connections_from_outside() {
    let _turn = turn();
    let w = Wire::new();
    let d = Dirs::new();
    let down = random_file(&d.path("srv"), "blob", MB20, 3);
    let _srv = w.http_server(&w.server, SERVER_IP, SERVER_HTTP, &d.path("srv"), &d.path("srv.log"));
    let _cli = w.http_server(&w.client, CLIENT_IP, CLIENT_HTTP, &d.path("cli"), &d.path("cli.log"));

    let mut host = Host::start(&w, d.tmp.path(), &["firewall"], FIREWALL, &[], RING);
    probe(&w, "tcp", SERVER_IP, SERVER_HTTP, &mut host);
    let url = format!("http://{SERVER_IP}:{SERVER_HTTP}/blob");
    assert_eq!(fetch(&w, &w.client, &url, &d.path("got/down")), sha256(&down));
    w.settle();

    let before = w.kernel();
    let url = format!("http://{CLIENT_IP}:{CLIENT_HTTP}/");
    let o = run(w.server("curl", &["-sS", "--connect-timeout", "2", "-o", "/dev/null", &url]));
    // 28: timed out. Dropped SYNs get no answer at all (7 would be a reset).
    assert_eq!(o.status.code(), Some(28), "the server's connection to the client: {}", text(&o));
    w.settle();
    let syns = w.kernel().h1_rx - before.h1_rx;
    let r = host.stop();

    assert!(syns >= 2, "curl sends a SYN and retries it within 2 s: {syns}");
    let fw = &r["nfs"][0];
    assert_eq!(fw["name"], "firewall");
    assert_eq!(n(&fw["dropped"]), syns, "the firewall dropped the server's SYNs and nothing else: {r:#}");
    assert_eq!(n(&r["ports"][1]["queues"][0]["dropped_by_nf"]), syns, "{r:#}");
    assert_eq!(n(&r["ports"][0]["queues"][0]["dropped_by_nf"]), 0, "{r:#}");
    let cli_log = std::fs::read_to_string(d.path("cli.log")).unwrap();
    assert!(!cli_log.contains("GET"), "the client's server was reached: {cli_log}");
}

/// The request lines of an http.server log, and whether every one came
/// from `from`.
fn requests_from(log: &Path, from: &str) -> (Vec<String>, bool) {
    let log = std::fs::read_to_string(log).unwrap();
    let lines: Vec<String> = log.lines().filter(|l| l.contains("\"GET ")).map(str::to_string).collect();
    let all = !lines.is_empty() && lines.iter().all(|l| l.starts_with(&format!("{from} - - ")));
    (lines, all)
}

/// Scenario 3: through the NAT the server sees the client as the public
/// address, and the download is intact.
#[test]
fn behind_the_nat_the_server_sees_the_public_address() {
    let _turn = turn();
    let w = Wire::new();
    let d = Dirs::new();
    let down = random_file(&d.path("srv"), "blob", MB20, 4);
    let _srv = w.http_server(&w.server, SERVER_IP, SERVER_HTTP, &d.path("srv"), &d.path("srv.log"));

    let mut host = Host::start(&w, d.tmp.path(), &["nat"], NAT, &[], RING);
    probe(&w, "tcp", SERVER_IP, SERVER_HTTP, &mut host);
    let url = format!("http://{SERVER_IP}:{SERVER_HTTP}/blob");
    assert_eq!(fetch(&w, &w.client, &url, &d.path("got/down")), sha256(&down));
    w.settle();
    let r = host.stop();

    let (lines, all) = requests_from(&d.path("srv.log"), PUBLIC_IP);
    assert!(all, "every request came from {PUBLIC_IP}: {lines:?}");
    assert_eq!(lines.len(), 1, "{lines:?}");
    let nat = &r["nfs"][0];
    assert_eq!(nat["name"], "nat");
    assert_eq!(n(&nat["dropped"]), 0, "{r:#}");
    assert_eq!(n(&nat["rewritten"]), n(&nat["packets"]), "every packet translated, both ways: {r:#}");
}

/// Scenario 4: firewall, NAT and monitor; replies from port 1 run the
/// chain last NF first, so the firewall sees the inside address both
/// ways, and the download passes with nothing dropped.
#[test]
fn a_firewall_nat_monitor_chain_carries_a_download_with_replies_run_in_reverse() {
    let _turn = turn();
    let w = Wire::new();
    let d = Dirs::new();
    let down = random_file(&d.path("srv"), "blob", MB20, 5);
    let _srv = w.http_server(&w.server, SERVER_IP, SERVER_HTTP, &d.path("srv"), &d.path("srv.log"));

    let config = format!("{FIREWALL}{NAT}");
    let chain = ["firewall", "nat", "monitor"];
    let mut host = Host::start(&w, d.tmp.path(), &chain, &config, &["--outside-ports", "1"], RING);
    probe(&w, "tcp", SERVER_IP, SERVER_HTTP, &mut host);
    let url = format!("http://{SERVER_IP}:{SERVER_HTTP}/blob");
    assert_eq!(fetch(&w, &w.client, &url, &d.path("got/down")), sha256(&down));
    w.settle();
    let r = host.stop();

    assert_eq!(r["chain"]["order"], serde_json::json!(chain), "{r:#}");
    assert_eq!(r["chain"]["outside_ports"], serde_json::json!([1]), "{r:#}");
    let (lines, all) = requests_from(&d.path("srv.log"), PUBLIC_IP);
    assert!(all && lines.len() == 1, "one request, from {PUBLIC_IP}: {lines:?}");
    for (i, name) in chain.iter().enumerate() {
        let nf = &r["nfs"][i];
        assert_eq!(nf["name"], *name, "{r:#}");
        assert_eq!(n(&nf["dropped"]), 0, "{name}: {r:#}");
        assert_eq!(n(&nf["packets"]), n(&r["rx"]), "{name} saw every packet: {r:#}");
    }
    assert_eq!(n(&r["tx"]), n(&r["rx"]), "{r:#}");
}

/// Scenario 5: UDP through the NAT, a 100-byte datagram and a 3,000-byte
/// one (which the client's kernel sends as three IP fragments, and the
/// port's socket reassembles): both come back intact, and the server saw
/// them from the public address.
#[test]
fn udp_datagrams_small_and_fragmented_are_echoed_through_the_nat() {
    let _turn = turn();
    let w = Wire::new();
    let d = Dirs::new();
    let log = std::fs::File::create(d.path("echo.log")).unwrap();
    let port = ECHO_PORT.to_string();
    let echo = w.server("python3", &["-u", "-c", UDP_ECHO, SERVER_IP, &port]).stdout(log).spawn().unwrap();
    let _echo = Bg(echo);

    let mut host = Host::start(&w, d.tmp.path(), &["nat"], NAT, &MBUF_BIG, RING_BIG_FRAMES);
    probe(&w, "udp", SERVER_IP, ECHO_PORT, &mut host);
    let got = must(w.client("python3", &["-c", UDP_SEND, SERVER_IP, &port, "100", "3000"]));
    w.settle();
    let r = host.stop();

    let echoed = std::fs::read_to_string(d.path("echo.log")).unwrap();
    assert_eq!(got, "100 intact\n3000 intact\n", "server saw:\n{echoed}report: {r:#}");
    let seen: Vec<&str> = echoed.lines().filter(|l| !l.ends_with(" 5")).collect();
    assert_eq!(seen, [format!("{PUBLIC_IP} 100"), format!("{PUBLIC_IP} 3000")], "{r:#}");
    // The 3,042-byte frame each way left cut into three fragments (the
    // interfaces' MTU is 1,500): two frames added each way.
    assert_eq!(n(&r["fragmented"]), 4, "{r:#}");
    assert_eq!(n(&r["dropped_by_nf"]) + n(&r["dropped_other"]) + n(&r["dropped_too_big"]), 0, "{r:#}");
    assert_eq!(n(&r["nfs"][0]["rewritten"]), n(&r["nfs"][0]["packets"]), "{r:#}");
}

/// Scenario 6: ICMP echo through the NAT (translated by identifier).
#[test]
fn ping_goes_through_the_nat() {
    let _turn = turn();
    let w = Wire::new();
    let d = Dirs::new();
    // A UDP echo only to know when the host forwards: ping's own three
    // tries are the test.
    let port = ECHO_PORT.to_string();
    let _echo = Bg(w.server("python3", &["-c", UDP_ECHO, SERVER_IP, &port]).stdout(Stdio::null()).spawn().unwrap());
    let mut host = Host::start(&w, d.tmp.path(), &["nat"], NAT, &[], RING);
    probe(&w, "udp", SERVER_IP, ECHO_PORT, &mut host);
    let o = run(w.client("ping", &["-c", "3", "-W", "1", SERVER_IP]));
    w.settle();
    let r = host.stop();
    let out = text(&o);
    assert!(o.status.success() && out.contains("3 received"), "{out}\nreport: {r:#}");
    // The server could also answer 10.0.0.5 itself: the NAT must have
    // translated every request and reply (and the probes) to pass them.
    let nat = &r["nfs"][0];
    assert_eq!(n(&nat["dropped"]), 0, "{r:#}");
    assert_eq!(n(&nat["rewritten"]), n(&nat["packets"]), "{r:#}");
}
