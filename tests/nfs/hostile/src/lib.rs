//! A network function that misbehaves on purpose, for the host's tests.
//!
//! Its config is a text `mode[:after]`: it behaves (forwards everything)
//! for `after` batches (default 0), then does `mode` on every batch:
//!
//! - `loop`: spins forever (the deadline must stop it);
//! - `alloc`: allocates without bound (the memory cap must stop it);
//! - `recurse`: recurses without bound (the stack limit must stop it);
//! - `panic`: panics;
//! - `error`: returns `err(...)` from `process`;
//! - `bad-verdicts`: returns one verdict too few;
//! - `print`: writes 1000 lines to stdout per batch (rate limit);
//! - `big-state`: stores 1 MiB of state per flow (state limit);
//! - `reject`: refuses its config in `init`;
//! - `count-panic`: counts packets per flow in host-owned flow state (a
//!   little-endian u64) on every batch, and panics on every batch after
//!   `after` — so tests can check that state survives the trap; it also
//!   counts them in a per-flow counter table `packets`;
//! - `pool`: declares a release pool of 16,777,216 resources taken with
//!   `chunk = u32::MAX`, and acquires from it in `init` and on every batch
//!   (the host must bound the refill);
//! - `pool-huge`: declares a pool of 2^32 resources (must be refused at
//!   `declare`; the NF then fails its `init` with the error);
//! - `big-event`: emits a 4 MB event and 2,000 1 KiB events per batch;
//! - `log-flood`: writes 100 `host-log` lines of 1 MB per batch;
//! - `flow-flood`: keeps 4 KiB of flow state for every flow it sees;
//! - `key-flood`: declares a global eventual counter table `keys` with
//!   the largest capacity and adds 65,536 new keys per batch (10 M keys
//!   after 153 batches): the state budget must hold it, with `over-budget`
//!   errors the NF ignores;
//! - `retag`: rewrites the outer 802.1Q VLAN id of every tagged frame to
//!   200 and forwards it (the host must refuse moving packets into a VLAN
//!   that is not the deployment's);
//! - `offload-out`: sends every packet out of port 1 (verdict port 2: port
//!   0 is the default output) and offloads every
//!   flow (`sluice:nf@0.5.0`) with a destination rewrite to 192.0.2.66
//!   (the host must refuse offloaded packets to a port the deployment's
//!   attachments do not name, as it refuses the NF's own);
//! - `translate-flood`: rewrites every untagged IPv4 packet's source to a
//!   flow of its own (address 100.64.0.0–3, port counting up: 262,144
//!   distinct flows before they repeat) and forwards it (a host with
//!   several workers must not let these translations crowd out another
//!   tenant's in its table of flows handed between workers);
//! - `init-loop`: spins forever in `init` (the start deadline must stop
//!   it);
//! - `scan-flood`: declares the same `keys` table, adds 4,096 new keys
//!   per batch, then asks for a `scan` page and a `top-k` of `u32::MAX`
//!   entries (the host must bound both to 1024) and reports what it got
//!   in a `hostile.scan` event (fields `page`, `top`, `cursor`: the
//!   numbers of entries, of pairs and of cursor bytes);
//! - `clash`: declares a table `totals` as per-flow bytes — incompatible
//!   with the monitor's eventual counter table of that name — ignores the
//!   error it gets, and otherwise forwards everything (a swap to it must
//!   be refused anyway).

#![allow(clippy::panic, clippy::indexing_slicing)] // misbehaving is the point

use sluice_sdk::{Batch, NetworkFunction, NfInfo};
use std::hint::black_box;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Loop,
    Alloc,
    Recurse,
    Panic,
    Error,
    BadVerdicts,
    Print,
    BigState,
    CountPanic,
    Clash,
    Pool,
    BigEvent,
    LogFlood,
    FlowFlood,
    KeyFlood,
    ScanFlood,
    Retag,
    OffloadOut,
    TranslateFlood,
}

/// The hostile NF.
#[derive(Debug)]
pub struct Hostile {
    mode: Mode,
    after: u64,
    seen: u64,
    hoard: Vec<Vec<u8>>,
    packets: Option<sluice_sdk::state::Counters>,
    pool: Option<sluice_sdk::state::Pool>,
    keys: Option<sluice_sdk::state::Counters>,
    /// Packets `translate-flood` translated.
    translated: u64,
}

/// Recursion the optimizer cannot turn into a loop, with everything in Wasm
/// locals (nothing address-taken), so it exhausts the Wasm stack rather
/// than the shadow stack in linear memory.
fn recurse(n: u64) -> u64 {
    if n == u64::MAX {
        return n;
    }
    let r = recurse(n.wrapping_add(1));
    r.rotate_left((n & 63) as u32) ^ n
}

