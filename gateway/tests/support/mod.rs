//! Real processes for the cluster tests: a nats-server with JetStream on a
//! free loopback port, `sluice-gateway` and `sluice-host serve` binaries,
//! and an HTTP client.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, dead_code)]

use serde_json::Value;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const ADMIN: &str = "test-admin-token";

pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn bin_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_sluice-gateway")).parent().unwrap().to_path_buf()
}

/// A binary built next to `sluice-gateway` by the same `cargo test --workspace`.
pub fn sibling_bin(name: &str) -> PathBuf {
    let p = bin_dir().join(name);
    assert!(p.exists(), "{} is missing: build the workspace first (`make test` does)", p.display());
    p
}

/// A component from nfs-wasm/ (`make nfs`).
pub fn nf(name: &str) -> PathBuf {
    let dir = std::env::var("SLUICE_NFS_DIR").map(PathBuf::from).unwrap_or_else(|_| workspace().join("target/nfs"));
    let p = dir.join(format!("{name}.wasm"));
    assert!(p.exists(), "{} is missing: run `make nfs test-nfs` first", p.display());
    p
}

/// A test-only component (`make test-nfs`).
pub fn test_nf(name: &str) -> PathBuf {
    let dir =
        std::env::var("SLUICE_TEST_NFS_DIR").map(PathBuf::from).unwrap_or_else(|_| workspace().join("target/nfs-test"));
    let p = dir.join(format!("{name}.wasm"));
    assert!(p.exists(), "{} is missing: run `make test-nfs` first", p.display());
    p
}

