//! Declares one table of every kind the contract offers through the SDK's
//! declaration helpers, sized by a configuration read with the typed
//! getters, and exercises the IPv6 accessors and the index of a refused
//! item.
//!
//! Configuration (`config.txt`): `capacity` (integer), `idle-ms`
//! (integer), `scale` (float), `v6-events` (boolean), `tag` (string) and
//! `pool-first` (integer, absent: its default 5000 is used).
//!
//! `init` declares, in this order: `largest`, a global eventual counter
//! table merged with max every batch, with capacity `capacity` and an idle
//! timeout of `idle-ms` ms; `packets`, per-flow counters with the same idle
//! timeout; `v6`, single-writer bytes (key-size 16, max-value-size 16, sync
//! every batch, capacity 1000); `seen`, single-writer counters (sync every
//! batch, capacity 1000, idle timeout 1 s); `notes`, per-flow bytes
//! (max-value-size 8, capacity 4096, idle timeout 1 s); `weights`,
//! read-only counters (capacity 16), filled with 1 → 10, 2 → 20, 3 → 30 in
//! one `counter-add`; `names`, read-only bytes (any key length,
//! max-value-size 16, capacity 16), filled with "tag" → the `tag` value in
//! one `put-many`; `ports`, a pool of `pool-first` .. `pool-first` + 100
//! (max-value-size 4, chunk 10).
//!
//! Each batch, in this order (a call whose list is empty is skipped):
//! (1) one `counter-add` on `largest` with one key per distinct source, in
//! order of first appearance: an IPv4 source's address (big-endian,
//! widened to u64), an IPv6 source's last 8 bytes (big-endian) with bit 63
//! set; its value offered is floor(w × `scale`), w the largest wire length
//! of that source's packets in the batch. Packets with neither an IPv4 nor
//! an IPv6 header have no source. If the table is full, the call stops at
//! the item the host refused: the packets of that source and of every
//! source after it in the call are dropped, and a `conformance.full` event
//! (level warn) on the first packet of the refused source carries `item`
//! (its index) and `sources` (the number of keys in the call). Any other
//! error fails the batch. (2) One `counter-add` on `packets` with one key
//! per distinct flow of the batch (its flow index, in order of first
//! appearance) and its number of packets in the batch. (3) One `put-many`
//! on `v6` with one entry per IPv6 packet, in batch order: its source
//! address → its destination address. With `v6-events`, a `conformance.v6`
//! event (level info) on the batch's first IPv6 packet carries `src` and
//! `dst` (32 lowercase hex digits each) and `tag`. Every other packet is
//! forwarded.

use sluice_sdk::state::{Bytes, Counters, Merge, Pool, StateError, TableSpec, push_frame};
use sluice_sdk::wire::abi::NO_FLOW;
use sluice_sdk::{Batch, Event, Level, NetworkFunction, NfInfo, Verdict, config_bool, config_float, config_int, emit};

const MS: u64 = 1_000_000;

struct Declare {
    largest: Counters,
    packets: Counters,
    v6: Bytes,
    scale: f64,
    v6_events: bool,
    tag: String,
    // Declared to show every kind; the batches do not use them.
    _seen: Counters,
    _notes: Bytes,
    _ports: Pool,
}

