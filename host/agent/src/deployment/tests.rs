//! A deployment killed with its meter window open: its checkpoint carries
//! the window's sums, the next start turns them into meter records (the
//! same ids however often recovery repeats), published exactly once, and
//! the reopened deployment resumes where the checkpoint says it was.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

use super::{Capture, flush, process, start};
use crate::prepare::{Blobs, Prepared};
use crate::shared::Shared;
use crate::{journal, outbox};
use futures::StreamExt;
use parking_lot::Mutex;
use sha2::Digest;
use sluice_control::{Bus, DeploymentSpec, EventBatch, LocalBus, MeterRecord};
use sluice_pcap::Trace;
use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

const PACKETS: u16 = 40;

/// What a deployment shares with an agent, and the agent's ends of it.
struct Host {
    shared: Shared,
    finished: mpsc::UnboundedReceiver<(String, String)>,
    meters: mpsc::UnboundedReceiver<MeterRecord>,
    _events: mpsc::UnboundedReceiver<EventBatch>,
}

fn host(state: &Path) -> Host {
    let (journal_dir, outbox_dir) = (journal::dir(state), state.join("outbox"));
    std::fs::create_dir_all(&journal_dir).unwrap();
    std::fs::create_dir_all(&outbox_dir).unwrap();
    let (finished_tx, finished) = mpsc::unbounded_channel();
    let (meter_tx, meters) = mpsc::unbounded_channel();
    let (event_tx, events) = mpsc::unbounded_channel();
    let shared = Shared {
        runtime: Arc::new(sluice_runtime::Runtime::new(sluice_runtime::RuntimeConfig::default()).unwrap()),
        host: "h1".into(),
        journal: journal::Journal::start(journal_dir).unwrap(),
        outbox_dir,
        output_dir: None,
        spool_dir: None,
        finished: finished_tx,
        batch_size: 8,
        limits: sluice_runtime::NfLimits::default(),
        nf_caps: BTreeMap::new(),
        // Only a flush closes the window.
        window: Duration::from_secs(3600),
        pps: None,
        status: Arc::new(Mutex::new(BTreeMap::new())),
        report: Arc::default(),
        meters: meter_tx,
        events: event_tx,
        changed: Arc::new(tokio::sync::Notify::new()),
        cores: sluice_engine::cores::CorePool::new(&sluice_engine::cores::CoreList::new([])),
        fair: sluice_engine::FairShare::new(),
        live: false,
        workers: 1,
        retries: crate::retry::Retries::default(),
        peer: None,
        vitals: Arc::default(),
    };
    Host { shared, finished, meters, _events: events }
}

fn noop() -> (DeploymentSpec, Blobs) {
    let dir = std::env::var("SLUICE_NFS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/nfs"));
    let path = dir.join("noop.wasm");
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e} (run `make nfs`)", path.display()));
    let digest = hex::encode(sha2::Sha256::digest(&bytes));
    let spec = serde_json::from_value(serde_json::json!({
        "id": "d1", "tenant": "t1", "name": "d1", "revision": 1,
        "nfs": [{ "name": "nf", "config": "",
                  "module": { "id": "m", "name": "noop", "version": "1", "digest": digest, "size": bytes.len() } }]
    }))
    .unwrap();
    (spec, [(digest, Arc::new(bytes))].into())
}

