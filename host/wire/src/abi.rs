//! Encodings of the `sluice:nf` batch that host and guests share: packet
//! descriptors, framed flow states and verdicts. Kept here, next to the
//! parser both sides use, so the two ends cannot drift apart. The layout is
//! specified in `wit/v0.2.0/nf.wit` (and identically in `wit/v0.1.0/nf.wit`) (`record batch`);
//! the batch frame of `sluice:nf@0.6.0` (the same three parts in one byte
//! list) in `wit/v0.6.0/nf.wit` (`nf.process`); 0.7.0's returns and result
//! frame in `wit/v0.7.0/nf.wit`.

mod result_frame;

pub use result_frame::{
    OFFLOAD_HEAD, OFFLOAD_OP, OffloadRecord, Offloads, OpRecord, RESULT_TRAILER, RETURN_COUNTS, Records, ResultFrame,
    ResultFrameError, ResultFrameWriter,
};

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

    /// Reads descriptor `i` from descriptors as little-endian bytes
    /// ([`DESCRIPTOR_BYTES`] each, as a batch frame holds them); `None`
    /// past the end.
    pub fn decode_le(bytes: &[u8], i: usize) -> Option<Descriptor> {
        let b = bytes.get(i * DESCRIPTOR_BYTES..(i + 1) * DESCRIPTOR_BYTES)?;
        let mut words = [0u64; DESCRIPTOR_WORDS];
        for (w, c) in words.iter_mut().zip(b.chunks_exact(8)) {
            *w = u64::from_le_bytes(<[u8; 8]>::try_from(c).ok()?);
        }
        Descriptor::decode(&words, 0)
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

/// Bytes of a batch frame's trailer: packets, data bytes, flow-state
/// bytes and return bytes (0.6.0: reserved, 0), each a little-endian u32.
pub const FRAME_TRAILER: usize = 16;

/// Bytes of one descriptor in a batch frame.
pub const DESCRIPTOR_BYTES: usize = DESCRIPTOR_WORDS * 8;

/// Why a byte list is not a batch frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Shorter than its trailer.
    #[error("batch frame of {0} bytes: shorter than its 16-byte trailer")]
    NoTrailer(usize),
    /// The trailer's lengths do not add up to the frame's.
    #[error(
        "batch frame of {len} bytes: its trailer says {packets} packets, {data} data bytes, {states} flow-state bytes, {returns} return bytes"
    )]
    Lengths {
        /// The frame's length.
        len: usize,
        /// Packets, per the trailer.
        packets: u32,
        /// Data bytes, per the trailer.
        data: u32,
        /// Flow-state bytes, per the trailer.
        states: u32,
        /// Return bytes, per the trailer.
        returns: u32,
    },
}

/// Appends the rest of a batch frame (`sluice:nf@0.6.0`) to `frame`, which
/// holds the batch's packet bytes: padding to a multiple of 8, the
/// descriptors, the flow states and the trailer. `frame.truncate(n)` with
/// the returned length gives the packet bytes back.
pub fn seal_frame(frame: &mut Vec<u8>, descriptors: &[u64], flow_states: &[u8]) -> usize {
    seal_frame_with_returns(frame, descriptors, flow_states, &[])
}

/// [`seal_frame`] for `sluice:nf@0.7.0`: the returns (records of
/// [`RETURN_BYTES`], see [`ReturnRecord`]) follow the flow states and the
/// trailer's last word counts their bytes.
pub fn seal_frame_with_returns(frame: &mut Vec<u8>, descriptors: &[u64], flow_states: &[u8], returns: &[u8]) -> usize {
    let data = frame.len();
    let padded = data.next_multiple_of(8);
    let packets = descriptors.len() / DESCRIPTOR_WORDS;
    frame.reserve(padded - data + descriptors.len() * 8 + flow_states.len() + returns.len() + FRAME_TRAILER);
    frame.resize(padded, 0);
    for w in descriptors {
        frame.extend_from_slice(&w.to_le_bytes());
    }
    frame.extend_from_slice(flow_states);
    frame.extend_from_slice(returns);
    for v in [packets, data, flow_states.len(), returns.len()] {
        frame.extend_from_slice(&u32::try_from(v).unwrap_or(u32::MAX).to_le_bytes());
    }
    data
}

