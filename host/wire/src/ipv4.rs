//! IPv4 headers.

use crate::bytes::{array, set_slice, set_u8, set_u16, u8_at, u16_at};
use crate::checksum;
use crate::{Error, Result};

/// Field positions of the IPv4 header.
pub mod field {
    use core::ops::Range;
    /// Version (high nibble) and header length in 32-bit words (low nibble).
    pub const VER_IHL: usize = 0;
    /// DSCP and ECN.
    pub const TOS: usize = 1;
    /// Total length of header and payload.
    pub const LENGTH: Range<usize> = 2..4;
    /// Identification.
    pub const IDENT: Range<usize> = 4..6;
    /// Flags and fragment offset.
    pub const FLG_OFF: Range<usize> = 6..8;
    /// Time to live.
    pub const TTL: usize = 8;
    /// Protocol of the payload.
    pub const PROTOCOL: usize = 9;
    /// Header checksum.
    pub const CHECKSUM: Range<usize> = 10..12;
    /// Source address.
    pub const SRC: Range<usize> = 12..16;
    /// Destination address.
    pub const DST: Range<usize> = 16..20;
}

/// Length of an IPv4 header without options.
pub const MIN_HEADER_LEN: usize = 20;

/// A view of an IPv4 packet (header and payload).
#[derive(Debug, Clone)]
pub struct Ipv4Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Ipv4Packet<T> {
    /// Wraps a buffer without checking it.
    pub const fn new_unchecked(buffer: T) -> Self {
        Ipv4Packet { buffer }
    }

