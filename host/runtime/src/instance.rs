//! One NF instance on one worker: called once per batch, contained when it
//! fails, re-created after a trap, with its flow state kept by the host.
//!
//! What it calls (a Wasm guest or a native NF) is in `guest`, the events
//! it hands the host in `events`, and the export and import of one flow's
//! state between hosts in `flow_export`.

mod events;
mod flow_export;
mod guest;

pub use crate::owner::{NfOwner, OwnerField};
pub use crate::trap::TrapCause;
pub use events::{EmittedEvent, LOG_EVENT, TRAP_EVENT};
pub use flow_export::FlowExport;
pub use guest::NativeNf;

use crate::batch::BatchBuilder;
use crate::bindings::{Event, Level, NfInfo, Rewrite, StateOp};
use crate::error::RuntimeError;
use crate::flow_state::FlowTable;
use crate::host::HostState;
use crate::limits::{FailurePolicy, NfLimits};
use crate::meters::Meters;
use crate::module::NfModule;
use crate::pre::Pre;
use crate::trap::{classify, trap_summary};
use crate::wasm_runtime::Runtime;
use events::wall_ns;
use guest::{Guest, Live};
use sluice_state::{Domain, Tables};
use sluice_wire::abi::Verdict;
use std::sync::Arc;
use wasmtime::{Engine, Store};

/// Default idle timeout of flow state when the NF names none: 120 s.
pub const DEFAULT_FLOW_IDLE_TIMEOUT_NS: u64 = 120_000_000_000;

/// Longest rewritten packet accepted.
pub const MAX_PACKET_LEN: usize = 65_535;

/// An NF module with the configuration and limits it runs under.
#[derive(Debug, Clone)]
pub struct NfSpec {
    /// The compiled module.
    pub module: NfModule,
    /// Bytes passed to `init`.
    pub config: Arc<[u8]>,
    /// Limits and failure policy.
    pub limits: NfLimits,
    /// Whose NF this is, for the host's log lines about it (none: the
    /// operator's own, as under `sluice-host run`).
    pub owner: Option<Arc<NfOwner>>,
}

/// How the last batch ended for this NF.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchStatus {
    /// The NF decided every packet.
    Ok,
    /// The NF trapped; the policy decided the batch.
    Trapped(TrapCause),
    /// The NF returned an error or a malformed result; the policy decided.
    Failed(String),
    /// No instance could be created; the policy decided.
    Unavailable(String),
}

/// The NF's decisions for one batch.
#[derive(Debug, Default)]
pub struct StageOutput {
    /// One per packet (validated).
    pub verdicts: Vec<Verdict>,
    /// Rewritten packets.
    pub rewrites: Vec<Rewrite>,
    /// Flows the NF asked to offload (`sluice:nf@0.5.0`).
    pub offloads: Vec<crate::offload::Request>,
    /// Flow hashes whose offload entries the NF revoked.
    pub revoked: Vec<u64>,
    /// Whether it revoked all of its entries.
    pub revoke_all: bool,
}

/// One NF instance with its host-owned state and meters.
pub struct NfInstance {
    name: Arc<str>,
    spec: NfSpec,
    native: Option<Box<dyn NativeNf>>,
    engine: Engine,
    fuel_enabled: bool,
    /// The epoch tick (see [`crate::host::CpuDeadline`]).
    tick: std::time::Duration,
    deadline_ticks: u64,
    live: Option<Live>,
    info: NfInfo,
    table: FlowTable,
    /// Declared state tables; `None` only while lent to a call.
    tables: Option<Box<Tables>>,
    meters: Meters,
    events: Vec<EmittedEvent>,
    touched: Vec<bool>,
    log_dropped_base: u64,
    /// The NF's log rate limit, shared by every instance it re-creates
    /// (a trap must not refill it).
    log_limiter: Arc<parking_lot::Mutex<crate::guest_io::LogLimiter>>,
    /// Offload entries this NF is on (charged to its state budget).
    offload_entries: u64,
    /// Whether it ever asked to offload a flow.
    asked_offload: bool,
    /// What passed under its ended offload entries, for its next batch.
    returns: std::collections::VecDeque<crate::offload::Return>,
    /// Times guest calls for `cpu_ns`. A TSC read where the CPU has a
    /// stable one (a few ns), instead of a clock_gettime call per read:
    /// this is read twice per batch.
    clock: quanta::Clock,
}

impl std::fmt::Debug for NfInstance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NfInstance").field("nf", &self.name).finish_non_exhaustive()
    }
}

impl NfInstance {
    /// Instantiates the NF and calls `init` with its config. A refused
    /// config is [`RuntimeError::ConfigRejected`] with the NF's message.
    pub fn new(runtime: &Runtime, spec: NfSpec) -> Result<Self, RuntimeError> {
        Self::new_in(runtime, spec, &Domain::new())
    }

