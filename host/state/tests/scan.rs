//! Listing tables (`sluice:nf@0.4.0`): `scan` pages and `top-k`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

use sluice_state::*;
use std::collections::BTreeSet;
use std::sync::Arc;

fn spec(name: &str, scope: Scope, access: Access, kind: Kind, consistency: Consistency) -> TableSpec {
    TableSpec {
        name: name.into(),
        scope,
        access,
        kind,
        consistency,
        key_size: 0,
        max_value_size: 64,
        capacity: 0,
        idle_timeout_ns: 0,
        notify_expired: false,
    }
}

fn eventual(name: &str) -> TableSpec {
    spec(
        name,
        Scope::Global,
        Access::ReadWrite,
        Kind::Counter,
        Consistency::Eventual { merge: Merge::Sum, merge_interval_ns: 0 },
    )
}

fn single(name: &str, kind: Kind) -> TableSpec {
    spec(name, Scope::Global, Access::ReadWrite, kind, Consistency::SingleWriter { sync_interval_ns: 0 })
}

fn framed(items: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for i in items {
        sluice_wire::abi::push_frame(&mut out, i);
    }
    out
}

fn unframe(b: &[u8]) -> Vec<Vec<u8>> {
    sluice_wire::abi::frames(b).map(|f| f.unwrap().to_vec()).collect()
}

/// Tables of one worker with `specs` declared; `fill` runs inside `init`.
fn worker(d: &Arc<Domain>, specs: &[TableSpec], fill: impl FnOnce(&mut Tables, &[u32])) -> (Tables, Vec<u32>) {
    let mut t = Tables::new(d, DEFAULT_BUDGET_BYTES);
    t.begin_init();
    let handles: Vec<u32> = specs.iter().map(|s| t.declare(s.clone()).unwrap()).collect();
    fill(&mut t, &handles);
    t.end_init().unwrap();
    (t, handles)
}

/// A full scan of counter table `h` in pages of `limit`: the entries and
/// the number of calls.
fn scan_counters(t: &mut Tables, h: u32, limit: u32) -> (Vec<(u64, u64)>, u64) {
    let (mut all, mut calls, mut cursor) = (Vec::new(), 0, Vec::new());
    loop {
        let page = t.scan(h, &cursor, limit).unwrap();
        calls += 1;
        assert!(page.counters.len() <= page_limit(limit), "a page of {} for limit {limit}", page.counters.len());
        all.extend_from_slice(&page.counters);
        if page.cursor.is_empty() {
            return (all, calls);
        }
        cursor = page.cursor;
    }
}

fn page_limit(limit: u32) -> usize {
    sluice_state::scan::page_limit(limit)
}

#[test]
fn a_scan_in_pages_returns_every_key_exactly_once_in_ascending_order() {
    let d = Domain::new();
    let keys: Vec<u64> = (0..1000u64).map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15)).collect();
    let counters = spec("weights", Scope::Global, Access::ReadOnly, Kind::Counter, Consistency::Local);
    let (mut t, h) = worker(&d, &[counters], |t, h| {
        let deltas: Vec<i64> = (0..1000).collect();
        t.counter_add(h[0], &keys, &deltas).unwrap();
    });
    for limit in [1, 7, 1000, 0] {
        let before = t.meters().ops;
        let (all, calls) = scan_counters(&mut t, h[0], limit);
        let mut expected: Vec<(u64, u64)> = keys.iter().copied().zip(0..).collect();
        expected.sort_unstable();
        assert_eq!(all, expected, "limit {limit}");
        assert_eq!(calls, 1000u64.div_ceil(page_limit(limit) as u64), "limit {limit}");
        // One operation per entry and one per call.
        assert_eq!(t.meters().ops - before, 1000 + calls);
    }
    // An empty table: one empty page, done.
    let (mut e, h) = worker(&d, &[eventual("empty")], |_, _| {});
    let page = e.scan(h[0], &[], 10).unwrap();
    assert!(page.counters.is_empty() && page.cursor.is_empty());
}

