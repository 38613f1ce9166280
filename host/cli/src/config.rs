//! Host configuration: one TOML file plus `SLUICE_*` environment variables.
//!
//! Precedence, lowest first: built-in defaults, the TOML file (`--config`),
//! environment variables, command-line flags. The file holds host settings
//! and one `[nf.<name>]` table per NF, where `<name>` is the NF's file stem
//! (`firewall` for `firewall.wasm`). Keys are snake_case, the names the
//! gateway's deployment API and an NF project's `sluice.toml` use for the
//! same settings (the kebab-case spellings, `batch-size`, are accepted too;
//! the keys inside an NF's own `config` table are the NF's and pass as
//! written):
//!
//! ```toml
//! batch_size = 32            # SLUICE_BATCH_SIZE
//! workers = 1                # SLUICE_WORKERS
//! cores = "0-3"              # SLUICE_CORES: cores workers are pinned to, one
//!                            # each in list order, round-robin when there are
//!                            # more workers (default: every core the process
//!                            # may use; `dpdk`: the EAL's lcores)
//! cache_dir = "/var/cache/sluice"     # SLUICE_CACHE_DIR; "" disables; default
//!                                      # $XDG_CACHE_HOME/sluice or ~/.cache/sluice
//!                                      # (modules/ and functions/: see
//!                                      # sluice_runtime::function_cache)
//! max_memory_mb = 256        # SLUICE_MAX_MEMORY_MB: pool slot size
//! max_instances = 512        # SLUICE_MAX_INSTANCES: NF instances the pool holds
//!                            # (default: 2 × NFs × workers, at least 32; `serve`: 512)
//! fuel = false               # SLUICE_FUEL: compile in fuel metering
//! mbuf_size = 2048           # SLUICE_MBUF_SIZE: bytes a DPDK packet buffer holds
//!                            # (`--mbuf-size`); a port's frames must fit one
//!                            # (raised to a net_af_packet framesz; jumbo: 9216+)
//! outside_ports = [1]        # SLUICE_OUTSIDE_PORTS="1": packets from these
//!                            # ingress ports (replies) run a linear chain last
//!                            # NF first (`run`, `dpdk`; default none)
//! fragments = "follow"       # SLUICE_FRAGMENTS: what NFs see of fragmented IP
//!                            # (`--fragments`): "follow" (the first fragment;
//!                            # the others follow its verdict) or "reassemble"
//!                            # (whole datagrams, cut again on the way out)
//! spread = "flow"            # SLUICE_SPREAD: how packets spread over workers
//!                            # (`--spread`): "flow" (by connection) or
//!                            # "addresses" (every connection of a host pair
//!                            # on one worker; DPDK: RSS on IP addresses)
//! handed_flows = 262144      # SLUICE_HANDED_FLOWS: translated flows each DPDK
//!                            # worker remembers to hand their replies to the
//!                            # worker that translated them (about 56 bytes
//!                            # each; a NAT connection is two); under `serve`
//!                            # shared fairly by the tenants
//!
//! [nf.firewall]
//! failure_policy = "fail-closed"   # or "fail-open"; SLUICE_FAILURE_POLICY sets the default
//! deadline_ms = 10                 # SLUICE_DEADLINE_MS sets the default
//! start_deadline_ms = 1000         # instantiation + init; SLUICE_START_DEADLINE_MS
//! memory_mb = 64                   # SLUICE_MEMORY_MB sets the default
//! fuel = 0                         # per-batch fuel; 0 = unlimited
//! max_flows = 1048576
//! max_flow_state_bytes = 4096
//! state_budget_mb = 64
//! log_lines_per_second = 50
//! # The NF's own configuration, handed to its `init` as JSON text:
//! [nf.firewall.config]
//! default = "deny"
//! # ...or as raw bytes from a file (`config_file = "rules.json"`) or a
//! # string (`config_text = "..."`).
//! ```

use serde::{Deserialize, Serialize};
use sluice_engine::cores::CoreList;
use sluice_runtime::{FailurePolicy, NfLimits, RuntimeConfig};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use sluice_config::ConfigError;
use sluice_config::env_parse;

