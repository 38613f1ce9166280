//! One deployment on this host: its chain of NF instances, the traffic it
//! is given, its output, and its meter windows, checkpointed to its
//! [`journal`](crate::journal) so a killed host bills exactly what it kept.
//! Runs on its own thread (NF calls are synchronous and CPU-bound); the
//! agent talks to it over a channel.

mod window;

use crate::journal::{self, Checkpoint, Position};
use crate::outbox;
use crate::prepare::{Prepared, apply_sides, chain_of, new_chain};
use crate::shared::Shared;
use sluice_control::{DeploymentSpec, EventBatch, HostState, NfEvent, now_ms};
use sluice_engine::idle::Backoff;
use sluice_engine::{CaptureIo, Dispatch, Driver, Order, Pass, Receive, Unmatched, Worker};
use sluice_pcap::{PcapAppender, Trace};
use sluice_runtime::{Chain, Fate, Meters, PacketResult, RawPacket};
use sluice_telemetry::metrics;
use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A capture to process: one pass of it, or the deployment's share of it.
#[derive(Clone)]
pub struct Capture {
    /// The packets.
    pub trace: Arc<Trace>,
    /// Its name (the spool file's, or the replayed file's).
    pub name: String,
    /// Replay pass (0 for spool captures).
    pub pass: u64,
    /// Whether it came from the spool (the agent is told when it is done).
    pub spooled: bool,
    /// The indices of the packets that are this deployment's (its
    /// attachments' share, ascending); none: every packet (a development
    /// deployment, without attachments).
    pub packets: Option<Arc<Vec<usize>>>,
}

/// What the agent tells a deployment.
pub enum Control {
    /// Process a capture.
    Trace(Capture),
    /// Move to another revision (hot swap where the chain keeps its shape).
    Update(Box<Prepared>),
    /// Flush meters and stop.
    Stop,
}

/// A running chain, its meter window, its output and where it is in its
/// input: one per deployment thread, or per deployment and worker of a
/// live host.
pub(crate) struct Active {
    pub(crate) spec: DeploymentSpec,
    /// The worker of a live host this runs on (its journal is
    /// `<deployment>.w<worker>`); none: the deployment's own thread.
    lane: Option<usize>,
    /// The chain, on the data path every host mode shares.
    pub(crate) worker: Worker,
    /// Cumulative meters of each NF at the start of the window.
    base: Vec<Meters>,
    window_start_ms: u64,
    window_started: Instant,
    /// Events of the window, sent when it closes.
    events: Vec<NfEvent>,
    /// Events over [`MAX_EVENTS_PER_WINDOW`] in this window.
    events_dropped: u64,
    /// Bytes of the window's events so far.
    event_bytes: usize,
    /// Record ids of this run: `<record_prefix>-<window>-<nf>`.
    record_prefix: String,
    window: u64,
    /// Forwarded packets, if the host keeps them.
    output: Option<PcapAppender>,
    /// Where in its input it is, and the spool captures it finished.
    position: Option<Position>,
    finished: BTreeSet<String>,
    last_checkpoint: Instant,
    /// Packets the worker had run at the last checkpoint.
    checkpointed: u64,
    /// Per NF: state held over the window, byte-microseconds, and the
    /// bytes at the latest sample.
    state_byte_us: Vec<u128>,
    state_bytes: Vec<u64>,
    last_state_sample: Instant,
    /// The host it runs on (metrics name it).
    host: String,
    /// Its chain's counters when they were last reported.
    chain_reported: sluice_runtime::ChainCounters,
    /// The trace of the revision started or applied last, until its first
    /// batch ran.
    first_batch: Option<opentelemetry::Context>,
    /// Per NF: its metrics' attributes (for the revision in
    /// `metric_revision`), and its invocations and guest time at the last
    /// batch observed.
    metric_attrs: Vec<Vec<opentelemetry::KeyValue>>,
    metric_revision: Option<u64>,
    guest_seen: Vec<(u64, u64)>,
}

/// Events sent per deployment and window; the rest are counted (and all
/// are metered). An NF that logs every packet would otherwise turn the
/// event feed into a copy of the traffic.
pub const MAX_EVENTS_PER_WINDOW: usize = 1000;
/// Event bytes (kind and fields) a deployment may send per meter window;
/// more are dropped and counted.
pub const MAX_EVENT_BYTES_PER_WINDOW: usize = 1 << 20;

