//! The same NF in every guest language: the conformance suite's stateful
//! firewall (`tests/conformance/firewall/nf.*`), built with `sluice nf
//! build`'s code path and run through the same runtime, against the Rust
//! build of it. Also each component's size, compile time and
//! instantiate-plus-init time, which differ by orders of magnitude between
//! languages that embed an interpreter (Python, JavaScript) and those that
//! do not.

use crate::{Bench, raw};
use anyhow::{Context, Result};
use sluice_cli::{BuildOptions, Lang, Project, Sdk};
use sluice_runtime::{Chain, NfInstance, NfLimits, NfSpec, Runtime, RuntimeConfig};
use std::path::Path;
use std::time::Instant;

/// The conformance firewall's configuration: the generator's clients are
/// in 10.1.0.0/16, so every connection is opened from inside.
const CONFIG: &str = "inside=10.0.0.0/8";

/// Batch sizes: 1 shows the fixed cost of a call into each language's
/// runtime, the larger ones how far batching amortizes it.
pub const BATCHES: [usize; 3] = [1, 32, 256];

/// One language's measurements.
pub struct LangRow {
    lang: Lang,
    size: usize,
    compile_ms: f64,
    instantiate_us: f64,
    /// ns per packet, per entry of [`BATCHES`].
    ns_per_pkt: Vec<f64>,
}

/// Builds the firewall in each language present and measures it over
/// `frames`.
pub fn measure(sdk_root: &Path, scratch: &Path, frames: &[Vec<u8>], bench: &Bench) -> Result<Vec<LangRow>> {
    let sdk = Sdk::locate(Some(sdk_root))?;
    let case = sdk_root.join("tests/conformance/firewall");
    let opts = BuildOptions { cargo_target_dir: Some(sdk_root.join("target/conformance-rust")), cache_dir: None };
    let packets = raw(frames);
    let mut rows = Vec::new();
    for lang in Lang::ALL {
        let source = case.join(format!("nf.{}", lang.extension()));
        let Ok(text) = std::fs::read_to_string(&source) else {
            eprintln!("  {lang}: no {} — skipped", source.display());
            continue;
        };
        eprintln!("  {lang}: building ...");
        let dir = scratch.join(lang.name());
        let _ = std::fs::remove_dir_all(&dir);
        sluice_cli::scaffold::write_sources(&sdk, &dir, "firewall", lang, &text)?;
        let built = sluice_cli::build(&Project::open(&dir)?, &sdk, &opts)
            .with_context(|| format!("building the {lang} firewall (run `make setup`)"))?;
        let bytes = std::fs::read(&built.path)?;
        // A fresh runtime without a code cache, so compile time is real.
        let runtime = Runtime::new(RuntimeConfig::default())?;
        let started = Instant::now();
        let module = runtime.load("firewall", &bytes)?;
        let compile_ms = started.elapsed().as_secs_f64() * 1e3;
        let spec = NfSpec { module, config: CONFIG.as_bytes().into(), limits: NfLimits::default(), owner: None };
        let instantiate_us = bench.per_call(|| {
            let _ = NfInstance::new(&runtime, spec.clone());
        }) / 1e3;
        let mut ns_per_pkt = Vec::new();
        for batch in BATCHES {
            eprintln!("  {lang}: batch {batch} ...");
            let mut chain = Chain::new(&runtime, std::slice::from_ref(&spec))?;
            ns_per_pkt.push(bench.per_packet(&mut chain, &packets, batch));
        }
        rows.push(LangRow { lang, size: bytes.len(), compile_ms, instantiate_us, ns_per_pkt });
    }
    Ok(rows)
}

/// The Markdown section.
pub fn render(rows: &[LangRow], packets: usize) -> String {
    let mut s = String::new();
    s.push_str("\n## The same firewall in each guest language\n\n");
    s.push_str(&format!(
        "The conformance suite's stateful firewall (`tests/conformance/firewall/nf.*`: per-flow state, inside-out \
         connections), built by `sluice nf build`'s code path and run through the same runtime over {packets} \
         64-byte packets; every build produces byte-identical output (`make test`). **vs Rust** is the Rust \
         build's ns/packet ÷ this language's at the same batch size. Compile is wasmtime's compilation of the \
         component (without the code cache); instantiate is a new instance plus `init`.\n\n"
    ));
    let header: Vec<String> = crate::languages::BATCHES.iter().map(|b| format!("batch {b} ns/pkt")).collect();
    s.push_str(&format!(
        "| language | component | compile | instantiate + init | {} | vs Rust (batch 32) | |\n|---|---:|---:|---:|{}---:|---|\n",
        header.join(" | "),
        "---:|".repeat(header.len())
    ));
    let rust = rows.iter().find(|r| r.lang == Lang::Rust);
    let at32 = BATCHES.iter().position(|b| *b == 32).unwrap_or(0);
    for r in rows {
        let ns: Vec<String> = r.ns_per_pkt.iter().map(|n| format!("{n:.0}")).collect();
        let ratio =
            rust.and_then(|base| Some(base.ns_per_pkt.get(at32)? / r.ns_per_pkt.get(at32)?)).unwrap_or(f64::NAN);
        s.push_str(&format!(
            "| {} | {} | {:.0} ms | {} | {} | {} | {} |\n",
            r.lang,
            human_size(r.size),
            r.compile_ms,
            human_time(r.instantiate_us),
            ns.join(" | "),
            if ratio >= 0.1 { format!("{ratio:.2}") } else { format!("{ratio:.3}") },
            crate::bar_chart(ratio)
        ));
    }
    s.push_str("\nBatching matters most where a call is expensive: from batch 1 to batch 256, ns/packet falls by ");
    let falls: Vec<String> = rows
        .iter()
        .filter_map(|r| Some(format!("{:.1}× ({})", r.ns_per_pkt.first()? / r.ns_per_pkt.last()?, r.lang)))
        .collect();
    s.push_str(&falls.join(", "));
    s.push_str(". The Python and JavaScript SDKs decode a batch's descriptors once per call and build packet views from them; no SDK calls the host per packet.\n");
    s
}

fn human_size(bytes: usize) -> String {
    if bytes >= 1 << 20 {
        format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
    } else {
        format!("{:.0} KiB", bytes as f64 / 1024.0)
    }
}

fn human_time(us: f64) -> String {
    if us >= 1000.0 { format!("{:.1} ms", us / 1000.0) } else { format!("{us:.0} µs") }
}
