//! The agent in process, over the in-process bus: it converges on the
//! desired deployments of its group (starting, stopping and replacing
//! them), retries a failing start with growing waits, and processes the
//! captures dropped in its spool. Real NF components run (`noop`,
//! `firewall` from `$SLUICE_NFS_DIR`, default `target/nfs`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

use futures::StreamExt;
use futures::stream::BoxStream;
use sha2::Digest;
use sluice_agent::report::AgentReport;
use sluice_agent::{AgentConfig, Input};
use sluice_control::{
    Bus, DeploymentSpec, DeploymentStatus, DesiredSet, FromHost, Heartbeat, HostState, LocalBus, MeterRecord,
};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

const GROUP: &str = "g";
const HOST: &str = "h1";
/// How long anything the tests wait for may take.
const PATIENCE: Duration = Duration::from_secs(60);

fn nf_path(name: &str) -> PathBuf {
    let dir = std::env::var("SLUICE_NFS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/nfs"));
    let p = dir.join(format!("{name}.wasm"));
    assert!(p.exists(), "{} missing: run `make nfs`", p.display());
    p
}

/// Puts NF `name`'s component on the bus; returns its module reference.
async fn module(bus: &LocalBus, name: &str) -> serde_json::Value {
    let bytes = std::fs::read(nf_path(name)).unwrap();
    let digest = hex::encode(sha2::Sha256::digest(&bytes));
    bus.put_module(&digest, &bytes).await.unwrap();
    serde_json::json!({ "id": format!("m-{name}"), "name": name, "version": "1", "digest": digest, "size": bytes.len() })
}

/// A deployment of a chain of `(nf name, module, config)`, each NF
/// forwarding to the next.
fn deployment(id: &str, revision: u64, chain: &[(&str, &serde_json::Value, &str)]) -> DeploymentSpec {
    let nfs: Vec<serde_json::Value> = chain
        .iter()
        .enumerate()
        .map(|(i, (name, module, config))| {
            let mut nf = serde_json::json!({ "name": name, "module": module, "config": config });
            if let Some((next, _, _)) = chain.get(i + 1) {
                nf["next"] = serde_json::json!(next);
            }
            nf
        })
        .collect();
    serde_json::from_value(
        serde_json::json!({ "id": id, "tenant": "t1", "name": id, "revision": revision, "nfs": nfs }),
    )
    .unwrap()
}

fn config(state_dir: &Path, input: Input) -> AgentConfig {
    AgentConfig {
        host: HOST.into(),
        group: GROUP.into(),
        input,
        pps: None,
        // Windows close when a capture is done or the host stops.
        window: Duration::from_secs(3600),
        heartbeat: Duration::from_millis(50),
        capacity_pps: 0,
        state_dir: state_dir.to_path_buf(),
        report: None,
        output: None,
        runtime: sluice_runtime::RuntimeConfig::default(),
        batch_size: 32,
        limits: sluice_runtime::NfLimits::default(),
        nf_caps: BTreeMap::new(),
        cores: sluice_engine::cores::CoreList::new([]),
        peer: None,
        metrics_listen: None,
        prometheus: None,
    }
}

/// An agent serving in this process until [`Agent::stop`].
struct Agent {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<AgentReport, sluice_agent::AgentError>>,
}

impl Agent {
    fn start(bus: &Arc<LocalBus>, cfg: AgentConfig) -> Agent {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(sluice_agent::serve(bus.clone(), cfg, async move {
            let _ = stopped.await;
        }));
        Agent { stop, task }
    }

    async fn stop(self) -> AgentReport {
        let _ = self.stop.send(());
        tokio::time::timeout(PATIENCE, self.task).await.expect("the agent stops").unwrap().unwrap()
    }
}

/// Waits for a heartbeat of the host that `until` takes.
async fn heartbeat(
    feed: &mut BoxStream<'static, FromHost<Heartbeat>>,
    what: &str,
    until: impl Fn(&Heartbeat) -> bool,
) -> Heartbeat {
    let deadline = Instant::now() + PATIENCE;
    let mut last = None;
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match tokio::time::timeout(left, feed.next()).await {
            Ok(Some(hb)) if hb.message.host == HOST => {
                if until(&hb.message) {
                    return hb.message;
                }
                last = Some(hb.message.deployments);
            }
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => break,
        }
    }
    panic!("no heartbeat shows {what}; the last said {last:?}");
}

fn status<'a>(hb: &'a Heartbeat, id: &str) -> Option<&'a DeploymentStatus> {
    hb.deployments.iter().find(|s| s.deployment == id)
}

