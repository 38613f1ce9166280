//! `sluice-bench`: what the sandbox costs.
//!
//! Every measurement runs the same NF two ways through the same host code
//! (batch building, flow state, verdicts): compiled natively into this
//! binary, and as a Wasm component through the runtime. Packets come from
//! an in-memory generator, never from disk. Results are ratios against the
//! native run measured in the same process, so they mean the same on any
//! machine; absolute ns are printed alongside.

mod control;
mod dispatch;
mod dpdk;
mod elastic;
mod fragments;
mod languages;
mod live;
mod native;
mod offload;
mod realstack;

use anyhow::{Context, Result};
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use native::SdkNative;
use sluice_runtime::{Chain, NativeNf, NfInstance, NfLimits, NfSpec, RawPacket, Runtime, RuntimeConfig};
use sluice_wire::build::FrameSpec;
use sluice_wire::tcp::flags::{ACK, PSH, SYN};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(name = "sluice-bench", about = "Benchmarks Wasm NFs against the same NFs compiled natively")]
struct Args {
    /// Directory with the built NF components (`make nfs`).
    #[arg(long, default_value = "target/nfs")]
    nfs: PathBuf,
    /// Write the results as Markdown here.
    #[arg(long)]
    write: Option<PathBuf>,
    /// Time per sample, ms (more is steadier).
    #[arg(long, default_value_t = 40)]
    sample_ms: u64,
    /// Samples per measurement; the median is reported.
    #[arg(long, default_value_t = 7)]
    samples: usize,
    /// A `sluice-host` built with DPDK: adds the DPDK throughput table
    /// (needs dpdk-testpmd for the ceiling).
    #[arg(long)]
    host: Option<PathBuf>,
    /// The Sluice checkout whose SDKs and conformance firewall the
    /// per-language table builds (needs the toolchains of `make setup`).
    #[arg(long, default_value = ".")]
    sdk_root: PathBuf,
    /// Skip the per-language table.
    #[arg(long)]
    no_languages: bool,
    /// Only the fragment-mode table (prints, writes nothing).
    #[arg(long)]
    fragments_only: bool,
    /// Only the global-state table: the NAT's pool and the monitor's
    /// eventual and single-writer tables on 1 and 2 workers (prints,
    /// writes nothing).
    #[arg(long)]
    state_only: bool,
    /// Only the control-plane table (needs --host; prints, writes nothing).
    #[arg(long, requires = "host")]
    control_only: bool,
    /// Only the DPDK scaling table (needs --host; prints, writes nothing).
    #[arg(long, requires = "host")]
    dpdk_only: bool,
    /// Worker counts of the DPDK scaling table (default: 1, 2, 4, ... up
    /// to the CPUs there are, and that number), e.g. `1,16` on a machine
    /// lent for a short time.
    #[arg(long, value_delimiter = ',')]
    dpdk_workers: Vec<usize>,
    /// Only the per-stage cost table of `sluice-host dpdk` (needs --host;
    /// prints, writes nothing).
    #[arg(long, requires = "host")]
    stages_only: bool,
    /// Only the live-host table (`serve --dpdk`; needs --host; prints,
    /// writes nothing).
    #[arg(long, requires = "host")]
    live_only: bool,
    /// Only the host-group tables (ownership tables; the dispatcher with
    /// --host; prints, writes nothing).
    #[arg(long)]
    groups_only: bool,
    /// Only what replicating peer state costs a live host (prints, writes
    /// nothing).
    #[arg(long, requires = "host")]
    peer_only: bool,
    /// Only the elastic group under live traffic: scale-out, drain,
    /// failover and pulls, from the packets (needs --host, root, python3;
    /// prints, writes nothing).
    #[arg(long, requires = "host")]
    elastic_only: bool,
    /// Only what metrics and OTLP export cost a live host (needs --host and
    /// `make setup`'s collector; prints, writes nothing).
    #[arg(long, requires = "host")]
    telemetry_only: bool,
    /// Only real TCP through the host against a Linux bridge (needs
    /// --host, root, iperf3, ethtool; prints, writes nothing).
    #[arg(long, requires = "host")]
    realstack_only: bool,
    /// Only the edit loop of Python and JavaScript NFs (prints, writes
    /// nothing).
    #[arg(long)]
    edit_loop_only: bool,
    /// Only flow offload: the firewall with and without offloading its
    /// connections, and (unless --no-languages) the conformance suite's
    /// offloading firewall in each guest language (prints, writes nothing).
    #[arg(long)]
    offload_only: bool,
    /// Only the conformance firewall in each guest language (prints,
    /// writes nothing).
    #[arg(long)]
    languages_only: bool,
    /// The guest languages the language tables measure (comma-separated:
    /// rust, c, python, js, go; default all).
    #[arg(long, value_delimiter = ',')]
    lang: Vec<sluice_cli::Lang>,
}

