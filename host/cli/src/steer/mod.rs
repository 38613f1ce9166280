//! `sluice-host steer`: the flowlet dispatcher of a host group.
//!
//! It takes the group's ingress traffic on DPDK ports and sends each packet
//! to the host that owns its flow in the group's flow-ownership table,
//! without running NF code. Worker `w` polls queue `w` of every ingress
//! port (symmetric RSS keeps both directions of a flow on one worker) and
//! tracks its flows' flowlets ([`sluice_group::Flowlets`]): a flow stays on
//! its host until it has been idle longer than the flowlet gap, so a new
//! table moves flows only between flowlets and never reorders one; a flow
//! whose host is gone moves at once. Each host is reached through a port
//! (`--to <host>=<port>`: a point-to-point link such as a memif or veth
//! pair), optionally with the destination MAC rewritten to the host's
//! (`--to <host>=<port>@<mac>`, for hosts behind one switch port).
//!
//! The table comes from the gateway over NATS ([`RouteFeed`], filled by
//! the caller); the dispatcher opens its ports once it has one.

mod feed;
mod follow;
mod liveness;
mod report;

pub use feed::{LinkEvent, RECENT_MS, RouteFeed, TableEvent};
pub use follow::follow_table;
pub use report::{HostCount, SteerReport};

use crate::config::HostConfig;
use crate::dpdk::{lifo_for, open_ports, port_report};
use crate::run::RunError;
use feed::BUCKETS;
use parking_lot::Mutex;
use report::WorkerStats;
use sluice_dpdk::Queue;
use sluice_engine::dpdk::{DpdkIo, Output};
use sluice_engine::{OutputCount, PacketIo, Receive};
use sluice_group::Flowlets;
use sluice_runtime::{Fate, PacketResult, RawPacket};
use sluice_wire::FlowKey;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Where one host's flows leave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Host id (as in the ownership table).
    pub host: String,
    /// DPDK port towards it.
    pub port: u16,
    /// Destination MAC to write into each frame, if any.
    pub mac: Option<[u8; 6]>,
}