impl Active {
    fn new(
        shared: &Shared,
        spec: DeploymentSpec,
        chain: Chain,
        resume: Option<Checkpoint>,
        lane: Option<usize>,
    ) -> Result<Self, String> {
        let base = vec![Meters::default(); spec.nfs.len()];
        let spec_nfs = spec.nfs.len();
        let mut secret = [0u8; 12];
        getrandom::fill(&mut secret).map_err(|e| format!("no randomness from the OS: {e}"))?;
        let resume = resume.unwrap_or_default();
        let output = match &shared.output_dir {
            Some(dir) if lane.is_none() => {
                let path = dir.join(format!("{}.pcap", spec.id));
                Some(PcapAppender::open(&path, resume.output_len).map_err(|e| e.to_string())?)
            }
            _ => None,
        };
        let guest_seen = chain.stages().iter().map(|s| (s.meters().invocations, s.meters().cpu_ns)).collect();
        Ok(Active {
            spec,
            lane,
            worker: Worker::new(chain),
            base,
            window_start_ms: now_ms(),
            window_started: Instant::now(),
            events: Vec::new(),
            events_dropped: 0,
            event_bytes: 0,
            // A secret of this run in every record id: nobody else can
            // claim the ids first.
            record_prefix: format!("{}-{}", shared.host, hex::encode(secret)),
            window: 0,
            output,
            position: resume.position,
            finished: resume.finished,
            last_checkpoint: Instant::now(),
            checkpointed: 0,
            state_byte_us: vec![0; spec_nfs],
            state_bytes: vec![0; spec_nfs],
            last_state_sample: Instant::now(),
            host: shared.host.clone(),
            chain_reported: sluice_runtime::ChainCounters::default(),
            first_batch: None,
            metric_attrs: Vec::new(),
            metric_revision: None,
            guest_seen,
        })
    }

    /// Integrates the state each NF holds since the last sample: what
    /// billing charges as state byte-ms. Sampled after every batch and on
    /// idle ticks, so a lane that holds state without traffic pays too.
    pub(crate) fn sample_state(&mut self) {
        let now = Instant::now();
        let us = now.duration_since(self.last_state_sample).as_micros();
        self.last_state_sample = now;
        let stages = self.worker.chain().stages();
        for ((stage, acc), held) in stages.iter().zip(self.state_byte_us.iter_mut()).zip(self.state_bytes.iter_mut()) {
            // The bytes held since the last sample are those seen then.
            *acc = acc.saturating_add(u128::from(*held) * us);
            *held = stage.state_bytes();
        }
    }

    /// Each NF's metrics attributes, for the running revision.
    fn metric_attrs(&mut self) -> &[Vec<opentelemetry::KeyValue>] {
        if self.metric_revision != Some(self.spec.revision) || self.metric_attrs.len() != self.spec.nfs.len() {
            let s = &self.spec;
            self.metric_attrs = s
                .nfs
                .iter()
                .map(|nf| metrics::nf_attributes(&s.tenant, &s.id, &nf.name, &nf.module.version, &self.host))
                .collect();
            self.metric_revision = Some(s.revision);
        }
        &self.metric_attrs
    }

    /// After a batch: each NF that ran in it adds its time in the guest to
    /// the guest-time histogram (nothing when no metrics are collected).
    pub(crate) fn observe_batch(&mut self) {
        if let Some(cx) = self.first_batch.take() {
            let span = tracing::info_span!("first batch", deployment = %self.spec.id, revision = self.spec.revision);
            sluice_telemetry::context::start_under(&span, &cx);
        }
        if !metrics::enabled() {
            return;
        }
        let n = self.worker.chain().stages().len();
        if self.guest_seen.len() != n {
            self.guest_seen =
                self.worker.chain().stages().iter().map(|s| (s.meters().invocations, s.meters().cpu_ns)).collect();
            return;
        }
        self.metric_attrs();
        let histogram = &metrics::nf().guest_time;
        for ((stage, seen), attrs) in
            self.worker.chain().stages().iter().zip(&mut self.guest_seen).zip(&self.metric_attrs)
        {
            let m = stage.meters();
            let calls = m.invocations.saturating_sub(seen.0);
            if calls > 0 {
                let ns = m.cpu_ns.saturating_sub(seen.1);
                histogram.record(ns as f64 * 1e-9 / calls as f64, attrs);
                *seen = (m.invocations, m.cpu_ns);
            }
        }
    }