/// A batch frame (`sluice:nf@0.6.0` `process`), split into its parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchFrame<'a> {
    /// The packets' bytes, back to back.
    pub data: &'a [u8],
    /// [`DESCRIPTOR_BYTES`] per packet, little-endian words.
    pub descriptors: &'a [u8],
    /// Framed flow states (see [`push_flow_state`]).
    pub flow_states: &'a [u8],
    /// Returns of ended offload entries (0.7.0; [`RETURN_BYTES`] each).
    pub returns: &'a [u8],
}

impl<'a> BatchFrame<'a> {
    /// Splits `frame` by its trailer.
    ///
    /// Errors: a frame shorter than its trailer, or whose trailer's lengths
    /// do not add up to its own.
    pub fn parse(frame: &'a [u8]) -> Result<Self, FrameError> {
        let len = frame.len();
        let (body, trailer) = frame.split_last_chunk::<FRAME_TRAILER>().ok_or(FrameError::NoTrailer(len))?;
        let word = |i: usize| {
            trailer.get(i * 4..i * 4 + 4).and_then(|b| <[u8; 4]>::try_from(b).ok()).map_or(0, u32::from_le_bytes)
        };
        let (packets, data, states, returns) = (word(0), word(1), word(2), word(3));
        let bad = FrameError::Lengths { len, packets, data, states, returns };
        let padded = (data as usize).next_multiple_of(8);
        let descriptors = (packets as usize).checked_mul(DESCRIPTOR_BYTES).ok_or(bad)?;
        let states_at = padded.checked_add(descriptors).ok_or(bad)?;
        let returns_at = states_at.checked_add(states as usize).ok_or(bad)?;
        if returns_at.checked_add(returns as usize) != Some(body.len())
            || !(returns as usize).is_multiple_of(RETURN_BYTES)
        {
            return Err(bad);
        }
        Ok(BatchFrame {
            data: body.get(..data as usize).ok_or(bad)?,
            descriptors: body.get(padded..states_at).ok_or(bad)?,
            flow_states: body.get(states_at..returns_at).ok_or(bad)?,
            returns: body.get(returns_at..).ok_or(bad)?,
        })
    }

    /// Number of packets.
    pub fn len(&self) -> usize {
        self.descriptors.len() / DESCRIPTOR_BYTES
    }

    /// Whether it holds no packet.
    pub fn is_empty(&self) -> bool {
        self.descriptors.is_empty()
    }

    /// Descriptor `i`; `None` past the end.
    pub fn descriptor(&self, i: usize) -> Option<Descriptor> {
        Descriptor::decode_le(self.descriptors, i)
    }
}

/// Bytes of one return in a batch frame (`sluice:nf@0.7.0`).
pub const RETURN_BYTES: usize = 72;

/// Bytes of a flow's normalized 5-tuple as returns and `expired` give it.
pub const FLOW_KEY_BYTES: usize = 37;

/// What passed under an ended offload entry, as a 0.7.0 batch frame hands
/// it in (the layout is `nf.process`'s, part 5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReturnRecord {
    /// The flow's hash (descriptor word 2).
    pub flow_hash: u64,
    /// Packets that passed under the entry.
    pub packets: u64,
    /// Their bytes on the wire.
    pub bytes: u64,
    /// The flow's index in the batch, where a packet of it is there.
    pub flow: Option<u32>,
    /// Whether the entry was for the flow's reverse direction.
    pub reverse: bool,
    /// Why it ended: the `end-reason` case (0 closed ... 4 replaced).
    pub reason: u8,
    /// The flow's normalized 5-tuple.
    pub key: [u8; FLOW_KEY_BYTES],
}

impl ReturnRecord {
    /// Appends the record's [`RETURN_BYTES`] to `out`.
    pub fn push(&self, out: &mut Vec<u8>) {
        for w in [self.flow_hash, self.packets, self.bytes] {
            out.extend_from_slice(&w.to_le_bytes());
        }
        out.extend_from_slice(&self.flow.unwrap_or(u32::MAX).to_le_bytes());
        out.extend_from_slice(&[u8::from(self.reverse), self.reason, 0, 0]);
        out.extend_from_slice(&self.key);
        out.extend_from_slice(&[0; RETURN_BYTES - 32 - FLOW_KEY_BYTES]);
    }