#[test]
fn byte_tables_scan_in_bytewise_key_order_with_the_get_many_framing() {
    let d = Domain::new();
    let names = spec("names", Scope::Global, Access::ReadOnly, Kind::Bytes, Consistency::Local);
    let (mut t, h) = worker(&d, &[names], |t, h| {
        let entries = framed(&[b"https", b"443", b"dns", b"53", b"http", b"80", b"a", b"", b"ssh", b"22"]);
        t.put_many(h[0], &entries).unwrap();
    });
    let mut keys = Vec::new();
    let mut cursor = Vec::new();
    loop {
        let page = t.scan(h[0], &cursor, 2).unwrap();
        assert!(page.counters.is_empty());
        let items = unframe(&page.entries);
        assert!(items.len() <= 4);
        for kv in items.chunks(2) {
            keys.push((String::from_utf8(kv[0].clone()).unwrap(), String::from_utf8(kv[1].clone()).unwrap()));
        }
        if page.cursor.is_empty() {
            break;
        }
        assert_eq!(page.cursor, unframe(&page.entries)[items.len() - 2], "the cursor is the page's last key");
        cursor = page.cursor;
    }
    // The empty value removed "a"; a key comes before its extensions.
    let expected = [("dns", "53"), ("http", "80"), ("https", "443"), ("ssh", "22")];
    assert_eq!(keys, expected.map(|(k, v)| (k.to_string(), v.to_string())));
    // A cursor the table could not hold is refused.
    assert_eq!(t.scan(h[0], &[b'x'; 300], 2), Err(StateError::BadInput(0)));
    let fixed =
        TableSpec { key_size: 4, ..spec("fixed", Scope::Global, Access::ReadOnly, Kind::Bytes, Consistency::Local) };
    let (mut f, h) = worker(&d, &[fixed], |_, _| {});
    assert_eq!(f.scan(h[0], b"abc", 2), Err(StateError::BadInput(0)));
    assert!(f.scan(h[0], b"abcd", 2).is_ok());
}

#[test]
fn counter_cursors_are_eight_bytes_and_per_flow_tables_refuse_a_scan() {
    let d = Domain::new();
    let per_flow = spec("packets", Scope::PerFlow, Access::ReadWrite, Kind::Counter, Consistency::Local);
    let notes = spec("notes", Scope::PerFlow, Access::ReadWrite, Kind::Bytes, Consistency::Local);
    let (mut t, h) = worker(&d, &[eventual("hits"), per_flow, notes], |_, _| {});
    assert_eq!(t.scan(h[0], &[1, 2, 3], 10), Err(StateError::BadInput(0)));
    assert_eq!(t.scan(h[1], &[], 10), Err(StateError::WrongKind));
    assert_eq!(t.scan(h[2], &[], 10), Err(StateError::WrongKind));
    assert_eq!(t.top_k(h[1], 3), Err(StateError::WrongKind));
    assert_eq!(t.top_k(h[2], 3), Err(StateError::WrongKind));
    assert_eq!(t.scan(99, &[], 10), Err(StateError::UnknownTable(99)));
    assert_eq!(t.meters().errors, 6);
}

#[test]
fn limits_are_bounded_by_the_host_whatever_the_nf_asks() {
    let d = Domain::new();
    let (mut t, h) = worker(&d, &[eventual("ports")], |_, _| {});
    t.begin_batch(&[], 1);
    let keys: Vec<u64> = (0..5000).collect();
    t.counter_add(h[0], &keys, &vec![1; keys.len()]).unwrap();
    t.end_batch(1);
    for limit in [0, 1025, u32::MAX] {
        let page = t.scan(h[0], &[], limit).unwrap();
        assert_eq!(page.counters.len(), MAX_SCAN, "limit {limit}");
        assert_eq!(page.cursor, 1023u64.to_le_bytes(), "limit {limit}");
    }
    assert_eq!(t.top_k(h[0], u32::MAX).unwrap().len(), MAX_SCAN);
    assert!(t.top_k(h[0], 0).unwrap().is_empty());
    let before = t.meters().ops;
    let (all, calls) = scan_counters(&mut t, h[0], u32::MAX);
    assert_eq!((all.len(), calls), (5000, 5));
    assert_eq!(t.meters().ops - before, 5005);
}

