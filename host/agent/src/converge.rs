//! Converging the host on its group's desired deployments: removed ones
//! stop (their last window closed, their checkpoints dropped), new or
//! changed ones have their modules fetched (from the host's cache, else
//! the bus), compiled once, and started or handed over — to a thread per
//! deployment on development input, to every live worker on live ports.

use crate::config::{AgentConfig, Input};
use crate::deployment::{self, Capture, Control};
use crate::live::Live;
use crate::prepare::{Blobs, Prepared, prepare};
use crate::shared::Shared;
use sluice_control::{Bus, DeploymentSpec, DesiredSet, HostState};
use sluice_engine::Classifier;
use sluice_pcap::Trace;
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use tracing::Instrument;

/// A deployment running on its own thread (development input).
pub(crate) struct Running {
    /// Digest of the spec last handed to the deployment.
    pub(crate) digest: String,
    /// To the deployment's thread.
    pub(crate) tx: crossbeam_channel::Sender<Control>,
    thread: std::thread::JoinHandle<()>,
}

impl Running {
    /// Tells the deployment to close its meter window and stop, and waits
    /// until its thread has.
    pub(crate) async fn stop(self) {
        let _ = self.tx.send(Control::Stop);
        let thread = self.thread;
        let _ = tokio::task::spawn_blocking(move || thread.join()).await;
    }
}

/// Converges a host on development input on `set`: removed deployments
/// stop; new ones start on a thread of their own (with the replayed
/// capture's passes queued, if traffic is replayed); changed ones get
/// their new revision.
pub(crate) async fn converge(
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
            r.stop().await;
        }
        // Its last window is in the outbox: nothing to resume.
        shared.journal.remove(&id);
        shared.forget(&id);
    }
    shared.journal.prune(|id| wanted.contains_key(id));
    for spec in &set.deployments {
        // The digest, not only the revision: what runs is what was asked.
        let digest = spec.digest();
        if running.get(&spec.id).is_some_and(|r| r.digest == digest) {
            continue;
        }
        let span = apply_span(set, spec);
        let Some(blobs) = fetch_for(bus, shared, modules_dir, spec).instrument(span.clone()).await else {
            continue;
        };
        let mut prepared = prepare(shared, spec, blobs).instrument(span.clone()).await;
        prepared.trace = trace_context(&span);
        match running.get_mut(&spec.id) {
            Some(r) if !r.thread.is_finished() => {
                if r.tx.send(Control::Update(Box::new(prepared))).is_ok() {
                    r.digest = digest;
                }
            }
            _ => {
                shared.set_status(spec, HostState::Pending, None);
                let replays = replays(cfg, set, spec, replay);
                match spawn(shared, prepared, replays) {
                    Ok((tx, thread)) => {
                        running.insert(spec.id.clone(), Running { digest, tx, thread });
                    }
                    Err(e) => tracing::error!(deployment = %spec.id, "cannot start a thread: {e}"),
                }
            }
        }
    }
}

/// The passes of the replayed capture a new deployment runs, if traffic is
/// replayed.
fn replays(cfg: &AgentConfig, set: &DesiredSet, spec: &DeploymentSpec, replay: Option<&Arc<Trace>>) -> Vec<Capture> {
    let (Input::Replay { loops, path }, Some(t)) = (&cfg.input, replay) else { return Vec::new() };
    // 0 = forever: a long queue, refilled never; a day at 1 Mpps is plenty.
    let n = if *loops == 0 { 100_000 } else { u64::from(*loops) };
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let (mut shares, _) = shares_of(set, t);
    let packets = shares.remove(&spec.id);
    (0..n)
        .map(|pass| Capture { trace: t.clone(), name: name.clone(), pass, spooled: false, packets: packets.clone() })
        .collect()
}

/// Starts a deployment's thread.
fn spawn(
    shared: &Shared,
    prepared: Prepared,
    replays: Vec<Capture>,
) -> std::io::Result<(crossbeam_channel::Sender<Control>, std::thread::JoinHandle<()>)> {
    let (tx, rx) = crossbeam_channel::unbounded();
    let s = shared.clone();
    let thread = std::thread::Builder::new()
        .name(format!("dep-{}", prepared.spec.id))
        .spawn(move || deployment::run(s, prepared, rx, replays))?;
    Ok((tx, thread))
}

/// Converges a live host's workers on `set`: removed deployments close
/// their windows and go; new or changed ones are compiled once and handed
/// to every worker.
pub(crate) async fn converge_live(
    bus: &dyn Bus,
    shared: &Shared,
    modules_dir: &Path,
    set: &DesiredSet,
    live: &mut Live,
) {
    let wanted: HashSet<&str> = set.deployments.iter().map(|d| d.id.as_str()).collect();
    let gone: Vec<String> = live.deployments.keys().filter(|id| !wanted.contains(id.as_str())).cloned().collect();
    for id in gone {
        tracing::info!(deployment = %id, "deployment removed");
        live.remove(&id).await;
        shared.journal.remove(&id);
        shared.forget(&id);
    }
    shared.journal.prune(|id| wanted.contains(id));
    for spec in &set.deployments {
        let digest = spec.digest();
        if live.deployments.get(&spec.id).is_some_and(|d| *d == digest) {
            continue;
        }
        let span = apply_span(set, spec);
        let Some(blobs) = fetch_for(bus, shared, modules_dir, spec).instrument(span.clone()).await else {
            // Its workers still take the new traffic claim (with the NFs
            // they run); it is retried on the next heartbeat.
            if live.deployments.contains_key(&spec.id) {
                let reason = "modules not fetched".to_string();
                live.apply(Prepared::failed(spec.clone(), reason), String::new()).await;
            }
            continue;
        };
        if !live.deployments.contains_key(&spec.id) {
            shared.set_status(spec, HostState::Pending, None);
        }
        if spec.attachments.is_empty() {
            tracing::warn!(deployment = %spec.id, "deployment has no traffic attachment: it receives no live traffic");
        }
        let mut prepared = prepare(shared, spec, blobs).instrument(span.clone()).await;
        prepared.trace = trace_context(&span);
        live.apply(prepared, digest).instrument(span).await;
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

/// The modules of `spec`, or none after marking it failed on this host.
async fn fetch_for(bus: &dyn Bus, shared: &Shared, modules_dir: &Path, spec: &DeploymentSpec) -> Option<Blobs> {
    match fetch(bus, modules_dir, spec).await {
        Ok(b) => Some(b),
        Err(reason) => {
            tracing::warn!(deployment = %spec.id, "cannot fetch modules: {reason}");
            shared.set_status(spec, HostState::Failed, Some(reason));
            None
        }
    }
}

/// Each attached deployment's share of a capture (ascending packet
/// indices), and how many packets no attachment claims. Deployments
/// without attachments have no entry: they get every packet.
pub(crate) fn shares_of(set: &DesiredSet, trace: &Trace) -> (HashMap<String, Arc<Vec<usize>>>, u64) {
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
fn trace_context(span: &tracing::Span) -> Option<opentelemetry::Context> {
    (!span.is_disabled()).then(|| sluice_telemetry::context::of(span))
}
