//! ICMP and ICMPv6 headers (the common part and echo messages).

use crate::bytes::{u8_at, u16_at};
use crate::{Error, Result};

/// Field positions of the ICMP header.
pub mod field {
    use core::ops::Range;
    /// Message type.
    pub const TYPE: usize = 0;
    /// Message code.
    pub const CODE: usize = 1;
    /// Checksum.
    pub const CHECKSUM: Range<usize> = 2..4;
    /// Echo identifier.
    pub const ECHO_IDENT: Range<usize> = 4..6;
    /// Echo sequence number.
    pub const ECHO_SEQNO: Range<usize> = 6..8;
}

/// Length of the ICMP header including the rest-of-header word.
pub const HEADER_LEN: usize = 8;

/// ICMPv4 echo request type.
pub const V4_ECHO_REQUEST: u8 = 8;
/// ICMPv4 echo reply type.
pub const V4_ECHO_REPLY: u8 = 0;
/// ICMPv6 echo request type.
pub const V6_ECHO_REQUEST: u8 = 128;
/// ICMPv6 echo reply type.
pub const V6_ECHO_REPLY: u8 = 129;

/// A view of an ICMP or ICMPv6 message.
#[derive(Debug, Clone)]
pub struct IcmpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> IcmpPacket<T> {
    /// Wraps a buffer without checking it.
    pub const fn new_unchecked(buffer: T) -> Self {
        IcmpPacket { buffer }
    }

    /// Wraps a buffer after [`check_len`](Self::check_len).
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Checks the buffer holds the 8-byte header.
    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < HEADER_LEN { Err(Error::Truncated) } else { Ok(()) }
    }

    /// Message type.
    pub fn msg_type(&self) -> u8 {
        u8_at(self.buffer.as_ref(), field::TYPE)
    }

    /// Message code.
    pub fn msg_code(&self) -> u8 {
        u8_at(self.buffer.as_ref(), field::CODE)
    }

    /// Checksum field.
    pub fn checksum(&self) -> u16 {
        u16_at(self.buffer.as_ref(), field::CHECKSUM)
    }

    /// Echo identifier (meaningful for echo messages).
    pub fn echo_ident(&self) -> u16 {
        u16_at(self.buffer.as_ref(), field::ECHO_IDENT)
    }

    /// Echo sequence number (meaningful for echo messages).
    pub fn echo_seq_no(&self) -> u16 {
        u16_at(self.buffer.as_ref(), field::ECHO_SEQNO)
    }

    /// Whether this is an echo request or reply of ICMPv4 (`v6 = false`)
    /// or ICMPv6 (`v6 = true`).
    pub fn is_echo(&self, v6: bool) -> bool {
        let t = self.msg_type();
        if v6 { t == V6_ECHO_REQUEST || t == V6_ECHO_REPLY } else { t == V4_ECHO_REQUEST || t == V4_ECHO_REPLY }
    }
}
