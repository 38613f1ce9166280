//! State tables across contract versions, hot swaps and failures.

use sluice_host::run::SwapAt;
use sluice_runtime::{Chain, NfLimits, NfSpec, RawPacket, Runtime, RuntimeConfig};
use sluice_tests::{nf, nf_as, run_host, test_nf};
use sluice_wire::build::FrameSpec;

const T0: u64 = 1_700_000_000_000_000_000;

fn trace(n: u64) -> Vec<(u64, Vec<u8>)> {
    (0..n)
        .map(|i| {
            let f = FrameSpec::udp4([10, 4, 0, (i % 20) as u8], 2000 + (i % 3) as u16, [192, 0, 2, 1], 53)
                .with_payload(vec![1; (i % 100) as usize])
                .build();
            (T0 + i * 1_000_000, f)
        })
        .collect()
}

fn totals(report: &sluice_host::Report, nf: usize) -> Vec<(u64, u64)> {
    let t = report.nfs[nf].tables.iter().find(|t| t.spec.name == "totals").expect("totals table");
    let mut v = t.values.clone();
    v.sort_unstable();
    v
}

#[test]
fn a_component_built_against_0_1_0_still_loads_and_chains_with_0_2_0() {
    let runtime = Runtime::new(RuntimeConfig::default()).unwrap();
    let legacy = runtime.load_file(&test_nf("legacy-v0-1")).unwrap();
    assert_eq!(legacy.contract_version(), "0.1.0");
    let monitor = runtime.load_file(&nf("monitor")).unwrap();
    assert_eq!(monitor.contract_version(), "0.6.0");
    let specs = [
        NfSpec { module: legacy, config: Vec::new().into(), limits: NfLimits::default(), owner: None },
        NfSpec { module: monitor, config: b"{}".to_vec().into(), limits: NfLimits::default(), owner: None },
    ];
    let mut chain = Chain::new(&runtime, &specs).unwrap();
    let frames = trace(40);
    let raw: Vec<RawPacket<'_>> = frames
        .iter()
        .map(|(t, f)| RawPacket { data: f, wire_len: f.len() as u32, timestamp_ns: *t, ingress_port: 0 })
        .collect();
    for batch in raw.chunks(8) {
        chain.process(batch);
    }
    // The 0.1.0 NF kept per-flow counts in its flow state.
    let key = sluice_wire::parse(&frames[0].1).key.unwrap().normalized();
    let entry = chain.stages()[0].flow_table().get(&key).unwrap();
    let count = u64::from_le_bytes(entry.value.clone().try_into().unwrap());
    assert_eq!(
        count,
        frames.iter().filter(|(_, f)| sluice_wire::parse(f).key.unwrap().normalized() == key).count() as u64
    );
    assert!(chain.stages()[0].tables().unwrap().is_empty());
    assert!(!chain.stages()[1].tables().unwrap().is_empty());
}

#[test]
fn a_component_built_against_0_2_0_still_loads_with_its_tables() {
    let runtime = Runtime::new(RuntimeConfig::default()).unwrap();
    let legacy = runtime.load_file(&test_nf("legacy-v0-2")).unwrap();
    assert_eq!(legacy.contract_version(), "0.2.0");
    let monitor = runtime.load_file(&nf("monitor")).unwrap();
    let specs = [
        NfSpec { module: legacy, config: Vec::new().into(), limits: NfLimits::default(), owner: None },
        NfSpec { module: monitor, config: b"{}".to_vec().into(), limits: NfLimits::default(), owner: None },
    ];
    let mut chain = Chain::new(&runtime, &specs).unwrap();
    let frames = trace(40);
    let raw: Vec<RawPacket<'_>> = frames
        .iter()
        .map(|(t, f)| RawPacket { data: f, wire_len: f.len() as u32, timestamp_ns: *t, ingress_port: 0 })
        .collect();
    for batch in raw.chunks(8) {
        chain.process(batch);
    }
    let stage = &mut chain.stages_mut()[0];
    stage.flush_state();
    assert_eq!(stage.meters().traps, 0);
    let domain = stage.tables().unwrap().domain().clone();
    assert_eq!(domain.eventual_snapshot("seen").unwrap(), vec![(0, 40)]);
}

