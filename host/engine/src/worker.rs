//! One worker: a chain of NF instances, the lane of a [`Dispatch`](crate::Dispatch).
//!
//! A worker that owns every packet of its I/O (`sluice-host run` and
//! `dpdk`, a `serve` capture replay) is the one-lane case of the
//! dispatch a host shared by tenants runs ([`Dispatch::step_one`](crate::Dispatch::step_one)): one
//! step for every data path.

use sluice_runtime::{Chain, EmittedEvent, FlowHook, NfSpec, PacketResult, RawPacket, Runtime, RuntimeError};

/// A chain of NF instances and its counts of batches and packets.
#[derive(Debug)]
pub struct Worker {
    chain: Chain,
    batches: u64,
    packets: u64,
}

impl Worker {
    /// A worker running `chain`.
    pub fn new(chain: Chain) -> Self {
        Worker { chain, batches: 0, packets: 0 }
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

/// An empty vector reusing the allocation of `v`: collecting an emptied
/// `Vec` into one whose elements have the same layout (here, the same view
/// type with another lifetime) happens in place. This is how a worker
/// keeps one buffer of views across batches without borrowing one batch's
/// packets into the next.
pub fn recycle<T, U>(mut v: Vec<T>) -> Vec<U> {
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
