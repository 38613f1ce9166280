//! `sluice`: the developer and tenant CLI.

// Gateway answers are read as `serde_json::Value`, whose `Index<&str>`
// yields `Null` for a missing key instead of panicking; writes go through
// `as_object_mut`.
#![allow(clippy::indexing_slicing)]

use anyhow::{Context, Result};

/// `println!` for what the command prints on stdout: when the reader went
/// away (`sluice … | head`) the command ends quietly, never with a panic.
macro_rules! outln {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = writeln!(std::io::stdout(), $($t)*) {
            stdout_failed(e)
        }
    }};
}

/// `print!` as [`outln!`] does it.
macro_rules! out {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = write!(std::io::stdout(), $($t)*) {
            stdout_failed(e)
        }
    }};
}

/// Ends the command after a failed write to stdout: quietly (status 0) when
/// the reader closed the pipe, else with the error.
fn stdout_failed(e: std::io::Error) -> ! {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        std::process::exit(0);
    }
    eprintln!("error: writing to stdout: {e}");
    std::process::exit(1)
}
use clap::{Parser, Subcommand};
use serde_json::{Value, json};
use sluice_cli::client::{Client, bar, encode, human};
use sluice_cli::{BuildOptions, Lang, Project, Sdk, Template};
use std::path::PathBuf;

/// Sluice CLI: write network functions in Rust, C, Python, JavaScript or
/// Go, build them into sandboxed sluice:nf components, upload and deploy
/// them through a gateway, and read usage and bills. `sluice dev` runs a
/// whole cluster in one process.
#[derive(Parser)]
#[command(version, propagate_version = true)]
struct Cli {
    /// The Sluice SDK (wit/ and sdk/): an installed one or a checkout
    /// (default: share/sluice next to this binary's bin/, or the checkout
    /// whose target/ holds it). Projects reference a copy of it installed
    /// under the user's data directory.
    #[arg(long, global = true, env = "SLUICE_SDK_ROOT")]
    sdk_root: Option<PathBuf>,
    /// Gateway URL.
    #[arg(long, global = true, env = "SLUICE_URL", default_value = "http://127.0.0.1:8080")]
    url: String,
    /// Tenant API key (tenant commands).
    #[arg(long, global = true, env = "SLUICE_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Admin token (`tenant`, `host` and `groups` commands; default for a
    /// gateway on this machine: the token `sluice dev` keeps in its default
    /// data directory).
    #[arg(long, global = true, env = "SLUICE_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: Option<String>,
    /// How commands print what they read or did: a table for people, or
    /// JSON (the API's objects; logs one object per line) for scripts.
    #[arg(long, short = 'o', global = true, value_enum, default_value = "table")]
    output: Output,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
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
    Dev {
        /// HTTP listen address.
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: String,
        /// Data directory: the database, module blobs, the admin token
        /// (default: dev/ under the user's data directory, e.g.
        /// ~/.local/share/sluice/dev, so nothing lands in the directory it
        /// is started from).
        #[arg(long)]
        data: Option<PathBuf>,
        /// Spool directory (default: <data>/spool).
        #[arg(long)]
        spool: Option<PathBuf>,
        /// Meter window, ms.
        #[arg(long, default_value_t = 1000)]
        window_ms: u64,
        /// Gateway config file (price plan, upload limit).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Serve the gateway's and the host's metrics (Prometheus text at
        /// /metrics, what a Prometheus of a real cluster scrapes), /healthz
        /// and /readyz at this address, e.g. 127.0.0.1:9464.
        #[arg(long, value_name = "ADDR")]
        metrics_listen: Option<String>,
        /// Also watch this NF project, as `sluice nf watch` does, as the
        /// tenant `dev` (created if missing; its new API key is printed):
        /// rebuild, upload and hot-swap on every save.
        #[arg(long, value_name = "PROJECT")]
        watch: Option<PathBuf>,
    },
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
    Deploy {
        /// Deployment name.
        name: String,
        /// Module id or name@version; repeat for a linear chain.
        #[arg(long = "module", short = 'm')]
        modules: Vec<String>,
        /// NF configuration file, one per --module in order.
        #[arg(long = "config-file")]
        config_files: Vec<PathBuf>,
        /// A full deployment request as JSON (see /docs) instead of --module.
        #[arg(long, conflicts_with = "modules")]
        spec: Option<PathBuf>,
        /// Host group.
        #[arg(long, default_value = "default")]
        group: String,
        /// Traffic of the group's hosts that is this deployment's; repeat
        /// for several. Required in a group whose operator exposes ports
        /// (on those ports, overlapping no other deployment's), refused in
        /// a development group. An update without it keeps the old ones
        /// (`"attach": []` in a --spec removes them).
        #[arg(long = "attach", value_name = "port=N[,vlan=V][,dst=PREFIX][,out=N]")]
        attach: Vec<String>,
        /// What the NFs see of fragmented IP: `follow` (the first
        /// fragment; the later ones follow its verdict) or `reassemble`
        /// (whole datagrams, cut again on the way out). An update without
        /// it keeps the deployment's choice.
        #[arg(long)]
        fragments: Option<sluice_runtime::fragments::FragmentMode>,
        /// Wait up to this many seconds for every host to run it.
        #[arg(long, default_value_t = 30)]
        wait: u64,
        /// Limits for every NF of the deployment (with --module; a --spec
        /// gives them per NF). Unset ones take the hosts' defaults.
        #[command(
            flatten,
            next_help_heading = "Limits (each applies to every NF of the deployment; unset: the hosts' defaults, also on an update)"
        )]
        limits: LimitFlags,
    },
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

