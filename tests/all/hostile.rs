//! Hostile NFs: the host finishes, counts the trap, applies the policy,
//! re-creates the instance, keeps host-owned state, and other NFs of the
//! chain are unaffected.

use sluice_host::{Report, RunOptions, run};
use sluice_runtime::{Chain, NfLimits, NfSpec, RawPacket, Runtime, RuntimeConfig, TrapCause};
use sluice_tests::{host_config, nf, nf_as, read_pcap, test_nf, write_pcap};
use sluice_wire::build::FrameSpec;
use std::path::Path;

fn frames(n: usize) -> Vec<Vec<u8>> {
    (0..n).map(|i| FrameSpec::udp4([10, 0, 0, 1], 1000 + (i % 3) as u16, [10, 0, 0, 2], 53).build()).collect()
}

/// counter -> hostile(mode) -> tail counter, 8 packets in batches of 4.
fn run_hostile(dir: &Path, mode: &str, policy: &str, extra: &str) -> (Report, Vec<Vec<u8>>) {
    let input = dir.join("in.pcap");
    let output = dir.join("out.pcap");
    write_pcap(&input, &frames(8));
    let head = nf_as(&nf("counter"), dir, "head");
    let tail = nf_as(&nf("counter"), dir, "tail");
    let mut config = host_config(
        dir,
        &format!(
            r#"
            batch-size = 4
            [nf.hostile]
            failure-policy = "{policy}"
            deadline-ms = 20
            memory-mb = 16
            config-text = "{mode}"
            {extra}
            "#
        ),
    );
    config.max_memory_mb = 64;
    let opts = RunOptions {
        nfs: vec![head, test_nf("hostile"), tail],
        chain: None,
        swaps: vec![],
        input,
        output: Some(output.clone()),
        progress: false,
    };
    let report = run(&config, &opts).unwrap();
    (report, read_pcap(&output))
}

fn check_trapped(mode: &str, cause: &str) {
    let dir = tempfile::tempdir().unwrap();
    let (r, out) = run_hostile(dir.path(), mode, "fail-open", "");
    let h = &r.nfs[1];
    assert_eq!(h.name, "hostile");
    assert_eq!(h.meters.traps, 2, "{mode}: {:?}", h.meters);
    assert_eq!(h.meters.trap_causes.get(cause).copied(), Some(2), "{mode}: {:?}", h.meters.trap_causes);
    assert_eq!(h.meters.policy, 8);
    // Re-created after each trap (lazily, so the last trap leaves none).
    assert_eq!(h.meters.instantiations, 2);
    // Fail-open forwards every packet unchanged; the NFs around it saw all.
    assert_eq!(out, frames(8));
    assert_eq!(r.nfs[0].meters.packets, 8);
    assert_eq!(r.nfs[0].meters.traps, 0);
    assert_eq!(r.nfs[2].meters.packets, 8);
    assert_eq!(r.nfs[2].meters.traps, 0);
}

#[test]
fn infinite_loop_hits_the_deadline() {
    check_trapped("loop", "deadline exceeded");
}

#[test]
fn unbounded_allocation_hits_the_memory_cap() {
    check_trapped("alloc", "out of memory");
}

#[test]
fn deep_recursion_overflows_the_stack() {
    check_trapped("recurse", "stack overflow");
}

#[test]
fn panic_traps() {
    check_trapped("panic", "panic");
}

#[test]
fn fuel_limit_stops_a_loop_deterministically() {
    let dir = tempfile::tempdir().unwrap();
    let (r, out) = run_hostile(dir.path(), "loop", "fail-closed", "fuel = 200000");
    let h = &r.nfs[1];
    assert_eq!(h.meters.trap_causes.get("out of fuel").copied(), Some(2), "{:?}", h.meters.trap_causes);
    assert!(out.is_empty());
    // Fail-closed: the NF after it saw nothing.
    assert_eq!(r.nfs[2].meters.packets, 0);
}

#[test]
fn fail_closed_drops_the_batch_and_later_nfs_see_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (r, out) = run_hostile(dir.path(), "panic:1", "fail-closed", "");
    // First batch passes, second traps and is dropped.
    assert_eq!(out, frames(8)[..4].to_vec());
    assert_eq!(r.packets_out, 4);
    assert_eq!(r.nfs[1].meters.traps, 1);
    assert_eq!(r.nfs[2].meters.packets, 4);
}

#[test]
fn refused_and_malformed_batches_get_the_policy_without_a_trap() {
    for mode in ["error", "bad-verdicts"] {
        let dir = tempfile::tempdir().unwrap();
        let (r, out) = run_hostile(dir.path(), mode, "fail-closed", "");
        assert!(out.is_empty(), "{mode}");
        assert_eq!(r.nfs[1].meters.errors, 2, "{mode}");
        assert_eq!(r.nfs[1].meters.traps, 0, "{mode}");
        assert_eq!(r.nfs[1].meters.instantiations, 1, "{mode}: no re-creation needed");
        // Every packet is accounted for in the summary: fwd + drop + policy.
        let m = &r.nfs[1].meters;
        assert_eq!(m.forwarded + m.dropped + m.policy, m.packets, "{mode}");
        assert_eq!(m.policy, 8, "{mode}");
        let line = r.summary().lines().find(|l| l.contains("hostile")).unwrap().to_string();
        assert!(line.contains("policy       8"), "{mode}: {line}");
    }
}

