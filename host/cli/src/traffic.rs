//! Test traffic written as text, one packet per line, turned into frames
//! with correct lengths and checksums (`sluice-host synth --from`, and the
//! `input.txt` of an NF project's test case):
//!
//! ```text
//! # time  [vlan N]  proto  source > destination  [options]
//! 0.000  tcp  10.0.0.5:40000 > 93.184.216.34:80  flags S
//! 0.010  tcp  93.184.216.34:80 > 10.0.0.5:40000  flags SA
//! 0.020  udp  10.0.0.5:5353 > 8.8.8.8:53  payload "example"
//! 0.030  icmp 10.0.0.5 > 10.0.0.9  ttl 1
//! 0.040  vlan 100  tcp  [2001:db8::1]:443 > [2001:db8::2]:5555  flags R
//! 1.000  tcp  10.0.1.* :* > 10.0.0.80:22  flags S  repeat 500 every 0.001
//! ```
//!
//! - time: seconds (a decimal), or `+S` after the previous line's packet.
//! - proto: `tcp`, `udp`, `icmp` (echo request), `icmp-reply`, `arp`
//!   (`arp 10.0.0.5 > 10.0.0.1`: 10.0.0.5 asks who has 10.0.0.1) or
//!   `arp-reply` (`arp-reply 10.0.0.1 > 10.0.0.5`: the answer).
//! - addresses: IPv4, or IPv6 in brackets; ports after `:` (TCP and UDP).
//! - options: `flags` (TCP: S, A, F, R, P, U, E, C; default none), `ttl N`
//!   (hop limit in IPv6; default 64), `payload "text"` (with `\"`, `\\`,
//!   `\n` escapes) or `hex 0a0b…` or `len N` (the whole frame, padded),
//!   `repeat N` (N packets, `every S` seconds apart, default 0.000001).
//! - `*` in a repeated line: a port `*` is 1024 + k on the k-th repetition
//!   (from 0), an IPv4 address's last octet `*` is 1 + k mod 254; enough
//!   for a SYN flood, a port scan or a spoofed-source storm in one line.
//! - `#` starts a comment; blank lines are skipped.

use crate::synth::Frame;
use sluice_wire::build::{FrameSpec, Transport};
use sluice_wire::flow::IpAddr128;
use std::net::IpAddr;

/// Most packets one file may describe (repeats included).
pub const MAX_PACKETS: u64 = 10_000_000;

/// A line that does not describe a packet.
#[derive(Debug, thiserror::Error)]
#[error("line {line}: {reason}")]
pub struct TrafficError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong with it, and what is expected.
    pub reason: String,
}

/// The frames `text` describes, in its order.
pub fn parse(text: &str) -> Result<Vec<Frame>, TrafficError> {
    let mut frames = Vec::new();
    let mut last_ns = 0u64;
    for (n, raw) in text.lines().enumerate() {
        let line = n + 1;
        let fail = |reason: String| TrafficError { line, reason };
        let content = strip_comment(raw);
        if content.trim().is_empty() {
            continue;
        }
        let tokens = tokenize(content).map_err(fail)?;
        let parsed = Line::parse(&tokens).map_err(fail)?;
        let start = if parsed.relative { last_ns.saturating_add(parsed.time_ns) } else { parsed.time_ns };
        if frames.len() as u64 + parsed.repeat > MAX_PACKETS {
            return Err(fail(format!("more than {MAX_PACKETS} packets in one file")));
        }
        for k in 0..parsed.repeat {
            let ts_ns = start.saturating_add(k.saturating_mul(parsed.every_ns));
            frames.push(Frame { ts_ns, data: parsed.frame(k) });
            last_ns = ts_ns;
        }
    }
    Ok(frames)
}

/// The line up to a `#` outside quotes.
fn strip_comment(line: &str) -> &str {
    let mut quoted = false;
    let mut escaped = false;
    for (i, c) in line.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            '#' if !quoted => return line.get(..i).unwrap_or(line),
            _ => {}
        }
    }
    line
}

