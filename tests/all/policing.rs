//! The UDP whitelister and the rate limiter: decisions that depend on
//! packet time, made from host-owned flow state.

use sluice_host::{Report, RunOptions, run};
use sluice_tests::{host_config, nf, run_host, write_pcap_at};
use sluice_wire::build::FrameSpec;

const T0: u64 = 1_700_000_000_000_000_000;
const MS: u64 = 1_000_000;

fn run_nf(name: &str, config: &str, frames: &[(u64, Vec<u8>)], batch: usize, workers: usize) -> (Report, Vec<Vec<u8>>) {
    run_host(config, vec![nf(name)], frames, |c, _| {
        c.batch_size = batch;
        c.workers = workers;
    })
}

#[test]
fn udp_replies_pass_only_after_a_request() {
    let req = FrameSpec::udp4([10, 0, 0, 5], 5000, [192, 0, 2, 53], 53).build();
    let rep = FrameSpec::udp4([192, 0, 2, 53], 53, [10, 0, 0, 5], 5000).build();
    let unsolicited = FrameSpec::udp4([192, 0, 2, 53], 53, [10, 0, 0, 6], 5000).build();
    let tcp_in = FrameSpec::tcp4([192, 0, 2, 1], 80, [10, 0, 0, 5], 6000, 0x12).build();
    let transit = FrameSpec::udp4([192, 0, 2, 1], 1, [198, 51, 100, 1], 2).build();
    let frames = vec![
        (T0, rep.clone()),                  // reply before any request: dropped
        (T0 + MS, req.clone()),             // request: passes, marks the flow
        (T0 + 2 * MS, rep.clone()),         // reply: passes
        (T0 + 3 * MS, unsolicited.clone()), // to a client that asked nothing: dropped
        (T0 + 4 * MS, tcp_in.clone()),      // not UDP: untouched
        (T0 + 5 * MS, transit.clone()),     // not to a client: untouched
        (T0 + 40_000 * MS, rep.clone()),    // 40 s later the mark idled out (30 s): dropped
    ];
    let config = "[nf.udp-whitelist.config]\nclients = [\"10.0.0.0/24\"]\nidle-timeout-s = 30\nlog-dropped = true\n";
    for (batch, workers) in [(1, 1), (32, 1), (2, 2)] {
        let (r, out) = run_nf("udp-whitelist", config, &frames, batch, workers);
        assert_eq!(
            out,
            vec![req.clone(), rep.clone(), tcp_in.clone(), transit.clone()],
            "batch {batch} workers {workers}"
        );
        assert_eq!(r.events_by_kind.get("udp-whitelist/udp-whitelist.drop"), Some(&3));
    }
}

#[test]
fn token_buckets_police_by_packet_time() {
    let a = |len| FrameSpec::udp4([10, 0, 0, 1], 1000, [10, 0, 0, 2], 2000).with_frame_len(len).build();
    let b = FrameSpec::udp4([10, 0, 0, 3], 1000, [10, 0, 0, 2], 2000).with_frame_len(100).build();
    // Flow a: 10 packets 1 ms apart, then one 100 ms later; flow b: 2 packets.
    let mut frames: Vec<(u64, Vec<u8>)> = (0..10).map(|i| (T0 + i * MS, a(100))).collect();
    frames.push((T0 + 2 * MS, b.clone()));
    frames.push((T0 + 3 * MS, b.clone()));
    frames.push((T0 + 110 * MS, a(100)));
    frames.sort_by_key(|f| f.0);
    let config = "[nf.ratelimit.config]\npackets-per-second = 100\npacket-burst = 3\nreport-every = 1\n";
    for (batch, workers) in [(1, 1), (4, 1), (32, 2)] {
        let (r, out) = run_nf("ratelimit", config, &frames, batch, workers);
        // a: burst of 3, 0.9 tokens refilled over the next 9 ms (not enough),
        // then 100 ms later a full token; b: its own bucket, both pass.
        assert_eq!(out.iter().filter(|f| **f == a(100)).count(), 4, "batch {batch} workers {workers}");
        assert_eq!(out.iter().filter(|f| **f == b).count(), 2);
        assert_eq!(r.nfs[0].meters.dropped, 7);
    }

    // A byte budget: 1000 B/s with a 250-byte burst lets two 100-byte packets through.
    let frames: Vec<(u64, Vec<u8>)> = (0..5).map(|i| (T0 + i * MS, a(100))).collect();
    let (_, out) =
        run_nf("ratelimit", "[nf.ratelimit.config]\nbytes-per-second = 1000\nbyte-burst = 250\n", &frames, 32, 1);
    assert_eq!(out.len(), 2);
}

