//! The wire of the real-stack tests: Linux network namespaces joined by
//! veth pairs to the two interfaces a Sluice host runs DPDK's
//! `net_af_packet` on, and the kernel tools that drive traffic over it.
//!
//! ```text
//!  netns client            root netns                         netns server
//!  c0 10.0.0.5/24 ──veth── h0 (port 0, inside) ─┐   ┌─ h1 (port 1, outside) ──veth── s0 198.51.100.7/24
//!                                            a Sluice host
//! ```
//!
//! The host is a bump in the wire: it answers no ARP, so both sides reach
//! each other through static routes and static neighbour entries that
//! name the far side's MAC (the wire then carries only the tests' own
//! frames); the server reaches the NAT's public address 203.0.113.1 the
//! same way, with the client's MAC. [`Wire::resolving`] removes the
//! neighbour entries: the kernels then resolve each other through the
//! host, by ARP and IPv6 neighbour discovery. Checksum and
//! segmentation offloads are off on all four veth ends, so every frame
//! carries real checksums and no frame is longer than the MTU.
//!
//! [`Wire::routed`] makes the server namespace a router in front of a
//! third namespace, `far`, over a link with a smaller MTU:
//!
//! ```text
//!  … h1 ──veth── s0 198.51.100.7/24 [router, forwarding] r1 192.0.2.1/24 ──veth (MTU 1280)── f0 192.0.2.7, .8/24  netns far
//! ```
//!
//! Namespaces and veths are named by pid and a counter and removed on
//! drop, also on panic. Shared by `sluice-host dpdk`'s tests
//! (`host/cli/tests/realstack.rs`) and `serve --dpdk`'s under the gateway
//! (`gateway/tests/realstack_live.rs`), which include this file.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

use std::borrow::BorrowMut;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub const CLIENT_IP: &str = "10.0.0.5";
pub const SERVER_IP: &str = "198.51.100.7";
pub const PUBLIC_IP: &str = "203.0.113.1";
/// The client's and server's IPv6 addresses ([`Wire::with_ipv6`]).
pub const CLIENT_IP6: &str = "2001:db8:1::5";
pub const SERVER_IP6: &str = "2001:db8:2::7";
/// The far namespace's addresses, behind the router ([`Wire::routed`]).
pub const FAR_IP: &str = "192.0.2.7";
pub const FAR_IP2: &str = "192.0.2.8";
/// The MTU of the router's link to the far namespace.
pub const FAR_MTU: u32 = 1280;
pub const SERVER_HTTP: u16 = 8080;
pub const CLIENT_HTTP: u16 = 8081;
pub const ECHO_PORT: u16 = 7007;

/// The `net_af_packet` ring of every port: deep enough that a TCP window
/// never finds it full.
pub const RING: &str = "framecnt=4096";

/// One host at a time: a host busy-polls a core, and two at once on a
/// small machine would starve the stacks they carry.
static TURN: Mutex<()> = Mutex::new(());
static WIRES: AtomicU32 = AtomicU32::new(0);

pub fn turn() -> std::sync::MutexGuard<'static, ()> {
    TURN.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// Runs a command (owned or borrowed) to its end.
pub fn run(mut c: impl BorrowMut<Command>) -> Output {
    let c = c.borrow_mut();
    c.output().unwrap_or_else(|e| panic!("{c:?}: {e}"))
}

