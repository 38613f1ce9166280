//! Putting an IP datagram back together from its fragments (RFC 791 §3.2,
//! RFC 8200 §4.5), and cutting it again the way it came.
//!
//! A [`Datagram`] collects the fragments of one datagram (one
//! [`FragmentKey`](crate::fragment::FragmentKey)) in any order. Fragments
//! that overlap one received before make the whole datagram invalid (RFC
//! 5722; Linux does the same for IPv4); an exact duplicate is ignored.
//! Once the last byte is in, [`Datagram::assemble`] gives the whole
//! datagram as one frame: the first fragment's link and IP headers with the
//! fragmentation undone (IPv4: offset and More Fragments cleared, total
//! length and checksum set; IPv6: the Fragment header removed).
//! [`split`] cuts such a datagram back into fragments of at most the size
//! of the largest one it came in (as Linux does after `nf_defrag`), so the
//! path MTU its source found still holds.

use crate::bytes::{set_slice, set_u8, set_u16, u8_at, u16_at};
use crate::fragment::IpFacts;
use crate::ipv4::{self, Ipv4Packet};
use crate::ipv6::{self, Ipv6Packet, ext};

/// The largest IP datagram: 65,535 bytes of IPv4 total length, or of IPv6
/// payload after the fixed header.
pub const MAX_DATAGRAM: usize = 65_535;

/// Why a fragment was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FragmentError {
    /// It is not an IP fragment, or its headers are malformed.
    Malformed,
    /// It overlaps part of the datagram already received: the datagram
    /// cannot be trusted any more and is discarded (RFC 5722).
    Overlap,
    /// It ends past 65,535 bytes, or past the end another fragment set.
    TooLong,
    /// A fragment that is not the last carries a length that is not a
    /// multiple of 8, or two fragments end the datagram at different places.
    Inconsistent,
}

impl FragmentError {
    /// A short name for counters and logs.
    pub fn name(self) -> &'static str {
        match self {
            FragmentError::Malformed => "malformed",
            FragmentError::Overlap => "overlap",
            FragmentError::TooLong => "too_long",
            FragmentError::Inconsistent => "inconsistent",
        }
    }
}

impl std::fmt::Display for FragmentError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FragmentError::Malformed => "not a well-formed IP fragment",
            FragmentError::Overlap => "the fragment overlaps one already received",
            FragmentError::TooLong => "the fragment ends past 65,535 bytes or past the datagram's last fragment",
            FragmentError::Inconsistent => "the fragments disagree on the datagram's length",
        })
    }
}

impl std::error::Error for FragmentError {}

/// What [`Datagram::add`] did with a fragment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Added {
    /// Kept; more fragments are missing.
    Kept,
    /// Kept, and it was the last one missing: [`Datagram::assemble`].
    Complete,
    /// The same bytes were received before: ignored.
    Duplicate,
}

/// The fragments of one datagram received so far.
#[derive(Debug, Clone, Default)]
pub struct Datagram {
    /// The first fragment's link header and IP header (IPv6: the headers
    /// before the Fragment header), once it came.
    head: Vec<u8>,
    /// Where the IP header starts in `head`.
    l3: usize,
    /// IPv6: where in `head` the Next Header field that names the Fragment
    /// header is, and what the Fragment header said comes next.
    next_header: Option<(usize, u8)>,
    v6: bool,
    /// The fragmentable part, as far as received (gaps are zeros).
    data: Vec<u8>,
    /// Received ranges of `data`, sorted and disjoint.
    have: Vec<(usize, usize)>,
    /// The fragmentable part's length, once the last fragment came.
    end: Option<usize>,
    /// The IP length of the largest fragment.
    largest: usize,
    /// The identification (to cut it again alike).
    ident: u32,
    fragments: u32,
}

