//! A host on live traffic (`sluice-host serve --dpdk`): the group's
//! deployments share the host's ports.
//!
//! Workers are the host's, not the deployments': worker `w` polls its I/O
//! (queue `w` of every port, spread by symmetric RSS) and holds one
//! [`Active`] per deployment of the group — its own chain instance, meter
//! window and journal (`<deployment>.w<w>`). Each batch goes through one
//! [`Dispatch`]: the deployments' attachments give every packet to at
//! most one deployment, whose chain runs on its part; packets nobody
//! claims get the host's unmatched policy and are counted in the host
//! report, never metered to a tenant. New revisions reach every worker
//! compiled once, and apply between batches (hot swaps keep flow state).

use crate::deployment::{self, Active};
use crate::journal;
use crate::prepare::{self, Prepared};
use crate::shared::Shared;
use parking_lot::Mutex;
use sluice_engine::SteerMark;
use sluice_engine::cores::CoreList;
use sluice_engine::idle::Backoff;
use sluice_engine::{
    Attachment, Classifier, Dispatch, Driver, FairShare, Lane, PacketIo, Pass, PortReport, QueueCounters, Receive,
    Share, Unmatched, Worker,
};
use sluice_runtime::{Chain, PacketResult};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Something a worker thread holds while it runs (e.g. its registration
/// with DPDK's EAL).
pub type ThreadGuard = Box<dyn std::any::Any>;

/// What a host's live ports give the agent.
pub struct LiveInput {
    /// One I/O per worker (its queue of every port).
    pub ios: Vec<Box<dyn PacketIo + Send>>,
    /// Port ids, in the I/Os' order.
    pub ports: Vec<u16>,
    /// What happens to packets no attachment claims.
    pub unmatched: Unmatched,
    /// Cores workers are pinned to (worker i on the i-th).
    pub cores: CoreList,
    /// Run first on each worker thread; what it returns is kept until the
    /// thread ends.
    pub on_thread: Arc<dyn Fn() -> Result<ThreadGuard, String> + Send + Sync>,
    /// The ports' device counters (queues left empty).
    pub port_stats: Arc<dyn Fn() -> Vec<PortReport> + Send + Sync>,
    /// Time each stage of the workers' batches (the report's `stages`).
    pub stage_times: bool,
}

impl std::fmt::Debug for LiveInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveInput")
            .field("workers", &self.ios.len())
            .field("ports", &self.ports)
            .field("unmatched", &self.unmatched)
            .finish_non_exhaustive()
    }
}

/// What the agent tells a live worker.
enum WorkerCommand {
    /// Run this revision (start the deployment, or move it to it), with
    /// its chain if it was started for this worker already.
    Apply(Box<Prepared>, Option<Box<Result<Chain, String>>>),
    /// Close the deployment's meter window and drop it; acknowledge.
    Remove(String, crossbeam_channel::Sender<()>),
}

/// One deployment on one worker.
struct LiveLane {
    active: Active,
    attachments: Vec<Attachment>,
    /// Its tenant's share of the worker.
    share: Share,
    /// Packets run, forwarded, and refused over its tenant's share since
    /// they were last reported.
    packets_in: u64,
    packets_out: u64,
    over_share: u64,
    /// Its flows' state replicated to, and imported from, the group's
    /// other hosts.
    peer: Option<sluice_peer::LanePeer>,
}

impl Lane for LiveLane {
    fn worker(&mut self) -> &mut Worker {
        &mut self.active.worker
    }

    fn may_send(&self, port: u16) -> bool {
        self.attachments.iter().any(|a| a.port == port || a.out == Some(port))
    }

    fn may_tag(&self, vlan: Option<u16>) -> bool {
        self.attachments.iter().any(|a| a.takes_vlan(vlan))
    }

    fn owner(&self) -> u64 {
        sluice_engine::dispatch::owner_of(&self.active.spec.tenant)
    }

    fn admit(&mut self, contended: bool) -> bool {
        // Alone in the batch it always runs: what it uses is charged after.
        !contended || self.share.pause().is_none()
    }

