//! Reading captures into shared memory.

use crate::PcapError;
use pcap_file::DataLink;
use pcap_file::pcap::PcapParser;
use pcap_file::pcapng::{Block, PcapNgParser};
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

/// One packet of a trace: where its bytes are in [`Trace::bytes`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PacketRef {
    /// Captured bytes, as a range of the file.
    pub range: Range<usize>,
    /// Length on the wire.
    pub wire_len: u32,
    /// Timestamp, ns since the Unix epoch.
    pub timestamp_ns: u64,
    /// Interface (pcapng) or 0.
    pub port: u16,
}

/// What reading found besides packets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadStats {
    /// Packets read.
    pub packets: u64,
    /// Records longer than the snap length, kept as they are.
    pub over_snaplen: u64,
    /// Packets skipped because their interface is not Ethernet.
    pub skipped_link_type: u64,
    /// Offset at which the file was cut off or damaged, if it was; records
    /// before it were read.
    pub truncated_at: Option<u64>,
    /// Why reading stopped early, if it did.
    pub truncation_reason: Option<String>,
}

/// A capture in memory.
#[derive(Debug, Clone)]
pub struct Trace {
    bytes: Arc<[u8]>,
    packets: Vec<PacketRef>,
    stats: ReadStats,
}

fn ts_ns(sec: u32, frac: u32, nanos: bool) -> u64 {
    u64::from(sec) * 1_000_000_000 + if nanos { u64::from(frac) } else { u64::from(frac) * 1000 }
}

/// Offset of `sub` within `whole` (both from the same allocation).
fn offset_in(whole: &[u8], sub: &[u8]) -> usize {
    (sub.as_ptr() as usize).saturating_sub(whole.as_ptr() as usize)
}

impl Trace {
    /// Reads a pcap or pcapng file.
    pub fn open(path: &Path) -> Result<Self, PcapError> {
        let bytes = std::fs::read(path).map_err(|source| PcapError::Io { path: path.to_path_buf(), source })?;
        Self::from_bytes(path, bytes.into())
    }

    /// Parses capture bytes; `path` only names the source in errors.
    pub fn from_bytes(path: &Path, bytes: Arc<[u8]>) -> Result<Self, PcapError> {
        let magic = bytes.get(..4).and_then(|m| <[u8; 4]>::try_from(m).ok()).map(u32::from_le_bytes);
        match magic {
            Some(0xa1b2_c3d4 | 0xd4c3_b2a1 | 0xa1b2_3c4d | 0x4d3c_b2a1) => Self::read_pcap(path, bytes),
            Some(0x0a0d_0d0a) => Self::read_pcapng(path, bytes),
            _ => Err(PcapError::NotACapture {
                path: path.to_path_buf(),
                magic: bytes.iter().take(4).map(|b| format!("{b:02x}")).collect(),
            }),
        }
    }

    fn read_pcap(path: &Path, bytes: Arc<[u8]>) -> Result<Self, PcapError> {
        let data: &[u8] = &bytes;
        let (mut rest, parser) = PcapParser::new(data)
            .map_err(|e| PcapError::BadHeader { path: path.to_path_buf(), reason: e.to_string() })?;
        let header = parser.header();
        if header.datalink != DataLink::ETHERNET {
            return Err(PcapError::UnsupportedLinkType {
                path: path.to_path_buf(),
                linktype: format!("{:?}", header.datalink),
            });
        }
        let nanos = header.ts_resolution == pcap_file::TsResolution::NanoSecond;
        let mut packets = Vec::new();
        let mut stats = ReadStats::default();
        while !rest.is_empty() {
            match parser.next_raw_packet(rest) {
                Ok((next, p)) => {
                    let start = offset_in(data, &p.data);
                    if p.incl_len > header.snaplen {
                        stats.over_snaplen += 1;
                    }
                    packets.push(PacketRef {
                        range: start..start + p.data.len(),
                        wire_len: p.orig_len.max(p.incl_len),
                        timestamp_ns: ts_ns(p.ts_sec, p.ts_frac, nanos),
                        port: 0,
                    });
                    rest = next;
                }
                Err(e) => {
                    stats.truncated_at = Some(offset_in(data, rest) as u64);
                    stats.truncation_reason = Some(match e {
                        pcap_file::PcapError::IncompleteBuffer => "file ends inside a packet record".to_string(),
                        other => other.to_string(),
                    });
                    break;
                }
            }
        }
        stats.packets = packets.len() as u64;
        Ok(Trace { bytes, packets, stats })
    }

