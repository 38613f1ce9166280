//! `sluice nf test`: a project's test cases, in the shape of the
//! conformance suite. Each folder `tests/<case>/` holds
//!
//! | file | what |
//! |---|---|
//! | `input.txt` or `input.pcap` | the traffic: text, one packet per line (`sluice_host::traffic`), or a capture |
//! | `config.txt` | the NF's configuration, if it takes one |
//! | `expected-verdicts.txt` | what became of each input packet, one line each: `3 forward 0`, `4 drop`, `5 forward 1 rewritten label 7` |
//! | `expected.pcap` | the forwarded packets, byte for byte (optional) |
//! | `expected.json` | packet counts, meters, events and tables (optional) |
//!
//! The case runs through the host's own run path, with the workers, batch
//! size and spread of the manifest's `[run]` (one worker, batches of 32,
//! spread by flow unless it or the command line says otherwise); what
//! differs from an expected file is shown as a diff. On more than one
//! worker `expected.json`'s meters are not compared: NF calls (and with
//! them state calls and declarations) grow with the workers, while the
//! output, the verdicts, the packet counts, the events and the tables
//! must not change.
//! `--bless` writes the expected files from the run instead.

use crate::error::{CliError, io};
use crate::project::Project;
use std::path::{Path, PathBuf};

/// Expected files a case may hold.
const VERDICTS: &str = "expected-verdicts.txt";
const PCAP: &str = "expected.pcap";
const SUMMARY: &str = "expected.json";

/// Lines of a diff shown per file.
const DIFF_LINES: usize = 40;

/// How one case went.
#[derive(Debug, Clone)]
pub struct CaseResult {
    /// The folder's name.
    pub name: String,
    /// Packets in its input.
    pub packets: usize,
    /// What differed, one readable block per expected file; empty: passed.
    pub failures: Vec<String>,
    /// Expected files written (`--bless`).
    pub blessed: Vec<String>,
}