impl Datagram {
    /// Adds one fragment: `frame` and what [`crate::fragment::inspect`]
    /// said of it (it must be a fragment).
    pub fn add(&mut self, frame: &[u8], facts: &IpFacts) -> Result<Added, FragmentError> {
        let f = facts.fragment.ok_or(FragmentError::Malformed)?;
        let ip = frame.get(facts.l3..facts.end).ok_or(FragmentError::Malformed)?;
        // Where the fragmentable part starts in the IP datagram.
        let (unfrag, next_header) = if facts.v6 {
            let p = Ipv6Packet::new_checked(ip).map_err(|_| FragmentError::Malformed)?;
            let at = p.upper_layer().ok().and_then(|u| u.fragment_header).ok_or(FragmentError::Malformed)?;
            (at, Some((next_header_field(ip, at).ok_or(FragmentError::Malformed)?, u8_at(ip, at))))
        } else {
            let p = Ipv4Packet::new_checked(ip).map_err(|_| FragmentError::Malformed)?;
            (p.header_len(), None)
        };
        let payload_at = if facts.v6 { unfrag + 8 } else { unfrag };
        let payload = ip.get(payload_at..).ok_or(FragmentError::Malformed)?;
        let start = f.offset as usize;
        let stop = start + payload.len();
        if f.more && !payload.len().is_multiple_of(8) {
            return Err(FragmentError::Inconsistent);
        }
        if unfrag + stop > MAX_DATAGRAM + if facts.v6 { ipv6::HEADER_LEN } else { 0 } {
            return Err(FragmentError::TooLong);
        }
        if self.fragments > 0 && self.v6 != facts.v6 {
            return Err(FragmentError::Malformed);
        }
        match (self.end, f.more) {
            (Some(end), _) if stop > end => return Err(FragmentError::TooLong),
            (Some(end), false) if stop != end => return Err(FragmentError::Inconsistent),
            (None, false) if self.have.last().is_some_and(|&(_, e)| e > stop) => {
                return Err(FragmentError::TooLong);
            }
            _ => {}
        }
        // Where it goes among the ranges received.
        let i = self.have.partition_point(|&(s, _)| s < start);
        if self.have.get(i).is_some_and(|&r| r == (start, stop)) {
            return Ok(Added::Duplicate);
        }
        let overlaps_before = i.checked_sub(1).and_then(|j| self.have.get(j)).is_some_and(|&(_, e)| e > start);
        let overlaps_after = self.have.get(i).is_some_and(|&(s, _)| s < stop);
        if overlaps_before || overlaps_after || (payload.is_empty() && f.more) {
            return Err(FragmentError::Overlap);
        }
        if self.data.len() < stop {
            self.data.resize(stop, 0);
        }
        if let Some(dst) = self.data.get_mut(start..stop) {
            dst.copy_from_slice(payload);
        }
        self.have.insert(i, (start, stop));
        // Merge with the neighbours, so the list stays short.
        if let (Some(&(s, e)), Some(&(s2, e2))) = (self.have.get(i), self.have.get(i + 1))
            && e == s2
        {
            self.have.splice(i..i + 2, [(s, e2)]);
        }
        if let Some(j) = i.checked_sub(1)
            && let (Some(&(s, e)), Some(&(s2, e2))) = (self.have.get(j), self.have.get(j + 1))
            && e == s2
        {
            self.have.splice(j..j + 2, [(s, e2)]);
        }
        if !f.more {
            self.end = Some(stop);
        }
        if start == 0 {
            self.head.clear();
            self.head.extend_from_slice(frame.get(..facts.l3 + unfrag).ok_or(FragmentError::Malformed)?);
            self.l3 = facts.l3;
            self.next_header = next_header.map(|(at, n)| (facts.l3 + at, n));
        }
        self.v6 = facts.v6;
        self.ident = f.key.ident;
        self.largest = self.largest.max(ip.len());
        self.fragments += 1;
        Ok(if self.complete() { Added::Complete } else { Added::Kept })
    }

    /// Whether every byte, and the first fragment's headers, came.
    pub fn complete(&self) -> bool {
        !self.head.is_empty() && self.end.is_some_and(|end| self.have.as_slice() == [(0, end)])
    }