    fn ran(&mut self, packets: u64, forwarded: u64, took: Duration) {
        self.packets_in += packets;
        self.packets_out += forwarded;
        self.share.charge_used(took);
        self.active.observe_batch();
    }

    fn refused(&mut self, packets: u64) {
        self.over_share += packets;
    }

    fn hold(
        &mut self,
        packets: &[sluice_runtime::RawPacket<'_>],
        moved: &[(usize, SteerMark)],
        room: usize,
        out: &mut Vec<(usize, sluice_runtime::Hold)>,
    ) {
        if let Some(p) = &mut self.peer {
            p.hold(self.active.worker.chain().stages(), packets, moved, room, out);
        }
    }

    fn release(&mut self, out: &mut Vec<u64>) {
        if let Some(p) = &mut self.peer {
            p.release(out);
        }
    }

    fn commits(&self) -> bool {
        self.peer.as_ref().is_some_and(sluice_peer::LanePeer::commits)
    }

    fn defer(
        &mut self,
        packets: &[sluice_runtime::RawPacket<'_>],
        leaves: &[bool],
        room: usize,
        out: &mut Vec<(usize, sluice_runtime::Defer)>,
    ) {
        if let Some(p) = self.peer.as_mut().filter(|p| p.commits()) {
            p.defer(self.active.worker.chain_mut(), packets, leaves, room, out);
        }
    }

    fn settle(&mut self, send: &mut Vec<u64>, drop: &mut Vec<u64>) {
        if let Some(p) = &mut self.peer {
            p.settle(self.active.worker.chain(), send, drop);
        }
    }

    fn run(&mut self, packets: &[sluice_runtime::RawPacket<'_>], moved: &[(usize, SteerMark)]) -> &mut [PacketResult] {
        match &mut self.peer {
            Some(p) => {
                p.set_moved(packets, moved);
                self.active.worker.run_hooked(packets, Some(p))
            }
            None => self.active.worker.run(packets),
        }
    }
}

/// One live worker's loop (see [`WorkerCtx::run`]).
struct LivePass<'a> {
    ctx: &'a WorkerCtx,
    rx: crossbeam_channel::Receiver<WorkerCommand>,
    io: Box<dyn PacketIo + Send>,
    lanes: Vec<LiveLane>,
    /// Deployments handed to this worker that are not running on it
    /// (their start failed): their attachments still claim their
    /// traffic, which is dropped rather than given the unmatched policy.
    claims: Vec<(String, Vec<Attachment>)>,
    classifier: Classifier,
    dispatch: Dispatch,
    fair: FairShare,
    /// Raised to run a pull's pass promptly (see `Peer::wake_me_on_arrivals`).
    raised: Option<sluice_peer::Raised>,
    /// Whether packets came since the last tick.
    busy: bool,
    /// Whether the host was open at the last pass (nothing ticks before).
    open: bool,
    last_report: Instant,
}

impl Pass for LivePass<'_> {
    /// Commands, then (once the host is open) a batch, then other hosts'
    /// requests for flows moved away from here.
    fn pass(&mut self) -> Receive {
        let ctx = self.ctx;
        // Read before the commands: once open, every command sent before
        // opening is in the channel.
        let open = ctx.open.load(std::sync::atomic::Ordering::Acquire);
        self.open = open;
        let was_raised = self.raised.as_ref().is_some_and(|r| r.take());
        let mut changed = false;
        loop {
            match self.rx.try_recv() {
                Ok(command) => {
                    ctx.obey(command, &mut self.lanes, &mut self.claims, &self.fair);
                    changed = true;
                }
                Err(crossbeam_channel::TryRecvError::Empty) => break,
                Err(crossbeam_channel::TryRecvError::Disconnected) => {
                    ctx.stop.store(true, std::sync::atomic::Ordering::Relaxed);
                    break;
                }
            }
        }
        if changed {
            // Claims come after the lanes: their indices have no lane.
            let running = self.lanes.iter().map(|l| &l.attachments);
            let waiting = self.claims.iter().map(|(_, a)| a);
            self.classifier =
                Classifier::new(running.chain(waiting).enumerate().flat_map(|(i, at)| at.iter().map(move |a| (i, *a))));
        }
        if !open {
            if let Some(r) = self.raised.as_ref().filter(|_| was_raised) {
                r.lower();
            }
            std::thread::sleep(Duration::from_millis(1));
            return Receive::Idle;
        }
        let got = self.dispatch.step(self.io.as_mut(), ctx.batch, &self.classifier, &mut self.lanes);
        self.busy |= matches!(got, Receive::Packets(_));
        // Other hosts' requests for flows moved away from here.
        if ctx.shared.peer.is_some() {
            let now = Instant::now();
            for l in &mut self.lanes {
                if let Some(p) = l.peer.as_mut() {
                    p.serve(l.active.worker.chain(), now);
                }
            }
        }
        // A pull raised this worker for the pass that looked at it.
        if let Some(r) = self.raised.as_ref().filter(|_| was_raised) {
            r.lower();
        }
        got
    }

    /// Peer state, then (with traffic) events, windows and checkpoints,
    /// then (every [`REPORT_EVERY`]) reports.
    fn tick(&mut self, now: Instant) {
        if !self.open {
            return;
        }
        let ctx = self.ctx;
        // Peer state goes out on its interval, with traffic or without.
        if ctx.shared.peer.is_some() {
            for l in &mut self.lanes {
                if let Some(p) = l.peer.as_mut().filter(|p| p.due(now)) {
                    p.export(l.active.worker.chain_mut(), now);
                }
            }
        }
        if std::mem::take(&mut self.busy) {
            for l in self.lanes.iter_mut().filter(|l| l.packets_in > 0) {
                l.active.tick(&ctx.shared);
            }
        }
        if now.saturating_duration_since(self.last_report) >= REPORT_EVERY {
            self.last_report = now;
            // Windows close on time also without traffic, and the
            // workers' eventual updates reach the host's view (and the
            // group's) though no packet comes to merge them.
            for l in &mut self.lanes {
                l.active.tick(&ctx.shared);
                for stage in l.active.worker.chain_mut().stages_mut() {
                    stage.flush_state();
                }
            }
            ctx.report(&mut self.lanes, &self.dispatch, self.io.as_ref());
        }
    }
}

/// The counters of a live host's own decisions, kept in the host report.
#[derive(Debug, Default)]
struct WorkerCounts {
    queues: Vec<QueueCounters>,
    unmatched: u64,
    refused_egress: u64,
    over_share: u64,
    not_running: u64,
    uncommitted: u64,
    /// With stage times.
    stages: Option<sluice_runtime::StageTimes>,
}

/// The live workers of a host.
pub(crate) struct Live {
    commands: Vec<crossbeam_channel::Sender<WorkerCommand>>,
    threads: Vec<std::thread::JoinHandle<()>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    /// Whether workers may poll their ports (set once the host has
    /// converged on its group's deployments at start).
    open: Arc<std::sync::atomic::AtomicBool>,
    counts: Arc<Mutex<Vec<WorkerCounts>>>,
    port_stats: Arc<dyn Fn() -> Vec<PortReport> + Send + Sync>,
    /// Deployment id → digest of the revision handed out.
    pub(crate) deployments: HashMap<String, String>,
    shared: Shared,
}

impl Live {
    /// Starts one worker per I/O.
    pub(crate) fn start(shared: &Shared, input: LiveInput, batch: usize) -> Result<Live, String> {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let open = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let counts =
            Arc::new(Mutex::new((0..input.ios.len()).map(|_| WorkerCounts::default()).collect::<Vec<WorkerCounts>>()));
        let mut commands = Vec::new();
        let mut threads = Vec::new();
        for (w, io) in input.ios.into_iter().enumerate() {
            let (tx, rx) = crossbeam_channel::unbounded();
            let ctx = WorkerCtx {
                w,
                shared: shared.clone(),
                ports: input.ports.clone(),
                unmatched: input.unmatched,
                batch,
                core: input.cores.for_worker(w),
                on_thread: input.on_thread.clone(),
                stop: stop.clone(),
                open: open.clone(),
                counts: counts.clone(),
                stage_times: input.stage_times,
            };
            let t = std::thread::Builder::new()
                .name(format!("live-{w}"))
                .spawn(move || ctx.run(io, rx))
                .map_err(|e| format!("cannot start live worker {w}: {e}"))?;
            commands.push(tx);
            threads.push(t);
        }
        Ok(Live {
            commands,
            threads,
            stop,
            open,
            counts,
            port_stats: input.port_stats,
            deployments: HashMap::new(),
            shared: shared.clone(),
        })
    }

