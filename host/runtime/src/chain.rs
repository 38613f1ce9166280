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

pub use crate::fate::{Fate, PacketResult};

use crate::batch::{BatchBuilder, RawPacket};
use crate::error::RuntimeError;
use crate::instance::{BatchStatus, EmittedEvent, NfInstance, NfSpec, StageOutput};
use crate::wasm_runtime::Runtime;
use sluice_wire::abi::{MAX_BATCH, Verdict};

/// Rewritten packets a chain on several workers looks at for a translated
/// flow (see [`Chain::watch_translations`]): a NAT's or load balancer's
/// first packets show it, and then nothing is looked at.
const TRANSLATION_CHECKS: u16 = 1024;

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

/// A packet the chain ran whose output waits until its flow's changed
/// state is held by another host (output commit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Defer {
    /// The I/O keeps its output under this ticket, sends it when the
    /// ticket is let go and frees it when the ticket is dropped.
    Keep(u64),
    /// It may not leave: no room to wait, or its flow's change could not
    /// be sent.
    Drop,
}

/// What a chain decided on its own, before or instead of its NFs: every
/// packet it refused or handled without an NF is in one of these.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ChainCounters {
    /// Frames longer than [`crate::instance::MAX_PACKET_LEN`], refused.
    pub refused_oversize: u64,
    /// Frames shorter than the datagram their IP header declares (cut off
    /// by a receive buffer smaller than the datagram), refused: an NF never
    /// sees part of a datagram as a whole one. Captures that record a
    /// shorter snap length are not refused (their packets say so).
    pub refused_cut_short: u64,
    /// Later IP fragments that followed their first fragment's fate (see
    /// [`crate::fragments`]).
    pub fragments_followed: u64,
    /// Later IP fragments dropped: their first fragment was not seen
    /// (it came after them, was lost, or was seen too long ago).
    pub fragments_unmatched: u64,
    /// IP fragments held to reassemble their datagram (all but the one
    /// that completed it; see [`crate::reassembly`]).
    #[serde(default)]
    pub fragments_held: u64,
    /// Datagrams reassembled from their fragments and run through the NFs.
    #[serde(default)]
    pub datagrams_reassembled: u64,
    /// IP fragments refused on arrival: they contradict their datagram
    /// (overlap, inconsistent length), repeat one already held, or their
    /// source or the deployment holds as many fragments as it may.
    #[serde(default)]
    pub fragments_refused: u64,
    /// Held fragments thrown away: their datagram stayed incomplete for
    /// 30 s, or a later fragment invalidated it.
    #[serde(default)]
    pub fragments_discarded: u64,
}

impl ChainCounters {
    /// Adds another worker's counters.
    pub fn add(&mut self, o: &ChainCounters) {
        self.refused_oversize += o.refused_oversize;
        self.refused_cut_short += o.refused_cut_short;
        self.fragments_followed += o.fragments_followed;
        self.fragments_unmatched += o.fragments_unmatched;
        self.fragments_held += o.fragments_held;
        self.datagrams_reassembled += o.datagrams_reassembled;
        self.fragments_refused += o.fragments_refused;
        self.fragments_discarded += o.fragments_discarded;
    }

    /// What was counted since `earlier` (the same chain's counters read
    /// before); everything, when the chain was replaced in between and
    /// counts from zero again.
    pub fn since(&self, earlier: &ChainCounters) -> ChainCounters {
        let replaced = self.refused_oversize < earlier.refused_oversize
            || self.refused_cut_short < earlier.refused_cut_short
            || self.fragments_followed < earlier.fragments_followed
            || self.fragments_unmatched < earlier.fragments_unmatched
            || self.fragments_held < earlier.fragments_held
            || self.datagrams_reassembled < earlier.datagrams_reassembled
            || self.fragments_refused < earlier.fragments_refused
            || self.fragments_discarded < earlier.fragments_discarded;
        if replaced {
            return *self;
        }
        ChainCounters {
            refused_oversize: self.refused_oversize - earlier.refused_oversize,
            refused_cut_short: self.refused_cut_short - earlier.refused_cut_short,
            fragments_followed: self.fragments_followed - earlier.fragments_followed,
            fragments_unmatched: self.fragments_unmatched - earlier.fragments_unmatched,
            fragments_held: self.fragments_held - earlier.fragments_held,
            datagrams_reassembled: self.datagrams_reassembled - earlier.datagrams_reassembled,
            fragments_refused: self.fragments_refused - earlier.fragments_refused,
            fragments_discarded: self.fragments_discarded - earlier.fragments_discarded,
        }
    }

