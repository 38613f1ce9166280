//! Chain files: which NFs form a chain and where each sends its packets.
//!
//! ```toml
//! # firewall -> ids (label 1) | counter (the rest); both go on to monitor
//! [[nf]]
//! name = "firewall"
//! module = "../../target/nfs/firewall.wasm"   # relative to this file
//! next = "counter"                            # forwarded packets
//! labels = { 1 = "ids" }                      # label(1) packets
//!
//! [[nf]]
//! name = "ids"
//! module = "../../target/nfs/ids.wasm"
//! next = "monitor"
//!
//! [[nf]]
//! name = "counter"
//! module = "../../target/nfs/counter.wasm"
//! next = "monitor"
//!
//! [[nf]]
//! name = "monitor"
//! module = "../../target/nfs/counter.wasm"
//! # no next: packets leave the chain here
//! ```
//!
//! The first NF receives every packet. NFs must be listed so that every
//! route goes forward; NF names are also the names of their `[nf.<name>]`
//! sections in the host config.

use crate::config::ConfigError;
use serde::Deserialize;
use sluice_runtime::Routes;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ChainFile {
    nf: Vec<Node>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Node {
    name: String,
    module: PathBuf,
    #[serde(default)]
    next: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
}

/// A parsed chain: NF names and modules in order, and their routes.
#[derive(Debug, Clone)]
pub struct ChainDef {
    /// (name, module path) of each NF, in chain order.
    pub nfs: Vec<(String, PathBuf)>,
    /// Routes of each NF.
    pub routes: Vec<Routes>,
}

impl ChainDef {
    /// A linear chain of modules named after their file stems.
    pub fn linear(modules: &[PathBuf]) -> ChainDef {
        let nfs = modules
            .iter()
            .map(|p| (p.file_stem().and_then(|s| s.to_str()).unwrap_or("nf").to_string(), p.clone()))
            .collect::<Vec<_>>();
        ChainDef { routes: Routes::linear(nfs.len()), nfs }
    }

    /// One worker's instance of the chain: its NFs started from `specs`
    /// (in chain order), sharing `domains` with the other workers; packets
    /// from the `outside` ports run it last NF first (see
    /// [`sluice_runtime::Chain::set_outside`]); `fragments` chooses what
    /// its NFs see of fragmented IP.
    pub fn instantiate(
        &self,
        runtime: &sluice_runtime::Runtime,
        specs: &[sluice_runtime::NfSpec],
        domains: &[std::sync::Arc<sluice_state::Domain>],
        outside: &[u16],
        fragments: sluice_runtime::fragments::FragmentMode,
    ) -> Result<sluice_runtime::Chain, sluice_runtime::RuntimeError> {
        let mut chain = sluice_runtime::Chain::with_domains(runtime, specs, self.routes.clone(), domains)?;
        chain.set_outside(outside)?;
        chain.set_fragment_mode(fragments);
        Ok(chain)
    }

    /// Reads a chain file.
    pub fn load(path: &Path) -> Result<ChainDef, ConfigError> {
        let err = |message: String| ConfigError::Parse { path: path.to_path_buf(), message };
        let file: ChainFile = sluice_config::parse_file(path, |t| toml::from_str(t))?;
        if file.nf.is_empty() {
            return Err(err("a chain needs at least one [[nf]]".into()));
        }
        let base = path.parent().unwrap_or(Path::new("."));
        let index = |name: &str, from: &str| {
            file.nf
                .iter()
                .position(|n| n.name == name)
                .ok_or_else(|| err(format!("NF '{from}' routes to '{name}', which is not in the chain")))
        };
        let mut routes = Vec::with_capacity(file.nf.len());
        for (i, n) in file.nf.iter().enumerate() {
            if file.nf.iter().take(i).any(|m| m.name == n.name) {
                return Err(err(format!("NF name '{}' is used twice", n.name)));
            }
            let next = n.next.as_deref().map(|t| index(t, &n.name)).transpose()?;
            let mut labels = Vec::new();
            for (l, t) in &n.labels {
                let label: u16 =
                    l.parse().map_err(|_| err(format!("NF '{}': label '{l}' is not a number 0-65535", n.name)))?;
                labels.push((label, index(t, &n.name)?));
            }
            routes.push(Routes { next, labels });
        }
        let names: Vec<&str> = file.nf.iter().map(|n| n.name.as_str()).collect();
        sluice_runtime::check_routes(&names, &routes).map_err(err)?;
        Ok(ChainDef { nfs: file.nf.iter().map(|n| (n.name.clone(), base.join(&n.module))).collect(), routes })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Result<ChainDef, String> {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("chain.toml");
        std::fs::write(&p, text).unwrap();
        ChainDef::load(&p).map_err(|e| e.to_string())
    }

    #[test]
    fn a_branching_chain() {
        let c = load(
            r#"
            [[nf]]
            name = "fw"
            module = "fw.wasm"
            next = "b"
            labels = { 1 = "a" }
            [[nf]]
            name = "a"
            module = "a.wasm"
            next = "c"
            [[nf]]
            name = "b"
            module = "b.wasm"
            next = "c"
            [[nf]]
            name = "c"
            module = "c.wasm"
            "#,
        )
        .unwrap();
        assert_eq!(c.routes[0], Routes { next: Some(2), labels: vec![(1, 1)] });
        assert_eq!(c.routes[3], Routes::default());
        assert!(c.nfs[1].1.ends_with("a.wasm"));
    }

    #[test]
    fn loops_unknown_names_and_bad_labels_are_errors() {
        let e = load("[[nf]]\nname='a'\nmodule='a'\nnext='b'\n[[nf]]\nname='b'\nmodule='b'\nnext='a'\n").unwrap_err();
        assert!(e.contains("comes before it"), "{e}");
        let e = load("[[nf]]\nname='a'\nmodule='a'\nnext='zz'\n").unwrap_err();
        assert!(e.contains("'zz'"), "{e}");
        let e = load("[[nf]]\nname='a'\nmodule='a'\nlabels={ x = 'a' }\n").unwrap_err();
        assert!(e.contains("label 'x'"), "{e}");
        let e = load("[[nf]]\nname='a'\nmodule='a'\n[[nf]]\nname='a'\nmodule='b'\n").unwrap_err();
        assert!(e.contains("twice"), "{e}");
    }
}
