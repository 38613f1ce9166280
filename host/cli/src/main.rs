//! `sluice-host`: run WebAssembly network functions over packet batches.

use anyhow::Context;
use clap::{Parser, Subcommand};
use sluice_host::{HostConfig, RunError, RunOptions};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "sluice-host", version, about = "Run sandboxed WebAssembly network functions over packet batches")]
struct Cli {
    /// Host configuration (TOML); SLUICE_* variables override it.
    #[arg(long, global = true, env = "SLUICE_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

/// Where the cluster's NATS is and who this process is on it.
#[derive(clap::Args)]
struct BusArgs {
    /// NATS server URL(s), comma-separated.
    #[arg(long, env = "SLUICE_NATS_URL", default_value = "nats://127.0.0.1:4222")]
    nats: String,
    /// Cluster name (prefix of every subject, stream and bucket).
    #[arg(long, env = "SLUICE_CLUSTER", default_value = "default")]
    cluster: String,
    /// Host group: the one a host serves, or a dispatcher steers.
    #[arg(long, env = "SLUICE_GROUP", default_value = "default")]
    group: String,
    /// NATS nkey seed file (`sluice-host keygen` writes one; the operator
    /// registers its public key with the gateway).
    #[arg(long, env = "SLUICE_NATS_NKEY")]
    nats_nkey: Option<PathBuf>,
    /// A NATS credentials (JWT) file, instead of --nats-nkey.
    #[arg(long, env = "SLUICE_NATS_CREDS", conflicts_with = "nats_nkey")]
    nats_creds: Option<PathBuf>,
    /// CA certificate the NATS servers' certificates chain to (requires TLS).
    #[arg(long, env = "SLUICE_NATS_CA")]
    nats_ca: Option<PathBuf>,
    /// Client certificate for mutual TLS with NATS.
    #[arg(long, env = "SLUICE_NATS_CERT", requires = "nats_key")]
    nats_cert: Option<PathBuf>,
    /// Its private key.
    #[arg(long, env = "SLUICE_NATS_KEY", requires = "nats_cert")]
    nats_key: Option<PathBuf>,
}

impl BusArgs {
    fn auth(&self) -> sluice_control::NatsAuth {
        sluice_control::NatsAuth {
            nkey_file: self.nats_nkey.clone(),
            creds_file: self.nats_creds.clone(),
            ca_file: self.nats_ca.clone(),
            cert_file: self.nats_cert.clone(),
            key_file: self.nats_key.clone(),
        }
    }
}

// Parsed once per process: the size of its largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Process a capture through one NF or a linear chain of NFs.
    ///
    /// Each NF is loaded and compiled once, instantiated once per worker,
    /// and called once per batch. Forwarded packets go to --out; a summary
    /// is printed and --report writes the per-NF meters as JSON.
    Run {
        /// NF components, comma-separated or repeated; with several, they
        /// form a linear chain in the given order.
        #[arg(long = "nf", value_delimiter = ',', required_unless_present = "chain", conflicts_with = "chain")]
        nfs: Vec<PathBuf>,
        /// A chain file: NFs and where each sends its packets (branches by
        /// label, joins); the format is under "Chain files" in README.md
        /// (share/doc/sluice/ in a release), an example in
        /// deploy/local/demo-chain.toml.
        #[arg(long)]
        chain: Option<PathBuf>,
        /// Hot-swap an NF to another version before a given packet:
        /// `<nf>=<module.wasm>@<packet index>` (repeatable). Flow state is
        /// kept; an incompatible version is refused and the old one runs on.
        #[arg(long = "swap")]
        swaps: Vec<sluice_host::run::SwapAt>,
        /// Ingress ports on the outside (pcapng interface ids) (`--outside-ports 1`): their
        /// packets, replies to connections opened from the inside, run the
        /// chain last NF first, so a firewall listed before a NAT sees
        /// inside addresses both ways. Linear chains only. Overrides
        /// `outside_ports` of the config.
        #[arg(long, value_delimiter = ',')]
        outside_ports: Vec<u16>,
        /// What the NFs see of fragmented IP datagrams: `follow` (the first
        /// fragment; the later ones follow its verdict and rewrites) or
        /// `reassemble` (whole datagrams, held until complete and cut again
        /// as they came on the way out). Overrides `fragments` of the config.
        #[arg(long)]
        fragments: Option<sluice_runtime::fragments::FragmentMode>,
        /// How packets spread over the workers: `flow` (by connection) or
        /// `addresses` (every connection between two hosts on one worker,
        /// so state an NF keys by an address meets its writes there).
        /// Overrides `spread` of the config.
        #[arg(long)]
        spread: Option<sluice_traffic::Spread>,
        /// Input capture (pcap or pcapng, Ethernet).
        #[arg(long = "in")]
        input: PathBuf,
        /// Output capture for forwarded packets (pcap).
        #[arg(long = "out")]
        output: Option<PathBuf>,
        /// Write a JSON report here.
        #[arg(long)]
        report: Option<PathBuf>,
        /// Packets per batch (one NF call per batch).
        #[arg(long)]
        batch: Option<usize>,
        /// Worker threads; flows are pinned to workers by a symmetric hash.
        #[arg(long)]
        workers: Option<usize>,
        /// Cores the workers run on, as in taskset ("0-3,6"): worker i on
        /// the i-th core; with more workers than cores they share cores
        /// round-robin (slower, but deadlines count CPU time, so no NF traps
        /// for it). Default: every core the process may use.
        #[arg(long, env = "SLUICE_CORES")]
        cores: Option<String>,
        /// Do not show a progress bar.
        #[arg(long)]
        quiet: bool,
    },
    /// Process packets from DPDK ports through one NF or a chain.
    ///
    /// EAL arguments follow `--`. Without NICs or hugepages (tests, a
    /// laptop): `-- --no-huge --no-pci -m 512 --vdev=net_pcap0,rx_pcap=in.pcap,tx_pcap=out.pcap`.
    /// Stops on SIGINT/SIGTERM, after --max-packets, or after --idle-exit-ms
    /// without traffic, and prints per-port and per-queue counters.
    #[cfg(feature = "dpdk")]
    Dpdk {
        /// NF components, comma-separated or repeated (a chain in order).
        #[arg(long = "nf", value_delimiter = ',', required_unless_present = "chain", conflicts_with = "chain")]
        nfs: Vec<PathBuf>,
        /// A chain file instead of --nf.
        #[arg(long)]
        chain: Option<PathBuf>,
        /// DPDK port ids to use (default: every port found).
        #[arg(long, value_delimiter = ',')]
        ports: Vec<u16>,
        /// Default output of a port is its pair (0<->1, 2<->3) instead of itself.
        #[arg(long)]
        pairs: bool,
        /// Ingress ports on the outside (`--outside-ports 1`): their
        /// packets, replies to connections opened from the inside, run the
        /// chain last NF first, so a firewall listed before a NAT sees
        /// inside addresses both ways. Linear chains only. Overrides
        /// `outside_ports` of the config.
        #[arg(long, value_delimiter = ',')]
        outside_ports: Vec<u16>,
        /// What the NFs see of fragmented IP datagrams: `follow` (the first
        /// fragment; the later ones follow its verdict and rewrites) or
        /// `reassemble` (whole datagrams, held until complete and cut again
        /// as they came on the way out). Overrides `fragments` of the config.
        #[arg(long)]
        fragments: Option<sluice_runtime::fragments::FragmentMode>,
        /// How packets spread over the workers: `flow` (by connection) or
        /// `addresses` (every connection between two hosts on one worker,
        /// so state an NF keys by an address meets its writes there).
        /// Overrides `spread` of the config.
        #[arg(long)]
        spread: Option<sluice_traffic::Spread>,
        /// Packets per batch (at most, per worker and port; up to 256).
        #[arg(long)]
        batch: Option<usize>,
        /// Worker threads = RX/TX queue pairs per port.
        #[arg(long)]
        workers: Option<usize>,
        /// Cores the workers run on ("0-3,6"). Default: the EAL's lcores
        /// (-l/--lcores), worker lcores first, then the main lcore; worker i
        /// takes the i-th, round-robin when there are more workers than
        /// cores (slower, but deadlines count CPU time, so no NF traps).
        #[arg(long, env = "SLUICE_CORES")]
        cores: Option<String>,
        /// Stop after this many received packets.
        #[arg(long)]
        max_packets: Option<u64>,
        /// Stop when no packet arrived for this long (ms).
        #[arg(long)]
        idle_exit_ms: Option<u64>,
        /// Mbufs in the packet pool.
        #[arg(long, default_value_t = 8191)]
        mbufs: u32,
        /// Bytes each packet buffer holds (after its headroom): the longest
        /// frame a port receives whole; a net_af_packet port's framesz must
        /// fit it. Overrides `mbuf_size` of the config (default 2048).
        #[arg(long)]
        mbuf_size: Option<u16>,
        /// RX/TX descriptors per queue.
        #[arg(long, default_value_t = 512)]
        descriptors: u16,
        /// Time each stage of every batch (receive, read, build, call,
        /// verdicts, deliver, transmit) with the CPU's time-stamp counter;
        /// the report's `stages` gives ns per packet in each.
        #[arg(long)]
        stage_times: bool,
        /// Write a JSON report here.
        #[arg(long)]
        report: Option<PathBuf>,
        /// EAL arguments.
        #[arg(last = true)]
        eal: Vec<String>,
    },
    /// The flowlet dispatcher of a host group: take the group's ingress
    /// traffic on DPDK ports and send each packet to the host that owns its
    /// flow in the group's flow-ownership table (read over NATS with the
    /// dispatcher's own identity, registered with `sluice host add
    /// --dispatcher`). A flow moves to a new owner only after it was idle
    /// for the flowlet gap, so its packets are never reordered; a flow
    /// whose host is gone moves at once. Runs no NF code. EAL arguments
    /// follow `--`; stops on SIGINT/SIGTERM, after --max-packets, or after
    /// --idle-exit-ms without traffic.
    #[cfg(feature = "dpdk")]
    Steer {
        #[command(flatten)]
        bus: BusArgs,
        /// Dispatcher id (as registered).
        #[arg(long, env = "SLUICE_HOST_ID", required_unless_present = "table")]
        id: Option<String>,
        /// Steer by this ownership table (JSON, as the gateway publishes
        /// it) instead of following the group's over NATS: a fixed split,
        /// for a dispatcher without a control plane.
        #[arg(long)]
        table: Option<PathBuf>,
        /// Ports the group's traffic arrives on.
        #[arg(long, value_delimiter = ',', default_value = "0")]
        ingress: Vec<u16>,
        /// Where a host's flows leave: `<host>=<port>` (a point-to-point
        /// link) or `<host>=<port>@<mac>` (the destination MAC is rewritten
        /// to the host's); repeat for every host of the group.
        #[arg(long = "to", required = true)]
        to: Vec<sluice_host::steer::Target>,
        /// Flowlet gap, µs: a flow may move to another host only after this
        /// long without packets (above the largest difference in delay
        /// between the paths to two hosts).
        #[arg(long, default_value_t = 2000)]
        flowlet_gap_us: u64,
        /// How long a flow's host is remembered without packets, ms.
        #[arg(long, default_value_t = 30_000)]
        remember_ms: u64,
        /// Flows tracked per worker (more are steered by the table alone).
        #[arg(long, default_value_t = 1 << 20)]
        max_flows: usize,
        /// How often the group's table is read, ms.
        #[arg(long, default_value_t = 100)]
        table_poll_ms: u64,
        /// A planned table change (a host joining or draining) is steered by
        /// this long after it is first seen, ms, so that the hosts (which
        /// read the table every 100 ms) hand the moving flows' state to
        /// their new owners first. A table that loses a host applies at once.
        #[arg(long, default_value_t = 300)]
        handover_ms: u64,
        /// How long to wait for the links towards the hosts to come up
        /// before taking traffic, ms.
        #[arg(long, default_value_t = 10_000)]
        link_wait_ms: u64,
        /// How long a burst towards a host whose port is full is retried
        /// before the rest is dropped, µs (backpressure from a slow host,
        /// bounded: it holds up the worker's other hosts meanwhile).
        #[arg(long, default_value_t = 100)]
        tx_retry_us: u64,
        /// An address whose TCP and UDP ports are a release pool split
        /// between the hosts (a NAT's public address): packets to it go to
        /// the host that owns the destination port's block, where the
        /// connection's binding is. Repeat for each address.
        #[arg(long = "pool-address")]
        pool_addresses: Vec<std::net::IpAddr>,
        /// Packets per burst (up to 256).
        #[arg(long)]
        batch: Option<usize>,
        /// Worker threads = RX/TX queue pairs per port.
        #[arg(long)]
        workers: Option<usize>,
        /// Cores the workers run on ("0-3,6"; default: the EAL's lcores).
        #[arg(long, env = "SLUICE_CORES")]
        cores: Option<String>,
        /// Stop after this many received packets.
        #[arg(long)]
        max_packets: Option<u64>,
        /// Stop when no packet arrived for this long (ms).
        #[arg(long)]
        idle_exit_ms: Option<u64>,
        /// Mbufs in the packet pool.
        #[arg(long, default_value_t = 8191)]
        mbufs: u32,
        /// RX/TX descriptors per queue.
        #[arg(long, default_value_t = 512)]
        descriptors: u16,
        /// Keep a JSON report here (updated while it runs).
        #[arg(long)]
        report: Option<PathBuf>,
        /// EAL arguments.
        #[arg(last = true)]
        eal: Vec<String>,
    },
    /// Join a cluster over NATS and run what the gateway deploys to this
    /// host's group.
    ///
    /// The host heartbeats its status, fetches modules by digest from the
    /// cluster's object store, and publishes meter records (per deployment,
    /// NF and version, every --window-ms) to the meter stream. Traffic comes
    /// from DPDK ports with --dpdk (EAL arguments after `--`): the host's
    /// workers run every deployment, and each packet goes to the one whose
    /// traffic attachment (port, VLAN, destination prefix) claims it;
    /// unclaimed packets follow --unmatched. For development, traffic comes
    /// from --in instead: a capture replayed into every deployment when it
    /// starts, or a spool directory whose captures go through every
    /// deployment (each attached deployment gets its share, others all).
    /// Stops on SIGINT/SIGTERM after flushing its meters.
    Serve {
        #[command(flatten)]
        bus: BusArgs,
        /// Host id, unique in the cluster (default: the machine's hostname).
        #[arg(long = "host-id", env = "SLUICE_HOST_ID")]
        host_id: Option<String>,
        /// Serve Prometheus `/metrics`, `/healthz` and `/readyz` on this
        /// address (e.g. `127.0.0.1:9464`; the metrics name every tenant
        /// on the host: keep it on the operator's network).
        #[arg(long, env = "SLUICE_METRICS_LISTEN")]
        metrics_listen: Option<std::net::SocketAddr>,
        /// Traffic: a capture file to replay, or a spool directory.
        #[arg(long = "in")]
        input: Option<PathBuf>,
        /// With a capture file: passes per deployment (0 = forever).
        #[arg(long = "loop", default_value_t = 1)]
        loops: u32,
        /// Replay at most this many packets per second per deployment.
        #[arg(long)]
        pps: Option<u64>,
        /// Meter window, ms (10-300000: the gateway refuses records whose
        /// window is longer than its `[meters] max-window-ms`, 10 min).
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(10..=300_000))]
        window_ms: u64,
        /// Heartbeat interval, ms (the gateway counts a host gone after its
        /// `host-silence-ms` without one).
        #[arg(long, default_value_t = 1000)]
        heartbeat_ms: u64,
        /// Packets per second this host can take: the weight of its share
        /// of its group's flows in the group's ownership table (default:
        /// the gateway's `group-default-capacity-pps`).
        #[arg(long, env = "SLUICE_CAPACITY_PPS", default_value_t = 0)]
        capacity_pps: u64,
        /// Module cache and meter outbox (default: ~/.local/state/sluice/<host-id>).
        #[arg(long, env = "SLUICE_STATE_DIR")]
        state_dir: Option<PathBuf>,
        /// Keep a JSON report of everything metered here (updated every second).
        #[arg(long)]
        report: Option<PathBuf>,
        /// Write each deployment's forwarded packets to <DIR>/<deployment-id>.pcap
        /// (appended across restarts; after a kill it holds exactly what was billed).
        #[arg(long = "out")]
        output: Option<PathBuf>,
        /// Packets per batch.
        #[arg(long)]
        batch: Option<usize>,
        /// Cores to run on ("0-3,6"). With --dpdk: worker i on the i-th
        /// (default: the EAL's lcores). Otherwise each deployment's thread is
        /// pinned to the core fewest others hold (default: every core the
        /// process may use).
        #[arg(long, env = "SLUICE_CORES")]
        cores: Option<String>,
        /// Take traffic from DPDK ports (EAL arguments after `--`), e.g.
        /// `-- --no-huge --no-pci -m 512 --vdev=net_af_packet0,iface=eth1`.
        #[arg(long, conflicts_with = "input")]
        dpdk: bool,
        /// With --dpdk: worker threads (= RX/TX queue pairs per port).
        #[arg(long, requires = "dpdk")]
        workers: Option<usize>,
        /// With --dpdk: port ids to use (default: every port found).
        #[arg(long, value_delimiter = ',', requires = "dpdk")]
        ports: Vec<u16>,
        /// With --dpdk: forwarded packets leave by the paired port (0<->1,
        /// 2<->3) unless an attachment names `out`.
        #[arg(long, requires = "dpdk")]
        pairs: bool,
        /// Packets no deployment's attachment claims: `drop` or `forward`.
        #[arg(long, env = "SLUICE_UNMATCHED", default_value = "drop")]
        unmatched: sluice_engine::Unmatched,
        /// With --dpdk: mbufs in the packet pool.
        #[arg(long, default_value_t = 8191, requires = "dpdk")]
        mbufs: u32,
        /// With --dpdk: bytes each packet buffer holds (after its headroom): the longest
        /// frame a port receives whole; a net_af_packet port's framesz must
        /// fit it. Overrides `mbuf_size` of the config (default 2048).
        #[arg(long, requires = "dpdk")]
        mbuf_size: Option<u16>,
        /// With --dpdk: RX/TX descriptors per queue.
        #[arg(long, default_value_t = 512, requires = "dpdk")]
        descriptors: u16,
        /// With --dpdk: how often, µs, each worker sends the state of the
        /// flows it touched to their next owners in the group (0: off).
        /// Keep it under half the dispatcher's --flowlet-gap-us.
        #[arg(long, env = "SLUICE_REPLICATE_US", default_value_t = 1000, requires = "dpdk")]
        replicate_us: u64,
        /// With --dpdk: MiB of replicas kept for the group's other hosts, at
        /// most (past it, new replicas are refused and counted).
        #[arg(long, env = "SLUICE_PEER_MAX_MB", default_value_t = 256, requires = "dpdk")]
        peer_max_mb: usize,
        /// With --dpdk: how long, µs, the packets of a flow the dispatcher
        /// moved here without its state wait while it is pulled from the
        /// host that had it (then they run without it: a state miss).
        #[arg(long, env = "SLUICE_PULL_WAIT_US", default_value_t = 5000, requires = "dpdk")]
        pull_wait_us: u64,
        /// EAL arguments (with --dpdk).
        #[arg(last = true)]
        eal: Vec<String>,
    },
    /// Write a new nkey seed (mode 0600) for this host's NATS identity and
    /// print its public key, to register with `POST /v1/hosts`.
    Keygen {
        /// Where to write the seed (never overwritten).
        #[arg(long)]
        out: PathBuf,
        /// Print the public key of an existing seed instead.
        #[arg(long)]
        show: bool,
    },
    /// Check that a module is a component fitting the sluice:nf world.
    Check {
        /// Modules to check.
        #[arg(required = true)]
        modules: Vec<PathBuf>,
    },
    /// Write a synthetic "office edge" trace (web, DNS, ping, scans,
    /// IPv6, a few damaged frames).
    Synth {
        /// Output pcap.
        #[arg(long)]
        out: PathBuf,
        /// Number of sessions (each a few packets).
        #[arg(long, default_value_t = 1000)]
        sessions: usize,
        /// PRNG seed: same seed, same trace.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// 802.1Q VLAN ids the sessions take in turn (0: untagged), e.g.
        /// `100,200,0` for two tenants' traffic and unclaimed traffic.
        #[arg(long, value_delimiter = ',')]
        vlans: Vec<u16>,
        /// Instead of sessions: the packets a text file describes, one per
        /// line (`0.0 tcp 10.0.0.5:40000 > 10.0.0.80:22 flags S repeat 500`;
        /// the format is in sdk/cli/README.md, under share/doc/sluice/ in a
        /// release).
        #[arg(long, value_name = "FILE", conflicts_with_all = ["sessions", "seed", "vlans"])]
        from: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let telemetry = match sluice_telemetry::start(telemetry_settings(&cli)) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(1);
        }
    };
    let prometheus = telemetry.prometheus();
    let code = match real_main(cli, prometheus) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    };
    // Whatever is buffered goes out before the process ends (SIGTERM
    // included: the commands return when it arrives).
    telemetry.shutdown();
    code
}

