//! What a deployment has processed, kept on disk so a killed host bills
//! exactly what it did.
//!
//! Each deployment checkpoints, every [`CHECKPOINT_EVERY`] and whenever a
//! meter window closes or a capture is finished: the sums of the open
//! meter window per NF, where in its input it is (capture and packet),
//! which spool captures it finished, and the length of its output
//! capture. After a `kill -9` the next start:
//!
//! 1. turns the window's sums into meter records, with ids derived from
//!    the journal (the same ids however often this is repeated, so they
//!    are stored once), and writes them to the outbox;
//! 2. cuts the deployment's output back to the recorded length, and
//!    resumes its input at the recorded packet.
//!
//! So packets processed after the last checkpoint are processed again
//! (their output and meters were not kept): the bill equals the output.
//!
//! The checkpoints of all of a host's deployments go to one append-only
//! file, `<state-dir>/journal/checkpoints.log`, one JSON line per
//! checkpoint or removal; the newest line of a name wins. A line is
//! appended with one `write`, so a kill leaves at most the last line torn,
//! and a torn line is skipped when the file is read. The file is rewritten
//! with only the newest line of each name (to a temporary name, renamed)
//! at start and whenever it has grown to [`COMPACT_AT`] and four times
//! what it holds. The file lives in the page cache: a process kill loses
//! nothing it wrote; a machine crash can lose the lines the kernel had not
//! yet written back (up to the kernel's dirty-page delay, typically 30 s).
//!
//! The periodic checkpoints are written off the packet path ([`Journal`]):
//! a worker hands its checkpoint over and goes on; a thread of the host
//! appends the newest one of each deployment part, all of them in one
//! write per wake. (A file per checkpoint, written and renamed, cost a
//! live worker tens of microseconds each; written by a thread of its own,
//! its 800 file creations and renames a second with 16 tenants still put
//! the kernel's filesystem code at a tenth of a 16-tenant host's time.)
//! A `kill -9` can then also lose the checkpoint handed over but not yet
//! written, as it loses the packets after the last one: what it bills is
//! still what the journal says it processed. The checkpoints whose order
//! with other files matters — a closing window's full sums before its
//! records go to the outbox, a finished capture before the spool forgets
//! it, a start or an update — are written at once, in the caller's order
//! ([`Journal::write_now`]); reads, removals and pruning see the
//! checkpoints handed over as written.
//!
//! Checkpoint files of earlier versions (`<deployment>[.w<i>].json`) are
//! read at start, their windows recovered, and moved into the log.

use crate::outbox;
use parking_lot::{Condvar, Mutex};
use serde::{Deserialize, Serialize};
use sluice_control::{MeterRecord, Meters};
use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// How often a deployment checkpoints while it processes.
pub const CHECKPOINT_EVERY: Duration = Duration::from_millis(20);

/// The log is rewritten with only its newest lines once it is this long
/// (and four times what those lines take).
pub const COMPACT_AT: u64 = 4 << 20;

/// The log's file name in the journal directory.
const LOG: &str = "checkpoints.log";

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
    /// (named `<deployment>.w<worker>`); none: the deployment's own
    /// thread (named `<deployment>`).
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

    /// Its journal name ([`name_of`]).
    pub fn name(&self) -> String {
        name_of(&self.deployment, self.worker)
    }
}

/// One line of the log.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Line {
    /// A checkpoint, written at `at_ms` (ms since the epoch): the end of
    /// its window if the host is killed after it.
    Put { at_ms: u64, checkpoint: Checkpoint },
    /// A deployment removed: its checkpoints and its workers' go.
    Gone { deployment: String },
}

/// The newest checkpoint of each name, and when it was written.
type Newest = HashMap<String, (u64, Checkpoint)>;

