//! Flow offload (`sluice:nf@0.5.0`): the host decides offloaded flows'
//! packets itself, and everything the NF keeps ends as without offload.

use sluice_runtime::{Chain, Fate, NfLimits, NfSpec, RawPacket, Runtime, RuntimeConfig};
use sluice_tests::{nf, test_nf};
use sluice_wire::build::FrameSpec;
use sluice_wire::tcp::flags::{ACK, FIN, PSH, SYN};

const T0: u64 = 1_700_000_000_000_000_000;

/// `conns` TCP connections from 10.0.0.x to 203.0.113.9:80, interleaved:
/// handshake, `data` segments alternating direction, then FIN, FIN, ACK.
/// One frame every microsecond.
fn connections(conns: u16, data: usize) -> Vec<(u64, Vec<u8>)> {
    let client = |c: u16| [10, 0, (c >> 8) as u8, c as u8];
    let server = [203, 0, 113, 9];
    let mut per_conn: Vec<Vec<Vec<u8>>> = Vec::new();
    for c in 0..conns {
        let port = 40_000 + c;
        let out = |f| FrameSpec::tcp4(client(c), port, server, 80, f).with_payload(vec![7; 100]).build();
        let back = |f| FrameSpec::tcp4(server, 80, client(c), port, f).with_payload(vec![9; 300]).build();
        let mut v = vec![out(SYN), back(SYN | ACK), out(ACK)];
        for i in 0..data {
            v.push(if i % 2 == 0 { out(PSH | ACK) } else { back(PSH | ACK) });
        }
        v.extend([out(FIN | ACK), back(FIN | ACK), out(ACK)]);
        per_conn.push(v);
    }
    let longest = per_conn.iter().map(Vec::len).max().unwrap_or(0);
    let mut frames = Vec::new();
    for i in 0..longest {
        for conn in &per_conn {
            if let Some(f) = conn.get(i) {
                frames.push(f.clone());
            }
        }
    }
    frames.into_iter().enumerate().map(|(i, f)| (T0 + i as u64 * 1_000, f)).collect()
}

fn chain(runtime: &Runtime, module: &str, test: bool, config: &str) -> Chain {
    let path = if test { test_nf(module) } else { nf(module) };
    let module = runtime.load_file(&path).unwrap();
    assert_eq!(module.contract_version(), "0.6.0");
    let spec = NfSpec { module, config: config.as_bytes().to_vec().into(), limits: NfLimits::default(), owner: None };
    Chain::new(runtime, &[spec]).unwrap()
}

/// Runs `frames` through `chain` in batches of `batch`: every packet's
/// fate and bytes out.
fn run(chain: &mut Chain, frames: &[(u64, Vec<u8>)], batch: usize) -> Vec<(Fate, Vec<u8>)> {
    let mut out = Vec::new();
    for chunk in frames.chunks(batch) {
        let raw: Vec<RawPacket<'_>> = chunk
            .iter()
            .map(|(t, f)| RawPacket { data: f, wire_len: f.len() as u32, timestamp_ns: *t, ingress_port: 0 })
            .collect();
        let results = chain.process(&raw);
        for (r, (_, f)) in results.iter().zip(chunk) {
            out.push((r.fate, r.data.clone().unwrap_or_else(|| f.clone())));
        }
    }
    out
}

const FIREWALL: &str =
    r#"{"default":"deny","rules":[{"action":"allow","proto":"tcp","src":"10.0.0.0/8","dst-ports":"80"}]"#;

#[test]
fn an_offloading_firewall_decides_every_packet_as_without_offload_with_few_calls() {
    let runtime = Runtime::new(RuntimeConfig::default()).unwrap();
    let frames = connections(40, 64);
    let mut plain = chain(&runtime, "firewall", false, &format!("{FIREWALL}}}"));
    let mut offloading =
        chain(&runtime, "firewall", false, &format!("{FIREWALL},\"offload\":true,\"offload-after\":1}}"));
    let a = run(&mut plain, &frames, 32);
    let b = run(&mut offloading, &frames, 32);
    assert_eq!(a.len(), frames.len());
    assert!(a.iter().all(|(f, _)| *f == Fate::Forward(0)), "every packet of an allowed connection passes");
    assert_eq!(a, b, "the same fate and bytes for every packet");

    let (pm, om) = (plain.stages()[0].meters(), offloading.stages()[0].meters());
    assert_eq!(pm.packets, frames.len() as u64);
    assert_eq!(pm.offloaded_packets, 0);
    assert_eq!(om.packets + om.offloaded_packets, frames.len() as u64, "every packet handed over or offloaded");
    assert!(om.offloaded_packets * 10 > frames.len() as u64 * 8, "most packets offloaded: {om:?}");
    assert!(om.invocations < pm.invocations, "fewer calls: {} against {}", om.invocations, pm.invocations);
    let c = offloading.offload_counters();
    // Each connection: one entry per direction, ended by its FINs. The
    // firewall's first requests (one batch's) are declined: the chain
    // tracks packets' paths only once an NF has asked.
    assert_eq!((c.installed, c.ended), (80, 80), "{c:?}");
    assert!(c.declined > 0 && c.declined <= 32, "{c:?}");
    assert_eq!(offloading.offload_entries(), 0);
    assert_eq!(offloading.stages()[0].offload_entries(), 0);
    // The rule hits the NF counts are the same.
    let hits = |c: &mut Chain| {
        let s = &mut c.stages_mut()[0];
        s.flush_state();
        s.tables().unwrap().domain().eventual_snapshot("rule-hits").unwrap()
    };
    assert_eq!(hits(&mut plain), hits(&mut offloading));
}

