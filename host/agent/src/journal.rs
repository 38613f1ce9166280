//! What a deployment has processed, kept on disk so a killed host bills
//! exactly what it did.
//!
//! Each deployment checkpoints, every [`CHECKPOINT_EVERY`] and whenever a
//! meter window closes or a capture is finished, one small file
//! (`<state-dir>/journal/<deployment>.json`, written to a temporary name
//! and renamed): the sums of the open meter window per NF, where in its
//! input it is (capture and packet), which spool captures it finished, and
//! the length of its output capture. After a `kill -9` the next start:
//!
//! 1. turns the window's sums into meter records, with ids derived from
//!    the journal (the same ids however often this is repeated, so they
//!    are stored once), and writes them to the outbox;
//! 2. cuts the deployment's output back to the recorded length, and
//!    resumes its input at the recorded packet.
//!
//! So packets processed after the last checkpoint are processed again
//! (their output and meters were not kept): the bill equals the output.
//! The file lives in the page cache: a process kill loses nothing it
//! wrote; a machine crash can lose the checkpoints and outbox records the
//! kernel had not yet written back (up to the kernel's dirty-page delay,
//! typically 30 s).
//!
//! The periodic checkpoints are written off the packet path ([`Journal`]):
//! a worker hands its checkpoint over and goes on; a thread of the host
//! writes the newest one of each deployment part (a file write and a
//! rename cost a live worker tens of microseconds each, 800 a second with
//! 16 tenants on it). A `kill -9` can then also lose the checkpoint handed
//! over but not yet written, as it loses the packets after the last one:
//! what it bills is still what the journal says it processed. The
//! checkpoints whose order with other files matters — a closing window's
//! full sums before its records go to the outbox, a finished capture
//! before the spool forgets it, a start or an update — are written at
//! once, in the caller's order ([`Journal::write_now`]); reads, removals
//! and pruning see the checkpoints handed over as written.

use crate::outbox;
use parking_lot::{Condvar, Mutex};
use serde::{Deserialize, Serialize};
use sluice_control::{MeterRecord, Meters};
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// How often a deployment checkpoints while it processes.
pub const CHECKPOINT_EVERY: Duration = Duration::from_millis(20);

/// One NF's identity and its sums since the window opened.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NfSums {
    /// NF name in the chain.
    pub nf: String,
    /// Module name.
    pub module: String,
    /// Module version.
    pub version: String,
    /// Module digest.
    pub digest: String,
    /// What it did in the open window, and the state it holds (gauges).
    pub sums: Meters,
}

/// Where in its input a deployment is.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Position {
    /// Capture name (a spool file's name, or the replayed file's).
    pub input: String,
    /// Replay pass (0 for spool captures).
    pub pass: u64,
    /// Packets of it done.
    pub packet: u64,
}

/// A deployment's checkpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// Deployment id.
    pub deployment: String,
    /// The worker of a live host whose part of the deployment this is
    /// (file `<deployment>.w<worker>.json`); none: the deployment's own
    /// thread (`<deployment>.json`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<usize>,
    /// Tenant billed.
    pub tenant: String,
    /// Record ids of this run start with it (`<host>-<secret>`).
    pub record_prefix: String,
    /// Sequence number of the open window within the run.
    pub window: u64,
    /// When the open window started, ms since the epoch.
    pub window_start_ms: u64,
    /// Per NF of the chain, in order.
    pub nfs: Vec<NfSums>,
    /// The capture being processed, if any.
    pub position: Option<Position>,
    /// Spool captures finished, still in the spool.
    pub finished: BTreeSet<String>,
    /// Length of the output capture, if there is one.
    pub output_len: Option<u64>,
}

impl Checkpoint {
    /// The meter records of the open window (NFs that did work), with ids
    /// `<record_prefix>-<window>-<nf index>`: the same for the same window,
    /// whoever writes them.
    pub fn records(&self, host: &str, window_end_ms: u64) -> Vec<MeterRecord> {
        self.nfs
            .iter()
            .enumerate()
            .filter(|(_, n)| !n.sums.is_empty())
            .map(|(i, n)| MeterRecord {
                id: format!("{}-{}-{i}", self.record_prefix, self.window),
                host: host.to_string(),
                tenant: self.tenant.clone(),
                deployment: self.deployment.clone(),
                nf: n.nf.clone(),
                module: n.module.clone(),
                version: n.version.clone(),
                digest: n.digest.clone(),
                window_start_ms: self.window_start_ms,
                window_end_ms: window_end_ms.max(self.window_start_ms + 1),
                meters: n.sums.clone(),
            })
            .collect()
    }
}

/// A host's journal: checkpoints handed over by the deployments, written
/// by a thread of its own (see the module's documentation).
#[derive(Debug)]
pub struct Journal {
    dir: PathBuf,
    /// The newest checkpoint handed over per name ([`name_of`]), not
    /// written yet.
    pending: Mutex<HashMap<String, Checkpoint>>,
    wake: Condvar,
    /// Held while files are written, read or removed: lock order `io`,
    /// then `pending`.
    io: Mutex<()>,
}

