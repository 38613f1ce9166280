//! Packets from a capture file (already in memory), delivered to a
//! closure: `sluice-host run`'s workers and `serve`'s deployments.

use crate::io::{PacketIo, Receive, Results};
use sluice_pcap::Trace;
use sluice_runtime::{PacketResult, RawPacket};
use std::ops::Range;

/// Which packets of the capture, in which order.
#[derive(Debug, Clone)]
pub enum Order<'t> {
    /// The packets with these indices, in order.
    Range(Range<usize>),
    /// The packets with these indices, in this order.
    List(&'t [usize]),
}

impl Order<'_> {
    fn len(&self) -> usize {
        match self {
            Order::Range(r) => r.len(),
            Order::List(l) => l.len(),
        }
    }

    fn at(&self, pos: usize) -> Option<usize> {
        match self {
            Order::Range(r) => r.clone().nth(pos),
            Order::List(l) => l.get(pos).copied(),
        }
    }
}

/// The packets of `trace` in `order`; each result goes to `deliver` with
/// the packet's index in the capture and its view.
pub struct CaptureIo<'t, F> {
    trace: &'t Trace,
    order: Order<'t>,
    /// Next position in `order`.
    next: usize,
    /// Positions of the last `receive`.
    taken: Range<usize>,
    deliver: F,
}

impl<F> std::fmt::Debug for CaptureIo<'_, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaptureIo").field("order", &self.order).field("next", &self.next).finish_non_exhaustive()
    }
}

impl<'t, F: FnMut(usize, RawPacket<'t>, &PacketResult)> CaptureIo<'t, F> {
    /// Reads `order` of `trace`, delivering each result to `deliver`.
    pub fn new(trace: &'t Trace, order: Order<'t>, deliver: F) -> Self {
        CaptureIo { trace, order, next: 0, taken: 0..0, deliver }
    }

    /// The capture index of the next packet to receive (the end of the
    /// order's range, or the capture's length, when all were received).
    pub fn next_index(&self) -> usize {
        self.order.at(self.next).unwrap_or(match &self.order {
            Order::Range(r) => r.end,
            Order::List(_) => self.trace.packets().len(),
        })
    }

    /// Packets received so far.
    pub fn received(&self) -> usize {
        self.next
    }

    fn view(&self, index: usize) -> Option<RawPacket<'t>> {
        let p = self.trace.packets().get(index)?;
        Some(RawPacket {
            data: self.trace.data(p),
            wire_len: p.wire_len,
            timestamp_ns: p.timestamp_ns,
            ingress_port: p.port,
        })
    }
}

impl<'t, F: FnMut(usize, RawPacket<'t>, &PacketResult)> PacketIo for CaptureIo<'t, F> {
    fn receive(&mut self, max: usize) -> Receive {
        let len = self.order.len();
        if self.next >= len {
            return Receive::Done;
        }
        let end = self.next.saturating_add(max.max(1)).min(len);
        self.taken = self.next..end;
        self.next = end;
        Receive::Packets(end - self.taken.start)
    }

    fn packets<'a>(
        &'a mut self,
        out: &mut Vec<RawPacket<'a>>,
        _moved: &mut Vec<(usize, sluice_wire::steer::SteerMark)>,
    ) {
        for pos in self.taken.clone() {
            if let Some(p) = self.order.at(pos).and_then(|i| self.view(i)) {
                out.push(p);
            }
        }
    }

    fn deliver(&mut self, results: Results<'_>) {
        for (pos, r) in self.taken.clone().zip(results.iter()) {
            if let Some(i) = self.order.at(pos)
                && let Some(p) = self.view(i)
            {
                (self.deliver)(i, p, r);
            }
        }
    }
}