/// Firewall rules for the benchmark: the matching rule is last of ten, as
/// in a real rule set where common traffic is not always first.
const FIREWALL_CONFIG: &str = r#"{"default":"deny","rules":[
 {"action":"deny","proto":"tcp","dst-ports":"23"},
 {"action":"deny","proto":"tcp","src":"192.168.0.0/16"},
 {"action":"deny","proto":"udp","dst-ports":"161-162"},
 {"action":"allow","proto":"udp","dst-ports":"53"},
 {"action":"allow","proto":"icmp"},
 {"action":"deny","proto":"tcp","dst-ports":"3389"},
 {"action":"allow","proto":"tcp","src":"172.16.0.0/12","dst-ports":"22"},
 {"action":"deny","proto":"tcp","src":"10.99.0.0/16"},
 {"action":"allow","proto":"tcp","src":"2001:db8::/32"},
 {"action":"allow","proto":"tcp","src":"10.0.0.0/8","dst-ports":"1-65535"}]}"#;

/// The generator's servers are 10.200.0.1..16:443; the VIP is the first,
/// so a sixteenth of the traffic is balanced (rewritten) and its replies
/// rewritten back.
/// Configs of the DPDK scaling table.
const DPDK_CONFIGS: dpdk::Configs<'static> =
    dpdk::Configs { firewall: FIREWALL_CONFIG, nat: NAT_CONFIG, monitor: MONITOR_CONFIG };

const NAT_CONFIG: &str = r#"{"public-ip":"203.0.113.1","inside":["10.1.0.0/16"]}"#;

const MONITOR_CONFIG: &str = r#"{"report-interval-s":0}"#;
/// The monitor with its five tables single-writer instead of eventual.
const MONITOR_SINGLE_WRITER_CONFIG: &str = r#"{"report-interval-s":0,"consistency":"single-writer"}"#;

const LB_CONFIG: &str = r#"{"vip":"10.200.0.1","port":443,"protocol":"tcp",
 "backends":["10.50.0.1","10.50.0.2","10.50.0.3","10.50.0.4"]}"#;

/// IDS rules for the benchmark: both case modes, stream and positioned
/// rules; the generated payloads match none, so every byte is scanned.
const IDS_CONFIG: &str = r#"{"mode":"ids","rules":[
 "alert tcp any any -> any any (msg:\"exe\"; content:\"evil.exe\"; sid:1;)",
 "alert tcp any any -> any any (msg:\"sh\"; content:\"/bin/sh\"; nocase; sid:2;)",
 "alert tcp any any -> any 443 (msg:\"magic\"; content:\"MAGIC\"; offset:0; depth:16; sid:3;)",
 "alert tcp any any <> any any (msg:\"passwd\"; content:\"/etc/passwd\"; sid:4;)",
 "alert tcp any any -> any any (msg:\"cmd\"; content:\"cmd.exe\"; nocase; sid:5;)"]}"#;

/// `n` frames of `size` bytes over `flows` TCP connections: each flow
/// opens with a SYN from the client; the rest alternate direction.
fn traffic(size: usize, flows: usize, n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| {
            let f = i % flows;
            let round = i / flows;
            let client = [10, 1, (f >> 8) as u8, f as u8];
            let server = [10, 200, 0, 1 + (f % 16) as u8];
            let cport = 10_000 + f as u16;
            let spec = match (round, round % 2) {
                (0, _) => FrameSpec::tcp4(client, cport, server, 443, SYN),
                (_, 1) => FrameSpec::tcp4(server, 443, client, cport, PSH | ACK),
                _ => FrameSpec::tcp4(client, cport, server, 443, ACK),
            };
            spec.with_frame_len(size).build()
        })
        .collect()
}

