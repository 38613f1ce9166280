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
//! of two veth pairs, forwarding port 0 to port 1 and back; the wire and
//! its static routes are `realstack/wire.rs`'s (shared with the gateway's
//! `serve --dpdk` test). One test puts a router behind the server side,
//! with a narrower link beyond it, for path MTU discovery through the NAT.
//!
//! Each test builds its own wire (namespaces and veths named by pid and a
//! counter, removed on drop, also on panic), starts one host, waits until
//! its ports' packet sockets are bound and a connection goes through, runs
//! the traffic, stops the host with SIGINT and reads its `--report`. Tests
//! take turns: a host busy-polls a core, and two at once on a small machine
//! would starve the stacks they carry.

#![cfg(feature = "dpdk")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

#[path = "realstack/wire.rs"]
mod wire;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use wire::*;

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

fn nf(name: &str) -> PathBuf {
    let dir = std::env::var("SLUICE_NFS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/nfs"));
    let p = dir.join(format!("{name}.wasm"));
    assert!(p.exists(), "{} missing: run `make nfs`", p.display());
    p
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
        c.arg("--config").arg(&cfg).args(["dpdk", "--nf", &chain.join(","), "--pairs"]);
        if !extra.contains(&"--workers") {
            c.args(["--workers", "1"]);
        }
        c.args(extra).arg("--report").arg(&report).arg("--");
        c.args(["--no-huge", "--no-pci", "-m", "512", "--log-level=lib.eal:error"]);
        let prefix = format!("sluice-{}", w.h0);
        c.arg(format!("--file-prefix={prefix}"));
        c.args(w.vdevs(ring));
        c.stdout(std::fs::File::create(&out).unwrap()).stderr(std::fs::File::create(&err).unwrap());
        let mut host = Host { child: Some(c.spawn().unwrap()), report, out, err, prefix };
        wait_until("the host's packet sockets", 60, || {
            host.assert_running();
            w.bound()
        });
        host
    }

    /// Stops the host as a user would (SIGINT) and returns its report.
    fn stop(mut self) -> Value {
        let pid = self.child.as_ref().unwrap().id();
        must(Command::new("kill").args(["-INT", &pid.to_string()]));
        let mut status = None;
        // The child stays in `self` until it exited: killed on drop if not.
        wait_until("the host to stop after SIGINT", 30, || {
            status = self.child.as_mut().unwrap().try_wait().unwrap();
            status.is_some()
        });
        self.child = None;
        assert!(status.is_some_and(|s| s.success()), "the host stopped with {status:?}:\n{}", self.output());
        let r = std::fs::read(&self.report).unwrap_or_else(|e| panic!("report: {e}\n{}", self.output()));
        serde_json::from_slice(&r).unwrap()
    }
}

impl Running for Host {
    fn assert_running(&mut self) {
        if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().unwrap()) {
            panic!("the host exited ({status}):\n{}", self.output());
        }
    }

    fn output(&self) -> String {
        let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
        format!("stdout:\n{}\nstderr:\n{}", read(&self.out), read(&self.err))
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

/// Echoes every UDP datagram on `argv[1]:argv[2]`, printing its sender
/// and length.
const UDP_ECHO: &str = r#"
import socket, sys
s = socket.socket(socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET, socket.SOCK_DGRAM)
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
s = socket.socket(socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET, socket.SOCK_DGRAM)
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

/// Answers each datagram that holds a number with as many bytes, and
/// echoes any other.
const UDP_ANSWER: &str = r#"
import socket, sys
s = socket.socket(socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], int(sys.argv[2])))
while True:
    data, peer = s.recvfrom(65535)
    s.sendto(b"a" * int(data) if data.isdigit() else data, peer)
"#;

