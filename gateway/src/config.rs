//! Gateway configuration: one TOML file plus `SLUICE_*` environment
//! variables (which win), plus command-line flags (which win over both).
//!
//! ```toml
//! listen = "127.0.0.1:8080"          # SLUICE_LISTEN
//! data-dir = "/var/lib/sluice"       # SLUICE_DATA_DIR: gateway.db and blobs/
//! admin-token = "change-me"          # SLUICE_ADMIN_TOKEN (required)
//! max-module-mb = 32                 # SLUICE_MAX_MODULE_MB: upload size limit
//! max-state-budget-mb = 1024         # SLUICE_MAX_STATE_BUDGET_MB: the largest state
//!                                    # budget (`limits.state_budget_mb`) a deployment
//!                                    # may give an NF, MiB
//! cluster = "default"                # SLUICE_CLUSTER
//! nats = "nats://127.0.0.1:4222"     # SLUICE_NATS_URL (several: comma-separated)
//! nats-nkey = "/etc/sluice/gateway.nk"  # SLUICE_NATS_NKEY: the gateway's nkey seed
//! nats-creds = "/etc/sluice/gw.creds"   # SLUICE_NATS_CREDS: or a JWT creds file
//! nats-ca = "/etc/sluice/tls/ca.pem"    # SLUICE_NATS_CA: CA of the servers (requires TLS)
//! nats-cert = "/etc/sluice/tls/gateway.pem"     # SLUICE_NATS_CERT: client certificate
//! nats-key = "/etc/sluice/tls/gateway-key.pem"  # SLUICE_NATS_KEY: its key
//! nats-replicas = 3                  # SLUICE_NATS_REPLICAS: JetStream copies
//!                                    # (default: the cluster's servers, at most 3)
//! nats-auth-file = "/etc/nats/sluice-auth.conf"  # SLUICE_NATS_AUTH_FILE: where the
//!                                    # servers' authorization block is written
//! default-groups = ["default"]       # host groups a new tenant may deploy to
//! host-silence-ms = 3000             # SLUICE_HOST_SILENCE_MS: a host heard from less
//!                                    # recently is gone: out of its group's
//!                                    # ownership table (500-600000)
//! default-capacity-pps = 1000000     # a host's weight in its group's ownership
//!                                    # table when it declares no --capacity-pps
//!
//! [meters]                           # what a meter record may claim (else refused,
//!                                    # counted, listed in GET /v1/rejects)
//! host-max-pps = 300000000           # packets/s a host can process, unless its
//!                                    # registration says (`max_pps`): 2x100 GbE
//! host-max-bps = 400000000000        # bits/s, unless its registration says (`max_bps`)
//! max-window-ms = 600000             # the longest meter window
//! clock-skew-ms = 300000             # how far past the gateway's clock a window may end
//! max-age-ms = 2592000000            # how long ago a window may have started (30 days)
//! metrics-listen = "10.0.0.5:9464"   # SLUICE_METRICS_LISTEN: the operator's listener:
//!                                    # Prometheus /metrics, /healthz, /readyz (none
//!                                    # by default; keep it off the tenants' network)
//!
//! [groups.edge]                      # per host group (the name after `groups.`)
//! ports = [0, 1]                     # ports of its hosts tenants may attach to:
//!                                    # every deployment there needs an attachment
//!                                    # (`attach`) on these ports, and no two
//!                                    # deployments' attachments may overlap. A group
//!                                    # without ports is a development group: no
//!                                    # attachments, each deployment sees every
//!                                    # packet of a host's capture.
//!
//! [quotas]                           # per tenant (see docs/security.md)
//! deployments = 50                   # deployments
//! nfs-per-group = 64                 # NF instances (chain lengths summed) per host group
//! modules = 200                      # module versions stored
//! module-mb = 1024                   # bytes of module versions stored, MiB
//! uploads-in-flight = 2              # uploads being checked at once (more: 429)
//! compiles = 2                       # gateway-wide: modules compiled at once (more wait)
//!
//! [billing]                          # the price plan: exact decimals (0.05 or "0.05"), never negative
//! currency = "USD"                   # ISO 4217; bills round to its minor unit
//! per-million-packets = 0.05
//! per-gb = 0.02
//! per-cpu-second = 0.10
//! per-million-invocations = 0.20
//! per-gb-hour-state = 0.01           # NF state held on hosts (10^9 bytes for an hour)
//! [billing.included]                 # free allowances per tenant and period
//! packets = 1_000_000
//! gb = 1.0
//! cpu-seconds = 10.0
//! invocations = 100_000
//! state-gb-hours = 1.0
//! ```

