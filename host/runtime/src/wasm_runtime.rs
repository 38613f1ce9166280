//! The Wasm runtime of a host ([`Runtime`]): the wasmtime engine shared by
//! all its NFs, its linker and code caches, and its epoch ticker.

use crate::error::RuntimeError;
use crate::host::HostState;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;
use wasmtime::component::Linker;
use wasmtime::{Cache, CacheConfig, Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

/// Engine-wide settings. Per-NF limits are in [`crate::NfLimits`].
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// Directory of the compiled-code cache (keyed by a hash of the module
    /// bytes and the compiler settings) in its `modules/`, and the
    /// compiled-function cache in its `functions/` (see
    /// [`crate::function_cache`]); `None` disables both.
    pub cache_dir: Option<PathBuf>,
    /// Largest memory any instance may have: the pooling allocator's slot
    /// size. Each NF's own cap must not exceed it.
    pub max_memory_bytes: u64,
    /// Instances the pool holds (NFs × workers, plus re-creations in
    /// flight).
    pub max_instances: u32,
    /// Whether fuel metering is compiled in (needed by any NF with a fuel
    /// limit; costs every NF some speed).
    pub fuel: bool,
    /// Epoch tick: the granularity of batch deadlines.
    pub epoch_tick: Duration,
    /// Whether each NF's log lines (guest stdout/stderr and `host-log`)
    /// and traps are also kept as events of kind `log` and `trap` for the
    /// NF's tenant (hosts under `serve`), within the NF's log rate.
    pub nf_logs_as_events: bool,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            cache_dir: None,
            max_memory_bytes: 256 << 20,
            max_instances: 128,
            fuel: false,
            epoch_tick: Duration::from_millis(1),
            nf_logs_as_events: false,
        }
    }
}

/// Increments the engine's epoch every tick so that deadlines fire.
struct EpochTicker {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl EpochTicker {
    fn start(engine: Engine, tick: Duration) -> Result<Self, RuntimeError> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::Builder::new()
            .name("sluice-epoch".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    std::thread::sleep(tick);
                    engine.increment_epoch();
                }
            })
            .map_err(|e| RuntimeError::Engine(format!("cannot start the epoch thread: {e}")))?;
        Ok(EpochTicker { stop, handle: Some(handle) })
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// The engine, linker and epoch ticker. One per host process; NF modules
/// loaded through it share compiled code across workers.
pub struct Runtime {
    pub(crate) engine: Engine,
    pub(crate) linker: Linker<HostState>,
    pub(crate) config: RuntimeConfig,
    cache: Option<Cache>,
    /// Components loaded, by digest, while a module of them lives: every
    /// deployment of the same bytes runs the same machine code (one copy
    /// in the caches, not one per tenant).
    pub(crate) loaded: parking_lot::Mutex<std::collections::HashMap<String, std::sync::Weak<crate::pre::Pre>>>,
    /// Shared by all instances: creating a clock calibrates it, which is
    /// too slow to repeat per instance.
    pub(crate) clock: quanta::Clock,
    _ticker: EpochTicker,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").field("config", &self.config).finish_non_exhaustive()
    }
}

