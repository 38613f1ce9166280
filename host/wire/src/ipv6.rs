//! IPv6 headers and the extension headers between them and the transport.

use crate::bytes::{array, set_slice, u8_at, u16_at, u32_at};
use crate::{Error, Result};

/// Field positions of the IPv6 header.
pub mod field {
    use core::ops::Range;
    /// Version, traffic class, flow label.
    pub const VER_TC_FLOW: Range<usize> = 0..4;
    /// Payload length.
    pub const LENGTH: Range<usize> = 4..6;
    /// Next header.
    pub const NXT_HDR: usize = 6;
    /// Hop limit.
    pub const HOP_LIMIT: usize = 7;
    /// Source address.
    pub const SRC: Range<usize> = 8..24;
    /// Destination address.
    pub const DST: Range<usize> = 24..40;
}

/// Length of the fixed IPv6 header.
pub const HEADER_LEN: usize = 40;

/// Extension headers that are skipped to find the transport header.
pub mod ext {
    /// Hop-by-hop options.
    pub const HOP_BY_HOP: u8 = 0;
    /// Routing.
    pub const ROUTING: u8 = 43;
    /// Fragment.
    pub const FRAGMENT: u8 = 44;
    /// Destination options.
    pub const DEST_OPTS: u8 = 60;
}

/// Longest chain of extension headers followed before giving up, so that a
/// hostile packet cannot make parsing expensive.
pub const MAX_EXTENSION_HEADERS: usize = 8;

/// Where the upper-layer (transport) header of an IPv6 packet is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpperLayer {
    /// Protocol number of the upper layer.
    pub protocol: u8,
    /// Offset of its header from the start of the IPv6 header.
    pub offset: usize,
    /// Whether a fragment header was on the way.
    pub fragment: bool,
    /// Whether this is a non-first fragment (its transport header is absent).
    pub later_fragment: bool,
    /// Offset of the fragment header from the start of the IPv6 header,
    /// when there is one.
    pub fragment_header: Option<usize>,
}

/// A view of an IPv6 packet.
#[derive(Debug, Clone)]
pub struct Ipv6Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Ipv6Packet<T> {
    /// Wraps a buffer without checking it.
    pub const fn new_unchecked(buffer: T) -> Self {
        Ipv6Packet { buffer }
    }