#[derive(Subcommand)]
enum TenantCommand {
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
enum HostCommand {
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
enum Output {
    /// For people.
    Table,
    /// For scripts: the API's JSON.
    Json,
}

#[derive(Subcommand)]
enum GroupsCommand {
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
enum KeyCommand {
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
enum SdkCommand {
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
enum NfCommand {
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
struct RunShape {
    /// Worker threads; packets are spread over them as `--spread` says,
    /// as on a host (default: sluice.toml's [run] workers, else 1).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=i64::from(sluice_cli::project::MAX_WORKERS)))]
    workers: Option<u32>,
    /// Packets per batch, the most one `process` call gets (default:
    /// sluice.toml's [run] batch, else 32).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=sluice_cli::project::MAX_BATCH as i64))]
    batch: Option<u32>,
    /// How packets spread over the workers: `flow` (by connection) or
    /// `addresses` (every connection between two hosts on one worker, so
    /// state keyed by an address is written and read there) (default:
    /// sluice.toml's [run] spread, else flow).
    #[arg(long)]
    spread: Option<sluice_traffic::Spread>,
}

/// What `sluice nf watch` deploys to, and how often it looks.
#[derive(Debug, clap::Args)]
struct WatchArgs {
    /// The deployment (default: sluice.toml's [deployment] name, else the
    /// NF's); created if missing.
    #[arg(long)]
    deployment: Option<String>,
    /// Its host group (default: sluice.toml's, else `default`).
    #[arg(long)]
    group: Option<String>,
    /// The NF's configuration from this file instead of sluice.toml's.
    #[arg(long)]
    config_file: Option<PathBuf>,
    /// How often to look for changes and log lines, ms.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(50..=60_000))]
    interval_ms: u64,
    /// Cargo target directory for Rust projects.
    #[arg(long)]
    cargo_target_dir: Option<PathBuf>,
}

/// Per-NF limits of `sluice deploy`, applied to every NF of the deployment
/// (a --spec gives them per NF instead). Unset ones take the hosts'
/// defaults; an update without them puts the defaults back. Values out of
/// range are refused here, before anything is sent.
#[derive(Debug, clap::Args)]
struct LimitFlags {
    /// CPU deadline of one batch, ms (1-1000; hosts default to 10).
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..=1000))]
    deadline_ms: Option<u64>,
    /// CPU deadline of starting an instance (instantiation and init, and
    /// re-creating it after a trap), ms (1-30000; hosts default to 1000).
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..=30_000))]
    start_deadline_ms: Option<u64>,
    /// What a batch the NF failed becomes: fail-open forwards it,
    /// fail-closed drops it (hosts' default).
    #[arg(long, value_parser = ["fail-open", "fail-closed"])]
    failure_policy: Option<String>,
    /// Linear memory cap per instance, MiB (1 to the hosts' memory slot,
    /// 256 by default, which the gateway checks; hosts default to 64).
    #[arg(long, value_name = "MIB", value_parser = clap::value_parser!(u64).range(1..))]
    memory_mb: Option<u64>,
    /// State budget, MiB: each instance's own tables and flow state, and
    /// once more the NF's shared tables on a host (1 to the gateway's
    /// max-state-budget-mb, 1024 by default, which the gateway checks;
    /// hosts default to 64).
    #[arg(long, value_name = "MIB", value_parser = clap::value_parser!(u64).range(1..))]
    state_budget_mb: Option<u64>,
    /// Fuel per batch call, about one Wasm instruction each (0 to 10^12;
    /// 0: unlimited); counted only on hosts that compile fuel metering in.
    #[arg(long, value_parser = clap::value_parser!(u64).range(0..=1_000_000_000_000))]
    fuel: Option<u64>,
    /// Most flows with state per worker (1-16777216).
    #[arg(long, value_name = "FLOWS", value_parser = clap::value_parser!(u64).range(1..=16_777_216))]
    max_flows: Option<u64>,
    /// Largest state value of one flow, bytes (1-65536).
    #[arg(long, value_name = "BYTES", value_parser = clap::value_parser!(u64).range(1..=65_536))]
    max_flow_state_bytes: Option<u64>,
    /// Log lines per second per instance (0-10000; hosts default to 50);
    /// more are dropped and counted.
    #[arg(long, value_name = "LINES", value_parser = clap::value_parser!(u32).range(0..=10_000))]
    log_lines_per_second: Option<u32>,
}

impl LimitFlags {
    /// The limits given, as the API's `limits` object.
    fn to_json(&self) -> serde_json::Map<String, Value> {
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

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::from(1)
        }
    }
}

/// The admin token of a `sluice dev` on this machine in its default data
/// directory, when `url` is a loopback address and the file is there.
fn dev_admin_token(url: &str) -> Option<String> {
    let host = url.split("://").nth(1)?.split(['/', ':']).next()?;
    if !matches!(host, "127.0.0.1" | "localhost" | "[") {
        return None;
    }
    let file = sluice_cli::dev::default_data_dir().ok()?.join("admin-token");
    std::fs::read_to_string(file).ok().map(|t| t.trim().to_string()).filter(|t| !t.is_empty())
}

/// Builds `project` for `nf build|test|run|deploy`, saying so first.
fn build_project(project: &Project, sdk: &Sdk, cargo_target_dir: Option<PathBuf>) -> Result<sluice_cli::Built> {
    eprintln!("building {} ({}) ...", project.manifest.name, project.manifest.lang);
    sluice_cli::build(project, sdk, &BuildOptions::with_code_cache(cargo_target_dir))
        .with_context(|| format!("building {}", project.dir.display()))
}

/// Creates deployment `name` from `body`, or updates it if it exists;
/// the gateway's answer.
fn put_deployment(client: &Client, name: &str, body: &Value) -> Result<Value> {
    let path = format!("/v1/deployments/{}", encode(name));
    Ok(match client.get::<Value>(&path) {
        Ok(_) => client.put(&path, body)?,
        Err(sluice_cli::client::ClientError::Api { status: 404, .. }) => client.post("/v1/deployments", body)?,
        Err(e) => return Err(e.into()),
    })
}

/// Deployment `name` once it runs or failed, or after `wait` seconds
/// (starting from `d`, the gateway's last answer).
fn wait_deployment(client: &Client, name: &str, d: Value, wait: u64) -> Result<Value> {
    let path = format!("/v1/deployments/{}", encode(name));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(wait);
    let mut last = d;
    while wait > 0 && std::time::Instant::now() < deadline {
        last = client.get(&path)?;
        match last["status"].as_str() {
            Some("running") | Some("failed") => break,
            _ => std::thread::sleep(std::time::Duration::from_millis(200)),
        }
    }
    Ok(last)
}

/// The deployment request of a project's sluice.toml running
/// `<name>@<version>`: its deployment name, group, attachments, and the
/// NF's configuration (`config` instead of the manifest's when given) and
/// limits under the API's names.
fn deployment_body(project: &Project, version: &str, config: Option<Vec<u8>>) -> Result<Value> {
    let m = &project.manifest;
    let config = match config {
        Some(c) => c,
        None => project.config_bytes()?,
    };
    let config = String::from_utf8(config)
        .map_err(|_| anyhow::anyhow!("the NF's configuration is not UTF-8 text, which a deployment carries"))?;
    let mut body = json!({
        "name": project.deployment_name(),
        "group": m.deployment.group.clone().unwrap_or_else(|| "default".into()),
        "nfs": [{
            "name": m.name,
            "module": format!("{}@{version}", m.name),
            "config": config,
            "limits": Value::Object(project.limits().limits_json()),
        }],
    });
    if !m.deployment.attach.is_empty() {
        body["attach"] = json!(m.deployment.attach);
    }
    if let Some(f) = m.deployment.fragments {
        body["fragments"] = json!(f.to_string());
    }
    Ok(body)
}

/// Uploads `bytes` as `name@version`, or finds it there already with the
/// same bytes; the module, and whether it was uploaded now. The same
/// version with other bytes is an error: a gateway keeps each version's
/// bytes for good.
fn upload_once(client: &Client, name: &str, version: &str, bytes: &[u8]) -> Result<(Value, bool)> {
    use sha2::Digest;
    let digest = hex::encode(sha2::Sha256::digest(bytes));
    let id = format!("{name}@{version}");
    match client.get::<Value>(&format!("/v1/modules/{}", encode(&id))) {
        Ok(m) if m["digest"].as_str() == Some(digest.as_str()) => return Ok((m, false)),
        Ok(_) => anyhow::bail!(
            "{id} is on the gateway already with other bytes: module versions are immutable; raise `version` in sluice.toml"
        ),
        Err(sluice_cli::client::ClientError::Api { status: 404, .. }) => {}
        Err(e) => return Err(e.into()),
    }
    let path = format!("/v1/modules?name={}&version={}", encode(name), encode(version));
    Ok((client.post_bytes(&path, "application/wasm", bytes)?, true))
}

