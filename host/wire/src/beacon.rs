//! The liveness beacon a group's host sends its dispatcher: "host `id` is
//! alive", every millisecond or so, on the link the dispatcher reaches it
//! by. A dispatcher that stops hearing a host's beacons treats it as gone
//! and sends its flows to their next owners within milliseconds, where a
//! killed host's link may take tens of milliseconds to go down (a memif
//! socket closes when the kernel has torn the process down) or never go
//! down at all (a host behind a switch).
//!
//! One frame under the IEEE local experimental EtherType 0x88B5 (the one
//! the dispatcher's [`steer`](crate::steer) marks use; the magic tells
//! them apart), padded to Ethernet's minimum length:
//!
//! ```text
//! dst MAC (6) | src MAC (6) | 0x88B5 (2) | "SB" (2) | version 1 (1)
//!   | id length n (1) | sequence number, big endian (8) | host id (n) | padding
//! ```

use crate::steer::ETHERTYPE;

const MAGIC: [u8; 2] = *b"SB";
const VERSION: u8 = 1;
/// The longest host id a beacon carries (the control plane's token limit).
pub const MAX_ID: usize = 64;
/// Ethernet's shortest frame, without its FCS.
const MIN_FRAME: usize = 60;

mod field {
    use core::ops::Range;
    pub const DST: Range<usize> = 0..6;
    pub const SRC: Range<usize> = 6..12;
    pub const ETHERTYPE: Range<usize> = 12..14;
    pub const MAGIC: Range<usize> = 14..16;
    pub const VERSION: usize = 16;
    pub const ID_LEN: usize = 17;
    pub const SEQ: Range<usize> = 18..26;
    pub const ID: usize = 26;
}

/// Why a frame is not a beacon.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BeaconError {
    /// Shorter than its header or than the id it announces.
    #[error("frame too short for a beacon")]
    Truncated,
    /// Another EtherType or magic: not a beacon at all.
    #[error("not a beacon")]
    NotBeacon,
    /// A beacon of a version this build does not read.
    #[error("beacon version {0} is not known (this build reads version 1)")]
    Version(u8),
    /// An id that is not UTF-8 or longer than [`MAX_ID`].
    #[error("beacon host id is not a valid id")]
    BadId,
}

/// A zero-copy view of a beacon frame.
#[derive(Debug, Clone, Copy)]
pub struct Beacon<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Beacon<T> {
    /// A view of `buffer`, checked to be a whole beacon of this version.
    pub fn new_checked(buffer: T) -> Result<Self, BeaconError> {
        let b = Beacon { buffer };
        b.check()?;
        Ok(b)
    }

    fn check(&self) -> Result<(), BeaconError> {
        let d = self.buffer.as_ref();
        let head = d.get(..field::ID).ok_or(BeaconError::Truncated)?;
        if head.get(field::ETHERTYPE) != Some(&ETHERTYPE.to_be_bytes()[..])
            || head.get(field::MAGIC) != Some(&MAGIC[..])
        {
            return Err(BeaconError::NotBeacon);
        }
        let version = head.get(field::VERSION).copied().unwrap_or(0);
        if version != VERSION {
            return Err(BeaconError::Version(version));
        }
        let n = usize::from(head.get(field::ID_LEN).copied().unwrap_or(0));
        if n == 0 || n > MAX_ID {
            return Err(BeaconError::BadId);
        }
        let id = d.get(field::ID..field::ID + n).ok_or(BeaconError::Truncated)?;
        std::str::from_utf8(id).map_err(|_| BeaconError::BadId)?;
        Ok(())
    }

    /// The host that sent it.
    pub fn host(&self) -> &str {
        let d = self.buffer.as_ref();
        let n = d.get(field::ID_LEN).map_or(0, |&n| usize::from(n));
        d.get(field::ID..field::ID + n).and_then(|id| std::str::from_utf8(id).ok()).unwrap_or("")
    }

    /// Its sequence number (the sender counts its beacons from 0).
    pub fn seq(&self) -> u64 {
        self.buffer.as_ref().get(field::SEQ).and_then(|s| s.try_into().ok()).map_or(0, u64::from_be_bytes)
    }
}

