//! The NAT: both directions translated with valid checksums (checked by
//! tshark), one public port per connection across workers, replies found
//! on any worker, ports freed by idle expiry.

use sluice_runtime::{Chain, Fate, NfLimits, NfSpec, RawPacket, Routes, Runtime, RuntimeConfig};
use sluice_state::Domain;
use sluice_tests::{nf, read_pcap, run_host, write_pcap};
use sluice_wire::build::{FrameSpec, Transport};
use sluice_wire::tcp::flags::{ACK, SYN};
use sluice_wire::{FlowKey, IpAddr128};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

const PUBLIC: [u8; 4] = [203, 0, 113, 1];
const CONFIG: &str =
    r#"{"public-ip":"203.0.113.1","inside":["10.0.0.0/8"],"port-first":2000,"port-count":500,"idle-timeout-s":60}"#;
const T0: u64 = 1_700_000_000_000_000_000;

/// Two workers, each with its own NAT instance, sharing the NAT's state
/// domain; packets go to the worker of their symmetric flow hash, as the
/// host dispatches them.
struct TwoWorkers {
    chains: Vec<Chain>,
    domain: Arc<Domain>,
}

impl TwoWorkers {
    fn new(config: &str) -> Self {
        let runtime = Runtime::new(RuntimeConfig::default()).unwrap();
        let module = runtime.load_file(&nf("nat")).unwrap();
        assert_eq!(module.contract_version(), "0.4.0");
        let spec = NfSpec { module, config: config.as_bytes().into(), limits: NfLimits::default(), owner: None };
        let domain = Domain::new();
        let chains = (0..2)
            .map(|_| {
                Chain::with_domains(
                    &runtime,
                    std::slice::from_ref(&spec),
                    Routes::linear(1),
                    std::slice::from_ref(&domain),
                )
                .unwrap()
            })
            .collect();
        TwoWorkers { chains, domain }
    }

    /// Processes frames (in batches of up to 32 per worker); returns what
    /// left, per input frame: `None` if dropped.
    fn send(&mut self, frames: &[(u64, Vec<u8>)]) -> Vec<Option<Vec<u8>>> {
        let mut out = vec![None; frames.len()];
        let mut per: Vec<Vec<usize>> = vec![Vec::new(); 2];
        for (i, (_, f)) in frames.iter().enumerate() {
            let w = sluice_wire::parse(f).key.map(|k| (k.symmetric_hash() % 2) as usize).unwrap_or(0);
            per[w].push(i);
        }
        for (w, idx) in per.iter().enumerate() {
            for chunk in idx.chunks(32) {
                let raw: Vec<RawPacket<'_>> = chunk
                    .iter()
                    .map(|&i| RawPacket {
                        data: &frames[i].1,
                        wire_len: frames[i].1.len() as u32,
                        timestamp_ns: frames[i].0,
                        ingress_port: 0,
                    })
                    .collect();
                let results = self.chains[w].process(&raw).to_vec();
                for (&i, r) in chunk.iter().zip(results) {
                    if let Fate::Forward(_) = r.fate {
                        out[i] = Some(r.data.unwrap_or_else(|| frames[i].1.clone()));
                    }
                }
            }
        }
        out
    }
}

fn key(f: &[u8]) -> FlowKey {
    sluice_wire::parse(f).key.unwrap()
}

/// 120 TCP and 40 UDP connections from 40 inside hosts to 5 servers.
fn outbound() -> Vec<Vec<u8>> {
    let mut v = Vec::new();
    for h in 1..=40u8 {
        for c in 0..3u16 {
            v.push(FrameSpec::tcp4([10, 1, 0, h], 40000 + c, [198, 51, 100, h % 5], 443, SYN).build());
        }
        v.push(FrameSpec::udp4([10, 1, 0, h], 5353, [198, 51, 100, 9], 53).with_payload(b"query".to_vec()).build());
    }
    v
}