/// A [`Line`] to write, borrowing what it holds.
#[derive(Serialize)]
#[serde(rename_all = "snake_case")]
enum LineRef<'a> {
    Put { at_ms: u64, checkpoint: &'a Checkpoint },
    Gone { deployment: &'a str },
}

impl LineRef<'_> {
    /// Appends the line, newline included, to `buf`.
    fn encode(&self, buf: &mut Vec<u8>) -> std::io::Result<()> {
        serde_json::to_writer(&mut *buf, self).map_err(std::io::Error::other)?;
        buf.push(b'\n');
        Ok(())
    }
}

/// Replays the log in `dir` (none: empty); a line that does not parse (a
/// write a kill tore) is skipped.
fn replay(dir: &Path) -> Newest {
    let path = dir.join(LOG);
    let mut newest = Newest::new();
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return newest,
        Err(e) => {
            tracing::error!(file = %path.display(), "cannot read the journal: {e}");
            return newest;
        }
    };
    for (i, line) in bytes.split(|&b| b == b'\n').enumerate() {
        if line.is_empty() {
            continue;
        }
        match serde_json::from_slice::<Line>(line) {
            Ok(Line::Put { at_ms, checkpoint }) => {
                newest.insert(checkpoint.name(), (at_ms, checkpoint));
            }
            Ok(Line::Gone { deployment }) => newest.retain(|_, (_, c)| c.deployment != deployment),
            Err(e) => tracing::warn!(file = %path.display(), line = i + 1, "skipping an unreadable journal line: {e}"),
        }
    }
    newest
}

/// Rewrites the log in `dir` with one line per checkpoint (to a temporary
/// name, renamed over it); returns its length.
fn rewrite(dir: &Path, newest: &Newest) -> std::io::Result<u64> {
    let mut buf = Vec::new();
    let mut names: Vec<&String> = newest.keys().collect();
    names.sort();
    for name in names {
        if let Some((at_ms, c)) = newest.get(name) {
            LineRef::Put { at_ms: *at_ms, checkpoint: c }.encode(&mut buf)?;
        }
    }
    let path = dir.join(LOG);
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, &buf)?;
    std::fs::rename(&tmp, &path)?;
    Ok(buf.len() as u64)
}

/// The log open for appending, and what it holds.
#[derive(Debug)]
struct Log {
    file: Option<File>,
    /// Bytes in the file.
    len: u64,
    /// Bytes its newest lines took when it was last rewritten.
    base: u64,
    /// An append failed part way: rewrite before appending again.
    torn: bool,
    newest: Newest,
}

/// A host's journal: checkpoints handed over by the deployments, appended
/// to the log by a thread of its own (see the module's documentation).
#[derive(Debug)]
pub struct Journal {
    dir: PathBuf,
    /// The newest checkpoint handed over per name ([`name_of`]), not
    /// written yet.
    pending: Mutex<HashMap<String, Checkpoint>>,
    wake: Condvar,
    /// The log: lock order `log`, then `pending`.
    log: Mutex<Log>,
}

/// How long the writer sleeps when nothing is handed over.
const WRITER_WAKE: Duration = Duration::from_millis(100);