/// What each command reports and as whom: the long-running ones (`serve`,
/// `steer`, `dpdk`) export over OTLP when the `OTEL_*` variables ask;
/// `run` and the one-shot tools only log.
fn telemetry_settings(cli: &Cli) -> sluice_telemetry::Settings<'static> {
    let mut s = sluice_telemetry::Settings { log_default: "warn", ..Default::default() };
    match &cli.command {
        Command::Serve { bus, host_id, metrics_listen, .. } => {
            s.service = "sluice-host";
            s.prometheus = metrics_listen.is_some();
            let host = host_id.clone().unwrap_or_else(default_host_id);
            s.attributes = vec![
                ("sluice.cluster", bus.cluster.clone()),
                ("sluice.group", bus.group.clone()),
                ("host.name", host.clone()),
                ("service.instance.id", host),
            ];
        }
        #[cfg(feature = "dpdk")]
        Command::Steer { bus, id, .. } => {
            s.service = "sluice-steer";
            s.attributes = vec![("sluice.cluster", bus.cluster.clone()), ("sluice.group", bus.group.clone())];
            s.attributes.extend(id.clone().map(|id| ("service.instance.id", id)));
        }
        #[cfg(feature = "dpdk")]
        Command::Dpdk { .. } => s.service = "sluice-host",
        _ => {}
    }
    s
}

