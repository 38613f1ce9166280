//! The cluster side of a Sluice host (`sluice-host serve`, and the host
//! half of `sluice dev`).
//!
//! What it owns, and why here: joining a host group over the control
//! [`Bus`](sluice_control::Bus) (heartbeats carrying each deployment's
//! status), converging on the group's desired deployments (fetching modules
//! by digest, compiling them once, hot-swapping NFs on updates), feeding
//! them traffic, and turning the runtime's per-invocation meters into meter
//! records per window, published through a crash-safe outbox. The packet
//! path itself is `sluice-runtime`'s; this crate only schedules it.
//!
//! Traffic comes from live ports ([`serve_live`], `sluice-host serve
//! --dpdk`: the host's workers run every deployment, each packet going to
//! the deployment whose traffic attachment claims it; see [`live`]) or,
//! for development, from pcap files: replayed from a file
//! (`Input::Replay`, e.g. for load tests) or picked up from a spool
//! directory (`Input::Spool`; a capture moves to `done/` once every
//! deployment has finished it). A deployment with attachments gets its
//! share of a capture, one without (a development deployment) all of it.
//! Forwarded packets of captures go to one capture per deployment under
//! `output`, if set. A killed host resumes every deployment where its
//! [`journal`] says it was, and bills exactly the output it kept.

pub mod deployment;
pub mod journal;
pub mod live;
pub mod outbox;
pub mod probes;
pub mod report;
pub mod retry;

use deployment::{Blobs, Control, Prepared, Shared};
use futures::StreamExt;
use live::Live;
pub use live::LiveInput;
use report::AgentReport;
use sluice_control::{Bus, DeploymentSpec, DeploymentStatus, DesiredSet, Heartbeat, HostState, now_ms};
use sluice_engine::Classifier;
use sluice_pcap::Trace;
use sluice_peer::{Outgoing, Peer, PeerStore};
use sluice_runtime::{NfLimits, Runtime, RuntimeConfig};
use std::collections::HashSet;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tracing::Instrument;

/// Where traffic comes from.
#[derive(Debug, Clone)]
pub enum Input {
    /// No traffic (deployments start and idle).
    None,
    /// Replay a capture through every deployment when it starts, `loops`
    /// times (0: forever).
    Replay {
        /// The capture.
        path: PathBuf,
        /// Passes.
        loops: u32,
    },
    /// Watch a directory; each capture put there (write it elsewhere and
    /// rename it in) goes through every running deployment, then moves to
    /// `done/` (or `failed/` with the reason next to it).
    Spool {
        /// The directory.
        dir: PathBuf,
    },
}

/// How the agent runs.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// Host id (unique in the cluster; `[A-Za-z0-9_-]`).
    pub host: String,
    /// Host group it serves.
    pub group: String,
    /// Traffic.
    pub input: Input,
    /// Replay rate limit, packets per second.
    pub pps: Option<u64>,
    /// Meter window.
    pub window: Duration,
    /// Heartbeat interval.
    pub heartbeat: Duration,
    /// Packets per second this host can take, declared to the group
    /// controller (the weight of its share of the group's flows; 0: not
    /// declared, the controller assumes its default).
    pub capacity_pps: u64,
    /// Module cache and meter outbox.
    pub state_dir: PathBuf,
    /// Where to write the host's own report (updated as it goes).
    pub report: Option<PathBuf>,
    /// Where each deployment writes the packets it forwards
    /// (`<dir>/<deployment>.pcap`, appended across restarts).
    pub output: Option<PathBuf>,
    /// Engine settings.
    pub runtime: RuntimeConfig,
    /// Packets per NF call.
    pub batch_size: usize,
    /// Default NF limits (a deployment may override some).
    pub limits: NfLimits,
    /// Caps for the NFs of a name, whatever their deployment asks
    /// (the host config's `[nf.<name>]` sections).
    pub nf_caps: BTreeMap<String, NfLimits>,
    /// Cores deployment threads are pinned to: each takes the core fewest
    /// others hold.
    pub cores: sluice_runtime::cores::CoreList,
    /// Peer state with the group's other hosts (live hosts only; none:
    /// flows are not replicated).
    pub peer: Option<PeerConfig>,
    /// Where to serve `/metrics`, `/healthz` and `/readyz` (none: nowhere).
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// The process's Prometheus registry, rendered at `/metrics`.
    pub prometheus: Option<sluice_telemetry::Prometheus>,
}

