//! Captures dropped in a spool directory (development input): each new
//! capture goes to every running deployment (an attached deployment gets
//! its share of it), and moves to `done/` once every one of them has
//! finished it, or to `failed/` (the reason next to it) if it cannot be
//! read.

use crate::converge::{Running, shares_of};
use crate::deployment::{Capture, Control};
use crate::error::AgentError;
use crate::shared::Shared;
use sluice_control::DesiredSet;
use sluice_pcap::Trace;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A spool directory and the captures of it handed out.
pub(crate) struct Spool {
    dir: PathBuf,
    /// Spool captures handed out, and the deployments still processing each.
    inflight: HashMap<String, HashSet<String>>,
}

impl Spool {
    /// The spool at `dir`, with its `done/` and `failed/` directories.
    pub(crate) fn open(dir: &Path) -> Result<Spool, AgentError> {
        for sub in ["done", "failed"] {
            std::fs::create_dir_all(dir.join(sub)).map_err(AgentError::io("creating", &dir.join(sub)))?;
        }
        Ok(Spool { dir: dir.to_path_buf(), inflight: HashMap::new() })
    }

    /// Hands every new capture in the spool to every running deployment.
    pub(crate) async fn pick_up(&mut self, running: &HashMap<String, Running>, set: &DesiredSet, shared: &Shared) {
        if running.is_empty() {
            return;
        }
        let dir = &self.dir;
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
            if self.inflight.contains_key(&name) {
                continue;
            }
            let p = path.clone();
            let opened = tokio::task::spawn_blocking(move || Trace::open(&p)).await;
            match opened {
                Ok(Ok(trace)) => {
                    let trace = Arc::new(trace);
                    let (mut shares, unmatched) = shares_of(set, &trace);
                    shared.report.lock().unmatched += unmatched;
                    let mut given = HashSet::new();
                    for (id, r) in running {
                        let capture = Capture {
                            trace: trace.clone(),
                            name: name.clone(),
                            pass: 0,
                            spooled: true,
                            packets: shares.remove(id),
                        };
                        if r.tx.send(Control::Trace(capture)).is_ok() {
                            given.insert(id.clone());
                        }
                    }
                    tracing::info!(file = %path.display(), packets = trace.packets().len(), deployments = given.len(), "capture taken from the spool");
                    self.inflight.insert(name, given);
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

    /// Deployment `deployment` finished capture `file`: the capture moves
    /// to `done/` if it was the last.
    pub(crate) fn finished(&mut self, deployment: &str, file: &str, running: &HashMap<String, Running>) {
        if let Some(left) = self.inflight.get_mut(file) {
            left.remove(deployment);
        }
        self.release(running);
    }

    /// Moves spool captures every deployment has finished (or that no
    /// running deployment still holds) to `done/`.
    pub(crate) fn release(&mut self, running: &HashMap<String, Running>) {
        let dir = &self.dir;
        self.inflight.retain(|name, left| {
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
}
