//! The control plane: how long a deployment takes to run on a host, and
//! how fast the gateway stores meter records, against the floor of each
//! measured in the same run (starting the NF in-process; inserting the
//! same records straight into the gateway's database in the same batches).
//!
//! Real processes: a nats-server with JetStream run with the shipped
//! secure configuration (`deploy/nats/nats-server.conf`: mutual TLS, nkey
//! users with subject permissions, credentials from
//! `deploy/nats/bootstrap.sh`), `sluice-gateway` and `sluice-host serve`
//! (both from the directory of `--host`).

// Gateway answers are `serde_json::Value`s, whose `Index<&str>` yields
// `Null` for a missing key instead of panicking.
#![allow(clippy::indexing_slicing)]

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use sluice_control::{Bus, MeterRecord, Meters, NatsAuth, NatsBus, Role};
use sluice_runtime::{Chain, NfLimits, NfSpec, Runtime, RuntimeConfig};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub(crate) const ADMIN: &str = "bench-admin-token";
const DEPLOYS: usize = 15;
const RECORDS: usize = 20_000;

pub(crate) struct Kill(pub(crate) Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A free TCP port on 127.0.0.1 that no earlier call in this process
/// returned (two binds in a row may get the same free port).
pub(crate) fn free_port() -> Result<u16> {
    static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        if GIVEN.lock().map_err(|_| anyhow::anyhow!("the port registry lock is poisoned"))?.insert(port) {
            return Ok(port);
        }
    }
}

fn nats_server() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("SLUICE_NATS_SERVER").map(PathBuf::from).filter(|p| p.exists()) {
        return Ok(p);
    }
    std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .map(|d| Path::new(d).join("nats-server"))
        .chain(std::env::var_os("HOME").map(|h| Path::new(&h).join("go/bin/nats-server")))
        .find(|p| p.exists())
        .context("nats-server not found: run `make setup`")
}