impl FromStr for Target {
    type Err = String;
    /// `<host>=<port>` or `<host>=<port>@<mac>`.
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("'{s}' is not <host>=<port>[@<mac>], e.g. edge-1=1 or edge-1=0@02:00:00:00:00:01");
        let (host, rest) = s.split_once('=').ok_or_else(bad)?;
        sluice_control::subjects::check_token("host", host).map_err(|e| e.to_string())?;
        let (port, mac) = match rest.split_once('@') {
            Some((p, m)) => (p, Some(m)),
            None => (rest, None),
        };
        let port = port.parse().map_err(|_| bad())?;
        let mac = mac.map(|m| sluice_wire::ethernet::parse_mac(m).ok_or_else(bad)).transpose()?;
        Ok(Target { host: host.to_string(), port, mac })
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct SteerOptions {
    /// Ports the group's traffic arrives on.
    pub ingress: Vec<u16>,
    /// Where each host's flows leave.
    pub to: Vec<Target>,
    /// Flowlet gap: a flow may move to another host only after this long
    /// without packets.
    pub gap: Duration,
    /// How long a flow's host is remembered without packets.
    pub remember: Duration,
    /// Flows tracked per worker.
    pub max_flows: usize,
    /// EAL arguments.
    pub eal_args: Vec<String>,
    /// Mbufs in the pool.
    pub mbufs: u32,
    /// RX/TX descriptors per queue.
    pub descriptors: u16,
    /// Stop after this many received packets.
    pub max_packets: Option<u64>,
    /// Stop a worker when it has received nothing for this long.
    pub idle_exit: Option<Duration>,
    /// Keep a JSON report here (updated every second).
    pub report: Option<PathBuf>,
    /// How long to wait for the links towards the hosts before taking
    /// traffic.
    pub link_wait: Duration,
    /// How long a burst towards a host whose port is full is retried
    /// before what is left is dropped (backpressure from a slow host,
    /// bounded so that it cannot stall the others for long).
    pub tx_retry: Duration,
    /// With liveness beacons: a host none is heard from for this long is
    /// treated as gone (see [`liveness`]); `None`: only link state.
    pub liveness: Option<Duration>,
    /// Addresses whose TCP and UDP ports are resources of a release pool
    /// split between the hosts (a NAT's public addresses): a packet to one
    /// goes to the owner of its destination port's block
    /// ([`sluice_group::blocks`]), not by its flow.
    pub pool_addresses: Vec<sluice_wire::IpAddr128>,
}

/// Checks the options against each other.
fn check(opts: &SteerOptions) -> Result<(), RunError> {
    if opts.to.is_empty() {
        return Err(RunError::Usage("no hosts to steer to: give --to <host>=<port> for each host of the group".into()));
    }
    for (i, t) in opts.to.iter().enumerate() {
        if opts.to.iter().skip(i + 1).any(|u| u.host == t.host) {
            return Err(RunError::Usage(format!("--to names host {} twice", t.host)));
        }
        if opts.ingress.contains(&t.port) {
            return Err(RunError::Usage(format!("port {} is both an ingress port and host {}'s", t.port, t.host)));
        }
    }
    if opts.ingress.is_empty() {
        return Err(RunError::Usage("no ingress port: give --ingress".into()));
    }
    if opts.gap.is_zero() {
        return Err(RunError::Usage("the flowlet gap must be above 0".into()));
    }
    Ok(())
}

/// Steers until stopped (signal, `max_packets` or `idle_exit`). Waits for
/// the first table before opening the ports.
pub fn run_steer(
    config: &HostConfig,
    opts: &SteerOptions,
    feed: Arc<RouteFeed>,
    stop: Arc<AtomicBool>,
) -> Result<SteerReport, RunError> {
    check(opts)?;
    while feed.version() == 0 {
        if stop.load(Ordering::Relaxed) {
            return Ok(SteerReport::default());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    tracing::info!(version = feed.version(), "steering by the group's table");
    let workers = config.workers.clamp(1, 64);
    let mut ports: Vec<u16> = opts.ingress.clone();
    for t in &opts.to {
        if !ports.contains(&t.port) {
            ports.push(t.port);
        }
    }
    let opened = open_ports(
        config,
        &opts.eal_args,
        &ports,
        opts.mbufs,
        opts.descriptors,
        "sluice_steer",
        lifo_for(config.batch_size.clamp(1, 256)),
    )?;
    // Traffic is taken once the links towards the hosts are up (a memif
    // peer connects a moment after both sides started), or after
    // `link_wait`: a host whose link stays down counts as TX drops.
    let deadline = Instant::now() + opts.link_wait;
    let targets: Vec<&sluice_dpdk::Port> =
        opened.ports.iter().filter(|p| opts.to.iter().any(|t| t.port == p.id())).collect();
    // With beacons, also until every host was heard from.
    let mut liveness = opts.liveness.map(|bound| liveness::Liveness::new(bound, &opts.to, &opened.ports));
    let ready = |l: &Option<liveness::Liveness>| {
        targets.iter().all(|p| p.link_up()) && l.as_ref().is_none_or(liveness::Liveness::heard_all)
    };
    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline && !ready(&liveness) {
        if let Some(l) = &mut liveness {
            l.poll(&feed, Instant::now());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for p in targets.iter().filter(|p| !p.link_up()) {
        tracing::warn!(
            port = p.id(),
            name = p.name(),
            "the link towards a host is down; its packets are dropped until it is up"
        );
    }
    if let Some(l) = &mut liveness {
        l.poll(&feed, Instant::now());
        for (i, t) in opts.to.iter().enumerate().filter(|(i, _)| !l.alive(*i, Instant::now())) {
            tracing::warn!(
                host = t.host,
                port = t.port,
                "no liveness beacon from a host (is it run with --beacon?): its packets go to the next owners until one comes"
            );
            feed.set_link(i, false, "beacons");
        }
    }
    let burst = config.batch_size.clamp(1, 256);
    let stats: Arc<Mutex<Vec<WorkerStats>>> = Arc::new(Mutex::new(vec![WorkerStats::default(); workers]));
    let received = AtomicU64::new(0);
    let done = AtomicBool::new(false);
    let start = Instant::now();
    let empty = |opts: &SteerOptions| SteerReport {
        hosts: opts.to.iter().map(|t| HostCount { host: t.host.clone(), port: t.port, ..Default::default() }).collect(),
        workers,
        ..Default::default()
    };
    let results: Vec<Result<(), RunError>> = std::thread::scope(|scope| {
        let mut handles = Vec::new();
        for w in 0..workers {
            let io = steer_io(&opened.ports, opts, w as u16, burst, &feed);
            let (stop, feed, stats, received, eal) = (&stop, &feed, &stats, &received, &opened.eal);
            let core = opened.cores.for_worker(w);
            handles.push(scope.spawn(move || -> Result<(), RunError> {
                sluice_engine::cores::pin_worker(&format!("steer worker {w}"), core);
                let _guard = eal.register_thread()?;
                steer_loop(w, io, opts, burst, feed, stop, received, stats);
                Ok(())
            }));
        }
        // Links towards hosts are watched: a host that died takes its link
        // down with it (memif, a cable), long before the controller
        // notices its silence.
        let watched: Vec<(usize, &sluice_dpdk::Port)> = opts
            .to
            .iter()
            .enumerate()
            .filter_map(|(i, t)| opened.ports.iter().find(|p| p.id() == t.port).map(|p| (i, p)))
            .collect();
        // With beacons, a host none is heard from within the bound
        // counts as gone as well (a hung or killed process whose link
        // stays up, or goes down late).
        let (done_ref, feed_ref, eal) = (&done, &feed, &opened.eal);
        let watcher = scope.spawn(move || {
            let (done, feed) = (done_ref, feed_ref);
            // Registered for the mempool's per-thread cache (beacons are freed here).
            let _guard = liveness.is_some().then(|| eal.register_thread().ok()).flatten();
            let every = liveness.as_ref().map_or(Duration::from_millis(1), |l| {
                (l.bound() / 8).clamp(Duration::from_micros(100), Duration::from_millis(1))
            });
            while !done.load(Ordering::Relaxed) {
                let now = Instant::now();
                if let Some(l) = &mut liveness {
                    l.poll(feed, now);
                }
                for (i, p) in &watched {
                    let link = p.link_up();
                    let heard = liveness.as_ref().is_none_or(|l| l.alive(*i, now));
                    let cause = match (link, heard) {
                        (false, _) => "link",
                        (true, false) => "beacons",
                        (true, true) if liveness.is_some() => "link and beacons",
                        (true, true) => "link",
                    };
                    feed.set_link(*i, link && heard, cause);
                }
                std::thread::sleep(every);
            }
        });
        // The report is kept up to date while the workers run.
        let writer = scope.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(200));
                if let Some(path) = &opts.report {
                    let mut r = empty(opts);
                    for w in stats.lock().iter() {
                        r.add(w);
                    }
                    r.add_feed(&feed);
                    write_report(path, &r);
                }
            }
        });
        let r: Vec<Result<(), RunError>> =
            handles.into_iter().enumerate().map(|(w, h)| h.join().unwrap_or(Err(RunError::Worker(w)))).collect();
        done.store(true, Ordering::Relaxed);
        let _ = writer.join();
        let _ = watcher.join();
        r
    });
    for r in results {
        r?;
    }
    let wall_ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
    let mut report = empty(opts);
    for w in stats.lock().iter() {
        report.add(w);
    }
    report.add_feed(&feed);
    report.wall_ns = wall_ns;
    report.mpps = if wall_ns > 0 { report.received as f64 * 1e3 / wall_ns as f64 } else { 0.0 };
    report.ports = opened.ports.iter().map(|p| port_report(p, Vec::new())).collect();
    if let Some(path) = &opts.report {
        write_report(path, &report);
    }
    drop(opened);
    Ok(report)
}

fn write_report(path: &std::path::Path, r: &SteerReport) {
    let tmp = path.with_extension("tmp");
    let written = serde_json::to_vec_pretty(r)
        .map_err(std::io::Error::other)
        .and_then(|b| std::fs::write(&tmp, b))
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = written {
        tracing::warn!(path = %path.display(), "cannot write the dispatcher report: {e}");
    }
}

/// Worker `w`'s queue of each port: the ingress ports first, which it
/// polls, then the hosts' ports, which it only sends to; verdict port
/// i + 1 is host i (`--to` order), with its MAC when it has one.
fn steer_io(ports: &[sluice_dpdk::Port], opts: &SteerOptions, w: u16, burst: usize, feed: &RouteFeed) -> DpdkIo {
    let (mut ids, mut queues): (Vec<u16>, Vec<Queue>) = (Vec::new(), Vec::new());
    for id in opts.ingress.iter().chain(opts.to.iter().map(|t| &t.port)) {
        if !ids.contains(id)
            && let Some(q) = ports.iter().find(|p| p.id() == *id).and_then(|p| p.queue(w))
        {
            ids.push(*id);
            queues.push(q);
        }
    }
    let receiving = ids.iter().filter(|id| opts.ingress.contains(id)).count();
    let outputs = opts
        .to
        .iter()
        .map(|t| Output { port: ids.iter().position(|&id| id == t.port).unwrap_or(usize::MAX), mac: t.mac })
        .collect();
    DpdkIo::new(queues, ids, false, burst)
        .receive_on(receiving)
        .with_outputs(outputs)
        .with_tx_retry(opts.tx_retry, feed.down_flags())
}

#[allow(clippy::too_many_arguments)]
fn steer_loop(
    w: usize,
    io: DpdkIo,
    opts: &SteerOptions,
    burst: usize,
    feed: &RouteFeed,
    stop: &AtomicBool,
    received: &AtomicU64,
    shared: &Mutex<Vec<WorkerStats>>,
) {
    let targets = &opts.to;
    let gap_ns = u64::try_from(opts.gap.as_nanos()).unwrap_or(u64::MAX);
    let remember_ns = u64::try_from(opts.remember.as_nanos()).unwrap_or(u64::MAX);
    let router = Router {
        w,
        opts,
        feed,
        shared,
        flowlets: Flowlets::new(gap_ns, remember_ns, opts.max_flows),
        route: feed.current(),
        down: Vec::new(),
        link_epoch: u64::MAX,
        recent: vec![[(0, 0); BUCKETS]; targets.len()],
        counted: vec![OutputCount::default(); targets.len()],
        stats: WorkerStats {
            per_host: vec![0; targets.len()],
            per_host_dropped: vec![0; targets.len()],
            per_host_moved_in: vec![0; targets.len()],
            per_host_moved_away: vec![0; targets.len()],
            ..Default::default()
        },
        marked: Vec::new(),
        hashes: targets.iter().map(|t| sluice_wire::steer::host_hash(&t.host)).collect(),
        clock: Instant::now(),
    };
    let mut steering = Steering {
        io,
        burst,
        views: Vec::with_capacity(burst),
        results: Vec::with_capacity(burst),
        moved: Vec::new(),
        router,
    };
    // Never sleeps: a frame waits for no more than a poll.
    sluice_engine::Driver::new(sluice_engine::idle::Backoff::polling())
        .stop_on(stop)
        .count(received, opts.max_packets)
        .idle_exit(opts.idle_exit)
        .tick_every(PUBLISH_EVERY)
        .run(&mut steering);
    steering.router.publish();
}

/// How often a dispatcher worker publishes its counts.
const PUBLISH_EVERY: Duration = Duration::from_millis(100);

/// One dispatcher worker. Each pass receives a batch, picks each packet's
/// host (its result: forward to that host's output, with the mark of a
/// moved flowlet as new bytes, or drop) and delivers the batch; the I/O
/// writes each host's MAC, sends, retries a full queue towards a live host
/// and counts per host.
struct Steering<'a, Io> {
    io: Io,
    burst: usize,
    /// The batch's packets (emptied between batches).
    views: Vec<RawPacket<'static>>,
    results: Vec<PacketResult>,
    /// Marks found on received packets (ignored).
    moved: Vec<(usize, sluice_wire::steer::SteerMark)>,
    router: Router<'a>,
}