/// Writes host `id`'s beacon number `seq` to `dst` into `out` (cleared
/// first). The source MAC is a locally administered address derived from
/// the id. Fails on an id that is empty or longer than [`MAX_ID`].
pub fn build(dst: [u8; 6], id: &str, seq: u64, out: &mut Vec<u8>) -> Result<(), BeaconError> {
    let n = u8::try_from(id.len()).map_err(|_| BeaconError::BadId)?;
    if id.is_empty() || id.len() > MAX_ID {
        return Err(BeaconError::BadId);
    }
    out.clear();
    out.extend_from_slice(&dst);
    debug_assert_eq!(out.len(), field::DST.end);
    out.push(0x02);
    out.push(0x53);
    out.extend_from_slice(&crate::steer::host_hash(id).to_be_bytes());
    debug_assert_eq!(out.len(), field::SRC.end);
    out.extend_from_slice(&ETHERTYPE.to_be_bytes());
    out.extend_from_slice(&MAGIC);
    out.push(VERSION);
    out.push(n);
    out.extend_from_slice(&seq.to_be_bytes());
    out.extend_from_slice(id.as_bytes());
    if out.len() < MIN_FRAME {
        out.resize(MIN_FRAME, 0);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_beacon_names_its_host_and_number_and_is_nothing_else() {
        let mut f = Vec::new();
        build([0xff; 6], "edge-1", 7, &mut f).unwrap();
        assert_eq!(f.len(), MIN_FRAME);
        let b = Beacon::new_checked(&f[..]).unwrap();
        assert_eq!((b.host(), b.seq()), ("edge-1", 7));
        // Not IP, not a dispatcher's mark.
        assert!(crate::parse(&f).key.is_none());
        assert_eq!(crate::steer::mark_of(&f), None);
        // Ids the control plane would refuse are refused here too.
        assert_eq!(build([0; 6], "", 0, &mut f), Err(BeaconError::BadId));
        assert_eq!(build([0; 6], &"h".repeat(MAX_ID + 1), 0, &mut f), Err(BeaconError::BadId));
        build([0; 6], &"h".repeat(MAX_ID), 1, &mut f).unwrap();
        assert_eq!(Beacon::new_checked(&f[..]).unwrap().host().len(), MAX_ID);
    }

    #[test]
    fn frames_that_are_not_whole_beacons_are_refused() {
        let mut f = Vec::new();
        build([0xff; 6], "h1", 1, &mut f).unwrap();
        assert_eq!(Beacon::new_checked(&f[..20]).unwrap_err(), BeaconError::Truncated);
        let mut other = f.clone();
        other[15] = b'L';
        assert_eq!(Beacon::new_checked(&other[..]).unwrap_err(), BeaconError::NotBeacon);
        let mut v2 = f.clone();
        v2[field::VERSION] = 2;
        assert_eq!(Beacon::new_checked(&v2[..]).unwrap_err(), BeaconError::Version(2));
        let mut long = f.clone();
        long[field::ID_LEN] = 200;
        assert_eq!(Beacon::new_checked(&long[..]).unwrap_err(), BeaconError::BadId);
        let mut bad = f.clone();
        bad[field::ID] = 0xff;
        assert_eq!(Beacon::new_checked(&bad[..]).unwrap_err(), BeaconError::BadId);
        let tcp = crate::build::FrameSpec::tcp4([10, 0, 0, 1], 1, [10, 0, 0, 2], 80, crate::tcp::flags::SYN).build();
        assert_eq!(Beacon::new_checked(&tcp[..]).unwrap_err(), BeaconError::NotBeacon);
    }

    proptest! {
        #[test]
        fn any_bytes_are_read_without_panicking(frame in proptest::collection::vec(any::<u8>(), 0..120)) {
            if let Ok(b) = Beacon::new_checked(&frame[..]) {
                prop_assert!(!b.host().is_empty() && b.host().len() <= MAX_ID);
            }
        }

        #[test]
        fn build_then_read_gives_back_the_id_and_number(id in "[a-z0-9_-]{1,64}", seq in any::<u64>()) {
            let mut f = Vec::new();
            build([1, 2, 3, 4, 5, 6], &id, seq, &mut f).unwrap();
            let b = Beacon::new_checked(&f[..]).unwrap();
            prop_assert_eq!(b.host(), id.as_str());
            prop_assert_eq!(b.seq(), seq);
        }
    }
}
