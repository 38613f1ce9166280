//! Zero-copy, panic-free packet views for Sluice.
//!
//! This crate owns the parsing of the headers a network function looks at:
//! Ethernet, 802.1Q/802.1ad, IPv4, IPv6 (with extension headers), TCP, UDP and
//! ICMP/ICMPv6, plus the flow key and the checksums. The same code runs in the
//! host (to build batch metadata) and in guests through `sluice-sdk` (to read
//! and rewrite packets), so host and NF always agree on what a packet is.
//!
//! # The safety contract
//!
//! Every header type is a view `Foo<T: AsRef<[u8]>>` over borrowed bytes, in the
//! manner of smoltcp's `wire` module. `Foo::new_checked(buf)` verifies the
//! buffer is long enough for every accessor (and that length fields inside the
//! header are consistent with it); after that no accessor can panic or index
//! out of bounds. `Foo::new_unchecked` exists for callers that checked already;
//! its accessors still never panic — they return zero for bytes that are
//! missing — because the workspace forbids unchecked indexing. Field positions
//! are named `Range`s in each module's `field` submodule.
//!
//! Errors are a small `Copy` enum so that the hot path never allocates.

pub mod abi;
pub mod beacon;
#[allow(clippy::indexing_slicing)] // builds fixed-size headers it just allocated
pub mod build;
pub mod checksum;
pub mod ethernet;
pub mod flow;
pub mod fragment;
pub mod icmp;
pub mod ipv4;
pub mod ipv6;
pub mod parse;
pub mod reassembly;
pub mod rewrite;
pub mod steer;
pub mod tcp;
pub mod udp;

pub use flow::{FlowKey, IpAddr128};
pub use parse::{Layers, parse};

/// Why a buffer could not be read as the requested header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Error {
    /// The buffer ends before the header (or the length it declares) does.
    Truncated,
    /// A field holds a value the header cannot have (e.g. an IPv4 header
    /// length below 20 bytes, or a version that is not 4).
    Malformed,
}

impl core::fmt::Display for Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Error::Truncated => f.write_str("packet truncated: buffer shorter than the header"),
            Error::Malformed => f.write_str("malformed header field"),
        }
    }
}

impl std::error::Error for Error {}

/// Result of parsing.
pub type Result<T> = core::result::Result<T, Error>;

/// Byte-access helpers that never panic: a missing byte reads as zero and a
/// write past the end is ignored. Views only reach these after `check_len`,
/// so the fallbacks matter only for `new_unchecked` misuse.
pub(crate) mod bytes {
    use core::ops::Range;

    #[inline]
    pub fn u8_at(buf: &[u8], at: usize) -> u8 {
        buf.get(at).copied().unwrap_or(0)
    }

    #[inline]
    pub fn u16_at(buf: &[u8], r: Range<usize>) -> u16 {
        match buf.get(r) {
            Some(&[a, b]) => u16::from_be_bytes([a, b]),
            _ => 0,
        }
    }

    #[inline]
    pub fn u32_at(buf: &[u8], r: Range<usize>) -> u32 {
        match buf.get(r) {
            Some(&[a, b, c, d]) => u32::from_be_bytes([a, b, c, d]),
            _ => 0,
        }
    }

    #[inline]
    pub fn array<const N: usize>(buf: &[u8], r: Range<usize>) -> [u8; N] {
        let mut out = [0u8; N];
        if let Some(src) = buf.get(r)
            && src.len() == N
        {
            out.copy_from_slice(src);
        }
        out
    }

    #[inline]
    pub fn set_u8(buf: &mut [u8], at: usize, v: u8) {
        if let Some(b) = buf.get_mut(at) {
            *b = v;
        }
    }

    #[inline]
    pub fn set_u16(buf: &mut [u8], r: Range<usize>, v: u16) {
        if let Some(dst) = buf.get_mut(r)
            && dst.len() == 2
        {
            dst.copy_from_slice(&v.to_be_bytes());
        }
    }

    #[inline]
    pub fn set_slice(buf: &mut [u8], r: Range<usize>, v: &[u8]) {
        if let Some(dst) = buf.get_mut(r)
            && dst.len() == v.len()
        {
            dst.copy_from_slice(v);
        }
    }
}