impl NetworkFunction for Hostile {
    fn init(config: &[u8]) -> Result<(Self, NfInfo), String> {
        let text = std::str::from_utf8(config).map_err(|_| "config is not UTF-8".to_string())?.trim();
        let (mode, after) = match text.split_once(':') {
            Some((m, a)) => (m, a.parse::<u64>().map_err(|_| format!("bad batch count '{a}'"))?),
            None => (text, 0),
        };
        let mode = match mode {
            "loop" => Mode::Loop,
            "alloc" => Mode::Alloc,
            "recurse" => Mode::Recurse,
            "panic" => Mode::Panic,
            "error" => Mode::Error,
            "bad-verdicts" => Mode::BadVerdicts,
            "print" => Mode::Print,
            "big-state" => Mode::BigState,
            "count-panic" => Mode::CountPanic,
            "clash" => Mode::Clash,
            "pool" | "pool-huge" => Mode::Pool,
            "big-event" => Mode::BigEvent,
            "log-flood" => Mode::LogFlood,
            "flow-flood" => Mode::FlowFlood,
            "key-flood" => Mode::KeyFlood,
            "scan-flood" => Mode::ScanFlood,
            "retag" => Mode::Retag,
            "offload-out" => Mode::OffloadOut,
            "translate-flood" => Mode::TranslateFlood,
            "init-loop" => loop {
                black_box(());
            },
            "reject" => return Err("hostile: config rejected on purpose (mode 'reject')".into()),
            other => return Err(format!("hostile: unknown mode '{other}'")),
        };
        let pool = if mode == Mode::Pool {
            use sluice_sdk::state::{Consistency, Pool, PoolSpec, TableSpec};
            let count = if text.starts_with("pool-huge") { 1u64 << 32 } else { 1 << 24 };
            let mut spec = TableSpec::pool("ports", 0, count, 8);
            spec.consistency = Consistency::Release(PoolSpec { first: 0, count, chunk: u32::MAX });
            let pool = Pool::declare(spec).map_err(|e| format!("hostile: declaring the pool: {e}"))?;
            let mut value = Vec::new();
            sluice_sdk::state::push_frame(&mut value, b"init");
            pool.acquire(&value).map_err(|e| format!("hostile: acquiring in init: {e}"))?;
            Some(pool)
        } else {
            None
        };
        let info = if matches!(mode, Mode::BigState | Mode::CountPanic | Mode::FlowFlood) {
            NfInfo::with_flow_state(0)
        } else {
            NfInfo::stateless()
        };
        // count-panic also counts in a host table, to show that tables
        // outlive the instance too.
        let packets = if mode == Mode::CountPanic {
            Some(
                sluice_sdk::state::Counters::declare(sluice_sdk::state::TableSpec::per_flow_counter("packets"))
                    .map_err(|e| format!("hostile: {e}"))?,
            )
        } else {
            None
        };
        if mode == Mode::Clash {
            let _ = sluice_sdk::state::declare(sluice_sdk::state::TableSpec::per_flow_bytes("totals", 8));
        }
        let keys = if matches!(mode, Mode::KeyFlood | Mode::ScanFlood) {
            use sluice_sdk::state::{Counters, Merge, TableSpec};
            let spec = TableSpec::eventual_counter("keys", Merge::Sum, 0).capacity(u32::MAX);
            Some(Counters::declare(spec).map_err(|e| format!("hostile: {e}"))?)
        } else {
            None
        };
        Ok((Hostile { mode, after, seen: 0, hoard: Vec::new(), packets, pool, keys, translated: 0 }, info))
    }

