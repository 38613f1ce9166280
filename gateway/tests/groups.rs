//! The group controller against real processes: a secure nats-server, the
//! gateway and four `sluice-host serve` processes of one group. Membership
//! comes from heartbeats; every change (a host joining, a cap, added
//! capacity, a drain, a `kill -9`, a gateway restart) gives a new version
//! of the group's flow-ownership table, or none, as it should; the table
//! on the bus is the one the API describes, every host reads it through
//! its own restricted NATS identity, and the slots of a host that goes
//! move to exactly the next owners the previous table named.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

use crate::support::*;
use serde_json::{Value, json};
use sluice_control::{Bus, OwnershipTable};
use sluice_wire::FlowKey;
use std::process::Command;
use std::time::{Duration, Instant};

const SILENCE_MS: u64 = 1500;

/// The group `default`'s table as the gateway published it.
fn published(nats: &Nats) -> Option<OwnershipTable> {
    published_group(nats, "default")
}

/// A group's table as the gateway published it, read with the gateway's
/// identity.
fn published_group(nats: &Nats, group: &str) -> Option<OwnershipTable> {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let (cert, key) = nats.pki.client_cert("gateway");
        let auth = sluice_control::NatsAuth {
            nkey_file: Some(nats.pki.nkey("gateway").0),
            ca_file: Some(nats.pki.ca()),
            cert_file: Some(cert),
            key_file: Some(key),
            creds_file: None,
        };
        let bus = sluice_control::NatsBus::connect(
            &nats.url,
            "test",
            &auth,
            sluice_control::Role::Gateway { replicas: None },
            "groups-test",
        )
        .await
        .unwrap();
        bus.ownership(group).await.unwrap()
    })
}

fn group(api: &Api) -> Value {
    let r = api.get(Some(ADMIN), "/v1/groups/default");
    assert_eq!(r.status, 200, "{}", r.body);
    r.body
}

fn member<'a>(g: &'a Value, host: &str) -> &'a Value {
    g["members"].as_array().unwrap().iter().find(|m| m["host"] == host).unwrap_or_else(|| panic!("{host} in {g}"))
}

fn active(t: &OwnershipTable) -> Vec<&str> {
    t.members().iter().map(|m| m.host.as_str()).collect()
}

/// Waits for a table version after `after` whose active hosts are `hosts`,
/// published and read back by every live member.
fn wait_table(api: &Api, nats: &Nats, after: u64, hosts: &[&str]) -> OwnershipTable {
    wait_group_table(api, nats, "default", after, hosts)
}

/// [`wait_table`] of any group.
fn wait_group_table(api: &Api, nats: &Nats, name: &str, after: u64, hosts: &[&str]) -> OwnershipTable {
    wait_for(30, &format!("a table of {name} of {hosts:?} after v{after}"), || {
        let r = api.get(Some(ADMIN), &format!("/v1/groups/{name}"));
        assert_eq!(r.status, 200, "{}", r.body);
        let v = r.body["table_version"].as_u64().unwrap_or(0);
        let t = published_group(nats, name)?;
        (v > after && t.version() == v && active(&t) == hosts).then_some(t)
    })
}

/// Every slot the lost host owned in `before` is owned in `after` by its
/// next owner in `before`; returns the share of the other slots that moved.
fn check_handover(before: &OwnershipTable, after: &OwnershipTable, lost: &str) -> f64 {
    let mut others_moved = 0;
    for s in 0..before.slots() {
        let prefs: Vec<&str> = before.preferences(s).collect();
        if prefs[0] == lost {
            assert_eq!(after.owner_of_slot(s), Some(prefs[1]), "slot {s} of {lost} went elsewhere than its next owner");
        } else if after.owner_of_slot(s) != Some(prefs[0]) {
            others_moved += 1;
        }
    }
    others_moved as f64 / before.slots() as f64
}

