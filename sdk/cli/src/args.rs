//! The command line: clap's definitions of every command, subcommand and
//! flag, and which gateway flags each command shows in its help.

use clap::{Parser, Subcommand};
use serde_json::Value;
use sluice_cli::Lang;
use std::path::PathBuf;

/// Sluice CLI: write network functions in Rust, C, Python, JavaScript or
/// Go, build them into sandboxed sluice:nf components, upload and deploy
/// them through a gateway, and read usage and bills. `sluice dev` runs a
/// whole cluster in one process.
#[derive(Parser)]
#[command(version, propagate_version = true)]
pub struct Cli {
    /// The Sluice SDK (wit/ and sdk/): an installed one or a checkout
    /// (default: share/sluice next to this binary's bin/, or the checkout
    /// whose target/ holds it). Projects reference a copy of it installed
    /// under the user's data directory.
    #[arg(long, global = true, env = "SLUICE_SDK_ROOT")]
    pub sdk_root: Option<PathBuf>,
    /// Gateway URL.
    #[arg(long, global = true, env = "SLUICE_URL", default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// Tenant API key (tenant commands).
    #[arg(long, global = true, env = "SLUICE_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Admin token (`tenant`, `host` and `groups` commands; default for a
    /// gateway on this machine: the token `sluice dev` keeps in its default
    /// data directory).
    #[arg(long, global = true, env = "SLUICE_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// How commands print what they read or did: a table for people, or
    /// JSON (the API's objects; logs one object per line) for scripts.
    #[arg(long, short = 'o', global = true, value_enum, default_value = "table")]
    pub output: Output,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Network function projects, and modules on the gateway.
    #[command(subcommand)]
    Nf(NfCommand),
    /// The SDK projects build against: where it is, and its installed copy.
    #[command(subcommand)]
    Sdk(SdkCommand),
    /// Print a shell completion script: `sluice completions bash >
    /// ~/.local/share/bash-completion/completions/sluice` (zsh, fish,
    /// elvish and powershell too).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Run a gateway and one pcap-fed host in this process (in-process
    /// bus, SQLite under --data). Drop captures into the spool directory to
    /// send them through every deployment. Stops on Ctrl-C or SIGTERM.
    Dev(DevArgs),
    /// Tenants (needs the admin token).
    #[command(subcommand)]
    Tenant(TenantCommand),
    /// Hosts of the cluster: only registered hosts are heard (needs the
    /// admin token).
    #[command(subcommand)]
    Host(HostCommand),
    /// Host groups: members, capacity, load, demand and the version of
    /// each group's flow-ownership table; scaling settings, added
    /// capacity, drains (needs the admin token). Without a subcommand:
    /// list them.
    Groups {
        #[command(subcommand)]
        command: Option<GroupsCommand>,
    },
    /// Print a link that opens the gateway's dashboard signed in as you:
    /// it works once, within a minute, and holds no API key (a one-time
    /// ticket in the URL's fragment, which browsers do not send to
    /// servers). The session it opens reads only, for an hour.
    Dashboard,
    /// Your own API keys: list, add, rotate, revoke.
    #[command(subcommand)]
    Key(KeyCommand),
    /// Deploy a module (or a linear chain of modules, or a chain spec) onto
    /// a host group; updates the deployment if the name exists (NFs whose
    /// module or config changed are hot-swapped on the hosts).
    Deploy(DeployArgs),
    /// List deployments and their status per host.
    Deployments,
    /// Delete a deployment.
    Undeploy {
        /// Deployment name or id.
        name: String,
    },
    /// The newest events your NFs emitted (alerts, denies, ...).
    Events {
        /// Only this deployment.
        #[arg(long)]
        deployment: Option<String>,
        /// Only this kind (e.g. firewall.deny).
        #[arg(long)]
        kind: Option<String>,
        /// Only events received since then: RFC 3339 or ms since the epoch.
        #[arg(long)]
        since: Option<String>,
        /// How many.
        #[arg(long, default_value_t = 20)]
        limit: u64,
    },
    /// Your NFs' logs: what they wrote to stdout, stderr or `host-log`,
    /// and their traps with the cause, from every host.
    Logs {
        /// Only this deployment (name or id).
        #[arg(long)]
        deployment: Option<String>,
        /// Only this NF (its name in the chain).
        #[arg(long)]
        nf: Option<String>,
        /// The least level shown: debug, info, warn or error.
        #[arg(long, default_value = "debug")]
        level: String,
        /// Only lines since then: RFC 3339 or ms since the epoch.
        #[arg(long)]
        since: Option<String>,
        /// How many of the newest lines first.
        #[arg(long, default_value_t = 100)]
        limit: u64,
        /// Keep printing new lines as they come (Ctrl-C stops).
        #[arg(short, long)]
        follow: bool,
    },
    /// Usage by deployment, NF and version.
    Usage {
        /// Start: RFC 3339 or ms since the epoch (default: everything).
        #[arg(long)]
        from: Option<String>,
        /// End (exclusive).
        #[arg(long)]
        to: Option<String>,
        /// Print the JSON answer (as `--output json`).
        #[arg(long)]
        json: bool,
    },
    /// The bill of a month, priced by the gateway's plan.
    Bill {
        /// Month, YYYY-MM (UTC).
        #[arg(long)]
        period: String,
        /// Print CSV.
        #[arg(long, conflicts_with = "json")]
        csv: bool,
        /// Print the JSON answer (as `--output json`).
        #[arg(long)]
        json: bool,
    },
}

