//! Unit tests of the store: meter records stored once and summed exactly,
//! events and logs kept apart, deployments and their attachments.

#![allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::panic)]
use super::*;
use sluice_control::{EventBatch, MeterRecord, Meters, NfEvent};

fn rec(id: &str, packets: u64) -> MeterRecord {
    MeterRecord {
        id: id.into(),
        host: "h".into(),
        tenant: "t1".into(),
        deployment: "d1".into(),
        nf: "fw".into(),
        module: "firewall".into(),
        version: "1.0.0".into(),
        digest: "x".into(),
        window_start_ms: 1000,
        window_end_ms: 2000,
        meters: Meters { invocations: 1, packets, bytes: packets * 64, cpu_ns: 10, state_ops: 2, ..Default::default() },
    }
}

#[test]
fn meter_records_are_stored_once() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(&dir.path().join("g.db")).unwrap();
    assert_eq!(s.insert_meters(&[rec("a", 5), rec("b", 7)], 0).unwrap(), 2);
    assert_eq!(s.insert_meters(&[rec("a", 5), rec("c", 1)], 0).unwrap(), 1);
    let u = s.usage("t1", 0, 10_000).unwrap();
    assert_eq!(u.len(), 1);
    assert_eq!(u[0].sums.packets, 13);
    assert_eq!(u[0].records, 3);
    assert!(s.usage("t2", 0, 10_000).unwrap().is_empty());
    assert!(s.usage("t1", 1001, 10_000).unwrap().is_empty());
}

#[test]
fn state_byte_ms_is_summed_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(&dir.path().join("g.db")).unwrap();
    let mut a = rec("a", 1);
    a.meters.state_byte_ms = u64::MAX / 4;
    a.meters.table_bytes = 4096;
    let mut b = rec("b", 1);
    b.meters.state_byte_ms = 7;
    s.insert_meters(&[a, b], 0).unwrap();
    let u = s.usage("t1", 0, 10_000).unwrap();
    assert_eq!(u[0].sums.state_byte_ms, u64::MAX / 4 + 7);
    assert_eq!(u[0].state_byte_ms, u128::from(u64::MAX / 4 + 7));
}

#[test]
fn state_byte_ms_past_what_sqlite_and_u64_can_sum_stays_exact() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(&dir.path().join("g.db")).unwrap();
    // Five records of i64::MAX byte-ms each: SQLite's SUM would fail
    // with an overflow, and the u64 sums saturate.
    let big = u64::try_from(i64::MAX).unwrap();
    let recs: Vec<MeterRecord> = (0..5)
        .map(|n| {
            let mut r = rec(&format!("r{n}"), 1);
            r.meters.state_byte_ms = big;
            r
        })
        .collect();
    s.insert_meters(&recs, 0).unwrap();
    let u = s.usage("t1", 0, 10_000).unwrap();
    assert_eq!(u[0].state_byte_ms, 5 * u128::from(big));
    assert_eq!(u[0].sums.state_byte_ms, u64::MAX);
}

#[test]
fn state_held_is_each_hosts_latest_record_in_the_row_of_its_version() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(&dir.path().join("g.db")).unwrap();
    let at = |id: &str, host: &str, version: &str, end: u64, bytes: u64| {
        let mut r = rec(id, 1);
        r.host = host.into();
        r.version = version.into();
        r.window_start_ms = end - 1000;
        r.window_end_ms = end;
        r.meters.table_bytes = bytes;
        r
    };
    s.insert_meters(
        &[
            // Host a ran 1.0.0, then 2.0.0, which holds 300 bytes now.
            at("a1", "a", "1.0.0", 2000, 100),
            at("a2", "a", "1.0.0", 3000, 200),
            at("a3", "a", "2.0.0", 4000, 300),
            // Host b still runs 1.0.0 with 50 bytes.
            at("b1", "b", "1.0.0", 2000, 70),
            at("b2", "b", "1.0.0", 3500, 50),
        ],
        0,
    )
    .unwrap();
    let u = s.usage("t1", 0, 10_000).unwrap();
    let held = |version: &str| u.iter().find(|r| r.version == version).unwrap().sums.state_bytes();
    assert_eq!((held("1.0.0"), held("2.0.0")), (50, 300));
    // In a range that ends before host a's upgrade, its latest record
    // there counts.
    let u = s.usage("t1", 0, 2500).unwrap();
    assert_eq!(u.iter().map(|r| (r.version.as_str(), r.sums.state_bytes())).collect::<Vec<_>>(), [("1.0.0", 270)]);
}

