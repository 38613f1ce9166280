//! Gives every flow an id from a pool and remembers it per flow: each
//! batch, the flows seen for the first time (no entry in the per-flow byte
//! table `ids`) acquire an id from the release table `pool` (100..1100),
//! bound to the IPv4 source of the flow's first packet in the batch
//! (0.0.0.0 if not IPv4); the id is stored per flow (8 bytes
//! little-endian), read back through `lookup`, and reported as a
//! `conformance.flow` event on that first packet (fields `id`, `host`).
//! A flow whose packet in the batch carries TCP FIN or RST gives its id
//! back (`release`) and loses its entry at the end of the batch. Every
//! packet is forwarded. Calls per batch: get-many, acquire, put-many,
//! lookup, and (with FIN/RST) release and put-many.

use sluice_sdk::state::{Bytes, Pool, TableSpec, frames, push_frame};
use sluice_sdk::wire::abi::NO_FLOW;
use sluice_sdk::{Batch, Event, Level, NetworkFunction, NfInfo, emit};

struct Tables {
    ids: Bytes,
    pool: Pool,
}

fn state_err(e: impl std::fmt::Debug) -> String {
    format!("{e:?}")
}

impl NetworkFunction for Tables {
    fn init(_config: &[u8]) -> Result<(Self, NfInfo), String> {
        let ids = Bytes::declare(TableSpec::per_flow_bytes("ids", 8)).map_err(state_err)?;
        let pool = Pool::declare(TableSpec::pool("pool", 100, 1000, 4)).map_err(state_err)?;
        Ok((Tables { ids, pool }, NfInfo::stateless()))
    }

    fn process(&mut self, batch: &mut Batch) -> Result<(), String> {
        // Distinct flows in order of first appearance, with that packet,
        // and whether any of their packets ends the connection.
        let mut flows: Vec<(u32, usize, [u8; 4], bool)> = Vec::new();
        for (i, p) in batch.packets().enumerate() {
            let flow = u32::from(p.descriptor().flow);
            if flow == u32::from(NO_FLOW) {
                continue;
            }
            let ends = p.tcp().is_some_and(|t| t.fin() || t.rst());
            match flows.iter_mut().find(|f| f.0 == flow) {
                Some(f) => f.3 |= ends,
                None => flows.push((flow, i, p.ipv4().map_or([0; 4], |ip| ip.src()), ends)),
            }
        }
        if flows.is_empty() {
            return Ok(());
        }
        let mut keys = Vec::new();
        for f in &flows {
            push_frame(&mut keys, &f.0.to_le_bytes());
        }
        let known = self.ids.get_many(&keys).map_err(state_err)?;
        let mut id_of: Vec<Option<u64>> = Vec::new();
        let mut fresh = Vec::new();
        for (k, value) in frames(&known).enumerate() {
            let value = value.map_err(|i| format!("bad framing at {i}"))?;
            id_of.push(value.try_into().ok().map(u64::from_le_bytes));
            if value.is_empty() {
                fresh.push(k);
            }
        }
        if !fresh.is_empty() {
            let mut values = Vec::new();
            for &k in &fresh {
                push_frame(&mut values, &flows[k].2);
            }
            let ids = self.pool.acquire(&values).map_err(state_err)?;
            let mut entries = Vec::new();
            for (&k, &id) in fresh.iter().zip(&ids) {
                push_frame(&mut entries, &flows[k].0.to_le_bytes());
                push_frame(&mut entries, &id.to_le_bytes());
                id_of[k] = Some(id);
            }
            self.ids.put_many(&entries).map_err(state_err)?;
            let bound = self.pool.lookup(&ids).map_err(state_err)?;
            let mut events = Vec::new();
            for ((&k, &id), host) in fresh.iter().zip(&ids).zip(frames(&bound)) {
                let host = host.map_err(|i| format!("bad framing at {i}"))?;
                let host = match host {
                    [a, b, c, d] => format!("{a}.{b}.{c}.{d}"),
                    _ => "none".to_string(),
                };
                events.push(Event {
                    kind: "conformance.flow".into(),
                    level: Level::Info,
                    packet: Some(flows[k].1 as u32),
                    fields: vec![("id".into(), id.to_string()), ("host".into(), host)],
                });
            }
            emit(&events);
        }
        let mut done = Vec::new();
        let mut removals = Vec::new();
        for (k, f) in flows.iter().enumerate() {
            if let (true, Some(id)) = (f.3, id_of[k]) {
                done.push(id);
                push_frame(&mut removals, &f.0.to_le_bytes());
                push_frame(&mut removals, &[]);
            }
        }
        if !done.is_empty() {
            self.pool.release(&done).map_err(state_err)?;
            self.ids.put_many(&removals).map_err(state_err)?;
        }
        Ok(())
    }
}

sluice_sdk::export_nf!(Tables);
