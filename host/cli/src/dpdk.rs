//! `sluice-host dpdk`: NFs over DPDK ports.
//!
//! One worker thread per RX/TX queue pair: worker `w` owns queue `w` of
//! every port, with its own instance of every NF. With more than one worker
//! the ports spread flows over queues by RSS with a symmetric key, so both
//! directions of a connection reach the same worker and its flow state
//! (devices without RSS, like most virtual ones, spread by their own rule).
//! Each worker is a [`sluice_engine::Worker`] over its queues
//! ([`sluice_engine::dpdk::DpdkIo`]): it receives up to one batch from each
//! of its queues, runs the chain once over it, and sends each forwarded
//! packet (rewritten in place when an NF changed it) out of its port;
//! dropped packets are freed. Workers are pinned to the EAL's lcores (or
//! `cores`).

use crate::beacon::{BeaconOptions, BeaconPort, Beacons};
use crate::config::HostConfig;
use crate::report::{EventLog, NfReport};
use crate::run::{RunError, load_specs};
use serde::Serialize;
use sluice_dpdk::{DpdkError, Eal, Queue};
use sluice_engine::cores::CoreList;
use sluice_engine::dpdk::{DpdkIo, Egress};
use sluice_engine::handoff::Handoff;
use sluice_engine::idle::Backoff;
use sluice_engine::{Dispatch, Driver, PacketIo, Pass, Receive, Unmatched, Worker};
pub use sluice_engine::{PortReport, QueueCounters};
use sluice_runtime::{Chain, Meters, Runtime};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::{Duration, Instant};

