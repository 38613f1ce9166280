//! The cross-language conformance suite: every case in
//! `tests/conformance/<case>/` holds an input capture, the NF's config
//! (`config.txt`), the expected output (`expected.pcap`, byte for byte,
//! and `expected.json`: meters, events and tables) and the same NF in each
//! language (`nf.rs`, `nf.c`, `nf.py`, `nf.js`, `nf.go`). Each present source is
//! built with `sluice nf build`'s code path and run through the real host;
//! a missing source skips that language for that case, and says so.
//!
//! `SLUICE_BLESS=1` rewrites the expected files from the Rust NF (review
//! the diff: the other languages must then agree with it).

use serde_json::Value;
use sluice_cli::{BuildOptions, Lang, Project, Sdk};
use sluice_traffic::Spread;
use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// Builds the case's NF in `lang` (if its source exists) into a component
/// named after the case.
fn build(case: &str, lang: Lang, scratch: &Path) -> Option<PathBuf> {
    let dir = workspace().join("tests/conformance").join(case);
    let source = dir.join(format!("nf.{}", lang.extension()));
    if !source.exists() {
        println!("skip {case}/{lang}: no {}", source.file_name().unwrap().to_string_lossy());
        return None;
    }
    // The copy projects build against; installed once per process (the
    // install names its scratch directory after the process, so parallel
    // tests must not race to write it).
    static SDK: std::sync::OnceLock<Sdk> = std::sync::OnceLock::new();
    let sdk = SDK.get_or_init(|| Sdk::locate(Some(&workspace())).unwrap().for_projects().unwrap());
    let project_dir = scratch.join(lang.name());
    let text = std::fs::read_to_string(&source).unwrap();
    sluice_cli::scaffold::write_sources(sdk, &project_dir, case, lang, &text).unwrap();
    let project = Project::open(&project_dir).unwrap();
    let opts = BuildOptions {
        cargo_target_dir: Some(workspace().join("target/conformance-rust")),
        cache_dir: Some(workspace().join("target/sluice-cache")),
    };
    let built = sluice_cli::build(&project, sdk, &opts).unwrap_or_else(|e| panic!("{case}/{lang}: {e}"));
    assert_eq!(built.contract, sluice_cli::sdk::contract_version(lang));
    Some(built.path)
}

/// What a run must reproduce besides the output bytes.
fn summary(report: &sluice_host::Report) -> Value {
    report.expected()
}

fn run(case: &str, component: &Path, scratch: &Path, workers: usize, spread: Spread) -> (Vec<u8>, Value) {
    let dir = workspace().join("tests/conformance").join(case);
    let config = std::fs::read_to_string(dir.join("config.txt")).unwrap_or_default();
    let (output, report) = run_with(case, component, scratch, workers, spread, &config);
    (output, summary(&report))
}

/// Runs the case's NF with `config` instead of the case's own.
fn run_with(
    case: &str,
    component: &Path,
    scratch: &Path,
    workers: usize,
    spread: Spread,
    config: &str,
) -> (Vec<u8>, sluice_host::Report) {
    let dir = workspace().join("tests/conformance").join(case);
    // A generous deadline: this suite compares outputs, and the interpreted
    // languages share two cores with the builds of the other cases, which
    // can stretch a 200 µs batch past the default 10 ms.
    let toml = format!(
        "batch-size = 32\n[nf.{case}]\nfailure-policy = \"fail-closed\"\ndeadline-ms = 5000\nconfig-text = {}\n",
        toml_string(config)
    );
    let mut c = sluice_tests::host_config(scratch, &toml);
    c.workers = workers;
    c.spread = spread;
    let output =
        scratch.join(format!("{}.{workers}.{spread}.out.pcap", component.file_stem().unwrap().to_string_lossy()));
    let opts = sluice_host::RunOptions {
        nfs: vec![component.to_path_buf()],
        chain: None,
        swaps: vec![],
        input: dir.join("input.pcap"),
        output: Some(output.clone()),
        progress: false,
    };
    let report = sluice_host::run(&c, &opts).unwrap();
    (std::fs::read(&output).unwrap(), report)
}