    /// Wraps a buffer after [`check_len`](Self::check_len).
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Checks the version, that the buffer holds the whole header (with
    /// options), and that the total length covers the header. A total length
    /// beyond the buffer is allowed (truncated captures): `payload` then
    /// returns what was captured.
    pub fn check_len(&self) -> Result<()> {
        let buf = self.buffer.as_ref();
        if buf.len() < MIN_HEADER_LEN {
            return Err(Error::Truncated);
        }
        if self.version() != 4 {
            return Err(Error::Malformed);
        }
        let hl = self.header_len();
        if hl < MIN_HEADER_LEN || usize::from(self.total_len()) < hl {
            return Err(Error::Malformed);
        }
        if buf.len() < hl {
            return Err(Error::Truncated);
        }
        Ok(())
    }

    /// IP version (4).
    pub fn version(&self) -> u8 {
        u8_at(self.buffer.as_ref(), field::VER_IHL) >> 4
    }

    /// Header length in bytes.
    pub fn header_len(&self) -> usize {
        usize::from(u8_at(self.buffer.as_ref(), field::VER_IHL) & 0x0f) * 4
    }

    /// DSCP/ECN byte.
    pub fn tos(&self) -> u8 {
        u8_at(self.buffer.as_ref(), field::TOS)
    }

    /// Total length field.
    pub fn total_len(&self) -> u16 {
        u16_at(self.buffer.as_ref(), field::LENGTH)
    }

    /// Identification field.
    pub fn ident(&self) -> u16 {
        u16_at(self.buffer.as_ref(), field::IDENT)
    }

    /// Whether more fragments follow.
    pub fn more_frags(&self) -> bool {
        u16_at(self.buffer.as_ref(), field::FLG_OFF) & 0x2000 != 0
    }

    /// Fragment offset in bytes.
    pub fn frag_offset(&self) -> u16 {
        (u16_at(self.buffer.as_ref(), field::FLG_OFF) & 0x1fff) << 3
    }

    /// Whether this packet is a fragment (first or later).
    pub fn is_fragment(&self) -> bool {
        self.more_frags() || self.frag_offset() != 0
    }

    /// Time to live.
    pub fn ttl(&self) -> u8 {
        u8_at(self.buffer.as_ref(), field::TTL)
    }

    /// Payload protocol number.
    pub fn protocol(&self) -> u8 {
        u8_at(self.buffer.as_ref(), field::PROTOCOL)
    }

    /// Header checksum field.
    pub fn checksum(&self) -> u16 {
        u16_at(self.buffer.as_ref(), field::CHECKSUM)
    }

    /// Source address.
    pub fn src(&self) -> [u8; 4] {
        array(self.buffer.as_ref(), field::SRC)
    }

    /// Destination address.
    pub fn dst(&self) -> [u8; 4] {
        array(self.buffer.as_ref(), field::DST)
    }

    /// Whether the header checksum is correct.
    pub fn verify_checksum(&self) -> bool {
        let hl = self.header_len();
        self.buffer.as_ref().get(..hl).is_some_and(|h| checksum::fold(checksum::sum(0, h)) == 0xffff)
    }

    /// The payload as far as it was captured and as far as the total length
    /// says (trailing Ethernet padding is excluded).
    pub fn payload(&self) -> &[u8] {
        let buf = self.buffer.as_ref();
        let end = usize::from(self.total_len()).min(buf.len());
        buf.get(self.header_len()..end).unwrap_or(&[])
    }

    /// The payload length the header declares.
    pub fn payload_len(&self) -> u16 {
        self.total_len().saturating_sub(self.header_len() as u16)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv4Packet<T> {
    /// Sets the TTL, updating the header checksum incrementally.
    pub fn set_ttl(&mut self, ttl: u8) {
        let old = u16_at(self.buffer.as_ref(), 8..10);
        set_u8(self.buffer.as_mut(), field::TTL, ttl);
        let new = u16_at(self.buffer.as_ref(), 8..10);
        let c = checksum::update_u16(self.checksum(), old, new);
        set_u16(self.buffer.as_mut(), field::CHECKSUM, c);
    }

    /// Sets the source address, updating the header checksum incrementally.
    /// The transport checksum covers the address too: fix it with
    /// [`checksum::update_bytes`] (the TCP/UDP views have helpers).
    pub fn set_src(&mut self, addr: [u8; 4]) {
        let old = self.src();
        set_slice(self.buffer.as_mut(), field::SRC, &addr);
        let c = checksum::update_bytes(self.checksum(), &old, &addr);
        set_u16(self.buffer.as_mut(), field::CHECKSUM, c);
    }

    /// Sets the destination address, updating the header checksum.
    pub fn set_dst(&mut self, addr: [u8; 4]) {
        let old = self.dst();
        set_slice(self.buffer.as_mut(), field::DST, &addr);
        let c = checksum::update_bytes(self.checksum(), &old, &addr);
        set_u16(self.buffer.as_mut(), field::CHECKSUM, c);
    }

    /// Sets the total length (header and payload); fix the checksum after.
    pub fn set_total_len(&mut self, len: u16) {
        set_u16(self.buffer.as_mut(), field::LENGTH, len);
    }

    /// Recomputes the header checksum from scratch.
    pub fn fill_checksum(&mut self) {
        set_u16(self.buffer.as_mut(), field::CHECKSUM, 0);
        let hl = self.header_len();
        let c = self.buffer.as_ref().get(..hl).map(checksum::checksum).unwrap_or(0);
        set_u16(self.buffer.as_mut(), field::CHECKSUM, c);
    }

    /// The payload, mutable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let hl = self.header_len();
        let end = usize::from(self.total_len()).min(self.buffer.as_ref().len());
        self.buffer.as_mut().get_mut(hl..end).unwrap_or(&mut [])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> Vec<u8> {
        let mut h = vec![0x45, 0, 0, 20, 0, 1, 0x40, 0, 64, 6, 0, 0, 10, 0, 0, 1, 192, 168, 1, 1];
        let c = checksum::checksum(&h);
        h[10..12].copy_from_slice(&c.to_be_bytes());
        h
    }

    #[test]
    fn fields() {
        let h = header();
        let p = Ipv4Packet::new_checked(&h[..]).unwrap();
        assert_eq!(p.src(), [10, 0, 0, 1]);
        assert_eq!(p.dst(), [192, 168, 1, 1]);
        assert_eq!(p.protocol(), 6);
        assert!(p.verify_checksum());
        assert!(!p.is_fragment());
    }

    #[test]
    fn rewrite_keeps_checksum_valid() {
        let mut h = header();
        let mut p = Ipv4Packet::new_checked(&mut h[..]).unwrap();
        p.set_src([203, 0, 113, 7]);
        p.set_ttl(3);
        assert!(p.verify_checksum());
    }

    #[test]
    fn bad_ihl_is_malformed() {
        let mut h = header();
        h[0] = 0x44;
        assert_eq!(Ipv4Packet::new_checked(&h[..]).err(), Some(Error::Malformed));
    }
}
