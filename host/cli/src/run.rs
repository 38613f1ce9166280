//! `sluice-host run`: a pcap through a chain of NFs on N workers.
//!
//! Packets are read once into shared memory, cut into chunks, and each
//! chunk's packets are spread over workers by the symmetric flow hash, so
//! both directions of a connection meet the same worker and its flow
//! state. Every worker runs its own instance of every NF, on the shared
//! data path ([`sluice_engine::Dispatch::step_one`] over a [`sluice_engine::CaptureIo`]).
//! Results are put back in input order before writing, so the output is
//! the same for any number of workers.

use crate::chain::ChainDef;
use crate::config::{ConfigError, HostConfig};
use crate::report::{
    BytesEntry, EventLog, InputReport, MAX_REPORTED_ENTRIES, NfReport, Report, SwapRecord, TableReport,
};
use indicatif::{ProgressBar, ProgressStyle};
use sluice_engine::idle::Backoff;
use sluice_engine::{CaptureIo, Dispatch, Driver, Order, PacketIo, Pass, Receive, Unmatched, Worker};
use sluice_pcap::{PcapError, PcapSink, Trace};
use sluice_runtime::{Chain, EmittedEvent, Fate, NfSpec, PacketResult, Runtime, RuntimeError};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// Errors that stop a run before or while it processes packets.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Configuration.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Loading or starting an NF.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// Reading or writing a capture.
    #[error(transparent)]
    Pcap(#[from] PcapError),
    /// Bad arguments.
    #[error("{0}")]
    Usage(String),
    /// A worker thread died.
    #[error("worker {0} stopped unexpectedly; see the log above")]
    Worker(usize),
}

/// A hot swap during a run: before packet `at`, NF `nf` becomes `module`.
#[derive(Debug, Clone)]
pub struct SwapAt {
    /// Index of the first packet the new version processes.
    pub at: usize,
    /// Name of the NF in the chain.
    pub nf: String,
    /// The new version's component.
    pub module: PathBuf,
}

impl std::str::FromStr for SwapAt {
    type Err = String;

    /// `name=module.wasm@packet`.
    fn from_str(s: &str) -> Result<Self, String> {
        let err = || format!("'{s}': write a swap as <nf>=<module.wasm>@<packet index>");
        let (nf, rest) = s.split_once('=').ok_or_else(err)?;
        let (module, at) = rest.rsplit_once('@').ok_or_else(err)?;
        Ok(SwapAt { at: at.parse().map_err(|_| err())?, nf: nf.to_string(), module: PathBuf::from(module) })
    }
}

/// Jobs for a worker.
enum Job {
    Packets(Vec<usize>),
    Swap(String, Box<NfSpec>),
    /// The first half of a sync point of the single-writer tables: hand
    /// forwarded writes to their owners (every worker, before any syncs).
    HandOver,
    /// The second half: owners apply them and publish (every worker at
    /// once).
    Sync,
}

/// A worker's answers.
enum Reply {
    Done(WorkerOutput),
    Swapped(Result<(), String>),
    Synced,
}

/// Loads the new versions of hot swaps (so a bad module fails the run
/// before it starts); each gets the config of the NF it replaces.
fn load_swaps(
    runtime: &Runtime,
    config: &HostConfig,
    chain: &ChainDef,
    swaps: &[SwapAt],
) -> Result<Vec<(usize, String, NfSpec)>, RunError> {
    let mut out = Vec::new();
    for s in swaps {
        if !chain.nfs.iter().any(|(n, _)| *n == s.nf) {
            return Err(RunError::Usage(format!("--swap names NF '{}', which is not in the chain", s.nf)));
        }
        let bytes = std::fs::read(&s.module).map_err(|source| RuntimeError::Read { path: s.module.clone(), source })?;
        let module = runtime.load(&s.nf, &bytes)?;
        let spec =
            NfSpec { module, config: config.nf_config_bytes(&s.nf)?.into(), limits: config.limits(&s.nf), owner: None };
        out.push((s.at, s.nf.clone(), spec));
    }
    Ok(out)
}

