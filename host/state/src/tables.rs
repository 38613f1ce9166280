//! The tables of one NF instance on one worker.
//!
//! The state interface's calls are in [`calls`], a flow's export and
//! import in [`flows`], and how each kind of table keeps its entries in
//! [`store`].

mod calls;
mod flows;
mod store;

use crate::domain::Domain;
use crate::entry::{ENTRY_OVERHEAD, stale};
use crate::error::StateError;
use crate::spec::{Access, Consistency, MAX_TABLES, Scope, TableSpec};
use sluice_wire::FlowKey;
use sluice_wire::abi::push_frame;
use std::sync::Arc;
use store::{Slot, Store, clone_local};

/// Default state memory budget per NF instance: 64 MiB.
pub const DEFAULT_BUDGET_BYTES: usize = 64 << 20;

/// Counters of state use, for meters and billing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct StateMeters {
    /// Items read or written (keys, resources), not calls.
    pub ops: u64,
    /// State calls.
    pub calls: u64,
    /// Calls that returned an error.
    pub errors: u64,
    /// Items refused for capacity, budget, size or an exhausted pool.
    pub rejected: u64,
    /// Entries removed for idleness.
    pub expired: u64,
    /// Merges of eventual replicas into the shared view.
    pub merges: u64,
}

#[derive(Debug)]
struct Table {
    spec: TableSpec,
    store: Store,
    last_sweep_ns: u64,
    /// Declared by the running version (a table of an older version stays,
    /// with its contents, but is not used).
    declared: bool,
}

/// One per-flow table entry of an exported flow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowTableEntry {
    /// Table name.
    pub table: String,
    /// The value (counters: 8 bytes little-endian).
    pub value: Vec<u8>,
    /// The entry's logical clock.
    pub clock: u64,
}

/// The state tables of one NF instance on one worker. Owned by the host:
/// moved into the sandbox's host state for a call and back out after, so
/// it outlives any instance of the NF.
#[derive(Debug)]
pub struct Tables {
    domain: Arc<Domain>,
    worker: usize,
    tables: Vec<Table>,
    in_init: bool,
    incompatible: Option<String>,
    flows: Vec<FlowKey>,
    now_ns: u64,
    budget: usize,
    used: usize,
    meters: StateMeters,
    expired: Vec<(u32, Vec<u8>)>,
    /// A barrier sync ran since the last batch: prune the overlays.
    synced: bool,
    /// Flows whose per-flow entries changed (a host in a group).
    changes: crate::FlowChanges,
    /// Pool resources bound or released here (output commit).
    pool_changes: crate::PoolChanges,
    /// Whether a declared table is per flow (kept with the declarations).
    per_flow: bool,
}

/// A restore point for a swap that may be refused.
#[derive(Debug)]
pub struct Checkpoint {
    specs: Vec<(TableSpec, bool)>,
    read_only: Vec<(usize, Store)>,
}

fn flow_index(b: &[u8]) -> Option<usize> {
    <[u8; 4]>::try_from(b).ok().map(|b| u32::from_le_bytes(b) as usize)
}

fn idx(i: usize) -> u32 {
    u32::try_from(i).unwrap_or(u32::MAX)
}

impl Tables {
    /// Tables for a new worker of the NF whose shared state is `domain`,
    /// with a memory budget in bytes.
    pub fn new(domain: &Arc<Domain>, budget_bytes: usize) -> Self {
        domain.set_budget(budget_bytes);
        Tables {
            worker: domain.attach(),
            domain: domain.clone(),
            tables: Vec::new(),
            in_init: false,
            incompatible: None,
            flows: Vec::new(),
            now_ns: 0,
            budget: budget_bytes,
            used: 0,
            meters: StateMeters::default(),
            expired: Vec::new(),
            synced: false,
            changes: crate::FlowChanges::default(),
            pool_changes: crate::PoolChanges::default(),
            per_flow: false,
        }
    }

    /// This worker's index in the domain.
    pub fn worker(&self) -> usize {
        self.worker
    }

    /// The shared state this worker belongs to.
    pub fn domain(&self) -> &Arc<Domain> {
        &self.domain
    }

    /// Changes the budget (a new version may have other limits).
    pub fn set_budget(&mut self, budget_bytes: usize) {
        self.budget = budget_bytes;
    }

    /// Meters so far.
    pub fn meters(&self) -> &StateMeters {
        &self.meters
    }

    /// Bytes this worker's own tables hold, charged against the budget
    /// (shared tables are charged to the domain).
    pub fn used_bytes(&self) -> usize {
        self.used
    }