    /// Like [`new`](Self::new), for one worker of several: `domain` holds
    /// the NF's state shared between workers (eventual tables, pools), and
    /// every worker's instance of the NF must get the same one.
    pub fn new_in(runtime: &Runtime, spec: NfSpec, domain: &Arc<Domain>) -> Result<Self, RuntimeError> {
        let nf = spec.module.name.to_string();
        if spec.limits.memory_bytes > runtime.config.max_memory_bytes {
            return Err(RuntimeError::Limits {
                nf,
                reason: format!(
                    "memory cap {} bytes exceeds the runtime's pool slot of {} bytes; raise max_memory_mb in the host config",
                    spec.limits.memory_bytes, runtime.config.max_memory_bytes
                ),
            });
        }
        if spec.limits.fuel_per_batch.is_some() && !runtime.config.fuel {
            return Err(RuntimeError::Limits {
                nf,
                reason: "a fuel limit needs fuel metering enabled in the runtime config".into(),
            });
        }
        let mut inst = Self::unstarted(runtime, spec, None, domain);
        inst.start()?;
        Ok(inst)
    }

    /// Wraps a native NF (see [`NativeNf`]). `spec` names the Wasm build of
    /// the same NF: its name, digest and config are used, and of its limits
    /// only the flow-state ones apply (nothing can interrupt native code).
    pub fn new_native(runtime: &Runtime, spec: NfSpec, nf: Box<dyn NativeNf>) -> Result<Self, RuntimeError> {
        Self::new_native_in(runtime, spec, nf, &Domain::new())
    }

    /// [`new_native`](Self::new_native) for one worker of several (see
    /// [`new_in`](Self::new_in)).
    pub fn new_native_in(
        runtime: &Runtime,
        spec: NfSpec,
        mut nf: Box<dyn NativeNf>,
        domain: &Arc<Domain>,
    ) -> Result<Self, RuntimeError> {
        let name = spec.module.name.to_string();
        let mut inst = Self::unstarted(runtime, spec, None, domain);
        if let Some(t) = inst.tables.as_deref_mut() {
            t.begin_init();
        }
        let config = inst.spec.config.clone();
        let info = sluice_state::with_installed(&mut inst.tables, || nf.init(&config));
        let declared = inst.tables.as_deref_mut().map(|t| t.end_init()).unwrap_or(Ok(()));
        let info = info.map_err(|message| RuntimeError::ConfigRejected { nf: name.clone(), message })?;
        declared.map_err(|reason| RuntimeError::Start { nf: name, reason })?;
        inst.native = Some(nf);
        inst.meters.instantiations = 1;
        inst.accept(info);
        Ok(inst)
    }

    /// An instance with its state and meters but no running guest yet.
    fn unstarted(runtime: &Runtime, spec: NfSpec, native: Option<Box<dyn NativeNf>>, domain: &Arc<Domain>) -> Self {
        // The wall-clock epoch deadline fires at half the deadline; from
        // there the CPU clock decides (see `crate::host::CpuDeadline`).
        let tick = runtime.config.epoch_tick.as_nanos().max(1);
        let deadline_ticks =
            u64::try_from((spec.limits.deadline.as_nanos() / 2).div_ceil(tick)).unwrap_or(u64::MAX).max(1);
        NfInstance {
            name: spec.module.name.clone(),
            native,
            engine: runtime.engine.clone(),
            fuel_enabled: runtime.config.fuel,
            tick: runtime.config.epoch_tick,
            deadline_ticks,
            live: None,
            info: NfInfo { wants_flow_state: false, flow_idle_timeout_ns: 0 },
            table: FlowTable::new(DEFAULT_FLOW_IDLE_TIMEOUT_NS, spec.limits.max_flows),
            tables: Some(Box::new(Tables::new(domain, spec.limits.state_budget_bytes))),
            meters: Meters::default(),
            events: Vec::new(),
            touched: Vec::new(),
            log_dropped_base: 0,
            log_limiter: Arc::new(parking_lot::Mutex::new(if runtime.config.nf_logs_as_events {
                crate::guest_io::LogLimiter::keeping(spec.limits.log_lines_per_second)
            } else {
                crate::guest_io::LogLimiter::new(spec.limits.log_lines_per_second)
            })),
            clock: runtime.clock.clone(),
            offload_entries: 0,
            asked_offload: false,
            returns: std::collections::VecDeque::new(),
            spec,
        }
    }

    /// Takes what the NF said in `init`.
    fn accept(&mut self, info: NfInfo) {
        self.table.set_idle_timeout_ns(if info.flow_idle_timeout_ns == 0 {
            DEFAULT_FLOW_IDLE_TIMEOUT_NS
        } else {
            info.flow_idle_timeout_ns
        });
        self.info = info;
    }

