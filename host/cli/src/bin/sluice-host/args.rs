//! The command line of `sluice-host`: every command's arguments, with the
//! groups several commands share written once.

use clap::{Parser, Subcommand};
use sluice_host::HostConfig;
use std::path::{Path, PathBuf};

#[derive(Parser)]
#[command(name = "sluice-host", version, about = "Run sandboxed WebAssembly network functions over packet batches")]
pub struct Cli {
    /// Host configuration (TOML); SLUICE_* variables override it.
    #[arg(long, global = true, env = "SLUICE_CONFIG")]
    pub config: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

/// Where the cluster's NATS is and who this process is on it.
#[derive(clap::Args)]
pub struct BusArgs {
    /// NATS server URL(s), comma-separated.
    #[arg(long, env = "SLUICE_NATS_URL", default_value = "nats://127.0.0.1:4222")]
    pub nats: String,
    /// Cluster name (prefix of every subject, stream and bucket).
    #[arg(long, env = "SLUICE_CLUSTER", default_value = "default")]
    pub cluster: String,
    /// Host group: the one a host serves, or a dispatcher steers.
    #[arg(long, env = "SLUICE_GROUP", default_value = "default")]
    pub group: String,
    /// How this process proves who it is to NATS.
    #[command(flatten)]
    pub auth: sluice_control::NatsAuth,
}

// Parsed once per process: the size of its largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
pub enum Command {
    /// Process a capture through one NF or a linear chain of NFs.
    ///
    /// Each NF is loaded and compiled once, instantiated once per worker,
    /// and called once per batch. Forwarded packets go to --out; a summary
    /// is printed and --report writes the per-NF meters as JSON.
    Run(RunArgs),
    /// Process packets from DPDK ports through one NF or a chain.
    ///
    /// EAL arguments follow `--`. Without NICs or hugepages (tests, a
    /// laptop): `-- --no-huge --no-pci -m 512 --vdev=net_pcap0,rx_pcap=in.pcap,tx_pcap=out.pcap`.
    /// Stops on SIGINT/SIGTERM, after --max-packets, or after --idle-exit-ms
    /// without traffic, and prints per-port and per-queue counters.
    #[cfg(feature = "dpdk")]
    Dpdk(DpdkArgs),
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
    Steer(SteerArgs),
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
    Serve(ServeArgs),
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
    Synth(SynthArgs),
}

/// The arguments of `sluice-host run`.
#[derive(clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub chain: ChainArgs,
    #[command(flatten)]
    pub traffic: TrafficArgs,
    #[command(flatten)]
    pub workers: WorkerArgs,
    /// Hot-swap an NF to another version before a given packet:
    /// `<nf>=<module.wasm>@<packet index>` (repeatable). Flow state is
    /// kept; an incompatible version is refused and the old one runs on.
    #[arg(long = "swap")]
    pub swaps: Vec<sluice_host::run::SwapAt>,
    /// Input capture (pcap or pcapng, Ethernet).
    #[arg(long = "in")]
    pub input: PathBuf,
    /// Output capture for forwarded packets (pcap).
    #[arg(long = "out")]
    pub output: Option<PathBuf>,
    /// Write a JSON report here.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// Do not show a progress bar.
    #[arg(long)]
    pub quiet: bool,
}

/// The arguments of `sluice-host dpdk`.
#[cfg(feature = "dpdk")]
#[derive(clap::Args)]
pub struct DpdkArgs {
    #[command(flatten)]
    pub chain: ChainArgs,
    #[command(flatten)]
    pub traffic: TrafficArgs,
    #[command(flatten)]
    pub workers: WorkerArgs,
    #[command(flatten)]
    pub live: LiveArgs,
    /// DPDK port ids to use (default: every port found).
    #[arg(long, value_delimiter = ',')]
    pub ports: Vec<u16>,
    /// Default output of a port is its pair (0<->1, 2<->3) instead of itself.
    #[arg(long)]
    pub pairs: bool,
    /// Bytes each packet buffer holds (after its headroom): the longest
    /// frame a port receives whole; a net_af_packet port's framesz must
    /// fit it. Overrides `mbuf_size` of the config (default 2048).
    #[arg(long)]
    pub mbuf_size: Option<u16>,
    /// Time each stage of every batch (receive, read, build, call,
    /// verdicts, deliver, transmit) with the CPU's time-stamp counter;
    /// the report's `stages` gives ns per packet in each.
    #[arg(long)]
    pub stage_times: bool,
    /// Write a JSON report here.
    #[arg(long)]
    pub report: Option<PathBuf>,
}

