//! Encodings of the `sluice:nf` batch that host and guests share: packet
//! descriptors, framed flow states and verdicts. Kept here, next to the
//! parser both sides use, so the two ends cannot drift apart. The layout is
//! specified in `wit/v0.2.0/nf.wit` (and identically in `wit/v0.1.0/nf.wit`) (`record batch`).

/// u64 words per packet descriptor.
pub const DESCRIPTOR_WORDS: usize = 4;

/// Descriptor flow index for "no flow" (not an IP packet).
pub const NO_FLOW: u16 = u16::MAX;

/// Descriptor l4 offset for "no transport header".
pub const NO_L4: u16 = u16::MAX;

/// Descriptor l3 offset for "no IP header".
pub const NO_L3: u8 = u8::MAX;

/// Most packets in one batch: flow indices are 16 bits.
pub const MAX_BATCH: usize = 4096;

/// What the host knows about one packet of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Descriptor {
    /// Offset in the batch data one past the packet's last byte.
    pub end: u32,
    /// Length on the wire.
    pub wire_len: u32,
    /// Arrival time, ns since the Unix epoch.
    pub timestamp_ns: u64,
    /// Symmetric flow hash (0: no flow).
    pub flow_hash: u64,
    /// Index among the batch's distinct flows ([`NO_FLOW`]: none).
    pub flow: u16,
    /// Ingress port.
    pub ingress_port: u16,
    /// Transport header offset ([`NO_L4`]: none).
    pub l4_offset: u16,
    /// IP header offset ([`NO_L3`]: none).
    pub l3_offset: u8,
    /// [`packet_flags`] bits.
    pub flags: u8,
}

impl Descriptor {
    /// The four words of the descriptor.
    #[inline]
    pub const fn encode(&self) -> [u64; DESCRIPTOR_WORDS] {
        [
            self.end as u64 | (self.wire_len as u64) << 32,
            self.timestamp_ns,
            self.flow_hash,
            self.flow as u64
                | (self.ingress_port as u64) << 16
                | (self.l4_offset as u64) << 32
                | (self.l3_offset as u64) << 48
                | (self.flags as u64) << 56,
        ]
    }

    /// Reads descriptor `i` from a descriptor list; `None` past the end.
    pub fn decode(words: &[u64], i: usize) -> Option<Descriptor> {
        let w = words.get(i * DESCRIPTOR_WORDS..(i + 1) * DESCRIPTOR_WORDS)?;
        let (w0, w1, w2, w3) = match *w {
            [a, b, c, d] => (a, b, c, d),
            _ => return None,
        };
        Some(Descriptor {
            end: w0 as u32,
            wire_len: (w0 >> 32) as u32,
            timestamp_ns: w1,
            flow_hash: w2,
            flow: w3 as u16,
            ingress_port: (w3 >> 16) as u16,
            l4_offset: (w3 >> 32) as u16,
            l3_offset: (w3 >> 48) as u8,
            flags: (w3 >> 56) as u8,
        })
    }
}

/// Appends one flow's state to a `flow-states` list (a 4-byte
/// little-endian length, then the bytes; empty means "no state").
pub fn push_flow_state(out: &mut Vec<u8>, state: &[u8]) {
    out.extend_from_slice(&(state.len() as u32).to_le_bytes());
    out.extend_from_slice(state);
}

/// Splits a `flow-states` list into one range per flow (of the state
/// bytes). Stops at the first malformed frame.
pub fn split_flow_states(states: &[u8]) -> Vec<core::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while let Some(len) = states.get(at..at + 4).and_then(|b| <[u8; 4]>::try_from(b).ok()) {
        let len = u32::from_le_bytes(len) as usize;
        let start = at + 4;
        if start + len > states.len() {
            break;
        }
        out.push(start..start + len);
        at = start + len;
    }
    out
}

/// Appends one item to a framed list (`sluice:nf@0.2.0` `state`: a 4-byte
/// little-endian length, then the bytes). The same framing as
/// `flow-states`.
pub fn push_frame(out: &mut Vec<u8>, item: &[u8]) {
    push_flow_state(out, item);
}

/// Iterates over the items of a framed list. Yields `Err(index)` once, for
/// the first item whose header or bytes are cut short, and then stops.
pub fn frames(bytes: &[u8]) -> Frames<'_> {
    Frames { rest: bytes, index: 0, failed: false }
}

/// Iterator returned by [`frames`].
#[derive(Debug, Clone)]
pub struct Frames<'a> {
    rest: &'a [u8],
    index: u32,
    failed: bool,
}

