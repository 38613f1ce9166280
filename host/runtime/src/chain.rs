//! A chain of NFs run as sequential function calls over one batch on one
//! worker (Serpens' run-to-completion model, §III-B): no queues between
//! NFs, and no copies beyond the one into each guest that the contract
//! requires.
//!
//! A chain is a DAG of NFs listed in an order where every route goes
//! forward. Each NF has a `next` NF (or none: the packet leaves the chain)
//! and may route labels elsewhere: a packet an NF gives `label(l)` goes to
//! the NF routed for `l` (Serpens' *distribute*), any other forwarded packet
//! to `next`. Several NFs may route to the same NF (*aggregate*): it gets
//! their packets merged back into arrival order. A linear chain is the
//! special case where every NF's `next` is the one after it.

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
    /// Refused before any NF ran: a frame longer than
    /// [`crate::instance::MAX_PACKET_LEN`], which no NF could rewrite.
    Refused,
}

/// A packet kept back from the chain while its flow's state is fetched
/// from another host: held by the packet I/O until released, or dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// The I/O keeps it under this ticket until the ticket is released;
    /// it then comes back, ahead of newer packets.
    Keep(u64),
    /// Its flow holds as many packets as it may, or the I/O has no room:
    /// dropped, since it may not overtake the held ones.
    Drop,
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

/// Where an NF's packets go next.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Routes {
    /// The NF (index in the chain) for forwarded and unrouted labelled
    /// packets; `None`: they leave the chain.
    pub next: Option<usize>,
    /// Label → NF index.
    pub labels: Vec<(u16, usize)>,
}

impl Routes {
    /// The linear routes of `n` NFs: each to the one after it.
    pub fn linear(n: usize) -> Vec<Routes> {
        (0..n).map(|i| Routes { next: (i + 1 < n).then_some(i + 1), labels: Vec::new() }).collect()
    }

    fn target(&self, label: Option<u16>) -> Option<usize> {
        label.and_then(|l| self.labels.iter().find(|(k, _)| *k == l).map(|(_, t)| *t)).or(self.next)
    }
}

/// Checks that every route points to a later NF (so chains cannot loop).
pub fn check_routes(names: &[&str], routes: &[Routes]) -> Result<(), String> {
    if names.len() != routes.len() {
        return Err(format!("{} NFs but {} route entries", names.len(), routes.len()));
    }
    for (i, r) in routes.iter().enumerate() {
        let name = names.get(i).copied().unwrap_or("?");
        for t in r.next.iter().chain(r.labels.iter().map(|(_, t)| t)) {
            let target =
                names.get(*t).copied().ok_or_else(|| format!("NF '{name}' routes to NF #{t}, which does not exist"))?;
            if *t <= i {
                return Err(format!(
                    "NF '{name}' routes to '{target}', which comes before it; list the NFs so that every route goes forward (chains cannot loop)"
                ));
            }
        }
    }
    Ok(())
}

/// Called by [`Chain::process_hooked`] before a batch's first NF runs.
pub trait FlowHook {
    /// `keys`: the batch's distinct flows (normalized; empty when no NF of
    /// the chain keeps flows).
    fn before(&mut self, stages: &mut [NfInstance], keys: &[sluice_wire::FlowKey]);
}

/// NF instances of one worker, called in chain order on every batch.
#[derive(Debug)]
pub struct Chain {
    stages: Vec<NfInstance>,
    routes: Vec<Routes>,
    builder: BatchBuilder,
    out: StageOutput,
    results: Vec<PacketResult>,
    /// Packets waiting at each NF (indices into `results`).
    inbox: Vec<Vec<usize>>,
    /// The packets the builder holds, and whether their bytes are current.
    built: Vec<usize>,
    statuses: Vec<BatchStatus>,
    /// Frames refused at ingress (see [`Fate::Refused`]).
    refused: u64,
}

impl Chain {
    /// Frames refused at ingress so far: longer than
    /// [`crate::instance::MAX_PACKET_LEN`]; each is dropped alone, never
    /// the batch it came in.
    pub fn refused(&self) -> u64 {
        self.refused
    }