/// Reports a created or updated deployment, waits up to `wait` seconds
/// for its hosts, and fails if it failed or is not running by then.
fn finish_deploy(client: &Client, name: &str, d: Value, wait: u64, as_json: bool) -> Result<()> {
    // Progress on stderr when stdout carries JSON.
    let said = format!(
        "deployment {} ({}) revision {} on group {}",
        d["name"].as_str().unwrap_or_default(),
        d["id"].as_str().unwrap_or_default(),
        d["revision"],
        d["group"].as_str().unwrap_or_default()
    );
    if as_json {
        eprintln!("{said}");
    } else {
        outln!("{said}");
    }
    let last = wait_deployment(client, name, d, wait)?;
    if as_json {
        emit(&last)?;
    } else {
        print_deployment(&last);
    }
    if last["status"] == "failed" {
        anyhow::bail!("deployment {name} failed: {}", last["reason"].as_str().unwrap_or("see the hosts above"));
    }
    if wait > 0 && last["status"] != "running" {
        anyhow::bail!(
            "deployment {name} is {} after {wait} s (--wait): not every host of its group runs it yet",
            last["status"].as_str().unwrap_or("unknown")
        );
    }
    Ok(())
}

/// `sluice dev --watch`: the tenant `dev` (created if missing) gets a new
/// API key, printed, and watches `project` with it.
fn watch_as_dev_tenant(url: &str, admin_token: &str, sdk: &Sdk, project: &Project, output: Output) -> Result<()> {
    let admin = Client::new(url, Some(admin_token.to_string()));
    let created: Result<Value, _> = admin.post("/v1/tenants", &json!({ "name": "dev" }));
    let key = match created {
        Ok(t) => t["api_key"].as_str().unwrap_or_default().to_string(),
        Err(sluice_cli::client::ClientError::Api { status: 409, .. }) => {
            let tenants: Vec<Value> = admin.get_all("/v1/tenants")?;
            let id = tenants
                .iter()
                .find(|t| t["name"] == "dev")
                .and_then(|t| t["id"].as_str())
                .context("the tenant 'dev' exists but is not listed")?;
            let k: Value = admin.post(&format!("/v1/tenants/{}/keys", encode(id)), &json!({}))?;
            k["api_key"].as_str().unwrap_or_default().to_string()
        }
        Err(e) => return Err(e.into()),
    };
    outln!("sluice dev: watching {} as tenant dev; its API key:", project.dir.display());
    outln!("export SLUICE_API_KEY={key}");
    let args = WatchArgs { deployment: None, group: None, config_file: None, interval_ms: 500, cargo_target_dir: None };
    watch(&Client::new(url, Some(key)), sdk, project, args, output, &Default::default())
}

/// `sluice nf watch`: on every save, build, upload under a new dev
/// version, and swap the deployment to it; meanwhile the NF's log lines
/// and traps. Runs until interrupted.
/// `running` holds `name@version` of what the deployment runs since the
/// last swap.
fn watch(
    client: &Client,
    sdk: &Sdk,
    project: &Project,
    w: WatchArgs,
    output: Output,
    running: &std::sync::Mutex<Option<String>>,
) -> Result<()> {
    let nf = project.manifest.name.clone();
    let deployment = w.deployment.clone().unwrap_or_else(|| project.deployment_name().to_string());
    let config = match &w.config_file {
        Some(f) => Some(std::fs::read(f).with_context(|| format!("reading {}", f.display()))?),
        None => None,
    };
    let mut seen: Option<String> = None;
    let mut previous: Option<String> = None;
    let mut after: Option<String> = None;
    let mut generation = 0u64;
    let started = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    eprintln!("watching {} (deployment {deployment}); Ctrl-C stops", project.dir.display());
    loop {
        let fp = project.sources_digest()?;
        if seen.as_deref() != Some(fp.as_str()) {
            seen = Some(fp);
            generation += 1;
            eprintln!("building {nf} ...");
            match sluice_cli::build(project, sdk, &BuildOptions::with_code_cache(w.cargo_target_dir.clone())) {
                Err(e) => eprintln!("build failed; fix it and save again:\n{e}"),
                Ok(built) => {
                    let version = format!("0.0.0-dev.{started}.{generation}");
                    let bytes =
                        std::fs::read(&built.path).with_context(|| format!("reading {}", built.path.display()))?;
                    let path = format!("/v1/modules?name={}&version={}", encode(&nf), encode(&version));
                    let uploaded: Result<Value, _> = client.post_bytes(&path, "application/wasm", &bytes);
                    match uploaded {
                        Err(e) => eprintln!("upload of {nf}@{version} refused: {e}"),
                        Ok(_) => {
                            let mut body = deployment_body(project, &version, config.clone())?;
                            body["name"] = json!(deployment);
                            if let Some(g) = &w.group {
                                body["group"] = json!(g);
                            }
                            let d = put_deployment(client, &deployment, &body)
                                .and_then(|d| wait_deployment(client, &deployment, d, 30));
                            match d {
                                Ok(d) if d["status"] == "running" => {
                                    eprintln!("deployment {deployment} revision {} runs {nf}@{version}", d["revision"]);
                                    *running.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
                                        Some(format!("{nf}@{version}"));
                                    // The dev version it replaced is no longer deployed.
                                    if let Some(old) = previous.replace(format!("{nf}@{version}")) {
                                        let _ = client.delete(&format!("/v1/modules/{}", encode(&old)));
                                    }
                                }
                                Ok(d) => eprintln!(
                                    "deployment {deployment} is {}: {}",
                                    d["status"].as_str().unwrap_or("unknown"),
                                    d["reason"].as_str().unwrap_or("not every host runs it yet")
                                ),
                                Err(e) => eprintln!("deploying {nf}@{version}: {e:#}"),
                            }
                        }
                    }
                }
            }
        }
        // The NF's log lines and traps since the last look.
        let mut q = vec![format!("deployment={}", encode(&deployment)), "limit=200".to_string()];
        if let Some(a) = &after {
            q.push(format!("after={}", encode(a)));
        }
        if let Ok(page) = client.get::<Value>(&format!("/v1/logs?{}", q.join("&"))) {
            for l in page["lines"].as_array().into_iter().flatten() {
                print_log_line(l, output)?;
            }
            if let Some(n) = page["next"].as_str() {
                after = Some(n.to_string());
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(w.interval_ms));
    }
}

/// On Ctrl-C or SIGTERM, says what `sluice nf watch` leaves deployed and
/// how to put the manifest's version back, then ends the process.
fn say_where_watch_left(deployment: String, running: std::sync::Arc<std::sync::Mutex<Option<String>>>) {
    std::thread::spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return };
        rt.block_on(async { sluice_control::shutdown_signal().await });
        match running.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone() {
            Some(v) => eprintln!(
                "\nstopped watching; deployment {deployment} stays on {v}. `sluice nf deploy` puts sluice.toml's version back; `sluice undeploy {deployment}` removes it"
            ),
            None => eprintln!("\nstopped watching; no version of this watch was deployed"),
        }
        std::process::exit(130);
    });
}

/// Prints `v` as JSON (`--output json`).
fn emit(v: &impl serde::Serialize) -> Result<()> {
    outln!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

/// Where each gateway flag means something: local commands (`nf new`,
/// `nf build`, `sdk`, ...) show none of them in their help, admin commands
/// no API key, tenant commands no admin token. They are still accepted
/// everywhere (a hidden copy where they do not apply), so a script's
/// environment never breaks a command. A group (`nf`) whose subcommands
/// differ keeps them all.
fn command() -> clap::Command {
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
        hide(cmd, path, &copies, path.len() == 1 && path[0] != "nf")
    })
}

