//! Loading an NF module: validate, compile (cached), pre-instantiate.

use crate::bindings::NetworkFunctionPre;
use crate::engine::Runtime;
use crate::error::RuntimeError;
use crate::host::HostState;
use sha2::{Digest, Sha256};
use std::path::Path;
use std::sync::Arc;
use wasmtime::component::Component;

/// A compiled, type-checked NF component, ready to instantiate on any
/// worker. Cheap to clone.
#[derive(Clone)]
pub struct NfModule {
    pub(crate) name: Arc<str>,
    pub(crate) digest: String,
    pub(crate) pre: NetworkFunctionPre<HostState>,
    pub(crate) size: usize,
}

impl std::fmt::Debug for NfModule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NfModule").field("name", &self.name).field("digest", &self.digest).finish()
    }
}

const WASM_MAGIC: [u8; 4] = *b"\0asm";
/// Version/layer field of a core module (version 1, layer 0).
const CORE_VERSION: [u8; 4] = [1, 0, 0, 0];

impl NfModule {
    /// NF name (from the file name or as given).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// SHA-256 of the component bytes, hex.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// Size of the component in bytes.
    pub fn size(&self) -> usize {
        self.size
    }
}

impl Runtime {
    /// Validates and compiles `bytes` as NF `name`, and checks it against
    /// the `sluice:nf` world (imports satisfiable by this host, `nf`
    /// exported). Compiled code is cached on disk by content.
    pub fn load(&self, name: &str, bytes: &[u8]) -> Result<NfModule, RuntimeError> {
        let nf = name.to_string();
        match (bytes.get(0..4), bytes.get(4..8)) {
            (Some(m), _) if m != WASM_MAGIC => return Err(RuntimeError::NotWasm { nf }),
            (None, _) => return Err(RuntimeError::NotWasm { nf }),
            (_, Some(v)) if v == CORE_VERSION => return Err(RuntimeError::CoreModule { nf }),
            _ => {}
        }
        let digest = hex::encode(Sha256::digest(bytes));
        let component = Component::new(&self.engine, bytes)
            .map_err(|e| RuntimeError::Invalid { nf: nf.clone(), reason: format!("{e:#}") })?;
        let instance_pre = self
            .linker
            .instantiate_pre(&component)
            .map_err(|e| RuntimeError::WrongWorld { nf: nf.clone(), reason: format!("{e:#}") })?;
        let pre = NetworkFunctionPre::new(instance_pre)
            .map_err(|e| RuntimeError::WrongWorld { nf: nf.clone(), reason: format!("{e:#}") })?;
        Ok(NfModule { name: name.into(), digest, pre, size: bytes.len() })
    }

    /// Loads a module from a file; the NF is named after the file stem.
    pub fn load_file(&self, path: &Path) -> Result<NfModule, RuntimeError> {
        let bytes = std::fs::read(path).map_err(|source| RuntimeError::Read { path: path.to_path_buf(), source })?;
        let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or("nf");
        self.load(name, &bytes)
    }
}