/// How a live host replicates its flows' state to its group's other hosts.
#[derive(Debug, Clone)]
pub struct PeerConfig {
    /// How often a worker sends the state of the flows it touched. Keep it
    /// under half the dispatcher's flowlet gap: a flow then moves only
    /// after its last update was sent.
    pub interval: Duration,
    /// Replicas kept for peers, at most.
    pub max_flows: usize,
    /// Bytes of replicas kept for peers, at most.
    pub max_bytes: usize,
    /// A replica not refreshed for this long is dropped (its flow went
    /// idle on its owner).
    pub lifetime: Duration,
    /// How often the group's ownership table is read.
    pub table_poll: Duration,
    /// How long the packets of a flow moved here without its state wait
    /// for it from the host that had it (then they run without it).
    pub pull_wait: Duration,
}

impl Default for PeerConfig {
    fn default() -> Self {
        PeerConfig {
            interval: Duration::from_millis(1),
            max_flows: 1 << 20,
            max_bytes: 256 << 20,
            lifetime: Duration::from_secs(120),
            table_poll: Duration::from_millis(100),
            pull_wait: Duration::from_millis(5),
        }
    }
}

/// Errors that stop the agent.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The engine could not start.
    #[error(transparent)]
    Runtime(#[from] sluice_runtime::RuntimeError),
    /// The bus failed at startup.
    #[error(transparent)]
    Bus(#[from] sluice_control::BusError),
    /// A bad setting.
    #[error("{0}")]
    Config(String),
    /// Input capture.
    #[error(transparent)]
    Pcap(#[from] sluice_pcap::PcapError),
    /// Local files.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// Path.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
}

struct Running {
    /// Digest of the spec last handed to the deployment.
    digest: String,
    tx: crossbeam_channel::Sender<Control>,
    thread: std::thread::JoinHandle<()>,
}

fn random_hex(bytes: usize) -> Result<String, AgentError> {
    let mut b = vec![0u8; bytes];
    getrandom::fill(&mut b).map_err(|e| AgentError::Config(format!("no randomness from the OS: {e}")))?;
    Ok(hex::encode(b))
}

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
    sluice_control::subjects::check_token("host", &cfg.host).map_err(|e| AgentError::Config(e.to_string()))?;
    sluice_control::subjects::check_token("group", &cfg.group).map_err(|e| AgentError::Config(e.to_string()))?;
    if cfg.batch_size == 0 || cfg.batch_size > 4096 {
        return Err(AgentError::Config(format!("batch size {} is out of range 1..=4096", cfg.batch_size)));
    }
    let io = |what, path: &Path| {
        let path = path.to_path_buf();
        move |source| AgentError::Io { what, path, source }
    };
    let modules_dir = cfg.state_dir.join("modules");
    std::fs::create_dir_all(&modules_dir).map_err(io("creating", &modules_dir))?;
    let replay = match &cfg.input {
        Input::Replay { path, .. } => Some(Arc::new(Trace::open(path)?)),
        _ => None,
    };
    if let Input::Spool { dir } = &cfg.input {
        for sub in ["done", "failed"] {
            std::fs::create_dir_all(dir.join(sub)).map_err(io("creating", &dir.join(sub)))?;
        }
    }
    let boot = random_hex(6)?;
    if let Some(out) = &cfg.output {
        std::fs::create_dir_all(out).map_err(io("creating", out))?;
    }
    // The meters of a killed run go to the outbox before anything else.
    let journal_dir = journal::dir(&cfg.state_dir);
    let outbox_dir = cfg.state_dir.join("outbox");
    let recovered = journal::recover(&journal_dir, &outbox_dir, &cfg.host).map_err(io("recovering", &journal_dir))?;
    let (finished_tx, mut finished_rx) = tokio::sync::mpsc::unbounded_channel::<(String, String)>();
    let started_ms = now_ms();
    let report = Arc::new(Mutex::new(AgentReport { host: cfg.host.clone(), boot: boot.clone(), ..Default::default() }));
    {
        // What a killed run processed is billed now: the report says so.
        let mut r = report.lock().unwrap_or_else(PoisonError::into_inner);
        for rec in &recovered {
            let d = r.deployments.entry(rec.deployment.clone()).or_default();
            d.tenant.clone_from(&rec.tenant);
            d.nfs.entry(format!("{}@{}", rec.nf, rec.version)).or_default().add(rec);
        }
    }
    let peer = match (&live_input, &cfg.peer) {
        (Some(_), Some(pc)) => Some(start_peer(&bus, &cfg, pc).await?),
        _ => None,
    };
    let (meter_tx, meter_rx) = tokio::sync::mpsc::unbounded_channel();
    let (event_tx, mut event_rx) = tokio::sync::mpsc::unbounded_channel::<sluice_control::EventBatch>();
    let shared = Shared {
        // Tenants see their NFs' log lines and traps (GET /v1/logs).
        runtime: Arc::new(Runtime::new(RuntimeConfig { nf_logs_as_events: true, ..cfg.runtime.clone() })?),
        host: cfg.host.clone(),
        journal_dir: journal_dir.clone(),
        outbox_dir: outbox_dir.clone(),
        output_dir: cfg.output.clone(),
        spool_dir: match &cfg.input {
            Input::Spool { dir } => Some(dir.clone()),
            _ => None,
        },
        finished: finished_tx,
        batch_size: cfg.batch_size,
        limits: cfg.limits.clone(),
        nf_caps: cfg.nf_caps.clone(),
        window: cfg.window,
        pps: cfg.pps,
        status: Arc::new(Mutex::new(BTreeMap::new())),
        report: report.clone(),
        meters: meter_tx,
        events: event_tx,
        changed: Arc::new(tokio::sync::Notify::new()),
        cores: sluice_runtime::cores::CorePool::new(&cfg.cores),
        fair: sluice_engine::FairShare::new(),
        live: live_input.is_some(),
        workers: live_input.as_ref().map_or(1, |l| l.ios.len().max(1)),
        retries: retry::Retries::default(),
        peer: peer.clone(),
        vitals: Arc::new(probes::Vitals::default()),
    };
    shared.vitals.turned();
    let (probes_stop, probes_stopped) = tokio::sync::oneshot::channel::<()>();
    let probes_task = match cfg.metrics_listen {
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| AgentError::Config(format!("cannot listen on {addr} (--metrics-listen): {e}")))?;
            tracing::info!("metrics, health and readiness on http://{addr}");
            Some(tokio::spawn(probes::serve(
                listener,
                bus.clone(),
                shared.clone(),
                shared.vitals.clone(),
                cfg.prometheus.clone(),
                shared.outbox_dir.clone(),
                async move {
                    let _ = probes_stopped.await;
                },
            )))
        }
        None => None,
    };
    // The host's own gauges, read when the metrics are collected.
    let _host_metrics = sluice_telemetry::metrics::enabled().then(|| {
        let (report, outbox, status, vitals) =
            (report.clone(), outbox_dir.clone(), shared.status.clone(), shared.vitals.clone());
        sluice_telemetry::metrics::host(&cfg.host, move || {
            let (ports, unmatched) = {
                let r = report.lock().unwrap_or_else(PoisonError::into_inner);
                (r.ports.clone(), r.unmatched)
            };
            let beat = vitals.heartbeat_ms.load(std::sync::atomic::Ordering::Relaxed);
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
                deployments: status
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .values()
                    .filter(|s| s.state == HostState::Running)
                    .count() as u64,
            }
        })
    });
    let publisher = tokio::spawn(outbox::run(bus.clone(), outbox_dir, meter_rx, Duration::from_secs(10)));
    let event_bus = bus.clone();
    let event_publisher = tokio::spawn(async move {
        while let Some(batch) = event_rx.recv().await {
            if let Err(e) = event_bus.publish_events(&batch).await {
                tracing::warn!("{} NF event(s) not published: {e}", batch.events.len());
            }
        }
    });
    let mut live = match live_input {
        Some(input) => Some(Live::start(&shared, input, cfg.batch_size).map_err(AgentError::Config)?),
        None => None,
    };
    let mut desired = bus.watch_desired(&cfg.group).await?;
    let joined = std::time::Instant::now();
    let mut running: HashMap<String, Running> = HashMap::new();
    // Spool captures handed out, and the deployments still processing each.
    let mut inflight: HashMap<String, HashSet<String>> = HashMap::new();
    let mut current = DesiredSet { group: cfg.group.clone(), ..Default::default() };
    let mut beat = tokio::time::interval(cfg.heartbeat);
    let mut spool_tick = tokio::time::interval(Duration::from_millis(200));
    let mut report_tick = tokio::time::interval(Duration::from_secs(1));
    let mut table_tick = tokio::time::interval(cfg.peer.as_ref().map_or(Duration::from_secs(3600), |p| p.table_poll));
    tokio::pin!(shutdown);
    tracing::info!(host = %cfg.host, group = %cfg.group, boot = %boot, "host joined");
    let mut pulse = Pulse::new(&boot, started_ms);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            set = desired.next() => {
                let Some(set) = set else {
                    tracing::error!("the desired-deployment feed ended; stopping");
                    break;
                };
                match live.as_mut() {
                    Some(l) => {
                        converge_live(bus.as_ref(), &shared, &modules_dir, &set, l).await;
                        l.open();
                    }
                    None => converge(bus.as_ref(), &shared, &cfg, &modules_dir, &set, &mut running, replay.as_ref()).await,
                }
                shared.vitals.converged.store(true, std::sync::atomic::Ordering::Relaxed);
                release(&cfg, &running, &mut inflight);
                current = set;
                heartbeat(bus.as_ref(), &cfg, &pulse, &shared, &current).await;
            }
            _ = shared.changed.notified() => heartbeat(bus.as_ref(), &cfg, &pulse, &shared, &current).await,
            _ = beat.tick() => {
                // A group without deployments sends no desired set: its
                // host opens its ports after two heartbeats all the same.
                if joined.elapsed() >= cfg.heartbeat * 2 {
                    if let Some(l) = &live {
                        l.open();
                    }
                    shared.vitals.converged.store(true, std::sync::atomic::Ordering::Relaxed);
                }
                // Deployments that could not start are retried: a failed
                // module fetch on every beat, a failed start when its
                // back-off is due.
                let due = shared.retries.due();
                match live.as_mut() {
                    Some(l) => {
                        for id in due {
                            if let Some(d) = l.deployments.get_mut(&id) {
                                d.clear();
                            }
                        }
                        if current.deployments.iter().any(|d| l.deployments.get(&d.id) != Some(&d.digest())) {
                            converge_live(bus.as_ref(), &shared, &modules_dir, &current, l).await;
                        }
                    }
                    None => if current.deployments.iter().any(|d| !running.contains_key(&d.id)) || !due.is_empty() {
                        for id in due {
                            if let Some(r) = running.get_mut(&id) {
                                r.digest.clear();
                            }
                        }
                        converge(bus.as_ref(), &shared, &cfg, &modules_dir, &current, &mut running, replay.as_ref()).await;
                    },
                }
                pulse.measure(bus.as_ref(), &cfg.group, &shared, &current).await;
                heartbeat(bus.as_ref(), &cfg, &pulse, &shared, &current).await;
            }
            _ = spool_tick.tick(), if matches!(cfg.input, Input::Spool { .. }) => {
                if let Input::Spool { dir } = &cfg.input {
                    spool(dir, &running, &current, &shared, &mut inflight).await;
                }
            }
            Some((deployment, file)) = finished_rx.recv() => {
                if let Some(left) = inflight.get_mut(&file) {
                    left.remove(&deployment);
                }
                release(&cfg, &running, &mut inflight);
            }
            _ = table_tick.tick(), if peer.is_some() => {
                if let Some(p) = &peer {
                    follow_table(bus.as_ref(), &cfg.group, p).await;
                }
            }
            _ = report_tick.tick() => {
                shared.vitals.turned();
                if let Some(l) = &live {
                    l.report(&shared);
                }
                if let Some(p) = &peer {
                    p.store().expire(std::time::Instant::now());
                    let (counters, tables) = (p.counters(), p.global_tables(16));
                    let mut r = report.lock().unwrap_or_else(PoisonError::into_inner);
                    r.peer = Some(counters);
                    r.global_tables = tables;
                }
                write_report(cfg.report.as_deref(), &report);
            }
        }
    }
    tracing::info!(host = %cfg.host, "stopping: flushing meters");
    let _ = probes_stop.send(());
    if let Some(t) = probes_task {
        let _ = t.await;
    }
    if let Some(l) = live.take() {
        l.stop(&shared).await;
    }
    for (_, r) in running.drain() {
        let _ = r.tx.send(Control::Stop);
        let _ = tokio::task::spawn_blocking(move || r.thread.join()).await;
    }
    drop(shared);
    let left = publisher.await.unwrap_or(0);
    let _ = event_publisher.await;
    if left > 0 {
        tracing::warn!("{left} meter record(s) could not be published; they stay in the outbox for the next start");
    }
    write_report(cfg.report.as_deref(), &report);
    let out = report.lock().unwrap_or_else(PoisonError::into_inner).clone();
    Ok(out)
}

