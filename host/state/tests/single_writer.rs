//! Single-writer tables: one owner per key, forwarded writes, syncs.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

use sluice_state::*;
use std::sync::Arc;

fn single(name: &str, kind: Kind, sync_interval_ns: u64) -> TableSpec {
    TableSpec {
        name: name.into(),
        scope: Scope::Global,
        access: Access::ReadWrite,
        kind,
        consistency: Consistency::SingleWriter { sync_interval_ns },
        key_size: 0,
        max_value_size: 64,
        capacity: 0,
        idle_timeout_ns: 0,
        notify_expired: false,
    }
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

/// `n` workers of one NF on a barrier domain, each with the table declared.
fn workers(n: usize, spec: &TableSpec, budget: usize) -> (Arc<Domain>, Vec<Tables>, u32) {
    let d = Domain::for_workers(n);
    d.set_barrier(true);
    let mut ws: Vec<Tables> = (0..n).map(|_| Tables::new(&d, budget)).collect();
    let mut handle = 0;
    for w in &mut ws {
        w.begin_init();
        handle = w.declare(spec.clone()).unwrap();
        w.end_init().unwrap();
    }
    (d, ws, handle)
}

/// One batch on worker `w`.
fn batch<R>(ws: &mut [Tables], w: usize, now: u64, f: impl FnOnce(&mut Tables) -> R) -> R {
    ws[w].begin_batch(&[], now);
    let r = f(&mut ws[w]);
    ws[w].end_batch(now);
    r
}

fn sync(ws: &mut [Tables]) {
    for w in ws.iter_mut() {
        w.hand_over();
    }
    for w in ws.iter_mut() {
        w.sync_point();
    }
}

fn get(t: &mut Tables, h: u32, keys: &[u64]) -> Vec<u64> {
    let mut out = Vec::new();
    t.counter_get(h, keys, &mut out).unwrap();
    out
}

#[test]
fn counters_from_every_worker_add_up_and_are_read_after_a_sync() {
    let (d, mut ws, h) = workers(2, &single("c", Kind::Counter, 0), DEFAULT_BUDGET_BYTES);
    let keys: Vec<u64> = (0..64).collect();
    for w in 0..2 {
        batch(&mut ws, w, 10, |t| t.counter_add(h, &keys, &vec![3; 64]).unwrap());
    }
    // Each worker reads its own writes at once, the other's only after a
    // sync; a key it owns shows its own adds, one it does not shows its
    // overlay.
    assert_eq!(batch(&mut ws, 0, 11, |t| get(t, h, &keys)), vec![3; 64]);
    sync(&mut ws);
    for w in 0..2 {
        assert_eq!(batch(&mut ws, w, 12, |t| get(t, h, &keys)), vec![6; 64], "worker {w}");
    }
    // Deltas are never lost: 100 adds from each worker.
    for i in 0..100 {
        for w in 0..2 {
            batch(&mut ws, w, 20 + i, |t| t.counter_add(h, &[7], &[1]).unwrap());
        }
        if i % 10 == 0 {
            sync(&mut ws);
        }
    }
    sync(&mut ws);
    for w in 0..2 {
        assert_eq!(batch(&mut ws, w, 200, |t| get(t, h, &[7])), vec![206], "worker {w}");
    }
    let snap = d.single_snapshot("c").unwrap();
    assert_eq!(snap.len(), 64);
    assert_eq!(ws[0].tables().next().unwrap().1, 64);
}

#[test]
fn byte_writes_apply_in_worker_order_and_removals_free_their_entries() {
    let (d, mut ws, h) = workers(3, &single("b", Kind::Bytes, 0), DEFAULT_BUDGET_BYTES);
    // Every worker writes the same keys in one sync interval: the owner's
    // own write applies at once, the others' at the sync in worker order,
    // so the last of those wins: worker 2's, or worker 1's where worker 2
    // owns the key.
    let winner = |key: &[u8]| if shard_of(key, 3) == 2 { 2u8 } else { 3u8 };
    for w in 0..3 {
        let v = [w as u8 + 1; 4];
        let entries = framed(&[b"k1", &v, b"k2", &v, b"k3", &v]);
        batch(&mut ws, w, 5, |t| t.put_many(h, &entries).unwrap());
    }
    // Before the sync each reads its own value.
    for w in 0..3 {
        let mut out = Vec::new();
        batch(&mut ws, w, 6, |t| t.get_many(h, &framed(&[b"k1"]), &mut out).unwrap());
        assert_eq!(unframe(&out), vec![vec![w as u8 + 1; 4]]);
    }
    sync(&mut ws);
    for w in 0..3 {
        let mut out = Vec::new();
        batch(&mut ws, w, 7, |t| t.get_many(h, &framed(&[b"k1", b"k2", b"k3", b"zz"]), &mut out).unwrap());
        let want = [winner(b"k1"), winner(b"k2"), winner(b"k3")].map(|v| vec![v; 4]);
        assert_eq!(unframe(&out), [want.to_vec(), vec![vec![]]].concat(), "worker {w}");
    }
    assert_eq!(d.shared_bytes(), 3 * (2 + 4 + ENTRY_OVERHEAD));
    batch(&mut ws, 1, 8, |t| t.put_many(h, &framed(&[b"k1", b"", b"k2", b""])).unwrap());
    sync(&mut ws);
    assert_eq!(d.single_snapshot("b").unwrap(), vec![(b"k3".to_vec(), vec![winner(b"k3"); 4])]);
    assert_eq!(d.shared_bytes(), 2 + 4 + ENTRY_OVERHEAD);
    assert_eq!(ws[0].tables().next().unwrap().1, 1);
}

#[test]
fn capacity_and_budget_count_the_whole_table_and_refused_writes_are_not_forwarded() {
    let mut spec = single("c", Kind::Counter, 0);
    spec.capacity = 100;
    let (d, mut ws, h) = workers(2, &spec, DEFAULT_BUDGET_BYTES);
    let a: Vec<u64> = (0..60).collect();
    let b: Vec<u64> = (1000..1060).collect();
    batch(&mut ws, 0, 1, |t| t.counter_add(h, &a, &vec![1; 60]).unwrap());
    let err = batch(&mut ws, 1, 1, |t| t.counter_add(h, &b, &vec![1; 60]).unwrap_err());
    assert_eq!(err, StateError::Full(40));
    sync(&mut ws);
    assert_eq!(d.single_snapshot("c").unwrap().len(), 100);
    // Keys the table holds are still updated at capacity.
    batch(&mut ws, 1, 2, |t| t.counter_add(h, &a, &vec![1; 60]).unwrap());
    sync(&mut ws);
    assert_eq!(batch(&mut ws, 0, 3, |t| get(t, h, &a[..3])), vec![2, 2, 2]);
    assert_eq!(batch(&mut ws, 0, 3, |t| get(t, h, &b[40..43])), vec![0, 0, 0]);

    // A hostile key flood stops at the budget on every worker together.
    let budget = 1000 * (16 + ENTRY_OVERHEAD);
    let (d, mut ws, h) = workers(2, &single("flood", Kind::Counter, 0), budget);
    let mut refused = 0;
    for round in 0..20u64 {
        for w in 0..2 {
            let keys: Vec<u64> = (0..100).map(|i| (round * 2 + w as u64) * 1000 + i).collect();
            if batch(&mut ws, w, round, |t| t.counter_add(h, &keys, &vec![1; 100])).is_err() {
                refused += 1;
            }
        }
        sync(&mut ws);
    }
    assert!(refused > 0);
    assert!(d.shared_bytes() <= budget, "{} > {budget}", d.shared_bytes());
    assert_eq!(d.single_snapshot("flood").unwrap().len(), 1000);
}

#[test]
fn idle_entries_expire_at_their_owner_and_are_handed_to_it() {
    let mut spec = single("b", Kind::Bytes, 0);
    // Sweeps come at most every eighth of the timeout and 1 ms.
    spec.idle_timeout_ns = 1_000_000;
    spec.notify_expired = true;
    let (d, mut ws, h) = workers(2, &spec, DEFAULT_BUDGET_BYTES);
    let keys: Vec<Vec<u8>> = (0..16u8).map(|i| vec![i; 4]).collect();
    let mut entries = Vec::new();
    for k in &keys {
        sluice_wire::abi::push_frame(&mut entries, k);
        sluice_wire::abi::push_frame(&mut entries, b"v");
    }
    batch(&mut ws, 1, 100, |t| t.put_many(h, &entries).unwrap());
    sync(&mut ws);
    assert_eq!(d.single_snapshot("b").unwrap().len(), 16);
    // Past the timeout: every owner removes its keys at its sync and hands
    // them to its own instance.
    for w in &mut ws {
        w.begin_batch(&[], 5_000_000);
        w.end_batch(5_000_000);
    }
    sync(&mut ws);
    let mut handed = 0;
    for w in &mut ws {
        for (table, framed) in w.take_expired() {
            assert_eq!(table, h);
            let items = unframe(&framed);
            assert!(items.chunks(2).all(|kv| kv[1] == b"v"));
            handed += items.len() / 2;
        }
    }
    assert_eq!(handed, 16);
    assert!(d.single_snapshot("b").unwrap().is_empty());
    assert_eq!(d.shared_bytes(), 0);
    assert_eq!(ws[0].meters().expired + ws[1].meters().expired, 16);
}

#[test]
fn a_live_worker_syncs_on_its_own_batches_and_a_leaving_worker_hands_its_keys_on() {
    let d = Domain::for_workers(2);
    let spec = single("c", Kind::Counter, 0);
    let mut ws: Vec<Tables> = (0..2).map(|_| Tables::new(&d, DEFAULT_BUDGET_BYTES)).collect();
    let mut h = 0;
    for w in &mut ws {
        w.begin_init();
        h = w.declare(spec.clone()).unwrap();
        w.end_init().unwrap();
    }
    let keys: Vec<u64> = (0..32).collect();
    batch(&mut ws, 1, 1, |t| t.counter_add(h, &keys, &vec![5; 32]).unwrap());
    // Worker 0 applies what was forwarded at the end of its next batch and
    // publishes; worker 1 then reads the published values (its overlay is
    // pruned, not counted twice).
    batch(&mut ws, 0, 2, |_| ());
    batch(&mut ws, 1, 3, |_| ());
    assert_eq!(batch(&mut ws, 1, 4, |t| get(t, h, &keys)), vec![5; 32]);
    assert_eq!(batch(&mut ws, 0, 4, |t| get(t, h, &keys)), vec![5; 32]);

    // Worker 0 leaves: its shard is parked with its entries, and a worker
    // that joins later adopts it.
    let w0 = ws.remove(0);
    drop(w0);
    let mut late = Tables::new(&d, DEFAULT_BUDGET_BYTES);
    late.begin_init();
    let h2 = late.declare(spec.clone()).unwrap();
    late.end_init().unwrap();
    late.begin_batch(&[], 5);
    let mut out = Vec::new();
    late.counter_get(h2, &keys, &mut out).unwrap();
    assert_eq!(out, vec![5; 32]);
    late.counter_add(h2, &keys, &vec![1; 32]).unwrap();
    late.end_batch(5);
    ws.push(late);
    batch(&mut ws, 0, 6, |_| ());
    batch(&mut ws, 1, 7, |_| ());
    assert_eq!(batch(&mut ws, 0, 8, |t| get(t, h, &keys)), vec![6; 32]);
}

#[test]
fn the_layout_is_checked_and_kept_across_versions() {
    let d = Domain::for_workers(1);
    let mut t = Tables::new(&d, DEFAULT_BUDGET_BYTES);
    t.begin_init();
    let mut per_flow = single("p", Kind::Counter, 0);
    per_flow.scope = Scope::PerFlow;
    assert!(matches!(t.declare(per_flow), Err(StateError::BadSpec(_))));
    let mut ro = single("r", Kind::Counter, 0);
    ro.access = Access::ReadOnly;
    assert!(matches!(t.declare(ro), Err(StateError::BadSpec(_))));
    let h = t.declare(single("b", Kind::Bytes, 0)).unwrap();
    t.end_init().unwrap();
    t.begin_batch(&[], 1);
    assert_eq!(t.counter_add(h, &[1], &[1]), Err(StateError::WrongKind));
    assert_eq!(t.put_many(h, &framed(&[b"k", &[0; 65]])), Err(StateError::TooLarge(0)));
    assert_eq!(t.put_many(h, &framed(&[b"k", b"v", b"", b"v"])), Err(StateError::BadInput(1)));
    let mut out = Vec::new();
    t.get_many(h, &framed(&[b"k"]), &mut out).unwrap();
    assert_eq!(unframe(&out), vec![b"v".to_vec()]);
    t.end_batch(1);
    // A new version may change the sync interval, not the consistency.
    t.begin_init();
    assert_eq!(t.declare(single("b", Kind::Bytes, 1_000_000)).unwrap(), h);
    t.end_init().unwrap();
    t.begin_init();
    let eventual = TableSpec {
        consistency: Consistency::Eventual { merge: Merge::Sum, merge_interval_ns: 0 },
        ..single("b", Kind::Counter, 0)
    };
    assert!(matches!(t.declare(eventual), Err(StateError::Incompatible(_))));
    assert!(t.end_init().is_err());
}

#[test]
fn many_live_workers_writing_and_reading_every_shard_never_wait_on_each_other() {
    // Eight workers on their own threads, each batch writing and reading
    // keys spread over every shard in a different order, each syncing
    // (publishing its shards) at the end of every batch: readers that held
    // one shard's replica while waiting for another's, behind owners
    // waiting to publish, used to stop every worker for good.
    const WORKERS: usize = 8;
    let d = Domain::for_workers(WORKERS);
    let spec = single("b", Kind::Bytes, 0);
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    for w in 0..WORKERS {
        let d = d.clone();
        let spec = spec.clone();
        let done = done_tx.clone();
        std::thread::spawn(move || {
            let mut t = Tables::new(&d, DEFAULT_BUDGET_BYTES);
            t.begin_init();
            let h = t.declare(spec).unwrap();
            t.end_init().unwrap();
            let mut out = Vec::new();
            for b in 0..3_000u64 {
                let keys: Vec<[u8; 8]> =
                    (0..16u64).map(|i| ((i * 7 + b + w as u64 * 3) % 64).to_le_bytes()).rev().collect();
                let mut entries = Vec::new();
                for k in &keys {
                    sluice_wire::abi::push_frame(&mut entries, k);
                    sluice_wire::abi::push_frame(&mut entries, &b.to_le_bytes());
                }
                let names: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
                t.begin_batch(&[], b + 1);
                t.put_many(h, &entries).unwrap();
                out.clear();
                t.get_many(h, &framed(&names), &mut out).unwrap();
                t.end_batch(b + 1);
            }
            done.send(w).unwrap();
        });
    }
    drop(done_tx);
    for _ in 0..WORKERS {
        done_rx
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("a worker stopped: the workers wait on each other");
    }
}