/// A dispatcher worker's flowlets, table, links and counts.
struct Router<'a> {
    w: usize,
    opts: &'a SteerOptions,
    feed: &'a RouteFeed,
    shared: &'a Mutex<Vec<WorkerStats>>,
    flowlets: Flowlets<FlowKey>,
    route: Arc<sluice_group::Route>,
    down: Vec<bool>,
    link_epoch: u64,
    /// Per host, packets sent per ms over the last BUCKETS ms: (ms, count).
    recent: Vec<[(u64, u64); BUCKETS]>,
    /// Per host, the I/O's output counts already added to `stats`.
    counted: Vec<OutputCount>,
    stats: WorkerStats,
    marked: Vec<u8>,
    hashes: Vec<u32>,
    clock: Instant,
}

impl Router<'_> {
    fn publish(&mut self) {
        self.stats.flowlets = self.flowlets.counters();
        self.stats.flows = self.flowlets.len();
        if let Some(slot) = self.shared.lock().get_mut(self.w) {
            slot.clone_from(&self.stats);
        }
    }

    /// Takes the feed's newest table and links.
    fn follow_feed(&mut self) {
        let feed = self.feed;
        if feed.version() != self.route.version {
            self.route = feed.current();
        }
        if feed.link_epoch() != self.link_epoch {
            let was: Vec<bool> = self.down.clone();
            self.link_epoch = feed.link_epoch();
            feed.copy_down(&mut self.down);
            // A link that went down: what this worker sent there just before.
            let now_ms = u64::try_from(self.clock.elapsed().as_millis()).unwrap_or(u64::MAX);
            for (i, (&d, r)) in self.down.iter().zip(&self.recent).enumerate() {
                if d && !was.get(i).copied().unwrap_or(false) {
                    let n = r.iter().filter(|(ms, _)| now_ms.saturating_sub(*ms) < RECENT_MS).map(|(_, n)| n).sum();
                    feed.add_sent_before_down(i, n);
                }
            }
        }
    }

    /// The result of each packet of `batch`, in order, into `results`.
    fn steer_batch(&mut self, batch: &[RawPacket<'_>], results: &mut Vec<PacketResult>) {
        let now_ns = u64::try_from(self.clock.elapsed().as_nanos()).unwrap_or(u64::MAX);
        // The results are kept between batches and only their fates and
        // bytes set: a result built per packet and moved into place costs
        // more than the steering itself.
        results.resize_with(batch.len(), || PacketResult::of(Fate::Dropped(0)));
        results.truncate(batch.len());
        for (p, r) in batch.iter().zip(results.iter_mut()) {
            let (fate, marked) = self.steer(p.data, now_ns);
            r.fate = fate;
            if marked {
                r.data = Some(self.marked.clone());
            } else if r.data.is_some() {
                r.data = None;
            }
        }
    }

    /// The fate of one packet: its host's output, or a drop (counted);
    /// true when it starts a moved flowlet and `marked` holds it with its
    /// mark.
    #[inline(always)]
    fn steer(&mut self, data: &[u8], now_ns: u64) -> (Fate, bool) {
        let Router { opts, feed, route, down, stats, marked, hashes, flowlets, .. } = self;
        let Some(key) = sluice_wire::parse(data).key else {
            stats.not_ip += 1;
            return (Fate::Dropped(0), false);
        };
        // A reply to a pooled resource (a NAT's public port) goes to the
        // host that owns the port's block; it is another flow than the
        // connection the host translated, so flowlets do not apply.
        let pooled = matches!(key.protocol, 6 | 17) && opts.pool_addresses.contains(&key.dst);
        let s = if pooled {
            let block = sluice_group::block_of(u64::from(key.dst_port));
            route.owner_avoiding(sluice_group::block_hash(block), down).map(|host| {
                stats.to_pool_owner += 1;
                sluice_group::Steer { host, new_flowlet: false, moved_from: None }
            })
        } else {
            let key = key.normalized();
            flowlets.steer_avoiding(key, key.hash_normalized(), now_ns, route, down)
        };
        let Some(s) = s else {
            stats.no_route += 1;
            return (Fate::Dropped(0), false);
        };
        let i = usize::from(s.host);
        let fate = Fate::Forward(s.host.saturating_add(1));
        if let Some(p) = s.moved_from {
            if let Some(n) = stats.per_host_moved_away.get_mut(usize::from(p)) {
                *n += 1;
            }
            feed.moved_from_down(usize::from(p));
            if let Some(n) = stats.per_host_moved_in.get_mut(i) {
                *n += 1;
            }
            // The new owner learns which host had the flow.
            if let Some(prev) = hashes.get(usize::from(p)) {
                let mark = sluice_wire::steer::SteerMark { previous: *prev, table_version: route.version };
                if sluice_wire::steer::encap(data, mark, marked) {
                    stats.marked += 1;
                    return (fate, true);
                }
            }
        }
        (fate, false)
    }

    /// Adds what the I/O sent and dropped per host (`outputs`, since its
    /// start) since the last batch.
    fn count_sent(&mut self, outputs: &[OutputCount]) {
        let ms = u64::try_from(self.clock.elapsed().as_millis()).unwrap_or(u64::MAX);
        let stats = &mut self.stats;
        let counts = stats.per_host.iter_mut().zip(stats.per_host_dropped.iter_mut());
        for (((now, was), (count, dropped)), r) in
            outputs.iter().zip(self.counted.iter_mut()).zip(counts).zip(self.recent.iter_mut())
        {
            let (sent, lost) = (now.sent - was.sent, now.dropped - was.dropped);
            if sent == 0 && lost == 0 {
                continue;
            }
            *was = *now;
            *count += sent;
            *dropped += lost;
            stats.dropped_tx_full += lost;
            if let Some(b) = r.get_mut((ms % BUCKETS as u64) as usize) {
                *b = if b.0 == ms { (ms, b.1 + sent) } else { (ms, sent) };
            }
        }
    }
}

