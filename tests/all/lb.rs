//! The load balancer: Maglev spreading, per-connection affinity that
//! survives a backend-list change, rewrites with valid checksums.

use sluice_host::{RunOptions, run};
use sluice_runtime::{Chain, NfLimits, NfSpec, RawPacket, Runtime, RuntimeConfig};
use sluice_tests::{host_config, nf, read_pcap, write_pcap};
use sluice_wire::IpAddr128;
use sluice_wire::build::FrameSpec;
use sluice_wire::checksum::pseudo_header_v4;
use sluice_wire::ipv4::Ipv4Packet;
use sluice_wire::tcp::TcpPacket;
use sluice_wire::tcp::flags::{ACK, SYN};
use std::collections::{HashMap, HashSet};

const VIP: [u8; 4] = [203, 0, 113, 10];
const BACKENDS: [[u8; 4]; 3] = [[10, 1, 0, 1], [10, 1, 0, 2], [10, 1, 0, 3]];

fn client(i: u16) -> [u8; 4] {
    [198, 51, 100, (i % 200) as u8 + 1]
}

fn to_vip(i: u16, flags: u8) -> Vec<u8> {
    FrameSpec::tcp4(client(i), 20_000 + i, VIP, 80, flags).with_payload(b"hello".to_vec()).build()
}

fn checksums_ok(f: &[u8]) -> bool {
    let l = sluice_wire::parse(f);
    let k = l.key.unwrap();
    let ip = Ipv4Packet::new_checked(&f[usize::from(l.l3_offset.unwrap())..]).unwrap();
    let t = &f[usize::from(l.l4_offset.unwrap())..];
    ip.verify_checksum()
        && TcpPacket::new_checked(t).unwrap().verify_checksum(pseudo_header_v4(
            k.src.to_v4().unwrap(),
            k.dst.to_v4().unwrap(),
            6,
            t.len() as u16,
        ))
}

fn lb_config(backends: &[&str]) -> String {
    let list: Vec<String> = backends.iter().map(|b| format!("\"{b}\"")).collect();
    format!(r#"{{"vip":"203.0.113.10","port":80,"protocol":"tcp","table-size":251,"backends":[{}]}}"#, list.join(","))
}

#[test]
fn connections_spread_stick_and_replies_come_from_the_vip() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.pcap");
    let output = dir.path().join("out.pcap");
    let mut frames = Vec::new();
    for i in 0..300u16 {
        frames.push(to_vip(i, SYN));
    }
    for i in 0..300u16 {
        frames.push(to_vip(i, ACK));
    }
    // A reply from a backend to a client.
    frames.push(FrameSpec::tcp4(BACKENDS[1], 80, client(7), 20_007, SYN | ACK).build());
    // Traffic not to the VIP passes untouched.
    let other = FrameSpec::tcp4([198, 51, 100, 1], 1, [192, 0, 2, 1], 80, SYN).build();
    frames.push(other.clone());
    write_pcap(&input, &frames);
    let config = host_config(
        dir.path(),
        &format!("[nf.lb]\nconfig-text = '{}'\n", lb_config(&["10.1.0.1", "10.1.0.2", "10.1.0.3"])),
    );
    let opts = RunOptions {
        nfs: vec![nf("lb")],
        chain: None,
        swaps: vec![],
        input,
        output: Some(output.clone()),
        progress: false,
    };
    let r = run(&config, &opts).unwrap();
    assert_eq!(r.nfs[0].meters.rewritten, 601);
    let out = read_pcap(&output);
    assert_eq!(out.len(), frames.len());

    let mut backend_of: HashMap<u16, IpAddr128> = HashMap::new();
    let mut per_backend: HashMap<IpAddr128, usize> = HashMap::new();
    for f in &out[..600] {
        assert!(checksums_ok(f), "bad checksum after rewrite");
        let k = sluice_wire::parse(f).key.unwrap();
        assert!(BACKENDS.iter().any(|b| IpAddr128::from_v4(*b) == k.dst), "{k}");
        assert_eq!(k.dst_port, 80);
        let prev = backend_of.insert(k.src_port, k.dst);
        assert!(prev.is_none_or(|p| p == k.dst), "flow {} moved backends", k.src_port);
        *per_backend.entry(k.dst).or_default() += 1;
    }
    assert_eq!(per_backend.len(), 3);
    assert!(per_backend.values().all(|&n| n >= 120), "{per_backend:?}");
    let reply = sluice_wire::parse(&out[600]).key.unwrap();
    assert_eq!(reply.src, IpAddr128::from_v4(VIP));
    assert!(checksums_ok(&out[600]));
    assert_eq!(out[601], other);
}