    /// The whole datagram as one frame, once [`complete`](Self::complete).
    pub fn assemble(&self) -> Option<Vec<u8>> {
        if !self.complete() {
            return None;
        }
        let mut frame = Vec::with_capacity(self.head.len() + self.data.len());
        frame.extend_from_slice(&self.head);
        frame.extend_from_slice(&self.data);
        let ip = frame.get_mut(self.l3..)?;
        let len = ip.len();
        if self.v6 {
            let (at, next) = self.next_header?;
            set_u8(frame.as_mut_slice(), at, next);
            let ip = frame.get_mut(self.l3..)?;
            let payload = u16::try_from(len.checked_sub(ipv6::HEADER_LEN)?).ok()?;
            Ipv6Packet::new_unchecked(ip).set_payload_len(payload);
        } else {
            let flags = u16_at(ip, ipv4::field::FLG_OFF) & 0xc000;
            set_u16(ip, ipv4::field::FLG_OFF, flags);
            let mut p = Ipv4Packet::new_unchecked(ip);
            p.set_total_len(u16::try_from(len).ok()?);
            p.fill_checksum();
        }
        Some(frame)
    }

    /// How to cut the datagram again: the largest fragment's IP length and
    /// the identification.
    pub fn cut(&self) -> Cut {
        Cut { size: self.largest, ident: self.ident, v6: self.v6 }
    }

    /// Bytes this datagram holds in memory.
    pub fn held_bytes(&self) -> usize {
        self.head.len() + self.data.len() + self.have.len() * 16
    }

    /// Fragments taken so far.
    pub fn fragments(&self) -> u32 {
        self.fragments
    }
}

/// How a reassembled datagram was fragmented when it came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cut {
    /// The IP length of its largest fragment.
    pub size: usize,
    /// Its identification.
    pub ident: u32,
    /// Whether it was IPv6.
    pub v6: bool,
}

/// Cuts the datagram in `frame` into fragments whose IP part is at most
/// `cut.size` bytes (IPv4: see [`crate::fragment::split_ipv4`]; IPv6: a
/// Fragment header with `cut.ident` after the unfragmentable headers). A
/// datagram that fits, or that cannot be cut (not IP of `cut`'s version,
/// Don't Fragment), is returned whole.
pub fn split(frame: &[u8], cut: &Cut) -> Vec<Vec<u8>> {
    let pieces =
        if cut.v6 { split_ipv6(frame, cut.size, cut.ident) } else { crate::fragment::split_ipv4(frame, cut.size).ok() };
    pieces.unwrap_or_else(|| vec![frame.to_vec()])
}

