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

/// The three fragments of a 3,000-byte UDP datagram of flow `i` (its
/// own source port and IP identification), in order.
fn flow_fragments(i: u16) -> Vec<Vec<u8>> {
    let mut whole = FrameSpec::udp4(CLIENT, 6000 + i, SERVER, 53).with_payload(vec![i as u8; 3000]).build();
    whole[14 + 4..14 + 6].copy_from_slice(&(100 + i).to_be_bytes());
    whole[14 + 6] = 0;
    Ipv4Packet::new_unchecked(&mut whole[14..]).fill_checksum();
    split_ipv4(&whole, 1500).unwrap()
}

/// `run` on two workers: the fragments of many datagrams, each first
/// fragment on the worker of its flow, and every later fragment sent
/// where its first went, so all of them leave translated.
#[test]
fn a_run_on_two_workers_sends_later_fragments_where_their_first_went() {
    let config = format!("[nf.firewall]\nconfig-text = '{FIREWALL}'\n[nf.nat]\nconfig-text = '{NAT}'\n");
    let frames: Vec<Vec<u8>> = (0..20).flat_map(flow_fragments).collect();
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

/// The frames that left for `results` (fragments, rewrites or the
/// originals), in order.
fn frames_out(results: &[PacketResult], sent: &[(u16, Vec<u8>)]) -> Vec<Vec<u8>> {
    results
        .iter()
        .zip(sent)
        .filter(|(r, _)| matches!(r.fate, Fate::Forward(_)))
        .flat_map(|(r, (_, f))| r.frames(f).map(<[u8]>::to_vec).collect::<Vec<_>>())
        .collect()
}

/// The UDP datagram the fragments in `frames` carry, checked whole.
fn udp_of(frames: &[Vec<u8>]) -> (Vec<u8>, u16, u16) {
    let mut d = sluice_wire::reassembly::Datagram::default();
    let mut whole = None;
    for f in frames {
        let facts = sluice_wire::fragment::inspect(f).unwrap();
        if d.add(f, &facts).unwrap() == sluice_wire::reassembly::Added::Complete {
            whole = d.assemble();
        }
    }
    let whole = whole.expect("the fragments make a whole datagram");
    let ip = Ipv4Packet::new_checked(&whole[14..]).unwrap();
    let udp = sluice_wire::udp::UdpPacket::new_checked(ip.payload()).unwrap();
    let pseudo = sluice_wire::checksum::pseudo_header_v4(ip.src(), ip.dst(), 17, ip.payload().len() as u16);
    assert!(udp.verify_checksum(pseudo), "the UDP checksum holds over the whole datagram");
    (ip.payload().to_vec(), udp.src_port(), udp.dst_port())
}

fn reassembling(outside: &[u16]) -> Chain {
    let mut chain = firewall_nat(outside);
    chain.set_fragment_mode(sluice_runtime::fragments::FragmentMode::Reassemble);
    chain
}

#[test]
fn reassembled_datagrams_run_the_nat_whole_and_leave_cut_as_they_came() {
    let mut chain = reassembling(&[OUTSIDE]);
    let (whole, frags) = fragments(3000, 77);
    // The last fragment first, over two batches: nothing leaves until the
    // datagram is whole, then its fragments leave in its place.
    let first: Vec<_> = [&frags[2], &frags[1]].iter().map(|f| (INSIDE, (*f).clone())).collect();
    let out = send(&mut chain, &first);
    assert!(out.iter().all(|r| r.fate == Fate::Reassembling), "{out:?}");
    let last = [(INSIDE, frags[0].clone())];
    let out = send(&mut chain, &last);
    assert_eq!(out[0].fate, Fate::Forward(0));
    let left = frames_out(&out, &last);
    assert_eq!(left.len(), 3, "cut again as it came");
    for (f, came) in left.iter().zip(&frags) {
        assert_eq!(f.len(), came.len(), "no fragment larger than the largest that came");
        let ip = Ipv4Packet::new_checked(&f[14..]).unwrap();
        assert_eq!((ip.src(), ip.ident()), (PUBLIC, 77));
        assert!(ip.verify_checksum());
    }
    let (payload, sport, _) = udp_of(&left);
    assert_eq!(payload.len(), Ipv4Packet::new_checked(&whole[14..]).unwrap().payload().len());
    assert!((2000..2100).contains(&sport), "the NAT translated the port of the whole datagram: {sport}");
    let c = chain.counters();
    assert_eq!((c.fragments_held, c.datagrams_reassembled, c.dropped()), (2, 1, 0), "{c:?}");
    assert_eq!(chain.reassembly_bytes(), 0);

    // A fragmented reply to the public port runs the chain in reverse,
    // reassembled: it comes back to the client whole-checksummed.
    let mut reply = FrameSpec::udp4(SERVER, 53, PUBLIC, sport).with_payload(vec![0x5a; 2500]).build();
    reply[14 + 6] = 0;
    Ipv4Packet::new_unchecked(&mut reply[14..]).fill_checksum();
    let back: Vec<_> = split_ipv4(&reply, 1400).unwrap().into_iter().map(|f| (OUTSIDE, f)).collect();
    let out = send(&mut chain, &back);
    let left = frames_out(&out, &back);
    assert_eq!(left.len(), back.len(), "{out:?}");
    let ip = Ipv4Packet::new_checked(&left[0][14..]).unwrap();
    assert_eq!(ip.dst(), CLIENT);
    assert_eq!(udp_of(&left).2, 5353);
}

#[test]
fn reassembly_refuses_what_contradicts_a_datagram_and_counts_it() {
    let mut chain = reassembling(&[OUTSIDE]);
    let (_, frags) = fragments(3000, 9);
    // A duplicate is refused; the datagram still completes.
    let sent: Vec<_> = [&frags[0], &frags[0], &frags[1], &frags[2]].iter().map(|f| (INSIDE, (*f).clone())).collect();
    let out = send(&mut chain, &sent);
    assert_eq!(
        out.iter().map(|r| r.fate).collect::<Vec<_>>(),
        [Fate::Reassembling, Fate::Refused, Fate::Reassembling, Fate::Forward(0)]
    );
    // An overlapping fragment throws its datagram away.
    let (_, frags) = fragments(3000, 10);
    let mut overlap = frags[1].clone();
    overlap[14 + 7] -= 1;
    Ipv4Packet::new_unchecked(&mut overlap[14..]).fill_checksum();
    let sent = [(INSIDE, frags[0].clone()), (INSIDE, overlap), (INSIDE, frags[1].clone()), (INSIDE, frags[2].clone())];
    let out = send(&mut chain, &sent);
    assert_eq!(out[1].fate, Fate::Refused);
    assert!(out[2..].iter().all(|r| r.fate == Fate::Reassembling), "a new datagram starts, without its first fragment");
    let c = chain.counters();
    assert_eq!((c.fragments_refused, c.fragments_discarded, c.datagrams_reassembled), (2, 1, 1), "{c:?}");
    // Incomplete datagrams are forgotten after 30 s of packet time.
    let later = RawPacket {
        data: &frags[0],
        wire_len: frags[0].len() as u32,
        timestamp_ns: T0 + 31_000_000_000,
        ingress_port: INSIDE,
    };
    let other = fragments(3000, 11).1;
    let raw = [RawPacket { data: &other[0], ..later }];
    chain.process(&raw);
    assert_eq!(chain.counters().fragments_discarded, 3, "{:?}", chain.counters());
    // Switching back to following drops what is held.
    chain.set_fragment_mode(sluice_runtime::fragments::FragmentMode::Follow);
    assert_eq!((chain.counters().fragments_discarded, chain.reassembly_bytes()), (4, 0));
}

/// `run --fragments reassemble` on two workers: every datagram is
/// reassembled on one worker and leaves as three fragments.
#[test]
fn a_run_reassembles_on_two_workers() {
    let config = format!(
        "fragments = \"reassemble\"\n[nf.firewall]\nconfig-text = '{FIREWALL}'\n[nf.nat]\nconfig-text = '{NAT}'\n"
    );
    let frames: Vec<Vec<u8>> = (0..20).flat_map(|i| flow_fragments(i).into_iter().rev()).collect();
    let stamped = sluice_tests::stamped(&frames);
    let (report, out) = sluice_tests::run_host(&config, vec![nf("firewall"), nf("nat")], &stamped, |c, _| {
        c.workers = 2;
    });
    let c = report.chain.counters;
    assert_eq!((c.datagrams_reassembled, c.fragments_held, c.dropped()), (20, 40, 0), "{:?}", report.chain);
    assert_eq!(report.chain.fragments, sluice_runtime::fragments::FragmentMode::Reassemble);
    assert_eq!(out.len(), 60);
    for datagram in out.chunks(3) {
        let frames: Vec<Vec<u8>> = datagram.to_vec();
        assert_eq!(Ipv4Packet::new_checked(&frames[0][14..]).unwrap().src(), PUBLIC);
        udp_of(&frames);
    }
}
