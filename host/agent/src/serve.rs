//! The agent's control loop: it sets the host up (state directories, the
//! journal's recovery, peer state, probes, publishers, live workers), then
//! turns until shutdown — converging on each desired set, heartbeating,
//! retrying failed starts, feeding the spool, writing the report — and
//! stops everything in order, flushing meters.

use crate::config::{AgentConfig, Input};
use crate::converge::{Running, converge, converge_live};
use crate::error::AgentError;
use crate::heartbeat::{Pulse, heartbeat};
use crate::live::{Live, LiveInput};
use crate::peer::{follow_table, start_peer};
use crate::probes::{self, Vitals};
use crate::report::{self, AgentReport};
use crate::shared::Shared;
use crate::spool::Spool;
use crate::{journal, outbox, retry};
use futures::StreamExt;
use futures::stream::BoxStream;
use parking_lot::Mutex;
use sluice_control::{Bus, DesiredSet, EventBatch, HostState, MeterRecord, now_ms};
use sluice_pcap::Trace;
use sluice_peer::Peer;
use sluice_runtime::{Runtime, RuntimeConfig};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

/// Runs the agent on development input (`cfg.input`) until `shutdown`
/// resolves; returns its report.
pub async fn serve(
    bus: Arc<dyn Bus>,
    cfg: AgentConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<AgentReport, AgentError> {
    run(bus, cfg, None, shutdown).await
}

/// Runs the agent on live ports until `shutdown` resolves; returns its
/// report. `cfg.input` must be `Input::None`.
pub async fn serve_live(
    bus: Arc<dyn Bus>,
    cfg: AgentConfig,
    live: LiveInput,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<AgentReport, AgentError> {
    if !matches!(cfg.input, Input::None) {
        return Err(AgentError::Config("a host on live ports takes no capture input (--in)".into()));
    }
    run(bus, cfg, Some(live), shutdown).await
}

async fn run(
    bus: Arc<dyn Bus>,
    cfg: AgentConfig,
    live_input: Option<LiveInput>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<AgentReport, AgentError> {
    cfg.check()?;
    let modules_dir = cfg.state_dir.join("modules");
    std::fs::create_dir_all(&modules_dir).map_err(AgentError::io("creating", &modules_dir))?;
    let replay = match &cfg.input {
        Input::Replay { path, .. } => Some(Arc::new(Trace::open(path)?)),
        _ => None,
    };
    let spool = cfg.spool_dir().map(Spool::open).transpose()?;
    let boot = random_hex(6)?;
    if let Some(out) = &cfg.output {
        std::fs::create_dir_all(out).map_err(AgentError::io("creating", out))?;
    }
    // The meters of a killed run go to the outbox before anything else.
    let report = Arc::new(Mutex::new(recover(&cfg, &boot)?));
    let started_ms = now_ms();
    let peer = match (&live_input, &cfg.peer) {
        (Some(_), Some(pc)) => Some(start_peer(&bus, &cfg, pc).await?),
        _ => None,
    };
    let (shared, feeds) = share(&cfg, live_input.as_ref(), peer.clone(), report.clone())?;
    shared.vitals.turned();
    let probes = Probes::start(&bus, &cfg, &shared).await?;
    // The host's own gauges, read when the metrics are collected.
    let _host_metrics = sluice_telemetry::metrics::enabled().then(|| host_metrics(&cfg.host, &shared));
    let publisher =
        tokio::spawn(outbox::run(bus.clone(), shared.outbox_dir.clone(), feeds.meters, Duration::from_secs(10)));
    let event_publisher = tokio::spawn(publish_events(bus.clone(), feeds.events));
    let live = match live_input {
        Some(input) => Some(Live::start(&shared, input, cfg.batch_size).map_err(AgentError::Config)?),
        None => None,
    };
    let desired = bus.watch_desired(&cfg.group).await?;
    tracing::info!(host = %cfg.host, group = %cfg.group, boot = %boot, "host joined");
    let agent = Agent {
        current: DesiredSet { group: cfg.group.clone(), ..Default::default() },
        pulse: Pulse::new(&boot, started_ms),
        joined: Instant::now(),
        running: HashMap::new(),
        bus,
        cfg,
        shared,
        modules_dir,
        replay,
        live,
        spool,
        peer,
    };
    let report_path = agent.cfg.report.clone();
    agent.turn(desired, feeds.finished, shutdown).await.stop(probes).await;
    let left = publisher.await.unwrap_or(0);
    let _ = event_publisher.await;
    if left > 0 {
        tracing::warn!("{left} meter record(s) could not be published; they stay in the outbox for the next start");
    }
    report::write(report_path.as_deref(), &report);
    let out = report.lock().clone();
    Ok(out)
}

fn random_hex(bytes: usize) -> Result<String, AgentError> {
    let mut b = vec![0u8; bytes];
    getrandom::fill(&mut b).map_err(|e| AgentError::Config(format!("no randomness from the OS: {e}")))?;
    Ok(hex::encode(b))
}

/// Turns the checkpoints of a killed run into meter records in the outbox,
/// and starts the host report with them: what a killed run processed is
/// billed now, and the report says so.
fn recover(cfg: &AgentConfig, boot: &str) -> Result<AgentReport, AgentError> {
    let journal_dir = journal::dir(&cfg.state_dir);
    let outbox_dir = cfg.state_dir.join("outbox");
    let recovered =
        journal::recover(&journal_dir, &outbox_dir, &cfg.host).map_err(AgentError::io("recovering", &journal_dir))?;
    let mut r = AgentReport { host: cfg.host.clone(), boot: boot.to_string(), ..Default::default() };
    for rec in &recovered {
        let d = r.deployments.entry(rec.deployment.clone()).or_default();
        d.tenant.clone_from(&rec.tenant);
        d.nfs.entry(format!("{}@{}", rec.nf, rec.version)).or_default().add(rec);
    }
    Ok(r)
}

/// What the deployments send the control loop and its publishers.
struct Feeds {
    /// (deployment, capture): a deployment finished a spool capture.
    finished: mpsc::UnboundedReceiver<(String, String)>,
    /// Meter records of closed windows.
    meters: mpsc::UnboundedReceiver<MeterRecord>,
    /// The NFs' events.
    events: mpsc::UnboundedReceiver<EventBatch>,
}

/// What the deployments share with the agent, and the ends of its feeds.
fn share(
    cfg: &AgentConfig,
    live_input: Option<&LiveInput>,
    peer: Option<Arc<Peer>>,
    report: Arc<Mutex<AgentReport>>,
) -> Result<(Shared, Feeds), AgentError> {
    let (finished_tx, finished) = mpsc::unbounded_channel();
    let (meter_tx, meters) = mpsc::unbounded_channel();
    let (event_tx, events) = mpsc::unbounded_channel();
    let shared = Shared {
        // Tenants see their NFs' log lines and traps (GET /v1/logs).
        runtime: Arc::new(Runtime::new(RuntimeConfig { nf_logs_as_events: true, ..cfg.runtime.clone() })?),
        host: cfg.host.clone(),
        journal: journal::Journal::start(journal::dir(&cfg.state_dir))
            .map_err(AgentError::io("starting the journal writer for", &journal::dir(&cfg.state_dir)))?,
        outbox_dir: cfg.state_dir.join("outbox"),
        output_dir: cfg.output.clone(),
        spool_dir: cfg.spool_dir().map(Path::to_path_buf),
        finished: finished_tx,
        batch_size: cfg.batch_size,
        limits: cfg.limits.clone(),
        nf_caps: cfg.nf_caps.clone(),
        window: cfg.window,
        pps: cfg.pps,
        status: Arc::new(Mutex::new(BTreeMap::new())),
        report,
        meters: meter_tx,
        events: event_tx,
        changed: Arc::new(tokio::sync::Notify::new()),
        cores: sluice_engine::cores::CorePool::new(&cfg.cores),
        fair: sluice_engine::FairShare::new(),
        live: live_input.is_some(),
        workers: live_input.map_or(1, |l| l.ios.len().max(1)),
        retries: retry::Retries::default(),
        peer,
        vitals: Arc::new(Vitals::default()),
    };
    Ok((shared, Feeds { finished, meters, events }))
}

/// The host's probes listener (`--metrics-listen`), if it has one.
struct Probes {
    stop: oneshot::Sender<()>,
    task: Option<JoinHandle<()>>,
}

impl Probes {
    /// Binds the listener and serves `/metrics`, `/healthz` and `/readyz`.
    async fn start(bus: &Arc<dyn Bus>, cfg: &AgentConfig, shared: &Shared) -> Result<Probes, AgentError> {
        let (stop, stopped) = oneshot::channel::<()>();
        let task = match cfg.metrics_listen {
            Some(addr) => {
                let listener = tokio::net::TcpListener::bind(addr)
                    .await
                    .map_err(|e| AgentError::Config(format!("cannot listen on {addr} (--metrics-listen): {e}")))?;
                tracing::info!("metrics, health and readiness on http://{addr}");
                Some(tokio::spawn(probes::serve(
                    listener,
                    bus.clone(),
                    shared.status.clone(),
                    shared.vitals.clone(),
                    cfg.prometheus.clone(),
                    shared.outbox_dir.clone(),
                    async move {
                        let _ = stopped.await;
                    },
                )))
            }
            None => None,
        };
        Ok(Probes { stop, task })
    }

    /// Stops the listener.
    async fn stop(self) {
        let _ = self.stop.send(());
        if let Some(t) = self.task {
            let _ = t.await;
        }
    }
}

/// Registers the host's own gauges (ports, unmatched packets, outbox,
/// heartbeat age, running deployments), read when the metrics are
/// collected.
fn host_metrics(host: &str, shared: &Shared) -> sluice_telemetry::metrics::HostMetrics {
    let (report, outbox, status, vitals) =
        (shared.report.clone(), shared.outbox_dir.clone(), shared.status.clone(), shared.vitals.clone());
    sluice_telemetry::metrics::host(host, move || {
        let (ports, unmatched) = {
            let r = report.lock();
            (r.ports.clone(), r.unmatched)
        };
        let beat = vitals.heartbeat_ms.load(Ordering::Relaxed);
        sluice_telemetry::metrics::HostReading {
            ports: ports
                .into_iter()
                .map(|p| sluice_telemetry::metrics::PortReading {
                    port: p.port,
                    name: p.name,
                    received: p.ipackets,
                    sent: p.opackets,
                    missed: p.imissed,
                    no_mbuf: p.rx_nombuf,
                    receive_errors: p.ierrors,
                    send_errors: p.oerrors,
                })
                .collect(),
            unmatched,
            outbox: outbox::pending(&outbox) as u64,
            heartbeat_age: if beat == 0 { 0.0 } else { now_ms().saturating_sub(beat) as f64 / 1000.0 },
            deployments: status.lock().values().filter(|s| s.state == HostState::Running).count() as u64,
        }
    })
}

/// Publishes the NFs' events until the deployments are gone.
async fn publish_events(bus: Arc<dyn Bus>, mut events: mpsc::UnboundedReceiver<EventBatch>) {
    while let Some(batch) = events.recv().await {
        if let Err(e) = bus.publish_events(&batch).await {
            tracing::warn!("{} NF event(s) not published: {e}", batch.events.len());
        }
    }
}

/// What the control loop holds.
struct Agent {
    bus: Arc<dyn Bus>,
    cfg: AgentConfig,
    shared: Shared,
    /// The host's cache of modules, by digest.
    modules_dir: PathBuf,
    /// The capture replayed, if traffic is replayed.
    replay: Option<Arc<Trace>>,
    /// The live workers, on live ports.
    live: Option<Live>,
    /// The deployment threads, on development input.
    running: HashMap<String, Running>,
    /// The spool, if traffic comes from one.
    spool: Option<Spool>,
    /// The desired set last received.
    current: DesiredSet,
    pulse: Pulse,
    peer: Option<Arc<Peer>>,
    /// When the host joined its group.
    joined: Instant,
}

impl Agent {
    /// Turns the control loop until `shutdown` resolves or the desired
    /// set's feed ends.
    async fn turn(
        mut self,
        mut desired: BoxStream<'static, DesiredSet>,
        mut finished: mpsc::UnboundedReceiver<(String, String)>,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> Self {
        let changed = self.shared.changed.clone();
        let mut beat = tokio::time::interval(self.cfg.heartbeat);
        let mut spool_tick = tokio::time::interval(Duration::from_millis(200));
        let mut report_tick = tokio::time::interval(Duration::from_secs(1));
        let mut table_tick =
            tokio::time::interval(self.cfg.peer.as_ref().map_or(Duration::from_secs(3600), |p| p.table_poll));
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                set = desired.next() => {
                    let Some(set) = set else {
                        tracing::error!("the desired-deployment feed ended; stopping");
                        break;
                    };
                    self.on_desired(set).await;
                }
                _ = changed.notified() => self.heartbeat().await,
                _ = beat.tick() => self.on_beat().await,
                _ = spool_tick.tick(), if self.spool.is_some() => {
                    if let Some(spool) = self.spool.as_mut() {
                        spool.pick_up(&self.running, &self.current, &self.shared).await;
                    }
                }
                Some((deployment, file)) = finished.recv() => {
                    if let Some(spool) = self.spool.as_mut() {
                        spool.finished(&deployment, &file, &self.running);
                    }
                }
                _ = table_tick.tick(), if self.peer.is_some() => {
                    if let Some(p) = &self.peer {
                        follow_table(self.bus.as_ref(), &self.cfg.group, p).await;
                    }
                }
                _ = report_tick.tick() => self.on_report_tick(),
            }
        }
        self
    }

    /// A new desired set: converges on it, then says so.
    async fn on_desired(&mut self, set: DesiredSet) {
        match self.live.as_mut() {
            Some(l) => {
                converge_live(self.bus.as_ref(), &self.shared, &self.modules_dir, &set, l).await;
                l.open();
            }
            None => self.converge(&set).await,
        }
        self.shared.vitals.converged.store(true, Ordering::Relaxed);
        if let Some(spool) = self.spool.as_mut() {
            spool.release(&self.running);
        }
        self.current = set;
        self.heartbeat().await;
    }

    /// Converges the deployment threads on `set`.
    async fn converge(&mut self, set: &DesiredSet) {
        let (bus, shared, cfg) = (self.bus.as_ref(), &self.shared, &self.cfg);
        converge(bus, shared, cfg, &self.modules_dir, set, &mut self.running, self.replay.as_ref()).await;
    }

    /// The heartbeat's interval: opens a live host's ports once it has
    /// waited long enough, retries what could not start, measures the
    /// host's load and heartbeats.
    async fn on_beat(&mut self) {
        // A group without deployments sends no desired set: its host opens
        // its ports after two heartbeats all the same.
        if self.joined.elapsed() >= self.cfg.heartbeat * 2 {
            if let Some(l) = &self.live {
                l.open();
            }
            self.shared.vitals.converged.store(true, Ordering::Relaxed);
        }
        self.retry().await;
        self.pulse.measure(self.bus.as_ref(), &self.cfg.group, &self.shared, &self.current).await;
        self.heartbeat().await;
    }

    /// Deployments that could not start are retried: a failed module fetch
    /// on every beat, a failed start when its back-off is due.
    async fn retry(&mut self) {
        let due = self.shared.retries.due();
        let (bus, shared, current) = (self.bus.as_ref(), &self.shared, &self.current);
        match self.live.as_mut() {
            Some(l) => {
                for id in due {
                    if let Some(d) = l.deployments.get_mut(&id) {
                        d.clear();
                    }
                }
                if current.deployments.iter().any(|d| l.deployments.get(&d.id) != Some(&d.digest())) {
                    converge_live(bus, shared, &self.modules_dir, current, l).await;
                }
            }
            None => {
                if current.deployments.iter().any(|d| !self.running.contains_key(&d.id)) || !due.is_empty() {
                    for id in due {
                        if let Some(r) = self.running.get_mut(&id) {
                            r.digest.clear();
                        }
                    }
                    let running = &mut self.running;
                    converge(bus, shared, &self.cfg, &self.modules_dir, current, running, self.replay.as_ref()).await;
                }
            }
        }
    }

    async fn heartbeat(&self) {
        heartbeat(self.bus.as_ref(), &self.cfg, &self.pulse, &self.shared, &self.current).await;
    }

    /// Every second: the loop turned; the live workers', and the peer
    /// state's, counters go into the report, which is written.
    fn on_report_tick(&self) {
        self.shared.vitals.turned();
        if let Some(l) = &self.live {
            l.report(&self.shared);
        }
        if let Some(p) = &self.peer {
            p.store().expire(Instant::now());
            let (counters, tables) = (p.counters(), p.global_tables(16));
            let mut r = self.shared.report.lock();
            r.peer = Some(counters);
            r.global_tables = tables;
        }
        report::write(self.cfg.report.as_deref(), &self.shared.report);
    }

    /// Stops the probes, then every deployment (each closes its meter
    /// window), and lets go of what the publishers wait on.
    async fn stop(mut self, probes: Probes) {
        tracing::info!(host = %self.cfg.host, "stopping: flushing meters");
        probes.stop().await;
        if let Some(l) = self.live.take() {
            l.stop(&self.shared).await;
        }
        for (_, r) in self.running.drain() {
            r.stop().await;
        }
        // What the deployments handed over last is on disk before the
        // host exits.
        self.shared.journal.flush();
    }
}
