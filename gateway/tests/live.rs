//! Hosts on live ports under the control plane (`sluice-host serve
//! --dpdk`) with real DPDK virtual devices, a real nats-server and the
//! gateway: tenants share one port and each sees only the traffic its
//! attachment claims; hot swaps and restarts on the live path; and the
//! same capture gives the same output through `run`, `dpdk` and `serve`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

use crate::support::*;
use serde_json::json;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A gateway whose group `edge` exposes ports 0 and 1 to tenants.
fn edge_gateway(nats: &Nats, dir: &Path) -> Gateway {
    let conf = dir.join("gateway.toml");
    std::fs::write(&conf, "[groups.edge]\nports = [0, 1]\n").unwrap();
    Gateway::start(nats, dir, &[("SLUICE_GATEWAY_CONFIG", conf.to_str().unwrap())])
}

/// A tenant that may deploy to `edge`.
fn edge_tenant(api: &Api, name: &str) -> (String, String) {
    let r = api.post(Some(ADMIN), "/v1/tenants", &json!({ "name": name, "groups": ["edge"] }));
    assert_eq!(r.status, 201, "{}", r.body);
    (r.body["id"].as_str().unwrap().to_string(), r.body["api_key"].as_str().unwrap().to_string())
}

/// `sluice-host synth` with sessions on `vlans` in turn.
fn vlan_trace(dir: &Path, name: &str, sessions: usize, vlans: &str) -> PathBuf {
    let p = dir.join(name);
    let mut cmd = Command::new(sibling_bin("sluice-host"));
    cmd.args(["synth", "--sessions", &sessions.to_string(), "--seed", "5", "--out"]).arg(&p);
    if !vlans.is_empty() {
        cmd.args(["--vlans", vlans]);
    }
    assert!(cmd.stdout(Stdio::null()).status().unwrap().success());
    p
}

/// Packets of a capture per outer VLAN id (none: untagged).
fn per_vlan(path: &Path) -> BTreeMap<Option<u16>, u64> {
    let t = sluice_pcap::Trace::open(path).unwrap();
    let mut out = BTreeMap::new();
    for p in t.packets() {
        let d = t.data(p);
        let vlan = (d.len() >= 16 && d[12..14] == [0x81, 0x00]).then(|| u16::from_be_bytes([d[14], d[15]]) & 0xfff);
        *out.entry(vlan).or_default() += 1;
    }
    out
}

/// The bytes of each packet of a capture, in order.
fn frames(path: &Path) -> Vec<Vec<u8>> {
    let t = sluice_pcap::Trace::open(path).unwrap();
    t.packets().iter().map(|p| t.data(p).to_vec()).collect()
}

/// `serve --dpdk` flags: group `edge`, one worker, a pcap vdev reading
/// `rx` (`infinite` times over) and writing `tx`; EAL files under a prefix of
/// `dir` and `id`.
fn live_args(dir: &Path, id: &str, rx: &Path, tx: &Path, infinite: bool, report: &Path) -> Vec<String> {
    let vdev = format!(
        "--vdev=net_pcap0,rx_pcap={},tx_pcap={}{}",
        rx.display(),
        tx.display(),
        if infinite { ",infinite_rx=1" } else { "" }
    );
    live_args_with(dir, id, &[vdev], report)
}

/// `serve --dpdk` flags with these `--vdev` arguments.
fn live_args_with(dir: &Path, id: &str, vdevs: &[String], report: &Path) -> Vec<String> {
    [
        "--group",
        "edge",
        "--dpdk",
        "--workers",
        "1",
        "--window-ms",
        "200",
        "--heartbeat-ms",
        "300",
        "--report",
        report.to_str().unwrap(),
        "--",
        "--no-huge",
        "--no-pci",
        "-m",
        "256",
        "-l",
        "0",
        "--log-level=lib.eal:error",
    ]
    .iter()
    .map(|s| s.to_string())
    // EAL's runtime files are per prefix: one per test directory and host.
    .chain([format!("--file-prefix=sluice-{}-{id}", dir.file_name().unwrap().to_string_lossy())])
    .chain(vdevs.iter().cloned())
    .collect()
}

/// Waits until the host's deployments ran, and its unmatched count took,
/// `total` packets between them.
fn wait_taken(report: &Path, total: u64, what: &str) {
    wait_for(60, what, || {
        let r = std::fs::read(report).ok().and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())?;
        let seen: u64 = r["deployments"].as_object()?.values().map(|d| d["packets_in"].as_u64().unwrap_or(0)).sum();
        (seen + r["unmatched"].as_u64()? == total).then_some(())
    });
}

fn start_live(nats: &Nats, gw: &Gateway, dir: &Path, id: &str, args: &[String]) -> Proc {
    start_host(nats, gw, dir, id, &args.iter().map(String::as_str).collect::<Vec<_>>())
}

fn usage_packets(api: &Api, key: &str) -> u64 {
    let u = api.get(Some(key), "/v1/usage").body;
    u["rows"].as_array().unwrap().iter().map(|r| r["packets"].as_u64().unwrap()).sum()
}

