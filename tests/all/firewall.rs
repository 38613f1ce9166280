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
        (t(OUT, 443, IN, 40010, ACK), false, "after reset the state is gone"),
        (t(IN, 40000, OUT, 80, FIN | ACK), true, "inside closes"),
        (t(OUT, 80, IN, 40000, FIN | ACK), true, "outside closes"),
        (t(IN, 40000, OUT, 80, ACK), true, "final ack"),
        (t(OUT, 80, IN, 40000, ACK), false, "connection is closed"),
        (t(IN, 40020, OUT, 8080, ACK), false, "mid-stream ack of unknown connection is outside the rule port range"),
        (t(IN, 40021, OUT, 80, ACK), true, "mid-stream ack matching an allow rule passes on the rule"),
        (t(OUT, 80, IN, 40021, ACK), false, "but opens no state for replies"),
        (arp, false, "non-ip is dropped by default"),
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
