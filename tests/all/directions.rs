//! Chains in both directions and IP fragments, through the real firewall
//! and NAT components: replies from the outside run the chain last NF
//! first, later fragments follow their first fragment, and frames cut
//! shorter than their datagram are refused and counted.

use sluice_runtime::{
    Chain, ChainCounters, Fate, NfLimits, NfSpec, PacketResult, RawPacket, Routes, Runtime, RuntimeConfig,
};
use sluice_state::Domain;
use sluice_tests::nf;
use sluice_wire::build::FrameSpec;
use sluice_wire::fragment::split_ipv4;
use sluice_wire::ipv4::Ipv4Packet;
use sluice_wire::tcp::flags::{ACK, SYN};

const INSIDE: u16 = 0;
const OUTSIDE: u16 = 1;
const CLIENT: [u8; 4] = [10, 0, 0, 5];
const SERVER: [u8; 4] = [198, 51, 100, 7];
const PUBLIC: [u8; 4] = [203, 0, 113, 1];
const FIREWALL: &str = r#"{"default":"deny","rules":[{"action":"allow","src":"10.0.0.0/8"}]}"#;
const NAT: &str = r#"{"public-ip":"203.0.113.1","inside":["10.0.0.0/8"],"port-first":2000,"port-count":100}"#;
const T0: u64 = 1_700_000_000_000_000_000;

fn spec(runtime: &Runtime, name: &str, config: &str) -> NfSpec {
    let module = runtime.load_file(&nf(name)).unwrap();
    NfSpec { module, config: config.as_bytes().into(), limits: NfLimits::default(), owner: None }
}

/// firewall -> nat, replies from `outside` ports in reverse.
fn firewall_nat(outside: &[u16]) -> Chain {
    let runtime = Runtime::new(RuntimeConfig::default()).unwrap();
    let specs = [spec(&runtime, "firewall", FIREWALL), spec(&runtime, "nat", NAT)];
    let domains = [Domain::new(), Domain::new()];
    let mut chain = Chain::with_domains(&runtime, &specs, Routes::linear(2), &domains).unwrap();
    chain.set_outside(outside).unwrap();
    chain
}

fn send(chain: &mut Chain, frames: &[(u16, Vec<u8>)]) -> Vec<PacketResult> {
    let raw: Vec<RawPacket<'_>> = frames
        .iter()
        .enumerate()
        .map(|(i, (port, f))| RawPacket {
            data: f,
            wire_len: f.len() as u32,
            timestamp_ns: T0 + i as u64 * 1000,
            ingress_port: *port,
        })
        .collect();
    chain.process(&raw).to_vec()
}

fn bytes(r: &PacketResult, original: &[u8]) -> Vec<u8> {
    r.data.clone().unwrap_or_else(|| original.to_vec())
}

/// The public port the NAT gave a frame that left through it.
fn public_port(frame: &[u8]) -> u16 {
    let ip = Ipv4Packet::new_checked(&frame[14..]).unwrap();
    assert_eq!(ip.src(), PUBLIC, "the connection leaves with the public address");
    u16::from_be_bytes([frame[34], frame[35]])
}