    /// Writes the output buffered so far and the checkpoint that accounts
    /// for it (at once, see [`crate::journal`]).
    pub(crate) fn checkpoint(&mut self, shared: &Shared) {
        self.checkpoint_with(shared, true);
    }

    /// Writes the output buffered so far and hands over the checkpoint
    /// that accounts for it, or writes it at once (`now`).
    fn checkpoint_with(&mut self, shared: &Shared, now: bool) {
        let output_len = match self.output.as_mut().map(PcapAppender::flush) {
            Some(Ok(len)) => Some(len),
            Some(Err(e)) => {
                tracing::error!(deployment = %self.spec.id, "writing the output: {e}");
                None
            }
            None => None,
        };
        if let Some(spool) = &shared.spool_dir {
            self.finished.retain(|f| spool.join(f).exists());
        }
        let c = Checkpoint {
            deployment: self.spec.id.clone(),
            worker: self.lane,
            tenant: self.spec.tenant.clone(),
            record_prefix: self.record_prefix.clone(),
            window: self.window,
            window_start_ms: self.window_start_ms,
            nfs: self.window_sums(),
            position: self.position.clone(),
            finished: self.finished.clone(),
            output_len,
        };
        if !now {
            shared.journal.write(c);
        } else if let Err(e) = shared.journal.write_now(&c) {
            tracing::error!(deployment = %self.spec.id, "cannot write the checkpoint: {e}");
        }
        self.last_checkpoint = Instant::now();
        self.checkpointed = self.worker.packets();
    }

    /// Takes the chain's pending events into the window.
    pub(crate) fn collect_events(&mut self) {
        for e in self.worker.drain_events() {
            let size = e.event.fields.iter().fold(e.event.kind.len(), |n, (k, v)| n + k.len() + v.len());
            if self.events.len() >= MAX_EVENTS_PER_WINDOW || self.event_bytes + size > MAX_EVENT_BYTES_PER_WINDOW {
                self.events_dropped += 1;
                continue;
            }
            self.event_bytes += size;
            let version = self.spec.nfs.iter().find(|n| *n.name == *e.nf).map(|n| n.module.version.clone());
            self.events.push(NfEvent {
                tenant: self.spec.tenant.clone(),
                deployment: self.spec.id.clone(),
                nf: e.nf.to_string(),
                version: version.unwrap_or_default(),
                kind: e.event.kind,
                level: sluice_runtime::bindings::level_name(e.event.level).into(),
                timestamp_ns: e.timestamp_ns,
                flow: e.flow.map(|k| k.to_string()),
                fields: e.event.fields.into_iter().collect(),
            });
        }
    }
}

/// The deployment thread: starts the chain, then serves `rx` until `Stop`.
pub fn run(shared: Shared, prepared: Prepared, rx: crossbeam_channel::Receiver<Control>, replay: Vec<Capture>) {
    let spec = &prepared.spec;
    let id = spec.id.clone();
    // The core fewest other deployments hold, until this thread ends.
    let lease = shared.cores.lease();
    if lease.as_ref().is_some_and(sluice_engine::cores::CoreLease::shared) {
        tracing::info!(deployment = %id, "more deployments than cores: this one shares a core; deadlines count CPU time, so sharing slows it but does not make its NFs trap");
    }
    let on = sluice_engine::cores::pin_worker(&id, lease.as_ref().map(sluice_engine::cores::CoreLease::core));
    // Its tenant's share of that core, charged after every batch.
    let mut share = lease.as_ref().map(|l| shared.fair.join(l.core(), &spec.tenant));
    {
        let mut r = shared.report.lock();
        let d = r.deployments.entry(id.clone()).or_default();
        d.name = spec.name.clone();
        d.tenant = spec.tenant.clone();
        d.cores = on;
    }
    let resume = shared.journal.read(&spec.id);
    let mut active = start(&shared, prepared, resume, None, None);
    let mut queue: VecDeque<Capture> = VecDeque::new();
    if active.is_some() {
        queue.extend(replay.iter().cloned());
    }
    loop {
        let msg = match queue.pop_front() {
            Some(t) => Control::Trace(t),
            None => match rx.recv() {
                Ok(m) => m,
                Err(_) => Control::Stop,
            },
        };
        match msg {
            Control::Trace(input) => {
                if active.is_none() {
                    if input.spooled {
                        let _ = shared.finished.send((id.clone(), input.name.clone()));
                    }
                    continue;
                }
                let flow = process(&shared, &mut active, &input, &rx, &mut queue, &mut share);
                if let Some(a) = active.as_mut() {
                    flush(&shared, a);
                }
                shared.report.lock().traces += 1;
                if matches!(flow, Flow::Stop) {
                    break;
                }
            }
            Control::Update(p) => active = update(&shared, active.take(), *p),
            Control::Stop => break,
        }
    }
    if let Some(a) = active.as_mut() {
        flush(&shared, a);
    }
    tracing::info!(deployment = %id, "deployment stopped");
}