/// Waits for `f` to return `Some`, up to `secs`.
pub fn wait_for<T>(secs: u64, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out after {secs} s waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn wait_port(port: u16, what: &str) {
    wait_for(30, what, || std::net::TcpStream::connect(("127.0.0.1", port)).ok());
}

/// A child process killed on drop.
pub struct Proc {
    pub child: Child,
    pub name: String,
}

impl Proc {
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM and wait for a clean exit.
    pub fn term(&mut self) {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                assert!(st.success(), "{} exited with {st}", self.name);
                return;
            }
            assert!(Instant::now() < deadline, "{} did not stop within 30 s of SIGTERM", self.name);
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn log_file(dir: &Path, name: &str) -> Stdio {
    Stdio::from(std::fs::OpenOptions::new().create(true).append(true).open(dir.join(format!("{name}.log"))).unwrap())
}

/// nats-server ≥ 2.10 with JetStream.
pub struct Nats {
    pub url: String,
    _proc: Proc,
}

pub fn nats_server_bin() -> PathBuf {
    if let Ok(p) = std::env::var("SLUICE_NATS_SERVER") {
        return PathBuf::from(p);
    }
    for dir in std::env::var("PATH").unwrap_or_default().split(':').chain(["/usr/local/bin", "/root/go/bin"]) {
        let p = Path::new(dir).join("nats-server");
        if p.exists() {
            return p;
        }
    }
    panic!("nats-server not found: run `make setup` (it installs nats-server 2.12 with `go install`)");
}

impl Nats {
    pub fn start(dir: &Path) -> Nats {
        let port = free_port();
        let store = dir.join("jetstream");
        let child = Command::new(nats_server_bin())
            .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
            .arg(&store)
            .stdout(log_file(dir, "nats"))
            .stderr(log_file(dir, "nats"))
            .spawn()
            .unwrap();
        wait_port(port, "nats-server");
        Nats { url: format!("nats://127.0.0.1:{port}"), _proc: Proc { child, name: "nats-server".into() } }
    }
}

/// A gateway process (restartable on the same data directory and port).
pub struct Gateway {
    pub url: String,
    pub port: u16,
    pub data: PathBuf,
    pub nats: String,
    pub log_dir: PathBuf,
    pub env: Vec<(String, String)>,
    pub proc: Option<Proc>,
}

impl Gateway {
    pub fn start(nats: &Nats, dir: &Path, env: &[(&str, &str)]) -> Gateway {
        let port = free_port();
        let mut g = Gateway {
            url: format!("http://127.0.0.1:{port}"),
            port,
            data: dir.join("gateway"),
            nats: nats.url.clone(),
            log_dir: dir.to_path_buf(),
            env: env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            proc: None,
        };
        g.restart();
        g
    }

    pub fn restart(&mut self) {
        let child = Command::new(env!("CARGO_BIN_EXE_sluice-gateway"))
            .args(["--listen", &format!("127.0.0.1:{}", self.port), "--nats", &self.nats, "--cluster", "test"])
            .arg("--data-dir")
            .arg(&self.data)
            .env("SLUICE_ADMIN_TOKEN", ADMIN)
            .env("SLUICE_LOG", "info")
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdout(log_file(&self.log_dir, "gateway"))
            .stderr(log_file(&self.log_dir, "gateway"))
            .spawn()
            .unwrap();
        self.proc = Some(Proc { child, name: "sluice-gateway".into() });
        let url = format!("{}/healthz", self.url);
        wait_for(60, "the gateway to answer /healthz", || ureq::get(&url).call().ok());
    }

    pub fn kill9(&mut self) {
        if let Some(p) = self.proc.as_mut() {
            p.kill9();
        }
        self.proc = None;
    }
}

/// `sluice-host serve`.
pub fn start_host(nats: &Nats, dir: &Path, id: &str, args: &[&str]) -> Proc {
    let child = Command::new(sibling_bin("sluice-host"))
        .args(["serve", "--nats", &nats.url, "--cluster", "test", "--host-id", id])
        .arg("--state-dir")
        .arg(dir.join(format!("state-{id}")))
        .args(args)
        .env("SLUICE_LOG", "info")
        .env("SLUICE_CACHE_DIR", workspace().join("target/sluice-cache"))
        .stdout(log_file(dir, id))
        .stderr(log_file(dir, id))
        .spawn()
        .unwrap();
    Proc { child, name: format!("sluice-host {id}") }
}

/// How a host replays a capture: passes (0 = forever), packets per second
/// and meter window.
pub struct Replay<'a> {
    pub pcap: &'a Path,
    pub loops: u32,
    pub pps: u32,
    pub window_ms: u32,
    pub report: &'a Path,
}

/// `sluice-host serve` replaying a capture into every deployment and
/// keeping its own report.
pub fn start_replay_host(nats: &Nats, dir: &Path, id: &str, r: Replay<'_>) -> Proc {
    let (loops, pps, window) = (r.loops.to_string(), r.pps.to_string(), r.window_ms.to_string());
    let args = [
        "--in",
        r.pcap.to_str().unwrap(),
        "--loop",
        &loops,
        "--pps",
        &pps,
        "--window-ms",
        &window,
        "--report",
        r.report.to_str().unwrap(),
    ];
    start_host(nats, dir, id, &args)
}

/// A synthetic trace.
pub fn trace(dir: &Path, sessions: usize) -> PathBuf {
    let p = dir.join("office.pcap");
    let st = Command::new(sibling_bin("sluice-host"))
        .args(["synth", "--sessions", &sessions.to_string(), "--seed", "11", "--out"])
        .arg(&p)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(st.success());
    p
}

/// An HTTP answer: status and JSON (or text as a JSON string).
pub struct Resp {
    pub status: u16,
    pub body: Value,
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder().http_status_as_error(false).build().into()
}

fn finish(r: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> Resp {
    let mut r = r.unwrap();
    let status = r.status().as_u16();
    let text = r.body_mut().read_to_string().unwrap_or_default();
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    Resp { status, body }
}

pub struct Api {
    pub base: String,
}

impl Api {
    pub fn get(&self, key: Option<&str>, path: &str) -> Resp {
        let mut r = agent().get(format!("{}{path}", self.base));
        if let Some(k) = key {
            r = r.header("Authorization", format!("Bearer {k}"));
        }
        finish(r.call())
    }
    pub fn delete(&self, key: Option<&str>, path: &str) -> Resp {
        let mut r = agent().delete(format!("{}{path}", self.base));
        if let Some(k) = key {
            r = r.header("Authorization", format!("Bearer {k}"));
        }
        finish(r.call())
    }
    pub fn post(&self, key: Option<&str>, path: &str, body: &Value) -> Resp {
        let mut r = agent().post(format!("{}{path}", self.base));
        if let Some(k) = key {
            r = r.header("Authorization", format!("Bearer {k}"));
        }
        finish(r.send_json(body))
    }
    pub fn put(&self, key: Option<&str>, path: &str, body: &Value) -> Resp {
        let mut r = agent().put(format!("{}{path}", self.base));
        if let Some(k) = key {
            r = r.header("Authorization", format!("Bearer {k}"));
        }
        finish(r.send_json(body))
    }
    pub fn upload(&self, key: Option<&str>, name: &str, version: &str, bytes: &[u8]) -> Resp {
        let mut r = agent().post(format!("{}/v1/modules?name={name}&version={version}", self.base));
        if let Some(k) = key {
            r = r.header("Authorization", format!("Bearer {k}"));
        }
        finish(r.header("Content-Type", "application/wasm").send(bytes))
    }

    /// Creates a tenant; returns (id, key).
    pub fn tenant(&self, name: &str) -> (String, String) {
        let r = self.post(Some(ADMIN), "/v1/tenants", &serde_json::json!({ "name": name }));
        assert_eq!(r.status, 201, "{}", r.body);
        (r.body["id"].as_str().unwrap().to_string(), r.body["api_key"].as_str().unwrap().to_string())
    }

    /// Waits until the deployment runs at `revision` on every live host.
    pub fn wait_running(&self, key: &str, name: &str, revision: i64) -> Value {
        wait_for(60, &format!("deployment {name} rev {revision} to run"), || {
            let d = self.get(Some(key), &format!("/v1/deployments/{name}")).body;
            assert_ne!(d["status"], "failed", "{d}");
            (d["status"] == "running" && d["revision"] == revision).then_some(d)
        })
    }
}

/// The host's own report.
pub fn host_report(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// Sums of a host report per `nf@version` over every deployment.
pub fn report_totals(reports: &[Value]) -> std::collections::BTreeMap<String, [u64; 5]> {
    let mut out = std::collections::BTreeMap::new();
    for r in reports {
        for d in r["deployments"].as_object().unwrap().values() {
            for (k, t) in d["nfs"].as_object().unwrap() {
                let e: &mut [u64; 5] = out.entry(k.clone()).or_default();
                for (i, f) in ["invocations", "packets", "bytes", "cpu_ns", "records"].iter().enumerate() {
                    e[i] += t[f].as_u64().unwrap();
                }
            }
        }
    }
    out
}

/// Gateway usage per `nf@version`.
pub fn usage_totals(usage: &Value) -> std::collections::BTreeMap<String, [u64; 5]> {
    let mut out = std::collections::BTreeMap::new();
    for r in usage["rows"].as_array().unwrap() {
        let k = format!("{}@{}", r["nf"].as_str().unwrap(), r["version"].as_str().unwrap());
        let e: &mut [u64; 5] = out.entry(k).or_default();
        for (i, f) in ["invocations", "packets", "bytes", "cpu_ns", "records"].iter().enumerate() {
            e[i] += r[f].as_u64().unwrap();
        }
    }
    out
}
