//! Ethernet II frames and 802.1Q / 802.1ad VLAN tags.

use crate::bytes::{array, set_slice, set_u16, u16_at};
use crate::{Error, Result};

/// Field positions of the Ethernet header.
pub mod field {
    use core::ops::Range;
    /// Destination MAC address.
    pub const DST: Range<usize> = 0..6;
    /// Source MAC address.
    pub const SRC: Range<usize> = 6..12;
    /// EtherType (or TPID of a VLAN tag).
    pub const ETHERTYPE: Range<usize> = 12..14;
    /// Start of the payload.
    pub const PAYLOAD: usize = 14;
    /// A VLAN tag's tag control information, relative to the tag.
    pub const VLAN_TCI: Range<usize> = 0..2;
    /// A VLAN tag's inner EtherType, relative to the tag.
    pub const VLAN_ETHERTYPE: Range<usize> = 2..4;
    /// Length of one VLAN tag.
    pub const VLAN_LEN: usize = 4;
}

/// Length of an Ethernet header without VLAN tags.
pub const HEADER_LEN: usize = field::PAYLOAD;

/// EtherType values Sluice understands.
pub mod ethertype {
    /// IPv4.
    pub const IPV4: u16 = 0x0800;
    /// ARP.
    pub const ARP: u16 = 0x0806;
    /// 802.1Q VLAN tag.
    pub const VLAN: u16 = 0x8100;
    /// 802.1ad (QinQ) service tag.
    pub const QINQ: u16 = 0x88a8;
    /// IPv6.
    pub const IPV6: u16 = 0x86dd;
}

/// A MAC address written `02:00:5e:10:00:01` (six hex bytes, colons
/// between), or `None`.
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = s.split(':');
    for b in &mut mac {
        let p = parts.next()?;
        if p.is_empty() || p.len() > 2 {
            return None;
        }
        *b = u8::from_str_radix(p, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

/// A view of an Ethernet II frame.
#[derive(Debug, Clone)]
pub struct EthernetFrame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> EthernetFrame<T> {
    /// Wraps a buffer without checking its length.
    pub const fn new_unchecked(buffer: T) -> Self {
        EthernetFrame { buffer }
    }

    /// Wraps a buffer after checking it holds a whole Ethernet header.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let f = Self::new_unchecked(buffer);
        f.check_len()?;
        Ok(f)
    }

    /// Ensures every accessor stays in bounds.
    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < HEADER_LEN { Err(Error::Truncated) } else { Ok(()) }
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Destination MAC address.
    pub fn dst(&self) -> [u8; 6] {
        array(self.buffer.as_ref(), field::DST)
    }

    /// Source MAC address.
    pub fn src(&self) -> [u8; 6] {
        array(self.buffer.as_ref(), field::SRC)
    }

    /// The outer EtherType (a VLAN TPID when the frame is tagged).
    pub fn ethertype(&self) -> u16 {
        u16_at(self.buffer.as_ref(), field::ETHERTYPE)
    }

    /// Skips any 802.1Q / 802.1ad tags (at most two) and returns the inner
    /// EtherType, the offset of the network header, and the outer VLAN id.
    pub fn network(&self) -> Result<(u16, usize, Option<u16>)> {
        let buf = self.buffer.as_ref();
        let mut ethertype = self.ethertype();
        let mut offset = field::PAYLOAD;
        let mut vlan = None;
        let mut tags = 0;
        while ethertype == ethertype::VLAN || ethertype == ethertype::QINQ {
            if tags == 2 {
                return Err(Error::Malformed);
            }
            let tag = buf.get(offset..offset + field::VLAN_LEN).ok_or(Error::Truncated)?;
            if vlan.is_none() {
                vlan = Some(u16_at(tag, field::VLAN_TCI) & 0x0fff);
            }
            ethertype = u16_at(tag, field::VLAN_ETHERTYPE);
            offset += field::VLAN_LEN;
            tags += 1;
        }
        Ok((ethertype, offset, vlan))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> EthernetFrame<T> {
    /// Sets the destination MAC address.
    pub fn set_dst(&mut self, mac: [u8; 6]) {
        set_slice(self.buffer.as_mut(), field::DST, &mac);
    }

    /// Sets the source MAC address.
    pub fn set_src(&mut self, mac: [u8; 6]) {
        set_slice(self.buffer.as_mut(), field::SRC, &mac);
    }

    /// Sets the outer EtherType.
    pub fn set_ethertype(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), field::ETHERTYPE, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_are_six_hex_bytes() {
        assert_eq!(parse_mac("02:00:5e:10:0:FF"), Some([2, 0, 0x5e, 0x10, 0, 0xff]));
        for bad in
            ["", "02:00:5e:10:00", "02:00:5e:10:00:01:02", "02:00:5e:10:00:zz", "02:00:5e:10:00:123", "02::5e:10:00:01"]
        {
            assert_eq!(parse_mac(bad), None, "{bad}");
        }
    }

    #[test]
    fn vlan_tags_are_skipped() {
        let mut f = [0u8; 22];
        f[12..14].copy_from_slice(&ethertype::QINQ.to_be_bytes());
        f[14..16].copy_from_slice(&0x0064u16.to_be_bytes());
        f[16..18].copy_from_slice(&ethertype::VLAN.to_be_bytes());
        f[20..22].copy_from_slice(&ethertype::IPV6.to_be_bytes());
        let frame = EthernetFrame::new_checked(&f[..]).unwrap();
        assert_eq!(frame.network(), Ok((ethertype::IPV6, 22, Some(100))));
    }

    #[test]
    fn three_tags_are_malformed() {
        let mut f = [0u8; 30];
        for off in [12, 16, 20] {
            f[off..off + 2].copy_from_slice(&ethertype::VLAN.to_be_bytes());
        }
        let frame = EthernetFrame::new_checked(&f[..]).unwrap();
        assert_eq!(frame.network(), Err(Error::Malformed));
    }

    #[test]
    fn short_frame_is_truncated() {
        assert_eq!(EthernetFrame::new_checked(&[0u8; 13][..]).err(), Some(Error::Truncated));
    }
}
