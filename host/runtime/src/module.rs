//! Loading an NF module: validate, compile (cached), pre-instantiate.

use crate::bindings::{v0_1, v0_2, v0_3, v0_4, v0_5, v0_6, v0_7};
use crate::error::RuntimeError;
use crate::pre::Pre;
use crate::wasm_runtime::Runtime;
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
    pub(crate) pre: Arc<Pre>,
    pub(crate) size: usize,
}

/// The `nf` export of each contract version, newest first.
const NF_EXPORTS: [(&str, &str); 7] = [
    ("sluice:nf/nf@0.7.0", "0.7.0"),
    ("sluice:nf/nf@0.6.0", "0.6.0"),
    ("sluice:nf/nf@0.5.0", "0.5.0"),
    ("sluice:nf/nf@0.4.0", "0.4.0"),
    ("sluice:nf/nf@0.3.0", "0.3.0"),
    ("sluice:nf/nf@0.2.0", "0.2.0"),
    ("sluice:nf/nf@0.1.0", "0.1.0"),
];

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

    /// Whether `other` runs the same compiled code as this module (the
    /// same bytes, loaded while this one lived).
    pub fn shares_code_with(&self, other: &NfModule) -> bool {
        Arc::ptr_eq(&self.pre, &other.pre)
    }

    /// The `sluice:nf` version the component was built against.
    pub fn contract_version(&self) -> &'static str {
        match *self.pre {
            Pre::V1(_) => "0.1.0",
            Pre::V2(_) => "0.2.0",
            Pre::V3(_) => "0.3.0",
            Pre::V4(_) => "0.4.0",
            Pre::V5(_) => "0.5.0",
            Pre::V6(_) => "0.6.0",
            Pre::V7(_) => "0.7.0",
        }
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
        if let Some(pre) = self.loaded.lock().get(&digest).and_then(std::sync::Weak::upgrade) {
            return Ok(NfModule { name: name.into(), digest, pre, size: bytes.len() });
        }
        let component = Component::new(&self.engine, bytes)
            .map_err(|e| RuntimeError::Invalid { nf: nf.clone(), reason: format!("{e:#}") })?;
        let exports: Vec<String> =
            component.component_type().exports(&self.engine).map(|(name, _)| name.to_string()).collect();
        let Some((_, version)) = NF_EXPORTS.iter().find(|(e, _)| exports.iter().any(|x| x == e)) else {
            return Err(RuntimeError::WrongWorld {
                nf,
                reason: format!(
                    "the component exports none of {} (it exports: {}); build it against wit/ with a Sluice SDK",
                    NF_EXPORTS.map(|e| e.0).join(", "),
                    if exports.is_empty() { "nothing".to_string() } else { exports.join(", ") }
                ),
            });
        };
        let wrong = |e: wasmtime::Error| RuntimeError::WrongWorld {
            nf: nf.clone(),
            reason: format!("as a sluice:nf@{version} component: {e:#}"),
        };
        let instance_pre = self.linker.instantiate_pre(&component).map_err(wrong)?;
        let pre = match *version {
            "0.7.0" => Pre::V7(v0_7::NetworkFunctionPre::new(instance_pre).map_err(wrong)?),
            "0.6.0" => Pre::V6(v0_6::NetworkFunctionPre::new(instance_pre).map_err(wrong)?),
            "0.5.0" => Pre::V5(v0_5::NetworkFunctionPre::new(instance_pre).map_err(wrong)?),
            "0.4.0" => Pre::V4(v0_4::NetworkFunctionPre::new(instance_pre).map_err(wrong)?),
            "0.3.0" => Pre::V3(v0_3::NetworkFunctionPre::new(instance_pre).map_err(wrong)?),
            "0.2.0" => Pre::V2(v0_2::NetworkFunctionPre::new(instance_pre).map_err(wrong)?),
            _ => Pre::V1(v0_1::NetworkFunctionPre::new(instance_pre).map_err(wrong)?),
        };
        let pre = Arc::new(pre);
        {
            let mut loaded = self.loaded.lock();
            loaded.retain(|_, w| w.strong_count() > 0);
            loaded.insert(digest.clone(), Arc::downgrade(&pre));
        }
        Ok(NfModule { name: name.into(), digest, pre, size: bytes.len() })
    }

    /// Loads a module from a file; the NF is named after the file stem.
    pub fn load_file(&self, path: &Path) -> Result<NfModule, RuntimeError> {
        let bytes = std::fs::read(path).map_err(|source| RuntimeError::Read { path: path.to_path_buf(), source })?;
        let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or("nf");
        self.load(name, &bytes)
    }
}