fn state_err(e: StateError) -> String {
    format!("{e:?}")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl NetworkFunction for Declare {
    fn init(config: &[u8]) -> Result<(Self, NfInfo), String> {
        let text = std::str::from_utf8(config).map_err(|_| "config is not UTF-8".to_string())?;
        let capacity = u32::try_from(config_int(text, "capacity", 65_536)?).map_err(|_| "capacity: out of range")?;
        let idle_ns = u64::try_from(config_int(text, "idle-ms", 0)?).map_err(|_| "idle-ms: negative")? * MS;
        let scale = config_float(text, "scale", 1.0)?;
        let v6_events = config_bool(text, "v6-events", false)?;
        let tag = sluice_sdk::config_str(text, "tag", "none").to_string();
        let pool_first = u64::try_from(config_int(text, "pool-first", 5000)?).map_err(|_| "pool-first: negative")?;

        let largest = Counters::declare(
            TableSpec::eventual_counter("largest", Merge::Max, 0).capacity(capacity).idle_timeout_ns(idle_ns),
        )
        .map_err(state_err)?;
        let packets =
            Counters::declare(TableSpec::per_flow_counter("packets").idle_timeout_ns(idle_ns)).map_err(state_err)?;
        let v6 = Bytes::declare(TableSpec::single_writer_bytes("v6", 16, 16, 0).capacity(1000)).map_err(state_err)?;
        let seen =
            Counters::declare(TableSpec::single_writer_counter("seen", 0).capacity(1000).idle_timeout_ns(1000 * MS))
                .map_err(state_err)?;
        let notes = Bytes::declare(TableSpec::per_flow_bytes("notes", 8).capacity(4096).idle_timeout_ns(1000 * MS))
            .map_err(state_err)?;
        let weights = Counters::declare(TableSpec::read_only_counter("weights").capacity(16)).map_err(state_err)?;
        weights.add(&[1, 2, 3], &[10, 20, 30]).map_err(state_err)?;
        let names = Bytes::declare(TableSpec::read_only_bytes("names", 0, 16).capacity(16)).map_err(state_err)?;
        let mut entry = Vec::new();
        push_frame(&mut entry, b"tag");
        push_frame(&mut entry, tag.as_bytes());
        names.put_many(&entry).map_err(state_err)?;
        let ports = Pool::declare(TableSpec::pool("ports", pool_first, 100, 4).chunk(10)).map_err(state_err)?;

        let nf = Declare { largest, packets, v6, scale, v6_events, tag, _seen: seen, _notes: notes, _ports: ports };
        Ok((nf, NfInfo::stateless()))
    }

    fn process(&mut self, batch: &mut Batch) -> Result<(), String> {
        // Per packet: its source key (if IP). Distinct sources with their
        // first packet and largest wire length, distinct flows with their
        // packet counts, and the IPv6 packets' addresses, all in order.
        let mut source_of: Vec<Option<u64>> = Vec::new();
        let mut sources: Vec<(u64, usize, u32)> = Vec::new();
        let mut flows: Vec<(u64, i64)> = Vec::new();
        let mut v6: Vec<(usize, [u8; 16], [u8; 16])> = Vec::new();
        for (i, p) in batch.packets().enumerate() {
            let key = if let Some(ip) = p.ipv4() {
                Some(u64::from(u32::from_be_bytes(ip.src())))
            } else if let Some(ip) = p.ipv6() {
                v6.push((i, ip.src(), ip.dst()));
                let src = ip.src();
                let (_, low) = src.split_at(8);
                let low: [u8; 8] = low.try_into().map_err(|_| "address")?;
                Some(u64::from_be_bytes(low) | 1 << 63)
            } else {
                None
            };
            source_of.push(key);
            if let Some(key) = key {
                match sources.iter_mut().find(|s| s.0 == key) {
                    Some(s) => s.2 = s.2.max(p.wire_len()),
                    None => sources.push((key, i, p.wire_len())),
                }
            }
            let flow = u64::from(p.descriptor().flow);
            if flow != u64::from(NO_FLOW) {
                match flows.iter_mut().find(|f| f.0 == flow) {
                    Some(f) => f.1 += 1,
                    None => flows.push((flow, 1)),
                }
            }
        }
        let mut events = Vec::new();
        // (1) The largest packet per source; a full table refuses a source
        // and every one after it.
        if !sources.is_empty() {
            let keys: Vec<u64> = sources.iter().map(|s| s.0).collect();
            let values: Vec<i64> = sources.iter().map(|s| (f64::from(s.2) * self.scale).floor() as i64).collect();
            match self.largest.add(&keys, &values) {
                Ok(()) => {}
                Err(e @ StateError::Full(_)) => {
                    let item = e.item().ok_or("full without an item")? as usize;
                    let (refused, first) = match (keys.get(item..), sources.get(item)) {
                        (Some(refused), Some(source)) => (refused, source.1),
                        _ => return Err(format!("full at item {item} of {}", keys.len())),
                    };
                    for (i, key) in source_of.iter().enumerate() {
                        if key.is_some_and(|k| refused.contains(&k)) {
                            batch.set_verdict(i, Verdict::Drop);
                        }
                    }
                    events.push(Event {
                        kind: "conformance.full".into(),
                        level: Level::Warn,
                        packet: Some(first as u32),
                        fields: vec![("item".into(), item.to_string()), ("sources".into(), keys.len().to_string())],
                    });
                }
                Err(e) => return Err(state_err(e)),
            }
        }
        // (2) Packets per flow.
        if !flows.is_empty() {
            let keys: Vec<u64> = flows.iter().map(|f| f.0).collect();
            let deltas: Vec<i64> = flows.iter().map(|f| f.1).collect();
            self.packets.add(&keys, &deltas).map_err(state_err)?;
        }
        // (3) IPv6 source -> destination.
        if let Some(&(first, src, dst)) = v6.first() {
            let mut entries = Vec::new();
            for (_, s, d) in &v6 {
                push_frame(&mut entries, s);
                push_frame(&mut entries, d);
            }
            self.v6.put_many(&entries).map_err(state_err)?;
            if self.v6_events {
                events.push(Event {
                    kind: "conformance.v6".into(),
                    level: Level::Info,
                    packet: Some(first as u32),
                    fields: vec![
                        ("src".into(), hex(&src)),
                        ("dst".into(), hex(&dst)),
                        ("tag".into(), self.tag.clone()),
                    ],
                });
            }
        }
        if !events.is_empty() {
            emit(&events);
        }
        Ok(())
    }
}

sluice_sdk::export_nf!(Declare);
