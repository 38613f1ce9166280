//! The per-instance host state and the `sluice:nf` imports.

use crate::bindings::v0_1::sluice::nf::{host_log, types};
use crate::bindings::v0_2::sluice::nf::{host_log as host_log_v2, state as wit_state};
use crate::bindings::v0_3::sluice::nf::{host_log as host_log_v3, state as wit_state_v3};
use crate::bindings::{Event, Level};
use crate::guest_io::{GuestOutput, LogLimiter, Stream};
use parking_lot::Mutex;
use sluice_state::{StateError, TableSpec, Tables};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use wasmtime::{StoreLimits, StoreLimitsBuilder};
use wasmtime_wasi::{ResourceTable, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

/// Events emitted per batch beyond which further events are dropped and
/// counted; an IDS under attack must not turn the host into an event pump.
pub const MAX_EVENTS_PER_BATCH: usize = 1024;
/// Largest event (kind, field names and values, 16 bytes per field):
/// larger ones are dropped and counted.
pub const MAX_EVENT_BYTES: usize = 4096;
/// Event bytes one batch call may emit; more are dropped and counted.
pub const MAX_EVENT_BYTES_PER_BATCH: usize = 256 * 1024;
/// Longest `host-log` line kept (as for stdout); longer ones are cut.
pub const MAX_LOG_LINE: usize = crate::guest_io::MAX_LINE;

/// What an event costs against the limits.
fn event_size(e: &Event) -> usize {
    e.fields.iter().fold(e.kind.len() + 16, |n, (k, v)| n.saturating_add(k.len() + v.len() + 16))
}

/// What a store holds for one NF instance.
pub struct HostState {
    wasi: WasiCtx,
    table: ResourceTable,
    pub(crate) limits: StoreLimits,
    nf: Arc<str>,
    /// Whose NF it is (host log lines name them).
    owner: Option<Arc<crate::owner::NfOwner>>,
    limiter: Arc<Mutex<LogLimiter>>,
    log_dropped: Arc<AtomicU64>,
    /// Events of the current call.
    pub(crate) events: Vec<Event>,
    /// Events dropped by the per-batch caps.
    pub(crate) events_dropped: u64,
    /// Bytes of this call's events.
    pub(crate) event_bytes: usize,
    /// The NF's state tables, moved in for a call and out after it (the
    /// instance owns them; see `NfInstance`).
    pub(crate) tables: Option<Box<Tables>>,
    /// The current call's flow offload requests and returns (0.5.0).
    pub(crate) offload: crate::offload::Calls,
    /// The CPU-time deadline of the current call (see [`CpuDeadline`]).
    pub(crate) deadline: CpuDeadline,
}

/// A batch deadline in CPU time, on top of wasmtime's wall-clock epochs.
///
/// The epoch deadline fires after half the call's deadline in wall time.
/// Only then is the thread's CPU clock read (a system call, too slow to
/// make per batch), and the call goes on: it is stopped once the CPU time
/// it used from that first reading reaches the deadline. A call is
/// therefore stopped only when it used at least its deadline in CPU time,
/// never for time its thread was preempted or shared its core; a runaway
/// call on a core of its own is stopped about 1.5 deadlines after it
/// started.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CpuDeadline {
    /// The deadline.
    pub(crate) limit: std::time::Duration,
    /// The epoch tick.
    pub(crate) tick: std::time::Duration,
    /// Thread CPU time when the wall deadline first fired in this call.
    pub(crate) mark: Option<std::time::Duration>,
}

impl CpuDeadline {
    /// Epoch ticks covering `d` (at least one).
    pub(crate) fn ticks(&self, d: std::time::Duration) -> u64 {
        let tick = self.tick.as_nanos().max(1);
        u64::try_from(d.as_nanos().div_ceil(tick)).unwrap_or(u64::MAX).max(1)
    }

    /// Called when the wall deadline passes: stop, or how many more ticks.
    pub(crate) fn expired(&mut self) -> wasmtime::UpdateDeadline {
        let now = crate::cpu_time::thread_cpu_time();
        match self.mark {
            None => {
                self.mark = Some(now);
                wasmtime::UpdateDeadline::Continue(self.ticks(self.limit))
            }
            Some(mark) => {
                let used = now.saturating_sub(mark);
                match self.limit.checked_sub(used) {
                    Some(left) if !left.is_zero() => wasmtime::UpdateDeadline::Continue(self.ticks(left)),
                    _ => wasmtime::UpdateDeadline::Interrupt,
                }
            }
        }
    }
}