/// The arguments of `sluice-host steer`.
#[cfg(feature = "dpdk")]
#[derive(clap::Args)]
pub struct SteerArgs {
    #[command(flatten)]
    pub workers: WorkerArgs,
    #[command(flatten)]
    pub live: LiveArgs,
    #[command(flatten)]
    pub bus: BusArgs,
    /// Dispatcher id (as registered).
    #[arg(long, env = "SLUICE_HOST_ID", required_unless_present = "table")]
    pub id: Option<String>,
    /// Steer by this ownership table (JSON, as the gateway publishes
    /// it) instead of following the group's over NATS: a fixed split,
    /// for a dispatcher without a control plane.
    #[arg(long)]
    pub table: Option<PathBuf>,
    /// Ports the group's traffic arrives on.
    #[arg(long, value_delimiter = ',', default_value = "0")]
    pub ingress: Vec<u16>,
    /// Where a host's flows leave: `<host>=<port>` (a point-to-point
    /// link) or `<host>=<port>@<mac>` (the destination MAC is rewritten
    /// to the host's); repeat for every host of the group.
    #[arg(long = "to", required = true)]
    pub to: Vec<sluice_host::steer::Target>,
    /// Flowlet gap, µs: a flow may move to another host only after this
    /// long without packets (above the largest difference in delay
    /// between the paths to two hosts).
    #[arg(long, default_value_t = 2000)]
    pub flowlet_gap_us: u64,
    /// How long a flow's host is remembered without packets, ms.
    #[arg(long, default_value_t = 30_000)]
    pub remember_ms: u64,
    /// Flows tracked per worker (more are steered by the table alone).
    #[arg(long, default_value_t = 1 << 20)]
    pub max_flows: usize,
    /// How often the group's table is read, ms.
    #[arg(long, default_value_t = 100)]
    pub table_poll_ms: u64,
    /// A planned table change (a host joining or draining) is steered by
    /// this long after it is first seen, ms, so that the hosts (which
    /// read the table every 100 ms) hand the moving flows' state to
    /// their new owners first. A table that loses a host applies at once.
    #[arg(long, default_value_t = 300)]
    pub handover_ms: u64,
    /// How long to wait for the links towards the hosts to come up
    /// before taking traffic, ms.
    #[arg(long, default_value_t = 10_000)]
    pub link_wait_ms: u64,
    /// Hear the hosts' liveness beacons (hosts run with `serve --dpdk
    /// --beacon <port>`): a host none is heard from for this long, ms, is
    /// treated as gone and its flows go to their next owners at once
    /// (0: off; only link state and the controller's table). Keep it
    /// above a few beacon intervals and the hosts' scheduling hiccups:
    /// 5-20 ms.
    #[arg(long, env = "SLUICE_LIVENESS_MS", default_value_t = 0)]
    pub liveness_ms: u64,
    /// How long a burst towards a host whose port is full is retried
    /// before the rest is dropped, µs (backpressure from a slow host,
    /// bounded: it holds up the worker's other hosts meanwhile).
    #[arg(long, default_value_t = 100)]
    pub tx_retry_us: u64,
    /// An address whose TCP and UDP ports are a release pool split
    /// between the hosts (a NAT's public address): packets to it go to
    /// the host that owns the destination port's block, where the
    /// connection's binding is. Repeat for each address.
    #[arg(long = "pool-address")]
    pub pool_addresses: Vec<std::net::IpAddr>,
    /// Keep a JSON report here (updated while it runs).
    #[arg(long)]
    pub report: Option<PathBuf>,
}