    /// Sets the per-call budget: the deadline, and fuel if metered.
    fn arm(store: &mut Store<HostState>, deadline_ticks: u64, fuel: Option<u64>) {
        store.set_epoch_deadline(deadline_ticks);
        store.data_mut().deadline.mark = None;
        if let Some(f) = fuel {
            let _ = store.set_fuel(f);
        }
    }

    fn fuel(&self) -> Option<u64> {
        self.fuel_enabled.then(|| self.spec.limits.fuel_per_batch.unwrap_or(u64::MAX))
    }

    /// Creates a fresh instance and runs `init`.
    fn start(&mut self) -> Result<(), RuntimeError> {
        let name = self.name.clone();
        // Instantiation and `init` run under the start deadline (language
        // runtimes restore a snapshot there), batches under the batch one.
        let start_deadline = self.spec.limits.start_deadline;
        let state = HostState::new(
            name.clone(),
            self.spec.owner.clone(),
            self.spec.limits.memory_bytes,
            self.log_limiter.clone(),
            start_deadline,
            self.tick,
        );
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.limits);
        // The deadline counts the CPU time the call used, not wall time.
        store.epoch_deadline_callback(|mut cx| Ok(cx.data_mut().deadline.expired()));
        let start_ticks = store.data().deadline.ticks(start_deadline / 2);
        Self::arm(&mut store, start_ticks, self.fuel_enabled.then_some(u64::MAX));
        self.meters.instantiations += 1;
        let over = |e: &wasmtime::Error| classify(e) == TrapCause::Deadline;
        let over_start = |what: &str| {
            format!(
                "{what} exceeded the start deadline of {} ms; raise start_deadline_ms (a deployment's limits, sluice.toml's [limits] or the host's [nf.<name>])",
                start_deadline.as_millis()
            )
        };
        let start_err = |e: wasmtime::Error| RuntimeError::Start {
            nf: name.to_string(),
            reason: if over(&e) { over_start("instantiation") } else { format!("instantiation failed: {e:#}") },
        };
        let guest = match &*self.spec.module.pre {
            Pre::V1(pre) => Guest::V1(pre.instantiate(&mut store).map_err(start_err)?),
            Pre::V2(pre) => Guest::V2(pre.instantiate(&mut store).map_err(start_err)?),
            Pre::V3(pre) => Guest::V3(pre.instantiate(&mut store).map_err(start_err)?),
            Pre::V4(pre) => Guest::V4(pre.instantiate(&mut store).map_err(start_err)?),
            Pre::V5(pre) => Guest::V5(pre.instantiate(&mut store).map_err(start_err)?),
            Pre::V6(pre) => Guest::V6(pre.instantiate(&mut store).map_err(start_err)?),
            Pre::V7(pre) => Guest::V7(pre.instantiate(&mut store).map_err(start_err)?),
        };
        let mut live = Live { store, guest };
        if let Some(t) = self.tables.as_deref_mut() {
            t.begin_init();
        }
        live.lend(&mut self.tables);
        let result = live.init(&self.spec.config);
        live.reclaim(&mut self.tables);
        let declared = self.tables.as_deref_mut().map(|t| t.end_init()).unwrap_or(Ok(()));
        let info = match result {
            Ok(Ok(info)) => info,
            Ok(Err(message)) => return Err(RuntimeError::ConfigRejected { nf: name.to_string(), message }),
            Err(e) if over(&e) => {
                return Err(RuntimeError::Start { nf: name.to_string(), reason: over_start("init") });
            }
            Err(e) => {
                return Err(RuntimeError::Start {
                    nf: name.to_string(),
                    reason: format!("init trapped ({}): {e:#}", classify(&e)),
                });
            }
        };
        declared.map_err(|reason| RuntimeError::Start { nf: name.to_string(), reason })?;
        self.accept(info);
        live.store.data_mut().deadline.limit = self.spec.limits.deadline;
        self.live = Some(live);
        Ok(())
    }

    /// NF name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether this is a native (unsandboxed) NF.
    pub fn is_native(&self) -> bool {
        self.native.is_some()
    }

    /// The module this instance runs.
    pub fn module(&self) -> &NfModule {
        &self.spec.module
    }

    /// What the NF said about itself in `init`.
    pub fn wants_flow_state(&self) -> bool {
        self.info.wants_flow_state
    }

    /// Whether batches for this NF need their distinct flows collected
    /// (for flow state or per-flow tables).
    pub fn needs_flows(&self) -> bool {
        self.info.wants_flow_state || self.tables.as_deref().is_some_and(Tables::has_per_flow)
    }

    /// Whether the NF may offload flows (built against `sluice:nf@0.5.0`).
    pub fn offloads(&self) -> bool {
        matches!(*self.spec.module.pre, Pre::V5(_) | Pre::V6(_) | Pre::V7(_)) && self.native.is_none()
    }

    /// Whether the NF ever asked to offload a flow (a chain tracks its
    /// packets' paths from then on).
    pub fn offloaded(&self) -> bool {
        self.asked_offload
    }

    /// Its flow idle timeout (what `init` asked, else the default): the
    /// idle timeout of an offload entry that names none.
    pub fn flow_idle_timeout_ns(&self) -> u64 {
        match self.info.flow_idle_timeout_ns {
            0 => DEFAULT_FLOW_IDLE_TIMEOUT_NS,
            t => t,
        }
    }

    /// Offload entries this NF is on.
    pub fn offload_entries(&self) -> u64 {
        self.offload_entries
    }

    /// Counts an entry made with this NF on its path.
    pub(crate) fn offload_installed(&mut self) {
        self.offload_entries += 1;
    }

    /// An entry with this NF on its path ended: what passed under it, for
    /// the next batch, when the NF asked for it. An NF that never takes its
    /// returns keeps the newest
    /// [`MAX_RETURNS_WAITING`](crate::offload::MAX_RETURNS_WAITING).
    pub(crate) fn offload_ended(&mut self, r: Option<crate::offload::Return>) {
        self.offload_entries = self.offload_entries.saturating_sub(1);
        if let Some(r) = r
            && self.offloads()
        {
            if self.returns.len() >= crate::offload::MAX_RETURNS_WAITING {
                self.returns.pop_front();
                self.meters.offload_returns_dropped += 1;
            }
            self.returns.push_back(r);
        }
    }

    /// Whether returns wait for the NF's next batch.
    pub fn offload_returns_waiting(&self) -> bool {
        !self.returns.is_empty()
    }

    /// How many returns wait for the NF's next batch.
    pub fn offload_returns_len(&self) -> usize {
        self.returns.len()
    }

    /// Meters a packet that passed under an entry of this NF.
    #[inline]
    pub(crate) fn count_offloaded(&mut self, bytes: u64) {
        self.meters.offloaded_packets += 1;
        self.meters.offloaded_bytes += bytes;
    }

    /// Offload entries its state budget still holds.
    pub(crate) fn offload_room(&self) -> u64 {
        let used = self
            .table
            .bytes()
            .saturating_add(self.offload_bytes())
            .saturating_add(self.tables.as_deref().map_or(0, Tables::used_bytes));
        (self.spec.limits.state_budget_bytes.saturating_sub(used) as u64) / crate::offload::ENTRY_BYTES
    }

    /// State budget bytes the offload entries take.
    fn offload_bytes(&self) -> usize {
        usize::try_from(self.offload_entries.saturating_mul(crate::offload::ENTRY_BYTES)).unwrap_or(usize::MAX)
    }

    /// Meters so far.
    pub fn meters(&self) -> &Meters {
        &self.meters
    }

    /// The NF's flow state on this worker.
    pub fn flow_table(&self) -> &FlowTable {
        &self.table
    }

    /// The NF's flow state, mutable (export/import).
    pub fn flow_table_mut(&mut self) -> &mut FlowTable {
        &mut self.table
    }

    /// Packets of flow `key` passed under an offload entry, the last at
    /// packet time `now`: its flow state and its entries in the NF's
    /// per-flow tables are brought up to it, as the NF's own read would
    /// have. The chain does this when the entry ends and before the
    /// flow's packets reach the NF, not for every packet under the entry;
    /// sweeps ask the chain about flows that look idle
    /// ([`process_live`](Self::process_live)).
    pub(crate) fn offloaded_flow_seen(&mut self, key: &sluice_wire::FlowKey, now: u64) {
        self.table.touch(key, now);
        if let Some(t) = self.tables.as_deref_mut() {
            t.touch_flow(key, now);
        }
    }

    /// Replaces the running NF by another version between two batches (hot
    /// swap). The new version is instantiated and its `init` run first; if
    /// that fails, or the new version asks for no flow state where this one
    /// keeps some (its flows' state would be lost), the swap is refused and
    /// this version keeps running untouched. Otherwise the next batch goes
    /// to the new version, with all flow state, meters and pending events
    /// carried over: no packet is lost or processed twice.
    pub fn swap(&mut self, runtime: &Runtime, spec: NfSpec) -> Result<(), RuntimeError> {
        let nf = self.name.to_string();
        if self.native.is_some() {
            return Err(RuntimeError::Swap { nf, reason: "a native NF cannot be swapped".into() });
        }
        // Start the new version in a scratch instance that borrows our
        // tables (it must find the tables it declares, and refuse
        // incompatible ones); nothing else of ours is touched until it has
        // accepted its config, and a refusal rolls the tables back.
        let Some(tables) = self.tables.as_deref() else {
            return Err(RuntimeError::Swap { nf, reason: "state tables are in use".into() });
        };
        let checkpoint = tables.checkpoint();
        let domain = tables.domain().clone();
        let mut next = Self::unstarted(runtime, spec.clone(), None, &domain);
        next.name = self.name.clone();
        next.tables = self.tables.take();
        let started = next.start();
        self.tables = next.tables.take();
        let refuse = |this: &mut Self, reason: String| {
            if let Some(t) = this.tables.as_deref_mut() {
                t.rollback(checkpoint);
            }
            Err(RuntimeError::Swap { nf: nf.clone(), reason })
        };
        if let Err(e) = started {
            return refuse(self, e.to_string());
        }
        if self.info.wants_flow_state && !next.info.wants_flow_state {
            let reason = format!(
                "the new version ({}) keeps no flow state, so the state of this version's {} flow(s) would be lost; refusing",
                spec.module.digest(),
                self.table.len()
            );
            return refuse(self, reason);
        }
        self.live = next.live.take();
        self.info = next.info;
        self.deadline_ticks = next.deadline_ticks;
        self.fuel_enabled = next.fuel_enabled;
        self.spec = spec;
        self.table.set_capacity(self.spec.limits.max_flows);
        if let Some(t) = self.tables.as_deref_mut() {
            t.set_budget(self.spec.limits.state_budget_bytes);
            t.domain().set_budget(self.spec.limits.state_budget_bytes);
        }
        let info = self.info;
        self.accept(info);
        self.meters.instantiations += 1;
        self.log_dropped_base = self.meters.log_dropped;
        self.log_limiter = next.log_limiter.clone();
        Ok(())
    }

    /// The NF's declared state tables on this worker.
    pub fn tables(&self) -> Option<&Tables> {
        self.tables.as_deref()
    }

    /// The declared state tables, mutable (flush, export/import).
    pub fn tables_mut(&mut self) -> Option<&mut Tables> {
        self.tables.as_deref_mut()
    }

    /// Bytes of state this instance holds, to bill: its flow state, its
    /// own tables and (on the one live worker that bills them) the NF's shared
    /// tables. Summed over a deployment's workers, each byte counts once.
    pub fn state_bytes(&self) -> u64 {
        (self.table.bytes() + self.tables.as_deref().map_or(0, Tables::held_bytes)) as u64
    }

    /// Flows with state and table entries this instance holds, counted as
    /// [`state_bytes`](Self::state_bytes) counts bytes (shared tables on
    /// one worker only).
    pub fn state_entries(&self) -> u64 {
        (self.table.len() + self.tables.as_deref().map_or(0, Tables::held_entries)) as u64
    }

    /// Merges this worker's eventual replicas into the shared view (end
    /// of a run, or before a report).
    pub fn flush_state(&mut self) {
        if let Some(t) = self.tables.as_deref_mut() {
            t.flush();
            crate::meters::take_table_meters(&mut self.meters, t.meters(), t.held_bytes());
        }
    }

    /// The first half of a sync point of a runner that syncs every worker
    /// at the same packet (`sluice-host run`): this worker hands its writes
    /// to other workers' single-writer keys to their owners. Call it on
    /// every worker, while none is processing, before any calls
    /// [`NfInstance::sync_state`].
    pub fn hand_over_state(&mut self) {
        if let Some(t) = self.tables.as_deref_mut() {
            t.hand_over();
        }
    }

    /// The second half of that sync point: the single-writer keys this
    /// worker owns take the writes handed to them and are published.
    pub fn sync_state(&mut self) {
        if let Some(t) = self.tables.as_deref_mut() {
            t.sync_point();
            crate::meters::take_table_meters(&mut self.meters, t.meters(), t.held_bytes());
        }
    }

    /// Processes the batch in `builder`: hands in flow state, calls the NF
    /// once, applies its decisions or, if it failed, its failure policy.
    /// Never panics and never returns an error: failure is a status.
    pub fn process(&mut self, builder: &mut BatchBuilder, out: &mut StageOutput) -> BatchStatus {
        self.process_live(builder, out, &|_| None)
    }

    /// [`process`](Self::process) in a chain with offload entries: `live`
    /// gives, for a flow whose state a sweep finds idle, the packet time
    /// of the last packet that passed under a live entry of it through
    /// this NF, if one did (see [`offloaded_flow_seen`](Self::offloaded_flow_seen)).
    pub(crate) fn process_live(
        &mut self,
        builder: &mut BatchBuilder,
        out: &mut StageOutput,
        live: &dyn Fn(&sluice_wire::FlowKey) -> Option<u64>,
    ) -> BatchStatus {
        out.verdicts.clear();
        out.rewrites.clear();
        out.offloads.clear();
        out.revoked.clear();
        out.revoke_all = false;
        let n = builder.len();
        let (batch, flow_keys, now) = builder.parts_mut();
        self.meters.invocations += 1;
        self.meters.packets += n as u64;
        self.meters.bytes += batch.data.len() as u64;
        let wants_state = self.info.wants_flow_state;
        // Declared tables may use what flow state leaves of the budget.
        let flow_bytes = self.table.bytes().saturating_add(self.offload_bytes());
        let budget = self.spec.limits.state_budget_bytes;
        if let Some(t) = self.tables.as_deref_mut() {
            t.set_budget(budget.saturating_sub(flow_bytes));
        }
        batch.flow_states.clear();
        if wants_state {
            for key in flow_keys {
                // Frame: 4-byte length, then the bytes (see sluice_wire::abi).
                let at = batch.flow_states.len();
                batch.flow_states.extend_from_slice(&[0; 4]);
                self.table.read_into(key, now, &mut batch.flow_states);
                let len = (batch.flow_states.len() - at - 4) as u32;
                if let Some(hdr) = batch.flow_states.get_mut(at..at + 4) {
                    hdr.copy_from_slice(&len.to_le_bytes());
                }
            }
            self.meters.state_ops += flow_keys.len() as u64;
        }

        let uses_tables = self.tables.as_deref().is_some_and(|t| !t.is_empty());
        if uses_tables && let Some(t) = self.tables.as_deref_mut() {
            // Per-flow tables are keyed by the batch's flow indices.
            let flows: &[sluice_wire::FlowKey] = if t.has_per_flow() { flow_keys } else { &[] };
            t.begin_batch(flows, now);
        }

        let result = if let Some(native) = self.native.as_mut() {
            let t0 = self.clock.raw();
            let r = sluice_state::with_installed(&mut self.tables, || native.process(batch));
            self.meters.cpu_ns += self.clock.delta_as_nanos(t0, self.clock.raw());
            Ok(r)
        } else {
            if self.live.is_none()
                && let Err(e) = self.start()
            {
                let msg = e.to_string();
                self.apply_policy(n, out);
                return BatchStatus::Unavailable(msg);
            }
            let fuel = self.fuel();
            let Some(live) = self.live.as_mut() else {
                self.apply_policy(n, out);
                return BatchStatus::Unavailable("no instance".into());
            };
            Self::arm(&mut live.store, self.deadline_ticks, fuel);
            live.lend(&mut self.tables);
            let offloads = live.offloads();
            if offloads {
                let used = flow_bytes.saturating_add(self.tables.as_deref().map_or(0, Tables::used_bytes));
                let room = (budget.saturating_sub(used) as u64) / crate::offload::ENTRY_BYTES;
                let calls = &mut live.store.data_mut().offload;
                open_offload_calls(calls, batch, flow_keys, room, &mut self.returns);
            }
            let t0 = self.clock.raw();
            let result = live.process(batch);
            self.meters.cpu_ns += self.clock.delta_as_nanos(t0, self.clock.raw());
            live.reclaim(&mut self.tables);
            if offloads {
                let calls = &mut live.store.data_mut().offload;
                // Returns the NF did not take wait for its next batch.
                for (r, _) in calls.returns.drain(..).rev() {
                    self.returns.push_front(r);
                }
                if matches!(result, Ok(Ok(_))) {
                    self.asked_offload |= !calls.requests.is_empty();
                    std::mem::swap(&mut out.offloads, &mut calls.requests);
                    std::mem::swap(&mut out.revoked, &mut calls.revoked);
                    out.revoke_all = calls.revoke_all;
                }
                calls.requests.clear();
                calls.revoked.clear();
                calls.revoke_all = false;
                calls.close();
            }

            // Events and log drops are collected even from a batch that failed.
            let data = live.store.data_mut();
            let emitted = std::mem::take(&mut data.events);
            data.event_bytes = 0;
            self.meters.events += emitted.len() as u64 + std::mem::take(&mut data.events_dropped);
            self.meters.log_dropped = self.log_dropped_base + data.log_dropped();
            for event in emitted {
                let packet = event.packet.map(|p| p as usize).filter(|&p| p < n);
                self.events.push(EmittedEvent {
                    nf: self.name.clone(),
                    flow: packet.and_then(|p| sluice_wire::parse(crate::batch::packet_bytes(batch, p)).key),
                    timestamp_ns: packet
                        .and_then(|p| sluice_wire::abi::Descriptor::decode(&batch.descriptors, p))
                        .map(|d| d.timestamp_ns)
                        .unwrap_or(now),
                    event,
                });
            }
            result
        };

        let status = match result {
            Ok(Ok(mut r)) => match validate(&r, n, flow_keys.len(), &mut out.verdicts) {
                Ok(()) => {
                    if wants_state {
                        self.apply_updates(flow_keys, now, &mut r.flow_updates, live);
                    }
                    for v in &out.verdicts {
                        match v {
                            Verdict::Drop => self.meters.dropped += 1,
                            Verdict::Forward(_) | Verdict::Label(_) => self.meters.forwarded += 1,
                        }
                    }
                    self.meters.rewritten += r.rewrites.len() as u64;
                    out.rewrites = r.rewrites;
                    if uses_tables {
                        self.end_tables(now, live);
                    }
                    return BatchStatus::Ok;
                }
                Err(msg) => {
                    self.meters.errors += 1;
                    let (tenant, deployment, version) = NfOwner::fields(self.spec.owner.as_deref());
                    tracing::warn!(nf = %self.name, tenant, deployment, version, "malformed batch result: {msg}");
                    BatchStatus::Failed(msg)
                }
            },
            Ok(Err(msg)) => {
                self.meters.errors += 1;
                let (tenant, deployment, version) = NfOwner::fields(self.spec.owner.as_deref());
                tracing::warn!(nf = %self.name, tenant, deployment, version, "batch refused by the NF: {msg}");
                BatchStatus::Failed(msg)
            }
            Err(e) => {
                let cause = classify(&e);
                self.meters.count_trap(cause);
                // A trap per batch would flood the log: the first few and
                // then every power of two are logged (all are counted); the
                // guest backtrace is at debug level.
                let n = self.meters.traps;
                if n <= 3 || n.is_power_of_two() {
                    let (tenant, deployment, version) = NfOwner::fields(self.spec.owner.as_deref());
                    tracing::warn!(
                        nf = %self.name,
                        tenant,
                        deployment,
                        version,
                        cause = %cause,
                        policy = ?self.spec.limits.failure_policy,
                        traps = n,
                        "NF trapped; applied the failure policy to the batch and will re-create the instance: {}",
                        trap_summary(&e)
                    );
                }
                tracing::debug!(nf = %self.name, "trap detail: {e:?}");
                // The tenant sees its NF's traps too, within its log rate.
                if self.log_limiter.lock().admit_record() {
                    self.events.push(EmittedEvent {
                        nf: self.name.clone(),
                        event: Event {
                            kind: TRAP_EVENT.into(),
                            level: Level::Error,
                            packet: None,
                            fields: vec![
                                ("cause".into(), cause.to_string()),
                                ("message".into(), trap_summary(&e)),
                                ("policy".into(), self.spec.limits.failure_policy.name().into()),
                                ("traps".into(), n.to_string()),
                            ],
                        },
                        flow: None,
                        timestamp_ns: wall_ns(),
                    });
                }
                // The instance may be in any state after a trap: drop it and
                // re-create it (lazily, at the next batch). Flow state lives
                // here, not in the instance, so nothing is lost.
                self.live = None;
                BatchStatus::Trapped(cause)
            }
        };
        if wants_state {
            for key in flow_keys {
                self.table.touch(key, now);
            }
        }
        if uses_tables {
            self.end_tables(now, live);
        }
        self.apply_policy(n, out);
        status
    }

    /// After a batch: merges and sweeps the tables, and hands expired
    /// entries to the NF (one `expired` call per table that has any).
    fn end_tables(&mut self, now: u64, live: &dyn Fn(&sluice_wire::FlowKey) -> Option<u64>) {
        let Some(t) = self.tables.as_deref_mut() else { return };
        t.end_batch_live(now, live);
        let expired = t.take_expired();
        let fuel = self.fuel();
        for (table, entries) in expired {
            let outcome = if let Some(native) = self.native.as_mut() {
                sluice_state::with_installed(&mut self.tables, || native.expired(table, &entries))
            } else if let Some(live) = self.live.as_mut() {
                if matches!(live.guest, Guest::V1(_)) {
                    continue;
                }
                Self::arm(&mut live.store, self.deadline_ticks, fuel);
                live.lend(&mut self.tables);
                let t0 = self.clock.raw();
                let r = live.expired(table, &entries);
                self.meters.cpu_ns += self.clock.delta_as_nanos(t0, self.clock.raw());
                live.reclaim(&mut self.tables);
                match r {
                    Ok(r) => r,
                    Err(e) => {
                        let cause = classify(&e);
                        self.meters.count_trap(cause);
                        let (tenant, deployment, version) = NfOwner::fields(self.spec.owner.as_deref());
                        tracing::warn!(nf = %self.name, tenant, deployment, version, cause = %cause, "NF trapped in `expired`; re-creating it: {}", trap_summary(&e));
                        self.live = None;
                        Ok(())
                    }
                }
            } else {
                Ok(())
            };
            if let Err(msg) = outcome {
                self.meters.errors += 1;
                let (tenant, deployment, version) = NfOwner::fields(self.spec.owner.as_deref());
                tracing::warn!(nf = %self.name, tenant, deployment, version, table, "`expired` failed: {msg}");
            }
        }
        if let Some(t) = self.tables.as_deref() {
            crate::meters::take_table_meters(&mut self.meters, t.meters(), t.held_bytes());
        }
    }

    fn apply_updates(
        &mut self,
        keys: &[sluice_wire::FlowKey],
        now: u64,
        updates: &mut Vec<crate::bindings::FlowUpdate>,
        live: &dyn Fn(&sluice_wire::FlowKey) -> Option<u64>,
    ) {
        self.touched.clear();
        self.touched.resize(keys.len(), false);
        for u in updates.drain(..) {
            let idx = u.flow as usize;
            let Some(key) = keys.get(idx) else { continue };
            if let Some(t) = self.touched.get_mut(idx) {
                *t = true;
            }
            self.meters.state_ops += 1;
            match u.op {
                StateOp::Set(v) if v.is_empty() => self.table.remove(key),
                StateOp::Set(v) if v.len() > self.limits().max_flow_state_bytes => {
                    // Refused: the old value stays.
                    self.meters.state_rejected += 1;
                    self.table.touch(key, now);
                }
                StateOp::Set(v) => {
                    // Flow state, declared tables and offload entries
                    // share the budget.
                    let tables =
                        self.tables.as_deref().map_or(0, Tables::used_bytes).saturating_add(self.offload_bytes());
                    let budget = self.spec.limits.state_budget_bytes.saturating_sub(tables);
                    if !self.table.set(*key, v, now, budget) {
                        self.meters.state_rejected += 1;
                    }
                }
                StateOp::Remove => self.table.remove(key),
            }
        }
        for (key, touched) in keys.iter().zip(&self.touched) {
            if !touched {
                self.table.touch(key, now);
            }
        }
        self.table.expire_live(now, live);
        self.meters.flow_state_bytes = self.table.bytes() as u64;
    }

    fn limits(&self) -> &NfLimits {
        &self.spec.limits
    }

    fn apply_policy(&mut self, n: usize, out: &mut StageOutput) {
        let v = match self.spec.limits.failure_policy {
            FailurePolicy::FailOpen => Verdict::Forward(0),
            FailurePolicy::FailClosed => Verdict::Drop,
        };
        out.verdicts.clear();
        out.verdicts.resize(n, v);
        out.rewrites.clear();
        self.meters.policy += n as u64;
    }
}

