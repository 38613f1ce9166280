//! What can go wrong while scaffolding or building an NF.

use std::path::PathBuf;

/// An error of `sluice nf new`, `sluice nf build` or `sluice nf check`.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// A file or directory could not be read or written.
    #[error("{action} {path}: {reason}")]
    Io {
        /// What was being done ("reading", "writing", ...).
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The underlying error (said in the message, not again as a cause).
        reason: std::io::Error,
    },
    /// `sluice.toml` is missing or malformed.
    #[error("{path}: {reason}")]
    Manifest {
        /// The manifest file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A traffic file (one packet per line) is malformed or could not be
    /// turned into a capture.
    #[error("{path}: {reason}")]
    Traffic {
        /// The traffic file.
        path: PathBuf,
        /// What is wrong, with the line.
        reason: String,
    },
    /// A toolchain the language needs is not installed.
    #[error("building a {lang} NF needs {tool}, which was not found ({detail}); {hint}")]
    MissingTool {
        /// The NF's language.
        lang: &'static str,
        /// The missing tool.
        tool: String,
        /// Where it was looked for.
        detail: String,
        /// How to install it.
        hint: &'static str,
    },
    /// A toolchain ran and failed (compile error, bad import, ...).
    #[error("{tool} failed ({status}) building {what}:\n{output}")]
    ToolFailed {
        /// The command.
        tool: String,
        /// Its exit status.
        status: String,
        /// What it was building.
        what: String,
        /// The end of its output.
        output: String,
    },
    /// A Python NF does not compile: the compiler's own report, first and
    /// alone.
    #[error("{error}")]
    PythonSyntax {
        /// `File "...", line N`, the line, a caret and `SyntaxError: ...`.
        error: String,
    },
    /// The core module could not be turned into a component.
    #[error("turning {path} into a component: {reason}")]
    Componentize {
        /// The core module.
        path: PathBuf,
        /// wit-component's explanation.
        reason: String,
    },
    /// The component does not fit the `sluice:nf` world: the same check a
    /// gateway upload gets.
    #[error("{path} does not fit the sluice:nf world: {reason}; {advice}")]
    Check {
        /// The component.
        path: PathBuf,
        /// The runtime's reason (said here once, not again as a cause).
        reason: sluice_runtime::RuntimeError,
        /// What the NF's language needs to fit it.
        advice: &'static str,
    },
    /// `sluice nf new` would overwrite something.
    #[error("{0} already exists; choose another name or directory")]
    Exists(PathBuf),
    /// An NF name that cannot become a package or file name.
    #[error("bad NF name '{0}': use 1-64 characters of a-z, 0-9 and '-', starting with a letter")]
    BadName(String),
    /// A template that does not exist.
    #[error("no template '{0}': use counter or firewall")]
    UnknownTemplate(String),
    /// The Sluice SDK directory could not be found.
    #[error(
        "the Sluice SDK is not at {0} (no wit/v0.7.0/nf.wit there); set SLUICE_SDK_ROOT to the Sluice checkout or pass --sdk-root"
    )]
    NoSdk(PathBuf),
    /// No SDK next to the binary and none named.
    #[error(
        "no Sluice SDK found (looked in {}): unpack the release tarball whole (share/sluice beside bin/sluice), or set SLUICE_SDK_ROOT (or --sdk-root) to an SDK or a Sluice checkout", .0.join(", ")
    )]
    SdkNotFound(Vec<String>),
    /// A test case of the project cannot run.
    #[error("test case {case}: {reason}")]
    Case {
        /// The case's folder name.
        case: String,
        /// What is wrong.
        reason: String,
    },
    /// Neither SLUICE_DATA_DIR, XDG_DATA_HOME nor HOME is set.
    #[error("no data directory for the installed SDK: set SLUICE_DATA_DIR (or HOME)")]
    NoDataDir,
}

pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> CliError {
    let path = path.into();
    move |reason| CliError::Io { action, path, reason }
}