/// The arguments of `sluice-host serve`.
#[derive(clap::Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub bus: BusArgs,
    /// Host id, unique in the cluster (default: the machine's hostname).
    #[arg(long = "host-id", env = "SLUICE_HOST_ID")]
    pub host_id: Option<String>,
    /// Serve Prometheus `/metrics`, `/healthz` and `/readyz` on this
    /// address (e.g. `127.0.0.1:9464`; the metrics name every tenant
    /// on the host: keep it on the operator's network).
    #[arg(long, env = "SLUICE_METRICS_LISTEN")]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// Traffic: a capture file to replay, or a spool directory.
    #[arg(long = "in")]
    pub input: Option<PathBuf>,
    /// With a capture file: passes per deployment (0 = forever).
    #[arg(long = "loop", default_value_t = 1)]
    pub loops: u32,
    /// Replay at most this many packets per second per deployment.
    #[arg(long)]
    pub pps: Option<u64>,
    /// Meter window, ms (10-300000: the gateway refuses records whose
    /// window is longer than its `[meters] max-window-ms`, 10 min).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(10..=300_000))]
    pub window_ms: u64,
    /// Heartbeat interval, ms (the gateway counts a host gone after its
    /// `host-silence-ms` without one).
    #[arg(long, default_value_t = 1000)]
    pub heartbeat_ms: u64,
    /// Packets per second this host can take: the weight of its share
    /// of its group's flows in the group's ownership table (default:
    /// the gateway's `group-default-capacity-pps`).
    #[arg(long, env = "SLUICE_CAPACITY_PPS", default_value_t = 0)]
    pub capacity_pps: u64,
    /// Module cache and meter outbox (default: ~/.local/state/sluice/<host-id>).
    #[arg(long, env = "SLUICE_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// Keep a JSON report of everything metered here (updated every second).
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// Write each deployment's forwarded packets to <DIR>/<deployment-id>.pcap
    /// (appended across restarts; after a kill it holds exactly what was billed).
    #[arg(long = "out")]
    pub output: Option<PathBuf>,
    /// Packets per batch.
    #[arg(long)]
    pub batch: Option<usize>,
    /// Cores to run on ("0-3,6"). With --dpdk: worker i on the i-th
    /// (default: the EAL's lcores). Otherwise each deployment's thread is
    /// pinned to the core fewest others hold (default: every core the
    /// process may use).
    #[arg(long, env = "SLUICE_CORES")]
    pub cores: Option<String>,
    /// Take traffic from DPDK ports (EAL arguments after `--`), e.g.
    /// `-- --no-huge --no-pci -m 512 --vdev=net_af_packet0,iface=eth1`.
    #[arg(long, conflicts_with = "input")]
    pub dpdk: bool,
    #[command(flatten)]
    pub live: ServeDpdkArgs,
    /// Packets no deployment's attachment claims: `drop` or `forward`.
    #[arg(long, env = "SLUICE_UNMATCHED", default_value = "drop")]
    pub unmatched: sluice_engine::Unmatched,
}