/// A wall and monotonic clock that never moves: NFs get time only from
/// packet timestamps, which keeps replays deterministic. The monotonic
/// clock reads one second rather than zero because some language runtimes
/// (Go's) refuse to start on a monotonic clock that reads zero.
struct FrozenClock;

impl wasmtime_wasi::HostWallClock for FrozenClock {
    fn resolution(&self) -> std::time::Duration {
        std::time::Duration::from_secs(1)
    }
    fn now(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }
}

impl wasmtime_wasi::HostMonotonicClock for FrozenClock {
    fn resolution(&self) -> u64 {
        1_000_000_000
    }
    fn now(&self) -> u64 {
        1_000_000_000
    }
}

impl HostState {
    /// State for a new instance of NF `nf` with a memory cap and the log
    /// limiter of the NF (kept across re-creations, so a trap does not
    /// refill it).
    pub fn new(
        nf: Arc<str>,
        owner: Option<Arc<crate::owner::NfOwner>>,
        memory_bytes: u64,
        limiter: Arc<Mutex<LogLimiter>>,
        deadline: std::time::Duration,
        tick: std::time::Duration,
    ) -> Self {
        let log_dropped = limiter.lock().dropped();
        // No preopened directories, no environment, no arguments, no
        // sockets, no name lookups, frozen clocks: the only inputs an NF has
        // are its config and its batches. Randomness stays (guest std hash
        // maps need it) but is seeded, so runs are reproducible.
        let wasi = WasiCtxBuilder::new()
            .stdout(GuestOutput::new(nf.clone(), owner.clone(), Stream::Stdout, limiter.clone()))
            .stderr(GuestOutput::new(nf.clone(), owner.clone(), Stream::Stderr, limiter.clone()))
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .socket_addr_check(|_, _| Box::pin(async { false }))
            .wall_clock(FrozenClock)
            .monotonic_clock(FrozenClock)
            .insecure_random_seed(0x05ee_d0f5_11ce)
            .build();
        let limits = StoreLimitsBuilder::new()
            .memory_size(usize::try_from(memory_bytes).unwrap_or(usize::MAX))
            .trap_on_grow_failure(true)
            .instances(64)
            .tables(16)
            .memories(4)
            .build();
        HostState {
            wasi,
            table: ResourceTable::new(),
            limits,
            nf,
            owner,
            limiter,
            log_dropped,
            events: Vec::new(),
            events_dropped: 0,
            event_bytes: 0,
            tables: None,
            offload: crate::offload::Calls::default(),
            deadline: CpuDeadline { limit: deadline, tick, mark: None },
        }
    }