    fn read_pcapng(path: &Path, bytes: Arc<[u8]>) -> Result<Self, PcapError> {
        let data: &[u8] = &bytes;
        let (mut rest, mut parser) = PcapNgParser::new(data)
            .map_err(|e| PcapError::BadHeader { path: path.to_path_buf(), reason: e.to_string() })?;
        let mut packets = Vec::new();
        let mut stats = ReadStats::default();
        while !rest.is_empty() {
            let before = rest;
            let block = match parser.next_block(rest) {
                Ok((next, block)) => {
                    rest = next;
                    block
                }
                Err(e) => {
                    stats.truncated_at = Some(offset_in(data, before) as u64);
                    stats.truncation_reason = Some(match e {
                        pcap_file::PcapError::IncompleteBuffer => "file ends inside a block".to_string(),
                        other => other.to_string(),
                    });
                    break;
                }
            };
            let (iface, ts, orig_len, pkt) = match &block {
                Block::EnhancedPacket(p) => (p.interface_id, p.timestamp.as_nanos() as u64, p.original_len, &p.data),
                Block::SimplePacket(p) => (0, 0, p.original_len, &p.data),
                _ => continue,
            };
            let Some(idb) = parser.interfaces().get(iface as usize) else {
                stats.skipped_link_type += 1;
                continue;
            };
            if idb.linktype != DataLink::ETHERNET {
                stats.skipped_link_type += 1;
                continue;
            }
            if idb.snaplen != 0 && pkt.len() > idb.snaplen as usize {
                stats.over_snaplen += 1;
            }
            // Borrowed data points into `bytes`; an owned copy (never made
            // by the parser for packet data) would fall outside and is
            // skipped rather than mis-addressed.
            let start = offset_in(data, pkt);
            if start + pkt.len() > data.len() {
                continue;
            }
            packets.push(PacketRef {
                range: start..start + pkt.len(),
                wire_len: orig_len.max(pkt.len() as u32),
                timestamp_ns: ts,
                port: u16::try_from(iface).unwrap_or(u16::MAX),
            });
        }
        stats.packets = packets.len() as u64;
        Ok(Trace { bytes, packets, stats })
    }

    /// The file's bytes, shared.
    pub fn bytes(&self) -> &Arc<[u8]> {
        &self.bytes
    }

    /// The packets, in file order.
    pub fn packets(&self) -> &[PacketRef] {
        &self.packets
    }

    /// The captured bytes of a packet.
    pub fn data(&self, p: &PacketRef) -> &[u8] {
        self.bytes.get(p.range.clone()).unwrap_or(&[])
    }

    /// What reading found.
    pub fn stats(&self) -> &ReadStats {
        &self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PcapSink;

    fn sample(n: usize) -> Vec<u8> {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.pcap");
        let mut w = PcapSink::create(&p).unwrap();
        for i in 0..n {
            let frame = vec![i as u8; 60];
            w.write(1_000_000_000 + i as u64, 60, &frame).unwrap();
        }
        w.finish().unwrap();
        std::fs::read(&p).unwrap()
    }

    #[test]
    fn round_trip() {
        let t = Trace::from_bytes(Path::new("x"), sample(3).into()).unwrap();
        assert_eq!(t.packets().len(), 3);
        assert_eq!(t.data(&t.packets()[2]), &[2u8; 60][..]);
        assert_eq!(t.packets()[1].timestamp_ns, 1_000_000_001);
        assert_eq!(t.stats().truncated_at, None);
    }

    #[test]
    fn truncated_file_keeps_whole_records() {
        let bytes = sample(3);
        let cut = bytes.len() - 10;
        let t = Trace::from_bytes(Path::new("x"), bytes[..cut].to_vec().into()).unwrap();
        assert_eq!(t.packets().len(), 2);
        assert!(t.stats().truncated_at.is_some());
    }

    #[test]
    fn record_longer_than_snaplen_is_kept_and_counted() {
        let mut bytes = sample(1);
        // snaplen field of the global header (offset 16, little endian).
        bytes[16..20].copy_from_slice(&40u32.to_le_bytes());
        let t = Trace::from_bytes(Path::new("x"), bytes.into()).unwrap();
        assert_eq!(t.packets().len(), 1);
        assert_eq!(t.stats().over_snaplen, 1);
    }

    #[test]
    fn huge_record_length_is_a_truncation_not_an_allocation() {
        let mut bytes = sample(2);
        // incl_len of the second record.
        let second = 24 + 16 + 60;
        bytes[second + 8..second + 12].copy_from_slice(&u32::MAX.to_le_bytes());
        let t = Trace::from_bytes(Path::new("x"), bytes.into()).unwrap();
        assert_eq!(t.packets().len(), 1);
        assert_eq!(t.stats().truncated_at, Some(second as u64));
    }

    #[test]
    fn non_ethernet_pcap_is_an_error() {
        let mut bytes = sample(1);
        bytes[20..24].copy_from_slice(&101u32.to_le_bytes());
        let e = Trace::from_bytes(Path::new("raw.pcap"), bytes.into()).unwrap_err();
        assert!(e.to_string().contains("link type"), "{e}");
    }

    #[test]
    fn garbage_is_not_a_capture() {
        let e = Trace::from_bytes(Path::new("g"), b"hello world".to_vec().into()).unwrap_err();
        assert!(matches!(e, PcapError::NotACapture { .. }));
        let e = Trace::from_bytes(Path::new("g"), Vec::new().into()).unwrap_err();
        assert!(matches!(e, PcapError::NotACapture { .. }));
    }

    proptest::proptest! {
        #[test]
        fn any_damage_never_panics(cut in 0usize..400, flips in proptest::collection::vec((0usize..400, proptest::num::u8::ANY), 0..8)) {
            let mut bytes = sample(4);
            for (at, v) in flips {
                let n = bytes.len();
                bytes[at % n] = v;
            }
            bytes.truncate(cut.min(bytes.len()));
            let _ = Trace::from_bytes(Path::new("p"), bytes.into());
        }
    }
}