/// A spooled capture of [`PACKETS`] UDP packets.
fn capture(dir: &Path) -> Capture {
    let path = dir.join("cap.pcap");
    let mut sink = sluice_pcap::PcapSink::create(&path).unwrap();
    for i in 0..PACKETS {
        let mut f = vec![2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2, 0x08, 0x00];
        f.extend([0x45, 0, 0, 28, 0, 0, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
        f.extend((1000 + i).to_be_bytes());
        f.extend([0, 53, 0, 8, 0, 0]);
        sink.write(u64::from(i), f.len() as u32, &f).unwrap();
    }
    sink.finish().unwrap();
    let trace = Arc::new(Trace::open(&path).unwrap());
    Capture { trace, name: "cap.pcap".into(), pass: 0, spooled: true, packets: None }
}

#[tokio::test]
async fn a_killed_deployments_open_window_is_billed_once_under_the_same_ids() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let (spec, blobs) = noop();
    let input = capture(dir.path());
    let (_control, rx) = crossbeam_channel::unbounded();

    // A run processes the capture; its window stays open.
    let mut first = host(&state);
    let shared = &first.shared;
    let mut slot = start(shared, Prepared::new(shared, spec.clone(), &blobs), None, None, None);
    assert!(slot.is_some(), "the deployment starts");
    process(shared, &mut slot, &input, &rx, &mut VecDeque::new(), &mut None);
    assert_eq!(first.finished.try_recv().unwrap(), ("d1".to_string(), "cap.pcap".to_string()));
    // Killed: dropped without closing its window.
    drop(slot);
    assert!(first.meters.try_recv().is_err(), "no window closed");
    let killed = shared.journal.read("d1").expect("a checkpoint");
    assert_eq!(killed.nfs[0].sums.packets, u64::from(PACKETS));
    assert!(killed.finished.contains("cap.pcap"));
    let ids = vec![format!("{}-{}-0", killed.record_prefix, killed.window)];

    // Recovery at the next start. Killed again before the checkpoint was
    // rewritten, it recovers the same records under the same ids.
    let (journal_dir, outbox_dir) = (journal::dir(&state), state.join("outbox"));
    shared.journal.flush();
    let checkpoint = journal_dir.join("checkpoints.log");
    let before = std::fs::read(&checkpoint).unwrap();
    let recovered = journal::recover(&journal_dir, &outbox_dir, "h1").unwrap();
    std::fs::write(&checkpoint, &before).unwrap();
    let again = journal::recover(&journal_dir, &outbox_dir, "h1").unwrap();
    for records in [&recovered, &again] {
        assert_eq!(records.iter().map(|r| r.id.clone()).collect::<Vec<_>>(), ids);
        assert_eq!(records[0].meters, recovered[0].meters);
    }
    assert_eq!(recovered[0].meters.packets, u64::from(PACKETS));
    assert_eq!(outbox::pending(&outbox_dir), 1, "one record in the outbox");
    assert!(journal::recover(&journal_dir, &outbox_dir, "h1").unwrap().is_empty(), "recovered once");

    // Reopened, the deployment resumes from its checkpoint: the capture
    // it finished is not processed again, and nothing more is billed.
    let mut second = host(&state);
    let shared = &second.shared;
    let resume = shared.journal.read("d1");
    let mut slot = start(shared, Prepared::new(shared, spec, &blobs), resume, None, None);
    process(shared, &mut slot, &input, &rx, &mut VecDeque::new(), &mut None);
    assert_eq!(second.finished.try_recv().unwrap(), ("d1".to_string(), "cap.pcap".to_string()));
    flush(shared, slot.as_mut().unwrap());
    assert!(second.meters.try_recv().is_err(), "nothing processed again, nothing billed again");
    assert_eq!(outbox::pending(&outbox_dir), 1);

    // The outbox publishes the recovered record once, and empties.
    let bus = Arc::new(LocalBus::new());
    let mut feed = bus.meters().await.unwrap();
    let (tx, none) = mpsc::unbounded_channel();
    drop(tx);
    assert_eq!(outbox::run(bus.clone(), outbox_dir.clone(), none, Duration::from_secs(1)).await, 0);
    let published = feed.next().await.unwrap().unwrap().record;
    assert_eq!((published.id, &published.meters), (ids[0].clone(), &recovered[0].meters));
    assert!(tokio::time::timeout(Duration::from_millis(100), feed.next()).await.is_err(), "published once");
    assert_eq!(outbox::pending(&outbox_dir), 0);
}