    /// Wraps a buffer after [`check_len`](Self::check_len).
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Checks the buffer holds the fixed header and the version is 6.
    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        if self.version() != 6 {
            return Err(Error::Malformed);
        }
        Ok(())
    }

    /// IP version (6).
    pub fn version(&self) -> u8 {
        u8_at(self.buffer.as_ref(), 0) >> 4
    }

    /// Traffic class.
    pub fn traffic_class(&self) -> u8 {
        ((u32_at(self.buffer.as_ref(), field::VER_TC_FLOW) >> 20) & 0xff) as u8
    }

    /// Flow label.
    pub fn flow_label(&self) -> u32 {
        u32_at(self.buffer.as_ref(), field::VER_TC_FLOW) & 0x000f_ffff
    }

    /// Payload length field.
    pub fn payload_len(&self) -> u16 {
        u16_at(self.buffer.as_ref(), field::LENGTH)
    }

    /// Next header of the fixed header.
    pub fn next_header(&self) -> u8 {
        u8_at(self.buffer.as_ref(), field::NXT_HDR)
    }

    /// Hop limit.
    pub fn hop_limit(&self) -> u8 {
        u8_at(self.buffer.as_ref(), field::HOP_LIMIT)
    }

    /// Source address.
    pub fn src(&self) -> [u8; 16] {
        array(self.buffer.as_ref(), field::SRC)
    }

    /// Destination address.
    pub fn dst(&self) -> [u8; 16] {
        array(self.buffer.as_ref(), field::DST)
    }

    /// Follows extension headers to the upper-layer protocol.
    pub fn upper_layer(&self) -> Result<UpperLayer> {
        let buf = self.buffer.as_ref();
        let mut next = self.next_header();
        let mut offset = HEADER_LEN;
        let mut fragment = false;
        let mut fragment_header = None;
        for _ in 0..MAX_EXTENSION_HEADERS {
            match next {
                ext::HOP_BY_HOP | ext::ROUTING | ext::DEST_OPTS => {
                    let h = buf.get(offset..offset + 2).ok_or(Error::Truncated)?;
                    let len = (usize::from(u8_at(h, 1)) + 1) * 8;
                    next = u8_at(h, 0);
                    offset += len;
                }
                ext::FRAGMENT => {
                    let h = buf.get(offset..offset + 8).ok_or(Error::Truncated)?;
                    let frag_off = u16_at(h, 2..4) & 0xfff8;
                    next = u8_at(h, 0);
                    fragment_header = Some(offset);
                    offset += 8;
                    fragment = true;
                    if frag_off != 0 {
                        return Ok(UpperLayer {
                            protocol: next,
                            offset,
                            fragment,
                            later_fragment: true,
                            fragment_header,
                        });
                    }
                }
                _ => {
                    return Ok(UpperLayer { protocol: next, offset, fragment, later_fragment: false, fragment_header });
                }
            }
        }
        Err(Error::Malformed)
    }

    /// The payload (everything after the fixed header) as far as captured
    /// and as far as the payload length says.
    pub fn payload(&self) -> &[u8] {
        let buf = self.buffer.as_ref();
        let end = (HEADER_LEN + usize::from(self.payload_len())).min(buf.len());
        buf.get(HEADER_LEN..end).unwrap_or(&[])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv6Packet<T> {
    /// Sets the source address (IPv6 has no header checksum; fix the
    /// transport checksum).
    pub fn set_src(&mut self, addr: [u8; 16]) {
        set_slice(self.buffer.as_mut(), field::SRC, &addr);
    }

    /// Sets the destination address.
    pub fn set_dst(&mut self, addr: [u8; 16]) {
        set_slice(self.buffer.as_mut(), field::DST, &addr);
    }

    /// Sets the payload length.
    pub fn set_payload_len(&mut self, len: u16) {
        crate::bytes::set_u16(self.buffer.as_mut(), field::LENGTH, len);
    }

    /// Sets the hop limit.
    pub fn set_hop_limit(&mut self, v: u8) {
        crate::bytes::set_u8(self.buffer.as_mut(), field::HOP_LIMIT, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extension_headers_are_followed() {
        let mut p = [0u8; 40 + 8 + 8 + 8];
        p[0] = 0x60;
        p[4..6].copy_from_slice(&24u16.to_be_bytes());
        p[6] = ext::HOP_BY_HOP;
        p[40] = ext::FRAGMENT; // hop-by-hop, 8 bytes
        p[48] = 17; // fragment header -> UDP, offset 0
        let v = Ipv6Packet::new_checked(&p[..]).unwrap();
        assert_eq!(
            v.upper_layer(),
            Ok(UpperLayer {
                protocol: 17,
                offset: 56,
                fragment: true,
                later_fragment: false,
                fragment_header: Some(48)
            })
        );
    }

    #[test]
    fn later_fragment_has_no_transport() {
        let mut p = [0u8; 48];
        p[0] = 0x60;
        p[6] = ext::FRAGMENT;
        p[40] = 6;
        p[42..44].copy_from_slice(&(185u16 << 3).to_be_bytes());
        let v = Ipv6Packet::new_checked(&p[..]).unwrap();
        assert_eq!(
            v.upper_layer(),
            Ok(UpperLayer { protocol: 6, offset: 48, fragment: true, later_fragment: true, fragment_header: Some(40) })
        );
    }

    #[test]
    fn extension_loop_is_bounded() {
        let mut p = [0u8; 40 + 8 * 20];
        p[0] = 0x60;
        p[6] = ext::DEST_OPTS;
        for i in 0..20 {
            p[40 + 8 * i] = ext::DEST_OPTS;
        }
        let v = Ipv6Packet::new_checked(&p[..]).unwrap();
        assert_eq!(v.upper_layer(), Err(Error::Malformed));
    }
}
