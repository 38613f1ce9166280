//! The tables of one NF instance on one worker.

use crate::HashMap;
use crate::error::StateError;
use crate::scan::{Largest, ScanPage, Smallest, counter_page, framed_page, page_limit, top_limit, u64_cursor};
use crate::shared::{AddRefusal, Domain, EventualShared, Pending, Pool, stale};
use crate::single::SingleStore::{Bytes as SingleBytes, Counters as SingleCounters};
use crate::single::{Refusal, SingleStore};
use crate::spec::{Access, Consistency, Kind, MAX_TABLES, Scope, TableSpec};
use sluice_wire::FlowKey;
use sluice_wire::abi::{frames, push_frame};
use std::sync::Arc;

/// Bytes an entry costs besides its key and value (map slot, timestamps):
/// what the memory budget charges per entry.
pub const ENTRY_OVERHEAD: usize = 48;

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

#[derive(Debug, Clone)]
struct Slot<V> {
    value: V,
    last_ns: u64,
    /// Updates so far: the entry's logical clock.
    clock: u64,
}

#[derive(Debug)]
enum Store {
    Counters(HashMap<u64, Slot<u64>>),
    FlowCounters(HashMap<FlowKey, Slot<u64>>),
    Bytes(HashMap<Box<[u8]>, Slot<Vec<u8>>>),
    FlowBytes(HashMap<FlowKey, Slot<Vec<u8>>>),
    Eventual { pending: HashMap<u64, Pending>, shared: Arc<EventualShared>, last_merge_ns: u64 },
    Pool(Arc<Pool>),
    Single(SingleStore),
}

impl Store {
    fn new(spec: &TableSpec, domain: &Domain, worker: usize) -> Store {
        match (spec.scope, spec.kind, spec.consistency) {
            (_, _, Consistency::SingleWriter { sync_interval_ns }) => {
                Store::Single(SingleStore::new(domain.single(spec, sync_interval_ns), worker))
            }
            (_, _, Consistency::Eventual { merge, .. }) => {
                Store::Eventual { pending: HashMap::default(), shared: domain.eventual(spec, merge), last_merge_ns: 0 }
            }
            (_, _, Consistency::Release { first, count, chunk }) => Store::Pool(domain.pool(spec, first, count, chunk)),
            (Scope::PerFlow, Kind::Counter, _) => Store::FlowCounters(HashMap::default()),
            (Scope::PerFlow, Kind::Bytes, _) => Store::FlowBytes(HashMap::default()),
            (Scope::Global, Kind::Counter, _) => Store::Counters(HashMap::default()),
            (Scope::Global, Kind::Bytes, _) => Store::Bytes(HashMap::default()),
        }
    }

    /// Whether the store is the domain's, shared by its workers.
    fn is_shared(&self) -> bool {
        matches!(self, Store::Eventual { .. } | Store::Single(_) | Store::Pool(_))
    }

    fn len(&self) -> usize {
        match self {
            Store::Counters(m) => m.len(),
            Store::FlowCounters(m) => m.len(),
            Store::Bytes(m) => m.len(),
            Store::FlowBytes(m) => m.len(),
            Store::Eventual { shared, .. } => shared.len(),
            Store::Single(s) => s.len(),
            Store::Pool(_) => 0,
        }
    }

    /// Bytes charged to the budget.
    fn cost(&self) -> usize {
        match self {
            Store::Counters(m) => m.len() * (16 + ENTRY_OVERHEAD),
            Store::FlowCounters(m) => m.len() * (FlowKey::ENCODED_LEN + 8 + ENTRY_OVERHEAD),
            Store::Bytes(m) => m.iter().map(|(k, v)| k.len() + v.value.len() + ENTRY_OVERHEAD).sum(),
            Store::FlowBytes(m) => m.values().map(|v| FlowKey::ENCODED_LEN + v.value.len() + ENTRY_OVERHEAD).sum(),
            // Charged to the domain's shared account.
            Store::Eventual { .. } | Store::Pool(_) | Store::Single(_) => 0,
        }
    }

    fn clear(&mut self) {
        match self {
            Store::Counters(m) => m.clear(),
            Store::FlowCounters(m) => m.clear(),
            Store::Bytes(m) => m.clear(),
            Store::FlowBytes(m) => m.clear(),
            Store::Eventual { pending, shared, .. } => shared.forget(pending),
            Store::Pool(_) | Store::Single(_) => {}
        }
    }
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