#[test]
fn chatty_guest_is_rate_limited() {
    let dir = tempfile::tempdir().unwrap();
    let (r, out) = run_hostile(dir.path(), "print", "fail-closed", "log-lines-per-second = 10");
    assert_eq!(out.len(), 8);
    assert!(r.nfs[1].meters.log_dropped >= 1900, "{:?}", r.nfs[1].meters);
}

#[test]
fn oversized_state_is_refused_not_stored() {
    let dir = tempfile::tempdir().unwrap();
    let (r, out) = run_hostile(dir.path(), "big-state", "fail-closed", "");
    assert_eq!(out.len(), 8);
    assert!(r.nfs[1].meters.state_rejected >= 3, "{:?}", r.nfs[1].meters);
}

#[test]
fn rejected_config_names_the_nf_and_its_reason() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.pcap");
    write_pcap(&input, &frames(1));
    let config = host_config(dir.path(), "[nf.hostile]\nconfig-text = \"reject\"\n");
    let opts =
        RunOptions { nfs: vec![test_nf("hostile")], chain: None, swaps: vec![], input, output: None, progress: false };
    let e = run(&config, &opts).unwrap_err().to_string();
    assert_eq!(e, "NF 'hostile' rejected its configuration: hostile: config rejected on purpose (mode 'reject')");
}

#[test]
fn flow_state_survives_a_trap_and_re_instantiation() {
    let runtime = Runtime::new(RuntimeConfig::default()).unwrap();
    let module = runtime.load_file(&test_nf("hostile")).unwrap();
    // Counts per flow on every batch; panics on batch 3 of each instance.
    let spec = NfSpec { module, config: b"count-panic:2".as_slice().into(), limits: NfLimits::default(), owner: None };
    let mut chain = Chain::new(&runtime, &[spec]).unwrap();
    let frame = FrameSpec::udp4([10, 0, 0, 1], 7, [10, 0, 0, 2], 8).build();
    let pkt = RawPacket { data: &frame, wire_len: frame.len() as u32, timestamp_ns: 1, ingress_port: 0 };
    let mut trapped = 0;
    for _ in 0..6 {
        chain.process(&[pkt, pkt]);
        if matches!(chain.last_statuses()[0], sluice_runtime::BatchStatus::Trapped(TrapCause::Panic)) {
            trapped += 1;
        }
    }
    // Batches 1,2 count (4); 3 traps (its update is discarded); a new
    // instance counts batches 4,5 (8) from the kept state; 6 traps.
    assert_eq!(trapped, 2);
    let key = sluice_wire::parse(&frame).key.unwrap().normalized();
    let entry = chain.stages()[0].flow_table().get(&key).expect("state kept");
    assert_eq!(u64::from_le_bytes(entry.value.clone().try_into().unwrap()), 8);
    // The per-flow table kept counting across both traps: a table write is
    // applied when made, so the trapped batches' counts (made before the
    // panic) stay, unlike their discarded flow-state updates.
    let exported = chain.stages()[0].export_flow(&key).expect("flow exported");
    let packets = exported.tables.iter().find(|e| e.table == "packets").expect("table entry");
    assert_eq!(u64::from_le_bytes(packets.value.clone().try_into().unwrap()), 12);
    assert_eq!(exported.flow.as_ref().map(|f| f.clock), Some(4));
    // Re-creation is lazy: the instance after the last trap is not made.
    assert_eq!(chain.stages()[0].meters().instantiations, 2);
}

/// An NF asking `scan` and `top-k` for `u32::MAX` entries of a table of
/// thousands gets 1024 of each (the host's bound), pays for what it got,
/// and runs on within its deadline.
#[test]
fn a_hostile_scan_limit_is_bounded_by_the_host() {
    let dir = tempfile::tempdir().unwrap();
    let (r, out) = run_hostile(dir.path(), "scan-flood", "fail-closed", "");
    let h = &r.nfs[1];
    assert_eq!(h.name, "hostile");
    assert_eq!((h.meters.traps, h.meters.errors), (0, 0), "{:?}", h.meters);
    assert_eq!(out, frames(8));
    let scans: Vec<_> = r.events.iter().filter(|e| e.kind == "hostile.scan").collect();
    assert_eq!(scans.len(), 2, "{:?}", r.events);
    for e in scans {
        assert_eq!((e.fields["page"].as_str(), e.fields["top"].as_str()), ("1024", "1024"), "{:?}", e.fields);
        assert_eq!(e.fields["cursor"], "8", "more entries follow the page");
    }
    // Per batch: 4,096 keys added, then 1,024 + 1 for the scan and as
    // many for the top-k.
    assert_eq!(h.meters.table_ops, 2 * (4096 + 1025 + 1025), "{:?}", h.meters);
}