impl Runtime {
    /// Creates the engine: Cranelift, component model (without async
    /// support, which slows every call), pooling allocator, epoch
    /// interruption, optional fuel, optional on-disk code cache.
    pub fn new(config: RuntimeConfig) -> Result<Self, RuntimeError> {
        let mut c = Config::new();
        c.wasm_component_model(true);
        c.epoch_interruption(true);
        c.consume_fuel(config.fuel);
        c.cranelift_opt_level(wasmtime::OptLevel::Speed);
        let mut pool = PoolingAllocationConfig::default();
        let n = config.max_instances.max(1);
        pool.total_component_instances(n)
            .total_core_instances(n.saturating_mul(8))
            .total_memories(n.saturating_mul(2))
            .total_tables(n.saturating_mul(4))
            .total_stacks(n)
            .max_memories_per_component(4)
            .max_tables_per_component(8)
            .max_core_instances_per_component(64)
            .max_memory_size(usize::try_from(config.max_memory_bytes).unwrap_or(usize::MAX));
        c.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        let mut cache = None;
        if let Some(dir) = &config.cache_dir {
            std::fs::create_dir_all(dir)
                .map_err(|e| RuntimeError::Engine(format!("cannot create cache dir {}: {e}", dir.display())))?;
            let dir = std::path::absolute(dir)
                .map_err(|e| RuntimeError::Engine(format!("cache dir {}: {e}", dir.display())))?;
            // Wasmtime's module cache removes what it does not know from
            // its directory: the two caches get one each.
            let mut cc = CacheConfig::new();
            cc.with_directory(dir.join("modules"));
            let cache_handle_new =
                Cache::new(cc).map_err(|e| RuntimeError::Engine(format!("code cache in {}: {e}", dir.display())))?;
            c.cache(Some(cache_handle_new.clone()));
            cache = Some(cache_handle_new);
            // Beside it, compiled functions: a component that differs
            // from one compiled before in a few functions (or only in its
            // data) compiles only those.
            let functions = dir.join("functions");
            let store = crate::function_cache::FunctionCache::open(&functions)
                .map_err(|e| RuntimeError::Engine(format!("function cache in {}: {e}", functions.display())))?;
            c.enable_incremental_compilation(Arc::new(store)).map_err(|e| RuntimeError::Engine(format!("{e:#}")))?;
        }
        let engine = Engine::new(&c).map_err(|e| RuntimeError::Engine(format!("{e:#}")))?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker).map_err(|e| RuntimeError::Engine(format!("{e:#}")))?;
        // Every released contract version: a component picks its own.
        crate::bindings::v0_1::NetworkFunction::add_to_linker::<HostState, wasmtime::component::HasSelf<HostState>>(
            &mut linker,
            |s| s,
        )
        .map_err(|e| RuntimeError::Engine(format!("{e:#}")))?;
        crate::bindings::v0_2::NetworkFunction::add_to_linker::<HostState, wasmtime::component::HasSelf<HostState>>(
            &mut linker,
            |s| s,
        )
        .map_err(|e| RuntimeError::Engine(format!("{e:#}")))?;
        crate::bindings::v0_3::NetworkFunction::add_to_linker::<HostState, wasmtime::component::HasSelf<HostState>>(
            &mut linker,
            |s| s,
        )
        .map_err(|e| RuntimeError::Engine(format!("{e:#}")))?;
        crate::bindings::v0_4::NetworkFunction::add_to_linker::<HostState, wasmtime::component::HasSelf<HostState>>(
            &mut linker,
            |s| s,
        )
        .map_err(|e| RuntimeError::Engine(format!("{e:#}")))?;
        crate::bindings::v0_5::NetworkFunction::add_to_linker::<HostState, wasmtime::component::HasSelf<HostState>>(
            &mut linker,
            |s| s,
        )
        .map_err(|e| RuntimeError::Engine(format!("{e:#}")))?;
        crate::bindings::v0_6::NetworkFunction::add_to_linker::<HostState, wasmtime::component::HasSelf<HostState>>(
            &mut linker,
            |s| s,
        )
        .map_err(|e| RuntimeError::Engine(format!("{e:#}")))?;
        crate::bindings::v0_7::NetworkFunction::add_to_linker::<HostState, wasmtime::component::HasSelf<HostState>>(
            &mut linker,
            |s| s,
        )
        .map_err(|e| RuntimeError::Engine(format!("{e:#}")))?;
        let ticker = EpochTicker::start(engine.clone(), config.epoch_tick)?;
        Ok(Runtime {
            engine,
            linker,
            config,
            cache,
            loaded: parking_lot::Mutex::new(std::collections::HashMap::new()),
            clock: quanta::Clock::new(),
            _ticker: ticker,
        })
    }

    /// The engine's settings.
    pub fn config(&self) -> &RuntimeConfig {
        &self.config
    }

    /// Compiled-code cache hits and misses so far (when the cache is on).
    pub fn cache_stats(&self) -> Option<(usize, usize)> {
        self.cache.as_ref().map(|c| (c.cache_hits(), c.cache_misses()))
    }
}