fn fw_config() -> serde_json::Value {
    let deny = |port: &str| json!({ "action": "deny", "proto": "tcp", "dst-ports": port });
    json!({ "default": "allow", "log-denied": true, "rules": [deny("22"), deny("23"), deny("3389")] })
}

#[test]
fn two_tenants_share_one_dpdk_port_and_each_sees_only_its_vlan() {
    let _turn = beside_others();
    let dir = test_dir();
    let nats = Nats::start(dir.path());
    let gw = edge_gateway(&nats, dir.path());
    let api = gw.api();
    let (_, a) = edge_tenant(&api, "alpha");
    let (_, b) = edge_tenant(&api, "bravo");
    assert_eq!(api.upload(Some(&a), "firewall", "1.0.0", &std::fs::read(nf("firewall")).unwrap()).status, 201);
    assert_eq!(api.upload(Some(&b), "counter", "1.0.0", &std::fs::read(nf("counter")).unwrap()).status, 201);
    let d = api.post(
        Some(&a),
        "/v1/deployments",
        &json!({ "name": "fw", "group": "edge", "module": "firewall@1.0.0", "config": fw_config(), "attach": ["port=0,vlan=100"] }),
    );
    assert_eq!(d.status, 201, "{}", d.body);
    let d = api.post(
        Some(&b),
        "/v1/deployments",
        &json!({ "name": "count", "group": "edge", "module": "counter@1.0.0", "attach": ["port=0,vlan=200,out=1"] }),
    );
    assert_eq!(d.status, 201, "{}", d.body);
    // Bravo cannot claim alpha's VLAN, nor a port the operator did not expose.
    let r = api.post(
        Some(&b),
        "/v1/deployments",
        &json!({ "name": "spy", "group": "edge", "module": "counter@1.0.0", "attach": ["port=0,vlan=100,dst=10.0.0.0/8"] }),
    );
    assert_eq!(r.status, 409, "{}", r.body);
    assert!(!r.body.to_string().contains("\"fw\"") && !r.body.to_string().contains("'fw'"), "{}", r.body);
    let r = api.post(
        Some(&b),
        "/v1/deployments",
        &json!({ "name": "spy", "group": "edge", "module": "counter@1.0.0", "attach": ["port=2"] }),
    );
    assert!(r.status == 403 || r.status == 422, "{} {}", r.status, r.body);

    // The host joins after both are deployed: it opens its port once it
    // runs them, so none of their packets is taken for unclaimed.
    let input = vlan_trace(dir.path(), "tagged.pcap", 900, "100,200,0");
    let expected = per_vlan(&input);
    let (out, report) = (dir.path().join("out.pcap"), dir.path().join("h1.json"));
    // Port 1 receives nothing; bravo's packets leave by it.
    let (empty, out1) = (dir.path().join("empty.pcap"), dir.path().join("out1.pcap"));
    sluice_pcap::PcapSink::create(&empty).unwrap().finish().unwrap();
    let vdevs = [
        format!("--vdev=net_pcap0,rx_pcap={},tx_pcap={}", input.display(), out.display()),
        format!("--vdev=net_pcap1,rx_pcap={},tx_pcap={}", empty.display(), out1.display()),
    ];
    let metrics = format!("127.0.0.1:{}", free_port());
    let mut args = live_args_with(dir.path(), "h1", &vdevs, &report);
    // Before `--`: what follows it is the EAL's.
    let eal = args.iter().position(|a| a == "--").unwrap_or(args.len());
    args.splice(eal..eal, ["--metrics-listen".to_string(), metrics.clone(), "--stage-times".to_string()]);
    let mut host = start_live(&nats, &gw, dir.path(), "h1", &args);
    api.wait_running(&a, "fw", 1);
    api.wait_running(&b, "count", 1);
    let total: u64 = expected.values().sum();
    wait_taken(&report, total, "the host to take the whole capture");
    // Prometheus' view of the ports: what port 0 received, and the
    // traffic nobody's attachment took, as the host report counts them.
    let text = wait_for(30, "the host's port counters", || {
        let text = ureq::get(&format!("http://{metrics}/metrics")).call().ok()?.body_mut().read_to_string().ok()?;
        let received =
            text.lines().find(|l| l.starts_with("sluice_host_port_received_total") && l.contains("port=\"0\""))?;
        received.ends_with(&format!(" {total}")).then_some(text)
    });
    let unmatched = expected.get(&None).copied().unwrap_or(0);
    assert!(
        text.lines().any(|l| l.starts_with("sluice_host_unmatched_total") && l.ends_with(&format!(" {unmatched}"))),
        "{text}"
    );
    assert!(text.contains("sluice_host_port_missed_total") && text.contains("device=\"net_pcap0\""), "{text}");
    host.term();
    let rep = host_report(&report);
    let deps = rep["deployments"].as_object().unwrap();
    let by_name = |n: &str| deps.values().find(|d| d["name"] == n).unwrap().clone();
    let (fw, count) = (by_name("fw"), by_name("count"));
    assert_eq!(fw["packets_in"].as_u64(), expected.get(&Some(100)).copied(), "{rep}");
    assert_eq!(count["packets_in"].as_u64(), expected.get(&Some(200)).copied(), "{rep}");
    assert_eq!(rep["unmatched"].as_u64(), expected.get(&None).copied(), "{rep}");
    // Stage times (`--stage-times`): every packet the worker received was
    // timed, and classifying them to the tenants took time.
    let stages = &rep["stages"];
    assert_eq!(stages["packets"].as_u64(), Some(total), "{stages}");
    for k in ["receive", "read", "classify", "build", "call", "verdicts", "deliver", "transmit", "between"] {
        assert!(stages[k].as_f64().is_some_and(|ns| ns > 0.0), "{k}: {stages}");
    }
    // What left port 0: the firewall's forwarded VLAN 100 packets; port 1
    // (bravo's `out`): all of VLAN 200; untagged traffic was dropped (the
    // default policy); tags kept.
    let got = per_vlan(&out);
    assert_eq!(got.keys().collect::<Vec<_>>(), vec![&Some(100)], "{got:?}");
    assert_eq!(got.get(&Some(100)).copied(), fw["packets_out"].as_u64(), "{got:?}");
    let got1 = per_vlan(&out1);
    assert_eq!(got1.keys().collect::<Vec<_>>(), vec![&Some(200)], "{got1:?}");
    assert_eq!(got1.get(&Some(200)), expected.get(&Some(200)), "{got1:?}");
    assert!(fw["packets_out"].as_u64().unwrap() < fw["packets_in"].as_u64().unwrap(), "the firewall denied scans");
    // Each tenant is billed exactly its VLAN's packets; nobody the rest.
    wait_for(30, "usage to reach the gateway", || {
        (usage_packets(&api, &a) == expected[&Some(100)] && usage_packets(&api, &b) == expected[&Some(200)])
            .then_some(())
    });
    // The firewall's deny events reach its tenant, from the live host.
    let events = wait_for(30, "alpha's deny events", || {
        let e = api.get(Some(&a), "/v1/events?kind=firewall.deny&limit=1000").body;
        e.as_array().filter(|e| !e.is_empty()).cloned()
    });
    assert!(events.iter().all(|e| e["nf"] == "firewall" && e["host"] == "h1"), "{events:?}");
    assert_eq!(api.get(Some(&b), "/v1/events").body, json!([]));
}

