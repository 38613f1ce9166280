//! The contract check: the host's own loader, as the gateway runs it on
//! every upload, so a module that passes here is accepted there.

use crate::Lang;
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

/// What an NF in `lang` (or a component of unknown origin) needs to fit
/// the world, for the check's error.
fn advice(lang: Option<Lang>) -> &'static str {
    match lang {
        None => {
            "build it with `sluice nf build`, which targets sluice:nf@0.6.0 (Rust, C, Go) or 0.7.0 (Python, JavaScript), in any language"
        }
        Some(Lang::Rust) => {
            "a Rust NF is a cdylib crate that implements sluice_sdk::NetworkFunction and exports it with `export_nf!(Type)` (sdk/rust/README.md)"
        }
        Some(Lang::C) => "a C NF defines nf_init and nf_process from sluice_nf.h (sdk/c/README.md)",
        Some(Lang::Python) => "a Python NF's module ends with `Nf = export(MyNf)` (sdk/python/README.md)",
        Some(Lang::Js) => "a JavaScript NF ends with `export const nf = exportNf(MyNf)` (sdk/js/README.md)",
        Some(Lang::Go) => {
            "a Go NF registers itself with `func init() { nf.Export(myNf{}) }` and has an empty main (sdk/go/README.md)"
        }
    }
}

/// Validates, compiles and pre-instantiates `path` against the host's
/// linker under the NF name `name`; `lang`, when known, shapes the advice
/// of an error.
pub fn check_file(path: &Path, name: &str, lang: Option<Lang>, cache_dir: Option<&Path>) -> Result<Checked, CliError> {
    let bytes = std::fs::read(path).map_err(io("reading", path))?;
    let fail = |reason| CliError::Check { path: path.to_path_buf(), reason, advice: advice(lang) };
    let runtime =
        Runtime::new(RuntimeConfig { cache_dir: cache_dir.map(Path::to_path_buf), ..RuntimeConfig::default() })
            .map_err(&fail)?;
    let module = runtime.load(name, &bytes).map_err(&fail)?;
    Ok(Checked { size: module.size(), contract: module.contract_version(), digest: module.digest().to_string() })
}
