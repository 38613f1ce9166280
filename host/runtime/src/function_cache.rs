//! Cranelift's incremental compilation cache on disk: compiled functions
//! keyed by a digest of their own code and the compiler's settings.
//!
//! The module cache (`wasmtime::Cache`) only helps when a component's
//! bytes are the same as before. An NF edited by one line changes few of
//! its functions, and a Python or JavaScript NF, whose interpreter is most
//! of the component, changes none: only its data (the snapshot of the
//! interpreter's memory). With this cache, such a component compiles only
//! the functions it has not compiled before.
//!
//! Entries are files `<dir>/<2 hex>/<62 hex>`, written aside and renamed
//! into place, so a reader never sees half of one and processes sharing
//! the directory never corrupt it. [`MAX_BYTES`] bounds the directory:
//! the least recently written entries go until half of it is left. Sizing
//! the directory means a `stat` of every entry (tens of thousands: about
//! a second of system calls), so a runtime starting over it does it at
//! most every [`PRUNE_EVERY`] (a marker file's age says when it was last
//! done, by any process) and on a thread of its own: a host or a `run`
//! never waits for it.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Most bytes the function cache keeps: a few interpreters' worth of
/// compiled functions (CPython's are about 60 MiB).
pub const MAX_BYTES: u64 = 1 << 30;

/// How often the directory is sized and pruned, at most.
pub const PRUNE_EVERY: Duration = Duration::from_secs(3600);

/// The file whose modification time is the last prune's.
const PRUNED: &str = ".pruned";

/// A directory of compiled functions; see the module documentation.
#[derive(Debug)]
pub struct FunctionCache {
    dir: PathBuf,
    next_tmp: AtomicU64,
}

impl FunctionCache {
    /// The cache in `dir` (created if missing); pruned to [`MAX_BYTES`] on
    /// a thread of its own when no process did it in the last
    /// [`PRUNE_EVERY`].
    pub fn open(dir: &Path) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        if prune_due(dir) {
            // Marked first: runtimes starting meanwhile leave it to this one.
            std::fs::write(dir.join(PRUNED), b"")?;
            let owned = dir.to_path_buf();
            let pruning =
                std::thread::Builder::new().name("function-cache-prune".into()).spawn(move || prune(&owned, MAX_BYTES));
            if let Err(e) = pruning {
                tracing::warn!(dir = %dir.display(), "the function cache is not pruned this time: {e}");
            }
        }
        Ok(FunctionCache { dir: dir.to_path_buf(), next_tmp: AtomicU64::new(0) })
    }

    fn path(&self, key: &[u8]) -> PathBuf {
        let hex = hex::encode(key);
        let (head, tail) = hex.split_at(hex.len().min(2));
        self.dir.join(head).join(tail)
    }
}

impl wasmtime::CacheStore for FunctionCache {
    fn get(&self, key: &[u8]) -> Option<Cow<'_, [u8]>> {
        std::fs::read(self.path(key)).ok().map(Cow::Owned)
    }

    fn insert(&self, key: &[u8], value: Vec<u8>) -> bool {
        let path = self.path(key);
        let Some(parent) = path.parent() else { return false };
        let n = self.next_tmp.fetch_add(1, Ordering::Relaxed);
        let tmp = parent.join(format!(".tmp.{}.{n}", std::process::id()));
        let written = std::fs::create_dir_all(parent)
            .and_then(|()| std::fs::write(&tmp, &value))
            .and_then(|()| std::fs::rename(&tmp, &path));
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written.is_ok()
    }
}

/// Whether no prune of `dir` was marked in the last [`PRUNE_EVERY`].
fn prune_due(dir: &Path) -> bool {
    let last = std::fs::metadata(dir.join(PRUNED)).and_then(|m| m.modified());
    last.map_or(true, |t| t.elapsed().map_or(true, |age| age >= PRUNE_EVERY))
}

/// Removes the oldest entries under `dir` until at most half of `max` is
/// left, when it holds more than `max` bytes.
fn prune(dir: &Path, max: u64) {
    let mut entries: Vec<(std::time::SystemTime, u64, PathBuf)> = Vec::new();
    for sub in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        for file in std::fs::read_dir(sub.path()).into_iter().flatten().flatten() {
            if let Ok(meta) = file.metadata() {
                let when = meta.modified().unwrap_or(std::time::UNIX_EPOCH);
                entries.push((when, meta.len(), file.path()));
            }
        }
    }
    let mut total: u64 = entries.iter().map(|e| e.1).sum();
    if total <= max {
        return;
    }
    entries.sort_unstable();
    for (_, len, path) in entries {
        if total <= max / 2 {
            break;
        }
        if std::fs::remove_file(&path).is_ok() {
            total = total.saturating_sub(len);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use wasmtime::CacheStore;

    #[test]
    fn a_stored_function_is_read_back_and_an_unknown_one_is_absent() {
        let dir = tempfile::tempdir().unwrap();
        let cache = FunctionCache::open(dir.path()).unwrap();
        assert!(cache.insert(&[7; 32], vec![1, 2, 3]));
        assert_eq!(cache.get(&[7; 32]).as_deref(), Some(&[1u8, 2, 3][..]));
        assert!(cache.get(&[8; 32]).is_none());
    }

    #[test]
    fn a_cache_over_its_bound_keeps_its_newest_half() {
        let dir = tempfile::tempdir().unwrap();
        let cache = FunctionCache::open(dir.path()).unwrap();
        for i in 0..10u8 {
            assert!(cache.insert(&[i; 32], vec![0; 100]));
            let when = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000 + u64::from(i));
            std::fs::File::options().write(true).open(cache.path(&[i; 32])).unwrap().set_modified(when).unwrap();
        }
        prune(dir.path(), 600);
        let kept: Vec<u8> = (0..10u8).filter(|i| cache.get(&[*i; 32]).is_some()).collect();
        assert_eq!(kept, vec![7, 8, 9]);
    }

    #[test]
    fn a_runtime_prunes_only_when_no_process_did_within_the_hour() {
        let dir = tempfile::tempdir().unwrap();
        assert!(prune_due(dir.path()));
        FunctionCache::open(dir.path()).unwrap();
        assert!(!prune_due(dir.path()), "the first open marks the prune");
        let stale = std::time::SystemTime::now() - PRUNE_EVERY - Duration::from_secs(1);
        std::fs::File::options().write(true).open(dir.path().join(PRUNED)).unwrap().set_modified(stale).unwrap();
        assert!(prune_due(dir.path()));
    }
}
