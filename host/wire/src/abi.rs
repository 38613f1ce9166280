//! Encodings of the `sluice:nf` batch columns that host and guests share:
//! verdicts, packet flags and "absent" sentinels. Kept here, next to the
//! parser both sides use, so they cannot drift apart.

/// `l3-offsets` / `l4-offsets` value for "no such header".
pub const NO_OFFSET: u16 = u16::MAX;

/// `flows` value for "no flow" (not an IP packet).
pub const NO_FLOW: u32 = u32::MAX;

/// Bits of `packet-flags`.
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
    use super::*;

    #[test]
    fn verdicts_round_trip() {
        for v in [Verdict::Drop, Verdict::Forward(0), Verdict::Forward(65535), Verdict::Label(7)] {
            assert_eq!(Verdict::decode(v.encode()), Some(v));
        }
        assert_eq!(Verdict::decode(3 << 16), None);
        assert_eq!(Verdict::Forward(0).encode(), 0x0001_0000);
    }
}
