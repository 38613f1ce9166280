//! Where a worker's packets come from and where their results go.

use serde::{Deserialize, Serialize};
use sluice_runtime::{Fate, PacketResult, RawPacket};

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
    /// order, and to `moved` the packets a group's dispatcher marked as
    /// the first of a flowlet moved here from another host (index in the
    /// batch, and the mark, which the view no longer has).
    fn packets<'a>(&'a mut self, out: &mut Vec<RawPacket<'a>>, moved: &mut Vec<(usize, sluice_wire::steer::SteerMark)>);

    /// Takes the result of each packet of the last `receive`, in order:
    /// sends, writes or records it, and lets the packets go.
    fn deliver(&mut self, results: Results<'_>);

    /// Times the device's transmit bursts from now on (see
    /// [`sluice_runtime::stages`]); I/O without a device does nothing.
    fn time_transmit(&mut self) {}

    /// Ns spent in transmit bursts since [`time_transmit`](Self::time_transmit).
    fn transmit_ns(&self) -> u64 {
        0
    }

    /// Counters of each of its queues, per port in order (live ports).
    fn queue_counters(&self) -> &[QueueCounters] {
        &[]
    }

    /// Packets sent and dropped through each output (verdict port k ≥ 1
    /// is output k − 1), since the start; empty where outputs are not
    /// counted apart from their ports.
    fn output_counts(&self) -> &[OutputCount] {
        &[]
    }

    /// Packets it can still hold (see [`hold`](Self::hold)); 0: it holds
    /// none, and no packet waits.
    fn hold_room(&self) -> usize {
        0
    }

    /// Keeps packet `index` of the last `receive` back from `deliver`
    /// (its result is not read) under `ticket`, until the ticket is
    /// released. Called before `deliver`, at most `hold_room` times.
    fn hold(&mut self, index: usize, ticket: u64) {
        let _ = (index, ticket);
    }

    /// The packets held under these tickets come back at the next
    /// `receive`, in the order they were held, ahead of new packets.
    fn release(&mut self, tickets: &[u64]) {
        let _ = tickets;
    }

    /// How many workers a packet can be passed around (see
    /// [`pass`](Self::pass)); `None`: this I/O passes nothing (a host's
    /// only worker, or packets not spread by a hash of the device's).
    fn circle(&self) -> Option<usize> {
        None
    }

    /// The packets of the last `receive` that came passed from another
    /// worker: (index, times passed so far), in index order; a packet a
    /// worker handed to the home of its flow counts as passed all the way
    /// round (it is where it belongs).
    fn passed_in(&self, out: &mut Vec<(usize, usize)>) {
        let _ = out;
    }

    /// Passes packet `index` of the last `receive` to the next worker
    /// instead of delivering it (its result is not read): an IP fragment
    /// that came to a worker without its flow's state. Called before
    /// `deliver`.
    fn pass(&mut self, index: usize) {
        let _ = index;
    }

    /// Outputs it can still keep back (see [`defer`](Self::defer)); 0: it
    /// keeps none, and every output leaves at `deliver`.
    fn defer_room(&self) -> usize {
        0
    }

    /// Keeps the output of packet `index` of the last `receive` (what
    /// `deliver` makes of it: rewritten, cut to fit, for its port) back
    /// under `ticket` until the ticket is let go. Called before
    /// `deliver`, at most `defer_room` times.
    fn defer(&mut self, index: usize, ticket: u64) {
        let _ = (index, ticket);
    }

    /// Sends the outputs kept under the tickets of `send`, in the order
    /// they were kept, and frees those under the tickets of `drop`.
    fn settle(&mut self, send: &[u64], drop: &[u64]) {
        let _ = (send, drop);
    }
}

/// The results of a batch, one per packet in the order received: one
/// slice, or gathered from the slices of the lanes that ran parts of it
/// (each packet names its lane's slice and its place there), so that no
/// result is copied into a batch-wide array. Each packet's result may
/// name its *owner*: whose lane ran it (see [`owned_by`](Self::owned_by)).
#[derive(Debug, Clone, Copy)]
pub struct Results<'a>(Source<'a>, &'a [u64]);

#[derive(Debug, Clone, Copy)]
enum Source<'a> {
    Slice(&'a [PacketResult]),
    Gathered { parts: &'a [&'a [PacketResult]], at: &'a [(u32, u32)] },
}