    /// Bytes to bill this worker for: its own tables, and for the one
    /// live worker of the domain that bills them, the shared tables too,
    /// so that summing every worker's counts each byte once.
    pub fn held_bytes(&self) -> usize {
        if self.domain.bills_shared(self.worker) { self.used + self.domain.shared_bytes() } else { self.used }
    }

    /// Entries to count for this worker, as [`held_bytes`](Self::held_bytes)
    /// counts bytes: its own tables' entries, and the shared tables' on
    /// the one worker that bills them.
    pub fn held_entries(&self) -> usize {
        let bills_shared = self.domain.bills_shared(self.worker);
        self.tables.iter().filter(|t| t.declared && (bills_shared || !t.store.is_shared())).map(|t| t.store.len()).sum()
    }

    /// The declared tables and their entry counts on this worker.
    pub fn tables(&self) -> impl Iterator<Item = (&TableSpec, usize)> {
        self.tables.iter().filter(|t| t.declared).map(|t| (&t.spec, t.store.len()))
    }

    /// Whether any table is declared.
    pub fn is_empty(&self) -> bool {
        !self.tables.iter().any(|t| t.declared)
    }

    /// Packets of flow `key` passed without the NF (flow offload), the
    /// last at packet time `now_ns`: its per-flow entries are brought up
    /// to it, as if the NF had read them then. The host does this when
    /// the flow's entry ends, before the flow's packets reach the NF, and
    /// for entries a sweep finds idle (see [`end_batch`](Self::end_batch)),
    /// not for every packet: a flow is alive while packets pass under its
    /// entry (a NAT's mapping keeps the port its entry translates to).
    pub fn touch_flow(&mut self, key: &FlowKey, now_ns: u64) {
        if !self.per_flow {
            return;
        }
        for t in &mut self.tables {
            let last = match &mut t.store {
                Store::FlowCounters(m) => m.get_mut(key).map(|s| &mut s.last_ns),
                Store::FlowBytes(m) => m.get_mut(key).map(|s| &mut s.last_ns),
                _ => None,
            };
            if let Some(last) = last {
                *last = (*last).max(now_ns);
            }
        }
    }

    /// Whether a per-flow table is declared (the host then tells the
    /// tables each batch's flows).
    pub fn has_per_flow(&self) -> bool {
        self.per_flow
    }

    /// Recomputes [`has_per_flow`](Self::has_per_flow) after the
    /// declarations changed.
    fn note_declarations(&mut self) {
        self.per_flow = self.tables.iter().any(|t| t.declared && t.spec.scope == Scope::PerFlow);
    }

    /// Starts an `init`: declarations are allowed, and the running
    /// version's declarations are forgotten until made again.
    pub fn begin_init(&mut self) {
        self.in_init = true;
        self.incompatible = None;
        for t in &mut self.tables {
            t.declared = false;
        }
        self.per_flow = false;
    }

    /// Ends an `init`. Fails if the NF declared a table incompatibly (even
    /// if it ignored the error it got).
    pub fn end_init(&mut self) -> Result<(), String> {
        self.in_init = false;
        match self.incompatible.take() {
            Some(why) => Err(why),
            None => Ok(()),
        }
    }

    /// Saves what a refused swap must restore: the declarations and the
    /// read-only tables (the only ones `init` rewrites).
    pub fn checkpoint(&self) -> Checkpoint {
        let specs = self.tables.iter().map(|t| (t.spec.clone(), t.declared)).collect();
        let read_only = self
            .tables
            .iter()
            .enumerate()
            .filter(|(_, t)| t.spec.access == Access::ReadOnly)
            .map(|(i, t)| (i, clone_local(&t.store, &t.spec, &self.domain)))
            .collect();
        Checkpoint { specs, read_only }
    }

    /// Restores a checkpoint after a refused swap.
    pub fn rollback(&mut self, cp: Checkpoint) {
        self.tables.truncate(cp.specs.len());
        for (t, (spec, declared)) in self.tables.iter_mut().zip(cp.specs) {
            t.spec = spec;
            t.declared = declared;
        }
        self.note_declarations();
        for (i, store) in cp.read_only {
            if let Some(t) = self.tables.get_mut(i) {
                t.store = store;
            }
        }
        self.in_init = false;
        self.incompatible = None;
        self.recount();
    }

    fn recount(&mut self) {
        self.used = self.tables.iter().map(|t| t.store.cost()).sum();
    }