/// The arguments of `sluice-host serve` that apply with `--dpdk`.
#[derive(clap::Args)]
pub struct ServeDpdkArgs {
    /// With --dpdk: worker threads (= RX/TX queue pairs per port).
    #[arg(long, requires = "dpdk")]
    pub workers: Option<usize>,
    /// With --dpdk: port ids to use (default: every port found).
    #[arg(long, value_delimiter = ',', requires = "dpdk")]
    pub ports: Vec<u16>,
    /// With --dpdk: forwarded packets leave by the paired port (0<->1,
    /// 2<->3) unless an attachment names `out`.
    #[arg(long, requires = "dpdk")]
    pub pairs: bool,
    /// With --dpdk: mbufs in the packet pool.
    #[arg(long, default_value_t = 8191, requires = "dpdk")]
    pub mbufs: u32,
    /// With --dpdk: bytes each packet buffer holds (after its headroom): the longest
    /// frame a port receives whole; a net_af_packet port's framesz must
    /// fit it. Overrides `mbuf_size` of the config (default 2048).
    #[arg(long, requires = "dpdk")]
    pub mbuf_size: Option<u16>,
    /// With --dpdk: RX/TX descriptors per queue.
    #[arg(long, default_value_t = 512, requires = "dpdk")]
    pub descriptors: u16,
    /// With --dpdk: how often, µs, each worker sends the state of the
    /// flows it touched to their next owners in the group (0: off).
    /// Keep it under half the dispatcher's --flowlet-gap-us.
    #[arg(long, env = "SLUICE_REPLICATE_US", default_value_t = 1000, requires = "dpdk")]
    pub replicate_us: u64,
    /// With --dpdk: MiB of replicas kept for the group's other hosts, at
    /// most (past it, new replicas are refused and counted).
    #[arg(long, env = "SLUICE_PEER_MAX_MB", default_value_t = 256, requires = "dpdk")]
    pub peer_max_mb: usize,
    /// With --dpdk: how long, µs, the packets of a flow the dispatcher
    /// moved here without its state wait while it is pulled from the
    /// host that had it (then they run without it: a state miss).
    #[arg(long, env = "SLUICE_PULL_WAIT_US", default_value_t = 5000, requires = "dpdk")]
    pub pull_wait_us: u64,
    /// With --dpdk: receive the group's peer-link datagrams at this
    /// `ip:port` (port 0: any free one), an address the group's other
    /// hosts reach this host at. A pull's request and answer and probes
    /// of suspected hosts then go host to host as one authenticated
    /// datagram each instead of through NATS (keys are exchanged over
    /// NATS). Unset: they take NATS.
    #[arg(long, env = "SLUICE_PEER_LINK", requires = "dpdk")]
    pub peer_link: Option<std::net::SocketAddr>,
    /// With --dpdk: send liveness beacons to the group's dispatcher out of
    /// this port (`<port>`, broadcast, or `<port>@<mac>`), so that a
    /// dispatcher run with --liveness-ms moves this host's flows within
    /// milliseconds once they stop (the process died or hangs).
    #[arg(long, env = "SLUICE_BEACON", requires = "dpdk")]
    pub beacon: Option<sluice_host::beacon::BeaconTarget>,
    /// With --dpdk: how often, µs, a beacon is sent. Keep it well under
    /// the dispatcher's --liveness-ms.
    #[arg(long, env = "SLUICE_BEACON_US", default_value_t = 1000, requires = "beacon")]
    pub beacon_us: u64,
    /// With --dpdk: time each stage of the workers' batches (a few ns
    /// per batch); the host report's `stages` gives ns per packet
    /// (docs/run-report.md).
    #[arg(long, requires = "dpdk")]
    pub stage_times: bool,
    /// EAL arguments (with --dpdk).
    #[arg(last = true)]
    pub eal: Vec<String>,
}

/// The arguments of `sluice-host synth`.
#[derive(clap::Args)]
pub struct SynthArgs {
    /// Output pcap.
    #[arg(long)]
    pub out: PathBuf,
    /// Number of sessions (each a few packets).
    #[arg(long, default_value_t = 1000)]
    pub sessions: usize,
    /// PRNG seed: same seed, same trace.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// 802.1Q VLAN ids the sessions take in turn (0: untagged), e.g.
    /// `100,200,0` for two tenants' traffic and unclaimed traffic.
    #[arg(long, value_delimiter = ',')]
    pub vlans: Vec<u16>,
    /// Instead of sessions: the packets a text file describes, one per
    /// line (`0.0 tcp 10.0.0.5:40000 > 10.0.0.80:22 flags S repeat 500`;
    /// the format is in sdk/cli/README.md, under share/doc/sluice/ in a
    /// release).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["sessions", "seed", "vlans"])]
    pub from: Option<PathBuf>,
}

/// The NFs a command runs.
#[derive(clap::Args)]
pub struct ChainArgs {
    /// NF components, comma-separated or repeated; with several, they
    /// form a linear chain in the given order.
    #[arg(long = "nf", value_delimiter = ',', required_unless_present = "chain", conflicts_with = "chain")]
    pub nfs: Vec<PathBuf>,
    /// A chain file: NFs and where each sends its packets (branches by
    /// label, joins); the format is under "Chain files" in README.md
    /// (share/doc/sluice/ in a release), an example in
    /// deploy/local/demo-chain.toml.
    #[arg(long)]
    pub chain: Option<PathBuf>,
}

