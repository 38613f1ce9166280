//! Where a worker's packets come from and where their results go.

use sluice_runtime::{PacketResult, RawPacket};

/// What a [`PacketIo::receive`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Receive {
    /// This many packets (at least one) are ready.
    Packets(usize),
    /// None now; more may come (a live port).
    Idle,
    /// None, and none will come (a capture's end).
    Done,
}

/// A source and sink of packets for one worker.
///
/// A [`Worker`](crate::Worker) calls, per batch, `receive`, then `packets`
/// to view what was received, then `deliver` with one result per packet
/// in the same order.
pub trait PacketIo {
    /// Takes up to `max` packets.
    fn receive(&mut self, max: usize) -> Receive;

    /// Appends views of the packets of the last `receive` to `out`, in
    /// order.
    fn packets<'a>(&'a mut self, out: &mut Vec<RawPacket<'a>>);

    /// Takes the result of each packet of the last `receive`, in order:
    /// sends, writes or records it, and lets the packets go.
    fn deliver(&mut self, results: &[PacketResult]);
}