enum Flow {
    Continue,
    Stop,
}

/// Starts a deployment; `chain` is its chain if it was started elsewhere
/// (a live host starts chains off its workers), else it is started here.
pub(crate) fn start(
    shared: &Shared,
    prepared: Prepared,
    resume: Option<Checkpoint>,
    lane: Option<usize>,
    chain: Option<Result<Chain, String>>,
) -> Option<Active> {
    let span = traced("start", &prepared, lane);
    let _in = span.enter();
    let chain = chain.unwrap_or_else(|| chain_of(shared, &prepared.built, &prepared.spec));
    let Prepared { spec, trace, .. } = prepared;
    let made = chain.and_then(|chain| Active::new(shared, spec.clone(), chain, resume, lane));
    match made {
        Ok(mut a) => {
            a.first_batch = trace;
            tracing::info!(deployment = %spec.id, revision = spec.revision, "deployment running");
            shared.retries.started(&spec.id);
            shared.set_status(&spec, HostState::Running, None);
            a.checkpoint(shared);
            Some(a)
        }
        Err(reason) => {
            let (attempt, wait) = shared.retries.failed(&spec.id);
            let reason = format!("{reason} (attempt {attempt}; the host retries in {} s)", wait.as_secs());
            tracing::warn!(deployment = %spec.id, revision = spec.revision, "deployment failed: {reason}");
            shared.set_status(&spec, HostState::Failed, Some(reason));
            None
        }
    }
}

/// A span of the host's work on `prepared`, in the trace of the change
/// that asked for it (disabled, at no cost, when there is none).
fn traced(what: &'static str, prepared: &Prepared, lane: Option<usize>) -> tracing::Span {
    let Some(cx) = &prepared.trace else { return tracing::Span::none() };
    let span = tracing::info_span!("apply on worker", step = what, deployment = %prepared.spec.id, revision = prepared.spec.revision, worker = lane);
    sluice_telemetry::context::start_under(&span, cx);
    span
}

/// Applies a new revision. Same NFs and routes: each NF whose module or
/// config changed is hot-swapped, keeping its state. Otherwise the chain
/// is rebuilt. A refused update leaves the running revision in place.
pub(crate) fn update(shared: &Shared, active: Option<Active>, prepared: Prepared) -> Option<Active> {
    let Some(mut a) = active else { return start(shared, prepared, None, None, None) };
    let span = traced("update", &prepared, a.lane);
    let _in = span.enter();
    let Prepared { spec, built, trace } = prepared;
    a.first_batch = trace;
    flush(shared, &mut a);
    let same_shape = a.spec.nfs.len() == spec.nfs.len()
        && a.spec.nfs.iter().zip(&spec.nfs).all(|(o, n)| o.name == n.name && o.next == n.next && o.labels == n.labels);
    if !same_shape {
        return match built.and_then(|(specs, routes, domains)| new_chain(shared, &specs, routes, &domains, &spec)) {
            Ok(chain) => {
                // The new chain continues where the old one was.
                a.worker.replace_chain(chain);
                a.guest_seen = vec![(0, 0); spec.nfs.len()];
                a.base = vec![Meters::default(); spec.nfs.len()];
                a.state_byte_us = vec![0; spec.nfs.len()];
                a.state_bytes = vec![0; spec.nfs.len()];
                shared.set_status(&spec, HostState::Running, None);
                a.spec = spec;
                a.checkpoint(shared);
                Some(a)
            }
            Err(reason) => {
                let reason = format!("{reason}; revision {} keeps running", a.spec.revision);
                shared.set_status(&spec, HostState::Failed, Some(reason));
                Some(a)
            }
        };
    }
    // The same NFs: the sides of the attachments and the fragment mode may
    // still have changed.
    if let Err(reason) = apply_sides(a.worker.chain_mut(), &spec) {
        let reason = format!("{reason}; revision {} keeps running", a.spec.revision);
        shared.set_status(&spec, HostState::Failed, Some(reason));
        return Some(a);
    }
    let (specs, _, _) = match built {
        Ok(x) => x,
        Err(reason) => {
            let reason = format!("{reason}; revision {} keeps running", a.spec.revision);
            shared.set_status(&spec, HostState::Failed, Some(reason));
            return Some(a);
        }
    };
    for ((old, new), nf_spec) in a.spec.nfs.clone().iter().zip(&spec.nfs).zip(specs) {
        if old.module.digest == new.module.digest && old.config == new.config && old.limits == new.limits {
            continue;
        }
        if let Err(e) = a.worker.swap(&shared.runtime, &new.name, nf_spec) {
            let reason = format!("{e}; revision {} keeps running", a.spec.revision);
            shared.set_status(&spec, HostState::Failed, Some(reason));
            return Some(a);
        }
        tracing::info!(deployment = %spec.id, nf = %new.name, version = %new.module.version, "hot swap done");
        if let Some(o) = a.spec.nfs.iter_mut().find(|o| o.name == new.name) {
            *o = new.clone();
        }
    }
    shared.set_status(&spec, HostState::Running, None);
    a.spec = spec;
    Some(a)
}

