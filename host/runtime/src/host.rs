//! The per-instance host state and the `sluice:nf` imports.

use crate::bindings::sluice::nf::{host_log, types};
use crate::bindings::{Event, Level};
use crate::guest_io::{GuestOutput, LogLimiter, Stream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use wasmtime::{StoreLimits, StoreLimitsBuilder};
use wasmtime_wasi::{ResourceTable, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

/// Events emitted per batch beyond which further events are dropped and
/// counted; an IDS under attack must not turn the host into an event pump.
pub const MAX_EVENTS_PER_BATCH: usize = 1024;

/// What a store holds for one NF instance.
pub struct HostState {
    wasi: WasiCtx,
    table: ResourceTable,
    pub(crate) limits: StoreLimits,
    nf: Arc<str>,
    limiter: Arc<Mutex<LogLimiter>>,
    log_dropped: Arc<AtomicU64>,
    /// Events of the current call.
    pub(crate) events: Vec<Event>,
    /// Events dropped by the per-batch cap.
    pub(crate) events_dropped: u64,
}

/// A wall and monotonic clock that always reads zero: NFs get time only
/// from packet timestamps, which keeps replays deterministic.
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
        0
    }
}

impl HostState {
    /// State for a new instance of NF `nf` with a memory cap and a log rate.
    pub fn new(nf: Arc<str>, memory_bytes: u64, log_lines_per_second: u32) -> Self {
        let log_limiter = LogLimiter::new(log_lines_per_second);
        let log_dropped = log_limiter.dropped();
        let limiter = Arc::new(Mutex::new(log_limiter));
        // No preopened directories, no environment, no arguments, no
        // sockets, no name lookups, frozen clocks: the only inputs an NF has
        // are its config and its batches. Randomness stays (guest std hash
        // maps need it) but is seeded, so runs are reproducible.
        let wasi = WasiCtxBuilder::new()
            .stdout(GuestOutput::new(nf.clone(), Stream::Stdout, limiter.clone()))
            .stderr(GuestOutput::new(nf.clone(), Stream::Stderr, limiter.clone()))
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
            limiter,
            log_dropped,
            events: Vec::new(),
            events_dropped: 0,
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
    fn log(&mut self, level: Level, message: String) {
        let allowed = self.limiter.lock().map(|mut l| l.allow()).unwrap_or(false);
        if !allowed {
            return;
        }
        let nf = &*self.nf;
        match level {
            Level::Debug => tracing::debug!(target: "sluice::guest", nf, "{message}"),
            Level::Info => tracing::info!(target: "sluice::guest", nf, "{message}"),
            Level::Warn => tracing::warn!(target: "sluice::guest", nf, "{message}"),
            Level::Error => tracing::error!(target: "sluice::guest", nf, "{message}"),
        }
    }

    fn emit(&mut self, events: Vec<Event>) {
        let room = MAX_EVENTS_PER_BATCH.saturating_sub(self.events.len());
        let n = events.len();
        self.events.extend(events.into_iter().take(room));
        self.events_dropped += n.saturating_sub(room) as u64;
    }
}
