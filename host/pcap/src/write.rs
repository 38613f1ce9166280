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

/// The header of the files Sluice writes: Ethernet, nanosecond timestamps.
fn header(endianness: Endianness) -> PcapHeader {
    PcapHeader {
        version_major: 2,
        version_minor: 4,
        ts_correction: 0,
        ts_accuracy: 0,
        snaplen: SNAPLEN,
        datalink: DataLink::ETHERNET,
        ts_resolution: TsResolution::NanoSecond,
        endianness,
    }
}

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
        let writer = PcapWriter::with_header(BufWriter::new(file), header(Endianness::native()))
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

/// Byte length of a pcap file header.
const PCAP_HEADER_LEN: u64 = 24;

/// A pcap file that grows across restarts of its writer: packets are
/// buffered and written with one `write` per [`flush`](Self::flush), which
/// returns the file's length. A writer that restarts after a crash opens it
/// again with the length of its last flush it recorded, and what was
/// written after that is cut, so the file holds exactly what the writer
/// accounted for.
pub struct PcapAppender {
    path: PathBuf,
    file: File,
    buf: Vec<u8>,
    len: u64,
    written: u64,
}

impl std::fmt::Debug for PcapAppender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PcapAppender").field("path", &self.path).field("len", &self.len).finish()
    }
}

impl PcapAppender {
    /// Opens `path` for appending. `keep`: the length to cut it back to
    /// (none: keep it whole). A missing or headerless file is started anew
    /// with a little-endian, nanosecond Ethernet header.
    pub fn open(path: &Path, keep: Option<u64>) -> Result<Self, PcapError> {
        use std::io::{Read, Seek, SeekFrom, Write};
        let io = |source| PcapError::Io { path: path.to_path_buf(), source };
        let mut file =
            std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path).map_err(io)?;
        let mut magic = [0u8; 4];
        let on_disk = file.metadata().map_err(io)?.len();
        let ours = on_disk >= PCAP_HEADER_LEN
            && file.read_exact(&mut magic).is_ok()
            && u32::from_le_bytes(magic) == 0xa1b2_3c4d;
        let len = if ours {
            let len = keep.unwrap_or(on_disk).clamp(PCAP_HEADER_LEN, on_disk);
            file.set_len(len).map_err(io)?;
            len
        } else {
            let mut bytes = Vec::new();
            header(Endianness::Little)
                .write_to(&mut bytes)
                .map_err(|e| PcapError::Write { path: path.to_path_buf(), reason: e.to_string() })?;
            file.set_len(0).map_err(io)?;
            file.seek(SeekFrom::Start(0)).map_err(io)?;
            file.write_all(&bytes).map_err(io)?;
            bytes.len() as u64
        };
        file.seek(SeekFrom::Start(len)).map_err(io)?;
        Ok(PcapAppender { path: path.to_path_buf(), file, buf: Vec::new(), len, written: 0 })
    }

    /// Buffers a packet.
    pub fn push(&mut self, timestamp_ns: u64, wire_len: u32, data: &[u8]) -> Result<(), PcapError> {
        let data = data.get(..SNAPLEN as usize).unwrap_or(data);
        let orig_len = wire_len.max(data.len() as u32);
        PcapPacket::new(Duration::from_nanos(timestamp_ns), orig_len, data)
            .write_to::<_, byteorder_slice::LittleEndian>(&mut self.buf, TsResolution::NanoSecond, SNAPLEN)
            .map_err(|e| PcapError::Write { path: self.path.clone(), reason: e.to_string() })?;
        self.written += 1;
        Ok(())
    }

    /// Writes what is buffered; returns the file's length.
    pub fn flush(&mut self) -> Result<u64, PcapError> {
        use std::io::Write;
        if !self.buf.is_empty() {
            self.file.write_all(&self.buf).map_err(|source| PcapError::Io { path: self.path.clone(), source })?;
            self.len += self.buf.len() as u64;
            self.buf.clear();
        }
        Ok(self.len)
    }

    /// Packets pushed through this writer.
    pub fn written(&self) -> u64 {
        self.written
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn an_appender_cuts_what_was_written_after_the_recorded_length() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("out.pcap");
        let mut a = PcapAppender::open(&p, None).unwrap();
        a.push(1, 60, &[1u8; 60]).unwrap();
        let kept = a.flush().unwrap();
        a.push(2, 60, &[2u8; 60]).unwrap();
        a.flush().unwrap();
        drop(a);
        // A restart that recorded only the first flush.
        let mut a = PcapAppender::open(&p, Some(kept)).unwrap();
        a.push(3, 70, &[3u8; 70]).unwrap();
        a.flush().unwrap();
        drop(a);
        let t = crate::Trace::open(&p).unwrap();
        let stamps: Vec<u64> = t.packets().iter().map(|p| p.timestamp_ns).collect();
        assert_eq!(stamps, vec![1, 3]);
        // Junk is replaced by a fresh capture.
        std::fs::write(&p, b"not a capture at all, longer than a header").unwrap();
        let mut a = PcapAppender::open(&p, Some(10)).unwrap();
        a.push(4, 60, &[4u8; 60]).unwrap();
        a.flush().unwrap();
        assert_eq!(crate::Trace::open(&p).unwrap().packets().len(), 1);
    }
}