#[test]
fn a_firewall_before_a_nat_carries_a_connection_when_replies_run_the_chain_in_reverse() {
    let mut chain = firewall_nat(&[OUTSIDE]);
    let syn = FrameSpec::tcp4(CLIENT, 20000, SERVER, 80, SYN).build();
    let out = send(&mut chain, &[(INSIDE, syn.clone())]);
    assert_eq!(out[0].fate, Fate::Forward(0));
    let port = public_port(&bytes(&out[0], &syn));

    // The reply comes to the public address: the NAT turns it back first,
    // then the firewall sees the inside address it let out.
    let syn_ack = FrameSpec::tcp4(SERVER, 80, PUBLIC, port, SYN | ACK).build();
    let ack = FrameSpec::tcp4(CLIENT, 20000, SERVER, 80, ACK).build();
    let data = FrameSpec::tcp4(SERVER, 80, PUBLIC, port, ACK).with_payload(vec![1u8; 100]).build();
    let out = send(&mut chain, &[(OUTSIDE, syn_ack.clone()), (INSIDE, ack), (OUTSIDE, data)]);
    assert!(out.iter().all(|r| r.fate == Fate::Forward(0)), "{out:?}");
    let back = bytes(&out[0], &syn_ack);
    let ip = Ipv4Packet::new_checked(&back[14..]).unwrap();
    assert_eq!(ip.dst(), CLIENT);
    assert!(ip.verify_checksum());
    assert_eq!(u16::from_be_bytes([back[36], back[37]]), 20000);

    // A connection opened from the outside is still refused (by the NAT:
    // no binding; the firewall would refuse it too).
    let probe = FrameSpec::tcp4(SERVER, 4444, PUBLIC, port.wrapping_add(1), SYN).build();
    let out = send(&mut chain, &[(OUTSIDE, probe)]);
    assert!(matches!(out[0].fate, Fate::Dropped(_)));
    assert_eq!(chain.outside(), &[OUTSIDE]);
}

#[test]
fn in_one_order_both_ways_the_firewall_refuses_the_replies() {
    // What a chain did before it knew its sides: the SYN-ACK reaches the
    // firewall with the public address, which it never saw leave.
    let mut chain = firewall_nat(&[]);
    let syn = FrameSpec::tcp4(CLIENT, 20000, SERVER, 80, SYN).build();
    let out = send(&mut chain, &[(INSIDE, syn.clone())]);
    let port = public_port(&bytes(&out[0], &syn));
    let syn_ack = FrameSpec::tcp4(SERVER, 80, PUBLIC, port, SYN | ACK).build();
    let out = send(&mut chain, &[(OUTSIDE, syn_ack)]);
    assert_eq!(out[0].fate, Fate::Dropped(0), "dropped by the firewall, first in the chain");
}

#[test]
fn only_a_linear_chain_runs_in_reverse() {
    let runtime = Runtime::new(RuntimeConfig::default()).unwrap();
    let specs = [spec(&runtime, "firewall", FIREWALL), spec(&runtime, "nat", NAT)];
    let routes = vec![Routes { next: Some(1), labels: vec![(1, 1)] }, Routes::default()];
    let mut chain = Chain::with_domains(&runtime, &specs, routes, &[Domain::new(), Domain::new()]).unwrap();
    let e = chain.set_outside(&[OUTSIDE]).unwrap_err().to_string();
    assert!(e.contains("runs one way only"), "{e}");
    chain.set_outside(&[]).unwrap();
}

/// A UDP datagram from the client of `len` payload bytes, cut at 1500.
fn fragments(len: usize, ident: u16) -> (Vec<u8>, Vec<Vec<u8>>) {
    let mut whole = FrameSpec::udp4(CLIENT, 5353, SERVER, 53).with_payload(vec![0xab; len]).build();
    let mut ip = Ipv4Packet::new_unchecked(&mut whole[14..]);
    ip.set_total_len((len + 28) as u16);
    whole[14 + 4..14 + 6].copy_from_slice(&ident.to_be_bytes());
    whole[14 + 6] = 0; // DF clear
    Ipv4Packet::new_unchecked(&mut whole[14..]).fill_checksum();
    let frags = split_ipv4(&whole, 1500).unwrap();
    (whole, frags)
}

#[test]
fn later_fragments_follow_their_first_through_the_nat() {
    let mut chain = firewall_nat(&[OUTSIDE]);
    let (_, frags) = fragments(3000, 77);
    assert_eq!(frags.len(), 3);
    // The first fragment's verdict and rewrites also hold for fragments in
    // later batches.
    let mut out = send(&mut chain, &[(INSIDE, frags[0].clone()), (INSIDE, frags[1].clone())]);
    out.extend(send(&mut chain, &[(INSIDE, frags[2].clone())]));
    for (r, f) in out.iter().zip(&frags) {
        assert_eq!(r.fate, Fate::Forward(0), "{r:?}");
        let b = bytes(r, f);
        let ip = Ipv4Packet::new_checked(&b[14..]).unwrap();
        assert_eq!(ip.src(), PUBLIC, "every fragment leaves with the public address");
        assert!(ip.verify_checksum());
        assert_eq!(ip.ident(), 77);
        assert_eq!(ip.payload().len(), Ipv4Packet::new_checked(&f[14..]).unwrap().payload().len());
    }
    let c = chain.counters();
    assert_eq!(c, ChainCounters { fragments_followed: 2, ..ChainCounters::default() });
}

