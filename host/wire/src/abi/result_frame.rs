//! The result frame of `sluice:nf@0.7.0` (`nf.process`'s answer): the
//! verdicts, rewritten packets, flow-state changes and offload requests of
//! one batch in one byte list, read here without copying. The layout is
//! specified in `wit/v0.7.0/nf.wit`.

/// Bytes of a result frame's trailer: verdicts, rewrite bytes, flow-state
/// change bytes and offload request bytes, each a little-endian u32.
pub const RESULT_TRAILER: usize = 16;

/// Bytes of an offload request's head.
pub const OFFLOAD_HEAD: usize = 40;

/// Bytes of one header change of an offload request.
pub const OFFLOAD_OP: usize = 24;

/// Bytes of a rewrite's or flow-state change's head (index, length).
const RECORD_HEAD: usize = 8;

/// Offload request flag: hand back what passed under the entry.
pub const RETURN_COUNTS: u8 = 1;

/// Why a byte list is not a well-formed result frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ResultFrameError {
    /// Shorter than its trailer.
    #[error("result frame of {0} bytes: shorter than its 16-byte trailer")]
    NoTrailer(usize),
    /// The trailer's lengths do not add up to the frame's.
    #[error(
        "result frame of {len} bytes: its trailer says {verdicts} verdicts, {rewrites} rewrite bytes, {updates} flow-state bytes, {offloads} offload bytes"
    )]
    Lengths {
        /// The frame's length.
        len: usize,
        /// Verdicts, per the trailer.
        verdicts: u32,
        /// Rewrite bytes, per the trailer.
        rewrites: u32,
        /// Flow-state change bytes, per the trailer.
        updates: u32,
        /// Offload request bytes, per the trailer.
        offloads: u32,
    },
    /// A record runs past the end of its part.
    #[error("result frame: {part} record {index} runs past the end of its part")]
    Cut {
        /// `rewrite`, `flow-state` or `offload`.
        part: &'static str,
        /// The record's position in its part.
        index: u32,
    },
}

/// A result frame, split into its parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResultFrame<'a> {
    verdicts: &'a [u8],
    rewrites: &'a [u8],
    updates: &'a [u8],
    offloads: &'a [u8],
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    b.get(at..at + 4).and_then(|s| <[u8; 4]>::try_from(s).ok()).map(u32::from_le_bytes)
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    b.get(at..at + 8).and_then(|s| <[u8; 8]>::try_from(s).ok()).map(u64::from_le_bytes)
}

impl<'a> ResultFrame<'a> {
    /// Splits `frame` by its trailer.
    ///
    /// Errors: a frame shorter than its trailer, or whose trailer's lengths
    /// do not add up to its own.
    pub fn parse(frame: &'a [u8]) -> Result<Self, ResultFrameError> {
        let len = frame.len();
        let (body, trailer) = frame.split_last_chunk::<RESULT_TRAILER>().ok_or(ResultFrameError::NoTrailer(len))?;
        let word = |i: usize| u32_at(trailer, i * 4).unwrap_or(0);
        let (verdicts, rewrites, updates, offloads) = (word(0), word(1), word(2), word(3));
        let bad = ResultFrameError::Lengths { len, verdicts, rewrites, updates, offloads };
        let v = (verdicts as usize).checked_mul(4).ok_or(bad)?;
        let ends = [v, rewrites as usize, updates as usize, offloads as usize];
        let mut at = 0usize;
        let mut parts: [&[u8]; 4] = [&[]; 4];
        for (part, n) in parts.iter_mut().zip(ends) {
            let end = at.checked_add(n).ok_or(bad)?;
            *part = body.get(at..end).ok_or(bad)?;
            at = end;
        }
        if at != body.len() {
            return Err(bad);
        }
        let [verdicts, rewrites, updates, offloads] = parts;
        Ok(ResultFrame { verdicts, rewrites, updates, offloads })
    }

    /// How many verdicts it holds.
    pub fn verdict_count(&self) -> usize {
        self.verdicts.len() / 4
    }