/// Runs a capture through the chain, batch by batch, from where the
/// deployment's checkpoint says it was. Between batches it applies
/// updates (so a swap takes effect mid-capture, losing no packet), queues
/// further captures, checkpoints, and closes meter windows.
fn process(
    shared: &Shared,
    slot: &mut Option<Active>,
    input: &Capture,
    rx: &crossbeam_channel::Receiver<Control>,
    queue: &mut VecDeque<Capture>,
    share: &mut Option<sluice_engine::Share>,
) -> Flow {
    let trace = &input.trace;
    let start_at = match slot.as_ref() {
        Some(a) if input.spooled && a.finished.contains(&input.name) => None,
        Some(a) => match &a.position {
            // A killed run was here: resume (an earlier pass is done).
            Some(p) if p.input == input.name && p.pass > input.pass => None,
            Some(p) if p.input == input.name && p.pass == input.pass => Some(p.packet),
            _ => Some(0),
        },
        None => None,
    };
    let (Some(start_at), Some(a)) = (start_at, slot.as_mut()) else {
        // Finished before a kill: nothing to do again.
        if let (true, Some(a)) = (input.spooled, slot.as_ref()) {
            let _ = shared.finished.send((a.spec.id.clone(), input.name.clone()));
        }
        return Flow::Continue;
    };
    if start_at > 0 {
        tracing::info!(
            deployment = %a.spec.id,
            input = %input.name,
            pass = input.pass,
            packet = start_at,
            "resuming a capture where the checkpoint of a stopped run left it"
        );
    }
    a.position = Some(Position { input: input.name.clone(), pass: input.pass, packet: start_at });
    let total = trace.packets().len();
    let mut pass = Replay {
        shared,
        slot: &mut *slot,
        input,
        rx,
        queue,
        share,
        dispatch: Dispatch::new(Vec::new(), Unmatched::Drop),
        next: usize::try_from(start_at).unwrap_or(usize::MAX).min(total),
        started: Instant::now(),
        done: 0,
        packets_in: 0,
        packets_out: 0,
        paused: Duration::ZERO,
        outcome: Flow::Continue,
        completed: true,
    };
    Driver::new(Backoff::polling()).run(&mut pass);
    let Replay { completed, packets_in, packets_out, paused, outcome, .. } = pass;
    if let Some(a) = slot.as_mut() {
        if completed {
            // A replay goes on with its next pass; a spool capture is done.
            a.position =
                (!input.spooled).then(|| Position { input: input.name.clone(), pass: input.pass + 1, packet: 0 });
            if input.spooled {
                a.finished.insert(input.name.clone());
            }
            a.checkpoint(shared);
            if input.spooled {
                let _ = shared.finished.send((a.spec.id.clone(), input.name.clone()));
            }
        }
        {
            let mut r = shared.report.lock();
            let d = r.deployments.entry(a.spec.id.clone()).or_default();
            d.packets_in += packets_in;
            d.packets_out += packets_out;
            d.paused_ms += u64::try_from(paused.as_millis()).unwrap_or(u64::MAX);
        }
        a.report_chain(shared);
        if let Some(s) = shared.status.lock().get_mut(&a.spec.id) {
            s.packets += packets_in;
        }
    }
    outcome
}

