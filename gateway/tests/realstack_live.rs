//! Real Linux TCP stacks on both sides of `sluice-host serve --dpdk`
//! under the control plane: a tenant deploys firewall -> NAT through the
//! gateway with an inside and an outside attachment, and a real
//! connection crosses it both ways. The wire (network namespaces, veth
//! pairs, static routes) is the host's real-stack tests' own
//! (`host/cli/tests/realstack/wire.rs`); nats-server, the gateway and the
//! host are started as in `live.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

#[path = "../../host/cli/tests/realstack/wire.rs"]
mod wire;

use crate::support::*;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use wire::*;

/// A gateway whose group `edge` exposes ports 0 and 1 to tenants.
fn edge_gateway(nats: &Nats, dir: &Path) -> Gateway {
    let conf = dir.join("gateway.toml");
    std::fs::write(&conf, "[groups.edge]\nports = [0, 1]\n").unwrap();
    Gateway::start(nats, dir, &[("SLUICE_GATEWAY_CONFIG", conf.to_str().unwrap())])
}

/// The chain firewall -> nat with the configurations of the host's
/// real-stack tests: default deny, allow 10.0.0.0/24; the inside
/// 10.0.0.0/8 behind 203.0.113.1.
fn fw_nat() -> Value {
    json!([
        { "module": "firewall@1", "config": { "default": "deny", "rules": [{ "action": "allow", "src": "10.0.0.0/24" }] } },
        { "module": "nat@1", "config": { "public-ip": PUBLIC_IP, "inside": ["10.0.0.0/8"] } }
    ])
}

const INSIDE: &str = "port=0,out=1";
const OUTSIDE: &str = "port=1,dst=203.0.113.1/32,out=0,side=outside";
/// The outside attachment as an inside one: replies run firewall first.
const OUTSIDE_AS_INSIDE: &str = "port=1,dst=203.0.113.1/32,out=0";

/// `sluice-host serve --dpdk` on the wire's two interfaces (`serve` and
/// its log, killed on drop), signed in as `h1`.
struct LiveHost {
    proc: Proc,
    log: PathBuf,
    prefix: String,
}

impl LiveHost {
    fn start(nats: &Nats, gw: &Gateway, dir: &Path, w: &Wire, report: &Path) -> LiveHost {
        LiveHost::start_on(nats, gw, dir, w, report, 1)
    }

    /// With `workers` workers, each port read through as many queues.
    fn start_on(nats: &Nats, gw: &Gateway, dir: &Path, w: &Wire, report: &Path, workers: usize) -> LiveHost {
        LiveHost::start_with(nats, gw, dir, w, report, workers, &[])
    }

    /// With `workers` workers and `more` arguments of `serve`.
    fn start_with(
        nats: &Nats,
        gw: &Gateway,
        dir: &Path,
        w: &Wire,
        report: &Path,
        workers: usize,
        more: &[&str],
    ) -> LiveHost {
        let prefix = format!("sluice-{}", w.h0);
        let workers = workers.to_string();
        let mut args: Vec<String> = ["--group", "edge", "--dpdk", "--workers", &workers, "--pairs"]
            .into_iter()
            .chain(more.iter().copied())
            .chain(["--window-ms", "200", "--heartbeat-ms", "300", "--report", report.to_str().unwrap()])
            .chain(["--", "--no-huge", "--no-pci", "-m", "512", "--log-level=lib.eal:error"])
            .map(str::to_string)
            .collect();
        args.push(format!("--file-prefix={prefix}"));
        args.extend(w.vdevs(&format!("{RING},qpairs={workers}")));
        let proc = start_host(nats, gw, dir, "h1", &args.iter().map(String::as_str).collect::<Vec<_>>());
        LiveHost { proc, log: dir.join("h1.log"), prefix }
    }
}

impl LiveHost {
    /// Waits until `key`'s deployment `fwnat` runs (first version), the
    /// host's packet sockets are bound and a connection to the server
    /// goes through.
    fn until_forwarding(&mut self, api: &Api, key: &str, w: &Wire) {
        api.wait_running(key, "fwnat", 1);
        wait_until("the host's packet sockets", 60, || {
            self.assert_running();
            w.bound()
        });
        probe(w, "tcp", SERVER_IP, SERVER_HTTP, self);
    }
}

impl Running for LiveHost {
    fn assert_running(&mut self) {
        if let Some(status) = self.proc.child.try_wait().unwrap() {
            panic!("the host exited ({status}):\n{}", self.output());
        }
    }

    fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for LiveHost {
    fn drop(&mut self) {
        self.proc.kill9();
        let _ = std::fs::remove_dir_all(Path::new("/var/run/dpdk").join(&self.prefix));
    }
}

/// Tenant `alpha` of group `edge`, with the firewall and the NAT uploaded
/// as version 1; returns its API key.
fn alpha_with_firewall_and_nat(api: &Api) -> String {
    let r = api.post(Some(ADMIN), "/v1/tenants", &json!({ "name": "alpha", "groups": ["edge"] }));
    assert_eq!(r.status, 201, "{}", r.body);
    let key = r.body["api_key"].as_str().unwrap().to_string();
    for name in ["firewall", "nat"] {
        let up = api.upload(Some(&key), name, "1", &std::fs::read(nf(name)).unwrap());
        assert_eq!(up.status, 201, "{}", up.body);
    }
    key
}

/// The deployment named `name` in a host report.
fn deployment(report: &Path, name: &str) -> Value {
    let r = host_report(report);
    r["deployments"].as_object().unwrap().values().find(|d| d["name"] == name).cloned().unwrap_or(Value::Null)
}

/// firewall -> nat deployed through the gateway onto `serve --dpdk`: the
/// inside attachment takes the client's packets out of port 1, the
/// outside one (`side=outside`) takes the replies to the public address
/// back out of port 0, last NF first. A 20 MB download arrives intact, the
/// server sees the public address, a connection the server opens gets
/// nowhere. With the same attachment on the inside the replies meet the
/// firewall before the NAT and are dropped: the side is what carries the
/// connection. A branching chain may not take an outside attachment.
#[test]
fn a_tenants_firewall_nat_deployment_carries_real_tcp_both_ways_only_with_its_outside_attachment() {
    let _turn = turn();
    let dir = test_dir();
    let nats = Nats::start(dir.path());
    let gw = edge_gateway(&nats, dir.path());
    let api = gw.api();
    let key = alpha_with_firewall_and_nat(&api);

    // A chain with a label route has no reverse order for replies.
    let mut branching = fw_nat();
    branching[0]["labels"] = json!({ "1": "nat" });
    let r = api.post(
        Some(&key),
        "/v1/deployments",
        &json!({ "name": "branching", "group": "edge", "nfs": branching, "attach": [INSIDE, OUTSIDE] }),
    );
    assert_eq!((r.status, &r.body["error"]), (422, &json!("attachment_side")), "{}", r.body);

    let body = json!({ "name": "fwnat", "group": "edge", "nfs": fw_nat(), "attach": [INSIDE, OUTSIDE] });
    let r = api.post(Some(&key), "/v1/deployments", &body);
    assert_eq!(r.status, 201, "{}", r.body);

    let w = Wire::new();
    let d = Dirs::new();
    let down = random_file(&d.path("srv"), "blob", MB20, 11);
    let _srv = w.http_server(&w.server, SERVER_IP, SERVER_HTTP, &d.path("srv"), &d.path("srv.log"));
    let _cli = w.http_server(&w.client, CLIENT_IP, CLIENT_HTTP, &d.path("cli"), &d.path("cli.log"));
    let report = dir.path().join("h1.json");
    let mut host = LiveHost::start(&nats, &gw, dir.path(), &w, &report);
    host.until_forwarding(&api, &key, &w);

    let url = format!("http://{SERVER_IP}:{SERVER_HTTP}/blob");
    assert_eq!(fetch(&w, &w.client, &url, &d.path("got/down")), sha256(&down), "the client's download");
    let (lines, all) = requests_from(&d.path("srv.log"), PUBLIC_IP);
    assert!(all && lines.len() == 1, "one request, from {PUBLIC_IP}: {lines:?}");
    // The server opens connections: to the public address (no binding)
    // and to the inside address (no attachment claims it). Both time out.
    for to in [PUBLIC_IP, CLIENT_IP] {
        let (code, out) = connect_exit(&w, &w.server, &format!("http://{to}:{CLIENT_HTTP}/"));
        assert_eq!(code, Some(28), "the server's connection to {to}: {out}");
    }
    let cli_log = std::fs::read_to_string(d.path("cli.log")).unwrap();
    assert!(!cli_log.contains("GET"), "the client's server was reached: {cli_log}");
    w.settle();

    // The same deployment, its replies' attachment on the inside.
    let r = api.put(
        Some(&key),
        "/v1/deployments/fwnat",
        &json!({ "nfs": fw_nat(), "attach": [INSIDE, OUTSIDE_AS_INSIDE] }),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    api.wait_running(&key, "fwnat", 2);
    let before = w.kernel();
    let (code, out) = connect_exit(&w, &w.client, &url);
    assert_eq!(code, Some(28), "the client's connection with replies run firewall first: {out}");
    w.settle();
    let after = w.kernel();
    // The client's SYNs left by port 1; the server's SYN-ACKs came in on
    // port 1 and none went on to the client.
    assert!(after.h1_tx - before.h1_tx >= 2, "{before:?} {after:?}");
    assert!(after.h1_rx - before.h1_rx >= 2, "{before:?} {after:?}");
    assert_eq!(after.h0_tx, before.h0_tx, "a reply reached the client");

    host.proc.term();
    let dep = deployment(&report, "fwnat");
    let (packets_in, packets_out) = (dep["packets_in"].as_u64().unwrap(), dep["packets_out"].as_u64().unwrap());
    // 20 MB is at least 13,700 full-sized segments.
    assert!(packets_in > 13_700, "{dep}");
    assert!(packets_in - packets_out >= after.h1_rx - before.h1_rx, "the dropped replies: {dep}");
    assert_eq!(host_report(&report)["refused_egress"].as_u64(), Some(0), "{dep}");
}

/// The tenant's firewall -> nat on a live host with two workers, each
/// port read through two queues: a reply to the public address may come
/// in on the worker without the firewall's state of its connection, which
/// hands it to the worker that translated it. Sixteen downloads arrive
/// intact from the public address, and what one worker handed over the
/// other took in.
#[test]
fn a_tenants_firewall_nat_deployment_carries_every_connection_on_two_workers() {
    let _turn = turn();
    let dir = test_dir();
    let nats = Nats::start(dir.path());
    let gw = edge_gateway(&nats, dir.path());
    let api = gw.api();
    let key = alpha_with_firewall_and_nat(&api);
    let body = json!({ "name": "fwnat", "group": "edge", "nfs": fw_nat(), "attach": [INSIDE, OUTSIDE] });
    let r = api.post(Some(&key), "/v1/deployments", &body);
    assert_eq!(r.status, 201, "{}", r.body);

    let w = Wire::new();
    let d = Dirs::new();
    let down = random_file(&d.path("srv"), "blob", 1 << 20, 12);
    let _srv = w.http_server(&w.server, SERVER_IP, SERVER_HTTP, &d.path("srv"), &d.path("srv.log"));
    let report = dir.path().join("h1.json");
    let mut host = LiveHost::start_on(&nats, &gw, dir.path(), &w, &report, 2);
    host.until_forwarding(&api, &key, &w);
    let url = format!("http://{SERVER_IP}:{SERVER_HTTP}/blob");
    for i in 0..16 {
        assert_eq!(fetch(&w, &w.client, &url, &d.path(&format!("got/{i}"))), sha256(&down), "download {i}");
    }
    let (lines, all) = requests_from(&d.path("srv.log"), PUBLIC_IP);
    assert!(all && lines.len() == 16, "sixteen requests, all from {PUBLIC_IP}: {lines:?}");
    w.settle();

    host.proc.term();
    let r = host_report(&report);
    let queues: Vec<&Value> =
        r["ports"].as_array().unwrap().iter().flat_map(|p| p["queues"].as_array().unwrap().iter()).collect();
    let count = |k: &str| queues.iter().map(|q| q[k].as_u64().unwrap_or(0)).sum::<u64>();
    assert_eq!(count("handed_off"), count("taken_over"), "{r:#}");
    assert!(count("handed_off") > 0, "no reply came in on the other worker in sixteen connections: {r:#}");
}

/// UDP datagrams from `argv[1]` to `argv[2]` port 9, from eight sockets
/// in turn (their flows spread over the host's workers), about 10,000 a
/// second until killed.
const UDP_FLOOD: &str = r#"
import socket, sys, time
socks = []
for _ in range(8):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((sys.argv[1], 0))
    socks.append(s)
n = 0
while True:
    socks[n % 8].sendto(b"flood", (sys.argv[2], 9))
    n += 1
    if n % 20 == 0:
        time.sleep(0.002)
"#;

/// A second tenant, `mallory`, shares the two-worker host of the test
/// above with a hostile NF that translates every packet into a flow of
/// its own (`translate-flood`), fed by a UDP flood from its own prefix,
/// while the workers remember only 256 handed flows each
/// (`handed_flows`): the flood fills the tables hundreds of times over,
/// and alpha's firewall -> NAT keeps its share of them. All sixteen of
/// alpha's downloads arrive intact from the public address (without a
/// share, about one in four timed out: its reply's home had been
/// refused and the firewall of the other worker dropped it), and the
/// host says it refused homes.
#[test]
fn a_tenant_translating_a_flood_of_flows_leaves_another_its_handed_connections() {
    let _turn = turn();
    let dir = test_dir();
    let nats = Nats::start(dir.path());
    let gw = edge_gateway(&nats, dir.path());
    let api = gw.api();
    let key = alpha_with_firewall_and_nat(&api);
    let inside = "port=0,dst=198.51.100.0/24,out=1";
    let body = json!({ "name": "fwnat", "group": "edge", "nfs": fw_nat(), "attach": [inside, OUTSIDE] });
    let r = api.post(Some(&key), "/v1/deployments", &body);
    assert_eq!(r.status, 201, "{}", r.body);
    let r = api.post(Some(ADMIN), "/v1/tenants", &json!({ "name": "mallory", "groups": ["edge"] }));
    assert_eq!(r.status, 201, "{}", r.body);
    let evil = r.body["api_key"].as_str().unwrap().to_string();
    assert_eq!(api.upload(Some(&evil), "hostile", "1", &std::fs::read(test_nf("hostile")).unwrap()).status, 201);
    let nfs = json!([{ "module": "hostile@1", "config": "translate-flood" }]);
    let body = json!({ "name": "flood", "group": "edge", "nfs": nfs, "attach": ["port=0,dst=10.200.0.0/24,out=1"] });
    let r = api.post(Some(&evil), "/v1/deployments", &body);
    assert_eq!(r.status, 201, "{}", r.body);

    let w = Wire::new();
    let d = Dirs::new();
    add_address(&w.client, "c0", "10.200.0.5");
    let s0 = w.mac(&w.server, "s0");
    ip(&["-n", &w.client, "neigh", "add", "10.200.0.7", "lladdr", &s0, "dev", "c0"]);
    let down = random_file(&d.path("srv"), "blob", 1 << 20, 13);
    let _srv = w.http_server(&w.server, SERVER_IP, SERVER_HTTP, &d.path("srv"), &d.path("srv.log"));
    let conf = dir.path().join("host.toml");
    std::fs::write(&conf, "handed_flows = 256\n").unwrap();
    let report = dir.path().join("h1.json");
    let mut host = LiveHost::start_with(&nats, &gw, dir.path(), &w, &report, 2, &["--config", conf.to_str().unwrap()]);
    host.until_forwarding(&api, &key, &w);
    api.wait_running(&evil, "flood", 1);
    let _flood = Bg(w.exec(&w.client, "python3", &["-c", UDP_FLOOD, "10.200.0.5", "10.200.0.7"]).spawn().unwrap());
    wait_until("the flood through mallory's NF", 30, || {
        host.assert_running();
        // More translated flows than both workers' tables hold.
        w.kernel().h1_tx > 2_000
    });
    let url = format!("http://{SERVER_IP}:{SERVER_HTTP}/blob");
    for i in 0..16 {
        assert_eq!(fetch(&w, &w.client, &url, &d.path(&format!("got/{i}"))), sha256(&down), "download {i}");
    }
    let (lines, all) = requests_from(&d.path("srv.log"), PUBLIC_IP);
    assert!(all && lines.len() == 16, "sixteen requests, all from {PUBLIC_IP}: {lines:?}");
    drop(_flood);
    w.settle();

    host.proc.term();
    let flood = deployment(&report, "flood");
    assert!(flood["packets_out"].as_u64().unwrap() > 2_000, "{flood}");
    let r = host_report(&report);
    let queues: Vec<&Value> =
        r["ports"].as_array().unwrap().iter().flat_map(|p| p["queues"].as_array().unwrap().iter()).collect();
    let count = |k: &str| queues.iter().map(|q| q[k].as_u64().unwrap_or(0)).sum::<u64>();
    assert_eq!(count("handed_off"), count("taken_over"), "{r:#}");
    assert!(count("handed_off") > 0, "no reply came in on the other worker in sixteen connections: {r:#}");
    assert!(host.output().contains("no room for the homes"), "{}", host.output());
}

/// Gives `end` in namespace `ns` the address `addr` (a /24) too.
fn add_address(ns: &str, end: &str, addr: &str) {
    ip(&["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", end]);
}

/// Two tenants share the wire's two ports, each claiming its own prefix
/// on both: each has a client and a server in its prefix (a second
/// address on each end of the wire) and a firewall of its own, attached
/// by destination prefix on the way out (port 0) and on the way back
/// (port 1, outside). Both downloads arrive intact; each server sees only
/// its own tenant's client, and each deployment counts its own tenant's
/// connection and drops nothing.
#[test]
fn two_tenants_sharing_both_ports_each_carry_real_tcp_through_their_own_firewall() {
    let _turn = turn();
    let dir = test_dir();
    let nats = Nats::start(dir.path());
    let gw = edge_gateway(&nats, dir.path());
    let api = gw.api();
    let tenants = [("alpha", "10.100.0"), ("beta", "10.200.0")];
    let mut keys = Vec::new();
    for (name, net) in tenants {
        let r = api.post(Some(ADMIN), "/v1/tenants", &json!({ "name": name, "groups": ["edge"] }));
        assert_eq!(r.status, 201, "{}", r.body);
        let key = r.body["api_key"].as_str().unwrap().to_string();
        let up = api.upload(Some(&key), "firewall", "1", &std::fs::read(nf("firewall")).unwrap());
        assert_eq!(up.status, 201, "{}", up.body);
        let config = json!({ "default": "deny", "rules": [{ "action": "allow", "src": format!("{net}.5/32") }] });
        let attach = [format!("port=0,dst={net}.0/24,out=1"), format!("port=1,dst={net}.0/24,out=0,side=outside")];
        let nfs = json!([{ "module": "firewall@1", "config": config }]);
        let body = json!({ "name": format!("fw-{name}"), "group": "edge", "nfs": nfs, "attach": attach });
        let r = api.post(Some(&key), "/v1/deployments", &body);
        assert_eq!(r.status, 201, "{}", r.body);
        keys.push(key);
    }

    let w = Wire::new();
    let d = Dirs::new();
    let (c0, s0) = (w.mac(&w.client, "c0"), w.mac(&w.server, "s0"));
    let mut servers = Vec::new();
    for (i, (_, net)) in tenants.iter().enumerate() {
        let (client, server) = (format!("{net}.5"), format!("{net}.7"));
        add_address(&w.client, "c0", &client);
        add_address(&w.server, "s0", &server);
        ip(&["-n", &w.client, "neigh", "add", &server, "lladdr", &s0, "dev", "c0"]);
        ip(&["-n", &w.server, "neigh", "add", &client, "lladdr", &c0, "dev", "s0"]);
        let root = d.path("srv").join(i.to_string());
        std::fs::create_dir(&root).unwrap();
        random_file(&root, "blob", 2 << 20, 20 + i as u64);
        servers.push(w.http_server(&w.server, &server, SERVER_HTTP, &root, &d.path(&format!("srv{i}.log"))));
    }
    let report = dir.path().join("h1.json");
    let mut host = LiveHost::start(&nats, &gw, dir.path(), &w, &report);
    for ((name, _), key) in tenants.iter().zip(&keys) {
        api.wait_running(key, &format!("fw-{name}"), 1);
    }
    wait_until("the host's packet sockets", 60, || {
        host.assert_running();
        w.bound()
    });
    for (i, (_, net)) in tenants.iter().enumerate() {
        let server = format!("{net}.7");
        probe(&w, "tcp", &server, SERVER_HTTP, &mut host);
        let url = format!("http://{server}:{SERVER_HTTP}/blob");
        let want = sha256(&d.path("srv").join(i.to_string()).join("blob"));
        assert_eq!(fetch(&w, &w.client, &url, &d.path(&format!("got/{i}"))), want, "{url}");
        let client = format!("{net}.5");
        let (lines, all) = requests_from(&d.path(&format!("srv{i}.log")), &client);
        assert!(all && lines.len() == 1, "one request, from {client}: {lines:?}");
    }
    w.settle();
    host.proc.term();
    for (name, _) in tenants {
        let dep = deployment(&report, &format!("fw-{name}"));
        // 2 MiB is at least 1,400 full-sized segments.
        assert!(dep["packets_in"].as_u64().unwrap() > 1_400, "{dep}");
        assert_eq!(dep["packets_in"], dep["packets_out"], "nothing of {name}'s was dropped: {dep}");
    }
    assert_eq!(host_report(&report)["refused_egress"].as_u64(), Some(0));
}
