//! The contract check: the host's own loader, as the gateway runs it on
//! every upload, so a module that passes here is accepted there.

use crate::error::{CliError, io};
use sluice_runtime::{Runtime, RuntimeConfig};
use std::path::Path;

/// What the check found out about a component.
#[derive(Debug, Clone)]
pub struct Checked {
    /// Size in bytes.
    pub size: usize,
    /// The `sluice:nf` version it targets.
    pub contract: &'static str,
    /// SHA-256, hex.
    pub digest: String,
}

/// Validates, compiles and pre-instantiates `path` against the host's
/// linker under the NF name `name`.
pub fn check_file(path: &Path, name: &str, cache_dir: Option<&Path>) -> Result<Checked, CliError> {
    let bytes = std::fs::read(path).map_err(io("reading", path))?;
    let runtime =
        Runtime::new(RuntimeConfig { cache_dir: cache_dir.map(Path::to_path_buf), ..RuntimeConfig::default() })
            .map_err(|source| CliError::Check { path: path.to_path_buf(), source })?;
    let module = runtime.load(name, &bytes).map_err(|source| CliError::Check { path: path.to_path_buf(), source })?;
    Ok(Checked { size: module.size(), contract: module.contract_version(), digest: module.digest().to_string() })
}