/// Asks `argv[1]:argv[2]` for `argv[3]` bytes from `argv[4]` sockets of
/// their own (flows), one after the other, each up to three times; prints
/// how many got their answer whole.
const UDP_ASK: &str = r#"
import socket, sys
answered = 0
for _ in range(int(sys.argv[4])):
    s = socket.socket(socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(1)
    s.connect((sys.argv[1], int(sys.argv[2])))
    for _ in range(3):
        s.send(sys.argv[3].encode())
        try:
            answered += len(s.recv(65535)) == int(sys.argv[3])
            break
        except socket.timeout:
            pass
    s.close()
print(answered)
"#;

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

/// The load balancer between real stacks: the server namespace holds two
/// backends (two addresses on its end), the client reaches the VIP (a
/// static neighbour entry, as the lb's README says to deploy it). Eight
/// connections from eight ports download the same file intact, the
/// backends' kernels accepted the rewritten segments (both backends got
/// connections, from the client's own address), and with `offload` the
/// same holds while the host rewrites the established packets itself. On
/// two workers (two queues a port) a backend's reply, which hashes apart
/// from the connection to the VIP, is handed to the worker that chose the
/// backend.
#[test]
fn the_load_balancer_spreads_real_connections_over_its_backends_with_and_without_offload() {
    const VIP: &str = "198.51.100.100";
    const BACKENDS: [&str; 2] = ["198.51.100.21", "198.51.100.22"];
    for (offload, workers) in [(false, 1), (true, 1), (false, 2)] {
        let _turn = turn();
        let w = Wire::new();
        let d = Dirs::new();
        let down = random_file(&d.path("srv"), "blob", 1 << 20, 12);
        let s0 = w.mac(&w.server, "s0");
        ip(&["-n", &w.client, "neigh", "add", VIP, "lladdr", &s0, "dev", "c0"]);
        for b in BACKENDS {
            ip(&["-n", &w.server, "addr", "add", &format!("{b}/24"), "dev", "s0"]);
        }
        let _srv = w.http_server(&w.server, "0.0.0.0", SERVER_HTTP, &d.path("srv"), &d.path("srv.log"));
        let config = format!(
            "[nf.lb.config]\nvip = \"{VIP}\"\nport = {SERVER_HTTP}\nprotocol = \"tcp\"\n\
             backends = [\"{}\", \"{}\"]\noffload = {offload}\n",
            BACKENDS[0], BACKENDS[1]
        );
        let workers_arg = workers.to_string();
        let ring = format!("{RING},qpairs={workers}");
        let mut host = Host::start(&w, d.tmp.path(), &["lb"], &config, &["--workers", &workers_arg], &ring);
        probe(&w, "tcp", VIP, SERVER_HTTP, &mut host);
        let url = format!("http://{VIP}:{SERVER_HTTP}/blob");
        for port in 40_001..40_009 {
            let to = d.path(&format!("got/{port}"));
            let o = run(w.client(
                "curl",
                &["-sS", "--fail", "--local-port", &port.to_string(), "-o", to.to_str().unwrap(), &url],
            ));
            assert!(o.status.success(), "offload {offload}, {workers} workers, port {port}: {}", text(&o));
            assert_eq!(sha256(&to), sha256(&down), "offload {offload}, {workers} workers, port {port}");
        }
        w.settle();
        let r = host.stop();
        let (lines, all) = requests_from(&d.path("srv.log"), CLIENT_IP);
        assert!(all && lines.len() == 8, "eight requests, from {CLIENT_IP}: {lines:?}");
        // Which backend each connection reached: the server's sockets.
        let sockets = must(w.server("ss", &["-tn", "state", "time-wait"]));
        for b in BACKENDS {
            assert!(sockets.contains(&format!("{b}:{SERVER_HTTP}")), "no connection reached {b}:\n{sockets}");
        }
        assert_eq!(n(&r["dropped_by_nf"]), 0, "{r:#}");
        let offloaded = r["chain"]["offload"]["packets"].as_u64().unwrap_or(0);
        if offload {
            // 1 MiB each way over eight connections is at least 5,000 segments.
            assert!(offloaded > 5_000, "{r:#}");
        } else {
            assert_eq!(offloaded, 0, "{r:#}");
        }
    }
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

/// The NAT on two workers, each port read through two queues
/// (`qpairs=2`: the kernel spreads a port's frames over its two sockets by
/// a flow hash): sixteen connections, spread over both queues of both
/// ports, all arrive intact from the public address. A reply comes to the
/// public address, which hashes apart from the connection it answers, so
/// it may come in on the other worker: the NAT's translations are
/// host-wide, and either worker finds them.
#[test]
fn the_nat_on_two_workers_carries_connections_spread_over_both_queues() {
    let _turn = turn();
    let w = Wire::new();
    let d = Dirs::new();
    let down = random_file(&d.path("srv"), "blob", 1 << 20, 6);
    let _srv = w.http_server(&w.server, SERVER_IP, SERVER_HTTP, &d.path("srv"), &d.path("srv.log"));
    let ring = format!("{RING},qpairs=2");
    let mut host = Host::start(&w, d.tmp.path(), &["nat"], NAT, &["--workers", "2"], &ring);
    probe(&w, "tcp", SERVER_IP, SERVER_HTTP, &mut host);
    let url = format!("http://{SERVER_IP}:{SERVER_HTTP}/blob");
    for i in 0..16 {
        assert_eq!(fetch(&w, &w.client, &url, &d.path(&format!("got/{i}"))), sha256(&down), "download {i}");
    }
    w.settle();
    let r = host.stop();
    let (lines, all) = requests_from(&d.path("srv.log"), PUBLIC_IP);
    assert!(all && lines.len() == 16, "sixteen requests, all from {PUBLIC_IP}: {lines:?}");
    for port in 0..2 {
        let queues = r["ports"][port]["queues"].as_array().unwrap();
        assert_eq!(queues.len(), 2, "{r:#}");
        assert!(queues.iter().all(|q| n(&q["rx"]) > 0), "port {port}: both queues received: {r:#}");
    }
    assert_eq!(n(&r["workers"]), 2, "{r:#}");
    assert_eq!(n(&r["tx"]), n(&r["rx"]), "{r:#}");
    assert_eq!(n(&r["nfs"][0]["dropped"]), 0, "{r:#}");
}

/// A firewall and the NAT on two workers, each port read through two
/// queues: a reply to the public address hashes apart from the connection
/// it answers and may come in on the worker without the firewall's state
/// of it; that worker hands it to the one that translated the connection.
/// Sixteen connections arrive intact, from the public address, none
/// dropped, and what one worker handed over the other took in.
#[test]
fn a_firewall_and_nat_on_two_workers_carry_every_connection() {
    let _turn = turn();
    let w = Wire::new();
    let d = Dirs::new();
    let down = random_file(&d.path("srv"), "blob", 1 << 20, 7);
    let _srv = w.http_server(&w.server, SERVER_IP, SERVER_HTTP, &d.path("srv"), &d.path("srv.log"));
    let config = format!("{FIREWALL}{NAT}");
    let ring = format!("{RING},qpairs=2");
    let extra = ["--outside-ports", "1", "--workers", "2"];
    let mut host = Host::start(&w, d.tmp.path(), &["firewall", "nat"], &config, &extra, &ring);
    probe(&w, "tcp", SERVER_IP, SERVER_HTTP, &mut host);
    let url = format!("http://{SERVER_IP}:{SERVER_HTTP}/blob");
    for i in 0..16 {
        assert_eq!(fetch(&w, &w.client, &url, &d.path(&format!("got/{i}"))), sha256(&down), "download {i}");
    }
    let o = run(w.client("ping", &["-c", "3", "-i", "0.2", "-W", "1", SERVER_IP]));
    assert!(text(&o).contains("3 received"), "{}", text(&o));
    w.settle();
    let r = host.stop();
    let (lines, all) = requests_from(&d.path("srv.log"), PUBLIC_IP);
    assert!(all && lines.len() == 16, "sixteen requests, all from {PUBLIC_IP}: {lines:?}");
    assert_eq!(n(&r["dropped_by_nf"]), 0, "{r:#}");
    assert_eq!(n(&r["tx"]), n(&r["rx"]), "{r:#}");
    let queues = || r["ports"].as_array().unwrap().iter().flat_map(|p| p["queues"].as_array().unwrap().iter());
    let handed: u64 = queues().map(|q| n(&q["handed_off"])).sum();
    let taken: u64 = queues().map(|q| n(&q["taken_over"])).sum();
    assert_eq!(handed, taken, "{r:#}");
    eprintln!("handed over: {handed}");
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

/// A real TCP download through the policer at 2,000,000 bytes a second
/// with a burst of 1,000,000: it arrives intact (TCP resends what the
/// policer dropped), the policer dropped some of it, and it took at least
/// the time the rate gives the bytes beyond the burst.
#[test]
fn a_download_through_the_policer_arrives_intact_at_its_rate() {
    let _turn = turn();
    let w = Wire::new();
    let d = Dirs::new();
    let len = 4_000_000;
    let down = random_file(&d.path("srv"), "blob", len, 5);
    let _srv = w.http_server(&w.server, SERVER_IP, SERVER_HTTP, &d.path("srv"), &d.path("srv.log"));
    let config = "[nf.ratelimit.config]\nbytes-per-second = 2000000\nbyte-burst = 1000000\n";
    let mut host = Host::start(&w, d.tmp.path(), &["ratelimit"], config, &[], RING);
    probe(&w, "tcp", SERVER_IP, SERVER_HTTP, &mut host);
    let url = format!("http://{SERVER_IP}:{SERVER_HTTP}/blob");
    let started = std::time::Instant::now();
    assert_eq!(fetch(&w, &w.client, &url, &d.path("got/down")), sha256(&down));
    let took = started.elapsed();
    w.settle();
    let r = host.stop();
    let policer = &r["nfs"][0];
    assert!(n(&policer["dropped"]) > 0, "{r:#}");
    // A new flow starts with a full bucket: the rest waits for the rate.
    let floor = std::time::Duration::from_secs_f64((len - 1_000_000) as f64 / 2_000_000.0);
    assert!(took >= floor, "{len} bytes in {took:?}: faster than the policer's rate allows\n{r:#}");
}

/// A DNS server on `[::]:53` (IPv4 and IPv6): answers each query with one
/// A record (192.0.2.1) and prints the name; echoes anything too short
/// to be a query (the probe).
const DNS_SERVER: &str = r#"
import socket, struct
s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
s.bind(("::", 53))
while True:
    d, peer = s.recvfrom(2048)
    if len(d) < 17:
        s.sendto(d, peer)
        continue
    labels, i = [], 12
    while d[i]:
        labels.append(d[i + 1 : i + 1 + d[i]].decode())
        i += 1 + d[i]
    print(".".join(labels), flush=True)
    record = b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, 60, 4) + bytes([192, 0, 2, 1])
    s.sendto(d[:2] + struct.pack("!HHHHH", 0x8180, 1, 1, 0, 0) + d[12:] + record, peer)
"#;

/// Looks up each name of `argv[2:]` at the server `argv[1]` (one A query,
/// 2 s to answer) and prints the name, who answered, the response code and
/// the number of answers, or that nothing came.
const DNS_LOOKUP: &str = r#"
import socket, struct, sys
server = sys.argv[1]
for k, name in enumerate(sys.argv[2:]):
    s = socket.socket(socket.AF_INET6 if ":" in server else socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(2)
    question = b"".join(bytes([len(l)]) + l.encode() for l in name.split(".")) + b"\0" + struct.pack("!HH", 1, 1)
    s.sendto(struct.pack("!HHHHHH", 0x4000 + k, 0x0100, 1, 0, 0, 0) + question, (server, 53))
    try:
        d, peer = s.recvfrom(2048)
        ok = d[:2] == struct.pack("!H", 0x4000 + k) and d[12:12 + len(question)] == question
        print(name, peer[0], "rcode", d[3] & 0xF, "answers", struct.unpack("!H", d[6:8])[0], "" if ok else "mismatched")
    except socket.timeout:
        print(name, "no answer")
"#;

/// A resolver's lookups through the DNS filter, over IPv4 and IPv6: a
/// blocked name (and its subdomain) gets NXDOMAIN back at once from the
/// server's address, sent back out of the port the query came in on,
/// and never reaches the server; other names get the server's answer.
#[test]
fn blocked_lookups_are_answered_nxdomain_back_to_the_client() {
    let _turn = turn();
    let w = Wire::new().with_ipv6();
    let d = Dirs::new();
    let log = std::fs::File::create(d.path("dns.log")).unwrap();
    let _dns = Bg(w.server("python3", &["-u", "-c", DNS_SERVER]).stdout(log).spawn().unwrap());
    let config = "[nf.dns-filter.config]\nblock = [\"ads.example\"]\n";
    let mut host = Host::start(&w, d.tmp.path(), &["dns-filter"], config, &[], RING);
    probe(&w, "udp", SERVER_IP, 53, &mut host);
    probe(&w, "udp", SERVER_IP6, 53, &mut host);
    let names = ["www.example.org", "ads.example", "x.ads.example"];
    let mut got = String::new();
    for server in [SERVER_IP, SERVER_IP6] {
        let mut args = vec!["-c", DNS_LOOKUP, server];
        args.extend(names);
        got += &must(w.client("python3", &args));
    }
    w.settle();
    let r = host.stop();
    let mut want = String::new();
    for server in [SERVER_IP, SERVER_IP6] {
        want += &format!("www.example.org {server} rcode 0 answers 1 \n");
        want += &format!("ads.example {server} rcode 3 answers 0 \n");
        want += &format!("x.ads.example {server} rcode 3 answers 0 \n");
    }
    let asked = std::fs::read_to_string(d.path("dns.log")).unwrap();
    assert_eq!(got, want, "the server was asked:\n{asked}report: {r:#}");
    assert_eq!(asked, "www.example.org\nwww.example.org\n", "{r:#}");
    let filter = &r["nfs"][0];
    assert_eq!(n(&filter["rewritten"]), 4, "{r:#}");
    assert_eq!(n(&r["events_by_kind"]["dns-filter/dns.blocked"]), 4, "{r:#}");
    assert_eq!(n(&r["dropped_by_nf"]), 0, "{r:#}");
}

/// That `ns` resolved `to` on its interface `dev` to `mac`.
fn assert_resolved(w: &Wire, ns: &str, dev: &str, to: &str, mac: &str) {
    let known = must(w.exec(ns, "ip", &["neigh", "show", "dev", dev]));
    assert!(known.contains(&format!("{to} lladdr {mac}")), "{ns} knows: {known}");
}

/// Hosts that find each other as hosts on a link do — ARP, and IPv6 with
/// link-local addresses, duplicate address detection, multicast listener
/// reports and neighbour discovery, no static neighbour entry — reach each
/// other through a firewall whose rules name only the inside's addresses:
/// the link protocols pass without a rule, and nothing the kernels sent is
/// dropped.
#[test]
fn through_the_firewall_hosts_resolve_each_other_by_arp_and_neighbour_discovery() {
    let _turn = turn();
    let w = Wire::new().resolving();
    let d = Dirs::new();
    let down = random_file(&d.path("srv"), "blob", 1 << 20, 9);
    let _srv = w.http_server(&w.server, "::", SERVER_HTTP, &d.path("srv"), &d.path("srv.log"));
    let config = r#"
[nf.firewall.config]
default = "deny"
rules = [{ action = "allow", src = "10.0.0.0/24" }, { action = "allow", src = "2001:db8:1::/64" }]
"#;
    let mut host = Host::start(&w, d.tmp.path(), &["firewall"], config, &[], RING);
    probe(&w, "tcp", SERVER_IP, SERVER_HTTP, &mut host);
    probe(&w, "tcp", SERVER_IP6, SERVER_HTTP, &mut host);
    for url in [format!("http://{SERVER_IP}:{SERVER_HTTP}/blob"), format!("http://[{SERVER_IP6}]:{SERVER_HTTP}/blob")] {
        assert_eq!(fetch(&w, &w.client, &url, &d.path("got/down")), sha256(&down), "{url}");
    }
    w.settle();
    let r = host.stop();
    // Each learned the other's MAC through the host.
    for to in [SERVER_IP, SERVER_IP6] {
        assert_resolved(&w, &w.client, "c0", to, &w.mac(&w.server, "s0"));
    }
    for to in [CLIENT_IP, CLIENT_IP6] {
        assert_resolved(&w, &w.server, "s0", to, &w.mac(&w.client, "c0"));
    }
    assert_eq!(n(&r["dropped_by_nf"]), 0, "{r:#}");
}

/// The same on a firewall and NAT chain, as a small site would run it: the
/// client resolves the server by ARP through the host, and the server the
/// NAT's public address, which the client (the site's router) answers for
/// by proxy ARP; the server sees only the public address.
#[test]
fn behind_a_firewall_and_nat_the_public_address_is_resolved_by_the_sites_proxy_arp() {
    let _turn = turn();
    let w = Wire::new().resolving();
    let d = Dirs::new();
    let down = random_file(&d.path("srv"), "blob", 1 << 20, 10);
    let _srv = w.http_server(&w.server, SERVER_IP, SERVER_HTTP, &d.path("srv"), &d.path("srv.log"));
    // nfs-wasm/nat/README.md, "On a link".
    must(w.client("sysctl", &["-qw", "net.ipv4.ip_forward=1", "net.ipv4.conf.c0.proxy_arp=1"]));
    ip(&["-n", &w.client, "route", "add", &format!("{PUBLIC_IP}/32"), "dev", "lo"]);
    let config = format!("{FIREWALL}{NAT}");
    let mut host = Host::start(&w, d.tmp.path(), &["firewall", "nat"], &config, &["--outside-ports", "1"], RING);
    probe(&w, "tcp", SERVER_IP, SERVER_HTTP, &mut host);
    let url = format!("http://{SERVER_IP}:{SERVER_HTTP}/blob");
    assert_eq!(fetch(&w, &w.client, &url, &d.path("got/down")), sha256(&down));
    w.settle();
    let r = host.stop();
    let (lines, all) = requests_from(&d.path("srv.log"), PUBLIC_IP);
    assert!(all && lines.len() == 1, "one request, from {PUBLIC_IP}: {lines:?}");
    assert_resolved(&w, &w.server, "s0", PUBLIC_IP, &w.mac(&w.client, "c0"));
    assert_eq!(n(&r["dropped_by_nf"]), 0, "{r:#}");
}

/// With checksum offload left on at the client's end of the wire (the
/// default of a veth), the kernel hands the host TCP segments whose
/// checksums a device was to finish; forwarded as they are, the server
/// drops them and TCP stalls. The host does not finish them (with
/// segmentation offload, also on by default, the frames are cut
/// super-frames that nothing can mend), but it says why, naming the fix.
#[test]
fn a_port_fed_by_an_interface_with_checksum_offload_on_is_named_with_the_fix() {
    let _turn = turn();
    let w = Wire::new();
    let d = Dirs::new();
    let _srv = w.http_server(&w.server, SERVER_IP, SERVER_HTTP, &d.path("srv"), &d.path("srv.log"));
    must(w.client("ethtool", &["-K", "c0", "tx", "on"]));
    let mut host = Host::start(&w, d.tmp.path(), &["noop"], "", &[], RING);
    let url = format!("http://{SERVER_IP}:{SERVER_HTTP}/");
    let o = run(w.client("curl", &["-sS", "--connect-timeout", "2", "-o", "/dev/null", &url]));
    assert!(!o.status.success(), "a connection went through: {}", text(&o));
    wait_until("the host's warning", 10, || {
        host.assert_running();
        host.output().contains("port 0 received a TCP or UDP checksum left for a device to finish")
    });
    assert!(host.output().contains("ethtool -K <interface> tx off"), "{}", host.output());
    host.stop();
}

/// Scenario 5b: IPv6 fragments, which the PMD's socket does not
/// reassemble, through the firewall with `--fragments reassemble`: the
/// client's and the server's kernels send each 3,000-byte datagram as
/// three fragments, the host puts them back together, the firewall decides
/// on the whole datagram (the reply as part of the connection), and the
/// datagram leaves cut as it came; both come back intact.
#[test]
fn ipv6_fragments_are_reassembled_for_the_firewall_and_cut_again() {
    let _turn = turn();
    let w = Wire::new().with_ipv6();
    let d = Dirs::new();
    let log = std::fs::File::create(d.path("echo.log")).unwrap();
    let port = ECHO_PORT.to_string();
    let echo = w.server("python3", &["-u", "-c", UDP_ECHO, SERVER_IP6, &port]).stdout(log).spawn().unwrap();
    let _echo = Bg(echo);
    let config = r#"
[nf.firewall.config]
default = "deny"
rules = [{ action = "allow", src = "2001:db8:1::/64" }]
"#;
    let mut host = Host::start(&w, d.tmp.path(), &["firewall"], config, &["--fragments", "reassemble"], RING);
    probe(&w, "udp", SERVER_IP6, ECHO_PORT, &mut host);
    let got = must(w.client("python3", &["-c", UDP_SEND, SERVER_IP6, &port, "3000", "100", "3000"]));
    w.settle();
    let r = host.stop();
    let echoed = std::fs::read_to_string(d.path("echo.log")).unwrap();
    assert_eq!(got, "3000 intact\n100 intact\n3000 intact\n", "server saw:\n{echoed}report: {r:#}");
    let c = &r["chain"];
    assert_eq!(c["fragments"], "reassemble", "{r:#}");
    // Two datagrams each way, three fragments each.
    assert_eq!((n(&c["datagrams_reassembled"]), n(&c["fragments_held"])), (4, 8), "{r:#}");
    assert_eq!(n(&r["reassembling"]), 8, "{r:#}");
    assert_eq!(n(&r["fragmented"]), 8, "cut again as they came: {r:#}");
    assert_eq!(n(&c["fragments_refused"]) + n(&c["fragments_discarded"]), 0, "{r:#}");
}

/// The firewall on two workers, each port read through two queues: small
/// IPv6 requests from sixteen flows of the client, each answered with a
/// 3,000-byte datagram that the server's kernel sends as three fragments.
/// The kernel's fanout places a fragment by its addresses alone (it does
/// not reassemble IPv6 for the sockets), so an answer may come in on the
/// worker without the firewall's state of its flow, made by the request;
/// that worker passes it round to the one that holds it. Every answer
/// arrives, with the fragments followed and with them reassembled, and
/// what one worker passed over the other took in.
#[test]
fn large_udp_answers_in_ipv6_fragments_reach_the_flows_worker_through_the_firewall() {
    let _turn = turn();
    let w = Wire::new().with_ipv6();
    let d = Dirs::new();
    let port = ECHO_PORT.to_string();
    let _answer = Bg(w.server("python3", &["-c", UDP_ANSWER, SERVER_IP6, &port]).spawn().unwrap());
    let config = r#"
[nf.firewall.config]
default = "deny"
rules = [{ action = "allow", src = "2001:db8:1::/64" }]
"#;
    let ring = format!("{RING},qpairs=2");
    for mode in ["follow", "reassemble"] {
        let extra = ["--workers", "2", "--fragments", mode];
        let mut host = Host::start(&w, d.tmp.path(), &["firewall"], config, &extra, &ring);
        probe(&w, "udp", SERVER_IP6, ECHO_PORT, &mut host);
        let got = must(w.client("python3", &["-c", UDP_ASK, SERVER_IP6, &port, "3000", "16"]));
        w.settle();
        let r = host.stop();
        assert_eq!(got.trim(), "16", "{mode}: answers that arrived whole: {r:#}");
        assert_eq!(n(&r["dropped_by_nf"]), 0, "{mode}: {r:#}");
        assert_eq!(n(&r["chain"]["fragments_unmatched"]), 0, "{mode}: {r:#}");
        let queues = || r["ports"].as_array().unwrap().iter().flat_map(|p| p["queues"].as_array().unwrap().iter());
        let handed: u64 = queues().map(|q| n(&q["handed_off"])).sum();
        let taken: u64 = queues().map(|q| n(&q["taken_over"])).sum();
        assert_eq!(handed, taken, "{mode}: {r:#}");
        assert!(handed > 0, "{mode}: no answer came in on the other worker in sixteen flows: {r:#}");
        // No NF translates here: no flow has a home, every hand-off is a
        // fragment passed on.
        let passed: u64 = queues().map(|q| n(&q["passed_on"])).sum();
        assert_eq!(passed, handed, "{mode}: {r:#}");
    }
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

/// Takes TCP connections on `argv[1]:argv[2]`, one after another: reads
/// each to its end, prints the peer, the length and the SHA-256 of what
/// came, and sends the SHA-256 back. A connection that sent nothing (the
/// probe's) gets no answer: the probe has closed its socket, and the
/// answer would get a reset, racing the sink's FIN to the firewall, which
/// forgets the connection at the reset and drops the FIN.
const TCP_SINK: &str = r#"
import hashlib, socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(8)
while True:
    c, peer = s.accept()
    h, n = hashlib.sha256(), 0
    while True:
        b = c.recv(65536)
        if not b:
            break
        h.update(b)
        n += len(b)
    print(peer[0], n, h.hexdigest(), flush=True)
    if n:
        c.sendall(h.hexdigest().encode())
    c.close()
"#;

/// Sends the file `argv[3]` to `argv[1]:argv[2]`, closes its side and
/// prints what comes back.
const TCP_SEND: &str = r#"
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30)
s.sendall(open(sys.argv[3], "rb").read())
s.shutdown(socket.SHUT_WR)
back = b""
while True:
    b = s.recv(4096)
    if not b:
        break
    back += b
print(back.decode())
"#;

const SINK_PORT: u16 = 9009;

/// Scenario 8: path MTU discovery through firewall -> NAT. Behind the
/// host's outside port a router forwards to a link of MTU 1280; the
/// client's 2 MB upload leaves in 1500-byte segments with DF set, the
/// router drops them and sends frag-needed (mtu 1280) to the public
/// address, the NAT translates the error back to the client (RFC 5508,
/// the quoted header too) and the firewall lets it pass as its
/// connection's, the client's kernel lowers its path MTU, and the upload
/// arrives whole. A ping too big for the link gets its frag-needed the
/// same way, about an echo instead of a TCP segment. On one worker and on
/// two (where an error may come in on the worker without its connection).
#[test]
fn path_mtu_discovery_works_through_the_nat_for_tcp_and_ping() {
    let _turn = turn();
    // On two workers the errors come in on either: each goes where the
    // connection it quotes was translated.
    for workers in ["1", "2"] {
        path_mtu_discovery_through_the_nat_on(workers);
    }
}

fn path_mtu_discovery_through_the_nat_on(workers: &str) {
    let w = Wire::routed();
    let d = Dirs::new();
    let up = random_file(&d.path("cli"), "blob", 2_000_000, 8);
    let port = SINK_PORT.to_string();
    let log = std::fs::File::create(d.path("sink.log")).unwrap();
    let _sink = Bg(w.far("python3", &["-u", "-c", TCP_SINK, FAR_IP, &port]).stdout(log).spawn().unwrap());

    let config = format!("{FIREWALL}{NAT}");
    let ring = format!("{RING},qpairs={workers}");
    let extra = ["--outside-ports", "1", "--workers", workers];
    let mut host = Host::start(&w, d.tmp.path(), &["firewall", "nat"], &config, &extra, &ring);
    probe(&w, "tcp", FAR_IP, SINK_PORT, &mut host);
    let (router_unreach, client_unreach) =
        (w.icmp_stat(&w.server, "OutDestUnreachs"), w.icmp_stat(&w.client, "InDestUnreachs"));
    let sent = run(w.client("python3", &["-c", TCP_SEND, FAR_IP, &port, up.to_str().unwrap()]));
    let route = must(w.client("ip", &["route", "get", FAR_IP]));
    // The ping goes to the far side's other address: no path MTU is
    // known for it yet, so the kernel sends the 1428-byte echo.
    let size = "1400";
    let ping = run(w.client("ping", &["-n", "-c", "1", "-W", "2", "-M", "do", "-s", size, FAR_IP2]));
    let (router_unreach, client_unreach) = (
        w.icmp_stat(&w.server, "OutDestUnreachs") - router_unreach,
        w.icmp_stat(&w.client, "InDestUnreachs") - client_unreach,
    );
    let route2 = must(w.client("ip", &["route", "get", FAR_IP2]));
    w.settle();
    let r = host.stop();

    let sink = std::fs::read_to_string(d.path("sink.log")).unwrap();
    eprintln!(
        "{workers} worker(s): frag-needed: {router_unreach} sent, {client_unreach} received; {route}{}",
        text(&ping)
    );
    let digest = sha256(&up);
    assert!(sent.status.success() && text(&sent).trim() == digest, "upload: {}\nsink: {sink}\n{r:#}", text(&sent));
    assert!(sink.lines().any(|l| l == format!("{PUBLIC_IP} 2000000 {digest}")), "the far server saw: {sink}");
    assert!(router_unreach > 0, "the router sent no frag-needed");
    assert_eq!(
        client_unreach, router_unreach,
        "{workers} worker(s): the client got {client_unreach} of the router's {router_unreach} errors: {r:#}"
    );
    assert!(route.contains(&format!("mtu {FAR_MTU}")), "no path MTU cached for {FAR_IP}: {route}");
    let ping = text(&ping);
    assert!(ping.contains(&format!("Frag needed and DF set (mtu = {FAR_MTU})")), "ping: {ping}\n{r:#}");
    assert!(route2.contains(&format!("mtu {FAR_MTU}")), "no path MTU cached for {FAR_IP2}: {route2}");
    assert_eq!(r["chain"]["order"], serde_json::json!(["firewall", "nat"]), "{r:#}");
    for (i, name) in ["firewall", "nat"].iter().enumerate() {
        let nf = &r["nfs"][i];
        assert_eq!(nf["name"], *name, "{r:#}");
        assert_eq!(n(&nf["dropped"]), 0, "{name} dropped what it should have passed: {r:#}");
    }
    // Every error is about a connection the NAT translated: it is run
    // where it came in if that worker translated it, else handed straight
    // there; none goes round the workers looking for its flow.
    let queues = || r["ports"].as_array().unwrap().iter().flat_map(|p| p["queues"].as_array().unwrap().iter());
    let passed: u64 = queues().map(|q| n(&q["passed_on"])).sum();
    assert_eq!(passed, 0, "{workers} worker(s): errors passed round the workers: {r:#}");
}