impl<'a> Iterator for Frames<'a> {
    type Item = Result<&'a [u8], u32>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() || self.failed {
            return None;
        }
        let index = self.index;
        self.index += 1;
        let item = self.rest.split_first_chunk::<4>().and_then(|(len, rest)| {
            let len = u32::from_le_bytes(*len) as usize;
            Some((rest.get(..len)?, rest.get(len..)?))
        });
        match item {
            Some((item, rest)) => {
                self.rest = rest;
                Some(Ok(item))
            }
            None => {
                self.failed = true;
                Some(Err(index))
            }
        }
    }
}

/// Bits of descriptor flags.
pub mod packet_flags {
    /// The packet travels against its flow's normalized direction.
    pub const REVERSE: u8 = 1;
    /// IP fragment.
    pub const FRAGMENT: u8 = 2;
    /// Captured fewer bytes than were on the wire.
    pub const TRUNCATED: u8 = 4;
    /// IPv6.
    pub const IPV6: u8 = 8;
}

/// What happens to a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// Drop it.
    Drop,
    /// Send it out of this port (0 is the default output).
    Forward(u16),
    /// Hand it to the next NF of a chain selected by this label.
    Label(u16),
}

const KIND_DROP: u32 = 0;
const KIND_FORWARD: u32 = 1;
const KIND_LABEL: u32 = 2;

impl Verdict {
    /// The `verdicts` column value: `kind << 16 | value`.
    pub const fn encode(self) -> u32 {
        match self {
            Verdict::Drop => KIND_DROP << 16,
            Verdict::Forward(p) => (KIND_FORWARD << 16) | p as u32,
            Verdict::Label(l) => (KIND_LABEL << 16) | l as u32,
        }
    }

    /// Decodes a `verdicts` value; `None` for an unknown kind.
    pub const fn decode(v: u32) -> Option<Verdict> {
        let value = (v & 0xffff) as u16;
        match v >> 16 {
            KIND_DROP => Some(Verdict::Drop),
            KIND_FORWARD => Some(Verdict::Forward(value)),
            KIND_LABEL => Some(Verdict::Label(value)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn frames_round_trip_and_stop_at_a_cut() {
        let mut b = Vec::new();
        for item in [&b"ab"[..], b"", b"xyz"] {
            push_frame(&mut b, item);
        }
        let items: Vec<_> = frames(&b).collect();
        assert_eq!(items, vec![Ok(&b"ab"[..]), Ok(&b""[..]), Ok(&b"xyz"[..])]);
        let cut: Vec<_> = frames(&b[..b.len() - 1]).collect();
        assert_eq!(cut, vec![Ok(&b"ab"[..]), Ok(&b""[..]), Err(2)]);
        assert_eq!(frames(&[1, 0]).collect::<Vec<_>>(), vec![Err(0)]);
    }
    use super::*;

    #[test]
    fn descriptors_round_trip() {
        let d = Descriptor {
            end: 0xdead_beef,
            wire_len: 1514,
            timestamp_ns: u64::MAX - 3,
            flow_hash: 0x1234_5678_9abc_def0,
            flow: 4095,
            ingress_port: 7,
            l4_offset: NO_L4,
            l3_offset: 18,
            flags: packet_flags::REVERSE | packet_flags::IPV6,
        };
        let mut words = vec![0u64; 4];
        words.extend_from_slice(&d.encode());
        assert_eq!(Descriptor::decode(&words, 1), Some(d));
        assert_eq!(Descriptor::decode(&words, 2), None);
    }

    #[test]
    fn flow_states_frame_and_split() {
        let mut v = Vec::new();
        push_flow_state(&mut v, b"abc");
        push_flow_state(&mut v, b"");
        push_flow_state(&mut v, b"z");
        let r = split_flow_states(&v);
        assert_eq!(r.len(), 3);
        assert_eq!(&v[r[0].clone()], b"abc");
        assert!(r[1].is_empty());
        assert_eq!(&v[r[2].clone()], b"z");
        // A frame claiming more bytes than remain ends the list.
        v.extend_from_slice(&100u32.to_le_bytes());
        assert_eq!(split_flow_states(&v).len(), 3);
    }

    #[test]
    fn verdicts_round_trip() {
        for v in [Verdict::Drop, Verdict::Forward(0), Verdict::Forward(65535), Verdict::Label(7)] {
            assert_eq!(Verdict::decode(v.encode()), Some(v));
        }
        assert_eq!(Verdict::decode(3 << 16), None);
        assert_eq!(Verdict::Forward(0).encode(), 0x0001_0000);
    }
}