#[test]
fn fragments_of_a_refused_datagram_and_orphans_are_dropped_and_counted() {
    let mut chain = firewall_nat(&[OUTSIDE]);
    // From the outside to an address the firewall does not allow.
    let mut foreign = FrameSpec::udp4(SERVER, 53, CLIENT, 5353).with_payload(vec![1u8; 3000]).build();
    foreign[14 + 6] = 0;
    Ipv4Packet::new_unchecked(&mut foreign[14..]).fill_checksum();
    let frags = split_ipv4(&foreign, 1500).unwrap();
    let out = send(&mut chain, &frags.iter().map(|f| (OUTSIDE, f.clone())).collect::<Vec<_>>());
    assert!(out.iter().all(|r| matches!(r.fate, Fate::Dropped(_))), "{out:?}");

    // A later fragment whose first never came.
    let (_, frags) = fragments(3000, 99);
    let out = send(&mut chain, &[(INSIDE, frags[2].clone())]);
    assert_eq!(out[0].fate, Fate::Refused);
    let c = chain.counters();
    assert_eq!((c.fragments_followed, c.fragments_unmatched), (2, 1));
}

#[test]
fn a_frame_shorter_than_its_datagram_is_refused_unless_a_capture_says_it_was_cut() {
    let mut chain = firewall_nat(&[OUTSIDE]);
    let (whole, _) = fragments(3000, 5);
    let cut = whole[..1982].to_vec();
    // Received whole (wire length = bytes): a datagram that lost its tail.
    let out = send(&mut chain, &[(INSIDE, cut.clone())]);
    assert_eq!(out[0].fate, Fate::Refused);
    assert_eq!(chain.counters().refused_cut_short, 1);
    // A capture with a snap length: the NF sees a truncated packet.
    let raw = [RawPacket { data: &cut, wire_len: whole.len() as u32, timestamp_ns: T0, ingress_port: INSIDE }];
    let r = chain.process(&raw).to_vec();
    assert_ne!(r[0].fate, Fate::Refused);
    assert_eq!(chain.counters().refused_cut_short, 1);
}

/// `run` on two workers: the fragments of many datagrams, each first
/// fragment on the worker of its flow, and every later fragment sent
/// where its first went, so all of them leave translated.
#[test]
fn a_run_on_two_workers_sends_later_fragments_where_their_first_went() {
    let config = format!("[nf.firewall]\nconfig-text = '{FIREWALL}'\n[nf.nat]\nconfig-text = '{NAT}'\n");
    let mut frames = Vec::new();
    for i in 0..20u16 {
        let mut whole = FrameSpec::udp4(CLIENT, 6000 + i, SERVER, 53).with_payload(vec![i as u8; 3000]).build();
        whole[14 + 4..14 + 6].copy_from_slice(&(100 + i).to_be_bytes());
        whole[14 + 6] = 0;
        Ipv4Packet::new_unchecked(&mut whole[14..]).fill_checksum();
        frames.extend(split_ipv4(&whole, 1500).unwrap());
    }
    let stamped = sluice_tests::stamped(&frames);
    let (report, out) = sluice_tests::run_host(&config, vec![nf("firewall"), nf("nat")], &stamped, |c, _| {
        c.workers = 2;
    });
    assert_eq!(report.chain.counters.fragments_followed, 40, "{:?}", report.chain);
    assert_eq!(report.chain.counters.fragments_unmatched, 0);
    assert_eq!(out.len(), 60);
    for f in &out {
        let ip = Ipv4Packet::new_checked(&f[14..]).unwrap();
        assert_eq!(ip.src(), PUBLIC);
        assert!(ip.verify_checksum());
    }
}
