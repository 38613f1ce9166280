//! A linear chain of NFs run as sequential function calls over one batch
//! on one worker (Serpens' run-to-completion model): no queues, and no
//! copies beyond the one into each guest that the contract requires.

use crate::batch::{BatchBuilder, RawPacket};
use crate::engine::Runtime;
use crate::error::RuntimeError;
use crate::instance::{BatchStatus, EmittedEvent, NfInstance, NfSpec, StageOutput};
use sluice_wire::abi::{MAX_BATCH, Verdict};

/// The fate of one packet after the whole chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fate {
    /// Sent out of this port.
    Forward(u16),
    /// Dropped by the chain's NF at this position.
    Dropped(usize),
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
}

/// NF instances of one worker, called in order on every batch.
#[derive(Debug)]
pub struct Chain {
    stages: Vec<NfInstance>,
    builder: BatchBuilder,
    out: StageOutput,
    results: Vec<PacketResult>,
    alive: Vec<usize>,
    next_alive: Vec<usize>,
    statuses: Vec<BatchStatus>,
}

impl Chain {
    /// Instantiates every NF (in order) and runs their `init`.
    pub fn new(runtime: &Runtime, specs: &[NfSpec]) -> Result<Self, RuntimeError> {
        let stages = specs.iter().map(|s| NfInstance::new(runtime, s.clone())).collect::<Result<Vec<_>, _>>()?;
        Ok(Self::from_instances(stages))
    }

    /// A chain of already-created instances (e.g. native NFs).
    pub fn from_instances(stages: Vec<NfInstance>) -> Self {
        let with_flows = stages.iter().any(NfInstance::wants_flow_state);
        Chain {
            statuses: vec![BatchStatus::Ok; stages.len()],
            stages,
            builder: BatchBuilder::new(with_flows),
            out: StageOutput::default(),
            results: Vec::new(),
            alive: Vec::new(),
            next_alive: Vec::new(),
        }
    }

    /// The NF instances, in chain order.
    pub fn stages(&self) -> &[NfInstance] {
        &self.stages
    }

    /// The NF instances, mutable (state export/import).
    pub fn stages_mut(&mut self) -> &mut [NfInstance] {
        &mut self.stages
    }

    /// How the last batch ended at each NF.
    pub fn last_statuses(&self) -> &[BatchStatus] {
        &self.statuses
    }

    /// Takes the events every NF emitted since the last call.
    pub fn drain_events(&mut self) -> Vec<EmittedEvent> {
        self.stages.iter_mut().flat_map(NfInstance::drain_events).collect()
    }

    /// Runs one batch through the chain and returns one result per packet,
    /// in input order. More than [`MAX_BATCH`] packets are run as several
    /// batches.
    pub fn process(&mut self, packets: &[RawPacket<'_>]) -> &[PacketResult] {
        self.results.clear();
        self.results.resize(packets.len(), PacketResult { fate: Fate::Forward(0), data: None, label: None });
        for (n, chunk) in packets.chunks(MAX_BATCH).enumerate() {
            self.process_batch(chunk, n * MAX_BATCH);
        }
        &self.results
    }

    /// Runs `packets` (at most [`MAX_BATCH`]) as one batch; their results
    /// start at `base` in `self.results`.
    fn process_batch(&mut self, packets: &[RawPacket<'_>], base: usize) {
        self.alive.clear();
        self.alive.extend(base..base + packets.len());
        self.builder.clear();
        for p in packets {
            // Cannot fail: at most MAX_BATCH packets.
            let _ = self.builder.push(*p);
        }
        let last = self.stages.len().saturating_sub(1);
        for (s, stage) in self.stages.iter_mut().enumerate() {
            if self.alive.is_empty() {
                break;
            }
            let status = stage.process(&mut self.builder, &mut self.out);
            if let Some(slot) = self.statuses.get_mut(s) {
                *slot = status;
            }
            let mut changed = !self.out.rewrites.is_empty();
            self.next_alive.clear();
            for (j, &orig) in self.alive.iter().enumerate() {
                let Some(r) = self.results.get_mut(orig) else { continue };
                match self.out.verdicts.get(j).copied().unwrap_or(Verdict::Drop) {
                    Verdict::Drop => {
                        r.fate = Fate::Dropped(s);
                        changed = true;
                    }
                    Verdict::Forward(port) => {
                        r.fate = Fate::Forward(port);
                        self.next_alive.push(orig);
                    }
                    Verdict::Label(l) => {
                        r.fate = Fate::Forward(0);
                        r.label = Some(l);
                        self.next_alive.push(orig);
                    }
                }
            }
            for rw in self.out.rewrites.drain(..) {
                if let Some(&orig) = self.alive.get(rw.packet as usize)
                    && let Some(r) = self.results.get_mut(orig)
                    && !matches!(r.fate, Fate::Dropped(_))
                {
                    r.data = Some(rw.data);
                }
            }
            std::mem::swap(&mut self.alive, &mut self.next_alive);
            if changed && s < last {
                // The next NF sees only survivors, with their new bytes.
                self.builder.clear();
                for &orig in &self.alive {
                    let (Some(p), Some(r)) = (packets.get(orig - base), self.results.get(orig)) else { continue };
                    let data = r.data.as_deref().unwrap_or(p.data);
                    let wire_len = if r.data.is_some() { data.len() as u32 } else { p.wire_len };
                    let _ = self.builder.push(RawPacket { data, wire_len, ..*p });
                }
            }
        }
    }
}