#[test]
fn bad_configs_are_refused_with_the_reason() {
    let frames = vec![(T0, FrameSpec::udp4([10, 0, 0, 1], 1, [10, 0, 0, 2], 2).build())];
    for (name, config, needle) in [
        ("ratelimit", "[nf.ratelimit.config]\npacket-burst = 3\n", "burst without a rate"),
        ("ratelimit", "[nf.ratelimit.config]\npackets-per-second = -1\n", "must be positive"),
        ("ratelimit", "[nf.ratelimit.config]\nreport-every = 1\n", "packets-per-second"),
        ("udp-whitelist", "[nf.udp-whitelist.config]\nclients = [\"10.0.0.300/24\"]\n", "10.0.0.300"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("in.pcap");
        write_pcap_at(&input, &frames);
        let c = host_config(dir.path(), config);
        let opts = RunOptions { nfs: vec![nf(name)], chain: None, swaps: vec![], input, output: None, progress: false };
        let e = run(&c, &opts).unwrap_err().to_string();
        assert!(e.contains(needle), "{name}: {e}");
    }
}

#[test]
fn a_source_is_policed_over_all_its_flows() {
    // One source opens 40 flows, one packet each, 1 ms apart: per flow
    // every packet passes; per source (100 packets/s, burst 5) only the
    // burst and what refills (one per 10 ms) pass. Another source is
    // independent.
    let mut frames = Vec::new();
    for i in 0..40u64 {
        let f = FrameSpec::udp4([10, 0, 0, 7], 1000 + i as u16, [192, 0, 2, 1], 53).build();
        frames.push((T0 + i * MS, f));
    }
    frames.push((T0 + 40 * MS, FrameSpec::udp4([10, 0, 0, 8], 1, [192, 0, 2, 1], 53).build()));
    let per_flow = "[nf.ratelimit.config]\npackets-per-second = 100\npacket-burst = 5\n";
    let (_, out) = run_nf("ratelimit", per_flow, &frames, 8, 1);
    assert_eq!(out.len(), 41);
    let per_source = format!("{per_flow}per = \"source\"\n");
    for batch in [1, 8, 64] {
        let (r, out) = run_nf("ratelimit", &per_source, &frames, batch, 1);
        // 5 burst + refills at 10 ms steps over 39 ms (3) + the other source.
        assert_eq!(out.len(), 5 + 3 + 1, "batch {batch}");
        assert_eq!(r.nfs[0].tables.len(), 2);
        assert_eq!(r.nfs[0].meters.table_errors, 0);
    }
    // Over the group: a burst per window of burst/rate (50 ms), counted
    // by sum; the 40 packets fall in one window, so only the burst passes,
    // and a packet two windows later passes again.
    let mut later = frames.clone();
    later.push((T0 + 150 * MS, FrameSpec::udp4([10, 0, 0, 7], 999, [192, 0, 2, 1], 53).build()));
    let per_group = format!("{per_flow}per = \"group-source\"\n");
    for batch in [1, 8, 64] {
        let (r, out) = run_nf("ratelimit", &per_group, &later, batch, 1);
        assert_eq!(out.len(), 5 + 1 + 1, "batch {batch}");
        assert_eq!(r.nfs[0].meters.table_errors, 0);
    }
    let bad = "[nf.ratelimit.config]\npackets-per-second = 100\nper = \"tenant\"\n";
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.pcap");
    write_pcap_at(&input, &frames);
    let c = host_config(dir.path(), bad);
    let opts =
        RunOptions { nfs: vec![nf("ratelimit")], chain: None, swaps: vec![], input, output: None, progress: false };
    let err = run(&c, &opts).unwrap_err().to_string();
    assert!(err.contains("per = 'tenant'"), "{err}");
}