    /// Packets the chain dropped itself (refused on arrival, or held and
    /// thrown away).
    pub fn dropped(&self) -> u64 {
        self.refused_oversize
            + self.refused_cut_short
            + self.fragments_unmatched
            + self.fragments_refused
            + self.fragments_discarded
    }
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

    /// Called after [`before`](Self::before): offload entries another host
    /// carried with the state of flows of the batch, for the chain to take
    /// in (see [`Chain::import_offloads`]).
    fn carried(&mut self, _out: &mut Vec<(sluice_wire::FlowKey, Vec<crate::offload::Carried>)>) {}
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
    counters: ChainCounters,
    /// First fragments decided, whose later fragments follow them.
    followers: crate::fragments::Followers,
    /// The batch's first fragments (index into `results`, datagram).
    firsts: Vec<(usize, sluice_wire::fragment::FragmentKey)>,
    /// The batch's later fragments, resolved after its first fragments.
    laters: Vec<(usize, sluice_wire::fragment::FragmentKey)>,
    /// What the NFs see of fragmented datagrams.
    fragment_mode: crate::fragments::FragmentMode,
    /// How many more rewritten packets to look at for a changed flow (an
    /// address or port translated) before the host warns that the chain's
    /// other NFs may miss their state on another worker; 0: not looking
    /// (see [`Chain::watch_translations`]).
    translation_checks: u16,
    /// Incomplete datagrams ([`FragmentMode::Reassemble`](crate::fragments::FragmentMode)).
    reassembler: crate::reassembly::Reassembler,
    /// The batch's reassembled datagrams (index into `results`, how to cut
    /// it again).
    reassembled: Vec<(usize, sluice_wire::reassembly::Cut)>,
    /// Ingress ports on the outside: their packets (replies) run the chain
    /// from its last NF to its first (see [`Chain::set_outside`]).
    outside: Vec<u16>,
    /// The packets of the batch that run in reverse (indices into `results`).
    replies: Vec<usize>,
    /// Stage times, when asked for ([`Chain::time_stages`]).
    timing: Option<Box<(crate::stages::Stopwatch, crate::stages::StageTimes)>>,
    /// Flow offload entries (see [`crate::offload`]).
    offload: crate::offload::Table,
    /// What the NFs asked to offload for packets of the batch (index in
    /// the batch, requests), and where each packet's is (`u32::MAX`: none).
    offers: Vec<(usize, crate::offload::Pending)>,
    offer_at: Vec<u32>,
    /// How many NFs each packet of the batch went through, when an NF
    /// of the chain may offload.
    visits: Vec<u8>,
    /// Entries ended and not yet handed to their NFs.
    ended: Vec<(crate::offload::Step, crate::offload::Return)>,
    /// Entries carried from another host, for the chain to take in.
    carried: Vec<(sluice_wire::FlowKey, Vec<crate::offload::Carried>)>,
}

/// The chain's own stages (see [`crate::stages`]).
#[derive(Debug, Clone, Copy)]
enum Stage {
    Build,
    Call,
    Verdicts,
}

impl Chain {
    /// What the chain decided itself so far: frames refused at ingress
    /// (each dropped alone, never the batch it came in) and later IP
    /// fragments.
    pub fn counters(&self) -> ChainCounters {
        self.counters
    }

    /// Times the chain's stages (build, call, verdicts; see
    /// [`crate::stages`]) from now on, or stops (and forgets the sums).
    pub fn time_stages(&mut self, on: bool) {
        self.timing = on.then(|| Box::new((crate::stages::Stopwatch::new(), crate::stages::StageTimes::default())));
    }

    /// The chain's stage times so far (zero when not timed): `build_ns`,
    /// `call_ns` and `verdicts_ns`.
    pub fn stage_times(&self) -> crate::stages::StageTimes {
        self.timing.as_ref().map(|t| t.1).unwrap_or_default()
    }

    /// Whether its stages are timed.
    pub fn timed(&self) -> bool {
        self.timing.is_some()
    }

    /// The chain's stage times so far, which start again from zero (it
    /// stays timed).
    pub fn take_stage_times(&mut self) -> crate::stages::StageTimes {
        self.timing.as_deref_mut().map(|t| std::mem::take(&mut t.1)).unwrap_or_default()
    }

