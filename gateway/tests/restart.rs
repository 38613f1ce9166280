//! NFs in language runtimes that start from a snapshot (CPython, a JS
//! engine) come back `running` after every restart of `sluice dev`: their
//! instantiation and `init` run under the start deadline, not the batch
//! deadline, and a failed start is retried.
//!
//! The deployments keep the hosts' default limits (a 10 ms batch deadline):
//! a start that ran under the batch deadline again would trap with
//! `interrupt` and the deployment would stay `failed`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

use crate::support::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// `sluice nf new <name> --lang <lang> --template firewall` and `sluice nf
/// build`, as a tenant does: the component.
fn build_firewall(dir: &Path, lang: &str) -> PathBuf {
    let name = format!("fw-{lang}");
    let o = Command::new(sibling_bin("sluice"))
        .args(["nf", "new", &name, "--lang", lang, "--template", "firewall"])
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let project = dir.join(&name);
    let started = Instant::now();
    let o = Command::new(sibling_bin("sluice")).args(["nf", "build"]).current_dir(&project).output().unwrap();
    assert!(o.status.success(), "{lang}: {}", text(&o));
    let wasm = project.join("build").join(format!("{name}.wasm"));
    let size = std::fs::metadata(&wasm).unwrap().len();
    eprintln!("built {name}: {size} bytes in {:.1} s", started.elapsed().as_secs_f64());
    wasm
}

/// Seconds since midnight of a log line's RFC 3339 UTC timestamp.
fn time_of_day(line: &str) -> Option<f64> {
    let t = line.get(11..26)?;
    let mut parts = t.split(':');
    let (h, m, s) = (parts.next()?, parts.next()?, parts.next()?);
    Some(h.parse::<f64>().ok()? * 3600.0 + m.parse::<f64>().ok()? * 60.0 + s.parse::<f64>().ok()?)
}

/// A deployment's status as seen by a poll.
fn describe(d: &Value) -> String {
    format!("status {} reason {} hosts {}", d["status"], d["reason"], d["hosts"])
}

struct Dev {
    url: String,
    port: u16,
    data: PathBuf,
    log: PathBuf,
    /// Every `failed` status seen while waiting: when, what.
    failures: Vec<String>,
}

