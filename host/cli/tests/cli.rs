//! The `sluice-host` binary as a user runs it: exit codes and messages.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_sluice-host"));
    c.env("SLUICE_CACHE_DIR", "").env("SLUICE_LOG", "warn").env_remove("SLUICE_CONFIG");
    c
}

fn nfs_dir() -> PathBuf {
    std::env::var("SLUICE_NFS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/nfs"))
}

fn nf(name: &str) -> PathBuf {
    let p = nfs_dir().join(format!("{name}.wasm"));
    assert!(p.exists(), "{} missing: run `make nfs`", p.display());
    p
}

/// `sluice-host [--config cfg] run --nf <nf> --in <input>`.
fn run_cmd(config: Option<&Path>, nf: &Path, input: &Path) -> Command {
    let mut c = bin();
    if let Some(cfg) = config {
        c.arg("--config").arg(cfg);
    }
    c.args(["run", "--nf"]).arg(nf).arg("--in").arg(input);
    c
}

fn text(o: &Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

fn synth(dir: &Path) -> PathBuf {
    let p = dir.join("in.pcap");
    let o = bin().args(["synth", "--out"]).arg(&p).args(["--sessions", "300"]).output().unwrap();
    assert!(o.status.success(), "{:?}", text(&o));
    p
}

#[test]
fn run_prints_a_summary_and_writes_output_and_report() {
    let dir = tempfile::tempdir().unwrap();
    let input = synth(dir.path());
    let out = dir.path().join("out.pcap");
    let report = dir.path().join("r.json");
    let o = run_cmd(None, &nf("counter"), &input).arg("--out").arg(&out).arg("--report").arg(&report).output().unwrap();
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("packets:") && stdout.contains("Mpps"), "{stdout}");
    assert!(stdout.contains(&format!("output: {}", out.display())), "{stdout}");
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    for key in ["packets_in", "packets_out", "packets_dropped", "batches"] {
        assert!(r[key].is_u64(), "{key} missing in {r}");
    }
    for key in ["name", "invocations", "packets", "bytes", "cpu_ns", "traps"] {
        assert!(!r["nfs"][0][key].is_null(), "nfs[0].{key} missing in {r}");
    }
    // The counter forwards every packet, the synthetic trace's damaged
    // frames too: the capture says they were cut (their wire length is
    // the whole frame's), so the chain hands them to the NF as truncated.
    assert_eq!(r["packets_in"], r["packets_out"]);
    assert_eq!(r["chain"]["refused_cut_short"], 0, "{r}");
    assert_eq!(r["chain"]["order"], serde_json::json!(["counter"]), "{r}");
}

#[test]
fn a_rejected_config_exits_2_with_the_nfs_message() {
    let dir = tempfile::tempdir().unwrap();
    let input = synth(dir.path());
    let cfg = dir.path().join("host.toml");
    std::fs::write(&cfg, "[nf.firewall.config]\nrules = [{ action = \"maybe\" }]\n").unwrap();
    let o = run_cmd(Some(&cfg), &nf("firewall"), &input).output().unwrap();
    let (_, stderr) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("NF 'firewall' rejected its configuration") && stderr.contains("maybe"), "{stderr}");
}

#[test]
fn bad_inputs_exit_1_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.pcap");
    std::fs::write(&junk, b"not a capture").unwrap();
    let o = run_cmd(None, &nf("counter"), &junk).output().unwrap();
    let (_, stderr) = text(&o);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr.contains("not a pcap or pcapng file"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");

    let not_wasm = dir.path().join("x.wasm");
    std::fs::write(&not_wasm, b"hello").unwrap();
    let o = run_cmd(None, &not_wasm, &junk).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).1.contains("not a WebAssembly binary"), "{:?}", text(&o));

    let cfg = dir.path().join("bad.toml");
    std::fs::write(&cfg, "batch-size = \"many\"\n").unwrap();
    let o = run_cmd(Some(&cfg), &nf("counter"), &junk).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).1.contains("bad.toml"), "{:?}", text(&o));

    let o = run_cmd(None, &nf("counter"), &junk).env("SLUICE_WORKERS", "lots").output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).1.contains("SLUICE_WORKERS"), "{:?}", text(&o));
}

