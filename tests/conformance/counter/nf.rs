//! Forwards every packet and counts packets and bytes on the wire in the
//! host table `totals` (key 0: packets, key 1: bytes), one `counter-add`
//! per batch.

use sluice_sdk::state::{Counters, Merge, TableSpec};
use sluice_sdk::{Batch, NetworkFunction, NfInfo};

struct Counter {
    totals: Counters,
}

impl NetworkFunction for Counter {
    fn init(_config: &[u8]) -> Result<(Self, NfInfo), String> {
        let totals = Counters::declare(TableSpec::eventual_counter("totals", Merge::Sum, 0))
            .map_err(|e| format!("declaring totals: {e:?}"))?;
        Ok((Counter { totals }, NfInfo::stateless()))
    }

    fn process(&mut self, batch: &mut Batch) -> Result<(), String> {
        let bytes: u64 = batch.packets().map(|p| u64::from(p.wire_len())).sum();
        let deltas = [batch.len() as i64, bytes as i64];
        self.totals.add(&[0, 1], &deltas).map_err(|e| format!("counting: {e:?}"))
    }
}

sluice_sdk::export_nf!(Counter);
