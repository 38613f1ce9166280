//! The monitor's eventual counters: with two workers the merged totals
//! equal the sums over the trace.

use sluice_tests::{nf, run_host};
use sluice_wire::build::FrameSpec;
use std::collections::HashMap;

const T0: u64 = 1_700_000_000_000_000_000;

fn trace() -> Vec<(u64, Vec<u8>)> {
    let mut v = Vec::new();
    for i in 0..3000u64 {
        let h = (i % 37) as u8 + 1;
        let f = FrameSpec::udp4([10, 3, 0, h], 1000 + (i % 11) as u16, [192, 0, 2, (i % 5) as u8], 53)
            .with_payload(vec![0; (i % 300) as usize])
            .build();
        v.push((T0 + i * 10_000_000, f));
    }
    // A non-IP frame counts in the totals only.
    let mut arp = vec![0xffu8; 6];
    arp.extend_from_slice(&[2, 0, 0, 0, 0, 1, 0x08, 0x06]);
    arp.extend_from_slice(&[0; 28]);
    v.push((T0 + 30_000_000_000, arp));
    v
}

fn values(report: &sluice_host::Report, table: &str) -> HashMap<u64, u64> {
    let t = report.nfs[0].tables.iter().find(|t| t.spec.name == table).unwrap_or_else(|| panic!("table {table}"));
    t.values.iter().copied().collect()
}

#[test]
fn two_workers_merge_to_the_trace_totals() {
    let frames = trace();
    let bytes: u64 = frames.iter().map(|(_, f)| f.len() as u64).sum();
    let mut per_host: HashMap<u64, (u64, u64)> = HashMap::new();
    let mut per_flow: HashMap<u64, u64> = HashMap::new();
    for (_, f) in &frames {
        if let Some(k) = sluice_wire::parse(f).key {
            let e = per_host.entry(u64::from(u32::from_be_bytes(k.src.to_v4().unwrap()))).or_default();
            e.0 += 1;
            e.1 += f.len() as u64;
            *per_flow.entry(k.symmetric_hash()).or_default() += 1;
        }
    }
    let config = "[nf.monitor.config]\nreport-interval-s = 5\ntop = 3\nmerge-interval-ms = 50\n";
    for workers in [1, 2] {
        let (report, out) = run_host(config, vec![nf("monitor")], &frames, |c, _| c.workers = workers);
        assert_eq!(out.len(), frames.len(), "the monitor forwards everything");
        let totals = values(&report, "totals");
        assert_eq!(totals[&0], frames.len() as u64, "{workers} workers: packets");
        assert_eq!(totals[&1], bytes, "{workers} workers: bytes");
        let hp = values(&report, "host-packets");
        let hb = values(&report, "host-bytes");
        assert_eq!(hp.len(), per_host.len());
        for (h, (p, b)) in &per_host {
            assert_eq!((hp[h], hb[h]), (*p, *b), "host {h:#x}");
        }
        // The report lists the largest 1000 entries of a table; all match.
        let flows = report.nfs[0].tables.iter().find(|t| t.spec.name == "flow-packets").unwrap();
        assert_eq!(flows.entries, per_flow.len() as u64);
        let wrong = flows.values.iter().filter(|(k, v)| per_flow.get(k) != Some(v)).count();
        assert_eq!(wrong, 0, "flow counts differ from the trace");
        // Periodic top-talker reports, from every worker that saw traffic.
        let reports = report.events_by_kind.get("monitor/monitor.report").copied().unwrap_or(0);
        assert!(reports >= 5, "{reports} reports");
        let ev = report.events.iter().find(|e| e.kind == "monitor.report").unwrap();
        assert!(ev.fields["top1"].starts_with("10.3.0."), "{:?}", ev.fields);
        assert!(report.nfs[0].meters.table_calls > 0);
        assert_eq!(report.nfs[0].meters.table_errors, 0);
    }
}
