//! The mark a group's dispatcher puts on the first packet of a flowlet it
//! moved to another host: which host had the flow before (a hash of its
//! id, [`host_hash`]) and the version of the ownership table the move
//! followed.
//!
//! The mark is 18 bytes inserted after the Ethernet addresses, under the
//! IEEE local experimental EtherType 0x88B5, so nothing between the
//! dispatcher and the host mistakes the frame for IP:
//!
//! ```text
//! dst MAC (6) | src MAC (6) | 0x88B5 (2) | "SL" (2) | version 1 (1) | flags (1)
//!   | previous host's id hash, big endian (4) | table version, big endian (8)
//!   | the original EtherType and payload …
//! ```
//!
//! Hosts strip it before any NF sees the frame. Links from a dispatcher to
//! its hosts need an MTU 18 bytes above the traffic's for marked packets.

/// The EtherType of a marked frame.
pub const ETHERTYPE: u16 = 0x88B5;
/// Bytes the mark adds.
pub const LEN: usize = 18;
const MAGIC: [u8; 2] = *b"SL";
const VERSION: u8 = 1;
/// Offset of the mark: after destination and source MAC.
const AT: usize = 12;

/// What a mark says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SteerMark {
    /// The previous host: [`host_hash`] of its id.
    pub previous: u32,
    /// The version of the table that index is in.
    pub table_version: u64,
}

/// The 32-bit FNV-1a hash of a host id, as marks carry it (fixed, so
/// every dispatcher and host agree; ids are unique in a cluster and a
/// group has at most a few hundred hosts).
pub fn host_hash(id: &str) -> u32 {
    id.bytes().fold(0x811c_9dc5u32, |h, b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193))
}

/// `frame` with `mark` inserted, into `out` (cleared first). A frame too
/// short for Ethernet addresses is copied unmarked; returns whether it was
/// marked.
pub fn encap(frame: &[u8], mark: SteerMark, out: &mut Vec<u8>) -> bool {
    out.clear();
    let (Some(head), Some(tail)) = (frame.get(..AT), frame.get(AT..)) else {
        out.extend_from_slice(frame);
        return false;
    };
    out.reserve(frame.len() + LEN);
    out.extend_from_slice(head);
    out.extend_from_slice(&ETHERTYPE.to_be_bytes());
    out.extend_from_slice(&MAGIC);
    out.push(VERSION);
    out.push(0);
    out.extend_from_slice(&mark.previous.to_be_bytes());
    out.extend_from_slice(&mark.table_version.to_be_bytes());
    out.extend_from_slice(tail);
    true
}

/// The mark of a frame, if it carries one of this version.
pub fn mark_of(frame: &[u8]) -> Option<SteerMark> {
    let h = frame.get(AT..AT + LEN)?;
    let (et, rest) = h.split_at_checked(2)?;
    if et != ETHERTYPE.to_be_bytes() || rest.get(..2)? != MAGIC || *rest.get(2)? != VERSION {
        return None;
    }
    let previous = u32::from_be_bytes(rest.get(4..8)?.try_into().ok()?);
    let table_version = u64::from_be_bytes(rest.get(8..16)?.try_into().ok()?);
    Some(SteerMark { previous, table_version })
}

/// `frame` without its mark, into `out` (cleared first); `None` if it
/// carries none.
pub fn decap(frame: &[u8], out: &mut Vec<u8>) -> Option<SteerMark> {
    let mark = mark_of(frame)?;
    out.clear();
    out.extend_from_slice(frame.get(..AT)?);
    out.extend_from_slice(frame.get(AT + LEN..)?);
    Some(mark)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_marked_frame_says_where_the_flow_was_and_strips_back() {
        let f = crate::build::FrameSpec::tcp4([10, 0, 0, 1], 1, [10, 0, 0, 2], 80, crate::tcp::flags::SYN).build();
        let mark = SteerMark { previous: host_hash("h3"), table_version: 42 };
        assert_ne!(host_hash("h3"), host_hash("h4"));
        let mut m = Vec::new();
        assert!(encap(&f, mark, &mut m));
        assert_eq!(m.len(), f.len() + LEN);
        // Nothing takes a marked frame for IP.
        assert!(crate::parse(&m).key.is_none());
        let mut back = Vec::new();
        assert_eq!(decap(&m, &mut back), Some(mark));
        assert_eq!(back, f);
        assert_eq!(mark_of(&f), None);
        assert!(!encap(&[1, 2, 3], mark, &mut m));
        assert_eq!(m, vec![1, 2, 3]);
    }

    proptest! {
        #[test]
        fn encap_then_decap_is_the_identity(
            frame in proptest::collection::vec(any::<u8>(), 12..200),
            previous in any::<u32>(),
            table_version in any::<u64>(),
        ) {
            let mark = SteerMark { previous, table_version };
            let (mut m, mut back) = (Vec::new(), Vec::new());
            prop_assert!(encap(&frame, mark, &mut m));
            prop_assert_eq!(decap(&m, &mut back), Some(mark));
            prop_assert_eq!(back, frame);
        }

        #[test]
        fn arbitrary_frames_never_panic(frame in proptest::collection::vec(any::<u8>(), 0..64)) {
            let mut out = Vec::new();
            let _ = decap(&frame, &mut out);
        }
    }
}