fn sluice(gw: &Gateway, args: &[&str]) -> String {
    let out = Command::new(sibling_bin("sluice"))
        .args(["--url", &gw.url])
        .args(args)
        .env("SLUICE_ADMIN_TOKEN", ADMIN)
        .env_remove("SLUICE_API_KEY")
        .output()
        .unwrap();
    assert!(out.status.success(), "sluice {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn heartbeats_drains_caps_and_a_kill_give_new_table_versions_with_minimal_movement() {
    let _turn = beside_others();
    let dir = test_dir();
    let nats = Nats::start(dir.path());
    let silence = SILENCE_MS.to_string();
    let mut gw = Gateway::start(&nats, dir.path(), &[("SLUICE_HOST_SILENCE_MS", &silence)]);
    let api = gw.api();
    let host = |id: &str, capacity: &str, extra: &[&str]| {
        let mut args = vec!["--heartbeat-ms", "300", "--capacity-pps", capacity];
        args.extend_from_slice(extra);
        start_host(&nats, &gw, dir.path(), id, &args)
    };

    // Three hosts; h1 replays traffic into a deployment, which is the
    // group's demand.
    let pcap = trace(dir.path(), 300);
    let report = dir.path().join("h1.json");
    let replay = Replay { pcap: &pcap, loops: 0, pps: 3000, window_ms: 500, report: &report }.args();
    let replay: Vec<&str> = replay.iter().map(String::as_str).collect();
    let _h1 = host("h1", "1000", &replay);
    let mut h2 = host("h2", "1000", &[]);
    let _h3 = host("h3", "1000", &[]);
    let (_, key) = api.tenant("acme");
    assert_eq!(api.upload(Some(&key), "counter", "1", &std::fs::read(nf("counter")).unwrap()).status, 201);
    assert_eq!(api.post(Some(&key), "/v1/deployments", &json!({ "name": "c", "module": "counter@1" })).status, 201);
    api.wait_running(&key, "c", 1);

    let t1 = wait_table(&api, &nats, 0, &["h1", "h2", "h3"]);
    for (h, share) in t1.shares() {
        assert!((share - 1.0 / 3.0).abs() < 0.01, "{h}: {share}");
    }
    // Every host reads the table through its own restricted identity.
    wait_for(20, "every host to report the table it read", || {
        let g = group(&api);
        ["h1", "h2", "h3"].iter().all(|h| member(&g, h)["table_version"] == t1.version()).then_some(())
    });
    // Demand follows h1's replay; the members report their load.
    let g = wait_for(30, "the demand to reach the replay rate", || {
        let g = group(&api);
        (g["demand_pps"].as_u64().unwrap() > 2000).then_some(g)
    });
    assert!(member(&g, "h1")["load_pps"].as_u64().unwrap() > 1000, "{g}");
    assert_eq!(member(&g, "h2")["load_pps"], 0, "{g}");
    assert_eq!((g["active_hosts"].as_u64(), g["proposed_hosts"].as_u64()), (Some(3), Some(3)), "{g}");

    // Autoscaling at half capacity: the controller proposes more hosts
    // than there are; all three stay active.
    let out = sluice(&gw, &["groups", "set", "default", "--target-load", "0.5", "--output", "json"]);
    let s: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(s["target_load"], 0.5, "{out}");
    wait_for(20, "a proposal of 5 or more hosts", || {
        let g = group(&api);
        (g["proposed_hosts"].as_u64().unwrap() >= 5 && g["active_hosts"] == 3).then_some(())
    });
    // A cap applies at once: h3 stands by, its slots go to their next owners.
    let r = api.put(Some(ADMIN), "/v1/groups/default/settings", &json!({ "max_hosts": 2 }));
    assert_eq!(r.status, 200, "{}", r.body);
    let t2 = wait_table(&api, &nats, t1.version(), &["h1", "h2"]);
    assert!(check_handover(&t1, &t2, "h3") < 0.03);
    assert_eq!(member(&group(&api), "h3")["state"], "standby");
    // Added capacity brings the standby back.
    sluice(&gw, &["groups", "add-capacity", "default", "--hosts", "1"]);
    let t3 = wait_table(&api, &nats, t2.version(), &["h1", "h2", "h3"]);
    assert_eq!(t3.members(), t1.members());
    assert_eq!(t3.moved_from(&t1), 0, "the same members give the same table");

    // Autoscaling off, no cap; a fourth host of twice the capacity joins
    // and takes its weighted share, about 2/5 of the slots.
    sluice(&gw, &["groups", "set", "default", "--no-target", "--no-max", "--min-hosts", "1"]);
    let _h4 = host("h4", "2000", &[]);
    let t4 = wait_table(&api, &nats, t3.version(), &["h1", "h2", "h3", "h4"]);
    let share: f64 = t4.shares().into_iter().find(|(h, _)| h == "h4").unwrap().1;
    assert!((share - 0.4).abs() < 0.01, "h4 owns {share}");
    let moved = t4.moved_from(&t3) as f64 / t4.slots() as f64;
    assert!(moved < 0.43, "{moved} of the slots moved for a host that takes 0.4");
    assert_eq!(group(&api)["moved_slots"].as_u64(), Some(t4.moved_from(&t3) as u64));

    // Draining h4: it stays up and heard, owns nothing; its slots go to
    // their next owners and little else moves.
    sluice(&gw, &["groups", "drain", "default", "h4"]);
    let t5 = wait_table(&api, &nats, t4.version(), &["h1", "h2", "h3"]);
    assert!(check_handover(&t4, &t5, "h4") < 0.03);
    let g = group(&api);
    assert_eq!(
        (member(&g, "h4")["state"].as_str(), member(&g, "h4")["drained"].as_bool()),
        (Some("draining"), Some(true))
    );

    // kill -9 of h2: gone after the silence bound, its slots to their next
    // owners, which are the hosts its state is replicated to.
    let killed = Instant::now();
    h2.kill9();
    let t6 = wait_table(&api, &nats, t5.version(), &["h1", "h3"]);
    let detected = killed.elapsed();
    assert!(detected >= Duration::from_millis(SILENCE_MS - 300), "h2 dropped {detected:?} after the kill");
    assert!(check_handover(&t5, &t6, "h2") < 0.03);
    eprintln!("h2 out of the table {detected:?} after kill -9 (silence bound {SILENCE_MS} ms)");
    assert_eq!(member(&group(&api), "h2")["state"], "gone");

    // The JSON list names the same version; the table view prints it.
    let list: Value = serde_json::from_str(&sluice(&gw, &["groups", "--output", "json"])).unwrap();
    assert_eq!(list[0]["table_version"].as_u64(), Some(t6.version()), "{list}");
    let text = sluice(&gw, &["groups"]);
    assert!(text.contains(&format!("table v{}", t6.version())) && text.contains("draining"), "{text}");

    // A gateway restart adopts the published table: no new version while
    // nothing changes.
    gw.kill9();
    gw.restart();
    std::thread::sleep(Duration::from_millis(SILENCE_MS + 1500));
    let g = group(&api);
    assert_eq!(g["table_version"].as_u64(), Some(t6.version()), "{g}");
    assert_eq!(published(&nats).unwrap(), t6);

    // Bad requests say why; tenants may not touch groups.
    for body in [json!({ "min_hosts": 0 }), json!({ "target_load": 2.0 }), json!({ "max_hosts": 0 }), json!({ "x": 1 })]
    {
        let r = api.put(Some(ADMIN), "/v1/groups/default/settings", &body);
        assert_eq!(r.status, 400, "{body} -> {}", r.body);
    }
    assert_eq!(api.put(Some(ADMIN), "/v1/groups/a.b/settings", &json!({})).status, 400);
    assert_eq!(api.post(Some(ADMIN), "/v1/groups/default/hosts/ghost/drain", &json!({})).status, 404);
    assert_eq!(api.post(Some(ADMIN), "/v1/groups/nope/capacity", &json!({ "hosts": 1 })).status, 404);
    assert_eq!(api.post(Some(ADMIN), "/v1/groups/default/capacity", &json!({ "hosts": 0 })).status, 400);
    assert_eq!(api.get(Some(&key), "/v1/groups").status, 403);
    assert_eq!(api.post(Some(&key), "/v1/groups/default/hosts/h1/drain", &json!({})).status, 403);
}

/// A pcap file with no packets.
fn empty_pcap(path: &std::path::Path) {
    let mut h = Vec::new();
    h.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
    h.extend_from_slice(&2u16.to_le_bytes());
    h.extend_from_slice(&4u16.to_le_bytes());
    h.extend_from_slice(&[0; 8]);
    h.extend_from_slice(&65535u32.to_le_bytes());
    h.extend_from_slice(&1u32.to_le_bytes());
    std::fs::write(path, h).unwrap();
}

/// Each packet's normalized flow key (none: not IP), in capture order.
fn flows(path: &std::path::Path) -> Vec<(Option<sluice_wire::FlowKey>, Vec<u8>)> {
    let t = sluice_pcap::Trace::open(path).unwrap();
    t.packets()
        .iter()
        .map(|p| {
            let d = t.data(p);
            (sluice_wire::parse(d).key.map(|k| k.normalized()), d.to_vec())
        })
        .collect()
}

#[test]
fn the_dispatcher_sends_every_flow_to_its_owner_whole_and_in_order() {
    let _turn = measuring_alone();
    let dir = test_dir();
    let nats = Nats::start(dir.path());
    let gw = Gateway::start(&nats, dir.path(), &[("SLUICE_HOST_SILENCE_MS", "1500")]);
    let api = gw.api();
    let _h1 = start_host(&nats, &gw, dir.path(), "h1", &["--heartbeat-ms", "300", "--capacity-pps", "1000"]);
    let _h2 = start_host(&nats, &gw, dir.path(), "h2", &["--heartbeat-ms", "300", "--capacity-pps", "2000"]);
    let _h3 = start_host(&nats, &gw, dir.path(), "h3", &["--heartbeat-ms", "300", "--capacity-pps", "1000"]);
    let table = wait_table(&api, &nats, 0, &["h1", "h2", "h3"]);

    // The dispatcher's identity: registered as one, it may read the table.
    let (_, public) = nats.pki.nkey("d1");
    let r = api.post(
        Some(ADMIN),
        "/v1/hosts",
        &json!({ "id": "d1", "group": "default", "nkey": public, "role": "dispatcher" }),
    );
    assert_eq!((r.status, r.body["role"].as_str()), (201, Some("dispatcher")), "{}", r.body);
    nats.reload();

    let pcap = trace(dir.path(), 2000);
    let empty = dir.path().join("empty.pcap");
    empty_pcap(&empty);
    let report = dir.path().join("steer.json");
    let out = |h: &str| dir.path().join(format!("to-{h}.pcap"));
    let mut vdevs = vec![format!(
        "--vdev=net_pcap0,rx_pcap={},tx_pcap={}",
        pcap.display(),
        dir.path().join("ingress-tx.pcap").display()
    )];
    for (i, h) in ["h1", "h2", "h3"].iter().enumerate() {
        vdevs.push(format!("--vdev=net_pcap{},rx_pcap={},tx_pcap={}", i + 1, empty.display(), out(h).display()));
    }
    let prefix = format!("--file-prefix=sluice-{}-d1", dir.path().file_name().unwrap().to_string_lossy());
    let st = Command::new(sibling_bin("sluice-host"))
        .args(["steer", "--nats", &nats.url, "--cluster", "test", "--group", "default", "--id", "d1"])
        .args(nats.pki.host_flags("d1"))
        .args(["--ingress", "0", "--to", "h1=1", "--to", "h2=2@02:00:00:00:00:02", "--to", "h3=3"])
        .args(["--workers", "1", "--idle-exit-ms", "1500", "--report"])
        .arg(&report)
        .args(["--", "--no-huge", "--no-pci", "-m", "256", "-l", "0", "--log-level=lib.eal:error", &prefix])
        .args(&vdevs)
        .env("SLUICE_LOG", "info")
        .output()
        .unwrap();
    assert!(
        st.status.success(),
        "steer: {}{}",
        String::from_utf8_lossy(&st.stdout),
        String::from_utf8_lossy(&st.stderr)
    );
    eprint!("{}", String::from_utf8_lossy(&st.stdout));
    let rep: Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();

    let input = flows(&pcap);
    let ip = input.iter().filter(|(k, _)| k.is_some()).count() as u64;
    assert_eq!(rep["received"].as_u64(), Some(input.len() as u64), "{rep}");
    assert_eq!((rep["forwarded"].as_u64(), rep["no_route"].as_u64()), (Some(ip), Some(0)), "{rep}");
    assert_eq!(rep["not_ip"].as_u64(), Some(input.len() as u64 - ip), "{rep}");
    assert_eq!(rep["table_version"].as_u64(), Some(table.version()), "{rep}");

    // Every flow went whole, in order, to its owner; h2's frames carry its MAC.
    let mut seen = std::collections::HashMap::new();
    let mut total = 0;
    for h in ["h1", "h2", "h3"] {
        let got = flows(&out(h));
        total += got.len();
        let mut per_flow: std::collections::HashMap<sluice_wire::FlowKey, Vec<Vec<u8>>> = Default::default();
        for (k, frame) in got {
            let k = k.unwrap();
            assert_eq!(
                table.owner(k.hash_normalized()),
                Some(h),
                "a flow of {} reached {h}",
                table.owner(k.hash_normalized()).unwrap()
            );
            if h == "h2" {
                assert_eq!(frame[..6], [2, 0, 0, 0, 0, 2]);
            }
            per_flow.entry(k).or_default().push(frame);
            assert!(seen.insert(k, h).is_none_or(|other| other == h), "a flow reached two hosts");
        }
        for (k, frames) in per_flow {
            let sent: Vec<&Vec<u8>> = input.iter().filter(|(x, _)| *x == Some(k)).map(|(_, f)| f).collect();
            assert_eq!(frames.len(), sent.len());
            for (got, sent) in frames.iter().zip(sent) {
                assert_eq!(got[6..], sent[6..], "a flow's packets arrived out of order");
            }
        }
    }
    assert_eq!(total as u64, ip);
    // Each host got about its weighted share of the flows.
    let share = |h: &str| seen.values().filter(|x| **x == h).count() as f64 / seen.len() as f64;
    assert!((share("h2") - 0.5).abs() < 0.1 && (share("h1") - 0.25).abs() < 0.1, "{} {}", share("h1"), share("h2"));

    // The dispatcher's identity cannot heartbeat or bill as a host.
    assert_eq!(group(&api)["members"].as_array().unwrap().len(), 3);
}

/// `serve --dpdk` of group `edge`: port 0 a memif (server on `sock`)
/// towards the dispatcher, port 1 a capture of what it forwards.
fn edge_host_args(
    dir: &std::path::Path,
    id: &str,
    sock: &std::path::Path,
    out: &std::path::Path,
    empty: &std::path::Path,
) -> Vec<String> {
    let prefix = format!("--file-prefix=sluice-{}-{id}", dir.file_name().unwrap().to_string_lossy());
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
        "--capacity-pps",
        "1000",
        "--report",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([dir.join(format!("{id}.json")).to_str().unwrap().to_string()])
    .chain(
        ["--", "--no-huge", "--no-pci", "-m", "256", "-l", "0", "--log-level=lib.eal:error"]
            .iter()
            .map(|s| s.to_string()),
    )
    .chain([
        prefix,
        format!("--vdev=net_memif0,role=server,socket={}", sock.display()),
        format!("--vdev=net_pcap1,rx_pcap={},tx_pcap={}", empty.display(), out.display()),
    ])
    .collect()
}

/// A group `edge` behind a dispatcher, up to its first table: a secure
/// nats-server, the gateway (ports 0 and 1 exposed in `edge`), `hosts` as
/// `serve --dpdk` hosts (see [`edge_host_args`]), tenant acme's deployment
/// `dep` of NF `nf` (with `config`, if any) attached `port=0,out=1` and
/// running, and dispatcher `d1` registered.
struct EdgeGroup {
    nats: Nats,
    gw: Gateway,
    procs: Vec<Proc>,
    key: String,
    table: OwnershipTable,
    /// This test's turn, alone among the file's tests.
    _turn: std::sync::RwLockWriteGuard<'static, ()>,
}

fn edge_group(d: &std::path::Path, hosts: &[&str], nf_name: &str, dep: &str, config: Option<Value>) -> EdgeGroup {
    edge_group_with(d, hosts, nf_name, dep, config, &[])
}

/// [`edge_group`] with `extra` arguments for every host.
fn edge_group_with(
    d: &std::path::Path,
    hosts: &[&str],
    nf_name: &str,
    dep: &str,
    config: Option<Value>,
    extra: &[&str],
) -> EdgeGroup {
    edge_group_spec(d, hosts, nf_name, dep, config, extra, &[])
}

/// [`edge_group_with`] with `fields` added to the deployment's request.
fn edge_group_spec(
    d: &std::path::Path,
    hosts: &[&str],
    nf_name: &str,
    dep: &str,
    config: Option<Value>,
    extra: &[&str],
    fields: &[(&str, Value)],
) -> EdgeGroup {
    // Tests that run a group with its dispatcher take turns alone: each
    // runs five or six busy-polling processes, which on a small machine
    // would hold up each other's hosts.
    let turn = measuring_alone();
    let nats = Nats::start(d);
    let conf = d.join("gateway.toml");
    std::fs::write(&conf, "[groups.edge]\nports = [0, 1]\n").unwrap();
    let gw = Gateway::start(
        &nats,
        d,
        &[("SLUICE_GATEWAY_CONFIG", conf.to_str().unwrap()), ("SLUICE_HOST_SILENCE_MS", &SILENCE_MS.to_string())],
    );
    let api = gw.api();
    let empty = d.join("empty.pcap");
    empty_pcap(&empty);
    let mut procs = Vec::new();
    for h in hosts {
        let mut args = edge_host_args(d, h, &d.join(format!("{h}.sock")), &d.join(format!("{h}.out.pcap")), &empty);
        let eal = args.iter().position(|a| a == "--").unwrap_or(args.len());
        args.splice(eal..eal, extra.iter().map(|a| a.to_string()));
        procs.push(start_host(&nats, &gw, d, h, &args.iter().map(String::as_str).collect::<Vec<_>>()));
    }
    let (id, key) = api.tenant("acme");
    assert_eq!(api.put(Some(ADMIN), &format!("/v1/tenants/{id}/groups"), &json!({ "groups": ["edge"] })).status, 200);
    assert_eq!(api.upload(Some(&key), nf_name, "1", &std::fs::read(nf(nf_name)).unwrap()).status, 201);
    let mut spec =
        json!({ "name": dep, "group": "edge", "module": format!("{nf_name}@1"), "attach": ["port=0,out=1"] });
    if let Some(c) = config {
        spec["config"] = c;
    }
    for (k, v) in fields {
        spec[*k] = v.clone();
    }
    let r = api.post(Some(&key), "/v1/deployments", &spec);
    assert_eq!(r.status, 201, "{}", r.body);
    api.wait_running(&key, dep, 1);
    let table = wait_group_table(&api, &nats, "edge", 0, hosts);
    let (_, public) = nats.pki.nkey("d1");
    let r = api.post(
        Some(ADMIN),
        "/v1/hosts",
        &json!({ "id": "d1", "group": "edge", "nkey": public, "role": "dispatcher" }),
    );
    assert_eq!(r.status, 201, "{}", r.body);
    nats.reload();
    EdgeGroup { nats, gw, procs, key, table, _turn: turn }
}

/// The stateful firewall's config in these tests: clients of 10.0.0.0/8
/// may open connections to port 80; nothing else passes, so a server's
/// packet passes only where its connection's state is.
fn web_firewall() -> Value {
    json!({ "default": "deny", "rules": [{ "action": "allow", "proto": "tcp", "src": "10.0.0.0/8", "dst-ports": "80" }] })
}

#[test]
fn a_group_behind_its_dispatcher_processes_every_packet_once_on_its_flow_s_owner() {
    let dir = test_dir();
    let d = dir.path();
    let hosts = ["h1", "h2", "h3"];
    let EdgeGroup { nats, gw, mut procs, key, _turn, .. } = edge_group(d, &hosts, "counter", "c", None);
    let api = gw.api();
    let pcap = trace(d, 1000);
    let rep = steer_once(&nats, d, "trace", &pcap, &hosts);
    let input = flows(&pcap);
    assert_eq!(rep["forwarded"].as_u64(), Some(input.len() as u64), "{rep}");

    // Every packet is billed once, by one host: usage equals the trace.
    wait_for(60, "usage to reach the trace's packets", || {
        let u = api.get(Some(&key), "/v1/usage").body;
        (u["total"]["packets"].as_u64() == Some(input.len() as u64)).then_some(())
    });
    for p in procs.iter_mut() {
        p.term();
    }
    let u = api.get(Some(&key), "/v1/usage").body;
    assert_eq!(u["total"]["packets"].as_u64(), Some(input.len() as u64), "{u}");

    // Each host forwarded exactly its flows, whole and in order.
    let table = published_group(&nats, "edge").unwrap();
    let mut total = 0;
    for h in hosts {
        let got = flows(&d.join(format!("{h}.out.pcap")));
        total += got.len();
        let mut per_flow: std::collections::HashMap<sluice_wire::FlowKey, Vec<Vec<u8>>> = Default::default();
        for (k, frame) in got {
            let k = k.unwrap();
            assert_eq!(table.owner(k.hash_normalized()), Some(h));
            per_flow.entry(k).or_default().push(frame);
        }
        for (k, frames) in per_flow {
            let sent: Vec<&Vec<u8>> = input.iter().filter(|(x, _)| *x == Some(k)).map(|(_, f)| f).collect();
            assert_eq!(frames.iter().collect::<Vec<_>>(), sent, "a flow of {h} lost, gained or reordered packets");
        }
    }
    assert_eq!(total, input.len());
}

/// A capture of `frames` (1 µs apart).
fn write_pcap(path: &std::path::Path, frames: &[Vec<u8>]) {
    empty_pcap(path);
    let mut b = std::fs::read(path).unwrap();
    for (i, f) in frames.iter().enumerate() {
        b.extend_from_slice(&1u32.to_le_bytes());
        b.extend_from_slice(&(i as u32).to_le_bytes());
        b.extend_from_slice(&(f.len() as u32).to_le_bytes());
        b.extend_from_slice(&(f.len() as u32).to_le_bytes());
        b.extend_from_slice(f);
    }
    std::fs::write(path, b).unwrap();
}

/// The dispatcher `d1` of group `edge` taking port 0 from `ingress` (a
/// vdev) and sending to `hosts` over their memifs (port i + 1), exiting
/// after `idle_exit_ms` without traffic, with `extra` arguments; its
/// report in `steer-<pass>.json`.
fn steer_command(
    nats: &Nats,
    d: &std::path::Path,
    pass: &str,
    ingress: String,
    hosts: &[&str],
    idle_exit_ms: u64,
    extra: &[&str],
) -> Command {
    let mut vdevs = vec![ingress];
    let mut to = Vec::new();
    for (i, h) in hosts.iter().enumerate() {
        vdevs.push(format!("--vdev=net_memif{},role=client,socket={}", i + 1, d.join(format!("{h}.sock")).display()));
        to.extend(["--to".to_string(), format!("{h}={}", i + 1)]);
    }
    let prefix = format!("--file-prefix=sluice-{}-d1-{pass}", d.file_name().unwrap().to_string_lossy());
    let mut c = Command::new(sibling_bin("sluice-host"));
    c.args(["steer", "--nats", &nats.url, "--cluster", "test", "--group", "edge", "--id", "d1"])
        .args(nats.pki.host_flags("d1"))
        .args(["--ingress", "0", "--workers", "1", "--batch", "32", "--idle-exit-ms", &idle_exit_ms.to_string()])
        // A host held up by a busy test machine slows the dispatcher down
        // rather than losing packets.
        .args(["--tx-retry-us", "50000"])
        .arg("--report")
        .arg(d.join(format!("steer-{pass}.json")))
        .args(&to)
        .args(extra)
        .args(["--", "--no-huge", "--no-pci", "-m", "512", "-l", "0", "--log-level=lib.eal:error", &prefix])
        .args(&vdevs)
        .env("SLUICE_LOG", "info");
    c
}

/// One pass of the dispatcher over `pcap`, to the hosts named; returns its
/// report.
fn steer_once(nats: &Nats, d: &std::path::Path, pass: &str, pcap: &std::path::Path, hosts: &[&str]) -> Value {
    steer_once_with(nats, d, pass, pcap, hosts, &[])
}

/// [`steer_once`] with `extra` arguments for the dispatcher.
fn steer_once_with(
    nats: &Nats,
    d: &std::path::Path,
    pass: &str,
    pcap: &std::path::Path,
    hosts: &[&str],
    extra: &[&str],
) -> Value {
    let ingress = format!(
        "--vdev=net_pcap0,rx_pcap={},tx_pcap={}",
        pcap.display(),
        d.join(format!("{pass}-ingress-tx.pcap")).display()
    );
    let st = steer_command(nats, d, pass, ingress, hosts, 1500, extra).output().unwrap();
    eprint!("{}", String::from_utf8_lossy(&st.stdout));
    assert!(st.status.success(), "steer {pass}: {}", String::from_utf8_lossy(&st.stderr));
    serde_json::from_slice(&std::fs::read(d.join(format!("steer-{pass}.json"))).unwrap()).unwrap()
}

/// A host's report, as last written.
fn host_report(d: &std::path::Path, h: &str) -> Value {
    std::fs::read(d.join(format!("{h}.json"))).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or(Value::Null)
}

/// SNF's promise with the stateful firewall: connections opened through
/// three hosts keep their state when their host is killed (`kill -9`:
/// their replies pass at the next owners, which imported the replicas
/// the dead host had sent) and when a host is drained (its flows' state
/// goes with them). Without the state, the firewall drops every reply:
/// no rule allows traffic from the server.
/// Frames, in order.
type Frames = Vec<Vec<u8>>;

/// 600 connections from clients of 10.0.0.0/8 to a web server: the
/// clients' SYNs, the server's SYN-ACKs and the clients' ACKs.
fn web_connections() -> (Frames, Frames, Frames) {
    use sluice_wire::build::FrameSpec;
    use sluice_wire::tcp::flags;
    let conns: Vec<([u8; 4], u16)> =
        (0..600u32).map(|i| ([10, 0, (i / 200) as u8, (i % 200) as u8 + 1], 40000 + i as u16)).collect();
    let server = [192, 0, 2, 1];
    let syn = conns.iter().map(|&(c, p)| FrameSpec::tcp4(c, p, server, 80, flags::SYN).build()).collect();
    let syn_ack =
        conns.iter().map(|&(c, p)| FrameSpec::tcp4(server, 80, c, p, flags::SYN | flags::ACK).build()).collect();
    let ack = conns.iter().map(|&(c, p)| FrameSpec::tcp4(c, p, server, 80, flags::ACK).build()).collect();
    (syn, syn_ack, ack)
}

/// How many of `frames` host `h` of the test in `d` sent out (its output
/// capture is written as it goes).
fn passed(d: &std::path::Path, h: &str, frames: &[Vec<u8>]) -> usize {
    let got = flows(&d.join(format!("{h}.out.pcap")));
    frames.iter().filter(|f| got.iter().any(|(_, g)| g == *f)).count()
}

/// How many of `frames` belong to flows that `t` gives to host `h`.
fn owned_by(t: &OwnershipTable, h: &str, frames: &[Vec<u8>]) -> usize {
    let key_of = |f: &Vec<u8>| sluice_wire::parse(f).key.unwrap().normalized();
    frames.iter().filter(|f| t.owner(key_of(f).hash_normalized()) == Some(h)).count()
}

#[test]
fn flows_keep_their_firewall_state_through_a_kill_and_a_drain() {
    let dir = test_dir();
    let d = dir.path();
    let hosts = ["h1", "h2", "h3"];
    let EdgeGroup { nats, gw, mut procs, table: before, _turn, .. } =
        edge_group(d, &hosts, "firewall", "fw", Some(web_firewall()));
    let api = gw.api();

    // 600 connections from clients to a web server: the SYNs, then the
    // server's SYN-ACKs, then the clients' ACKs.
    let (syn, syn_ack, ack) = web_connections();
    let h2_flows = owned_by(&before, "h2", &syn);
    assert!(h2_flows > 50, "h2 owns {h2_flows} of the connections");

    let p1 = d.join("syn.pcap");
    write_pcap(&p1, &syn);
    let rep = steer_once(&nats, d, "syn", &p1, &hosts);
    assert_eq!(rep["forwarded"].as_u64(), Some(syn.len() as u64), "{rep}");
    // Every host has sent its connections' state to their next owners.
    wait_for(30, "each host to replicate its connections", || {
        let sent: u64 = hosts.iter().map(|h| host_report(d, h)["peer"]["flows_sent"].as_u64().unwrap_or(0)).sum();
        (sent >= syn.len() as u64).then_some(())
    });

    // kill -9 of h2: its slots go to their next owners, which hold the
    // state h2 replicated.
    let killed = Instant::now();
    procs[1].kill9();
    let after = wait_group_table(&api, &nats, "edge", before.version(), &["h1", "h3"]);
    eprintln!("h2 out of the table {:.2} s after the kill", killed.elapsed().as_secs_f64());
    let live = ["h1", "h3"];
    let p2 = d.join("syn-ack.pcap");
    write_pcap(&p2, &syn_ack);
    let rep = steer_once(&nats, d, "syn-ack", &p2, &live);
    assert_eq!(rep["forwarded"].as_u64(), Some(syn_ack.len() as u64), "{rep}");
    // The replies are in the outputs once each host's capture is written.
    wait_for(30, "every server reply to pass", || {
        (live.iter().map(|h| passed(d, h, &syn_ack)).sum::<usize>() == syn_ack.len()).then_some(())
    });
    let imported: u64 = live.iter().map(|h| host_report(d, h)["peer"]["flows_imported"].as_u64().unwrap_or(0)).sum();
    assert_eq!(imported, h2_flows as u64, "the next owners imported exactly h2's connections");

    // Drain h3: its flows go to h1 with their state; h3 stays up.
    let h3_flows = owned_by(&after, "h3", &syn);
    let r = api.post(Some(ADMIN), "/v1/groups/edge/hosts/h3/drain", &json!({}));
    assert!(r.status < 300, "{}", r.body);
    let drained = wait_group_table(&api, &nats, "edge", after.version(), &["h1"]);
    assert!(drained.finishing().iter().any(|h| h == "h3"));
    // h3 sends the state of the flows whose next owner changed (the ones
    // h2 had), and already replicated its own to h1.
    std::thread::sleep(Duration::from_millis(500));
    let p3 = d.join("ack.pcap");
    write_pcap(&p3, &ack);
    let rep = steer_once(&nats, d, "ack", &p3, &live);
    assert_eq!(rep["forwarded"].as_u64(), Some(ack.len() as u64), "{rep}");
    wait_for(30, "every client ACK to pass at h1", || (passed(d, "h1", &ack) == ack.len()).then_some(()));
    assert_eq!(passed(d, "h3", &ack), 0, "a drained host takes no new flowlet");
    let imported_h1 = host_report(d, "h1")["peer"]["flows_imported"].as_u64().unwrap_or(0);
    assert!(imported_h1 >= h3_flows as u64, "h1 imported {imported_h1}, h3 had {h3_flows}");
    stop_all_but(&mut procs, 1);
}

/// Output commit (`durability = "replicated"`): with periodic replication
/// off (an interval of a minute), a connection's state reaches its next
/// owner only because its SYN waited for it; a `kill -9` of a host right
/// after its SYNs left then breaks none of its connections.
#[test]
fn with_replicated_durability_a_killed_host_s_connections_lose_no_state() {
    let dir = test_dir();
    let d = dir.path();
    let hosts = ["h1", "h2", "h3"];
    let EdgeGroup { nats, gw, mut procs, table: before, _turn, .. } =
        committing_group(d, "firewall", "fw", web_firewall());
    let api = gw.api();
    let (syn, syn_ack, _) = web_connections();
    let h2_flows = owned_by(&before, "h2", &syn);
    assert!(h2_flows > 50, "h2 owns {h2_flows} of the connections");

    let p1 = d.join("syn.pcap");
    write_pcap(&p1, &syn);
    let rep = steer_once(&nats, d, "syn", &p1, &hosts);
    assert_eq!(rep["forwarded"].as_u64(), Some(syn.len() as u64), "{rep}");
    // Every SYN waited for its connection's state to be held by the next
    // owner, and left: the hosts' reports say so (h2's too, before it dies).
    wait_committed(d, &hosts, syn.len() as u64);
    let peer = |h: &str, k: &str| host_report(d, h)["peer"][k].as_u64().unwrap_or(0);

    // kill -9 of h2 at once: its connections' next owners hold their state
    // only because their SYNs waited for it.
    procs[1].kill9();
    wait_group_table(&api, &nats, "edge", before.version(), &["h1", "h3"]);
    let live = ["h1", "h3"];
    let p2 = d.join("syn-ack.pcap");
    write_pcap(&p2, &syn_ack);
    let rep = steer_once(&nats, d, "syn-ack", &p2, &live);
    assert_eq!(rep["forwarded"].as_u64(), Some(syn_ack.len() as u64), "{rep}");
    wait_for(30, "every server reply to pass", || {
        (live.iter().map(|h| passed(d, h, &syn_ack)).sum::<usize>() == syn_ack.len()).then_some(())
    });
    let imported: u64 = live.iter().map(|h| peer(h, "flows_imported")).sum();
    assert_eq!(imported, h2_flows as u64, "the next owners imported exactly h2's connections");
    stop_all_but(&mut procs, 1);
}

/// Every frame host `h` of the test in `d` sent out so far (none while
/// its capture has no header yet).
fn out_frames(d: &std::path::Path, h: &str) -> Frames {
    let path = d.join(format!("{h}.out.pcap"));
    let written = std::fs::metadata(&path).map(|m| m.len() >= 24).unwrap_or(false);
    if written { flows(&path).into_iter().map(|(_, f)| f).collect() } else { Vec::new() }
}

/// The frames out of `hosts` whose payload ends with `mark`, with the host.
fn marked<'h>(d: &std::path::Path, hosts: &[&'h str], mark: &[u8]) -> Vec<(&'h str, Vec<u8>)> {
    hosts
        .iter()
        .flat_map(|h| out_frames(d, h).into_iter().filter(|f| f.ends_with(mark)).map(move |f| (*h, f)))
        .collect()
}