/// Cuts an IPv6 datagram into fragments of at most `mtu` bytes of IP
/// (RFC 8200 §4.5): the unfragmentable part (fixed header, Hop-by-Hop
/// Options, Routing, and Destination Options before a Routing header) in
/// each, then a Fragment header. `None` when it is not IPv6, already a
/// fragment, or `mtu` leaves no room for 8 bytes of data.
pub fn split_ipv6(frame: &[u8], mtu: usize, ident: u32) -> Option<Vec<Vec<u8>>> {
    let facts = crate::fragment::inspect(frame).filter(|f| f.v6 && f.fragment.is_none())?;
    let (link, ip) = (frame.get(..facts.l3)?, frame.get(facts.l3..facts.end.min(frame.len()))?);
    if ip.len() <= mtu {
        return Some(vec![frame.to_vec()]);
    }
    // The unfragmentable part ends after the last Hop-by-Hop or Routing
    // header (and the Destination Options before a Routing header).
    let (mut at, mut field, mut next) = (ipv6::HEADER_LEN, ipv6::field::NXT_HDR, u8_at(ip, ipv6::field::NXT_HDR));
    let (mut unfrag, mut unfrag_field) = (at, field);
    for _ in 0..ipv6::MAX_EXTENSION_HEADERS {
        if !matches!(next, ext::HOP_BY_HOP | ext::ROUTING | ext::DEST_OPTS) {
            break;
        }
        let h = ip.get(at..at + 2)?;
        let len = (usize::from(u8_at(h, 1)) + 1) * 8;
        let this = next;
        (field, next) = (at, u8_at(h, 0));
        at += len;
        if this != ext::DEST_OPTS || next == ext::ROUTING {
            (unfrag, unfrag_field) = (at, field);
        }
    }
    let (head, data) = (ip.get(..unfrag)?, ip.get(unfrag..)?);
    let after = u8_at(ip, unfrag_field);
    let room = mtu.checked_sub(unfrag + 8).map(|r| r & !7).filter(|&r| r >= 8)?;
    let mut out = Vec::new();
    let mut off = 0usize;
    while off < data.len() {
        let take = room.min(data.len() - off);
        let more = off + take < data.len();
        let mut f = Vec::with_capacity(link.len() + unfrag + 8 + take);
        f.extend_from_slice(link);
        f.extend_from_slice(head);
        f.extend_from_slice(&[after, 0, 0, 0, 0, 0, 0, 0]);
        f.extend_from_slice(data.get(off..off + take)?);
        let hdr = f.get_mut(facts.l3..)?;
        set_u8(hdr, unfrag_field, ext::FRAGMENT);
        let word = u16::try_from(off).ok()? & 0xfff8 | u16::from(more);
        set_u16(hdr, unfrag + 2..unfrag + 4, word);
        set_slice(hdr, unfrag + 4..unfrag + 8, &ident.to_be_bytes());
        let payload = u16::try_from(unfrag + 8 + take - ipv6::HEADER_LEN).ok()?;
        Ipv6Packet::new_unchecked(hdr).set_payload_len(payload);
        out.push(f);
        off += take;
    }
    Some(out)
}