/// `sluice dev`: where the gateway listens, keeps its data and reads
/// captures; its meter window, config and metrics; a project to watch.
#[derive(clap::Args)]
pub struct DevArgs {
    /// HTTP listen address.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: String,
    /// Data directory: the database, module blobs, the admin token
    /// (default: dev/ under the user's data directory, e.g.
    /// ~/.local/share/sluice/dev, so nothing lands in the directory it
    /// is started from).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Spool directory (default: <data>/spool).
    #[arg(long)]
    pub spool: Option<PathBuf>,
    /// Meter window, ms.
    #[arg(long, default_value_t = 1000)]
    pub window_ms: u64,
    /// Gateway config file (price plan, upload limit).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Serve the gateway's and the host's metrics (Prometheus text at
    /// /metrics, what a Prometheus of a real cluster scrapes), /healthz
    /// and /readyz at this address, e.g. 127.0.0.1:9464.
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<String>,
    /// Also watch this NF project, as `sluice nf watch` does, as the
    /// tenant `dev` (created if missing; its new API key is printed):
    /// rebuild, upload and hot-swap on every save.
    #[arg(long, value_name = "PROJECT")]
    pub watch: Option<PathBuf>,
}

/// `sluice deploy`: the deployment's name, its modules (or a spec), group,
/// traffic, fragment handling, limits, and how long to wait for it.
#[derive(clap::Args)]
pub struct DeployArgs {
    /// Deployment name.
    pub name: String,
    /// Module id or name@version; repeat for a linear chain.
    #[arg(long = "module", short = 'm')]
    pub modules: Vec<String>,
    /// NF configuration file, one per --module in order.
    #[arg(long = "config-file")]
    pub config_files: Vec<PathBuf>,
    /// A full deployment request as JSON (see /docs) instead of --module.
    #[arg(long, conflicts_with = "modules")]
    pub spec: Option<PathBuf>,
    /// Host group.
    #[arg(long, default_value = "default")]
    pub group: String,
    /// Traffic of the group's hosts that is this deployment's; repeat
    /// for several. Required in a group whose operator exposes ports
    /// (on those ports, overlapping no other deployment's), refused in
    /// a development group. An update without it keeps the old ones
    /// (`"attach": []` in a --spec removes them).
    #[arg(long = "attach", value_name = "port=N[,vlan=V][,dst=PREFIX][,out=N]")]
    pub attach: Vec<String>,
    /// What the NFs see of fragmented IP: `follow` (the first
    /// fragment; the later ones follow its verdict) or `reassemble`
    /// (whole datagrams, cut again on the way out). An update without
    /// it keeps the deployment's choice.
    #[arg(long)]
    pub fragments: Option<sluice_runtime::fragments::FragmentMode>,
    /// What a host's death may lose of the flows' state in a group:
    /// `periodic` (the last replication interval's changes; no packet
    /// waits) or `replicated` (nothing a packet out of the host depended
    /// on: a packet that changed its flow's state leaves once the flow's
    /// next owner holds it). An update without it keeps the deployment's
    /// choice.
    #[arg(long)]
    pub durability: Option<sluice_control::Durability>,
    /// Wait up to this many seconds for every host to run it.
    #[arg(long, default_value_t = 30)]
    pub wait: u64,
    /// Limits for every NF of the deployment (with --module; a --spec
    /// gives them per NF). Unset ones take the hosts' defaults.
    #[command(
        flatten,
        next_help_heading = "Limits (each applies to every NF of the deployment; unset: the hosts' defaults, also on an update)"
    )]
    pub limits: LimitFlags,
}

