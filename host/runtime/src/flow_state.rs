//! Host-owned per-flow state of one NF on one worker.
//!
//! The NF never holds this memory: the host copies each flow's bytes into
//! the batch and takes changes back, so state survives a trap, a
//! re-instantiation and (later) a version swap, and can be exported per flow
//! to move it between hosts. Each entry carries a logical clock that counts
//! its updates; an import with an older clock than the local entry is stale
//! and refused (SNF §5.3), which is what makes replays of peer state safe.

use sluice_wire::FlowKey;
/// Flow keys come off the wire, so the maps are seeded per process (no
/// hash flooding), with foldhash rather than SipHash for speed.
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// One flow's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowEntry {
    /// The NF's bytes.
    pub value: Vec<u8>,
    /// Packet time (ns) of the last packet of the flow.
    pub last_seen_ns: u64,
    /// Number of updates so far: a per-flow logical clock.
    pub clock: u64,
}

/// A flow's state as exported for another host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportedFlow {
    /// The normalized key.
    pub key: FlowKey,
    /// The state bytes.
    pub value: Vec<u8>,
    /// Its logical clock.
    pub clock: u64,
    /// Packet time of its last packet.
    pub last_seen_ns: u64,
}

/// Why an import was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImportError {
    /// The local entry is as new or newer.
    #[error("stale flow state for {key}: imported clock {imported} <= local clock {local}")]
    Stale {
        /// Flow.
        key: FlowKey,
        /// Clock of the import.
        imported: u64,
        /// Clock held locally.
        local: u64,
    },
    /// The table is at capacity.
    #[error("flow table full ({capacity} flows); raise max-flows or lower the idle timeout")]
    Full {
        /// Capacity.
        capacity: usize,
    },
}

/// What one flow's entry costs besides its value (key, clocks, hash slot),
/// charged to the instance's state budget.
pub const FLOW_ENTRY_OVERHEAD: usize = 96;

fn cost(value: &[u8]) -> usize {
    value.len() + FLOW_ENTRY_OVERHEAD
}

/// Per-flow state of one NF on one worker, keyed by normalized flow key.
#[derive(Debug)]
pub struct FlowTable {
    entries: HashMap<FlowKey, FlowEntry>,
    idle_timeout_ns: u64,
    capacity: usize,
    /// Bytes held: values plus [`FLOW_ENTRY_OVERHEAD`] per flow.
    bytes: usize,
    /// Packet time of the last expiry sweep.
    last_sweep_ns: u64,
    expired: u64,
    /// Flows whose state changed (a host in a group).
    changes: sluice_state::FlowChanges,
}

impl FlowTable {
    /// An empty table.
    pub fn new(idle_timeout_ns: u64, capacity: usize) -> Self {
        FlowTable {
            entries: HashMap::default(),
            idle_timeout_ns,
            capacity,
            bytes: 0,
            last_sweep_ns: 0,
            expired: 0,
            changes: sluice_state::FlowChanges::default(),
        }
    }

    /// Bytes held (values and per-flow overhead).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Changes the idle timeout (the NF says it in `init`).
    pub fn set_idle_timeout_ns(&mut self, ns: u64) {
        self.idle_timeout_ns = ns;
    }

    /// Changes the capacity (a new NF version may allow more or fewer
    /// flows; existing flows are kept either way).
    pub fn set_capacity(&mut self, capacity: usize) {
        self.capacity = capacity;
    }

    /// Number of flows with state.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no flow has state.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Flows forgotten because they idled out.
    pub fn expired(&self) -> u64 {
        self.expired
    }

    /// Appends a flow's value to `out` for a batch and returns whether it
    /// had one. An entry idle for longer than the timeout is forgotten
    /// instead.
    pub fn read_into(&mut self, key: &FlowKey, now_ns: u64, out: &mut Vec<u8>) -> bool {
        let Some(e) = self.entries.get(key) else { return false };
        if self.idle_timeout_ns > 0 && now_ns.saturating_sub(e.last_seen_ns) > self.idle_timeout_ns {
            self.remove(key);
            self.expired += 1;
            return false;
        }
        out.extend_from_slice(&e.value);
        true
    }