pub(crate) fn tshark_bad_checksums(pcap: &std::path::Path) -> usize {
    let out = std::process::Command::new("tshark")
        .args(["-r", pcap.to_str().unwrap(), "-o", "ip.check_checksum:TRUE", "-o", "tcp.check_checksum:TRUE"])
        .args([
            "-o",
            "udp.check_checksum:TRUE",
            "-Y",
            "ip.checksum.status == \"Bad\" || tcp.checksum.status == \"Bad\" || udp.checksum.status == \"Bad\"",
        ])
        .output()
        .expect("tshark is installed by `make setup` (Debian package tshark)");
    assert!(out.status.success(), "tshark failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().filter(|l| !l.trim().is_empty()).count()
}

#[test]
fn translates_both_directions_across_workers_with_valid_checksums() {
    let mut host = TwoWorkers::new(CONFIG);
    let out_frames = outbound();
    let stamped: Vec<(u64, Vec<u8>)> = out_frames.iter().map(|f| (T0, f.clone())).collect();
    let sent = host.send(&stamped);

    // Every connection left with the public address and its own port.
    let mut port_of: HashMap<FlowKey, u16> = HashMap::new();
    for (orig, out) in out_frames.iter().zip(&sent) {
        let out = out.as_ref().expect("outbound packets pass");
        let (o, n) = (key(orig), key(out));
        assert_eq!(n.src, IpAddr128::from_v4(PUBLIC));
        assert_eq!((n.dst, n.dst_port), (o.dst, o.dst_port));
        assert!((2000..2500).contains(&n.src_port));
        port_of.insert(o, n.src_port);
    }
    let distinct: HashSet<u16> = port_of.values().copied().collect();
    assert_eq!(distinct.len(), out_frames.len(), "one public port per connection");

    // Second packets of the same connections keep their ports.
    let again = host.send(&stamped.iter().map(|(t, f)| (t + 1_000_000, f.clone())).collect::<Vec<_>>());
    for (orig, out) in out_frames.iter().zip(&again) {
        assert_eq!(key(out.as_ref().unwrap()).src_port, port_of[&key(orig)]);
    }

    // Replies from the servers: after translation they are other flows, so
    // many land on the other worker; all find their connection.
    let replies: Vec<(u64, Vec<u8>)> = out_frames
        .iter()
        .map(|f| {
            let k = key(f);
            let port = port_of[&k];
            let src = k.dst.to_v4().unwrap();
            let frame = if k.protocol == 6 {
                FrameSpec::tcp4(src, k.dst_port, PUBLIC, port, SYN | ACK).build()
            } else {
                FrameSpec::udp4(src, k.dst_port, PUBLIC, port).with_payload(b"answer".to_vec()).build()
            };
            (T0 + 2_000_000, frame)
        })
        .collect();
    let back = host.send(&replies);
    for (orig, r) in out_frames.iter().zip(&back) {
        let o = key(orig);
        let r = key(r.as_ref().expect("replies pass"));
        assert_eq!((r.dst, r.dst_port), (o.src, o.src_port), "reply reaches the inside host");
        assert_eq!((r.src, r.src_port), (o.dst, o.dst_port));
    }
    let crossed = out_frames
        .iter()
        .zip(&replies)
        .filter(|(o, (_, r))| key(o).symmetric_hash() % 2 != key(r).symmetric_hash() % 2)
        .count();
    assert!(crossed > 10, "the test must exercise replies on the other worker ({crossed})");

    // A packet to a bound port from another remote is dropped, as is one
    // to an unbound port.
    let port = port_of[&key(&out_frames[0])];
    let strays = vec![
        (T0 + 3_000_000, FrameSpec::tcp4([192, 0, 2, 66], 443, PUBLIC, port, SYN | ACK).build()),
        (T0 + 3_000_000, FrameSpec::tcp4([198, 51, 100, 1], 443, PUBLIC, 2499, ACK).build()),
        (
            T0 + 3_000_000,
            FrameSpec {
                src: IpAddr128::from_v4([10, 1, 0, 1]),
                dst: IpAddr128::from_v4([198, 51, 100, 1]),
                transport: Transport::IcmpEcho { ident: 7 },
                payload: Vec::new(),
                vlan: None,
            }
            .build(),
        ),
    ];
    assert_eq!(host.send(&strays), vec![None, None, None]);

    // tshark agrees every rewritten checksum is right.
    let dir = tempfile::tempdir().unwrap();
    let pcap = dir.path().join("nat.pcap");
    let all: Vec<Vec<u8>> = sent.iter().chain(&back).map(|f| f.clone().unwrap()).collect();
    write_pcap(&pcap, &all);
    assert_eq!(tshark_bad_checksums(&pcap), 0);
    // ... and notices a wrong one (the TTL changed, the checksum not).
    let mut broken = all[0].clone();
    broken[14 + 8] ^= 0x01;
    write_pcap(&pcap, &[broken, all[1].clone()]);
    assert_eq!(tshark_bad_checksums(&pcap), 1);
}

#[test]
fn idle_mappings_give_their_ports_back() {
    let mut host = TwoWorkers::new(CONFIG);
    let frames: Vec<(u64, Vec<u8>)> = outbound().into_iter().map(|f| (T0, f)).collect();
    host.send(&frames);
    let bound = |d: &Domain| d.pool_stats().iter().find(|(n, _)| n == "ports").unwrap().1.bound;
    assert_eq!(bound(&host.domain), 160);
    // 30 s later one connection is still busy; 70 s after that the rest
    // idled out on both workers (60 s timeout), and their ports are free.
    host.send(&[(T0 + 30_000_000_000, frames[0].1.clone())]);
    let tick = |t: u64| {
        vec![
            (t, FrameSpec::udp4([192, 0, 2, 1], 1, [192, 0, 2, 2], 2).build()),
            (t, FrameSpec::udp4([192, 0, 2, 3], 1, [192, 0, 2, 2], 2).build()),
        ]
    };
    host.send(&tick(T0 + 70_000_000_000));
    assert_eq!(bound(&host.domain), 1, "only the busy connection keeps its port");
    let expired: u64 = host.chains.iter().map(|c| c.stages()[0].meters().table_expired).sum();
    assert_eq!(expired, 159);
    // A new connection can take a freed port again.
    let fresh =
        host.send(&[(T0 + 71_000_000_000, FrameSpec::tcp4([10, 9, 9, 9], 1, [198, 51, 100, 1], 80, SYN).build())]);
    assert!(fresh[0].is_some());
}

#[test]
fn an_exhausted_pool_drops_new_connections_and_says_so() {
    let config = CONFIG.replace("\"port-count\":500", "\"port-count\":10");
    let (report, out) = run_host(
        &format!("[nf.nat]\nconfig-text = '{config}'\n"),
        vec![nf("nat")],
        &outbound().into_iter().map(|f| (T0, f)).collect::<Vec<_>>(),
        |c, _| {
            c.workers = 2;
        },
    );
    assert_eq!(out.len(), 10, "ten ports, ten connections");
    assert_eq!(report.packets_dropped, 150);
    assert!(report.events_by_kind.get("nat/nat.ports-exhausted").copied().unwrap_or(0) >= 1);
    let t = report.nfs[0].tables.iter().find(|t| t.spec.name == "ports").unwrap();
    assert_eq!(t.pool.unwrap().exhausted, 150);
}

#[test]
fn a_two_worker_run_never_gives_one_port_to_two_connections() {
    // Many connections, each with several packets, through `sluice-host
    // run --workers 2`: in the output, every public port belongs to one
    // inside connection.
    let mut frames = Vec::new();
    for round in 0..4u64 {
        for h in 1..=60u8 {
            for c in 0..5u16 {
                frames.push((
                    T0 + round * 1_000_000,
                    FrameSpec::tcp4([10, 2, h / 16, h], 30000 + c, [198, 51, 100, h % 7], 80, ACK)
                        .with_payload(vec![h; 40])
                        .build(),
                ));
            }
        }
    }
    let config = format!("[nf.nat]\nconfig-text = '{CONFIG}'\n");
    let (report, out) = run_host(&config, vec![nf("nat")], &frames, |c, _| {
        c.workers = 2;
        c.batch_size = 16;
    });
    assert_eq!(out.len(), frames.len());
    let mut owner: BTreeMap<u16, HashSet<(IpAddr128, u16)>> = BTreeMap::new();
    for (orig, o) in frames.iter().zip(&out) {
        let (k, n) = (key(&orig.1), key(o));
        owner.entry(n.src_port).or_default().insert((k.src, k.src_port));
    }
    assert_eq!(owner.len(), 300);
    assert!(owner.values().all(|s| s.len() == 1), "a port shared by two connections");
    let t = report.nfs[0].tables.iter().find(|t| t.spec.name == "ports").unwrap();
    assert_eq!(t.pool.unwrap().bound, 300);
    let dir = tempfile::tempdir().unwrap();
    let pcap = dir.path().join("out.pcap");
    write_pcap(&pcap, &out);
    assert_eq!(tshark_bad_checksums(&pcap), 0);
    assert_eq!(read_pcap(&pcap).len(), out.len());
}
