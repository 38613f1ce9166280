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
//! The file lives in the page cache: a process kill loses nothing; a
//! machine crash can lose the checkpoints and outbox records the kernel
//! had not yet written back (up to the kernel's dirty-page delay,
//! typically 30 s).

use crate::outbox;
use serde::{Deserialize, Serialize};
use sluice_control::{MeterRecord, Meters};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
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