#[test]
fn a_trapping_nf_is_contained_and_the_run_exits_0() {
    let hostile = std::env::var("SLUICE_TEST_NFS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/nfs-test"))
        .join("hostile.wasm");
    assert!(hostile.exists(), "{} missing: run `make test-nfs`", hostile.display());
    let dir = tempfile::tempdir().unwrap();
    let input = synth(dir.path());
    let cfg = dir.path().join("host.toml");
    std::fs::write(&cfg, "[nf.hostile]\nfailure-policy = \"fail-open\"\nconfig-text = \"panic:3\"\n").unwrap();
    let o = run_cmd(Some(&cfg), &hostile, &input).output().unwrap();
    let (stdout, stderr) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("trap causes: panic"), "{stdout}");
    assert!(stderr.contains("NF trapped") && stderr.contains("hostile"), "{stderr}");
}

#[test]
fn check_tells_good_modules_from_bad() {
    let dir = tempfile::tempdir().unwrap();
    let core = dir.path().join("core.wasm");
    std::fs::write(&core, b"\0asm\x01\0\0\0").unwrap();
    let o = bin().arg("check").arg(nf("firewall")).arg(&core).output().unwrap();
    let (stdout, _) = text(&o);
    assert_eq!(o.status.code(), Some(1));
    assert!(stdout.contains("ok: ") && stdout.contains("sha256"), "{stdout}");
    assert!(stdout.contains("core WebAssembly module"), "{stdout}");
}

#[test]
fn help_describes_the_commands() {
    let o = bin().arg("--help").output().unwrap();
    let (stdout, _) = text(&o);
    assert!(o.status.success());
    for cmd in ["run", "check", "synth"] {
        assert!(stdout.contains(cmd), "{stdout}");
    }
}

fn hostile_nf() -> PathBuf {
    let p = std::env::var("SLUICE_TEST_NFS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/nfs-test"))
        .join("hostile.wasm");
    assert!(p.exists(), "{} missing: run `make test-nfs`", p.display());
    p
}

/// A hostile NF adds 65,536 new keys per batch to an eventual table of
/// the largest capacity, toward 10 M keys: the state budget holds the
/// merged table, the NF gets `over-budget`, the bytes are reported, and
/// the host's peak memory grows with the budget, not with the keys.
#[test]
fn a_key_flood_is_held_by_the_state_budget() {
    let dir = tempfile::tempdir().unwrap();
    let input = synth(dir.path());
    let run = |budget_mb: u64| {
        let cfg = dir.path().join(format!("flood-{budget_mb}.toml"));
        std::fs::write(
            &cfg,
            // A batch of 65,536 inserts (and the table's growth copy) takes
            // about 8 ms of CPU here, next to the default 10 ms deadline:
            // this test is about the budget, so the deadline is not in play.
            format!(
                "[nf.hostile]\nconfig-text = \"key-flood\"\nstate-budget-mb = {budget_mb}\nfailure-policy = \"fail-open\"\ndeadline-ms = 1000\n"
            ),
        )
        .unwrap();
        let report = dir.path().join(format!("flood-{budget_mb}.json"));
        let o = run_cmd(Some(&cfg), &hostile_nf(), &input)
            .args(["--batch", "8", "--workers", "2", "--report"])
            .arg(&report)
            .output()
            .unwrap();
        let (stdout, stderr) = text(&o);
        assert!(o.status.success(), "{stdout}\n{stderr}");
        let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
        (r, stdout)
    };
    let (small, _) = run(1);
    let (big, summary) = run(64);
    let per_entry = 16 + 48;
    for (r, mb) in [(&small, 1u64), (&big, 64)] {
        let m = &r["nfs"][0];
        let batches = m["invocations"].as_u64().unwrap();
        assert!(batches * 65_536 >= 10_000_000, "only {batches} batches: the flood must try 10 M keys");
        let entries = r["nfs"][0]["tables"][0]["entries"].as_u64().unwrap();
        assert_eq!(entries, (mb << 20) / per_entry, "the budget bounds the merged table: {r}");
        assert_eq!(m["table_bytes"].as_u64().unwrap(), entries * per_entry, "{m}");
        assert!(m["table_rejected"].as_u64().unwrap() > 0 && m["table_errors"].as_u64().unwrap() > 0, "{m}");
        assert_eq!(m["traps"].as_u64().unwrap(), 0, "{m}");
    }
    assert!(summary.contains("bytes held"), "{summary}");
    // Peak memory grows with the budget (docs/design.md states at most
    // 1.25 × budget + 16 MiB: the hash table's slack and its growth copy).
    let peak = |r: &serde_json::Value| r["peak_rss_bytes"].as_u64().unwrap();
    let grown = peak(&big).saturating_sub(peak(&small));
    let bound = (63u64 << 20) * 5 / 4 + (16 << 20);
    assert!(grown <= bound, "peak RSS grew by {} MiB for 63 MiB more budget", grown >> 20);
}

