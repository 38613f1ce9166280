//! Remembers each flow for 2 ms of packet time and reports when the host
//! forgets it: every batch writes, for each flow in it, the number of its
//! packets in that batch (8 bytes little-endian) into the per-flow byte
//! table `recent` (idle timeout 2 ms, `notify-expired`). When the host
//! expires entries it calls `expired`, which emits one `conformance.expired`
//! event per entry with fields `key` (the 37-byte flow key in hex) and
//! `packets` (the value). Every packet is forwarded.

use sluice_sdk::state::{Bytes, TableSpec, frames, push_frame};
use sluice_sdk::wire::abi::NO_FLOW;
use sluice_sdk::{Batch, Event, Level, NetworkFunction, NfInfo, emit};

struct Expiry {
    recent: Bytes,
}

impl NetworkFunction for Expiry {
    fn init(_config: &[u8]) -> Result<(Self, NfInfo), String> {
        let spec = TableSpec::per_flow_bytes("recent", 8).idle_timeout_ns(2_000_000).notify_expired();
        let recent = Bytes::declare(spec).map_err(|e| format!("{e:?}"))?;
        Ok((Expiry { recent }, NfInfo::stateless()))
    }

    fn process(&mut self, batch: &mut Batch) -> Result<(), String> {
        let mut counts: Vec<(u32, u64)> = Vec::new();
        for p in batch.packets() {
            let flow = u32::from(p.descriptor().flow);
            if flow == u32::from(NO_FLOW) {
                continue;
            }
            match counts.iter_mut().find(|c| c.0 == flow) {
                Some(c) => c.1 += 1,
                None => counts.push((flow, 1)),
            }
        }
        if counts.is_empty() {
            return Ok(());
        }
        let mut entries = Vec::new();
        for (flow, n) in counts {
            push_frame(&mut entries, &flow.to_le_bytes());
            push_frame(&mut entries, &n.to_le_bytes());
        }
        self.recent.put_many(&entries).map_err(|e| format!("{e:?}"))
    }

    fn expired(&mut self, _table: u32, entries: &[u8]) -> Result<(), String> {
        let items: Vec<&[u8]> = frames(entries).collect::<Result<_, _>>().map_err(|i| format!("bad framing at {i}"))?;
        let events = items
            .chunks(2)
            .filter_map(|kv| match kv {
                [key, value] => Some(Event {
                    kind: "conformance.expired".into(),
                    level: Level::Info,
                    packet: None,
                    fields: vec![
                        ("key".into(), key.iter().map(|b| format!("{b:02x}")).collect()),
                        ("packets".into(), (*value).try_into().map(u64::from_le_bytes).unwrap_or(0).to_string()),
                    ],
                }),
                _ => None,
            })
            .collect::<Vec<_>>();
        if !events.is_empty() {
            emit(&events);
        }
        Ok(())
    }
}

sluice_sdk::export_nf!(Expiry);