#[test]
fn trap_causes_are_summed_into_usage() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(&dir.path().join("g.db")).unwrap();
    let mut a = rec("a", 5);
    a.meters.traps = 3;
    a.meters.trap_causes = [("panic".to_string(), 2), ("deadline exceeded".to_string(), 1)].into();
    let mut b = rec("b", 5);
    b.meters.traps = 4;
    b.meters.trap_causes = [("panic".to_string(), 4)].into();
    let mut other = rec("c", 1);
    other.nf = "other".into();
    s.insert_meters(&[a, b, other], 0).unwrap();
    let u = s.usage("t1", 0, 10_000).unwrap();
    let fw = u.iter().find(|r| r.nf == "fw").unwrap();
    assert_eq!(fw.sums.traps, 7);
    assert_eq!(fw.sums.trap_causes, [("deadline exceeded".to_string(), 1), ("panic".to_string(), 6)].into());
    assert!(u.iter().find(|r| r.nf == "other").unwrap().sums.trap_causes.is_empty());
}

#[test]
fn only_the_newest_events_are_kept() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(&dir.path().join("g.db")).unwrap();
    let ev = |tenant: &str, kind: &str| NfEvent {
        tenant: tenant.into(),
        deployment: "d1".into(),
        nf: "fw".into(),
        version: "1".into(),
        kind: kind.into(),
        level: "info".into(),
        timestamp_ns: 1,
        flow: None,
        fields: [("k".to_string(), "v".to_string())].into(),
    };
    let batch = EventBatch {
        host: "h".into(),
        events: (0..10).map(|n| ev("t1", &format!("k{n}"))).chain([ev("t2", "other")]).collect(),
        dropped: 0,
    };
    s.insert_events(&batch, 0, 4).unwrap();
    let got = s.events("t1", None, None, None, None, 100).unwrap();
    let kinds: Vec<&str> = got.iter().map(|(_, _, _, e)| e.kind.as_str()).collect();
    assert_eq!(kinds, ["k9", "k8", "k7", "k6"]);
    assert_eq!(got[0].3.fields["k"], "v");
    // Paging back: the events before the last one seen, newest first.
    let older = s.events("t1", None, None, None, Some(got[1].0), 100).unwrap();
    let kinds: Vec<&str> = older.iter().map(|(_, _, _, e)| e.kind.as_str()).collect();
    assert_eq!(kinds, ["k7", "k6"]);
    assert_eq!(s.events("t1", Some("d1"), Some("k8"), None, None, 100).unwrap().len(), 1);
    assert_eq!(s.events("t1", Some("d2"), None, None, None, 100).unwrap().len(), 0);
    assert_eq!(s.events("t2", None, None, None, None, 100).unwrap().len(), 1);
    // Received after a time: none are, later than now.
    assert_eq!(s.events("t1", None, None, Some(i64::MAX), None, 100).unwrap().len(), 0);

    // Log lines are kept apart: a flood of them leaves the events, and
    // the events list leaves them out.
    let lines = EventBatch {
        host: "h".into(),
        events: (0..10)
            .map(|n| NfEvent { level: if n % 2 == 0 { "info" } else { "error" }.into(), ..ev("t1", "sluice.log") })
            .collect(),
        dropped: 0,
    };
    s.insert_events(&lines, 5, 4).unwrap();
    assert_eq!(s.events("t1", None, None, None, None, 100).unwrap().len(), 4);
    let q =
        |levels: Vec<&'static str>, after: Option<i64>| LogQuery { levels, after, limit: 100, ..Default::default() };
    let all = s.logs("t1", &q(vec!["debug", "info", "warn", "error"], None)).unwrap();
    assert_eq!(all.len(), 4);
    assert!(all.windows(2).all(|w| w[0].seq < w[1].seq), "oldest first");
    assert_eq!(s.logs("t1", &q(vec!["error"], None)).unwrap().len(), 2);
    assert_eq!(s.logs("t1", &q(vec!["debug", "info", "warn", "error"], Some(all[1].seq))).unwrap().len(), 2);
    assert_eq!(s.logs("t2", &q(vec!["debug", "info", "warn", "error"], None)).unwrap().len(), 0);
}