#[test]
fn hot_swap_on_the_live_path_loses_no_packet_and_a_restarted_host_resumes() {
    let _turn = beside_others();
    let dir = test_dir();
    let nats = Nats::start(dir.path());
    let gw = edge_gateway(&nats, dir.path());
    let api = gw.api();
    let (_, key) = edge_tenant(&api, "alpha");
    let fw = std::fs::read(nf("firewall")).unwrap();
    assert_eq!(api.upload(Some(&key), "firewall", "1.0.0", &fw).status, 201);
    assert_eq!(api.upload(Some(&key), "firewall", "2.0.0", &fw).status, 201);
    let d = api.post(
        Some(&key),
        "/v1/deployments",
        &json!({ "name": "fw", "group": "edge", "module": "firewall@1.0.0", "config": fw_config(), "attach": ["port=0"] }),
    );
    assert_eq!(d.status, 201, "{}", d.body);
    let input = vlan_trace(dir.path(), "loop.pcap", 200, "");
    let report = dir.path().join("h1.json");
    let args = live_args(dir.path(), "h1", &input, &dir.path().join("out.pcap"), true, &report);
    let mut host = start_live(&nats, &gw, dir.path(), "h1", &args);
    api.wait_running(&key, "fw", 1);
    let packets_in = |r: &Path| -> u64 {
        std::fs::read(r)
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .and_then(|v| {
                v["deployments"].as_object().map(|d| d.values().map(|d| d["packets_in"].as_u64().unwrap_or(0)).sum())
            })
            .unwrap_or(0)
    };
    wait_for(60, "traffic through version 1", || (packets_in(&report) > 20_000).then_some(()));
    // Swap under traffic.
    let up = api.put(
        Some(&key),
        "/v1/deployments/fw",
        &json!({ "module": "firewall@2.0.0", "config": { "default": "allow" } }),
    );
    assert_eq!(up.status, 200, "{}", up.body);
    api.wait_running(&key, "fw", 2);
    let at_swap = packets_in(&report);
    wait_for(60, "traffic through version 2", || (packets_in(&report) > at_swap + 20_000).then_some(()));
    // SIGTERM flushes the last window: usage equals what the host ran,
    // every packet through exactly one version.
    host.term();
    let rep = host_report(&report);
    let dep = rep["deployments"].as_object().unwrap().values().next().unwrap().clone();
    let ran = dep["packets_in"].as_u64().unwrap();
    let per_version: u64 = dep["nfs"].as_object().unwrap().values().map(|t| t["packets"].as_u64().unwrap()).sum();
    assert_eq!(per_version, ran, "{dep}");
    // ...and what ran is what the port received: no packet was lost, held
    // back or handed to nobody around the swap.
    let port = &rep["ports"][0];
    let received = port["ipackets"].as_u64().unwrap();
    let queues: u64 = port["queues"].as_array().unwrap().iter().map(|q| q["rx"].as_u64().unwrap()).sum();
    assert_eq!((received, queues), (ran, ran), "{rep:#}");
    for k in ["unmatched", "not_running", "over_share"] {
        assert_eq!(rep[k].as_u64().unwrap_or(0), 0, "{k}: {rep:#}");
    }
    assert!(dep["nfs"]["firewall@1.0.0"]["packets"].as_u64().unwrap() > 0, "{dep}");
    assert!(dep["nfs"]["firewall@2.0.0"]["packets"].as_u64().unwrap() > 0, "{dep}");
    wait_for(30, "usage to equal the host's count", || (usage_packets(&api, &key) == ran).then_some(()));

    // A restarted host (same state) runs the deployment again, and its
    // packets are billed on top.
    let report2 = dir.path().join("h1-again.json");
    let args = live_args(dir.path(), "h1", &input, &dir.path().join("out2.pcap"), true, &report2);
    let mut host = start_live(&nats, &gw, dir.path(), "h1", &args);
    wait_for(60, "the restarted host to run traffic", || (packets_in(&report2) > 5_000).then_some(()));
    host.term();
    let more = packets_in(&report2);
    wait_for(30, "usage to add the restarted host's packets", || {
        (usage_packets(&api, &key) == ran + more).then_some(())
    });
}