/// [`edge_group_spec`] for three hosts h1–h3 with periodic replication
/// off (an interval of a minute) and the deployment's `durability =
/// "replicated"`: a flow's state reaches its next owner only by output
/// commit.
fn committing_group(d: &std::path::Path, nf_name: &str, dep: &str, config: Value) -> EdgeGroup {
    let extra = ["--replicate-us", "60000000"];
    edge_group_spec(d, &["h1", "h2", "h3"], nf_name, dep, Some(config), &extra, &[("durability", json!("replicated"))])
}

/// Stops every process of a test but the `killed` one.
fn stop_all_but(procs: &mut [Proc], killed: usize) {
    for (i, p) in procs.iter_mut().enumerate() {
        if i != killed {
            p.term();
        }
    }
}

/// Waits until every host's output commit is settled (each message sent
/// held) and at least `deferred` packets waited for one, then checks that
/// none timed out or was dropped.
fn wait_committed(d: &std::path::Path, hosts: &[&str], deferred: u64) {
    let peer = |h: &str, k: &str| host_report(d, h)["peer"][k].as_u64().unwrap_or(0);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let waited: u64 = hosts.iter().map(|h| peer(h, "packets_deferred")).sum();
        let settled = hosts.iter().all(|h| peer(h, "commits_held") == peer(h, "commits_sent"));
        if waited >= deferred && settled {
            break;
        }
        let counters: Vec<Value> = hosts.iter().map(|h| host_report(d, h)["peer"].clone()).collect();
        assert!(Instant::now() < deadline, "{waited} of {deferred} packets waited; settled: {settled}: {counters:#?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    for h in hosts {
        assert_eq!(peer(h, "commits_timed_out"), 0, "{h}: {}", host_report(d, h)["peer"]);
        assert_eq!(peer(h, "packets_commit_dropped"), 0, "{h}");
    }
}