/// What to run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// NF modules of a linear chain, in order (ignored with `chain`).
    pub nfs: Vec<PathBuf>,
    /// A chain file (NFs and their routes) instead of `nfs`.
    pub chain: Option<PathBuf>,
    /// Hot swaps to perform during the run.
    pub swaps: Vec<SwapAt>,
    /// Input capture.
    pub input: PathBuf,
    /// Output capture (forwarded packets).
    pub output: Option<PathBuf>,
    /// Show a progress bar.
    pub progress: bool,
}

struct WorkerOutput {
    results: Vec<(usize, PacketResult)>,
    events: Vec<EmittedEvent>,
    batches: u64,
}

/// Runs the packets with `indices` (in this order) through `w`, batch by
/// batch.
fn run_indices(
    w: &mut Worker,
    dispatch: &mut Dispatch,
    trace: &Trace,
    indices: &[usize],
    batch_size: usize,
) -> WorkerOutput {
    let before = w.batches();
    let mut results = Vec::with_capacity(indices.len());
    let mut events = Vec::new();
    let io = CaptureIo::new(trace, Order::List(indices), |i, _, r: &PacketResult| results.push((i, r.clone())));
    let mut pass = Replay { worker: &mut *w, dispatch, io, batch: batch_size.max(1), events: &mut events };
    Driver::new(Backoff::polling()).run(&mut pass);
    WorkerOutput { results, events, batches: w.batches() - before }
}

/// One pass of a run's worker: a batch of its packets, and the events its
/// NFs emitted.
struct Replay<'w, I> {
    worker: &'w mut Worker,
    dispatch: &'w mut Dispatch,
    io: I,
    batch: usize,
    events: &'w mut Vec<EmittedEvent>,
}

impl<I: PacketIo> Pass for Replay<'_, I> {
    fn pass(&mut self) -> Receive {
        let got = self.dispatch.step_one(&mut self.io, self.batch, self.worker);
        self.events.extend(self.worker.drain_events());
        got
    }
}

/// Where a chunk `start..end` of a run with single-writer tables ends: at
/// its sync point. Interval 0 syncs every `batch` packets of the capture
/// (one worker's batch); otherwise at every multiple of the interval in
/// packet time, and at least every 64 batches. Neither depends on the
/// number of workers, so neither does the output.
fn sync_cut(trace: &Trace, start: usize, end: usize, interval: u64, batch: usize) -> usize {
    let batch = batch.max(1);
    if interval == 0 {
        return end.min(start + batch);
    }
    let end = end.min(start + batch * 64);
    let ts = |i: usize| trace.packets().get(i).map_or(0, |p| p.timestamp_ns);
    let period = ts(start) / interval;
    (start + 1..end).find(|&i| ts(i) / interval != period).unwrap_or(end)
}

/// A finished worker's chain: its offload entries ended (their NFs are
/// handed what passed under them) and its state flushed into the shared
/// domains.
fn finish(w: Worker) -> Chain {
    let mut chain = w.into_chain();
    chain.end_offloads();
    for stage in chain.stages_mut() {
        stage.flush_state();
    }
    chain
}

/// The chain a run asks for: a chain file, or the linear chain of `nfs`.
pub fn chain_def(chain: Option<&Path>, nfs: &[PathBuf]) -> Result<ChainDef, RunError> {
    match chain {
        Some(path) => Ok(ChainDef::load(path)?),
        None if nfs.is_empty() => {
            Err(RunError::Usage("give --nf <module.wasm> (one or more) or --chain <chain.toml>".into()))
        }
        None => Ok(ChainDef::linear(nfs)),
    }
}

/// Loads every NF module of a chain once (compiled code is shared by
/// workers), each named as the chain names it.
pub fn load_specs(runtime: &Runtime, config: &HostConfig, chain: &ChainDef) -> Result<Vec<NfSpec>, RunError> {
    let mut seen = std::collections::HashSet::new();
    let mut specs = Vec::new();
    for (name, path) in &chain.nfs {
        let bytes = std::fs::read(path).map_err(|source| RuntimeError::Read { path: path.clone(), source })?;
        let module = runtime.load(name, &bytes)?;
        let name = module.name().to_string();
        if !seen.insert(name.clone()) {
            return Err(RunError::Usage(format!(
                "NF name '{name}' appears twice in the chain; copy one module under another file name so each has its own [nf.<name>] section"
            )));
        }
        let bytes = config.nf_config_bytes(&name)?;
        specs.push(NfSpec { module, config: bytes.into(), limits: config.limits(&name), owner: None });
    }
    for name in config.nf.keys() {
        if !seen.contains(name) {
            tracing::warn!("config has a section [nf.{name}] but no NF of that name is in the chain");
        }
    }
    Ok(specs)
}

