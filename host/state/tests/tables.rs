//! Behaviour of state tables as an NF sees it through the `state` calls.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

use sluice_state::*;
use sluice_wire::{FlowKey, IpAddr128};
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

fn eventual(name: &str, merge: Merge) -> TableSpec {
    spec(name, Scope::Global, Access::ReadWrite, Kind::Counter, Consistency::Eventual { merge, merge_interval_ns: 0 })
}

fn pool(name: &str, count: u64) -> TableSpec {
    spec(name, Scope::Global, Access::ReadWrite, Kind::Bytes, Consistency::Release { first: 1000, count, chunk: 4 })
}

fn flow(n: u8) -> FlowKey {
    FlowKey {
        src: IpAddr128::from_v4([10, 0, 0, n]),
        dst: IpAddr128::from_v4([192, 0, 2, 1]),
        src_port: 1000 + u16::from(n),
        dst_port: 80,
        protocol: 6,
    }
}

fn declared(tables: &mut Tables, specs: &[TableSpec]) -> Vec<u32> {
    tables.begin_init();
    let handles = specs.iter().map(|s| tables.declare(s.clone()).unwrap()).collect();
    tables.end_init().unwrap();
    handles
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

#[test]
fn declare_only_in_init_and_refuse_bad_specs() {
    let d = Domain::new();
    let mut t = Tables::new(&d, DEFAULT_BUDGET_BYTES);
    assert_eq!(t.declare(eventual("hits", Merge::Sum)), Err(StateError::NotNow));
    t.begin_init();
    let bad = spec("x", Scope::Global, Access::ReadWrite, Kind::Counter, Consistency::Local);
    assert!(matches!(t.declare(bad), Err(StateError::BadSpec(m)) if m.contains("eventual or release")));
    let bad = spec("Bad Name", Scope::Global, Access::ReadOnly, Kind::Counter, Consistency::Local);
    assert!(matches!(t.declare(bad), Err(StateError::BadSpec(_))));
    let bad = eventual("bytes", Merge::Sum);
    let bad = TableSpec { kind: Kind::Bytes, ..bad };
    assert!(matches!(t.declare(bad), Err(StateError::BadSpec(m)) if m.contains("counter")));
    let bad = TableSpec { capacity: 10, ..pool("ports", 64) };
    assert!(matches!(t.declare(bad), Err(StateError::BadSpec(m)) if m.contains("capacity 0")));
    assert_eq!(t.declare(eventual("hits", Merge::Sum)), Ok(0));
    assert!(t.end_init().is_ok());
    assert_eq!(t.meters().errors, 5);
}

#[test]
fn redeclaring_keeps_contents_and_refuses_other_layouts() {
    let d = Domain::new();
    let mut t = Tables::new(&d, DEFAULT_BUDGET_BYTES);
    let s = spec("seen", Scope::Global, Access::ReadWrite, Kind::Bytes, Consistency::Local);
    let s = TableSpec {
        consistency: Consistency::Eventual { merge: Merge::Max, merge_interval_ns: 0 },
        kind: Kind::Counter,
        ..s
    };
    let [h] = declared(&mut t, std::slice::from_ref(&s))[..] else { panic!() };
    t.counter_add(h, &[7], &[42]).unwrap();
    // Same table after a re-init (a trap, or a new version).
    let [h2] = declared(&mut t, std::slice::from_ref(&s))[..] else { panic!() };
    let mut out = Vec::new();
    t.counter_get(h2, &[7], &mut out).unwrap();
    assert_eq!(out, [42]);
    // Another merge is another layout.
    t.begin_init();
    let other = eventual("seen", Merge::Sum);
    assert!(matches!(t.declare(other), Err(StateError::Incompatible(m)) if m.contains("consistency")));
    // Refused even if the NF ignores the error.
    assert!(t.end_init().unwrap_err().contains("table 'seen'"));
}

#[test]
fn read_only_tables_are_written_only_in_init() {
    let d = Domain::new();
    let mut t = Tables::new(&d, DEFAULT_BUDGET_BYTES);
    t.begin_init();
    let ro = spec("block", Scope::Global, Access::ReadOnly, Kind::Bytes, Consistency::Local);
    let h = t.declare(ro).unwrap();
    t.put_many(h, &framed(&[&[10, 0, 0, 1], b"x"])).unwrap();
    t.end_init().unwrap();
    assert_eq!(t.put_many(h, &framed(&[&[10, 0, 0, 2], b"y"])), Err(StateError::NotNow));
    let mut out = Vec::new();
    t.get_many(h, &framed(&[&[10, 0, 0, 1], &[10, 0, 0, 2]]), &mut out).unwrap();
    assert_eq!(unframe(&out), vec![b"x".to_vec(), vec![]]);
}

#[test]
fn capacity_and_budget_are_errors_not_traps() {
    let d = Domain::new();
    let mut t = Tables::new(&d, DEFAULT_BUDGET_BYTES);
    let s = TableSpec { capacity: 2, ..spec("c", Scope::Global, Access::ReadOnly, Kind::Counter, Consistency::Local) };
    t.begin_init();
    let h = t.declare(s).unwrap();
    assert_eq!(t.counter_add(h, &[1, 2, 3, 1], &[1, 1, 1, 1]), Err(StateError::Full(2)));
    t.end_init().unwrap();
    assert_eq!(t.counters("c").unwrap(), vec![(1, 1), (2, 1)]);
    assert_eq!(t.meters().rejected, 1);

    let mut small = Tables::new(&d, 3 * (16 + ENTRY_OVERHEAD));
    let b = TableSpec {
        max_value_size: 1000,
        ..spec("b", Scope::Global, Access::ReadOnly, Kind::Bytes, Consistency::Local)
    };
    small.begin_init();
    let h = small.declare(b).unwrap();
    assert_eq!(small.put_many(h, &framed(&[b"k1", &[0; 10], b"k2", &[0; 200]])), Err(StateError::OverBudget(1)));
    assert_eq!(small.put_many(h, &framed(&[b"k3", &[0; 1001]])), Err(StateError::TooLarge(0)));
    assert_eq!(small.put_many(h, &framed(&[b"k3"])), Err(StateError::BadInput(0)));
    // Removing frees budget.
    small.put_many(h, &framed(&[b"k1", b""])).unwrap();
    small.put_many(h, &framed(&[b"k2", &[0; 100]])).unwrap();
    small.end_init().unwrap();
}

#[test]
fn per_flow_tables_key_by_batch_flow_and_export_with_clock() {
    let d = Domain::new();
    let mut t = Tables::new(&d, DEFAULT_BUDGET_BYTES);
    let bytes = spec("map", Scope::PerFlow, Access::ReadWrite, Kind::Bytes, Consistency::Local);
    let ctr = spec("pkts", Scope::PerFlow, Access::ReadWrite, Kind::Counter, Consistency::Local);
    let [hb, hc] = declared(&mut t, &[bytes, ctr])[..] else { panic!() };
    t.begin_batch(&[flow(1), flow(2)], 10);
    t.put_many(hb, &framed(&[&1u32.to_le_bytes(), b"two"])).unwrap();
    t.counter_add(hc, &[0, 1, 1], &[1, 1, 1]).unwrap();
    assert_eq!(t.counter_add(hc, &[2], &[1]), Err(StateError::BadInput(0)));
    // Next batch: flow 2 is now index 0.
    t.begin_batch(&[flow(2)], 20);
    let mut out = Vec::new();
    t.get_many(hb, &framed(&[&0u32.to_le_bytes()]), &mut out).unwrap();
    assert_eq!(unframe(&out), vec![b"two".to_vec()]);
    let exported = t.export_flow(&flow(2));
    assert_eq!(exported.len(), 2);
    assert_eq!(exported[1].value, 2u64.to_le_bytes());

    // Another host imports it; a replay of the same clocks is stale.
    let d2 = Domain::new();
    let mut u = Tables::new(&d2, DEFAULT_BUDGET_BYTES);
    let [hb2, _] = declared(
        &mut u,
        &[
            spec("map", Scope::PerFlow, Access::ReadWrite, Kind::Bytes, Consistency::Local),
            spec("pkts", Scope::PerFlow, Access::ReadWrite, Kind::Counter, Consistency::Local),
        ],
    )[..] else {
        panic!()
    };
    assert_eq!(u.import_flow(flow(2), &exported), 2);
    assert_eq!(u.import_flow(flow(2), &exported), 0);
    u.begin_batch(&[flow(2)], 30);
    let mut out = Vec::new();
    u.get_many(hb2, &framed(&[&0u32.to_le_bytes()]), &mut out).unwrap();
    assert_eq!(unframe(&out), vec![b"two".to_vec()]);
}

#[test]
fn idle_entries_expire_and_are_handed_back() {
    let d = Domain::new();
    let mut t = Tables::new(&d, DEFAULT_BUDGET_BYTES);
    let s = TableSpec {
        idle_timeout_ns: 1_000_000_000,
        notify_expired: true,
        ..spec("map", Scope::PerFlow, Access::ReadWrite, Kind::Bytes, Consistency::Local)
    };
    let [h] = declared(&mut t, &[s])[..] else { panic!() };
    t.begin_batch(&[flow(1), flow(2)], 1_000_000_000);
    t.put_many(h, &framed(&[&0u32.to_le_bytes(), b"a", &1u32.to_le_bytes(), b"b"])).unwrap();
    t.end_batch(1_000_000_000);
    // Flow 2 stays busy.
    t.begin_batch(&[flow(2)], 1_800_000_000);
    let mut out = Vec::new();
    t.get_many(h, &framed(&[&0u32.to_le_bytes()]), &mut out).unwrap();
    t.end_batch(1_800_000_000);
    assert!(t.take_expired().is_empty());
    t.begin_batch(&[], 2_500_000_000);
    t.end_batch(2_500_000_000);
    let expired = t.take_expired();
    assert_eq!(expired.len(), 1);
    let items = unframe(&expired[0].1);
    assert_eq!(items, vec![flow(1).to_bytes().to_vec(), b"a".to_vec()]);
    assert_eq!(t.meters().expired, 1);
    assert_eq!(t.used_bytes(), FlowKey::ENCODED_LEN + 1 + ENTRY_OVERHEAD);
}

#[test]
fn expired_entries_come_back_sorted_by_key() {
    let d = Domain::new();
    let mut t = Tables::new(&d, DEFAULT_BUDGET_BYTES);
    let s = TableSpec {
        idle_timeout_ns: 1_000_000_000,
        notify_expired: true,
        ..spec("map", Scope::PerFlow, Access::ReadWrite, Kind::Bytes, Consistency::Local)
    };
    let [h] = declared(&mut t, &[s])[..] else { panic!() };
    let flows: Vec<_> = [9u8, 3, 200, 1, 77, 5, 42, 150].iter().map(|&p| flow(p)).collect();
    t.begin_batch(&flows, 1_000_000_000);
    let keys: Vec<[u8; 4]> = (0..flows.len() as u32).map(u32::to_le_bytes).collect();
    let entries: Vec<&[u8]> = keys.iter().flat_map(|k| [&k[..], b"v"]).collect();
    t.put_many(h, &framed(&entries)).unwrap();
    t.end_batch(1_000_000_000);
    t.begin_batch(&[], 3_000_000_000);
    t.end_batch(3_000_000_000);
    let expired = t.take_expired();
    let got: Vec<Vec<u8>> = unframe(&expired[0].1).into_iter().step_by(2).collect();
    let mut want: Vec<Vec<u8>> = flows.iter().map(|f| f.to_bytes().to_vec()).collect();
    want.sort();
    assert_eq!(got, want, "a replay must hand the NF expired entries in one order");
}

#[test]
fn eventual_replicas_merge_to_the_trace_totals() {
    let d = Domain::new();
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let d = d.clone();
            std::thread::spawn(move || {
                let mut t = Tables::new(&d, DEFAULT_BUDGET_BYTES);
                let [sum, max] = declared(&mut t, &[eventual("bytes", Merge::Sum), eventual("peak", Merge::Max)])[..]
                else {
                    panic!()
                };
                for i in 0..1000u64 {
                    t.begin_batch(&[], i);
                    t.counter_add(sum, &[i % 7, 99], &[1, 2]).unwrap();
                    t.counter_add(max, &[1], &[(w * 1000 + i) as i64]).unwrap();
                    t.end_batch(i);
                }
                t.flush();
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let bytes = d.eventual_snapshot("bytes").unwrap();
    assert_eq!(bytes.iter().find(|(k, _)| *k == 99).unwrap().1, 4 * 1000 * 2);
    assert_eq!(bytes.iter().filter(|(k, _)| *k < 7).map(|(_, v)| v).sum::<u64>(), 4000);
    assert_eq!(d.eventual_snapshot("peak").unwrap(), vec![(1, 3999)]);
}

#[test]
fn a_pool_resource_is_held_by_one_flow_at_a_time() {
    let d = Domain::new();
    let held = Arc::new(std::sync::Mutex::new(std::collections::HashSet::new()));
    let workers: Vec<_> = (0..3)
        .map(|w| {
            let (d, held) = (d.clone(), held.clone());
            std::thread::spawn(move || {
                let mut t = Tables::new(&d, DEFAULT_BUDGET_BYTES);
                let [p] = declared(&mut t, &[pool("ports", 64)])[..] else { panic!() };
                let mut mine = Vec::new();
                for round in 0..300u32 {
                    let mut got = Vec::new();
                    let v = (w * 1000 + round).to_le_bytes();
                    t.acquire(p, &framed(&[&v, &v]), &mut got).unwrap();
                    for r in &got {
                        assert!((1000..1064).contains(r));
                        assert!(held.lock().unwrap().insert(*r), "resource {r} handed out twice");
                    }
                    mine.extend(got);
                    if mine.len() > 10 {
                        let give: Vec<u64> = mine.drain(..6).collect();
                        for r in &give {
                            held.lock().unwrap().remove(r);
                        }
                        t.release(p, &give).unwrap();
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let stats = d.pool_stats();
    assert_eq!(stats[0].1.size, 64);
    assert_eq!(stats[0].1.bound as usize, held.lock().unwrap().len());
}

#[test]
fn an_exhausted_pool_hands_out_fewer_and_lookup_sees_bindings() {
    let d = Domain::new();
    let mut a = Tables::new(&d, DEFAULT_BUDGET_BYTES);
    let mut b = Tables::new(&d, DEFAULT_BUDGET_BYTES);
    let [pa] = declared(&mut a, &[pool("ports", 3)])[..] else { panic!() };
    let [pb] = declared(&mut b, &[pool("ports", 3)])[..] else { panic!() };
    let mut got = Vec::new();
    a.acquire(pa, &framed(&[b"x", b"y"]), &mut got).unwrap();
    assert_eq!(got, vec![1000, 1001]);
    // Worker b takes the rest, stealing from a's share when needed.
    let mut got_b = Vec::new();
    b.acquire(pb, &framed(&[b"z", b"w"]), &mut got_b).unwrap();
    assert_eq!(got_b, vec![1002]);
    assert_eq!(b.meters().rejected, 1);
    let mut out = Vec::new();
    b.lookup(pb, &[1000, 1002, 5], &mut out).unwrap();
    assert_eq!(unframe(&out), vec![b"x".to_vec(), b"z".to_vec(), vec![]]);
    a.release(pa, &[1000]).unwrap();
    let mut again = Vec::new();
    b.acquire(pb, &framed(&[b"v"]), &mut again).unwrap();
    assert_eq!(again, vec![1000]);
    assert!(d.pool_stats()[0].1.rebalances >= 1);
}

#[test]
fn native_calls_reach_the_installed_tables() {
    let d = Domain::new();
    let mut t = Some(Box::new(Tables::new(&d, DEFAULT_BUDGET_BYTES)));
    assert!(with_current(|_| ()).is_none());
    let h = with_installed(&mut t, || {
        with_current(|t| {
            t.begin_init();
            let h = t.declare(eventual("n", Merge::Sum)).unwrap();
            t.end_init().unwrap();
            t.counter_add(h, &[1], &[5]).unwrap();
            h
        })
        .unwrap()
    });
    let mut out = Vec::new();
    t.as_mut().unwrap().counter_get(h, &[1], &mut out).unwrap();
    assert_eq!(out, [5]);
    assert!(with_current(|_| ()).is_none());
}

/// Capacity counts the merged table, not a worker's pending updates: keys
/// already in the table are always updated, new keys are refused once the
/// table (over every worker) is full.
#[test]
fn eventual_capacity_bounds_the_merged_table_over_workers() {
    let d = Domain::new();
    let capped = TableSpec { capacity: 4, ..eventual("syn", Merge::Sum) };
    let mut a = Tables::new(&d, DEFAULT_BUDGET_BYTES);
    let mut b = Tables::new(&d, DEFAULT_BUDGET_BYTES);
    let [ta] = declared(&mut a, std::slice::from_ref(&capped))[..] else { panic!() };
    let [tb] = declared(&mut b, std::slice::from_ref(&capped))[..] else { panic!() };
    a.begin_batch(&[], 1);
    a.counter_add(ta, &[1, 2, 3], &[1, 1, 1]).unwrap();
    b.begin_batch(&[], 1);
    // One new key fits (3 reserved by a's pending updates), the next not.
    assert_eq!(b.counter_add(tb, &[4, 5], &[1, 1]), Err(StateError::Full(1)));
    a.end_batch(2);
    b.end_batch(2);
    assert_eq!(d.eventual_snapshot("syn").unwrap().len(), 4);
    // A batch of more distinct sources than the capacity still counts the
    // sources the table holds: every one of 8 SYNs of source 1 is counted.
    for _ in 0..8 {
        b.begin_batch(&[], 3);
        assert_eq!(b.counter_add(tb, &[1, 6, 7, 8, 9], &[1, 1, 1, 1, 1]), Err(StateError::Full(1)));
        b.end_batch(3);
    }
    let snap = d.eventual_snapshot("syn").unwrap();
    assert_eq!(snap, vec![(1, 9), (2, 1), (3, 1), (4, 1)]);
    assert_eq!(d.shared_bytes(), 4 * (16 + ENTRY_OVERHEAD));
}

/// The state budget holds for the merged table too, and its bytes are
/// held (and billed) once, by the domain's first worker.
#[test]
fn eventual_tables_are_within_the_budget_and_counted_once() {
    let d = Domain::new();
    let per = 16 + ENTRY_OVERHEAD;
    let budget = 1000 * per;
    let big = TableSpec { capacity: u32::MAX, ..eventual("src", Merge::Sum) };
    let mut workers: Vec<Tables> = (0..2).map(|_| Tables::new(&d, budget)).collect();
    let handles: Vec<u32> = workers.iter_mut().map(|t| declared(t, std::slice::from_ref(&big))[0]).collect();
    let mut refused = 0;
    for round in 0..50u64 {
        for (w, (t, h)) in workers.iter_mut().zip(&handles).enumerate() {
            let keys: Vec<u64> = (0..64).map(|i| (round * 2 + w as u64) * 64 + i).collect();
            t.begin_batch(&[], round);
            if let Err(StateError::OverBudget(_)) = t.counter_add(*h, &keys, &[1; 64]) {
                refused += 1;
            }
            t.end_batch(round);
        }
    }
    assert!(refused > 0);
    assert_eq!(d.eventual_snapshot("src").unwrap().len(), 1000);
    assert_eq!(d.shared_bytes(), budget);
    assert_eq!(workers[0].held_bytes(), budget);
    assert_eq!(workers[1].held_bytes(), 0);
}

/// Idle expiry runs on the merged view: idle keys leave, their bytes are
/// given back, and the NF gets them if it asked.
#[test]
fn eventual_entries_expire_on_packet_time() {
    let d = Domain::new();
    let s = TableSpec { idle_timeout_ns: 3_000_000_000, notify_expired: true, ..eventual("hits", Merge::Sum) };
    let mut t = Tables::new(&d, DEFAULT_BUDGET_BYTES);
    let [h] = declared(&mut t, &[s])[..] else { panic!() };
    t.begin_batch(&[], 0);
    t.counter_add(h, &[1, 2], &[5, 7]).unwrap();
    t.end_batch(0);
    // Key 2 stays in use; key 1 idles.
    for s in 1..=6u64 {
        let now = s * 1_000_000_000;
        t.begin_batch(&[], now);
        t.counter_add(h, &[2], &[1]).unwrap();
        t.end_batch(now);
    }
    assert_eq!(d.eventual_snapshot("hits").unwrap(), vec![(2, 13)]);
    assert_eq!(t.meters().expired, 1);
    let expired = t.take_expired();
    assert_eq!(expired.len(), 1);
    assert_eq!(unframe(&expired[0].1), vec![1u64.to_le_bytes().to_vec(), 5u64.to_le_bytes().to_vec()]);
    let mut out = Vec::new();
    t.counter_get(h, &[1, 2], &mut out).unwrap();
    assert_eq!(out, vec![0, 13]);
    assert_eq!(d.shared_bytes(), 16 + ENTRY_OVERHEAD);
}

/// A worker that goes away gives back what its unmerged updates reserved.
#[test]
fn dropped_workers_release_their_reservations() {
    let d = Domain::new();
    let never = Consistency::Eventual { merge: Merge::Sum, merge_interval_ns: u64::MAX };
    let s = TableSpec { capacity: 2, consistency: never, ..eventual("x", Merge::Sum) };
    let mut a = Tables::new(&d, DEFAULT_BUDGET_BYTES);
    let [h] = declared(&mut a, std::slice::from_ref(&s))[..] else { panic!() };
    a.begin_batch(&[], 0);
    a.counter_add(h, &[1, 2], &[1, 1]).unwrap();
    drop(a);
    assert_eq!(d.shared_bytes(), 0);
    let mut b = Tables::new(&d, DEFAULT_BUDGET_BYTES);
    let [h] = declared(&mut b, &[s])[..] else { panic!() };
    b.begin_batch(&[], 0);
    assert_eq!(b.counter_add(h, &[3, 4], &[1, 1]), Ok(()));
}

/// Pool bindings hold the NF's values: they are charged to the budget.
#[test]
fn pool_bindings_are_charged_to_the_budget() {
    let d = Domain::new();
    let per = 8 + 64 + ENTRY_OVERHEAD;
    let mut t = Tables::new(&d, 10 * per);
    let [p] = declared(&mut t, &[pool("ports", 1000)])[..] else { panic!() };
    let value = [7u8; 64];
    let values: Vec<&[u8]> = vec![&value; 12];
    let mut out = Vec::new();
    assert_eq!(t.acquire(p, &framed(&values), &mut out), Err(StateError::OverBudget(10)));
    assert_eq!(out.len(), 10);
    assert_eq!(d.shared_bytes(), 10 * per);
    t.release(p, &out[..5]).unwrap();
    assert_eq!(d.shared_bytes(), 5 * per);
}

/// The shared tables' bytes are billed by one live worker at a time: when
/// it goes, another takes over, so they are never billed twice or lost.
#[test]
fn one_live_worker_bills_the_shared_tables() {
    let d = Domain::new();
    let per = 16 + ENTRY_OVERHEAD;
    let mut a = Tables::new(&d, DEFAULT_BUDGET_BYTES);
    let b = Tables::new(&d, DEFAULT_BUDGET_BYTES);
    let [h] = declared(&mut a, &[eventual("n", Merge::Sum)])[..] else { panic!() };
    a.begin_batch(&[], 0);
    a.counter_add(h, &[1, 2, 3], &[1, 1, 1]).unwrap();
    a.end_batch(0);
    assert_eq!(a.held_bytes() + b.held_bytes(), 3 * per);
    assert_eq!(a.held_bytes(), 3 * per, "the first to ask bills");
    drop(a);
    assert_eq!(b.held_bytes(), 3 * per, "the next live worker takes over");
}

/// A group's hosts merge their eventual tables: each sends its own values
/// of changed keys, and reads merge them with the other hosts' values.
#[test]
fn eventual_tables_merge_other_hosts_values_on_read() {
    let d = Domain::new();
    d.track_changes();
    let mut t = Tables::new(&d, DEFAULT_BUDGET_BYTES);
    let [sum, peak] = declared(&mut t, &[eventual("bytes", Merge::Sum), eventual("peak", Merge::Max)])[..] else {
        panic!()
    };
    t.begin_batch(&[], 1);
    t.counter_add(sum, &[1, 2], &[10, 20]).unwrap();
    t.counter_add(peak, &[1], &[5]).unwrap();
    t.end_batch(1);
    t.flush();
    // This host's values of the changed keys, once.
    let changes = d.eventual_changes(2);
    assert_eq!(changes, vec![("bytes".to_string(), vec![(1, 10), (2, 20)]), ("peak".to_string(), vec![(1, 5)])]);
    assert!(d.eventual_changes(2).is_empty());
    // Another host's values replace what it sent before; reads merge.
    assert_eq!(d.set_eventual_remote("h2", "bytes", &[(1, 3), (3, 4)], 2), 0);
    assert_eq!(d.set_eventual_remote("h2", "bytes", &[(1, 7)], 2), 0);
    assert_eq!(d.set_eventual_remote("h3", "peak", &[(1, 9)], 2), 0);
    assert_eq!(d.set_eventual_remote("h3", "unknown", &[(1, 9)], 2), 0);
    let mut out = Vec::new();
    t.begin_batch(&[], 3);
    t.counter_get(sum, &[1, 2, 3], &mut out).unwrap();
    t.counter_get(peak, &[1], &mut out).unwrap();
    t.end_batch(3);
    assert_eq!(out, vec![17, 20, 4, 9]);
    assert_eq!(d.eventual_snapshot("bytes").unwrap(), vec![(1, 17), (2, 20), (3, 4)]);
    assert_eq!(d.eventual_top("bytes", 2).unwrap(), (3, vec![(2, 20), (1, 17)]));
    // Remote values do not travel on: only this host's changes are sent.
    assert!(d.eventual_changes(3).is_empty());
}

/// A key that stays live on its host without changing (it is read) is
/// sent again every half idle timeout, so it does not idle out on the
/// group's other hosts; one idle here is not.
#[test]
fn live_eventual_keys_are_sent_again_every_half_idle_timeout() {
    let d = Domain::new();
    d.track_changes();
    let mut t = Tables::new(&d, DEFAULT_BUDGET_BYTES);
    let s = TableSpec { idle_timeout_ns: 1_000_000_000, ..eventual("hits", Merge::Sum) };
    let [hits] = declared(&mut t, &[s])[..] else { panic!() };
    let at = |ms: u64| ms * 1_000_000;
    t.begin_batch(&[], at(1));
    t.counter_add(hits, &[1, 2], &[10, 20]).unwrap();
    t.end_batch(at(1));
    t.flush();
    assert_eq!(d.eventual_changes(at(2)), vec![("hits".to_string(), vec![(1, 10), (2, 20)])]);
    assert!(d.eventual_changes(at(100)).is_empty());
    // Key 1 is read (kept live), key 2 is not.
    let mut out = Vec::new();
    for ms in [400, 800] {
        t.begin_batch(&[], at(ms));
        t.counter_get(hits, &[1], &mut out).unwrap();
        t.end_batch(at(ms));
    }
    assert_eq!(d.eventual_changes(at(502)), vec![("hits".to_string(), vec![(1, 10), (2, 20)])]);
    assert!(d.eventual_changes(at(600)).is_empty());
    assert_eq!(d.eventual_changes(at(1100)), vec![("hits".to_string(), vec![(1, 10)])]);
}

/// Two hosts split one pool by blocks of 16: each hands out only its own
/// blocks; a block that moves takes its bindings along (handed over, then
/// allowed), a release of a binding held on the other host is kept for it,
/// and no resource is ever bound on both.
#[test]
fn a_split_pool_hands_out_its_own_blocks_and_moved_bindings_go_along() {
    let (a, b) = (Domain::new(), Domain::new());
    let mut ta = Tables::new(&a, DEFAULT_BUDGET_BYTES);
    let mut tb = Tables::new(&b, DEFAULT_BUDGET_BYTES);
    let [pa] = declared(&mut ta, &[pool("ports", 64)])[..] else { panic!() };
    let [pb] = declared(&mut tb, &[pool("ports", 64)])[..] else { panic!() };
    // Resources 1000..1064: blocks 62 (1000..1008), 63, 64, 65, 66 (1056..1064).
    let a_owns = |r: u64| (r / 16).is_multiple_of(2);
    a.split_pool("ports", 16, &a_owns);
    b.split_pool("ports", 16, &|r| !a_owns(r));
    let take = |t: &mut Tables, p: u32, n: usize| {
        let values: Vec<&[u8]> = vec![b"x".as_slice(); n];
        let mut got = Vec::new();
        t.acquire(p, &framed(&values), &mut got).unwrap();
        got
    };
    let got_a = take(&mut ta, pa, 64);
    let got_b = take(&mut tb, pb, 64);
    assert!(got_a.iter().all(|r| a_owns(*r)) && got_b.iter().all(|r| !a_owns(*r)));
    assert_eq!(got_a.len() + got_b.len(), 64, "together they hand out the whole pool once");

    // Block 64 (1024..1040) moves from a to b: a stops handing it out and
    // hands its bindings over; b takes them in, then hands out the rest.
    let a_now = |r: u64| a_owns(r) && r / 16 != 64;
    a.split_pool("ports", 16, &a_now);
    let moved = a.pool_take_bindings("ports", &a_now);
    assert_eq!(moved.iter().map(|e| e.0).collect::<Vec<_>>(), (1024..1040).collect::<Vec<_>>());
    assert_eq!(b.pool_import("ports", &moved), 0);
    b.split_pool("ports", 16, &|r| !a_now(r));
    assert!(take(&mut tb, pb, 1).is_empty(), "every resource is bound somewhere");

    // A connection of block 64 that stayed on a ends there: its release
    // goes to b, which frees it for b's flows.
    ta.release(pa, &[1030]).unwrap();
    assert_eq!(a.pool_take_foreign("ports"), vec![1030]);
    assert_eq!(b.pool_release_remote("ports", &[1030]), 1);
    assert_eq!(take(&mut tb, pb, 2), vec![1030]);
    // b notes what changed, for the host that would take its blocks over.
    let changed = b.pool_take_changed("ports").unwrap();
    assert!(changed.iter().any(|(r, v)| *r == 1030 && v.is_some()));
    assert!(changed.iter().any(|(r, _)| *r == 1024));
}