#[derive(Subcommand)]
pub enum TenantCommand {
    /// Create a tenant and print its first API key.
    Create {
        /// Tenant name.
        name: String,
        /// Host groups it may deploy to, comma-separated (default: the
        /// gateway's default-groups).
        #[arg(long, value_delimiter = ',')]
        groups: Option<Vec<String>>,
        /// Print only the key (for scripts).
        #[arg(long)]
        key_only: bool,
    },
    /// List tenants.
    List,
    /// Add an API key to a tenant.
    Key {
        /// Tenant id.
        tenant: String,
    },
    /// List a tenant's API keys.
    Keys {
        /// Tenant id.
        tenant: String,
    },
    /// Revoke one of a tenant's API keys.
    Revoke {
        /// Tenant id.
        tenant: String,
        /// Key prefix (from `sluice tenant keys`).
        prefix: String,
    },
    /// Set the host groups a tenant may deploy to.
    Grant {
        /// Tenant id.
        tenant: String,
        /// Groups, comma-separated (empty: none).
        #[arg(long, value_delimiter = ',', num_args = 0..)]
        groups: Vec<String>,
    },
}

#[derive(Subcommand)]
pub enum HostCommand {
    /// Register a host (its heartbeats, meters and events are then
    /// accepted for deployments of its group).
    Add {
        /// Host id (its --host-id).
        id: String,
        /// The group it serves.
        #[arg(long)]
        group: String,
        /// Its NATS nkey public key (`sluice-host keygen` prints it).
        #[arg(long)]
        nkey: Option<String>,
        /// Register a dispatcher (`sluice-host steer`) instead: it may only
        /// read the group's flow-ownership table.
        #[arg(long)]
        dispatcher: bool,
        /// Packets per second it can process at most (its ports' line
        /// rate): meter records claiming more are refused. Default: the
        /// gateway's `[meters] host-max-pps`.
        #[arg(long)]
        max_pps: Option<u64>,
        /// Bits per second it can process at most. Default: `[meters]
        /// host-max-bps`.
        #[arg(long)]
        max_bps: Option<u64>,
    },
    /// List registered hosts and whether they are alive.
    List,
    /// Remove a host from the registry.
    Remove {
        /// Host id.
        id: String,
    },
}

/// How a command prints what it read.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// For people.
    Table,
    /// For scripts: the API's JSON.
    Json,
}

#[derive(Subcommand)]
pub enum GroupsCommand {
    /// Every group, with its members.
    List,
    /// One group, with its members.
    Show {
        /// Group name.
        group: String,
    },
    /// Set scaling settings; options left out keep their value.
    Set {
        /// Group name.
        group: String,
        /// Fewest active hosts.
        #[arg(long)]
        min_hosts: Option<u32>,
        /// Most active hosts.
        #[arg(long, conflicts_with = "no_max")]
        max_hosts: Option<u32>,
        /// No upper limit of active hosts.
        #[arg(long)]
        no_max: bool,
        /// Share of declared capacity to run active hosts at (0.05-1):
        /// turns autoscaling on.
        #[arg(long, conflicts_with = "no_target")]
        target_load: Option<f64>,
        /// Autoscaling off: every live, undrained host is active.
        #[arg(long)]
        no_target: bool,
    },
    /// Make standby hosts active: raises min-hosts to the active hosts
    /// plus --hosts.
    AddCapacity {
        /// Group name.
        group: String,
        /// Hosts to add.
        #[arg(long, default_value_t = 1)]
        hosts: u32,
    },
    /// Drain a host: its flows go to their next owners and it owns none
    /// (--undo: it may own flows again).
    Drain {
        /// Group name.
        group: String,
        /// Host id.
        host: String,
        /// Undrain instead.
        #[arg(long)]
        undo: bool,
    },
}