    /// A linear chain: instantiates every NF (in order) and runs `init`.
    pub fn new(runtime: &Runtime, specs: &[NfSpec]) -> Result<Self, RuntimeError> {
        Self::with_routes(runtime, specs, Routes::linear(specs.len()))
    }

    /// A chain with explicit routes (see [`check_routes`]).
    pub fn with_routes(runtime: &Runtime, specs: &[NfSpec], routes: Vec<Routes>) -> Result<Self, RuntimeError> {
        let domains: Vec<_> = specs.iter().map(|_| sluice_state::Domain::new()).collect();
        Self::with_domains(runtime, specs, routes, &domains)
    }

    /// One worker's chain where several workers run the same NFs:
    /// `domains[i]` holds NF `i`'s state shared between workers (eventual
    /// tables, pools) and must be the same for every worker's chain.
    pub fn with_domains(
        runtime: &Runtime,
        specs: &[NfSpec],
        routes: Vec<Routes>,
        domains: &[std::sync::Arc<sluice_state::Domain>],
    ) -> Result<Self, RuntimeError> {
        let names: Vec<&str> = specs.iter().map(|s| s.module.name()).collect();
        check_routes(&names, &routes).map_err(|reason| RuntimeError::Chain { reason })?;
        if domains.len() != specs.len() {
            return Err(RuntimeError::Chain {
                reason: format!("{} state domains for {} NFs", domains.len(), specs.len()),
            });
        }
        let stages = specs
            .iter()
            .zip(domains)
            .map(|(s, d)| NfInstance::new_in(runtime, s.clone(), d))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self::assemble(stages, routes))
    }

    /// A linear chain of already-created instances (e.g. native NFs).
    pub fn from_instances(stages: Vec<NfInstance>) -> Self {
        let routes = Routes::linear(stages.len());
        Self::assemble(stages, routes)
    }

    fn assemble(stages: Vec<NfInstance>, routes: Vec<Routes>) -> Self {
        let with_flows = stages.iter().any(NfInstance::needs_flows);
        Chain {
            statuses: vec![BatchStatus::Ok; stages.len()],
            refused: 0,
            inbox: vec![Vec::new(); stages.len()],
            stages,
            routes,
            builder: BatchBuilder::new(with_flows),
            out: StageOutput::default(),
            results: Vec::new(),
            built: Vec::new(),
        }
    }

    /// Hot-swaps the NF named `name` to another version (see
    /// [`NfInstance::swap`]); takes effect with the next batch.
    pub fn swap(&mut self, runtime: &Runtime, name: &str, spec: NfSpec) -> Result<(), RuntimeError> {
        let stage = self.stages.iter_mut().find(|s| s.name() == name).ok_or_else(|| RuntimeError::Swap {
            nf: name.to_string(),
            reason: "no NF of that name in the chain".into(),
        })?;
        let with_flows_before = stage.needs_flows();
        stage.swap(runtime, spec)?;
        if stage.needs_flows() && !with_flows_before {
            // The new version wants flow state: collect flows from now on.
            self.builder = BatchBuilder::new(true);
            self.built.clear();
        }
        Ok(())
    }

    /// Where each NF sends its packets.
    pub fn routes(&self) -> &[Routes] {
        &self.routes
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

    /// The results of the last [`process`](Self::process) call, one per
    /// packet in input order.
    pub fn last_results(&self) -> &[PacketResult] {
        &self.results
    }

    /// Runs one batch through the chain and returns one result per packet,
    /// in input order. More than [`MAX_BATCH`] packets are run as several
    /// batches.
    pub fn process(&mut self, packets: &[RawPacket<'_>]) -> &[PacketResult] {
        self.process_hooked(packets, None)
    }

    /// [`process`](Self::process), calling `hook` with the distinct flows
    /// of each batch before its first NF runs (a host in a group imports
    /// the state of flows that arrive from another host there, and marks
    /// the flows it replicates). The flows are those the first NF sees.
    pub fn process_hooked(
        &mut self,
        packets: &[RawPacket<'_>],
        mut hook: Option<&mut dyn FlowHook>,
    ) -> &[PacketResult] {
        self.results.clear();
        self.results.resize(packets.len(), PacketResult { fate: Fate::Forward(0), data: None, label: None });
        for (n, chunk) in packets.chunks(MAX_BATCH).enumerate() {
            self.process_batch(chunk, n * MAX_BATCH, &mut hook);
        }
        &self.results
    }

    /// Runs `packets` (at most [`MAX_BATCH`]) as one batch; their results
    /// start at `base` in `self.results`.
    fn process_batch(&mut self, packets: &[RawPacket<'_>], base: usize, hook: &mut Option<&mut dyn FlowHook>) {
        for inbox in &mut self.inbox {
            inbox.clear();
        }
        let Some(first) = self.inbox.first_mut() else { return };
        self.built.clear();
        self.builder.clear();
        for (i, p) in packets.iter().enumerate() {
            if p.data.len() > crate::instance::MAX_PACKET_LEN {
                if self.refused == 0 {
                    tracing::warn!(bytes = p.data.len(), "refusing a frame longer than 65,535 bytes (counted)");
                }
                self.refused += 1;
                if let Some(r) = self.results.get_mut(base + i) {
                    r.fate = Fate::Refused;
                }
                continue;
            }
            first.push(base + i);
            // Cannot fail: at most MAX_BATCH packets.
            let _ = self.builder.push(*p);
            self.built.push(base + i);
        }
        if let Some(h) = hook.as_mut() {
            h.before(&mut self.stages, self.builder.flow_keys());
        }
        for s in 0..self.stages.len() {
            let Some(slot) = self.inbox.get_mut(s) else { continue };
            let mut mine = std::mem::take(slot);
            if mine.is_empty() {
                continue;
            }
            // Packets from several branches come back in arrival order.
            mine.sort_unstable();
            if mine != self.built {
                // This NF sees exactly its packets, with their current bytes.
                self.builder.clear();
                for &orig in &mine {
                    let (Some(p), Some(r)) = (packets.get(orig - base), self.results.get(orig)) else { continue };
                    let data = r.data.as_deref().unwrap_or(p.data);
                    let wire_len = if r.data.is_some() { data.len() as u32 } else { p.wire_len };
                    let _ = self.builder.push(RawPacket { data, wire_len, ..*p });
                }
                self.built.clone_from(&mine);
            }
            let Some(stage) = self.stages.get_mut(s) else { continue };
            let status = stage.process(&mut self.builder, &mut self.out);
            if let Some(slot) = self.statuses.get_mut(s) {
                *slot = status;
            }
            let routes = self.routes.get(s);
            for (j, &orig) in mine.iter().enumerate() {
                let Some(r) = self.results.get_mut(orig) else { continue };
                let label = match self.out.verdicts.get(j).copied().unwrap_or(Verdict::Drop) {
                    Verdict::Drop => {
                        r.fate = Fate::Dropped(s);
                        continue;
                    }
                    Verdict::Forward(port) => {
                        r.fate = Fate::Forward(port);
                        None
                    }
                    Verdict::Label(l) => {
                        r.fate = Fate::Forward(0);
                        r.label = Some(l);
                        Some(l)
                    }
                };
                if let Some(t) = routes.and_then(|r| r.target(label))
                    && let Some(inbox) = self.inbox.get_mut(t)
                {
                    inbox.push(orig);
                }
            }
            if !self.out.rewrites.is_empty() {
                // The builder no longer holds current bytes.
                self.built.clear();
            }
            for rw in self.out.rewrites.drain(..) {
                if let Some(&orig) = mine.get(rw.packet as usize)
                    && let Some(r) = self.results.get_mut(orig)
                    && !matches!(r.fate, Fate::Dropped(_))
                {
                    r.data = Some(rw.data);
                }
            }
            mine.clear();
            if let Some(slot) = self.inbox.get_mut(s) {
                *slot = mine;
            }
        }
    }
}