/// Starts a live host's peer state: the store of replicas its peers send,
/// fed from its inbox, and the publisher of what its workers replicate.
async fn start_peer(bus: &Arc<dyn Bus>, cfg: &AgentConfig, pc: &PeerConfig) -> Result<Arc<Peer>, AgentError> {
    if pc.interval.is_zero() {
        return Err(AgentError::Config("the replication interval must be above 0".into()));
    }
    if pc.pull_wait > sluice_peer::pull::MAX_WAIT {
        return Err(AgentError::Config(format!(
            "a pull wait of {:?} is over the {:?} packets may wait (--pull-wait-us)",
            pc.pull_wait,
            sluice_peer::pull::MAX_WAIT
        )));
    }
    let (tx, rx) = crossbeam_channel::bounded::<Outgoing>(4096);
    let store = PeerStore::new(pc.max_flows, pc.max_bytes, pc.lifetime);
    let peer = Peer::new(&cfg.host, pc.interval, pc.pull_wait, store, tx);
    let mut inbox = bus.peer_inbox(&cfg.group, &cfg.host).await?;
    let p = peer.clone();
    tokio::spawn(async move {
        while let Some(m) = inbox.next().await {
            if let Err(e) = p.receive(&m.host, &m.message, std::time::Instant::now(), wall_ns()) {
                tracing::warn!(from = %m.host, "peer state refused: {e}");
            }
        }
    });
    // This host's values of global eventual tables go to every other host,
    // and its split release pools follow the table.
    let (p, global_bus, group, me) = (peer.clone(), bus.clone(), cfg.group.clone(), cfg.host.clone());
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(sluice_peer::GLOBAL_EVERY);
        loop {
            tick.tick().await;
            // Release pools follow the table: blocks handed over, waited
            // for, replicated (see sluice_peer::pools).
            p.pool_tick(std::time::Instant::now());
            let peers = p.peers();
            let messages = p.global_messages(peers.len(), wall_ns());
            for body in &messages {
                for to in &peers {
                    if let Err(e) = global_bus.publish_peer(&group, to, &me, body.clone()).await {
                        tracing::debug!(to, "global table values not sent: {e}");
                    }
                }
            }
        }
    });
    // Workers hand messages over without waiting; this thread sends them.
    let (out_bus, group, me) = (bus.clone(), cfg.group.clone(), cfg.host.clone());
    let handle = tokio::runtime::Handle::current();
    std::thread::Builder::new()
        .name("peer-out".into())
        .spawn(move || {
            while let Ok(o) = rx.recv() {
                if let Err(e) = handle.block_on(out_bus.publish_peer(&group, &o.to, &me, o.body)) {
                    tracing::debug!(to = %o.to, flows = o.flows, "peer state not sent: {e}");
                }
            }
        })
        .map_err(|e| AgentError::Config(format!("cannot start the peer-state sender: {e}")))?;
    follow_table(bus.as_ref(), &cfg.group, &peer).await;
    Ok(peer)
}