    /// Log lines dropped by the rate limit so far.
    pub fn log_dropped(&self) -> u64 {
        self.log_dropped.load(Ordering::Relaxed)
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

impl types::Host for HostState {}

impl host_log::Host for HostState {
    fn log(&mut self, level: Level, mut message: String) {
        if message.len() > MAX_LOG_LINE {
            let mut cut = MAX_LOG_LINE;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
            message.push_str(" [cut]");
        }
        let name = crate::bindings::level_name(level);
        let allowed = self.limiter.lock().admit(name, "host-log", &message);
        if !allowed {
            return;
        }
        let nf = &*self.nf;
        let (tenant, deployment, version) = crate::owner::NfOwner::fields(self.owner.as_deref());
        match level {
            Level::Debug => tracing::debug!(target: "sluice::guest", nf, tenant, deployment, version, "{message}"),
            Level::Info => tracing::info!(target: "sluice::guest", nf, tenant, deployment, version, "{message}"),
            Level::Warn => tracing::warn!(target: "sluice::guest", nf, tenant, deployment, version, "{message}"),
            Level::Error => tracing::error!(target: "sluice::guest", nf, tenant, deployment, version, "{message}"),
        }
    }

    fn emit(&mut self, events: Vec<Event>) {
        for e in events {
            let size = event_size(&e);
            // `sluice.` kinds are the host's own (logs, traps): an NF may not
            // pass its events off as them.
            if size > MAX_EVENT_BYTES
                || e.kind.starts_with("sluice.")
                || self.events.len() >= MAX_EVENTS_PER_BATCH
                || self.event_bytes.saturating_add(size) > MAX_EVENT_BYTES_PER_BATCH
            {
                self.events_dropped += 1;
                continue;
            }
            self.event_bytes += size;
            self.events.push(e);
        }
    }
}

impl host_log_v2::Host for HostState {
    fn log(&mut self, level: Level, message: String) {
        host_log::Host::log(self, level, message)
    }

    fn emit(&mut self, events: Vec<Event>) {
        host_log::Host::emit(self, events)
    }
}

impl host_log_v3::Host for HostState {
    fn log(&mut self, level: Level, message: String) {
        host_log::Host::log(self, level, message)
    }

    fn emit(&mut self, events: Vec<Event>) {
        host_log::Host::emit(self, events)
    }
}

/// A 0.3.0 table spec: 0.2.0's, or a single-writer table (the one case
/// 0.2.0 does not have).
fn spec_from_wit_v3(s: wit_state_v3::TableSpec) -> TableSpec {
    use wit_state_v3 as w;
    let (consistency, single) = match s.consistency {
        w::Consistency::Local => (wit_state::Consistency::Local, None),
        w::Consistency::Eventual(e) => (
            wit_state::Consistency::Eventual(wit_state::EventualSpec {
                merge: match e.merge {
                    w::Merge::Sum => wit_state::Merge::Sum,
                    w::Merge::Max => wit_state::Merge::Max,
                    w::Merge::Min => wit_state::Merge::Min,
                },
                merge_interval_ns: e.merge_interval_ns,
            }),
            None,
        ),
        w::Consistency::Release(p) => (
            wit_state::Consistency::Release(wit_state::PoolSpec { first: p.first, count: p.count, chunk: p.chunk }),
            None,
        ),
        w::Consistency::SingleWriter(sw) => (wit_state::Consistency::Local, Some(sw.sync_interval_ns)),
    };
    let mut spec = spec_from_wit(wit_state::TableSpec {
        name: s.name,
        scope: match s.scope {
            w::Scope::PerFlow => wit_state::Scope::PerFlow,
            w::Scope::Global => wit_state::Scope::Global,
        },
        access: match s.access {
            w::Access::ReadOnly => wit_state::Access::ReadOnly,
            w::Access::ReadWrite => wit_state::Access::ReadWrite,
        },
        kind: match s.kind {
            w::ValueKind::Counter => wit_state::ValueKind::Counter,
            w::ValueKind::Bytes => wit_state::ValueKind::Bytes,
        },
        consistency,
        key_size: s.key_size,
        max_value_size: s.max_value_size,
        capacity: s.capacity,
        idle_timeout_ns: s.idle_timeout_ns,
        notify_expired: s.notify_expired,
    });
    if let Some(sync_interval_ns) = single {
        spec.consistency = sluice_state::Consistency::SingleWriter { sync_interval_ns };
    }
    spec
}

fn error_to_wit_v3(e: wit_state::StateError) -> wit_state_v3::StateError {
    use wit_state::StateError as E;
    use wit_state_v3::StateError as W;
    match e {
        E::UnknownTable(t) => W::UnknownTable(t),
        E::NotNow => W::NotNow,
        E::WrongKind => W::WrongKind,
        E::BadSpec(m) => W::BadSpec(m),
        E::Incompatible(m) => W::Incompatible(m),
        E::BadInput(i) => W::BadInput(i),
        E::Full(i) => W::Full(i),
        E::OverBudget(i) => W::OverBudget(i),
        E::TooLarge(i) => W::TooLarge(i),
    }
}

/// 0.3.0's `state`: the same calls as 0.2.0's, on the same tables.
impl wit_state_v3::Host for HostState {
    fn declare(&mut self, spec: wit_state_v3::TableSpec) -> Result<u32, wit_state_v3::StateError> {
        self.state(|t| t.declare(spec_from_wit_v3(spec))).map_err(error_to_wit_v3)
    }

    fn counter_add(&mut self, table: u32, keys: Vec<u64>, deltas: Vec<i64>) -> Result<(), wit_state_v3::StateError> {
        wit_state::Host::counter_add(self, table, keys, deltas).map_err(error_to_wit_v3)
    }

    fn counter_get(&mut self, table: u32, keys: Vec<u64>) -> Result<Vec<u64>, wit_state_v3::StateError> {
        wit_state::Host::counter_get(self, table, keys).map_err(error_to_wit_v3)
    }

    fn get_many(&mut self, table: u32, keys: Vec<u8>) -> Result<Vec<u8>, wit_state_v3::StateError> {
        wit_state::Host::get_many(self, table, keys).map_err(error_to_wit_v3)
    }

    fn put_many(&mut self, table: u32, entries: Vec<u8>) -> Result<(), wit_state_v3::StateError> {
        wit_state::Host::put_many(self, table, entries).map_err(error_to_wit_v3)
    }

    fn acquire(&mut self, table: u32, values: Vec<u8>) -> Result<Vec<u64>, wit_state_v3::StateError> {
        wit_state::Host::acquire(self, table, values).map_err(error_to_wit_v3)
    }

    fn lookup(&mut self, table: u32, resources: Vec<u64>) -> Result<Vec<u8>, wit_state_v3::StateError> {
        wit_state::Host::lookup(self, table, resources).map_err(error_to_wit_v3)
    }

    fn release(&mut self, table: u32, resources: Vec<u64>) -> Result<(), wit_state_v3::StateError> {
        wit_state::Host::release(self, table, resources).map_err(error_to_wit_v3)
    }
}

/// `host-log` and `state` of 0.4.0, and of every later version that keeps
/// them field for field: one body, bound to each version's generated types
/// (wasmtime registers an interface's functions under its own version, so
/// each version has its own bindings). `state` is 0.3.0's calls on the same
/// tables, plus `scan` and `top-k`.
macro_rules! state_of_0_4 {
    ($($log:ident)::+, $($w:ident)::+) => {
        const _: () = {
            use $($w)::+ as w;

            impl $($log)::+::Host for HostState {
                fn log(&mut self, level: Level, message: String) {
                    host_log::Host::log(self, level, message)
                }

                fn emit(&mut self, events: Vec<Event>) {
                    host_log::Host::emit(self, events)
                }
            }

            /// A table spec of this version: 0.3.0's, field for field.
            fn spec(s: w::TableSpec) -> TableSpec {
                use wit_state_v3 as v3;
                spec_from_wit_v3(v3::TableSpec {
                    name: s.name,
                    scope: match s.scope {
                        w::Scope::PerFlow => v3::Scope::PerFlow,
                        w::Scope::Global => v3::Scope::Global,
                    },
                    access: match s.access {
                        w::Access::ReadOnly => v3::Access::ReadOnly,
                        w::Access::ReadWrite => v3::Access::ReadWrite,
                    },
                    kind: match s.kind {
                        w::ValueKind::Counter => v3::ValueKind::Counter,
                        w::ValueKind::Bytes => v3::ValueKind::Bytes,
                    },
                    consistency: match s.consistency {
                        w::Consistency::Local => v3::Consistency::Local,
                        w::Consistency::Eventual(e) => v3::Consistency::Eventual(v3::EventualSpec {
                            merge: match e.merge {
                                w::Merge::Sum => v3::Merge::Sum,
                                w::Merge::Max => v3::Merge::Max,
                                w::Merge::Min => v3::Merge::Min,
                            },
                            merge_interval_ns: e.merge_interval_ns,
                        }),
                        w::Consistency::Release(p) => {
                            v3::Consistency::Release(v3::PoolSpec { first: p.first, count: p.count, chunk: p.chunk })
                        }
                        w::Consistency::SingleWriter(sw) => {
                            v3::Consistency::SingleWriter(v3::SingleWriterSpec { sync_interval_ns: sw.sync_interval_ns })
                        }
                    },
                    key_size: s.key_size,
                    max_value_size: s.max_value_size,
                    capacity: s.capacity,
                    idle_timeout_ns: s.idle_timeout_ns,
                    notify_expired: s.notify_expired,
                })
            }

            fn error(e: StateError) -> w::StateError {
                use w::StateError as W;
                match e {
                    StateError::UnknownTable(t) => W::UnknownTable(t),
                    StateError::NotNow => W::NotNow,
                    StateError::WrongKind => W::WrongKind,
                    StateError::BadSpec(m) => W::BadSpec(m),
                    StateError::Incompatible(m) => W::Incompatible(m),
                    StateError::BadInput(i) => W::BadInput(i),
                    StateError::Full(i) => W::Full(i),
                    StateError::OverBudget(i) => W::OverBudget(i),
                    StateError::TooLarge(i) => W::TooLarge(i),
                }
            }

            /// Runs a state call on the tables moved in for this call.
            fn with<R>(
                h: &mut HostState,
                f: impl FnOnce(&mut Tables) -> Result<R, StateError>,
            ) -> Result<R, w::StateError> {
                match h.tables.as_deref_mut() {
                    Some(t) => f(t).map_err(error),
                    None => Err(w::StateError::NotNow),
                }
            }

            impl w::Host for HostState {
                fn declare(&mut self, s: w::TableSpec) -> Result<u32, w::StateError> {
                    with(self, |t| t.declare(spec(s)))
                }

                fn counter_add(&mut self, table: u32, keys: Vec<u64>, deltas: Vec<i64>) -> Result<(), w::StateError> {
                    with(self, |t| t.counter_add(table, &keys, &deltas))
                }

                fn counter_get(&mut self, table: u32, keys: Vec<u64>) -> Result<Vec<u64>, w::StateError> {
                    with(self, |t| {
                        let mut out = Vec::with_capacity(keys.len());
                        t.counter_get(table, &keys, &mut out).map(|()| out)
                    })
                }

                fn get_many(&mut self, table: u32, keys: Vec<u8>) -> Result<Vec<u8>, w::StateError> {
                    with(self, |t| {
                        let mut out = Vec::with_capacity(keys.len());
                        t.get_many(table, &keys, &mut out).map(|()| out)
                    })
                }

                fn put_many(&mut self, table: u32, entries: Vec<u8>) -> Result<(), w::StateError> {
                    with(self, |t| t.put_many(table, &entries))
                }

                fn acquire(&mut self, table: u32, values: Vec<u8>) -> Result<Vec<u64>, w::StateError> {
                    with(self, |t| {
                        let mut out = Vec::new();
                        t.acquire(table, &values, &mut out).map(|()| out)
                    })
                }

                fn lookup(&mut self, table: u32, resources: Vec<u64>) -> Result<Vec<u8>, w::StateError> {
                    with(self, |t| {
                        let mut out = Vec::new();
                        t.lookup(table, &resources, &mut out).map(|()| out)
                    })
                }

                fn release(&mut self, table: u32, resources: Vec<u64>) -> Result<(), w::StateError> {
                    with(self, |t| t.release(table, &resources))
                }

                fn scan(&mut self, table: u32, cursor: Vec<u8>, limit: u32) -> Result<w::ScanPage, w::StateError> {
                    with(self, |t| t.scan(table, &cursor, limit)).map(|p| w::ScanPage {
                        counters: p.counters,
                        entries: p.entries,
                        cursor: p.cursor,
                    })
                }

                fn top_k(&mut self, table: u32, k: u32) -> Result<Vec<(u64, u64)>, w::StateError> {
                    with(self, |t| t.top_k(table, k))
                }
            }
        };
    };
}

state_of_0_4!(crate::bindings::v0_4::sluice::nf::host_log, crate::bindings::v0_4::sluice::nf::state);
state_of_0_4!(crate::bindings::v0_5::sluice::nf::host_log, crate::bindings::v0_5::sluice::nf::state);
state_of_0_4!(crate::bindings::v0_6::sluice::nf::host_log, crate::bindings::v0_6::sluice::nf::state);
state_of_0_4!(crate::bindings::v0_7::sluice::nf::host_log, crate::bindings::v0_7::sluice::nf::state);

fn spec_from_wit(s: wit_state::TableSpec) -> TableSpec {
    use sluice_state::{Access, Consistency, Kind, Merge, Scope};
    let merge = |m: wit_state::Merge| match m {
        wit_state::Merge::Sum => Merge::Sum,
        wit_state::Merge::Max => Merge::Max,
        wit_state::Merge::Min => Merge::Min,
    };
    TableSpec {
        name: s.name,
        scope: match s.scope {
            wit_state::Scope::PerFlow => Scope::PerFlow,
            wit_state::Scope::Global => Scope::Global,
        },
        access: match s.access {
            wit_state::Access::ReadOnly => Access::ReadOnly,
            wit_state::Access::ReadWrite => Access::ReadWrite,
        },
        kind: match s.kind {
            wit_state::ValueKind::Counter => Kind::Counter,
            wit_state::ValueKind::Bytes => Kind::Bytes,
        },
        consistency: match s.consistency {
            wit_state::Consistency::Local => Consistency::Local,
            wit_state::Consistency::Eventual(e) => {
                Consistency::Eventual { merge: merge(e.merge), merge_interval_ns: e.merge_interval_ns }
            }
            wit_state::Consistency::Release(p) => {
                Consistency::Release { first: p.first, count: p.count, chunk: p.chunk }
            }
        },
        key_size: s.key_size,
        max_value_size: s.max_value_size,
        capacity: s.capacity,
        idle_timeout_ns: s.idle_timeout_ns,
        notify_expired: s.notify_expired,
    }
}

fn error_to_wit(e: StateError) -> wit_state::StateError {
    use wit_state::StateError as W;
    match e {
        StateError::UnknownTable(t) => W::UnknownTable(t),
        StateError::NotNow => W::NotNow,
        StateError::WrongKind => W::WrongKind,
        StateError::BadSpec(m) => W::BadSpec(m),
        StateError::Incompatible(m) => W::Incompatible(m),
        StateError::BadInput(i) => W::BadInput(i),
        StateError::Full(i) => W::Full(i),
        StateError::OverBudget(i) => W::OverBudget(i),
        StateError::TooLarge(i) => W::TooLarge(i),
    }
}

impl HostState {
    /// Runs a state call on the tables that are moved in for this call.
    fn state<R>(&mut self, f: impl FnOnce(&mut Tables) -> Result<R, StateError>) -> Result<R, wit_state::StateError> {
        match self.tables.as_deref_mut() {
            Some(t) => f(t).map_err(error_to_wit),
            // Only reachable if a guest calls in while the host holds the
            // tables, which the call protocol rules out.
            None => Err(wit_state::StateError::NotNow),
        }
    }
}

impl wit_state::Host for HostState {
    fn declare(&mut self, spec: wit_state::TableSpec) -> Result<wit_state::Table, wit_state::StateError> {
        self.state(|t| t.declare(spec_from_wit(spec)))
    }

    fn counter_add(
        &mut self,
        table: wit_state::Table,
        keys: Vec<u64>,
        deltas: Vec<i64>,
    ) -> Result<(), wit_state::StateError> {
        self.state(|t| t.counter_add(table, &keys, &deltas))
    }

    fn counter_get(&mut self, table: wit_state::Table, keys: Vec<u64>) -> Result<Vec<u64>, wit_state::StateError> {
        self.state(|t| {
            let mut out = Vec::with_capacity(keys.len());
            t.counter_get(table, &keys, &mut out).map(|()| out)
        })
    }

    fn get_many(&mut self, table: wit_state::Table, keys: Vec<u8>) -> Result<Vec<u8>, wit_state::StateError> {
        self.state(|t| {
            let mut out = Vec::with_capacity(keys.len());
            t.get_many(table, &keys, &mut out).map(|()| out)
        })
    }

    fn put_many(&mut self, table: wit_state::Table, entries: Vec<u8>) -> Result<(), wit_state::StateError> {
        self.state(|t| t.put_many(table, &entries))
    }

    fn acquire(&mut self, table: wit_state::Table, values: Vec<u8>) -> Result<Vec<u64>, wit_state::StateError> {
        self.state(|t| {
            let mut out = Vec::new();
            t.acquire(table, &values, &mut out).map(|()| out)
        })
    }

    fn lookup(&mut self, table: wit_state::Table, resources: Vec<u64>) -> Result<Vec<u8>, wit_state::StateError> {
        self.state(|t| {
            let mut out = Vec::new();
            t.lookup(table, &resources, &mut out).map(|()| out)
        })
    }

    fn release(&mut self, table: wit_state::Table, resources: Vec<u64>) -> Result<(), wit_state::StateError> {
        self.state(|t| t.release(table, &resources))
    }
}

/// `offload` of 0.5.0 and later (the same interface, field for field, in
/// each version's bindings; 0.7.0 has no `returned`, its returns come in
/// the batch frame): requests, revokes and returns of the current call
/// (see [`crate::offload`]).
macro_rules! offload_of_0_5 {
    ($($o:ident)::+ $(, $returned:ident)?) => {
        const _: () = {
            use $($o)::+ as wit_offload;

        impl wit_offload::Host for HostState {
            fn offload(&mut self, requests: Vec<wit_offload::OffloadRequest>) -> Vec<Result<(), wit_offload::OffloadError>> {
                use crate::offload::Refusal;
                use sluice_wire::abi::{OffloadRecord, OpRecord};
                use wit_offload::{OffloadError as E, RewriteOp as W};
                // Each change as the result frame of 0.7.0 carries it, so
                // that one decoder checks both.
                let record = |op: &W| {
                    let (kind, endpoint, dscp) = match op {
                        W::Source(e) => (0, Some(e), 0),
                        W::Destination(e) => (1, Some(e), 0),
                        W::DecrementTtl => (2, None, 0),
                        W::SetDscp(d) => (3, None, *d),
                    };
                    let mut address = [0u8; 16];
                    let given = endpoint.map_or(&[][..], |e| e.address.as_slice());
                    if let Some(a) = address.get_mut(..given.len()) {
                        a.copy_from_slice(given);
                    }
                    OpRecord {
                        kind,
                        address_len: u8::try_from(given.len()).unwrap_or(u8::MAX),
                        address,
                        port: endpoint.and_then(|e| e.port),
                        dscp,
                    }
                };
                requests
                    .into_iter()
                    .map(|r| {
                        let head = OffloadRecord::new(
                            r.packet,
                            r.return_counts,
                            [r.idle_timeout_ns, r.max_packets, r.max_bytes, r.max_age_ns],
                        );
                        self.offload.offload_ops(&head, r.rewrites.iter().map(record)).map_err(|e| match e {
                            Refusal::NotNow => E::NotNow,
                            Refusal::BadPacket => E::BadPacket,
                            Refusal::NotOffloadable(why) => E::NotOffloadable(why.to_string()),
                            Refusal::BadRewrite(why) => E::BadRewrite(why),
                            Refusal::OverBudget => E::OverBudget,
                        })
                    })
                    .collect()
            }

            fn revoke(&mut self, flow_hashes: Vec<u64>) {
                if self.offload.open {
                    // A hash names at most one flow: more than a batch's worth of
                    // flows cannot name more entries than the NF holds.
                    self.offload.revoked.extend(flow_hashes.into_iter().take(sluice_wire::abi::MAX_BATCH * 16));
                }
            }

            fn revoke_all(&mut self) {
                if self.offload.open {
                    self.offload.revoke_all = true;
                }
            }

            $(fn $returned(&mut self) -> Vec<wit_offload::OffloadReturn> {
                use crate::offload::EndReason as R;
                use wit_offload::EndReason as W;
                std::mem::take(&mut self.offload.returns)
                    .into_iter()
                    .map(|(r, flow)| wit_offload::OffloadReturn {
                        flow,
                        flow_hash: r.key.hash_normalized(),
                        key: r.key.to_bytes().to_vec(),
                        reverse: r.reverse,
                        packets: r.packets,
                        bytes: r.bytes,
                        reason: match r.reason {
                            R::Closed => W::Closed,
                            R::Limit => W::Limit,
                            R::Idle => W::Idle,
                            R::Revoked => W::Revoked,
                            R::Replaced => W::Replaced,
                        },
                    })
                    .collect()
            })?
        }
        };
    };
}

offload_of_0_5!(crate::bindings::v0_5::sluice::nf::offload, returned);
offload_of_0_5!(crate::bindings::v0_6::sluice::nf::offload, returned);
offload_of_0_5!(crate::bindings::v0_7::sluice::nf::offload);
