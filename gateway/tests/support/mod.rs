//! Real processes for the cluster tests: a nats-server with JetStream on a
//! free loopback port, run with the shipped secure configuration (mutual
//! TLS, nkey users with subject permissions), `sluice-gateway` and
//! `sluice-host serve` binaries, and an HTTP client.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, dead_code)]

use serde_json::Value;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const ADMIN: &str = "test-admin-token";

/// The gateway's tests run in parallel, except those that measure a
/// throughput or pace packets: they take this lock for writing, every
/// other test for reading, so they run with no other test's processes
/// beside them.
static MEASURING: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// A test's turn beside the file's other tests (see [`MEASURING`]).
pub fn beside_others() -> std::sync::RwLockReadGuard<'static, ()> {
    MEASURING.read().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A measuring test's turn, alone among the file's tests.
pub fn measuring_alone() -> std::sync::RwLockWriteGuard<'static, ()> {
    MEASURING.write().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A directory for one test; kept after the test (for its logs) when
/// `SLUICE_KEEP_TEST_DIRS` is set.
pub fn test_dir() -> tempfile::TempDir {
    let mut d = tempfile::tempdir().unwrap();
    if std::env::var_os("SLUICE_KEEP_TEST_DIRS").is_some() {
        d.disable_cleanup(true);
        eprintln!("test directory: {}", d.path().display());
    }
    d
}

pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// A free TCP port on 127.0.0.1 that no earlier call in this process
/// returned: the kernel may hand the same free port to two binds in a row,
/// and then two services of one test collide on it.
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    loop {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        if GIVEN.lock().unwrap().insert(port) {
            return port;
        }
    }
}