/// `init` that never returns is stopped by the start deadline, and the
/// error names the limit to raise.
#[test]
fn a_start_past_its_deadline_fails_with_the_limit_named() {
    let dir = tempfile::tempdir().unwrap();
    let input = synth(dir.path());
    let cfg = dir.path().join("host.toml");
    std::fs::write(&cfg, "[nf.hostile]\nconfig-text = \"init-loop\"\nstart-deadline-ms = 50\n").unwrap();
    let o = run_cmd(Some(&cfg), &hostile_nf(), &input).output().unwrap();
    let (stdout, stderr) = text(&o);
    assert!(!o.status.success(), "{stdout}\n{stderr}");
    assert!(stderr.contains("exceeded the start deadline of 50 ms; raise start_deadline_ms"), "{stdout}\n{stderr}");
}

/// `run` plans which worker takes each packet before any NF runs, so it
/// cannot send a translated connection's replies where its state is: a
/// chain of several NFs that translates, run on several workers, says so
/// at its first translated packet, with the fix. One worker, or the NAT
/// alone, does not.
#[test]
fn a_run_of_a_chain_that_translates_on_two_workers_warns() {
    let dir = tempfile::tempdir().unwrap();
    let text_in = dir.path().join("in.txt");
    std::fs::write(&text_in, "0.0 tcp 10.0.0.5:40000 > 198.51.100.7:80 flags S\n").unwrap();
    let input = dir.path().join("in.pcap");
    let o = bin().args(["synth", "--from"]).arg(&text_in).arg("--out").arg(&input).output().unwrap();
    assert!(o.status.success(), "{:?}", text(&o));
    let config = dir.path().join("host.toml");
    std::fs::write(
        &config,
        "[nf.firewall.config]\nrules = [{ action = \"allow\", src = \"10.0.0.0/8\" }]\n\
         [nf.nat.config]\npublic-ip = \"203.0.113.1\"\ninside = [\"10.0.0.0/8\"]\n",
    )
    .unwrap();
    let chain = format!("{},{}", nf("firewall").display(), nf("nat").display());
    let nat = nf("nat").display().to_string();
    for (nfs, workers, warns) in [(&chain, "2", true), (&chain, "1", false), (&nat, "2", false)] {
        let o = bin()
            .arg("--config")
            .arg(&config)
            .args(["run", "--nf", nfs, "--workers", workers, "--in"])
            .arg(&input)
            .output()
            .unwrap();
        let (stdout, stderr) = text(&o);
        assert!(o.status.success(), "{stdout}\n{stderr}");
        assert_eq!(
            stderr.contains("translates addresses or ports") && stderr.contains("--workers 1"),
            warns,
            "{nfs} on {workers}: {stderr}"
        );
    }
}