    /// Adds the time since the last lap to `stage`, when timed.
    #[inline]
    fn lap(&mut self, stage: Stage) {
        if let Some(t) = self.timing.as_deref_mut() {
            let ns = t.0.lap();
            let slot = match stage {
                Stage::Build => &mut t.1.build_ns,
                Stage::Call => &mut t.1.call_ns,
                Stage::Verdicts => &mut t.1.verdicts_ns,
            };
            *slot += ns;
        }
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
            counters: ChainCounters::default(),
            followers: crate::fragments::Followers::default(),
            firsts: Vec::new(),
            laters: Vec::new(),
            fragment_mode: crate::fragments::FragmentMode::default(),
            translation_checks: 0,
            reassembler: crate::reassembly::Reassembler::default(),
            reassembled: Vec::new(),
            outside: Vec::new(),
            replies: Vec::new(),
            timing: None,
            offload: crate::offload::Table::default(),
            offers: Vec::new(),
            offer_at: Vec::new(),
            visits: Vec::new(),
            ended: Vec::new(),
            carried: Vec::new(),
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
        // The new version decides its flows again.
        if let Some(at) = self.stages.iter().position(|s| s.name() == name) {
            self.offload.end_all(Some(at), crate::offload::EndReason::Replaced, &mut self.ended);
            self.hand_back();
        }
        let Some(stage) = self.stages.iter_mut().find(|s| s.name() == name) else { return Ok(()) };
        if stage.needs_flows() && !with_flows_before {
            // The new version wants flow state: collect flows from now on.
            self.builder = BatchBuilder::new(true);
            self.built.clear();
        }
        Ok(())
    }

    /// What the chain's flow offload entries did so far.
    pub fn offload_counters(&self) -> crate::offload::OffloadCounters {
        self.offload.counters
    }

    /// Offload entries held now.
    pub fn offload_entries(&self) -> usize {
        self.offload.len()
    }

    /// A number that changes whenever an offload entry of flow `key`
    /// (normalized, as it comes in) is made, passes a packet or ends; 0
    /// when it has none. With the NFs' [`NfInstance::flow_clock`]s it
    /// tells whether a flow's state changed since it was last sent.
    pub fn offload_sum(&self, key: &sluice_wire::FlowKey) -> u64 {
        self.offload.flow_sum(key)
    }

    /// What NF `stage` holds of flow `key` (see
    /// [`NfInstance::export_flow`]), its flow state last seen as of the
    /// last packet that passed under a live offload entry of the flow,
    /// where that is later (the NFs' flow state is not refreshed for each
    /// such packet).
    pub fn export_flow(&self, stage: usize, key: &sluice_wire::FlowKey) -> Option<crate::instance::FlowExport> {
        let mut e = self.stages.get(stage)?.export_flow(key)?;
        if let (Some(f), Some(t)) = (e.flow.as_mut(), self.offload.last_packet(stage, &e.key)) {
            f.last_seen_ns = f.last_seen_ns.max(t);
        }
        Some(e)
    }

    /// Copies of flow `key`'s offload entries (normalized, as it comes
    /// in), to go with its NFs' state to another host.
    pub fn carry_offloads(&self, key: &sluice_wire::FlowKey) -> Vec<crate::offload::Carried> {
        self.offload.carry(key, |i| self.stages.get(i).map(|s| s.name().to_string()))
    }

    /// [`carry_offloads`](Self::carry_offloads) for a flow that leaves this
    /// host (its owner changed): its entries also end here, and what passed
    /// under them goes only with the copies, so that no NF is handed the
    /// same packets twice.
    pub fn hand_over_offloads(&mut self, key: &sluice_wire::FlowKey) -> Vec<crate::offload::Carried> {
        let out = self.carry_offloads(key);
        let mut ended_on = Vec::new();
        self.offload.hand_over(key, &mut ended_on);
        for (step, r) in ended_on {
            if let Some(s) = self.stages.get_mut(step.stage) {
                s.offloaded_flow_seen(&step.key, r.last_ns);
                s.offload_ended(None);
            }
        }
        out
    }

