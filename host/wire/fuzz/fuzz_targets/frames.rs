//! Any bytes as a batch frame and as a result frame (`sluice:nf@0.6.0` and
//! `@0.7.0`): parsing and reading every part never panic, and the records
//! a result frame yields, written again, read back the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_wire::abi::{BatchFrame, OffloadRecord, OpRecord, ResultFrame, ResultFrameWriter, ReturnRecord};

fuzz_target!(|data: &[u8]| {
    if let Ok(f) = BatchFrame::parse(data) {
        for i in 0..=f.len() {
            let _ = f.descriptor(i);
        }
        let mut k = 0;
        while let Some(r) = ReturnRecord::decode(f.returns, k) {
            let mut again = Vec::new();
            r.push(&mut again);
            assert_eq!(ReturnRecord::decode(&again, 0), Some(r));
            k += 1;
        }
    }
    let Ok(f) = ResultFrame::parse(data) else { return };
    let verdicts: Vec<u32> = f.verdicts().collect();
    let rewrites: Vec<_> = f.rewrites().map_while(Result::ok).collect();
    let updates: Vec<_> = f.updates().map_while(Result::ok).collect();
    let offloads: Vec<(OffloadRecord<'_>, Vec<OpRecord>)> =
        f.offloads().map_while(Result::ok).map(|o| (o, o.ops().collect())).collect();
    let mut w = ResultFrameWriter::default();
    for (i, b) in &rewrites {
        w.rewrite(*i, b);
    }
    for (i, b) in &updates {
        w.update(*i, b);
    }
    for (o, ops) in &offloads {
        w.offload(o, ops);
    }
    let again = w.finish(&verdicts);
    let g = ResultFrame::parse(&again).expect("a written frame parses");
    assert_eq!(g.verdicts().collect::<Vec<_>>(), verdicts);
    assert_eq!(g.rewrites().map_while(Result::ok).collect::<Vec<_>>(), rewrites);
    assert_eq!(g.updates().map_while(Result::ok).collect::<Vec<_>>(), updates);
    let back: Vec<_> = g.offloads().map_while(Result::ok).map(|o| (o, o.ops().collect::<Vec<_>>())).collect();
    assert_eq!(back.len(), offloads.len());
    for ((a, aops), (b, bops)) in back.iter().zip(&offloads) {
        assert_eq!((a.packet, a.return_counts, a.idle_timeout_ns, a.max_packets), (b.packet, b.return_counts, b.idle_timeout_ns, b.max_packets));
        assert_eq!(aops, bops);
    }
});
