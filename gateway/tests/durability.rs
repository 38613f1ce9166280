//! Billing survives `kill -9` of a host: ten kills in a row while captures
//! go through the spool, a restart after each; in the end every packet of
//! every capture went through exactly once, and the tenant is billed
//! exactly the packets the deployment's output holds, counted by reading
//! the output capture (never by the host's own meters).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

use crate::support::*;
use serde_json::json;
use std::path::Path;
use std::time::Duration;

/// What a host logs when it goes on with a capture from a killed run's
/// checkpoint.
const RESUMED: &str = "resuming a capture where the checkpoint of a stopped run left it";
/// What it logs when it runs the deployment.
const RUNNING: &str = "deployment running";

fn packets_in(p: &Path) -> u64 {
    sluice_pcap::Trace::open(p).map(|t| t.packets().len() as u64).unwrap_or(0)
}

fn spool_left(spool: &Path) -> usize {
    std::fs::read_dir(spool).unwrap().flatten().filter(|e| e.path().extension().is_some_and(|x| x == "pcap")).count()
}

#[test]
fn ten_kills_of_a_host_bill_exactly_what_its_output_holds() {
    let _turn = beside_others();
    let dir = test_dir();
    let nats = Nats::start(dir.path());
    let gw = Gateway::start(&nats, dir.path(), &[]);
    let api = gw.api();
    let (_, key) = api.tenant("acme");
    assert_eq!(api.upload(Some(&key), "counter", "1", &std::fs::read(nf("counter")).unwrap()).status, 201);
    let d = api.post(Some(&key), "/v1/deployments", &json!({ "name": "c", "module": "counter@1" }));
    assert_eq!(d.status, 201, "{}", d.body);
    let deployment = d.body["id"].as_str().unwrap().to_string();

    // Eight captures in the spool, paced so that the kills land mid-capture.
    let spool = dir.path().join("spool");
    let out = dir.path().join("out");
    std::fs::create_dir_all(&spool).unwrap();
    let pcap = trace(dir.path(), 400);
    let per_capture = packets_in(&pcap);
    assert!(per_capture > 1000, "{per_capture}");
    for i in 0..8 {
        let tmp = dir.path().join(format!("c{i}.tmp"));
        std::fs::copy(&pcap, &tmp).unwrap();
        std::fs::rename(&tmp, spool.join(format!("c{i}.pcap"))).unwrap();
    }
    let args =
        ["--in", spool.to_str().unwrap(), "--out", out.to_str().unwrap(), "--pps", "2000", "--window-ms", "5000"];
    let mut host = start_host(&nats, &gw, dir.path(), "h1", &args);
    api.wait_running(&key, "c", 1);
    let output = out.join(format!("{deployment}.pcap"));
    let log = dir.path().join("h1.log");
    let logged =
        |what: &str| std::fs::read_to_string(&log).unwrap_or_default().lines().filter(|l| l.contains(what)).count();
    // Each start of the host runs the deployment once it has joined.
    let running = |starts: usize| {
        wait_for(60, "the host to run the deployment", || (logged(RUNNING) >= starts).then_some(()));
    };
    for kill in 0..10 {
        // Once the (re)started host runs the deployment, let it work a
        // little: the kill lands mid-capture (or between two).
        running(kill + 1);
        std::thread::sleep(Duration::from_millis(250 + 97 * (kill as u64 % 4)));
        host.kill9();
        host = start_host(&nats, &gw, dir.path(), "h1", &args);
    }
    running(11);
    wait_for(120, "every capture to be processed", || (spool_left(&spool) == 0).then_some(()));
    host.term();

    // The kills interrupted work: most restarts found a checkpoint in the
    // middle of a capture and went on from there (8 of 10 here; a kill that
    // lands as one capture ends leaves nothing half-done).
    let resumed = logged(RESUMED);
    assert!(resumed >= 6, "only {resumed} of 10 restarts resumed a capture mid-way");
    let done = std::fs::read_dir(spool.join("done")).unwrap().count();
    assert_eq!(done, 8, "every capture moved to done/ once processed");
    let forwarded = packets_in(&output);
    assert_eq!(forwarded, 8 * per_capture, "every packet went through exactly once (the counter forwards all)");
    let billed = wait_for(60, "usage to equal the output", || {
        let u = api.get(Some(&key), "/v1/usage").body;
        let p = u["total"]["packets"].as_u64().unwrap_or(0);
        (p >= forwarded).then_some(p)
    });
    // Nothing arrives late that would make it more.
    std::thread::sleep(Duration::from_secs(1));
    let u = api.get(Some(&key), "/v1/usage").body;
    assert_eq!(u["total"]["packets"].as_u64().unwrap(), forwarded, "billed {billed}, output {forwarded}");
}