/// Settings of one NF: its limits (the names and meanings of the
/// deployment API's `limits`) and its configuration.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NfSection {
    /// `fail-open` or `fail-closed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_policy: Option<FailurePolicy>,
    /// CPU deadline per batch, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<u64>,
    /// CPU deadline of instantiation plus `init`, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_deadline_ms: Option<u64>,
    /// Memory cap, MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u64>,
    /// Fuel per batch (0 = unlimited).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fuel: Option<u64>,
    /// Flow-table capacity per worker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_flows: Option<usize>,
    /// Largest per-flow state value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_flow_state_bytes: Option<usize>,
    /// State memory budget, MiB: each instance's own tables and flow
    /// state, and once more the NF's shared tables on the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_budget_mb: Option<usize>,
    /// Log rate limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_lines_per_second: Option<u32>,
    /// The NF's config as a table, passed to `init` as JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<toml::Table>,
    /// The NF's config from a file, passed verbatim (relative to the config file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_file: Option<PathBuf>,
    /// The NF's config as a string, passed verbatim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_text: Option<String>,
}

/// NF instances a `serve` host's pool holds by default: eight tenants at
/// the gateway's default `quotas.nfs-per-group` (64).
pub const SERVE_INSTANCES: u32 = 512;

/// The whole host configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostConfig {
    /// Packets per batch (one NF call per batch).
    #[serde(default = "default_batch")]
    pub batch_size: usize,
    /// Worker threads.
    #[serde(default = "default_workers")]
    pub workers: usize,
    /// Cores worker threads are pinned to, as in taskset (`"0-3,6"`): one
    /// worker per core in list order, round-robin when there are more
    /// workers than cores. Default: every core the process may use (for
    /// `dpdk`, the EAL's lcores).
    #[serde(default)]
    pub cores: Option<String>,
    /// Compiled-code cache directory; empty disables the cache.
    #[serde(default = "default_cache_dir")]
    pub cache_dir: PathBuf,
    /// Pool slot size (the largest memory any NF may get), MiB.
    #[serde(default = "default_max_memory")]
    pub max_memory_mb: u64,
    /// NF instances the engine's pool holds (every NF on every worker,
    /// plus room for swaps and re-creations). Default: 2 × NFs × workers,
    /// at least 32; under `serve`, where the group's tenants decide what
    /// runs, [`SERVE_INSTANCES`].
    #[serde(default)]
    pub max_instances: Option<u32>,
    /// Whether fuel metering is compiled in.
    #[serde(default)]
    pub fuel: bool,
    /// Bytes each DPDK packet buffer (mbuf) holds after its headroom: the
    /// longest frame a port receives whole. It is raised to fit the ring
    /// frames (`framesz`) of the `net_af_packet` devices in the EAL
    /// arguments, which the kernel also fills with the IPv4 datagrams it
    /// reassembles (a longer one arrives cut short and is refused and
    /// counted). Default 2048.
    #[serde(default = "default_mbuf_size")]
    pub mbuf_size: u16,
    /// Ingress ports on the outside of the chain (`run`, `dpdk`): their
    /// packets, the replies to connections opened from the inside, run a
    /// linear chain from its last NF to its first, so every NF sees both
    /// directions of a connection on its own side of the NFs that rewrite
    /// it (see [`sluice_runtime::Chain::set_outside`]). Empty: every packet
    /// runs the chain in order. (`serve` takes this from its deployments'
    /// attachments: `side=outside`.)
    #[serde(default)]
    pub outside_ports: Vec<u16>,
    /// What the NFs see of fragmented IP datagrams (`run`, `dpdk`; see
    /// [`sluice_runtime::fragments::FragmentMode`]). (`serve` takes this
    /// from each deployment's `fragments`.)
    #[serde(default)]
    pub fragments: sluice_runtime::fragments::FragmentMode,
    /// How packets spread over the workers (`run` in software; `dpdk`,
    /// `serve --dpdk` and `steer` through the ports' RSS, see
    /// [`sluice_traffic::Spread`]). Under `serve --dpdk` the ports are the
    /// host's, so every deployment on it spreads the same way.
    #[serde(default)]
    pub spread: sluice_traffic::Spread,
    /// Flows translated by another worker that each worker of a DPDK host
    /// with several remembers, to hand their packets to the worker with
    /// their state (see [`sluice_engine::handoff`]); at least 1.
    #[serde(default = "default_handed_flows")]
    pub handed_flows: usize,
    /// Per-NF sections.
    #[serde(default)]
    pub nf: BTreeMap<String, NfSection>,
    /// Defaults for NF limits from the environment.
    #[serde(skip)]
    pub nf_defaults: NfSection,
    /// Directory of the config file, for relative `config-file` paths.
    #[serde(skip)]
    pub base_dir: PathBuf,
}

