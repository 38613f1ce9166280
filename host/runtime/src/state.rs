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

/// Per-flow state of one NF on one worker, keyed by normalized flow key.
#[derive(Debug)]
pub struct FlowTable {
    entries: HashMap<FlowKey, FlowEntry>,
    idle_timeout_ns: u64,
    capacity: usize,
    /// Packet time of the last expiry sweep.
    last_sweep_ns: u64,
    expired: u64,
}

impl FlowTable {
    /// An empty table.
    pub fn new(idle_timeout_ns: u64, capacity: usize) -> Self {
        FlowTable { entries: HashMap::default(), idle_timeout_ns, capacity, last_sweep_ns: 0, expired: 0 }
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
            self.entries.remove(key);
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

    /// Stores a new value. Returns `false` (and stores nothing) if the table
    /// is full and the flow is new.
    pub fn set(&mut self, key: FlowKey, value: Vec<u8>, now_ns: u64) -> bool {
        match self.entries.get_mut(&key) {
            Some(e) => {
                e.value = value;
                e.last_seen_ns = e.last_seen_ns.max(now_ns);
                e.clock += 1;
                true
            }
            None => {
                if self.entries.len() >= self.capacity {
                    return false;
                }
                self.entries.insert(key, FlowEntry { value, last_seen_ns: now_ns, clock: 1 });
                true
            }
        }
    }

    /// Forgets a flow.
    pub fn remove(&mut self, key: &FlowKey) {
        self.entries.remove(key);
    }

    /// Reads a flow's entry without taking it.
    pub fn get(&self, key: &FlowKey) -> Option<&FlowEntry> {
        self.entries.get(key)
    }

    /// Forgets every flow idle for longer than the timeout at packet time
    /// `now_ns`. Cheap to call per batch: it sweeps at most once per
    /// timeout/4 of packet time.
    pub fn expire(&mut self, now_ns: u64) {
        if self.idle_timeout_ns == 0 || now_ns.saturating_sub(self.last_sweep_ns) < self.idle_timeout_ns / 4 {
            return;
        }
        self.last_sweep_ns = now_ns;
        let timeout = self.idle_timeout_ns;
        let before = self.entries.len();
        self.entries.retain(|_, e| now_ns.saturating_sub(e.last_seen_ns) <= timeout);
        self.expired += (before - self.entries.len()) as u64;
    }

    /// The keys of every flow with state (e.g. to export them all).
    pub fn keys(&self) -> impl Iterator<Item = &FlowKey> {
        self.entries.keys()
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
        if let Some(e) = self.entries.get_mut(&f.key) {
            if f.clock <= e.clock {
                return Err(ImportError::Stale { key: f.key, imported: f.clock, local: e.clock });
            }
            *e = FlowEntry { value: f.value, last_seen_ns: f.last_seen_ns, clock: f.clock };
            return Ok(());
        }
        if self.entries.len() >= self.capacity {
            return Err(ImportError::Full { capacity: self.capacity });
        }
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
        assert!(t.set(k(1), vec![7], 0));
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
        t.set(k(1), vec![1], 0);
        t.set(k(2), vec![2], 90);
        t.expire(150);
        assert!(t.get(&k(1)).is_none());
        assert!(t.get(&k(2)).is_some());
        assert!(!t.read_into(&k(2), 500, &mut Vec::new()));
        assert_eq!(t.expired(), 2);
    }

    #[test]
    fn capacity_is_enforced() {
        let mut t = FlowTable::new(0, 1);
        assert!(t.set(k(1), vec![1], 0));
        assert!(!t.set(k(2), vec![2], 0));
        assert!(t.set(k(1), vec![3], 0));
    }

    #[test]
    fn stale_imports_are_refused() {
        let mut a = FlowTable::new(0, 10);
        a.set(k(1), vec![1], 0);
        a.set(k(1), vec![2], 0);
        let exported = a.export(&k(1)).unwrap();
        assert_eq!(exported.clock, 2);
        let mut b = FlowTable::new(0, 10);
        b.import(exported.clone()).unwrap();
        assert!(matches!(b.import(exported), Err(ImportError::Stale { .. })));
        assert_eq!(b.get(&k(1)).unwrap().value, vec![2]);
    }
}