    /// Sets the flows and packet time of the batch about to be processed.
    pub fn begin_batch(&mut self, flows: &[FlowKey], now_ns: u64) {
        self.flows.clear();
        self.flows.extend_from_slice(flows);
        self.now_ns = self.now_ns.max(now_ns);
        if std::mem::take(&mut self.synced) {
            for t in &mut self.tables {
                if let Store::Single(s) = &mut t.store {
                    s.prune();
                }
            }
        }
    }

    /// The first half of a barrier runner's sync point (`sluice-host
    /// run`), called on every worker while none is processing: hands the
    /// writes this worker made to other workers' single-writer keys to
    /// their owners. Every worker must have handed over before any calls
    /// [`Tables::sync_point`].
    pub fn hand_over(&mut self) {
        let now = self.now_ns;
        for t in &mut self.tables {
            if let Store::Single(s) = &mut t.store {
                s.push(now);
            }
        }
    }

    /// The second half of a barrier runner's sync point: the owners of
    /// single-writer keys apply the writes handed to them
    /// ([`Tables::hand_over`]) and publish.
    pub fn sync_point(&mut self) {
        self.sync_single(true);
    }

    /// Syncs single-writer tables (all of them, or those that are due).
    fn sync_single(&mut self, all: bool) {
        let now = self.now_ns;
        for (i, t) in self.tables.iter_mut().enumerate() {
            let Store::Single(s) = &mut t.store else { continue };
            let interval = match t.spec.consistency {
                Consistency::SingleWriter { sync_interval_ns } => sync_interval_ns,
                _ => 0,
            };
            if !all && now.saturating_sub(s.last_sync_ns()) < interval {
                continue;
            }
            let notify = t.spec.notify_expired && t.declared;
            let mut framed = Vec::new();
            self.meters.expired += s.sync(now, notify, &mut framed);
            self.meters.merges += 1;
            if !framed.is_empty() {
                self.expired.push((idx(i), framed));
            }
        }
        self.synced = true;
    }

    /// After a batch: merges eventual replicas that are due and sweeps
    /// idle entries (collected for `take_expired` where the NF asked).
    pub fn end_batch(&mut self, now_ns: u64) {
        self.end_batch_live(now_ns, &|_| None);
    }