#[test]
fn top_k_returns_the_largest_counters_with_ties_by_ascending_key() {
    let d = Domain::for_workers(2);
    d.set_barrier(true);
    let specs = [eventual("hits"), single("owned", Kind::Counter), single("names", Kind::Bytes)];
    let (mut a, h) = worker(&d, &specs, |_, _| {});
    let (mut b, _) = worker(&d, &specs, |_, _| {});
    let values: [(u64, i64); 6] = [(5, 10), (1, 4), (2, 10), (9, 10), (3, 12), (4, 0)];
    for table in [h[0], h[1]] {
        // Half the counts from each worker: the top is over the whole table.
        for w in [&mut a, &mut b] {
            w.begin_batch(&[], 1);
            let keys: Vec<u64> = values.iter().map(|(k, _)| *k).collect();
            let halves: Vec<i64> = values.iter().map(|(_, v)| v / 2).collect();
            w.counter_add(table, &keys, &halves).unwrap();
            w.end_batch(1);
        }
        a.hand_over();
        b.hand_over();
        a.sync_point();
        b.sync_point();
        a.begin_batch(&[], 2);
        b.begin_batch(&[], 2);
        // Worker a's own add, not merged or published yet, counts too.
        a.counter_add(table, &[1], &[100]).unwrap();
        assert_eq!(a.top_k(table, 4).unwrap(), vec![(1, 104), (3, 12), (2, 10), (5, 10)], "table {table}");
        assert_eq!(b.top_k(table, 2).unwrap(), vec![(3, 12), (2, 10)], "table {table}");
        let before = a.meters().ops;
        assert_eq!(a.top_k(table, 100).unwrap().len(), 6);
        assert_eq!(a.meters().ops - before, 7);
        a.end_batch(2);
        b.end_batch(2);
    }
    assert_eq!(a.top_k(h[2], 3), Err(StateError::WrongKind));
}

#[test]
fn eventual_scans_see_the_merged_view_plus_own_unmerged_updates() {
    let d = Domain::new();
    let spec = TableSpec { ..eventual("hits") };
    let spec = TableSpec {
        consistency: Consistency::Eventual { merge: Merge::Sum, merge_interval_ns: 1_000_000_000 },
        ..spec
    };
    let (mut a, h) = worker(&d, std::slice::from_ref(&spec), |_, _| {});
    let (mut b, _) = worker(&d, std::slice::from_ref(&spec), |_, _| {});
    b.begin_batch(&[], 2_000_000_000);
    b.counter_add(h[0], &[1, 2], &[10, 20]).unwrap();
    b.end_batch(2_000_000_000);
    a.begin_batch(&[], 2_000_000_000);
    a.counter_add(h[0], &[2, 3], &[1, 1]).unwrap();
    a.end_batch(2_000_000_000);
    // Both merged (their first batch is past the interval); now a's next
    // update stays pending.
    a.begin_batch(&[], 2_000_000_001);
    a.counter_add(h[0], &[4, 1], &[7, 5]).unwrap();
    assert_eq!(scan_counters(&mut a, h[0], 2).0, vec![(1, 15), (2, 21), (3, 1), (4, 7)]);
    assert_eq!(scan_counters(&mut b, h[0], 2).0, vec![(1, 10), (2, 21), (3, 1)]);
    assert_eq!(d.eventual_snapshot("hits").unwrap(), vec![(1, 10), (2, 21), (3, 1)]);
}

