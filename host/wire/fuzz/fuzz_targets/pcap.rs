//! Any bytes as a capture file: reading must never panic, and every packet
//! it returns must lie inside the file.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    if let Ok(t) = sluice_pcap::Trace::from_bytes(Path::new("fuzz.pcap"), data.to_vec().into()) {
        for p in t.packets() {
            assert!(p.range.end <= data.len());
            let _ = sluice_wire::parse(t.data(p));
        }
    }
});
