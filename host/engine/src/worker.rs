//! One worker: a chain and the per-batch step every data path shares.

use crate::io::{PacketIo, Receive};
use sluice_runtime::{
    Chain, EmittedEvent, FlowHook, NfSpec, PacketResult, RawPacket, Runtime, RuntimeError, StageTimes, Stopwatch,
};

/// A chain of NF instances and the buffers its batches reuse.
#[derive(Debug)]
pub struct Worker {
    chain: Chain,
    /// The packet views of the last batch, emptied, kept for the next.
    spare: Vec<RawPacket<'static>>,
    batches: u64,
    packets: u64,
    /// Stage times, when asked for ([`Worker::time_stages`]).
    timing: Option<Box<(Stopwatch, StageTimes)>>,
}

impl Worker {
    /// A worker running `chain`.
    pub fn new(chain: Chain) -> Self {
        Worker { chain, spare: Vec::new(), batches: 0, packets: 0, timing: None }
    }

    /// Runs one batch of at most `max` packets from `io` through the
    /// chain and delivers the results to `io`. Returns what `io` had.
    pub fn step(&mut self, io: &mut impl PacketIo, max: usize) -> Receive {
        // Timed stages (when asked for): one read of the clock at each
        // stage's end; the chain times its own. The time since the last
        // batch was the caller's loop.
        let mut timing = self.timing.take();
        lap(&mut timing, |t| &mut t.between_ns);
        let got = io.receive(max);
        if let Receive::Packets(n) = got {
            lap(&mut timing, |t| &mut t.receive_ns);
            let mut raw = recycle(std::mem::take(&mut self.spare));
            io.packets(&mut raw);
            lap(&mut timing, |t| &mut t.read_ns);
            self.run(&raw);
            self.spare = recycle(raw);
            debug_assert_eq!(self.chain.last_results().len(), n);
            if let Some(t) = timing.as_deref_mut() {
                t.0.restart();
            }
            io.deliver(self.chain.last_results());
            lap(&mut timing, |t| &mut t.deliver_ns);
            if let Some(t) = timing.as_deref_mut() {
                t.1.batches += 1;
                t.1.packets += n as u64;
            }
        }
        self.timing = timing;
        got
    }

    /// Times each stage of a batch from now on (see
    /// [`sluice_runtime::stages`]): the worker's receive, read and
    /// deliver, the chain's build, call and verdicts, and `io`'s transmit.
    pub fn time_stages(&mut self, io: &mut impl PacketIo) {
        self.timing = Some(Box::default());
        self.chain.time_stages(true);
        io.time_transmit();
    }

    /// The stage times so far (zero when not timed); `io` is the one the
    /// worker steps, whose transmit time is taken out of delivery.
    pub fn stage_times(&self, io: &impl PacketIo) -> StageTimes {
        let mut t = self.timing.as_deref().map(|t| t.1).unwrap_or_default();
        let chain = self.chain.stage_times();
        t.build_ns = chain.build_ns;
        t.call_ns = chain.call_ns;
        t.verdicts_ns = chain.verdicts_ns;
        t.transmit_ns = io.transmit_ns();
        t.deliver_ns = t.deliver_ns.saturating_sub(t.transmit_ns);
        t
    }

    /// Runs one batch of packets (already received) through the chain and
    /// returns one result per packet, in order: the step of a
    /// [`Dispatch`](crate::Dispatch), which gives each worker of a host its
    /// own packets of a shared batch.
    pub fn run(&mut self, packets: &[RawPacket<'_>]) -> &mut [PacketResult] {
        self.run_hooked(packets, None)
    }

    /// [`run`](Self::run) with a hook called before each batch's first NF
    /// (see [`Chain::process_hooked`](sluice_runtime::Chain::process_hooked)).
    pub fn run_hooked(&mut self, packets: &[RawPacket<'_>], hook: Option<&mut dyn FlowHook>) -> &mut [PacketResult] {
        self.batches += 1;
        self.packets += packets.len() as u64;
        self.chain.process_hooked(packets, hook)
    }

    /// Hot-swaps the NF named `name` to another version: takes effect with
    /// the next batch (see [`Chain::swap`]).
    pub fn swap(&mut self, runtime: &Runtime, name: &str, spec: NfSpec) -> Result<(), RuntimeError> {
        self.chain.swap(runtime, name, spec)
    }

    /// Replaces the chain (a deployment whose NFs or routes changed); the
    /// counts of batches and packets go on.
    pub fn replace_chain(&mut self, chain: Chain) -> Chain {
        std::mem::replace(&mut self.chain, chain)
    }

    /// The chain (meters, tables, statuses).
    pub fn chain(&self) -> &Chain {
        &self.chain
    }

    /// The chain, mutable (state export and flush).
    pub fn chain_mut(&mut self) -> &mut Chain {
        &mut self.chain
    }

    /// Takes the events every NF emitted since the last call.
    pub fn drain_events(&mut self) -> Vec<EmittedEvent> {
        self.chain.drain_events()
    }

    /// Batches run so far.
    pub fn batches(&self) -> u64 {
        self.batches
    }

    /// Packets run so far.
    pub fn packets(&self) -> u64 {
        self.packets
    }

    /// The chain, when the worker is done.
    pub fn into_chain(self) -> Chain {
        self.chain
    }
}

/// Adds the time since the last lap to the stage `slot` picks, when
/// timed.
#[inline]
fn lap(timing: &mut Option<Box<(Stopwatch, StageTimes)>>, slot: impl FnOnce(&mut StageTimes) -> &mut u64) {
    if let Some(t) = timing.as_deref_mut() {
        *slot(&mut t.1) += t.0.lap();
    }
}

/// An empty vector reusing the allocation of `v`: collecting an emptied
/// `Vec` into one whose elements have the same layout (here, the same view
/// type with another lifetime) happens in place. This is how a worker
/// keeps one buffer of views across batches without borrowing one batch's
/// packets into the next.
pub(crate) fn recycle<T, U>(mut v: Vec<T>) -> Vec<U> {
    v.clear();
    v.into_iter().filter_map(|_| None).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recycling_keeps_the_allocation() {
        let mut v: Vec<RawPacket<'static>> = Vec::with_capacity(64);
        v.push(RawPacket { data: &[], wire_len: 0, timestamp_ns: 0, ingress_port: 0 });
        let ptr = v.as_ptr() as usize;
        let w: Vec<RawPacket<'_>> = recycle(v);
        assert!(w.is_empty());
        assert_eq!(w.capacity(), 64);
        assert_eq!(w.as_ptr() as usize, ptr);
    }
}