#[test]
fn run_dpdk_and_serve_agree_on_the_same_capture() {
    let _turn = beside_others();
    let dir = test_dir();
    let d = dir.path();
    let input = vlan_trace(d, "in.pcap", 400, "");
    let cfg = d.join("fw.json");
    std::fs::write(&cfg, fw_config().to_string()).unwrap();
    let host_toml = d.join("host.toml");
    std::fs::write(&host_toml, format!("[nf.firewall]\nconfig-file = \"{}\"\n", cfg.display())).unwrap();
    let host = |args: &[&str]| {
        let o = Command::new(sibling_bin("sluice-host")).arg("--config").arg(&host_toml).args(args).output().unwrap();
        assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
    };
    let fw = nf("firewall");
    let run_out = d.join("run.pcap");
    host(&[
        "run",
        "--nf",
        fw.to_str().unwrap(),
        "--in",
        input.to_str().unwrap(),
        "--out",
        run_out.to_str().unwrap(),
        "--quiet",
    ]);
    let dpdk_out = d.join("dpdk.pcap");
    let vdev = format!("--vdev=net_pcap0,rx_pcap={},tx_pcap={}", input.display(), dpdk_out.display());
    let prefix = format!("--file-prefix=sluice-agree-{}", std::process::id());
    host(&[
        "dpdk",
        "--nf",
        fw.to_str().unwrap(),
        "--workers",
        "1",
        "--idle-exit-ms",
        "1500",
        "--",
        "--no-huge",
        "--no-pci",
        "-m",
        "256",
        "-l",
        "0",
        "--log-level=lib.eal:error",
        &prefix,
        &vdev,
    ]);

    let nats = Nats::start(d);
    let gw = edge_gateway(&nats, d);
    let api = gw.api();
    let (_, key) = edge_tenant(&api, "alpha");
    assert_eq!(api.upload(Some(&key), "firewall", "1.0.0", &std::fs::read(&fw).unwrap()).status, 201);
    let r = api.post(
        Some(&key),
        "/v1/deployments",
        &json!({ "name": "fw", "group": "edge", "module": "firewall@1.0.0", "config": fw_config(), "attach": ["port=0"] }),
    );
    assert_eq!(r.status, 201, "{}", r.body);
    let (serve_out, report) = (d.join("serve.pcap"), d.join("h1.json"));
    let mut h = start_live(&nats, &gw, d, "h1", &live_args(d, "h1", &input, &serve_out, false, &report));
    let total = frames(&input).len() as u64;
    wait_taken(&report, total, "the host to take the capture");
    h.term();
    let (a, b, c) = (frames(&run_out), frames(&dpdk_out), frames(&serve_out));
    assert!(!a.is_empty() && a.len() < total as usize, "the firewall forwards some and drops some");
    assert_eq!(a, b, "run and dpdk differ");
    assert_eq!(a, c, "run and serve --dpdk differ");
}

