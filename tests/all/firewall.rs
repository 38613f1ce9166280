//! Golden tests of the firewall: exactly which packets pass.

use sluice_host::{RunOptions, run};
use sluice_tests::{host_config, nf, read_pcap, run_host, stamped, write_pcap};
use sluice_wire::IpAddr128;
use sluice_wire::build::{FrameSpec, Transport};
use sluice_wire::tcp::flags::{ACK, FIN, PSH, RST, SYN};
use std::path::Path;

const RULES: &str = r#"
[nf.firewall.config]
default = "deny"
log-denied = true
rules = [
  { action = "deny",  proto = "tcp", src = "10.0.0.66", dst-ports = "80" },
  { action = "allow", proto = "tcp", src = "10.0.0.0/24", dst-ports = "80-443" },
  { action = "allow", proto = "udp", src = "10.0.0.0/24", dst-ports = "53" },
  { action = "allow", proto = "icmp", src = "10.0.0.0/24" },
  { action = "allow", proto = "tcp", src = "2001:db8:1::/48", dst-ports = "443" },
]
"#;

const IN: [u8; 4] = [10, 0, 0, 5];
const OUT: [u8; 4] = [203, 0, 113, 9];

/// The golden trace: each frame with whether it must pass, and why.
pub fn cases() -> Vec<(Vec<u8>, bool, &'static str)> {
    let t = |s, sp, d, dp, f| FrameSpec::tcp4(s, sp, d, dp, f).build();
    let v6a = IpAddr128::from_v6([0x20, 1, 0xd, 0xb8, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7]);
    let v6b = IpAddr128::from_v6([0x20, 1, 0xd, 0xb8, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
    let t6 = |src, dst, sp, dp, fl| {
        FrameSpec {
            src,
            dst,
            transport: Transport::Tcp { src_port: sp, dst_port: dp, flags: fl },
            payload: vec![],
            vlan: Some(42),
        }
        .build()
    };
    let mut arp = vec![0xffu8; 42];
    arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
    let mut truncated = t(IN, 4000, OUT, 80, SYN);
    truncated.truncate(14 + 12);
    let mut ping = FrameSpec::udp4(IN, 0, OUT, 0);
    ping.transport = Transport::IcmpEcho { ident: 9 };
    let mut pong = FrameSpec::udp4(OUT, 0, IN, 0);
    pong.transport = Transport::IcmpEchoReply { ident: 9 };
    let mut stray_pong = FrameSpec::udp4(OUT, 0, IN, 0);
    stray_pong.transport = Transport::IcmpEchoReply { ident: 10 };
    vec![
        (t(IN, 40000, OUT, 80, SYN), true, "inside opens web connection"),
        (t(OUT, 80, IN, 40000, SYN | ACK), true, "reply passes by state"),
        (t(IN, 40000, OUT, 80, ACK), true, "handshake completes"),
        (t(OUT, 80, IN, 40000, PSH | ACK), true, "data from outside on open connection"),
        (t(OUT, 5555, IN, 22, SYN), false, "outside scan of ssh"),
        (t(OUT, 443, IN, 40001, SYN | ACK), false, "spoofed reply without state"),
        (t(IN, 40002, OUT, 25, SYN), false, "smtp not allowed"),
        (t([10, 0, 0, 66], 40003, OUT, 80, SYN), false, "first rule denies this host"),
        (FrameSpec::udp4(IN, 5353, [192, 0, 2, 53], 53).build(), true, "dns query"),
        (FrameSpec::udp4([192, 0, 2, 53], 53, IN, 5353).build(), true, "dns answer by state"),
        (FrameSpec::udp4([192, 0, 2, 53], 53, IN, 5354).build(), false, "answer to another port"),
        (ping.build(), true, "ping"),
        (pong.build(), true, "pong by state"),
        (stray_pong.build(), false, "pong with another identifier"),
        (t(IN, 40010, OUT, 443, SYN), true, "second web connection"),
        (t(OUT, 443, IN, 40010, RST), true, "reset from outside passes (state exists)"),
        (t(OUT, 443, IN, 40010, ACK), true, "after a reset, the closed connection's late segments pass"),
        (t(IN, 40000, OUT, 80, FIN | ACK), true, "inside closes"),
        (t(OUT, 80, IN, 40000, FIN | ACK), true, "outside closes"),
        (t(IN, 40000, OUT, 80, ACK), true, "final ack"),
        (t(OUT, 80, IN, 40000, ACK), true, "a late ack of the closed connection passes"),
        (t(OUT, 80, IN, 40000, SYN), false, "a new connection from outside on its 5-tuple is decided by the rules"),
        (t(IN, 40000, OUT, 80, SYN), true, "one from inside opens it again"),
        (t(OUT, 80, IN, 40000, SYN | ACK), true, "and its reply passes by state"),
        (t(IN, 40020, OUT, 8080, ACK), false, "mid-stream ack of unknown connection is outside the rule port range"),
        (t(IN, 40021, OUT, 80, ACK), true, "mid-stream ack matching an allow rule passes on the rule"),
        (t(OUT, 80, IN, 40021, ACK), false, "but opens no state for replies"),
        (arp, false, "non-ip (not even valid arp) is dropped by default"),
        (truncated, false, "truncated ip header has no flow: dropped"),
        (t6(v6a, v6b, 50000, 443, SYN), true, "ipv6 behind a vlan tag"),
        (t6(v6b, v6a, 443, 50000, SYN | ACK), true, "ipv6 reply by state"),
        (t6(v6b, v6a, 443, 50001, SYN), false, "ipv6 from outside"),
    ]
}

fn passing(batch: usize, workers: usize) -> (Vec<Vec<u8>>, sluice_host::Report) {
    let frames: Vec<Vec<u8>> = cases().into_iter().map(|c| c.0).collect();
    let (report, out) = run_host(RULES, vec![nf("firewall")], &stamped(&frames), |c, _| {
        c.batch_size = batch;
        c.workers = workers;
    });
    (out, report)
}

#[test]
fn exactly_the_expected_packets_pass_at_every_batch_size() {
    let expected: Vec<Vec<u8>> = cases().into_iter().filter(|c| c.1).map(|c| c.0).collect();
    for batch in [1, 3, 32] {
        let (out, report) = passing(batch, 1);
        if out != expected {
            let cases = cases();
            for (frame, pass, why) in &cases {
                let got = out.contains(frame);
                assert_eq!(got, *pass, "batch {batch}: '{why}' should {}pass", if *pass { "" } else { "not " });
            }
        }
        assert_eq!(report.packets_in, cases().len() as u64);
        assert_eq!(report.packets_out, expected.len() as u64);
        assert_eq!(report.nfs[0].meters.traps, 0);
        assert_eq!(report.nfs[0].meters.invocations, cases().len().div_ceil(batch) as u64);
        // Denied connections are reported as events, with the packet's flow.
        let denies: Vec<_> = report.events.iter().filter(|e| e.kind == "firewall.deny").collect();
        assert!(denies.len() >= 5, "{} deny events", denies.len());
        let scan = denies.iter().find(|e| e.fields.get("rule").map(String::as_str) == Some("default")).unwrap();
        assert_eq!(scan.nf, "firewall");
        assert!(scan.flow.as_deref().is_some_and(|f| f.contains("203.0.113.9")), "{scan:?}");
        let smtp_host = denies.iter().find(|e| e.fields.get("rule").map(String::as_str) == Some("1")).unwrap();
        assert!(smtp_host.flow.as_deref().is_some_and(|f| f.contains("10.0.0.66")), "{smtp_host:?}");
    }
}

#[test]
fn two_workers_give_the_same_output_as_one() {
    let (one, _) = passing(4, 1);
    let (two, report) = passing(4, 2);
    assert_eq!(one, two);
    assert_eq!(report.workers, 2);
}

#[test]
fn committed_fixture_matches_the_builder() {
    // tests/fixtures/firewall-golden.pcap is the same trace, committed so
    // that other tools (tshark, other hosts) can replay it. BLESS=1
    // regenerates it.
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/firewall-golden.pcap");
    let frames: Vec<Vec<u8>> = cases().into_iter().map(|c| c.0).collect();
    if std::env::var("BLESS").is_ok() {
        write_pcap(&fixture, &frames);
    }
    assert_eq!(read_pcap(&fixture), frames, "fixture is stale: run with BLESS=1 and commit it");
}

#[test]
fn a_bad_rule_is_reported_with_the_nfs_own_message() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.pcap");
    write_pcap(&input, &[FrameSpec::udp4(IN, 1, OUT, 2).build()]);
    let config = host_config(
        dir.path(),
        r#"
        [nf.firewall.config]
        rules = [{ action = "allow" }, { action = "allow", src = "10.0.0.0/33" }]
        "#,
    );
    let opts =
        RunOptions { nfs: vec![nf("firewall")], chain: None, swaps: vec![], input, output: None, progress: false };
    let err = run(&config, &opts).unwrap_err().to_string();
    assert!(err.contains("rejected its configuration"), "{err}");
    assert!(err.contains("rule 2") && err.contains("33"), "{err}");
}

/// An ICMP (or ICMPv6, for IPv6 addresses) error of `kind` (type, code)
/// from `from` to `to`, its 4 bytes after the checksum `rest` (an MTU),
/// quoting the first `quote` bytes of `about`'s IP datagram.
fn icmp_error(from: IpAddr128, to: IpAddr128, kind: (u8, u8), rest: u32, about: &[u8], quote: usize) -> Vec<u8> {
    let l3 = usize::from(sluice_wire::parse(about).l3_offset.unwrap());
    let quoted = about[l3..(l3 + quote).min(about.len())].to_vec();
    // Built as an echo request, then retyped with its checksum updated.
    let mut f =
        FrameSpec { src: from, dst: to, transport: Transport::IcmpEcho { ident: 0 }, payload: quoted, vlan: None }
            .build();
    let l4 = usize::from(sluice_wire::parse(&f).l4_offset.unwrap());
    let mut head = [0u8; 8];
    head[0] = kind.0;
    head[1] = kind.1;
    head[4..8].copy_from_slice(&rest.to_be_bytes());
    let mut c = u16::from_be_bytes([f[l4 + 2], f[l4 + 3]]);
    for at in [0, 4, 6] {
        let old = u16::from_be_bytes([f[l4 + at], f[l4 + at + 1]]);
        let new = u16::from_be_bytes([head[at], head[at + 1]]);
        c = sluice_wire::checksum::update_u16(c, old, new);
    }
    head[2..4].copy_from_slice(&c.to_be_bytes());
    f[l4..l4 + 8].copy_from_slice(&head);
    f
}

#[test]
fn icmp_errors_about_known_connections_pass_and_the_rest_are_decided_by_the_rules() {
    let v4 = IpAddr128::from_v4;
    let dns_server = [192, 0, 2, 53];
    let router = v4([198, 51, 100, 254]);
    let v6a = IpAddr128::from_v6([0x20, 1, 0xd, 0xb8, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7]);
    let v6b = IpAddr128::from_v6([0x20, 1, 0xd, 0xb8, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
    let router6 = IpAddr128::from_v6([0x20, 1, 0xd, 0xb8, 0xee, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
    let dns = FrameSpec::udp4(IN, 5353, dns_server, 53).with_payload(b"query".to_vec()).build();
    let unknown = FrameSpec::udp4(IN, 5354, dns_server, 53).build();
    let web = FrameSpec::tcp4(IN, 40000, OUT, 80, ACK).with_payload(vec![1; 1400]).build();
    let web6 = FrameSpec {
        src: v6a,
        dst: v6b,
        transport: Transport::Tcp { src_port: 50000, dst_port: 443, flags: SYN },
        payload: vec![],
        vlan: Some(42),
    }
    .build();
    let cases: Vec<(Vec<u8>, bool, &str)> = vec![
        (dns.clone(), true, "dns query opens the flow"),
        (icmp_error(v4(dns_server), v4(IN), (3, 3), 0, &dns, 28), true, "port unreachable for the open udp flow"),
        (icmp_error(v4(dns_server), v4(IN), (3, 3), 0, &unknown, 28), false, "port unreachable for an unknown flow"),
        (
            icmp_error(v4(dns_server), v4([10, 0, 0, 6]), (3, 3), 0, &dns, 28),
            false,
            "to another host than the one that sent the quoted packet",
        ),
        (FrameSpec::tcp4(IN, 40000, OUT, 80, SYN).build(), true, "web connection opens"),
        (web.clone(), true, "a 1400-byte segment"),
        (icmp_error(router, v4(IN), (3, 4), 1280, &web, 548), true, "fragmentation needed for it (PMTU discovery)"),
        (icmp_error(router, v4(IN), (11, 0), 0, &web, 28), true, "time exceeded for it"),
        (icmp_error(router, v4(IN), (5, 0), 0, &web, 28), false, "a redirect is no error: decided by the rules"),
        (web6.clone(), true, "ipv6 connection opens"),
        (icmp_error(router6, v6a, (2, 0), 1280, &web6, 48), true, "icmpv6 packet too big for it"),
        (icmp_error(router6, v6a, (1, 4), 0, &web6, 4), false, "a quote cut short names no connection"),
        (FrameSpec::tcp4(OUT, 80, IN, 40000, RST).build(), true, "reset closes the web connection"),
        (icmp_error(router, v4(IN), (3, 4), 1280, &web, 548), false, "its errors are then decided by the rules"),
    ];
    let mut arp = vec![0xffu8; 42];
    arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
    for workers in [1, 2] {
        for batch in [1, 3, 32] {
            // An error goes to the worker of the connection it quotes,
            // which reads its own writes to the index at once: no gap is
            // needed between a connection's packets and its errors.
            let gap = 0;
            let mut trace: Vec<(&[u8], bool, &str)> = Vec::new();
            for (frame, pass, why) in &cases {
                trace.push((frame, *pass, why));
                trace.extend(std::iter::repeat_n((arp.as_slice(), false, "arp"), gap));
            }
            let frames: Vec<Vec<u8>> = trace.iter().map(|c| c.0.to_vec()).collect();
            let (report, out) = run_host(RULES, vec![nf("firewall")], &stamped(&frames), |c, _| {
                c.batch_size = batch;
                c.workers = workers;
            });
            let mut at = 0;
            for (frame, pass, why) in &trace {
                let passed = out.get(at).is_some_and(|o| o == frame);
                assert_eq!(
                    passed,
                    *pass,
                    "{workers} workers, batch {batch}: '{why}' should {}pass",
                    if *pass { "" } else { "not " }
                );
                at += usize::from(passed);
            }
            assert_eq!(at, out.len());
            assert_eq!(report.nfs[0].meters.traps, 0);
        }
    }
}

#[test]
fn related_icmp_can_be_turned_off() {
    let dns = FrameSpec::udp4(IN, 5353, [192, 0, 2, 53], 53).build();
    let error = icmp_error(IpAddr128::from_v4([192, 0, 2, 53]), IpAddr128::from_v4(IN), (3, 3), 0, &dns, 28);
    let config = RULES.replace("default = \"deny\"", "default = \"deny\"\nrelated-icmp = false");
    let (_, out) = run_host(&config, vec![nf("firewall")], &stamped(&[dns.clone(), error]), |_, _| {});
    assert_eq!(out, vec![dns]);
}

/// An ICMPv6 message of type `kind` (code 0) from `src` to `dst` with hop
/// limit `hops`, its checksum right.
fn icmpv6(src: [u8; 16], dst: [u8; 16], kind: u8, hops: u8) -> Vec<u8> {
    let (src, dst) = (IpAddr128::from_v6(src), IpAddr128::from_v6(dst));
    // Built as an echo request, then retyped with its checksum updated.
    let transport = Transport::IcmpEcho { ident: 0 };
    let mut f = FrameSpec { src, dst, transport, payload: vec![0; 20], vlan: None }.build();
    let parsed = sluice_wire::parse(&f);
    let (l3, l4) = (usize::from(parsed.l3_offset.unwrap()), usize::from(parsed.l4_offset.unwrap()));
    f[l3 + 7] = hops;
    let old = u16::from_be_bytes([f[l4], f[l4 + 1]]);
    let c = sluice_wire::checksum::update_u16(u16::from_be_bytes([f[l4 + 2], f[l4 + 3]]), old, u16::from(kind) << 8);
    f[l4] = kind;
    f[l4 + 1] = 0;
    f[l4 + 2..l4 + 4].copy_from_slice(&c.to_be_bytes());
    f
}

#[test]
fn link_protocols_pass_without_a_rule_unless_turned_off() {
    let link_local = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5];
    let global = [0x20, 1, 0xd, 0xb8, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5];
    let solicited = [0xff, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, 0, 0, 7];
    let (all_nodes, all_routers, mld_routers) = (
        [0xff, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
        [0xff, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2],
        [0xff, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x16],
    );
    let arp = |reply, vlan| sluice_wire::build::arp4([10, 0, 0, 5], [10, 0, 0, 7], reply, vlan);
    let mut bad_arp = arp(false, None);
    bad_arp[16..18].copy_from_slice(&0x86ddu16.to_be_bytes()); // for IPv6
    let cases: Vec<(Vec<u8>, bool, &str)> = vec![
        (arp(false, None), true, "an arp request"),
        (arp(true, Some(42)), true, "an arp reply behind a vlan tag"),
        (bad_arp, false, "arp for another protocol is other non-ip"),
        (icmpv6(global, solicited, 135, 255), true, "a neighbour solicitation"),
        (icmpv6([0; 16], solicited, 135, 255), true, "a duplicate address detection probe"),
        (icmpv6(global, link_local, 136, 255), true, "a neighbour advertisement"),
        (icmpv6(link_local, all_routers, 133, 255), true, "a router solicitation"),
        (icmpv6(link_local, all_nodes, 134, 255), true, "a router advertisement"),
        (icmpv6(global, solicited, 135, 64), false, "a solicitation from beyond the link"),
        (icmpv6(link_local, global, 137, 255), false, "a redirect is decided by the rules"),
        (icmpv6([0; 16], mld_routers, 143, 1), true, "a multicast listener report"),
        (icmpv6(link_local, all_nodes, 130, 1), true, "a multicast listener query"),
        (icmpv6(global, mld_routers, 143, 1), false, "a listener report from a global address"),
        (icmpv6(link_local, mld_routers, 143, 2), false, "a listener report with hop limit 2"),
    ];
    let frames: Vec<Vec<u8>> = cases.iter().map(|c| c.0.clone()).collect();
    let (report, out) = run_host(RULES, vec![nf("firewall")], &stamped(&frames), |_, _| {});
    let expected: Vec<Vec<u8>> = cases.iter().filter(|c| c.1).map(|c| c.0.clone()).collect();
    for (frame, pass, why) in &cases {
        assert_eq!(out.contains(frame), *pass, "'{why}' should {}pass", if *pass { "" } else { "not " });
    }
    assert_eq!(out, expected);
    // Counted under their own key of `rule-hits`, and they open nothing.
    let table = |name: &str| report.nfs[0].tables.iter().find(|t| t.spec.name == name).unwrap();
    let link_hits = table("rule-hits").values.iter().find(|v| v.0 == u64::from(u32::MAX) - 2).map(|v| v.1);
    assert_eq!(link_hits, Some(expected.len() as u64));
    assert_eq!(table("connections").entries, 0);

    // Turned off, ARP is non-IP (dropped by default) and the ICMPv6
    // messages are decided by the rules (none allows them).
    let config = RULES.replace("default = \"deny\"", "default = \"deny\"\nallow-link-protocols = false");
    let (_, out) = run_host(&config, vec![nf("firewall")], &stamped(&frames), |_, _| {});
    assert!(out.is_empty(), "{} passed", out.len());
}

#[test]
fn first_fragments_and_long_datagrams_are_decided_by_the_rules_like_whole_packets() {
    use crate::nat::{datagram, ipv4_frame};
    let dns_server = [192, 0, 2, 53];
    let fragment = |dst_port: u16| {
        let whole = FrameSpec::udp4(IN, 5353, dns_server, dst_port).with_payload(vec![7; 3000]).build();
        ipv4_frame(IN, dns_server, 17, 0x2000, &datagram(&whole)[20..1500])
    };
    let long = FrameSpec::udp4(IN, 5354, dns_server, 53).with_payload(vec![8; 3000]).build();
    let cases = [
        (fragment(53), true, "first fragment to an allowed port"),
        (fragment(54), false, "first fragment to a port no rule allows"),
        (long.clone(), true, "a whole 3028-byte datagram"),
    ];
    let frames: Vec<Vec<u8>> = cases.iter().map(|c| c.0.clone()).collect();
    let (_, out) = run_host(RULES, vec![nf("firewall")], &stamped(&frames), |_, _| {});
    let expected: Vec<Vec<u8>> = cases.iter().filter(|c| c.1).map(|c| c.0.clone()).collect();
    assert_eq!(out, expected, "{:?}", cases.iter().map(|c| (c.1, c.2)).collect::<Vec<_>>());
}