    /// Reads return `i` of a frame's returns; `None` past the end.
    pub fn decode(returns: &[u8], i: usize) -> Option<ReturnRecord> {
        let r = returns.get(i * RETURN_BYTES..(i + 1) * RETURN_BYTES)?;
        let word = |at: usize| r.get(at..at + 8).and_then(|b| <[u8; 8]>::try_from(b).ok()).map(u64::from_le_bytes);
        let flow = u32::from_le_bytes(<[u8; 4]>::try_from(r.get(24..28)?).ok()?);
        Some(ReturnRecord {
            flow_hash: word(0)?,
            packets: word(8)?,
            bytes: word(16)?,
            flow: (flow != u32::MAX).then_some(flow),
            reverse: *r.get(28)? != 0,
            reason: *r.get(29)?,
            key: <[u8; FLOW_KEY_BYTES]>::try_from(r.get(32..32 + FLOW_KEY_BYTES)?).ok()?,
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
    fn a_sealed_frame_parses_into_its_parts_and_gives_its_data_back() {
        let d = |end: u32| Descriptor { end, wire_len: end, timestamp_ns: 9, flow: 0, ..Default::default() }.encode();
        let descriptors: Vec<u64> = [d(60), d(125)].concat();
        let mut states = Vec::new();
        push_flow_state(&mut states, b"xy");
        let mut frame: Vec<u8> = (0..125u8).collect();
        let data = seal_frame(&mut frame, &descriptors, &states);
        assert_eq!(data, 125);
        assert_eq!(frame.len(), 128 + 64 + 6 + FRAME_TRAILER);
        let f = BatchFrame::parse(&frame).unwrap();
        assert_eq!(f.len(), 2);
        assert_eq!(f.data.len(), 125);
        assert_eq!(f.flow_states, &states[..]);
        assert_eq!(f.descriptor(1).map(|d| d.end), Some(125));
        assert_eq!(f.descriptor(2), None);
        assert!(f.returns.is_empty());
        frame.truncate(data);
        assert_eq!(frame, (0..125u8).collect::<Vec<_>>());
        // 0.7.0: returns after the flow states.
        let r = ReturnRecord {
            flow_hash: 7,
            packets: 63,
            bytes: 4032,
            flow: None,
            reverse: true,
            reason: 2,
            key: [9; FLOW_KEY_BYTES],
        };
        let mut returns = Vec::new();
        r.push(&mut returns);
        ReturnRecord { flow: Some(1), ..r }.push(&mut returns);
        assert_eq!(returns.len(), 2 * RETURN_BYTES);
        let data = seal_frame_with_returns(&mut frame, &descriptors, &states, &returns);
        let f = BatchFrame::parse(&frame).unwrap();
        assert_eq!((f.len(), f.flow_states, f.returns), (2, &states[..], &returns[..]));
        assert_eq!(ReturnRecord::decode(f.returns, 0), Some(r));
        assert_eq!(ReturnRecord::decode(f.returns, 1).and_then(|r| r.flow), Some(1));
        assert_eq!(ReturnRecord::decode(f.returns, 2), None);
        frame.truncate(data);
        let empty = {
            let mut e = Vec::new();
            seal_frame(&mut e, &[], &[]);
            e
        };
        assert!(BatchFrame::parse(&empty).unwrap().is_empty());
    }

    #[test]
    fn frames_whose_lengths_disagree_are_refused() {
        let mut frame = vec![1u8; 8];
        seal_frame(&mut frame, &Descriptor::default().encode(), &[]);
        assert!(BatchFrame::parse(&frame).is_ok());
        assert_eq!(BatchFrame::parse(&frame[..15]), Err(FrameError::NoTrailer(15)));
        assert!(BatchFrame::parse(&frame[1..]).is_err());
        let mut more = frame.clone();
        more.insert(0, 0);
        assert!(BatchFrame::parse(&more).is_err());
        // Lengths that overflow when added up.
        let mut huge = vec![0u8; 16];
        huge[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        huge[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(BatchFrame::parse(&huge).is_err());
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_parse_or_are_refused_without_panicking(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..200)) {
            if let Ok(f) = BatchFrame::parse(&bytes) {
                proptest::prop_assert_eq!(f.data.len().next_multiple_of(8) + f.descriptors.len() + f.flow_states.len() + f.returns.len() + FRAME_TRAILER, bytes.len());
                for i in 0..=f.len() {
                    let _ = f.descriptor(i);
                }
            }
        }
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