/// How long the writer sleeps when nothing is handed over.
const WRITER_WAKE: Duration = Duration::from_millis(100);

impl Journal {
    /// The journal in `dir`, with its writer thread (which ends when the
    /// journal is dropped; what is pending then is written by the drop,
    /// on the writer's thread if it was looking at the journal then).
    pub fn start(dir: PathBuf) -> std::io::Result<Arc<Journal>> {
        let j =
            Arc::new(Journal { dir, pending: Mutex::new(HashMap::new()), wake: Condvar::new(), io: Mutex::new(()) });
        let weak = Arc::downgrade(&j);
        std::thread::Builder::new().name("sluice-journal".into()).spawn(move || {
            while let Some(j) = weak.upgrade() {
                {
                    let mut p = j.pending.lock();
                    if p.is_empty() {
                        j.wake.wait_for(&mut p, WRITER_WAKE);
                    }
                }
                j.flush();
            }
        })?;
        Ok(j)
    }

    /// The directory the checkpoints are in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Hands a checkpoint over: written soon, replacing any older one of
    /// its name not written yet.
    pub fn write(&self, c: Checkpoint) {
        let name = name_of(&c.deployment, c.worker);
        self.pending.lock().insert(name, c);
        self.wake.notify_one();
    }

    /// Writes a checkpoint now (an older one of its name handed over is
    /// dropped).
    pub fn write_now(&self, c: &Checkpoint) -> std::io::Result<()> {
        let _io = self.io.lock();
        self.pending.lock().remove(&name_of(&c.deployment, c.worker));
        write(&self.dir, c)
    }

    /// Writes every checkpoint handed over.
    pub fn flush(&self) {
        let _io = self.io.lock();
        let batch = std::mem::take(&mut *self.pending.lock());
        for c in batch.into_values() {
            if let Err(e) = write(&self.dir, &c) {
                tracing::error!(deployment = %c.deployment, "cannot write the checkpoint: {e}");
            }
        }
    }

    /// The newest checkpoint named `name`, handed over or written.
    pub fn read(&self, name: &str) -> Option<Checkpoint> {
        let _io = self.io.lock();
        if let Some(c) = self.pending.lock().get(name) {
            return Some(c.clone());
        }
        read(&self.dir, name)
    }

    /// Removes a deployment's checkpoints, handed over or written.
    pub fn remove(&self, deployment: &str) {
        let _io = self.io.lock();
        self.pending.lock().retain(|_, c| c.deployment != deployment);
        remove(&self.dir, deployment);
    }

    /// Removes the checkpoints of deployments `keep` says no to, handed
    /// over or written (see [`prune`]).
    pub fn prune(&self, keep: impl Fn(&str) -> bool) {
        let _io = self.io.lock();
        self.pending.lock().retain(|_, c| keep(&c.deployment));
        prune(&self.dir, keep);
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        self.flush();
    }
}

/// The journal directory of a host.
pub fn dir(state_dir: &Path) -> PathBuf {
    state_dir.join("journal")
}

fn path_of(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.json"))
}

/// The journal name of a deployment's part on a live host's worker, or of
/// the deployment (`worker` none).
pub fn name_of(deployment: &str, worker: Option<usize>) -> String {
    match worker {
        Some(w) => format!("{deployment}.w{w}"),
        None => deployment.to_string(),
    }
}

/// Writes a checkpoint (atomically: a temporary file renamed over the old).
pub fn write(dir: &Path, c: &Checkpoint) -> std::io::Result<()> {
    let path = path_of(dir, &name_of(&c.deployment, c.worker));
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec(c).map_err(std::io::Error::other)?)?;
    std::fs::rename(&tmp, &path)
}

/// The checkpoint named `name` ([`name_of`]), if there is one.
pub fn read(dir: &Path, name: &str) -> Option<Checkpoint> {
    let path = path_of(dir, name);
    let bytes = std::fs::read(&path).ok()?;
    match serde_json::from_slice(&bytes) {
        Ok(c) => Some(c),
        Err(e) => {
            tracing::warn!(file = %path.display(), "ignoring an unreadable checkpoint: {e}");
            None
        }
    }
}

/// Removes a deployment's checkpoints, its own and its workers' (it was
/// undeployed).
pub fn remove(dir: &Path, deployment: &str) {
    let _ = std::fs::remove_file(path_of(dir, deployment));
    let lanes = format!("{deployment}.w");
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = e.file_name();
        let Some(stem) = name.to_str().and_then(|n| n.strip_suffix(".json")) else { continue };
        if stem.strip_prefix(&lanes).is_some_and(|w| !w.is_empty() && w.bytes().all(|b| b.is_ascii_digit())) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Removes the checkpoints of deployments `keep` says no to: deployments
/// removed while the host was down (their last window was recovered into
/// the outbox at start), or a worker's late checkpoint of a deployment
/// already removed.
pub fn prune(dir: &Path, keep: impl Fn(&str) -> bool) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = e.path();
        if path.extension().is_none_or(|x| x != "json") {
            continue;
        }
        let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else { continue };
        let Some(c) = read(dir, stem) else { continue };
        if !keep(&c.deployment) {
            tracing::info!(deployment = %c.deployment, file = %path.display(), "checkpoint of a removed deployment dropped");
            let _ = std::fs::remove_file(&path);
        }
    }
}