    fn process(&mut self, batch: &mut Batch) -> Result<(), String> {
        self.seen += 1;
        if self.mode == Mode::CountPanic {
            for i in 0..batch.len() {
                let Some(f) = batch.packet(i).and_then(|p| p.flow()) else { continue };
                let n =
                    batch.flow_state(f).and_then(|s| <[u8; 8]>::try_from(s).ok()).map(u64::from_le_bytes).unwrap_or(0);
                batch.set_flow_state(f, (n + 1).to_le_bytes().to_vec());
            }
            if let Some(t) = self.packets {
                let flows: Vec<u64> = batch.packets().filter_map(|p| p.flow()).map(u64::from).collect();
                t.add(&flows, &vec![1; flows.len()]).map_err(|e| format!("hostile: {e}"))?;
            }
        }
        if self.seen <= self.after {
            return Ok(());
        }
        match self.mode {
            Mode::Loop => {
                let mut x = 0u64;
                loop {
                    x = black_box(x.wrapping_add(1));
                }
            }
            Mode::Alloc => loop {
                let mut v = vec![1u8; 1 << 20];
                v[0] = black_box(2);
                self.hoard.push(v);
            },
            Mode::Recurse => {
                black_box(recurse(black_box(0)));
                Ok(())
            }
            Mode::Panic | Mode::CountPanic => panic!("hostile NF panics on purpose"),
            Mode::Error => Err("hostile: refusing this batch on purpose".into()),
            Mode::BadVerdicts => {
                // Swapping in an empty batch makes `finish` return zero
                // verdicts for a non-empty batch: a malformed result the
                // host must notice.
                *batch = Batch::new(Vec::new(), &[], &[]);
                Ok(())
            }
            Mode::Print => {
                for i in 0..1000 {
                    println!("hostile line {i}");
                }
                Ok(())
            }
            Mode::BigState => {
                for f in 0..batch.flow_count() as u32 {
                    batch.set_flow_state(f, vec![0xee; 1 << 20]);
                }
                Ok(())
            }
            Mode::Clash => Ok(()),
            Mode::Pool => {
                if let Some(p) = self.pool {
                    let mut values = Vec::new();
                    for _ in 0..batch.len() {
                        sluice_sdk::state::push_frame(&mut values, b"flow");
                    }
                    let _ = p.acquire(&values);
                }
                Ok(())
            }
            Mode::BigEvent => {
                let event = |size: usize| sluice_sdk::Event {
                    kind: "hostile.big".into(),
                    level: sluice_sdk::Level::Info,
                    packet: None,
                    fields: vec![("blob".into(), "e".repeat(size))],
                };
                sluice_sdk::emit(&[event(4 << 20)]);
                sluice_sdk::emit(&(0..2000).map(|_| event(1024)).collect::<Vec<_>>());
                Ok(())
            }
            Mode::LogFlood => {
                let line = "l".repeat(1 << 20);
                for _ in 0..100 {
                    sluice_sdk::log(sluice_sdk::Level::Warn, &line);
                }
                Ok(())
            }
            Mode::KeyFlood => {
                const PER_BATCH: u64 = 65_536;
                let first = self.seen * PER_BATCH;
                let keys: Vec<u64> = (first..first + PER_BATCH).collect();
                if let Some(t) = &self.keys {
                    // Refusals are the point: keep going.
                    let _ = t.add(&keys, &vec![1; keys.len()]);
                }
                Ok(())
            }
            Mode::ScanFlood => {
                const PER_BATCH: u64 = 4096;
                let Some(t) = &self.keys else { return Ok(()) };
                let first = self.seen * PER_BATCH;
                let keys: Vec<u64> = (first..first + PER_BATCH).collect();
                t.add(&keys, &vec![1; keys.len()]).map_err(|e| format!("hostile: {e}"))?;
                let page = t.scan(&[], u32::MAX).map_err(|e| format!("hostile: {e}"))?;
                let top = t.top_k(u32::MAX).map_err(|e| format!("hostile: {e}"))?;
                sluice_sdk::emit(&[sluice_sdk::Event {
                    kind: "hostile.scan".into(),
                    level: sluice_sdk::Level::Info,
                    packet: None,
                    fields: vec![
                        ("page".into(), page.counters.len().to_string()),
                        ("top".into(), top.len().to_string()),
                        ("cursor".into(), page.cursor.len().to_string()),
                    ],
                }]);
                Ok(())
            }
            Mode::Retag => {
                for i in 0..batch.len() {
                    batch.edit(i, |d| {
                        if d.len() >= 16 && d[12..14] == [0x81, 0x00] {
                            let tci = u16::from_be_bytes([d[14], d[15]]) & 0xf000 | 200;
                            d[14..16].copy_from_slice(&tci.to_be_bytes());
                        }
                    });
                }
                Ok(())
            }
            Mode::OffloadOut => {
                use sluice_sdk::offload::Offload;
                let elsewhere = sluice_sdk::IpAddr128::from_v4([192, 0, 2, 66]);
                for i in 0..batch.len() {
                    batch.set_verdict(i, sluice_sdk::Verdict::Forward(2));
                    batch.offload(Offload::packet(i).destination(elsewhere, None).without_counts());
                }
                Ok(())
            }
            Mode::TranslateFlood => {
                for i in 0..batch.len() {
                    let n = self.translated;
                    self.translated = self.translated.wrapping_add(1);
                    batch.edit(i, |d| {
                        // Ethernet, IPv4 without options, TCP or UDP.
                        if d.len() >= 38 && d[12..14] == [0x08, 0x00] && d[14] == 0x45 && matches!(d[23], 6 | 17) {
                            d[26..30].copy_from_slice(&[100, 64, 0, (n & 3) as u8]);
                            d[34..36].copy_from_slice(&((n >> 2) as u16).to_be_bytes());
                        }
                    });
                }
                Ok(())
            }
            Mode::FlowFlood => {
                for f in 0..batch.flow_count() as u32 {
                    batch.set_flow_state(f, vec![0xab; 4096]);
                }
                Ok(())
            }
        }
    }
}

sluice_sdk::export_nf!(Hostile);