impl Dev {
    /// Starts `sluice dev` on the data directory and port and waits for
    /// /healthz; returns the process and where its log starts.
    fn start(&self) -> (Proc, u64, Instant) {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log).unwrap();
        let offset = log.metadata().unwrap().len();
        let spawned = Instant::now();
        let child = Command::new(sibling_bin("sluice"))
            .args(["dev", "--listen", &format!("127.0.0.1:{}", self.port), "--window-ms", "200"])
            .arg("--data")
            .arg(&self.data)
            .env_remove("SLUICE_ADMIN_TOKEN")
            // The host's starts and failed starts, with their times.
            .env("SLUICE_LOG", "warn,sluice_agent=info")
            .env("NO_COLOR", "1")
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap();
        let p = Proc { child, name: "sluice dev".into() };
        wait_for(60, "sluice dev to answer /healthz", || ureq::get(format!("{}/healthz", self.url)).call().ok());
        eprintln!("sluice dev answers /healthz {:.2} s after it was started", spawned.elapsed().as_secs_f64());
        (p, offset, spawned)
    }

    fn cli(&self, key: Option<&str>, args: &[&str]) -> String {
        let admin = std::fs::read_to_string(self.data.join("admin-token")).unwrap();
        let mut c = Command::new(sibling_bin("sluice"));
        c.args(args).env("SLUICE_URL", &self.url).env("SLUICE_ADMIN_TOKEN", admin.trim()).env_remove("SLUICE_API_KEY");
        if let Some(k) = key {
            c.env("SLUICE_API_KEY", k);
        }
        let o = c.output().unwrap();
        assert!(o.status.success(), "sluice {args:?}: {}\n{}", text(&o), self.log_tail(40));
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    fn log_tail(&self, n: usize) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        format!(
            "--- last {n} lines of {} ---\n{}",
            self.log.display(),
            lines[lines.len().saturating_sub(n)..].join("\n")
        )
    }

    /// The host's start lines logged since `offset`, each with its time
    /// after the host joined.
    fn start_lines(&self, offset: u64, ids: &BTreeMap<String, String>) -> String {
        let log = std::fs::read(&self.log).unwrap_or_default();
        let since =
            String::from_utf8_lossy(log.get(usize::try_from(offset).unwrap()..).unwrap_or_default()).into_owned();
        let mut joined = None;
        let mut out = Vec::new();
        for l in since.lines() {
            let t = time_of_day(l);
            if l.contains("host joined") {
                joined = t;
            }
            if l.contains("deployment running") || l.contains("deployment failed") {
                let after = match (joined, t) {
                    (Some(j), Some(t)) => format!("{:+.3} s after the host joined", t - j),
                    _ => "?".into(),
                };
                let name = ids.iter().find(|(id, _)| l.contains(id.as_str())).map_or("?", |(_, n)| n.as_str());
                out.push(format!("  {name} ({after}): {}", l.trim()));
            }
        }
        out.join("\n")
    }

    /// Waits up to `secs` (from `since`) until every deployment runs. A
    /// transient `failed` (the host retries with back-off) is recorded and
    /// reported; one that lasts until the deadline fails the test with
    /// each deployment's status and the tail of the log.
    fn wait_running(&mut self, api: &Api, key: &str, names: &[&str], after: &str, since: Instant, secs: u64) {
        let deadline = since + Duration::from_secs(secs);
        let mut running_at: BTreeMap<&str, f64> = BTreeMap::new();
        let mut last_failure: BTreeMap<&str, String> = BTreeMap::new();
        loop {
            let ds: Vec<Value> =
                names.iter().map(|n| api.get(Some(key), &format!("/v1/deployments/{n}")).body).collect();
            let t = since.elapsed().as_secs_f64();
            for (n, d) in names.iter().zip(&ds) {
                if d["status"] == "failed" {
                    let reason = d["reason"].as_str().unwrap_or_default().to_string();
                    if last_failure.get(n) != Some(&reason) {
                        let seen = format!("{after}: {n} failed at {t:.2} s: {reason}");
                        eprintln!("TRANSIENT? {seen}");
                        self.failures.push(seen);
                        last_failure.insert(n, reason);
                    }
                }
                if d["status"] == "running" {
                    running_at.entry(n).or_insert(t);
                }
            }
            if ds.iter().all(|d| d["status"] == "running") {
                let times: Vec<String> = running_at.iter().map(|(n, t)| format!("{n} {t:.2} s")).collect();
                eprintln!("{after}: running ({} after start)", times.join(", "));
                return;
            }
            if Instant::now() > deadline {
                let states: Vec<String> = names.iter().zip(&ds).map(|(n, d)| format!("{n}: {}", describe(d))).collect();
                panic!(
                    "{after}: not both running within {secs} s (a deployment that stays failed is the bug):\n{}\n{}",
                    states.join("\n"),
                    self.log_tail(40)
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// A deployment's usage: packets and traps over its rows.
fn usage_of(usage: &Value, deployment: &str) -> (u64, u64) {
    usage["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["deployment_name"] == deployment)
        .fold((0, 0), |(p, t), r| (p + r["packets"].as_u64().unwrap(), t + r["traps"].as_u64().unwrap()))
}

#[test]
fn python_and_js_deployments_come_back_running_after_every_restart() {
    let _turn = beside_others();
    let dir = test_dir();
    let components: Vec<(String, PathBuf)> =
        ["python", "js"].iter().map(|l| (format!("fw-{l}"), build_firewall(dir.path(), l))).collect();
    let port = free_port();
    let mut dev = Dev {
        url: format!("http://127.0.0.1:{port}"),
        port,
        data: dir.path().join("dev"),
        log: dir.path().join("dev.log"),
        failures: Vec::new(),
    };
    let (mut proc, mut offset, _) = dev.start();
    let key = dev.cli(None, &["tenant", "create", "acme", "--key-only"]).trim().to_string();
    assert!(key.starts_with("sk_"), "{key}");
    let cfg = dir.path().join("fw.conf");
    // The template's configuration (`config-text` of the scaffolded host.toml).
    std::fs::write(&cfg, "inside=10.0.0.0/8").unwrap();
    let deployed = Instant::now();
    for (name, wasm) in &components {
        let out = dev.cli(Some(&key), &["nf", "upload", wasm.to_str().unwrap(), "--version", "1.0.0"]);
        assert!(out.contains(&format!("uploaded {name}@1.0.0")), "{out}");
        // Not waiting here: a failed first start is retried by the host,
        // which `wait_running` allows for and reports.
        let out = dev.cli(
            Some(&key),
            &["deploy", name, "-m", &format!("{name}@1.0.0"), "--config-file", cfg.to_str().unwrap(), "--wait", "0"],
        );
        assert!(out.contains(&format!("deployment {name} (")), "{out}");
    }
    let api = Api { base: dev.url.clone() };
    let names: Vec<&str> = components.iter().map(|(n, _)| n.as_str()).collect();
    // The first start compiles the components.
    dev.wait_running(&api, &key, &names, "after deploying", deployed, 180);
    let ids: BTreeMap<String, String> = names
        .iter()
        .map(|n| {
            (
                api.get(Some(&key), &format!("/v1/deployments/{n}")).body["id"].as_str().unwrap().to_string(),
                n.to_string(),
            )
        })
        .collect();
    eprintln!("{}", dev.start_lines(offset, &ids));
    for (i, how) in ["SIGTERM", "SIGKILL", "SIGTERM"].iter().enumerate() {
        if *how == "SIGKILL" {
            proc.kill9();
        } else {
            proc.term();
        }
        let (p, o, spawned) = dev.start();
        proc = p;
        offset = o;
        dev.wait_running(&api, &key, &names, &format!("after restart {} ({how})", i + 1), spawned, 60);
        eprintln!("{}", dev.start_lines(offset, &ids));
        // The tenant's view agrees.
        let out = dev.cli(Some(&key), &["deployments"]);
        for n in &names {
            assert!(out.lines().any(|l| l.starts_with(&format!("{n} (")) && l.contains(": running")), "{out}");
        }
    }
    // They process traffic: each gets every packet of a capture.
    let before = api.get(Some(&key), "/v1/usage").body;
    let pcap = trace(dir.path(), 100);
    let spool = dev.data.join("spool");
    std::fs::copy(&pcap, spool.join(".incoming")).unwrap();
    std::fs::rename(spool.join(".incoming"), spool.join("after-restarts.pcap")).unwrap();
    let n = sluice_pcap::Trace::open(&pcap).unwrap().packets().len() as u64;
    assert!(n > 0);
    let deadline = Instant::now() + Duration::from_secs(60);
    let after = loop {
        let u = api.get(Some(&key), "/v1/usage").body;
        if names.iter().all(|d| usage_of(&u, d).0 == usage_of(&before, d).0 + n) {
            break u;
        }
        assert!(
            Instant::now() < deadline,
            "the capture's {n} packets did not reach both deployments within 60 s:\nbefore {before}\nnow {u}\n{}",
            dev.log_tail(40)
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(spool.join("done/after-restarts.pcap").exists());
    for d in &names {
        let (packets, traps) = usage_of(&after, d);
        eprintln!("{d}: {packets} packets metered, {traps} traps");
    }
    // Still running after the traffic.
    for d in &names {
        let s = api.get(Some(&key), &format!("/v1/deployments/{d}")).body;
        assert_eq!(s["status"], "running", "{d}: {}\n{}", describe(&s), dev.log_tail(40));
    }
    if dev.failures.is_empty() {
        eprintln!("no failed status seen");
    } else {
        eprintln!("failed statuses seen (each recovered):\n{}", dev.failures.join("\n"));
    }
    proc.term();
}

/// `/readyz` says whether the gateway can work — NATS connected, the
/// database taking writes — and follows NATS going away and coming back;
/// `/healthz` (liveness) answers throughout.
#[test]
fn readiness_follows_nats_and_the_database() {
    let _turn = beside_others();
    let dir = crate::support::test_dir();
    let mut nats = Nats::start(dir.path());
    let gw = Gateway::start(&nats, dir.path(), &[]);
    let api = gw.api();
    let ready = |want: u16| {
        wait_for(30, &format!("/readyz to answer {want}"), || {
            let r = api.get(None, "/readyz");
            (r.status == want).then_some(r.body)
        })
    };
    let body = ready(200);
    assert_eq!(body["nats"], "connected", "{body}");
    assert_eq!(body["database"], "writable", "{body}");
    assert_eq!(body["ready"], true, "{body}");
    nats.proc = None;
    let body = ready(503);
    assert_eq!(body["nats"], "disconnected", "{body}");
    assert_eq!(body["database"], "writable", "{body}");
    assert_eq!(api.get(None, "/healthz").status, 200);
    nats.restart();
    let body = ready(200);
    assert_eq!(body["ready"], true, "{body}");
    // The API still works once NATS is back.
    let (_, key) = api.tenant("acme");
    assert_eq!(api.get(Some(&key), "/v1/me").status, 200);
}
