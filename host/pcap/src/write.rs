//! Writing pcap files (nanosecond timestamps, Ethernet).

use crate::PcapError;
use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter};
use pcap_file::{DataLink, Endianness, TsResolution};
use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Snap length of written files; longer packets are cut to it (their wire
/// length is kept), as tcpdump does.
pub const SNAPLEN: u32 = 262_144;

/// A pcap file being written.
pub struct PcapSink {
    path: PathBuf,
    writer: PcapWriter<BufWriter<File>>,
    written: u64,
}

impl std::fmt::Debug for PcapSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PcapSink").field("path", &self.path).field("written", &self.written).finish()
    }
}

impl PcapSink {
    /// Creates (or truncates) `path`.
    pub fn create(path: &Path) -> Result<Self, PcapError> {
        let file = File::create(path).map_err(|source| PcapError::Io { path: path.to_path_buf(), source })?;
        let header = PcapHeader {
            version_major: 2,
            version_minor: 4,
            ts_correction: 0,
            ts_accuracy: 0,
            snaplen: SNAPLEN,
            datalink: DataLink::ETHERNET,
            ts_resolution: TsResolution::NanoSecond,
            endianness: Endianness::native(),
        };
        let writer = PcapWriter::with_header(BufWriter::new(file), header)
            .map_err(|e| PcapError::Write { path: path.to_path_buf(), reason: e.to_string() })?;
        Ok(PcapSink { path: path.to_path_buf(), writer, written: 0 })
    }

    /// Appends a packet.
    pub fn write(&mut self, timestamp_ns: u64, wire_len: u32, data: &[u8]) -> Result<(), PcapError> {
        let data = data.get(..SNAPLEN as usize).unwrap_or(data);
        let orig_len = wire_len.max(data.len() as u32);
        let pkt = PcapPacket::new(Duration::from_nanos(timestamp_ns), orig_len, data);
        self.writer
            .write_packet(&pkt)
            .map_err(|e| PcapError::Write { path: self.path.clone(), reason: e.to_string() })?;
        self.written += 1;
        Ok(())
    }

    /// Packets written so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Flushes and closes the file.
    pub fn finish(self) -> Result<u64, PcapError> {
        let path = self.path;
        let written = self.written;
        let mut w = self.writer.into_writer();
        std::io::Write::flush(&mut w).map_err(|source| PcapError::Io { path, source })?;
        Ok(written)
    }
}