    /// Whether a per-flow table is declared (the host then tells the
    /// tables each batch's flows).
    pub fn has_per_flow(&self) -> bool {
        self.tables.iter().any(|t| t.declared && t.spec.scope == Scope::PerFlow)
    }

    /// Starts an `init`: declarations are allowed, and the running
    /// version's declarations are forgotten until made again.
    pub fn begin_init(&mut self) {
        self.in_init = true;
        self.incompatible = None;
        for t in &mut self.tables {
            t.declared = false;
        }
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
    // `retain` hands the byte keys over as `&Box<[u8]>`.
    #[allow(clippy::borrowed_box)]
    pub fn end_batch(&mut self, now_ns: u64) {
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
                    sweep!($m, $key, $val, $cost, |_| {})
                };
                ($m:expr, $key:expr, $val:expr, $cost:expr, $gone:expr) => {
                    $m.retain(|k, s| {
                        if !stale(s.last_ns, now, timeout) {
                            return true;
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
                    |k: &FlowKey| changes.note(k)
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
                    |k: &FlowKey| changes.note(k)
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

    /// For a per-flow counter table, the flows its keys (batch flow
    /// indices) name; empty for other tables. Resolved before the table is
    /// borrowed mutably.
    fn counter_flow_keys(&self, t: u32, keys: &[u64]) -> Result<Vec<FlowKey>, StateError> {
        match self.tables.get(t as usize).map(|x| &x.store) {
            Some(Store::FlowCounters(_)) => keys
                .iter()
                .enumerate()
                .map(|(item, k)| self.flow(usize::try_from(*k).unwrap_or(usize::MAX), item))
                .collect(),
            _ => Ok(Vec::new()),
        }
    }

    /// `counter-add`.
    pub fn counter_add(&mut self, t: u32, keys: &[u64], deltas: &[i64]) -> Result<(), StateError> {
        let r = self.counter_add_inner(t, keys, deltas);
        self.account(r)
    }

    fn counter_add_inner(&mut self, t: u32, keys: &[u64], deltas: &[i64]) -> Result<(), StateError> {
        self.writable(t)?;
        if keys.len() != deltas.len() {
            return Err(StateError::BadInput(idx(keys.len().min(deltas.len()))));
        }
        let now = self.now_ns;
        let budget = self.budget;
        let mut used = self.used;
        // Per-flow keys are resolved before borrowing the table.
        let flow_keys: Vec<FlowKey> = self.counter_flow_keys(t, keys)?;
        for k in &flow_keys {
            self.changes.note(k);
        }
        let table = self.table(t)?;
        let cap = table.spec.capacity();
        let timeout = table.spec.idle_timeout_ns;
        let add = |v: u64, d: i64| {
            if d >= 0 { v.saturating_add(d.unsigned_abs()) } else { v.saturating_sub(d.unsigned_abs()) }
        };
        let result = match &mut table.store {
            Store::Counters(m) => {
                let mut r = Ok(());
                for (i, (k, d)) in keys.iter().zip(deltas).enumerate() {
                    match m.get_mut(k) {
                        Some(s) if !stale(s.last_ns, now, timeout) => {
                            s.value = add(s.value, *d);
                            s.last_ns = now;
                            s.clock += 1;
                        }
                        existing => {
                            if existing.is_none() {
                                match Self::charge(used, budget, m.len(), cap, 16 + ENTRY_OVERHEAD, i) {
                                    Ok(total) => used = total,
                                    Err(e) => {
                                        r = Err(e);
                                        break;
                                    }
                                }
                            }
                            m.insert(*k, Slot { value: add(0, *d), last_ns: now, clock: 1 });
                        }
                    }
                }
                r
            }
            Store::FlowCounters(m) => {
                let mut r = Ok(());
                let cost = FlowKey::ENCODED_LEN + 8 + ENTRY_OVERHEAD;
                for (i, (k, d)) in flow_keys.iter().zip(deltas).enumerate() {
                    match m.get_mut(k) {
                        Some(s) if !stale(s.last_ns, now, timeout) => {
                            s.value = add(s.value, *d);
                            s.last_ns = now;
                            s.clock += 1;
                        }
                        existing => {
                            let clock = existing.map(|s| s.clock).unwrap_or(0) + 1;
                            if clock == 1 {
                                match Self::charge(used, budget, m.len(), cap, cost, i) {
                                    Ok(total) => used = total,
                                    Err(e) => {
                                        r = Err(e);
                                        break;
                                    }
                                }
                            }
                            m.insert(*k, Slot { value: add(0, *d), last_ns: now, clock });
                        }
                    }
                }
                r
            }
            Store::Single(SingleCounters(s)) => s.counter_add(keys, deltas, now).map_err(refusal),
            Store::Eventual { pending, shared, .. } => shared.add(pending, keys, deltas, now).map_err(|r| match r {
                AddRefusal::Full(i) => StateError::Full(idx(i)),
                AddRefusal::OverBudget(i) => StateError::OverBudget(idx(i)),
                AddRefusal::Negative(i) => StateError::BadInput(idx(i)),
            }),
            _ => Err(StateError::WrongKind),
        };
        self.used = used;
        self.meters.ops += keys.len() as u64;
        result
    }

    /// `counter-get`: appends one value per key to `out`.
    pub fn counter_get(&mut self, t: u32, keys: &[u64], out: &mut Vec<u64>) -> Result<(), StateError> {
        let r = self.counter_get_inner(t, keys, out);
        self.account(r)
    }

    fn counter_get_inner(&mut self, t: u32, keys: &[u64], out: &mut Vec<u64>) -> Result<(), StateError> {
        let now = self.now_ns;
        let flow_keys: Vec<FlowKey> = self.counter_flow_keys(t, keys)?;
        let table = self.table(t)?;
        let timeout = table.spec.idle_timeout_ns;
        match &mut table.store {
            Store::Counters(m) => read_counters(m, keys, now, timeout, out),
            Store::FlowCounters(m) => read_counters(m, &flow_keys, now, timeout, out),
            Store::Eventual { pending, shared, .. } => shared.read(keys, pending, now, out),
            Store::Single(SingleCounters(s)) => s.counter_get(keys, now, out),
            _ => return Err(StateError::WrongKind),
        }
        self.meters.ops += keys.len() as u64;
        Ok(())
    }

    /// `get-many`: appends one framed value per framed key to `out`.
    pub fn get_many(&mut self, t: u32, keys: &[u8], out: &mut Vec<u8>) -> Result<(), StateError> {
        let r = self.get_many_inner(t, keys, out);
        self.account(r)
    }

    fn get_many_inner(&mut self, t: u32, keys: &[u8], out: &mut Vec<u8>) -> Result<(), StateError> {
        let now = self.now_ns;
        let flows = std::mem::take(&mut self.flows);
        let result = (|| {
            let table = self.table(t)?;
            let timeout = table.spec.idle_timeout_ns;
            let mut n = 0u64;
            match &mut table.store {
                Store::Single(SingleBytes(s)) => {
                    let keys: Vec<&[u8]> = frames(keys).collect::<Result<_, _>>().map_err(StateError::BadInput)?;
                    n = keys.len() as u64;
                    s.get_many(&keys, now, out);
                }
                Store::Bytes(m) => {
                    for key in frames(keys) {
                        let key = key.map_err(StateError::BadInput)?;
                        n += 1;
                        match m.get_mut(key) {
                            Some(s) if !stale(s.last_ns, now, timeout) => {
                                s.last_ns = now;
                                push_frame(out, &s.value);
                            }
                            _ => push_frame(out, &[]),
                        }
                    }
                }
                Store::FlowBytes(m) => {
                    for (item, key) in frames(keys).enumerate() {
                        let key = key.map_err(StateError::BadInput)?;
                        n += 1;
                        let flow = flow_index(key).and_then(|i| flows.get(i)).ok_or(StateError::BadInput(idx(item)))?;
                        match m.get_mut(flow) {
                            Some(s) if !stale(s.last_ns, now, timeout) => {
                                s.last_ns = now;
                                push_frame(out, &s.value);
                            }
                            _ => push_frame(out, &[]),
                        }
                    }
                }
                _ => return Err(StateError::WrongKind),
            }
            Ok(n)
        })();
        self.flows = flows;
        let n = result?;
        self.meters.ops += n;
        Ok(())
    }

    /// `put-many`.
    pub fn put_many(&mut self, t: u32, entries: &[u8]) -> Result<(), StateError> {
        let r = self.put_many_inner(t, entries);
        self.account(r)
    }

    fn put_many_inner(&mut self, t: u32, entries: &[u8]) -> Result<(), StateError> {
        self.writable(t)?;
        let now = self.now_ns;
        let budget = self.budget;
        let mut used = self.used;
        let flows = std::mem::take(&mut self.flows);
        let mut n = 0u64;
        let mut changes = std::mem::take(&mut self.changes);
        let result = (|| {
            let table = self.table(t)?;
            let cap = table.spec.capacity();
            let key_size = table.spec.key_size as usize;
            let max_value = table.spec.max_value_size as usize;
            if let Store::Single(s) = &mut table.store {
                let SingleBytes(s) = s else { return Err(StateError::WrongKind) };
                // The items up to a malformed one are written, as for any
                // other table.
                let (items, bad) = single_items(entries, key_size, max_value);
                n = items.len() as u64;
                s.put_many(&items, now).map_err(refusal)?;
                return bad.map_or(Ok(()), Err);
            }
            let mut items = frames(entries);
            let mut item = 0u32;
            loop {
                let Some(key) = items.next() else { return Ok(()) };
                let key = key.map_err(|_| StateError::BadInput(item))?;
                let value = match items.next() {
                    Some(Ok(v)) => v,
                    _ => return Err(StateError::BadInput(item)),
                };
                if value.len() > max_value {
                    return Err(StateError::TooLarge(item));
                }
                n += 1;
                match &mut table.store {
                    Store::Bytes(m) => {
                        let key_ok = if key_size == 0 {
                            !key.is_empty() && key.len() <= crate::spec::MAX_KEY_SIZE as usize
                        } else {
                            key.len() == key_size
                        };
                        if !key_ok {
                            return Err(StateError::BadInput(item));
                        }
                        let old = m.get(key).map(|s| (s.value.len(), s.clock));
                        if value.is_empty() {
                            if let Some((len, _)) = old {
                                m.remove(key);
                                used = used.saturating_sub(key.len() + len + ENTRY_OVERHEAD);
                            }
                        } else {
                            let (old_cost, clock) = match old {
                                Some((len, clock)) => (key.len() + len + ENTRY_OVERHEAD, clock),
                                None => (0, 0),
                            };
                            let new_cost = key.len() + value.len() + ENTRY_OVERHEAD;
                            let len = if old.is_some() { 0 } else { m.len() };
                            used =
                                Self::charge(used.saturating_sub(old_cost), budget, len, cap, new_cost, item as usize)?;
                            m.insert(key.into(), Slot { value: value.to_vec(), last_ns: now, clock: clock + 1 });
                        }
                    }
                    Store::FlowBytes(m) => {
                        let flow = *flow_index(key).and_then(|i| flows.get(i)).ok_or(StateError::BadInput(item))?;
                        changes.note(&flow);
                        let old = m.get(&flow).map(|s| (s.value.len(), s.clock));
                        let base = FlowKey::ENCODED_LEN + ENTRY_OVERHEAD;
                        if value.is_empty() {
                            if let Some((len, _)) = old {
                                m.remove(&flow);
                                used = used.saturating_sub(base + len);
                            }
                        } else {
                            let (old_cost, clock) = match old {
                                Some((len, clock)) => (base + len, clock),
                                None => (0, 0),
                            };
                            let len = if old.is_some() { 0 } else { m.len() };
                            used = Self::charge(
                                used.saturating_sub(old_cost),
                                budget,
                                len,
                                cap,
                                base + value.len(),
                                item as usize,
                            )?;
                            m.insert(flow, Slot { value: value.to_vec(), last_ns: now, clock: clock + 1 });
                        }
                    }
                    _ => return Err(StateError::WrongKind),
                }
                item += 1;
            }
        })();
        self.changes = changes;
        self.flows = flows;
        self.used = used;
        self.meters.ops += n;
        result
    }

    /// `scan`: one page of table `t` in ascending key order after
    /// `cursor`, at most `limit` entries (see [`crate::scan`]). Metered as
    /// one operation per entry plus one for the call.
    pub fn scan(&mut self, t: u32, cursor: &[u8], limit: u32) -> Result<ScanPage, StateError> {
        let r = self.scan_inner(t, cursor, page_limit(limit));
        self.meters.ops += 1 + r.as_ref().map_or(0, |p| p.len as u64);
        self.account(r)
    }

    fn scan_inner(&mut self, t: u32, cursor: &[u8], limit: usize) -> Result<ScanPage, StateError> {
        let now = self.now_ns;
        let table = self.table(t)?;
        let timeout = table.spec.idle_timeout_ns;
        let key_size = table.spec.key_size as usize;
        let counter_cursor = || u64_cursor(cursor).ok_or(StateError::BadInput(0));
        match &table.store {
            Store::FlowCounters(_) | Store::FlowBytes(_) => Err(StateError::WrongKind),
            Store::Counters(m) => {
                let mut page = Smallest::new(counter_cursor()?, limit);
                for (k, s) in m.iter().filter(|(_, s)| !stale(s.last_ns, now, timeout)) {
                    page.offer(*k, s.value);
                }
                let (counters, more) = page.finish();
                Ok(counter_page(counters, more))
            }
            Store::Eventual { pending, shared, .. } => {
                let mut page = Smallest::new(counter_cursor()?, limit);
                shared.visit(pending, now, |k, v| page.offer(k, v));
                let (counters, more) = page.finish();
                Ok(counter_page(counters, more))
            }
            Store::Single(SingleCounters(s)) => {
                let (counters, more) = s.scan_counters(counter_cursor()?, limit, now);
                Ok(counter_page(counters, more))
            }
            Store::Single(SingleBytes(s)) => {
                let after = byte_cursor(cursor, key_size)?;
                let (items, more) = s.scan_bytes(after, limit, now);
                Ok(framed_entries(&items, more))
            }
            Store::Bytes(m) => {
                let after = byte_cursor(cursor, key_size)?;
                let mut page = Smallest::new(after, limit);
                for (k, s) in m.iter().filter(|(_, s)| !stale(s.last_ns, now, timeout)) {
                    page.offer(&**k, s.value.as_slice());
                }
                let (items, more) = page.finish();
                Ok(framed_entries(&items, more))
            }
            Store::Pool(p) => {
                let (items, more) = p.scan(counter_cursor()?, limit);
                let mut entries = Vec::new();
                for (r, v) in &items {
                    push_frame(&mut entries, &r.to_le_bytes());
                    push_frame(&mut entries, v);
                }
                let last = items.last().map(|(r, _)| r.to_le_bytes());
                Ok(framed_page(entries, items.len(), last.as_ref().map(|l| &l[..]), more))
            }
        }
    }

    /// `top-k`: the `k` (at most [`MAX_SCAN`]) largest counters of table
    /// `t`, largest first, equal values by ascending key. Metered as one
    /// operation per pair plus one for the call.
    pub fn top_k(&mut self, t: u32, k: u32) -> Result<Vec<(u64, u64)>, StateError> {
        let r = self.top_k_inner(t, top_limit(k));
        self.meters.ops += 1 + r.as_ref().map_or(0, |v| v.len() as u64);
        self.account(r)
    }

    fn top_k_inner(&mut self, t: u32, k: usize) -> Result<Vec<(u64, u64)>, StateError> {
        let now = self.now_ns;
        let table = self.table(t)?;
        let timeout = table.spec.idle_timeout_ns;
        let mut top = Largest::new(k);
        match &table.store {
            Store::Counters(m) => {
                for (key, s) in m.iter().filter(|(_, s)| !stale(s.last_ns, now, timeout)) {
                    top.offer(*key, s.value);
                }
            }
            Store::Eventual { pending, shared, .. } => shared.visit(pending, now, |key, v| top.offer(key, v)),
            Store::Single(SingleCounters(s)) => s.top(&mut top, now),
            _ => return Err(StateError::WrongKind),
        }
        Ok(top.finish())
    }

    fn pool(&mut self, t: u32) -> Result<Arc<Pool>, StateError> {
        match &self.table(t)?.store {
            Store::Pool(p) => Ok(p.clone()),
            _ => Err(StateError::WrongKind),
        }
    }

    /// `acquire`: appends the resources to `out`.
    pub fn acquire(&mut self, t: u32, values: &[u8], out: &mut Vec<u64>) -> Result<(), StateError> {
        let r = (|| {
            let pool = self.pool(t)?;
            let max = self.tables.get(t as usize).map(|x| x.spec.max_value_size as usize).unwrap_or(0);
            let mut items = Vec::new();
            for (i, v) in frames(values).enumerate() {
                let v = v.map_err(StateError::BadInput)?;
                if v.len() > max {
                    return Err(StateError::TooLarge(idx(i)));
                }
                items.push(v);
            }
            self.meters.ops += items.len() as u64;
            match pool.acquire(self.worker, items.iter().copied(), out) {
                Ok(short) => {
                    self.meters.rejected += short;
                    Ok(())
                }
                Err(item) => Err(StateError::OverBudget(idx(item))),
            }
        })();
        self.account(r)
    }

    /// `lookup`: appends one framed value per resource to `out`.
    pub fn lookup(&mut self, t: u32, resources: &[u64], out: &mut Vec<u8>) -> Result<(), StateError> {
        let r = self.pool(t).map(|p| {
            p.lookup(resources, out);
        });
        self.meters.ops += resources.len() as u64;
        self.account(r)
    }

    /// `release`.
    pub fn release(&mut self, t: u32, resources: &[u64]) -> Result<(), StateError> {
        let worker = self.worker;
        let r = self.pool(t).map(|p| {
            p.release(worker, resources);
        });
        self.meters.ops += resources.len() as u64;
        self.account(r)
    }

    /// The worker holding a pool resource (tests, reports).
    pub fn pool_holder(&self, name: &str, resource: u64) -> Option<usize> {
        self.tables.iter().find(|t| t.spec.name == name).and_then(|t| match &t.store {
            Store::Pool(p) => p.holder(resource),
            _ => None,
        })
    }

    /// A flow's entries in every per-flow table, for moving the flow to
    /// another host.
    pub fn export_flow(&self, flow: &FlowKey) -> Vec<FlowTableEntry> {
        let mut out = Vec::new();
        for t in &self.tables {
            let entry = match &t.store {
                Store::FlowCounters(m) => m.get(flow).map(|s| (s.value.to_le_bytes().to_vec(), s.clock)),
                Store::FlowBytes(m) => m.get(flow).map(|s| (s.value.clone(), s.clock)),
                _ => None,
            };
            if let Some((value, clock)) = entry {
                out.push(FlowTableEntry { table: t.spec.name.clone(), value, clock });
            }
        }
        out
    }

    /// The sum of the clocks of a flow's per-flow table entries (0: none):
    /// it changes whenever one of them is written.
    pub fn flow_clock(&self, flow: &FlowKey) -> u64 {
        let mut sum = 0u64;
        for t in &self.tables {
            let clock = match &t.store {
                Store::FlowCounters(m) => m.get(flow).map(|s| s.clock),
                Store::FlowBytes(m) => m.get(flow).map(|s| s.clock),
                _ => None,
            };
            sum = sum.wrapping_add(clock.unwrap_or(0));
        }
        sum
    }

    /// Starts noting the flows whose per-flow entries change (written,
    /// imported or idled out), for [`take_flow_changes`](Self::take_flow_changes).
    pub fn track_flow_changes(&mut self) {
        self.changes.track();
    }

    /// Appends the flows whose per-flow entries changed since the last
    /// call; `false` if too many changed to note (any may have).
    pub fn take_flow_changes(&mut self, out: &mut Vec<FlowKey>) -> bool {
        self.changes.take(out)
    }

    /// Imports a flow's per-flow table entries. An entry whose clock is not
    /// newer than the local one is stale and skipped; returns how many
    /// were imported. Entries of unknown tables are skipped too.
    pub fn import_flow(&mut self, flow: FlowKey, entries: &[FlowTableEntry]) -> usize {
        let now = self.now_ns;
        let mut n = 0;
        // Imported state is sent on to this host's next owner.
        self.changes.note(&flow);
        for e in entries {
            let Some(t) = self.tables.iter_mut().find(|t| t.spec.name == e.table) else { continue };
            match &mut t.store {
                Store::FlowCounters(m) => {
                    let Ok(b) = <[u8; 8]>::try_from(e.value.as_slice()) else { continue };
                    if m.get(&flow).is_some_and(|s| s.clock >= e.clock) {
                        continue;
                    }
                    m.insert(flow, Slot { value: u64::from_le_bytes(b), last_ns: now, clock: e.clock });
                    n += 1;
                }
                Store::FlowBytes(m) => {
                    if m.get(&flow).is_some_and(|s| s.clock >= e.clock) {
                        continue;
                    }
                    m.insert(flow, Slot { value: e.value.clone(), last_ns: now, clock: e.clock });
                    n += 1;
                }
                _ => {}
            }
        }
        self.recount();
        n
    }
}

fn refusal(r: Refusal) -> StateError {
    match r {
        Refusal::Full(i) => StateError::Full(idx(i)),
        Refusal::OverBudget(i) => StateError::OverBudget(idx(i)),
    }
}

/// `(key, value)` items of a `put-many`.
type Items<'a> = Vec<(&'a [u8], &'a [u8])>;

/// The `(key, value)` items of a `put-many` on a single-writer byte table,
/// up to the first malformed one, and the error for that one.
fn single_items(entries: &[u8], key_size: usize, max_value: usize) -> (Items<'_>, Option<StateError>) {
    let mut items = Vec::new();
    let mut frames = frames(entries);
    loop {
        let item = idx(items.len());
        let key = match frames.next() {
            None => return (items, None),
            Some(Ok(k)) => k,
            Some(Err(_)) => return (items, Some(StateError::BadInput(item))),
        };
        let Some(Ok(value)) = frames.next() else { return (items, Some(StateError::BadInput(item))) };
        let key_ok = if key_size == 0 {
            !key.is_empty() && key.len() <= crate::spec::MAX_KEY_SIZE as usize
        } else {
            key.len() == key_size
        };
        if !key_ok {
            return (items, Some(StateError::BadInput(item)));
        }
        if value.len() > max_value {
            return (items, Some(StateError::TooLarge(item)));
        }
        items.push((key, value));
    }
}

/// A byte-table cursor: empty (the start) or a key the table could hold.
fn byte_cursor(cursor: &[u8], key_size: usize) -> Result<Option<&[u8]>, StateError> {
    let ok = if key_size == 0 { cursor.len() <= crate::spec::MAX_KEY_SIZE as usize } else { cursor.len() == key_size };
    match cursor {
        [] => Ok(None),
        c if ok => Ok(Some(c)),
        _ => Err(StateError::BadInput(0)),
    }
}

/// A page of byte entries, framed key, value, ...
fn framed_entries<K: AsRef<[u8]>, V: AsRef<[u8]>>(items: &[(K, V)], more: bool) -> ScanPage {
    let mut entries = Vec::new();
    for (k, v) in items {
        push_frame(&mut entries, k.as_ref());
        push_frame(&mut entries, v.as_ref());
    }
    framed_page(entries, items.len(), items.last().map(|(k, _)| k.as_ref()), more)
}

/// Appends the live value of each key (0 if absent or idle), marking the
/// entries read.
fn read_counters<K: std::hash::Hash + Eq>(
    m: &mut HashMap<K, Slot<u64>>,
    keys: &[K],
    now: u64,
    timeout: u64,
    out: &mut Vec<u64>,
) {
    for k in keys {
        out.push(match m.get_mut(k) {
            Some(s) if !stale(s.last_ns, now, timeout) => {
                s.last_ns = now;
                s.value
            }
            _ => 0,
        });
    }
}

/// A copy of a local store (read-only tables are small: configuration).
fn clone_local(store: &Store, spec: &TableSpec, domain: &Domain) -> Store {
    match store {
        Store::Counters(m) => Store::Counters(m.clone()),
        Store::FlowCounters(m) => Store::FlowCounters(m.clone()),
        Store::Bytes(m) => Store::Bytes(m.clone()),
        Store::FlowBytes(m) => Store::FlowBytes(m.clone()),
        Store::Eventual { .. } | Store::Pool(_) | Store::Single(_) => Store::new(spec, domain, usize::MAX),
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
