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
pub fn measure(
    sdk_root: &Path,
    scratch: &Path,
    frames: &[Vec<u8>],
    langs: &[Lang],
    bench: &Bench,
) -> Result<Vec<LangRow>> {
    // Projects reach the SDK through their link to its installed copy.
    let sdk = Sdk::locate(Some(sdk_root))?.for_projects()?;
    let packets = raw(frames);
    let mut rows = Vec::new();
    for &lang in langs {
        let Some(bytes) = build(&sdk, sdk_root, scratch, "firewall", lang)? else { continue };
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

/// Builds the conformance suite's `case` NF in `lang` with `sluice nf
/// build`'s code path in a fresh project under `scratch`; None when the
/// case has no source in that language.
pub fn build(sdk: &Sdk, sdk_root: &Path, scratch: &Path, case: &str, lang: Lang) -> Result<Option<Vec<u8>>> {
    let source = sdk_root.join("tests/conformance").join(case).join(format!("nf.{}", lang.extension()));
    let Ok(text) = std::fs::read_to_string(&source) else {
        eprintln!("  {lang}: no {} — skipped", source.display());
        return Ok(None);
    };
    eprintln!("  {lang}: building {case} ...");
    let opts = BuildOptions { cargo_target_dir: Some(sdk_root.join("target/conformance-rust")), cache_dir: None };
    let dir = scratch.join(format!("{case}-{}", lang.name()));
    let _ = std::fs::remove_dir_all(&dir);
    sluice_cli::scaffold::write_sources(sdk, &dir, case, lang, &text)?;
    let built = sluice_cli::build(&Project::open(&dir)?, sdk, &opts)
        .with_context(|| format!("building the {lang} {case} NF (run `make setup`)"))?;
    Ok(Some(std::fs::read(&built.path)?))
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

/// One interpreted language's edit loop: what `sluice nf build` costs
/// (the toolchain, then the contract check's compile) on a fresh
/// machine, on an unchanged project and after a one-line edit.
pub struct EditRow {
    lang: Lang,
    /// First build: toolchain and compile, empty caches.
    cold_s: f64,
    /// The same sources again: the component kept, loaded from the
    /// module cache.
    unchanged_s: f64,
    /// After a one-line edit: the toolchain's share ...
    edit_toolchain_s: f64,
    /// ... and the check's compile, with the function cache ...
    edit_compile_s: f64,
    /// ... and, for the same component, without it (the module cache
    /// alone, as before the function cache).
    edit_compile_uncached_s: f64,
}

/// Builds the conformance firewall in Python and JavaScript three times as
/// `sluice nf build` does (with its caches, in a fresh directory): cold,
/// unchanged, and after appending a comment line to the source.
pub fn edit_loop(sdk_root: &Path, scratch: &Path) -> Result<Vec<EditRow>> {
    let sdk = Sdk::locate(Some(sdk_root))?.for_projects()?;
    let mut rows = Vec::new();
    for lang in [Lang::Python, Lang::Js] {
        let source = sdk_root.join("tests/conformance/firewall").join(format!("nf.{}", lang.extension()));
        let text = std::fs::read_to_string(&source).with_context(|| format!("reading {}", source.display()))?;
        let dir = scratch.join(format!("edit-{}", lang.name()));
        let _ = std::fs::remove_dir_all(&dir);
        sluice_cli::scaffold::write_sources(&sdk, &dir, "firewall", lang, &text)?;
        let project = Project::open(&dir)?;
        let cache = scratch.join(format!("edit-{}-cache", lang.name()));
        let _ = std::fs::remove_dir_all(&cache);
        let opts = BuildOptions { cargo_target_dir: None, cache_dir: Some(cache.clone()) };
        let timed = || -> Result<(f64, f64)> {
            let started = Instant::now();
            let built = sluice_cli::build(&project, &sdk, &opts)
                .with_context(|| format!("building the {lang} firewall (run `make setup`)"))?;
            Ok((started.elapsed().as_secs_f64(), built.build_time.as_secs_f64()))
        };
        eprintln!("  {lang}: cold build ...");
        let (cold_s, _) = timed()?;
        eprintln!("  {lang}: unchanged ...");
        let (unchanged_s, _) = timed()?;
        eprintln!("  {lang}: a one-line edit ...");
        let comment = if lang == Lang::Python { "# edited\n" } else { "// edited\n" };
        std::fs::write(project.source(), format!("{text}{comment}"))?;
        let (edit_s, edit_toolchain_s) = timed()?;
        let fresh = scratch.join(format!("edit-{}-cache-fresh", lang.name()));
        let _ = std::fs::remove_dir_all(&fresh);
        let started = Instant::now();
        sluice_cli::check::check_file(&project.component(), "firewall", Some(lang), Some(&fresh))?;
        let edit_compile_uncached_s = started.elapsed().as_secs_f64();
        rows.push(EditRow {
            lang,
            cold_s,
            unchanged_s,
            edit_toolchain_s,
            edit_compile_s: edit_s - edit_toolchain_s,
            edit_compile_uncached_s,
        });
    }
    Ok(rows)
}

/// The Markdown section of [`edit_loop`].
pub fn render_edit_loop(rows: &[EditRow]) -> String {
    let mut s = String::from("\n## The edit loop of an interpreted NF\n\n");
    s.push_str(
        "`sluice nf build`'s code path on the conformance firewall in a fresh project with empty caches: the first \
         build, the same sources again, and the build after appending one comment line to the source, split into \
         the toolchain (componentize-py, esbuild + componentize-js) and the contract check's compile. An unchanged \
         project keeps its component (its sources, SDK and toolchain digest match the last build's), which \
         the module cache then loads. After an edit the compile takes the functions it compiled before from the \
         function cache (`cache_dir/functions`); **without** is the same component compiled with the module \
         cache alone. `sluice nf test` adds the run of its cases (tens of milliseconds) to these.\n\n",
    );
    s.push_str(
        "| language | first build | unchanged | edit: toolchain | edit: compile | edit: compile without the function cache | edit: total |\n|---|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        s.push_str(&format!(
            "| {} | {:.1} s | {:.2} s | {:.1} s | {:.1} s | {:.1} s | {:.1} s |\n",
            r.lang,
            r.cold_s,
            r.unchanged_s,
            r.edit_toolchain_s,
            r.edit_compile_s,
            r.edit_compile_uncached_s,
            r.edit_toolchain_s + r.edit_compile_s
        ));
    }
    s.push_str(
        "\nThe toolchain's share cannot shrink here: componentize-py 0.25.1 compiles the whole CPython component \
         with Cranelift on every build (about three quarters of its time) and has no code cache, and both \
         toolchains snapshot a running interpreter whose memory holds random hash seeds, clocks and temporary \
         paths, so their output differs on every run; an unchanged project therefore keeps its component instead \
         of rebuilding it.\n",
    );
    s
}