/// Reads the group's ownership table into the host's peer state.
async fn follow_table(bus: &dyn Bus, group: &str, peer: &Peer) {
    match tokio::time::timeout(Duration::from_millis(500), bus.ownership(group)).await {
        Ok(Ok(Some(t))) => {
            let version = t.version();
            if peer.set_table(t) {
                tracing::info!(group, version, "new ownership table");
            }
        }
        Ok(Ok(None)) => {}
        Ok(Err(e)) => tracing::debug!(group, "reading the ownership table: {e}"),
        Err(_) => tracing::debug!(group, "reading the ownership table timed out"),
    }
}

/// The wall clock in ns (live workers' packet time).
fn wall_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn write_report(path: Option<&Path>, report: &Mutex<AgentReport>) {
    let Some(path) = path else { return };
    let json = {
        let mut r = report.lock().unwrap_or_else(PoisonError::into_inner);
        r.updated_ms = now_ms();
        serde_json::to_vec_pretty(&*r)
    };
    let tmp = path.with_extension("tmp");
    if let Err(e) = json
        .map_err(std::io::Error::other)
        .and_then(|b| std::fs::write(&tmp, b))
        .and_then(|()| std::fs::rename(&tmp, path))
    {
        tracing::warn!(path = %path.display(), "cannot write the host report: {e}");
    }
}