fn default_batch() -> usize {
    32
}
fn default_workers() -> usize {
    1
}
/// The user's cache directory for compiled code: `$XDG_CACHE_HOME/sluice`,
/// else `~/.cache/sluice`; none (no cache) if neither is known.
fn default_cache_dir() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").filter(|v| !v.is_empty()).map(|h| PathBuf::from(h).join(".cache")))
        .map(|d| d.join("sluice"))
        .unwrap_or_default()
}
fn default_mbuf_size() -> u16 {
    2048
}
fn default_handed_flows() -> usize {
    #[cfg(feature = "dpdk")]
    let flows = sluice_engine::handoff::CAPACITY;
    // Without DPDK no worker hands a flow to another: the setting is read,
    // shown with the same default, and unused.
    #[cfg(not(feature = "dpdk"))]
    let flows = 1 << 18;
    flows
}
fn default_max_memory() -> u64 {
    256
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            batch_size: default_batch(),
            workers: default_workers(),
            cores: None,
            cache_dir: default_cache_dir(),
            max_memory_mb: default_max_memory(),
            max_instances: None,
            fuel: false,
            mbuf_size: default_mbuf_size(),
            outside_ports: Vec::new(),
            fragments: sluice_runtime::fragments::FragmentMode::default(),
            spread: sluice_traffic::Spread::default(),
            handed_flows: default_handed_flows(),
            nf: BTreeMap::new(),
            nf_defaults: NfSection::default(),
            base_dir: PathBuf::from("."),
        }
    }
}

/// A comma-separated list of port ids (`"1"`, `"1,3"`; empty: none).
pub fn parse_ports(text: &str) -> Result<Vec<u16>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| p.parse::<u16>().map_err(|_| format!("'{p}' is not a port id (0-65535); give e.g. \"1\" or \"1,3\"")))
        .collect()
}

/// `key` in snake_case: the kebab-case spelling (`batch-size`) is the
/// same setting.
fn snake(key: &str) -> String {
    key.replace('-', "_")
}

impl NfSection {
    /// The section's limits as the deployment API's `limits` object (the
    /// same names; unset ones left out).
    pub fn limits_json(&self) -> serde_json::Map<String, serde_json::Value> {
        let limits = NfSection { config: None, config_file: None, config_text: None, ..self.clone() };
        match serde_json::to_value(limits) {
            Ok(serde_json::Value::Object(m)) => m,
            _ => serde_json::Map::new(),
        }
    }

    /// Reads a table of limits only (a project's `[limits]`): the keys of
    /// [`NfSection`] but its configuration ones, snake_case or kebab-case.
    pub fn limits_from(table: toml::Table) -> Result<NfSection, String> {
        let table: toml::Table = table.into_iter().map(|(k, v)| (snake(&k), v)).collect();
        if let Some(k) = ["config", "config_file", "config_text"].iter().find(|k| table.contains_key(**k)) {
            return Err(format!("{k} is the NF's configuration, not a limit: give it outside [limits]"));
        }
        NfSection::deserialize(toml::Value::Table(table)).map_err(|e| e.to_string())
    }
}

impl HostConfig {
    /// Parses a configuration file's text, either spelling of the keys
    /// (see the module documentation); the message says what is wrong.
    pub fn parse(text: &str) -> Result<HostConfig, String> {
        let table: toml::Table = toml::from_str(text).map_err(|e| e.to_string())?;
        let mut table: toml::Table = table.into_iter().map(|(k, v)| (snake(&k), v)).collect();
        if let Some(toml::Value::Table(nfs)) = table.remove("nf") {
            // Only each section's own keys: those of its `config` table
            // are the NF's.
            let nfs: toml::Table = nfs
                .into_iter()
                .map(|(name, section)| match section {
                    toml::Value::Table(keys) => {
                        (name, toml::Value::Table(keys.into_iter().map(|(k, v)| (snake(&k), v)).collect()))
                    }
                    other => (name, other),
                })
                .collect();
            table.insert("nf".into(), toml::Value::Table(nfs));
        }
        HostConfig::deserialize(toml::Value::Table(table)).map_err(|e| e.to_string())
    }