#[test]
fn a_deployed_module_cannot_be_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(&dir.path().join("g.db")).unwrap();
    s.create_tenant(&TenantRow { id: "t1".into(), name: "acme".into(), created_ms: 0 }, "h", "p").unwrap();
    assert!(!s.create_tenant(&TenantRow { id: "t2".into(), name: "acme".into(), created_ms: 0 }, "h2", "p").unwrap());
    let m = ModuleRow {
        id: "m1".into(),
        tenant_id: "t1".into(),
        name: "fw".into(),
        version: "1".into(),
        digest: "d".into(),
        size: 1,
        contract: "0.2.0".into(),
        created_ms: 0,
    };
    assert!(s.insert_module(&m).unwrap());
    assert!(!s.insert_module(&ModuleRow { id: "m2".into(), ..m.clone() }).unwrap());
    assert_eq!(s.module("t1", "fw@1").unwrap().unwrap().id, "m1");
    assert!(s.module("t2", "m1").unwrap().is_none());
    let d = DeploymentRow {
        id: "d1".into(),
        tenant_id: "t1".into(),
        name: "edge".into(),
        group: "g".into(),
        revision: 1,
        spec: "{}".into(),
        attachments: Vec::new(),
        fragments: sluice_runtime::fragments::FragmentMode::Reassemble,
        durability: sluice_control::Durability::Replicated,
        created_ms: 0,
        updated_ms: 0,
    };
    s.put_deployment(&d, &["m1".into()]).unwrap();
    // The same name again, and an update from a stale revision: conflicts.
    let again = DeploymentRow { id: "d9".into(), ..d.clone() };
    assert!(matches!(s.put_deployment(&again, &[]), Err(StoreError::Conflict(_))));
    let two = DeploymentRow { revision: 2, spec: "{\"v\":2}".into(), ..d.clone() };
    s.put_deployment(&two, &["m1".into()]).unwrap();
    assert!(matches!(s.put_deployment(&two, &["m1".into()]), Err(StoreError::Conflict(_))));
    let stored = s.deployment("t1", "edge").unwrap().unwrap();
    assert_eq!((stored.revision, stored.fragments), (2, sluice_runtime::fragments::FragmentMode::Reassemble));
    assert_eq!(stored.durability, sluice_control::Durability::Replicated);
    assert_eq!(s.delete_module("t1", "m1").unwrap(), Err(vec!["edge".to_string()]));
    assert!(s.delete_deployment("t1", "d1").unwrap());
    assert_eq!(s.delete_module("t1", "m1").unwrap(), Ok(true));
}

fn attached(id: &str, tenant: &str, group: &str, revision: i64, attachments: &[&str]) -> DeploymentRow {
    DeploymentRow {
        id: id.into(),
        tenant_id: tenant.into(),
        name: format!("name-{id}"),
        group: group.into(),
        revision,
        spec: "[]".into(),
        attachments: attachments.iter().map(|a| a.parse().unwrap()).collect(),
        fragments: Default::default(),
        durability: Default::default(),
        created_ms: 0,
        updated_ms: 0,
    }
}

fn overlap_message(r: Result<(), StoreError>) -> String {
    match r {
        Err(StoreError::Overlap(m)) => m,
        other => panic!("expected an overlap, got {other:?}"),
    }
}