#[test]
fn a_host_joining_a_group_with_removed_deployments_runs_the_current_ones() {
    let _turn = beside_others();
    let dir = test_dir();
    let nats = Nats::start(dir.path());
    let gw = edge_gateway(&nats, dir.path());
    let api = gw.api();
    let (_, key) = edge_tenant(&api, "alpha");
    assert_eq!(api.upload(Some(&key), "counter", "1.0.0", &std::fs::read(nf("counter")).unwrap()).status, 201);
    let input = vlan_trace(dir.path(), "in.pcap", 100, "");
    let report = dir.path().join("h1.json");
    // A host of the group sees deployments come and go, then stops.
    let mut host = start_live(
        &nats,
        &gw,
        dir.path(),
        "h1",
        &live_args(dir.path(), "h1", &input, &dir.path().join("out0.pcap"), true, &report),
    );
    for i in 0..3 {
        let body =
            json!({ "name": format!("old{i}"), "group": "edge", "module": "counter@1.0.0", "attach": ["port=0"] });
        assert_eq!(api.post(Some(&key), "/v1/deployments", &body).status, 201);
        api.wait_running(&key, &format!("old{i}"), 1);
        assert_eq!(api.delete(Some(&key), &format!("/v1/deployments/old{i}")).status, 204);
    }
    host.term();
    let body = json!({ "name": "now", "group": "edge", "module": "counter@1.0.0", "attach": ["port=0"] });
    assert_eq!(api.post(Some(&key), "/v1/deployments", &body).status, 201);
    let mut host = start_live(
        &nats,
        &gw,
        dir.path(),
        "h1",
        &live_args(dir.path(), "h1", &input, &dir.path().join("out.pcap"), false, &report),
    );
    api.wait_running(&key, "now", 1);
    host.term();
}

/// Packets per second a deployment ran on the live host, over `secs` of
/// the host's own report times.
fn live_rate(report: &Path, name: &str, secs: u64) -> f64 {
    let read = || -> Option<(u64, u64)> {
        let r: serde_json::Value = serde_json::from_slice(&std::fs::read(report).ok()?).ok()?;
        let d = r["deployments"].as_object()?.values().find(|d| d["name"] == name)?.clone();
        Some((d["packets_in"].as_u64()?, r["updated_ms"].as_u64()?))
    };
    let (p0, t0) = wait_for(30, "a report with the deployment", read);
    std::thread::sleep(std::time::Duration::from_secs(secs));
    let (p1, t1) = wait_for(30, "a later report", || read().filter(|(_, t)| *t > t0));
    (p1 - p0) as f64 * 1000.0 / (t1 - t0) as f64
}

#[test]
fn a_tenant_whose_nf_spins_does_not_starve_its_neighbour_on_a_live_worker() {
    let _turn = measuring_alone();
    let dir = test_dir();
    let nats = Nats::start(dir.path());
    let gw = edge_gateway(&nats, dir.path());
    let api = gw.api();
    let (_, good) = edge_tenant(&api, "good");
    let (_, evil) = edge_tenant(&api, "evil");
    assert_eq!(api.upload(Some(&good), "counter", "1", &std::fs::read(nf("counter")).unwrap()).status, 201);
    assert_eq!(api.upload(Some(&evil), "hostile", "1", &std::fs::read(test_nf("hostile")).unwrap()).status, 201);
    let d = api.post(
        Some(&good),
        "/v1/deployments",
        &json!({ "name": "good", "group": "edge", "module": "counter@1", "attach": ["port=0,vlan=200"] }),
    );
    assert_eq!(d.status, 201, "{}", d.body);
    // Both tenants' traffic, interleaved, as fast as the worker takes it.
    let input = vlan_trace(dir.path(), "mixed.pcap", 300, "100,200");
    let report = dir.path().join("h1.json");
    let args = live_args(dir.path(), "h1", &input, &dir.path().join("out.pcap"), true, &report);
    let mut host = start_live(&nats, &gw, dir.path(), "h1", &args);
    api.wait_running(&good, "good", 1);
    let alone = live_rate(&report, "good", 3);
    // The other tenant's NF spins on every batch until its deadline stops it.
    let d = api.post(
        Some(&evil),
        "/v1/deployments",
        &json!({ "name": "spin", "group": "edge", "module": "hostile@1", "config": "loop", "attach": ["port=0,vlan=100"] }),
    );
    assert_eq!(d.status, 201, "{}", d.body);
    api.wait_running(&evil, "spin", 1);
    std::thread::sleep(std::time::Duration::from_secs(1));
    let with = live_rate(&report, "good", 4);
    host.term();
    eprintln!("the neighbour alone {alone:.0} pkt/s, beside a spinning NF {with:.0} pkt/s");
    // Half the worker is the neighbour's: without shares, the spinner's
    // 10 ms batches would leave it a few hundred batches a second.
    assert!(with >= 0.3 * alone, "the neighbour fell from {alone:.0} to {with:.0} packets/s");
    let r = host_report(&report);
    let spin = r["deployments"].as_object().unwrap().values().find(|d| d["name"] == "spin").unwrap().clone();
    assert!(spin["packets_in"].as_u64().unwrap() > 0, "{spin}");
    assert!(spin["dropped_over_share"].as_u64().unwrap() > 0, "{spin}");
    assert!(r["over_share"].as_u64().unwrap() > 0, "{r}");
}