impl<Io: PacketIo> sluice_engine::Pass for Steering<'_, Io> {
    fn pass(&mut self) -> Receive {
        let Steering { io, burst, views, results, moved, router } = self;
        router.follow_feed();
        let got = match io.receive(*burst) {
            Receive::Packets(n) => n,
            other => return other,
        };
        router.stats.received += got as u64;
        let mut batch = sluice_engine::recycle(std::mem::take(views));
        // A mark coming in from outside the group is taken off and not
        // acted on: the dispatcher makes its own.
        moved.clear();
        io.packets(&mut batch, moved);
        router.steer_batch(&batch, results);
        *views = sluice_engine::recycle(batch);
        io.deliver(results.as_slice().into());
        router.count_sent(io.output_counts());
        Receive::Packets(got)
    }

    fn tick(&mut self, _now: Instant) {
        self.router.publish();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn targets_parse_and_bad_ones_say_why() {
        assert_eq!("edge-1=2".parse::<Target>().unwrap(), Target { host: "edge-1".into(), port: 2, mac: None });
        assert_eq!("h=0@02:00:00:00:00:0a".parse::<Target>().unwrap().mac, Some([2, 0, 0, 0, 0, 10]));
        for bad in ["h", "h=x", "h=1@02:00", "a.b=1", "h=1@zz:00:00:00:00:00"] {
            assert!(bad.parse::<Target>().is_err(), "{bad}");
        }
    }
}