/// Runs a command that must succeed; returns its stdout.
pub fn must(mut c: impl BorrowMut<Command>) -> String {
    let c = c.borrow_mut();
    let o = run(&mut *c);
    assert!(o.status.success(), "{c:?}: {}", text(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn ip(args: &[&str]) {
    must(Command::new("ip").args(args));
}

/// Waits for `cond` (every 50 ms) until `secs` have passed.
pub fn wait_until(what: &str, secs: u64, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A process killed on drop (a server in a namespace).
pub struct Bg(pub Child);

impl Drop for Bg {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A host under test, as the wire's helpers see it.
pub trait Running {
    /// Panics, with what the host wrote, if it exited.
    fn assert_running(&mut self);
    /// What the host wrote so far.
    fn output(&self) -> String;
}

/// Packets the kernel counted on the host's two interfaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kernel {
    pub h0_rx: u64,
    pub h0_tx: u64,
    pub h1_rx: u64,
    pub h1_tx: u64,
}

pub const OFFLOADS: [&str; 12] = ["tx", "off", "rx", "off", "tso", "off", "gso", "off", "gro", "off", "sg", "off"];

/// The namespaces and veth pairs, removed on drop.
pub struct Wire {
    pub client: String,
    /// The server's namespace; a router in a [`Wire::routed`] wire.
    pub server: String,
    /// Behind the router ([`Wire::routed`]).
    pub far: Option<String>,
    /// Root end of the client's pair: DPDK port 0, the inside.
    pub h0: String,
    /// Root end of the server's pair: DPDK port 1, the outside.
    pub h1: String,
}

impl Wire {
    pub fn new() -> Wire {
        Wire::make(false)
    }

    /// A wire whose server namespace routes on to the far namespace over
    /// a link of MTU [`FAR_MTU`].
    pub fn routed() -> Wire {
        Wire::make(true)
    }

    fn make(routed: bool) -> Wire {
        let n = WIRES.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let w = Wire {
            client: format!("sluice-rs{pid}-{n}-client"),
            server: format!("sluice-rs{pid}-{n}-server"),
            far: routed.then(|| format!("sluice-rs{pid}-{n}-far")),
            h0: format!("rs{pid}-{n}i"),
            h1: format!("rs{pid}-{n}o"),
        };
        // Built in place, so a failure half-way still removes what exists.
        w.build();
        if let Some(far) = &w.far {
            w.build_far(far);
        }
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

    /// The router's second link, to `far`: MTU [`FAR_MTU`] on both ends,
    /// the kernel's own ARP (no DPDK host on it).
    fn build_far(&self, far: &str) {
        let router = &self.server;
        let mtu = FAR_MTU.to_string();
        ip(&["netns", "add", far]);
        ip(&["-n", router, "link", "add", "r1", "type", "veth", "peer", "name", "f0", "netns", far]);
        must(self.exec(router, "sysctl", &["-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.r1.disable_ipv6=1"]));
        must(self.exec(far, "sysctl", &["-qw", "net.ipv6.conf.f0.disable_ipv6=1"]));
        for (ns, end, addrs) in
            [(router.as_str(), "r1", &["192.0.2.1/24"][..]), (far, "f0", &["192.0.2.7/24", "192.0.2.8/24"])]
        {
            for a in addrs {
                ip(&["-n", ns, "addr", "add", a, "dev", end]);
            }
            ip(&["-n", ns, "link", "set", end, "mtu", &mtu]);
            ip(&["-n", ns, "link", "set", "lo", "up"]);
            ip(&["-n", ns, "link", "set", end, "up"]);
        }
        // The far hosts announce a 1460-byte MSS, as hosts on an Ethernet
        // do when the narrow link is further along the path (a tunnel):
        // else the client would send segments that fit 1280 bytes from
        // the start, and no packet would be too big for the router.
        ip(&["-n", far, "route", "add", "default", "via", "192.0.2.1", "dev", "f0", "advmss", "1460"]);
        ip(&["-n", &self.client, "route", "add", "192.0.2.0/24", "via", SERVER_IP, "dev", "c0"]);
    }

    /// Gives the client and the server IPv6 addresses ([`CLIENT_IP6`],
    /// [`SERVER_IP6`]) with static routes and neighbours, as for IPv4: no
    /// link-local address, duplicate address detection or router
    /// solicitation, so only the test's own packets cross the wire.
    pub fn with_ipv6(self) -> Wire {
        let ends =
            [(&self.client, "c0", CLIENT_IP6, "2001:db8:2::/64"), (&self.server, "s0", SERVER_IP6, "2001:db8:1::/64")];
        for (ns, end, addr, _) in ends {
            for (k, v) in
                [("addr_gen_mode", "1"), ("accept_dad", "0"), ("router_solicitations", "0"), ("disable_ipv6", "0")]
            {
                must(self.exec(ns, "sysctl", &["-qw", &format!("net.ipv6.conf.{end}.{k}={v}")]));
            }
            ip(&["-n", ns, "-6", "addr", "add", &format!("{addr}/64"), "dev", end, "nodad"]);
        }
        let (c0, s0) = (self.mac(&self.client, "c0"), self.mac(&self.server, "s0"));
        for ((ns, end, _, other), (to, mac)) in ends.into_iter().zip([(SERVER_IP6, &s0), (CLIENT_IP6, &c0)]) {
            ip(&["-n", ns, "-6", "route", "add", other, "dev", end]);
            ip(&["-n", ns, "-6", "neigh", "add", to, "lladdr", mac, "dev", end]);
        }
        self
    }

    /// Lets the client and the server find each other as hosts on a link
    /// do: the static neighbour entries removed (the kernels resolve each
    /// other's MAC by ARP), and IPv6 addresses ([`CLIENT_IP6`],
    /// [`SERVER_IP6`]) with the kernels' defaults — link-local addresses,
    /// duplicate address detection, router solicitations, multicast
    /// listener reports and neighbour discovery. The wire then also
    /// carries that chatter: its counters are not only the test's.
    pub fn resolving(self) -> Wire {
        ip(&["-n", &self.client, "neigh", "del", SERVER_IP, "dev", "c0"]);
        for to in [CLIENT_IP, PUBLIC_IP] {
            ip(&["-n", &self.server, "neigh", "del", to, "dev", "s0"]);
        }
        let ends =
            [(&self.client, "c0", CLIENT_IP6, "2001:db8:2::/64"), (&self.server, "s0", SERVER_IP6, "2001:db8:1::/64")];
        for (ns, end, addr, other) in ends {
            must(self.exec(ns, "sysctl", &["-qw", &format!("net.ipv6.conf.{end}.disable_ipv6=0")]));
            ip(&["-n", ns, "-6", "addr", "add", &format!("{addr}/64"), "dev", end]);
            ip(&["-n", ns, "-6", "route", "add", other, "dev", end]);
        }
        // Until duplicate address detection ends, an address is tentative.
        wait_until("IPv6 duplicate address detection", 10, || {
            ends.iter().all(|(ns, end, _, _)| {
                !must(self.exec(ns, "ip", &["-6", "addr", "show", "dev", end])).contains("tentative")
            })
        });
        self
    }

    pub fn mac(&self, ns: &str, iface: &str) -> String {
        must(self.exec(ns, "cat", &[&format!("/sys/class/net/{iface}/address")])).trim().to_string()
    }

    pub fn exec(&self, ns: &str, prog: &str, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns, prog]).args(args);
        c
    }

    pub fn client(&self, prog: &str, args: &[&str]) -> Command {
        self.exec(&self.client, prog, args)
    }

    pub fn server(&self, prog: &str, args: &[&str]) -> Command {
        self.exec(&self.server, prog, args)
    }

    /// A command in the far namespace ([`Wire::routed`]).
    pub fn far(&self, prog: &str, args: &[&str]) -> Command {
        self.exec(self.far.as_ref().expect("a routed wire"), prog, args)
    }

    /// `python3 -m http.server` on `addr:port` in `ns`, serving `dir`, its
    /// request log going to `log`.
    pub fn http_server(&self, ns: &str, addr: &str, port: u16, dir: &Path, log: &Path) -> Bg {
        let log = std::fs::File::create(log).unwrap();
        let port = port.to_string();
        let args = ["-u", "-m", "http.server", &port, "--bind", addr, "--directory", dir.to_str().unwrap()];
        Bg(self.exec(ns, "python3", &args).stdout(Stdio::null()).stderr(log).spawn().unwrap())
    }

    fn counter(&self, iface: &str, name: &str) -> u64 {
        let path = format!("/sys/class/net/{iface}/statistics/{name}");
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}")).trim().parse().unwrap()
    }

    pub fn kernel(&self) -> Kernel {
        Kernel {
            h0_rx: self.counter(&self.h0, "rx_packets"),
            h0_tx: self.counter(&self.h0, "tx_packets"),
            h1_rx: self.counter(&self.h1, "rx_packets"),
            h1_tx: self.counter(&self.h1, "tx_packets"),
        }
    }

    /// Waits until no frame crossed either interface for 300 ms (the last
    /// ACKs and FINs of a transfer), so that stopping the host loses none.
    pub fn settle(&self) {
        let mut last = self.kernel();
        let mut still = Instant::now();
        wait_until("the wire to fall quiet", 15, || {
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
    pub fn bound(&self) -> bool {
        let sockets = std::fs::read_to_string("/proc/net/packet").unwrap();
        let bound: Vec<&str> = sockets.lines().skip(1).filter_map(|l| l.split_whitespace().nth(4)).collect();
        [&self.h0, &self.h1].iter().all(|i| bound.contains(&self.ifindex(i).as_str()))
    }

    /// The `--vdev` EAL arguments of the host's two ports, `ring` the
    /// `net_af_packet` ring arguments.
    pub fn vdevs(&self, ring: &str) -> [String; 2] {
        [
            format!("--vdev=net_af_packet0,iface={},{ring}", self.h0),
            format!("--vdev=net_af_packet1,iface={},{ring}", self.h1),
        ]
    }

    /// A counter of the `Icmp:` lines of `/proc/net/snmp` in `ns`.
    pub fn icmp_stat(&self, ns: &str, name: &str) -> u64 {
        let snmp = must(self.exec(ns, "cat", &["/proc/net/snmp"]));
        let mut icmp = snmp.lines().filter(|l| l.starts_with("Icmp:"));
        let (names, values) = (icmp.next().unwrap(), icmp.next().unwrap());
        let at = names.split_whitespace().position(|n| n == name).unwrap_or_else(|| panic!("{name}: {names}"));
        values.split_whitespace().nth(at).unwrap().parse().unwrap()
    }
}

impl Drop for Wire {
    fn drop(&mut self) {
        // A namespace takes its ends of the veths with it; the far link
        // lies wholly in namespaces.
        for ns in [Some(&self.client), Some(&self.server), self.far.as_ref()].into_iter().flatten() {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
        for root in [&self.h0, &self.h1] {
            let _ = Command::new("ip").args(["link", "del", root]).output();
        }
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
            s = socket.socket(socket.AF_INET6 if ":" in addr[0] else socket.AF_INET, socket.SOCK_DGRAM)
            s.settimeout(0.5)
            s.sendto(b"probe", addr)
            while s.recv(65535) != b"probe":
                pass
        sys.exit(0)
    except OSError:
        time.sleep(0.1)
sys.exit(f"no answer from {addr} over {proto}")
"#;

/// Runs `PROBE` from the client; fails at once if the host exits first.
pub fn probe(w: &Wire, proto: &str, addr: &str, port: u16, host: &mut impl Running) {
    let port = port.to_string();
    let mut c = w.client("python3", &["-c", PROBE, proto, addr, &port]);
    let mut p = Bg(c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap());
    let mut done = None;
    wait_until("the probe", 40, || {
        host.assert_running();
        done = p.0.try_wait().unwrap();
        done.is_some()
    });
    let mut err = String::new();
    let _ = std::io::Read::read_to_string(p.0.stderr.as_mut().unwrap(), &mut err);
    assert!(done.is_some_and(|s| s.success()), "{err}\nhost {}", host.output());
}

/// A file of `len` pseudo-random bytes named `name` in `dir`.
pub fn random_file(dir: &Path, name: &str, len: usize, seed: u64) -> PathBuf {
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

pub fn sha256(p: &Path) -> String {
    let out = must(Command::new("sha256sum").arg(p));
    out.split_whitespace().next().unwrap().to_string()
}

/// Fetches `url` with curl in `ns` into `to`; returns its SHA-256.
pub fn fetch(w: &Wire, ns: &str, url: &str, to: &Path) -> String {
    let o = run(w.exec(ns, "curl", &["-sS", "--fail", "--max-time", "60", "-o", to.to_str().unwrap(), url]));
    assert!(o.status.success(), "curl {url}: {}", text(&o));
    sha256(to)
}

/// Directories of one test: what the server serves, what the client
/// serves, and downloads.
pub struct Dirs {
    pub tmp: tempfile::TempDir,
}

impl Dirs {
    pub fn new() -> Dirs {
        let d = Dirs { tmp: tempfile::tempdir().unwrap() };
        for sub in ["srv", "cli", "got"] {
            std::fs::create_dir(d.tmp.path().join(sub)).unwrap();
        }
        d
    }

    pub fn path(&self, sub: &str) -> PathBuf {
        self.tmp.path().join(sub)
    }
}

pub const MB20: usize = 20_000_000;

/// The request lines of an http.server log, and whether every one came
/// from `from`.
pub fn requests_from(log: &Path, from: &str) -> (Vec<String>, bool) {
    let log = std::fs::read_to_string(log).unwrap();
    let lines: Vec<String> = log.lines().filter(|l| l.contains("\"GET ")).map(str::to_string).collect();
    let all = !lines.is_empty() && lines.iter().all(|l| l.starts_with(&format!("{from} - - ")));
    (lines, all)
}

/// curl in `ns` to `url` with a 2 s connect timeout; its exit code.
/// 28: timed out, as when every SYN or SYN-ACK is dropped (7 would be a
/// reset, a refused connection).
pub fn connect_exit(w: &Wire, ns: &str, url: &str) -> (Option<i32>, String) {
    let o = run(w.exec(ns, "curl", &["-sS", "--connect-timeout", "2", "-o", "/dev/null", url]));
    (o.status.code(), text(&o))
}