/// The library firewall configured `offloading`, after `frames` in batches
/// of 32 gave the same fate and bytes for every packet as the firewall
/// without offload.
fn firewall_as_without_offload(runtime: &Runtime, offloading: &str, frames: &[(u64, Vec<u8>)]) -> Chain {
    let mut plain = chain(runtime, "firewall", false, &format!("{FIREWALL}}}"));
    let mut offloading = chain(runtime, "firewall", false, offloading);
    assert_eq!(run(&mut plain, frames, 32), run(&mut offloading, frames, 32));
    offloading
}

#[test]
fn flows_under_entries_longer_than_their_state_s_idle_timeout_keep_their_state() {
    // An NF's flow state is not refreshed for every packet under an
    // entry: sweeps (run by the datagrams to port 9, which reach the NF
    // all along) and the packets that come back to the NF (every entry
    // ends at its 20th packet) must find the flows alive. 40 connections
    // of 2.7 ms (a packet each way every 80 µs) against 1 ms of idle
    // timeout: a flow whose state was swept under its entry is opened
    // again when its packets come back.
    let runtime = Runtime::new(RuntimeConfig::default()).unwrap();
    let mut frames = connections(40, 64);
    frames.retain(|(_, f)| sluice_wire::parse(f).tcp_flags.is_none_or(|fl| fl & FIN == 0));
    let (first, last) = (frames[0].0, frames.last().unwrap().0);
    let discard = FrameSpec::udp4([10, 9, 9, 9], 5000, [203, 0, 113, 9], 9).build();
    frames.extend((first..last).step_by(20_000).map(|t| (t + 500, discard.clone())));
    frames.sort_by_key(|(t, _)| *t);
    let tables = |c: &mut Chain, name: &str| {
        let s = &mut c.stages_mut()[0];
        s.flush_state();
        let mut v = s.tables().unwrap().domain().eventual_snapshot(name).unwrap();
        v.sort_unstable();
        v
    };
    for batch in [8, 32] {
        let config = |offload| format!("offload = {offload}\nstate-ms = 1\nmax-packets = 20\n");
        let mut plain = chain(&runtime, "offload-counter", true, &config(0));
        let mut offloading = chain(&runtime, "offload-counter", true, &config(1));
        assert_eq!(run(&mut plain, &frames, batch), run(&mut offloading, &frames, batch), "batch {batch}");
        offloading.end_offloads();
        let opened = tables(&mut plain, "opened");
        assert_eq!(opened.len(), 41, "batch {batch}: each flow opened once: {opened:?}");
        assert!(opened.iter().all(|(_, n)| *n == 1), "batch {batch}: {opened:?}");
        assert_eq!(opened, tables(&mut offloading, "opened"), "batch {batch}: no flow's state lost under its entry");
        assert_eq!(tables(&mut plain, "packets"), tables(&mut offloading, "packets"), "batch {batch}");
        let m = offloading.stages()[0].meters();
        assert!(m.offloaded_packets * 2 > frames.len() as u64, "batch {batch}: {m:?}");
    }
}

#[test]
fn the_firewall_offloads_a_direction_at_its_fourth_established_packet_so_short_connections_make_no_entries() {
    let runtime = Runtime::new(RuntimeConfig::default()).unwrap();
    let offload = format!("{FIREWALL},\"offload\":true}}");
    // Short connections (two segments each way): no direction reaches its
    // fourth established packet, so no entry is made.
    let offloading = firewall_as_without_offload(&runtime, &offload, &connections(40, 4));
    let c = offloading.offload_counters();
    assert_eq!((c.installed, c.declined), (0, 0), "{c:?}");
    assert_eq!(offloading.stages()[0].meters().offloaded_packets, 0);

    // Long ones: each connection's SYN, SYN-ACK, the ACK and segments 0-5
    // and 7 (the first four established packets each way: ACK, 0, 2, 4
    // out; 1, 3, 5, 7 back) and its FIN, FIN, ACK reach the NF; the other
    // 57 pass under the two entries. The first batch's requests are
    // declined (the chain tracks paths once an NF has asked) and asked
    // again with each direction's next packet.
    let offloading = firewall_as_without_offload(&runtime, &offload, &connections(40, 64));
    let c = offloading.offload_counters();
    assert_eq!((c.installed, c.ended), (80, 80), "{c:?}");
    assert!(c.declined > 0 && c.declined <= 32, "{c:?}");
    let m = offloading.stages()[0].meters();
    assert_eq!(m.packets, 40 * 13 + c.declined, "{m:?}");
    assert_eq!(m.offloaded_packets, 40 * 57 - c.declined, "{m:?}");
}