#[test]
fn a_component_built_against_0_3_0_still_loads_with_its_single_writer_table() {
    let runtime = Runtime::new(RuntimeConfig::default()).unwrap();
    let legacy = runtime.load_file(&test_nf("legacy-v0-3")).unwrap();
    assert_eq!(legacy.contract_version(), "0.3.0");
    let monitor = runtime.load_file(&nf("monitor")).unwrap();
    assert_eq!(monitor.contract_version(), "0.6.0");
    let specs = [
        NfSpec { module: legacy, config: Vec::new().into(), limits: NfLimits::default(), owner: None },
        NfSpec { module: monitor, config: b"{}".to_vec().into(), limits: NfLimits::default(), owner: None },
    ];
    let mut chain = Chain::new(&runtime, &specs).unwrap();
    let frames = trace(40);
    let raw: Vec<RawPacket<'_>> = frames
        .iter()
        .map(|(t, f)| RawPacket { data: f, wire_len: f.len() as u32, timestamp_ns: *t, ingress_port: 0 })
        .collect();
    for batch in raw.chunks(8) {
        chain.process(batch);
    }
    let stage = &mut chain.stages_mut()[0];
    stage.flush_state();
    assert_eq!(stage.meters().traps, 0);
    let tables = stage.tables_mut().unwrap();
    tables.sync_point();
    let domain = tables.domain().clone();
    assert_eq!(
        domain.single_snapshot("seen").unwrap(),
        vec![(0u64.to_le_bytes().to_vec(), 40u64.to_le_bytes().to_vec())]
    );
}

#[test]
fn a_hot_swap_keeps_global_tables_and_refuses_incompatible_ones() {
    let dir = tempfile::tempdir().unwrap();
    let v2 = nf_as(&nf("monitor"), dir.path(), "monitor-v2");
    let frames = trace(500);
    let bytes: u64 = frames.iter().map(|(_, f)| f.len() as u64).sum();
    for workers in [1, 2] {
        let (report, _) =
            run_host("[nf.monitor.config]\nreport-interval-s = 0\n", vec![nf("monitor")], &frames, |c, o| {
                c.workers = workers;
                c.batch_size = 16;
                o.swaps = vec![SwapAt { at: 230, nf: "monitor".into(), module: v2.clone() }];
            });
        assert_eq!(report.swaps[0].result, "ok", "{:?}", report.swaps);
        // The new version declared the same tables and counted on: the
        // totals cover the whole trace, before and after the swap.
        assert_eq!(totals(&report, 0), vec![(0, 500), (1, bytes)], "{workers} workers");
    }

    // A version that declares `totals` with another layout is refused,
    // even though it ignores the error it got; the old version runs on
    // with its tables.
    let runtime = Runtime::new(RuntimeConfig::default()).unwrap();
    let monitor = runtime.load_file(&nf("monitor")).unwrap();
    let spec = NfSpec { module: monitor, config: b"{}".to_vec().into(), limits: NfLimits::default(), owner: None };
    let mut chain = Chain::new(&runtime, &[spec]).unwrap();
    let raw: Vec<RawPacket<'_>> = frames
        .iter()
        .map(|(t, f)| RawPacket { data: f, wire_len: f.len() as u32, timestamp_ns: *t, ingress_port: 0 })
        .collect();
    chain.process(&raw[..100]);
    let hostile = std::fs::read(test_nf("hostile")).unwrap();
    let clash = NfSpec {
        module: runtime.load("monitor", &hostile).unwrap(),
        config: b"clash".to_vec().into(),
        limits: NfLimits::default(),
        owner: None,
    };
    let err = chain.swap(&runtime, "monitor", clash).unwrap_err().to_string();
    assert!(err.contains("table 'totals'") && err.contains("another layout"), "{err}");
    chain.process(&raw[100..]);
    let stage = &mut chain.stages_mut()[0];
    stage.flush_state();
    let domain = stage.tables().unwrap().domain().clone();
    assert_eq!(domain.eventual_snapshot("totals").unwrap(), vec![(0u64, 500u64), (1, bytes)]);
    assert_eq!(stage.tables().unwrap().tables().count(), 5, "the old declarations stand");
}

#[test]
fn declared_tables_are_in_the_report_and_metered() {
    let (report, _) =
        run_host("[nf.monitor.config]\nreport-interval-s = 0\n", vec![nf("monitor")], &trace(100), |c, _| {
            c.batch_size = 10;
        });
    let names: Vec<&str> = report.nfs[0].tables.iter().map(|t| t.spec.name.as_str()).collect();
    assert_eq!(names, ["flow-packets", "flow-bytes", "host-packets", "host-bytes", "totals"]);
    let m = &report.nfs[0].meters;
    // Five counter-add calls per batch: O(1) host calls per batch.
    assert_eq!(m.table_calls, 5 * 10 + 5);
    assert!(m.table_ops >= 5 * 100 / 10);
    assert!(report.summary().contains("table totals"));
}