/// How the chain sees the traffic: overrides of the host configuration.
#[derive(clap::Args)]
pub struct TrafficArgs {
    /// Ingress ports on the outside (`--outside-ports 1`; pcapng interface
    /// ids for `run`, DPDK port ids for `dpdk`): their packets, replies to
    /// connections opened from the inside, run the chain last NF first, so
    /// a firewall listed before a NAT sees inside addresses both ways.
    /// Linear chains only. Overrides `outside_ports` of the config.
    #[arg(long, value_delimiter = ',')]
    pub outside_ports: Vec<u16>,
    /// What the NFs see of fragmented IP datagrams: `follow` (the first
    /// fragment; the later ones follow its verdict and rewrites) or
    /// `reassemble` (whole datagrams, held until complete and cut again
    /// as they came on the way out). Overrides `fragments` of the config.
    #[arg(long)]
    pub fragments: Option<sluice_runtime::fragments::FragmentMode>,
    /// How packets spread over the workers: `flow` (by connection) or
    /// `addresses` (every connection between two hosts on one worker,
    /// so state an NF keys by an address meets its writes there).
    /// Overrides `spread` of the config.
    #[arg(long)]
    pub spread: Option<sluice_traffic::Spread>,
}

impl TrafficArgs {
    /// Applies the overrides given.
    pub fn apply(self, config: &mut HostConfig) {
        if !self.outside_ports.is_empty() {
            config.outside_ports = self.outside_ports;
        }
        if let Some(f) = self.fragments {
            config.fragments = f;
        }
        if let Some(s) = self.spread {
            config.spread = s;
        }
    }
}

/// How many workers, where, and their batch size: overrides of the host
/// configuration.
#[derive(clap::Args)]
pub struct WorkerArgs {
    /// Packets per batch (one NF call per batch; on DPDK ports, per worker
    /// and port, up to 256).
    #[arg(long)]
    pub batch: Option<usize>,
    /// Worker threads (on DPDK ports: RX/TX queue pairs per port); packets
    /// spread over them by `--spread`.
    #[arg(long)]
    pub workers: Option<usize>,
    /// Cores the workers run on, as in taskset ("0-3,6"): worker i on the
    /// i-th core; with more workers than cores they share cores
    /// round-robin (slower, but deadlines count CPU time, so no NF traps
    /// for it). Default: every core the process may use; on DPDK ports the
    /// EAL's lcores (-l/--lcores), worker lcores first, then the main lcore.
    #[arg(long, env = "SLUICE_CORES")]
    pub cores: Option<String>,
}

impl WorkerArgs {
    /// The host configuration at `path` (and `SLUICE_*`) with these
    /// overrides.
    pub fn config(self, path: Option<&Path>) -> anyhow::Result<HostConfig> {
        let mut config = HostConfig::load(path)?;
        if self.cores.is_some() {
            config.cores = self.cores;
        }
        if let Some(b) = self.batch {
            config.batch_size = b;
        }
        if let Some(w) = self.workers {
            config.workers = w;
        }
        Ok(config)
    }
}

/// DPDK ports and when to stop taking packets from them.
#[derive(clap::Args)]
pub struct LiveArgs {
    /// Stop after this many received packets.
    #[arg(long)]
    pub max_packets: Option<u64>,
    /// Stop when no packet arrived for this long (ms).
    #[arg(long)]
    pub idle_exit_ms: Option<u64>,
    /// Mbufs in the packet pool.
    #[arg(long, default_value_t = 8191)]
    pub mbufs: u32,
    /// RX/TX descriptors per queue.
    #[arg(long, default_value_t = 512)]
    pub descriptors: u16,
    /// EAL arguments.
    #[arg(last = true)]
    pub eal: Vec<String>,
}

#[cfg(feature = "dpdk")]
impl LiveArgs {
    /// `--idle-exit-ms` as a duration.
    pub fn idle_exit(&self) -> Option<std::time::Duration> {
        self.idle_exit_ms.map(std::time::Duration::from_millis)
    }
}