    /// The verdicts (`kind << 16 | value`), in batch order.
    pub fn verdicts(&self) -> impl Iterator<Item = u32> + 'a {
        self.verdicts.chunks_exact(4).map(|c| u32_at(c, 0).unwrap_or(0))
    }

    /// The rewritten packets: (packet index, new bytes).
    pub fn rewrites(&self) -> Records<'a> {
        Records { rest: self.rewrites, index: 0, part: "rewrite", failed: false }
    }

    /// The flow-state changes: (flow index, bytes to store; empty: forget).
    pub fn updates(&self) -> Records<'a> {
        Records { rest: self.updates, index: 0, part: "flow-state", failed: false }
    }

    /// The offload requests.
    pub fn offloads(&self) -> Offloads<'a> {
        Offloads { rest: self.offloads, index: 0, failed: false }
    }
}

/// Iterator over a result frame's rewrites or flow-state changes. Yields
/// one error for the first record cut short, then stops.
#[derive(Debug, Clone)]
pub struct Records<'a> {
    rest: &'a [u8],
    index: u32,
    part: &'static str,
    failed: bool,
}

impl<'a> Iterator for Records<'a> {
    type Item = Result<(u32, &'a [u8]), ResultFrameError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() || self.failed {
            return None;
        }
        let index = self.index;
        self.index += 1;
        let record = (|| {
            let at = u32_at(self.rest, 0)?;
            let len = u32_at(self.rest, 4)? as usize;
            let end = RECORD_HEAD.checked_add(len)?;
            Some((at, self.rest.get(RECORD_HEAD..end)?, self.rest.get(end..)?))
        })();
        match record {
            Some((at, bytes, rest)) => {
                self.rest = rest;
                Some(Ok((at, bytes)))
            }
            None => {
                self.failed = true;
                Some(Err(ResultFrameError::Cut { part: self.part, index }))
            }
        }
    }
}

/// One offload request of a result frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OffloadRecord<'a> {
    /// The packet's index in the batch.
    pub packet: u32,
    /// Whether what passed under the entry comes back.
    pub return_counts: bool,
    /// Idle timeout, ns of packet time (0: the NF's flow idle timeout).
    pub idle_timeout_ns: u64,
    /// Packet limit (0: none).
    pub max_packets: u64,
    /// Byte limit (0: none).
    pub max_bytes: u64,
    /// Age limit, ns of packet time (0: none).
    pub max_age_ns: u64,
    ops: &'a [u8],
}

/// One header change of an offload request, as the frame holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpRecord {
    /// The `rewrite-op` case: 0 source, 1 destination, 2 decrement-ttl,
    /// 3 set-dscp (others are the caller's to refuse).
    pub kind: u8,
    /// The address's length as the frame says it (4 or 16 for an address).
    pub address_len: u8,
    /// The address (an IPv4 address in the first 4 bytes).
    pub address: [u8; 16],
    /// The new port, where one follows.
    pub port: Option<u16>,
    /// The DSCP of `set-dscp`.
    pub dscp: u8,
}

impl OffloadRecord<'_> {
    /// Its header changes, in order.
    pub fn ops(&self) -> impl Iterator<Item = OpRecord> + '_ {
        self.ops.chunks_exact(OFFLOAD_OP).map(|c| {
            let mut address = [0u8; 16];
            if let Some(a) = c.get(8..24) {
                address.copy_from_slice(a);
            }
            let byte = |i: usize| c.get(i).copied().unwrap_or(0);
            let port = u16::from_le_bytes([byte(4), byte(5)]);
            OpRecord {
                kind: byte(0),
                address_len: byte(1),
                address,
                port: (byte(2) != 0).then_some(port),
                dscp: byte(3),
            }
        })
    }

    /// How many header changes it lists.
    pub fn op_count(&self) -> usize {
        self.ops.len() / OFFLOAD_OP
    }
}

/// Iterator over a result frame's offload requests. Yields one error for
/// the first request cut short, then stops.
#[derive(Debug, Clone)]
pub struct Offloads<'a> {
    rest: &'a [u8],
    index: u32,
    failed: bool,
}