pub fn bin_dir() -> PathBuf {
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

pub fn wait_port(port: u16, what: &str) {
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

pub fn log_file(dir: &Path, name: &str) -> Stdio {
    Stdio::from(std::fs::OpenOptions::new().create(true).append(true).open(dir.join(format!("{name}.log"))).unwrap())
}

/// The cluster's secrets, made as an operator makes them, with
/// `deploy/nats/bootstrap.sh`: a CA and the servers' certificate, and per
/// client (the gateway, each host) a client certificate and an nkey seed.
#[derive(Clone)]
pub struct Pki {
    pub dir: PathBuf,
}

fn bootstrap(args: &[&str]) {
    let out = Command::new(workspace().join("deploy/nats/bootstrap.sh"))
        .args(args)
        .env("SLUICE_BIN", bin_dir())
        .output()
        .unwrap();
    assert!(out.status.success(), "bootstrap.sh {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

impl Pki {
    pub fn new(dir: &Path) -> Pki {
        let pki = Pki { dir: dir.join("pki") };
        bootstrap(&[pki.dir.to_str().unwrap()]);
        pki
    }

    pub fn ca(&self) -> PathBuf {
        self.dir.join("tls/ca.pem")
    }

    /// Where `name`'s files are (made on first use).
    fn client_dir(&self, name: &str) -> PathBuf {
        if name == "gateway" {
            return self.dir.join("tls");
        }
        let d = self.dir.join("hosts").join(name);
        if !d.exists() {
            bootstrap(&[self.dir.to_str().unwrap(), "host", name]);
        }
        d
    }

    /// A client certificate and key for `name`.
    pub fn client_cert(&self, name: &str) -> (PathBuf, PathBuf) {
        let d = self.client_dir(name);
        (d.join(format!("{name}.pem")), d.join(format!("{name}-key.pem")))
    }

    /// The nkey seed file of `name` and its public key.
    pub fn nkey(&self, name: &str) -> (PathBuf, String) {
        let seed = if name == "gateway" { self.dir.join("gateway.nk") } else { self.client_dir(name).join("host.nk") };
        let out =
            Command::new(sibling_bin("sluice-host")).args(["keygen", "--show", "--out"]).arg(&seed).output().unwrap();
        assert!(out.status.success(), "keygen --show: {}", String::from_utf8_lossy(&out.stderr));
        (seed, String::from_utf8(out.stdout).unwrap().trim().to_string())
    }

    /// The `sluice-host serve` flags that sign in as `name`.
    pub fn host_flags(&self, name: &str) -> Vec<String> {
        let (seed, _) = self.nkey(name);
        let (cert, key) = self.client_cert(name);
        let mut v = Vec::new();
        for (flag, path) in
            [("--nats-nkey", seed), ("--nats-ca", self.ca()), ("--nats-cert", cert), ("--nats-key", key)]
        {
            v.push(flag.to_string());
            v.push(path.to_str().unwrap().to_string());
        }
        v
    }
}

/// The shipped `deploy/nats/<file>` with its certificate paths pointed at
/// the test's PKI, its store in `store`, and no monitoring port (tests run
/// side by side).
fn shipped_nats_config(file: &str, pki: &Pki, store: &Path) -> String {
    let text = std::fs::read_to_string(workspace().join("deploy/nats").join(file)).unwrap();
    assert!(text.contains("/etc/nats/tls/"), "{file} names its certificates under /etc/nats/tls/");
    text.replace("/etc/nats/tls/", &format!("{}/", pki.dir.join("tls").display()))
        .replace("store_dir: /var/lib/nats", &format!("store_dir: \"{}\"", store.display()))
        .replace("http: 127.0.0.1:8222", "")
}

/// nats-server ≥ 2.10 with JetStream, run with the shipped configuration
/// (`deploy/nats/nats-server.conf`: mutual TLS, nkey users with subject
/// permissions from the authorization block the gateway writes).
pub struct Nats {
    pub url: String,
    pub port: u16,
    pub pki: Pki,
    /// Directory of the server configuration and the authorization block.
    pub conf_dir: PathBuf,
    /// The gateway's data directory (where its database is).
    pub gateway_data: PathBuf,
    pub log_dir: PathBuf,
    pub proc: Option<Proc>,
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

/// The gateway's NATS settings as environment variables.
pub fn gateway_nats_env(pki: &Pki, conf_dir: &Path) -> Vec<(String, String)> {
    let (seed, _) = pki.nkey("gateway");
    let (cert, key) = pki.client_cert("gateway");
    [
        ("SLUICE_NATS_NKEY", seed),
        ("SLUICE_NATS_CA", pki.ca()),
        ("SLUICE_NATS_CERT", cert),
        ("SLUICE_NATS_KEY", key),
        ("SLUICE_NATS_AUTH_FILE", conf_dir.join("sluice-auth.conf")),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_string()))
    .collect()
}

/// Writes the authorization block for the gateway's current registry
/// (`sluice-gateway nats-auth`), as an operator does before the first
/// server start.
pub fn write_nats_auth(pki: &Pki, conf_dir: &Path, gateway_data: &Path) {
    std::fs::create_dir_all(conf_dir).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sluice-gateway"))
        .args(["--cluster", "test", "--data-dir"])
        .arg(gateway_data)
        .arg("nats-auth")
        .env("SLUICE_ADMIN_TOKEN", ADMIN)
        .envs(gateway_nats_env(pki, conf_dir))
        .output()
        .unwrap();
    assert!(out.status.success(), "sluice-gateway nats-auth: {}", String::from_utf8_lossy(&out.stderr));
}

impl Nats {
    pub fn start(dir: &Path) -> Nats {
        Nats::start_with(dir, |conf| conf)
    }

    /// A server whose shipped configuration is changed by `edit` first.
    pub fn start_with(dir: &Path, edit: impl FnOnce(String) -> String) -> Nats {
        let pki = Pki::new(dir);
        let conf_dir = dir.join("nats");
        let gateway_data = dir.join("gateway");
        write_nats_auth(&pki, &conf_dir, &gateway_data);
        let store = dir.join("jetstream");
        std::fs::write(conf_dir.join("nats-server.conf"), edit(shipped_nats_config("nats-server.conf", &pki, &store)))
            .unwrap();
        let port = free_port();
        let mut n = Nats {
            url: format!("tls://127.0.0.1:{port}"),
            port,
            pki,
            conf_dir,
            gateway_data,
            log_dir: dir.to_path_buf(),
            proc: None,
        };
        n.restart();
        n
    }

    pub fn restart(&mut self) {
        let child = Command::new(nats_server_bin())
            .arg("-c")
            .arg(self.conf_dir.join("nats-server.conf"))
            .args(["-a", "127.0.0.1", "-p", &self.port.to_string()])
            .stdout(log_file(&self.log_dir, "nats"))
            .stderr(log_file(&self.log_dir, "nats"))
            .spawn()
            .unwrap();
        self.proc = Some(Proc { child, name: "nats-server".into() });
        wait_port(self.port, "nats-server");
    }

    /// Makes the server read its configuration again (a changed
    /// authorization block) and waits until it did.
    pub fn reload(&self) {
        let log = self.log_dir.join("nats.log");
        let count =
            || std::fs::read_to_string(&log).unwrap_or_default().matches("Reloaded server configuration").count();
        let before = count();
        let pid = self.proc.as_ref().unwrap().child.id().to_string();
        assert!(Command::new("kill").args(["-HUP", &pid]).status().unwrap().success());
        wait_for(10, "nats-server to reload its configuration", || (count() > before).then_some(()));
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
        let mut all = gateway_nats_env(&nats.pki, &nats.conf_dir);
        all.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let mut g = Gateway {
            url: format!("http://127.0.0.1:{port}"),
            port,
            data: nats.gateway_data.clone(),
            // `url` may list several servers (a cluster's view).
            nats: nats.url.clone(),
            log_dir: dir.to_path_buf(),
            env: all,
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

    pub fn api(&self) -> Api {
        Api { base: self.url.clone() }
    }
}

/// Registers host `id` in `group` with the gateway (its nkey public key)
/// and reloads the NATS server so it may sign in, as an operator does.
pub fn register_host(nats: &Nats, gw: &Gateway, id: &str, group: &str) {
    let (_, public) = nats.pki.nkey(id);
    let r = gw.api().post(Some(ADMIN), "/v1/hosts", &serde_json::json!({ "id": id, "group": group, "nkey": public }));
    assert!(r.status == 201 || r.status == 409, "registering {id}: {} {}", r.status, r.body);
    if r.status == 201 {
        nats.reload();
    }
}

/// `sluice-host serve`, registered in group `default` first.
pub fn start_host(nats: &Nats, gw: &Gateway, dir: &Path, id: &str, args: &[&str]) -> Proc {
    let group = args.windows(2).find(|w| w[0] == "--group").map(|w| w[1]).unwrap_or("default");
    register_host(nats, gw, id, group);
    start_host_unregistered(nats, dir, id, args)
}

/// `sluice-host serve` signing in as `id`, whether registered or not.
pub fn start_host_unregistered(nats: &Nats, dir: &Path, id: &str, args: &[&str]) -> Proc {
    let child = host_command(nats, dir, id, args).spawn().unwrap();
    Proc { child, name: format!("sluice-host {id}") }
}

/// The command [`start_host_unregistered`] runs, logging to `<id>.log`.
pub fn host_command(nats: &Nats, dir: &Path, id: &str, args: &[&str]) -> Command {
    let mut c = Command::new(sibling_bin("sluice-host"));
    c.args(["serve", "--nats", &nats.url, "--cluster", "test", "--host-id", id])
        .args(nats.pki.host_flags(id))
        .arg("--state-dir")
        .arg(dir.join(format!("state-{id}")))
        .args(args)
        .env("SLUICE_LOG", "info")
        .env("SLUICE_CACHE_DIR", workspace().join("target/sluice-cache"))
        .stdout(log_file(dir, id))
        .stderr(log_file(dir, id));
    c
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
pub fn start_replay_host(nats: &Nats, gw: &Gateway, dir: &Path, id: &str, r: Replay<'_>) -> Proc {
    let args = r.args();
    start_host(nats, gw, dir, id, &args.iter().map(String::as_str).collect::<Vec<_>>())
}

impl Replay<'_> {
    /// The `sluice-host serve` flags of this replay.
    pub fn args(&self) -> Vec<String> {
        [
            ("--in", self.pcap.to_str().unwrap().to_string()),
            ("--loop", self.loops.to_string()),
            ("--pps", self.pps.to_string()),
            ("--window-ms", self.window_ms.to_string()),
            ("--report", self.report.to_str().unwrap().to_string()),
        ]
        .into_iter()
        .flat_map(|(f, v)| [f.to_string(), v])
        .collect()
    }
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

/// An HTTP answer: status and JSON (or text as a JSON string), and the
/// path of the next page a list's `Link: <...>; rel="next"` names.
pub struct Resp {
    pub status: u16,
    pub body: Value,
    pub next: Option<String>,
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder().http_status_as_error(false).build().into()
}

fn finish(r: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> Resp {
    let mut r = r.unwrap();
    let status = r.status().as_u16();
    let next = r
        .headers()
        .get("link")
        .and_then(|v| v.to_str().ok())
        .filter(|l| l.ends_with("; rel=\"next\""))
        .and_then(|l| l.strip_prefix('<'))
        .and_then(|l| l.split('>').next())
        .map(str::to_string);
    let text = r.body_mut().read_to_string().unwrap_or_default();
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    Resp { status, body, next }
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
    /// A request with extra headers.
    pub fn send(&self, method: &str, key: Option<&str>, path: &str, headers: &[(&str, &str)], body: &Value) -> Resp {
        let mut r = ureq::http::Request::builder().method(method).uri(format!("{}{path}", self.base));
        if let Some(k) = key {
            r = r.header("Authorization", format!("Bearer {k}"));
        }
        for (h, v) in headers {
            r = r.header(*h, *v);
        }
        let r = r.header("Content-Type", "application/json").body(serde_json::to_vec(body).unwrap()).unwrap();
        finish(agent().run(r))
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
        let r = self.post(Some(ADMIN), "/v1/tenants", &serde_json::json!({ "name": name, "groups": ["default"] }));
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

/// The sums `report_totals` and `usage_totals` compare, in this order.
pub const TOTALS: [&str; 6] = ["invocations", "packets", "bytes", "cpu_ns", "records", "state_byte_ms"];

/// Sums of a host report per `nf@version` over every deployment.
pub fn report_totals(reports: &[Value]) -> std::collections::BTreeMap<String, [u64; 6]> {
    let mut out = std::collections::BTreeMap::new();
    for r in reports {
        for d in r["deployments"].as_object().unwrap().values() {
            for (k, t) in d["nfs"].as_object().unwrap() {
                let e: &mut [u64; 6] = out.entry(k.clone()).or_default();
                for (i, f) in TOTALS.iter().enumerate() {
                    e[i] += t[f].as_u64().unwrap_or(0);
                }
            }
        }
    }
    out
}

/// Gateway usage per `nf@version`.
pub fn usage_totals(usage: &Value) -> std::collections::BTreeMap<String, [u64; 6]> {
    let mut out = std::collections::BTreeMap::new();
    for r in usage["rows"].as_array().unwrap() {
        let k = format!("{}@{}", r["nf"].as_str().unwrap(), r["version"].as_str().unwrap());
        let e: &mut [u64; 6] = out.entry(k).or_default();
        for (i, f) in TOTALS.iter().enumerate() {
            e[i] += r[f].as_u64().unwrap();
        }
    }
    out
}

/// Three nats-servers on loopback, each run with the shipped
/// `deploy/nats/nats-cluster.conf` (routes over mutual TLS), sharing the
/// gateway's authorization block.
pub struct NatsCluster {
    /// Comma-separated client URLs of all three.
    pub urls: String,
    pub servers: Vec<Nats>,
    routes: Vec<u16>,
}

impl NatsCluster {
    pub fn start(dir: &Path) -> NatsCluster {
        let pki = Pki::new(dir);
        let conf_dir = dir.join("nats");
        let gateway_data = dir.join("gateway");
        write_nats_auth(&pki, &conf_dir, &gateway_data);
        std::fs::write(conf_dir.join("nats-cluster.conf"), shipped_nats_config("nats-cluster.conf", &pki, dir))
            .unwrap();
        let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let routes: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let mut c = NatsCluster {
            urls: ports.iter().map(|p| format!("tls://127.0.0.1:{p}")).collect::<Vec<_>>().join(","),
            servers: Vec::new(),
            routes,
        };
        for (i, port) in ports.iter().enumerate() {
            let log_dir = dir.join(format!("n{i}"));
            std::fs::create_dir_all(&log_dir).unwrap();
            c.servers.push(Nats {
                url: format!("tls://127.0.0.1:{port}"),
                port: *port,
                pki: pki.clone(),
                conf_dir: conf_dir.clone(),
                gateway_data: gateway_data.clone(),
                log_dir,
                proc: None,
            });
        }
        for i in 0..3 {
            c.restart(i);
        }
        c.wait_formed();
        c
    }

    /// A raw NATS client with the gateway's identity, connected to `urls`.
    pub async fn gateway_client(&self, urls: &str) -> async_nats::Client {
        let view = self.view();
        let (seed, _) = view.pki.nkey("gateway");
        let (cert, key) = view.pki.client_cert("gateway");
        let servers: Vec<&str> = urls.split(',').collect();
        async_nats::ConnectOptions::with_nkey(sluice_control::nats::read_seed(&seed).unwrap())
            .add_root_certificates(view.pki.ca())
            .add_client_certificate(cert, key)
            .custom_inbox_prefix("_INBOX_test_gateway")
            .connect(servers.as_slice())
            .await
            .unwrap()
    }

    /// Waits until a client sees all three servers (the routes are up).
    pub fn wait_formed(&self) {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let client = self.gateway_client(self.urls.split(',').next().unwrap()).await;
            for _ in 0..300 {
                if client.server_info().connect_urls.len() >= 3 {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            panic!("the NATS cluster did not form: {:?}", client.server_info().connect_urls);
        });
    }

    /// (Re)starts server `i` with its old store.
    pub fn restart(&mut self, i: usize) {
        let routes = self.routes.clone();
        let s = &mut self.servers[i];
        let mut cmd = Command::new(nats_server_bin());
        cmd.arg("-c").arg(s.conf_dir.join("nats-cluster.conf"));
        cmd.env("SLUICE_NATS_NAME", format!("n{i}"))
            .env("SLUICE_NATS_LISTEN", format!("127.0.0.1:{}", s.port))
            .env("SLUICE_NATS_ADVERTISE", format!("127.0.0.1:{}", s.port))
            .env("SLUICE_NATS_CLUSTER_LISTEN", format!("127.0.0.1:{}", routes[i]))
            .env("SLUICE_NATS_STORE", s.log_dir.join("jetstream"));
        for (j, r) in routes.iter().enumerate() {
            cmd.env(format!("SLUICE_NATS_ROUTE_{}", j + 1), format!("tls://127.0.0.1:{r}"));
        }
        let child = cmd.stdout(log_file(&s.log_dir, "nats")).stderr(log_file(&s.log_dir, "nats")).spawn().unwrap();
        s.proc = Some(Proc { child, name: format!("nats-server n{i}") });
        wait_port(s.port, "nats-server");
    }

    pub fn kill9(&mut self, i: usize) {
        if let Some(p) = self.servers[i].proc.as_mut() {
            p.kill9();
        }
        self.servers[i].proc = None;
    }

    /// Reloads every running server (a changed authorization block).
    pub fn reload(&self) {
        for s in self.servers.iter().filter(|s| s.proc.is_some()) {
            s.reload();
        }
    }

    /// The cluster as one client sees it: every server's URL.
    pub fn view(&self) -> Nats {
        let s = &self.servers[0];
        Nats {
            url: self.urls.clone(),
            port: s.port,
            pki: s.pki.clone(),
            conf_dir: s.conf_dir.clone(),
            gateway_data: s.gateway_data.clone(),
            log_dir: s.log_dir.clone(),
            proc: None,
        }
    }
}

/// Packets in a pcap file.
pub fn read_count(p: &Path) -> u64 {
    let bytes = std::fs::read(p).unwrap();
    let (mut n, mut off) = (0u64, 24usize);
    while off + 16 <= bytes.len() {
        off += 16 + u32::from_le_bytes(bytes[off + 8..off + 12].try_into().unwrap()) as usize;
        n += 1;
    }
    n
}
