//! pcap and pcapng input, pcap output.
//!
//! Damaged captures are the norm in the field, so reading is lenient where
//! it can be and precise where it cannot: a record longer than the file's
//! snap length is kept (and counted), a file cut off mid-record keeps every
//! whole record before the cut (and says where it was cut), packets of
//! pcapng interfaces with a non-Ethernet link type are skipped (and
//! counted), and only a file that is not a capture at all, or a classic pcap
//! whose link type is not Ethernet, is an error.
//!
//! The whole file is read into memory once and shared (`Arc<[u8]>`), and
//! packets are handed out as byte ranges into it, so worker threads read
//! packet bytes without copying them.

mod read;
mod write;

pub use read::{PacketRef, ReadStats, Trace};
pub use write::{PcapAppender, PcapSink};

use std::path::PathBuf;

/// Errors reading or writing captures.
#[derive(Debug, thiserror::Error)]
pub enum PcapError {
    /// The file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// File.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// The file does not start with a pcap or pcapng magic number.
    #[error(
        "{path}: not a pcap or pcapng file (starts with {magic}); expected a capture from tcpdump, Wireshark or `sluice-host trace`"
    )]
    NotACapture {
        /// File.
        path: PathBuf,
        /// First bytes, hex.
        magic: String,
    },
    /// The file header is damaged.
    #[error("{path}: damaged capture header: {reason}")]
    BadHeader {
        /// File.
        path: PathBuf,
        /// Cause.
        reason: String,
    },
    /// A classic pcap file with a link type other than Ethernet.
    #[error("{path}: link type {linktype} is not supported; Sluice hosts process Ethernet frames (link type 1)")]
    UnsupportedLinkType {
        /// File.
        path: PathBuf,
        /// Link type.
        linktype: String,
    },
    /// Writing a packet failed.
    #[error("{path}: cannot write packet: {reason}")]
    Write {
        /// File.
        path: PathBuf,
        /// Cause.
        reason: String,
    },
}