#[test]
fn affinity_survives_a_backend_list_change() {
    let runtime = Runtime::new(RuntimeConfig::default()).unwrap();
    let module = runtime.load_file(&nf("lb")).unwrap();
    let spec = |backends: &[&str]| NfSpec {
        module: module.clone(),
        config: lb_config(backends).into_bytes().into(),
        limits: NfLimits::default(),
        owner: None,
    };
    let three = ["10.1.0.1", "10.1.0.2", "10.1.0.3"];
    let four = ["10.1.0.1", "10.1.0.2", "10.1.0.3", "10.1.0.4"];
    let dst_of = |chain: &mut Chain, frames: &[Vec<u8>]| -> Vec<IpAddr128> {
        let raw: Vec<RawPacket<'_>> = frames
            .iter()
            .map(|f| RawPacket { data: f, wire_len: f.len() as u32, timestamp_ns: 1, ingress_port: 0 })
            .collect();
        chain
            .process(&raw)
            .iter()
            .zip(frames)
            .map(|(r, f)| sluice_wire::parse(r.data.as_deref().unwrap_or(f)).key.unwrap().dst)
            .collect()
    };
    let syns: Vec<Vec<u8>> = (0..200).map(|i| to_vip(i, SYN)).collect();
    let acks: Vec<Vec<u8>> = (0..200).map(|i| to_vip(i, ACK)).collect();

    let mut before = Chain::new(&runtime, &[spec(&three)]).unwrap();
    let first = dst_of(&mut before, &syns);

    // The new version of the NF, with a fourth backend, takes over the
    // flow state (as a hot swap does).
    let mut after = Chain::new(&runtime, &[spec(&four)]).unwrap();
    let old = before.stages()[0].flow_table();
    for key in old.keys() {
        after.stages_mut()[0].flow_table_mut().import(old.export(key).unwrap()).unwrap();
    }
    let second = dst_of(&mut after, &acks);
    assert_eq!(first, second, "existing connections must stay on their backends");

    // New connections use the fourth backend too; on a fresh table some of
    // the old flows would have moved to it.
    let fresh: Vec<Vec<u8>> = (0..200).map(|i| to_vip(i + 1000, SYN)).collect();
    let new_dsts: HashSet<IpAddr128> = dst_of(&mut after, &fresh).into_iter().collect();
    assert!(new_dsts.contains(&IpAddr128::from_v4([10, 1, 0, 4])));
    let mut cold = Chain::new(&runtime, &[spec(&four)]).unwrap();
    assert_ne!(dst_of(&mut cold, &acks), first);

    // A removed backend's connections are re-balanced, the rest stay.
    let mut shrunk = Chain::new(&runtime, &[spec(&["10.1.0.1", "10.1.0.2"])]).unwrap();
    for key in old.keys() {
        shrunk.stages_mut()[0].flow_table_mut().import(old.export(key).unwrap()).unwrap();
    }
    let third = dst_of(&mut shrunk, &acks);
    for (a, b) in first.iter().zip(&third) {
        if *a != IpAddr128::from_v4([10, 1, 0, 3]) {
            assert_eq!(a, b);
        } else {
            assert_ne!(*b, IpAddr128::from_v4([10, 1, 0, 3]));
        }
    }
}

#[test]
fn a_bad_backend_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.pcap");
    write_pcap(&input, &[to_vip(1, SYN)]);
    let config =
        host_config(dir.path(), &format!("[nf.lb]\nconfig-text = '{}'\n", lb_config(&["10.1.0.1", "backend-two"])));
    let opts = RunOptions { nfs: vec![nf("lb")], chain: None, swaps: vec![], input, output: None, progress: false };
    let e = run(&config, &opts).unwrap_err().to_string();
    assert!(e.contains("backend-two"), "{e}");
}

#[test]
fn a_frame_too_long_to_rewrite_is_refused_alone_and_its_batch_is_balanced() {
    let runtime = Runtime::new(RuntimeConfig::default()).unwrap();
    let module = runtime.load_file(&nf("lb")).unwrap();
    let spec = NfSpec {
        module,
        config: lb_config(&["10.1.0.1", "10.1.0.2", "10.1.0.3"]).into_bytes().into(),
        limits: NfLimits::default(),
        owner: None,
    };
    let mut chain = Chain::new(&runtime, &[spec]).unwrap();
    // 31 connections to the VIP and, in the middle, one 70,000-byte frame
    // to it: its rewrite could not be represented.
    let mut frames: Vec<Vec<u8>> = (0..31u16).map(|i| to_vip(i, SYN)).collect();
    let mut jumbo = to_vip(99, SYN);
    jumbo.resize(70_000, 0);
    frames.insert(15, jumbo);
    let raw: Vec<RawPacket<'_>> = frames
        .iter()
        .map(|f| RawPacket { data: f, wire_len: f.len() as u32, timestamp_ns: 1, ingress_port: 0 })
        .collect();
    let results = chain.process(&raw).to_vec();
    assert_eq!(results[15].fate, sluice_runtime::Fate::Refused);
    assert_eq!(chain.counters().refused_oversize, 1);
    for (i, r) in results.iter().enumerate().filter(|(i, _)| *i != 15) {
        assert_eq!(r.fate, sluice_runtime::Fate::Forward(0), "packet {i}");
        assert!(r.data.as_deref().is_some_and(checksums_ok), "packet {i} was not balanced");
    }
}