impl<'a> Iterator for Offloads<'a> {
    type Item = Result<OffloadRecord<'a>, ResultFrameError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() || self.failed {
            return None;
        }
        let index = self.index;
        self.index += 1;
        let r = self.rest;
        let record = (|| {
            let ops = *r.get(4)? as usize;
            let end = OFFLOAD_HEAD + ops * OFFLOAD_OP;
            let record = OffloadRecord {
                packet: u32_at(r, 0)?,
                return_counts: r.get(5)? & RETURN_COUNTS != 0,
                idle_timeout_ns: u64_at(r, 8)?,
                max_packets: u64_at(r, 16)?,
                max_bytes: u64_at(r, 24)?,
                max_age_ns: u64_at(r, 32)?,
                ops: r.get(OFFLOAD_HEAD..end)?,
            };
            Some((record, r.get(end..)?))
        })();
        match record {
            Some((record, rest)) => {
                self.rest = rest;
                Some(Ok(record))
            }
            None => {
                self.failed = true;
                Some(Err(ResultFrameError::Cut { part: "offload", index }))
            }
        }
    }
}

/// Writes result frames: what an SDK in Rust does, and what the host's
/// tests and fuzz targets build frames with.
#[derive(Debug, Clone, Default)]
pub struct ResultFrameWriter {
    rewrites: Vec<u8>,
    updates: Vec<u8>,
    offloads: Vec<u8>,
}

impl ResultFrameWriter {
    /// Adds a rewritten packet.
    pub fn rewrite(&mut self, packet: u32, bytes: &[u8]) {
        push_record(&mut self.rewrites, packet, bytes);
    }

    /// Adds a flow-state change (empty `bytes`: forget the state).
    pub fn update(&mut self, flow: u32, bytes: &[u8]) {
        push_record(&mut self.updates, flow, bytes);
    }

    /// Adds an offload request; `ops` beyond 255 are left out.
    pub fn offload(&mut self, r: &OffloadRecord<'_>, ops: &[OpRecord]) {
        let ops = ops.get(..ops.len().min(255)).unwrap_or_default();
        let o = &mut self.offloads;
        o.extend_from_slice(&r.packet.to_le_bytes());
        o.extend_from_slice(&[ops.len() as u8, if r.return_counts { RETURN_COUNTS } else { 0 }, 0, 0]);
        for w in [r.idle_timeout_ns, r.max_packets, r.max_bytes, r.max_age_ns] {
            o.extend_from_slice(&w.to_le_bytes());
        }
        for op in ops {
            o.extend_from_slice(&[op.kind, op.address_len, u8::from(op.port.is_some()), op.dscp]);
            o.extend_from_slice(&op.port.unwrap_or(0).to_le_bytes());
            o.extend_from_slice(&[0, 0]);
            o.extend_from_slice(&op.address);
        }
    }

    /// The frame: these verdicts, then what was added.
    pub fn finish(&self, verdicts: &[u32]) -> Vec<u8> {
        let mut out = Vec::with_capacity(
            verdicts.len() * 4 + self.rewrites.len() + self.updates.len() + self.offloads.len() + RESULT_TRAILER,
        );
        for v in verdicts {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for part in [&self.rewrites, &self.updates, &self.offloads] {
            out.extend_from_slice(part);
        }
        for n in [verdicts.len(), self.rewrites.len(), self.updates.len(), self.offloads.len()] {
            out.extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes());
        }
        out
    }
}

impl<'a> OffloadRecord<'a> {
    /// A request for packet `packet` with these limits and no header
    /// changes (for [`ResultFrameWriter::offload`]).
    pub const fn new(packet: u32, return_counts: bool, limits: [u64; 4]) -> Self {
        let [idle_timeout_ns, max_packets, max_bytes, max_age_ns] = limits;
        OffloadRecord { packet, return_counts, idle_timeout_ns, max_packets, max_bytes, max_age_ns, ops: &[] }
    }
}