impl<'a> Results<'a> {
    /// The results of a batch whose packet `i` has the result
    /// `parts[at[i].0][at[i].1]`; a place that names none reads as
    /// refused.
    pub fn gathered(parts: &'a [&'a [PacketResult]], at: &'a [(u32, u32)]) -> Self {
        Results(Source::Gathered { parts, at }, &[])
    }

    /// The same results, whose owners are `owners`: one per part of
    /// gathered results (the lane's [`owner`](crate::dispatch::Lane::owner)),
    /// or the one owner of a slice's.
    pub fn owned_by(self, owners: &'a [u64]) -> Self {
        Results(self.0, owners)
    }

    /// The owner of packet `i`'s result (0 where none is named).
    pub fn owner(&self, i: usize) -> u64 {
        let part = match self.0 {
            Source::Slice(_) => Some(0),
            Source::Gathered { at, .. } => at.get(i).map(|&(part, _)| part as usize),
        };
        part.and_then(|p| self.1.get(p)).copied().unwrap_or(0)
    }

    /// How many packets.
    pub fn len(&self) -> usize {
        match self.0 {
            Source::Slice(s) => s.len(),
            Source::Gathered { at, .. } => at.len(),
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The result of packet `i`.
    pub fn get(&self, i: usize) -> Option<&'a PacketResult> {
        match self.0 {
            Source::Slice(s) => s.get(i),
            Source::Gathered { parts, at } => at.get(i).map(|&place| Self::find(parts, place)),
        }
    }

    /// Each packet's result, in order.
    pub fn iter(&self) -> ResultsIter<'a> {
        match self.0 {
            Source::Slice(s) => ResultsIter(Walk::Slice(s.iter())),
            Source::Gathered { parts, at } => ResultsIter(Walk::Gathered { parts, at: at.iter() }),
        }
    }

    #[inline]
    fn find(parts: &'a [&'a [PacketResult]], (part, i): (u32, u32)) -> &'a PacketResult {
        parts.get(part as usize).and_then(|p| p.get(i as usize)).unwrap_or(&REFUSED)
    }
}

/// The iterator of [`Results::iter`].
#[derive(Debug, Clone)]
pub struct ResultsIter<'a>(Walk<'a>);

#[derive(Debug, Clone)]
enum Walk<'a> {
    Slice(std::slice::Iter<'a, PacketResult>),
    Gathered { parts: &'a [&'a [PacketResult]], at: std::slice::Iter<'a, (u32, u32)> },
}

impl<'a> Iterator for ResultsIter<'a> {
    type Item = &'a PacketResult;

    #[inline]
    fn next(&mut self) -> Option<&'a PacketResult> {
        match &mut self.0 {
            Walk::Slice(s) => s.next(),
            Walk::Gathered { parts, at } => at.next().map(|&place| Results::find(parts, place)),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        match &self.0 {
            Walk::Slice(s) => s.size_hint(),
            Walk::Gathered { at, .. } => at.size_hint(),
        }
    }
}

/// What a place that names no result reads as.
static REFUSED: PacketResult = PacketResult::of(Fate::Refused);

impl<'a> From<&'a [PacketResult]> for Results<'a> {
    fn from(s: &'a [PacketResult]) -> Self {
        Results(Source::Slice(s), &[])
    }
}

impl<'a> From<&'a mut [PacketResult]> for Results<'a> {
    fn from(s: &'a mut [PacketResult]) -> Self {
        Results(Source::Slice(s), &[])
    }
}

/// Packets that left through one output, and those its port's queue
/// refused (full).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct OutputCount {
    /// Taken by the device.
    pub sent: u64,
    /// Refused by a full TX queue (after any retries), and freed.
    pub dropped: u64,
}