/// One capture's replay through a deployment's chain (see [`process`]).
struct Replay<'a> {
    shared: &'a Shared,
    slot: &'a mut Option<Active>,
    input: &'a Capture,
    rx: &'a crossbeam_channel::Receiver<Control>,
    queue: &'a mut VecDeque<Capture>,
    share: &'a mut Option<sluice_engine::Share>,
    dispatch: Dispatch,
    /// The capture index of the next packet.
    next: usize,
    started: Instant,
    done: u64,
    packets_in: u64,
    packets_out: u64,
    paused: Duration,
    outcome: Flow,
    /// Whether the capture ran to its end (not stopped, not removed).
    completed: bool,
}

impl Pass for Replay<'_> {
    /// Commands first, then, unless stopped or over its tenant's share, a
    /// batch: forwarded packets go to the output, if the host keeps one.
    fn pass(&mut self) -> Receive {
        let shared = self.shared;
        while let Ok(msg) = self.rx.try_recv() {
            match msg {
                Control::Trace(t) => self.queue.push_back(t),
                Control::Update(p) => *self.slot = update(shared, self.slot.take(), *p),
                Control::Stop => self.outcome = Flow::Stop,
            }
        }
        let Some(a) = self.slot.as_mut() else {
            self.completed = false;
            return Receive::Done;
        };
        if matches!(self.outcome, Flow::Stop) {
            self.completed = false;
            return Receive::Done;
        }
        // Over its tenant's share of a core others use: leave it to them.
        if let Some(pause) = self.share.as_mut().and_then(sluice_engine::Share::pause) {
            self.paused += pause;
            std::thread::sleep(pause);
            return Receive::Idle;
        }
        let (trace, total) = (&self.input.trace, self.input.trace.packets().len());
        let (output, id) = (&mut a.output, &a.spec.id);
        let mut forwarded = 0u64;
        let order = match self.input.packets.as_deref() {
            // Its share of the capture, from where it is.
            Some(mine) => Order::List(mine.get(mine.partition_point(|&i| i < self.next)..).unwrap_or(&[])),
            None => Order::Range(self.next..total),
        };
        let mut io = CaptureIo::new(trace, order, |_, p: RawPacket<'_>, r: &PacketResult| {
            if !matches!(r.fate, Fate::Forward(_)) {
                return;
            }
            for frame in r.frames(p.data) {
                forwarded += 1;
                let Some(out) = output.as_mut() else { continue };
                // Unchanged bytes keep their capture's wire length.
                let wire_len = if std::ptr::eq(frame, p.data) {
                    p.wire_len
                } else {
                    u32::try_from(frame.len()).unwrap_or(u32::MAX)
                };
                if let Err(e) = out.push(p.timestamp_ns, wire_len, frame) {
                    tracing::warn!(deployment = %id, "a packet was not written to the output: {e}");
                }
            }
        });
        let got = self.dispatch.step_one(&mut io, shared.batch_size.max(1), &mut a.worker);
        let Receive::Packets(n) = got else { return Receive::Done };
        self.next = io.next_index();
        self.packets_out += forwarded;
        self.packets_in += n as u64;
        if let Some(p) = a.position.as_mut() {
            p.packet = self.next as u64;
        }
        self.done += n as u64;
        a.observe_batch();
        a.tick(shared);
        if let Some(s) = self.share.as_mut() {
            s.charge();
        }
        if let Some(pps) = shared.pps.filter(|p| *p > 0) {
            let due = Duration::from_secs_f64(self.done as f64 / pps as f64);
            if let Some(wait) = due.checked_sub(self.started.elapsed()) {
                std::thread::sleep(wait);
            }
        }
        got
    }
}