fn push_record(out: &mut Vec<u8>, index: u32, bytes: &[u8]) {
    out.extend_from_slice(&index.to_le_bytes());
    out.extend_from_slice(&u32::try_from(bytes.len()).unwrap_or(u32::MAX).to_le_bytes());
    out.extend_from_slice(bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        let mut w = ResultFrameWriter::default();
        w.rewrite(1, b"abc");
        w.update(0, b"\x01");
        w.update(2, b"");
        let mut address = [0u8; 16];
        address[..4].copy_from_slice(&[203, 0, 113, 1]);
        let ops = [
            OpRecord { kind: 0, address_len: 4, address, port: Some(4000), dscp: 0 },
            OpRecord { kind: 3, address_len: 0, address: [0; 16], port: None, dscp: 46 },
        ];
        w.offload(&OffloadRecord::new(2, true, [5, 6, 7, 8]), &ops);
        w.offload(&OffloadRecord::new(0, false, [0; 4]), &[]);
        w.finish(&[0x1_0000, 0, 0x2_0003])
    }

    #[test]
    fn a_written_frame_reads_back() {
        let frame = sample();
        let f = ResultFrame::parse(&frame).unwrap();
        assert_eq!(f.verdict_count(), 3);
        assert_eq!(f.verdicts().collect::<Vec<_>>(), vec![0x1_0000, 0, 0x2_0003]);
        assert_eq!(f.rewrites().collect::<Vec<_>>(), vec![Ok((1, &b"abc"[..]))]);
        assert_eq!(f.updates().collect::<Vec<_>>(), vec![Ok((0, &b"\x01"[..])), Ok((2, &b""[..]))]);
        let offloads: Vec<_> = f.offloads().map(Result::unwrap).collect();
        assert_eq!(offloads.len(), 2);
        let o = &offloads[0];
        assert_eq!(
            (o.packet, o.return_counts, o.idle_timeout_ns, o.max_packets, o.max_bytes, o.max_age_ns),
            (2, true, 5, 6, 7, 8)
        );
        let ops: Vec<_> = o.ops().collect();
        assert_eq!(ops.len(), 2);
        assert_eq!(
            (ops[0].kind, ops[0].address_len, &ops[0].address[..4], ops[0].port),
            (0, 4, &[203, 0, 113, 1][..], Some(4000))
        );
        assert_eq!((ops[1].kind, ops[1].dscp, ops[1].port), (3, 46, None));
        assert_eq!((offloads[1].packet, offloads[1].return_counts, offloads[1].op_count()), (0, false, 0));
    }

    #[test]
    fn frames_whose_lengths_disagree_or_whose_records_are_cut_are_refused() {
        let frame = sample();
        assert_eq!(ResultFrame::parse(&frame[..10]), Err(ResultFrameError::NoTrailer(10)));
        assert!(ResultFrame::parse(&frame[1..]).is_err());
        // A rewrite whose length runs past its part.
        let mut w = ResultFrameWriter::default();
        w.rewrite(0, b"abcd");
        let mut cut = w.finish(&[]);
        cut[4] = 9;
        let f = ResultFrame::parse(&cut).unwrap();
        assert_eq!(f.rewrites().collect::<Vec<_>>(), vec![Err(ResultFrameError::Cut { part: "rewrite", index: 0 })]);
        // An offload request that says more changes follow than do.
        let mut w = ResultFrameWriter::default();
        w.offload(&OffloadRecord::new(0, false, [0; 4]), &[]);
        let mut cut = w.finish(&[]);
        cut[4] = 1;
        let f = ResultFrame::parse(&cut).unwrap();
        assert_eq!(f.offloads().collect::<Vec<_>>(), vec![Err(ResultFrameError::Cut { part: "offload", index: 0 })]);
        // Lengths that overflow when added up.
        let mut huge = vec![0u8; 16];
        huge[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        huge[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(ResultFrame::parse(&huge).is_err());
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_parse_or_are_refused_without_panicking(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..300)) {
            if let Ok(f) = ResultFrame::parse(&bytes) {
                let _ = f.verdicts().count();
                let _ = f.rewrites().count();
                let _ = f.updates().count();
                for o in f.offloads().flatten() {
                    let _ = o.ops().count();
                }
            }
        }
    }
}