/// Whitespace-separated words; a quoted word keeps its spaces (with `\"`,
/// `\\` and `\n` escapes) and comes back marked as quoted.
fn tokenize(line: &str) -> Result<Vec<(String, bool)>, String> {
    let mut out = Vec::new();
    let mut chars = line.chars().peekable();
    while let Some(&c) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
        } else if c == '"' {
            chars.next();
            let mut s = String::new();
            loop {
                match chars.next() {
                    None => return Err("a quoted payload is not closed with \"".into()),
                    Some('"') => break,
                    Some('\\') => match chars.next() {
                        Some('n') => s.push('\n'),
                        Some('t') => s.push('\t'),
                        Some(e @ ('"' | '\\')) => s.push(e),
                        other => {
                            return Err(format!("unknown escape \\{}", other.map(String::from).unwrap_or_default()));
                        }
                    },
                    Some(c) => s.push(c),
                }
            }
            out.push((s, true));
        } else {
            let mut s = String::new();
            while let Some(&c) = chars.peek() {
                if c.is_whitespace() || c == '"' {
                    break;
                }
                s.push(c);
                chars.next();
            }
            out.push((s, false));
        }
    }
    Ok(out)
}

/// An endpoint: an address (maybe with `*` as the last IPv4 octet) and a port (maybe `*`).
#[derive(Debug, Clone, Copy)]
struct Endpoint {
    addr: IpAddr,
    wild_octet: bool,
    port: Option<Port>,
}

#[derive(Debug, Clone, Copy)]
enum Port {
    Fixed(u16),
    Counting,
}

impl Endpoint {
    fn parse(s: &str) -> Result<Endpoint, String> {
        let bad = || format!("'{s}' is not an address: write 10.0.0.1, 10.0.0.1:80, 10.0.0.*:* or [2001:db8::1]:80");
        let (addr, port) = if let Some(rest) = s.strip_prefix('[') {
            let (a, after) = rest.split_once(']').ok_or_else(bad)?;
            (a, after.strip_prefix(':'))
        } else {
            match s.rsplit_once(':') {
                Some((a, p)) => (a, Some(p)),
                None => (s, None),
            }
        };
        let port = match port {
            None => None,
            Some("*") => Some(Port::Counting),
            Some(p) => Some(Port::Fixed(p.parse().map_err(|_| format!("port '{p}' is not 0-65535 or *"))?)),
        };
        let (addr, wild_octet) = match addr.strip_suffix(".*") {
            Some(prefix) => (format!("{prefix}.0").parse::<IpAddr>().map_err(|_| bad())?, true),
            None => (addr.parse::<IpAddr>().map_err(|_| bad())?, false),
        };
        if wild_octet && addr.is_ipv6() {
            return Err(bad());
        }
        Ok(Endpoint { addr, wild_octet, port })
    }

    fn addr_at(&self, k: u64) -> IpAddr128 {
        match self.addr {
            IpAddr::V4(a) if self.wild_octet => {
                let mut o = a.octets();
                o[3] = u8::try_from(1 + k % 254).unwrap_or(1);
                IpAddr128::from_v4(o)
            }
            a => IpAddr128::from(a),
        }
    }