#[test]
fn overlapping_attachments_are_refused_in_a_group() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(&dir.path().join("g.db")).unwrap();
    for (id, name) in [("t1", "acme"), ("t2", "globex")] {
        s.create_tenant(&TenantRow { id: id.into(), name: name.into(), created_ms: 0 }, id, id).unwrap();
    }
    let web = attached("d1", "t1", "edge", 1, &["port=0,vlan=100", "port=1,dst=10.0.0.0/8"]);
    s.put_deployment(&web, &[]).unwrap();
    assert_eq!(s.deployment("t1", "d1").unwrap().unwrap().attachments, web.attachments);

    // Another tenant's overlapping claim: refused, without naming the deployment.
    let theirs = attached("d2", "t2", "edge", 1, &["port=0,vlan=100,dst=192.168.0.0/16"]);
    let m = overlap_message(s.put_deployment(&theirs, &[]));
    assert!(m.contains("another tenant's deployment") && !m.contains("name-d1") && !m.contains("vlan=100'"), "{m}");
    assert!(m.contains("'port=0,vlan=100,dst=192.168.0.0/16'"), "{m}");
    assert!(s.deployment("t2", "d2").unwrap().is_none());
    // The same tenant's: refused, naming its deployment and attachment.
    let mine = attached("d3", "t1", "edge", 1, &["port=1,dst=10.9.0.0/16"]);
    let m = overlap_message(s.put_deployment(&mine, &[]));
    assert!(m.contains("'name-d1'") && m.contains("'port=1,dst=10.0.0.0/8'"), "{m}");
    // The pre-check says the same.
    assert!(matches!(s.check_overlap("t1", "edge", None, &mine.attachments), Err(StoreError::Overlap(_))));

    // Disjoint claims, and the same claim in another group, are fine.
    s.put_deployment(&attached("d4", "t2", "edge", 1, &["port=0,vlan=200", "port=1,dst=11.0.0.0/8"]), &[]).unwrap();
    s.put_deployment(&attached("d5", "t2", "lab", 1, &["port=0,vlan=100"]), &[]).unwrap();
    // An update is not judged against its own previous attachments...
    s.put_deployment(&attached("d1", "t1", "edge", 2, &["port=0,vlan=100", "port=1,dst=10.1.0.0/16"]), &[]).unwrap();
    // ...but a move into a group goes through the check there.
    let m = overlap_message(s.put_deployment(&attached("d5", "t2", "edge", 2, &["port=0,vlan=100"]), &[]));
    assert!(m.contains("host group 'edge'"), "{m}");
    assert_eq!(s.deployment("t2", "d5").unwrap().unwrap().group, "lab");
    // Deleting a deployment frees its traffic.
    assert!(s.delete_deployment("t1", "d1").unwrap());
    s.put_deployment(&theirs, &[]).unwrap();
    // Development deployments (no attachments) never overlap.
    s.put_deployment(&attached("d6", "t1", "edge", 1, &[]), &[]).unwrap();
}

#[test]
fn concurrent_claims_on_the_same_traffic_store_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("g.db");
    let s = std::sync::Arc::new(Store::open(&path).unwrap());
    for t in ["t0", "t1", "t2", "t3", "t4", "t5", "t6", "t7"] {
        s.create_tenant(&TenantRow { id: t.into(), name: t.into(), created_ms: 0 }, t, t).unwrap();
    }
    let threads: Vec<_> = (0..8)
        .map(|n| {
            let s = s.clone();
            std::thread::spawn(move || {
                let d = attached(&format!("d{n}"), &format!("t{n}"), "edge", 1, &["port=0,vlan=7"]);
                s.put_deployment(&d, &[])
            })
        })
        .collect();
    let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 1, "{results:?}");
    assert!(results.iter().all(|r| r.is_ok() || matches!(r, Err(StoreError::Overlap(_)))));
    // A second handle on the same file (another connection) is held to it too.
    let other = Store::open(&path).unwrap();
    let d = attached("d9", "t0", "edge", 1, &["port=0"]);
    assert!(matches!(other.put_deployment(&d, &[]), Err(StoreError::Overlap(_))));
}
