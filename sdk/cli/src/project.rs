//! An NF project on disk: a folder with `sluice.toml` naming the NF and
//! its language, and the language's sources.

use crate::Lang;
use crate::error::{CliError, io};
use serde::{Deserialize, Serialize};
use sluice_host::config::NfSection;
use std::path::{Path, PathBuf};

/// The manifest file of a project.
pub const MANIFEST: &str = "sluice.toml";

/// `sluice.toml`: everything the NF needs, here and on a gateway.
///
/// ```toml
/// name = "edge-fw"
/// lang = "rust"
/// version = "0.1.0"            # what `sluice nf deploy` uploads
///
/// [config]                     # handed to `init` as JSON; or
/// inside = "10.0.0.0/8"        # config = "text" / config_file = "fw.json"
///
/// [limits]                     # the deployment API's names and ranges
/// failure_policy = "fail-closed"
/// deadline_ms = 10
///
/// [deployment]                 # `sluice nf deploy` and `nf watch`
/// name = "edge"                # default: the NF's name
/// group = "default"
/// attach = ["port=0,vlan=100"]
///
/// [run]                        # `sluice nf run` and `nf test` here
/// workers = 2                  # default 1
/// batch = 8                    # default 32
/// spread = "addresses"         # default "flow"
/// ```
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// The NF's name: the component is `build/<name>.wasm`, and the host
    /// and gateway show it under this name.
    pub name: String,
    /// The language of the sources.
    pub lang: Lang,
    /// The version `sluice nf deploy` uploads the component as (module
    /// versions are immutable on a gateway: change it with the code).
    #[serde(default = "default_version")]
    pub version: String,
    /// The NF source, relative to the project (default: the language's
    /// usual file, e.g. `nf.c`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<PathBuf>,
    /// The NF's configuration: a string is handed to `init` as written, a
    /// table as JSON text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<toml::Value>,
    /// Or the configuration is this file's bytes (relative to the project).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_file: Option<PathBuf>,
    /// Limits, with the names, units and ranges of the gateway's
    /// deployment API (`deadline_ms`, `failure_policy`, ...): for
    /// `nf run`, `nf test`, `nf deploy` and `nf watch`. Unset ones take the
    /// host's defaults.
    #[serde(default, skip_serializing_if = "toml::Table::is_empty")]
    pub limits: toml::Table,
    /// Where `sluice nf deploy` and `sluice nf watch` deploy it.
    #[serde(default, skip_serializing_if = "DeploymentSection::is_default")]
    pub deployment: DeploymentSection,
    /// How `sluice nf run` and `sluice nf test` run the NF on this
    /// machine (`--workers` and `--batch` override it); on a gateway the
    /// host's own settings decide.
    #[serde(default, skip_serializing_if = "RunSection::is_default")]
    pub run: RunSection,
}

/// `[run]` of `sluice.toml`: the local run's shape.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RunSection {
    /// Worker threads (1 to 64; default 1). Packets are spread over them
    /// as `spread` says, as on a host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workers: Option<u32>,
    /// Packets per batch, the most one `process` call gets (1 to 4096;
    /// default 32).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<u32>,
    /// How packets spread over the workers: `flow` (by connection, the
    /// default) or `addresses` (every connection between two hosts on one
    /// worker), as the host's `spread` setting does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spread: Option<sluice_traffic::Spread>,
}

impl RunSection {
    fn is_default(&self) -> bool {
        *self == RunSection::default()
    }

    /// Worker threads, default 1.
    pub fn workers(&self) -> usize {
        self.workers.map_or(1, |w| w as usize)
    }

    /// Packets per batch, default 32.
    pub fn batch(&self) -> usize {
        self.batch.map_or(32, |b| b as usize)
    }

    /// `None` when in range, else what is wrong.
    pub fn invalid(&self) -> Option<String> {
        if let Some(w) = self.workers
            && !(1..=MAX_WORKERS).contains(&w)
        {
            return Some(format!("workers = {w} is out of range: 1 to {MAX_WORKERS}"));
        }
        if let Some(b) = self.batch
            && !(1..=MAX_BATCH).contains(&(b as usize))
        {
            return Some(format!("batch = {b} is out of range: 1 to {MAX_BATCH}"));
        }
        None
    }
}

/// The most worker threads a local run takes.
pub const MAX_WORKERS: u32 = 64;
/// The largest batch: the host's own bound.
pub const MAX_BATCH: usize = sluice_wire::abi::MAX_BATCH;

/// `[deployment]` of `sluice.toml`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct DeploymentSection {
    /// The deployment's name (default: the NF's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Its host group (default: `default`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Its traffic on the group's hosts, as `sluice deploy --attach`
    /// takes it (`port=0,vlan=100,dst=10.1.0.0/16,out=1`); required in a
    /// group whose operator exposes ports, refused in a development group.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attach: Vec<String>,
    /// What the NFs see of fragmented IP (`follow`, the default, or
    /// `reassemble`), as `sluice deploy --fragments` takes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fragments: Option<sluice_runtime::fragments::FragmentMode>,
    /// What a host's death may lose of the flows' state (`periodic`, the
    /// default, or `replicated`), as `sluice deploy --durability` takes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub durability: Option<sluice_control::Durability>,
}

impl DeploymentSection {
    fn is_default(&self) -> bool {
        *self == DeploymentSection::default()
    }
}

fn default_version() -> String {
    "0.1.0".into()
}