    /// Loads `path` (if given) and applies `SLUICE_*` variables.
    pub fn load(path: Option<&Path>) -> Result<Self, ConfigError> {
        let mut cfg = match path {
            Some(p) => {
                let mut c = sluice_config::parse_file(p, HostConfig::parse)?;
                c.base_dir = p.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."));
                c
            }
            None => HostConfig::default(),
        };
        if let Some(v) = env_parse("SLUICE_BATCH_SIZE")? {
            cfg.batch_size = v;
        }
        if let Some(v) = env_parse("SLUICE_WORKERS")? {
            cfg.workers = v;
        }
        if let Ok(v) = std::env::var("SLUICE_CORES") {
            cfg.cores = Some(v);
        }
        if let Ok(v) = std::env::var("SLUICE_CACHE_DIR") {
            cfg.cache_dir = PathBuf::from(v);
        }
        if let Some(v) = env_parse("SLUICE_MAX_MEMORY_MB")? {
            cfg.max_memory_mb = v;
        }
        if let Some(v) = env_parse("SLUICE_MAX_INSTANCES")? {
            cfg.max_instances = Some(v);
        }
        if let Some(v) = env_parse("SLUICE_FUEL")? {
            cfg.fuel = v;
        }
        if let Some(v) = env_parse("SLUICE_MBUF_SIZE")? {
            cfg.mbuf_size = v;
        }
        if let Some(ports) = sluice_config::env_check("SLUICE_OUTSIDE_PORTS", parse_ports)? {
            cfg.outside_ports = ports;
        }
        if let Some(v) = env_parse("SLUICE_FRAGMENTS")? {
            cfg.fragments = v;
        }
        if let Some(v) = env_parse("SLUICE_HANDED_FLOWS")? {
            cfg.handed_flows = v;
        }
        if let Some(v) = env_parse("SLUICE_SPREAD")? {
            cfg.spread = v;
        }
        cfg.nf_defaults.deadline_ms = env_parse("SLUICE_DEADLINE_MS")?;
        cfg.nf_defaults.start_deadline_ms = env_parse("SLUICE_START_DEADLINE_MS")?;
        cfg.nf_defaults.memory_mb = env_parse("SLUICE_MEMORY_MB")?;
        if let Ok(v) = std::env::var("SLUICE_FAILURE_POLICY") {
            cfg.nf_defaults.failure_policy = Some(match v.as_str() {
                "fail-open" => FailurePolicy::FailOpen,
                "fail-closed" => FailurePolicy::FailClosed,
                _ => {
                    return Err(ConfigError::Env {
                        name: "SLUICE_FAILURE_POLICY".into(),
                        value: v,
                        reason: "use fail-open or fail-closed".into(),
                    });
                }
            });
        }
        Ok(cfg)
    }

    /// The cores of the `cores` setting, checked against those this
    /// process may use; `None` when it is not set.
    pub fn core_list(&self) -> Result<Option<CoreList>, ConfigError> {
        let Some(text) = self.cores.as_deref() else { return Ok(None) };
        let err = |reason: String| ConfigError::Invalid(format!("cores '{text}': {reason}"));
        let list: CoreList = text.parse().map_err(|e: sluice_engine::cores::CoreError| err(e.to_string()))?;
        let allowed = CoreList::allowed().map_err(|e| err(e.to_string()))?;
        if let Some(c) = list.cores().iter().find(|c| !allowed.cores().contains(c)) {
            return Err(err(format!("core {c} is not one this process may run on ({allowed})")));
        }
        Ok(Some(list))
    }

    /// The cores workers are pinned to: the `cores` setting, else every
    /// core the process may use.
    pub fn worker_cores(&self) -> Result<CoreList, ConfigError> {
        match self.core_list()? {
            Some(l) => Ok(l),
            None => CoreList::allowed()
                .map_err(|e| ConfigError::Invalid(format!("cores '(the process's CPU affinity)': {e}"))),
        }
    }

    /// The engine settings.
    pub fn runtime(&self) -> RuntimeConfig {
        let nfs = self.nf.len().max(4) as u32;
        RuntimeConfig {
            cache_dir: if self.cache_dir.as_os_str().is_empty() { None } else { Some(self.cache_dir.clone()) },
            max_memory_bytes: self.max_memory_mb << 20,
            max_instances: self.max_instances.unwrap_or((nfs * self.workers.max(1) as u32 * 2).max(32)),
            fuel: self.fuel || self.nf.values().any(|s| s.fuel.unwrap_or(0) > 0),
            ..RuntimeConfig::default()
        }
    }

