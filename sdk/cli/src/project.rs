//! An NF project on disk: a folder with `sluice.toml` naming the NF and
//! its language, and the language's sources.

use crate::Lang;
use crate::error::{CliError, io};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The manifest file of a project.
pub const MANIFEST: &str = "sluice.toml";

/// `sluice.toml`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// The NF's name: the component is `build/<name>.wasm`, and the host
    /// and gateway show it under this name.
    pub name: String,
    /// The language of the sources.
    pub lang: Lang,
    /// The NF source, relative to the project (default: the language's
    /// usual file, e.g. `nf.c`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<PathBuf>,
}

/// A project: its directory and manifest.
#[derive(Debug, Clone)]
pub struct Project {
    /// The project directory.
    pub dir: PathBuf,
    /// Its manifest.
    pub manifest: Manifest,
}

impl Project {
    /// Reads the project in `dir`.
    pub fn open(dir: &Path) -> Result<Self, CliError> {
        let path = dir.join(MANIFEST);
        let text = std::fs::read_to_string(&path).map_err(|e| CliError::Manifest {
            path: path.clone(),
            reason: format!("{e}; is this an NF project (made by `sluice nf new`)?"),
        })?;
        let manifest: Manifest =
            toml::from_str(&text).map_err(|e| CliError::Manifest { path: path.clone(), reason: e.to_string() })?;
        check_name(&manifest.name)?;
        let dir = dir.canonicalize().map_err(io("resolving", dir))?;
        Ok(Project { dir, manifest })
    }

    /// The NF source file.
    pub fn source(&self) -> PathBuf {
        self.dir.join(self.manifest.source.clone().unwrap_or_else(|| self.manifest.lang.main_source().into()))
    }

    /// Where builds put their outputs and scratch files.
    pub fn build_dir(&self) -> PathBuf {
        self.dir.join("build")
    }

    /// A digest of the project's sources (names, sizes, modification
    /// times of every file but build outputs, caches and `tests/`): it
    /// changes when the author saves one (`sluice nf watch`).
    pub fn sources_fingerprint(&self) -> Result<u64, CliError> {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        let tests = self.dir.join("tests");
        crate::sdk::walk(&self.dir, &mut |p, meta| {
            if !p.starts_with(&tests) {
                p.hash(&mut h);
                meta.len().hash(&mut h);
                meta.modified().ok().hash(&mut h);
            }
        })?;
        Ok(h.finish())
    }

    /// The component a build produces.
    pub fn component(&self) -> PathBuf {
        self.build_dir().join(format!("{}.wasm", self.manifest.name))
    }
}

/// Checks that `name` can be a package, module and file name in every
/// language.
pub fn check_name(name: &str) -> Result<(), CliError> {
    let ok = (1..=64).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.ends_with('-');
    if ok { Ok(()) } else { Err(CliError::BadName(name.to_string())) }
}
