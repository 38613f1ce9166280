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

use crate::config::HostConfig;
use crate::dpdk::{PortReport, open_ports, port_report};
use crate::run::RunError;
use serde::Serialize;
use sluice_dpdk::{Mbuf, Queue};
use sluice_group::{FlowletCounters, Flowlets, OwnershipTable, Route};
use sluice_wire::FlowKey;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
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
        let mac = mac
            .map(|m| {
                let parts: Vec<u8> = m.split(':').filter_map(|b| u8::from_str_radix(b, 16).ok()).collect();
                <[u8; 6]>::try_from(parts).map_err(|_| bad())
            })
            .transpose()?;
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
    /// Addresses whose TCP and UDP ports are resources of a release pool
    /// split between the hosts (a NAT's public addresses): a packet to one
    /// goes to the owner of its destination port's block
    /// ([`sluice_group::blocks`]), not by its flow.
    pub pool_addresses: Vec<sluice_wire::IpAddr128>,
}

/// The group's table as the workers steer by it: swapped whole when a new
/// version arrives; a worker looks at the version once per burst.
#[derive(Debug)]
pub struct RouteFeed {
    hosts: Vec<String>,
    version: AtomicU64,
    route: RwLock<Arc<Route>>,
    started: Instant,
    /// A table seen but not steered by yet, and when it will be.
    pending: Mutex<Option<(OwnershipTable, Instant)>>,
    events: Mutex<Vec<TableEvent>>,
    /// Per host (in `--to` order): whether its link is down.
    down: Vec<AtomicBool>,
    /// Counts link changes, so workers copy `down` only after one.
    link_epoch: AtomicU64,
    links: Mutex<Vec<LinkEvent>>,
    /// Per host, since its link last went down: flowlets moved away from
    /// it, and the packets sent to it in the [`RECENT_MS`] before (added
    /// by each worker when it sees the link down).
    since_down: Vec<(AtomicU64, AtomicU64)>,
}

/// The window before a link went down whose packets a link event counts
/// (they were in flight to, or queued at, a host that may have died).
pub const RECENT_MS: u64 = 20;
/// Buckets of the per-host count of recent packets (one per ms).
const BUCKETS: usize = 32;

/// A link towards a host that went down or came back.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LinkEvent {
    /// The host.
    pub host: String,
    /// Whether it is up now.
    pub up: bool,
    /// When, ms since the dispatcher started.
    pub at_ms: u64,
    /// When, µs since the Unix epoch (to set against other processes'
    /// clocks, e.g. when a host was killed).
    pub at_unix_us: u64,
    /// Down: packets sent to the host in the 20 ms before its link went
    /// down: what may have been lost with it (in flight, in its queues;
    /// what a dead host had taken before is not counted).
    pub sent_before: u64,
    /// Down: flowlets moved away from the host since (its flows, each at
    /// its next packet, to the slot's next owner).
    pub flowlets_moved: u64,
}

/// Now, µs since the Unix epoch.
fn unix_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// Tables kept in a dispatcher's report, at most (the latest).
const MAX_EVENTS: usize = 64;

/// A table the dispatcher started to steer by.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TableEvent {
    /// Its version.
    pub version: u64,
    /// When, ms since the dispatcher started.
    pub at_ms: u64,
    /// When, µs since the Unix epoch.
    pub at_unix_us: u64,
    /// How long after the dispatcher first saw it, ms (the handover delay
    /// of a planned change; 0 when a host was lost).
    pub delayed_ms: u64,
    /// Hosts of the dispatcher that may receive packets now and could not
    /// before.
    pub joined: Vec<String>,
    /// Hosts that could receive packets before and are gone now: their
    /// flows move at once, their next packets start flowlets elsewhere.
    pub left: Vec<String>,
}

impl RouteFeed {
    /// A feed for a dispatcher that reaches `hosts` (in `--to` order).
    pub fn new(hosts: Vec<String>) -> Self {
        RouteFeed {
            version: AtomicU64::new(0),
            route: RwLock::new(Arc::new(Route::empty())),
            started: Instant::now(),
            pending: Mutex::new(None),
            events: Mutex::new(Vec::new()),
            down: hosts.iter().map(|_| AtomicBool::new(false)).collect(),
            link_epoch: AtomicU64::new(0),
            links: Mutex::new(Vec::new()),
            since_down: hosts.iter().map(|_| (AtomicU64::new(0), AtomicU64::new(0))).collect(),
            hosts,
        }
    }

