//! The NAT: both directions translated with valid checksums (checked by
//! tshark), one public port per connection across workers, replies found
//! on any worker, ports freed by idle expiry; ICMP echo and errors (RFC
//! 5508), first fragments and long datagrams.

use sluice_runtime::{Chain, Fate, NfLimits, NfSpec, RawPacket, Routes, Runtime, RuntimeConfig};
use sluice_state::Domain;
use sluice_tests::{nf, read_pcap, run_host, write_pcap};
use sluice_wire::build::{FrameSpec, Transport};
use sluice_wire::checksum;
use sluice_wire::ipv4::Ipv4Packet;
use sluice_wire::rewrite::{Endpoint, set_endpoint};
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
        assert_eq!(module.contract_version(), "0.6.0");
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
    // to an unbound port, and inside traffic the NAT cannot translate.
    let port = port_of[&key(&out_frames[0])];
    let mut gre = FrameSpec::udp4([10, 1, 0, 1], 1, [198, 51, 100, 1], 2).build();
    gre[14 + 9] = 47;
    gre[14 + 10..14 + 12].copy_from_slice(&[0, 0]);
    let c = sluice_wire::checksum::checksum(&gre[14..34]);
    gre[14 + 10..14 + 12].copy_from_slice(&c.to_be_bytes());
    let strays = vec![
        (T0 + 3_000_000, FrameSpec::tcp4([192, 0, 2, 66], 443, PUBLIC, port, SYN | ACK).build()),
        (T0 + 3_000_000, FrameSpec::tcp4([198, 51, 100, 1], 443, PUBLIC, 2499, ACK).build()),
        (T0 + 3_000_000, gre),
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

// ICMP (RFC 5508) and fragments.

const ROUTER: [u8; 4] = [192, 0, 2, 254];

/// The IPv4 datagram of a frame (after its 14-byte Ethernet header).
pub(crate) fn datagram(f: &[u8]) -> &[u8] {
    let len = u16::from_be_bytes([f[16], f[17]]) as usize;
    &f[14..14 + len]
}

/// An ICMP message from `src` to `dst`: `header` is its type, code and
/// the 4 bytes after the checksum; `quoted` the bytes of an error's
/// embedded datagram.
fn icmp4(src: [u8; 4], dst: [u8; 4], header: [u8; 6], quoted: &[u8]) -> Vec<u8> {
    let mut icmp = vec![header[0], header[1], 0, 0, header[2], header[3], header[4], header[5]];
    icmp.extend_from_slice(quoted);
    let c = checksum::checksum(&icmp);
    icmp[2..4].copy_from_slice(&c.to_be_bytes());
    ipv4_frame(src, dst, 1, 0, &icmp)
}

/// An Ethernet + IPv4 frame carrying `payload` with protocol `proto`;
/// `flags_offset` is the flags and fragment offset word.
pub(crate) fn ipv4_frame(src: [u8; 4], dst: [u8; 4], proto: u8, flags_offset: u16, payload: &[u8]) -> Vec<u8> {
    let mut ip = vec![0x45, 0, 0, 0, 0x12, 0x34, 0, 0, 61, proto, 0, 0];
    ip[2..4].copy_from_slice(&((20 + payload.len()) as u16).to_be_bytes());
    ip[6..8].copy_from_slice(&flags_offset.to_be_bytes());
    ip.extend_from_slice(&src);
    ip.extend_from_slice(&dst);
    let c = checksum::checksum(&ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    let mut f = vec![0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1, 0x08, 0x00];
    f.extend_from_slice(&ip);
    f.extend_from_slice(payload);
    f
}

/// An ICMP error of `kind` (type, code) from `src` to `dst` quoting the
/// first `quote` bytes of `about`'s datagram. Fragmentation needed carries
/// the next-hop MTU (1280).
fn icmp_error(src: [u8; 4], dst: [u8; 4], kind: (u8, u8), about: &[u8], quote: usize) -> Vec<u8> {
    let d = datagram(about);
    let mtu: [u8; 2] = if kind == (3, 4) { 1280u16.to_be_bytes() } else { [0, 0] };
    icmp4(src, dst, [kind.0, kind.1, 0, 0, mtu[0], mtu[1]], &d[..quote.min(d.len())])
}

fn echo(src: [u8; 4], dst: [u8; 4], ident: u16, reply: bool) -> Vec<u8> {
    FrameSpec {
        src: IpAddr128::from_v4(src),
        dst: IpAddr128::from_v4(dst),
        transport: if reply { Transport::IcmpEchoReply { ident } } else { Transport::IcmpEcho { ident } },
        payload: b"abcdefghijklmnopqrstuvwxyz".to_vec(),
        vlan: None,
    }
    .build()
}

/// Asserts the IPv4 header checksum and the ICMP checksum of an ICMP
/// frame, and for an error the checksum of the embedded IP header.
fn assert_icmp_checksums(f: &[u8]) {
    let d = datagram(f);
    assert!(Ipv4Packet::new_checked(d).unwrap().verify_checksum(), "outer IP checksum");
    assert_eq!(checksum::checksum(&d[20..]), 0, "ICMP checksum");
    if matches!(d[20], 3 | 11 | 12) {
        assert!(Ipv4Packet::new_checked(&d[28..]).unwrap().verify_checksum(), "embedded IP checksum");
    }
}

/// The TCP/UDP checksum of a whole IPv4 datagram is right.
fn transport_checksum_ok(d: &[u8]) -> bool {
    let ip = Ipv4Packet::new_checked(d).unwrap();
    let seg = &d[20..];
    let pseudo = checksum::pseudo_header_v4(ip.src(), ip.dst(), ip.protocol(), seg.len() as u16);
    checksum::fold(checksum::sum(pseudo, seg)) == 0xffff
}

/// One packet to each worker: single-writer tables sync at a worker's
/// batch, so this publishes what earlier batches wrote.
fn tick(t: u64) -> Vec<(u64, Vec<u8>)> {
    vec![
        (t, FrameSpec::udp4([192, 0, 2, 1], 1, [192, 0, 2, 2], 2).build()),
        (t, FrameSpec::udp4([192, 0, 2, 3], 1, [192, 0, 2, 2], 2).build()),
    ]
}

#[test]
fn echo_requests_take_a_public_identifier_and_replies_and_errors_find_the_inside_host() {
    let mut host = TwoWorkers::new(CONFIG);
    let server = [198, 51, 100, 7];
    // Two inside hosts ping the same server with the same identifier.
    let pings: Vec<Vec<u8>> = (1..=2u8).map(|h| echo([10, 1, 0, h], server, 7, false)).collect();
    let sent = host.send(&pings.iter().map(|f| (T0, f.clone())).collect::<Vec<_>>());
    let mut public_ident = Vec::new();
    for out in &sent {
        let out = out.as_ref().expect("echo requests leave");
        let k = key(out);
        assert_eq!((k.src, k.dst, k.protocol), (IpAddr128::from_v4(PUBLIC), IpAddr128::from_v4(server), 1));
        assert!((2000..2500).contains(&k.src_port), "the identifier comes from the pool: {}", k.src_port);
        assert_icmp_checksums(out);
        public_ident.push(k.src_port);
    }
    assert_ne!(public_ident[0], public_ident[1], "one public identifier per query");

    // The replies come back to the public identifiers.
    let replies: Vec<(u64, Vec<u8>)> =
        public_ident.iter().map(|id| (T0 + 1_000_000, echo(server, PUBLIC, *id, true))).collect();
    let back = host.send(&replies);
    for (h, r) in back.iter().enumerate() {
        let r = r.as_ref().expect("echo replies come back");
        let k = key(r);
        assert_eq!((k.dst, k.dst_port), (IpAddr128::from_v4([10, 1, 0, h as u8 + 1]), 7));
        assert_icmp_checksums(r);
        // Byte for byte the reply the server sent, but for the address,
        // the identifier and the two checksums.
        assert_eq!(datagram(r)[28..], datagram(&replies[h].1)[28..]);
    }

    // A router on the way says the second ping's TTL ran out (traceroute
    // and mtr use echo requests): the quoted request is the one the inside
    // host sent.
    let expired = icmp_error(ROUTER, PUBLIC, (11, 0), sent[1].as_ref().unwrap(), 28 + 26);
    let out = host.send(&[(T0 + 2_000_000, expired)]);
    let out = out[0].as_ref().expect("time exceeded for a query reaches the inside host");
    assert_eq!(key(out).dst, IpAddr128::from_v4([10, 1, 0, 2]));
    assert_icmp_checksums(out);
    assert_eq!(&datagram(out)[28..], datagram(&pings[1]), "the embedded request is the inside host's");

    // Not translated: a reply from another server, a request from outside
    // to the public address, a reply from inside (no one outside can ping
    // inside), a reply to an unbound identifier.
    let strays = vec![
        (T0 + 3_000_000, echo([198, 51, 100, 8], PUBLIC, public_ident[0], true)),
        (T0 + 3_000_000, echo(server, PUBLIC, public_ident[0], false)),
        (T0 + 3_000_000, echo([10, 1, 0, 1], server, 7, true)),
        (T0 + 3_000_000, echo(server, PUBLIC, 2499, true)),
    ];
    assert_eq!(host.send(&strays), vec![None, None, None, None]);
}

#[test]
fn a_frag_needed_error_for_a_translated_tcp_connection_reaches_the_inside_host_as_it_sent_the_packet() {
    let mut host = TwoWorkers::new(CONFIG);
    let inside = [10, 1, 0, 9];
    let server = [198, 51, 100, 1];
    let big = FrameSpec::tcp4(inside, 40000, server, 443, ACK).with_payload(vec![0x5a; 1400]).build();
    let sent = host.send(&[(T0, big.clone())]);
    let out = sent[0].clone().expect("the connection leaves");
    let port = key(&out).src_port;

    // A router with a 1280-byte next hop answers "fragmentation needed"
    // (PMTU discovery) with the minimum quote (IP header and 8 bytes), or
    // with more (Linux quotes up to 576 bytes, TCP checksum included).
    for quote in [28, 548] {
        let error = icmp_error(ROUTER, PUBLIC, (3, 4), &out, quote);
        assert_icmp_checksums(&error);
        let back = host.send(&[(T0 + 1_000_000, error.clone())]);
        let back = back[0].as_ref().unwrap_or_else(|| panic!("a frag-needed error quoting {quote} bytes is dropped"));
        let d = datagram(back);
        assert_icmp_checksums(back);
        assert_eq!(Ipv4Packet::new_checked(d).unwrap().dst(), inside, "outer destination");
        assert_eq!(Ipv4Packet::new_checked(d).unwrap().src(), ROUTER, "outer source kept");
        assert_eq!(d[20..22], [3, 4], "type and code kept");
        assert_eq!(u16::from_be_bytes([d[26], d[27]]), 1280, "next-hop MTU kept");
        // The embedded packet is the inside host's own, byte for byte:
        // address, port, IP header checksum and (when quoted) the TCP
        // checksum all back to what it sent.
        assert_eq!(&d[28..], &datagram(&big)[..quote], "quote of {quote} bytes");
        assert_eq!(d.len(), datagram(&error).len());
        assert_eq!(u16::from_be_bytes([datagram(&error)[48], datagram(&error)[49]]), port, "it quoted the public port");
    }
}

#[test]
fn an_error_from_inside_about_an_inbound_packet_leaves_with_the_public_endpoint() {
    let mut host = TwoWorkers::new(CONFIG);
    let inside = [10, 1, 0, 2];
    let remote = [198, 51, 100, 9];
    let query = FrameSpec::udp4(inside, 5000, remote, 3478).with_payload(b"binding request".to_vec()).build();
    let out = host.send(&[(T0, query)])[0].clone().unwrap();
    let port = key(&out).src_port;
    let reply = FrameSpec::udp4(remote, 3478, PUBLIC, port).with_payload(b"binding response".to_vec()).build();
    let translated = host.send(&[(T0 + 1_000_000, reply.clone())])[0].clone().expect("the reply comes in");
    assert_eq!(key(&translated).dst, IpAddr128::from_v4(inside));
    host.send(&tick(T0 + 2_000_000));

    // The inside host's socket is gone: it answers port unreachable,
    // quoting the reply as it received it.
    for quote in [28, 44] {
        let unreachable = icmp_error(inside, remote, (3, 3), &translated, quote);
        let out = host.send(&[(T0 + 3_000_000, unreachable)])[0].clone().expect("the error leaves");
        let d = datagram(&out);
        assert_icmp_checksums(&out);
        assert_eq!(Ipv4Packet::new_checked(d).unwrap().src(), PUBLIC, "no private address leaks");
        assert_eq!(Ipv4Packet::new_checked(d).unwrap().dst(), remote);
        // The embedded packet is the reply as the remote sent it.
        assert_eq!(&d[28..], &datagram(&reply)[..quote]);
        if quote == 44 {
            assert!(transport_checksum_ok(&d[28..]), "embedded UDP checksum");
        }
    }
}

#[test]
fn icmp_errors_that_match_no_binding_are_dropped_and_counted() {
    let mut host = TwoWorkers::new(CONFIG);
    let inside = [10, 1, 0, 3];
    let server = [198, 51, 100, 3];
    let as_sent = host.send(&[(T0, FrameSpec::tcp4(inside, 41000, server, 80, SYN).build())])[0].clone().unwrap();
    let port = key(&as_sent).src_port;
    // The SYN as if it had gone elsewhere.
    let redirected = |dst: [u8; 4], dst_port: u16| {
        let mut f = as_sent.clone();
        let l = sluice_wire::parse(&f);
        set_endpoint(&mut f, &l, Endpoint::Destination, IpAddr128::from_v4(dst), Some(dst_port)).unwrap();
        f
    };
    let mut bad_sum = icmp_error(ROUTER, PUBLIC, (3, 1), &as_sent, 28);
    let n = bad_sum.len();
    bad_sum[n - 1] ^= 0xff;
    let other_port = if port == 2499 { 2498 } else { 2499 };
    let errors = [
        // About a port no connection holds.
        icmp_error(ROUTER, PUBLIC, (3, 1), &FrameSpec::udp4(PUBLIC, other_port, server, 53).build(), 28),
        // About the connection's port, but to another server or port
        // than the connection's.
        icmp_error(ROUTER, PUBLIC, (3, 1), &redirected([198, 51, 100, 4], 80), 28),
        icmp_error(ROUTER, PUBLIC, (3, 1), &redirected(server, 8080), 28),
        // About the connection, with a broken ICMP checksum.
        bad_sum,
        // About the connection, quoting only 4 bytes of its TCP header.
        icmp_error(ROUTER, PUBLIC, (3, 1), &as_sent, 24),
        // From inside, about an inbound packet the NAT never let in.
        icmp_error(inside, server, (3, 3), &FrameSpec::udp4(server, 53, inside, 3333).build(), 28),
    ];
    host.chains.iter_mut().for_each(|c| drop(c.drain_events()));
    let out = host.send(&errors.iter().map(|f| (T0 + 1_000_000, f.clone())).collect::<Vec<_>>());
    assert_eq!(out, vec![None; errors.len()]);
    let counted: u64 = host
        .chains
        .iter_mut()
        .flat_map(|c| c.drain_events())
        .filter(|e| e.event.kind == "nat.icmp-unmatched")
        .map(|e| e.event.fields.iter().find(|(k, _)| k == "packets").unwrap().1.parse::<u64>().unwrap())
        .sum();
    assert_eq!(counted, errors.len() as u64, "every unmatched error is counted");
    // The same error about the connection itself passes.
    let ok = host.send(&[(T0 + 2_000_000, icmp_error(ROUTER, PUBLIC, (3, 1), &as_sent, 28))]);
    assert_eq!(key(ok[0].as_ref().unwrap()).dst, IpAddr128::from_v4(inside));
}

#[test]
fn first_fragments_and_long_datagrams_are_translated_with_the_whole_datagrams_checksum() {
    let mut host = TwoWorkers::new(CONFIG);
    let inside = [10, 1, 0, 4];
    let server = [198, 51, 100, 5];
    let data: Vec<u8> = (0..3000u32).map(|i| (i * 7 + i / 256) as u8).collect();
    // The whole UDP datagram (3008 bytes), checksum over all of it.
    let whole = FrameSpec::udp4(inside, 6000, server, 9000).with_payload(data.clone()).build();
    let udp = &datagram(&whole)[20..];
    assert_eq!(udp.len(), 3008);
    // Its first fragment: flags MF, offset 0, the UDP header and 1472
    // bytes of data; the later fragment carries the other 1528.
    let first = ipv4_frame(inside, server, 17, 0x2000, &udp[..1480]);
    // A later fragment of another datagram, whose first never came.
    let mut stray = ipv4_frame(inside, server, 17, 1480 / 8, &udp[1480..]);
    stray[18..20].copy_from_slice(&0x4321u16.to_be_bytes());
    stray[24..26].copy_from_slice(&[0, 0]);
    let c = checksum::checksum(&stray[14..34]);
    stray[24..26].copy_from_slice(&c.to_be_bytes());

    let out = host.send(&[(T0, first.clone()), (T0, stray)]);
    let f = out[0].as_ref().expect("the first fragment is translated");
    assert_eq!(out[1], None, "a later fragment is never translated on its own");
    let d = datagram(f);
    let ip = Ipv4Packet::new_checked(d).unwrap();
    assert!(ip.verify_checksum());
    assert!(ip.more_frags() && ip.frag_offset() == 0, "still the first fragment");
    assert_eq!(ip.src(), PUBLIC);
    let port = u16::from_be_bytes([d[20], d[21]]);
    assert!((2000..2500).contains(&port));
    // The UDP checksum is right for the whole translated datagram: this
    // fragment's bytes and the later fragment's, untouched.
    let mut reassembled = d[..20].to_vec();
    reassembled[2..4].copy_from_slice(&(20u16 + 3008).to_be_bytes());
    reassembled.extend_from_slice(&d[20..]);
    reassembled.extend_from_slice(&udp[1480..]);
    assert!(transport_checksum_ok(&reassembled), "UDP checksum over the 3008-byte datagram");
    assert_eq!(&d[28..], &udp[8..1480], "the data is untouched");

    // The whole datagram, as the host hands over a reassembled one: the
    // same connection, the same port, checksum right.
    let out = host.send(&[(T0 + 1_000_000, whole.clone())]);
    let f = out[0].as_ref().expect("a 3042-byte frame is translated");
    assert_eq!(f.len(), whole.len());
    assert_eq!(key(f).src_port, port);
    assert!(transport_checksum_ok(datagram(f)));

    // The answer, a first fragment of a 3000-byte datagram to the public
    // port, comes back with its checksum right too.
    let answer = FrameSpec::udp4(server, 9000, PUBLIC, port).with_payload(data).build();
    let audp = datagram(&answer)[20..].to_vec();
    let afirst = ipv4_frame(server, PUBLIC, 17, 0x2000, &audp[..1480]);
    let back = host.send(&[(T0 + 2_000_000, afirst)]);
    let b = datagram(back[0].as_ref().expect("the first fragment of the answer comes in"));
    assert_eq!(Ipv4Packet::new_checked(b).unwrap().dst(), inside);
    let mut whole_back = b[..20].to_vec();
    whole_back[2..4].copy_from_slice(&(20u16 + 3008).to_be_bytes());
    whole_back.extend_from_slice(&b[20..]);
    whole_back.extend_from_slice(&audp[1480..]);
    assert!(transport_checksum_ok(&whole_back));
    assert_eq!(u16::from_be_bytes([b[22], b[23]]), 6000);
}
