//! Hot swap: a new version takes over between two batches with the flow
//! state; nothing is lost or processed twice; incompatible versions are
//! refused and the old one keeps running.

use sluice_host::run::SwapAt;
use sluice_runtime::{Chain, Fate, NfLimits, NfSpec, RawPacket, Runtime, RuntimeConfig};
use sluice_tests::{nf, nf_as, run_host, stamped, test_nf};
use sluice_wire::build::FrameSpec;
use sluice_wire::tcp::flags::{ACK, SYN};

const INSIDE_ONLY: &str = r#"
[nf.firewall.config]
rules = [{ action = "allow", proto = "tcp", src = "10.0.0.0/24" }]
"#;

/// 40 connections: each opened from inside, then answered from outside.
/// Replies pass only through state the firewall created.
fn trace() -> Vec<Vec<u8>> {
    let mut f = Vec::new();
    for i in 0..40u16 {
        f.push(FrameSpec::tcp4([10, 0, 0, 1], 1000 + i, [192, 0, 2, 1], 80, SYN).build());
    }
    for i in 0..40u16 {
        f.push(FrameSpec::tcp4([192, 0, 2, 1], 80, [10, 0, 0, 1], 1000 + i, SYN | ACK).build());
    }
    f
}

fn run_with(swaps: Vec<SwapAt>, workers: usize, batch: usize) -> (sluice_host::Report, Vec<Vec<u8>>) {
    run_host(INSIDE_ONLY, vec![nf("firewall")], &stamped(&trace()), |c, o| {
        c.workers = workers;
        c.batch_size = batch;
        o.swaps = swaps;
    })
}

#[test]
fn a_swap_keeps_flow_state_and_loses_no_packet() {
    let dir = tempfile::tempdir().unwrap();
    let v2 = nf_as(&nf("firewall"), dir.path(), "firewall-v2");
    let (_, baseline) = run_with(vec![], 1, 8);
    assert_eq!(baseline.len(), 80, "all replies pass through the state");
    for (workers, batch, at) in [(1, 8, 60), (2, 8, 45), (1, 1, 40), (2, 32, 0)] {
        let swap = SwapAt { at, nf: "firewall".into(), module: v2.clone() };
        let (r, out) = run_with(vec![swap], workers, batch);
        assert_eq!(r.swaps.len(), 1);
        assert_eq!(r.swaps[0].result, "ok", "{:?}", r.swaps);
        // The replies after the swap still pass: the state came along.
        assert_eq!(out, baseline, "workers {workers} batch {batch} swap at {at}");
        // Every packet processed exactly once, by one version or the other.
        assert_eq!(r.nfs[0].meters.packets, 80);
        assert_eq!(r.nfs[0].meters.instantiations, 2 * workers as u64);
    }
}

#[test]
fn an_incompatible_version_is_refused_and_the_old_one_runs_on() {
    // The empty NF keeps no flow state: swapping the firewall to it would
    // drop 40 connections' state.
    let dir = tempfile::tempdir().unwrap();
    let counter = nf_as(&nf("noop"), dir.path(), "not-a-firewall");
    let (_, baseline) = run_with(vec![], 1, 8);
    let (r, out) = run_with(vec![SwapAt { at: 50, nf: "firewall".into(), module: counter }], 1, 8);
    assert!(r.swaps[0].result.contains("keeps no flow state"), "{:?}", r.swaps);
    assert_eq!(out, baseline);

    // A version that rejects its config is refused too.
    let (r, out) = run_with(vec![SwapAt { at: 50, nf: "firewall".into(), module: test_nf("hostile") }], 1, 8);
    assert!(r.swaps[0].result.contains("rejected its configuration"), "{:?}", r.swaps);
    assert_eq!(out, baseline);
}

#[test]
fn a_new_config_applies_to_new_connections_only() {
    let runtime = Runtime::new(RuntimeConfig::default()).unwrap();
    let module = runtime.load("firewall", &std::fs::read(nf("firewall")).unwrap()).unwrap();
    let spec = |config: &str| NfSpec {
        module: module.clone(),
        config: config.as_bytes().into(),
        limits: NfLimits::default(),
        owner: None,
    };
    let mut chain = Chain::new(&runtime, &[spec(r#"{"rules":[{"action":"allow","proto":"tcp"}]}"#)]).unwrap();
    let syn = |p: u16| FrameSpec::tcp4([10, 0, 0, 1], p, [192, 0, 2, 1], 80, SYN).build();
    let ack = |p: u16| FrameSpec::tcp4([10, 0, 0, 1], p, [192, 0, 2, 1], 80, ACK).build();
    let fates = |chain: &mut Chain, frames: &[Vec<u8>]| -> Vec<Fate> {
        let raw: Vec<RawPacket<'_>> = frames
            .iter()
            .map(|f| RawPacket { data: f, wire_len: f.len() as u32, timestamp_ns: 1, ingress_port: 0 })
            .collect();
        chain.process(&raw).iter().map(|r| r.fate).collect()
    };
    assert_eq!(fates(&mut chain, &[syn(1)]), vec![Fate::Forward(0)]);
    // Version 2 denies everything new.
    chain.swap(&runtime, "firewall", spec(r#"{"default":"deny"}"#)).unwrap();
    assert_eq!(fates(&mut chain, &[ack(1), syn(2)]), vec![Fate::Forward(0), Fate::Dropped(0)]);
    // A refused swap leaves version 2 running.
    let e = chain.swap(&runtime, "firewall", spec(r#"{"rules":[{"action":"perhaps"}]}"#)).unwrap_err().to_string();
    assert!(e.contains("hot swap of NF 'firewall' refused") && e.contains("perhaps"), "{e}");
    assert_eq!(fates(&mut chain, &[syn(3)]), vec![Fate::Dropped(0)]);
    assert!(chain.swap(&runtime, "nope", spec("{}")).unwrap_err().to_string().contains("no NF of that name"));
}