#[test]
fn two_workers_each_run_every_deployment_and_usage_adds_up() {
    let _turn = beside_others();
    let dir = test_dir();
    let nats = Nats::start(dir.path());
    let gw = edge_gateway(&nats, dir.path());
    let api = gw.api();
    let (_, a) = edge_tenant(&api, "alpha");
    let (_, b) = edge_tenant(&api, "bravo");
    for key in [&a, &b] {
        assert_eq!(api.upload(Some(key), "counter", "1", &std::fs::read(nf("counter")).unwrap()).status, 201);
    }
    for (key, name, vlan) in [(&a, "ca", 100), (&b, "cb", 200)] {
        let body =
            json!({ "name": name, "group": "edge", "module": "counter@1", "attach": [format!("port=0,vlan={vlan}")] });
        assert_eq!(api.post(Some(key), "/v1/deployments", &body).status, 201);
    }
    let input = vlan_trace(dir.path(), "in.pcap", 600, "100,200,0");
    let expected = per_vlan(&input);
    // Two RX queues, each replaying the capture once: each worker takes one.
    let (out0, out1) = (dir.path().join("out0.pcap"), dir.path().join("out1.pcap"));
    let vdev = format!(
        "--vdev=net_pcap0,rx_pcap={0},rx_pcap={0},tx_pcap={1},tx_pcap={2}",
        input.display(),
        out0.display(),
        out1.display()
    );
    let report = dir.path().join("h1.json");
    let mut args = live_args_with(dir.path(), "h1", &[vdev], &report);
    let w = args.iter().position(|a| a == "--workers").unwrap();
    args[w + 1] = "2".into();
    let l = args.iter().position(|a| a == "-l").unwrap();
    args[l + 1] = "0,1".into();
    let mut host = start_live(&nats, &gw, dir.path(), "h1", &args);
    let total: u64 = 2 * expected.values().sum::<u64>();
    wait_taken(&report, total, "both workers to take the capture");
    host.term();
    let rep = host_report(&report);
    // Each worker ran its queue through its own lane of each deployment.
    let queues = rep["ports"][0]["queues"].as_array().unwrap();
    assert_eq!(queues.len(), 2, "{rep}");
    assert!(queues.iter().all(|q| q["rx"].as_u64().unwrap() == expected.values().sum::<u64>()), "{rep}");
    // Each lane checkpointed under its own name in the host's journal.
    let log = std::fs::read_to_string(dir.path().join("state-h1/journal/checkpoints.log")).unwrap();
    let journals: std::collections::BTreeSet<(String, u64)> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|l| {
            let c = &l["put"]["checkpoint"];
            Some((c["deployment"].as_str()?.to_string(), c["worker"].as_u64()?))
        })
        .collect();
    assert_eq!(journals.len(), 4, "{journals:?}");
    assert!(journals.iter().all(|(_, w)| *w < 2), "{journals:?}");
    assert_eq!(rep["unmatched"].as_u64(), Some(2 * expected[&None]), "{rep}");
    wait_for(30, "usage of both workers' records", || {
        (usage_packets(&api, &a) == 2 * expected[&Some(100)] && usage_packets(&api, &b) == 2 * expected[&Some(200)])
            .then_some(())
    });
}

/// A deployment whose NFs cannot start on the host (here: the host caps
/// its memory below what the module needs) keeps its claim on its traffic
/// there: with `--unmatched forward`, its packets are dropped and counted,
/// never forwarded past NFs that are not running; the host retries the
/// start with back-off and says so in the status.
#[test]
fn a_deployment_that_cannot_start_keeps_its_traffic_and_is_retried() {
    let _turn = beside_others();
    let dir = test_dir();
    let nats = Nats::start(dir.path());
    let gw = edge_gateway(&nats, dir.path());
    let api = gw.api();
    let (a, b) = hostile_beside_a_counter(&api, "stuck", "error:1000000");
    let input = vlan_trace(dir.path(), "tagged.pcap", 600, "100,200,0");
    let expected = per_vlan(&input);
    let total: u64 = expected.values().sum();
    let (out, report) = (dir.path().join("out.pcap"), dir.path().join("h1.json"));
    let host_conf = dir.path().join("host.toml");
    std::fs::write(&host_conf, "[nf.hostile]\nmemory-mb = 1\n").unwrap();
    let mut args =
        vec!["--config".to_string(), host_conf.to_str().unwrap().to_string(), "--unmatched".into(), "forward".into()];
    args.extend(live_args(dir.path(), "h1", &input, &out, false, &report));
    let mut host = start_live(&nats, &gw, dir.path(), "h1", &args);
    api.wait_running(&b, "count", 1);
    // The start is retried: the status names the failed attempt.
    let stuck = wait_for(30, "a second failed attempt", || {
        let d = api.get(Some(&a), "/v1/deployments/stuck").body;
        let text = d.to_string();
        (d["status"] == "failed" && text.contains("attempt 2")).then_some(d)
    });
    assert!(stuck.to_string().contains("the host retries in"), "{stuck}");
    wait_for(60, "the host to take the whole capture", || {
        let r = std::fs::read(&report).ok().and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())?;
        let seen: u64 = r["deployments"].as_object()?.values().map(|d| d["packets_in"].as_u64().unwrap_or(0)).sum();
        (seen + r["unmatched"].as_u64()? + r["not_running"].as_u64()? == total).then_some(())
    });
    host.term();
    let rep = host_report(&report);
    assert_eq!(rep["not_running"].as_u64(), expected.get(&Some(100)).copied(), "{rep}");
    assert_eq!(rep["unmatched"].as_u64(), expected.get(&None).copied(), "{rep}");
    // Out of the port: bravo's VLAN and the unclaimed untagged traffic
    // (forward policy), nothing of alpha's VLAN.
    let got = per_vlan(&out);
    assert_eq!(got.get(&Some(100)), None, "{got:?}");
    assert_eq!(got.get(&Some(200)), expected.get(&Some(200)), "{got:?}");
    assert_eq!(got.get(&None), expected.get(&None), "{got:?}");
    assert_eq!(usage_packets(&api, &a), 0);
}