    /// Records that a flow was seen at packet time `now_ns`.
    pub fn touch(&mut self, key: &FlowKey, now_ns: u64) {
        if let Some(e) = self.entries.get_mut(key) {
            e.last_seen_ns = e.last_seen_ns.max(now_ns);
        }
    }

    /// Stores a new value if the table would then hold at most `budget`
    /// bytes. Returns `false` (and stores nothing) if it would not, or if
    /// the table is full and the flow is new.
    pub fn set(&mut self, key: FlowKey, value: Vec<u8>, now_ns: u64, budget: usize) -> bool {
        self.changes.note(&key);
        let old = self.entries.get(&key).map_or(0, |e| cost(&e.value));
        let held = self.bytes.saturating_sub(old).saturating_add(cost(&value));
        if held > budget && held > self.bytes {
            return false;
        }
        match self.entries.get_mut(&key) {
            Some(e) => {
                e.value = value;
                e.last_seen_ns = e.last_seen_ns.max(now_ns);
                e.clock += 1;
            }
            None => {
                if self.entries.len() >= self.capacity {
                    return false;
                }
                self.entries.insert(key, FlowEntry { value, last_seen_ns: now_ns, clock: 1 });
            }
        }
        self.bytes = held;
        true
    }

    /// Forgets a flow.
    pub fn remove(&mut self, key: &FlowKey) {
        if let Some(e) = self.entries.remove(key) {
            self.changes.note(key);
            self.bytes = self.bytes.saturating_sub(cost(&e.value));
        }
    }

    /// Reads a flow's entry without taking it.
    pub fn get(&self, key: &FlowKey) -> Option<&FlowEntry> {
        self.entries.get(key)
    }

    /// Forgets every flow idle for longer than the timeout at packet time
    /// `now_ns`. Cheap to call per batch: it sweeps at most once per
    /// timeout/4 of packet time.
    pub fn expire(&mut self, now_ns: u64) {
        self.expire_live(now_ns, &|_| None);
    }

    /// [`expire`](Self::expire), where `live` gives, for a flow that looks
    /// idle, the packet time of the last packet that passed under one of
    /// its offload entries, if one lives: the flow was seen then (a flow
    /// is not touched for every packet under its entry).
    pub fn expire_live(&mut self, now_ns: u64, live: &dyn Fn(&FlowKey) -> Option<u64>) {
        if self.idle_timeout_ns == 0 || now_ns.saturating_sub(self.last_sweep_ns) < self.idle_timeout_ns / 4 {
            return;
        }
        self.last_sweep_ns = now_ns;
        let timeout = self.idle_timeout_ns;
        let before = self.entries.len();
        let mut freed = 0usize;
        let changes = &mut self.changes;
        self.entries.retain(|k, e| {
            if now_ns.saturating_sub(e.last_seen_ns) > timeout
                && let Some(t) = live(k)
            {
                e.last_seen_ns = e.last_seen_ns.max(t);
            }
            let keep = now_ns.saturating_sub(e.last_seen_ns) <= timeout;
            if !keep {
                freed += cost(&e.value);
                changes.note(k);
            }
            keep
        });
        self.bytes = self.bytes.saturating_sub(freed);
        self.expired += (before - self.entries.len()) as u64;
    }

    /// The keys of every flow with state (e.g. to export them all).
    pub fn keys(&self) -> impl Iterator<Item = &FlowKey> {
        self.entries.keys()
    }

    /// Starts noting the flows whose state changes (set, forgotten,
    /// idled out or imported), for [`take_changes`](Self::take_changes).
    pub fn track_changes(&mut self) {
        self.changes.track();
    }

    /// Whether changes are noted.
    pub fn tracking_changes(&self) -> bool {
        self.changes.tracking()
    }

    /// Appends the flows whose state changed since the last call; `false`
    /// if too many changed to note (any may have).
    pub fn take_changes(&mut self, out: &mut Vec<FlowKey>) -> bool {
        self.changes.take(out)
    }

    /// Exports one flow's state and clock.
    pub fn export(&self, key: &FlowKey) -> Option<ExportedFlow> {
        self.entries.get(key).map(|e| ExportedFlow {
            key: *key,
            value: e.value.clone(),
            clock: e.clock,
            last_seen_ns: e.last_seen_ns,
        })
    }

