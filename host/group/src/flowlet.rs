//! Flowlets (SNF §4.1): a flow's packets are sent to one host until the
//! flow has been idle for longer than the flowlet gap δ; only then may the
//! next packet start a new *flowlet* on another host. With δ above the
//! largest difference in delay between the paths to two hosts, a move never
//! reorders a flow's packets.
//!
//! [`Flowlets`] tracks the flows of one dispatcher worker (workers split
//! flows by symmetric hash, so each flow has one tracker). The table it
//! steers by is a [`Route`]: each slot's owner as an index into the
//! dispatcher's host list, and which hosts may still finish flowlets. A
//! flowlet on a host that is gone (not in the table, not draining) moves at
//! once: its packets could only be lost there.

use std::collections::HashMap;
use std::hash::Hash;

/// Marks "no host" in a [`Route`].
pub const NO_HOST: u16 = u16::MAX;

/// One ownership table as a dispatcher steers by it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The table version.
    pub version: u64,
    /// Per slot, the owner's index in the dispatcher's host list
    /// ([`NO_HOST`]: none the dispatcher can reach).
    pub owners: Vec<u16>,
    /// Per slot, the next owner's index ([`NO_HOST`]: none): where the
    /// slot's flows go while the owner's link is down, as they will in the
    /// table without it.
    pub nexts: Vec<u16>,
    /// Per host index: whether it may receive packets (an owner, or a
    /// member finishing its flowlets: draining or standing by).
    pub up: Vec<bool>,
}

impl Route {
    /// A route that owns nothing.
    pub fn empty() -> Self {
        Route { version: 0, owners: Vec::new(), nexts: Vec::new(), up: Vec::new() }
    }

    /// The route of `table` for a dispatcher that reaches `hosts` (by id,
    /// in the dispatcher's order).
    pub fn of(table: &crate::OwnershipTable, hosts: &[String]) -> Self {
        let index = |h: &str| hosts.iter().position(|x| x == h).and_then(|i| u16::try_from(i).ok());
        let owners = (0..table.slots()).map(|s| table.owner_of_slot(s).and_then(index).unwrap_or(NO_HOST)).collect();
        let nexts =
            (0..table.slots()).map(|s| table.preferences(s).nth(1).and_then(index).unwrap_or(NO_HOST)).collect();
        let up = hosts
            .iter()
            .map(|h| table.members().iter().any(|m| &m.host == h) || table.finishing().iter().any(|f| f == h))
            .collect();
        Route { version: table.version(), owners, nexts, up }
    }

    /// The owner of a flow by its symmetric hash, if reachable.
    pub fn owner(&self, flow_hash: u64) -> Option<u16> {
        self.owner_avoiding(flow_hash, &[])
    }

    /// The owner of a flow, or its next owner when the owner's link is
    /// down (`down[host]`), if reachable.
    pub fn owner_avoiding(&self, flow_hash: u64, down: &[bool]) -> Option<u16> {
        if self.owners.is_empty() {
            return None;
        }
        let slot = ((u128::from(flow_hash) * self.owners.len() as u128) >> 64) as usize;
        let is_down = |h: u16| down.get(usize::from(h)).copied().unwrap_or(false);
        let owner = self.owners.get(slot).copied().filter(|&h| h != NO_HOST);
        match owner {
            Some(h) if is_down(h) => self.nexts.get(slot).copied().filter(|&n| n != NO_HOST && !is_down(n)),
            other => other,
        }
    }

    /// Whether host `host` (index in the dispatcher's host list) may
    /// receive packets.
    pub fn is_up(&self, host: u16) -> bool {
        self.up.get(usize::from(host)).copied().unwrap_or(false)
    }
}

/// Where one packet goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Steer {
    /// Host index.
    pub host: u16,
    /// The packet starts a flowlet (a new flow, or after a gap).
    pub new_flowlet: bool,
    /// The flow's previous flowlet ran on this other host: its state is
    /// there (or on the hosts it was replicated to).
    pub moved_from: Option<u16>,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    host: u16,
    last_ns: u64,
}