/// An NF that rewrites its packets' VLAN tag into another tenant's VLAN
/// gets them refused (`refused_egress`): nothing of alpha's leaves in
/// bravo's VLAN.
#[test]
fn an_nf_cannot_retag_packets_into_another_tenants_vlan() {
    let _turn = beside_others();
    let dir = test_dir();
    let nats = Nats::start(dir.path());
    let gw = edge_gateway(&nats, dir.path());
    let api = gw.api();
    let (a, b) = hostile_beside_a_counter(&api, "retag", "retag");
    let input = vlan_trace(dir.path(), "tagged.pcap", 300, "100,200");
    let expected = per_vlan(&input);
    let total: u64 = expected.values().sum();
    let (out, report) = (dir.path().join("out.pcap"), dir.path().join("h1.json"));
    let mut host = start_live(&nats, &gw, dir.path(), "h1", &live_args(dir.path(), "h1", &input, &out, false, &report));
    api.wait_running(&a, "retag", 1);
    api.wait_running(&b, "count", 1);
    wait_taken(&report, total, "the host to take the whole capture");
    host.term();
    let rep = host_report(&report);
    assert_eq!(rep["refused_egress"].as_u64(), expected.get(&Some(100)).copied(), "{rep}");
    // Only bravo's own packets leave in VLAN 200.
    let got = per_vlan(&out);
    assert_eq!(got.get(&Some(200)), expected.get(&Some(200)), "{got:?}");
    assert_eq!(got.get(&Some(100)), None, "{got:?}");
}