/// Output commit with the NAT: a connection's mapping (per-flow) and its
/// public port's binding (in the pool split between the hosts by blocks)
/// are held by their next owners before its SYN leaves. With periodic
/// replication off, a `kill -9` of a host right after keeps every mapping:
/// each server reply reaches its inside host through the host that takes
/// the port's block over, each client's next packet leaves with the port
/// it had, and no port held by a connection is handed out again.
#[test]
fn with_replicated_durability_a_killed_host_s_nat_mappings_and_ports_survive() {
    use sluice_wire::build::FrameSpec;
    use sluice_wire::tcp::flags;
    let dir = test_dir();
    let d = dir.path();
    let hosts = ["h1", "h2", "h3"];
    let (public, server) = ([203, 0, 113, 1], [192, 0, 2, 1]);
    let config =
        json!({ "public-ip": "203.0.113.1", "inside": ["10.0.0.0/8"], "port-first": 1024, "port-count": 4096 });
    let EdgeGroup { nats, gw, mut procs, table: before, _turn, .. } = committing_group(d, "nat", "nat", config);
    let api = gw.api();
    let pool = ["--pool-address", "203.0.113.1"];
    let client = |i: u32| ([10, 1, (i / 200) as u8, (i % 200) as u8 + 1], 40000 + i as u16);
    let mark = |i: u32, seq: u32| [i.to_be_bytes(), seq.to_be_bytes()].concat();
    let syns = |r: std::ops::Range<u32>| -> Frames {
        r.map(|i| {
            let (addr, port) = client(i);
            FrameSpec::tcp4(addr, port, server, 80, flags::SYN).with_payload(mark(i, 0)).build()
        })
        .collect()
    };
    // Where each connection left, and its public port.
    let translated = |r: std::ops::Range<u32>, hosts: &[&'static str]| -> Vec<(&'static str, u16)> {
        r.map(|i| {
            let at = marked(d, hosts, &mark(i, 0));
            assert_eq!(at.len(), 1, "connection {i} left {} times", at.len());
            let k = sluice_wire::parse(&at[0].1).key.unwrap();
            assert_eq!(k.src, sluice_wire::IpAddr128::from_v4(public), "connection {i} not translated");
            (at[0].0, k.src_port)
        })
        .collect()
    };

    // A host hands out the blocks the first table gives it once the others
    // could have handed them over (sluice_peer::pools::HANDOVER_WAIT).
    std::thread::sleep(Duration::from_millis(1000));
    let n = 300u32;
    let p1 = d.join("syn.pcap");
    write_pcap(&p1, &syns(0..n));
    let rep = steer_once_with(&nats, d, "syn", &p1, &hosts, &pool);
    assert_eq!(rep["forwarded"].as_u64(), Some(u64::from(n)), "{rep}");
    wait_committed(d, &hosts, u64::from(n));
    let conns = translated(0..n, &hosts);
    let on_h2 = conns.iter().filter(|(h, _)| *h == "h2").count();
    assert!(on_h2 > 50, "h2 translated {on_h2} of the connections");

    // kill -9 of h2 at once: its mappings and its ports' bindings are on
    // their next owners only because its SYNs waited for them.
    procs[1].kill9();
    let after = wait_group_table(&api, &nats, "edge", before.version(), &["h1", "h3"]);
    let live = ["h1", "h3"];
    // Every server reply and every client's next packet.
    let mut frames: Frames = Vec::new();
    for (i, (_, port)) in (0..n).zip(&conns) {
        frames.push(FrameSpec::tcp4(server, 80, public, *port, flags::ACK).with_payload(mark(i, 1)).build());
        let (addr, cport) = client(i);
        frames.push(FrameSpec::tcp4(addr, cport, server, 80, flags::ACK).with_payload(mark(i, 2)).build());
    }
    let p2 = d.join("after.pcap");
    write_pcap(&p2, &frames);
    let rep = steer_once_with(&nats, d, "after", &p2, &live, &pool);
    assert_eq!(rep["forwarded"].as_u64(), Some(frames.len() as u64), "{rep}");
    let left = |seq: u32| (0..n).filter(|i| !marked(d, &live, &mark(*i, seq)).is_empty()).count();
    wait_for(30, "every reply and next packet to leave", || {
        (left(1) == n as usize && left(2) == n as usize).then_some(())
    });
    let mut problems = Vec::new();
    for (i, (was, port)) in (0..n).zip(&conns) {
        let (addr, cport) = client(i);
        let reply = marked(d, &live, &mark(i, 1));
        let back = reply.len() == 1 && {
            let k = sluice_wire::parse(&reply[0].1).key.unwrap();
            k.dst == sluice_wire::IpAddr128::from_v4(addr) && k.dst_port == cport
        };
        let next = marked(d, &live, &mark(i, 2));
        let same = next.len() == 1 && {
            let k = sluice_wire::parse(&next[0].1).key.unwrap();
            k.src == sluice_wire::IpAddr128::from_v4(public) && k.src_port == *port
        };
        if !back || !same {
            problems.push(format!("connection {i} (on {was}, port {port}): reply back {back}, same port {same}"));
        }
    }
    eprintln!("{} of {n} connections broken ({on_h2} were on h2)", problems.len());
    assert!(problems.is_empty(), "{problems:#?}");

    // New connections get ports no connection holds.
    let p3 = d.join("new.pcap");
    write_pcap(&p3, &syns(n..n + 100));
    let rep = steer_once_with(&nats, d, "new", &p3, &live, &pool);
    assert_eq!(rep["forwarded"].as_u64(), Some(100), "{rep}");
    wait_for(30, "the new connections to leave", || {
        (n..n + 100).all(|i| !marked(d, &live, &mark(i, 0)).is_empty()).then_some(())
    });
    let fresh = translated(n..n + 100, &live);
    let held: std::collections::HashSet<u16> = conns.iter().map(|(_, p)| *p).collect();
    for (j, (h, port)) in fresh.iter().enumerate() {
        assert!(!held.contains(port), "new connection {} on {h} got port {port}, held by another", n as usize + j);
        let owner = after.block_owner(sluice_group::block_of(u64::from(*port)));
        assert_eq!(owner, Some(*h), "port {port} from outside {h}'s blocks");
    }
    let pools: Vec<Value> = live.iter().map(|h| host_report(d, h)["peer"]["pools"].clone()).collect();
    let sum = |k: &str| pools.iter().map(|p| p[k].as_u64().unwrap_or(0)).sum::<u64>();
    assert!(sum("replicas_imported") > 0, "h2's bindings were taken over from their replicas: {pools:?}");
    assert_eq!(sum("refused"), 0, "{pools:?}");
    stop_all_but(&mut procs, 1);
}

/// Output commit with the IPS: a signature split over two segments of a
/// connection is found because the first segment's automaton state is held
/// by the connection's next owner before that segment leaves. `kill -9`
/// of a host between the two halves raises the same alerts as a run with
/// no failure: every connection alerted once, its second half and every
/// later packet dropped, wherever it ran.
#[test]
fn with_replicated_durability_a_killed_host_s_ips_finds_every_split_signature() {
    use sluice_wire::build::FrameSpec;
    use sluice_wire::tcp::flags;
    let dir = test_dir();
    let d = dir.path();
    let hosts = ["h1", "h2", "h3"];
    let config = json!({
        "mode": "ips",
        "rules": [r#"drop tcp any any -> any 80 (msg:"split"; content:"XATTACKX"; sid:7;)"#],
    });
    let EdgeGroup { nats, gw, mut procs, key, table: before, _turn } = committing_group(d, "ids", "ips", config);
    let api = gw.api();
    let n = 300u32;
    let server = [192, 0, 2, 1];
    let client = |i: u32| ([10, 2, (i / 200) as u8, (i % 200) as u8 + 1], 41000 + i as u16);
    // Each connection's frames differ by its client's port.
    let segment = |i: u32, payload: &[u8]| {
        let (addr, port) = client(i);
        FrameSpec::tcp4(addr, port, server, 80, flags::ACK | flags::PSH).with_payload(payload.to_vec()).build()
    };
    // The first halves: nothing matches yet, every one passes, and each
    // waited for its connection's automaton state to be held elsewhere.
    let first: Frames = (0..n).map(|i| segment(i, b"GET /XATT")).collect();
    let p1 = d.join("first.pcap");
    write_pcap(&p1, &first);
    let rep = steer_once(&nats, d, "first", &p1, &hosts);
    assert_eq!(rep["forwarded"].as_u64(), Some(u64::from(n)), "{rep}");
    wait_committed(d, &hosts, u64::from(n));
    let on_h2 = owned_by(&before, "h2", &first);
    assert!(on_h2 > 50, "h2 has {on_h2} of the connections");
    assert_eq!(hosts.iter().map(|h| passed(d, h, &first)).sum::<usize>(), n as usize);

    procs[1].kill9();
    wait_group_table(&api, &nats, "edge", before.version(), &["h1", "h3"]);
    let live = ["h1", "h3"];
    // The second halves complete the signature; a benign packet follows.
    let mut second: Frames = (0..n).map(|i| segment(i, b"ACKX HTTP")).collect();
    second.extend((0..n).map(|i| segment(i, b"hello")));
    let p2 = d.join("second.pcap");
    write_pcap(&p2, &second);
    let rep = steer_once(&nats, d, "second", &p2, &live);
    assert_eq!(rep["forwarded"].as_u64(), Some(second.len() as u64), "{rep}");
    // One alert per connection, from the hosts that ran it after the kill.
    let events = wait_for(30, "an alert for every connection", || {
        let e = api.get(Some(&key), "/v1/events?kind=ids.alert&limit=1000").body;
        let list = e.as_array().cloned().unwrap_or_default();
        (list.len() >= n as usize).then_some(list)
    });
    std::thread::sleep(Duration::from_millis(1500));
    let events = api.get(Some(&key), "/v1/events?kind=ids.alert&limit=1000").body.as_array().cloned().unwrap_or(events);
    let flows: std::collections::HashSet<String> =
        events.iter().filter_map(|e| e["flow"].as_str().map(String::from)).collect();
    assert_eq!((events.len(), flows.len()), (n as usize, n as usize), "one alert per connection");
    assert!(events.iter().all(|e| e["fields"]["sid"] == "7" && e["fields"]["action"] == "dropped"), "{events:?}");
    let passed_after: usize = live.iter().map(|h| passed(d, h, &second)).sum();
    assert_eq!(passed_after, 0, "a second half or a later packet passed: a connection's state was lost");
    stop_all_but(&mut procs, 1);
}

/// A veth pair in this namespace (removed on drop): the test sends on
/// `b`, the dispatcher takes `a` with `net_af_packet`.
struct Veth {
    a: String,
    b: String,
}

impl Veth {
    fn new() -> Veth {
        // Unique per pair: tests of this process may hold one each.
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 100;
        let id = std::process::id() % 100_000;
        let v = Veth { a: format!("slg{id}x{n}a"), b: format!("slg{id}x{n}b") };
        let ip = |args: &[&str]| {
            let o = Command::new("ip").args(args).output().unwrap_or_else(|e| panic!("`ip` (iproute2) is needed: {e}"));
            assert!(o.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&o.stderr));
        };
        ip(&["link", "add", &v.a, "type", "veth", "peer", "name", &v.b]);
        for n in [&v.a, &v.b] {
            // No IPv6 autoconfiguration chatter on the test wire.
            let _ = Command::new("sysctl").args(["-qw", &format!("net.ipv6.conf.{n}.disable_ipv6=1")]).output();
            ip(&["link", "set", n, "up"]);
        }
        v
    }
}