pub(crate) fn wait(what: &str, secs: u64, mut f: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        if Instant::now() > deadline {
            bail!("timed out waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    Ok(())
}

pub(crate) fn agent() -> ureq::Agent {
    ureq::Agent::config_builder().http_status_as_error(false).build().into()
}

pub(crate) fn call(r: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> Result<(u16, Value)> {
    let mut r = r?;
    let status = r.status().as_u16();
    let v = r.body_mut().read_json::<Value>().unwrap_or(Value::Null);
    Ok((status, v))
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// A cluster on this machine as an operator sets one up: credentials from
/// `deploy/nats/bootstrap.sh`, a nats-server with the shipped secure
/// configuration, and `sluice-gateway` (from the directory of the host
/// binary) with `gateway_toml` as its config.
pub(crate) struct Cluster {
    pub(crate) dir: PathBuf,
    pub(crate) base: String,
    pub(crate) nats_url: String,
    pki: PathBuf,
    bin: PathBuf,
    nats: Kill,
    _gateway: Kill,
}

impl Cluster {
    pub(crate) fn start(host: &Path, name: &str, gateway_toml: &str) -> Result<Cluster> {
        let bin = host.parent().context("--host has no directory")?.to_path_buf();
        let gateway_bin = bin.join("sluice-gateway");
        if !gateway_bin.exists() {
            bail!("{} is missing: `make build` builds it", gateway_bin.display());
        }
        let dir = std::env::temp_dir().join(format!("sluice-bench-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let log = |name: &str| -> Result<Stdio> { Ok(Stdio::from(std::fs::File::create(dir.join(name))?)) };
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let pki = dir.join("pki");
        let st = Command::new(workspace.join("deploy/nats/bootstrap.sh"))
            .arg(&pki)
            .env("SLUICE_BIN", &bin)
            .stdout(Stdio::null())
            .status()?;
        if !st.success() {
            bail!("deploy/nats/bootstrap.sh {} failed", pki.display());
        }
        let tls = pki.join("tls");
        let conf_dir = dir.join("nats");
        std::fs::create_dir_all(&conf_dir)?;
        let gateway_env: Vec<(&str, PathBuf)> = vec![
            ("SLUICE_NATS_NKEY", pki.join("gateway.nk")),
            ("SLUICE_NATS_CA", tls.join("ca.pem")),
            ("SLUICE_NATS_CERT", tls.join("gateway.pem")),
            ("SLUICE_NATS_KEY", tls.join("gateway-key.pem")),
            ("SLUICE_NATS_AUTH_FILE", conf_dir.join("sluice-auth.conf")),
            ("SLUICE_GATEWAY_CONFIG", dir.join("gateway.toml")),
        ];
        std::fs::write(dir.join("gateway.toml"), gateway_toml)?;
        let gateway_data = dir.join("gateway");
        let st = Command::new(&gateway_bin)
            .args(["--cluster", "bench", "--data-dir"])
            .arg(&gateway_data)
            .arg("nats-auth")
            .env("SLUICE_ADMIN_TOKEN", ADMIN)
            .envs(gateway_env.iter().cloned())
            .stdout(Stdio::null())
            .stderr(log("nats-auth.log")?)
            .status()?;
        if !st.success() {
            bail!("sluice-gateway nats-auth failed");
        }
        let conf = std::fs::read_to_string(workspace.join("deploy/nats/nats-server.conf"))?
            .replace("/etc/nats/tls/", &format!("{}/", tls.display()))
            .replace("store_dir: /var/lib/nats", &format!("store_dir: \"{}\"", dir.join("js").display()))
            .replace("http: 127.0.0.1:8222", "");
        std::fs::write(conf_dir.join("nats-server.conf"), conf)?;
        let nats_port = free_port()?;
        let nats_url = format!("tls://127.0.0.1:{nats_port}");
        let nats = Kill(
            Command::new(nats_server()?)
                .arg("-c")
                .arg(conf_dir.join("nats-server.conf"))
                .args(["-a", "127.0.0.1", "-p", &nats_port.to_string()])
                .stdout(log("nats.log")?)
                .stderr(log("nats.err")?)
                .spawn()?,
        );
        wait("nats-server", 30, || std::net::TcpStream::connect(("127.0.0.1", nats_port)).is_ok())?;
        let port = free_port()?;
        let base = format!("http://127.0.0.1:{port}");
        let gateway = Kill(
            Command::new(&gateway_bin)
                .args(["--listen", &format!("127.0.0.1:{port}"), "--nats", &nats_url, "--cluster", "bench"])
                .arg("--data-dir")
                .arg(&gateway_data)
                .env("SLUICE_ADMIN_TOKEN", ADMIN)
                .envs(gateway_env.iter().cloned())
                .stdout(log("gateway.log")?)
                .stderr(log("gateway.err")?)
                .spawn()?,
        );
        wait("the gateway", 60, || agent().get(format!("{base}/healthz")).call().is_ok())?;
        Ok(Cluster { dir, base, nats_url, pki, bin, nats, _gateway: gateway })
    }

    /// Host `id`'s NATS credentials.
    pub(crate) fn host_auth(&self, id: &str) -> NatsAuth {
        let d = self.pki.join("hosts").join(id);
        NatsAuth {
            nkey_file: Some(d.join("host.nk")),
            creds_file: None,
            ca_file: Some(d.join("ca.pem")),
            cert_file: Some(d.join(format!("{id}.pem"))),
            key_file: Some(d.join(format!("{id}-key.pem"))),
        }
    }

    /// Makes host `id`'s credentials, registers it in `group` and reloads
    /// the server; returns the `sluice-host serve` arguments that sign in
    /// as it.
    pub(crate) fn register_host(&self, id: &str, group: &str) -> Result<Vec<std::ffi::OsString>> {
        let mut args: Vec<std::ffi::OsString> =
            ["serve", "--nats", &self.nats_url, "--cluster", "bench", "--host-id", id].map(Into::into).to_vec();
        args.extend(self.register(id, group, "host")?);
        args.push("--state-dir".into());
        args.push(self.dir.join(format!("host-{id}")).into());
        Ok(args)
    }

    /// [`register_host`](Self::register_host) for a group's dispatcher:
    /// the `sluice-host steer` arguments that sign in as it.
    pub(crate) fn register_dispatcher(&self, id: &str, group: &str) -> Result<Vec<std::ffi::OsString>> {
        let mut args: Vec<std::ffi::OsString> =
            ["steer", "--nats", &self.nats_url, "--cluster", "bench", "--id", id].map(Into::into).to_vec();
        args.extend(self.register(id, group, "dispatcher")?);
        Ok(args)
    }

    /// Makes `id`'s credentials, registers it in `group` as `role` and
    /// reloads the server; returns its NATS credential flags.
    fn register(&self, id: &str, group: &str, role: &str) -> Result<Vec<std::ffi::OsString>> {
        let st = Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/nats/bootstrap.sh"))
            .arg(&self.pki)
            .args(["host", id])
            .env("SLUICE_BIN", &self.bin)
            .stdout(Stdio::null())
            .status()?;
        if !st.success() {
            bail!("deploy/nats/bootstrap.sh host {id} failed");
        }
        let auth = self.host_auth(id);
        let seed = sluice_control::nats::read_seed(&self.pki.join("hosts").join(id).join("host.nk"))
            .map_err(anyhow::Error::msg)?;
        let nkey = sluice_control::auth::public_key_of(&seed).map_err(anyhow::Error::msg)?;
        let (st, h) = call(
            agent()
                .post(format!("{}/v1/hosts", self.base))
                .header("Authorization", format!("Bearer {ADMIN}"))
                .send_json(json!({"id": id, "group": group, "nkey": nkey, "role": role})),
        )?;
        if st != 201 {
            bail!("registering host {id}: {st} {h}");
        }
        Command::new("kill").args(["-HUP", &self.nats.0.id().to_string()]).status()?;
        std::thread::sleep(Duration::from_millis(500));
        let mut args: Vec<std::ffi::OsString> = Vec::new();
        for (flag, path) in [
            ("--nats-nkey", auth.nkey_file),
            ("--nats-ca", auth.ca_file),
            ("--nats-cert", auth.cert_file),
            ("--nats-key", auth.key_file),
        ] {
            args.push(flag.into());
            args.push(path.unwrap_or_default().into());
        }
        Ok(args)
    }

    /// A log file in the cluster's directory.
    pub(crate) fn log(&self, name: &str) -> Result<Stdio> {
        Ok(Stdio::from(std::fs::File::create(self.dir.join(name))?))
    }

    /// Creates a tenant allowed in `groups`; returns its `Bearer` header
    /// value and its id.
    pub(crate) fn tenant(&self, name: &str, groups: &[&str]) -> Result<(String, String)> {
        let (st, t) = call(
            agent()
                .post(format!("{}/v1/tenants", self.base))
                .header("Authorization", format!("Bearer {ADMIN}"))
                .send_json(json!({"name": name, "groups": groups})),
        )?;
        if st != 201 {
            bail!("creating a tenant: {st} {t}");
        }
        Ok((
            format!("Bearer {}", t["api_key"].as_str().unwrap_or_default()),
            t["id"].as_str().unwrap_or_default().to_string(),
        ))
    }

    /// Uploads a module as `name@version`.
    pub(crate) fn upload(&self, key: &str, name: &str, version: &str, bytes: &[u8]) -> Result<()> {
        let (st, m) = call(
            agent()
                .post(format!("{}/v1/modules?name={name}&version={version}", self.base))
                .header("Authorization", key)
                .header("Content-Type", "application/wasm")
                .send(bytes),
        )?;
        if st != 201 {
            bail!("uploading {name}: {st} {m}");
        }
        Ok(())
    }

    /// Waits until a registered host is alive.
    pub(crate) fn wait_host(&self) -> Result<()> {
        wait("the host to join", 30, || {
            call(
                agent()
                    .get(format!("{}/v1/hosts", self.base))
                    .header("Authorization", format!("Bearer {ADMIN}"))
                    .call(),
            )
            .map(|(_, v)| v.as_array().is_some_and(|h| h.iter().any(|h| h["alive"] == true)))
            .unwrap_or(false)
        })
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The Markdown section.
pub fn section(host: &Path, nfs: &Path, firewall_config: &str) -> Result<String> {
    let cluster = Cluster::start(host, "control", "")?;
    let (base, nats_url, dir) = (cluster.base.clone(), cluster.nats_url.clone(), cluster.dir.clone());
    let host_args = cluster.register_host("bench", "default")?;
    let host_auth = cluster.host_auth("bench");
    let _host = Kill(
        Command::new(host).args(host_args).stdout(cluster.log("host.log")?).stderr(cluster.log("host.err")?).spawn()?,
    );
    let a = agent();
    let (key, tenant_id) = cluster.tenant("bench", &["default"])?;
    let fw = std::fs::read(nfs.join("firewall.wasm")).context("firewall.wasm (make nfs)")?;
    cluster.upload(&key, "firewall", "1", &fw)?;
    cluster.wait_host()?;

    // Deploy → running on the host, against starting the same NF in-process.
    let (mut accept_ms, mut running_ms) = (Vec::new(), Vec::new());
    let mut first_deployment = String::new();
    for i in 0..=DEPLOYS {
        let name = format!("d{i}");
        let t0 = Instant::now();
        let (st, d) = call(
            a.post(format!("{base}/v1/deployments"))
                .header("Authorization", &key)
                .send_json(json!({"name": name, "module": "firewall@1", "config": firewall_config})),
        )?;
        if st != 201 {
            bail!("deploying: {st} {d}");
        }
        if i == 0 {
            first_deployment = d["id"].as_str().unwrap_or_default().to_string();
        }
        let t1 = Instant::now();
        wait("a deployment to run", 30, || {
            call(a.get(format!("{base}/v1/deployments/{name}")).header("Authorization", &key).call())
                .map(|(_, v)| v["status"] == "running")
                .unwrap_or(false)
        })?;
        let t2 = Instant::now();
        // The first deployment warms caches on both sides; it is not counted.
        if i > 0 {
            accept_ms.push((t1 - t0).as_secs_f64() * 1e3);
            running_ms.push((t2 - t0).as_secs_f64() * 1e3);
        }
        call(a.delete(format!("{base}/v1/deployments/{name}")).header("Authorization", &key).call())?;
    }
    let runtime = Runtime::new(RuntimeConfig { cache_dir: Some(dir.join("cache")), ..RuntimeConfig::default() })?;
    let mut local_ms = Vec::new();
    for i in 0..=DEPLOYS {
        let t0 = Instant::now();
        let module = runtime.load("firewall", &fw)?;
        let spec = NfSpec {
            module,
            config: firewall_config.as_bytes().to_vec().into(),
            limits: NfLimits::default(),
            owner: None,
        };
        let chain = Chain::new(&runtime, &[spec])?;
        drop(chain);
        if i > 0 {
            local_ms.push(t0.elapsed().as_secs_f64() * 1e3);
        }
    }

    // Meter records: hosts' burst through JetStream into SQLite, against
    // inserting them straight into a gateway database.
    // Windows of the last minute: the gateway refuses windows that started
    // more than its max-age ago or end after its clock.
    let base_ms = sluice_control::now_ms().saturating_sub(60_000);
    let records: Vec<MeterRecord> = (0..RECORDS)
        .map(|n| MeterRecord {
            id: format!("bench-{n}"),
            host: "bench".into(),
            tenant: tenant_id.clone(),
            // A deployment placed on the host's group: the gateway checks.
            deployment: first_deployment.clone(),
            nf: "firewall".into(),
            module: "firewall".into(),
            version: "1".into(),
            digest: "0".into(),
            window_start_ms: base_ms + (n % 1000) as u64,
            window_end_ms: base_ms + 1_000 + (n % 1000) as u64,
            meters: Meters {
                invocations: 3,
                packets: 96,
                bytes: 6144,
                cpu_ns: 5000,
                state_ops: 10,
                ..Default::default()
            },
        })
        .collect();
    let rt = tokio::runtime::Runtime::new()?;
    let stored = |a: &ureq::Agent| -> u64 {
        call(a.get(format!("{base}/v1/usage")).header("Authorization", &key).call())
            .map(|(_, v)| v["total"]["records"].as_u64().unwrap_or(0))
            .unwrap_or(0)
    };
    // The records come from the registered host's identity.
    let bus = rt.block_on(NatsBus::connect(
        &nats_url,
        "bench",
        &host_auth,
        Role::Host { host: "bench".into() },
        "sluice-bench",
    ))?;
    let (publish_s, e2e_s) = rt.block_on(async {
        let t0 = Instant::now();
        // Many hosts publish at once: 64 records in flight.
        publish_all(&bus, &records).await?;
        let publish = t0.elapsed().as_secs_f64();
        let a = agent();
        let t = Instant::now();
        loop {
            if stored(&a) >= RECORDS as u64 {
                break;
            }
            if t.elapsed() > Duration::from_secs(300) {
                bail!("the gateway did not store {RECORDS} records within 300 s");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        anyhow::Ok((publish, t0.elapsed().as_secs_f64()))
    })?;
    // Published again: stored once.
    rt.block_on(publish_all(&bus, &records[..1000]))?;
    std::thread::sleep(Duration::from_millis(500));
    let after_replay = stored(&a);
    let store = sluice_gateway::store::Store::open(&dir.join("direct.db"))?;
    let t0 = Instant::now();
    for chunk in records.chunks(512) {
        store.insert_meters(chunk, 0)?;
    }
    let direct_s = t0.elapsed().as_secs_f64();

    let (acc, run, local) = (median(accept_ms), median(running_ms), median(local_ms));
    let e2e_rate = RECORDS as f64 / e2e_s;
    let direct_rate = RECORDS as f64 / direct_s;
    let mut s = String::new();
    s.push_str("\n## Control plane: deployments and meter records over NATS\n\n");
    s.push_str(&format!(
        "A real `nats-server` (JetStream, file storage) with the shipped secure configuration (mutual TLS, nkey users, subject permissions), `sluice-gateway` and one registered `sluice-host serve`, as separate processes on this machine. \
         **Deploy → running**: `POST /v1/deployments` of the firewall (the gateway checks the module and starts it once with its config), until `GET` reports it running on the host \
         (KV update, module fetch from the object store, compile from the host's code cache, start, heartbeat); median of {DEPLOYS}, after one warm-up. \
         The baseline is loading and starting the same NF in-process from a warm code cache. \
         **Meter records**: {RECORDS} records published to the meter stream (64 in flight), until the gateway has checked each against the host registry and the deployment's placements and stored all of them (acked per committed batch of up to 512); \
         the baseline inserts the same records into a gateway database directly in batches of 512 (same SQLite settings: WAL, `synchronous=FULL`).\n\n"
    ));
    s.push_str("| measurement | Sluice | baseline | ratio |\n|---|---:|---:|---:|\n");
    s.push_str(&format!(
        "| deploy → running on the host | {run:.1} ms | {local:.1} ms (in-process start) | {:.1} |\n",
        run / local
    ));
    s.push_str(&format!(
        "| of which the gateway's answer to the POST | {acc:.1} ms | {local:.1} ms | {:.1} |\n",
        acc / local
    ));
    s.push_str(&format!(
        "| meter records stored | {e2e_rate:.0} /s | {direct_rate:.0} /s (direct insert) | {:.2} |\n",
        e2e_rate / direct_rate
    ));
    s.push_str(&format!(
        "\nPublishing the {RECORDS} records took {:.2} s ({:.0} /s). Re-publishing 1000 of them afterwards left {after_replay} records stored ({RECORDS} expected): JetStream's duplicate window and the gateway's insert-or-ignore drop them.\n",
        publish_s,
        RECORDS as f64 / publish_s
    ));
    Ok(s)
}

/// Publishes records with up to 64 in flight, as many hosts would.
async fn publish_all(bus: &NatsBus, records: &[MeterRecord]) -> Result<()> {
    use futures::StreamExt;
    let done: Vec<Result<()>> = futures::stream::iter(records)
        .map(|r| async move { bus.publish_meter(r).await.map_err(anyhow::Error::from) })
        .buffer_unordered(64)
        .collect()
        .await;
    done.into_iter().collect()
}
