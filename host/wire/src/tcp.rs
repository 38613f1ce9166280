//! TCP headers.

use crate::bytes::{set_u16, u8_at, u16_at, u32_at};
use crate::checksum;
use crate::{Error, Result};

/// Field positions of the TCP header.
pub mod field {
    use core::ops::Range;
    /// Source port.
    pub const SRC_PORT: Range<usize> = 0..2;
    /// Destination port.
    pub const DST_PORT: Range<usize> = 2..4;
    /// Sequence number.
    pub const SEQ_NUM: Range<usize> = 4..8;
    /// Acknowledgment number.
    pub const ACK_NUM: Range<usize> = 8..12;
    /// Data offset (high nibble).
    pub const DATA_OFF: usize = 12;
    /// Flags.
    pub const FLAGS: usize = 13;
    /// Window size.
    pub const WIN_SIZE: Range<usize> = 14..16;
    /// Checksum.
    pub const CHECKSUM: Range<usize> = 16..18;
    /// Urgent pointer.
    pub const URGENT: Range<usize> = 18..20;
}

/// Length of a TCP header without options.
pub const MIN_HEADER_LEN: usize = 20;

/// TCP flag bits.
pub mod flags {
    /// No more data from sender.
    pub const FIN: u8 = 0x01;
    /// Synchronize sequence numbers.
    pub const SYN: u8 = 0x02;
    /// Reset the connection.
    pub const RST: u8 = 0x04;
    /// Push.
    pub const PSH: u8 = 0x08;
    /// Acknowledgment field is significant.
    pub const ACK: u8 = 0x10;
    /// Urgent pointer is significant.
    pub const URG: u8 = 0x20;
}

/// A view of a TCP segment.
#[derive(Debug, Clone)]
pub struct TcpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> TcpPacket<T> {
    /// Wraps a buffer without checking it.
    pub const fn new_unchecked(buffer: T) -> Self {
        TcpPacket { buffer }
    }

    /// Wraps a buffer after [`check_len`](Self::check_len).
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Checks the buffer holds the whole header including options.
    pub fn check_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        if len < MIN_HEADER_LEN {
            return Err(Error::Truncated);
        }
        let hl = self.header_len();
        if hl < MIN_HEADER_LEN {
            return Err(Error::Malformed);
        }
        if len < hl {
            return Err(Error::Truncated);
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

    /// Sequence number.
    pub fn seq_number(&self) -> u32 {
        u32_at(self.buffer.as_ref(), field::SEQ_NUM)
    }

    /// Acknowledgment number.
    pub fn ack_number(&self) -> u32 {
        u32_at(self.buffer.as_ref(), field::ACK_NUM)
    }

    /// Header length in bytes.
    pub fn header_len(&self) -> usize {
        usize::from(u8_at(self.buffer.as_ref(), field::DATA_OFF) >> 4) * 4
    }

    /// Flag byte (see [`flags`]).
    pub fn flags(&self) -> u8 {
        u8_at(self.buffer.as_ref(), field::FLAGS)
    }

    /// SYN set.
    pub fn syn(&self) -> bool {
        self.flags() & flags::SYN != 0
    }

    /// ACK set.
    pub fn ack(&self) -> bool {
        self.flags() & flags::ACK != 0
    }

    /// FIN set.
    pub fn fin(&self) -> bool {
        self.flags() & flags::FIN != 0
    }

    /// RST set.
    pub fn rst(&self) -> bool {
        self.flags() & flags::RST != 0
    }

    /// Window size.
    pub fn window(&self) -> u16 {
        u16_at(self.buffer.as_ref(), field::WIN_SIZE)
    }

    /// Checksum field.
    pub fn checksum(&self) -> u16 {
        u16_at(self.buffer.as_ref(), field::CHECKSUM)
    }

    /// Payload as captured.
    pub fn payload(&self) -> &[u8] {
        self.buffer.as_ref().get(self.header_len()..).unwrap_or(&[])
    }

    /// Whether the checksum is correct, given the one's-complement sum of
    /// the pseudo-header ([`checksum::pseudo_header_v4`] or `_v6`). Only
    /// meaningful when the whole segment was captured.
    pub fn verify_checksum(&self, pseudo_header_sum: u32) -> bool {
        checksum::fold(checksum::sum(pseudo_header_sum, self.buffer.as_ref())) == 0xffff
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> TcpPacket<T> {
    /// Sets the source port, updating the checksum incrementally.
    pub fn set_src_port(&mut self, port: u16) {
        let c = checksum::update_u16(self.checksum(), self.src_port(), port);
        set_u16(self.buffer.as_mut(), field::SRC_PORT, port);
        set_u16(self.buffer.as_mut(), field::CHECKSUM, c);
    }

    /// Sets the destination port, updating the checksum incrementally.
    pub fn set_dst_port(&mut self, port: u16) {
        let c = checksum::update_u16(self.checksum(), self.dst_port(), port);
        set_u16(self.buffer.as_mut(), field::DST_PORT, port);
        set_u16(self.buffer.as_mut(), field::CHECKSUM, c);
    }

    /// Updates the checksum for an address in the pseudo-header changing
    /// from `old` to `new` (call after rewriting the IP source/destination).
    pub fn update_checksum_for_address(&mut self, old: &[u8], new: &[u8]) {
        let c = checksum::update_bytes(self.checksum(), old, new);
        set_u16(self.buffer.as_mut(), field::CHECKSUM, c);
    }

    /// Recomputes the checksum from scratch over the whole buffer.
    pub fn fill_checksum(&mut self, pseudo_header_sum: u32) {
        set_u16(self.buffer.as_mut(), field::CHECKSUM, 0);
        let c = !checksum::fold(checksum::sum(pseudo_header_sum, self.buffer.as_ref()));
        set_u16(self.buffer.as_mut(), field::CHECKSUM, c);
    }
}