impl Drop for Veth {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "del", &self.a]).output();
    }
}

/// Sends frames from a schedule file at their due times (see the script).
const PACED_SENDER: &str = include_str!("../../tests/tools/paced-send.py");

/// Starts sending `frames` (due seconds, bytes) on `veth.b` at their due
/// times (see [`PACED_SENDER`]); returns once the sender started, with
/// the rest of its output.
fn paced_sender<'f>(
    d: &std::path::Path,
    veth: &Veth,
    frames: impl Iterator<Item = (f64, &'f [u8])>,
) -> (std::process::Child, std::io::Lines<std::io::BufReader<std::process::ChildStdout>>) {
    use std::io::BufRead;
    let mut file = Vec::new();
    for (t, f) in frames {
        file.extend_from_slice(&((t * 1e6) as u64).to_le_bytes());
        file.extend_from_slice(&(f.len() as u32).to_le_bytes());
        file.extend_from_slice(f);
    }
    std::fs::write(d.join("schedule.bin"), file).unwrap();
    let mut sender = Command::new("python3")
        .args(["-c", PACED_SENDER])
        .arg(d.join("schedule.bin"))
        .arg(&veth.b)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(sender.stdout.take().unwrap()).lines();
    assert!(lines.next().unwrap().unwrap().starts_with("start "));
    (sender, lines)
}

/// Dispatcher `d1` taking `veth.a` (net_af_packet) for `hosts`, reporting
/// to `steer-live.json`, once it steers by table `version`; it exits 3 s
/// after the last packet.
fn live_dispatcher(nats: &Nats, d: &std::path::Path, veth: &Veth, hosts: &[&str], version: u64) -> std::process::Child {
    live_dispatcher_with(nats, d, veth, hosts, version, 3000, &[])
}