impl From<DpdkError> for RunError {
    fn from(e: DpdkError) -> Self {
        RunError::Usage(e.to_string())
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct DpdkOptions {
    /// NF modules of a linear chain, in order (ignored with `chain`).
    pub nfs: Vec<PathBuf>,
    /// A chain file instead of `nfs`.
    pub chain: Option<PathBuf>,
    /// DPDK port ids to use; empty means every port DPDK found.
    pub ports: Vec<u16>,
    /// Forward port 0 out of the paired port (0↔1, 2↔3, …) instead of the
    /// ingress port.
    pub pairs: bool,
    /// EAL arguments (everything after `--`).
    pub eal_args: Vec<String>,
    /// Stop after this many received packets (over all workers).
    pub max_packets: Option<u64>,
    /// Stop a worker when it has received nothing for this long.
    pub idle_exit: Option<Duration>,
    /// Mbufs in the pool.
    pub mbufs: u32,
    /// RX/TX descriptors per queue.
    pub descriptors: u16,
    /// Time each stage of every batch (see [`sluice_runtime::stages`]);
    /// the report's `stages` gives ns per packet.
    pub stage_times: bool,
}

/// The report of one `sluice-host dpdk` run.
#[derive(Debug, Clone, Serialize)]
pub struct DpdkReport {
    /// Totals over all queues.
    #[serde(flatten)]
    pub totals: QueueCounters,
    /// Batches (chain calls).
    pub batches: u64,
    /// Traps over all NFs.
    pub traps: u64,
    /// Events the NFs emitted.
    pub events_total: u64,
    /// Events by `<nf>/<kind>`, all of them.
    pub events_by_kind: std::collections::BTreeMap<String, u64>,
    /// The first [`crate::report::MAX_REPORTED_EVENTS`] events, in packet
    /// time.
    pub events: Vec<crate::report::EventRecord>,
    /// Workers.
    pub workers: usize,
    /// The cores workers were given (`cores`, else the EAL's lcores).
    pub cores: String,
    /// The cores each worker ran on, as the OS reported its affinity once
    /// pinned.
    pub worker_cores: Vec<String>,
    /// Packets per batch (at most).
    pub batch_size: usize,
    /// Wall time, ns.
    pub wall_ns: u64,
    /// Received Mpps over the wall time.
    pub mpps: f64,
    /// Ports.
    pub ports: Vec<PortReport>,
    /// Per-NF meters.
    pub nfs: Vec<NfReport>,
    /// The chain's order and its own decisions.
    pub chain: crate::report::ChainReport,
    /// With `--stage-times`: ns per packet in each stage, over all workers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stages: Option<sluice_runtime::StagesPerPacket>,
}

impl DpdkReport {
    /// The human-readable summary.
    pub fn summary(&self) -> String {
        let t = &self.totals;
        let mut s = format!(
            "packets: {} rx, {} tx, {} dropped by NFs, {} dropped (TX full), {} dropped (other) | batches: {} | traps: {} | {:.3} Mpps | wall {:.3} s | {} worker(s) on cores {}, batch {}\n",
            t.rx,
            t.tx,
            t.dropped_by_nf,
            t.dropped_tx_full,
            t.dropped_other,
            self.batches,
            self.traps,
            self.mpps,
            self.wall_ns as f64 / 1e9,
            self.workers,
            self.worker_cores.join(" "),
            self.batch_size
        );
        for p in &self.ports {
            s.push_str(&format!(
                "  port {} ({}){}: device rx {} tx {} missed {} rx_nombuf {} errors {}/{}\n",
                p.port,
                p.name,
                if p.rss { ", rss" } else { "" },
                p.ipackets,
                p.opackets,
                p.imissed,
                p.rx_nombuf,
                p.ierrors,
                p.oerrors
            ));
            for (q, c) in p.queues.iter().enumerate() {
                s.push_str(&format!(
                    "    queue {q}: rx {} tx {} dropped by NFs {} TX full {} other {} too big {} | fragments added {}, held for reassembly {}\n",
                    c.rx, c.tx, c.dropped_by_nf, c.dropped_tx_full, c.dropped_other, c.dropped_too_big, c.fragmented, c.reassembling
                ));
                if c.handed_off + c.taken_over > 0 {
                    s.push_str(&format!(
                        "      handed to other workers {} (to their flow's home {}, strays passed on {}), taken from other workers {}\n",
                        c.handed_off,
                        c.handed_off.saturating_sub(c.passed_on),
                        c.passed_on,
                        c.taken_over
                    ));
                }
            }
        }
        s.push_str(&self.chain.summary());
        for nf in &self.nfs {
            s.push_str(&nf.summary());
        }
        s.push_str(&crate::report::events_summary(&self.events_by_kind));
        s
    }
}

struct WorkerResult {
    /// Counters per port index.
    counters: Vec<QueueCounters>,
    /// The worker's chain, stopped.
    chain: Chain,
    meters: Vec<Meters>,
    batches: u64,
    /// Events the NFs emitted.
    events: EventLog,
    /// The cores the worker ran on.
    cores: String,
    /// Stage times (zero unless timed).
    stages: sluice_runtime::StageTimes,
}

/// Runs the chain over DPDK ports until stopped (signal, `max_packets` or
/// `idle_exit`).
pub fn run_dpdk(config: &HostConfig, opts: &DpdkOptions, stop: Arc<AtomicBool>) -> Result<DpdkReport, RunError> {
    let chain = crate::run::chain_def(opts.chain.as_deref(), &opts.nfs)?;
    let batch = config.batch_size.clamp(1, 256);
    let workers = config.workers.clamp(1, 64);
    let runtime = Runtime::new(config.runtime())?;
    let specs = load_specs(&runtime, config, &chain)?;

    let Opened { eal, cores, port_ids, pool, ports } =
        open_ports(config, &opts.eal_args, &opts.ports, opts.mbufs, opts.descriptors, "sluice_mbufs", lifo_for(batch))?;
    let egress = egress_of(&ports, &pool);

    // Every worker's chain is instantiated before traffic starts, so a
    // rejected config fails the run up front.
    let domains: Vec<_> = specs.iter().map(|_| sluice_state::Domain::for_workers(workers)).collect();
    let mut chains = Vec::with_capacity(workers);
    for _ in 0..workers {
        chains.push(chain.instantiate(&runtime, &specs, &domains, &config.outside_ports, config.fragments)?);
    }

    let received = Arc::new(AtomicU64::new(0));
    // Several workers hand each other the replies of the flows their
    // chains translate (see `sluice_engine::handoff`).
    let mut handoff = (workers > 1).then(|| Arc::new(handoff_of(config, workers)));
    let start = Instant::now();
    let results: Vec<Result<WorkerResult, RunError>> = std::thread::scope(|scope| {
        let mut handles = Vec::new();
        for (w, chain) in chains.into_iter().enumerate() {
            let queues: Vec<Queue> = ports.iter().filter_map(|p| p.queue(w as u16)).collect();
            let stop = stop.clone();
            let received = received.clone();
            let eal = &eal;
            let port_ids = &port_ids;
            let core = cores.for_worker(w);
            let egress = &egress;
            let handoff = handoff.clone();
            handles.push(scope.spawn(move || -> Result<WorkerResult, RunError> {
                let on = sluice_engine::cores::pin_worker(&format!("dpdk worker {w}"), core);
                let _guard = eal.register_thread()?;
                let mut io = DpdkIo::new(queues, port_ids.to_vec(), opts.pairs, batch).with_egress(egress.clone());
                if let Some(h) = handoff {
                    io = io.with_handoff(h, w);
                }
                let mut r = worker_loop(chain, io, opts, batch, &stop, &received);
                r.cores = on;
                Ok(r)
            }));
        }
        handles.into_iter().enumerate().map(|(w, h)| h.join().unwrap_or(Err(RunError::Worker(w)))).collect()
    });
    let wall_ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);

    let mut per_port: Vec<Vec<QueueCounters>> = vec![Vec::new(); ports.len()];
    let mut nfs = NfReport::for_chain(&specs);
    let mut totals = QueueCounters::default();
    let mut batches = 0;
    let mut events = EventLog::default();
    let mut worker_cores = Vec::new();
    let mut worker_chains = Vec::new();
    let mut stages = sluice_runtime::StageTimes::default();
    for r in results {
        let r = r?;
        stages.add(&r.stages);
        worker_chains.push(r.chain);
        batches += r.batches;
        events.merge(r.events);
        worker_cores.push(r.cores);
        for (pi, c) in r.counters.iter().enumerate() {
            totals.add(c);
            if let Some(v) = per_port.get_mut(pi) {
                v.push(c.clone());
            }
        }
        for (nf, m) in nfs.iter_mut().zip(&r.meters) {
            nf.meters.add(m);
        }
    }
    // Packets handed to a worker that had stopped: freed here, before the
    // pool, and counted as dropped.
    if let Some(h) = handoff.take() {
        totals.dropped_other += h.drain();
        warn_refused(&h);
    }
    let port_reports = ports.iter().zip(per_port).map(|(p, queues)| port_report(p, queues)).collect();
    // Ports stop (flushing e.g. pcap output) before the pool and EAL go.
    drop(ports);
    // The workers' handles on the pool go before the pool, and the pool
    // before EAL.
    drop(egress);
    drop(pool);
    drop(eal);
    Ok(DpdkReport {
        mpps: if wall_ns > 0 { totals.rx as f64 * 1e3 / wall_ns as f64 } else { 0.0 },
        totals,
        batches,
        traps: nfs.iter().map(|n| n.meters.traps).sum(),
        events_total: events.total,
        events_by_kind: events.by_kind,
        events: events.kept,
        workers,
        cores: cores.to_string(),
        worker_cores,
        batch_size: batch,
        wall_ns,
        ports: port_reports,
        nfs,
        chain: crate::report::ChainReport::of(&worker_chains),
        stages: opts.stage_times.then(|| stages.per_packet()),
    })
}

fn worker_loop(
    chain: Chain,
    mut io: DpdkIo,
    opts: &DpdkOptions,
    batch: usize,
    stop: &AtomicBool,
    received: &AtomicU64,
) -> WorkerResult {
    let mut dispatch = Dispatch::new(Vec::new(), Unmatched::Drop);
    if opts.stage_times {
        dispatch.time_stages(&mut io);
    }
    let mut pass = Forward { worker: Worker::new(chain), dispatch, io, batch, events: EventLog::default() };
    Driver::new(Backoff::polling())
        .stop_on(stop)
        .count(received, opts.max_packets)
        .idle_exit(opts.idle_exit)
        .run(&mut pass);
    let Forward { worker, dispatch, io, events, .. } = pass;
    // Offloaded flows' counts go back to their NFs before the meters are read.
    let batches = worker.batches();
    let mut chain = worker.into_chain();
    chain.end_offloads();
    let meters = chain.stages().iter().map(|s| s.meters().clone()).collect();
    WorkerResult {
        stages: dispatch.stage_times(&io),
        counters: io.queue_counters().to_vec(),
        chain,
        meters,
        batches,
        events,
        cores: String::new(),
    }
}

/// One pass of a `sluice-host dpdk` worker: a batch of its queues through
/// its chain; its NFs' events go to its [`EventLog`].
struct Forward {
    worker: Worker,
    dispatch: Dispatch,
    io: DpdkIo,
    batch: usize,
    events: EventLog,
}

impl Pass for Forward {
    fn pass(&mut self) -> Receive {
        let got = self.dispatch.step_one(&mut self.io, self.batch, &mut self.worker);
        if matches!(got, Receive::Packets(_)) {
            self.events.take(self.worker.drain_events());
        }
        got
    }
}

/// EAL, its ports started with one queue pair per worker, and their pool
/// (fields drop in order: ports, pool, then EAL).
pub(crate) struct Opened {
    pub(crate) ports: Vec<sluice_dpdk::Port>,
    pub(crate) pool: Arc<sluice_dpdk::Mempool>,
    pub(crate) port_ids: Vec<u16>,
    /// Cores workers are pinned to (`cores`, else the EAL's lcores).
    pub(crate) cores: CoreList,
    pub(crate) eal: Eal,
}

/// Whether a worker taking bursts of `batch` packets from each of its
/// ports wants a LIFO mbuf pool ([`sluice_dpdk::Eal::mempool`]): when its
/// bursts are more than half what an lcore's cache holds. Measured on the
/// 2-core VM (docs/benchmarks.md): the empty NF at batch 256 1.5–1.7×
/// faster from a LIFO pool than from DPDK's FIFO ring, at batch 32 the ring
/// as fast or a few percent faster.
pub(crate) fn lifo_for(batch: usize) -> bool {
    batch > (sluice_dpdk::POOL_CACHE / 2) as usize
}

/// Initializes EAL with `eal_args` and starts `ports` (empty: every port
/// DPDK found) with one queue pair per configured worker, their mbufs from
/// one pool (a LIFO one with `lifo`, see [`sluice_dpdk::Eal::mempool`]).
pub(crate) fn open_ports(
    config: &HostConfig,
    eal_args: &[String],
    ports: &[u16],
    mbufs: u32,
    descriptors: u16,
    pool_name: &str,
    lifo: bool,
) -> Result<Opened, RunError> {
    let workers = config.workers.clamp(1, 64);
    let allowed = CoreList::allowed().ok();
    let eal = Eal::init(eal_args)?;
    // EAL pinned this (the main) thread to the main lcore, and threads
    // inherit that: each worker is pinned to its own core instead, and the
    // threads started from here on (peer-state sender, journal writer,
    // beacons) run off the workers' cores.
    let cores = match config.core_list()? {
        Some(list) => list,
        None => CoreList::new(eal.lcore_cpus()),
    };
    if let Some(allowed) = allowed {
        let control = sluice_engine::cores::control_cores(&allowed, &cores);
        match sluice_engine::cores::run_current_thread_on(&control) {
            Ok(()) => tracing::debug!(cores = %control, "the host's own threads run off the workers' cores"),
            Err(e) => tracing::warn!("{e}; the host's own threads share the main lcore"),
        }
    }
    sluice_engine::cores::warn_if_oversubscribed(workers, &cores);
    let available = eal.port_count();
    if available == 0 {
        return Err(RunError::Usage(
            "DPDK found no ports: bind a NIC to DPDK (dpdk-devbind.py) or add a virtual device, e.g. --vdev=net_pcap0,rx_pcap=in.pcap,tx_pcap=out.pcap or --vdev=net_af_packet0,iface=eth1".into(),
        ));
    }
    let port_ids: Vec<u16> = if ports.is_empty() { (0..available).collect() } else { ports.to_vec() };
    for &p in &port_ids {
        eal.check_port(p)?;
    }
    let socket = port_ids.first().map(|p| eal.socket_of(*p)).unwrap_or(-1);
    let data_room = data_room(config.mbuf_size, eal_args);
    let pool = Arc::new(eal.mempool(pool_name, mbufs, data_room, socket, lifo)?);
    if lifo && !pool.is_lifo() {
        tracing::info!(
            "the mbuf pool uses the EAL's default driver, not DPDK's LIFO stack (the librte_mempool_stack driver is not loaded, or --mbuf-pool-ops-name chose another): workers receiving large bursts get colder mbufs"
        );
    }
    let mut started = Vec::new();
    for &p in &port_ids {
        let ip_only = config.spread == sluice_traffic::Spread::Addresses;
        started.push(eal.start_port(p, workers as u16, descriptors, &pool, ip_only)?);
    }
    Ok(Opened { ports: started, pool, port_ids, cores, eal })
}

/// Bytes each mbuf holds: `mbuf_size`, or more where a `net_af_packet`
/// device of `eal_args` asks for larger ring frames (`framesz=`), so that
/// every frame its ring holds fits one mbuf (the device refuses to start
/// otherwise).
fn data_room(mbuf_size: u16, eal_args: &[String]) -> u16 {
    // The PMD's ring frames carry a 32-byte header before the packet.
    const FRAME_HEADER: u32 = 32;
    let wanted = eal_args
        .iter()
        .filter(|a| a.contains("net_af_packet"))
        .flat_map(|a| a.split(','))
        .filter_map(|kv| kv.trim().strip_prefix("framesz=")?.parse::<u32>().ok())
        .map(|f| f.saturating_sub(FRAME_HEADER))
        .max()
        .unwrap_or(0);
    let wanted = u16::try_from(wanted).unwrap_or(sluice_dpdk::MAX_DATA_ROOM).min(sluice_dpdk::MAX_DATA_ROOM);
    if wanted > mbuf_size {
        tracing::info!(mbuf_size, framesz_needs = wanted, "mbufs sized for the net_af_packet ring's frames");
    }
    mbuf_size.max(wanted)
}

/// What workers need to cut datagrams to their output ports' MTUs.
/// Says how many translated flows' homes the workers had no room for.
fn warn_refused(h: &Handoff) {
    if h.refused() > 0 {
        tracing::warn!(
            refused = h.refused(),
            "workers had no room for the homes of some translated flows (`handed_flows`, or a tenant's share of them): \
             their replies went to the worker their addresses hash to"
        );
    }
}

/// What the workers of a host with several share to hand each other the
/// packets of translated flows, as `config` sizes it.
fn handoff_of(config: &HostConfig, workers: usize) -> Handoff {
    Handoff::with_limits(workers, config.handed_flows.max(1), sluice_engine::handoff::IDLE)
}

fn egress_of(ports: &[sluice_dpdk::Port], pool: &Arc<sluice_dpdk::Mempool>) -> Egress {
    Egress { mtus: ports.iter().map(|p| p.mtu().map_or(0, usize::from)).collect(), pool: pool.clone() }
}

/// A port's device counters with its queues' counters.
pub fn port_report(p: &sluice_dpdk::Port, queues: Vec<QueueCounters>) -> PortReport {
    let s = p.stats();
    PortReport {
        port: p.id(),
        name: p.name().to_string(),
        rss: p.rss(),
        ipackets: s.ipackets,
        opackets: s.opackets,
        imissed: s.imissed,
        rx_nombuf: s.rx_nombuf,
        ierrors: s.ierrors,
        oerrors: s.oerrors,
        queues,
    }
}

/// DPDK ports opened for a host under the control plane (`serve --dpdk`),
/// and the thread sending its liveness beacons, which stops first.
#[derive(Debug)]
pub struct LivePorts {
    _beacons: Option<Beacons>,
    _held: Arc<Held>,
}

/// The ports, their pool and EAL (fields drop in that order).
struct Held {
    /// Packets in the workers' inboxes go back to the pool first.
    handoff: Option<Arc<Handoff>>,
    ports: Vec<sluice_dpdk::Port>,
    pool: Arc<sluice_dpdk::Mempool>,
    eal: Eal,
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(h) = &self.handoff {
            warn_refused(h);
        }
    }
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Held").field("ports", &self.ports).finish_non_exhaustive()
    }
}