#[test]
fn single_writer_scans_see_published_entries_and_own_writes() {
    let d = Domain::for_workers(2);
    d.set_barrier(true);
    let specs = [single("owned", Kind::Counter), single("names", Kind::Bytes)];
    let (mut a, h) = worker(&d, &specs, |_, _| {});
    let (mut b, _) = worker(&d, &specs, |_, _| {});
    let keys: Vec<u64> = (0..64).collect();
    b.begin_batch(&[], 1);
    b.counter_add(h[0], &keys, &vec![1; 64]).unwrap();
    let mut entries = Vec::new();
    for k in 0..64u8 {
        sluice_wire::abi::push_frame(&mut entries, &[b'k', k]);
        sluice_wire::abi::push_frame(&mut entries, &[k]);
    }
    b.put_many(h[1], &entries).unwrap();
    // Before any sync: b reads its own writes, a sees nothing yet.
    assert_eq!(scan_counters(&mut b, h[0], 10).0.len(), 64);
    assert!(scan_counters(&mut a, h[0], 10).0.is_empty());
    b.end_batch(1);
    a.hand_over();
    b.hand_over();
    a.sync_point();
    b.sync_point();
    a.begin_batch(&[], 2);
    let (all, _) = scan_counters(&mut a, h[0], 10);
    assert_eq!(all, keys.iter().map(|k| (*k, 1)).collect::<Vec<_>>());
    // a removes one name and adds one; its scan shows both at once.
    a.put_many(h[1], &framed(&[&[b'k', 5], b"", b"new", b"1"])).unwrap();
    let mut seen = Vec::new();
    let mut cursor = Vec::new();
    loop {
        let page = a.scan(h[1], &cursor, 9).unwrap();
        seen.extend(unframe(&page.entries).chunks(2).map(|kv| kv[0].clone()));
        if page.cursor.is_empty() {
            break;
        }
        cursor = page.cursor;
    }
    let mut expected: Vec<Vec<u8>> = (0..64u8).filter(|k| *k != 5).map(|k| vec![b'k', k]).collect();
    expected.push(b"new".to_vec());
    expected.sort();
    assert_eq!(seen, expected);
}

#[test]
fn a_pool_scan_lists_the_resources_held_on_every_worker() {
    let d = Domain::new();
    let pool = spec(
        "ports",
        Scope::Global,
        Access::ReadWrite,
        Kind::Bytes,
        Consistency::Release { first: 1000, count: 64, chunk: 4 },
    );
    let (mut a, h) = worker(&d, std::slice::from_ref(&pool), |_, _| {});
    let (mut b, _) = worker(&d, std::slice::from_ref(&pool), |_, _| {});
    let mut got = Vec::new();
    a.acquire(h[0], &framed(&[b"a1", b"a2"]), &mut got).unwrap();
    b.acquire(h[0], &framed(&[b"b1"]), &mut got).unwrap();
    a.release(h[0], &got[..1]).unwrap();
    let mut held: Vec<(u64, Vec<u8>)> = Vec::new();
    let mut cursor = Vec::new();
    loop {
        let page = b.scan(h[0], &cursor, 1).unwrap();
        for kv in unframe(&page.entries).chunks(2) {
            held.push((u64::from_le_bytes(kv[0].as_slice().try_into().unwrap()), kv[1].clone()));
        }
        if page.cursor.is_empty() {
            break;
        }
        cursor = page.cursor;
    }
    let mut expected = vec![(got[1], b"a2".to_vec()), (got[2], b"b1".to_vec())];
    expected.sort();
    assert_eq!(held, expected);
}

#[test]
fn idle_entries_are_skipped_and_a_scan_does_not_keep_entries_alive() {
    let d = Domain::new();
    let spec = TableSpec { idle_timeout_ns: 100, ..eventual("hits") };
    let (mut t, h) = worker(&d, &[spec], |_, _| {});
    t.begin_batch(&[], 1000);
    t.counter_add(h[0], &[1, 2], &[1, 1]).unwrap();
    t.end_batch(1000);
    t.begin_batch(&[], 1050);
    t.counter_add(h[0], &[2], &[1]).unwrap();
    t.end_batch(1050);
    t.begin_batch(&[], 1120);
    // Key 1 is idle (last used at 1000); a scan skips it and key 2 stays.
    assert_eq!(scan_counters(&mut t, h[0], 10).0, vec![(2, 2)]);
    assert_eq!(t.top_k(h[0], 5).unwrap(), vec![(2, 2)]);
    t.end_batch(1120);
    t.begin_batch(&[], 1151);
    // Scanned at 1120, but last used at 1050: idle now too.
    assert!(scan_counters(&mut t, h[0], 10).0.is_empty());
}

