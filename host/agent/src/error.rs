//! What stops the agent.

use std::path::{Path, PathBuf};

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

impl AgentError {
    /// Turns an I/O error of doing `what` to `path` into an [`AgentError`].
    pub(crate) fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> AgentError {
        let path = path.to_path_buf();
        move |source| AgentError::Io { what, path, source }
    }
}
