//! What became of one packet after a whole chain ([`PacketResult`]): its
//! [`Fate`] and the bytes that leave for it.

/// The fate of one packet after the whole chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Sent out of this port.
    Forward(u16),
    /// Dropped by the chain's NF at this position.
    Dropped(usize),
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
    /// When not empty, the frames that leave in the packet's place instead
    /// of `data`: the fragments of a datagram the chain reassembled, cut
    /// again as it came (see [`crate::reassembly`]).
    pub fragments: Vec<Vec<u8>>,
}

impl PacketResult {
    /// A result with no new bytes.
    pub const fn of(fate: Fate) -> Self {
        PacketResult { fate, data: None, label: None, fragments: Vec::new() }
    }

    /// The frames that leave for this packet when it is forwarded, given
    /// its bytes as received (`original`): its fragments, its new bytes, or
    /// the original.
    pub fn frames<'a>(&'a self, original: &'a [u8]) -> impl Iterator<Item = &'a [u8]> {
        let whole = self.fragments.is_empty().then(|| self.data.as_deref().unwrap_or(original));
        whole.into_iter().chain(self.fragments.iter().map(Vec::as_slice))
    }
}