/// Counters of a tracker.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct FlowletCounters {
    /// Flowlets started (new flows included).
    pub flowlets: u64,
    /// Flowlets that started on another host than the flow's previous one.
    pub moved: u64,
    /// Of those, moved because their host was gone (mid-flowlet).
    pub moved_from_gone: u64,
    /// Packets steered without tracking (the tracker was full).
    pub untracked: u64,
    /// Flows forgotten after `remember` without packets.
    pub forgotten: u64,
}

/// The flows of one worker.
#[derive(Debug)]
pub struct Flowlets<K> {
    gap_ns: u64,
    remember_ns: u64,
    capacity: usize,
    flows: HashMap<K, Entry, foldhash::fast::RandomState>,
    since_sweep: u32,
    counters: FlowletCounters,
}

/// Packets between sweeps of flows idle past `remember`.
const SWEEP_EVERY: u32 = 1 << 16;

impl<K: Hash + Eq> Flowlets<K> {
    /// A tracker with flowlet gap `gap_ns`, remembering a flow's host for
    /// `remember_ns` without packets (so a later flowlet knows where it
    /// was), holding at most `capacity` flows.
    pub fn new(gap_ns: u64, remember_ns: u64, capacity: usize) -> Self {
        Flowlets {
            gap_ns,
            remember_ns: remember_ns.max(gap_ns),
            capacity: capacity.max(1),
            flows: HashMap::with_hasher(foldhash::fast::RandomState::default()),
            since_sweep: 0,
            counters: FlowletCounters::default(),
        }
    }

    /// Counters so far.
    pub fn counters(&self) -> FlowletCounters {
        self.counters
    }

    /// Flows tracked.
    pub fn len(&self) -> usize {
        self.flows.len()
    }

    /// Whether no flow is tracked.
    pub fn is_empty(&self) -> bool {
        self.flows.is_empty()
    }

    /// Steers a packet of flow `key` (hash `flow_hash`) seen at `now_ns`
    /// (a monotonic clock). `None`: the route has no reachable owner for
    /// it.
    pub fn steer(&mut self, key: K, flow_hash: u64, now_ns: u64, route: &Route) -> Option<Steer> {
        self.steer_avoiding(key, flow_hash, now_ns, route, &[])
    }

    /// [`steer`](Self::steer) while the links to some hosts are down
    /// (`down[host]`): their flowlets move at once, to the slot's next
    /// owner, which holds the state their owner replicated.
    pub fn steer_avoiding(
        &mut self,
        key: K,
        flow_hash: u64,
        now_ns: u64,
        route: &Route,
        down: &[bool],
    ) -> Option<Steer> {
        self.since_sweep += 1;
        if self.since_sweep >= SWEEP_EVERY {
            self.sweep(now_ns);
        }
        if let Some(e) = self.flows.get_mut(&key) {
            let idle = now_ns.saturating_sub(e.last_ns);
            let up = route.is_up(e.host) && !down.get(usize::from(e.host)).copied().unwrap_or(false);
            if idle <= self.gap_ns && up {
                e.last_ns = now_ns;
                return Some(Steer { host: e.host, new_flowlet: false, moved_from: None });
            }
            let to = route.owner_avoiding(flow_hash, down)?;
            let from = e.host;
            e.host = to;
            e.last_ns = now_ns;
            self.counters.flowlets += 1;
            let moved_from = (from != to).then_some(from);
            if moved_from.is_some() {
                self.counters.moved += 1;
                if !up && idle <= self.gap_ns {
                    self.counters.moved_from_gone += 1;
                }
            }
            return Some(Steer { host: to, new_flowlet: true, moved_from });
        }
        let to = route.owner_avoiding(flow_hash, down)?;
        self.counters.flowlets += 1;
        if self.flows.len() >= self.capacity {
            self.sweep(now_ns);
        }
        if self.flows.len() < self.capacity {
            self.flows.insert(key, Entry { host: to, last_ns: now_ns });
        } else {
            self.counters.untracked += 1;
        }
        Some(Steer { host: to, new_flowlet: true, moved_from: None })
    }