fn raw(frames: &[Vec<u8>]) -> Vec<RawPacket<'_>> {
    frames
        .iter()
        .enumerate()
        .map(|(i, f)| RawPacket {
            data: f,
            wire_len: f.len() as u32,
            timestamp_ns: 1_000_000 + i as u64,
            ingress_port: 0,
        })
        .collect()
}

struct Bench {
    sample: Duration,
    samples: usize,
}

impl Bench {
    /// Median ns per packet of running `chain` over `packets` in batches.
    fn per_packet(&self, chain: &mut Chain, packets: &[RawPacket<'_>], batch: usize) -> f64 {
        // Warm up: first calls fault in memory and fill caches.
        for c in packets.chunks(batch) {
            chain.process(c);
        }
        let mut results = Vec::with_capacity(self.samples);
        for _ in 0..self.samples {
            let start = Instant::now();
            let mut done = 0u64;
            while start.elapsed() < self.sample {
                for c in packets.chunks(batch) {
                    chain.process(c);
                }
                done += packets.len() as u64;
            }
            results.push(start.elapsed().as_nanos() as f64 / done as f64);
        }
        median(&mut results)
    }

    /// Median ns per iteration of `f`.
    fn per_call(&self, mut f: impl FnMut()) -> f64 {
        f();
        let mut results = Vec::with_capacity(self.samples);
        for _ in 0..self.samples {
            let start = Instant::now();
            let mut n = 0u64;
            while start.elapsed() < self.sample {
                f();
                n += 1;
            }
            results.push(start.elapsed().as_nanos() as f64 / n as f64);
        }
        median(&mut results)
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

struct NfCase {
    name: &'static str,
    config: &'static str,
    kind: &'static str,
    native: fn() -> Box<dyn NativeNf>,
}

struct Row {
    nf: &'static str,
    kind: &'static str,
    size: usize,
    batch: usize,
    native: f64,
    wasm: f64,
}

fn main() -> Result<()> {
    let args = Args::parse();
    if let (true, Some(host)) = (args.dpdk_only, &args.host) {
        let frames = traffic(64, 1024, 8192);
        print!("{}", dpdk::section(host, &args.nfs, &frames, DPDK_CONFIGS, &args.dpdk_workers)?);
        return Ok(());
    }
    if let (true, Some(host)) = (args.stages_only, &args.host) {
        let frames = traffic(64, 1024, 8192);
        print!("{}", dpdk::stages_section(host, &args.nfs, &frames, DPDK_CONFIGS)?);
        return Ok(());
    }
    if let (true, Some(host)) = (args.peer_only, &args.host) {
        let frames = traffic(64, 1024, 8192);
        print!("{}", live::replication_section(host, &args.nfs, &frames, FIREWALL_CONFIG, IDS_CONFIG)?);
        return Ok(());
    }
    if let (true, Some(host)) = (args.telemetry_only, &args.host) {
        let frames = traffic(64, 1024, 8192);
        print!("{}", live::telemetry_section(host, &args.nfs, &frames, FIREWALL_CONFIG)?);
        return Ok(());
    }
    if let (true, Some(host)) = (args.realstack_only, &args.host) {
        print!("{}", realstack::section(host, &args.nfs)?);
        return Ok(());
    }
    if let (true, Some(host)) = (args.elastic_only, &args.host) {
        print!("{}", elastic::section(host, &args.nfs)?);
        return Ok(());
    }
    if args.edit_loop_only {
        let rows = languages::edit_loop(&args.sdk_root, &args.sdk_root.join("target/bench-languages"))?;
        print!("{}", languages::render_edit_loop(&rows));
        return Ok(());
    }
    if args.groups_only {
        let frames = traffic(64, 1024, 8192);
        print!("{}", dispatch::section(args.host.as_deref(), &frames)?);
        if let Some(host) = &args.host {
            print!("{}", live::replication_section(host, &args.nfs, &frames, FIREWALL_CONFIG, IDS_CONFIG)?);
        }
        return Ok(());
    }
    if let (true, Some(host)) = (args.live_only, &args.host) {
        let frames = traffic(64, 1024, 8192);
        print!("{}", live::section(host, &args.nfs, &frames, FIREWALL_CONFIG)?);
        return Ok(());
    }
    if let (true, Some(host)) = (args.control_only, &args.host) {
        print!("{}", control::section(host, &args.nfs, FIREWALL_CONFIG)?);
        return Ok(());
    }
    let bench = Bench { sample: Duration::from_millis(args.sample_ms), samples: args.samples.max(1) };
    let runtime = Runtime::new(RuntimeConfig::default())?;
    if args.fragments_only {
        print!("{}", fragments::section(&runtime, &args.nfs, &bench, 32)?);
        return Ok(());
    }
    let offload_cases = [
        offload::Case {
            name: "firewall",
            label: "firewall",
            config: FIREWALL_CONFIG,
            offload: r#""offload":true"#,
            native: || Box::new(SdkNative::<sluice_nf_firewall::Firewall>::new()),
        },
        offload::Case {
            name: "firewall",
            label: "firewall, offload-after 1",
            config: FIREWALL_CONFIG,
            offload: r#""offload":true,"offload-after":1"#,
            native: || Box::new(SdkNative::<sluice_nf_firewall::Firewall>::new()),
        },
        offload::Case {
            name: "nat",
            label: "nat",
            config: NAT_CONFIG,
            offload: r#""offload":true"#,
            native: || Box::new(SdkNative::<sluice_nf_nat::Nat>::new()),
        },
    ];
    let langs: Vec<sluice_cli::Lang> =
        if args.lang.is_empty() { sluice_cli::Lang::ALL.to_vec() } else { args.lang.clone() };
    if args.languages_only {
        let lang_frames = traffic(64, 256, 2048);
        let scratch = args.sdk_root.join("target/bench-languages");
        let rows = languages::measure(&args.sdk_root, &scratch, &lang_frames, &langs, &bench)?;
        print!("{}", languages::render(&rows, lang_frames.len()));
        return Ok(());
    }
    if args.offload_only {
        print!("{}", offload::render(&offload::measure(&runtime, &args.nfs, &offload_cases, &bench)?));
        if !args.no_languages {
            let scratch = args.sdk_root.join("target/bench-languages");
            print!("{}", offload::render_languages(&offload::languages(&args.sdk_root, &scratch, &langs, &bench)?));
        }
        return Ok(());
    }
    let cases = [
        NfCase {
            name: "noop",
            config: "",
            kind: "empty",
            native: || Box::new(SdkNative::<sluice_nf_noop::Noop>::new()),
        },
        NfCase {
            name: "counter",
            config: "",
            kind: "stateless",
            native: || Box::new(SdkNative::<sluice_nf_counter::Counter>::new()),
        },
        NfCase {
            name: "firewall",
            config: FIREWALL_CONFIG,
            kind: "stateful",
            native: || Box::new(SdkNative::<sluice_nf_firewall::Firewall>::new()),
        },
        NfCase {
            name: "lb",
            config: LB_CONFIG,
            kind: "L4 LB (rewrites)",
            native: || Box::new(SdkNative::<sluice_nf_lb::LoadBalancer>::new()),
        },
        NfCase {
            name: "ratelimit",
            config: r#"{"packets-per-second":1000000,"packet-burst":1000}"#,
            kind: "policer",
            native: || Box::new(SdkNative::<sluice_nf_ratelimit::RateLimiter>::new()),
        },
        NfCase {
            name: "udp-whitelist",
            config: r#"{"clients":["10.1.0.0/16"]}"#,
            kind: "stateful (TCP passes)",
            native: || Box::new(SdkNative::<sluice_nf_udp_whitelist::UdpWhitelist>::new()),
        },
        NfCase {
            name: "dns-filter",
            config: r#"{"block":["ads.example","malware.test"]}"#,
            kind: "stateless (no DNS in traffic)",
            native: || Box::new(SdkNative::<sluice_nf_dns_filter::DnsFilter>::new()),
        },
        NfCase {
            name: "nat",
            config: NAT_CONFIG,
            kind: "source NAT (rewrites, pool)",
            native: || Box::new(SdkNative::<sluice_nf_nat::Nat>::new()),
        },
        NfCase {
            name: "monitor",
            config: MONITOR_CONFIG,
            kind: "eventual counters",
            native: || Box::new(SdkNative::<sluice_nf_monitor::Monitor>::new()),
        },
        NfCase {
            name: "ids",
            config: IDS_CONFIG,
            kind: "payload scan",
            native: || Box::new(SdkNative::<sluice_nf_ids::Ids>::new()),
        },
    ];
    if args.state_only {
        let frames64 = traffic(64, 1024, 8192);
        let scaling = global_state(&runtime, &cases, &args.nfs, &frames64, &bench)?;
        print!("{}", render_scaling(&scaling, &[]));
        return Ok(());
    }
    let sizes = [64usize, 1500];
    let batches = [1usize, 8, 32, 128];
    let frames: Vec<(usize, Vec<Vec<u8>>)> = sizes.iter().map(|&s| (s, traffic(s, 1024, 8192))).collect();

    let total = (cases.len() * sizes.len() * batches.len()) as u64;
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} {msg}").unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut rows = Vec::new();
    let mut sizes_info = Vec::new();
    for case in &cases {
        let path = args.nfs.join(format!("{}.wasm", case.name));
        let module =
            runtime.load_file(&path).with_context(|| format!("loading {} (run `make nfs`)", path.display()))?;
        let spec = NfSpec { module, config: case.config.as_bytes().into(), limits: NfLimits::default(), owner: None };
        let inst_ns = bench.per_call(|| {
            let _ = NfInstance::new(&runtime, spec.clone());
        });
        sizes_info.push((case.name, spec.module.size(), inst_ns));
        for (size, frames) in &frames {
            let packets = raw(frames);
            for &batch in &batches {
                bar.set_message(format!("{} {}B batch {}", case.name, size, batch));
                let mut native =
                    Chain::from_instances(vec![NfInstance::new_native(&runtime, spec.clone(), (case.native)())?]);
                let mut wasm = Chain::new(&runtime, std::slice::from_ref(&spec))?;
                let n = bench.per_packet(&mut native, &packets, batch);
                let w = bench.per_packet(&mut wasm, &packets, batch);
                rows.push(Row { nf: case.name, kind: case.kind, size: *size, batch, native: n, wasm: w });
                bar.inc(1);
            }
        }
    }

    // Cold (instantiate per batch, the classic serverless model) vs warm.
    bar.set_message("cold vs warm");
    let mut cold = Vec::new();
    let packets64 = frames.first().map(|(_, f)| raw(f)).unwrap_or_default();
    for case in cases.iter().filter(|c| c.name == "noop" || c.name == "firewall") {
        let module = runtime.load_file(&args.nfs.join(format!("{}.wasm", case.name)))?;
        let spec = NfSpec { module, config: case.config.as_bytes().into(), limits: NfLimits::default(), owner: None };
        let batch: Vec<RawPacket<'_>> = packets64.iter().take(32).copied().collect();
        let mut warm = Chain::new(&runtime, std::slice::from_ref(&spec))?;
        let warm_ns = bench.per_call(|| {
            warm.process(&batch);
        });
        let cold_ns = bench.per_call(|| {
            if let Ok(mut c) = Chain::new(&runtime, std::slice::from_ref(&spec)) {
                c.process(&batch);
            }
        });
        cold.push((case.name, warm_ns, cold_ns));
    }
    bar.finish_and_clear();

    eprintln!("workers (about half a minute)...");
    let frames64 = frames.first().map(|(_, f)| f.as_slice()).unwrap_or(&[]);
    let scaling = global_state(&runtime, &cases, &args.nfs, frames64, &bench)?;

    let mut md = render(&rows, &cold, &sizes_info);
    md.push_str(&render_scaling(&scaling, &rows));
    eprintln!("flow offload (about a minute)...");
    md.push_str(&offload::render(&offload::measure(&runtime, &args.nfs, &offload_cases, &bench)?));
    if !args.no_languages {
        eprintln!(
            "the firewall in each guest language (a few minutes: builds, then Python and JavaScript are slow)..."
        );
        let lang_frames = traffic(64, 256, 2048);
        let scratch = args.sdk_root.join("target/bench-languages");
        let lang_rows = languages::measure(&args.sdk_root, &scratch, &lang_frames, &langs, &bench)?;
        md.push_str(&languages::render(&lang_rows, lang_frames.len()));
        eprintln!("flow offload in each guest language (a few minutes)...");
        md.push_str(&offload::render_languages(&offload::languages(&args.sdk_root, &scratch, &langs, &bench)?));
        eprintln!("the edit loop of Python and JavaScript NFs (a few minutes)...");
        let edits = languages::edit_loop(&args.sdk_root, &scratch)?;
        md.push_str(&languages::render_edit_loop(&edits));
    }
    if let Some(host) = &args.host {
        eprintln!("DPDK throughput (about a minute), then the control plane...");
        let frames64 = frames.first().map(|(_, f)| f.as_slice()).unwrap_or(&[]);
        md.push_str(&dpdk::stages_section(host, &args.nfs, frames64, DPDK_CONFIGS)?);
        md.push_str(&dpdk::section(host, &args.nfs, frames64, DPDK_CONFIGS, &args.dpdk_workers)?);
        eprintln!("real TCP through the host against a Linux bridge (about two and a half minutes)...");
        md.push_str(&realstack::section(host, &args.nfs)?);
        md.push_str(&control::section(host, &args.nfs, FIREWALL_CONFIG)?);
        md.push_str(&live::section(host, &args.nfs, frames64, FIREWALL_CONFIG)?);
    }
    md.push_str(&fragments::section(&runtime, &args.nfs, &bench, 32)?);
    let frames64 = frames.first().map(|(_, f)| f.as_slice()).unwrap_or(&[]);
    md.push_str(&dispatch::section(args.host.as_deref(), frames64)?);
    if let Some(host) = &args.host {
        md.push_str(&live::replication_section(host, &args.nfs, frames64, FIREWALL_CONFIG, IDS_CONFIG)?);
        md.push_str(&live::telemetry_section(host, &args.nfs, frames64, FIREWALL_CONFIG)?);
        eprintln!("the elastic group under live traffic (about a minute)...");
        md.push_str(&elastic::section(host, &args.nfs)?);
    }
    print!("{md}");
    if let Some(p) = args.write {
        std::fs::write(&p, &md).with_context(|| format!("writing {}", p.display()))?;
        eprintln!("wrote {}", p.display());
    }
    Ok(())
}

/// The NAT and the monitor on 1 and 2 workers: global state shared
/// between workers (the NAT's port pool, the monitor's counter tables,
/// eventual and single-writer).
fn global_state(
    runtime: &Runtime,
    cases: &[NfCase],
    nfs: &Path,
    frames64: &[Vec<u8>],
    bench: &Bench,
) -> Result<Vec<Scaling>> {
    let mut scaling = Vec::new();
    let mut scaled: Vec<(&'static str, &NfCase, &'static str)> = Vec::new();
    for case in cases.iter().filter(|c| c.name == "nat" || c.name == "monitor") {
        scaled.push((case.name, case, case.config));
        if case.name == "monitor" {
            scaled.push(("monitor (single-writer)", case, MONITOR_SINGLE_WRITER_CONFIG));
        }
    }
    for (label, case, config) in scaled {
        let module = runtime.load_file(&nfs.join(format!("{}.wasm", case.name)))?;
        let spec = NfSpec { module, config: config.as_bytes().into(), limits: NfLimits::default(), owner: None };
        for workers in [1usize, 2] {
            let native = workers_mpps(runtime, &spec, Some(case.native), frames64, workers, bench)?;
            let wasm = workers_mpps(runtime, &spec, None, frames64, workers, bench)?;
            scaling.push(Scaling { nf: label, workers, native, wasm });
        }
    }
    Ok(scaling)
}

struct Scaling {
    nf: &'static str,
    workers: usize,
    native: f64,
    wasm: f64,
}

/// Throughput in Mpps of `workers` threads, each with its own instance of
/// the NF (native if `native` is given) sharing one state domain, each
/// processing its share of the traffic (split by symmetric flow hash, as the
/// host does) in batches of 32.
fn workers_mpps(
    runtime: &Runtime,
    spec: &NfSpec,
    native: Option<fn() -> Box<dyn NativeNf>>,
    frames: &[Vec<u8>],
    workers: usize,
    bench: &Bench,
) -> Result<f64> {
    let domain = sluice_state::Domain::for_workers(workers);
    let mut shares: Vec<Vec<Vec<u8>>> = vec![Vec::new(); workers];
    for f in frames {
        let w = sluice_wire::parse(f).key.map(|k| sluice_traffic::Spread::Flow.worker(&k, workers)).unwrap_or(0);
        if let Some(s) = shares.get_mut(w) {
            s.push(f.clone());
        }
    }
    let mut chains = Vec::new();
    for _ in 0..workers {
        chains.push(match native {
            Some(make) => {
                Chain::from_instances(vec![NfInstance::new_native_in(runtime, spec.clone(), make(), &domain)?])
            }
            None => Chain::with_domains(
                runtime,
                std::slice::from_ref(spec),
                sluice_runtime::Routes::linear(1),
                std::slice::from_ref(&domain),
            )?,
        });
    }
    let run_for = bench.sample * bench.samples as u32;
    let done: Vec<u64> = std::thread::scope(|scope| {
        let handles: Vec<_> = chains
            .into_iter()
            .zip(&shares)
            .map(|(mut chain, share)| {
                scope.spawn(move || {
                    // Packet time moves on as on a live port (a packet
                    // every microsecond, the trace replayed end to end), so
                    // eventual tables merge and single-writer tables sync
                    // at their intervals during the measurement.
                    let mut packets = raw(share);
                    for (i, p) in packets.iter_mut().enumerate() {
                        p.timestamp_ns = 1_000_000 + 1_000 * i as u64;
                    }
                    let span = 1_000 * packets.len() as u64;
                    let pass = |packets: &mut [RawPacket<'_>], chain: &mut Chain| {
                        for c in packets.chunks(32) {
                            chain.process(c);
                        }
                        for p in packets.iter_mut() {
                            p.timestamp_ns += span;
                        }
                    };
                    pass(&mut packets, &mut chain);
                    let start = Instant::now();
                    let mut n = 0u64;
                    while start.elapsed() < run_for {
                        pass(&mut packets, &mut chain);
                        n += packets.len() as u64;
                    }
                    (n, start.elapsed())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().map(|(n, t)| (n as f64 / t.as_secs_f64()) as u64).unwrap_or(0)).collect()
    });
    Ok(done.iter().sum::<u64>() as f64 / 1e6)
}

fn render_scaling(scaling: &[Scaling], rows: &[Row]) -> String {
    let mut s = String::new();
    s.push_str(
        "
## Global state on 1 and 2 workers

",
    );
    s.push_str("64-byte packets, batch 32; each worker thread has its own instance and its share of the flows (split by symmetric hash, as the host does), and the workers share the NF's global state: the NAT's port pool (release consistency: a lock per `acquire`/`lookup` call) and the monitor's five counter tables, eventual (replicas merged every 100 ms of packet time) or single-writer (`\"consistency\":\"single-writer\"`: each key counted by its owner worker, the other's adds forwarded to it, synced every 100 ms of packet time at each owner's batches, as on a live host). Throughput summed over the workers.

");
    s.push_str(
        "| NF | workers | native Mpps | Wasm Mpps | ratio | Wasm speed-up over 1 worker |
|---|---:|---:|---:|---:|---:|
",
    );
    for r in scaling {
        let one = scaling.iter().find(|o| o.nf == r.nf && o.workers == 1).map(|o| o.wasm).unwrap_or(f64::NAN);
        s.push_str(&format!(
            "| {} | {} | {:.2} | {:.2} | {:.2} | {:.2}× |
",
            r.nf,
            r.workers,
            r.native,
            r.wasm,
            r.wasm / r.native,
            r.wasm / one
        ));
    }
    s.push_str(&format!(
        "
This machine has {} cores; the generator and the main thread share them with the workers.
",
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
    ));
    let find = |nf: &str| rows.iter().find(|r| r.nf == nf && r.size == 64 && r.batch == 32);
    if let (Some(m), Some(c)) = (find("monitor"), find("counter")) {
        s.push_str(
            "
## State access per packet

",
        );
        s.push_str("The monitor does the counter's per-packet work plus keeping five host tables (per-flow and per-host packets and bytes, totals): five `counter-add` calls per batch whose keys are folded in the guest. The difference between the two is what host-owned state costs per packet (64-byte packets, batch 32).

");
        s.push_str(
            "| | counter ns/pkt | monitor ns/pkt | state cost ns/pkt |
|---|---:|---:|---:|
",
        );
        s.push_str(&format!(
            "| native | {:.1} | {:.1} | {:.1} |
",
            c.native,
            m.native,
            m.native - c.native
        ));
        s.push_str(&format!(
            "| Wasm | {:.1} | {:.1} | {:.1} |
",
            c.wasm,
            m.wasm,
            m.wasm - c.wasm
        ));
    }
    s
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

fn bar_chart(ratio: f64) -> String {
    let n = (ratio.clamp(0.0, 1.2) * 20.0).round() as usize;
    "█".repeat(n)
}

fn render(rows: &[Row], cold: &[(&str, f64, f64)], sizes: &[(&str, usize, f64)]) -> String {
    let mut s = String::new();
    s.push_str("# Benchmarks\n\n");
    s.push_str("Produced by `make bench`, which runs\n`cargo run --release -p sluice-bench -- --nfs target/nfs --write docs/benchmarks.md`.\n\n");
    s.push_str(&format!(
        "Machine: {}, {} cores. Packets from an in-memory generator (8192 TCP packets over 1024 flows, every flow opened by a SYN, then alternating directions). Each figure is the median of several samples; on a small shared virtual machine, repeated runs of `make bench` still differ by up to about 15%, so compare ratios from one run.\n\n",
        cpu_model(),
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
    ));
    s.push_str("**Ratio** is native ns/packet ÷ Wasm ns/packet: the fraction of native throughput the sandboxed NF reaches (1.00 = as fast as native). Native means the same NF crate compiled into the host and called as a Rust function through the same host code (batch building, flow state, verdicts); see `host/bench/src/native.rs`.\n\n");
    s.push_str("## Wasm vs native, per NF, packet size and batch size\n\n");
    s.push_str("| NF | kind | packet | batch | native ns/pkt | Wasm ns/pkt | ratio | |\n|---|---|---:|---:|---:|---:|---:|---|\n");
    for r in rows {
        let ratio = r.native / r.wasm;
        s.push_str(&format!(
            "| {} | {} | {} B | {} | {:.1} | {:.1} | {:.2} | {} |\n",
            r.nf,
            r.kind,
            r.size,
            r.batch,
            r.native,
            r.wasm,
            ratio,
            bar_chart(ratio)
        ));
    }
    s.push_str("\n## Call overhead of the empty NF\n\n");
    s.push_str("The host's own per-packet work (parsing, building the batch) is in both columns; the difference is what one Wasm call per batch adds.\n\n");
    s.push_str("| packet | batch | Wasm ns/batch | Wasm ns/pkt | native ns/pkt | overhead ns/pkt |\n|---:|---:|---:|---:|---:|---:|\n");
    for r in rows.iter().filter(|r| r.nf == "noop") {
        s.push_str(&format!(
            "| {} B | {} | {:.0} | {:.1} | {:.1} | {:.1} |\n",
            r.size,
            r.batch,
            r.wasm * r.batch as f64,
            r.wasm,
            r.native,
            r.wasm - r.native
        ));
    }
    s.push_str("\n## Instantiate per batch (cold) vs instantiate once (warm)\n\n");
    s.push_str("One 32-packet batch of 64-byte packets. Cold creates a store, instantiates the component and runs `init` for every batch — the classic one-instance-per-event serverless model; warm is Sluice's model.\n\n");
    s.push_str("| NF | warm ns/batch | cold ns/batch | cold ÷ warm |\n|---|---:|---:|---:|\n");
    for (nf, w, c) in cold {
        s.push_str(&format!("| {nf} | {w:.0} | {c:.0} | {:.1}× |\n", c / w));
    }
    s.push_str("\n## Components\n\n| NF | size | instantiate + init |\n|---|---:|---:|\n");
    for (nf, size, ns) in sizes {
        s.push_str(&format!("| {nf} | {:.1} KiB | {:.1} µs |\n", *size as f64 / 1024.0, ns / 1000.0));
    }
    let find =
        |nf: &str, size: usize, batch: usize| rows.iter().find(|r| r.nf == nf && r.size == size && r.batch == batch);
    s.push_str("\n## Targets (64-byte packets, batch 32)\n\n| target | goal | reached |\n|---|---|---|\n");
    if let Some(r) = find("counter", 64, 32) {
        s.push_str(&format!("| stateless NF (counter) vs native | ≥ 0.80× | {:.2}× |\n", r.native / r.wasm));
    }
    if let Some(r) = find("firewall", 64, 32) {
        s.push_str(&format!("| stateful firewall vs native | ≥ 0.60× | {:.2}× |\n", r.native / r.wasm));
    }
    if let Some(r) = find("noop", 64, 32) {
        s.push_str(&format!("| empty-NF call overhead | ≤ 10 ns/pkt | {:.1} ns/pkt |\n", r.wasm - r.native));
    }
    s
}