#[derive(Subcommand)]
pub enum KeyCommand {
    /// List your API keys.
    List,
    /// Add a key (printed once).
    Add,
    /// Replace the key in use by a new one (printed once); the old one is
    /// refused from then on.
    Rotate,
    /// Revoke a key by its prefix.
    Revoke {
        /// Key prefix (from `sluice key list`).
        prefix: String,
    },
}

#[derive(Subcommand)]
pub enum SdkCommand {
    /// Print where the SDK is found and where projects' copy of it is.
    Path,
    /// Install a standalone copy of the SDK (every language) where
    /// projects reference it (the user's data directory), or under --to.
    Install {
        /// Write it here instead (an empty or missing directory).
        #[arg(long)]
        to: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
pub enum NfCommand {
    /// Create a buildable NF project in ./<name>/ from a template.
    New {
        /// Project and NF name (a-z, 0-9, '-').
        name: String,
        /// Language: rust, c, python, js or go.
        #[arg(long, short)]
        lang: Lang,
        /// counter (forward and count) or firewall (stateful, inside-out).
        #[arg(long, short, default_value = "counter")]
        template: String,
        /// Create the project under this directory instead of ./.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
    },
    /// Build the project into build/<name>.wasm and check it against the
    /// sluice:nf world (the same check the gateway's upload runs).
    Build {
        /// The project directory.
        #[arg(default_value = ".")]
        project: PathBuf,
        /// Cargo target directory for Rust projects.
        #[arg(long)]
        cargo_target_dir: Option<PathBuf>,
    },
    /// Build the project, then run its test cases: each folder
    /// tests/<case>/ with input.txt (one packet per line) or input.pcap,
    /// config.txt, and the expected-verdicts.txt, expected.pcap and
    /// expected.json it holds; what differs is shown as a diff.
    Test {
        /// The project directory.
        #[arg(default_value = ".")]
        project: PathBuf,
        /// Only this case.
        #[arg(long)]
        case: Option<String>,
        /// Write the expected files from this run instead of comparing
        /// (review them before you commit them).
        #[arg(long)]
        bless: bool,
        #[command(flatten)]
        shape: RunShape,
        /// Cargo target directory for Rust projects.
        #[arg(long)]
        cargo_target_dir: Option<PathBuf>,
    },
    /// Build the project and run it on a capture here, with the
    /// configuration and limits of its sluice.toml; print the report.
    Run {
        /// The project directory.
        #[arg(default_value = ".")]
        project: PathBuf,
        /// The input: a capture (.pcap) or a traffic file (.txt, one packet
        /// per line, as tests/<case>/input.txt).
        #[arg(long = "in", value_name = "FILE")]
        input: PathBuf,
        /// Write the forwarded packets to this capture.
        #[arg(long)]
        out: Option<PathBuf>,
        /// The NF's configuration from this file instead of sluice.toml's.
        #[arg(long)]
        config_file: Option<PathBuf>,
        #[command(flatten)]
        shape: RunShape,
        /// Cargo target directory for Rust projects.
        #[arg(long)]
        cargo_target_dir: Option<PathBuf>,
    },
    /// Build the project, upload it as <name>@<version> from sluice.toml
    /// (unless that version is there with the same bytes), and create or
    /// update its deployment with the manifest's config, limits, group and
    /// attachments; wait until every host runs it.
    Deploy {
        /// The project directory.
        #[arg(default_value = ".")]
        project: PathBuf,
        /// Wait up to this many seconds for every host to run it (0: not
        /// at all); past it the command fails.
        #[arg(long, default_value_t = 30)]
        wait: u64,
        /// Cargo target directory for Rust projects.
        #[arg(long)]
        cargo_target_dir: Option<PathBuf>,
    },
    /// Watch the project: on every save build it, upload it under a new
    /// dev version (0.0.0-dev.<start>.<n>) and hot-swap the deployment to
    /// it; print the NF's log lines, traps and build errors as they come.
    /// Against any gateway, `sluice dev` included. Ctrl-C stops.
    Watch {
        /// The project directory.
        #[arg(default_value = ".")]
        project: PathBuf,
        #[command(flatten)]
        args: WatchArgs,
    },
    /// Check a component file against the sluice:nf world.
    Check {
        /// The component (.wasm).
        component: PathBuf,
    },
    /// Upload a component to the gateway.
    Upload {
        /// The component (.wasm).
        file: PathBuf,
        /// Module name (default: the file stem).
        #[arg(long)]
        name: Option<String>,
        /// Module version (immutable once uploaded).
        #[arg(long)]
        version: String,
    },
    /// List uploaded modules.
    List,
    /// Delete an uploaded module (refused while deployed).
    Delete {
        /// Module id or name@version.
        module: String,
    },
}

/// How `nf run` and `nf test` run the NF here: the manifest's `[run]`
/// unless given.
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct RunShape {
    /// Worker threads; packets are spread over them as `--spread` says,
    /// as on a host (default: sluice.toml's [run] workers, else 1).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=i64::from(sluice_cli::project::MAX_WORKERS)))]
    pub workers: Option<u32>,
    /// Packets per batch, the most one `process` call gets (default:
    /// sluice.toml's [run] batch, else 32).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=sluice_cli::project::MAX_BATCH as i64))]
    pub batch: Option<u32>,
    /// How packets spread over the workers: `flow` (by connection) or
    /// `addresses` (every connection between two hosts on one worker, so
    /// state keyed by an address is written and read there) (default:
    /// sluice.toml's [run] spread, else flow).
    #[arg(long)]
    pub spread: Option<sluice_traffic::Spread>,
}

/// What `sluice nf watch` deploys to, and how often it looks.
#[derive(Debug, clap::Args)]
pub struct WatchArgs {
    /// The deployment (default: sluice.toml's [deployment] name, else the
    /// NF's); created if missing.
    #[arg(long)]
    pub deployment: Option<String>,
    /// Its host group (default: sluice.toml's, else `default`).
    #[arg(long)]
    pub group: Option<String>,
    /// The NF's configuration from this file instead of sluice.toml's.
    #[arg(long)]
    pub config_file: Option<PathBuf>,
    /// How often to look for changes and log lines, ms.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(50..=60_000))]
    pub interval_ms: u64,
    /// Cargo target directory for Rust projects.
    #[arg(long)]
    pub cargo_target_dir: Option<PathBuf>,
}

/// Per-NF limits of `sluice deploy`, applied to every NF of the deployment
/// (a --spec gives them per NF instead). Unset ones take the hosts'
/// defaults; an update without them puts the defaults back. Values out of
/// range are refused here, before anything is sent.
#[derive(Debug, clap::Args)]
pub struct LimitFlags {
    /// CPU deadline of one batch, ms (1-1000; hosts default to 10).
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub deadline_ms: Option<u64>,
    /// CPU deadline of starting an instance (instantiation and init, and
    /// re-creating it after a trap), ms (1-30000; hosts default to 1000).
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..=30_000))]
    pub start_deadline_ms: Option<u64>,
    /// What a batch the NF failed becomes: fail-open forwards it,
    /// fail-closed drops it (hosts' default).
    #[arg(long, value_parser = ["fail-open", "fail-closed"])]
    pub failure_policy: Option<String>,
    /// Linear memory cap per instance, MiB (1 to the hosts' memory slot,
    /// 256 by default, which the gateway checks; hosts default to 64).
    #[arg(long, value_name = "MIB", value_parser = clap::value_parser!(u64).range(1..))]
    pub memory_mb: Option<u64>,
    /// State budget, MiB: each instance's own tables and flow state, and
    /// once more the NF's shared tables on a host (1 to the gateway's
    /// max-state-budget-mb, 1024 by default, which the gateway checks;
    /// hosts default to 64).
    #[arg(long, value_name = "MIB", value_parser = clap::value_parser!(u64).range(1..))]
    pub state_budget_mb: Option<u64>,
    /// Fuel per batch call, about one Wasm instruction each (0 to 10^12;
    /// 0: unlimited); counted only on hosts that compile fuel metering in.
    #[arg(long, value_parser = clap::value_parser!(u64).range(0..=1_000_000_000_000))]
    pub fuel: Option<u64>,
    /// Most flows with state per worker (1-16777216).
    #[arg(long, value_name = "FLOWS", value_parser = clap::value_parser!(u64).range(1..=16_777_216))]
    pub max_flows: Option<u64>,
    /// Largest state value of one flow, bytes (1-65536).
    #[arg(long, value_name = "BYTES", value_parser = clap::value_parser!(u64).range(1..=65_536))]
    pub max_flow_state_bytes: Option<u64>,
    /// Log lines per second per instance (0-10000; hosts default to 50);
    /// more are dropped and counted.
    #[arg(long, value_name = "LINES", value_parser = clap::value_parser!(u32).range(0..=10_000))]
    pub log_lines_per_second: Option<u32>,
}