    /// [`end_batch`](Self::end_batch) of a chain with offload entries:
    /// `live` gives, for a flow whose per-flow entries look idle, the
    /// packet time of the last packet that passed under one of its
    /// entries, if one lives; such entries are brought up to it (see
    /// [`touch_flow`](Self::touch_flow)) and swept only if that too is
    /// idle.
    // `retain` hands the byte keys over as `&Box<[u8]>`.
    #[allow(clippy::borrowed_box)]
    pub fn end_batch_live(&mut self, now_ns: u64, live: &dyn Fn(&FlowKey) -> Option<u64>) {
        self.now_ns = self.now_ns.max(now_ns);
        let now = self.now_ns;
        let mut single = false;
        let barrier = self.domain.barrier();
        for (i, t) in self.tables.iter_mut().enumerate() {
            if let Store::Single(s) = &mut t.store {
                // A barrier runner hands writes over at its sync points.
                s.end_batch(now, barrier);
                single = true;
                continue;
            }
            if let Store::Eventual { pending, shared, last_merge_ns } = &mut t.store {
                let interval = match t.spec.consistency {
                    Consistency::Eventual { merge_interval_ns, .. } => merge_interval_ns,
                    _ => 0,
                };
                if now.saturating_sub(*last_merge_ns) >= interval {
                    shared.merge_in(pending, now);
                    *last_merge_ns = now;
                    self.meters.merges += 1;
                }
                // The shared view is swept by whichever worker is due first;
                // a worker asks at most as often as it would sweep its own.
                let timeout = t.spec.idle_timeout_ns;
                if timeout == 0 || now.saturating_sub(t.last_sweep_ns) < (timeout / 8).max(1_000_000) {
                    continue;
                }
                t.last_sweep_ns = now;
                let notify = t.spec.notify_expired && t.declared;
                let mut notes: Vec<(u64, u64)> = Vec::new();
                self.meters.expired += shared.sweep(now, notify, &mut notes);
                if !notes.is_empty() {
                    notes.sort_unstable();
                    let mut framed = Vec::new();
                    for (k, v) in &notes {
                        push_frame(&mut framed, &k.to_le_bytes());
                        push_frame(&mut framed, &v.to_le_bytes());
                    }
                    self.expired.push((idx(i), framed));
                }
                continue;
            }
            let timeout = t.spec.idle_timeout_ns;
            if timeout == 0 || now.saturating_sub(t.last_sweep_ns) < (timeout / 8).max(1_000_000) {
                continue;
            }
            t.last_sweep_ns = now;
            let mut notes: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
            let notify = t.spec.notify_expired && t.declared;
            let mut freed = 0usize;
            let mut n = 0u64;
            let changes = &mut self.changes;
            macro_rules! sweep {
                ($m:expr, $key:expr, $val:expr, $cost:expr) => {
                    sweep!($m, $key, $val, $cost, |_| {}, |_| None)
                };
                ($m:expr, $key:expr, $val:expr, $cost:expr, $gone:expr, $live:expr) => {
                    $m.retain(|k, s| {
                        if !stale(s.last_ns, now, timeout) {
                            return true;
                        }
                        if let Some(t) = $live(k) {
                            s.last_ns = s.last_ns.max(t);
                            if !stale(s.last_ns, now, timeout) {
                                return true;
                            }
                        }
                        $gone(k);
                        n += 1;
                        freed += $cost(k, s);
                        if notify {
                            notes.push(($key(k), $val(s)));
                        }
                        false
                    })
                };
            }
            match &mut t.store {
                Store::Counters(m) => sweep!(
                    m,
                    |k: &u64| k.to_le_bytes().to_vec(),
                    |s: &Slot<u64>| s.value.to_le_bytes().to_vec(),
                    |_: &u64, _: &Slot<u64>| 16 + ENTRY_OVERHEAD
                ),
                Store::FlowCounters(m) => sweep!(
                    m,
                    |k: &FlowKey| k.to_bytes().to_vec(),
                    |s: &Slot<u64>| s.value.to_le_bytes().to_vec(),
                    |_: &FlowKey, _: &Slot<u64>| FlowKey::ENCODED_LEN + 8 + ENTRY_OVERHEAD,
                    |k: &FlowKey| changes.note(k),
                    live
                ),
                Store::Bytes(m) => sweep!(
                    m,
                    |k: &Box<[u8]>| k.to_vec(),
                    |s: &Slot<Vec<u8>>| s.value.clone(),
                    |k: &Box<[u8]>, s: &Slot<Vec<u8>>| k.len() + s.value.len() + ENTRY_OVERHEAD
                ),
                Store::FlowBytes(m) => sweep!(
                    m,
                    |k: &FlowKey| k.to_bytes().to_vec(),
                    |s: &Slot<Vec<u8>>| s.value.clone(),
                    |_: &FlowKey, s: &Slot<Vec<u8>>| FlowKey::ENCODED_LEN + s.value.len() + ENTRY_OVERHEAD,
                    |k: &FlowKey| changes.note(k),
                    live
                ),
                Store::Eventual { .. } | Store::Pool(_) | Store::Single(_) => {}
            }
            self.used = self.used.saturating_sub(freed);
            self.meters.expired += n;
            if !notes.is_empty() {
                // Maps iterate in hash order, which differs between runs;
                // sorted by key, a replay hands the NF the same entries in
                // the same order.
                notes.sort_unstable();
                let mut framed = Vec::new();
                for (k, v) in &notes {
                    push_frame(&mut framed, k);
                    push_frame(&mut framed, v);
                }
                self.expired.push((idx(i), framed));
            }
        }
        // Live workers sync their single-writer shards when due; a barrier
        // runner syncs every worker at once (`sync_point`).
        if single && !barrier {
            self.sync_single(false);
        }
    }

    /// Expired entries to hand to the NF: `(table, framed key/value pairs)`.
    pub fn take_expired(&mut self) -> Vec<(u32, Vec<u8>)> {
        std::mem::take(&mut self.expired)
    }

    /// Merges every eventual replica now (end of a run, or before a
    /// report), and hands single-writer writes to their owners.
    pub fn flush(&mut self) {
        for t in &mut self.tables {
            if let Store::Single(s) = &mut t.store {
                s.push(self.now_ns);
            }
            if let Store::Eventual { pending, shared, last_merge_ns } = &mut t.store {
                shared.merge_in(pending, self.now_ns);
                *last_merge_ns = self.now_ns;
                self.meters.merges += 1;
            }
        }
        self.recount();
    }

    /// The contents of a local counter table (global scope), sorted.
    pub fn counters(&self, name: &str) -> Option<Vec<(u64, u64)>> {
        let t = self.tables.iter().find(|t| t.spec.name == name)?;
        match &t.store {
            Store::Counters(m) => {
                let mut v: Vec<(u64, u64)> = m.iter().map(|(k, s)| (*k, s.value)).collect();
                v.sort_unstable();
                Some(v)
            }
            _ => None,
        }
    }