    /// Takes in the offload entries of flow `key` (normalized, as it comes
    /// in here) that another host carried with its state (see
    /// [`carry_offloads`](Self::carry_offloads)); each is checked against
    /// this chain's NFs and their state budgets; `now` is packet time.
    /// Returns how many were refused, each logged with why.
    pub fn import_offloads(
        &mut self,
        key: sluice_wire::FlowKey,
        carried: Vec<crate::offload::Carried>,
        now: u64,
    ) -> usize {
        let mut refused = 0;
        for c in carried {
            let stages = &self.stages;
            let find = |nf: &str| {
                let at = stages
                    .iter()
                    .position(|s| s.name() == nf && s.offloads())
                    .ok_or_else(|| crate::offload::CarryRefusal::UnknownNf(nf.to_string()))?;
                match stages.get(at) {
                    Some(s) if s.offload_room() > 0 => Ok(at),
                    _ => Err(crate::offload::CarryRefusal::OverBudget(nf.to_string())),
                }
            };
            match self.offload.import(key, c, now, find) {
                Ok(Some(path)) => {
                    for step in &path {
                        if let Some(s) = self.stages.get_mut(step.stage) {
                            s.offload_installed();
                        }
                    }
                }
                Ok(None) => {}
                Err(why) => {
                    refused += 1;
                    tracing::debug!(?why, "an offload entry carried from another host was not taken in");
                }
            }
        }
        refused
    }

    /// Starts noting the flows whose offload entries change, for
    /// [`take_offload_changes`](Self::take_offload_changes).
    pub fn track_offload_changes(&mut self) {
        self.offload.track_changes();
    }

    /// Appends the flows (normalized, as they come in) whose offload
    /// entries changed since the last call; `false` if more changed than
    /// were noted (any may have).
    pub fn take_offload_changes(&mut self, out: &mut Vec<sluice_wire::FlowKey>) -> bool {
        self.offload.take_changes(out)
    }