    /// The engine settings of `serve`: the pool holds
    /// [`SERVE_INSTANCES`] unless `max-instances` says otherwise, so one
    /// tenant's many small deployments do not leave the next tenant none
    /// (the gateway's `quotas.nfs-per-group` bounds each tenant's share).
    pub fn serve_runtime(&self) -> RuntimeConfig {
        RuntimeConfig { max_instances: self.max_instances.unwrap_or(SERVE_INSTANCES), ..self.runtime() }
    }

    /// Limits of NF `name`: its section over the environment defaults over
    /// built-in defaults.
    pub fn limits(&self, name: &str) -> NfLimits {
        let d = NfLimits::default();
        let s = self.nf.get(name);
        let pick = |f: fn(&NfSection) -> Option<u64>| s.and_then(f).or_else(|| f(&self.nf_defaults));
        NfLimits {
            deadline: pick(|s| s.deadline_ms).map(Duration::from_millis).unwrap_or(d.deadline),
            start_deadline: pick(|s| s.start_deadline_ms).map(Duration::from_millis).unwrap_or(d.start_deadline),
            memory_bytes: pick(|s| s.memory_mb).map(|m| m << 20).unwrap_or(d.memory_bytes),
            fuel_per_batch: pick(|s| s.fuel).filter(|f| *f > 0),
            failure_policy: s
                .and_then(|s| s.failure_policy)
                .or(self.nf_defaults.failure_policy)
                .unwrap_or(d.failure_policy),
            max_flow_state_bytes: s.and_then(|s| s.max_flow_state_bytes).unwrap_or(d.max_flow_state_bytes),
            max_flows: s.and_then(|s| s.max_flows).unwrap_or(d.max_flows),
            state_budget_bytes: s
                .and_then(|s| s.state_budget_mb)
                .map(|m| m.saturating_mul(1 << 20))
                .unwrap_or(d.state_budget_bytes),
            log_lines_per_second: s.and_then(|s| s.log_lines_per_second).unwrap_or(d.log_lines_per_second),
        }
    }

    /// Under `serve`, where tenants name their NFs: the caps of each
    /// named section `[nf.<name>]`, for the NFs of that name in any
    /// deployment. A named section can only tighten what `[nf.""]` gives
    /// every NF (a tenant could otherwise name its NF after a generous
    /// section): each resource is the smaller of the two, and the fields
    /// the section leaves out are `[nf.""]`'s. The deployment's own limits
    /// are capped too.
    pub fn serve_caps(&self) -> BTreeMap<String, NfLimits> {
        let base = self.limits("");
        self.nf
            .keys()
            .filter(|name| !name.is_empty())
            .map(|name| (name.clone(), self.section_over_base(name).at_most(&base)))
            .collect()
    }

    /// The limits of section `name`, with `[nf.""]`'s (then the defaults)
    /// for what it leaves out.
    fn section_over_base(&self, name: &str) -> NfLimits {
        let base = self.limits("");
        let Some(s) = self.nf.get(name) else { return base };
        NfLimits {
            deadline: s.deadline_ms.map(Duration::from_millis).unwrap_or(base.deadline),
            start_deadline: s.start_deadline_ms.map(Duration::from_millis).unwrap_or(base.start_deadline),
            memory_bytes: s.memory_mb.map(|m| m << 20).unwrap_or(base.memory_bytes),
            fuel_per_batch: s.fuel.map(|f| (f > 0).then_some(f)).unwrap_or(base.fuel_per_batch),
            failure_policy: s.failure_policy.unwrap_or(base.failure_policy),
            max_flow_state_bytes: s.max_flow_state_bytes.unwrap_or(base.max_flow_state_bytes),
            max_flows: s.max_flows.unwrap_or(base.max_flows),
            state_budget_bytes: s.state_budget_mb.map(|m| m.saturating_mul(1 << 20)).unwrap_or(base.state_budget_bytes),
            log_lines_per_second: s.log_lines_per_second.unwrap_or(base.log_lines_per_second),
        }
    }

