//! The control plane on a replicated NATS cluster: three servers on
//! loopback with the shipped cluster configuration; the gateway keeps three
//! copies of every stream and bucket; one server is killed and restarted
//! while meters flow and a deployment is made; nothing is lost or counted
//! twice, and deployments keep converging.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

use crate::support::*;
use serde_json::json;
use std::time::Duration;

/// Replica counts of the cluster's streams, read with the gateway's identity.
fn replicas(cluster: &NatsCluster) -> Vec<(String, usize)> {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let js = async_nats::jetstream::new(cluster.gateway_client(&cluster.urls).await);
        let mut out = Vec::new();
        for name in ["SLUICE_METERS_test", "KV_sluice-desired-test", "OBJ_sluice-modules-test"] {
            let mut s = js.get_stream(name).await.unwrap();
            out.push((name.to_string(), s.info().await.unwrap().config.num_replicas));
        }
        out
    })
}

#[test]
fn a_server_killed_while_meters_flow_loses_and_double_counts_nothing() {
    let _turn = beside_others();
    let dir = test_dir();
    let mut cluster = NatsCluster::start(dir.path());
    let view = cluster.view();
    let gw = Gateway::start(&view, dir.path(), &[]);
    let api = gw.api();
    // Three copies of everything (streams made before every route was up
    // are scaled up by the gateway's next reconciliation).
    wait_for(30, "three replicas of every stream", || replicas(&cluster).iter().all(|(_, n)| *n == 3).then_some(()));

    let pcap = trace(dir.path(), 300);
    let report = dir.path().join("h1.json");
    let (_, public) = view.pki.nkey("h1");
    let r = api.post(Some(ADMIN), "/v1/hosts", &json!({ "id": "h1", "group": "default", "nkey": public }));
    assert_eq!(r.status, 201, "{}", r.body);
    cluster.reload();
    let args = Replay { pcap: &pcap, loops: 0, pps: 20000, window_ms: 100, report: &report }.args();
    let mut host =
        start_host_unregistered(&view, dir.path(), "h1", &args.iter().map(String::as_str).collect::<Vec<_>>());
    let (_, key) = api.tenant("acme");
    assert_eq!(api.upload(Some(&key), "counter", "1", &std::fs::read(nf("counter")).unwrap()).status, 201);
    assert_eq!(api.post(Some(&key), "/v1/deployments", &json!({ "name": "c1", "module": "counter@1" })).status, 201);
    api.wait_running(&key, "c1", 1);

    for victim in [0, 1] {
        wait_for(90, "meters to flow", || {
            let u = api.get(Some(&key), "/v1/usage").body;
            (u["total"]["records"].as_u64().unwrap_or(0) > 10).then_some(())
        });
        cluster.kill9(victim);
        // With one server down: meters keep flowing, a deployment converges.
        let name = format!("during-{victim}");
        let d = api.post(Some(&key), "/v1/deployments", &json!({ "name": name, "module": "counter@1" }));
        assert_eq!(d.status, 201, "{}", d.body);
        api.wait_running(&key, &name, 1);
        let before = api.get(Some(&key), "/v1/usage").body["total"]["records"].as_u64().unwrap_or(0);
        wait_for(90, "meters to flow with a server down", || {
            let u = api.get(Some(&key), "/v1/usage").body;
            (u["total"]["records"].as_u64().unwrap_or(0) > before + 5).then_some(())
        });
        std::thread::sleep(Duration::from_millis(500));
        cluster.restart(victim);
        std::thread::sleep(Duration::from_secs(2));
    }
    host.term();
    let expected = report_totals(&[host_report(&report)]);
    let records: u64 = expected.values().map(|t| t[4]).sum();
    assert!(records > 30, "the host produced {records} records");
    wait_for(60, "usage to equal the host report", || {
        let u = api.get(Some(&key), "/v1/usage").body;
        (usage_totals(&u) == expected).then_some(())
    });
}