/// Whether `hb` shows `spec` running, at its digest.
fn runs(hb: &Heartbeat, spec: &DeploymentSpec) -> bool {
    status(hb, &spec.id).is_some_and(|s| {
        s.state == HostState::Running && s.revision == spec.revision && s.digest.as_deref() == Some(&spec.digest())
    })
}

async fn desire(bus: &LocalBus, deployments: &[&DeploymentSpec]) {
    let set = DesiredSet {
        group: GROUP.into(),
        deployments: deployments.iter().map(|d| (*d).clone()).collect(),
        ..Default::default()
    };
    bus.set_desired(&set).await.unwrap();
}

/// Waits until `cond` holds.
async fn eventually(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !cond() {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A deployment's checkpoint.
fn journal(state_dir: &Path, id: &str) -> Option<sluice_agent::journal::Checkpoint> {
    sluice_agent::journal::read(&sluice_agent::journal::dir(state_dir), id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn converging_starts_new_deployments_stops_removed_ones_and_replaces_changed_ones() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let bus = Arc::new(LocalBus::new());
    let (noop, firewall) = (module(&bus, "noop").await, module(&bus, "firewall").await);
    let mut beats = bus.heartbeats().await.unwrap();
    let agent = Agent::start(&bus, config(&state, Input::None));

    // Two new deployments start.
    let a = deployment("a", 1, &[("nf", &noop, "")]);
    let b1 = deployment("b", 1, &[("fw", &firewall, "")]);
    desire(&bus, &[&a, &b1]).await;
    heartbeat(&mut beats, "a and b running", |hb| runs(hb, &a) && runs(hb, &b1)).await;
    // A deployment checkpoints right after it reports running.
    eventually("a and b checkpoint", || journal(&state, "a").is_some() && journal(&state, "b").is_some()).await;
    for m in [&noop, &firewall] {
        let cached = state.join("modules").join(format!("{}.wasm", m["digest"].as_str().unwrap()));
        assert!(cached.exists(), "{} is in the host's module cache", cached.display());
    }

    // a is removed, b gets a new config (a hot swap), c is new.
    let b2 = deployment("b", 2, &[("fw", &firewall, "{}")]);
    let c = deployment("c", 1, &[("nf", &noop, "")]);
    desire(&bus, &[&b2, &c]).await;
    let hb = heartbeat(&mut beats, "b at revision 2 and c running", |hb| runs(hb, &b2) && runs(hb, &c)).await;
    assert!(status(&hb, "a").is_none());
    assert!(journal(&state, "a").is_none(), "a removed deployment's checkpoint goes");
    eventually("c checkpoints", || journal(&state, "c").is_some()).await;

    // b's chain changes shape: it is rebuilt, and checkpoints both NFs.
    let b3 = deployment("b", 3, &[("fw", &firewall, "{}"), ("nf", &noop, "")]);
    desire(&bus, &[&b3, &c]).await;
    heartbeat(&mut beats, "b at revision 3", |hb| runs(hb, &b3) && runs(hb, &c)).await;
    let nfs = || journal(&state, "b").map_or(0, |j| j.nfs.len());
    eventually("b's checkpoint names its two NFs", || nfs() == 2).await;

    let report = agent.stop().await;
    let ids: Vec<&str> = report.deployments.keys().map(String::as_str).collect();
    assert_eq!(ids, ["b", "c"], "the report forgets removed deployments");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_start_is_retried_after_growing_waits_until_it_runs() {
    let dir = tempfile::tempdir().unwrap();
    let bus = Arc::new(LocalBus::new());
    let firewall = module(&bus, "firewall").await;
    let mut beats = bus.heartbeats().await.unwrap();
    let agent = Agent::start(&bus, config(&dir.path().join("state"), Input::None));

    // The firewall refuses this config: every start fails.
    let bad = deployment("d", 1, &[("fw", &firewall, "{not json")]);
    desire(&bus, &[&bad]).await;
    let mut seen = Vec::new();
    for (attempt, wait) in [(1, 1), (2, 2), (3, 4)] {
        let text = format!("attempt {attempt}; the host retries in {wait} s");
        heartbeat(&mut beats, &text, |hb| {
            status(hb, "d")
                .is_some_and(|s| s.state == HostState::Failed && s.reason.as_deref().is_some_and(|r| r.contains(&text)))
        })
        .await;
        seen.push(Instant::now());
    }
    // Each attempt came at least its wait after the one before.
    for (gap, wait) in seen.windows(2).map(|w| w[1] - w[0]).zip([1, 2]) {
        assert!(gap >= Duration::from_millis(wait * 1000 - 100), "a retry after {gap:?}, before its {wait} s wait");
    }

    // A config it takes: it runs, and the failures are forgotten.
    let good = deployment("d", 2, &[("fw", &firewall, "{}")]);
    desire(&bus, &[&good]).await;
    let hb = heartbeat(&mut beats, "d running", |hb| runs(hb, &good)).await;
    assert_eq!(status(&hb, "d").unwrap().reason, None);
    agent.stop().await;
}

/// A capture of `n` UDP packets.
fn write_capture(path: &Path, n: u16) {
    let mut sink = sluice_pcap::PcapSink::create(path).unwrap();
    for i in 0..n {
        let frame = udp_frame(i);
        sink.write(u64::from(i) * 1000, frame.len() as u32, &frame).unwrap();
    }
    sink.finish().unwrap();
}

/// An Ethernet frame of an IPv4 UDP datagram from port `1000 + i`.
fn udp_frame(i: u16) -> Vec<u8> {
    let payload = [0xabu8; 18];
    let udp_len = 8 + payload.len() as u16;
    let total = 20 + udp_len;
    let mut ip = vec![0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2];
    ip[2..4].copy_from_slice(&total.to_be_bytes());
    let sum = ip.chunks(2).map(|w| u32::from(u16::from_be_bytes([w[0], w[1]]))).sum::<u32>();
    let sum = !(((sum & 0xffff) + (sum >> 16)) as u16);
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    let mut f = vec![2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2, 0x08, 0x00];
    f.extend(ip);
    f.extend((1000 + i).to_be_bytes());
    f.extend(53u16.to_be_bytes());
    f.extend(udp_len.to_be_bytes());
    f.extend([0, 0]);
    f.extend(payload);
    f
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spooled_captures_are_processed_by_every_deployment_then_moved_to_done() {
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("spool");
    std::fs::create_dir_all(&spool).unwrap();
    let bus = Arc::new(LocalBus::new());
    let noop = module(&bus, "noop").await;
    let mut meters = bus.meters().await.unwrap();
    let mut beats = bus.heartbeats().await.unwrap();
    let agent = Agent::start(&bus, config(&dir.path().join("state"), Input::Spool { dir: spool.clone() }));
    let (d1, d2) = (deployment("d1", 1, &[("nf", &noop, "")]), deployment("d2", 1, &[("nf", &noop, "")]));
    desire(&bus, &[&d1, &d2]).await;
    heartbeat(&mut beats, "d1 and d2 running", |hb| runs(hb, &d1) && runs(hb, &d2)).await;

    // Written elsewhere and renamed in, as the spool asks; and a file
    // that is no capture.
    const PACKETS: u16 = 100;
    let tmp = dir.path().join("cap.pcap");
    write_capture(&tmp, PACKETS);
    std::fs::rename(&tmp, spool.join("cap.pcap")).unwrap();
    std::fs::write(dir.path().join("bad.pcap"), b"not a capture").unwrap();
    std::fs::rename(dir.path().join("bad.pcap"), spool.join("bad.pcap")).unwrap();

    let hb = heartbeat(&mut beats, "both deployments done with the capture", |hb| {
        [&d1, &d2].iter().all(|d| status(hb, &d.id).is_some_and(|s| s.packets == u64::from(PACKETS)))
    })
    .await;
    assert!(runs(&hb, &d1) && runs(&hb, &d2));
    eventually("the finished capture is moved to done/", || spool.join("done/cap.pcap").exists()).await;
    assert!(!spool.join("cap.pcap").exists());
    assert!(spool.join("failed/bad.pcap").exists(), "a file that is no capture goes to failed/");
    let why = std::fs::read_to_string(spool.join("failed/bad.pcap.error")).unwrap();
    assert!(!why.trim().is_empty(), "with the reason next to it");

    // Each deployment billed every packet once: its window closed when
    // the capture was done.
    let report = agent.stop().await;
    let mut billed: BTreeMap<String, u64> = BTreeMap::new();
    let mut ids = std::collections::BTreeSet::new();
    while let Ok(Some(Ok(d))) = tokio::time::timeout(Duration::from_millis(500), meters.next()).await {
        let rec: MeterRecord = d.record;
        assert!(ids.insert(rec.id.clone()), "record {} published twice", rec.id);
        *billed.entry(rec.deployment).or_default() += rec.meters.packets;
    }
    let want = u64::from(PACKETS);
    assert_eq!(billed, BTreeMap::from([("d1".to_string(), want), ("d2".to_string(), want)]));
    for id in ["d1", "d2"] {
        let d = &report.deployments[id];
        assert_eq!((d.packets_in, d.packets_out), (want, want), "{id}: noop forwards every packet");
        assert_eq!(d.nfs["nf@1"].sums.packets, want);
    }
    assert_eq!(report.traces, 2);
}