/// Counters of one queue pair (one worker on one port).
#[derive(Debug, Default, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct QueueCounters {
    /// Packets received.
    pub rx: u64,
    /// Packets sent.
    pub tx: u64,
    /// Packets an NF (or its failure policy) dropped.
    pub dropped_by_nf: u64,
    /// Packets dropped because the TX ring was full.
    pub dropped_tx_full: u64,
    /// Packets dropped because a verdict named no configured port, a
    /// rewrite did not fit an mbuf, or the frame was too long for any NF.
    pub dropped_other: u64,
    /// Datagrams longer than their output port's MTU that may not be
    /// fragmented (Don't Fragment set, IPv6): dropped, as a router does.
    #[serde(default)]
    pub dropped_too_big: u64,
    /// Frames added by cutting datagrams into fragments: longer than their
    /// output port's MTU, or reassembled by the chain and cut again (a
    /// datagram cut in three adds two): `rx + fragmented` = `tx` + every
    /// drop + `reassembling`.
    #[serde(default)]
    pub fragmented: u64,
    /// IP fragments the chain kept to reassemble their datagram: they
    /// leave inside it (see the chain's `fragments_held`).
    #[serde(default)]
    pub reassembling: u64,
    /// Frames kept back until their flow's changed state was held by
    /// another host (output commit), and those of them dropped because it
    /// was not in time; the others were sent (counted in `tx`).
    #[serde(default)]
    pub deferred: u64,
    #[serde(default)]
    pub dropped_uncommitted: u64,
    /// Packets received here and handed to the worker that holds their
    /// translated flow's state, and packets that worker took in from
    /// others on this port (see `sluice_engine::handoff`): on the whole
    /// host the two are equal, and over a worker's queues `rx + taken_over +
    /// fragmented` = `tx` + every drop + `reassembling` + `handed_off`.
    #[serde(default)]
    pub handed_off: u64,
    #[serde(default)]
    pub taken_over: u64,
    /// Of `handed_off`, the strays passed on to the next worker because no
    /// home was known for them and this worker's chain does not hold their
    /// flow (an IP fragment or an ICMP error, see README "IP fragments");
    /// the rest were handed straight to their flow's home.
    #[serde(default)]
    pub passed_on: u64,
}

impl QueueCounters {
    /// Adds another queue's counters.
    pub fn add(&mut self, o: &QueueCounters) {
        self.rx += o.rx;
        self.tx += o.tx;
        self.dropped_by_nf += o.dropped_by_nf;
        self.dropped_tx_full += o.dropped_tx_full;
        self.dropped_other += o.dropped_other;
        self.dropped_too_big += o.dropped_too_big;
        self.fragmented += o.fragmented;
        self.reassembling += o.reassembling;
        self.deferred += o.deferred;
        self.dropped_uncommitted += o.dropped_uncommitted;
        self.handed_off += o.handed_off;
        self.taken_over += o.taken_over;
        self.passed_on += o.passed_on;
    }
}

/// One port of a live host: the device's counters and its queues'.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct PortReport {
    /// Port id.
    pub port: u16,
    /// Device name.
    pub name: String,
    /// Whether RSS spreads flows over queues.
    pub rss: bool,
    /// Received by the device.
    pub ipackets: u64,
    /// Sent by the device (`net_af_packet`: less the frames the kernel
    /// refused).
    pub opackets: u64,
    /// Dropped with the receive ring full: the device's `imissed`, and on
    /// `net_af_packet` the kernel's drops at its sockets' rings (the PMD
    /// counts none).
    pub imissed: u64,
    /// RX mbuf allocation failures.
    pub rx_nombuf: u64,
    /// Receive errors.
    pub ierrors: u64,
    /// Taken to send but not sent: the device's `oerrors`, and on
    /// `net_af_packet` the frames the kernel refused (too long for the
    /// interface's MTU), which the PMD counts as sent.
    pub oerrors: u64,
    /// Per-queue counters (received on this port), one per worker.
    pub queues: Vec<QueueCounters>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gathered_results_read_each_packet_from_its_part_and_a_bad_place_as_refused() {
        let a = [PacketResult::of(Fate::Forward(1)), PacketResult::of(Fate::Dropped(0))];
        let b = [PacketResult::of(Fate::Forward(2))];
        let parts: [&[PacketResult]; 2] = [&a, &b];
        let at = [(1, 0), (0, 1), (0, 0), (2, 0), (0, 7)];
        let r = Results::gathered(&parts, &at);
        let fates: Vec<Fate> = r.iter().map(|r| r.fate).collect();
        assert_eq!(fates, [Fate::Forward(2), Fate::Dropped(0), Fate::Forward(1), Fate::Refused, Fate::Refused]);
        assert_eq!(r.len(), 5);
        assert_eq!(r.get(2).map(|r| r.fate), Some(Fate::Forward(1)));
        assert_eq!(r.get(5), None);
        let one = Results::from(&a[..]);
        assert_eq!(one.iter().map(|r| r.fate).collect::<Vec<_>>(), [Fate::Forward(1), Fate::Dropped(0)]);
        // Owners: each part's, the slice's one, none named reads as 0.
        let owned = r.owned_by(&[7, 9]);
        assert_eq!((0..6).map(|i| owned.owner(i)).collect::<Vec<_>>(), [9, 7, 7, 0, 7, 0]);
        assert_eq!(one.owned_by(&[5]).owner(1), 5);
        assert_eq!(r.owner(0), 0);
    }
}