impl Journal {
    /// The journal in `dir` (read from its log), with its writer thread
    /// (which ends when the journal is dropped; what is pending then is
    /// written by the drop, on the writer's thread if it was looking at
    /// the journal then).
    pub fn start(dir: PathBuf) -> std::io::Result<Arc<Journal>> {
        std::fs::create_dir_all(&dir)?;
        let newest = replay(&dir);
        let len = std::fs::metadata(dir.join(LOG)).map_or(0, |m| m.len());
        let log = Log { file: None, len, base: len, torn: false, newest };
        let j =
            Arc::new(Journal { dir, pending: Mutex::new(HashMap::new()), wake: Condvar::new(), log: Mutex::new(log) });
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

    /// Hands a checkpoint over: written soon, replacing any older one of
    /// its name not written yet.
    pub fn write(&self, c: Checkpoint) {
        self.pending.lock().insert(c.name(), c);
        self.wake.notify_one();
    }

    /// Writes a checkpoint now (an older one of its name handed over is
    /// dropped).
    pub fn write_now(&self, c: &Checkpoint) -> std::io::Result<()> {
        let mut log = self.log.lock();
        self.pending.lock().remove(&c.name());
        let at_ms = sluice_control::now_ms();
        let mut buf = Vec::new();
        LineRef::Put { at_ms, checkpoint: c }.encode(&mut buf)?;
        self.append(&mut log, &buf)?;
        log.newest.insert(c.name(), (at_ms, c.clone()));
        Ok(())
    }

    /// Writes every checkpoint handed over, in one append.
    pub fn flush(&self) {
        let mut log = self.log.lock();
        let batch = std::mem::take(&mut *self.pending.lock());
        if batch.is_empty() {
            return;
        }
        let at_ms = sluice_control::now_ms();
        let mut buf = Vec::new();
        for c in batch.values() {
            if let Err(e) = (LineRef::Put { at_ms, checkpoint: c }).encode(&mut buf) {
                tracing::error!(deployment = %c.deployment, "cannot encode the checkpoint: {e}");
            }
        }
        if let Err(e) = self.append(&mut log, &buf) {
            tracing::error!(file = %self.dir.join(LOG).display(), "cannot write {} checkpoints: {e}", batch.len());
            return;
        }
        for (name, c) in batch {
            log.newest.insert(name, (at_ms, c));
        }
    }

    /// The newest checkpoint named `name`, handed over or written.
    pub fn read(&self, name: &str) -> Option<Checkpoint> {
        let log = self.log.lock();
        if let Some(c) = self.pending.lock().get(name) {
            return Some(c.clone());
        }
        log.newest.get(name).map(|(_, c)| c.clone())
    }

    /// Removes a deployment's checkpoints, handed over or written.
    pub fn remove(&self, deployment: &str) {
        self.forget(|d| d == deployment);
    }

    /// Removes the checkpoints of deployments `keep` says no to, handed
    /// over or written: deployments removed while the host was down
    /// (their last window was recovered into the outbox at start), or a
    /// worker's late checkpoint of a deployment already removed.
    pub fn prune(&self, keep: impl Fn(&str) -> bool) {
        self.forget(|d| !keep(d));
    }

    fn forget(&self, gone: impl Fn(&str) -> bool) {
        let mut log = self.log.lock();
        self.pending.lock().retain(|_, c| !gone(&c.deployment));
        let deployments: BTreeSet<String> =
            log.newest.values().filter(|(_, c)| gone(&c.deployment)).map(|(_, c)| c.deployment.clone()).collect();
        if deployments.is_empty() {
            return;
        }
        let mut buf = Vec::new();
        for d in &deployments {
            if let Err(e) = (LineRef::Gone { deployment: d }).encode(&mut buf) {
                tracing::error!(deployment = %d, "cannot encode the removal: {e}");
            }
        }
        if let Err(e) = self.append(&mut log, &buf) {
            tracing::error!(file = %self.dir.join(LOG).display(), "cannot write a removal: {e}");
        }
        log.newest.retain(|_, (_, c)| !deployments.contains(&c.deployment));
        for d in deployments {
            tracing::info!(deployment = %d, "checkpoints of a removed deployment dropped");
        }
    }

    /// Appends `buf` to the log (one write), after rewriting it if it has
    /// grown past [`COMPACT_AT`] or an append tore.
    fn append(&self, log: &mut Log, buf: &[u8]) -> std::io::Result<()> {
        if log.torn || (log.len >= COMPACT_AT && log.len >= 4 * log.base) {
            let len = rewrite(&self.dir, &log.newest)?;
            (log.file, log.len, log.base, log.torn) = (None, len, len, false);
        }
        let file = match &mut log.file {
            Some(f) => f,
            None => log.file.insert(std::fs::OpenOptions::new().create(true).append(true).open(self.dir.join(LOG))?),
        };
        if let Err(e) = file.write_all(buf) {
            log.torn = true;
            return Err(e);
        }
        log.len += buf.len() as u64;
        Ok(())
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

/// The journal name of a deployment's part on a live host's worker, or of
/// the deployment (`worker` none).
pub fn name_of(deployment: &str, worker: Option<usize>) -> String {
    match worker {
        Some(w) => format!("{deployment}.w{w}"),
        None => deployment.to_string(),
    }
}

/// The checkpoint named `name` ([`name_of`]) in the log in `dir`, if there
/// is one: what a host started on `dir` would read.
pub fn read(dir: &Path, name: &str) -> Option<Checkpoint> {
    replay(dir).remove(name).map(|(_, c)| c)
}

/// Every checkpoint in the log in `dir`, by name.
pub fn read_all(dir: &Path) -> HashMap<String, Checkpoint> {
    replay(dir).into_iter().map(|(name, (_, c))| (name, c)).collect()
}

/// The checkpoint files of earlier versions (`<name>.json`), with their
/// modification times.
fn legacy(dir: &Path) -> Vec<(PathBuf, u64, Checkpoint)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = e.path();
        if path.extension().is_none_or(|x| x != "json") {
            continue;
        }
        let at_ms = std::fs::metadata(&path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or_else(sluice_control::now_ms, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        match std::fs::read(&path).map(|b| serde_json::from_slice::<Checkpoint>(&b)) {
            Ok(Ok(c)) => out.push((path, at_ms, c)),
            Ok(Err(e)) => tracing::warn!(file = %path.display(), "ignoring an unreadable checkpoint: {e}"),
            Err(e) => tracing::warn!(file = %path.display(), "cannot read a checkpoint: {e}"),
        }
    }
    out
}

/// At start: every checkpoint's open window becomes meter records in the
/// outbox, and the log is rewritten with each checkpoint's sums emptied
/// (keeping where its input and output are). Returns the records
/// recovered. Checkpoint files of earlier versions are recovered alike and
/// removed once the log holds them.
pub fn recover(dir: &Path, outbox_dir: &Path, host: &str) -> std::io::Result<Vec<MeterRecord>> {
    std::fs::create_dir_all(dir)?;
    std::fs::create_dir_all(outbox_dir)?;
    let mut newest = Newest::new();
    let old = legacy(dir);
    for (_, at_ms, c) in &old {
        newest.insert(c.name(), (*at_ms, c.clone()));
    }
    newest.extend(replay(dir));
    let mut out = Vec::new();
    let mut names: Vec<String> = newest.keys().cloned().collect();
    names.sort();
    for name in names {
        let Some((at_ms, c)) = newest.get_mut(&name) else { continue };
        let recs = c.records(host, *at_ms);
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
        out.extend(recs);
    }
    rewrite(dir, &newest)?;
    for (path, _, _) in old {
        let _ = std::fs::remove_file(path);
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
        // Removed: neither the line nor one handed over comes back.
        j.write(checkpoint("d1", Some(1), 5));
        j.write(checkpoint("d2", None, 1));
        j.flush();
        j.remove("d1");
        assert!(j.read("d1.w0").is_none() && j.read("d1.w1").is_none());
        assert!(read(dir.path(), "d1.w0").is_none() && read(dir.path(), "d1.w1").is_none());
        assert_eq!(j.read("d2").unwrap().window, 1);
        // Pruned alike; what is pending when the journal goes is written.
        j.write(checkpoint("d3", None, 7));
        j.prune(|d| d != "d2");
        assert!(j.read("d2").is_none());
        drop(j);
        assert_eq!(written(dir.path(), "d3").unwrap().window, 7);
        assert!(read(dir.path(), "d2").is_none());
        // A journal started on the directory reads what was written.
        let again = Journal::start(dir.path().to_path_buf()).unwrap();
        assert_eq!(again.read("d3").unwrap().window, 7);
        assert!(again.read("d2").is_none() && again.read("d1.w0").is_none());
    }

    #[test]
    fn the_writer_writes_what_is_handed_over_without_being_asked() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::start(dir.path().to_path_buf()).unwrap();
        j.write(checkpoint("d1", None, 9));
        assert_eq!(written(dir.path(), "d1").unwrap().window, 9);
    }

    #[test]
    fn many_checkpoints_a_wake_are_one_append_and_the_log_stays_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::start(dir.path().to_path_buf()).unwrap();
        let log = dir.path().join(LOG);
        for round in 0..2_000u64 {
            for d in 0..16 {
                j.write(checkpoint(&format!("d{d}"), Some(0), round));
            }
            j.flush();
        }
        // One file whatever the count of deployments, rewritten before it
        // outgrows its bound by more than a round's lines.
        let files: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(files, vec![std::ffi::OsString::from(LOG)]);
        assert!(std::fs::metadata(&log).unwrap().len() <= COMPACT_AT + 16 * 1024);
        let all = read_all(dir.path());
        assert_eq!(all.len(), 16);
        assert!(all.values().all(|c| c.window == 1_999));
    }

    #[test]
    fn a_torn_last_line_is_skipped_and_the_lines_before_it_kept() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::start(dir.path().to_path_buf()).unwrap();
        j.write_now(&checkpoint("d1", None, 1)).unwrap();
        j.write_now(&checkpoint("d2", None, 1)).unwrap();
        j.write_now(&checkpoint("d1", None, 2)).unwrap();
        drop(j);
        let log = dir.path().join(LOG);
        let bytes = std::fs::read(&log).unwrap();
        // A kill in the middle of the last write.
        std::fs::write(&log, &bytes[..bytes.len() - 20]).unwrap();
        assert_eq!(read(dir.path(), "d1").unwrap().window, 1);
        assert_eq!(read(dir.path(), "d2").unwrap().window, 1);
        // Recovery rewrites the log whole; what is appended after it reads.
        let o = dir.path().join("outbox");
        recover(dir.path(), &o, "h").unwrap();
        let j = Journal::start(dir.path().to_path_buf()).unwrap();
        j.write_now(&checkpoint("d3", None, 5)).unwrap();
        drop(j);
        assert_eq!(read(dir.path(), "d1").unwrap().window, 2);
        assert_eq!(read(dir.path(), "d3").unwrap().window, 5);
    }