/// What a host measures between heartbeats.
struct Pulse {
    boot: String,
    started_ms: u64,
    /// Packets processed (all deployments) at the last measurement.
    last: Option<(Instant, u64)>,
    load_pps: u64,
    table_version: Option<u64>,
}

impl Pulse {
    fn new(boot: &str, started_ms: u64) -> Self {
        Pulse { boot: boot.to_string(), started_ms, last: None, load_pps: 0, table_version: None }
    }

    /// The packet rate since the last measurement, and the version of the
    /// group's ownership table (a read that may not hold up the loop long).
    async fn measure(&mut self, bus: &dyn Bus, group: &str, shared: &Shared, set: &DesiredSet) {
        let packets: u64 = {
            let status = shared.status.lock().unwrap_or_else(PoisonError::into_inner);
            status.values().filter(|s| set.deployments.iter().any(|d| d.id == s.deployment)).map(|s| s.packets).sum()
        };
        let now = Instant::now();
        if let Some((at, before)) = self.last {
            let secs = now.duration_since(at).as_secs_f64();
            if secs > 0.0 {
                self.load_pps = (packets.saturating_sub(before) as f64 / secs) as u64;
            }
        }
        self.last = Some((now, packets));
        match tokio::time::timeout(Duration::from_millis(500), bus.ownership(group)).await {
            Ok(Ok(t)) => self.table_version = t.map(|t| t.version()),
            Ok(Err(e)) => tracing::debug!(group, "reading the ownership table: {e}"),
            Err(_) => tracing::debug!(group, "reading the ownership table timed out"),
        }
    }
}