fn run() -> Result<()> {
    let cli = <Cli as clap::FromArgMatches>::from_arg_matches(&command().get_matches()).unwrap_or_else(|e| e.exit());
    let output = cli.output;
    let as_json = output == Output::Json;
    let tenant = || Client::new(&cli.url, cli.api_key.clone());
    let admin = || Client::new(&cli.url, cli.admin_token.clone().or_else(|| dev_admin_token(&cli.url)));
    match cli.command {
        Command::Dev { listen, data, spool, window_ms, config, metrics_listen, watch: watched } => {
            let telemetry = sluice_telemetry::start(sluice_telemetry::Settings {
                service: if metrics_listen.is_some() { "sluice-dev" } else { "" },
                log_default: "warn",
                prometheus: metrics_listen.is_some(),
                ..Default::default()
            })?;
            // The project is checked before anything starts.
            let watched = match watched {
                Some(dir) => Some((Sdk::locate(cli.sdk_root.as_deref())?.for_projects()?, Project::open(&dir)?)),
                None => None,
            };
            let data = match data {
                Some(d) => d,
                None => sluice_cli::dev::default_data_dir()?,
            };
            let token_file = data.join("admin-token");
            let default_data = sluice_cli::dev::default_data_dir().is_ok_and(|d| d == data);
            let given_token = cli.admin_token.is_some();
            let opts = sluice_cli::dev::DevOptions {
                listen,
                data_dir: data,
                spool,
                admin_token: cli.admin_token.clone(),
                window: std::time::Duration::from_millis(window_ms.max(10)),
                config,
                metrics_listen,
                prometheus: telemetry.prometheus(),
            };
            let rt = tokio::runtime::Runtime::new()?;
            // The signal handlers are installed inside the runtime.
            let _in_runtime = rt.enter();
            rt.block_on(sluice_cli::dev::run(
                opts,
                |url, token, spool| {
                    outln!("sluice dev: gateway {url} (dashboard {url}/dashboard, API docs {url}/docs)");
                    outln!("sluice dev: one host in group 'default'; drop captures into {}", spool.display());
                    if given_token {
                        outln!("sluice dev: admin token as given (--admin-token or SLUICE_ADMIN_TOKEN)");
                    } else if default_data {
                        outln!(
                            "sluice dev: admin token in {} (sluice commands on this machine read it there)",
                            token_file.display()
                        );
                    } else {
                        outln!("sluice dev: admin token in {}", token_file.display());
                    }
                    // The CLI's default gateway is 127.0.0.1:8080; another
                    // address needs saying to the commands of other shells.
                    if url.trim_end_matches('/') != "http://127.0.0.1:8080" {
                        outln!("export SLUICE_URL={url}");
                    }
                    if let Some((sdk, project)) = watched {
                        let (url, token) = (url.to_string(), token.to_string());
                        std::thread::spawn(move || {
                            if let Err(e) = watch_as_dev_tenant(&url, &token, &sdk, &project, output) {
                                eprintln!("sluice dev: watching {} stopped: {e:#}", project.dir.display());
                            }
                        });
                    }
                },
                sluice_control::shutdown_signal(),
            ))?;
            telemetry.shutdown();
        }
        Command::Tenant(TenantCommand::Create { name, groups, key_only }) => {
            let mut body = json!({ "name": name });
            if let Some(g) = groups {
                body["groups"] = json!(g);
            }
            let t: Value = admin().post("/v1/tenants", &body)?;
            let key = t["api_key"].as_str().unwrap_or_default();
            if as_json {
                emit(&t)?;
            } else if key_only {
                outln!("{key}");
            } else {
                outln!("tenant {} ({})", t["name"].as_str().unwrap_or_default(), t["id"].as_str().unwrap_or_default());
                outln!("API key (shown once): {key}");
                outln!("  export SLUICE_API_KEY={key}");
            }
        }
        Command::Tenant(TenantCommand::List) => {
            let ts: Vec<Value> = admin().get_all("/v1/tenants")?;
            if as_json {
                return emit(&ts);
            }
            for t in ts {
                outln!("{:<16} {}", t["id"].as_str().unwrap_or_default(), t["name"].as_str().unwrap_or_default());
            }
        }
        Command::Tenant(TenantCommand::Key { tenant }) => {
            let k: Value = admin().post(&format!("/v1/tenants/{}/keys", encode(&tenant)), &json!({}))?;
            if as_json {
                return emit(&k);
            }
            outln!("{}", k["api_key"].as_str().unwrap_or_default());
        }
        Command::Tenant(TenantCommand::Keys { tenant }) => {
            let keys: Vec<Value> = admin().get(&format!("/v1/tenants/{}/keys", encode(&tenant)))?;
            if as_json {
                return emit(&keys);
            }
            print_keys(&keys);
        }
        Command::Tenant(TenantCommand::Revoke { tenant, prefix }) => {
            admin().delete(&format!("/v1/tenants/{}/keys/{}", encode(&tenant), encode(&prefix)))?;
            if as_json {
                return emit(&json!({ "revoked": prefix }));
            }
            outln!("revoked {prefix}");
        }
        Command::Tenant(TenantCommand::Grant { tenant, groups }) => {
            let g: Value =
                admin().put(&format!("/v1/tenants/{}/groups", encode(&tenant)), &json!({ "groups": groups }))?;
            if as_json {
                return emit(&g);
            }
            outln!("{tenant} may deploy to: {}", g["groups"]);
        }
        Command::Host(HostCommand::Add { id, group, nkey, dispatcher, max_pps, max_bps }) => {
            let role = if dispatcher { "dispatcher" } else { "host" };
            let h: Value = admin().post(
                "/v1/hosts",
                &json!({ "id": id, "group": group, "nkey": nkey, "role": role, "max_pps": max_pps, "max_bps": max_bps }),
            )?;
            if as_json {
                return emit(&h);
            }
            outln!(
                "{role} {} registered in group {}",
                h["host"].as_str().unwrap_or_default(),
                h["group"].as_str().unwrap_or_default()
            );
        }
        Command::Host(HostCommand::List) => {
            let hs: Vec<Value> = admin().get_all("/v1/hosts")?;
            if as_json {
                return emit(&hs);
            }
            outln!("{:<20} {:<16} {:<6} {:>11}", "HOST", "GROUP", "ALIVE", "DEPLOYMENTS");
            for h in hs {
                outln!(
                    "{:<20} {:<16} {:<6} {:>11}",
                    h["host"].as_str().unwrap_or_default(),
                    h["group"].as_str().unwrap_or_default(),
                    if h["alive"] == true { "yes" } else { "no" },
                    h["deployments"]
                );
            }
        }
        Command::Host(HostCommand::Remove { id }) => {
            admin().delete(&format!("/v1/hosts/{}", encode(&id)))?;
            if as_json {
                return emit(&json!({ "removed": id }));
            }
            outln!("host {id} removed");
        }
        Command::Groups { command } => groups(&admin(), command.unwrap_or(GroupsCommand::List), output)?,
        Command::Key(KeyCommand::List) => {
            let keys: Vec<Value> = tenant().get("/v1/me/keys")?;
            if as_json {
                return emit(&keys);
            }
            print_keys(&keys);
        }
        Command::Key(KeyCommand::Add) => {
            let k: Value = tenant().post("/v1/me/keys", &json!({}))?;
            if as_json {
                return emit(&k);
            }
            outln!("{}", k["api_key"].as_str().unwrap_or_default());
        }
        Command::Key(KeyCommand::Rotate) => {
            let k: Value = tenant().post("/v1/me/keys/rotate", &json!({}))?;
            if as_json {
                return emit(&k);
            }
            let key = k["api_key"].as_str().unwrap_or_default();
            outln!("new API key (shown once; the old one no longer works): {key}");
            outln!("  export SLUICE_API_KEY={key}");
        }
        Command::Dashboard => {
            let link: Value = tenant().post("/v1/me/dashboard-link", &json!({}))?;
            let url = format!("{}{}", cli.url.trim_end_matches('/'), link["path"].as_str().unwrap_or_default());
            if as_json {
                return emit(&json!({ "url": url, "expires_in_s": link["expires_in_s"] }));
            }
            outln!("{url}");
            eprintln!("open it within {} s; it signs in once", link["expires_in_s"]);
        }
        Command::Key(KeyCommand::Revoke { prefix }) => {
            tenant().delete(&format!("/v1/me/keys/{}", encode(&prefix)))?;
            if as_json {
                return emit(&json!({ "revoked": prefix }));
            }
            outln!("revoked {prefix}");
        }
        Command::Nf(NfCommand::Upload { file, name, version }) => {
            let name = name
                .or_else(|| file.file_stem().and_then(|s| s.to_str()).map(str::to_string))
                .context("give --name")?;
            let bytes = std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
            let path = format!("/v1/modules?name={}&version={}", encode(&name), encode(&version));
            let m: Value = tenant().post_bytes(&path, "application/wasm", &bytes)?;
            if as_json {
                return emit(&m);
            }
            outln!(
                "uploaded {}@{}: id {}, {} bytes, sluice:nf@{}, sha256 {}",
                m["name"].as_str().unwrap_or_default(),
                m["version"].as_str().unwrap_or_default(),
                m["id"].as_str().unwrap_or_default(),
                m["size"],
                m["contract"].as_str().unwrap_or_default(),
                m["digest"].as_str().unwrap_or_default()
            );
        }
        Command::Nf(NfCommand::List) => {
            let ms: Vec<Value> = tenant().get_all("/v1/modules")?;
            if as_json {
                return emit(&ms);
            }
            outln!("{:<16} {:<20} {:<10} {:>10}  {:<14} deployed in", "id", "name", "version", "bytes", "digest");
            for m in ms {
                outln!(
                    "{:<16} {:<20} {:<10} {:>10}  {:<14} {}",
                    m["id"].as_str().unwrap_or_default(),
                    m["name"].as_str().unwrap_or_default(),
                    m["version"].as_str().unwrap_or_default(),
                    m["size"].to_string(),
                    m["digest"].as_str().unwrap_or_default().chars().take(12).collect::<String>(),
                    m["deployed_in"]
                        .as_array()
                        .map(|a| a.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(","))
                        .unwrap_or_default()
                );
            }
        }
        Command::Nf(NfCommand::Delete { module }) => {
            tenant().delete(&format!("/v1/modules/{}", encode(&module)))?;
            if as_json {
                return emit(&json!({ "deleted": module }));
            }
            outln!("deleted {module}");
        }
        Command::Deploy { name, modules, config_files, spec, group, attach, fragments, limits, wait } => {
            let limits = limits.to_json();
            if spec.is_some() && !limits.is_empty() {
                anyhow::bail!("with --spec, give the limits per NF in the spec (\"limits\": {{...}})");
            }
            // Attachments are checked here first, so a typo fails before
            // anything is sent.
            let attach = attach
                .iter()
                .map(|a| a.parse::<sluice_traffic::Attachment>().map(|a| Value::String(a.to_string())))
                .collect::<Result<Vec<Value>, _>>()
                .context("--attach")?;
            let client = tenant();
            let mut body: Value = match spec {
                Some(p) => {
                    serde_json::from_slice(&std::fs::read(&p).with_context(|| format!("reading {}", p.display()))?)
                        .with_context(|| format!("{} is not JSON", p.display()))?
                }
                None => {
                    if modules.is_empty() {
                        anyhow::bail!("give --module <name@version> (repeat for a chain) or --spec <file.json>");
                    }
                    if !config_files.is_empty() && config_files.len() != modules.len() {
                        anyhow::bail!(
                            "give one --config-file per --module ({} modules, {} config files)",
                            modules.len(),
                            config_files.len()
                        );
                    }
                    let mut nfs = Vec::new();
                    for (i, m) in modules.iter().enumerate() {
                        let config = match config_files.get(i) {
                            Some(f) => Value::String(
                                std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?,
                            ),
                            None => Value::Null,
                        };
                        nfs.push(json!({ "module": m, "config": config, "limits": Value::Object(limits.clone()) }));
                    }
                    json!({ "nfs": nfs })
                }
            };
            let Some(obj) = body.as_object_mut() else {
                anyhow::bail!("the deployment spec must be a JSON object (see {}/docs)", cli.url);
            };
            obj.insert("name".into(), Value::String(name.clone()));
            obj.entry("group").or_insert(Value::String(group));
            if !attach.is_empty() {
                obj.insert("attach".into(), Value::Array(attach));
            }
            if let Some(f) = fragments {
                obj.insert("fragments".into(), Value::String(f.to_string()));
            }
            let d = put_deployment(&client, &name, &body)?;
            finish_deploy(&client, &name, d, wait, as_json)?;
        }
        Command::Deployments => {
            let ds: Vec<Value> = tenant().get_all("/v1/deployments")?;
            if as_json {
                return emit(&ds);
            }
            if ds.is_empty() {
                outln!("no deployments");
            }
            for d in ds {
                print_deployment(&d);
            }
        }
        Command::Undeploy { name } => {
            tenant().delete(&format!("/v1/deployments/{}", encode(&name)))?;
            if as_json {
                return emit(&json!({ "deleted": name }));
            }
            outln!("deleted deployment {name}");
        }
        Command::Events { deployment, kind, since, limit } => {
            let mut q = vec![format!("limit={limit}")];
            for (k, v) in [("deployment", deployment), ("kind", kind), ("since", since)] {
                if let Some(v) = v {
                    q.push(format!("{k}={}", encode(&v)));
                }
            }
            let evs: Vec<Value> = tenant().get(&format!("/v1/events?{}", q.join("&")))?;
            if as_json {
                return emit(&evs);
            }
            if evs.is_empty() {
                outln!("no events");
            }
            for e in evs {
                let fields: Vec<String> = e["fields"]
                    .as_object()
                    .map(|o| {
                        o.iter()
                            .filter(|(k, v)| !(k.as_str() == "flow" && **v == e["flow"]))
                            .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                            .collect()
                    })
                    .unwrap_or_default();
                let deployment = match e["deployment_name"].as_str() {
                    Some(n) if !n.is_empty() => n,
                    _ => e["deployment"].as_str().unwrap_or_default(),
                };
                // Wall clock first; the packet's own time is in --output json.
                outln!(
                    "{} {:<6} {:<16} {deployment}/{}@{} {}  {}  {}",
                    e["time"].as_str().unwrap_or_default(),
                    e["level"].as_str().unwrap_or_default(),
                    e["kind"].as_str().unwrap_or_default(),
                    e["nf"].as_str().unwrap_or_default(),
                    e["version"].as_str().unwrap_or_default(),
                    e["flow"].as_str().unwrap_or("-"),
                    fields.join(" "),
                    e["host"].as_str().unwrap_or_default()
                );
            }
        }
        Command::Logs { deployment, nf, level, since, limit, follow } => {
            let client = tenant();
            let mut q = vec![format!("level={}", encode(&level)), format!("limit={}", limit.clamp(1, 1000))];
            for (k, v) in [("deployment", deployment), ("nf", nf), ("since", since)] {
                if let Some(v) = v {
                    q.push(format!("{k}={}", encode(&v)));
                }
            }
            let mut after: Option<String> = None;
            loop {
                let mut query = q.clone();
                if let Some(a) = &after {
                    query.push(format!("after={}", encode(a)));
                }
                let page: Value = client.get(&format!("/v1/logs?{}", query.join("&")))?;
                let lines = page["lines"].as_array().cloned().unwrap_or_default();
                for l in &lines {
                    print_log_line(l, output)?;
                }
                if let Some(n) = page["next"].as_str() {
                    after = Some(n.to_string());
                }
                if !follow {
                    if lines.is_empty() && after.is_none() && output == Output::Table {
                        eprintln!("no log lines");
                    }
                    break;
                }
                // Following: a full page means more are waiting.
                if (lines.len() as u64) < limit.clamp(1, 1000) {
                    std::thread::sleep(std::time::Duration::from_secs(1));
                }
            }
        }
        Command::Usage { from, to, json } => {
            let mut q = Vec::new();
            if let Some(f) = from {
                q.push(format!("from={}", encode(&f)));
            }
            if let Some(t) = to {
                q.push(format!("to={}", encode(&t)));
            }
            let u: Value = tenant().get(&format!("/v1/usage?{}", q.join("&")))?;
            if json || as_json {
                outln!("{}", serde_json::to_string_pretty(&u)?);
            } else {
                print_usage(&u);
            }
        }
        Command::Bill { period, csv, json } => {
            let path = format!("/v1/bill?period={}&format={}", encode(&period), if csv { "csv" } else { "json" });
            if csv {
                out!("{}", tenant().get_text(&path)?);
            } else {
                let b: Value = tenant().get(&path)?;
                if json || as_json {
                    outln!("{}", serde_json::to_string_pretty(&b)?);
                } else {
                    print_bill(&b);
                }
            }
        }
        Command::Completions { shell } => {
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut command(), "sluice", &mut out);
            out!("{}", String::from_utf8_lossy(&out));
        }
        Command::Sdk(SdkCommand::Path) => {
            let sdk = Sdk::locate(cli.sdk_root.as_deref())?;
            let copy = sdk.projects_copy()?;
            if as_json {
                return emit(&json!({ "sdk": sdk.root(), "projects_copy": copy }));
            }
            outln!("sdk: {}", sdk.root().display());
            outln!("projects' copy: {}", copy.display());
        }
        Command::Sdk(SdkCommand::Install { to }) => {
            let sdk = Sdk::locate(cli.sdk_root.as_deref())?;
            let installed = match to {
                Some(dir) => {
                    if std::fs::read_dir(&dir).is_ok_and(|mut d| d.next().is_some()) {
                        anyhow::bail!("{} is not empty; give an empty or missing directory", dir.display());
                    }
                    sdk.install(&dir)?
                }
                None => sdk.for_projects()?,
            };
            if as_json {
                return emit(&json!({ "installed": installed.root() }));
            }
            outln!("installed {}", installed.root().display());
        }
        Command::Nf(NfCommand::New { name, lang, template, dir }) => {
            let sdk = Sdk::locate(cli.sdk_root.as_deref())?.for_projects()?;
            let template: Template = template.parse()?;
            let project = sluice_cli::new_project(&sdk, &dir, &name, lang, template)?;
            if as_json {
                return emit(&json!({ "project": project, "lang": lang.name(), "sdk": sdk.root() }));
            }
            outln!("created {} ({lang}); next:", project.display());
            outln!("  cd {} && sluice nf build", project.display());
        }
        Command::Nf(NfCommand::Build { project, cargo_target_dir }) => {
            // The time printed is the whole command's (SDK install and the
            // contract check included), not the toolchain's alone.
            let started = std::time::Instant::now();
            let sdk = Sdk::locate(cli.sdk_root.as_deref())?.for_projects()?;
            let project = Project::open(&project)?;
            let built = build_project(&project, &sdk, cargo_target_dir)?;
            if as_json {
                return emit(&json!({
                    "component": built.path,
                    "size": built.size,
                    "contract": built.contract,
                    "digest": built.digest,
                    "seconds": started.elapsed().as_secs_f64(),
                }));
            }
            outln!(
                "{}: {} bytes, sluice:nf@{}, sha256 {} (built in {:.1} s)",
                built.path.display(),
                built.size,
                built.contract,
                built.digest,
                started.elapsed().as_secs_f64()
            );
        }
        Command::Nf(NfCommand::Test { project, case, bless, shape, cargo_target_dir }) => {
            let sdk = Sdk::locate(cli.sdk_root.as_deref())?.for_projects()?;
            let project = Project::open(&project)?;
            let shape = project.local_run(shape.workers, shape.batch, shape.spread);
            // What can be wrong without a build is said before one.
            let dirs = sluice_cli::cases::cases(&project, case.as_deref())?;
            if dirs.is_empty() {
                match &case {
                    Some(c) => anyhow::bail!("no test case '{c}' in {}", project.dir.join("tests").display()),
                    None => anyhow::bail!(
                        "no test cases in {}: add a folder tests/<case>/ with input.txt and expected-verdicts.txt (sluice nf new makes one)",
                        project.dir.join("tests").display()
                    ),
                }
            }
            let built = build_project(&project, &sdk, cargo_target_dir)?;
            let mut results = Vec::new();
            for dir in &dirs {
                // A case that cannot run fails alone; the others still run.
                let r = sluice_cli::cases::run_case(&project, &built.path, dir, shape, bless).unwrap_or_else(|e| {
                    sluice_cli::cases::CaseResult {
                        name: dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
                        packets: 0,
                        failures: vec![e.to_string()],
                        blessed: Vec::new(),
                    }
                });
                if !as_json {
                    if bless {
                        outln!("case {}: wrote {} ({} packets)", r.name, r.blessed.join(", "), r.packets);
                    } else if r.passed() {
                        outln!("case {} ... ok ({} packets)", r.name, r.packets);
                    } else {
                        outln!("case {} ... FAILED ({} packets)", r.name, r.packets);
                        for f in &r.failures {
                            outln!("{f}");
                        }
                    }
                }
                results.push(r);
            }
            let failed = results.iter().filter(|r| !r.passed()).count();
            if as_json {
                let cases: Vec<Value> = results
                    .iter()
                    .map(|r| json!({ "case": r.name, "packets": r.packets, "passed": r.passed(), "failures": r.failures, "blessed": r.blessed }))
                    .collect();
                emit(&json!({ "cases": cases, "failed": failed }))?;
            } else if !bless {
                outln!("{} case(s), {} passed, {failed} failed", results.len(), results.len() - failed);
            }
            if failed > 0 && !bless {
                anyhow::bail!("{failed} test case(s) failed");
            }
        }
        Command::Nf(NfCommand::Run { project, input, out, config_file, shape, cargo_target_dir }) => {
            let sdk = Sdk::locate(cli.sdk_root.as_deref())?.for_projects()?;
            let project = Project::open(&project)?;
            let shape = project.local_run(shape.workers, shape.batch, shape.spread);
            // The inputs are read before the build, so that a wrong path
            // is said at once.
            let config = match &config_file {
                Some(f) => Some(
                    String::from_utf8(std::fs::read(f).with_context(|| format!("reading {}", f.display()))?)
                        .with_context(|| format!("{} is not UTF-8", f.display()))?,
                ),
                None => None,
            };
            let input = sluice_cli::cases::input_capture(&input, &project.build_dir().join("run"))?;
            let built = build_project(&project, &sdk, cargo_target_dir)?;
            let host = project.host_config(config, shape);
            let opts = sluice_host::RunOptions {
                nfs: vec![built.path.clone()],
                chain: None,
                swaps: vec![],
                input,
                output: out,
                progress: false,
            };
            let report = sluice_host::run(&host, &opts).context("running the NF")?;
            if as_json {
                emit(&report)?;
            } else {
                out!("{}", report.summary());
            }
        }
        Command::Nf(NfCommand::Deploy { project, wait, cargo_target_dir }) => {
            let sdk = Sdk::locate(cli.sdk_root.as_deref())?.for_projects()?;
            let project = Project::open(&project)?;
            let client = tenant();
            client.check_key()?;
            let m = &project.manifest;
            let built = build_project(&project, &sdk, cargo_target_dir)?;
            let bytes = std::fs::read(&built.path).with_context(|| format!("reading {}", built.path.display()))?;
            let (module, uploaded) = upload_once(&client, &m.name, &m.version, &bytes)?;
            eprintln!(
                "{} {}@{} ({} bytes, sha256 {})",
                if uploaded { "uploaded" } else { "already on the gateway:" },
                m.name,
                m.version,
                module["size"],
                module["digest"].as_str().unwrap_or_default().chars().take(12).collect::<String>()
            );
            let body = deployment_body(&project, &m.version, None)?;
            let name = project.deployment_name().to_string();
            let d = put_deployment(&client, &name, &body)?;
            finish_deploy(&client, &name, d, wait, as_json)?;
        }
        Command::Nf(NfCommand::Watch { project, args }) => {
            let sdk = Sdk::locate(cli.sdk_root.as_deref())?.for_projects()?;
            let project = Project::open(&project)?;
            let client = tenant();
            client.check_key()?;
            let deployment = args.deployment.clone().unwrap_or_else(|| project.deployment_name().to_string());
            let running = std::sync::Arc::new(std::sync::Mutex::new(None));
            say_where_watch_left(deployment, running.clone());
            watch(&client, &sdk, &project, args, output, &running)?;
        }
        Command::Nf(NfCommand::Check { component }) => {
            let name = component.file_stem().and_then(|s| s.to_str()).unwrap_or("nf").to_string();
            let checked = sluice_cli::check::check_file(&component, &name, None, None)?;
            if as_json {
                return emit(&json!({
                    "component": component,
                    "contract": checked.contract,
                    "size": checked.size,
                    "digest": checked.digest,
                }));
            }
            outln!(
                "{}: ok, sluice:nf@{}, {} bytes, sha256 {}",
                component.display(),
                checked.contract,
                checked.size,
                checked.digest
            );
        }
    }
    Ok(())
}