fn real_main(cli: Cli, prometheus: Option<sluice_telemetry::Prometheus>) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Run {
            nfs,
            chain,
            swaps,
            outside_ports,
            fragments,
            spread,
            input,
            output,
            report,
            batch,
            workers,
            cores,
            quiet,
        } => {
            let mut config = load_config(cli.config.as_deref(), batch, workers, cores)?;
            if !outside_ports.is_empty() {
                config.outside_ports = outside_ports;
            }
            if let Some(f) = fragments {
                config.fragments = f;
            }
            if let Some(s) = spread {
                config.spread = s;
            }
            let opts =
                RunOptions { nfs, chain, swaps, input, output, progress: !quiet && std::io::stderr().is_terminal() };
            finish(sluice_host::run(&config, &opts), sluice_host::Report::summary, report)
        }
        #[cfg(feature = "dpdk")]
        Command::Dpdk {
            nfs,
            chain,
            ports,
            pairs,
            outside_ports,
            fragments,
            spread,
            batch,
            workers,
            cores,
            max_packets,
            idle_exit_ms,
            mbufs,
            mbuf_size,
            descriptors,
            stage_times,
            report,
            eal,
        } => {
            let mut config = load_config(cli.config.as_deref(), batch, workers, cores)?;
            if !outside_ports.is_empty() {
                config.outside_ports = outside_ports;
            }
            if let Some(f) = fragments {
                config.fragments = f;
            }
            if let Some(s) = spread {
                config.spread = s;
            }
            if let Some(m) = mbuf_size {
                config.mbuf_size = m;
            }
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
                signal_hook::flag::register(sig, stop.clone()).context("installing the signal handler")?;
            }
            let opts = sluice_host::dpdk::DpdkOptions {
                nfs,
                chain,
                ports,
                pairs,
                eal_args: eal,
                max_packets,
                idle_exit: idle_exit_ms.map(std::time::Duration::from_millis),
                mbufs,
                descriptors,
                stage_times,
            };
            finish(sluice_host::dpdk::run_dpdk(&config, &opts, stop), sluice_host::dpdk::DpdkReport::summary, report)
        }
        #[cfg(feature = "dpdk")]
        Command::Steer {
            bus,
            id,
            table,
            ingress,
            to,
            flowlet_gap_us,
            remember_ms,
            max_flows,
            table_poll_ms,
            handover_ms,
            link_wait_ms,
            tx_retry_us,
            pool_addresses,
            batch,
            workers,
            cores,
            max_packets,
            idle_exit_ms,
            mbufs,
            descriptors,
            report,
            eal,
        } => {
            let config = load_config(cli.config.as_deref(), batch, workers, cores)?;
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
                signal_hook::flag::register(sig, stop.clone()).context("installing the signal handler")?;
            }
            let feed =
                std::sync::Arc::new(sluice_host::steer::RouteFeed::new(to.iter().map(|t| t.host.clone()).collect()));
            let auth = bus.auth();
            let BusArgs { nats, cluster, group, .. } = bus;
            // The table follower runs beside the workers, on its own thread.
            let rt = tokio::runtime::Runtime::new().context("starting the async runtime")?;
            let follower = if let Some(path) = &table {
                let text = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
                let t: sluice_control::OwnershipTable = serde_json::from_slice(&text)
                    .with_context(|| format!("{} is not an ownership table", path.display()))?;
                if t.version() == 0 {
                    anyhow::bail!("{}: a table's version starts at 1", path.display());
                }
                feed.set(&t);
                None
            } else {
                let id = id.clone().unwrap_or_default();
                let (feed, stop, group) = (feed.clone(), stop.clone(), group.clone());
                let role = sluice_control::Role::Dispatcher { id: id.clone() };
                let who = format!("sluice-host steer {id}");
                Some(rt.spawn(async move {
                    use sluice_control::Bus;
                    let bus = loop {
                        match sluice_control::NatsBus::connect(&nats, &cluster, &auth, role.clone(), &who).await {
                            Ok(b) => break b,
                            Err(e) if stop.load(std::sync::atomic::Ordering::Relaxed) => return Err(e.to_string()),
                            Err(e) => {
                                tracing::warn!("connecting to NATS: {e}; trying again");
                                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                            }
                        }
                    };
                    let poll = std::time::Duration::from_millis(table_poll_ms.max(10));
                    let handover = std::time::Duration::from_millis(handover_ms);
                    let mut tick = tokio::time::interval(std::time::Duration::from_millis(10));
                    let mut last_read: Option<std::time::Instant> = None;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        tick.tick().await;
                        let now = std::time::Instant::now();
                        if feed.apply_due(now, handover) {
                            tracing::info!(version = feed.version(), "steering by the new ownership table");
                        }
                        if last_read.is_some_and(|at| now.duration_since(at) < poll) {
                            continue;
                        }
                        last_read = Some(now);
                        match bus.ownership(&group).await {
                            Ok(Some(t)) => {
                                let (version, hosts) =
                                    (t.version(), t.members().iter().map(|m| m.host.clone()).collect::<Vec<_>>());
                                if feed.offer(t, std::time::Instant::now(), handover) {
                                    tracing::info!(version, ?hosts, "steering by the new ownership table");
                                }
                            }
                            Ok(None) => tracing::debug!(group, "no ownership table published yet"),
                            Err(e) => tracing::warn!(group, "reading the ownership table: {e}"),
                        }
                    }
                    Ok(())
                }))
            };
            let opts = sluice_host::steer::SteerOptions {
                ingress,
                to,
                gap: std::time::Duration::from_micros(flowlet_gap_us),
                remember: std::time::Duration::from_millis(remember_ms),
                max_flows,
                eal_args: eal,
                mbufs,
                descriptors,
                max_packets,
                idle_exit: idle_exit_ms.map(std::time::Duration::from_millis),
                report: report.clone(),
                link_wait: std::time::Duration::from_millis(link_wait_ms),
                tx_retry: std::time::Duration::from_micros(tx_retry_us),
                pool_addresses: pool_addresses.into_iter().map(sluice_wire::IpAddr128::from).collect(),
            };
            let result = sluice_host::steer::run_steer(&config, &opts, feed, stop.clone());
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            if let Some(f) = follower {
                f.abort();
            }
            finish(result, sluice_host::steer::SteerReport::summary, report)
        }
        Command::Serve {
            bus,
            host_id,
            metrics_listen,
            input,
            loops,
            pps,
            window_ms,
            heartbeat_ms,
            capacity_pps,
            state_dir,
            report,
            output,
            batch,
            cores,
            dpdk,
            workers,
            ports,
            pairs,
            unmatched,
            mbufs,
            mbuf_size,
            descriptors,
            replicate_us,
            peer_max_mb,
            pull_wait_us,
            eal,
        } => {
            let mut config = load_config(cli.config.as_deref(), batch, workers, cores)?;
            if let Some(m) = mbuf_size {
                config.mbuf_size = m;
            }
            if !dpdk && !eal.is_empty() {
                anyhow::bail!("EAL arguments after `--` need --dpdk");
            }
            let host = match host_id {
                Some(h) => h,
                None => default_host_id(),
            };
            let input = match input {
                None => sluice_agent::Input::None,
                Some(dir) if dir.is_dir() => sluice_agent::Input::Spool { dir },
                Some(path) => sluice_agent::Input::Replay { path, loops },
            };
            let state_dir = state_dir.unwrap_or_else(|| default_state_dir(&host));
            let auth = bus.auth();
            let BusArgs { nats, cluster, group, .. } = bus;
            let cfg = sluice_agent::AgentConfig {
                host: host.clone(),
                group,
                input,
                pps,
                window: std::time::Duration::from_millis(window_ms.max(10)),
                heartbeat: std::time::Duration::from_millis(heartbeat_ms.max(10)),
                capacity_pps,
                state_dir,
                report,
                output,
                runtime: config.serve_runtime(),
                batch_size: config.batch_size,
                limits: config.limits(""),
                nf_caps: config.serve_caps(),
                cores: config.worker_cores()?,
                peer: (dpdk && replicate_us > 0).then(|| sluice_agent::PeerConfig {
                    interval: std::time::Duration::from_micros(replicate_us),
                    max_bytes: peer_max_mb.saturating_mul(1 << 20),
                    pull_wait: std::time::Duration::from_micros(pull_wait_us),
                    ..Default::default()
                }),
                metrics_listen,
                prometheus,
            };
            let rt = tokio::runtime::Runtime::new().context("starting the async runtime")?;
            rt.block_on(async move {
                let role = sluice_control::Role::Host { host: host.clone() };
                // Stopping works from the start, also while NATS is unreachable.
                let mut stop = Box::pin(sluice_control::shutdown_signal());
                let who = format!("sluice-host {host}");
                let connect = sluice_control::NatsBus::connect(&nats, &cluster, &auth, role, &who);
                let bus = tokio::select! {
                    bus = connect => bus?,
                    _ = &mut stop => {
                        println!("host {host}: stopped before joining the cluster");
                        return anyhow::Ok(());
                    }
                };
                let bus = std::sync::Arc::new(bus);
                let report = if dpdk {
                    serve_dpdk(bus, cfg, &config, ports, pairs, unmatched, eal, mbufs, descriptors, stop).await?
                } else {
                    let _ = unmatched;
                    sluice_agent::serve(bus, cfg, stop).await?
                };
                let packets: u64 = report.deployments.values().map(|d| d.packets_in).sum();
                println!("host {host}: {} deployment(s), {packets} packets metered", report.deployments.len());
                anyhow::Ok(())
            })?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Keygen { out, show } => {
            let public = if show {
                sluice_control::nats::read_seed(&out).and_then(|seed| sluice_control::auth::public_key_of(&seed))
            } else {
                sluice_control::auth::write_new_seed(&out)
            };
            println!("{}", public.map_err(anyhow::Error::msg)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Check { modules } => {
            let config = HostConfig::load(cli.config.as_deref())?;
            let runtime = sluice_runtime::Runtime::new(config.runtime())?;
            let mut bad = 0;
            for m in &modules {
                match runtime.load_file(m) {
                    Ok(module) => println!("ok: {} ({} bytes, sha256 {})", m.display(), module.size(), module.digest()),
                    Err(e) => {
                        bad += 1;
                        println!("error: {e}");
                    }
                }
            }
            Ok(if bad == 0 { ExitCode::SUCCESS } else { ExitCode::from(1) })
        }
        Command::Synth { out, sessions, seed, vlans, from: Some(from) } => {
            let _ = (sessions, seed, vlans);
            let text = std::fs::read_to_string(&from).with_context(|| format!("reading {}", from.display()))?;
            let frames = sluice_host::traffic::parse(&text).with_context(|| format!("{}", from.display()))?;
            let n = sluice_host::synth::write_pcap(&out, &frames)?;
            println!("wrote {n} packets to {}", out.display());
            Ok(ExitCode::SUCCESS)
        }
        Command::Synth { out, sessions, seed, vlans, from: None } => {
            if let Some(v) = vlans.iter().find(|v| **v > sluice_engine::classify::MAX_VLAN) {
                anyhow::bail!("VLAN {v} is out of range (0 for untagged, 1..=4094)");
            }
            let frames = sluice_host::synth::office_edge_vlans(sessions, seed, &vlans);
            let n = sluice_host::synth::write_pcap(&out, &frames)?;
            println!("wrote {n} packets to {}", out.display());
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `serve --dpdk`: the agent on live ports.
#[allow(clippy::too_many_arguments)]
async fn serve_dpdk(
    bus: std::sync::Arc<sluice_control::NatsBus>,
    cfg: sluice_agent::AgentConfig,
    config: &HostConfig,
    ports: Vec<u16>,
    pairs: bool,
    unmatched: sluice_engine::Unmatched,
    eal: Vec<String>,
    mbufs: u32,
    descriptors: u16,
    stop: impl std::future::Future<Output = ()>,
) -> anyhow::Result<sluice_agent::report::AgentReport> {
    #[cfg(feature = "dpdk")]
    {
        let opts = sluice_host::dpdk::LiveOptions { ports, pairs, unmatched, eal_args: eal, mbufs, descriptors };
        let (input, held) = sluice_host::dpdk::open_live(config, &opts)?;
        let report = sluice_agent::serve_live(bus, cfg, input, stop).await?;
        // The ports close (flushing e.g. pcap output) after every worker is done.
        drop(held);
        Ok(report)
    }
    #[cfg(not(feature = "dpdk"))]
    {
        let _ = (bus, cfg, config, ports, pairs, unmatched, eal, mbufs, descriptors, stop);
        anyhow::bail!("this sluice-host was built without DPDK (cargo feature `dpdk`); --dpdk is not available")
    }
}

/// The machine's hostname, reduced to the characters a host id may hold.
fn default_host_id() -> String {
    let raw =
        std::fs::read_to_string("/etc/hostname").ok().or_else(|| std::env::var("HOSTNAME").ok()).unwrap_or_default();
    let id: String = raw
        .trim()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '-' })
        .take(64)
        .collect();
    if id.is_empty() { "host".into() } else { id }
}

/// `$XDG_STATE_HOME/sluice/<host>` or `~/.local/state/sluice/<host>`.
fn default_state_dir(host: &str) -> PathBuf {
    let base = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))
        .unwrap_or_else(|| PathBuf::from("."));
    base.join("sluice").join(host)
}