/// An NF that offloads its flows (`sluice:nf@0.5.0`) with a verdict to a
/// port its deployment's attachments do not name gets the packets that
/// pass under its entries refused as its own verdicts are: nothing of
/// alpha's leaves, and bravo's traffic is untouched.
#[test]
fn offloaded_packets_meet_the_same_egress_checks_as_the_nf_s_own() {
    let _turn = beside_others();
    let dir = test_dir();
    let nats = Nats::start(dir.path());
    let gw = edge_gateway(&nats, dir.path());
    let api = gw.api();
    let (a, b) = hostile_beside_a_counter(&api, "out", "offload-out");
    // Long flows in both tenants' VLANs, so that most of alpha's packets
    // come after its entries are made.
    let text = dir.path().join("long.txt");
    std::fs::write(
        &text,
        "0.000 vlan 100 udp 10.0.0.5:5000 > 198.51.100.9:5000 len 200 repeat 300 every 0.0001\n\
         0.000 vlan 100 tcp 10.0.0.6:40000 > 198.51.100.9:443 flags A len 200 repeat 300 every 0.0001\n\
         0.000 vlan 200 udp 10.0.1.5:6000 > 198.51.100.9:6000 len 200 repeat 200 every 0.0001\n",
    )
    .unwrap();
    let input = dir.path().join("long.pcap");
    let o = Command::new(sibling_bin("sluice-host"))
        .args(["synth", "--from", text.to_str().unwrap(), "--out", input.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let expected = per_vlan(&input);
    let total: u64 = expected.values().sum();
    let (out, report) = (dir.path().join("out.pcap"), dir.path().join("h1.json"));
    let mut host = start_live(&nats, &gw, dir.path(), "h1", &live_args(dir.path(), "h1", &input, &out, false, &report));
    api.wait_running(&a, "out", 1);
    api.wait_running(&b, "count", 1);
    wait_taken(&report, total, "the host to take the whole capture");
    host.term();
    let rep = host_report(&report);
    assert_eq!(rep["refused_egress"].as_u64(), expected.get(&Some(100)).copied(), "{rep}");
    // Some of them passed under entries, and were refused all the same.
    let offloaded: u64 = rep["deployments"]
        .as_object()
        .unwrap()
        .values()
        .filter(|d| d["name"] == "out")
        .flat_map(|d| d["nfs"].as_object().unwrap().values())
        .map(|t| t["offloaded_packets"].as_u64().unwrap_or(0))
        .sum();
    assert!(offloaded > 0, "no packet passed under an entry: {rep}");
    let got = per_vlan(&out);
    assert_eq!(got.get(&Some(100)), None, "{got:?}");
    assert_eq!(got.get(&Some(200)), expected.get(&Some(200)), "{got:?}");
    assert!(
        !frames(&out).iter().any(|f| f.windows(4).any(|w| w == [192, 0, 2, 66])),
        "an entry's rewrite left the host"
    );
}

/// Tenant alpha's hostile NF (`config`) as deployment `name` on VLAN 100,
/// tenant bravo's counter as `count` on VLAN 200 of port 0; their keys.
fn hostile_beside_a_counter(api: &Api, name: &str, config: &str) -> (String, String) {
    let (_, a) = edge_tenant(api, "alpha");
    let (_, b) = edge_tenant(api, "bravo");
    assert_eq!(api.upload(Some(&a), "hostile", "1", &std::fs::read(test_nf("hostile")).unwrap()).status, 201);
    assert_eq!(api.upload(Some(&b), "counter", "1", &std::fs::read(nf("counter")).unwrap()).status, 201);
    let d = api.post(
        Some(&a),
        "/v1/deployments",
        &json!({ "name": name, "group": "edge", "module": "hostile@1", "config": config, "attach": ["port=0,vlan=100"] }),
    );
    assert_eq!(d.status, 201, "{}", d.body);
    let d = api.post(
        Some(&b),
        "/v1/deployments",
        &json!({ "name": "count", "group": "edge", "module": "counter@1", "attach": ["port=0,vlan=200"] }),
    );
    assert_eq!(d.status, 201, "{}", d.body);
    (a, b)
}

/// A deployment that asks for `"fragments": "reassemble"` gets whole
/// datagrams under `serve --dpdk` as `run --fragments reassemble` does:
/// fragments that come last first leave grouped by datagram, cut as they
/// came, the same frames through both; the API shows the choice, and the
/// host reports the datagrams it reassembled.
#[test]
fn a_deployment_that_reassembles_fragments_matches_run() {
    use sluice_wire::ipv4::Ipv4Packet;
    let _turn = beside_others();
    let dir = test_dir();
    let d = dir.path();
    let input = d.join("in.pcap");
    let mut sink = sluice_pcap::PcapSink::create(&input).unwrap();
    let mut t = 1_000u64;
    for i in 0..10u16 {
        let mut whole = sluice_wire::build::FrameSpec::udp4([10, 0, 0, 5], 6000 + i, [198, 51, 100, 7], 53)
            .with_payload(vec![i as u8; 3000])
            .build();
        whole[14 + 4..14 + 6].copy_from_slice(&(700 + i).to_be_bytes());
        whole[14 + 6] = 0;
        Ipv4Packet::new_unchecked(&mut whole[14..]).fill_checksum();
        for f in sluice_wire::fragment::split_ipv4(&whole, 1500).unwrap().iter().rev() {
            sink.write(t, f.len() as u32, f).unwrap();
            t += 1_000;
        }
    }
    sink.finish().unwrap();
    let cfg = d.join("fw.json");
    std::fs::write(&cfg, fw_config().to_string()).unwrap();
    let host_toml = d.join("host.toml");
    std::fs::write(
        &host_toml,
        format!("fragments = \"reassemble\"\n[nf.firewall]\nconfig-file = \"{}\"\n", cfg.display()),
    )
    .unwrap();
    let fw = nf("firewall");
    let run_out = d.join("run.pcap");
    let o = Command::new(sibling_bin("sluice-host"))
        .arg("--config")
        .arg(&host_toml)
        .args(["run", "--quiet", "--nf", fw.to_str().unwrap(), "--in", input.to_str().unwrap()])
        .args(["--out", run_out.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    let nats = Nats::start(d);
    let gw = edge_gateway(&nats, d);
    let api = gw.api();
    let (_, key) = edge_tenant(&api, "alpha");
    assert_eq!(api.upload(Some(&key), "firewall", "1.0.0", &std::fs::read(&fw).unwrap()).status, 201);
    let bad = api.post(
        Some(&key),
        "/v1/deployments",
        &json!({ "name": "fw", "group": "edge", "module": "firewall@1.0.0", "attach": ["port=0"], "fragments": "defrag" }),
    );
    assert_eq!(bad.status, 400, "{}", bad.body);
    let r = api.post(
        Some(&key),
        "/v1/deployments",
        &json!({ "name": "fw", "group": "edge", "module": "firewall@1.0.0", "config": fw_config(), "attach": ["port=0"], "fragments": "reassemble" }),
    );
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.body["fragments"], "reassemble", "{}", r.body);
    let id = r.body["id"].as_str().unwrap().to_string();
    let (serve_out, report) = (d.join("serve.pcap"), d.join("h1.json"));
    let mut h = start_live(&nats, &gw, d, "h1", &live_args(d, "h1", &input, &serve_out, false, &report));
    wait_taken(&report, 30, "the host to take the capture");
    h.term();
    let (a, b) = (frames(&run_out), frames(&serve_out));
    assert_eq!(a.len(), 30);
    assert_ne!(a, frames(&input), "whole datagrams leave in order, not as they came");
    assert_eq!(a, b, "run and serve --dpdk differ");
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    let chain = &r["deployments"][&id]["chain"];
    assert_eq!(
        (chain["datagrams_reassembled"].as_u64(), chain["fragments_held"].as_u64()),
        (Some(10), Some(20)),
        "{r}"
    );
}