/// Runs the chain over the input and writes the output and report.
pub fn run(config: &HostConfig, opts: &RunOptions) -> Result<Report, RunError> {
    run_observed(config, opts, &mut |_, _| {})
}

/// [`run`], telling `observe` what became of every input packet (its
/// index in the capture and its result), in input order: what `sluice nf
/// test` compares per packet.
pub fn run_observed(
    config: &HostConfig,
    opts: &RunOptions,
    observe: &mut dyn FnMut(usize, &PacketResult),
) -> Result<Report, RunError> {
    let chain = chain_def(opts.chain.as_deref(), &opts.nfs)?;
    if config.batch_size == 0 || config.batch_size > sluice_wire::abi::MAX_BATCH {
        return Err(RunError::Usage(format!(
            "batch size {} is out of range 1..={}",
            config.batch_size,
            sluice_wire::abi::MAX_BATCH
        )));
    }
    let workers = config.workers.clamp(1, 256);
    let cores = config.worker_cores()?;
    sluice_engine::cores::warn_if_oversubscribed(workers, &cores);
    let runtime = Runtime::new(config.runtime())?;
    let specs = load_specs(&runtime, config, &chain)?;
    let swaps = load_swaps(&runtime, config, &chain, &opts.swaps)?;
    let trace = Arc::new(Trace::open(&opts.input)?);
    let sink = match &opts.output {
        Some(p) => Some(PcapSink::create(p)?),
        None => None,
    };

    // Instantiate every worker's chain up front so that a rejected config
    // fails the run before any packet is processed.
    // One state domain per NF, shared by its instances on every worker.
    let domains: Vec<_> = specs.iter().map(|_| sluice_state::Domain::for_workers(workers)).collect();
    // Single-writer tables sync only between chunks, on every worker at
    // the same packet: the output does not depend on thread timing.
    for d in &domains {
        d.set_barrier(true);
    }
    let mut worker_engines = Vec::with_capacity(workers);
    for _ in 0..workers {
        let mut c = chain.instantiate(&runtime, &specs, &domains, &config.outside_ports, config.fragments)?;
        c.watch_translations(workers);
        worker_engines.push(Worker::new(c));
    }

    let total = trace.packets().len();
    let bar = if opts.progress && total >= 100_000 {
        let b = ProgressBar::new(total as u64);
        b.set_style(
            ProgressStyle::with_template("{spinner} {bar:40} {pos}/{len} packets ({per_sec}, eta {eta})")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        b
    } else {
        ProgressBar::hidden()
    };

    let start = Instant::now();
    let mut out = Collector { sink, packets_out: 0, events: EventLog::default() };
    let mut batches = 0u64;
    let chunk_len = config.batch_size * workers * 64;
    // With single-writer tables, chunks end at their sync points.
    let sync_interval = domains.iter().filter_map(|d| d.sync_interval_ns()).min();
    let mut fates: Vec<Option<PacketResult>> = Vec::new();
    let mut swap_records: Vec<SwapRecord> = Vec::new();

    // Dispatch by the spread's symmetric hash (of the flow, or of its two
    // addresses), so both directions of a connection meet one worker;
    // non-IP packets go to worker 0. Every fragment of a
    // datagram goes where its first fragment goes (the flow's worker),
    // whether it comes before or after it: later fragments follow their
    // first, and a datagram is reassembled from all of them on one worker.
    // An ICMP error goes where the connection it quotes goes, as on DPDK.
    let owner: Vec<usize> = if workers == 1 {
        Vec::new()
    } else {
        let spread = config.spread;
        let flow_worker = |data: &[u8]| {
            let quoted = sluice_wire::parse::may_be_icmp(data).then(|| sluice_wire::parse::quoted_key(data)).flatten();
            quoted.or_else(|| sluice_wire::parse(data).key).map(|k| spread.worker(&k, workers))
        };
        let fragments: Vec<Option<sluice_wire::fragment::Fragment>> = trace
            .packets()
            .iter()
            .map(|p| sluice_wire::fragment::inspect(trace.data(p)).and_then(|ip| ip.fragment))
            .collect();
        let mut firsts = std::collections::HashMap::new();
        for (p, f) in trace.packets().iter().zip(&fragments) {
            if let Some(f) = f.filter(|f| f.offset == 0) {
                firsts.entry(f.key).or_insert_with(|| flow_worker(trace.data(p)).unwrap_or(0));
            }
        }
        trace
            .packets()
            .iter()
            .zip(&fragments)
            .map(|(p, f)| match f {
                Some(f) => firsts.get(&f.key).copied().unwrap_or(0),
                None => flow_worker(trace.data(p)).unwrap_or(0),
            })
            .collect()
    };
    // Chunks end at swap points, so a swap takes effect exactly between
    // the packets before and after it, on every worker.
    let mut pending_swaps = swaps.clone();
    pending_swaps.sort_by_key(|s| s.0);
    let runtime = &runtime;
    let collector = &mut out;
    let cores = &cores;
    let batch_size = config.batch_size;
    let result = std::thread::scope(|scope| -> Result<Vec<(Chain, String)>, RunError> {
        let mut to_workers = Vec::new();
        let (done_tx, done_rx) = crossbeam_channel::unbounded::<Reply>();
        let mut handles = Vec::new();
        for (wi, mut w) in worker_engines.drain(..).enumerate() {
            let (tx, rx) = crossbeam_channel::bounded::<Job>(2);
            to_workers.push(tx);
            let done = done_tx.clone();
            let trace = trace.clone();
            handles.push(scope.spawn(move || {
                let on = sluice_engine::cores::pin_worker(&format!("run worker {wi}"), cores.for_worker(wi));
                let mut dispatch = Dispatch::new(Vec::new(), Unmatched::Drop);
                while let Ok(job) = rx.recv() {
                    let reply = match job {
                        Job::Packets(indices) => {
                            Reply::Done(run_indices(&mut w, &mut dispatch, &trace, &indices, batch_size))
                        }
                        Job::Swap(name, spec) => {
                            Reply::Swapped(w.swap(runtime, &name, *spec).map_err(|e| e.to_string()))
                        }
                        Job::HandOver => {
                            for stage in w.chain_mut().stages_mut() {
                                stage.hand_over_state();
                            }
                            Reply::Synced
                        }
                        Job::Sync => {
                            for stage in w.chain_mut().stages_mut() {
                                stage.sync_state();
                            }
                            Reply::Synced
                        }
                    };
                    if done.send(reply).is_err() {
                        break;
                    }
                }
                (finish(w), on)
            }));
        }
        drop(done_tx);
        let mut start_at = 0;
        while start_at < total || pending_swaps.first().is_some_and(|s| s.0 <= start_at) {
            while let Some((at, name, spec)) = pending_swaps.first().cloned().filter(|s| s.0 <= start_at) {
                pending_swaps.remove(0);
                for (wi, tx) in to_workers.iter().enumerate() {
                    tx.send(Job::Swap(name.clone(), Box::new(spec.clone()))).map_err(|_| RunError::Worker(wi))?;
                }
                let mut outcome = Ok(());
                for _ in 0..workers {
                    if let Reply::Swapped(Err(e)) = done_rx.recv().map_err(|_| RunError::Worker(0))? {
                        outcome = Err(e);
                    }
                }
                match &outcome {
                    Ok(()) => tracing::info!(nf = %name, at, digest = %spec.module.digest(), "hot swap done"),
                    Err(e) => tracing::error!(nf = %name, at, "{e}"),
                }
                swap_records.push(SwapRecord {
                    nf: name,
                    at_packet: at as u64,
                    digest: spec.module.digest().to_string(),
                    result: match outcome {
                        Ok(()) => "ok".into(),
                        Err(e) => e,
                    },
                });
            }
            if start_at >= total {
                break;
            }
            let next_swap = pending_swaps.first().map(|s| s.0).unwrap_or(usize::MAX);
            let mut end = (start_at + chunk_len.max(1)).min(total).min(next_swap.max(start_at + 1));
            if let Some(interval) = sync_interval {
                end = sync_cut(&trace, start_at, end, interval, batch_size);
            }
            let mut per: Vec<Vec<usize>> = vec![Vec::new(); workers];
            for i in start_at..end {
                let w = owner.get(i).copied().unwrap_or(0);
                if let Some(v) = per.get_mut(w) {
                    v.push(i);
                }
            }
            for (wi, (tx, idx)) in to_workers.iter().zip(per).enumerate() {
                tx.send(Job::Packets(idx)).map_err(|_| RunError::Worker(wi))?;
            }
            fates.clear();
            fates.resize(end - start_at, None);
            for _ in 0..workers {
                let Reply::Done(done) = done_rx.recv().map_err(|_| RunError::Worker(0))? else { continue };
                batches += done.batches;
                for (i, r) in done.results {
                    if let Some(slot) = fates.get_mut(i - start_at) {
                        *slot = Some(r);
                    }
                }
                collector.events.take(done.events);
            }
            if sync_interval.is_some() {
                // Two phases, each on every worker before the next starts:
                // every forwarded write reaches its owner before any owner
                // applies, so a sync applies all writes made before it.
                let phases: [fn() -> Job; 2] = [|| Job::HandOver, || Job::Sync];
                for phase in phases {
                    for (wi, tx) in to_workers.iter().enumerate() {
                        tx.send(phase()).map_err(|_| RunError::Worker(wi))?;
                    }
                    for _ in 0..workers {
                        done_rx.recv().map_err(|_| RunError::Worker(0))?;
                    }
                }
            }
            collector.write(&trace, start_at..end, &mut fates, observe)?;
            bar.inc((end - start_at) as u64);
            start_at = end;
        }
        drop(to_workers);
        let mut tallies = Vec::new();
        for (wi, h) in handles.into_iter().enumerate() {
            tallies.push(h.join().map_err(|_| RunError::Worker(wi))?);
        }
        Ok(tallies)
    });
    let finished = result?;
    let wall_ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
    bar.finish_and_clear();
    if let Some(s) = out.sink.take() {
        s.finish()?;
    }

    let mut nfs = NfReport::for_chain(&specs);
    for (chain, _) in &finished {
        for (nf, stage) in nfs.iter_mut().zip(chain.stages()) {
            nf.meters.add(stage.meters());
        }
    }
    for (i, (nf, domain)) in nfs.iter_mut().zip(&domains).enumerate() {
        nf.tables = table_reports(finished.iter().filter_map(|(c, _)| c.stages().get(i)), domain);
    }
    let stats = trace.stats();
    let packets_in = total as u64;
    Ok(Report {
        packets_in,
        packets_out: out.packets_out,
        packets_dropped: packets_in - out.packets_out,
        batches,
        traps: nfs.iter().map(|n| n.meters.traps).sum(),
        workers,
        cores: cores.to_string(),
        worker_cores: finished.iter().map(|(_, on)| on.clone()).collect(),
        batch_size: config.batch_size,
        spread: config.spread,
        wall_ns,
        mpps: if wall_ns > 0 { packets_in as f64 * 1e3 / wall_ns as f64 } else { 0.0 },
        output: opts.output.as_ref().map(|p| p.display().to_string()),
        input: InputReport {
            path: opts.input.display().to_string(),
            over_snaplen: stats.over_snaplen,
            skipped_link_type: stats.skipped_link_type,
            truncated_at: stats.truncated_at,
            truncation_reason: stats.truncation_reason.clone(),
        },
        nfs,
        chain: crate::report::ChainReport::of(finished.iter().map(|(c, _)| c)),
        events_total: out.events.total,
        events_by_kind: out.events.by_kind,
        peak_rss_bytes: crate::report::peak_rss_bytes(),
        swaps: swap_records,
        events: out.events.kept,
    })
}

/// The state tables of one NF, over all its workers' instances.
pub fn table_reports<'a>(
    instances: impl Iterator<Item = &'a sluice_runtime::NfInstance>,
    domain: &sluice_state::Domain,
) -> Vec<TableReport> {
    let mut out: Vec<TableReport> = Vec::new();
    for inst in instances {
        let Some(tables) = inst.tables() else { continue };
        for (spec, entries) in tables.tables() {
            match out.iter_mut().find(|t| t.spec.name == spec.name) {
                Some(t) => t.entries += entries as u64,
                None => {
                    // A read-only table is the same on every worker: the
                    // first one's contents stand for all.
                    let read_only = spec.scope == sluice_state::Scope::Global
                        && spec.consistency == sluice_state::Consistency::Local;
                    let mut values = Vec::new();
                    let mut bytes = Vec::new();
                    if read_only {
                        if let Some(mut v) = tables.counters(&spec.name) {
                            v.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
                            v.truncate(MAX_REPORTED_ENTRIES);
                            values = v;
                        }
                        bytes = tables.bytes(&spec.name).map(|b| BytesEntry::list(&b)).unwrap_or_default();
                    }
                    out.push(TableReport { spec: spec.clone(), entries: entries as u64, values, bytes, pool: None })
                }
            }
        }
    }
    let pools = domain.pool_stats();
    for t in &mut out {
        match t.spec.consistency {
            sluice_state::Consistency::Eventual { .. } => {
                let mut values = domain.eventual_snapshot(&t.spec.name).unwrap_or_default();
                t.entries = values.len() as u64;
                values.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
                values.truncate(MAX_REPORTED_ENTRIES);
                t.values = values;
            }
            sluice_state::Consistency::Release { .. } => {
                t.pool = pools.iter().find(|(n, _)| *n == t.spec.name).map(|(_, s)| *s);
                t.entries = t.pool.map(|p| p.bound).unwrap_or(0);
            }
            sluice_state::Consistency::SingleWriter { .. } => {
                // Every worker sees the whole table: count it once.
                let entries = domain.single_snapshot(&t.spec.name).unwrap_or_default();
                t.entries = entries.len() as u64;
                if t.spec.kind == sluice_state::Kind::Counter {
                    let mut values: Vec<(u64, u64)> = entries
                        .iter()
                        .filter_map(|(k, v)| {
                            Some((
                                u64::from_le_bytes(k.as_slice().try_into().ok()?),
                                u64::from_le_bytes(v.as_slice().try_into().ok()?),
                            ))
                        })
                        .collect();
                    values.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
                    values.truncate(MAX_REPORTED_ENTRIES);
                    t.values = values;
                } else {
                    let mut entries = entries;
                    entries.sort_unstable();
                    t.bytes = BytesEntry::list(&entries);
                }
            }
            sluice_state::Consistency::Local => {}
        }
    }
    out
}