    /// Forgets flows idle past `remember` (or, when still full, past the
    /// gap: their next packet starts a flowlet anyway).
    fn sweep(&mut self, now_ns: u64) {
        self.since_sweep = 0;
        let before = self.flows.len();
        let keep = self.remember_ns;
        self.flows.retain(|_, e| now_ns.saturating_sub(e.last_ns) <= keep);
        if self.flows.len() >= self.capacity {
            let gap = self.gap_ns;
            self.flows.retain(|_, e| now_ns.saturating_sub(e.last_ns) <= gap);
        }
        self.counters.forgotten += (before - self.flows.len()) as u64;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;
    use crate::{Member, OwnershipTable};

    fn hosts() -> Vec<String> {
        ["h1", "h2", "h3"].iter().map(|s| s.to_string()).collect()
    }

    fn table(active: &[&str], finishing: &[&str], version: u64) -> OwnershipTable {
        let m: Vec<Member> = active.iter().map(|h| Member { host: h.to_string(), weight: 1 }).collect();
        let f: Vec<String> = finishing.iter().map(|s| s.to_string()).collect();
        OwnershipTable::build("g", version, 0, &m, 1021, 2).unwrap().with_finishing(&f)
    }

    const GAP: u64 = 1_000_000;

    #[test]
    fn a_flow_stays_on_its_host_within_a_flowlet_and_moves_only_after_a_gap() {
        let hs = hosts();
        let all = Route::of(&table(&["h1", "h2", "h3"], &[], 1), &hs);
        // A flow owned by h2 in the first table.
        let hash = (0..u64::MAX).step_by(1 << 40).find(|h| all.owner(*h) == Some(1)).unwrap();
        let mut f = Flowlets::new(GAP, 10 * GAP, 16);
        assert_eq!(f.steer(7u32, hash, 0, &all), Some(Steer { host: 1, new_flowlet: true, moved_from: None }));
        // h2 drained: it finishes its flowlet.
        let drained = Route::of(&table(&["h1", "h3"], &["h2"], 2), &hs);
        let to = drained.owner(hash).unwrap();
        assert_ne!(to, 1);
        assert_eq!(f.steer(7, hash, GAP / 2, &drained).unwrap().host, 1);
        assert_eq!(f.steer(7, hash, GAP, &drained).unwrap().host, 1);
        // After a gap the next flowlet goes to the new owner, saying where
        // the flow was.
        let s = f.steer(7, hash, 2 * GAP + 1, &drained).unwrap();
        assert_eq!(s, Steer { host: to, new_flowlet: true, moved_from: Some(1) });
        assert_eq!(f.counters().moved, 1);
        assert_eq!(f.counters().moved_from_gone, 0);
    }

    #[test]
    fn a_flowlet_on_a_gone_host_moves_at_once() {
        let hs = hosts();
        let all = Route::of(&table(&["h1", "h2", "h3"], &[], 1), &hs);
        let hash = (0..u64::MAX).step_by(1 << 40).find(|h| all.owner(*h) == Some(2)).unwrap();
        let mut f = Flowlets::new(GAP, 10 * GAP, 16);
        f.steer(1u8, hash, 0, &all);
        let without = Route::of(&table(&["h1", "h2"], &[], 2), &hs);
        let s = f.steer(1, hash, 10, &without).unwrap();
        assert!(s.new_flowlet && s.moved_from == Some(2) && s.host != 2, "{s:?}");
        assert_eq!(f.counters().moved_from_gone, 1);
    }

    #[test]
    fn the_tracker_stays_bounded() {
        let hs = hosts();
        let all = Route::of(&table(&["h1", "h2", "h3"], &[], 1), &hs);
        let mut f = Flowlets::new(GAP, 10 * GAP, 4);
        for k in 0..8u64 {
            assert!(f.steer(k, k.wrapping_mul(0x9e37_79b9_7f4a_7c15), 0, &all).is_some());
        }
        assert_eq!(f.len(), 4);
        assert_eq!(f.counters().untracked, 4);
        // Once they are idle past the gap, new flows take their places.
        assert!(f.steer(100, 5, 2 * GAP, &all).is_some());
        assert_eq!(f.len(), 1);
        assert_eq!(f.counters().forgotten, 4);
    }

    #[test]
    fn unreachable_owners_and_empty_routes_steer_nowhere() {
        let only = vec!["h9".to_string()];
        let r = Route::of(&table(&["h1"], &[], 1), &only);
        let mut f = Flowlets::new(GAP, GAP, 4);
        assert_eq!(f.steer(1u8, 42, 0, &r), None);
        assert_eq!(f.steer(1u8, 42, 0, &Route::empty()), None);
    }
}