    /// Lets workers poll their ports: called once the deployments the
    /// group had when the host joined were handed out, so their traffic
    /// is not taken for unclaimed while they start.
    pub(crate) fn open(&self) {
        self.open.store(true, std::sync::atomic::Ordering::Release);
    }

    /// Hands a revision to every worker. A deployment new to the workers
    /// (or retried) has its chains instantiated and started here, off the
    /// workers, one per worker in parallel: a start (up to the start
    /// deadline) never holds the traffic of the deployments already
    /// running there.
    pub(crate) async fn apply(&mut self, prepared: Prepared, digest: String) {
        let fresh = self.deployments.get(&prepared.spec.id).is_none_or(String::is_empty);
        let mut chains: Vec<Option<Box<Result<Chain, String>>>> = self.commands.iter().map(|_| None).collect();
        if fresh && prepared.built.is_ok() {
            let built = Arc::new(prepared.built.clone());
            let spec = Arc::new(prepared.spec.clone());
            let tasks: Vec<_> = self
                .commands
                .iter()
                .map(|_| {
                    let (shared, built, spec) = (self.shared.clone(), built.clone(), spec.clone());
                    tokio::task::spawn_blocking(move || prepare::chain_of(&shared, &built, &spec))
                })
                .collect();
            for (slot, t) in chains.iter_mut().zip(tasks) {
                *slot = Some(Box::new(t.await.unwrap_or_else(|e| Err(format!("starting the chain failed: {e}")))));
            }
        }
        // The NFs' global eventual tables are merged over the group.
        if let (Some(peer), Ok((_, _, domains))) = (&self.shared.peer, &prepared.built) {
            let nfs = &prepared.spec.nfs;
            let shape = format!("{:?}", nfs.iter().map(|n| (&n.name, &n.next, &n.labels)).collect::<Vec<_>>());
            peer.register(
                &prepared.spec.id,
                shape,
                nfs.iter().map(|n| n.name.clone()).zip(domains.iter().cloned()).collect(),
            );
        }
        self.deployments.insert(prepared.spec.id.clone(), digest);
        for (c, chain) in self.commands.iter().zip(chains) {
            let _ = c.send(WorkerCommand::Apply(Box::new(prepared.clone()), chain));
        }
    }