use crate::money::{Currency, Exact};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use sluice_config::ConfigError;
use sluice_config::env_check;

/// Free allowances per tenant and billing period.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct Included {
    /// Packets.
    pub packets: u64,
    /// Gigabytes (10^9 bytes).
    pub gb: Exact,
    /// Guest CPU seconds.
    pub cpu_seconds: Exact,
    /// NF invocations (batches).
    pub invocations: u64,
    /// GB-hours of NF state (10^9 bytes held for an hour).
    pub state_gb_hours: Exact,
}

impl Default for Included {
    fn default() -> Self {
        Included {
            packets: 1_000_000,
            gb: Exact::new(1, 0),
            cpu_seconds: Exact::new(10, 0),
            invocations: 100_000,
            state_gb_hours: Exact::new(1, 0),
        }
    }
}

/// The price plan. Prices and allowances are exact decimals (a TOML
/// number is read as the decimal it is written as, or write a string:
/// `"0.05"`), never negative; amounts are rounded once, per bill line, to
/// the currency's minor unit (see [`crate::billing`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct PricePlan {
    /// Currency of the bills: an ISO 4217 code with minor units (`USD`,
    /// `EUR`, `JPY`, `BHD`, ...), which decide the bills' rounding.
    pub currency: Currency,
    /// Price per million packets.
    pub per_million_packets: Exact,
    /// Price per GB (10^9 bytes) processed.
    pub per_gb: Exact,
    /// Price per second of guest CPU time.
    pub per_cpu_second: Exact,
    /// Price per million invocations.
    pub per_million_invocations: Exact,
    /// Price per GB-hour of NF state (tables and flow state held on hosts).
    pub per_gb_hour_state: Exact,
    /// Price per million packets an NF offloaded to the host (flow
    /// offload, `sluice:nf@0.5.0`: decided by the host without a call);
    /// unset, the packet price. They are not covered by the packet
    /// allowance.
    pub per_million_offloaded_packets: Option<Exact>,
    /// Allowances.
    pub included: Included,
}

impl Default for PricePlan {
    fn default() -> Self {
        PricePlan {
            currency: Currency::default(),
            per_million_packets: Exact::new(5, 2),
            per_gb: Exact::new(2, 2),
            per_cpu_second: Exact::new(10, 2),
            per_million_invocations: Exact::new(20, 2),
            per_gb_hour_state: Exact::new(1, 2),
            per_million_offloaded_packets: None,
            included: Included::default(),
        }
    }
}