async fn heartbeat(bus: &dyn Bus, cfg: &AgentConfig, pulse: &Pulse, shared: &Shared, set: &DesiredSet) {
    let deployments: Vec<DeploymentStatus> = {
        let status = shared.status.lock().unwrap_or_else(PoisonError::into_inner);
        status.values().filter(|s| set.deployments.iter().any(|d| d.id == s.deployment)).cloned().collect()
    };
    let hb = Heartbeat {
        host: cfg.host.clone(),
        group: cfg.group.clone(),
        boot: pulse.boot.clone(),
        started_ms: pulse.started_ms,
        sent_ms: now_ms(),
        interval_ms: u64::try_from(cfg.heartbeat.as_millis()).unwrap_or(u64::MAX),
        version: env!("CARGO_PKG_VERSION").to_string(),
        deployments,
        capacity_pps: cfg.capacity_pps,
        load_pps: pulse.load_pps,
        table_version: pulse.table_version,
        memory_slot_mb: cfg.runtime.max_memory_bytes >> 20,
    };
    match bus.heartbeat(&hb).await {
        Ok(()) => shared.vitals.heartbeat_ms.store(hb.sent_ms, std::sync::atomic::Ordering::Relaxed),
        Err(e) => tracing::warn!("heartbeat not sent: {e}"),
    }
}

/// Fetches the modules of `spec` (from the local cache, else the bus).
async fn fetch(bus: &dyn Bus, dir: &Path, spec: &DeploymentSpec) -> Result<Blobs, String> {
    let mut out = Blobs::new();
    for nf in &spec.nfs {
        let digest = &nf.module.digest;
        if out.contains_key(digest) {
            continue;
        }
        if digest.len() != 64 || !digest.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!("NF '{}': '{digest}' is not a SHA-256 digest", nf.name));
        }
        let path = dir.join(format!("{digest}.wasm"));
        let cached =
            tokio::fs::read(&path).await.ok().filter(|b| sluice_control::bus::verify_digest(digest, b).is_ok());
        let bytes = match cached {
            Some(b) => {
                tracing::info!(nf = %nf.name, digest = %digest, bytes = b.len(), "module from the host's cache");
                b
            }
            None => {
                let span = if tracing::Span::current().is_disabled() {
                    tracing::Span::none()
                } else {
                    tracing::info_span!("fetch module", nf = %nf.name, digest = %digest)
                };
                let b = bus.get_module(digest).instrument(span).await.map_err(|e| format!("NF '{}': {e}", nf.name))?;
                tracing::info!(nf = %nf.name, digest = %digest, bytes = b.len(), "module fetched");
                if let Err(e) = tokio::fs::write(&path, &b).await {
                    tracing::warn!(path = %path.display(), "cannot cache module: {e}");
                }
                b
            }
        };
        out.insert(digest.clone(), Arc::new(bytes));
    }
    Ok(out)
}

async fn converge(
    bus: &dyn Bus,
    shared: &Shared,
    cfg: &AgentConfig,
    modules_dir: &Path,
    set: &DesiredSet,
    running: &mut HashMap<String, Running>,
    replay: Option<&Arc<Trace>>,
) {
    let wanted: HashMap<&str, &DeploymentSpec> = set.deployments.iter().map(|d| (d.id.as_str(), d)).collect();
    let gone: Vec<String> = running.keys().filter(|id| !wanted.contains_key(id.as_str())).cloned().collect();
    for id in gone {
        if let Some(r) = running.remove(&id) {
            tracing::info!(deployment = %id, "deployment removed");
            let _ = r.tx.send(Control::Stop);
            let _ = tokio::task::spawn_blocking(move || r.thread.join()).await;
        }
        // Its last window is in the outbox: nothing to resume.
        journal::remove(&shared.journal_dir, &id);
        forget(shared, &id);
    }
    journal::prune(&shared.journal_dir, |id| wanted.contains_key(id));
    for spec in &set.deployments {
        // The digest, not only the revision: what runs is what was asked.
        let digest = spec.digest();
        if running.get(&spec.id).is_some_and(|r| r.digest == digest) {
            continue;
        }
        let span = apply_span(set, spec);
        let Some(blobs) = fetch_for(bus, shared, modules_dir, spec, &digest).instrument(span.clone()).await else {
            continue;
        };
        let mut prepared = prepare(shared, spec, blobs).instrument(span.clone()).await;
        prepared.trace = traced(&span);
        match running.get_mut(&spec.id) {
            Some(r) if !r.thread.is_finished() => {
                if r.tx.send(Control::Update(Box::new(prepared))).is_ok() {
                    r.digest = digest;
                }
            }
            _ => {
                host_status(shared, spec, &digest, HostState::Pending, None);
                let (tx, rx) = crossbeam_channel::unbounded();
                let replays: Vec<deployment::Input> = match (&cfg.input, replay) {
                    (Input::Replay { loops, path }, Some(t)) => {
                        // 0 = forever: a long queue, refilled never; a day at 1 Mpps is plenty.
                        let n = if *loops == 0 { 100_000 } else { u64::from(*loops) };
                        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                        let (mut shares, _) = shares_of(set, t);
                        let packets = shares.remove(&spec.id);
                        (0..n)
                            .map(|pass| deployment::Input {
                                trace: t.clone(),
                                name: name.clone(),
                                pass,
                                spooled: false,
                                packets: packets.clone(),
                            })
                            .collect()
                    }
                    _ => Vec::new(),
                };
                let s = shared.clone();
                let thread = std::thread::Builder::new()
                    .name(format!("dep-{}", spec.id))
                    .spawn(move || deployment::run(s, prepared, rx, replays));
                match thread {
                    Ok(thread) => {
                        running.insert(spec.id.clone(), Running { digest, tx, thread });
                    }
                    Err(e) => tracing::error!(deployment = %spec.id, "cannot start a thread: {e}"),
                }
            }
        }
    }
}