    /// Removes a deployment from every worker, waiting until each has
    /// closed its meter window.
    pub(crate) async fn remove(&mut self, id: &str) {
        self.deployments.remove(id);
        if let Some(p) = &self.shared.peer {
            p.unregister(id);
        }
        let mut acks = Vec::new();
        for c in &self.commands {
            let (tx, rx) = crossbeam_channel::bounded(1);
            if c.send(WorkerCommand::Remove(id.to_string(), tx)).is_ok() {
                acks.push(rx);
            }
        }
        let _ = tokio::task::spawn_blocking(move || {
            for a in acks {
                let _ = a.recv_timeout(Duration::from_secs(30));
            }
        })
        .await;
    }

    /// Puts the ports' and workers' counters into the host report.
    pub(crate) fn report(&self, shared: &Shared) {
        let mut ports = (self.port_stats)();
        let (mut unmatched, mut refused, mut over_share, mut not_running, mut uncommitted) = (0, 0, 0, 0, 0);
        let mut stages: Option<sluice_runtime::StageTimes> = None;
        {
            let counts = self.counts.lock();
            for c in counts.iter() {
                if let Some(s) = &c.stages {
                    stages.get_or_insert_default().add(s);
                }
                unmatched += c.unmatched;
                refused += c.refused_egress;
                over_share += c.over_share;
                not_running += c.not_running;
                uncommitted += c.uncommitted;
                for (p, q) in ports.iter_mut().zip(&c.queues) {
                    p.queues.push(q.clone());
                }
            }
        }
        let mut r = shared.report.lock();
        r.ports = ports;
        r.unmatched = unmatched;
        r.refused_egress = refused;
        r.over_share = over_share;
        r.not_running = not_running;
        r.uncommitted = uncommitted;
        r.stages = stages.map(|s| s.per_packet());
    }