/// The gateway's settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct GatewayConfig {
    /// HTTP listen address.
    #[serde(default = "default_listen")]
    pub listen: String,
    /// Database and module blobs.
    #[serde(default = "default_data_dir")]
    pub data_dir: PathBuf,
    /// Token of the operator (creates tenants and keys).
    #[serde(default)]
    pub admin_token: Option<String>,
    /// Largest module accepted, MiB.
    #[serde(default = "default_max_module_mb")]
    pub max_module_mb: u64,
    /// Largest state budget a deployment may give an NF, MiB
    /// (`limits.state_budget_mb`).
    #[serde(default = "default_max_state_budget_mb")]
    pub max_state_budget_mb: u64,
    /// Cluster name.
    #[serde(default = "default_cluster")]
    pub cluster: String,
    /// NATS URL(s), comma-separated.
    #[serde(default = "default_nats")]
    pub nats: String,
    /// The gateway's nkey seed file.
    #[serde(default)]
    pub nats_nkey: Option<PathBuf>,
    /// A NATS credentials (JWT) file, instead of `nats-nkey`.
    #[serde(default)]
    pub nats_creds: Option<PathBuf>,
    /// CA certificate the NATS servers' certificates chain to.
    #[serde(default)]
    pub nats_ca: Option<PathBuf>,
    /// Client certificate for mutual TLS.
    #[serde(default)]
    pub nats_cert: Option<PathBuf>,
    /// Its private key.
    #[serde(default)]
    pub nats_key: Option<PathBuf>,
    /// JetStream replicas of the meter stream and the buckets (none: as
    /// many as the NATS cluster has servers, at most 3).
    #[serde(default)]
    pub nats_replicas: Option<usize>,
    /// Where to write the NATS servers' `authorization` block (gateway and
    /// registered hosts, with their permissions) whenever a host is
    /// registered or removed.
    #[serde(default)]
    pub nats_auth_file: Option<PathBuf>,
    /// Host groups a new tenant may deploy to, unless the operator names
    /// others when creating it.
    #[serde(default)]
    pub default_groups: Vec<String>,
    /// Price plan.
    #[serde(default)]
    pub billing: PricePlan,
    /// What one tenant may hold and do at once.
    #[serde(default)]
    pub quotas: Quotas,
    /// Per host group settings, by group name.
    #[serde(default)]
    pub groups: BTreeMap<String, GroupConfig>,
    /// A host not heard from for this long is gone (out of its group's
    /// ownership table), ms.
    #[serde(default = "default_host_silence_ms")]
    pub host_silence_ms: u64,
    /// A host's weight in its group's ownership table when it declares no
    /// capacity, packets per second.
    #[serde(default = "default_capacity_pps")]
    pub default_capacity_pps: u64,
    /// What a meter record may claim.
    #[serde(default)]
    pub meters: MeterBounds,
    /// Where to serve Prometheus `/metrics`, `/healthz` and `/readyz` for
    /// the operator (none: nowhere; the metrics name every tenant).
    #[serde(default)]
    pub metrics_listen: Option<String>,
}

fn default_host_silence_ms() -> u64 {
    3000
}

/// What a meter record may claim before the gateway bills it: a window
/// of a bounded length, near the gateway's clock, and no more packets or
/// bytes than its host can process in it (see `crate::intake`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct MeterBounds {
    /// Packets per second a host can process, unless its registration
    /// says (`max_pps`). Default 300,000,000: two 100 GbE ports of
    /// minimum-size frames.
    #[serde(default = "default_host_max_pps")]
    pub host_max_pps: u64,
    /// Bits per second a host can process, unless its registration says
    /// (`max_bps`). Default 400 Gbit/s.
    #[serde(default = "default_host_max_bps")]
    pub host_max_bps: u64,
    /// The longest meter window, ms (hosts close one every `--window-ms`).
    #[serde(default = "default_max_window_ms")]
    pub max_window_ms: u64,
    /// How far past the gateway's clock a window may end, ms.
    #[serde(default = "default_clock_skew_ms")]
    pub clock_skew_ms: u64,
    /// How long ago a window may have started, ms (a host's outbox keeps
    /// records while NATS is away).
    #[serde(default = "default_max_age_ms")]
    pub max_age_ms: u64,
}

impl Default for MeterBounds {
    fn default() -> Self {
        MeterBounds {
            host_max_pps: default_host_max_pps(),
            host_max_bps: default_host_max_bps(),
            max_window_ms: default_max_window_ms(),
            clock_skew_ms: default_clock_skew_ms(),
            max_age_ms: default_max_age_ms(),
        }
    }
}

fn default_host_max_pps() -> u64 {
    300_000_000
}
fn default_host_max_bps() -> u64 {
    400_000_000_000
}
fn default_max_window_ms() -> u64 {
    600_000
}
fn default_clock_skew_ms() -> u64 {
    300_000
}
fn default_max_age_ms() -> u64 {
    30 * 24 * 3_600_000
}

fn default_capacity_pps() -> u64 {
    1_000_000
}

/// Bounds of `host-silence-ms`.
pub const HOST_SILENCE_MS: std::ops::RangeInclusive<u64> = 500..=600_000;

/// The operator's settings of one host group.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct GroupConfig {
    /// Ports of the group's hosts (DPDK port ids) that tenants' deployments
    /// may attach to, as ingress (`port`) and egress (`out`). Non-empty:
    /// the hosts' ports are shared between tenants, so every deployment of
    /// the group must say which of their traffic is its own, and no two
    /// deployments may claim the same packets. Empty: a development group,
    /// where a deployment takes no attachment and sees every packet of a
    /// host's capture.
    #[serde(default)]
    pub ports: Vec<u16>,
}