impl CaseResult {
    /// Whether every expected file matched.
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

/// The case folders of `project` (`tests/*/`), sorted, or only `only`.
pub fn cases(project: &Project, only: Option<&str>) -> Result<Vec<PathBuf>, CliError> {
    let dir = project.dir.join("tests");
    let Ok(entries) = std::fs::read_dir(&dir) else { return Ok(Vec::new()) };
    let mut out: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .filter(|p| only.is_none_or(|o| p.file_name().is_some_and(|n| n == o)))
        .collect();
    out.sort();
    Ok(out)
}

/// `path` as a capture: a `.txt` traffic file (one packet per line) is
/// written as `<scratch>/input.pcap`; anything else is taken as a capture.
pub fn input_capture(path: &Path, scratch: &Path) -> Result<PathBuf, CliError> {
    if path.extension().is_none_or(|e| e != "txt") {
        std::fs::File::open(path).map_err(io("reading", path))?;
        return Ok(path.to_path_buf());
    }
    let text = std::fs::read_to_string(path).map_err(io("reading", path))?;
    let frames = sluice_host::traffic::parse(&text)
        .map_err(|e| CliError::Traffic { path: path.to_path_buf(), reason: e.to_string() })?;
    std::fs::create_dir_all(scratch).map_err(io("creating", scratch))?;
    let pcap = scratch.join("input.pcap");
    sluice_host::synth::write_pcap(&pcap, &frames).map_err(|e| CliError::Traffic {
        path: path.to_path_buf(),
        reason: format!("writing {}: {e}", pcap.display()),
    })?;
    Ok(pcap)
}

/// Runs the case in `dir` through `component` (the project's NF) and
/// compares, or with `bless` records, its expected files.
pub fn run_case(
    project: &Project,
    component: &Path,
    dir: &Path,
    run: crate::project::RunSection,
    bless: bool,
) -> Result<CaseResult, CliError> {
    let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let scratch = project.build_dir().join("tests").join(&name);
    std::fs::create_dir_all(&scratch).map_err(io("creating", &scratch))?;
    let bad = |reason: String| CliError::Case { case: name.clone(), reason };

    // The input, as a capture.
    let input = if dir.join("input.txt").is_file() {
        input_capture(&dir.join("input.txt"), &scratch).map_err(|e| bad(e.to_string()))?
    } else if dir.join("input.pcap").is_file() {
        dir.join("input.pcap")
    } else {
        return Err(bad("no input.txt or input.pcap".into()));
    };
    let (has_config, config) = match std::fs::read(dir.join("config.txt")) {
        Ok(b) => (true, String::from_utf8(b).map_err(|_| bad("config.txt is not UTF-8".into()))?),
        Err(_) => (false, String::new()),
    };

    // The manifest's limits; a case's config.txt stands for the
    // manifest's configuration. Without a deadline in the manifest, a
    // second: a case checks what the NF does, not how fast, and shares
    // the machine with builds.
    let mut host = project.host_config(has_config.then_some(config), run);
    if let Some(section) = host.nf.get_mut(&project.manifest.name) {
        section.deadline_ms.get_or_insert(1000);
    }
    let output = scratch.join("output.pcap");
    let opts = sluice_host::RunOptions {
        nfs: vec![component.to_path_buf()],
        chain: None,
        swaps: vec![],
        input,
        output: Some(output.clone()),
        progress: false,
    };
    let mut verdicts = String::new();
    let mut packets = 0usize;
    let report = sluice_host::run_observed(&host, &opts, &mut |i, r| {
        packets += 1;
        verdicts.push_str(&verdict_line(i + 1, r));
        verdicts.push('\n');
    })
    .map_err(|e| bad(format!("the run failed: {e}")))?;
    let summary = serde_json::to_string_pretty(&report.expected()).unwrap_or_default() + "\n";
    let pcap = std::fs::read(&output).map_err(io("reading", &output))?;
    let mut result = CaseResult { name: name.clone(), packets, failures: Vec::new(), blessed: Vec::new() };

    if bless {
        let write = |file: &str, bytes: &[u8]| {
            let p = dir.join(file);
            std::fs::write(&p, bytes).map_err(io("writing", &p))
        };
        write(VERDICTS, verdicts.as_bytes())?;
        write(PCAP, &pcap)?;
        write(SUMMARY, summary.as_bytes())?;
        result.blessed = vec![VERDICTS.into(), PCAP.into(), SUMMARY.into()];
        return Ok(result);
    }
    let mut compared = 0;
    if let Ok(expected) = std::fs::read_to_string(dir.join(VERDICTS)) {
        compared += 1;
        if let Some(d) = diff(&expected, &verdicts) {
            result.failures.push(format!("{VERDICTS} (- expected, + got):\n{d}"));
        }
    }
    if let Ok(expected) = std::fs::read(dir.join(PCAP)) {
        compared += 1;
        if let Some(d) = pcap_diff(&expected, &pcap) {
            result.failures.push(format!("{PCAP}: {d}"));
        }
    }
    if let Ok(expected) = std::fs::read_to_string(dir.join(SUMMARY)) {
        compared += 1;
        // Compared as JSON, shown as a diff of the pretty forms; on several
        // workers without the meters, whose call counts grow with them.
        let several = run.workers() > 1;
        let comparable = |mut v: serde_json::Value| {
            if several && let Some(o) = v.as_object_mut() {
                o.remove("meters");
            }
            v
        };
        let got = comparable(report.expected());
        let wanted = serde_json::from_str::<serde_json::Value>(&expected).ok().map(comparable);
        if wanted.as_ref() != Some(&got) {
            let expected =
                wanted.map(|v| serde_json::to_string_pretty(&v).unwrap_or_default() + "\n").unwrap_or(expected);
            let got = serde_json::to_string_pretty(&got).unwrap_or_default() + "\n";
            let d = diff(&expected, &got).unwrap_or_else(|| "not valid JSON".into());
            result.failures.push(format!("{SUMMARY} (- expected, + got):\n{d}"));
        }
    }
    if compared == 0 {
        result.failures.push(format!(
            "no expected files ({VERDICTS}, {PCAP}, {SUMMARY}): write {VERDICTS} by hand, or record the current behaviour with `sluice nf test --bless` and review it"
        ));
    }
    Ok(result)
}

/// `7 forward 0`, `8 drop`, `9 forward 1 rewritten label 3`, `10 refused`,
/// `11 reassembling`.
fn verdict_line(n: usize, r: &sluice_runtime::PacketResult) -> String {
    let mut s = match r.fate {
        sluice_runtime::Fate::Forward(port) => format!("{n} forward {port}"),
        sluice_runtime::Fate::Dropped(_) => format!("{n} drop"),
        sluice_runtime::Fate::Refused => format!("{n} refused"),
        sluice_runtime::Fate::Reassembling => format!("{n} reassembling"),
    };
    if r.data.is_some() {
        s.push_str(" rewritten");
    }
    if let Some(l) = r.label {
        s.push_str(&format!(" label {l}"));
    }
    s
}

/// A unified diff of two texts (whitespace at line ends ignored), at most
/// [`DIFF_LINES`] lines of it; `None` when they agree.
fn diff(expected: &str, got: &str) -> Option<String> {
    let norm = |t: &str| t.lines().map(str::trim_end).filter(|l| !l.is_empty()).collect::<Vec<_>>().join("\n") + "\n";
    let (e, g) = (norm(expected), norm(got));
    if e == g {
        return None;
    }
    let text = similar::TextDiff::from_lines(&e, &g).unified_diff().context_radius(2).to_string();
    let lines: Vec<&str> = text.lines().collect();
    let mut shown = lines.iter().take(DIFF_LINES).copied().collect::<Vec<_>>().join("\n");
    if lines.len() > DIFF_LINES {
        shown.push_str(&format!("\n… {} more lines", lines.len() - DIFF_LINES));
    }
    Some(shown)
}

/// Where two captures' packets first differ; `None` when they are equal.
fn pcap_diff(expected: &[u8], got: &[u8]) -> Option<String> {
    if expected == got {
        return None;
    }
    let read = |b: &[u8]| -> Result<Vec<(u64, Vec<u8>)>, String> {
        let trace = sluice_pcap::Trace::from_bytes(Path::new("capture"), b.into()).map_err(|e| e.to_string())?;
        Ok(trace.packets().iter().map(|p| (p.timestamp_ns, trace.data(p).to_vec())).collect())
    };
    let (e, g) = match (read(expected), read(got)) {
        (Ok(e), Ok(g)) => (e, g),
        (Err(e), _) => return Some(format!("the expected capture does not read: {e}")),
        (_, Err(e)) => return Some(format!("the output capture does not read: {e}")),
    };
    for (i, (a, b)) in e.iter().zip(&g).enumerate() {
        if a.1 != b.1 {
            let at = a.1.iter().zip(&b.1).position(|(x, y)| x != y).unwrap_or(a.1.len().min(b.1.len()));
            return Some(format!(
                "forwarded packet {} differs at byte {at} (expected {} bytes, got {})",
                i + 1,
                a.1.len(),
                b.1.len()
            ));
        }
        if a.0 != b.0 {
            return Some(format!("forwarded packet {} has time {} ns, expected {}", i + 1, b.0, a.0));
        }
    }
    Some(format!("{} packets forwarded, expected {}", g.len(), e.len()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_diff_shows_the_changed_lines_only() {
        assert!(diff("1 forward 0\n2 drop\n", "1 forward 0  \n2 drop\n").is_none());
        let d = diff("1 forward 0\n2 drop\n3 forward 0\n", "1 forward 0\n2 forward 0\n3 forward 0\n").unwrap();
        assert!(d.contains("-2 drop") && d.contains("+2 forward 0"), "{d}");
        assert!(!d.contains("-1 forward 0"), "{d}");
    }
}