/// Where a run's results go: forwarded packets to the output file, events
/// to the report and the debug log ([`EventLog`]).
struct Collector {
    sink: Option<PcapSink>,
    packets_out: u64,
    events: EventLog,
}

impl Collector {
    /// Writes the forwarded packets of input range `range`, in input order.
    fn write(
        &mut self,
        trace: &Trace,
        range: std::ops::Range<usize>,
        fates: &mut Vec<Option<PacketResult>>,
        observe: &mut dyn FnMut(usize, &PacketResult),
    ) -> Result<(), RunError> {
        for (i, r) in range.zip(fates.drain(..)) {
            let Some(r) = r else { continue };
            observe(i, &r);
            if let (Fate::Forward(_), Some(p)) = (&r.fate, trace.packets().get(i)) {
                let original = trace.data(p);
                for frame in r.frames(original) {
                    self.packets_out += 1;
                    if let Some(s) = self.sink.as_mut() {
                        // Unchanged bytes keep their capture's wire length.
                        let wire_len = if std::ptr::eq(frame, original) { p.wire_len } else { frame.len() as u32 };
                        s.write(p.timestamp_ns, wire_len, frame)?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// Writes a report as pretty JSON.
pub fn write_report(report: &impl serde::Serialize, path: &Path) -> Result<(), std::io::Error> {
    let json = serde_json::to_vec_pretty(report).map_err(std::io::Error::other)?;
    std::fs::write(path, json)
}