/// The most ports one group may expose (DPDK's own default for the ports
/// of one process, `RTE_MAX_ETHPORTS`, is 32).
pub const MAX_GROUP_PORTS: usize = 64;

/// Per-tenant quotas (and the gateway's compile concurrency). A count or
/// size quota is answered `409 quota_exceeded`, a concurrency quota `429`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct Quotas {
    /// Deployments per tenant.
    pub deployments: u32,
    /// NF instances per tenant and host group: every NF of every
    /// deployment runs on each host of its group, so this bounds what one
    /// tenant takes of a host's instance pool.
    pub nfs_per_group: u32,
    /// Module versions per tenant.
    pub modules: u32,
    /// Bytes of module versions per tenant, MiB.
    pub module_mb: u64,
    /// Uploads of one tenant being checked at once.
    pub uploads_in_flight: u32,
    /// Modules compiled at once by the gateway, all tenants together
    /// (uploads and deployments' trial starts wait for a turn).
    pub compiles: u32,
}

impl Default for Quotas {
    fn default() -> Self {
        Quotas { deployments: 50, nfs_per_group: 64, modules: 200, module_mb: 1024, uploads_in_flight: 2, compiles: 2 }
    }
}

fn default_listen() -> String {
    "127.0.0.1:8080".into()
}
fn default_data_dir() -> PathBuf {
    PathBuf::from("sluice-data")
}
fn default_max_state_budget_mb() -> u64 {
    1024
}
fn default_max_module_mb() -> u64 {
    32
}
fn default_cluster() -> String {
    "default".into()
}
fn default_nats() -> String {
    "nats://127.0.0.1:4222".into()
}

impl Default for GatewayConfig {
    fn default() -> Self {
        GatewayConfig {
            listen: default_listen(),
            data_dir: default_data_dir(),
            admin_token: None,
            max_module_mb: default_max_module_mb(),
            max_state_budget_mb: default_max_state_budget_mb(),
            cluster: default_cluster(),
            nats: default_nats(),
            nats_nkey: None,
            nats_creds: None,
            nats_ca: None,
            nats_cert: None,
            nats_key: None,
            nats_replicas: None,
            nats_auth_file: None,
            default_groups: Vec::new(),
            billing: PricePlan::default(),
            quotas: Quotas::default(),
            groups: BTreeMap::new(),
            host_silence_ms: default_host_silence_ms(),
            default_capacity_pps: default_capacity_pps(),
            meters: MeterBounds::default(),
            metrics_listen: None,
        }
    }
}

impl GatewayConfig {
    /// Reads the file (if any), then applies `SLUICE_*` variables.
    pub fn load(path: Option<&Path>) -> Result<Self, ConfigError> {
        let mut cfg = match path {
            Some(p) => sluice_config::parse_file(p, |t| toml::from_str(t))?,
            None => GatewayConfig::default(),
        };
        let var = sluice_config::env_var;
        if let Some(v) = var("SLUICE_LISTEN") {
            cfg.listen = v;
        }
        if let Some(v) = var("SLUICE_DATA_DIR") {
            cfg.data_dir = v.into();
        }
        if let Some(v) = var("SLUICE_ADMIN_TOKEN") {
            cfg.admin_token = Some(v);
        }
        let mib = |v: &str| v.parse::<u64>().map_err(|_| "not a whole number of MiB".to_string());
        if let Some(n) = env_check("SLUICE_MAX_MODULE_MB", mib)? {
            cfg.max_module_mb = n;
        }
        if let Some(n) = env_check("SLUICE_MAX_STATE_BUDGET_MB", mib)? {
            cfg.max_state_budget_mb = n;
        }
        if let Some(v) = var("SLUICE_CLUSTER") {
            cfg.cluster = v;
        }
        if let Some(v) = var("SLUICE_NATS_URL") {
            cfg.nats = v;
        }
        if let Some(v) = var("SLUICE_METRICS_LISTEN") {
            cfg.metrics_listen = Some(v);
        }
        for (name, slot) in [
            ("SLUICE_NATS_NKEY", &mut cfg.nats_nkey),
            ("SLUICE_NATS_CREDS", &mut cfg.nats_creds),
            ("SLUICE_NATS_CA", &mut cfg.nats_ca),
            ("SLUICE_NATS_CERT", &mut cfg.nats_cert),
            ("SLUICE_NATS_KEY", &mut cfg.nats_key),
            ("SLUICE_NATS_AUTH_FILE", &mut cfg.nats_auth_file),
        ] {
            if let Some(v) = var(name) {
                *slot = Some(v.into());
            }
        }
        if let Some(n) = env_check("SLUICE_HOST_SILENCE_MS", |v| {
            v.parse().ok().filter(|n| HOST_SILENCE_MS.contains(n)).ok_or_else(|| {
                format!("not a number of ms from {} to {}", HOST_SILENCE_MS.start(), HOST_SILENCE_MS.end())
            })
        })? {
            cfg.host_silence_ms = n;
        }
        if let Some(n) = env_check("SLUICE_NATS_REPLICAS", |v| {
            v.parse().ok().filter(|n| (1..=5).contains(n)).ok_or_else(|| "not a replica count from 1 to 5".to_string())
        })? {
            cfg.nats_replicas = Some(n);
        }
        Ok(cfg)
    }