    fn window(packets: u64) -> Checkpoint {
        Checkpoint {
            deployment: "d1".into(),
            worker: None,
            tenant: "t1".into(),
            record_prefix: "h-abc".into(),
            window: 4,
            window_start_ms: 10,
            nfs: vec![
                NfSums { nf: "fw".into(), sums: Meters { packets, ..Default::default() }, ..Default::default() },
                NfSums { nf: "idle".into(), ..Default::default() },
            ],
            position: Some(Position { input: "a.pcap".into(), pass: 0, packet: 96 }),
            finished: ["z.pcap".to_string()].into(),
            output_len: Some(1000),
        }
    }

    #[test]
    fn recovery_is_idempotent_and_keeps_the_position() {
        let dir = tempfile::tempdir().unwrap();
        let (j, o) = (dir.path().join("journal"), dir.path().join("outbox"));
        std::fs::create_dir_all(&j).unwrap();
        let c = window(7);
        Journal::start(j.clone()).unwrap().write_now(&c).unwrap();
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

    #[test]
    fn a_checkpoint_file_of_an_earlier_version_is_recovered_into_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let (j, o) = (dir.path().join("journal"), dir.path().join("outbox"));
        std::fs::create_dir_all(&j).unwrap();
        let c = window(3);
        std::fs::write(j.join("d1.json"), serde_json::to_vec(&c).unwrap()).unwrap();
        let recs = recover(&j, &o, "h").unwrap();
        assert_eq!(recs.iter().map(|r| (r.id.as_str(), r.meters.packets)).collect::<Vec<_>>(), [("h-abc-4-0", 3)]);
        assert!(!j.join("d1.json").exists(), "moved into the log");
        let after = read(&j, "d1").unwrap();
        assert_eq!((after.window, after.position), (5, c.position));
        assert!(recover(&j, &o, "h").unwrap().is_empty());
    }
}