/// [`live_dispatcher`] exiting `idle_exit_ms` after the last packet, with
/// `extra` arguments.
fn live_dispatcher_with(
    nats: &Nats,
    d: &std::path::Path,
    veth: &Veth,
    hosts: &[&str],
    version: u64,
    idle_exit_ms: u64,
    extra: &[&str],
) -> std::process::Child {
    let ingress = format!("--vdev=net_af_packet0,iface={}", veth.a);
    let steer = steer_command(nats, d, "live", ingress, hosts, idle_exit_ms, extra)
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(d.join("steer.err")).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::fs::read(d.join("steer-live.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        .filter(|r| r["table_version"].as_u64() == Some(version))
        .is_none()
    {
        let err = std::fs::read_to_string(d.join("steer.err")).unwrap_or_default();
        assert!(Instant::now() < deadline, "the dispatcher does not steer by table v{version}: {err}");
        std::thread::sleep(Duration::from_millis(100));
    }
    steer
}

/// The elastic group under live traffic (SNF's claims): 240 firewall
/// connections replayed at a fixed rate into the dispatcher for 8 s while
/// a standby host joins (3 → 4), one is drained (4 → 3) and one is killed
/// (`kill -9`). The server's packets pass only where the connection's
/// state is, so each one that passes shows the state went with its flow.
/// Planned moves lose nothing and move state with every flowlet; the kill
/// loses only what was sent to the dead host before the table dropped it.
#[test]
fn a_group_scales_out_drains_and_loses_a_host_under_traffic_without_losing_state() {
    use sluice_wire::build::FrameSpec;
    use sluice_wire::tcp::flags;
    let dir = test_dir();
    let d = dir.path();
    let veth = Veth::new();
    let hosts = ["h1", "h2", "h3", "h4"];
    let EdgeGroup { nats, gw, mut procs, table: four, _turn, .. } =
        edge_group(d, &hosts, "firewall", "fw", Some(web_firewall()));
    let api = gw.api();
    // h4 stands by, up and running the deployment, owning nothing.
    assert!(api.post(Some(ADMIN), "/v1/groups/edge/hosts/h4/drain", &json!({})).status < 300);
    let three = wait_group_table(&api, &nats, "edge", four.version(), &["h1", "h2", "h3"]);

    // 240 connections opened over the first second, then a packet every
    // 50 ms each way by turns until 8 s; every frame unique.
    const SECS: f64 = 8.0;
    let server = [192, 0, 2, 1];
    let mut schedule: Vec<(f64, Vec<u8>, bool)> = Vec::new();
    for i in 0..240u32 {
        let client = [10, 1, (i / 200) as u8, (i % 200) as u8 + 1];
        let port = 30000 + i as u16;
        let mut t = f64::from(i) / 240.0;
        let mut seq = 0u32;
        let mut from_server = false;
        while t < SECS {
            let payload = [i.to_be_bytes(), seq.to_be_bytes()].concat();
            let f = match (seq, from_server) {
                (0, _) => FrameSpec::tcp4(client, port, server, 80, flags::SYN),
                (_, true) => FrameSpec::tcp4(server, 80, client, port, flags::ACK),
                (_, false) => FrameSpec::tcp4(client, port, server, 80, flags::ACK),
            };
            schedule.push((t, f.with_payload(payload).build(), from_server));
            seq += 1;
            from_server = !from_server;
            t += 0.05;
        }
    }
    schedule.sort_by(|a, b| a.0.total_cmp(&b.0));
    let report = d.join("steer-live.json");
    let steer = live_dispatcher(&nats, d, &veth, &hosts, three.version());
    let (mut sender, mut lines) = paced_sender(d, &veth, schedule.iter().map(|(t, f, _)| (*t, f.as_slice())));
    let t0 = Instant::now();
    let at = |secs: f64| std::thread::sleep(Duration::from_secs_f64(secs).saturating_sub(t0.elapsed()));

    at(1.5);
    assert!(api.delete(Some(ADMIN), "/v1/groups/edge/hosts/h4/drain").status < 300);
    let four = wait_group_table(&api, &nats, "edge", three.version(), &hosts);
    at(3.0);
    assert!(api.post(Some(ADMIN), "/v1/groups/edge/hosts/h3/drain", &json!({})).status < 300);
    let drained = wait_group_table(&api, &nats, "edge", four.version(), &["h1", "h2", "h4"]);
    at(4.5);
    let killed = t0.elapsed().as_secs_f64();
    let killed_unix = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    procs[1].kill9();
    let after = wait_group_table(&api, &nats, "edge", drained.version(), &["h1", "h4"]);
    let dropped = t0.elapsed().as_secs_f64();
    let done = lines.next().unwrap().unwrap();
    assert!(sender.wait().unwrap().success());
    eprintln!("sender: {done}; h2 killed at {killed:.2} s, out of the table by {dropped:.2} s");
    let st = steer.wait_with_output().unwrap();
    eprint!("{}", String::from_utf8_lossy(&st.stdout));
    assert!(st.status.success(), "steer: {}", std::fs::read_to_string(d.join("steer.err")).unwrap());
    let rep: Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();

    // What reached a host's output, and how often.
    wait_for(10, "the hosts to write what they forwarded", || {
        std::thread::sleep(Duration::from_millis(1200));
        Some(())
    });
    let mut seen: std::collections::HashMap<Vec<u8>, usize> = Default::default();
    for h in hosts {
        for (_, f) in flows(&d.join(format!("{h}.out.pcap"))) {
            *seen.entry(f).or_default() += 1;
        }
    }
    let owner_then = |f: &Vec<u8>| drained.owner(sluice_wire::parse(f).key.unwrap().symmetric_hash()).map(String::from);
    // A kill loses what h2 had taken and not yet written out, and what
    // was sent to it until its link went down (the dispatcher then sends
    // its flows to their next owners at once).
    let kill_window =
        |t: f64, f: &Vec<u8>| t > killed - 0.25 && t < killed + 0.5 && owner_then(f).as_deref() == Some("h2");
    let (mut lost_kill, mut lost_other, mut twice) = (0, 0, 0);
    let mut other = Vec::new();
    for (t, f, from_server) in &schedule {
        match seen.get(f).copied().unwrap_or(0) {
            1 => {}
            0 if kill_window(*t, f) => lost_kill += 1,
            0 => {
                lost_other += 1;
                let h = sluice_wire::parse(f).key.unwrap().symmetric_hash();
                let owners: Vec<Option<&str>> = [&three, &four, &drained, &after].iter().map(|t| t.owner(h)).collect();
                other.push(format!("{t:.3}s server={from_server} owners v3..v6 {owners:?}"));
            }
            _ => twice += 1,
        }
    }
    let server_frames = schedule.iter().filter(|s| s.2).count();
    let peer: Vec<Value> = ["h1", "h3", "h4"].iter().map(|h| host_report(d, h)["peer"].clone()).collect();
    let sum = |k: &str| peer.iter().map(|p| p[k].as_u64().unwrap_or(0)).sum::<u64>();
    let (moved, with_state) = (sum("flowlets_moved_in"), sum("moved_with_state"));
    eprintln!(
        "{} frames ({server_frames} from the server) | lost: {lost_kill} to the kill of h2, {lost_other} otherwise | twice: {twice} | moved flowlets {moved}, with state {with_state} | dispatcher: tables {} links {} hosts {}",
        schedule.len(),
        rep["tables"],
        rep["links"],
        rep["hosts"]
    );
    // Per host a flow left: the dispatcher's count of flowlets it moved
    // away, and the new owners' count of those that came, with state.
    for h in ["h2", "h3"] {
        let away = rep["hosts"].as_array().unwrap().iter().find(|x| x["host"] == h).unwrap()["moved_away"].as_u64();
        let from: Vec<&Value> = peer.iter().map(|p| &p["moved_from"][h]).collect();
        let came = from.iter().map(|m| m["flowlets"].as_u64().unwrap_or(0)).sum::<u64>();
        let with: u64 =
            from.iter().map(|m| m["with_state"].as_u64().unwrap_or(0) + m["pulled"].as_u64().unwrap_or(0)).sum();
        eprintln!("flowlets moved from {h}: {away:?} by the dispatcher, {came} arrived, {with} with their state");
        assert_eq!(with, came, "{h}");
        if h == "h2" {
            assert_eq!(Some(came), away, "every flowlet the kill moved arrived");
        } else {
            // Some went to h2, killed since.
            assert!(Some(came) <= away, "{h}");
        }
    }
    assert_eq!(twice, 0, "no frame is processed twice");
    assert_eq!(
        lost_other, 0,
        "a join and a drain lose nothing; after the kill every connection goes on, with its state: {other:#?}"
    );
    let in_window = schedule.iter().filter(|(t, f, _)| kill_window(*t, f)).count();
    assert!(lost_kill < in_window / 2, "the kill lost {lost_kill} of the {in_window} frames h2's flows had around it");
    assert!(moved > 0 && with_state * 100 >= moved * 95, "{with_state} of {moved} moved flowlets found their state");
    let links = rep["links"].as_array().unwrap();
    let down = links.iter().find(|l| l["host"] == "h2" && l["up"] == false).unwrap_or_else(|| panic!("{rep}"));
    // The dispatcher's account of the kill: the flowlets it moved away
    // from h2 since.
    eprintln!("link of h2 down: {down}; frames lost to the kill {lost_kill}");
    assert!(down["flowlets_moved"].as_u64().unwrap() > 0, "{down}");
    // Found by its link, in milliseconds, not by the controller's silence
    // bound (generous for a loaded 2-core runner).
    let detection_ms = (down["at_unix_us"].as_u64().unwrap() as f64 / 1e6 - killed_unix) * 1e3;
    eprintln!("h2's link went down {detection_ms:.1} ms after the kill ({})", down["cause"]);
    assert!(down["cause"] == "link" && detection_ms < 250.0, "{down}");
    // What it had sent h2 in the 20 ms before it saw the link down depends
    // on how long after the kill that was: reported, not asserted.
    let events = rep["tables"].as_array().unwrap();
    // Planned changes wait for the state handover; the loss does not.
    for v in [four.version(), drained.version()] {
        assert!(events.iter().any(|e| e["version"] == v && e["delayed_ms"].as_u64() >= Some(250)), "v{v}: {rep}");
    }
    assert!(
        events.iter().any(|e| e["left"] == json!(["h2"]) && e["version"].as_u64() == Some(after.version())),
        "{rep}"
    );
    stop_all_but(&mut procs, 1);
}

/// Output commit under live traffic: 240 firewall connections replayed at
/// a fixed rate through three hosts with periodic replication off (an
/// interval of a minute) and `durability = "replicated"`; h2 is killed
/// (`kill -9`) mid-stream. A connection's state reached its next owner
/// only because its SYN waited for it, so every frame of h2's connections
/// sent once the dispatcher saw h2's link go down passes at their next
/// owners; only frames sent to h2 around the kill are lost, and nothing
/// of the other hosts' connections.
#[test]
fn with_replicated_durability_a_host_killed_under_traffic_breaks_no_connection() {
    use sluice_wire::build::FrameSpec;
    use sluice_wire::tcp::flags;
    let dir = test_dir();
    let d = dir.path();
    let veth = Veth::new();
    let hosts = ["h1", "h2", "h3"];
    let EdgeGroup { nats, gw, mut procs, table: before, _turn, .. } =
        committing_group(d, "firewall", "fw", web_firewall());
    let api = gw.api();
    // 240 connections opened over the first second, then a packet every
    // 50 ms each way by turns until 4 s; every frame unique.
    const SECS: f64 = 4.0;
    let server = [192, 0, 2, 1];
    let mut schedule: Vec<(f64, Vec<u8>)> = Vec::new();
    for i in 0..240u32 {
        let client = [10, 1, (i / 200) as u8, (i % 200) as u8 + 1];
        let port = 30000 + i as u16;
        let (mut t, mut seq) = (f64::from(i) / 240.0, 0u32);
        while t < SECS {
            let payload = [i.to_be_bytes(), seq.to_be_bytes()].concat();
            let f = match seq {
                0 => FrameSpec::tcp4(client, port, server, 80, flags::SYN),
                s if s % 2 == 1 => FrameSpec::tcp4(server, 80, client, port, flags::ACK),
                _ => FrameSpec::tcp4(client, port, server, 80, flags::ACK),
            };
            schedule.push((t, f.with_payload(payload).build()));
            seq += 1;
            t += 0.05;
        }
    }
    schedule.sort_by(|a, b| a.0.total_cmp(&b.0));
    let steer = live_dispatcher(&nats, d, &veth, &hosts, before.version());
    let (mut sender, mut lines) = paced_sender(d, &veth, schedule.iter().map(|(t, f)| (*t, f.as_slice())));
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(2).saturating_sub(t0.elapsed()));
    let killed = t0.elapsed().as_secs_f64();
    let killed_unix = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    procs[1].kill9();
    wait_group_table(&api, &nats, "edge", before.version(), &["h1", "h3"]);
    lines.next().unwrap().unwrap();
    assert!(sender.wait().unwrap().success());
    let st = steer.wait_with_output().unwrap();
    assert!(st.status.success(), "steer: {}", std::fs::read_to_string(d.join("steer.err")).unwrap());
    let rep: Value = serde_json::from_slice(&std::fs::read(d.join("steer-live.json")).unwrap()).unwrap();
    let links = rep["links"].as_array().unwrap();
    let down = links.iter().find(|l| l["host"] == "h2" && l["up"] == false).unwrap_or_else(|| panic!("{rep}"));
    let detected = down["at_unix_us"].as_u64().unwrap() as f64 / 1e6 - killed_unix;
    std::thread::sleep(Duration::from_millis(1200));
    let mut seen: std::collections::HashMap<Vec<u8>, usize> = Default::default();
    for h in hosts {
        for f in out_frames(d, h) {
            *seen.entry(f).or_default() += 1;
        }
    }
    let on_h2 = |f: &Vec<u8>| before.owner(sluice_wire::parse(f).key.unwrap().symmetric_hash()) == Some("h2");
    // Frames the kill may take: h2's, sent from just before it until its
    // link was seen down (and the dispatcher's queue to it emptied).
    let window = |t: f64, f: &Vec<u8>| on_h2(f) && t > killed - 0.25 && t < killed + detected + 0.1;
    let (mut lost_window, mut twice) = (0, 0);
    let mut broken = Vec::new();
    for (t, f) in &schedule {
        match seen.get(f).copied().unwrap_or(0) {
            1 => {}
            0 if window(*t, f) => lost_window += 1,
            0 => broken.push(format!("{t:.3} s, h2's: {}", on_h2(f))),
            _ => twice += 1,
        }
    }
    let peer = |h: &str, k: &str| host_report(d, h)["peer"][k].as_u64().unwrap_or(0);
    eprintln!(
        "{} frames | h2 killed at {killed:.2} s, link down {:.1} ms later | lost around the kill {lost_window}, otherwise {} | imported {}",
        schedule.len(),
        detected * 1e3,
        broken.len(),
        peer("h1", "flows_imported") + peer("h3", "flows_imported"),
    );
    assert_eq!(twice, 0, "no frame is processed twice");
    assert!(broken.is_empty(), "every connection goes on after the kill, with its state: {broken:#?}");
    stop_all_but(&mut procs, 1);
}

/// Liveness beacons: a host that stops (`SIGSTOP`: hung, its memif link
/// stays up, the controller hears nothing for a while yet) stops sending
/// beacons, and the dispatcher (`--liveness-ms`) sends its flows to their
/// next owners within milliseconds, long before the controller's silence
/// bound; they keep their state (replicated every millisecond), so every
/// frame due once the dispatcher noticed passes. When the host runs again
/// its beacons bring it back.
#[test]
fn a_host_that_stops_beaconing_loses_its_flows_to_their_next_owners_within_milliseconds() {
    use sluice_wire::build::FrameSpec;
    use sluice_wire::tcp::flags;
    // Generous for a loaded 2-core runner; a failover by the controller's
    // silence bound fails it.
    const BOUND_MS: f64 = 250.0;
    assert!(BOUND_MS < SILENCE_MS as f64 / 2.0);
    let dir = test_dir();
    let d = dir.path();
    let veth = Veth::new();
    let hosts = ["h1", "h2", "h3"];
    let EdgeGroup { nats, gw: _gw, mut procs, table, _turn, .. } =
        edge_group_with(d, &hosts, "firewall", "fw", Some(web_firewall()), &["--beacon", "0", "--beacon-us", "1000"]);
    // 90 connections opened over the first half second, then a packet
    // every 10 ms by turns each way until 3.5 s; every frame unique.
    const SECS: f64 = 3.5;
    let server = [192, 0, 2, 1];
    let mut schedule: Vec<(f64, Vec<u8>)> = Vec::new();
    for i in 0..90u32 {
        let client = [10, 3, 0, i as u8 + 1];
        let port = 40000 + i as u16;
        let (mut t, mut seq) = (f64::from(i) / 180.0, 0u32);
        while t < SECS {
            let payload = [i.to_be_bytes(), seq.to_be_bytes()].concat();
            let f = match (seq, seq % 2 == 1) {
                (0, _) => FrameSpec::tcp4(client, port, server, 80, flags::SYN),
                (_, true) => FrameSpec::tcp4(server, 80, client, port, flags::ACK),
                (_, false) => FrameSpec::tcp4(client, port, server, 80, flags::ACK),
            };
            schedule.push((t, f.with_payload(payload).build()));
            seq += 1;
            t += 0.01;
        }
    }
    schedule.sort_by(|a, b| a.0.total_cmp(&b.0));
    let steer = live_dispatcher_with(&nats, d, &veth, &hosts, table.version(), 3000, &["--liveness-ms", "30"]);
    let (mut sender, mut lines) = paced_sender(d, &veth, schedule.iter().map(|(t, f)| (*t, f.as_slice())));
    let t0 = Instant::now();
    let unix = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    let t0_unix = unix();
    let at = |secs: f64| std::thread::sleep(Duration::from_secs_f64(secs).saturating_sub(t0.elapsed()));
    let signal = |sig: &str, p: &Proc| {
        let pid = p.child.id().to_string();
        assert!(Command::new("kill").args([sig, &pid]).status().unwrap().success(), "kill {sig} {pid}");
    };
    at(1.5);
    let stopped = unix();
    signal("-STOP", &procs[1]);
    at(2.3);
    let resumed = unix();
    signal("-CONT", &procs[1]);
    let done = lines.next().unwrap().unwrap();
    assert!(sender.wait().unwrap().success());
    let st = steer.wait_with_output().unwrap();
    assert!(st.status.success(), "steer: {}", std::fs::read_to_string(d.join("steer.err")).unwrap());
    let rep: Value = serde_json::from_slice(&std::fs::read(d.join("steer-live.json")).unwrap()).unwrap();
    wait_for(10, "the hosts to write what they forwarded", || {
        std::thread::sleep(Duration::from_millis(1200));
        Some(())
    });
    let links = rep["links"].as_array().unwrap();
    eprintln!("sender: {done}; links: {links:#?}; hosts: {}", rep["hosts"]);
    let at_s = |e: &Value| e["at_unix_us"].as_u64().unwrap() as f64 / 1e6;
    let down = links
        .iter()
        .find(|e| e["host"] == "h2" && e["up"] == false && at_s(e) >= stopped)
        .unwrap_or_else(|| panic!("the dispatcher never took h2 down: {rep}"));
    assert_eq!(down["cause"], "beacons", "its link stayed up: {down}");
    let detected = at_s(down);
    let detection_ms = (detected - stopped) * 1e3;
    eprintln!("h2 stopped; its beacons missed {detection_ms:.1} ms later (bound 30 ms)");
    assert!(detection_ms <= BOUND_MS, "h2 was taken down {detection_ms:.1} ms after it stopped");
    let up = links.iter().find(|e| e["host"] == "h2" && e["up"] == true && at_s(e) >= detected);
    assert_eq!(up.map(|e| &e["cause"]), Some(&json!("link and beacons")), "h2 came back once it ran again: {links:#?}");
    assert!(rep["hosts"].as_array().unwrap().iter().all(|h| h["beacons"].as_u64() > Some(1000)), "{}", rep["hosts"]);
    assert_eq!(rep["stray_frames"], 0);

    // Every frame of h2's flows due from 50 ms after the dispatcher
    // noticed until h2 ran again passed, through its flows' next owners,
    // with their state: the server's half passes only where it is.
    let mut seen: std::collections::HashMap<Vec<u8>, usize> = Default::default();
    for h in hosts {
        for (_, f) in flows(&d.join(format!("{h}.out.pcap"))) {
            *seen.entry(f).or_default() += 1;
        }
    }
    let owner = |f: &Vec<u8>| table.owner(sluice_wire::parse(f).key.unwrap().symmetric_hash()).map(String::from);
    let (mut due, mut lost, mut twice) = (0, Vec::new(), 0);
    for (t, f) in &schedule {
        let when = t0_unix + t;
        let n = seen.get(f).copied().unwrap_or(0);
        twice += usize::from(n > 1);
        if owner(f).as_deref() == Some("h2") && when >= detected + 0.05 && when < resumed {
            due += 1;
            if n == 0 {
                let to = sluice_wire::parse(f).key.is_some_and(|k| k.dst_port == 80);
                lost.push(format!("{t:.3} {}", if to { "client" } else { "server" }));
            }
        }
    }
    eprintln!("frames of h2's flows due while it was taken for dead: {due}, lost {}", lost.len());
    assert!(due > 500, "{due}");
    if !lost.is_empty() {
        // What the next owners saw: moved flowlets with and without their
        // state, waits, held and dropped packets, and what each forwarded.
        for h in hosts {
            let r = host_report(d, h);
            eprintln!("{h}: peer {}; deployments {}", r["peer"], r["deployments"]);
        }
    }
    assert!(lost.is_empty(), "frames of h2's flows lost after the dispatcher noticed: {lost:?}");
    assert_eq!(twice, 0, "no frame is processed twice");
    for p in &mut procs {
        p.term();
    }
}

/// SNF's reactive pull: with proactive replication slowed to a minute, a
/// drained host's flows move to their next owners without their state.
/// The first packet of each moved flowlet names the host it left; the new
/// owner asks that host for the state, holds the flow's packets meanwhile
/// and runs them, in order, once it arrives: every server reply of an open
/// connection passes. For flows the drained host holds no state of
/// (unsolicited server packets, which its firewall dropped) it answers so,
/// and their packets run at once and are dropped. The hosts run with
/// peer links: requests and answers are datagrams, and forged, replayed
/// and junk datagrams sent to the links meanwhile are refused, counted,
/// and change nothing.
#[test]
fn moved_flowlets_without_their_state_pull_it_from_the_host_they_left() {
    use sluice_wire::build::FrameSpec;
    use sluice_wire::tcp::flags;
    let dir = test_dir();
    let d = dir.path();
    let veth = Veth::new();
    let hosts = ["h1", "h2", "h3"];
    let EdgeGroup { nats, gw, mut procs, table: before, _turn, .. } = edge_group_with(
        d,
        &hosts,
        "firewall",
        "fw",
        Some(web_firewall()),
        &["--replicate-us", "60000000", "--pull-wait-us", "50000", "--peer-link", "127.0.0.1:0"],
    );
    let api = gw.api();

    // 300 connections opened over the first half second; 2 s later the
    // server answers each with three packets 200 µs apart, and 0.5 s
    // after that the client acknowledges. 60 unsolicited server packets
    // early, and a second one of each late.
    #[derive(Clone, Copy, PartialEq)]
    enum Kind {
        Client,
        Reply(u32),
        Unsolicited,
    }
    let server = [192, 0, 2, 1];
    let mut schedule: Vec<(f64, Vec<u8>, Kind, FlowKey)> = Vec::new();
    let mut add = |t: f64, f: FrameSpec, kind: Kind| {
        let f = f.build();
        let key = sluice_wire::parse(&f).key.unwrap().normalized();
        schedule.push((t, f, kind, key));
    };
    for i in 0..300u32 {
        let (client, port) = ([10, 2, (i / 200) as u8, (i % 200) as u8 + 1], 20000 + i as u16);
        let t = f64::from(i) / 600.0;
        add(t, FrameSpec::tcp4(client, port, server, 80, flags::SYN), Kind::Client);
        for n in 0..3u32 {
            let reply =
                FrameSpec::tcp4(server, 80, client, port, flags::SYN | flags::ACK).with_payload(n.to_be_bytes());
            add(t + 2.0 + f64::from(n) * 0.0002, reply, Kind::Reply(n));
        }
        add(t + 2.5, FrameSpec::tcp4(client, port, server, 80, flags::ACK), Kind::Client);
    }
    for i in 0..60u32 {
        let (client, port) = ([10, 3, 0, i as u8 + 1], 50000 + i as u16);
        for (t, n) in [(0.6 + f64::from(i) / 600.0, 0u32), (2.7 + f64::from(i) / 600.0, 1)] {
            let f = FrameSpec::tcp4(server, 80, client, port, flags::ACK).with_payload(n.to_be_bytes());
            add(t, f, Kind::Unsolicited);
        }
    }
    schedule.sort_by(|a, b| a.0.total_cmp(&b.0));
    // Datagrams no host of the group sent: junk, a forged tag in h1's
    // name, and one of each again (a replay of junk is junk).
    let attacker = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let links: Vec<String> = ["h1", "h3"]
        .iter()
        .map(|h| {
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                if let Some(a) = host_report(d, h)["peer"]["link_addr"].as_str() {
                    break a.to_string();
                }
                assert!(Instant::now() < deadline, "{h} reports no peer link");
                std::thread::sleep(Duration::from_millis(50));
            }
        })
        .collect();
    // Before the traffic, a flood of junk at h1's link for 300 ms, 50
    // datagrams a millisecond: more than the 1,000 per 100 ms its thread
    // takes at real-time priority.
    let flood_start = Instant::now();
    let mut flooded = 0u64;
    while flood_start.elapsed() < Duration::from_millis(300) {
        for _ in 0..50 {
            attacker.send_to(b"junk", &links[0]).unwrap();
            flooded += 1;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let steer = live_dispatcher(&nats, d, &veth, &hosts, before.version());
    let (mut sender, mut lines) = paced_sender(d, &veth, schedule.iter().map(|(t, f, ..)| (*t, f.as_slice())));
    let t0 = Instant::now();
    let mut forged = b"SLK1\x02h1".to_vec();
    forged.extend_from_slice(&7u64.to_le_bytes());
    forged.extend_from_slice(&[1u8; 8]);
    forged.extend_from_slice(&[0u8; 32]);
    for addr in &links {
        for junk in [&b"junk"[..], &forged, &forged, &[0u8; 2000]] {
            attacker.send_to(junk, addr).unwrap();
        }
    }

    std::thread::sleep(Duration::from_secs(1).saturating_sub(t0.elapsed()));
    assert!(api.post(Some(ADMIN), "/v1/groups/edge/hosts/h3/drain", &json!({})).status < 300);
    let drained = wait_group_table(&api, &nats, "edge", before.version(), &["h1", "h2"]);
    assert!(t0.elapsed() < Duration::from_millis(1900), "the drain took effect before the replies");
    let done = lines.next().unwrap().unwrap();
    assert!(sender.wait().unwrap().success());
    let st = steer.wait_with_output().unwrap();
    eprint!("sender: {done}\n{}", String::from_utf8_lossy(&st.stdout));
    assert!(st.status.success(), "steer: {}", std::fs::read_to_string(d.join("steer.err")).unwrap());
    std::thread::sleep(Duration::from_millis(1200));

    // Where each frame came out, and at which position of that output.
    let mut seen: std::collections::HashMap<Vec<u8>, Vec<(&str, usize)>> = Default::default();
    for h in hosts {
        for (i, (_, f)) in flows(&d.join(format!("{h}.out.pcap"))).into_iter().enumerate() {
            seen.entry(f).or_default().push((h, i));
        }
    }
    let moved = |k: &FlowKey| before.owner(k.hash_normalized()) == Some("h3");
    let mut failures = Vec::new();
    for (t, f, kind, key) in &schedule {
        let at = seen.get(f).map(Vec::as_slice).unwrap_or(&[]);
        let ok = match kind {
            Kind::Unsolicited => at.is_empty(),
            _ => at.len() == 1,
        };
        if !ok {
            failures.push(format!("{t:.4}s moved={} {at:?}", moved(key)));
        }
    }
    assert!(failures.is_empty(), "{} frames passed wrongly or not once: {failures:#?}", failures.len());
    // A moved connection's three replies came out of its new owner, in order.
    for (_, _, _, key) in schedule.iter().filter(|s| s.2 == Kind::Reply(0) && moved(&s.3)) {
        let owner = drained.owner(key.hash_normalized()).unwrap();
        let out: Vec<usize> = (0..3u32)
            .map(|n| {
                let (_, f, ..) = schedule.iter().find(|s| s.3 == *key && s.2 == Kind::Reply(n)).unwrap();
                let at = &seen[f][0];
                assert_eq!(at.0, owner);
                at.1
            })
            .collect();
        assert!(out.windows(2).all(|w| w[0] < w[1]), "replies out of order: {out:?}");
    }
    let conns = schedule.iter().filter(|s| s.2 == Kind::Reply(0) && moved(&s.3)).count() as u64;
    let unsolicited = schedule.iter().filter(|s| s.2 == Kind::Unsolicited && s.0 > 2.0 && moved(&s.3)).count() as u64;
    assert!(conns > 50, "h3 had {conns} connections");
    let peer: Vec<Value> = ["h1", "h2"].iter().map(|h| host_report(d, h)["peer"].clone()).collect();
    let sum = |k: &str| peer.iter().map(|p| p[k].as_u64().unwrap_or(0)).sum::<u64>();
    let h3 = host_report(d, "h3")["peer"].clone();
    eprintln!(
        "h3 had {conns} connections and {unsolicited} unsolicited flows | new owners: {} moved flowlets waited, {} with state, {} not held, {} timed out, {} packets held, wait avg {} µs max {} µs | h3: {} flows sent, {} not held",
        sum("moved_waited"),
        sum("waits_with_state"),
        sum("waits_not_held"),
        sum("waits_timed_out"),
        sum("packets_held"),
        sum("wait_us_total") / sum("moved_waited").max(1),
        peer.iter().map(|p| p["wait_us_max"].as_u64().unwrap_or(0)).max().unwrap_or(0),
        h3["pull_flows_sent"],
        h3["pull_flows_not_held"],
    );
    // (waited, with state, not held, timed out, held packets dropped)
    let waits = ["moved_waited", "waits_with_state", "waits_not_held", "waits_timed_out", "packets_held_dropped"];
    let waits: Vec<u64> = waits.iter().map(|k| sum(k)).collect();
    // Every moved flowlet waited, and each wait ended with the state, with
    // h3's answer that it held none, or (on a runner too loaded to answer
    // within the 50 ms bound, seen once in CI) timed out and ran without.
    let timed_out = waits[3];
    assert!(timed_out <= 2, "{timed_out} pulls timed out: {waits:?}");
    assert_eq!(waits[0], conns + unsolicited, "{waits:?}");
    assert_eq!(waits[1] + waits[2] + timed_out, waits[0], "{waits:?}");
    assert!(waits[1] + timed_out >= conns && waits[2] + timed_out >= unsolicited, "{waits:?}");
    assert_eq!(waits[4], 0, "held packets dropped: {waits:?}");
    assert!(sum("packets_held") >= conns + unsolicited);
    // h3 answered every pull, held or not, and every request it took in
    // (each of one host's batch) was answered and timed.
    assert_eq!(h3["pull_flows_sent"].as_u64(), Some(conns));
    let answered = h3["pulls_answered"].as_u64().unwrap_or(0);
    assert!(answered > 0 && answered == h3["pulls_received"].as_u64().unwrap_or(0), "{h3}");
    assert!(h3["pull_answer_us_total"].as_u64().is_some(), "{h3}");
    let pulled: u64 = peer.iter().map(|p| p["moved_from"]["h3"]["pulled"].as_u64().unwrap_or(0)).sum();
    assert!(pulled + timed_out >= conns && pulled <= conns, "{pulled} flows pulled of {conns}");
    assert_eq!(h3["pull_flows_not_held"].as_u64(), Some(unsolicited));
    // Nothing was replicated proactively: the state came only by pulls.
    assert_eq!(h3["flows_sent"].as_u64(), Some(conns));
    // The requests and answers went on the peer links; the datagrams
    // from outside the group were refused, four on each link.
    assert!(sum("link_sent") > 0 && h3["link_sent"].as_u64() >= Some(answered), "{h3}");
    assert!(h3["link_received"].as_u64() >= Some(answered), "{h3}");
    assert_eq!(h3["link_refused"].as_u64(), Some(4), "{h3}");
    assert_eq!(peer[1]["link_refused"].as_u64(), Some(0), "{}", peer[1]);
    // h1 refused what reached it of the flood (a full socket buffer may
    // drop some before it), counted it as a flood, and pulled as before.
    let refused = peer[0]["link_refused"].as_u64().unwrap_or(0);
    assert!(refused > 2004 && refused <= flooded + 4, "{flooded} sent: {}", peer[0]);
    assert!(peer[0]["link_floods"].as_u64() >= Some(1), "{}", peer[0]);
    assert_eq!(h3["link_floods"].as_u64(), Some(0), "{h3}");
    for p in &mut procs {
        p.term();
    }
}

/// Global eventual tables are merged over the group: the monitor's
/// totals, counted on three hosts each for its own flows, read the same
/// on every host, and equal the trace (what one host alone would count).
#[test]
fn a_monitor_s_totals_are_group_wide() {
    let dir = test_dir();
    let d = dir.path();
    let hosts = ["h1", "h2", "h3"];
    let EdgeGroup { nats, mut procs, _turn, .. } = edge_group(d, &hosts, "monitor", "mon", None);
    let pcap = trace(d, 1000);
    let rep = steer_once(&nats, d, "trace", &pcap, &hosts);
    let packets = flows(&pcap).len() as u64;
    assert_eq!(rep["forwarded"].as_u64(), Some(packets), "{rep}");
    let total_on = |h: &str| -> Option<(u64, u64)> {
        let r = host_report(d, h);
        let tables = r["global_tables"].as_object()?;
        let (_, totals) = tables.iter().find(|(k, _)| k.ends_with("/totals"))?;
        let top = totals["top"].as_array()?;
        let value = |key: u64| top.iter().find(|e| e[0] == key).and_then(|e| e[1].as_u64()).unwrap_or(0);
        Some((value(0), r["deployments"].as_object()?.values().map(|d| d["packets_in"].as_u64().unwrap_or(0)).sum()))
    };
    wait_for(30, "every host's totals to count the whole trace", || {
        let all: Vec<Option<(u64, u64)>> = hosts.iter().map(|h| total_on(h)).collect();
        all.iter().all(|t| t.is_some_and(|(total, _)| total == packets)).then_some(all)
    });
    // Each host ran only its own flows, and counted them once.
    let own: Vec<u64> = hosts.iter().map(|h| total_on(h).unwrap().1).collect();
    assert_eq!(own.iter().sum::<u64>(), packets, "{own:?}");
    assert!(own.iter().all(|&n| n < packets), "each host ran a part: {own:?}");
    let p = host_report(d, "h1")["peer"].clone();
    assert!(p["global_entries_received"].as_u64() > Some(0), "{p}");
    for p in procs.iter_mut() {
        p.term();
    }
}

/// A NAT on a group: its public ports are split between the hosts by
/// blocks that follow the ownership table, and the dispatcher sends each
/// reply to the owner of its public port's block. Connections are opened
/// through three hosts; a standby host joins, one is drained, one is
/// killed; after each step every connection's reply is translated back,
/// once, on the host that owns its port's block then (the bindings went
/// with the blocks: handed over, or replicated before the kill), and the
/// new connections of each step get ports no other connection holds.
#[test]
fn a_nat_s_public_ports_are_split_between_the_hosts_and_every_reply_reaches_its_binding() {
    use sluice_wire::build::FrameSpec;
    use sluice_wire::tcp::flags;
    let dir = test_dir();
    let d = dir.path();
    let veth = Veth::new();
    let hosts = ["h1", "h2", "h3", "h4"];
    let (public, server) = ([203, 0, 113, 1], [192, 0, 2, 1]);
    let config =
        json!({ "public-ip": "203.0.113.1", "inside": ["10.0.0.0/8"], "port-first": 1024, "port-count": 4096 });
    let EdgeGroup { nats, gw, mut procs, table: all, _turn, .. } = edge_group(d, &hosts, "nat", "nat", Some(config));
    let api = gw.api();
    assert!(api.post(Some(ADMIN), "/v1/groups/edge/hosts/h4/drain", &json!({})).status < 300);
    let three = wait_group_table(&api, &nats, "edge", all.version(), &["h1", "h2", "h3"]);
    let mut steer =
        live_dispatcher_with(&nats, d, &veth, &hosts, three.version(), 20_000, &["--pool-address", "203.0.113.1"]);

    let client = |i: u32| ([10, 1, (i / 200) as u8, (i % 200) as u8 + 1], 40000 + i as u16);
    let mark = |i: u32, seq: u32| [i.to_be_bytes(), seq.to_be_bytes()].concat();
    // Frames out of each host since the last look, by their 8-byte mark.
    let mut read_so_far: std::collections::HashMap<&str, usize> = Default::default();
    let mut outputs = |wait: bool| -> Vec<(&'static str, Vec<u8>)> {
        if wait {
            std::thread::sleep(Duration::from_millis(1500));
        }
        let mut out = Vec::new();
        for h in ["h1", "h2", "h3", "h4"] {
            let path = d.join(format!("{h}.out.pcap"));
            // A host that has sent nothing yet may not have written the header.
            let written = std::fs::metadata(&path).map(|m| m.len() >= 24).unwrap_or(false);
            let frames = if written { flows(&path) } else { Vec::new() };
            let from = read_so_far.get(h).copied().unwrap_or(0);
            out.extend(frames.iter().skip(from).map(|(_, f)| (h, f.clone())));
            read_so_far.insert(h, frames.len());
        }
        out
    };
    let send = |frames: Vec<Vec<u8>>| {
        let n = frames.len() as f64;
        let (mut sender, mut lines) =
            paced_sender(d, &veth, frames.iter().enumerate().map(|(k, f)| (k as f64 * 0.5 / n, f.as_slice())));
        lines.next().unwrap().unwrap();
        assert!(sender.wait().unwrap().success());
    };
    // Connection i: (host that translated it, its public port).
    let mut conns: std::collections::BTreeMap<u32, (&str, u16)> = Default::default();
    let mut step = |name: &str, table: &OwnershipTable, new: std::ops::Range<u32>, seq: u32| {
        let mut frames: Vec<Vec<u8>> = conns
            .iter()
            .map(|(i, (_, port))| {
                FrameSpec::tcp4(server, 80, public, *port, flags::ACK).with_payload(mark(*i, seq)).build()
            })
            .collect();
        for i in new.clone() {
            let (addr, port) = client(i);
            frames.push(FrameSpec::tcp4(addr, port, server, 80, flags::SYN).with_payload(mark(i, 0)).build());
        }
        send(frames);
        let out = outputs(true);
        let owner = |port: u16| table.block_owner(sluice_group::block_of(u64::from(port))).map(String::from);
        let mut problems = Vec::new();
        // Each reply: translated back to its client, once, by its block's owner.
        for (i, (_, port)) in &conns {
            let at: Vec<&(&str, Vec<u8>)> = out.iter().filter(|(_, f)| f.ends_with(&mark(*i, seq))).collect();
            let ok = at.len() == 1 && {
                let k = sluice_wire::parse(&at[0].1).key.unwrap();
                let (addr, cport) = client(*i);
                k.dst == sluice_wire::IpAddr128::from_v4(addr)
                    && k.dst_port == cport
                    && owner(*port).as_deref() == Some(at[0].0)
            };
            if !ok {
                problems.push(format!(
                    "reply of {i} to port {port} (block owner {:?}): {:?}",
                    owner(*port),
                    at.iter().map(|a| a.0).collect::<Vec<_>>()
                ));
            }
        }
        // Each new connection: translated once, from a port of a block its host owns.
        for i in new {
            let at: Vec<&(&str, Vec<u8>)> = out.iter().filter(|(_, f)| f.ends_with(&mark(i, 0))).collect();
            assert_eq!(at.len(), 1, "{name}: connection {i} left {} times", at.len());
            let k = sluice_wire::parse(&at[0].1).key.unwrap();
            assert_eq!(k.src, sluice_wire::IpAddr128::from_v4(public), "{name}: connection {i} not translated");
            assert_eq!(
                owner(k.src_port).as_deref(),
                Some(at[0].0),
                "{name}: connection {i} got port {} outside its host's blocks",
                k.src_port
            );
            assert!(
                conns.values().all(|(_, p)| *p != k.src_port),
                "{name}: port {} given to connection {i} is held by another connection",
                k.src_port
            );
            conns.insert(i, (at[0].0, k.src_port));
        }
        eprintln!("{name}: {} connections, {} replies wrong", conns.len(), problems.len());
        assert!(problems.is_empty(), "{name}: {problems:#?}");
    };

    step("three hosts", &three, 0..120, 1);
    // Blocks a host gains while hosts start wait out their handover (no
    // pool held them yet); from here on every handover arrives.
    let timed_out = |h: &str| host_report(d, h)["peer"]["pools"]["handover_waits_timed_out"].as_u64().unwrap_or(0);
    let waits_before: Vec<u64> = ["h1", "h3", "h4"].iter().map(|h| timed_out(h)).collect();
    assert!(api.delete(Some(ADMIN), "/v1/groups/edge/hosts/h4/drain").status < 300);
    let four = wait_group_table(&api, &nats, "edge", three.version(), &hosts);
    std::thread::sleep(Duration::from_millis(800));
    step("h4 joined", &four, 120..180, 2);
    assert!(api.post(Some(ADMIN), "/v1/groups/edge/hosts/h1/drain", &json!({})).status < 300);
    let drained = wait_group_table(&api, &nats, "edge", four.version(), &["h2", "h3", "h4"]);
    std::thread::sleep(Duration::from_millis(800));
    step("h1 drained", &drained, 180..240, 3);
    procs[1].kill9();
    let after = wait_group_table(&api, &nats, "edge", drained.version(), &["h3", "h4"]);
    std::thread::sleep(Duration::from_millis(800));
    step("h2 killed", &after, 240..260, 4);

    let _ = steer.kill();
    let _ = steer.wait();
    let rep: Value = serde_json::from_slice(&std::fs::read(d.join("steer-live.json")).unwrap()).unwrap();
    assert!(rep["to_pool_owner"].as_u64() > Some(0), "replies went by their port's block: {rep}");
    let pools: Vec<Value> = ["h1", "h3", "h4"].iter().map(|h| host_report(d, h)["peer"]["pools"].clone()).collect();
    eprintln!("pool counters h1, h3, h4: {pools:?}");
    let sum = |k: &str| pools.iter().map(|p| p[k].as_u64().unwrap_or(0)).sum::<u64>();
    assert!(sum("handed_over") > 0 && sum("taken_over") > 0, "{pools:?}");
    assert!(sum("replicas_imported") > 0, "h2's bindings were taken over from their replicas: {pools:?}");
    assert_eq!(sum("refused"), 0, "{pools:?}");
    let waits_after: Vec<u64> = ["h1", "h3", "h4"].iter().map(|h| timed_out(h)).collect();
    assert_eq!(waits_after, waits_before, "a join, a drain and a kill wait for no handover in vain");
}

/// A per-source rate limit over the whole group (`per = "group-source"`:
/// counts per window merged by sum over the hosts): a source whose flows
/// are spread over three hosts is held to its rate in all, not three
/// times it; a source under its rate loses nothing.
#[test]
fn a_group_wide_rate_limit_holds_a_source_spread_over_the_hosts_to_its_rate() {
    use sluice_wire::build::FrameSpec;
    use sluice_wire::tcp::flags;
    let dir = test_dir();
    let d = dir.path();
    let veth = Veth::new();
    let hosts = ["h1", "h2", "h3"];
    let config = json!({ "packets-per-second": 200, "per": "group-source" });
    let EdgeGroup { nats, gw: _gw, procs: _procs, table, _turn, .. } =
        edge_group(d, &hosts, "ratelimit", "rl", Some(config));
    let steer = live_dispatcher(&nats, d, &veth, &hosts, table.version());

    // For 3 s: source A sends 600 packets/s over 60 flows, source B 100/s
    // over 30; every frame marked (source, number).
    const SECS: f64 = 3.0;
    let (a, b, server) = ([10, 9, 0, 1], [10, 9, 0, 2], [192, 0, 2, 1]);
    let mut schedule: Vec<(f64, Vec<u8>)> = Vec::new();
    for (src, tag, pps, flows) in [(a, 0u32, 600u32, 60u16), (b, 1, 100, 30)] {
        for n in 0..(f64::from(pps) * SECS) as u32 {
            let port = 20000 + (n % u32::from(flows)) as u16;
            let f = FrameSpec::tcp4(src, port, server, 80, flags::ACK)
                .with_payload([tag.to_be_bytes(), n.to_be_bytes()].concat());
            schedule.push((f64::from(n) / f64::from(pps), f.build()));
        }
    }
    schedule.sort_by(|x, y| x.0.total_cmp(&y.0));
    let spread: std::collections::BTreeSet<&str> = (0..60u16)
        .filter_map(|i| {
            let k = sluice_wire::parse(&FrameSpec::tcp4(a, 20000 + i, server, 80, flags::ACK).build()).key.unwrap();
            table.owner(k.symmetric_hash())
        })
        .collect();
    assert_eq!(spread.len(), 3, "source A's flows are spread over the three hosts");
    let (mut sender, mut lines) = paced_sender(d, &veth, schedule.iter().map(|(t, f)| (*t, f.as_slice())));
    lines.next().unwrap().unwrap();
    assert!(sender.wait().unwrap().success());
    let st = steer.wait_with_output().unwrap();
    assert!(st.status.success(), "steer: {}", std::fs::read_to_string(d.join("steer.err")).unwrap());
    std::thread::sleep(Duration::from_millis(1200));

    let mut passed = [0u64; 2];
    let mut per_host: std::collections::BTreeMap<&str, u64> = Default::default();
    for h in hosts {
        for (_, f) in flows(&d.join(format!("{h}.out.pcap"))) {
            let tag =
                f.len().checked_sub(8).and_then(|i| f.get(i..i + 4)).map(|t| u32::from_be_bytes(t.try_into().unwrap()));
            if let Some(t @ (0 | 1)) = tag {
                passed[t as usize] += 1;
                if t == 0 {
                    *per_host.entry(h).or_default() += 1;
                }
            }
        }
    }
    // Its burst (a second's worth) and then its rate.
    let allowed = 200.0 + 200.0 * SECS;
    eprintln!(
        "source A: {} of {} passed (its rate allows about {allowed}), by host {per_host:?}; source B: {} of 300",
        passed[0],
        600.0 * SECS,
        passed[1]
    );
    // A source under its rate is not policed: policed with A (the group's
    // 200/s shared by both) it would keep about 86 of its 300. What it may
    // lose is what the loaded machine's af_packet and memif links drop
    // (13 of 300 once on a 2-core CI runner), not what the limiter takes.
    assert!(passed[1] >= 285, "a source under its rate was policed: {} of 300 passed", passed[1]);
    let a_passed = passed[0] as f64;
    // The sliding window admits about its rate after the first window (an
    // estimate: between the rate alone and the bucket's burst plus rate).
    assert!(a_passed >= 0.75 * 200.0 * SECS, "source A was held below its rate: {a_passed}");
    // Each host alone would pass all its third (200/s, within the rate):
    // all 1800. The hosts learn each other's counts every merge period, so
    // a runner that delays the merges lets more through (684–990 seen on
    // 2-core CI machines); well under what per-host limits pass.
    assert!(a_passed <= 1.5 * allowed, "source A passed {a_passed}, over what its rate allows the group ({allowed})");
    assert!(per_host.len() == 3, "{per_host:?}");
}
