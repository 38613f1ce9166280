//! What became of one packet after a whole chain ([`PacketResult`]): its
//! [`Fate`] and the bytes that leave for it.

/// The fate of one packet after the whole chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Sent out of this port.
    Forward(u16),
    /// Dropped by the chain's NF at this position.
    Dropped(u16),
    /// Refused before any NF ran: a frame longer than
    /// [`crate::instance::MAX_PACKET_LEN`], which no NF could rewrite, one
    /// cut short, or an IP fragment the chain could not take (see
    /// [`ChainCounters`](crate::ChainCounters)).
    Refused,
    /// An IP fragment the chain keeps until its datagram is whole (see
    /// [`crate::reassembly`]): it leaves inside its datagram, in the place
    /// of the fragment that completes it.
    Reassembling,
}

/// One packet's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PacketResult {
    /// Forwarded or dropped.
    pub fate: Fate,
    /// New bytes, if an NF rewrote the packet.
    pub data: Option<Vec<u8>>,
    /// Last label an NF gave the packet, if any.
    pub label: Option<u16>,
    /// When there are any, the frames that leave in the packet's place
    /// instead of `data`: the fragments of a datagram the chain
    /// reassembled, cut again as it came (see [`crate::reassembly`]).
    /// Boxed: rare, and every packet's result carries the field.
    pub fragments: Option<Box<[Vec<u8>]>>,
}

impl PacketResult {
    /// A result with no new bytes.
    pub const fn of(fate: Fate) -> Self {
        PacketResult { fate, data: None, label: None, fragments: None }
    }

    /// The frames that leave for this packet when it is forwarded, given
    /// its bytes as received (`original`): its fragments, its new bytes, or
    /// the original.
    pub fn frames<'a>(&'a self, original: &'a [u8]) -> impl Iterator<Item = &'a [u8]> {
        let cut = self.fragments.as_deref().unwrap_or(&[]);
        let whole = cut.is_empty().then(|| self.data.as_deref().unwrap_or(original));
        whole.into_iter().chain(cut.iter().map(Vec::as_slice))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_result_stays_small_and_its_frames_are_its_fragments_or_its_bytes() {
        // Every packet of a batch has one, written by the chain and read at
        // delivery: it stays within six words.
        assert!(std::mem::size_of::<PacketResult>() <= 48);
        let original = [1u8, 2, 3];
        let r = PacketResult::of(Fate::Forward(0));
        assert_eq!(r.frames(&original).collect::<Vec<_>>(), [&original[..]]);
        let r = PacketResult { data: Some(vec![9]), ..PacketResult::of(Fate::Forward(0)) };
        assert_eq!(r.frames(&original).collect::<Vec<_>>(), [&[9u8][..]]);
        let r = PacketResult { fragments: Some(vec![vec![4], vec![5]].into_boxed_slice()), ..r };
        assert_eq!(r.frames(&original).collect::<Vec<_>>(), [&[4u8][..], &[5u8][..]]);
    }
}