/// Hands every new capture in the spool to every running deployment.
async fn spool(
    dir: &Path,
    running: &HashMap<String, Running>,
    set: &DesiredSet,
    shared: &Shared,
    inflight: &mut HashMap<String, HashSet<String>>,
) {
    if running.is_empty() {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let mut files: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| !n.starts_with('.')))
        .filter(|p| p.extension().is_some_and(|x| x == "pcap" || x == "pcapng"))
        .collect();
    files.sort();
    for path in files {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if inflight.contains_key(&name) {
            continue;
        }
        let p = path.clone();
        let opened = tokio::task::spawn_blocking(move || Trace::open(&p)).await;
        match opened {
            Ok(Ok(trace)) => {
                let trace = Arc::new(trace);
                let (mut shares, unmatched) = shares_of(set, &trace);
                shared.report.lock().unwrap_or_else(PoisonError::into_inner).unmatched += unmatched;
                let mut given = HashSet::new();
                for (id, r) in running {
                    let input = deployment::Input {
                        trace: trace.clone(),
                        name: name.clone(),
                        pass: 0,
                        spooled: true,
                        packets: shares.remove(id),
                    };
                    if r.tx.send(Control::Trace(input)).is_ok() {
                        given.insert(id.clone());
                    }
                }
                tracing::info!(file = %path.display(), packets = trace.packets().len(), deployments = given.len(), "capture taken from the spool");
                inflight.insert(name, given);
            }
            Ok(Err(e)) => {
                tracing::warn!(file = %path.display(), "capture refused: {e}");
                let _ = std::fs::rename(&path, dir.join("failed").join(&name));
                let mut why = dir.join("failed").join(&name).into_os_string();
                why.push(".error");
                let _ = std::fs::write(PathBuf::from(why), format!("{e}\n"));
            }
            Err(e) => tracing::error!("reading a capture: {e}"),
        }
    }
}

/// Moves spool captures every deployment has finished (or that no running
/// deployment still holds) to `done/`.
fn release(cfg: &AgentConfig, running: &HashMap<String, Running>, inflight: &mut HashMap<String, HashSet<String>>) {
    let Input::Spool { dir } = &cfg.input else { return };
    inflight.retain(|name, left| {
        left.retain(|d| running.contains_key(d));
        if !left.is_empty() {
            return true;
        }
        if let Err(e) = std::fs::rename(dir.join(name), dir.join("done").join(name)) {
            tracing::warn!(file = %name, "cannot move a finished capture to done/: {e}");
        }
        false
    });
}

/// Compiles a revision's modules off the async threads.
async fn prepare(shared: &Shared, spec: &DeploymentSpec, blobs: Blobs) -> Prepared {
    let (s, spec2) = (shared.clone(), spec.clone());
    let span = if tracing::Span::current().is_disabled() {
        tracing::Span::none()
    } else {
        tracing::info_span!("compile", nfs = spec.nfs.len())
    };
    match tokio::task::spawn_blocking(move || span.in_scope(|| Prepared::new(&s, spec2, &blobs))).await {
        Ok(p) => p,
        Err(e) => Prepared::failed(spec.clone(), format!("compiling the chain failed: {e}")),
    }
}

/// Each attached deployment's share of a capture (ascending packet
/// indices), and how many packets no attachment claims. Deployments
/// without attachments have no entry: they get every packet.
fn shares_of(set: &DesiredSet, trace: &Trace) -> (HashMap<String, Arc<Vec<usize>>>, u64) {
    let classifier = Classifier::new(
        set.deployments.iter().enumerate().flat_map(|(i, d)| d.attachments.iter().map(move |a| (i, *a))),
    );
    if classifier.is_empty() {
        return (HashMap::new(), 0);
    }
    let mut lists: Vec<Vec<usize>> = vec![Vec::new(); set.deployments.len()];
    let mut unmatched = 0;
    for (i, p) in trace.packets().iter().enumerate() {
        let raw = sluice_runtime::RawPacket {
            data: trace.data(p),
            wire_len: p.wire_len,
            timestamp_ns: p.timestamp_ns,
            ingress_port: p.port,
        };
        match classifier.classify(&raw).and_then(|(owner, _)| lists.get_mut(owner)) {
            Some(list) => list.push(i),
            None => unmatched += 1,
        }
    }
    let shares = set
        .deployments
        .iter()
        .zip(lists)
        .filter(|(d, _)| !d.attachments.is_empty())
        .map(|(d, l)| (d.id.clone(), Arc::new(l)))
        .collect();
    (shares, unmatched)
}

