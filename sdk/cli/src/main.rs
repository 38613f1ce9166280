//! `sluice`: the developer and tenant CLI.

// Gateway answers are read as `serde_json::Value`, whose `Index<&str>`
// yields `Null` for a missing key instead of panicking; writes go through
// `as_object_mut`.
#![allow(clippy::indexing_slicing)]

use anyhow::{Context, Result};
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
    /// The Sluice checkout holding wit/ and sdk/ (default: the one this
    /// tool was built from).
    #[arg(long, global = true, env = "SLUICE_SDK_ROOT")]
    sdk_root: Option<PathBuf>,
    /// Gateway URL.
    #[arg(long, global = true, env = "SLUICE_URL", default_value = "http://127.0.0.1:8080")]
    url: String,
    /// Tenant API key (tenant commands).
    #[arg(long, global = true, env = "SLUICE_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Admin token (`tenant` commands).
    #[arg(long, global = true, env = "SLUICE_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Network function projects, and modules on the gateway.
    #[command(subcommand)]
    Nf(NfCommand),
    /// Run a gateway and one pcap-fed host in this process (in-process
    /// bus, SQLite under --data). Drop captures into the spool directory to
    /// send them through every deployment. Stops on Ctrl-C or SIGTERM.
    Dev {
        /// HTTP listen address.
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: String,
        /// Data directory.
        #[arg(long, default_value = "sluice-dev")]
        data: PathBuf,
        /// Spool directory (default: <data>/spool).
        #[arg(long)]
        spool: Option<PathBuf>,
        /// Meter window, ms.
        #[arg(long, default_value_t = 1000)]
        window_ms: u64,
        /// Gateway config file (price plan, upload limit).
        #[arg(long)]
        config: Option<PathBuf>,
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
        /// Output format.
        #[arg(long, value_enum, default_value = "table", global = true)]
        output: Output,
    },
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
        /// Output format (json: one line object per line of output).
        #[arg(long, value_enum, default_value = "table")]
        output: Output,
    },
    /// Usage by deployment, NF and version.
    Usage {
        /// Start: RFC 3339 or ms since the epoch (default: everything).
        #[arg(long)]
        from: Option<String>,
        /// End (exclusive).
        #[arg(long)]
        to: Option<String>,
        /// Print the JSON answer.
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
        /// Print the JSON answer.
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

fn run() -> Result<()> {
    let cli = Cli::parse();
    let tenant = || Client::new(&cli.url, cli.api_key.clone());
    let admin = || Client::new(&cli.url, cli.admin_token.clone());
    match cli.command {
        Command::Dev { listen, data, spool, window_ms, config } => {
            sluice_telemetry::init_logs("warn")?;
            let opts = sluice_cli::dev::DevOptions {
                listen,
                data_dir: data,
                spool,
                admin_token: cli.admin_token.clone(),
                window: std::time::Duration::from_millis(window_ms.max(10)),
                config,
            };
            let rt = tokio::runtime::Runtime::new()?;
            // The signal handlers are installed inside the runtime.
            let _in_runtime = rt.enter();
            rt.block_on(sluice_cli::dev::run(
                opts,
                |url, _token, spool| {
                    println!("sluice dev: gateway {url} (dashboard {url}/dashboard, API docs {url}/docs)");
                    println!("sluice dev: one host in group 'default'; drop captures into {}", spool.display());
                    println!("sluice dev: admin token in $SLUICE_ADMIN_TOKEN or the data directory's admin-token file");
                },
                sluice_control::shutdown_signal(),
            ))?;
        }
        Command::Tenant(TenantCommand::Create { name, groups, key_only }) => {
            let mut body = json!({ "name": name });
            if let Some(g) = groups {
                body["groups"] = json!(g);
            }
            let t: Value = admin().post("/v1/tenants", &body)?;
            let key = t["api_key"].as_str().unwrap_or_default();
            if key_only {
                println!("{key}");
            } else {
                println!(
                    "tenant {} ({})",
                    t["name"].as_str().unwrap_or_default(),
                    t["id"].as_str().unwrap_or_default()
                );
                println!("API key (shown once): {key}");
                println!("  export SLUICE_API_KEY={key}");
            }
        }
        Command::Tenant(TenantCommand::List) => {
            let ts: Vec<Value> = admin().get("/v1/tenants")?;
            for t in ts {
                println!("{:<16} {}", t["id"].as_str().unwrap_or_default(), t["name"].as_str().unwrap_or_default());
            }
        }
        Command::Tenant(TenantCommand::Key { tenant }) => {
            let k: Value = admin().post(&format!("/v1/tenants/{}/keys", encode(&tenant)), &json!({}))?;
            println!("{}", k["api_key"].as_str().unwrap_or_default());
        }
        Command::Tenant(TenantCommand::Keys { tenant }) => {
            let keys: Vec<Value> = admin().get(&format!("/v1/tenants/{}/keys", encode(&tenant)))?;
            print_keys(&keys);
        }
        Command::Tenant(TenantCommand::Revoke { tenant, prefix }) => {
            admin().delete(&format!("/v1/tenants/{}/keys/{}", encode(&tenant), encode(&prefix)))?;
            println!("revoked {prefix}");
        }
        Command::Tenant(TenantCommand::Grant { tenant, groups }) => {
            let g: Value =
                admin().put(&format!("/v1/tenants/{}/groups", encode(&tenant)), &json!({ "groups": groups }))?;
            println!("{tenant} may deploy to: {}", g["groups"]);
        }
        Command::Host(HostCommand::Add { id, group, nkey, dispatcher }) => {
            let role = if dispatcher { "dispatcher" } else { "host" };
            let h: Value =
                admin().post("/v1/hosts", &json!({ "id": id, "group": group, "nkey": nkey, "role": role }))?;
            println!(
                "{role} {} registered in group {}",
                h["host"].as_str().unwrap_or_default(),
                h["group"].as_str().unwrap_or_default()
            );
        }
        Command::Host(HostCommand::List) => {
            let hs: Vec<Value> = admin().get("/v1/hosts")?;
            println!("{:<20} {:<16} {:<6} {:>11}", "HOST", "GROUP", "ALIVE", "DEPLOYMENTS");
            for h in hs {
                println!(
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
            println!("host {id} removed");
        }
        Command::Groups { command, output } => groups(&admin(), command.unwrap_or(GroupsCommand::List), output)?,
        Command::Key(KeyCommand::List) => {
            let keys: Vec<Value> = tenant().get("/v1/me/keys")?;
            print_keys(&keys);
        }
        Command::Key(KeyCommand::Add) => {
            let k: Value = tenant().post("/v1/me/keys", &json!({}))?;
            println!("{}", k["api_key"].as_str().unwrap_or_default());
        }
        Command::Key(KeyCommand::Rotate) => {
            let k: Value = tenant().post("/v1/me/keys/rotate", &json!({}))?;
            let key = k["api_key"].as_str().unwrap_or_default();
            println!("new API key (shown once; the old one no longer works): {key}");
            println!("  export SLUICE_API_KEY={key}");
        }
        Command::Key(KeyCommand::Revoke { prefix }) => {
            tenant().delete(&format!("/v1/me/keys/{}", encode(&prefix)))?;
            println!("revoked {prefix}");
        }
        Command::Nf(NfCommand::Upload { file, name, version }) => {
            let name = name
                .or_else(|| file.file_stem().and_then(|s| s.to_str()).map(str::to_string))
                .context("give --name")?;
            let bytes = std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
            let path = format!("/v1/modules?name={}&version={}", encode(&name), encode(&version));
            let m: Value = tenant().post_bytes(&path, "application/wasm", &bytes)?;
            println!(
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
            let ms: Vec<Value> = tenant().get("/v1/modules")?;
            println!("{:<16} {:<20} {:<10} {:>10}  {:<14} deployed in", "id", "name", "version", "bytes", "digest");
            for m in ms {
                println!(
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
            println!("deleted {module}");
        }
        Command::Deploy { name, modules, config_files, spec, group, attach, limits, wait } => {
            let limits = limits.to_json();
            if spec.is_some() && !limits.is_empty() {
                anyhow::bail!("with --spec, give the limits per NF in the spec (\"limits\": {{...}})");
            }
            // Attachments are checked here first, so a typo fails before
            // anything is sent.
            let attach = attach
                .iter()
                .map(|a| a.parse::<sluice_engine::Attachment>().map(|a| Value::String(a.to_string())))
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
            let path = format!("/v1/deployments/{}", encode(&name));
            let d: Value = match client.get::<Value>(&path) {
                Ok(_) => client.put(&path, &body)?,
                Err(sluice_cli::client::ClientError::Api { status: 404, .. }) => {
                    client.post("/v1/deployments", &body)?
                }
                Err(e) => return Err(e.into()),
            };
            println!(
                "deployment {} ({}) revision {} on group {}",
                d["name"].as_str().unwrap_or_default(),
                d["id"].as_str().unwrap_or_default(),
                d["revision"],
                d["group"].as_str().unwrap_or_default()
            );
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(wait);
            let mut last = d;
            while wait > 0 && std::time::Instant::now() < deadline {
                last = client.get(&path)?;
                match last["status"].as_str() {
                    Some("running") | Some("failed") => break,
                    _ => std::thread::sleep(std::time::Duration::from_millis(200)),
                }
            }
            print_deployment(&last);
            if last["status"] == "failed" {
                anyhow::bail!("deployment {name} failed: {}", last["reason"].as_str().unwrap_or("see the hosts above"));
            }
        }
        Command::Deployments => {
            let ds: Vec<Value> = tenant().get("/v1/deployments")?;
            if ds.is_empty() {
                println!("no deployments");
            }
            for d in ds {
                print_deployment(&d);
            }
        }
        Command::Undeploy { name } => {
            tenant().delete(&format!("/v1/deployments/{}", encode(&name)))?;
            println!("deleted deployment {name}");
        }
        Command::Events { deployment, kind, limit } => {
            let mut q = vec![format!("limit={limit}")];
            if let Some(d) = deployment {
                q.push(format!("deployment={}", encode(&d)));
            }
            if let Some(k) = kind {
                q.push(format!("kind={}", encode(&k)));
            }
            let evs: Vec<Value> = tenant().get(&format!("/v1/events?{}", q.join("&")))?;
            if evs.is_empty() {
                println!("no events");
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
                println!(
                    "{:<6} {:<16} {}@{} {}  {}  {}",
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
        Command::Logs { deployment, nf, level, since, limit, follow, output } => {
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
            if json {
                println!("{}", serde_json::to_string_pretty(&u)?);
            } else {
                print_usage(&u);
            }
        }
        Command::Bill { period, csv, json } => {
            let path = format!("/v1/bill?period={}&format={}", encode(&period), if csv { "csv" } else { "json" });
            if csv {
                print!("{}", tenant().get_text(&path)?);
            } else {
                let b: Value = tenant().get(&path)?;
                if json {
                    println!("{}", serde_json::to_string_pretty(&b)?);
                } else {
                    print_bill(&b);
                }
            }
        }
        Command::Nf(NfCommand::New { name, lang, template, dir }) => {
            let sdk = Sdk::locate(cli.sdk_root.as_deref())?;
            let template: Template = template.parse()?;
            let project = sluice_cli::new_project(&sdk, &dir, &name, lang, template)?;
            println!("created {} ({lang}); next:", project.display());
            println!("  cd {} && sluice nf build", project.display());
        }
        Command::Nf(NfCommand::Build { project, cargo_target_dir }) => {
            let sdk = Sdk::locate(cli.sdk_root.as_deref())?;
            let project = Project::open(&project)?;
            eprintln!("building {} ({}) ...", project.manifest.name, project.manifest.lang);
            let built = sluice_cli::build(&project, &sdk, &BuildOptions { cargo_target_dir, cache_dir: None })
                .with_context(|| format!("building {}", project.dir.display()))?;
            println!(
                "{}: {} bytes, sluice:nf@{}, sha256 {} (built in {:.1} s)",
                built.path.display(),
                built.size,
                built.contract,
                built.digest,
                built.build_time.as_secs_f64()
            );
        }
        Command::Nf(NfCommand::Check { component }) => {
            let name = component.file_stem().and_then(|s| s.to_str()).unwrap_or("nf").to_string();
            let checked = sluice_cli::check::check_file(&component, &name, None)?;
            println!(
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
    println!("{:<10} {:<26} CURRENT", "PREFIX", "CREATED");
    for k in keys {
        let created = k["created_ms"].as_i64().unwrap_or(0);
        let when = time::OffsetDateTime::from_unix_timestamp(created / 1000)
            .ok()
            .and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok())
            .unwrap_or_default();
        println!(
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
    println!(
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
        println!("  traffic {}", attachments.join("; "));
    }
    for h in d["hosts"].as_array().into_iter().flatten() {
        println!(
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
        println!("no usage in this range");
        return;
    }
    let max = rows.iter().map(|r| num(&r["packets"])).fold(0.0, f64::max);
    println!(
        "{:<14} {:<12} {:<10} {:>12} {:>12} {:>14} {:>10} {:>10} {:>10} {:>10} {:>6}  packets",
        "deployment",
        "nf",
        "version",
        "invocations",
        "packets",
        "bytes",
        "cpu ms",
        "state ops",
        "state GB-h",
        "state now",
        "traps"
    );
    for r in &rows {
        println!(
            "{:<14} {:<12} {:<10} {:>12} {:>12} {:>14} {:>10.3} {:>10} {:>10.4} {:>10} {:>6}  {}",
            r["deployment_name"].as_str().unwrap_or_default(),
            r["nf"].as_str().unwrap_or_default(),
            r["version"].as_str().unwrap_or_default(),
            r["invocations"].to_string(),
            r["packets"].to_string(),
            r["bytes"].to_string(),
            num(&r["cpu_ns"]) / 1e6,
            r["state_ops"].to_string(),
            num(&r["state_gb_hours"]),
            format!("{}B", human(num(&r["state_bytes"]))),
            r["traps"].to_string(),
            bar(num(&r["packets"]), max, 24)
        );
    }
    let t = &u["total"];
    println!(
        "{:<14} {:<12} {:<10} {:>12} {:>12} {:>14} {:>10.3} {:>10} {:>10.4} {:>10} {:>6}",
        "total",
        "",
        "",
        t["invocations"].to_string(),
        t["packets"].to_string(),
        t["bytes"].to_string(),
        num(&t["cpu_ns"]) / 1e6,
        t["state_ops"].to_string(),
        num(&t["state_gb_hours"]),
        format!("{}B", human(num(&t["state_bytes"]))),
        t["traps"].to_string()
    );
}

fn print_bill(b: &Value) {
    let cur = b["currency"].as_str().unwrap_or_default();
    println!(
        "bill for {} ({}), {}",
        b["tenant_name"].as_str().unwrap_or_default(),
        b["tenant"].as_str().unwrap_or_default(),
        b["period"].as_str().unwrap_or_default()
    );
    println!(
        "{:<12} {:>14} {:>12} {:>14} {:>10} {:>10}  {:<20} share of the bill",
        "item", "used", "included", "billable", "price", "amount", "unit"
    );
    let top = b["lines"].as_array().into_iter().flatten().map(|l| num(&l["amount"])).fold(0.0, f64::max);
    for l in b["lines"].as_array().into_iter().flatten() {
        let q = num(&l["quantity"]);
        let inc = num(&l["included"]);
        println!(
            "{:<12} {:>14.6} {:>12.6} {:>14.6} {:>10} {:>10.2}  {:<20} {}",
            l["item"].as_str().unwrap_or_default(),
            q,
            inc,
            num(&l["billable"]),
            l["unit_price"].to_string(),
            num(&l["amount"]),
            l["unit"].as_str().unwrap_or_default(),
            bar(num(&l["amount"]), top, 20)
        );
    }
    println!("{:<12} {:>74.2} {cur}", "total", num(&b["total"]));
    let packets: f64 = b["usage"].as_array().into_iter().flatten().map(|r| num(&r["packets"])).sum();
    println!(
        "({} packets billed across {} NF version(s))",
        human(packets),
        b["usage"].as_array().map(Vec::len).unwrap_or(0)
    );
}

fn groups(admin: &Client, command: GroupsCommand, output: Output) -> anyhow::Result<()> {
    let print = |v: &Value| -> anyhow::Result<()> {
        println!("{}", serde_json::to_string_pretty(v)?);
        Ok(())
    };
    match command {
        GroupsCommand::List => {
            let gs: Vec<Value> = admin.get("/v1/groups")?;
            if output == Output::Json {
                return print(&Value::Array(gs));
            }
            if gs.is_empty() {
                println!("no groups yet: register hosts with `sluice host add`");
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
            println!("group {group}: {}", settings_line(&s));
        }
        GroupsCommand::AddCapacity { group, hosts } => {
            let s: Value =
                admin.post(&format!("/v1/groups/{}/capacity", encode(&group)), &json!({ "hosts": hosts }))?;
            if output == Output::Json {
                return print(&s);
            }
            println!("group {group}: {}", settings_line(&s));
        }
        GroupsCommand::Drain { group, host, undo } => {
            let path = format!("/v1/groups/{}/hosts/{}/drain", encode(&group), encode(&host));
            if undo {
                admin.delete(&path)?;
                println!("host {host} of group {group} may own flows again");
            } else {
                admin.post_empty(&path)?;
                println!(
                    "host {host} of group {group} is draining: the next table gives its flows to their next owners"
                );
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
    println!(
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
    println!(
        "  {:<20} {:<9} {:>12} {:>12} {:>7} {:>9} {:>6}",
        "HOST", "STATE", "CAPACITY", "LOAD", "SHARE", "SEEN(ms)", "TABLE"
    );
    for m in g["members"].as_array().into_iter().flatten() {
        println!(
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
