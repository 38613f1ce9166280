//! Any bytes as a sequence of IP fragments: inspecting, reassembling and
//! cutting never panic, and a datagram that completes is cut again into
//! fragments that reassemble to the same datagram.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_wire::fragment::inspect;
use sluice_wire::reassembly::{Added, Datagram, split};

fuzz_target!(|data: &[u8]| {
    // Frames separated by a length byte each.
    let mut frames = Vec::new();
    let mut rest = data;
    while let Some((&len, tail)) = rest.split_first() {
        let n = usize::from(len).min(tail.len());
        let (frame, tail) = tail.split_at(n);
        frames.push(frame);
        rest = tail;
    }
    let mut d = Datagram::default();
    for f in &frames {
        let Some(facts) = inspect(f) else { continue };
        if facts.fragment.is_none() {
            let _ = split(f, &sluice_wire::reassembly::Cut { size: 68, ident: 1, v6: facts.v6 });
            continue;
        }
        if d.add(f, &facts) == Ok(Added::Complete) {
            let whole = d.assemble().expect("a complete datagram assembles");
            let cut = d.cut();
            let pieces = split(&whole, &cut);
            let mut again = Datagram::default();
            let mut done = None;
            for p in &pieces {
                if let Some(facts) = inspect(p).filter(|f| f.fragment.is_some())
                    && again.add(p, &facts) == Ok(Added::Complete)
                {
                    done = again.assemble();
                }
            }
            if pieces.len() > 1 {
                assert_eq!(done.as_deref(), Some(&whole[..]), "cut again, it reassembles alike");
            }
            d = Datagram::default();
        }
    }
});