    /// Stops every worker after it closed its deployments' meter windows.
    pub(crate) async fn stop(self, shared: &Shared) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        drop(self.commands);
        let threads = self.threads;
        let _ = tokio::task::spawn_blocking(move || {
            for t in threads {
                let _ = t.join();
            }
        })
        .await;
        let last = Live {
            commands: Vec::new(),
            threads: Vec::new(),
            stop: self.stop,
            open: self.open,
            counts: self.counts,
            port_stats: self.port_stats,
            deployments: HashMap::new(),
            shared: self.shared,
        };
        last.report(shared);
    }
}

/// What a worker thread needs.
struct WorkerCtx {
    w: usize,
    shared: Shared,
    ports: Vec<u16>,
    unmatched: Unmatched,
    batch: usize,
    core: Option<usize>,
    on_thread: Arc<dyn Fn() -> Result<ThreadGuard, String> + Send + Sync>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    open: Arc<std::sync::atomic::AtomicBool>,
    counts: Arc<Mutex<Vec<WorkerCounts>>>,
    stage_times: bool,
}

/// How often a worker moves its counts into the host report and
/// deployment statuses.
const REPORT_EVERY: Duration = Duration::from_millis(50);
/// How often a busy worker takes its lanes' events and checks their
/// meter windows and checkpoints.
const TICK_EVERY: Duration = Duration::from_millis(1);
/// Sleep between polls of an idle worker (cut short when another host of
/// its group sends a request or an answer: see `Peer::wake_me_on_arrivals`).
const IDLE_SLEEP: Duration = Duration::from_micros(200);

impl WorkerCtx {
    fn run(self, mut io: Box<dyn PacketIo + Send>, rx: crossbeam_channel::Receiver<WorkerCommand>) {
        let w = self.w;
        let on = sluice_engine::cores::pin_worker(&format!("live worker {w}"), self.core);
        let _guard = match (self.on_thread)() {
            Ok(g) => g,
            Err(e) => {
                tracing::error!(worker = w, "live worker cannot start: {e}");
                return;
            }
        };
        tracing::info!(worker = w, cores = %on, "live worker running");
        let mut dispatch = Dispatch::new(self.ports.clone(), self.unmatched);
        if self.stage_times {
            dispatch.time_stages(io.as_mut());
        }
        let raised = self.shared.peer.as_ref().map(|p| p.wake_me_on_arrivals());
        let now = Instant::now();
        let mut pass = LivePass {
            ctx: &self,
            rx,
            io,
            lanes: Vec::new(),
            claims: Vec::new(),
            classifier: Classifier::default(),
            dispatch,
            // The worker's time, shared equally by the tenants whose
            // packets wait for it.
            fair: FairShare::new(),
            raised,
            busy: false,
            open: false,
            last_report: now,
        };
        Driver::new(Backoff::sleeping(IDLE_SLEEP)).stop_on(&self.stop).tick_every(TICK_EVERY).run(&mut pass);
        let LivePass { mut lanes, dispatch, io, .. } = pass;
        if let Some(p) = &self.shared.peer {
            p.stop_waking_me();
        }
        for l in &mut lanes {
            deployment::flush(&self.shared, &mut l.active);
        }
        self.report(&mut lanes, &dispatch, io.as_ref());
    }

