//! The IDS: signatures within packets, across packets of a flow, with
//! nocase/offset/depth, in IDS and IPS mode, on one and two workers.

use sluice_host::{Report, RunOptions, run};
use sluice_tests::{host_config, nf, run_host, stamped, write_pcap};
use sluice_wire::build::FrameSpec;
use sluice_wire::tcp::flags::{ACK, PSH};

const RULES: &str = r#"
[nf.ids.config]
mode = "MODE"
rules = [
  'alert tcp any any -> any 80 (msg:"exe download"; content:"evil.exe"; sid:1001;)',
  'alert tcp any any -> any 80 (msg:"shell"; content:"/bin/sh"; nocase; sid:1002;)',
  'drop tcp any any -> any 80 (msg:"magic at start"; content:"MAGIC"; offset:0; depth:8; sid:1003;)',
  'alert tcp any 80 -> any any (msg:"server leak"; content:"secret"; sid:1004;)',
]
"#;

fn seg(sport: u16, payload: &[u8]) -> Vec<u8> {
    FrameSpec::tcp4([10, 0, 0, 1], sport, [10, 0, 0, 2], 80, PSH | ACK).with_payload(payload.to_vec()).build()
}

fn reply(dport: u16, payload: &[u8]) -> Vec<u8> {
    FrameSpec::tcp4([10, 0, 0, 2], 80, [10, 0, 0, 1], dport, PSH | ACK).with_payload(payload.to_vec()).build()
}

fn run_ids(frames: &[Vec<u8>], mode: &str, batch: usize, workers: usize) -> (Report, Vec<Vec<u8>>) {
    run_host(&RULES.replace("MODE", mode), vec![nf("ids")], &stamped(frames), |c, _| {
        c.batch_size = batch;
        c.workers = workers;
    })
}

/// (sid, packet index in the trace) of every alert, sorted.
fn alerts(r: &Report, frames: &[Vec<u8>]) -> Vec<(u32, String)> {
    let mut v: Vec<(u32, String)> = r
        .events
        .iter()
        .filter(|e| e.kind == "ids.alert")
        .map(|e| (e.fields["sid"].parse().unwrap(), e.flow.clone().unwrap_or_default()))
        .collect();
    v.sort();
    assert_eq!(r.events_total as usize, v.len());
    let _ = frames;
    v
}

#[test]
fn a_signature_split_across_two_packets_of_a_flow_is_found() {
    let frames = vec![
        seg(4000, b"GET /downloads/ev"),
        seg(5000, b"unrelated flow"),
        seg(4000, b"il.exe HTTP/1.1\r\n"),
        // The same halves on two different flows must not match.
        seg(6000, b"xx ev"),
        seg(6001, b"il.exe"),
    ];
    for batch in [1, 2, 32] {
        for workers in [1, 2] {
            let (r, out) = run_ids(&frames, "ids", batch, workers);
            let a = alerts(&r, &frames);
            assert_eq!(a.len(), 1, "batch {batch} workers {workers}: {a:?}");
            assert_eq!(a[0].0, 1001);
            assert!(a[0].1.contains(":4000"), "{a:?}");
            assert_eq!(out.len(), frames.len(), "IDS mode drops nothing");
        }
    }
}

#[test]
fn nocase_offset_depth_and_direction_are_honoured() {
    let frames = vec![
        seg(4100, b"run /BIN/SH now"), // 1002 nocase: match
        seg(4101, b"EVIL.EXE"),        // 1001 is case-sensitive: no match
        seg(4102, b"MAGIC here"),      // 1003 within depth: match
        seg(4103, b"0123456789MAGIC"), // 1003 beyond depth: no match
        seg(4104, b"MAG"),             // 1003 never spans packets
        seg(4104, b"IC"),
        reply(4105, b"the secret is out"), // 1004 server -> client: match
        seg(4106, b"my secret"),           // 1004 wrong direction: no match
    ];
    let (r, _) = run_ids(&frames, "ids", 32, 1);
    let sids: Vec<u32> = alerts(&r, &frames).into_iter().map(|a| a.0).collect();
    assert_eq!(sids, vec![1002, 1003, 1004]);
}

#[test]
fn ips_mode_drops_the_matching_packet_and_the_rest_of_its_flow() {
    let frames = vec![
        seg(4200, b"hello"),
        seg(4200, b"MAGIC!"), // matches drop rule 1003
        seg(4200, b"more data"),
        seg(4201, b"other flow"),
        seg(4202, b"get evil.exe"), // alert-only rule: passes in IPS mode too
    ];
    let (r, out) = run_ids(&frames, "ips", 32, 1);
    assert_eq!(out, vec![frames[0].clone(), frames[3].clone(), frames[4].clone()]);
    assert_eq!(r.nfs[0].meters.dropped, 2);
    let a = alerts(&r, &frames);
    assert_eq!(a.iter().map(|x| x.0).collect::<Vec<_>>(), vec![1001, 1003]);
    let dropped = r.events.iter().find(|e| e.fields["sid"] == "1003").unwrap();
    assert_eq!(dropped.fields["action"], "dropped");

    // The same trace in IDS mode passes everything.
    let (_, out) = run_ids(&frames, "ids", 32, 1);
    assert_eq!(out.len(), frames.len());
}

#[test]
fn a_bad_rule_is_refused_with_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.pcap");
    write_pcap(&input, &[seg(1, b"x")]);
    let config = host_config(
        dir.path(),
        r#"
        [nf.ids.config]
        rules = """
        # web rules
        alert tcp any any -> any 80 (content:"a"; sid:1;)
        alert tcp any any -> any 80 (content:"b"; depth:0; sid:2;)
        """
        "#,
    );
    let opts = RunOptions { nfs: vec![nf("ids")], chain: None, swaps: vec![], input, output: None, progress: false };
    let e = run(&config, &opts).unwrap_err().to_string();
    assert!(e.contains("rejected its configuration") && e.contains("line 3") && e.contains("depth"), "{e}");
}