/// Converges a live host's workers on `set`: removed deployments close
/// their windows and go; new or changed ones are compiled once and handed
/// to every worker.
async fn converge_live(bus: &dyn Bus, shared: &Shared, modules_dir: &Path, set: &DesiredSet, live: &mut Live) {
    let wanted: HashSet<&str> = set.deployments.iter().map(|d| d.id.as_str()).collect();
    let gone: Vec<String> = live.deployments.keys().filter(|id| !wanted.contains(id.as_str())).cloned().collect();
    for id in gone {
        tracing::info!(deployment = %id, "deployment removed");
        live.remove(&id).await;
        journal::remove(&shared.journal_dir, &id);
        forget(shared, &id);
    }
    journal::prune(&shared.journal_dir, |id| wanted.contains(id));
    for spec in &set.deployments {
        let digest = spec.digest();
        if live.deployments.get(&spec.id).is_some_and(|d| *d == digest) {
            continue;
        }
        let span = apply_span(set, spec);
        let Some(blobs) = fetch_for(bus, shared, modules_dir, spec, &digest).instrument(span.clone()).await else {
            // Its workers still take the new traffic claim (with the NFs
            // they run); it is retried on the next heartbeat.
            if live.deployments.contains_key(&spec.id) {
                let reason = "modules not fetched".to_string();
                live.apply(Prepared::failed(spec.clone(), reason), String::new()).await;
            }
            continue;
        };
        if !live.deployments.contains_key(&spec.id) {
            host_status(shared, spec, &digest, HostState::Pending, None);
        }
        if spec.attachments.is_empty() {
            tracing::warn!(deployment = %spec.id, "deployment has no traffic attachment: it receives no live traffic");
        }
        let mut prepared = prepare(shared, spec, blobs).instrument(span.clone()).await;
        prepared.trace = traced(&span);
        live.apply(prepared, digest).instrument(span).await;
    }
}

/// The span of this host's work on a deployment's new revision, in the
/// trace of the change that wrote it; none (no cost) if it carried none.
fn apply_span(set: &DesiredSet, spec: &DeploymentSpec) -> tracing::Span {
    let Some(carrier) = set.traces.get(&spec.id) else { return tracing::Span::none() };
    let span = tracing::info_span!(
        "apply deployment",
        deployment = %spec.id,
        tenant = %spec.tenant,
        revision = spec.revision,
    );
    sluice_telemetry::context::set_parent(&span, carrier);
    span
}

/// The context that later spans of the deployment (on its workers) start
/// under, if `span` is recorded.
fn traced(span: &tracing::Span) -> Option<opentelemetry::Context> {
    (!span.is_disabled()).then(|| sluice_telemetry::context::of(span))
}

/// Forgets a removed deployment: its status, its retries and its part of
/// the host report.
fn forget(shared: &Shared, id: &str) {
    shared.status.lock().unwrap_or_else(PoisonError::into_inner).remove(id);
    shared.retries.forget(id);
    shared.report.lock().unwrap_or_else(PoisonError::into_inner).deployments.remove(id);
}

/// Records how a deployment is doing on this host (keeping its packet
/// count), and pokes the heartbeat.
fn host_status(shared: &Shared, spec: &DeploymentSpec, digest: &str, state: HostState, reason: Option<String>) {
    let mut status = shared.status.lock().unwrap_or_else(PoisonError::into_inner);
    let packets = status.get(&spec.id).map(|s| s.packets).unwrap_or(0);
    let s = DeploymentStatus {
        deployment: spec.id.clone(),
        revision: spec.revision,
        state,
        reason,
        digest: Some(digest.to_string()),
        packets,
    };
    status.insert(spec.id.clone(), s);
    drop(status);
    shared.changed.notify_one();
}

/// The modules of `spec`, or none after marking it failed on this host.
async fn fetch_for(
    bus: &dyn Bus,
    shared: &Shared,
    modules_dir: &Path,
    spec: &DeploymentSpec,
    digest: &str,
) -> Option<Blobs> {
    match fetch(bus, modules_dir, spec).await {
        Ok(b) => Some(b),
        Err(reason) => {
            tracing::warn!(deployment = %spec.id, "cannot fetch modules: {reason}");
            host_status(shared, spec, digest, HostState::Failed, Some(reason));
            None
        }
    }
}
