//! Moving a flow's per-flow table entries between hosts: export, import
//! by logical clock, and the flows whose entries changed.

use super::store::{Slot, Store};
use super::{FlowTableEntry, Tables};
use sluice_wire::FlowKey;

impl Tables {
    /// A flow's entries in every per-flow table, for moving the flow to
    /// another host.
    pub fn export_flow(&self, flow: &FlowKey) -> Vec<FlowTableEntry> {
        let mut out = Vec::new();
        for t in &self.tables {
            let entry = match &t.store {
                Store::FlowCounters(m) => m.get(flow).map(|s| (s.value.to_le_bytes().to_vec(), s.clock)),
                Store::FlowBytes(m) => m.get(flow).map(|s| (s.value.clone(), s.clock)),
                _ => None,
            };
            if let Some((value, clock)) = entry {
                out.push(FlowTableEntry { table: t.spec.name.clone(), value, clock });
            }
        }
        out
    }

    /// The sum of the clocks of a flow's per-flow table entries (0: none):
    /// it changes whenever one of them is written.
    pub fn flow_clock(&self, flow: &FlowKey) -> u64 {
        let mut sum = 0u64;
        for t in &self.tables {
            let clock = match &t.store {
                Store::FlowCounters(m) => m.get(flow).map(|s| s.clock),
                Store::FlowBytes(m) => m.get(flow).map(|s| s.clock),
                _ => None,
            };
            sum = sum.wrapping_add(clock.unwrap_or(0));
        }
        sum
    }

    /// Starts noting the flows whose per-flow entries change (written,
    /// imported or idled out), for [`take_flow_changes`](Self::take_flow_changes).
    pub fn track_flow_changes(&mut self) {
        self.changes.track();
    }

    /// Appends the flows whose per-flow entries changed since the last
    /// call; `false` if too many changed to note (any may have).
    pub fn take_flow_changes(&mut self, out: &mut Vec<FlowKey>) -> bool {
        self.changes.take(out)
    }

    /// Imports a flow's per-flow table entries. An entry whose clock is not
    /// newer than the local one is stale and skipped; returns how many
    /// were imported. Entries of unknown tables are skipped too.
    pub fn import_flow(&mut self, flow: FlowKey, entries: &[FlowTableEntry]) -> usize {
        let now = self.now_ns;
        let mut n = 0;
        // Imported state is sent on to this host's next owner.
        self.changes.note(&flow);
        for e in entries {
            let Some(t) = self.tables.iter_mut().find(|t| t.spec.name == e.table) else { continue };
            match &mut t.store {
                Store::FlowCounters(m) => {
                    let Ok(b) = <[u8; 8]>::try_from(e.value.as_slice()) else { continue };
                    if m.get(&flow).is_some_and(|s| s.clock >= e.clock) {
                        continue;
                    }
                    m.insert(flow, Slot { value: u64::from_le_bytes(b), last_ns: now, clock: e.clock });
                    n += 1;
                }
                Store::FlowBytes(m) => {
                    if m.get(&flow).is_some_and(|s| s.clock >= e.clock) {
                        continue;
                    }
                    m.insert(flow, Slot { value: e.value.clone(), last_ns: now, clock: e.clock });
                    n += 1;
                }
                _ => {}
            }
        }
        self.recount();
        n
    }
}
