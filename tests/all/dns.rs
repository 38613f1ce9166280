//! The DNS filter: blocked names (and subdomains) answered with NXDOMAIN
//! or dropped; everything else untouched.

use sluice_tests::{nf, run_host, stamped};
use sluice_wire::IpAddr128;
use sluice_wire::build::{FrameSpec, Transport};
use sluice_wire::checksum::{pseudo_header_v4, pseudo_header_v6};
use sluice_wire::ipv4::Ipv4Packet;
use sluice_wire::udp::UdpPacket;

fn query_payload(id: u16, name: &str) -> Vec<u8> {
    let mut m = id.to_be_bytes().to_vec();
    m.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.split('.') {
        m.push(label.len() as u8);
        m.extend_from_slice(label.as_bytes());
    }
    m.extend_from_slice(&[0, 0, 1, 0, 1]);
    m
}

fn q4(id: u16, name: &str) -> Vec<u8> {
    FrameSpec::udp4([10, 0, 0, 5], 40000 + id, [192, 0, 2, 53], 53).with_payload(query_payload(id, name)).build()
}

fn q6(id: u16, name: &str) -> Vec<u8> {
    FrameSpec {
        src: IpAddr128::from_v6([0x20, 1, 0xd, 0xb8, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5]),
        dst: IpAddr128::from_v6([0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x53]),
        transport: Transport::Udp { src_port: 40000 + id, dst_port: 53 },
        payload: query_payload(id, name),
        vlan: None,
    }
    .build()
}

fn run_filter(action: &str, frames: &[Vec<u8>]) -> (sluice_host::Report, Vec<Vec<u8>>) {
    let config =
        format!("[nf.dns-filter.config]\naction = \"{action}\"\nblock = [\"ads.example\", \"Malware.Test.\"]\n");
    run_host(&config, vec![nf("dns-filter")], &stamped(frames), |_, _| {})
}

#[test]
fn blocked_names_get_nxdomain_back_to_the_client() {
    let frames =
        vec![q4(1, "www.example.org"), q4(2, "tracker.ads.example"), q6(3, "malware.test"), q4(4, "notads.example")];
    let (r, out) = run_filter("nxdomain", &frames);
    assert_eq!(out.len(), 4);
    assert_eq!(out[0], frames[0]);
    assert_eq!(out[3], frames[3], "'notads.example' is not a subdomain of 'ads.example'");
    assert_eq!(r.nfs[0].meters.rewritten, 2);

    // IPv4 answer: addresses and ports swapped, NXDOMAIN, checksums valid.
    let l = sluice_wire::parse(&out[1]);
    let k = l.key.unwrap();
    assert_eq!((k.src, k.src_port), (IpAddr128::from_v4([192, 0, 2, 53]), 53));
    assert_eq!((k.dst, k.dst_port), (IpAddr128::from_v4([10, 0, 0, 5]), 40002));
    let ip = Ipv4Packet::new_checked(&out[1][14..]).unwrap();
    assert!(ip.verify_checksum());
    let udp = UdpPacket::new_checked(&out[1][34..]).unwrap();
    assert!(udp.verify_checksum(pseudo_header_v4(ip.src(), ip.dst(), 17, udp.len())));
    let dns = udp.payload();
    assert_eq!(&dns[..2], &2u16.to_be_bytes(), "same id");
    assert_eq!(dns[2] & 0x80, 0x80, "QR set");
    assert_eq!(dns[3] & 0x0f, 3, "NXDOMAIN");

    // IPv6 answer.
    let l = sluice_wire::parse(&out[2]);
    let k = l.key.unwrap();
    assert_eq!(k.src_port, 53);
    let udp = UdpPacket::new_checked(&out[2][54..]).unwrap();
    assert!(udp.verify_checksum(pseudo_header_v6(k.src.to_v6(), k.dst.to_v6(), 17, u32::from(udp.len()))));

    let names: Vec<&str> = r.events.iter().map(|e| e.fields["name"].as_str()).collect();
    assert_eq!(names, ["tracker.ads.example", "malware.test"]);
}

#[test]
fn drop_mode_drops_blocked_queries() {
    let frames = vec![
        q4(1, "a.ads.example"),
        q4(2, "ok.example"),
        FrameSpec::udp4([1, 1, 1, 1], 9, [2, 2, 2, 2], 53).with_payload(b"not dns at all".to_vec()).build(),
    ];
    let (r, out) = run_filter("drop", &frames);
    assert_eq!(out, frames[1..].to_vec());
    assert_eq!(r.nfs[0].meters.dropped, 1);
}

/// The answer leaves by the port its query came in on (verdict port
/// ingress + 1), alone and with a pass-through NF after the filter, whose
/// default output keeps the port the filter chose; other queries go to
/// the default output.
#[test]
fn answers_go_back_out_of_the_query_port_also_through_a_chain() {
    use sluice_runtime::{Chain, Fate, NfLimits, NfSpec, RawPacket, Runtime, RuntimeConfig};
    let runtime = Runtime::new(RuntimeConfig::default()).unwrap();
    let spec = |name: &str, config: &str| NfSpec {
        module: runtime.load_file(&nf(name)).unwrap(),
        config: config.as_bytes().into(),
        limits: NfLimits::default(),
        owner: None,
    };
    let filter = r#"{"block":["ads.example"]}"#;
    let frames = [
        (0u16, q4(1, "ads.example")),
        (0, q4(2, "www.example.org")),
        (1, q6(3, "x.ads.example")),
        (3, q4(4, "ads.example")),
    ];
    let raw: Vec<RawPacket<'_>> = frames
        .iter()
        .map(|(port, f)| RawPacket { data: f, wire_len: f.len() as u32, timestamp_ns: 1, ingress_port: *port })
        .collect();
    let want = [Fate::Forward(1), Fate::Forward(0), Fate::Forward(2), Fate::Forward(4)];
    for chain in [vec![spec("dns-filter", filter)], vec![spec("dns-filter", filter), spec("counter", "{}")]] {
        let mut chain = Chain::new(&runtime, &chain).unwrap();
        let fates: Vec<Fate> = chain.process(&raw).iter().map(|r| r.fate).collect();
        assert_eq!(fates, want);
    }
}