#[test]
fn offloaded_rewrites_idle_expiry_and_returns_leave_the_output_and_the_counts_of_a_run_without_offload() {
    let runtime = Runtime::new(RuntimeConfig::default()).unwrap();
    // Connections that never close: their entries end by idling out (1 ms
    // of packet time: a 40-connection round of packets takes 40 µs, so the
    // gap below ends them all) or at the end of the run.
    let mut frames = connections(40, 64);
    frames.retain(|(_, f)| sluice_wire::parse(f).tcp_flags.is_none_or(|fl| fl & FIN == 0));
    let gap = frames.last().unwrap().0 + 50_000_000;
    let again: Vec<(u64, Vec<u8>)> = connections(40, 64)
        .into_iter()
        .filter(|(_, f)| sluice_wire::parse(f).tcp_flags.is_none_or(|fl| fl & FIN == 0))
        .map(|(t, f)| (t - T0 + gap, f))
        .collect();
    frames.extend(again);
    for (batch, max_packets) in [(32, 0), (7, 5)] {
        let config = |offload| format!("offload = {offload}\nidle-ms = 1\nmax-packets = {max_packets}\n");
        let mut plain = chain(&runtime, "offload-counter", true, &config(0));
        let mut offloading = chain(&runtime, "offload-counter", true, &config(1));
        let a = run(&mut plain, &frames, batch);
        let b = run(&mut offloading, &frames, batch);
        assert_eq!(a, b, "batch {batch}: the same bytes out (DSCP 46, TTL lowered) for every packet");
        for (_, f) in &a {
            let l = sluice_wire::parse(f);
            let ip = sluice_wire::ipv4::Ipv4Packet::new_checked(&f[usize::from(l.l3_offset.unwrap())..]).unwrap();
            assert_eq!(ip.tos() >> 2, 46);
            assert!(ip.verify_checksum());
        }
        let c = offloading.offload_counters();
        assert!(c.installed >= 160, "batch {batch}: both directions of 40 connections, twice: {c:?}");
        assert!(c.packets * 10 > frames.len() as u64 * 5, "batch {batch}: {c:?}");
        // What is still offloaded comes back when the chain stops.
        assert!(offloading.offload_entries() > 0);
        offloading.end_offloads();
        assert_eq!(offloading.offload_entries(), 0);
        assert_eq!(offloading.offload_counters().ended, offloading.offload_counters().installed);
        let counts = |c: &mut Chain| {
            let s = &mut c.stages_mut()[0];
            s.flush_state();
            let mut v = s.tables().unwrap().domain().eventual_snapshot("packets").unwrap();
            v.sort_unstable();
            v
        };
        let (pa, pb) = (counts(&mut plain), counts(&mut offloading));
        assert_eq!(pa.len(), 40);
        assert_eq!(pa.iter().map(|(_, n)| n).sum::<u64>(), frames.len() as u64);
        assert_eq!(pa, pb, "batch {batch}: per-flow counts equal with returned packets added");
        let m = offloading.stages()[0].meters();
        assert_eq!(m.packets + m.offloaded_packets, frames.len() as u64);
        assert_eq!(m.offload_returns_dropped, 0);
    }
}

#[test]
fn a_component_built_against_0_4_0_still_loads_beside_newer_ones() {
    let runtime = Runtime::new(RuntimeConfig::default()).unwrap();
    let legacy = runtime.load_file(&test_nf("legacy-v0-4")).unwrap();
    assert_eq!(legacy.contract_version(), "0.4.0");
    let spec = NfSpec { module: legacy, config: Vec::new().into(), limits: NfLimits::default(), owner: None };
    let counter = runtime.load_file(&test_nf("offload-counter")).unwrap();
    let counter =
        NfSpec { module: counter, config: b"offload = 1\n".to_vec().into(), limits: NfLimits::default(), owner: None };
    // A chain of a 0.4.0 NF and an offloading one: the 0.4.0 NF never
    // offloads, so no packet skips the chain.
    let mut chain = Chain::new(&runtime, &[spec, counter]).unwrap();
    let frames = connections(4, 20);
    let out = run(&mut chain, &frames, 8);
    assert!(out.iter().all(|(f, _)| *f == Fate::Forward(0)));
    assert_eq!(chain.stages()[0].meters().errors, 0, "top-k saw every count");
    assert_eq!(chain.stages()[0].meters().packets, frames.len() as u64);
    let c = chain.offload_counters();
    assert_eq!(c.installed, 0);
    assert!(c.declined > 0, "the offloading NF asked, alone: {c:?}");
}

#[test]
fn a_component_built_against_0_5_0_still_loads_and_offloads_beside_0_6_0() {
    let runtime = Runtime::new(RuntimeConfig::default()).unwrap();
    let legacy = runtime.load_file(&test_nf("legacy-v0-5")).unwrap();
    assert_eq!(legacy.contract_version(), "0.5.0");
    let legacy = NfSpec { module: legacy, config: Vec::new().into(), limits: NfLimits::default(), owner: None };
    let counter = |offload: &str| NfSpec {
        module: runtime.load_file(&test_nf("offload-counter")).unwrap(),
        config: format!("offload = {offload}\n").into_bytes().into(),
        limits: NfLimits::default(),
        owner: None,
    };
    // The 0.5.0 NF takes the batch as three lists, the 0.6.0 one as a
    // frame; both offload, so established packets skip the chain, and the
    // output is the 0.6.0 NF's alone (the 0.5.0 one changes nothing).
    let mut chain = Chain::new(&runtime, &[legacy, counter("1")]).unwrap();
    let mut alone = Chain::new(&runtime, &[counter("0")]).unwrap();
    let frames = connections(10, 30);
    for batch in [1, 7, 32] {
        assert_eq!(run(&mut chain, &frames, batch), run(&mut alone, &frames, batch), "batch {batch}");
    }
    let m = chain.stages()[0].meters();
    assert_eq!(m.errors, 0, "the 0.5.0 NF read every batch and had its requests taken");
    assert_eq!(m.packets + m.offloaded_packets, 3 * frames.len() as u64);
    let c = chain.offload_counters();
    assert!(c.installed > 0 && c.packets > 0, "{c:?}");
}

/// A chain of the 0.7.0 test NF (no SDK) in `mode`, with `limits`.
fn frame_chain(runtime: &Runtime, mode: &str, limits: NfLimits) -> Chain {
    let module = runtime.load_file(&test_nf("frame-v0-7")).unwrap();
    assert_eq!(module.contract_version(), "0.7.0");
    Chain::new(runtime, &[NfSpec { module, config: mode.as_bytes().to_vec().into(), limits, owner: None }]).unwrap()
}

