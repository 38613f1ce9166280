//! Where the Sluice SDK lives: the WIT contract and the per-language SDK
//! folders that builds compile against.

use crate::error::CliError;
use std::path::{Path, PathBuf};

/// The contract version new projects and builds target.
pub const CONTRACT_VERSION: &str = "0.3.0";

/// A Sluice checkout (or installed copy) holding `wit/` and `sdk/`.
#[derive(Debug, Clone)]
pub struct Sdk {
    root: PathBuf,
}

impl Sdk {
    /// The SDK at `root`, checked to hold the current contract.
    pub fn at(root: &Path) -> Result<Self, CliError> {
        let root = root.canonicalize().map_err(|_| CliError::NoSdk(root.to_path_buf()))?;
        if !root.join("wit").join(format!("v{CONTRACT_VERSION}")).join("nf.wit").is_file() {
            return Err(CliError::NoSdk(root));
        }
        Ok(Sdk { root })
    }

    /// `SLUICE_SDK_ROOT` if set, else the checkout this tool was built from.
    pub fn locate(explicit: Option<&Path>) -> Result<Self, CliError> {
        if let Some(p) = explicit {
            return Sdk::at(p);
        }
        if let Some(p) = std::env::var_os("SLUICE_SDK_ROOT") {
            return Sdk::at(Path::new(&p));
        }
        Sdk::at(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."))
    }

    /// The checkout's root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The WIT package directory of the current contract.
    pub fn wit_dir(&self) -> PathBuf {
        self.root.join("wit").join(format!("v{CONTRACT_VERSION}"))
    }

    /// A language SDK's folder (`sdk/rust`, `sdk/c`, ...).
    pub fn lang_dir(&self, lang: crate::Lang) -> PathBuf {
        self.root.join("sdk").join(lang.name())
    }
}
