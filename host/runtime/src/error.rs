//! Errors of loading and starting NFs.

use std::path::PathBuf;

/// Why a module could not be loaded or an NF not started.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The engine could not be configured.
    #[error("cannot set up the Wasm engine: {0}")]
    Engine(String),
    /// The module file could not be read.
    #[error("cannot read NF module {path}: {source}")]
    Read {
        /// File.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// The bytes are not WebAssembly at all.
    #[error("NF '{nf}' is not a WebAssembly binary (no \\0asm header); build it for wasm32-wasip2")]
    NotWasm {
        /// NF name.
        nf: String,
    },
    /// A core module where a component is required.
    #[error(
        "NF '{nf}' is a core WebAssembly module, not a component; build it for wasm32-wasip2 or wrap it with `wasm-tools component new`"
    )]
    CoreModule {
        /// NF name.
        nf: String,
    },
    /// Validation or compilation failed.
    #[error("NF '{nf}' is not a valid component: {reason}")]
    Invalid {
        /// NF name.
        nf: String,
        /// Cause, from the validator.
        reason: String,
    },
    /// The component's imports or exports do not fit `sluice:nf`.
    #[error("NF '{nf}' does not fit the sluice:nf network-function world: {reason}")]
    WrongWorld {
        /// NF name.
        nf: String,
        /// Cause.
        reason: String,
    },
    /// The NF refused its configuration.
    #[error("NF '{nf}' rejected its configuration: {message}")]
    ConfigRejected {
        /// NF name.
        nf: String,
        /// The NF's own message.
        message: String,
    },
    /// Instantiation or `init` trapped or failed.
    #[error("NF '{nf}' failed to start: {reason}")]
    Start {
        /// NF name.
        nf: String,
        /// Cause.
        reason: String,
    },
    /// A hot swap was refused; the running version continues.
    #[error("hot swap of NF '{nf}' refused: {reason}")]
    Swap {
        /// NF name.
        nf: String,
        /// Why.
        reason: String,
    },
    /// A chain's routes are inconsistent.
    #[error("chain: {reason}")]
    Chain {
        /// What is wrong.
        reason: String,
    },
    /// Limits inconsistent with the runtime.
    #[error("NF '{nf}': {reason}")]
    Limits {
        /// NF name.
        nf: String,
        /// What is wrong.
        reason: String,
    },
}