    /// The flows (normalized, as they come in) with offload entries.
    pub fn offloaded_flows(&self) -> impl Iterator<Item = sluice_wire::FlowKey> + '_ {
        self.offload.flows()
    }

    /// Ends every offload entry (the chain stops, or its packets go
    /// elsewhere) and hands each NF what passed under its entries, with a
    /// call of `process` on an empty batch where no batch would follow.
    pub fn end_offloads(&mut self) {
        self.offload.end_all(None, crate::offload::EndReason::Replaced, &mut self.ended);
        self.hand_back();
        let mut empty = BatchBuilder::new(false);
        for stage in &mut self.stages {
            // Each call takes up to MAX_RETURNS_PER_CALL of them; an NF
            // that takes none ends the calls.
            while stage.offload_returns_waiting() {
                let before = stage.offload_returns_len();
                empty.clear();
                if stage.process(&mut empty, &mut self.out) != BatchStatus::Ok || stage.offload_returns_len() >= before
                {
                    break;
                }
            }
        }
    }

    /// Hands ended entries' returns to their NFs; each NF's state of the
    /// flow is brought up to the entry's last packet.
    fn hand_back(&mut self) {
        for (step, r) in self.ended.drain(..) {
            if let Some(s) = self.stages.get_mut(step.stage) {
                s.offloaded_flow_seen(&step.key, r.last_ns);
                s.offload_ended(step.wants_counts().then_some(r));
            }
        }
    }

    /// Where each NF sends its packets.
    pub fn routes(&self) -> &[Routes] {
        &self.routes
    }

    /// Makes the chain direction-aware: packets that come in on one of
    /// `ports` (the outside: replies to connections opened from the inside)
    /// run the chain in reverse, from its last NF to its first, so that
    /// every NF sees both directions of a connection on the same side of
    /// the NFs that rewrite it (a firewall before a NAT sees inside
    /// addresses both ways), as a router's hooks do. Packets from any other
    /// port run it in order. Only a linear chain has a reverse: one with
    /// label routes or joins is refused. No ports: every packet runs in
    /// order (the default).
    pub fn set_outside(&mut self, ports: &[u16]) -> Result<(), RuntimeError> {
        if !ports.is_empty() && self.routes != Routes::linear(self.stages.len()) {
            return Err(RuntimeError::Chain {
                reason: "a chain with label routes or joins runs one way only: give replies their own deployment, \
                         or make the chain linear to run it in reverse for the outside ports"
                    .into(),
            });
        }
        let mut ports = ports.to_vec();
        ports.sort_unstable();
        ports.dedup();
        self.outside = ports;
        Ok(())
    }

    /// Chooses what the NFs see of fragmented IP datagrams (see
    /// [`FragmentMode`](crate::fragments::FragmentMode)); takes effect with
    /// the next batch. Leaving [`Reassemble`](crate::fragments::FragmentMode::Reassemble)
    /// throws away the fragments held (counted as discarded).
    pub fn set_fragment_mode(&mut self, mode: crate::fragments::FragmentMode) {
        if mode != crate::fragments::FragmentMode::Reassemble {
            let mut tally = crate::reassembly::Tally::default();
            self.reassembler.clear(&mut tally);
            self.counters.fragments_discarded += tally.discarded;
        }
        self.fragment_mode = mode;
    }

    /// What the NFs see of fragmented IP datagrams.
    pub fn fragment_mode(&self) -> crate::fragments::FragmentMode {
        self.fragment_mode
    }

    /// Bytes of IP fragments held for reassembly now.
    pub fn reassembly_bytes(&self) -> usize {
        self.reassembler.held_bytes()
    }

    /// The ingress ports whose packets run the chain in reverse (see
    /// [`set_outside`](Self::set_outside)).
    pub fn outside(&self) -> &[u16] {
        &self.outside
    }

    /// Whether an NF of the chain keeps flow state of the flow `key`
    /// (either direction), or none keeps flow state at all (then any
    /// worker's chain will do for its packets).
    pub fn holds_flow(&self, key: &sluice_wire::FlowKey) -> bool {
        let key = key.normalized();
        let mut keeping = self.stages.iter().filter(|s| s.wants_flow_state()).peekable();
        keeping.peek().is_none() || keeping.any(|s| s.flow_table().get(&key).is_some())
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

    /// The same, to change or take out (a host's dispatch sets each
    /// lane's fates as the host sends them).
    pub fn last_results_mut(&mut self) -> &mut [PacketResult] {
        &mut self.results
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
    ) -> &mut [PacketResult] {
        if let Some(t) = self.timing.as_deref_mut() {
            t.0.restart();
        }
        if hook.is_some() && !self.builder.collects_flows() && self.stages.iter().any(NfInstance::offloads) {
            // A hook looks the batch's flows up (replicas from other hosts,
            // which carry offload entries also for NFs without flow state).
            self.builder = BatchBuilder::new(true);
            self.built.clear();
        }
        self.results.clear();
        self.results.resize(packets.len(), PacketResult::of(Fate::Forward(0)));
        for (n, chunk) in packets.chunks(MAX_BATCH).enumerate() {
            self.process_batch(chunk, n * MAX_BATCH, &mut hook);
        }
        if self.translation_checks > 0 {
            self.look_for_translations(packets);
        }
        &mut self.results
    }

    /// Has the chain look at its first rewritten packets for a flow its
    /// NFs translate (addresses or ports changed) when it is one of
    /// `workers` instances of a chain of several NFs, and warn once if
    /// one is: packets are spread over workers by their own addresses and
    /// ports, so the replies of a translated flow may reach another
    /// worker, where the chain's NFs with per-flow state (a stateful
    /// firewall) do not have that flow's state. An NF that translates
    /// alone (the NAT, whose state is host-wide) runs on any number.
    pub fn watch_translations(&mut self, workers: usize) {
        self.translation_checks = if workers > 1 && self.stages.len() > 1 { TRANSLATION_CHECKS } else { 0 };
    }

    /// Looks at the batch's rewritten packets (see
    /// [`watch_translations`](Self::watch_translations)); kept out of the
    /// batch's path.
    #[cold]
    #[inline(never)]
    fn look_for_translations(&mut self, packets: &[RawPacket<'_>]) {
        for (p, r) in packets.iter().zip(&self.results) {
            let (Fate::Forward(_), Some(data)) = (r.fate, r.data.as_deref()) else { continue };
            self.translation_checks = self.translation_checks.saturating_sub(1);
            let (Some(from), Some(to)) = (sluice_wire::parse(p.data).key, sluice_wire::parse(data).key) else {
                continue;
            };
            if from.normalized() != to.normalized() {
                tracing::warn!(
                    flow = %from,
                    left_as = %to,
                    "an NF of this chain translates addresses or ports, and the chain runs on several workers: \
                     the replies of a translated flow are spread by their own addresses and may reach another \
                     worker, whose NFs have no state of that flow (a stateful firewall drops them); run this chain \
                     on one worker (--workers 1), or the translating NF alone on several"
                );
                self.translation_checks = 0;
            }
            if self.translation_checks == 0 {
                return;
            }
        }
    }

    /// Runs `packets` (at most [`MAX_BATCH`]) as one batch; their results
    /// start at `base` in `self.results`. Packets from the outside ports run
    /// the NFs last to first, after the others have run first to last.
    fn process_batch(&mut self, packets: &[RawPacket<'_>], base: usize, hook: &mut Option<&mut dyn FlowHook>) {
        for inbox in &mut self.inbox {
            inbox.clear();
        }
        self.replies.clear();
        let last = self.stages.len().saturating_sub(1);
        if self.stages.is_empty() {
            return;
        }
        self.built.clear();
        self.builder.clear();
        self.firsts.clear();
        self.laters.clear();
        self.reassembled.clear();
        let reassemble = self.fragment_mode == crate::fragments::FragmentMode::Reassemble;
        // Packets' paths are tracked once an NF of the chain has asked to
        // offload: an NF that never does costs nothing here.
        let offloading = self.stages.iter().any(NfInstance::offloaded);
        let now = packets.iter().map(|p| p.timestamp_ns).max().unwrap_or(0);
        self.visits.clear();
        if offloading {
            self.visits.resize(packets.len(), 0);
            self.offers.clear();
            self.offer_at.clear();
            self.offer_at.resize(packets.len(), u32::MAX);
        }
        let offloaded = !self.offload.is_empty();
        if offloaded {
            self.offload.begin_batch();
            // At the batch's earliest packet time: an entry its later
            // packets find idle ends then, packet by packet.
            let earliest = packets.iter().map(|p| p.timestamp_ns).min().unwrap_or(0);
            self.offload.sweep(earliest, &mut self.ended);
        }
        for (i, p) in packets.iter().enumerate() {
            let at = base + i;
            if p.data.len() > crate::instance::MAX_PACKET_LEN {
                if self.counters.refused_oversize == 0 {
                    tracing::warn!(bytes = p.data.len(), "refusing a frame longer than 65,535 bytes (counted)");
                }
                self.counters.refused_oversize += 1;
                self.refuse(at);
                continue;
            }
            let layers = sluice_wire::parse(p.data);
            if let Some(ip) = &layers.ip {
                // A capture's snap length cuts frames on purpose (their
                // wire length says so); a frame cut by a receive buffer
                // claims to be whole.
                if ip.cut_short(p.data.len()) && p.wire_len as usize <= p.data.len() {
                    if self.counters.refused_cut_short == 0 {
                        tracing::warn!(
                            bytes = p.data.len(),
                            datagram = ip.end,
                            "refusing a frame shorter than its IP datagram (counted): give the port buffers as large as its frames"
                        );
                    }
                    self.counters.refused_cut_short += 1;
                    self.refuse(at);
                    continue;
                }
                if let Some(f) = &ip.fragment {
                    if reassemble {
                        if !self.reassemble(at, f.key, p, ip) {
                            continue;
                        }
                    } else if f.offset != 0 {
                        self.laters.push((at, f.key));
                        continue;
                    } else {
                        self.firsts.push((at, f.key));
                    }
                }
            }
            if offloaded && let Some(probe) = self.offload.probe(p, &layers) {
                let stages = &mut self.stages;
                let pass = self.offload.pass(&probe, p, &layers, &mut self.ended, |stage, bytes| {
                    if let Some(s) = stages.get_mut(stage) {
                        s.count_offloaded(bytes);
                    }
                });
                if let crate::offload::Pass::Hit { fate, label, data } = pass {
                    if let Some(r) = self.results.get_mut(at) {
                        r.fate = fate;
                        r.label = label;
                        r.data = data;
                    }
                    continue;
                }
            }
            if self.outside.contains(&p.ingress_port) {
                self.replies.push(at);
            } else if let Some(first) = self.inbox.first_mut() {
                first.push(at);
            }
            // A reassembled datagram goes in with its whole bytes. Cannot
            // fail: at most MAX_BATCH packets.
            let whole = if reassemble { self.results.get(at).and_then(|r| r.data.as_deref()) } else { None };
            let _ = match whole {
                Some(d) => self.builder.push(RawPacket { data: d, wire_len: d.len() as u32, ..*p }),
                None => self.builder.push_parsed(*p, &layers),
            };
            self.built.push(at);
        }
        if offloaded {
            self.hand_back();
        }
        if let Some(h) = hook.as_mut() {
            self.offload.track_changes();
            h.before(&mut self.stages, self.builder.flow_keys());
            h.carried(&mut self.carried);
            if !self.carried.is_empty() {
                self.take_carried(now);
            }
        }
        self.lap(Stage::Build);
        for s in 0..self.stages.len() {
            self.run_stage(s, packets, base, false);
        }
        if !self.replies.is_empty() {
            let replies = std::mem::take(&mut self.replies);
            if let Some(inbox) = self.inbox.get_mut(last) {
                inbox.extend_from_slice(&replies);
            }
            self.replies = replies;
            for s in (0..self.stages.len()).rev() {
                self.run_stage(s, packets, base, true);
            }
        }
        if !self.firsts.is_empty() || !self.laters.is_empty() {
            self.follow_fragments(packets, base);
        }
        if offloading {
            self.install_offloads(packets, base, now);
        }
        for (at, cut) in self.reassembled.drain(..) {
            if let Some(r) = self.results.get_mut(at)
                && let (Fate::Forward(_), Some(d)) = (&r.fate, &r.data)
            {
                let cut = sluice_wire::reassembly::split(d, &cut);
                r.fragments = (!cut.is_empty()).then(|| cut.into_boxed_slice());
            }
        }
        self.lap(Stage::Verdicts);
    }

    /// Takes in the entries a hook handed over (kept out of the batch's
    /// body: it runs only when flows arrive with state from another host).
    #[inline(never)]
    fn take_carried(&mut self, now: u64) {
        let mut carried = std::mem::take(&mut self.carried);
        for (key, entries) in carried.drain(..) {
            self.import_offloads(key, entries, now);
        }
        self.carried = carried;
    }

    /// Makes the offload entries of the batch's packets that every NF
    /// they went through asked to offload, and hands ended entries back.
    fn install_offloads(&mut self, packets: &[RawPacket<'_>], base: usize, now: u64) {
        let mut offers = std::mem::take(&mut self.offers);
        for (i, p) in offers.drain(..) {
            let (Some(r), Some(raw), Some(&visits)) = (self.results.get(base + i), packets.get(i), self.visits.get(i))
            else {
                continue;
            };
            // An entry takes packets as they come in: not a datagram the
            // chain reassembled from fragments.
            if p.steps() != usize::from(visits) || self.reassembled.iter().any(|&(at, _)| at == base + i) {
                self.offload.counters.declined += 1;
                continue;
            }
            let on: smallvec::SmallVec<[usize; 4]> = p.stages().collect();
            if self.offload.install(raw.ingress_port, r, p, now, &mut self.ended) {
                for s in on {
                    if let Some(stage) = self.stages.get_mut(s) {
                        stage.offload_installed();
                    }
                }
            }
        }
        self.offers = offers;
        self.hand_back();
    }

    /// Gives fragment `p` (at `at` in the results) to its datagram.
    /// `true` when it completed the datagram, which then runs through the
    /// NFs in its place (its result's `data` holds the datagram).
    fn reassemble(
        &mut self,
        at: usize,
        key: sluice_wire::fragment::FragmentKey,
        p: &RawPacket<'_>,
        ip: &sluice_wire::fragment::IpFacts,
    ) -> bool {
        use crate::reassembly::{Outcome, Refusal};
        let mut tally = crate::reassembly::Tally::default();
        let outcome = self.reassembler.add(key, p.data, ip, p.timestamp_ns, &mut tally);
        self.counters.fragments_discarded += tally.discarded;
        let Some(slot) = self.results.get_mut(at) else { return false };
        match outcome {
            Outcome::Held => {
                self.counters.fragments_held += 1;
                slot.fate = Fate::Reassembling;
                false
            }
            Outcome::Complete(datagram, cut) if datagram.len() <= crate::instance::MAX_PACKET_LEN => {
                self.counters.datagrams_reassembled += 1;
                slot.data = Some(datagram);
                self.reassembled.push((at, cut));
                true
            }
            Outcome::Complete(..) => {
                // Its link header takes it past what an NF can be given.
                self.counters.refused_oversize += 1;
                slot.fate = Fate::Refused;
                false
            }
            Outcome::Refused(why) => {
                if self.counters.fragments_refused == 0 {
                    let reason = match why {
                        Refusal::Invalid(e) => e.name(),
                        Refusal::Duplicate => "duplicate",
                        Refusal::NoRoom => "no_room",
                    };
                    tracing::warn!(reason, "refusing an IP fragment (counted)");
                }
                self.counters.fragments_refused += 1;
                slot.fate = Fate::Refused;
                false
            }
        }
    }

    fn refuse(&mut self, at: usize) {
        if let Some(r) = self.results.get_mut(at) {
            r.fate = Fate::Refused;
        }
    }

    /// Remembers the batch's first fragments' results and gives its later
    /// fragments theirs (see [`crate::fragments`]).
    fn follow_fragments(&mut self, packets: &[RawPacket<'_>], base: usize) {
        for &(at, key) in &self.firsts {
            let (Some(r), Some(p)) = (self.results.get(at), packets.get(at - base)) else { continue };
            self.followers.decide(key, r, p.timestamp_ns);
        }
        for &(at, key) in &self.laters {
            let Some(p) = packets.get(at - base) else { continue };
            let result = self.followers.follow(&key, p.data, p.timestamp_ns);
            match result {
                Some(r) => {
                    self.counters.fragments_followed += 1;
                    if let Some(slot) = self.results.get_mut(at) {
                        *slot = r;
                    }
                }
                None => {
                    self.counters.fragments_unmatched += 1;
                    if let Some(slot) = self.results.get_mut(at) {
                        slot.fate = Fate::Refused;
                    }
                }
            }
        }
    }

    /// Takes NF `s`'s offload requests and revokes from its last batch
    /// (`mine`: the results index of each of its packets).
    fn take_offloads(&mut self, s: usize, mine: &[usize], base: usize) {
        self.offload.revoke(s, &self.out.revoked, self.out.revoke_all, &mut self.ended);
        if self.visits.is_empty() {
            // The chain's first requests: this batch's paths were not
            // tracked, so they make no entry; the NF asks again with its
            // flows' next packets.
            self.offload.counters.declined += self.out.offloads.len() as u64;
            self.out.offloads.clear();
            return;
        }
        let default_idle = self.stages.get(s).map_or(0, NfInstance::flow_idle_timeout_ns);
        for r in self.out.offloads.drain(..) {
            let Some(&orig) = mine.get(r.packet as usize) else { continue };
            // The request was checked against an IP packet: it has a flow.
            let Some(flow) = self.builder.packet_flow(r.packet as usize) else { continue };
            let Some(at) = self.offer_at.get_mut(orig - base) else { continue };
            if *at == u32::MAX {
                *at = self.offers.len() as u32;
                self.offers.push((orig - base, crate::offload::Pending::default()));
            }
            if let Some((_, offer)) = self.offers.get_mut(*at as usize) {
                offer.add(s, flow, r, default_idle);
            }
        }
    }

    /// Runs NF `s` on the packets waiting for it and sends each on: to the
    /// NF its routes name, or (`reverse`) to the NF before it.
    fn run_stage(&mut self, s: usize, packets: &[RawPacket<'_>], base: usize, reverse: bool) {
        // What ran since the last lap applied the previous NF's verdicts.
        self.lap(Stage::Verdicts);
        let Some(slot) = self.inbox.get_mut(s) else { return };
        let mut mine = std::mem::take(slot);
        if mine.is_empty() {
            return;
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
        self.lap(Stage::Build);
        let Some(stage) = self.stages.get_mut(s) else { return };
        let status = if self.offload.is_empty() {
            stage.process(&mut self.builder, &mut self.out)
        } else {
            // Flows under entries were not refreshed for each packet that
            // passed: those of this batch are, before the NF reads them.
            let offload = &self.offload;
            for key in self.builder.flow_keys() {
                if let Some(t) = offload.last_packet(s, key) {
                    stage.offloaded_flow_seen(key, t);
                }
            }
            stage.process_live(&mut self.builder, &mut self.out, &|key| offload.last_packet(s, key))
        };
        self.lap(Stage::Call);
        if let Some(slot) = self.statuses.get_mut(s) {
            *slot = status;
        }
        if !self.visits.is_empty() {
            for &orig in &mine {
                if let Some(v) = self.visits.get_mut(orig - base) {
                    *v = v.saturating_add(1);
                }
            }
        }
        if !self.out.offloads.is_empty() || !self.out.revoked.is_empty() || self.out.revoke_all {
            self.take_offloads(s, &mine, base);
        }
        let routes = self.routes.get(s);
        for (j, &orig) in mine.iter().enumerate() {
            let Some(r) = self.results.get_mut(orig) else { continue };
            let label = match self.out.verdicts.get(j).copied().unwrap_or(Verdict::Drop) {
                Verdict::Drop => {
                    r.fate = Fate::Dropped(u16::try_from(s).unwrap_or(u16::MAX));
                    continue;
                }
                // Port 0, the default output, keeps a port an earlier NF
                // of the chain chose (a pass-through NF after one that
                // answers a packet back out of its ingress port must not
                // undo that); a label moves the packet on and keeps it too.
                Verdict::Forward(port) => {
                    if port != 0 {
                        r.fate = Fate::Forward(port);
                    }
                    None
                }
                Verdict::Label(l) => {
                    r.label = Some(l);
                    Some(l)
                }
            };
            let next = if reverse { s.checked_sub(1) } else { routes.and_then(|r| r.target(label)) };
            if let Some(t) = next
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