impl Manifest {
    /// A new project's manifest.
    pub fn new(name: &str, lang: Lang) -> Manifest {
        Manifest {
            name: name.to_string(),
            lang,
            version: default_version(),
            source: None,
            config: None,
            config_file: None,
            limits: toml::Table::new(),
            deployment: DeploymentSection::default(),
            run: RunSection::default(),
        }
    }
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
        let bad = |reason: String| CliError::Manifest { path: path.clone(), reason };
        sluice_traffic::check_version(&manifest.version).map_err(|e| bad(e.to_string()))?;
        if manifest.config.is_some() && manifest.config_file.is_some() {
            return Err(bad("give config or config_file, not both".into()));
        }
        if let Some(c) = &manifest.config
            && !matches!(c, toml::Value::String(_) | toml::Value::Table(_))
        {
            return Err(bad("config must be a string (passed as written) or a table (passed as JSON)".into()));
        }
        NfSection::limits_from(manifest.limits.clone()).map_err(|e| bad(format!("[limits]: {e}")))?;
        if let Some(reason) = manifest.run.invalid() {
            return Err(bad(format!("[run]: {reason}")));
        }
        for a in &manifest.deployment.attach {
            a.parse::<sluice_traffic::Attachment>().map_err(|e| bad(format!("[deployment] attach '{a}': {e}")))?;
        }
        let dir = dir.canonicalize().map_err(io("resolving", dir))?;
        Ok(Project { dir, manifest })
    }

    /// The NF's configuration bytes, as `init` gets them: `config` (a
    /// string as written, a table as JSON) or `config_file`'s bytes;
    /// empty when neither is set.
    pub fn config_bytes(&self) -> Result<Vec<u8>, CliError> {
        if let Some(f) = &self.manifest.config_file {
            let p = self.dir.join(f);
            return std::fs::read(&p).map_err(io("reading the config_file", &p));
        }
        Ok(match &self.manifest.config {
            Some(toml::Value::String(s)) => s.clone().into_bytes(),
            Some(v) => serde_json::to_vec(v).unwrap_or_default(),
            None => Vec::new(),
        })
    }

    /// The manifest's limits, as the host's `[nf.<name>]` section holds
    /// them (checked when the project was opened).
    pub fn limits(&self) -> NfSection {
        NfSection::limits_from(self.manifest.limits.clone()).unwrap_or_default()
    }

    /// The host configuration that runs this project locally (`nf run`,
    /// `nf test`): the workers and batch size of `run` (the manifest's
    /// `[run]` with the command line's overrides), and an `[nf.<name>]`
    /// section with the manifest's limits and `config` (the manifest's
    /// configuration when `None`).
    pub fn host_config(&self, config: Option<String>, run: RunSection) -> sluice_host::HostConfig {
        let mut section = self.limits();
        match (config, &self.manifest.config_file) {
            (Some(text), _) => section.config_text = Some(text),
            // A file's bytes pass as they are, UTF-8 or not.
            (None, Some(f)) => section.config_file = Some(self.dir.join(f)),
            (None, None) => {
                section.config_text = Some(String::from_utf8_lossy(&self.config_bytes().unwrap_or_default()).into())
            }
        }
        // Local runs see fragments as the deployment will.
        let mut host = sluice_host::HostConfig {
            batch_size: run.batch(),
            workers: run.workers(),
            spread: run.spread.unwrap_or_default(),
            fragments: self.manifest.deployment.fragments.unwrap_or_default(),
            ..Default::default()
        };
        host.base_dir = self.dir.clone();
        host.nf.insert(self.manifest.name.clone(), section);
        host
    }

    /// The manifest's `[run]` with `workers`, `batch` and `spread` (from
    /// the command line) in place of its own where given.
    pub fn local_run(
        &self,
        workers: Option<u32>,
        batch: Option<u32>,
        spread: Option<sluice_traffic::Spread>,
    ) -> RunSection {
        let own = &self.manifest.run;
        RunSection { workers: workers.or(own.workers), batch: batch.or(own.batch), spread: spread.or(own.spread) }
    }

    /// The deployment `nf deploy` and `nf watch` manage.
    pub fn deployment_name(&self) -> &str {
        self.manifest.deployment.name.as_deref().unwrap_or(&self.manifest.name)
    }

    /// The NF source file.
    pub fn source(&self) -> PathBuf {
        self.dir.join(self.manifest.source.clone().unwrap_or_else(|| self.manifest.lang.main_source().into()))
    }

    /// Where builds put their outputs and scratch files.
    pub fn build_dir(&self) -> PathBuf {
        self.dir.join("build")
    }

    /// A digest of the project's sources: the name and contents of every
    /// file but build outputs, caches, the SDK link, captures and
    /// `tests/` (SHA-256, hex). It changes exactly when a source does:
    /// `sluice nf watch` rebuilds on it, and a build whose sources,
    /// SDK and toolchain are unchanged reuses its component.
    pub fn sources_digest(&self) -> Result<String, CliError> {
        let tests = self.dir.join("tests");
        crate::sdk::digest_files(&self.dir, std::slice::from_ref(&self.dir), &|p| {
            !p.starts_with(&tests) && !p.extension().is_some_and(|e| e == "pcap" || e == "pcapng")
        })
    }

    /// The component a build produces.
    pub fn component(&self) -> PathBuf {
        self.build_dir().join(format!("{}.wasm", self.manifest.name))
    }
}

/// Checks that `name` can be a module name at the gateway (the one rule,
/// [`sluice_traffic::check_name`]) and also a package, module and file
/// name in every language: lowercase, starting with a letter, no `_`, not
/// ending with `-`.
pub fn check_name(name: &str) -> Result<(), CliError> {
    let ok = sluice_traffic::check_name("module", name).is_ok()
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.ends_with('-');
    if ok { Ok(()) } else { Err(CliError::BadName(name.to_string())) }
}