/// The offset in `ip` of the Next Header field that names the header at
/// `target` (the fixed header's, or the extension header's before it).
fn next_header_field(ip: &[u8], target: usize) -> Option<usize> {
    let (mut field, mut at) = (ipv6::field::NXT_HDR, ipv6::HEADER_LEN);
    for _ in 0..ipv6::MAX_EXTENSION_HEADERS {
        if at == target {
            return Some(field);
        }
        let len = (usize::from(*ip.get(at + 1)?) + 1) * 8;
        field = at;
        at += len;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::FrameSpec;
    use crate::fragment::{inspect, split_ipv4};

    fn udp4(payload: usize) -> Vec<u8> {
        let mut f = FrameSpec::udp4([10, 0, 0, 1], 5000, [10, 0, 0, 2], 53)
            .with_payload((0..payload).map(|i| i as u8).collect::<Vec<u8>>())
            .build();
        let ip = &mut f[14..];
        ip[6] = 0;
        ip[7] = 0;
        Ipv4Packet::new_unchecked(ip).fill_checksum();
        f
    }

    fn udp6(payload: usize) -> Vec<u8> {
        let mut a = [0u8; 16];
        a[..4].copy_from_slice(&[0x20, 1, 0xd, 0xb8]);
        let mut b = a;
        a[15] = 1;
        b[15] = 2;
        let spec = FrameSpec {
            src: crate::IpAddr128::from_v6(a),
            dst: crate::IpAddr128::from_v6(b),
            ..FrameSpec::udp4([0; 4], 5000, [0; 4], 53)
        };
        spec.with_payload((0..payload).map(|i| (i * 7) as u8).collect::<Vec<u8>>()).build()
    }

    fn reassemble(frags: &[Vec<u8>]) -> Result<Option<Vec<u8>>, FragmentError> {
        let mut d = Datagram::default();
        let mut done = false;
        for f in frags {
            let facts = inspect(f).ok_or(FragmentError::Malformed)?;
            done = d.add(f, &facts)? == Added::Complete;
        }
        Ok(if done { d.assemble() } else { None })
    }

    #[test]
    fn ipv4_fragments_in_any_order_give_the_datagram_back() {
        let f = udp4(3000);
        let mut frags = split_ipv4(&f, 1500).unwrap();
        assert_eq!(reassemble(&frags).unwrap().as_deref(), Some(&f[..]));
        frags.reverse();
        assert_eq!(reassemble(&frags).unwrap().as_deref(), Some(&f[..]));
        assert_eq!(reassemble(&frags[..2]).unwrap(), None, "one is missing");
    }

    #[test]
    fn ipv6_is_cut_and_put_back_together() {
        let f = udp6(3000);
        let frags = split_ipv6(&f, 1280, 0xabcd).unwrap();
        assert_eq!(frags.len(), 3);
        for fr in &frags {
            assert!(fr.len() - 14 <= 1280);
            assert_eq!(inspect(fr).unwrap().fragment.unwrap().key.ident, 0xabcd);
        }
        let whole = reassemble(&frags).unwrap().unwrap();
        assert_eq!(whole, f);
        let mut d = Datagram::default();
        for fr in &frags {
            d.add(fr, &inspect(fr).unwrap()).unwrap();
        }
        assert_eq!(d.cut(), Cut { size: 1280, ident: 0xabcd, v6: true });
        assert_eq!(split(&whole, &d.cut()), frags, "cut again as it came");
    }

    #[test]
    fn overlaps_and_inconsistent_ends_are_refused_and_duplicates_ignored() {
        let frags = split_ipv4(&udp4(3000), 1500).unwrap();
        let mut d = Datagram::default();
        assert_eq!(d.add(&frags[0], &inspect(&frags[0]).unwrap()), Ok(Added::Kept));
        assert_eq!(d.add(&frags[0], &inspect(&frags[0]).unwrap()), Ok(Added::Duplicate));
        // The same data, 8 bytes further: overlaps the first fragment.
        let mut shifted = frags[1].clone();
        let word = u16_at(&shifted[14..], ipv4::field::FLG_OFF);
        let off = (word & 0x1fff) - 1;
        set_u16(&mut shifted[14..], ipv4::field::FLG_OFF, (word & 0xe000) | off);
        assert_eq!(d.add(&shifted, &inspect(&shifted).unwrap()), Err(FragmentError::Overlap));
        // A last fragment, then one past its end.
        let mut d = Datagram::default();
        d.add(&frags[1], &inspect(&frags[1]).unwrap()).unwrap();
        let short_last = split_ipv4(&udp4(1000), 600).unwrap();
        let last = short_last.last().unwrap();
        assert_eq!(d.add(last, &inspect(last).unwrap()), Err(FragmentError::TooLong));
    }

    proptest::proptest! {
        #[test]
        fn any_cut_in_any_order_reassembles(len in 0usize..5000, mtu in 68usize..1600, seed in 0u64..1000, v6 in proptest::prelude::any::<bool>()) {
            let f = if v6 { udp6(len) } else { udp4(len) };
            let mut frags = if v6 { split_ipv6(&f, mtu.max(1280), 7).unwrap() } else { split_ipv4(&f, mtu).unwrap() };
            if frags.len() == 1 {
                return Ok(());
            }
            let n = frags.len();
            frags.rotate_left((seed as usize) % n);
            proptest::prop_assert_eq!(reassemble(&frags).unwrap(), Some(f));
        }

        #[test]
        fn arbitrary_fragments_never_panic(frames in proptest::collection::vec(proptest::collection::vec(proptest::prelude::any::<u8>(), 0..120), 0..6)) {
            let mut d = Datagram::default();
            for f in &frames {
                if let Some(facts) = inspect(f) && facts.fragment.is_some() {
                    let _ = d.add(f, &facts);
                }
            }
            let _ = d.assemble();
            for f in &frames {
                let _ = split(f, &Cut { size: 100, ident: 1, v6: true });
                let _ = split(f, &Cut { size: 100, ident: 1, v6: false });
            }
        }
    }
}
