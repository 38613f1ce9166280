//! NFs in language runtimes that start from a snapshot (CPython, a JS
//! engine) come back `running` after every restart of `sluice dev`: their
//! instantiation and `init` run under the start deadline, not the batch
//! deadline, and a failed start is retried.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

mod support;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use support::*;

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
    let o = Command::new(sibling_bin("sluice")).args(["nf", "build"]).current_dir(&project).output().unwrap();
    assert!(o.status.success(), "{lang}: {}", text(&o));
    project.join("build").join(format!("{name}.wasm"))
}

struct Dev {
    url: String,
    port: u16,
    data: PathBuf,
    log: PathBuf,
}

impl Dev {
    fn start(&self) -> Proc {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log).unwrap();
        let child = Command::new(sibling_bin("sluice"))
            .args(["dev", "--listen", &format!("127.0.0.1:{}", self.port), "--window-ms", "200"])
            .arg("--data")
            .arg(&self.data)
            .env_remove("SLUICE_ADMIN_TOKEN")
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap();
        let p = Proc { child, name: "sluice dev".into() };
        wait_for(60, "sluice dev to answer", || ureq::get(format!("{}/healthz", self.url)).call().ok());
        p
    }

    fn cli(&self, key: Option<&str>, args: &[&str]) -> String {
        let admin = std::fs::read_to_string(self.data.join("admin-token")).unwrap();
        let mut c = Command::new(sibling_bin("sluice"));
        c.args(args).env("SLUICE_URL", &self.url).env("SLUICE_ADMIN_TOKEN", admin.trim()).env_remove("SLUICE_API_KEY");
        if let Some(k) = key {
            c.env("SLUICE_API_KEY", k);
        }
        let o = c.output().unwrap();
        assert!(o.status.success(), "sluice {args:?}: {}", text(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// Waits until both deployments run; fails at once on a lasting
    /// `failed` (a transient one is retried by the host).
    fn wait_both_running(&self, api: &Api, key: &str, names: &[&str], after: &str) {
        let started = std::time::Instant::now();
        wait_for(90, &format!("{names:?} to run {after}"), || {
            let ds: Vec<Value> =
                names.iter().map(|n| api.get(Some(key), &format!("/v1/deployments/{n}")).body).collect();
            for d in &ds {
                if d["status"] == "failed" && started.elapsed() > std::time::Duration::from_secs(30) {
                    let log = std::fs::read_to_string(&self.log).unwrap_or_default();
                    let tail: Vec<&str> = log.lines().rev().take(30).collect();
                    panic!("{after}: {d}\n{}", tail.into_iter().rev().collect::<Vec<_>>().join("\n"));
                }
            }
            ds.iter().all(|d| d["status"] == "running").then_some(())
        });
    }
}

fn packets_of(usage: &Value, deployment: &str) -> u64 {
    usage["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["deployment_name"] == deployment)
        .map(|r| r["packets"].as_u64().unwrap())
        .sum()
}

#[test]
fn python_and_js_deployments_come_back_running_after_every_restart() {
    let dir = test_dir();
    let components: Vec<(String, PathBuf)> =
        ["python", "js"].iter().map(|l| (format!("fw-{l}"), build_firewall(dir.path(), l))).collect();
    let port = free_port();
    let dev = Dev {
        url: format!("http://127.0.0.1:{port}"),
        port,
        data: dir.path().join("dev"),
        log: dir.path().join("dev.log"),
    };
    let mut proc = dev.start();
    let key = dev.cli(None, &["tenant", "create", "acme", "--key-only"]).trim().to_string();
    let cfg = dir.path().join("fw.json");
    // The template's configuration (tests/conformance/firewall/config.txt).
    std::fs::write(&cfg, "inside=10.0.0.0/8").unwrap();
    for (name, wasm) in &components {
        let out = dev.cli(Some(&key), &["nf", "upload", wasm.to_str().unwrap(), "--version", "1.0.0"]);
        assert!(out.contains(&format!("uploaded {name}@1.0.0")), "{out}");
        dev.cli(Some(&key), &["deploy", name, "-m", &format!("{name}@1.0.0"), "--config-file", cfg.to_str().unwrap()]);
    }
    let api = Api { base: dev.url.clone() };
    let names: Vec<&str> = components.iter().map(|(n, _)| n.as_str()).collect();
    dev.wait_both_running(&api, &key, &names, "after deploying");
    for (i, how) in ["SIGTERM", "SIGKILL", "SIGTERM"].iter().enumerate() {
        if *how == "SIGKILL" {
            proc.kill9();
        } else {
            proc.term();
        }
        proc = dev.start();
        dev.wait_both_running(&api, &key, &names, &format!("after restart {} ({how})", i + 1));
    }
    // They process traffic: each gets every packet of a capture.
    let before = api.get(Some(&key), "/v1/usage").body;
    let pcap = trace(dir.path(), 100);
    let spool = dev.data.join("spool");
    std::fs::copy(&pcap, spool.join(".incoming")).unwrap();
    std::fs::rename(spool.join(".incoming"), spool.join("after-restarts.pcap")).unwrap();
    let n = sluice_pcap::Trace::open(&pcap).unwrap().packets().len() as u64;
    wait_for(60, "both deployments to take the capture", || {
        let u = api.get(Some(&key), "/v1/usage").body;
        names.iter().all(|d| packets_of(&u, d) == packets_of(&before, d) + n).then_some(())
    });
    proc.term();
}
