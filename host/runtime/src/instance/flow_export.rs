//! Moving one flow's state between hosts: what an instance holds for a
//! flow ([`FlowExport`]), its logical clock, the flows whose state
//! changed, and the import of another host's export.

use super::NfInstance;
use crate::flow_state::{ExportedFlow, ImportError};

/// One flow's state as it leaves a worker for another host (SNF §5.3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowExport {
    /// The normalized flow key.
    pub key: sluice_wire::FlowKey,
    /// Flow-state bytes with their logical clock, if any.
    pub flow: Option<ExportedFlow>,
    /// Entries of per-flow tables, each with its logical clock.
    pub tables: Vec<sluice_state::FlowTableEntry>,
}

impl NfInstance {
    /// Everything this worker holds for one flow: its flow-state bytes and
    /// logical clock, and its entries in per-flow tables. `None` if none.
    pub fn export_flow(&self, key: &sluice_wire::FlowKey) -> Option<FlowExport> {
        let key = key.normalized();
        let flow = self.table.export(&key);
        let tables = self.tables.as_deref().map(|t| t.export_flow(&key)).unwrap_or_default();
        if flow.is_none() && tables.is_empty() {
            return None;
        }
        Some(FlowExport { key, flow, tables })
    }

    /// Starts noting the flows whose state changes here (flow-state bytes
    /// and per-flow table entries): a host in a group replicates those.
    pub fn track_flow_changes(&mut self) {
        if !self.table.tracking_changes() {
            self.table.track_changes();
            if let Some(t) = self.tables.as_deref_mut() {
                t.track_flow_changes();
            }
        }
    }

    /// Appends the (normalized) flows whose state changed since the last
    /// call; `false` if too many changed to note (any may have).
    pub fn take_flow_changes(&mut self, out: &mut Vec<sluice_wire::FlowKey>) -> bool {
        let a = self.table.take_changes(out);
        let b = self.tables.as_deref_mut().is_none_or(|t| t.take_flow_changes(out));
        a && b
    }

    /// Starts noting the pool resources this instance binds or releases
    /// (output commit sends their bindings before its packets leave).
    pub fn track_pool_changes(&mut self) {
        if let Some(t) = self.tables.as_deref_mut() {
            t.track_pool_changes();
        }
    }

    /// Appends, per pool, the resources bound or released since the last
    /// call with their bindings now (`None`: free).
    pub fn take_pool_changes(&mut self, out: &mut Vec<(String, Vec<sluice_state::PoolChange>)>) {
        if let Some(t) = self.tables.as_deref_mut() {
            t.take_pool_changes(out);
        }
    }

    /// Notes resources of pool `pool` as changed again, for the next
    /// [`take_pool_changes`](Self::take_pool_changes).
    pub fn renote_pool_changes(&mut self, pool: &str, resources: &[u64]) {
        if let Some(t) = self.tables.as_deref_mut() {
            t.renote_pool_changes(pool, resources);
        }
    }

    /// The sum of the logical clocks of everything this worker holds for
    /// one (normalized) flow, and whether it holds anything: a cheap test
    /// of whether the flow's state changed since it was last exported.
    pub fn flow_clock(&self, key: &sluice_wire::FlowKey) -> Option<u64> {
        let flow = self.table.get(key).map(|e| e.clock);
        let tables = self.tables.as_deref().map_or(0, |t| t.flow_clock(key));
        if flow.is_none() && tables == 0 {
            return None;
        }
        Some(flow.unwrap_or(0).wrapping_add(tables))
    }

    /// Imports a flow exported by [`export_flow`](Self::export_flow) on
    /// another host. Parts whose logical clock is not newer than the local
    /// one are stale and refused; the flow-state part's refusal is the
    /// error, table entries are skipped individually.
    pub fn import_flow(&mut self, f: FlowExport) -> Result<(), ImportError> {
        if let Some(t) = self.tables.as_deref_mut() {
            t.import_flow(f.key, &f.tables);
        }
        match f.flow {
            Some(flow) => self.table.import(flow),
            None => Ok(()),
        }
    }
}