    /// Checks settings that have no usable default.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match &self.admin_token {
            None => Err(ConfigError::Invalid(
                "no admin token: set SLUICE_ADMIN_TOKEN or admin-token in the config file (tenants are created with it)".into(),
            )),
            Some(t) if t.len() < 8 => Err(ConfigError::Invalid("the admin token must be at least 8 characters".into())),
            Some(_) if self.max_module_mb == 0 => Err(ConfigError::Invalid("max-module-mb must be at least 1".into())),
            Some(_) if self.max_state_budget_mb == 0 => {
                Err(ConfigError::Invalid("max-state-budget-mb must be at least 1".into()))
            }
            Some(_) if self.quotas.compiles == 0 || self.quotas.uploads_in_flight == 0 => {
                Err(ConfigError::Invalid("quotas.compiles and quotas.uploads-in-flight must be at least 1".into()))
            }
            Some(_) if self.nats_replicas.is_some_and(|n| !(1..=5).contains(&n)) => {
                Err(ConfigError::Invalid("nats-replicas must be 1 to 5".into()))
            }
            Some(_) if !HOST_SILENCE_MS.contains(&self.host_silence_ms) => Err(ConfigError::Invalid(format!(
                "host-silence-ms must be {} to {}",
                HOST_SILENCE_MS.start(),
                HOST_SILENCE_MS.end()
            ))),
            Some(_) if self.default_capacity_pps == 0 => {
                Err(ConfigError::Invalid("default-capacity-pps must be at least 1".into()))
            }
            Some(_) if self.meters.host_max_pps == 0 || self.meters.host_max_bps == 0 => {
                Err(ConfigError::Invalid("[meters] host-max-pps and host-max-bps must be at least 1".into()))
            }
            Some(_) if self.meters.max_window_ms < 1000 => {
                Err(ConfigError::Invalid("[meters] max-window-ms must be at least 1000".into()))
            }
            Some(_) => {
                for g in &self.default_groups {
                    sluice_control::subjects::check_token("group", g)
                        .map_err(|e| ConfigError::Invalid(format!("default-groups: {e}")))?;
                }
                for (g, settings) in &self.groups {
                    sluice_control::subjects::check_token("group", g)
                        .map_err(|e| ConfigError::Invalid(format!("[groups.{g}]: {e}")))?;
                    if settings.ports.len() > MAX_GROUP_PORTS {
                        return Err(ConfigError::Invalid(format!(
                            "[groups.{g}]: ports lists {} ports; at most {MAX_GROUP_PORTS}",
                            settings.ports.len()
                        )));
                    }
                    let mut seen = std::collections::BTreeSet::new();
                    if let Some(p) = settings.ports.iter().find(|p| !seen.insert(**p)) {
                        return Err(ConfigError::Invalid(format!("[groups.{g}]: ports lists port {p} twice")));
                    }
                }
                Ok(())
            }
        }
    }

    /// How the gateway authenticates to NATS.
    pub fn nats_auth(&self) -> sluice_control::NatsAuth {
        sluice_control::NatsAuth {
            nkey_file: self.nats_nkey.clone(),
            creds_file: self.nats_creds.clone(),
            ca_file: self.nats_ca.clone(),
            cert_file: self.nats_cert.clone(),
            key_file: self.nats_key.clone(),
        }
    }

    /// The ports host group `group` exposes to tenants, in ascending
    /// order; empty for a development group (and for a group the
    /// configuration does not name).
    pub fn exposed_ports(&self, group: &str) -> Vec<u16> {
        let mut ports = self.groups.get(group).map(|g| g.ports.clone()).unwrap_or_default();
        ports.sort_unstable();
        ports
    }

    /// The upload limit in bytes.
    pub fn max_module_bytes(&self) -> usize {
        usize::try_from(self.max_module_mb.saturating_mul(1 << 20)).unwrap_or(usize::MAX)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn plan_from_toml() {
        let c: GatewayConfig =
            toml::from_str("admin-token = 'secret-token'\n[billing]\nper-gb = 0.5\n[billing.included]\npackets = 10\n")
                .unwrap();
        assert_eq!(c.billing.per_gb, Exact::new(5, 1));
        assert_eq!(c.billing.included.packets, 10);
        assert_eq!(c.billing.included.gb, Exact::new(1, 0));
        assert_eq!(c.billing.per_million_packets, Exact::new(5, 2));
        assert_eq!(
            (c.billing.per_gb_hour_state, c.billing.included.state_gb_hours),
            (Exact::new(1, 2), Exact::new(1, 0))
        );
        assert_eq!(c.max_state_budget_mb, 1024);
        c.validate().unwrap();
        let c: GatewayConfig = toml::from_str(
            "admin-token = 'secret-token'\nmax-state-budget-mb = 256\n[billing]\nper-gb-hour-state = 0.2\n[billing.included]\nstate-gb-hours = 0.5\n",
        )
        .unwrap();
        assert_eq!(
            (c.billing.per_gb_hour_state, c.billing.included.state_gb_hours),
            (Exact::new(2, 1), Exact::new(5, 1))
        );
        assert_eq!(c.max_state_budget_mb, 256);
        let c: GatewayConfig = toml::from_str("admin-token = 'secret-token'\nmax-state-budget-mb = 0\n").unwrap();
        assert!(c.validate().unwrap_err().to_string().contains("max-state-budget-mb must be at least 1"));
        assert!(toml::from_str::<GatewayConfig>("listn = 'x'").is_err());
        assert!(GatewayConfig::default().validate().is_err());
    }

    #[test]
    fn groups_expose_ports() {
        let text = "admin-token = 'secret-token'\n[groups.edge]\nports = [1, 0]\n[groups.lab]\n";
        let c: GatewayConfig = toml::from_str(text).unwrap();
        c.validate().unwrap();
        assert_eq!(c.exposed_ports("edge"), [0, 1]);
        assert!(c.exposed_ports("lab").is_empty());
        assert!(c.exposed_ports("default").is_empty());
        // Unknown keys, bad names, repeated and out-of-range ports are refused.
        assert!(toml::from_str::<GatewayConfig>("[groups.edge]\nport = [0]\n").is_err());
        assert!(toml::from_str::<GatewayConfig>("[groups.edge]\nports = [70000]\n").is_err());
        let bad = |text: &str| {
            let c: GatewayConfig = toml::from_str(&format!("admin-token = 'secret-token'\n{text}")).unwrap();
            c.validate().unwrap_err().to_string()
        };
        assert!(bad("[groups.'a.b']\nports = [0]\n").contains("[groups.a.b]"));
        assert!(bad("[groups.edge]\nports = [0, 1, 0]\n").contains("port 0 twice"));
    }

    #[test]
    fn shipped_examples_parse() {
        for text in
            [include_str!("../../deploy/systemd/gateway.toml"), include_str!("../../deploy/local/gateway-demo.toml")]
        {
            let c: GatewayConfig = toml::from_str(text).unwrap();
            assert!(c.billing.per_million_packets > Exact::default());
        }
    }
}