    /// Whether the link towards host `i` is down (as last noted).
    pub fn link_down(&self, i: usize) -> bool {
        self.down.get(i).is_some_and(|d| d.load(Ordering::Acquire))
    }

    /// Notes the state of the link towards host `i`. A host whose link
    /// went down is treated as gone at once: its flows move to their
    /// next owners (which hold their replicated state) without waiting
    /// for the controller to notice its silence.
    pub fn set_link(&self, i: usize, up: bool) {
        let Some(flag) = self.down.get(i) else { return };
        let was_down = flag.swap(!up, Ordering::AcqRel);
        if was_down != up {
            // No change.
            return;
        }
        self.link_epoch.fetch_add(1, Ordering::AcqRel);
        let host = self.hosts.get(i).cloned().unwrap_or_default();
        if up {
            tracing::info!(host, "the link towards a host is up");
        } else {
            tracing::warn!(host, "the link towards a host went down: its flows go to their next owners");
        }
        let mut links = self.links.lock().unwrap_or_else(PoisonError::into_inner);
        if !up && let Some((moved, sent)) = self.since_down.get(i) {
            moved.store(0, Ordering::Relaxed);
            sent.store(0, Ordering::Relaxed);
        }
        if links.len() >= MAX_EVENTS {
            links.remove(0);
        }
        links.push(LinkEvent {
            host,
            up,
            at_ms: u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX),
            at_unix_us: unix_us(),
            ..Default::default()
        });
    }

    /// The link changes so far (the latest 64); each host's latest down
    /// event with its counts since.
    pub fn link_events(&self) -> Vec<LinkEvent> {
        let mut links = self.links.lock().unwrap_or_else(PoisonError::into_inner).clone();
        for (i, host) in self.hosts.iter().enumerate() {
            let Some((moved, sent)) = self.since_down.get(i) else { continue };
            if let Some(e) = links.iter_mut().rev().find(|e| e.host == *host && !e.up) {
                e.flowlets_moved = moved.load(Ordering::Relaxed);
                e.sent_before = sent.load(Ordering::Relaxed);
            }
        }
        links
    }

    /// A worker's count of the packets it sent host `i` in the window
    /// before its link went down.
    fn add_sent_before_down(&self, i: usize, n: u64) {
        if let Some((_, sent)) = self.since_down.get(i) {
            sent.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// A flowlet moved away from host `i` while its link is down.
    fn moved_from_down(&self, i: usize) {
        if let Some((moved, _)) = self.since_down.get(i)
            && self.down.get(i).is_some_and(|d| d.load(Ordering::Relaxed))
        {
            moved.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn link_epoch(&self) -> u64 {
        self.link_epoch.load(Ordering::Acquire)
    }

    fn copy_down(&self, out: &mut Vec<bool>) {
        out.clear();
        out.extend(self.down.iter().map(|d| d.load(Ordering::Acquire)));
    }

    /// Offers a table read from the bus. A table in which a host the
    /// dispatcher sends to is gone (neither a member nor finishing) is
    /// steered by at once: packets sent there are lost. Any other change
    /// (a host joining or draining, new weights) waits `handover` after it
    /// was first seen, so that the hosts, which read the table as often,
    /// have handed the moving flows' state to their new owners before the
    /// first packet reaches them. Returns whether the dispatcher steers by
    /// a new table now.
    pub fn offer(&self, table: OwnershipTable, now: Instant, handover: Duration) -> bool {
        if table.version() <= self.version() {
            return false;
        }
        let current = self.current();
        let listed = |h: &str| table.members().iter().any(|m| m.host == h) || table.finishing().iter().any(|f| f == h);
        let lost = (0..self.hosts.len())
            .any(|i| u16::try_from(i).is_ok_and(|i| current.is_up(i)) && !self.hosts.get(i).is_some_and(|h| listed(h)));
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        let (due, seen) = match &*pending {
            Some((t, due)) if t.version() == table.version() => (*due, due.checked_sub(handover).unwrap_or(now)),
            _ => (now + handover, now),
        };
        if lost || current.version == 0 || now >= due {
            *pending = None;
            drop(pending);
            self.apply(&table, now.saturating_duration_since(seen));
            true
        } else {
            *pending = Some((table, due));
            false
        }
    }

    /// Steers by the pending table if its delay is over.
    pub fn apply_due(&self, now: Instant, handover: Duration) -> bool {
        let pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner).take();
        match pending {
            Some((t, due)) if now >= due => {
                self.apply(&t, handover);
                true
            }
            Some(p) => {
                *self.pending.lock().unwrap_or_else(PoisonError::into_inner) = Some(p);
                false
            }
            None => false,
        }
    }

    fn apply(&self, table: &OwnershipTable, delayed: Duration) {
        let before = self.current();
        if !self.set(table) {
            return;
        }
        let after = self.current();
        let (mut joined, mut left) = (Vec::new(), Vec::new());
        for (i, h) in self.hosts.iter().enumerate() {
            let Ok(i) = u16::try_from(i) else { continue };
            match (before.is_up(i), after.is_up(i)) {
                (false, true) => joined.push(h.clone()),
                (true, false) => left.push(h.clone()),
                _ => {}
            }
        }
        let mut events = self.events.lock().unwrap_or_else(PoisonError::into_inner);
        if events.len() >= MAX_EVENTS {
            events.remove(0);
        }
        events.push(TableEvent {
            version: table.version(),
            at_ms: u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX),
            at_unix_us: unix_us(),
            delayed_ms: u64::try_from(delayed.as_millis()).unwrap_or(u64::MAX),
            joined,
            left,
        });
    }

    /// The tables steered by so far (the latest [`MAX_EVENTS`]).
    pub fn events(&self) -> Vec<TableEvent> {
        self.events.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Steers by `table` from now on (an older or equal version is
    /// ignored). Returns whether it was taken.
    pub fn set(&self, table: &OwnershipTable) -> bool {
        if table.version() <= self.version.load(Ordering::Acquire) {
            return false;
        }
        let route = Arc::new(Route::of(table, &self.hosts));
        *self.route.write().unwrap_or_else(PoisonError::into_inner) = route;
        self.version.store(table.version(), Ordering::Release);
        true
    }

    /// The version steered by (0: none yet).
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    fn current(&self) -> Arc<Route> {
        self.route.read().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

/// Packets sent to one host.
#[derive(Debug, Clone, Default, Serialize)]
pub struct HostCount {
    /// Host id.
    pub host: String,
    /// Port towards it.
    pub port: u16,
    /// Packets it was sent.
    pub packets: u64,
    /// Packets for it that its port did not take (a full ring, or a link
    /// that went down with the host): dropped.
    pub dropped: u64,
    /// Flowlets moved to it from another host.
    pub moved_in: u64,
    /// Flowlets of flows it had that went to another host (a table that
    /// moved its slots, or its link down): after a kill, the flows the
    /// loss moved.
    pub moved_away: u64,
}

/// Counters of one worker.
#[derive(Debug, Clone, Default, Serialize)]
struct WorkerStats {
    received: u64,
    per_host: Vec<u64>,
    per_host_dropped: Vec<u64>,
    per_host_moved_in: Vec<u64>,
    per_host_moved_away: Vec<u64>,
    no_route: u64,
    not_ip: u64,
    dropped_tx_full: u64,
    marked: u64,
    to_pool_owner: u64,
    flowlets: FlowletCounters,
    flows: usize,
}

/// The report of a dispatcher run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SteerReport {
    /// Packets received on the ingress ports.
    pub received: u64,
    /// Packets sent towards their hosts.
    pub forwarded: u64,
    /// Packets whose flow's owner is not reachable from here (no `--to`
    /// for it, or no table yet): dropped.
    pub no_route: u64,
    /// Packets without a flow key (not IP): dropped.
    pub not_ip: u64,
    /// Packets a host's port did not take: dropped.
    pub dropped_tx_full: u64,
    /// First packets of moved flowlets, marked with the host the flow was
    /// on (see `sluice_wire::steer`); a mark that did not fit the buffer
    /// leaves the packet unmarked.
    pub marked: u64,
    /// Packets to a pool address (`--pool-address`) sent to the owner of
    /// their destination port's block.
    pub to_pool_owner: u64,
    /// Per host.
    pub hosts: Vec<HostCount>,
    /// The tables steered by, in order, with the hosts each let in or
    /// lost (the latest 64).
    pub tables: Vec<TableEvent>,
    /// Links towards hosts that went down or came back (the latest 64).
    pub links: Vec<LinkEvent>,
    /// Flowlets started, moved between hosts, moved because their host
    /// was gone; flows untracked or forgotten.
    pub flowlets: FlowletCounters,
    /// Flows tracked at the end, over all workers.
    pub flows: usize,
    /// The table version steered by at the end.
    pub table_version: u64,
    /// Workers.
    pub workers: usize,
    /// Wall time, ns.
    pub wall_ns: u64,
    /// Received Mpps over the wall time.
    pub mpps: f64,
    /// Ports.
    pub ports: Vec<PortReport>,
}

impl SteerReport {
    /// The human-readable summary.
    pub fn summary(&self) -> String {
        let f = &self.flowlets;
        let mut s = format!(
            "packets: {} rx, {} forwarded, {} no route, {} not IP, {} dropped (TX full) | flowlets: {} started, {} moved ({} from a gone host, {} marked), {} flows | table v{} | {:.3} Mpps | {} worker(s)\n",
            self.received,
            self.forwarded,
            self.no_route,
            self.not_ip,
            self.dropped_tx_full,
            f.flowlets,
            f.moved,
            f.moved_from_gone,
            self.marked,
            self.flows,
            self.table_version,
            self.mpps,
            self.workers
        );
        for h in &self.hosts {
            s.push_str(&format!(
                "  {} (port {}): {} packets, {} dropped | flowlets moved in {}, away {}\n",
                h.host, h.port, h.packets, h.dropped, h.moved_in, h.moved_away
            ));
        }
        s
    }

    fn add(&mut self, w: &WorkerStats) {
        self.received += w.received;
        self.no_route += w.no_route;
        self.not_ip += w.not_ip;
        self.dropped_tx_full += w.dropped_tx_full;
        self.marked += w.marked;
        self.to_pool_owner += w.to_pool_owner;
        for (h, n) in self.hosts.iter_mut().zip(&w.per_host) {
            h.packets += n;
            self.forwarded += n;
        }
        for (h, n) in self.hosts.iter_mut().zip(&w.per_host_dropped) {
            h.dropped += n;
        }
        for (h, n) in self.hosts.iter_mut().zip(&w.per_host_moved_in) {
            h.moved_in += n;
        }
        for (h, n) in self.hosts.iter_mut().zip(&w.per_host_moved_away) {
            h.moved_away += n;
        }
        let f = &mut self.flowlets;
        f.flowlets += w.flowlets.flowlets;
        f.moved += w.flowlets.moved;
        f.moved_from_gone += w.flowlets.moved_from_gone;
        f.untracked += w.flowlets.untracked;
        f.forgotten += w.flowlets.forgotten;
        self.flows += w.flows;
    }
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
    let opened = open_ports(config, &opts.eal_args, &ports, opts.mbufs, opts.descriptors, "sluice_steer")?;
    // Traffic is taken once the links towards the hosts are up (a memif
    // peer connects a moment after both sides started), or after
    // `link_wait`: a host whose link stays down counts as TX drops.
    let deadline = Instant::now() + opts.link_wait;
    let targets: Vec<&sluice_dpdk::Port> =
        opened.ports.iter().filter(|p| opts.to.iter().any(|t| t.port == p.id())).collect();
    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline && !targets.iter().all(|p| p.link_up()) {
        std::thread::sleep(Duration::from_millis(20));
    }
    for p in targets.iter().filter(|p| !p.link_up()) {
        tracing::warn!(
            port = p.id(),
            name = p.name(),
            "the link towards a host is down; its packets are dropped until it is up"
        );
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
            let queues: Vec<Queue> = opened
                .ports
                .iter()
                .filter(|p| opts.ingress.contains(&p.id()))
                .filter_map(|p| p.queue(w as u16))
                .collect();
            let (stop, feed, stats, received, eal) = (&stop, &feed, &stats, &received, &opened.eal);
            let core = opened.cores.for_worker(w);
            handles.push(scope.spawn(move || -> Result<(), RunError> {
                sluice_runtime::cores::pin_worker(&format!("steer worker {w}"), core);
                let _guard = eal.register_thread()?;
                steer_loop(w, queues, opts, burst, feed, stop, received, stats);
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
        let (done_ref, feed_ref) = (&done, &feed);
        let watcher = scope.spawn(move || {
            let (done, feed) = (done_ref, feed_ref);
            while !done.load(Ordering::Relaxed) {
                for (i, p) in &watched {
                    feed.set_link(*i, p.link_up());
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        // The report is kept up to date while the workers run.
        let writer = scope.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(200));
                if let Some(path) = &opts.report {
                    let mut r = empty(opts);
                    for w in stats.lock().unwrap_or_else(PoisonError::into_inner).iter() {
                        r.add(w);
                    }
                    r.table_version = feed.version();
                    r.tables = feed.events();
                    r.links = feed.link_events();
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
    for w in stats.lock().unwrap_or_else(PoisonError::into_inner).iter() {
        report.add(w);
    }
    report.table_version = feed.version();
    report.tables = feed.events();
    report.links = feed.link_events();
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

#[allow(clippy::too_many_arguments)]
fn steer_loop(
    w: usize,
    mut queues: Vec<Queue>,
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
    let mut flowlets: Flowlets<FlowKey> = Flowlets::new(gap_ns, remember_ns, opts.max_flows);
    let mut route = feed.current();
    let (mut down, mut link_epoch) = (Vec::new(), u64::MAX);
    // Per host, packets sent per ms over the last BUCKETS ms: (ms, count).
    let mut recent: Vec<[(u64, u64); BUCKETS]> = vec![[(0, 0); BUCKETS]; targets.len()];
    let mut rx: Vec<Mbuf> = Vec::with_capacity(burst);
    let mut out: Vec<Vec<Mbuf>> = targets.iter().map(|_| Vec::with_capacity(burst)).collect();
    let mut stats = WorkerStats {
        per_host: vec![0; targets.len()],
        per_host_dropped: vec![0; targets.len()],
        per_host_moved_in: vec![0; targets.len()],
        per_host_moved_away: vec![0; targets.len()],
        ..Default::default()
    };
    let mut scratch = Vec::new();
    let mut marked = Vec::new();
    let hashes: Vec<u32> = targets.iter().map(|t| sluice_wire::steer::host_hash(&t.host)).collect();
    let clock = Instant::now();
    let mut last_rx = Instant::now();
    let mut last_publish = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        if let Some(max) = opts.max_packets
            && received.load(Ordering::Relaxed) >= max
        {
            break;
        }
        if feed.version() != route.version {
            route = feed.current();
        }
        if feed.link_epoch() != link_epoch {
            let was: Vec<bool> = down.clone();
            link_epoch = feed.link_epoch();
            feed.copy_down(&mut down);
            // A link that went down: what this worker sent there just before.
            let now_ms = u64::try_from(clock.elapsed().as_millis()).unwrap_or(u64::MAX);
            for (i, (&d, r)) in down.iter().zip(&recent).enumerate() {
                if d && !was.get(i).copied().unwrap_or(false) {
                    let n = r.iter().filter(|(ms, _)| now_ms.saturating_sub(*ms) < RECENT_MS).map(|(_, n)| n).sum();
                    feed.add_sent_before_down(i, n);
                }
            }
        }
        let mut got = 0;
        for q in queues.iter_mut() {
            got += q.rx_burst(&mut rx, burst as u16);
        }
        if got == 0 {
            if opts.idle_exit.is_some_and(|d| last_rx.elapsed() >= d) {
                break;
            }
            if last_publish.elapsed() >= Duration::from_millis(100) {
                publish(shared, w, &mut stats, &flowlets, &mut last_publish);
            }
            std::hint::spin_loop();
            continue;
        }
        last_rx = Instant::now();
        received.fetch_add(got as u64, Ordering::Relaxed);
        stats.received += got as u64;
        let now_ns = u64::try_from(clock.elapsed().as_nanos()).unwrap_or(u64::MAX);
        for mut m in rx.drain(..) {
            let key = match m.data() {
                Some(d) => sluice_wire::parse(d).key,
                None => {
                    m.read_into(&mut scratch);
                    sluice_wire::parse(&scratch).key
                }
            };
            let Some(key) = key else {
                stats.not_ip += 1;
                continue;
            };
            // A reply to a pooled resource (a NAT's public port) goes to the
            // host that owns the port's block; it is another flow than the
            // connection the host translated, so flowlets do not apply.
            let pooled = matches!(key.protocol, 6 | 17) && opts.pool_addresses.contains(&key.dst);
            let s = if pooled {
                let block = sluice_group::block_of(u64::from(key.dst_port));
                route.owner_avoiding(sluice_group::block_hash(block), &down).map(|host| {
                    stats.to_pool_owner += 1;
                    sluice_group::Steer { host, new_flowlet: false, moved_from: None }
                })
            } else {
                let key = key.normalized();
                flowlets.steer_avoiding(key, key.hash_normalized(), now_ns, &route, &down)
            };
            let Some(s) = s else {
                stats.no_route += 1;
                continue;
            };
            let i = usize::from(s.host);
            if let Some(p) = s.moved_from {
                if let Some(n) = stats.per_host_moved_away.get_mut(usize::from(p)) {
                    *n += 1;
                }
                feed.moved_from_down(usize::from(p));
                if let Some(n) = stats.per_host_moved_in.get_mut(i) {
                    *n += 1;
                }
            }
            // The new owner learns which host had the flow.
            if let Some(prev) = s.moved_from.and_then(|p| hashes.get(usize::from(p))) {
                m.read_into(&mut scratch);
                let mark = sluice_wire::steer::SteerMark { previous: *prev, table_version: route.version };
                if sluice_wire::steer::encap(&scratch, mark, &mut marked) && m.set_data(&marked).is_ok() {
                    stats.marked += 1;
                }
            }
            if let Some(mac) = targets.get(i).and_then(|t| t.mac) {
                match m.first_segment_mut() {
                    Some(frame) if frame.len() >= 6 => {
                        if let Some(dst) = frame.get_mut(..6) {
                            dst.copy_from_slice(&mac);
                        }
                    }
                    _ => {
                        // A shared buffer: rewrite a copy.
                        m.read_into(&mut scratch);
                        if let Some(dst) = scratch.get_mut(..6) {
                            dst.copy_from_slice(&mac);
                        }
                        if m.set_data(&scratch).is_err() {
                            stats.dropped_tx_full += 1;
                            continue;
                        }
                    }
                }
            }
            if let Some(v) = out.get_mut(i) {
                v.push(m);
            }
        }
        if let Some(q) = queues.first_mut() {
            let counts = stats.per_host.iter_mut().zip(stats.per_host_dropped.iter_mut());
            for (hi, ((v, t), (count, dropped))) in out.iter_mut().zip(targets).zip(counts).enumerate() {
                if v.is_empty() {
                    continue;
                }
                let mut sent = q.tx_burst(t.port, v);
                let since = Instant::now();
                // A full queue towards a live host is waited on (up to
                // --tx-retry-us); one towards a host whose link is down
                // is not: its packets are lost with it, and waiting would
                // hold every other host's packets too.
                while !v.is_empty() && since.elapsed() < opts.tx_retry && !feed.link_down(hi) {
                    std::hint::spin_loop();
                    sent += q.tx_burst(t.port, v);
                }
                *count += sent as u64;
                if let Some(r) = recent.get_mut(hi) {
                    let ms = u64::try_from(clock.elapsed().as_millis()).unwrap_or(u64::MAX);
                    if let Some(b) = r.get_mut((ms % BUCKETS as u64) as usize) {
                        *b = if b.0 == ms { (ms, b.1 + sent as u64) } else { (ms, sent as u64) };
                    }
                }
                stats.dropped_tx_full += v.len() as u64;
                *dropped += v.len() as u64;
                // What the port did not take is freed here.
                v.clear();
            }
        }
        if last_publish.elapsed() >= Duration::from_millis(100) {
            publish(shared, w, &mut stats, &flowlets, &mut last_publish);
        }
    }
    publish(shared, w, &mut stats, &flowlets, &mut last_publish);
}

fn publish(
    shared: &Mutex<Vec<WorkerStats>>,
    w: usize,
    stats: &mut WorkerStats,
    flowlets: &Flowlets<FlowKey>,
    at: &mut Instant,
) {
    stats.flowlets = flowlets.counters();
    stats.flows = flowlets.len();
    if let Some(slot) = shared.lock().unwrap_or_else(PoisonError::into_inner).get_mut(w) {
        slot.clone_from(stats);
    }
    *at = Instant::now();
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
