//! Where a packet's time goes, stage by stage: a host asked for it
//! (`--stage-times`) reads the CPU's time-stamp counter (through
//! `quanta`, a few nanoseconds a read) at each stage's end, once per
//! batch, and sums the stages over the run. Off, nothing is read.
//!
//! The stages, in the order a batch passes them:
//! - `receive`: the device's receive burst (and released held packets);
//! - `read`: reading the packets' lengths and bytes out of the buffers;
//! - `classify`: which deployment's lane each packet takes (`serve` only);
//! - `build`: parse, descriptor, flow key and hash of each packet: the
//!   batch record an NF receives;
//! - `call`: the NF's `process` call: flow state in, lowering the batch
//!   into the guest, the guest's code, lifting its answer, state out;
//! - `verdicts`: applying verdicts, labels, routes and rewrites to the
//!   packets' fates;
//! - `deliver`: each packet to its output queue (or freed), rewritten
//!   bytes written back, datagrams cut to the MTU;
//! - `transmit`: the device's transmit burst;
//! - `between`: the worker's loop between batches: its checks of stop
//!   and limits and, on a live host, commands, meter ticks, reports, peer
//!   state and polls that found nothing.

use serde::Serialize;

/// Nanoseconds spent per stage, summed over a run (see the module).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct StageTimes {
    /// Device receive bursts that returned packets.
    pub receive_ns: u64,
    /// Reading packets out of their buffers.
    pub read_ns: u64,
    /// Classifying packets to lanes.
    pub classify_ns: u64,
    /// Building batch records (parse, descriptor, flow key).
    pub build_ns: u64,
    /// NF calls.
    pub call_ns: u64,
    /// Applying verdicts.
    pub verdicts_ns: u64,
    /// Delivering packets to output queues.
    pub deliver_ns: u64,
    /// Device transmit bursts.
    pub transmit_ns: u64,
    /// The worker's loop between batches.
    pub between_ns: u64,
    /// Batches timed.
    pub batches: u64,
    /// Packets timed.
    pub packets: u64,
}

impl StageTimes {
    /// Adds `o`'s sums to these.
    pub fn add(&mut self, o: &StageTimes) {
        self.receive_ns += o.receive_ns;
        self.read_ns += o.read_ns;
        self.classify_ns += o.classify_ns;
        self.build_ns += o.build_ns;
        self.call_ns += o.call_ns;
        self.verdicts_ns += o.verdicts_ns;
        self.deliver_ns += o.deliver_ns;
        self.transmit_ns += o.transmit_ns;
        self.between_ns += o.between_ns;
        self.batches += o.batches;
        self.packets += o.packets;
    }

    /// The sums as ns per packet, stage by stage, with their total.
    pub fn per_packet(&self) -> StagesPerPacket {
        let n = self.packets.max(1) as f64;
        let per = |ns: u64| ns as f64 / n;
        let mut out = StagesPerPacket {
            receive: per(self.receive_ns),
            read: per(self.read_ns),
            classify: per(self.classify_ns),
            build: per(self.build_ns),
            call: per(self.call_ns),
            verdicts: per(self.verdicts_ns),
            deliver: per(self.deliver_ns),
            transmit: per(self.transmit_ns),
            between: per(self.between_ns),
            total: 0.0,
            packets: self.packets,
            batches: self.batches,
        };
        out.total = out.receive
            + out.read
            + out.classify
            + out.build
            + out.call
            + out.verdicts
            + out.deliver
            + out.transmit
            + out.between;
        out
    }
}

/// [`StageTimes`] as ns per packet (what reports show).
#[derive(Debug, Default, Clone, Copy, PartialEq, Serialize, serde::Deserialize)]
pub struct StagesPerPacket {
    /// Device receive.
    pub receive: f64,
    /// Reading packets out of their buffers.
    pub read: f64,
    /// Classifying to lanes (`serve`).
    pub classify: f64,
    /// Parse, descriptor, flow key.
    pub build: f64,
    /// NF calls.
    pub call: f64,
    /// Applying verdicts.
    pub verdicts: f64,
    /// Delivering to output queues.
    pub deliver: f64,
    /// Device transmit.
    pub transmit: f64,
    /// The worker's loop between batches.
    #[serde(default)]
    pub between: f64,
    /// The stages together.
    pub total: f64,
    /// Packets timed.
    pub packets: u64,
    /// Batches timed.
    pub batches: u64,
}

/// A stopwatch over the time-stamp counter: [`lap`](Self::lap) returns
/// the ns since the previous lap (or the start).
#[derive(Debug, Clone)]
pub struct Stopwatch {
    clock: quanta::Clock,
    last: u64,
}

impl Default for Stopwatch {
    fn default() -> Self {
        Self::new()
    }
}

impl Stopwatch {
    /// A stopwatch started now.
    pub fn new() -> Self {
        let clock = quanta::Clock::new();
        let last = clock.raw();
        Stopwatch { clock, last }
    }

    /// Starts a new lap now.
    #[inline]
    pub fn restart(&mut self) {
        self.last = self.clock.raw();
    }

    /// Ns since the previous lap; starts the next.
    #[inline]
    pub fn lap(&mut self) -> u64 {
        let now = self.clock.raw();
        let ns = self.clock.delta_as_nanos(self.last, now);
        self.last = now;
        ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn laps_add_up_to_the_time_between_them() {
        let mut w = Stopwatch::new();
        let start = std::time::Instant::now();
        let mut sum = 0;
        for _ in 0..3 {
            std::thread::sleep(std::time::Duration::from_millis(2));
            sum += w.lap();
        }
        let wall = start.elapsed().as_nanos() as u64;
        assert!(sum >= 6_000_000, "{sum}");
        assert!(sum <= wall + 1_000_000, "{sum} > {wall}");
    }

    #[test]
    fn per_packet_divides_each_stage_by_the_packets() {
        let t =
            StageTimes { receive_ns: 100, build_ns: 300, call_ns: 600, packets: 10, batches: 1, ..Default::default() };
        let p = t.per_packet();
        assert_eq!((p.receive, p.build, p.call, p.total), (10.0, 30.0, 60.0, 100.0));
        let mut sum = t;
        sum.add(&t);
        assert_eq!(sum.per_packet().total, 100.0);
        assert_eq!(sum.packets, 20);
    }
}