fn print_keys(keys: &[Value]) {
    outln!("{:<10} {:<26} CURRENT", "PREFIX", "CREATED");
    for k in keys {
        let created = k["created_ms"].as_i64().unwrap_or(0);
        let when = time::OffsetDateTime::from_unix_timestamp(created / 1000)
            .ok()
            .and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok())
            .unwrap_or_default();
        outln!(
            "{:<10} {:<26} {}",
            k["prefix"].as_str().unwrap_or_default(),
            when,
            if k["current"] == true { "*" } else { "" }
        );
    }
}

fn print_deployment(d: &Value) {
    let nfs: Vec<String> = d["nfs"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|n| {
                    format!(
                        "{}={}@{}",
                        n["name"].as_str().unwrap_or(""),
                        n["module_name"].as_str().unwrap_or(""),
                        n["version"].as_str().unwrap_or("")
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    outln!(
        "{} ({}) rev {} group {}: {}{}  [{}]",
        d["name"].as_str().unwrap_or_default(),
        d["id"].as_str().unwrap_or_default(),
        d["revision"],
        d["group"].as_str().unwrap_or_default(),
        d["status"].as_str().unwrap_or_default(),
        d["reason"].as_str().map(|r| format!(" ({r})")).unwrap_or_default(),
        nfs.join(" -> ")
    );
    let attachments: Vec<&str> = d["attachments"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    if !attachments.is_empty() {
        outln!("  traffic {}", attachments.join("; "));
    }
    for h in d["hosts"].as_array().into_iter().flatten() {
        outln!(
            "  host {:<16} {:<8} rev {} {:>10} packets{}",
            h["host"].as_str().unwrap_or_default(),
            h["state"].as_str().unwrap_or_default(),
            h["revision"],
            h["packets"].to_string(),
            h["reason"].as_str().map(|r| format!("  {r}")).unwrap_or_default()
        );
    }
}

fn num(v: &Value) -> f64 {
    v.as_f64().unwrap_or(0.0)
}

fn print_usage(u: &Value) {
    let rows = u["rows"].as_array().cloned().unwrap_or_default();
    if rows.is_empty() {
        outln!("no usage in this range");
        return;
    }
    let max = rows.iter().map(|r| num(&r["packets"])).fold(0.0, f64::max);
    outln!(
        "{:<14} {:<12} {:<10} {:>12} {:>12} {:>12} {:>10} {:>10} {:>8} {:>14} {:>10} {:>10} {:>10} {:>10} {:>6}  packets",
        "deployment",
        "nf",
        "version",
        "invocations",
        "packets",
        "forwarded",
        "dropped",
        "rewritten",
        "policy",
        "bytes",
        "cpu ms",
        "state ops",
        "state GB-h",
        "state now",
        "traps"
    );
    let line = |r: &Value, deployment: &str, nf: &str, version: &str| {
        format!(
            "{:<14} {:<12} {:<10} {:>12} {:>12} {:>12} {:>10} {:>10} {:>8} {:>14} {:>10.3} {:>10} {:>10.4} {:>10} {:>6}",
            deployment,
            nf,
            version,
            r["invocations"].to_string(),
            r["packets"].to_string(),
            r["forwarded"].to_string(),
            r["dropped"].to_string(),
            r["rewritten"].to_string(),
            r["policy"].to_string(),
            r["bytes"].to_string(),
            num(&r["cpu_ns"]) / 1e6,
            r["state_ops"].to_string(),
            num(&r["state_gb_hours"]),
            format!("{}B", human(num(&r["state_bytes"]))),
            r["traps"].to_string(),
        )
    };
    for r in &rows {
        let l = line(
            r,
            r["deployment_name"].as_str().unwrap_or_default(),
            r["nf"].as_str().unwrap_or_default(),
            r["version"].as_str().unwrap_or_default(),
        );
        outln!("{l}  {}", bar(num(&r["packets"]), max, 24));
    }
    outln!("{}", line(&u["total"], "total", "", ""));
}

fn print_bill(b: &Value) {
    let cur = b["currency"].as_str().unwrap_or_default();
    outln!(
        "bill for {} ({}), {}",
        b["tenant_name"].as_str().unwrap_or_default(),
        b["tenant"].as_str().unwrap_or_default(),
        b["period"].as_str().unwrap_or_default()
    );
    outln!(
        "{:<12} {:>14} {:>12} {:>14} {:>10} {:>10}  {:<20} share of the bill",
        "item",
        "used",
        "included",
        "billable",
        "price",
        "amount",
        "unit"
    );
    let top = b["lines"].as_array().into_iter().flatten().map(|l| num(&l["amount_minor"])).fold(0.0, f64::max);
    for l in b["lines"].as_array().into_iter().flatten() {
        let q = num(&l["quantity"]);
        let inc = num(&l["included"]);
        outln!(
            "{:<12} {:>14.6} {:>12.6} {:>14.6} {:>10} {:>10}  {:<20} {}",
            l["item"].as_str().unwrap_or_default(),
            q,
            inc,
            num(&l["billable"]),
            l["unit_price"].as_str().unwrap_or_default(),
            l["amount"].as_str().unwrap_or_default(),
            l["unit"].as_str().unwrap_or_default(),
            bar(num(&l["amount_minor"]), top, 20)
        );
    }
    outln!("{:<12} {:>74} {cur}", "total", b["total"].as_str().unwrap_or_default());
    let packets: f64 = b["usage"].as_array().into_iter().flatten().map(|r| num(&r["packets"])).sum();
    outln!(
        "({} packets billed across {} NF version(s))",
        human(packets),
        b["usage"].as_array().map(Vec::len).unwrap_or(0)
    );
}

fn groups(admin: &Client, command: GroupsCommand, output: Output) -> anyhow::Result<()> {
    let print = |v: &Value| -> anyhow::Result<()> {
        outln!("{}", serde_json::to_string_pretty(v)?);
        Ok(())
    };
    match command {
        GroupsCommand::List => {
            let gs: Vec<Value> = admin.get("/v1/groups")?;
            if output == Output::Json {
                return print(&Value::Array(gs));
            }
            if gs.is_empty() {
                outln!("no groups yet: register hosts with `sluice host add`");
            }
            for g in &gs {
                print_group(g);
            }
        }
        GroupsCommand::Show { group } => {
            let g: Value = admin.get(&format!("/v1/groups/{}", encode(&group)))?;
            if output == Output::Json {
                return print(&g);
            }
            print_group(&g);
        }
        GroupsCommand::Set { group, min_hosts, max_hosts, no_max, target_load, no_target } => {
            let mut body = serde_json::Map::new();
            if let Some(m) = min_hosts {
                body.insert("min_hosts".into(), json!(m));
            }
            if no_max {
                body.insert("max_hosts".into(), Value::Null);
            } else if let Some(m) = max_hosts {
                body.insert("max_hosts".into(), json!(m));
            }
            if no_target {
                body.insert("target_load".into(), Value::Null);
            } else if let Some(t) = target_load {
                body.insert("target_load".into(), json!(t));
            }
            let s: Value = admin.put(&format!("/v1/groups/{}/settings", encode(&group)), &Value::Object(body))?;
            if output == Output::Json {
                return print(&s);
            }
            outln!("group {group}: {}", settings_line(&s));
        }
        GroupsCommand::AddCapacity { group, hosts } => {
            let s: Value =
                admin.post(&format!("/v1/groups/{}/capacity", encode(&group)), &json!({ "hosts": hosts }))?;
            if output == Output::Json {
                return print(&s);
            }
            outln!("group {group}: {}", settings_line(&s));
        }
        GroupsCommand::Drain { group, host, undo } => {
            let path = format!("/v1/groups/{}/hosts/{}/drain", encode(&group), encode(&host));
            if undo {
                admin.delete(&path)?;
                outln!("host {host} of group {group} may own flows again");
            } else {
                admin.post_empty(&path)?;
                outln!("host {host} of group {group} is draining: the next table gives its flows to their next owners");
            }
        }
    }
    Ok(())
}

fn settings_line(s: &Value) -> String {
    let max = s["max_hosts"].as_u64().map_or("no limit".to_string(), |m| m.to_string());
    let target = s["target_load"].as_f64().map_or("off (every host active)".to_string(), |t| format!("{t}"));
    format!("min-hosts {}, max-hosts {max}, target-load {target}", s["min_hosts"])
}

fn print_group(g: &Value) {
    outln!(
        "group {}  table v{}  active {}/proposed {}  demand {} pps  load {} pps  capacity {} pps  ({})",
        g["group"].as_str().unwrap_or_default(),
        g["table_version"],
        g["active_hosts"],
        g["proposed_hosts"],
        g["demand_pps"],
        g["load_pps"],
        g["capacity_pps"],
        settings_line(&g["settings"])
    );
    outln!(
        "  {:<20} {:<9} {:>12} {:>12} {:>7} {:>9} {:>6}",
        "HOST",
        "STATE",
        "CAPACITY",
        "LOAD",
        "SHARE",
        "SEEN(ms)",
        "TABLE"
    );
    for m in g["members"].as_array().into_iter().flatten() {
        outln!(
            "  {:<20} {:<9} {:>12} {:>12} {:>6.1}% {:>9} {:>6}",
            m["host"].as_str().unwrap_or_default(),
            m["state"].as_str().unwrap_or_default(),
            m["capacity_pps"].as_u64().unwrap_or(0),
            m["load_pps"].as_u64().unwrap_or(0),
            m["share"].as_f64().unwrap_or(0.0) * 100.0,
            m["last_seen_ms_ago"].as_u64().map_or("-".to_string(), |v| v.to_string()),
            m["table_version"].as_u64().map_or("-".to_string(), |v| format!("v{v}")),
        );
    }
}

/// Prints one line of `GET /v1/logs`; a closed pipe ends the command
/// quietly.
fn print_log_line(l: &Value, output: Output) -> anyhow::Result<()> {
    use std::io::Write as _;
    let s = |k: &str| l[k].as_str().unwrap_or_default();
    let text = match output {
        Output::Json => l.to_string(),
        Output::Table => {
            let what = if s("kind") == "trap" {
                let extra: Vec<String> = l["fields"]
                    .as_object()
                    .map(|o| o.iter().map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default())).collect())
                    .unwrap_or_default();
                format!("TRAP ({}): {} {}", s("cause"), s("message"), extra.join(" "))
            } else {
                format!("[{}] {}", s("source"), s("message"))
            };
            let deployment = if s("deployment_name").is_empty() { s("deployment") } else { s("deployment_name") };
            format!(
                "{} {:<5} {}/{}@{} {}  {}",
                s("time"),
                s("level"),
                deployment,
                s("nf"),
                s("version"),
                s("host"),
                what
            )
        }
    };
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{text}") {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        r => Ok(r?),
    }
}