/// At start: every checkpoint's open window becomes meter records in the
/// outbox, and the checkpoint is rewritten with empty sums (keeping where
/// its input and output are). Returns the records recovered.
pub fn recover(dir: &Path, outbox_dir: &Path, host: &str) -> std::io::Result<Vec<MeterRecord>> {
    std::fs::create_dir_all(dir)?;
    std::fs::create_dir_all(outbox_dir)?;
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)?.flatten() {
        let path = e.path();
        if path.extension().is_none_or(|x| x != "json") {
            continue;
        }
        let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else { continue };
        let Some(mut c) = read(dir, stem) else { continue };
        let end = std::fs::metadata(&path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or_else(sluice_control::now_ms);
        let recs = c.records(host, end);
        for r in &recs {
            outbox::store(outbox_dir, r)?;
        }
        if !recs.is_empty() {
            tracing::info!(deployment = %c.deployment, records = recs.len(), "meters of a killed run recovered");
        }
        for n in &mut c.nfs {
            n.sums = Meters::default();
        }
        c.window += 1;
        write(dir, &c)?;
        out.extend(recs);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn checkpoint(deployment: &str, worker: Option<usize>, window: u64) -> Checkpoint {
        Checkpoint { deployment: deployment.into(), worker, window, ..Checkpoint::default() }
    }

    /// The checkpoint `name` once the writer thread has written it (10 s
    /// at most).
    fn written(dir: &Path, name: &str) -> Option<Checkpoint> {
        let until = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let c = read(dir, name);
            if c.is_some() || std::time::Instant::now() >= until {
                return c;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn checkpoints_handed_over_are_read_removed_and_superseded_as_if_written() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::start(dir.path().to_path_buf()).unwrap();
        // Handed over: read back at once, newest first, whether or not the
        // writer got to it.
        j.write(checkpoint("d1", Some(0), 1));
        j.write(checkpoint("d1", Some(0), 2));
        assert_eq!(j.read("d1.w0").unwrap().window, 2);
        j.flush();
        assert_eq!(read(dir.path(), "d1.w0").unwrap().window, 2);
        // Written at once, it wins over an older one handed over.
        j.write(checkpoint("d1", Some(0), 3));
        j.write_now(&checkpoint("d1", Some(0), 4)).unwrap();
        j.flush();
        assert_eq!(read(dir.path(), "d1.w0").unwrap().window, 4);
        // Removed: neither the file nor one handed over comes back.
        j.write(checkpoint("d1", Some(1), 5));
        j.write(checkpoint("d2", None, 1));
        j.remove("d1");
        j.flush();
        assert!(j.read("d1.w0").is_none() && j.read("d1.w1").is_none());
        assert_eq!(j.read("d2").unwrap().window, 1);
        // Pruned alike; what is pending when the journal goes is written.
        j.write(checkpoint("d3", None, 7));
        j.prune(|d| d != "d2");
        assert!(j.read("d2").is_none());
        drop(j);
        assert_eq!(written(dir.path(), "d3").unwrap().window, 7);
    }

    #[test]
    fn the_writer_writes_what_is_handed_over_without_being_asked() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::start(dir.path().to_path_buf()).unwrap();
        j.write(checkpoint("d1", None, 9));
        assert_eq!(written(dir.path(), "d1").unwrap().window, 9);
    }

    #[test]
    fn recovery_is_idempotent_and_keeps_the_position() {
        let dir = tempfile::tempdir().unwrap();
        let (j, o) = (dir.path().join("journal"), dir.path().join("outbox"));
        std::fs::create_dir_all(&j).unwrap();
        let c = Checkpoint {
            deployment: "d1".into(),
            worker: None,
            tenant: "t1".into(),
            record_prefix: "h-abc".into(),
            window: 4,
            window_start_ms: 10,
            nfs: vec![
                NfSums { nf: "fw".into(), sums: Meters { packets: 7, ..Default::default() }, ..Default::default() },
                NfSums { nf: "idle".into(), ..Default::default() },
            ],
            position: Some(Position { input: "a.pcap".into(), pass: 0, packet: 96 }),
            finished: ["z.pcap".to_string()].into(),
            output_len: Some(1000),
        };
        write(&j, &c).unwrap();
        let recs = recover(&j, &o, "h").unwrap();
        assert_eq!(recs.len(), 1);
        assert_eq!(recs[0].id, "h-abc-4-0");
        assert_eq!(recs[0].meters.packets, 7);
        // Recovering again finds nothing new; the position is kept.
        assert!(recover(&j, &o, "h").unwrap().is_empty());
        let after = read(&j, "d1").unwrap();
        assert_eq!(after.position, c.position);
        assert_eq!(after.output_len, Some(1000));
        assert_eq!(after.window, 6);
        assert_eq!(std::fs::read_dir(&o).unwrap().count(), 1);
    }
}