/// The host config with command-line overrides.
fn load_config(
    path: Option<&std::path::Path>,
    batch: Option<usize>,
    workers: Option<usize>,
    cores: Option<String>,
) -> anyhow::Result<HostConfig> {
    let mut config = HostConfig::load(path)?;
    if cores.is_some() {
        config.cores = cores;
    }
    if let Some(b) = batch {
        config.batch_size = b;
    }
    if let Some(w) = workers {
        config.workers = w;
    }
    Ok(config)
}

/// Prints a run's summary and writes its report; a refused NF config exits
/// with status 2 and the NF's message.
fn finish<R: serde::Serialize>(
    result: Result<R, RunError>,
    summary: fn(&R) -> String,
    report: Option<PathBuf>,
) -> anyhow::Result<ExitCode> {
    let rep = match result {
        Ok(r) => r,
        Err(RunError::Runtime(e @ sluice_runtime::RuntimeError::ConfigRejected { .. })) => {
            eprintln!("error: {e}");
            return Ok(ExitCode::from(2));
        }
        Err(e) => return Err(e.into()),
    };
    print!("{}", summary(&rep));
    if let Some(path) = report {
        sluice_host::write_report(&rep, &path).with_context(|| format!("writing report {}", path.display()))?;
        println!("report: {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}
