//! Counts IPv4 TCP packets per destination port and lists the table with
//! `scan` and `top-k` (`sluice:nf@0.4.0`).
//!
//! `init` declares `ports`, a global eventual counter table summed every
//! batch, and `names`, a read-only byte table (any key length, values up
//! to 8 bytes) filled in one `put-many` with "http" → "80", "https" →
//! "443", "dns" → "53", "ssh" → "22" and "ntp" → "123".
//!
//! Each batch: (1) one `counter-add` on `ports` with one key per distinct
//! destination port of the batch's IPv4 TCP packets, in order of first
//! appearance, and its number of such packets (skipped when there are
//! none). (2) If the batch has an IPv4 TCP packet with SYN set and ACK
//! clear, on the first such packet a `conformance.scan` event (level info)
//! with the fields, in this order: `top`, the `top-k` of 3 of `ports` as
//! `port=count` joined by commas; `entries`, `pages` and `total`: the
//! number of entries, of `scan` calls and the sum of the values of a full
//! scan of `ports` in pages of 16 (starting from an empty cursor, each
//! next call with the cursor the previous page returned, until a page's
//! cursor is empty); `ascending`, `yes` if every key of that scan is
//! larger than the one before it, else `no`; `names`, the keys of a full
//! scan of `names` in pages of 2 (through the SDK's iterator over every
//! entry where it has one), joined by commas. Every packet is
//! forwarded.

use sluice_sdk::state::{Bytes, Counters, Merge, TableSpec, push_frame};
use sluice_sdk::{Batch, Event, Level, NetworkFunction, NfInfo, emit};

struct Scan {
    ports: Counters,
    names: Bytes,
}

fn state_err(e: impl std::fmt::Debug) -> String {
    format!("{e:?}")
}

impl NetworkFunction for Scan {
    fn init(_config: &[u8]) -> Result<(Self, NfInfo), String> {
        let ports = Counters::declare(TableSpec::eventual_counter("ports", Merge::Sum, 0)).map_err(state_err)?;
        let names = Bytes::declare(TableSpec::read_only_bytes("names", 0, 8)).map_err(state_err)?;
        let mut entries = Vec::new();
        for (name, port) in [("http", "80"), ("https", "443"), ("dns", "53"), ("ssh", "22"), ("ntp", "123")] {
            push_frame(&mut entries, name.as_bytes());
            push_frame(&mut entries, port.as_bytes());
        }
        names.put_many(&entries).map_err(state_err)?;
        Ok((Scan { ports, names }, NfInfo::stateless()))
    }

    fn process(&mut self, batch: &mut Batch) -> Result<(), String> {
        let mut keys: Vec<u64> = Vec::new();
        let mut counts: Vec<i64> = Vec::new();
        let mut trigger = None;
        for (i, p) in batch.packets().enumerate() {
            let (Some(_), Some(tcp)) = (p.ipv4(), p.tcp()) else { continue };
            let port = u64::from(tcp.dst_port());
            match keys.iter().position(|k| *k == port) {
                Some(at) => counts[at] += 1,
                None => {
                    keys.push(port);
                    counts.push(1);
                }
            }
            if trigger.is_none() && tcp.syn() && !tcp.ack() {
                trigger = Some(i as u32);
            }
        }
        if !keys.is_empty() {
            self.ports.add(&keys, &counts).map_err(state_err)?;
        }
        let Some(packet) = trigger else { return Ok(()) };
        let top = self.ports.top_k(3).map_err(state_err)?;
        let top: Vec<String> = top.iter().map(|(port, n)| format!("{port}={n}")).collect();
        let (mut entries, mut pages, mut total, mut ascending) = (0u64, 0u64, 0u64, true);
        let mut last: Option<u64> = None;
        let mut cursor = Vec::new();
        loop {
            let page = self.ports.scan(&cursor, 16).map_err(state_err)?;
            pages += 1;
            for (key, value) in &page.counters {
                entries += 1;
                total += value;
                ascending &= last.is_none_or(|l| *key > l);
                last = Some(*key);
            }
            if page.cursor.is_empty() {
                break;
            }
            cursor = page.cursor;
        }
        let mut names: Vec<String> = Vec::new();
        for entry in self.names.entries(2) {
            let (key, _) = entry.map_err(state_err)?;
            names.push(String::from_utf8_lossy(&key).into_owned());
        }
        emit(&[Event {
            kind: "conformance.scan".into(),
            level: Level::Info,
            packet: Some(packet),
            fields: vec![
                ("top".into(), top.join(",")),
                ("entries".into(), entries.to_string()),
                ("pages".into(), pages.to_string()),
                ("total".into(), total.to_string()),
                ("ascending".into(), if ascending { "yes" } else { "no" }.into()),
                ("names".into(), names.join(",")),
            ],
        }]);
        Ok(())
    }
}

sluice_sdk::export_nf!(Scan);