    /// The bytes NF `name` receives in `init`.
    pub fn nf_config_bytes(&self, name: &str) -> Result<Vec<u8>, ConfigError> {
        let Some(s) = self.nf.get(name) else { return Ok(Vec::new()) };
        let set = [s.config.is_some(), s.config_file.is_some(), s.config_text.is_some()];
        if set.iter().filter(|b| **b).count() > 1 {
            return Err(ConfigError::Invalid(format!(
                "[nf.{name}]: give only one of config, config_file and config_text"
            )));
        }
        if let Some(t) = &s.config {
            return serde_json::to_vec(t).map_err(|e| ConfigError::Invalid(format!("[nf.{name}]: {e}")));
        }
        if let Some(f) = &s.config_file {
            let p = self.base_dir.join(f);
            return std::fs::read(&p).map_err(|source| ConfigError::Read { path: p, source });
        }
        Ok(s.config_text.clone().unwrap_or_default().into_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nf_table_becomes_json() {
        let c = HostConfig::parse(
            r#"
            batch-size = 64
            [nf.firewall]
            failure-policy = "fail-open"
            deadline-ms = 5
            [nf.firewall.config]
            default = "deny"
            rules = [{ action = "allow", dst-ports = "80" }]
            "#,
        )
        .unwrap();
        assert_eq!(c.batch_size, 64);
        let l = c.limits("firewall");
        assert_eq!(l.failure_policy, FailurePolicy::FailOpen);
        assert_eq!(l.deadline, Duration::from_millis(5));
        let json: serde_json::Value = serde_json::from_slice(&c.nf_config_bytes("firewall").unwrap()).unwrap();
        assert_eq!(json["rules"][0]["dst-ports"], "80");
        assert!(c.nf_config_bytes("other").unwrap().is_empty());
    }

    #[test]
    fn serve_caps_only_tighten() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("h.toml");
        std::fs::write(
            &p,
            "[nf.\"\"]\nmemory-mb = 32\ndeadline-ms = 20\n[nf.big]\nmemory-mb = 512\n[nf.small]\ndeadline-ms = 5\n",
        )
        .unwrap();
        let c = HostConfig::load(Some(&p)).unwrap();
        let caps = c.serve_caps();
        assert_eq!(caps["big"].memory_bytes, 32 << 20, "a named section cannot loosen [nf.\"\"]");
        assert_eq!(caps["big"].deadline, Duration::from_millis(20));
        assert_eq!(caps["small"].deadline, Duration::from_millis(5));
        assert_eq!(caps["small"].memory_bytes, 32 << 20);
        assert!(!caps.contains_key(""));
    }

    #[test]
    fn unknown_keys_are_errors() {
        let e = HostConfig::parse("batchsize = 3").unwrap_err();
        assert!(e.contains("batchsize"), "{e}");
        let e = HostConfig::parse("[nf.fw]\ndeadline = 3").unwrap_err();
        assert!(e.contains("deadline"), "{e}");
    }

    #[test]
    fn snake_case_keys_are_the_api_names() {
        let c = HostConfig::parse(
            "batch_size = 16\nmax_memory_mb = 128\n[nf.fw]\nfailure_policy = \"fail-open\"\ndeadline_ms = 7\nmax_flows = 9\nconfig_text = \"x\"\n",
        )
        .unwrap();
        assert_eq!((c.batch_size, c.max_memory_mb), (16, 128));
        let l = c.limits("fw");
        assert_eq!((l.failure_policy, l.deadline, l.max_flows), (FailurePolicy::FailOpen, Duration::from_millis(7), 9));
        let api = c.nf["fw"].limits_json();
        assert_eq!(
            serde_json::Value::Object(api),
            serde_json::json!({"failure_policy": "fail-open", "deadline_ms": 7, "max_flows": 9})
        );
    }

    #[test]
    fn a_limits_table_holds_limits_only() {
        let t: toml::Table = toml::from_str("deadline-ms = 3\nmemory_mb = 8").unwrap();
        let s = NfSection::limits_from(t).unwrap();
        assert_eq!((s.deadline_ms, s.memory_mb), (Some(3), Some(8)));
        let t: toml::Table = toml::from_str("config_text = \"x\"").unwrap();
        assert!(NfSection::limits_from(t).unwrap_err().contains("not a limit"));
        let t: toml::Table = toml::from_str("deadline_mss = 3").unwrap();
        assert!(NfSection::limits_from(t).unwrap_err().contains("deadline_mss"));
    }
}