    fn port_at(&self, k: u64) -> u16 {
        match self.port {
            None => 0,
            Some(Port::Fixed(p)) => p,
            Some(Port::Counting) => u16::try_from(1024 + k % (65536 - 1024)).unwrap_or(1024),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Proto {
    Tcp,
    Udp,
    Icmp,
    IcmpReply,
    Arp,
    ArpReply,
}

/// One line, parsed.
#[derive(Debug)]
struct Line {
    time_ns: u64,
    relative: bool,
    vlan: Option<u16>,
    proto: Proto,
    src: Endpoint,
    dst: Endpoint,
    flags: u8,
    ttl: Option<u8>,
    payload: Vec<u8>,
    frame_len: Option<usize>,
    repeat: u64,
    every_ns: u64,
}

fn seconds(s: &str) -> Result<u64, String> {
    let v: f64 = s.parse().map_err(|_| format!("'{s}' is not a time in seconds (e.g. 0.25)"))?;
    if !(0.0..=1.0e9).contains(&v) {
        return Err(format!("time {s} is out of range (0 to 10^9 seconds)"));
    }
    Ok((v * 1e9).round() as u64)
}

fn tcp_flags(s: &str) -> Result<u8, String> {
    s.chars().try_fold(0u8, |acc, c| {
        let bit = match c.to_ascii_uppercase() {
            'F' => 0x01,
            'S' => 0x02,
            'R' => 0x04,
            'P' => 0x08,
            'A' => 0x10,
            'U' => 0x20,
            'E' => 0x40,
            'C' => 0x80,
            other => return Err(format!("TCP flag '{other}' is not one of S A F R P U E C")),
        };
        Ok(acc | bit)
    })
}

fn hex(s: &str) -> Result<Vec<u8>, String> {
    let s = s.trim_start_matches("0x");
    if !s.len().is_multiple_of(2) {
        return Err(format!("hex '{s}' has an odd number of digits"));
    }
    (0..s.len())
        .step_by(2)
        .map(|i| {
            s.get(i..i + 2).and_then(|b| u8::from_str_radix(b, 16).ok()).ok_or_else(|| format!("'{s}' is not hex"))
        })
        .collect()
}

impl Line {
    fn parse(tokens: &[(String, bool)]) -> Result<Line, String> {
        let mut it = tokens.iter().map(|(s, q)| (s.as_str(), *q)).peekable();
        let mut next = |what: &str| it.next().ok_or_else(|| format!("missing {what}"));
        let (time, _) = next("the time")?;
        let (relative, time) = match time.strip_prefix('+') {
            Some(t) => (true, t),
            None => (false, time),
        };
        let time_ns = seconds(time)?;
        let (mut word, _) = next("the protocol")?;
        let mut vlan = None;
        if word == "vlan" {
            let (id, _) = next("the VLAN id")?;
            let id: u16 = id.parse().map_err(|_| format!("VLAN '{id}' is not 1-4094"))?;
            if !(1..=4094).contains(&id) {
                return Err(format!("VLAN {id} is not 1-4094"));
            }
            vlan = Some(id);
            word = next("the protocol")?.0;
        }
        let proto = match word {
            "tcp" => Proto::Tcp,
            "udp" => Proto::Udp,
            "icmp" => Proto::Icmp,
            "icmp-reply" => Proto::IcmpReply,
            "arp" => Proto::Arp,
            "arp-reply" => Proto::ArpReply,
            other => return Err(format!("protocol '{other}' is not tcp, udp, icmp, icmp-reply, arp or arp-reply")),
        };
        let src = Endpoint::parse(next("the source")?.0)?;
        let (arrow, _) = next("'>'")?;
        if arrow != ">" {
            return Err(format!("expected '>' between source and destination, found '{arrow}'"));
        }
        let dst = Endpoint::parse(next("the destination")?.0)?;
        if src.addr.is_ipv4() != dst.addr.is_ipv4() {
            return Err("source and destination are of different IP versions".into());
        }
        let ports = matches!(proto, Proto::Tcp | Proto::Udp);
        if ports != (src.port.is_some() && dst.port.is_some()) {
            return Err(if ports {
                "TCP and UDP need ports on both addresses (10.0.0.1:80)".into()
            } else {
                "ICMP and ARP have no ports".into()
            });
        }
        if matches!(proto, Proto::Arp | Proto::ArpReply) && !src.addr.is_ipv4() {
            return Err("ARP is for IPv4 addresses".into());
        }
        let mut line = Line {
            time_ns,
            relative,
            vlan,
            proto,
            src,
            dst,
            flags: 0,
            ttl: None,
            payload: Vec::new(),
            frame_len: None,
            repeat: 1,
            every_ns: 1_000,
        };
        while let Some((key, _)) = it.next() {
            let (value, quoted) = it.next().ok_or_else(|| format!("option '{key}' needs a value"))?;
            match key {
                "flags" if proto == Proto::Tcp => line.flags = tcp_flags(value)?,
                "flags" => return Err("flags are for tcp".into()),
                "ttl" => line.ttl = Some(value.parse().map_err(|_| format!("ttl '{value}' is not 0-255"))?),
                "payload" if quoted => line.payload = value.as_bytes().to_vec(),
                "payload" => return Err("write the payload in quotes: payload \"text\"".into()),
                "hex" => line.payload = hex(value)?,
                "len" => {
                    let len: usize = value.parse().map_err(|_| format!("len '{value}' is not a byte count"))?;
                    if len > 9216 {
                        return Err(format!("len {len} is over 9216 bytes (a jumbo frame)"));
                    }
                    line.frame_len = Some(len);
                }
                "repeat" => {
                    line.repeat = value.parse().map_err(|_| format!("repeat '{value}' is not a count"))?;
                    if line.repeat == 0 || line.repeat > MAX_PACKETS {
                        return Err(format!("repeat {} is not 1-{MAX_PACKETS}", line.repeat));
                    }
                }
                "every" => line.every_ns = seconds(value)?,
                other => {
                    return Err(format!("unknown option '{other}': use flags, ttl, payload, hex, len, repeat, every"));
                }
            }
        }
        if line.payload.len() > 9000 {
            return Err("the payload is over 9000 bytes".into());
        }
        Ok(line)
    }

    /// The k-th repetition's frame.
    fn frame(&self, k: u64) -> Vec<u8> {
        let transport = match self.proto {
            Proto::Arp | Proto::ArpReply => {
                let (sender, target) = (self.src.addr_at(k).to_v4(), self.dst.addr_at(k).to_v4());
                let reply = self.proto == Proto::ArpReply;
                let mut frame =
                    sluice_wire::build::arp4(sender.unwrap_or([0; 4]), target.unwrap_or([0; 4]), reply, self.vlan);
                if let Some(len) = self.frame_len {
                    frame.resize(len.max(frame.len()), 0);
                }
                return frame;
            }
            Proto::Tcp => {
                Transport::Tcp { src_port: self.src.port_at(k), dst_port: self.dst.port_at(k), flags: self.flags }
            }
            Proto::Udp => Transport::Udp { src_port: self.src.port_at(k), dst_port: self.dst.port_at(k) },
            Proto::Icmp => Transport::IcmpEcho { ident: 1 },
            Proto::IcmpReply => Transport::IcmpEchoReply { ident: 1 },
        };
        let mut spec = FrameSpec {
            src: self.src.addr_at(k),
            dst: self.dst.addr_at(k),
            transport,
            payload: self.payload.clone(),
            vlan: self.vlan,
        };
        if let Some(len) = self.frame_len {
            spec = spec.with_frame_len(len);
        }
        let mut frame = spec.build();
        if let Some(ttl) = self.ttl {
            set_ttl(&mut frame, self.vlan.is_some(), ttl);
        }
        frame
    }
}

/// Sets the IPv4 TTL (and the header checksum) or the IPv6 hop limit of a
/// frame [`FrameSpec::build`] wrote.
fn set_ttl(frame: &mut [u8], tagged: bool, ttl: u8) {
    let ip = if tagged { 18 } else { 14 };
    match frame.get(ip).map(|b| b >> 4) {
        Some(4) => {
            if let Some(b) = frame.get_mut(ip + 8) {
                *b = ttl;
            }
            if let Some(h) = frame.get_mut(ip..ip + 20) {
                if let Some(sum) = h.get_mut(10..12) {
                    sum.fill(0);
                }
                let c = sluice_wire::checksum::checksum(h);
                if let Some(sum) = h.get_mut(10..12) {
                    sum.copy_from_slice(&c.to_be_bytes());
                }
            }
        }
        Some(6) => {
            if let Some(b) = frame.get_mut(ip + 7) {
                *b = ttl;
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;
    use sluice_wire::parse::parse as parse_frame;

    #[test]
    fn arp_lines_are_arp_frames_for_ipv4_only() {
        let frames = parse("0 arp 10.0.0.5 > 10.0.0.1\n+0.001 vlan 7 arp-reply 10.0.0.1 > 10.0.0.5\n").unwrap();
        let parsed: Vec<_> = frames.iter().map(|f| parse_frame(&f.data)).collect();
        assert!(parsed.iter().all(|l| l.ethertype == sluice_wire::ethernet::ethertype::ARP && l.key.is_none()));
        assert_eq!((parsed[0].vlan, parsed[1].vlan), (None, Some(7)));
        assert_eq!(frames[0].data[..6], [0xff; 6], "a request is a broadcast");
        assert!(parse("0 arp [2001:db8::1] > [2001:db8::2]\n").unwrap_err().to_string().contains("IPv4"));
        assert!(parse("0 arp 10.0.0.5:1 > 10.0.0.1:2\n").unwrap_err().to_string().contains("no ports"));
    }

    #[test]
    fn a_handshake_a_query_and_a_low_ttl_ping() {
        let frames = parse(
            "# a connection\n0.000 tcp 10.0.0.5:40000 > 93.184.216.34:80 flags S\n\
             +0.010 tcp 93.184.216.34:80 > 10.0.0.5:40000 flags SA   # the reply\n\
             0.020 udp 10.0.0.5:5353 > 8.8.8.8:53 payload \"a \\\"query\\\" # not a comment\"\n\
             0.030 icmp 10.0.0.5 > 10.0.0.9 ttl 1\n\
             0.040 vlan 100 tcp [2001:db8::1]:443 > [2001:db8::2]:5555 flags R ttl 2\n",
        )
        .unwrap();
        assert_eq!(frames.len(), 5);
        assert_eq!(frames[1].ts_ns, 10_000_000);
        let syn = parse_frame(&frames[0].data);
        let key = syn.key.unwrap();
        assert_eq!((key.src_port, key.dst_port), (40000, 80));
        assert_eq!(frames[0].data[14 + 20 + 13], 0x02);
        assert_eq!(frames[1].data[14 + 20 + 13], 0x12);
        assert!(frames[2].data.ends_with(b"a \"query\" # not a comment"));
        assert_eq!(frames[3].data[14 + 8], 1);
        assert_eq!(sluice_wire::checksum::checksum(&frames[3].data[14..34]), 0, "the IPv4 header checksum holds");
        assert_eq!(frames[4].data[18 + 7], 2);
        assert_eq!(&frames[4].data[12..14], &[0x81, 0x00]);
    }

    #[test]
    fn a_repeated_line_counts_ports_and_octets() {
        let frames = parse("1.0 tcp 10.0.1.*:* > 10.0.0.80:22 flags S repeat 300 every 0.001").unwrap();
        assert_eq!(frames.len(), 300);
        assert_eq!(frames[299].ts_ns, 1_000_000_000 + 299_000_000);
        let k = parse_frame(&frames[255].data).key.unwrap();
        assert_eq!(k.src_port, 1024 + 255);
        assert_eq!(k.src.to_v4().unwrap(), [10, 0, 1, 2]);
    }

    #[test]
    fn bad_lines_say_where_and_what() {
        for (text, says) in [
            ("0 tcp 10.0.0.1 > 10.0.0.2:80", "need ports"),
            ("0 sctp 10.0.0.1:1 > 10.0.0.2:80", "not tcp, udp"),
            ("0 tcp 10.0.0.1:1 10.0.0.2:80", "expected '>'"),
            ("x tcp 10.0.0.1:1 > 10.0.0.2:80", "not a time"),
            ("0 tcp 10.0.0.1:1 > [::1]:80", "different IP versions"),
            ("0 tcp 10.0.0.1:1 > 10.0.0.2:80 flags SX", "flag 'X'"),
            ("0 udp 10.0.0.1:1 > 10.0.0.2:80 payload \"open", "not closed"),
            ("0 udp 10.0.0.1:1 > 10.0.0.2:80 repeat 0", "repeat 0"),
            ("0 vlan 5000 udp 10.0.0.1:1 > 10.0.0.2:80", "VLAN"),
            ("0 icmp 10.0.0.1:1 > 10.0.0.2:80", "no ports"),
            ("0 udp 10.0.0.1:1 > 10.0.0.2:99999", "port"),
        ] {
            let e = parse(&format!("\n{text}\n")).unwrap_err();
            assert_eq!(e.line, 2, "{text}");
            assert!(e.to_string().contains(says), "{text}: {e}");
        }
    }

    proptest::proptest! {
        #[test]
        fn every_tcp_line_builds_a_frame_that_parses_to_its_endpoints(
            a in proptest::array::uniform4(0u8..), b in proptest::array::uniform4(0u8..),
            sp in 0u16.., dp in 0u16.., ttl in 0u8.., payload in "[a-z ]{0,40}", vlan in proptest::option::of(1u16..4095)
        ) {
            let v = vlan.map(|v| format!("vlan {v} ")).unwrap_or_default();
            let line = format!(
                "0 {v}tcp {}:{sp} > {}:{dp} flags SA ttl {ttl} payload \"{payload}\"",
                std::net::Ipv4Addr::from(a), std::net::Ipv4Addr::from(b)
            );
            let frames = parse(&line).unwrap();
            let l = parse_frame(&frames[0].data);
            let k = l.key.unwrap();
            proptest::prop_assert_eq!(k.src.to_v4().unwrap(), a);
            proptest::prop_assert_eq!(k.dst.to_v4().unwrap(), b);
            proptest::prop_assert_eq!((k.src_port, k.dst_port), (sp, dp));
            proptest::prop_assert!(frames[0].data.ends_with(payload.as_bytes()));
        }
    }
}