    /// Imports one flow's state; refused if the local clock is as new.
    pub fn import(&mut self, f: ExportedFlow) -> Result<(), ImportError> {
        // Imported state is sent on to this host's next owner.
        self.changes.note(&f.key);
        if let Some(e) = self.entries.get_mut(&f.key) {
            if f.clock <= e.clock {
                return Err(ImportError::Stale { key: f.key, imported: f.clock, local: e.clock });
            }
            self.bytes = self.bytes.saturating_sub(cost(&e.value)).saturating_add(cost(&f.value));
            *e = FlowEntry { value: f.value, last_seen_ns: f.last_seen_ns, clock: f.clock };
            return Ok(());
        }
        if self.entries.len() >= self.capacity {
            return Err(ImportError::Full { capacity: self.capacity });
        }
        self.bytes = self.bytes.saturating_add(cost(&f.value));
        self.entries.insert(f.key, FlowEntry { value: f.value, last_seen_ns: f.last_seen_ns, clock: f.clock });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_wire::IpAddr128;

    fn k(n: u8) -> FlowKey {
        FlowKey {
            src: IpAddr128::from_v4([10, 0, 0, n]),
            dst: IpAddr128::from_v4([10, 0, 1, 1]),
            src_port: 1,
            dst_port: 2,
            protocol: 6,
        }
    }

    #[test]
    fn read_appends_and_touch_refreshes() {
        let mut t = FlowTable::new(100, 10);
        assert!(t.set(k(1), vec![7], 0, usize::MAX));
        let mut out = vec![1];
        assert!(t.read_into(&k(1), 50, &mut out));
        assert_eq!(out, vec![1, 7]);
        t.touch(&k(1), 90);
        assert!(t.read_into(&k(1), 180, &mut out));
        assert!(!t.read_into(&k(2), 180, &mut out));
    }

    #[test]
    fn idle_entries_expire() {
        let mut t = FlowTable::new(100, 10);
        t.set(k(1), vec![1], 0, usize::MAX);
        t.set(k(2), vec![2], 90, usize::MAX);
        t.expire(150);
        assert!(t.get(&k(1)).is_none());
        assert!(t.get(&k(2)).is_some());
        assert!(!t.read_into(&k(2), 500, &mut Vec::new()));
        assert_eq!(t.expired(), 2);
    }

    #[test]
    fn the_budget_bounds_bytes_held() {
        let per = FLOW_ENTRY_OVERHEAD + 100;
        let mut t = FlowTable::new(0, 10);
        assert!(t.set(k(1), vec![0; 100], 0, 2 * per));
        assert!(t.set(k(2), vec![0; 100], 0, 2 * per));
        assert!(!t.set(k(3), vec![0; 100], 0, 2 * per), "over budget");
        // Growing an existing flow past it is refused, shrinking is not.
        assert!(!t.set(k(1), vec![0; 101], 0, 2 * per));
        assert!(t.set(k(1), vec![0; 10], 0, 2 * per));
        assert_eq!(t.bytes(), 2 * FLOW_ENTRY_OVERHEAD + 110);
        t.remove(&k(2));
        assert_eq!(t.bytes(), FLOW_ENTRY_OVERHEAD + 10);
        assert!(t.set(k(3), vec![0; 100], 0, 2 * per));
    }

    #[test]
    fn capacity_is_enforced() {
        let mut t = FlowTable::new(0, 1);
        assert!(t.set(k(1), vec![1], 0, usize::MAX));
        assert!(!t.set(k(2), vec![2], 0, usize::MAX));
        assert!(t.set(k(1), vec![3], 0, usize::MAX));
    }

    #[test]
    fn stale_imports_are_refused() {
        let mut a = FlowTable::new(0, 10);
        a.set(k(1), vec![1], 0, usize::MAX);
        a.set(k(1), vec![2], 0, usize::MAX);
        let exported = a.export(&k(1)).unwrap();
        assert_eq!(exported.clock, 2);
        let mut b = FlowTable::new(0, 10);
        b.import(exported.clone()).unwrap();
        assert!(matches!(b.import(exported), Err(ImportError::Stale { .. })));
        assert_eq!(b.get(&k(1)).unwrap().value, vec![2]);
    }
}