impl LimitFlags {
    /// The limits given, as the API's `limits` object.
    pub fn to_json(&self) -> serde_json::Map<String, Value> {
        let mut m = serde_json::Map::new();
        let mut put = |k: &str, v: Option<Value>| {
            if let Some(v) = v {
                m.insert(k.into(), v);
            }
        };
        put("deadline_ms", self.deadline_ms.map(Value::from));
        put("start_deadline_ms", self.start_deadline_ms.map(Value::from));
        put("failure_policy", self.failure_policy.clone().map(Value::from));
        put("memory_mb", self.memory_mb.map(Value::from));
        put("state_budget_mb", self.state_budget_mb.map(Value::from));
        put("fuel", self.fuel.map(Value::from));
        put("max_flows", self.max_flows.map(Value::from));
        put("max_flow_state_bytes", self.max_flow_state_bytes.map(Value::from));
        put("log_lines_per_second", self.log_lines_per_second.map(Value::from));
        m
    }
}

/// Where each gateway flag means something: local commands (`nf new`,
/// `nf build`, `sdk`, ...) show none of them in their help, admin commands
/// no API key, tenant commands no admin token. They are still accepted
/// everywhere (a hidden copy where they do not apply), so a script's
/// environment never breaks a command. A group (`nf`) whose subcommands
/// differ keeps them all.
pub fn command() -> clap::Command {
    const GATEWAY: &[&str] = &["url", "api_key", "admin_token"];
    const ADMIN: &[&str] = &["api_key", "sdk_root"];
    const TENANT: &[&str] = &["admin_token", "sdk_root"];
    let hidden: &[(&[&str], &[&str])] = &[
        (&["nf", "new"], GATEWAY),
        (&["nf", "build"], GATEWAY),
        (&["nf", "test"], GATEWAY),
        (&["nf", "run"], GATEWAY),
        (&["nf", "check"], &["url", "api_key", "admin_token", "sdk_root"]),
        (&["nf", "deploy"], &["admin_token"]),
        (&["nf", "watch"], &["admin_token"]),
        (&["nf", "upload"], TENANT),
        (&["nf", "list"], TENANT),
        (&["nf", "delete"], TENANT),
        (&["sdk"], GATEWAY),
        (&["completions"], &["url", "api_key", "admin_token", "sdk_root"]),
        (&["dev"], &["url", "api_key"]),
        (&["tenant"], ADMIN),
        (&["host"], ADMIN),
        (&["groups"], ADMIN),
        (&["key"], TENANT),
        (&["dashboard"], TENANT),
        (&["deploy"], TENANT),
        (&["deployments"], TENANT),
        (&["undeploy"], TENANT),
        (&["events"], TENANT),
        (&["logs"], TENANT),
        (&["usage"], TENANT),
        (&["bill"], TENANT),
    ];
    // A subcommand holding its own hidden copy of a global flag is skipped
    // when clap copies the global one into every subcommand.
    fn hide(cmd: clap::Command, path: &[&str], copies: &[clap::Arg], deep: bool) -> clap::Command {
        match path.split_first() {
            Some((first, rest)) => cmd.mut_subcommand(*first, |c| hide(c, rest, copies, deep)),
            None => {
                let subs: Vec<String> = cmd.get_subcommands().map(|c| c.get_name().to_string()).collect();
                let mut cmd = cmd.args(copies.iter().cloned());
                if deep {
                    for sub in subs {
                        cmd = cmd.mut_subcommand(sub, |c| hide(c, &[], copies, true));
                    }
                }
                cmd
            }
        }
    }
    let cmd = <Cli as clap::CommandFactory>::command();
    let globals: Vec<clap::Arg> = cmd.get_arguments().cloned().collect();
    hidden.iter().fold(cmd, |cmd, (path, ids)| {
        let copies: Vec<clap::Arg> = globals
            .iter()
            .filter(|a| ids.iter().any(|id| a.get_id() == id))
            .map(|a| a.clone().global(false).hide(true))
            .collect();
        hide(cmd, path, &copies, path.len() == 1 && path.first() != Some(&"nf"))
    })
}
