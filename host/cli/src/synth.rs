//! Synthetic traffic: a reproducible "office edge" trace for demos, tests
//! and benchmarks.
//!
//! Inside hosts (10.0.0.0/24) open web connections (full TCP handshakes,
//! data, FIN teardown), resolve names over UDP/53 and ping; outside hosts
//! scan inside ports (SSH, telnet, RDP) and send unsolicited UDP; a few
//! IPv6 web flows and a few damaged frames are mixed in. With the demo
//! firewall config, the inside-initiated traffic and its replies pass and
//! everything outside-initiated is dropped.

use sluice_pcap::{PcapError, PcapSink};
use sluice_wire::IpAddr128;
use sluice_wire::build::{FrameSpec, Transport};
use sluice_wire::tcp::flags::{ACK, FIN, PSH, SYN};
use std::path::Path;

/// A small deterministic PRNG (xorshift64*): the trace must be the same on
/// every machine for a given seed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// Seeded generator (seed 0 is replaced by a constant).
    pub fn new(seed: u64) -> Self {
        Rng(if seed == 0 { 0x9e37_79b9_7f4a_7c15 } else { seed })
    }

    /// Next value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Value in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// One frame of a synthetic trace with its timestamp.
#[derive(Debug, Clone)]
pub struct Frame {
    /// Packet time, ns.
    pub ts_ns: u64,
    /// Bytes.
    pub data: Vec<u8>,
}

/// Generates `sessions` sessions of mixed traffic.
pub fn office_edge(sessions: usize, seed: u64) -> Vec<Frame> {
    office_edge_vlans(sessions, seed, &[])
}

/// Generates `sessions` sessions of mixed traffic, session `i` on 802.1Q
/// VLAN `vlans[i % len]` (0: untagged; none given: all untagged) — the
/// traffic of several tenants sharing a port.
pub fn office_edge_vlans(sessions: usize, seed: u64, vlans: &[u16]) -> Vec<Frame> {
    let mut rng = Rng::new(seed);
    let mut frames = Vec::new();
    let mut ts: u64 = 1_767_225_600_000_000_000; // 2026-01-01T00:00:00Z
    let tag = std::cell::Cell::new(0u16);
    let push = |frames: &mut Vec<Frame>, f: FrameSpec, ts: &mut u64, rng: &mut Rng| {
        *ts += 1_000 + rng.below(50_000);
        let f = if tag.get() == 0 { f } else { f.with_vlan(tag.get()) };
        frames.push(Frame { ts_ns: *ts, data: f.build() });
    };
    for s in 0..sessions {
        let vlan = if vlans.is_empty() { 0 } else { vlans.get(s % vlans.len()).copied().unwrap_or(0) };
        tag.set(vlan);
        let inside = [10, 0, 0, 10 + (rng.below(200) as u8)];
        let outside = [198, 51, 100, 1 + (rng.below(250) as u8)];
        let eport = 20_000 + (s as u16 % 40_000);
        match rng.below(10) {
            0..=3 => {
                // Web connection: handshake, request, response, teardown.
                let dport = if rng.below(2) == 0 { 80 } else { 443 };
                let c = |fl| FrameSpec::tcp4(inside, eport, outside, dport, fl);
                let r = |fl| FrameSpec::tcp4(outside, dport, inside, eport, fl);
                push(&mut frames, c(SYN), &mut ts, &mut rng);
                push(&mut frames, r(SYN | ACK), &mut ts, &mut rng);
                push(&mut frames, c(ACK), &mut ts, &mut rng);
                push(
                    &mut frames,
                    c(PSH | ACK).with_payload(b"GET / HTTP/1.1\r\nHost: example.net\r\n\r\n".to_vec()),
                    &mut ts,
                    &mut rng,
                );
                let body = 200 + rng.below(1200) as usize;
                push(&mut frames, r(PSH | ACK).with_frame_len(54 + body), &mut ts, &mut rng);
                push(&mut frames, c(FIN | ACK), &mut ts, &mut rng);
                push(&mut frames, r(FIN | ACK), &mut ts, &mut rng);
                push(&mut frames, c(ACK), &mut ts, &mut rng);
            }
            4 | 5 => {
                // DNS query and answer.
                let dns = [192, 0, 2, 53];
                push(
                    &mut frames,
                    FrameSpec::udp4(inside, eport, dns, 53).with_payload(vec![0x12; 32]),
                    &mut ts,
                    &mut rng,
                );
                push(
                    &mut frames,
                    FrameSpec::udp4(dns, 53, inside, eport).with_payload(vec![0x34; 64]),
                    &mut ts,
                    &mut rng,
                );
            }
            6 => {
                // Ping and reply.
                let mut req = FrameSpec::udp4(inside, 0, outside, 0);
                req.transport = Transport::IcmpEcho { ident: eport };
                push(&mut frames, req, &mut ts, &mut rng);
                let mut rep = FrameSpec::udp4(outside, 0, inside, 0);
                rep.transport = Transport::IcmpEchoReply { ident: eport };
                push(&mut frames, rep, &mut ts, &mut rng);
            }
            7 => {
                // Port scan from outside.
                for port in [22u16, 23, 3389] {
                    push(&mut frames, FrameSpec::tcp4(outside, eport, inside, port, SYN), &mut ts, &mut rng);
                }
            }
            8 => {
                // Unsolicited UDP from outside, and an IPv6 web flow.
                push(
                    &mut frames,
                    FrameSpec::udp4(outside, 53, inside, 161).with_payload(vec![0; 40]),
                    &mut ts,
                    &mut rng,
                );
                let a =
                    IpAddr128::from_v6([0x20, 1, 0x0d, 0xb8, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 10 + (s % 200) as u8]);
                let b = IpAddr128::from_v6([0x20, 1, 0x0d, 0xb8, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 80]);
                let spec = |src, dst, sp, dp, fl| FrameSpec {
                    src,
                    dst,
                    transport: Transport::Tcp { src_port: sp, dst_port: dp, flags: fl },
                    payload: Vec::new(),
                    vlan: None,
                };
                push(&mut frames, spec(a, b, eport, 443, SYN), &mut ts, &mut rng);
                push(&mut frames, spec(b, a, 443, eport, SYN | ACK), &mut ts, &mut rng);
                push(&mut frames, spec(a, b, eport, 443, ACK), &mut ts, &mut rng);
            }
            _ => {
                // A damaged packet: an IPv4 datagram whose TCP header is
                // cut after 7 bytes. Its IP header says so (total length
                // 27), so the host hands it to the NFs, which see a
                // transport header they cannot read. (A frame shorter than
                // its IP header says is refused by the host before any NF.)
                let spec = FrameSpec::tcp4(inside, eport, outside, 80, SYN);
                let (spec, tag_len) = if vlan == 0 { (spec, 0) } else { (spec.with_vlan(vlan), 4) };
                let mut f = spec.build();
                f.truncate(14 + tag_len + 20 + 7);
                if let Some(ip) = f.get_mut(14 + tag_len..) {
                    let mut ip = sluice_wire::ipv4::Ipv4Packet::new_unchecked(ip);
                    ip.set_total_len(20 + 7);
                    ip.fill_checksum();
                }
                ts += 1_000;
                frames.push(Frame { ts_ns: ts, data: f });
            }
        }
    }
    frames
}

/// Writes frames to a pcap file.
pub fn write_pcap(path: &Path, frames: &[Frame]) -> Result<u64, PcapError> {
    let mut sink = PcapSink::create(path)?;
    for f in frames {
        sink.write(f.ts_ns, f.data.len() as u32, &f.data)?;
    }
    sink.finish()
}
