//! UDP headers.

use crate::bytes::{set_u16, u16_at};
use crate::checksum;
use crate::{Error, Result};

/// Field positions of the UDP header.
pub mod field {
    use core::ops::Range;
    /// Source port.
    pub const SRC_PORT: Range<usize> = 0..2;
    /// Destination port.
    pub const DST_PORT: Range<usize> = 2..4;
    /// Length of header and payload.
    pub const LENGTH: Range<usize> = 4..6;
    /// Checksum (0 means none, IPv4 only).
    pub const CHECKSUM: Range<usize> = 6..8;
}

/// Length of the UDP header.
pub const HEADER_LEN: usize = 8;

/// A view of a UDP datagram.
#[derive(Debug, Clone)]
pub struct UdpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> UdpPacket<T> {
    /// Wraps a buffer without checking it.
    pub const fn new_unchecked(buffer: T) -> Self {
        UdpPacket { buffer }
    }

    /// Wraps a buffer after [`check_len`](Self::check_len).
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Checks the header is present and its length field covers it.
    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        if usize::from(self.len()) < HEADER_LEN {
            return Err(Error::Malformed);
        }
        Ok(())
    }

    /// Source port.
    pub fn src_port(&self) -> u16 {
        u16_at(self.buffer.as_ref(), field::SRC_PORT)
    }

    /// Destination port.
    pub fn dst_port(&self) -> u16 {
        u16_at(self.buffer.as_ref(), field::DST_PORT)
    }

    /// Length field.
    pub fn len(&self) -> u16 {
        u16_at(self.buffer.as_ref(), field::LENGTH)
    }

    /// Whether the length field says there is no payload.
    pub fn is_empty(&self) -> bool {
        usize::from(self.len()) <= HEADER_LEN
    }

    /// Checksum field.
    pub fn checksum(&self) -> u16 {
        u16_at(self.buffer.as_ref(), field::CHECKSUM)
    }

    /// Payload as captured and as far as the length field says.
    pub fn payload(&self) -> &[u8] {
        let buf = self.buffer.as_ref();
        let end = usize::from(self.len()).min(buf.len());
        buf.get(HEADER_LEN..end).unwrap_or(&[])
    }

    /// Whether the checksum is correct (a zero checksum means "none").
    pub fn verify_checksum(&self, pseudo_header_sum: u32) -> bool {
        if self.checksum() == 0 {
            return true;
        }
        let buf = self.buffer.as_ref();
        let end = usize::from(self.len()).min(buf.len());
        let data = buf.get(..end).unwrap_or(buf);
        checksum::fold(checksum::sum(pseudo_header_sum, data)) == 0xffff
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> UdpPacket<T> {
    fn set_checksum_field(&mut self, c: u16) {
        // 0 means "no checksum" in UDP, so a computed 0 is sent as 0xffff.
        set_u16(self.buffer.as_mut(), field::CHECKSUM, if c == 0 { 0xffff } else { c });
    }

    /// Sets the source port, updating a present checksum incrementally.
    pub fn set_src_port(&mut self, port: u16) {
        let old = self.src_port();
        set_u16(self.buffer.as_mut(), field::SRC_PORT, port);
        if self.checksum() != 0 {
            let c = checksum::update_u16(self.checksum(), old, port);
            self.set_checksum_field(c);
        }
    }

    /// Sets the destination port, updating a present checksum incrementally.
    pub fn set_dst_port(&mut self, port: u16) {
        let old = self.dst_port();
        set_u16(self.buffer.as_mut(), field::DST_PORT, port);
        if self.checksum() != 0 {
            let c = checksum::update_u16(self.checksum(), old, port);
            self.set_checksum_field(c);
        }
    }

    /// Updates a present checksum for a pseudo-header address change.
    pub fn update_checksum_for_address(&mut self, old: &[u8], new: &[u8]) {
        if self.checksum() != 0 {
            let c = checksum::update_bytes(self.checksum(), old, new);
            self.set_checksum_field(c);
        }
    }

    /// Sets the length field (header and payload).
    pub fn set_len(&mut self, len: u16) {
        set_u16(self.buffer.as_mut(), field::LENGTH, len);
    }

    /// Recomputes the checksum from scratch.
    pub fn fill_checksum(&mut self, pseudo_header_sum: u32) {
        set_u16(self.buffer.as_mut(), field::CHECKSUM, 0);
        let buf = self.buffer.as_ref();
        let end = usize::from(self.len()).min(buf.len());
        let data = buf.get(..end).unwrap_or(buf);
        let c = !checksum::fold(checksum::sum(pseudo_header_sum, data));
        self.set_checksum_field(c);
    }
}
