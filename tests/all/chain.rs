//! Linear chains: later NFs see only what earlier ones forwarded.

use sluice_host::{RunOptions, run};
use sluice_tests::{host_config, nf, write_pcap};
use sluice_wire::build::FrameSpec;

#[test]
fn counter_after_firewall_counts_survivors_only() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.pcap");
    let frames: Vec<Vec<u8>> = (0..50u16)
        .map(|i| {
            let dport = if i % 5 == 0 { 22 } else { 80 };
            FrameSpec::tcp4([10, 0, 0, 1], 1000 + i, [10, 0, 0, 2], dport, 2).build()
        })
        .collect();
    write_pcap(&input, &frames);
    let config = host_config(
        dir.path(),
        r#"
        batch-size = 8
        [nf.firewall.config]
        rules = [{ action = "allow", proto = "tcp", dst-ports = "80" }]
        "#,
    );
    let opts = RunOptions { nfs: vec![nf("firewall"), nf("counter")], input, output: None, progress: false };
    let r = run(&config, &opts).unwrap();
    assert_eq!(r.nfs[0].meters.dropped, 10);
    assert_eq!(r.nfs[1].meters.packets, 40);
    assert_eq!(r.nfs[1].meters.bytes, r.nfs[0].meters.bytes * 40 / 50);
    assert_eq!(r.packets_out, 40);
    // Meters are counted per call, not sampled.
    assert_eq!(r.nfs[0].meters.invocations, 7);
    assert!(r.nfs[0].meters.cpu_ns > 0);
}