#[test]
fn a_0_7_0_component_gets_its_returns_in_the_batch_frame_and_offloads_through_its_result_frame() {
    let runtime = Runtime::new(RuntimeConfig::default()).unwrap();
    let frames = connections(10, 30);
    let mut chain = frame_chain(&runtime, "ok", NfLimits::default());
    for batch in [1, 7, 32] {
        let out = run(&mut chain, &frames, batch);
        assert!(
            out.iter().zip(&frames).all(|((fate, b), (_, f))| *fate == Fate::Forward(0) && b == f),
            "batch {batch}"
        );
    }
    // What is still offloaded comes back with a batch of no packets.
    chain.end_offloads();
    let (mut seen, mut returned) = (0u64, 0u64);
    for e in chain.drain_events() {
        let field = |k: &str| e.event.fields.iter().find(|(n, _)| n == k).map_or(0, |(_, v)| v.parse::<u64>().unwrap());
        seen += field("packets");
        returned += field("returned-packets");
    }
    let m = chain.stages()[0].meters();
    assert_eq!(m.errors, 0, "every return named one of its batch's flows");
    let c = chain.offload_counters();
    assert!(c.installed > 0 && c.packets > 0, "{c:?}");
    assert_eq!(m.packets + m.offloaded_packets, 3 * frames.len() as u64);
    assert_eq!(seen, m.packets);
    assert_eq!(seen + returned, 3 * frames.len() as u64, "every packet seen or returned, once");
}

#[test]
fn malformed_result_frames_get_the_failure_policy_and_floods_of_requests_are_held() {
    let runtime = Runtime::new(RuntimeConfig::default()).unwrap();
    let frames = connections(10, 10);
    for mode in ["lengths", "cut", "verdicts"] {
        let mut chain = frame_chain(&runtime, mode, NfLimits::default());
        run(&mut chain, &frames, 8);
        let m = chain.stages()[0].meters();
        assert_eq!(
            (m.errors, m.traps),
            (frames.len().div_ceil(8) as u64, 0),
            "{mode}: every batch refused, none trapped"
        );
        assert_eq!(m.policy, frames.len() as u64, "{mode}");
        assert_eq!(chain.offload_counters().installed, 0, "{mode}");
    }
    // 65,536 requests a batch, most for packets it does not have or with
    // changes the host refuses: what is made is held by the budget.
    let limits = NfLimits { state_budget_bytes: 64 * 1024, ..NfLimits::default() };
    let mut chain = frame_chain(&runtime, "flood", limits);
    let out = run(&mut chain, &frames, 32);
    assert!(out.iter().all(|(f, _)| *f == Fate::Forward(0)), "refused requests do not stop traffic");
    let m = chain.stages()[0].meters();
    assert_eq!((m.errors, m.traps), (0, 0));
    assert!(chain.offload_entries() as u64 * sluice_runtime::offload::ENTRY_BYTES <= 64 * 1024);
}

#[test]
fn offload_entries_are_held_by_the_state_budget() {
    let runtime = Runtime::new(RuntimeConfig::default()).unwrap();
    let module = runtime.load_file(&test_nf("offload-counter")).unwrap();
    // 64 KiB of budget: the table's 40 counters take a few KiB, the
    // rest holds fewer than 256 entries of 256 bytes.
    let limits = NfLimits { state_budget_bytes: 64 * 1024, ..NfLimits::default() };
    let spec = NfSpec { module, config: b"offload = 1\n".to_vec().into(), limits, owner: None };
    let mut chain = Chain::new(&runtime, &[spec]).unwrap();
    let frames = connections(400, 4);
    let out = run(&mut chain, &frames, 64);
    assert!(out.iter().all(|(f, _)| *f == Fate::Forward(0)), "refused offloads do not stop traffic");
    let held = chain.offload_entries() as u64;
    assert!(held > 0 && held * sluice_runtime::offload::ENTRY_BYTES <= 64 * 1024, "{held} entries held");
    assert!(held < 800, "not every one of the 800 flow directions: {held}");
    assert_eq!(chain.stages()[0].meters().traps, 0);
}

#[test]
fn a_chain_skips_its_nfs_only_where_every_nf_offloaded_and_applies_every_nf_s_changes() {
    let runtime = Runtime::new(RuntimeConfig::default()).unwrap();
    let spec = |config: &str| NfSpec {
        module: runtime.load_file(&test_nf("offload-counter")).unwrap(),
        config: config.as_bytes().to_vec().into(),
        limits: NfLimits::default(),
        owner: None,
    };
    let frames = connections(20, 40);
    // Both NFs offload: each lowers the TTL, so an offloaded packet leaves
    // with its TTL lowered twice, as one that ran both NFs.
    let mut both = Chain::new(&runtime, &[spec("offload = 1\n"), spec("offload = 1\n")]).unwrap();
    let mut neither = Chain::new(&runtime, &[spec("offload = 0\n"), spec("offload = 0\n")]).unwrap();
    // Only the second offloads: nothing skips the chain.
    let mut second = Chain::new(&runtime, &[spec("offload = 0\n"), spec("offload = 1\n")]).unwrap();
    let (a, b, c) = (run(&mut neither, &frames, 16), run(&mut both, &frames, 16), run(&mut second, &frames, 16));
    assert_eq!(a, b);
    assert_eq!(a, c);
    let ttl = |f: &[u8]| f[14 + 8];
    assert_eq!(ttl(&a[0].1), ttl(&frames[0].1) - 2);
    let cb = both.offload_counters();
    assert!(cb.installed >= 40 && cb.packets * 2 > frames.len() as u64, "{cb:?}");
    let m = both.stages()[1].meters();
    assert_eq!(m.packets + m.offloaded_packets, frames.len() as u64, "each NF meters what passed under its entries");
    let cs = second.offload_counters();
    assert_eq!((cs.installed, cs.packets), (0, 0), "{cs:?}");
    assert!(cs.declined > 0);
    assert_eq!(second.stages()[0].meters().packets, frames.len() as u64);
}