impl Active {
    /// Adds what its chain decided without an NF since the last call to
    /// the host report and the metrics.
    pub(crate) fn report_chain(&mut self, shared: &Shared) {
        let now = self.worker.chain().counters();
        let delta = now.since(&self.chain_reported);
        self.chain_reported = now;
        if delta == sluice_runtime::ChainCounters::default() {
            return;
        }
        shared.report.lock().deployments.entry(self.spec.id.clone()).or_default().chain.add(&delta);
        if sluice_telemetry::metrics::enabled() {
            let m = sluice_telemetry::metrics::deployment();
            let base = [
                opentelemetry::KeyValue::new("tenant", self.spec.tenant.clone()),
                opentelemetry::KeyValue::new("deployment", self.spec.id.clone()),
                opentelemetry::KeyValue::new("host", self.host.clone()),
            ];
            for (reason, n) in [
                ("oversize", delta.refused_oversize),
                ("cut_short", delta.refused_cut_short),
                ("fragment_unmatched", delta.fragments_unmatched),
                ("fragment_refused", delta.fragments_refused),
                ("fragment_discarded", delta.fragments_discarded),
            ] {
                if n > 0 {
                    let mut attrs = base.to_vec();
                    attrs.push(opentelemetry::KeyValue::new("reason", reason));
                    m.refused.add(n, &attrs);
                }
            }
            if delta.fragments_followed > 0 {
                m.fragments_followed.add(delta.fragments_followed, &base);
            }
            if delta.datagrams_reassembled > 0 {
                m.reassembled.add(delta.datagrams_reassembled, &base);
            }
        }
    }

    /// After a batch (or a while without one): takes the NFs' events,
    /// closes the meter window when it is due, else checkpoints when due.
    pub(crate) fn tick(&mut self, shared: &Shared) {
        self.collect_events();
        self.sample_state();
        if self.window_started.elapsed() >= shared.window {
            flush(shared, self);
        } else if self.last_checkpoint.elapsed() >= journal::CHECKPOINT_EVERY
            && self.worker.packets() != self.checkpointed
        {
            self.checkpoint_with(shared, false);
        }
    }
}

/// Closes the meter window: one record per NF that did work, stored in the
/// outbox before the window moves on (see [`crate::journal`] for the
/// order), and the window's events.
pub(crate) fn flush(shared: &Shared, a: &mut Active) {
    // Its input ended or it stops: offloaded flows' counts go back to its
    // NFs (their entries end) before the window is closed.
    a.worker.chain_mut().end_offloads();
    a.collect_events();
    a.sample_state();
    if !a.events.is_empty() || a.events_dropped > 0 {
        let batch =
            EventBatch { host: shared.host.clone(), events: std::mem::take(&mut a.events), dropped: a.events_dropped };
        a.events_dropped = 0;
        a.event_bytes = 0;
        let _ = shared.events.send(batch);
    }
    // 1. The window's full sums are checkpointed (with the output so far).
    a.checkpoint(shared);
    let end = now_ms().max(a.window_start_ms + 1);
    let c = Checkpoint {
        deployment: a.spec.id.clone(),
        tenant: a.spec.tenant.clone(),
        record_prefix: a.record_prefix.clone(),
        window: a.window,
        window_start_ms: a.window_start_ms,
        nfs: a.window_sums(),
        ..Default::default()
    };
    // 2. Its records go to the outbox (ids fixed by the checkpoint).
    for rec in c.records(&shared.host, end) {
        if let Err(e) = outbox::store(&shared.outbox_dir, &rec) {
            tracing::error!(deployment = %a.spec.id, id = %rec.id, "cannot write a meter record to the outbox: {e}");
        }
        {
            let mut r = shared.report.lock();
            let dep = r.deployments.entry(a.spec.id.clone()).or_default();
            dep.nfs.entry(format!("{}@{}", rec.nf, rec.version)).or_default().add(&rec);
        }
        if shared.meters.send(rec).is_err() {
            tracing::error!(deployment = %a.spec.id, "the meter publisher is gone; the record waits in the outbox");
        }
    }
    a.record_window_metrics();
    // 3. The next window starts, and is checkpointed empty.
    for (stage, base) in a.worker.chain().stages().iter().zip(a.base.iter_mut()) {
        *base = stage.meters().clone();
    }
    a.state_byte_us.iter_mut().for_each(|b| *b = 0);
    a.window += 1;
    a.window_start_ms = end;
    a.window_started = Instant::now();
    a.checkpoint(shared);
}

#[cfg(test)]
mod tests;