fn toml_string(s: &str) -> String {
    format!("\"{}\"", s.trim_end().replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n"))
}

fn conformance(case: &str) {
    conformance_on(case, &[1], Spread::Flow);
}

/// Runs the case on each worker count, packets spread over the workers as
/// `spread` says: the first must match every expected file, the others the
/// output bytes and the tables (meters count calls, which grow with the
/// workers).
fn conformance_on(case: &str, worker_counts: &[usize], spread: Spread) {
    let dir = workspace().join("tests/conformance").join(case);
    let bless = std::env::var_os("SLUICE_BLESS").is_some();
    let mut ran = Vec::new();
    for lang in Lang::ALL {
        let scratch = tempfile::tempdir().unwrap();
        let Some(component) = build(case, lang, scratch.path()) else { continue };
        let (pcap, summary) = run(case, &component, scratch.path(), worker_counts[0], spread);
        assert_eq!(summary["meters"]["traps"], 0, "{case}/{lang} trapped: {summary:#}");
        assert_eq!(summary["meters"]["errors"], 0, "{case}/{lang} failed batches: {summary:#}");
        if bless && lang == Lang::Rust {
            std::fs::write(dir.join("expected.pcap"), &pcap).unwrap();
            std::fs::write(dir.join("expected.json"), serde_json::to_string_pretty(&summary).unwrap() + "\n").unwrap();
        }
        let expected_pcap = std::fs::read(dir.join("expected.pcap")).unwrap();
        let expected: Value = serde_json::from_slice(&std::fs::read(dir.join("expected.json")).unwrap()).unwrap();
        assert!(
            pcap == expected_pcap,
            "{case}/{lang}: output differs from expected.pcap ({} vs {} bytes)",
            pcap.len(),
            expected_pcap.len()
        );
        assert_eq!(summary, expected, "{case}/{lang}: meters, events or tables differ from expected.json");
        println!("{case}/{lang}: identical ({} output bytes)", pcap.len());
        for &workers in &worker_counts[1..] {
            let (pcap_n, summary_n) = run(case, &component, scratch.path(), workers, spread);
            assert!(
                pcap_n == expected_pcap,
                "{case}/{lang} on {workers} workers: output differs from expected.pcap ({} vs {} bytes)",
                pcap_n.len(),
                expected_pcap.len()
            );
            assert_eq!(summary_n["tables"], expected["tables"], "{case}/{lang} on {workers} workers: tables differ");
            assert_eq!(summary_n["packets_dropped"], expected["packets_dropped"]);
            println!("{case}/{lang} on {workers} workers: identical");
        }
        ran.push(lang);
    }
    assert!(ran.contains(&Lang::Rust), "{case}: the Rust NF is the reference and must be present");
}

#[test]
fn counter_in_every_language() {
    conformance("counter");
}

#[test]
fn firewall_in_every_language() {
    conformance("firewall");
}

#[test]
fn rewriter_in_every_language() {
    conformance("rewriter");
}

#[test]
fn events_in_every_language() {
    conformance("events");
}

#[test]
fn tables_in_every_language() {
    conformance("tables");
}

#[test]
fn expiry_in_every_language() {
    conformance("expiry");
}

/// Every table kind declared through each SDK's helpers with a capacity and
/// an idle timeout, typed config getters, IPv6 addresses, and the index of
/// the item a full table refused.
#[test]
fn declare_in_every_language() {
    conformance("declare");
    let expected: Value =
        serde_json::from_slice(&std::fs::read(workspace().join("tests/conformance/declare/expected.json")).unwrap())
            .unwrap();
    // The case means something: the capacity refused sources (their
    // packets dropped, the index reported), and IPv6 packets were seen.
    let events = expected["events"].as_array().unwrap();
    let full: Vec<&Value> = events.iter().filter(|e| e["kind"] == "conformance.full").collect();
    assert!(!full.is_empty(), "{expected:#}");
    assert!(full.iter().any(|e| e["fields"]["item"] != "0"), "{expected:#}");
    assert!(expected["packets_dropped"].as_u64().unwrap() > 0, "{expected:#}");
    assert!(events.iter().any(|e| e["kind"] == "conformance.v6"), "{expected:#}");
    assert_eq!(expected["tables"]["weights"]["entries"], 3, "{expected:#}");
    assert_eq!(expected["tables"]["names"]["entries"], 1, "{expected:#}");
}

/// Single-writer tables: a per-source SYN guard whose decisions span
/// flows gives the same output on one worker and on two.
#[test]
fn guard_in_every_language_on_one_and_two_workers() {
    conformance_on("guard", &[1, 2], Spread::Flow);
    let expected: Value =
        serde_json::from_slice(&std::fs::read(workspace().join("tests/conformance/guard/expected.json")).unwrap())
            .unwrap();
    // The case means something: the guard dropped packets and blocked
    // sources.
    assert!(expected["packets_dropped"].as_u64().unwrap() > 0, "{expected:#}");
    assert!(expected["tables"]["blocked"]["entries"].as_u64().unwrap() > 0, "{expected:#}");
}

/// Single-writer tables read and written packet by packet: a knock gate
/// whose clients knock a millisecond apart, ten times closer than the
/// table's sync interval. Spread by addresses, every knock of a client
/// meets its earlier ones on one worker, which reads its own writes, so
/// two workers give one worker's output; spread by flow, the knocks land
/// on both workers, and a knock read on the other worker before a sync
/// misses the one before it.
#[test]
fn knock_in_every_language_on_one_and_two_workers_spread_by_addresses() {
    conformance_on("knock", &[1, 2], Spread::Addresses);
    let dir = workspace().join("tests/conformance/knock");
    let expected: Value = serde_json::from_slice(&std::fs::read(dir.join("expected.json")).unwrap()).unwrap();
    // The case means something: knocks opened the gate for 202 clients
    // (their stage is 3), 100 knocked only twice, and the connections of
    // those and of the three that did not knock right were dropped.
    assert_eq!(expected["packets_dropped"], 103, "{expected:#}");
    let stages: Vec<&Value> =
        expected["tables"]["stage"]["bytes"].as_array().unwrap().iter().map(|e| &e["value"]).collect();
    assert_eq!(stages.iter().filter(|v| **v == "03").count(), 202, "{expected:#}");
    assert_eq!(stages.iter().filter(|v| **v == "02").count(), 100, "{expected:#}");
    // Spread by flow, two workers do not give that output.
    let scratch = tempfile::tempdir().unwrap();
    let component = build("knock", Lang::Rust, scratch.path()).unwrap();
    let (by_flow, _) = run("knock", &component, scratch.path(), 2, Spread::Flow);
    assert!(by_flow != std::fs::read(dir.join("expected.pcap")).unwrap(), "knocks spread by flow all passed");
}

/// Listing a table (`sluice:nf@0.4.0`): `top-k` and a paged `scan` of a
/// counter table, and a paged `scan` of a byte table.
#[test]
fn scan_in_every_language() {
    conformance("scan");
    let expected: Value =
        serde_json::from_slice(&std::fs::read(workspace().join("tests/conformance/scan/expected.json")).unwrap())
            .unwrap();
    // The case means something: scans took several pages, walked every
    // entry the table holds in ascending order, and the last one counted
    // every TCP packet.
    let scans: Vec<&Value> =
        expected["events"].as_array().unwrap().iter().filter(|e| e["kind"] == "conformance.scan").collect();
    assert!(scans.len() > 1, "{expected:#}");
    let last = scans.last().unwrap();
    assert!(last["fields"]["pages"].as_str().unwrap().parse::<u64>().unwrap() > 2, "{expected:#}");
    assert!(
        scans.iter().all(|e| e["fields"]["ascending"] == "yes" && e["fields"]["names"] == "dns,http,https,ntp,ssh")
    );
    assert_eq!(last["fields"]["entries"], expected["tables"]["ports"]["entries"].to_string(), "{expected:#}");
}

/// The reference output of the rewriter is right on its own terms, not
/// only equal across languages: tshark finds no more bad checksums than
/// the input had, and no address of the translated prefix is left.
#[test]
fn rewriter_reference_output_has_valid_checksums() {
    let dir = workspace().join("tests/conformance/rewriter");
    let bad_in = crate::nat::tshark_bad_checksums(&dir.join("input.pcap"));
    let bad_out = crate::nat::tshark_bad_checksums(&dir.join("expected.pcap"));
    assert_eq!(bad_out, bad_in, "the translation broke checksums");
    let frames = sluice_tests::read_pcap(&dir.join("expected.pcap"));
    let translated = frames.iter().filter(|f| f.windows(3).any(|w| w == [192, 0, 2])).count();
    assert!(translated > 100, "only {translated} frames carry 192.0.2.0/24");
    let left = frames.iter().filter(|f| f.windows(3).any(|w| w == [198, 51, 100])).count();
    assert_eq!(left, 0, "{left} frames still carry 198.51.100.0/24");
}

/// Flow offload (`sluice:nf@0.5.0`): a firewall that offloads established
/// flows with a DSCP change and adds the returned counts to its table gives,
/// in every language and on one and two workers, the output bytes, events
/// and tables of the same NF without offload (the case's expected files),
/// while most packets pass without a call.
#[test]
fn offload_in_every_language_on_one_and_two_workers_matches_a_run_without_offload() {
    conformance("offload");
    let case = "offload";
    let dir = workspace().join("tests/conformance").join(case);
    let expected_pcap = std::fs::read(dir.join("expected.pcap")).unwrap();
    let expected: Value = serde_json::from_slice(&std::fs::read(dir.join("expected.json")).unwrap()).unwrap();
    // The case means something: packets were dropped, forwarded packets
    // counted, and every forwarded packet had its DSCP set.
    assert!(expected["packets_dropped"].as_u64().unwrap() > 0, "{expected:#}");
    let counted = expected["tables"]["forwarded"]["values"].as_array().unwrap().iter().find(|v| v[0] == 0).unwrap();
    assert_eq!(counted[1], expected["packets_out"], "{expected:#}");
    assert_eq!(expected["meters"]["rewritten"], expected["packets_out"], "{expected:#}");
    let config = std::fs::read_to_string(dir.join("config.txt")).unwrap();
    assert!(config.contains("offload=false"), "{config}");
    // At each direction's first eligible packet, and (the SDKs' admission
    // counts) at its fourth: the same output, fewer packets offloaded.
    let at_once = config.replace("offload=false", "offload=true");
    let after_4 = format!("{at_once}offload-after=4\n");
    for lang in Lang::ALL {
        let scratch = tempfile::tempdir().unwrap();
        let Some(component) = build(case, lang, scratch.path()) else { continue };
        for workers in [1, 2] {
            let mut offloaded = Vec::new();
            for (after, config) in [(1, &at_once), (4, &after_4)] {
                let (pcap, report) = run_with(case, &component, scratch.path(), workers, Spread::Flow, config);
                let summary = summary(&report);
                let what = format!("{case}/{lang} with offload (after {after}) on {workers} workers");
                assert_eq!(summary["meters"]["traps"], 0, "{what} trapped: {summary:#}");
                assert_eq!(summary["meters"]["errors"], 0, "{what}: failed batches: {summary:#}");
                assert!(
                    pcap == expected_pcap,
                    "{what}: output differs from the run without offload ({} vs {} bytes)",
                    pcap.len(),
                    expected_pcap.len()
                );
                assert_eq!(summary["tables"], expected["tables"], "{what}: tables differ");
                assert_eq!(summary["events"], expected["events"], "{what}: events differ");
                assert_eq!(summary["packets_dropped"], expected["packets_dropped"], "{what}");
                let m = &report.nfs[0].meters;
                assert_eq!(
                    m.packets + m.offloaded_packets,
                    expected["meters"]["packets"].as_u64().unwrap(),
                    "{what}: every packet either reached the NF or passed under an entry"
                );
                assert!(
                    m.offloaded_packets * 4 > m.packets,
                    "{what}: only {} of {} packets offloaded",
                    m.offloaded_packets,
                    m.packets + m.offloaded_packets
                );
                println!(
                    "{what}: identical, {} of {} packets offloaded",
                    m.offloaded_packets,
                    m.packets + m.offloaded_packets
                );
                offloaded.push(m.offloaded_packets);
            }
            // Where a batch holds several packets of a flow, the entry is
            // made when the batch ends either way; on one worker the
            // case's batches are such that waiting costs some packets.
            let (first, fourth) = (offloaded[0], offloaded[1]);
            assert!(
                fourth > 0 && fourth <= first && (workers > 1 || fourth < first),
                "{case}/{lang} on {workers} workers: offloaded at the first packet {first}, at the fourth {fourth}"
            );
        }
    }
}