#[test]
fn a_hot_swap_ends_the_old_version_s_entries_and_hands_their_counts_to_the_new_one() {
    let runtime = Runtime::new(RuntimeConfig::default()).unwrap();
    let frames = connections(30, 64);
    let (first, second) = frames.split_at(frames.len() / 2);
    let spec = || NfSpec {
        module: runtime.load_file(&test_nf("offload-counter")).unwrap(),
        config: b"offload = 1\n".to_vec().into(),
        limits: NfLimits::default(),
        owner: None,
    };
    let mut chain = Chain::new(&runtime, &[spec()]).unwrap();
    let mut plain = chain_of(&runtime, "offload = 0\n");
    let mut out = run(&mut chain, first, 32);
    assert!(chain.offload_entries() > 0);
    let before = chain.offload_counters();
    chain.swap(&runtime, "offload-counter", spec()).unwrap();
    assert_eq!(chain.offload_entries(), 0, "the new version decides its flows again");
    assert_eq!(chain.offload_counters().ended, before.installed);
    out.extend(run(&mut chain, second, 32));
    assert_eq!(out, run(&mut plain, &frames, 32));
    chain.end_offloads();
    let counts = |c: &mut Chain| {
        let s = &mut c.stages_mut()[0];
        s.flush_state();
        let mut v = s.tables().unwrap().domain().eventual_snapshot("packets").unwrap();
        v.sort_unstable();
        v
    };
    assert_eq!(counts(&mut chain), counts(&mut plain), "what passed under the old version's entries is counted");
}

fn chain_of(runtime: &Runtime, config: &str) -> Chain {
    chain(runtime, "offload-counter", true, config)
}

/// The monitor's five tables, merged.
fn monitor_tables(c: &mut Chain, stage: usize) -> Vec<Vec<(u64, u64)>> {
    let s = &mut c.stages_mut()[stage];
    s.flush_state();
    let domain = s.tables().unwrap().domain().clone();
    ["flow-packets", "flow-bytes", "host-packets", "host-bytes", "totals"]
        .iter()
        .map(|t| {
            let mut v = domain.eventual_snapshot(t).unwrap();
            v.sort_unstable();
            v
        })
        .collect()
}

#[test]
fn an_offloading_monitor_ends_with_the_tables_of_a_monitor_that_saw_every_packet() {
    let runtime = Runtime::new(RuntimeConfig::default()).unwrap();
    let mut frames = connections(30, 64);
    // Connections left open too: their counts come back at the end.
    frames.extend(
        connections(10, 20)
            .into_iter()
            .filter(|(_, f)| sluice_wire::parse(f).tcp_flags.is_none_or(|fl| fl & FIN == 0))
            .map(|(t, f)| (t + 1_000_000_000, f)),
    );
    let spec = |name: &str, config: &str| NfSpec {
        module: runtime.load_file(&nf(name)).unwrap(),
        config: config.as_bytes().to_vec().into(),
        limits: NfLimits::default(),
        owner: None,
    };
    let plain_cfg = r#"{"report-interval-s":0}"#;
    let offload_cfg = r#"{"report-interval-s":0,"offload":true}"#;
    let mut plain = Chain::new(&runtime, &[spec("monitor", plain_cfg)]).unwrap();
    let mut offloading = Chain::new(&runtime, &[spec("monitor", offload_cfg)]).unwrap();
    assert_eq!(run(&mut plain, &frames, 32), run(&mut offloading, &frames, 32));
    let c = offloading.offload_counters();
    assert!(c.packets * 10 > frames.len() as u64 * 7, "most packets offloaded: {c:?}");
    offloading.end_offloads();
    let expected = monitor_tables(&mut plain, 0);
    assert_eq!(expected[4], vec![(0, frames.len() as u64), (1, frames.iter().map(|(_, f)| f.len() as u64).sum())]);
    assert_eq!(monitor_tables(&mut offloading, 0), expected);

    // Behind an offloading firewall: both offload the same packets, so
    // established connections skip the chain, and the monitor still
    // counts every packet.
    let firewall = format!("{FIREWALL},\"offload\":true}}");
    let mut chain = Chain::new(&runtime, &[spec("firewall", &firewall), spec("monitor", offload_cfg)]).unwrap();
    let mut both_plain =
        Chain::new(&runtime, &[spec("firewall", &format!("{FIREWALL}}}")), spec("monitor", plain_cfg)]).unwrap();
    assert_eq!(run(&mut both_plain, &frames, 32), run(&mut chain, &frames, 32));
    let c = chain.offload_counters();
    assert!(c.installed >= 80 && c.packets * 10 > frames.len() as u64 * 7, "{c:?}");
    chain.end_offloads();
    assert_eq!(monitor_tables(&mut chain, 1), monitor_tables(&mut both_plain, 1));
}

/// Source port of a frame (TCP or UDP).
fn src_port(f: &[u8]) -> u16 {
    sluice_wire::parse(f).key.unwrap().src_port
}