/// A worker inserts keys while another scans: pages stay strictly
/// ascending (no key twice), and every key present from the first call to
/// the last is returned.
#[test]
fn under_concurrent_inserts_a_scan_repeats_no_key_and_misses_none_present_throughout() {
    let d = Domain::new();
    let (mut reader, h) = worker(&d, &[eventual("keys")], |_, _| {});
    let (mut writer, _) = worker(&d, &[eventual("keys")], |_, _| {});
    let table = h[0];
    // Even keys are there before the scan starts.
    writer.begin_batch(&[], 1);
    let before: Vec<u64> = (0..4000).map(|i| i * 2).collect();
    writer.counter_add(h[0], &before, &vec![1; before.len()]).unwrap();
    writer.end_batch(1);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop_writer = stop.clone();
    let inserter = std::thread::spawn(move || {
        // Odd keys, in random order, merged batch by batch.
        let mut now = 2;
        let mut i = 0u64;
        while !stop_writer.load(std::sync::atomic::Ordering::Relaxed) && i < 4000 {
            writer.begin_batch(&[], now);
            let keys: Vec<u64> = (i..i + 16).map(|k| (k.wrapping_mul(2654435761) % 4000) * 2 + 1).collect();
            writer.counter_add(table, &keys, &vec![1; keys.len()]).unwrap();
            writer.end_batch(now);
            now += 1;
            i += 16;
        }
        writer
    });
    let mut seen = Vec::new();
    let mut cursor = Vec::new();
    loop {
        let page = reader.scan(h[0], &cursor, 25).unwrap();
        seen.extend(page.counters.iter().map(|(k, _)| *k));
        if page.cursor.is_empty() {
            break;
        }
        cursor = page.cursor;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _writer = inserter.join().unwrap();
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "a key came twice or out of order");
    let seen: BTreeSet<u64> = seen.into_iter().collect();
    assert!(before.iter().all(|k| seen.contains(k)), "a key present throughout was missed");
}

/// The case that asked for `top-k`: the top 5 of 65,536 ports. Reading
/// every key costs 65,536 operations; `top-k` costs 6, and a full scan
/// 65,536 + 64 (one per page of 1024).
#[test]
fn the_top_5_of_65536_ports_costs_6_operations_instead_of_65536() {
    let d = Domain::new();
    let (mut t, h) = worker(&d, &[eventual("ports")], |_, _| {});
    t.begin_batch(&[], 1);
    let ports: Vec<u64> = (0..65_536).collect();
    let counts: Vec<i64> = ports.iter().map(|p| ((p * 7919) % 65_536) as i64).collect();
    t.counter_add(h[0], &ports, &counts).unwrap();
    t.end_batch(1);

    let ops = t.meters().ops;
    let mut all = Vec::new();
    t.counter_get(h[0], &ports, &mut all).unwrap();
    let mut by_reading: Vec<(u64, u64)> = ports.iter().copied().zip(all).collect();
    by_reading.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    by_reading.truncate(5);
    let read_ops = t.meters().ops - ops;

    let ops = t.meters().ops;
    let top = t.top_k(h[0], 5).unwrap();
    let top_ops = t.meters().ops - ops;

    let ops = t.meters().ops;
    let (scanned, calls) = scan_counters(&mut t, h[0], 0);
    let scan_ops = t.meters().ops - ops;

    assert_eq!(top, by_reading);
    assert_eq!((read_ops, top_ops), (65_536, 6));
    assert_eq!((scanned.len(), calls, scan_ops), (65_536, 64, 65_600));
}