/// What `serve --dpdk` opens.
#[derive(Debug, Clone)]
pub struct LiveOptions {
    /// DPDK port ids to use; empty means every port DPDK found.
    pub ports: Vec<u16>,
    /// Default output of a port is its pair (0↔1, 2↔3).
    pub pairs: bool,
    /// What happens to packets no deployment's attachment claims.
    pub unmatched: sluice_engine::Unmatched,
    /// EAL arguments.
    pub eal_args: Vec<String>,
    /// Mbufs in the pool.
    pub mbufs: u32,
    /// RX/TX descriptors per queue.
    pub descriptors: u16,
    /// Liveness beacons to a group's dispatcher, if any.
    pub beacon: Option<BeaconOptions>,
    /// Time each stage of the workers' batches (the report's `stages`).
    pub stage_times: bool,
}

/// Initializes EAL and starts the ports with one queue pair per worker;
/// returns the agent's live input and the ports (keep them until the agent
/// returns).
pub fn open_live(config: &HostConfig, opts: &LiveOptions) -> Result<(sluice_agent::LiveInput, LivePorts), RunError> {
    if let Some(b) = &opts.beacon {
        b.check()?;
    }
    let workers = config.workers.clamp(1, 64);
    let batch = config.batch_size.clamp(1, 256);
    let Opened { eal, cores, port_ids, pool, ports } =
        // A live worker receives a batch for each of its lanes at once, so
        // its bursts grow with the tenants on the port; a LIFO pool helps
        // 16 tenants and costs 1 to 4 (docs/benchmarks.md, live host), so
        // the choice follows the batch alone, as for `dpdk`, and an
        // operator with many tenants a port passes the EAL
        // `--mbuf-pool-ops-name=stack`.
        open_ports(config, &opts.eal_args, &opts.ports, opts.mbufs, opts.descriptors, "sluice_live", lifo_for(batch))?;
    let beacon_port = match &opts.beacon {
        Some(b) => Some(port_ids.iter().position(|&p| p == b.target.port).ok_or_else(|| {
            RunError::Usage(format!(
                "--beacon names port {}, which this host does not use (its ports: {port_ids:?})",
                b.target.port
            ))
        })?),
        None => None,
    };
    let tx_lock = Arc::new(parking_lot::Mutex::new(()));
    let egress = egress_of(&ports, &pool);
    let mut ios: Vec<Box<dyn PacketIo + Send>> = Vec::new();
    let handoff = (workers > 1).then(|| Arc::new(handoff_of(config, workers)));
    for w in 0..workers {
        let queues: Vec<Queue> = ports.iter().filter_map(|p| p.queue(w as u16)).collect();
        let mut io = DpdkIo::new(queues, port_ids.clone(), opts.pairs, batch).with_egress(egress.clone());
        if let Some(h) = &handoff {
            io = io.with_handoff(h.clone(), w);
        }
        if let (0, Some(i)) = (w, beacon_port) {
            io = io.with_shared_tx(i, tx_lock.clone());
        }
        ios.push(Box::new(io));
    }
    let held = Arc::new(Held { handoff, ports, pool, eal });
    let beacons = match (&opts.beacon, beacon_port) {
        (Some(b), Some(i)) => {
            let queue = held
                .ports
                .get(i)
                .and_then(|p| p.queue(0))
                .ok_or_else(|| RunError::Usage(format!("port {} has no queue for beacons", b.target.port)))?;
            let h = held.clone();
            let port = BeaconPort {
                register: Box::new(move || h.eal.register_thread()),
                queue,
                pool: held.pool.clone(),
                lock: tx_lock,
            };
            Some(Beacons::start(b, port)?)
        }
        _ => None,
    };
    let (h1, h2) = (held.clone(), held.clone());
    let input = sluice_agent::LiveInput {
        ios,
        ports: port_ids,
        unmatched: opts.unmatched,
        cores,
        on_thread: Arc::new(move || {
            h1.eal.register_thread().map(|g| Box::new(g) as sluice_agent::live::ThreadGuard).map_err(|e| e.to_string())
        }),
        port_stats: Arc::new(move || h2.ports.iter().map(|p| port_report(p, Vec::new())).collect()),
        stage_times: opts.stage_times,
    };
    Ok((input, LivePorts { _beacons: beacons, _held: held }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mbufs_grow_to_hold_an_af_packet_rings_frames() {
        let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(data_room(2048, &args(&["--no-huge", "--vdev=net_af_packet0,iface=v1"])), 2048);
        let big =
            args(&["--vdev=net_af_packet0,iface=v1,blocksz=16384,framesz=9216", "--vdev=net_pcap0,framesz=99999"]);
        assert_eq!(data_room(2048, &big), 9216 - 32);
        assert_eq!(data_room(12000, &big), 12000, "an explicit larger size stays");
        assert_eq!(data_room(2048, &args(&["--vdev=net_af_packet0,framesz=999999"])), sluice_dpdk::MAX_DATA_ROOM);
    }
}