    fn obey(
        &self,
        command: WorkerCommand,
        lanes: &mut Vec<LiveLane>,
        claims: &mut Vec<(String, Vec<Attachment>)>,
        fair: &FairShare,
    ) {
        let id = match &command {
            WorkerCommand::Apply(p, _) => p.spec.id.clone(),
            WorkerCommand::Remove(id, _) => id.clone(),
        };
        claims.retain(|(c, _)| *c != id);
        match command {
            WorkerCommand::Apply(p, chain) => match lanes.iter().position(|l| l.active.spec.id == p.spec.id) {
                Some(i) => {
                    let LiveLane { active, share, packets_in, packets_out, over_share, peer, .. } = lanes.remove(i);
                    // The traffic claim follows the desired revision even
                    // when its NFs are refused and the running ones stay:
                    // the gateway has already given up what it released.
                    let attachments = p.spec.attachments.clone();
                    if let Some(active) = deployment::update(&self.shared, Some(active), *p) {
                        // A change of durability takes a new lane peer (its
                        // kept outputs are let go by their time limit).
                        let replicated = active.spec.durability == sluice_control::Durability::Replicated;
                        let peer = match (peer, &self.shared.peer) {
                            (Some(old), Some(p)) if old.commits() != replicated => {
                                Some(p.lane(&active.spec.id, replicated))
                            }
                            (peer, _) => peer,
                        };
                        lanes.insert(
                            i,
                            LiveLane { active, attachments, share, packets_in, packets_out, over_share, peer },
                        );
                    }
                }
                None => {
                    let name = journal::name_of(&p.spec.id, Some(self.w));
                    let resume = self.shared.journal.read(&name);
                    let attachments = p.spec.attachments.clone();
                    let started = deployment::start(&self.shared, *p, resume, Some(self.w), chain.map(|c| *c));
                    if started.is_none() {
                        claims.push((id, attachments));
                    }
                    if let Some(active) = started {
                        let attachments = active.spec.attachments.clone();
                        let share = fair.join(0, &active.spec.tenant);
                        let replicated = active.spec.durability == sluice_control::Durability::Replicated;
                        let peer = self.shared.peer.as_ref().map(|p| p.lane(&active.spec.id, replicated));
                        lanes.push(LiveLane {
                            peer,
                            active,
                            attachments,
                            share,
                            packets_in: 0,
                            packets_out: 0,
                            over_share: 0,
                        });
                    }
                }
            },
            WorkerCommand::Remove(id, ack) => {
                if let Some(i) = lanes.iter().position(|l| l.active.spec.id == id) {
                    let mut lane = lanes.remove(i);
                    deployment::flush(&self.shared, &mut lane.active);
                    self.report_lane(&mut lane);
                }
                let _ = ack.send(());
            }
        }
    }

    fn report_lane(&self, l: &mut LiveLane) {
        l.active.report_chain(&self.shared);
        if l.packets_in == 0 && l.over_share == 0 {
            return;
        }
        let id = &l.active.spec.id;
        {
            let mut r = self.shared.report.lock();
            let d = r.deployments.entry(id.clone()).or_default();
            d.name.clone_from(&l.active.spec.name);
            d.tenant.clone_from(&l.active.spec.tenant);
            d.packets_in += l.packets_in;
            d.packets_out += l.packets_out;
            d.dropped_over_share += l.over_share;
        }
        if l.over_share > 0 && sluice_telemetry::metrics::enabled() {
            let s = &l.active.spec;
            let attrs = [
                opentelemetry::KeyValue::new("tenant", s.tenant.clone()),
                opentelemetry::KeyValue::new("deployment", s.id.clone()),
                opentelemetry::KeyValue::new("host", self.shared.host.clone()),
            ];
            sluice_telemetry::metrics::deployment().over_share.add(l.over_share, &attrs);
        }
        if let Some(s) = self.shared.status.lock().get_mut(id) {
            s.packets += l.packets_in;
        }
        l.packets_in = 0;
        l.packets_out = 0;
        l.over_share = 0;
    }

    fn report(&self, lanes: &mut [LiveLane], dispatch: &Dispatch, io: &dyn PacketIo) {
        for l in lanes.iter_mut() {
            self.report_lane(l);
        }
        let mut counts = self.counts.lock();
        if let Some(c) = counts.get_mut(self.w) {
            let d = dispatch.counters();
            c.unmatched = d.unmatched;
            c.refused_egress = d.refused_egress;
            c.over_share = d.over_share;
            c.not_running = d.not_running;
            c.uncommitted = d.uncommitted;
            c.queues = io.queue_counters().to_vec();
            if self.stage_times {
                c.stages = Some(dispatch.stage_times(io));
            }
        }
    }
}