#[test]
fn an_offloading_nat_translates_every_packet_as_without_offload_and_keeps_a_mapping_only_while_its_flow_runs() {
    let runtime = Runtime::new(RuntimeConfig::default()).unwrap();
    // One public port, so that who holds it shows in the output.
    let nat = |offload: bool| {
        format!(
            r#"{{"public-ip":"198.51.100.1","inside":["10.0.0.0/8"],"port-first":40000,"port-count":1,"idle-timeout-s":1,"offload":{offload}}}"#
        )
    };
    let udp = |src: u8, t: u64| {
        (t, FrameSpec::udp4([10, 0, 0, src], 5000, [203, 0, 113, 5], 53).with_payload(vec![src; 40]).build())
    };
    let ms = 1_000_000;
    // Host 1 sends every 100 ms for 3 s: under an entry its mapping must
    // stay (longer than its 1 s timeout), so host 3, starting at 2 s, finds
    // no port. Then 3 s of silence: host 1's mapping idles out. Host 2
    // starts and takes the port; host 1's next packets find none (not the
    // old entry's port). Two phases, so that no batch spans the silence (a
    // batch's packets share one packet time for the tables).
    let mut first: Vec<(u64, Vec<u8>)> = (0..30).map(|i| udp(1, T0 + i * 100 * ms)).collect();
    first.extend((0..5).map(|i| udp(3, T0 + 2_000 * ms + i * ms)));
    first.sort_by_key(|(t, _)| *t);
    let mut second: Vec<(u64, Vec<u8>)> = (0..40).map(|i| udp(2, T0 + 6_000 * ms + i * ms)).collect();
    second.extend((0..10).map(|i| udp(1, T0 + 6_045 * ms + i * ms)));
    let frames: Vec<(u64, Vec<u8>)> = first.iter().chain(&second).cloned().collect();
    for batch in [1, 8, 32] {
        let mut plain = chain(&runtime, "nat", false, &nat(false));
        let mut offloading = chain(&runtime, "nat", false, &nat(true));
        let mut x = run(&mut plain, &first, batch);
        x.extend(run(&mut plain, &second, batch));
        let mut y = run(&mut offloading, &first, batch);
        y.extend(run(&mut offloading, &second, batch));
        let differ = x.iter().zip(&y).position(|(a, b)| a != b);
        assert!(differ.is_none(), "batch {batch}: packet {differ:?} differs with offload");
        let forwarded = |host: u8, phase: std::ops::Range<u64>| -> Vec<u16> {
            frames
                .iter()
                .zip(&x)
                .filter(|((t, f), _)| phase.contains(&(t - T0)) && f[29] == host)
                .filter(|(_, (fate, _))| *fate == Fate::Forward(0))
                .map(|(_, (_, out))| src_port(out))
                .collect()
        };
        assert_eq!(forwarded(1, 0..5_000 * ms), vec![40000; 30], "batch {batch}: host 1 kept its port");
        assert_eq!(forwarded(3, 0..5_000 * ms), Vec::<u16>::new(), "batch {batch}: no port for host 3");
        // Host 1's mapping is swept at the end of host 2's first batch, so
        // host 2's packets pass from its second batch on.
        let second_host = forwarded(2, 5_000 * ms..u64::MAX);
        assert!(!second_host.is_empty() && second_host.iter().all(|p| *p == 40000), "batch {batch}: {second_host:?}");
        assert_eq!(forwarded(1, 5_000 * ms..u64::MAX), Vec::<u16>::new(), "batch {batch}: and host 1 has none");
        let (pm, om) = (plain.stages()[0].meters(), offloading.stages()[0].meters());
        assert_eq!(pm.offloaded_packets, 0);
        assert_eq!(om.packets + om.offloaded_packets, frames.len() as u64);
        // Host 1's packets from the second asking batch on pass under an
        // entry (the first is declined): in batches of 1, all but two; of
        // 8, the last two batches' (each a packet every 100 ms); of 32,
        // none (its 30 packets fill one batch).
        let least = match batch {
            1 => 28,
            8 => 14,
            _ => 0,
        };
        assert!(om.offloaded_packets >= least, "batch {batch}: {om:?}");
    }
}