/// Opens the offload calls of one `process` call: the batch's
/// descriptors (what a request is checked against), the entries the budget
/// still holds, and up to [`crate::offload::MAX_RETURNS_PER_CALL`] waiting
/// returns, each with its flow's index in the batch where it has one.
fn open_offload_calls(
    calls: &mut crate::offload::Calls,
    batch: &crate::bindings::Batch,
    flow_keys: &[sluice_wire::FlowKey],
    room: u64,
    waiting: &mut std::collections::VecDeque<crate::offload::Return>,
) {
    calls.open = true;
    calls.room = room;
    calls.words.clear();
    // One copy of the whole descriptors (vectorized), not a gather.
    calls.words.clone_from(&batch.descriptors);
    calls.returns.clear();
    if waiting.is_empty() {
        return;
    }
    let take = waiting.len().min(crate::offload::MAX_RETURNS_PER_CALL);
    let index: std::collections::HashMap<&sluice_wire::FlowKey, u32> =
        flow_keys.iter().enumerate().map(|(i, k)| (k, i as u32)).collect();
    calls.returns.extend(waiting.drain(..take).map(|r| {
        let flow = index.get(&r.key).copied();
        (r, flow)
    }));
}

/// Checks a result against its batch and decodes the verdicts into `out`.
fn validate(
    r: &crate::bindings::BatchResult,
    packets: usize,
    flows: usize,
    out: &mut Vec<Verdict>,
) -> Result<(), String> {
    if r.verdicts.len() != packets {
        return Err(format!("{} verdicts for {packets} packets", r.verdicts.len()));
    }
    out.clear();
    for (i, &v) in r.verdicts.iter().enumerate() {
        match Verdict::decode(v) {
            Some(v) => out.push(v),
            None => return Err(format!("packet {i}: unknown verdict kind {} (value {v:#x})", v >> 16)),
        }
    }
    for rw in &r.rewrites {
        if rw.packet as usize >= packets {
            return Err(format!("rewrite of packet {} in a batch of {packets}", rw.packet));
        }
        if rw.data.len() > MAX_PACKET_LEN || rw.data.is_empty() {
            return Err(format!("rewrite of packet {} has {} bytes (1..=65535 allowed)", rw.packet, rw.data.len()));
        }
    }
    for u in &r.flow_updates {
        if u.flow as usize >= flows {
            return Err(format!("state update of flow {} in a batch of {flows} flows", u.flow));
        }
    }
    Ok(())
}