    /// The contents of a local byte table (global scope), sorted by key.
    pub fn bytes(&self, name: &str) -> Option<Vec<(Vec<u8>, Vec<u8>)>> {
        let t = self.tables.iter().find(|t| t.spec.name == name)?;
        match &t.store {
            Store::Bytes(m) => {
                let mut v: Vec<(Vec<u8>, Vec<u8>)> = m.iter().map(|(k, s)| (k.to_vec(), s.value.clone())).collect();
                v.sort_unstable();
                Some(v)
            }
            _ => None,
        }
    }

    fn table(&mut self, t: u32) -> Result<&mut Table, StateError> {
        match self.tables.get_mut(t as usize) {
            Some(table) if table.declared => Ok(table),
            _ => Err(StateError::UnknownTable(t)),
        }
    }

    /// Charges `cost` bytes for a new entry of a table holding `len` of
    /// `cap`: the new total, or why it does not fit (at item `item`).
    fn charge(
        used: usize,
        budget: usize,
        len: usize,
        cap: usize,
        cost: usize,
        item: usize,
    ) -> Result<usize, StateError> {
        if len >= cap {
            Err(StateError::Full(idx(item)))
        } else if used + cost > budget {
            Err(StateError::OverBudget(idx(item)))
        } else {
            Ok(used + cost)
        }
    }

    /// Records the outcome of a call in the meters.
    fn account<T>(&mut self, r: Result<T, StateError>) -> Result<T, StateError> {
        self.meters.calls += 1;
        if let Err(e) = &r {
            self.meters.errors += 1;
            if matches!(e, StateError::Full(_) | StateError::OverBudget(_) | StateError::TooLarge(_)) {
                self.meters.rejected += 1;
            }
        }
        r
    }

    /// `declare`.
    pub fn declare(&mut self, spec: TableSpec) -> Result<u32, StateError> {
        let r = self.declare_inner(spec);
        self.account(r)
    }

    fn declare_inner(&mut self, spec: TableSpec) -> Result<u32, StateError> {
        if !self.in_init {
            return Err(StateError::NotNow);
        }
        spec.validate()?;
        if let Some(i) = self.tables.iter().position(|t| t.spec.name == spec.name) {
            let Some(t) = self.tables.get_mut(i) else { return Err(StateError::UnknownTable(idx(i))) };
            if let Some(why) = t.spec.incompatibility(&spec) {
                self.incompatible.get_or_insert_with(|| why.clone());
                return Err(StateError::Incompatible(why));
            }
            if t.declared {
                return Err(StateError::BadSpec(format!("table '{}' is declared twice", spec.name)));
            }
            if spec.access == Access::ReadOnly {
                // `init` is the only writer: it refills from empty.
                t.store.clear();
            }
            if let (Store::Eventual { .. }, Consistency::Eventual { merge, .. }) = (&t.store, spec.consistency) {
                // Capacity and expiry may change between versions.
                let _ = self.domain.eventual(&spec, merge);
            }
            if let (Store::Single(s), Consistency::SingleWriter { sync_interval_ns }) = (&mut t.store, spec.consistency)
            {
                let _ = self.domain.single(&spec, sync_interval_ns);
                s.claim();
            }
            t.spec = spec;
            t.declared = true;
            self.recount();
            self.note_declarations();
            return Ok(idx(i));
        }
        if self.tables.len() >= MAX_TABLES {
            return Err(StateError::BadSpec(format!("more than {MAX_TABLES} tables")));
        }
        let mut store = Store::new(&spec, &self.domain, self.worker);
        if let Store::Single(s) = &mut store {
            s.claim();
        }
        self.tables.push(Table { spec, store, last_sweep_ns: self.now_ns, declared: true });
        self.note_declarations();
        Ok(idx(self.tables.len() - 1))
    }

    fn writable(&self, t: u32) -> Result<(), StateError> {
        match self.tables.get(t as usize) {
            Some(table) if table.declared => {
                if table.spec.access == Access::ReadOnly && !self.in_init {
                    Err(StateError::NotNow)
                } else {
                    Ok(())
                }
            }
            _ => Err(StateError::UnknownTable(t)),
        }
    }

    fn flow(&self, i: usize, item: usize) -> Result<FlowKey, StateError> {
        self.flows.get(i).copied().ok_or(StateError::BadInput(idx(item)))
    }
}

impl Drop for Tables {
    /// Gives back the entries this worker's unmerged updates reserved in
    /// shared tables, and the billing of the shared tables if it had it.
    fn drop(&mut self) {
        self.domain.leave(self.worker);
        for t in &mut self.tables {
            match &mut t.store {
                Store::Eventual { pending, shared, .. } => shared.forget(pending),
                Store::Single(s) => s.leave(),
                _ => {}
            }
        }
    }
}