#[test]
fn an_offloading_load_balancer_rewrites_both_directions_as_without_offload() {
    let runtime = Runtime::new(RuntimeConfig::default()).unwrap();
    let lb = |offload: bool| {
        format!(r#"{{"vip":"203.0.113.9","port":80,"backends":["10.9.0.1:8080"],"offload":{offload}}}"#)
    };
    // Clients to the VIP, replies from the backend.
    let mut frames = Vec::new();
    for (t, f) in connections(30, 40) {
        let k = sluice_wire::parse(&f).key.unwrap();
        let flags = sluice_wire::parse(&f).tcp_flags.unwrap();
        let frame = if k.src.to_v4() == Some([203, 0, 113, 9]) {
            let client = k.dst.to_v4().unwrap();
            FrameSpec::tcp4([10, 9, 0, 1], 8080, client, k.dst_port, flags).with_payload(vec![9; 300]).build()
        } else {
            f
        };
        frames.push((t, frame));
    }
    let mut plain = chain(&runtime, "lb", false, &lb(false));
    let mut offloading = chain(&runtime, "lb", false, &lb(true));
    let x = run(&mut plain, &frames, 32);
    let y = run(&mut offloading, &frames, 32);
    let differ = x.iter().zip(&y).position(|(a, b)| a != b);
    assert!(differ.is_none() && x.len() == y.len(), "packet {differ:?} differs with offload");
    // Requests went to the backend, replies came from the VIP.
    for (out, (_, f)) in x.iter().map(|(_, o)| o).zip(&frames) {
        let (k_in, k_out) = (sluice_wire::parse(f).key.unwrap(), sluice_wire::parse(out).key.unwrap());
        if k_in.dst.to_v4() == Some([203, 0, 113, 9]) {
            assert_eq!((k_out.dst.to_v4(), k_out.dst_port), (Some([10, 9, 0, 1]), 8080));
        } else {
            assert_eq!((k_out.src.to_v4(), k_out.src_port), (Some([203, 0, 113, 9]), 80));
        }
    }
    let om = offloading.stages()[0].meters();
    assert_eq!(om.packets + om.offloaded_packets, frames.len() as u64);
    assert!(om.offloaded_packets * 10 > frames.len() as u64 * 7, "{om:?}");
}

/// The offload-counter's per-flow counts, merged.
fn counter_table(c: &mut Chain) -> Vec<(u64, u64)> {
    let s = &mut c.stages_mut()[0];
    s.flush_state();
    let mut v = s.tables().unwrap().domain().eventual_snapshot("packets").unwrap();
    v.sort_unstable();
    v
}

/// Per-key sums of two hosts' counts.
fn merged(a: &[(u64, u64)], b: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut m = std::collections::BTreeMap::new();
    for (k, n) in a.iter().chain(b) {
        *m.entry(*k).or_insert(0) += n;
    }
    m.into_iter().collect()
}

#[test]
fn offload_entries_travel_with_their_flows_to_another_host_and_no_packet_is_counted_twice_or_lost() {
    let runtime = Runtime::new(RuntimeConfig::default()).unwrap();
    // Long connections that stay open: mid-way, their flows move to a
    // second host, their entries carrying what passed under them.
    let mut frames = connections(30, 64);
    frames.retain(|(_, f)| sluice_wire::parse(f).tcp_flags.is_none_or(|fl| fl & FIN == 0));
    let half = frames.len() / 2;
    let config = |offload| format!("offload = {offload}\n");
    let mut plain = chain(&runtime, "offload-counter", true, &config(0));
    let expected = run(&mut plain, &frames, 32);
    let total = counter_table(&mut plain);
    let keys = |c: &Chain| -> Vec<sluice_wire::FlowKey> {
        let mut v: Vec<_> = c.offloaded_flows().collect();
        v.sort_unstable();
        v.dedup();
        v
    };

    // A kill: the last copies the first host sent its flows' next owner
    // are all that is left of its entries.
    for batch in [32, 5] {
        let mut a = chain(&runtime, "offload-counter", true, &config(1));
        let mut b = chain(&runtime, "offload-counter", true, &config(1));
        let mut out = run(&mut a, &frames[..half], batch);
        let flows = keys(&a);
        assert_eq!(flows.len(), 30);
        let copies: Vec<_> = flows.iter().map(|k| (*k, a.carry_offloads(k))).collect();
        assert!(copies.iter().all(|(_, c)| c.len() == 2 && c.iter().all(|e| e.packets > 0)), "both directions passed");
        let now = frames[half].0;
        for (k, c) in copies {
            assert_eq!(b.import_offloads(k, c, now), 0);
        }
        assert_eq!(b.offload_entries(), 60);
        out.extend(run(&mut b, &frames[half..], batch));
        assert_eq!(out, expected, "batch {batch}: the same bytes out on the second host");
        let calls = b.stages()[0].meters().packets;
        assert_eq!(calls, 0, "batch {batch}: the second host decided every packet by the carried entries");

        b.end_offloads();

        // The killed host's counts stop where it died (its returns never
        // came); the second host adds what passed under the entries there.
        let at_kill = counter_table(&mut a);
        assert_eq!(merged(&at_kill, &counter_table(&mut b)), total, "batch {batch}: every packet counted once");
        // Without the copies the second host would miss what passed under
        // the first host's entries.
        let mut c = chain(&runtime, "offload-counter", true, &config(1));
        run(&mut c, &frames[half..], batch);
        c.end_offloads();
        assert_ne!(merged(&at_kill, &counter_table(&mut c)), total);
    }

    // A move to a live host: a copy, then the hand-over when its owner
    // changes; the host it left ends its entries without counting them,
    // and the second copy adds only what passed since the first.
    let mut a = chain(&runtime, "offload-counter", true, &config(1));
    let mut b = chain(&runtime, "offload-counter", true, &config(1));
    let third = frames.len() / 3;
    let mut out = run(&mut a, &frames[..third], 32);
    let flows = keys(&a);
    let first: Vec<_> = flows.iter().map(|k| (*k, a.carry_offloads(k))).collect();
    out.extend(run(&mut a, &frames[third..half], 32));
    // The replica store keeps the newest copy; the flow's first packets
    // at the second host took the first one in before the second came.
    for (k, c) in first {
        b.import_offloads(k, c, frames[half].0);
    }
    for k in &flows {
        let last = a.hand_over_offloads(k);
        assert_eq!(last.len(), 2);
        b.import_offloads(*k, last, frames[half].0);
    }
    assert_eq!(a.offload_entries(), 0);
    a.end_offloads();
    out.extend(run(&mut b, &frames[half..], 32));
    assert_eq!(out, expected);
    b.end_offloads();
    assert_eq!(merged(&counter_table(&mut a), &counter_table(&mut b)), total, "every packet counted once");
    assert_eq!(a.stages()[0].offload_entries() + b.stages()[0].offload_entries(), 0, "budgets given back");
}

/// Two hosts of group `edge` in one process: each a [`sluice_peer::Peer`]
/// with table `table` and a channel for its outbox.
fn group_of_two(
    table: &sluice_group::OwnershipTable,
) -> [(std::sync::Arc<sluice_peer::Peer>, crossbeam_channel::Receiver<sluice_peer::Outgoing>); 2] {
    use sluice_peer::{Peer, PeerOut, PeerStore};
    use std::time::Duration;
    ["h1", "h2"].map(|me| {
        let (tx, rx) = crossbeam_channel::bounded(1024);
        let store = PeerStore::new(100_000, 1 << 26, Duration::from_secs(60));
        let p = Peer::new(me, Duration::from_millis(1), Duration::from_millis(5), store, PeerOut::new(tx, None));
        p.set_table(table.clone());
        (p, rx)
    })
}

/// Runs `frames` through `c` in batches of 32 with `lane` as its hook.
fn hooked(c: &mut Chain, lane: &mut sluice_peer::LanePeer, frames: &[(u64, Vec<u8>)]) {
    for chunk in frames.chunks(32) {
        let raw: Vec<RawPacket<'_>> = chunk
            .iter()
            .map(|(t, f)| RawPacket { data: f, wire_len: f.len() as u32, timestamp_ns: *t, ingress_port: 0 })
            .collect();
        c.process_hooked(&raw, Some(lane));
    }
}

/// Hands every message in `out` to `to` as from `from`: the flows in them.
fn deliver(out: &crossbeam_channel::Receiver<sluice_peer::Outgoing>, from: &str, to: &sluice_peer::Peer) -> usize {
    let mut flows = 0;
    while let Ok(o) = out.try_recv() {
        flows += o.flows;
        to.receive(from, &o.body, std::time::Instant::now(), 0).unwrap();
    }
    flows
}

/// h1's connections of `table` that stay open (no FIN).
fn h1_connections(table: &sluice_group::OwnershipTable) -> Vec<(u64, Vec<u8>)> {
    let owner = |f: &[u8]| table.owner(sluice_wire::parse(f).key.unwrap().normalized().hash_normalized());
    let mut frames = connections(60, 40);
    frames.retain(|(_, f)| owner(f) == Some("h1") && sluice_wire::parse(f).tcp_flags.is_none_or(|fl| fl & FIN == 0));
    frames
}

fn edge_table(version: u64, hosts: &[&str]) -> sluice_group::OwnershipTable {
    let members: Vec<sluice_group::Member> =
        hosts.iter().map(|h| sluice_group::Member { host: h.to_string(), weight: 1 }).collect();
    sluice_group::OwnershipTable::build("edge", version, 0, &members, 1021, 2).unwrap()
}

/// The same through the peer layer of two hosts of a group: the first
/// host's lane replicates its flows (stateless here, so the entries are
/// all there is of them) to their next owner, is killed, and the second
/// host takes the replicas in with the flows' next packets.
#[test]
fn a_killed_host_s_offload_entries_reach_its_flows_next_owner_with_their_counts() {
    let runtime = Runtime::new(RuntimeConfig::default()).unwrap();
    let table = edge_table(1, &["h1", "h2"]);
    let [(p1, out1), (p2, _)] = group_of_two(&table);
    let frames = h1_connections(&table);
    let half = frames.len() / 2;
    let config = "offload = 1\n";
    let mut plain = chain(&runtime, "offload-counter", true, "offload = 0\n");
    run(&mut plain, &frames, 32);
    let total = counter_table(&mut plain);
    assert!(total.len() >= 10, "{} of h1's connections", total.len());

    let mut a = chain(&runtime, "offload-counter", true, config);
    let mut lane1 = p1.lane("d", false);
    hooked(&mut a, &mut lane1, &frames[..half]);
    assert!(a.offload_counters().packets > 0);
    lane1.export(&mut a, std::time::Instant::now());
    assert_eq!(deliver(&out1, "h1", &p2), total.len(), "every flow with entries replicated, none with NF state");
    // kill -9 of h1: its counts stop at what its NF was handed.
    let at_kill = counter_table(&mut a);
    drop((a, lane1));

    let mut b = chain(&runtime, "offload-counter", true, config);
    let mut lane2 = p2.lane("d", false);
    hooked(&mut b, &mut lane2, &frames[half..]);
    assert_eq!(p2.counters().flows_imported, total.len() as u64);
    assert!(b.offload_counters().installed >= 2 * total.len() as u64);
    b.end_offloads();
    assert_eq!(merged(&at_kill, &counter_table(&mut b)), total, "every packet counted once");
}

/// A drain through the peer layer: h1 replicates, then a table without it
/// takes its flows; its next export hands the entries over (they end on
/// h1 without a return) and h2 takes them in: every packet counted once.
#[test]
fn a_drained_host_hands_its_offload_entries_over_and_counts_none_twice() {
    let runtime = Runtime::new(RuntimeConfig::default()).unwrap();
    let table = edge_table(1, &["h1", "h2"]);
    let [(p1, out1), (p2, _)] = group_of_two(&table);
    let frames = h1_connections(&table);
    let (third, half) = (frames.len() / 3, frames.len() / 2);
    let mut plain = chain(&runtime, "offload-counter", true, "offload = 0\n");
    run(&mut plain, &frames, 32);
    let total = counter_table(&mut plain);

    let mut a = chain(&runtime, "offload-counter", true, "offload = 1\n");
    let mut lane1 = p1.lane("d", false);
    hooked(&mut a, &mut lane1, &frames[..third]);
    lane1.export(&mut a, std::time::Instant::now());
    deliver(&out1, "h1", &p2);
    hooked(&mut a, &mut lane1, &frames[third..half]);
    let entries = a.offload_entries();
    assert_eq!(entries, 2 * total.len());
    // h1 leaves the table: its flows go to h2 with their entries.
    let drained = edge_table(2, &["h2"]);
    p1.set_table(drained.clone());
    p2.set_table(drained);
    lane1.export(&mut a, std::time::Instant::now());
    assert_eq!(a.offload_entries(), 0, "handed over");
    assert_eq!(a.stages()[0].offload_entries(), 0, "their budget given back");
    assert_eq!(deliver(&out1, "h1", &p2), total.len());
    a.end_offloads();

    let mut b = chain(&runtime, "offload-counter", true, "offload = 1\n");
    let mut lane2 = p2.lane("d", false);
    hooked(&mut b, &mut lane2, &frames[half..]);
    // The batch that takes a flow's replica in runs through the NF (the
    // entries take the flow from the next batch on).
    let called = b.stages()[0].meters().packets;
    assert!(called <= 32, "{called} packets reached the NF");
    b.end_offloads();
    assert_eq!(merged(&counter_table(&mut a), &counter_table(&mut b)), total, "every packet counted once");
}
