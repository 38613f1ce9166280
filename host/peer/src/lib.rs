//! Peer state between the hosts of a group (SNF §5: ephemeral state kept
//! on the host that processes the flow, replicated to the host that would
//! process it next).
//!
//! - Each live worker's lane of a deployment ([`LanePeer`]) marks the flows
//!   its batches touched. Every replication interval it exports their state
//!   from every NF of its chain (flow-state bytes and per-flow table
//!   entries, each with its logical clock) and sends it, batched per host,
//!   to the flow's **next owner**: the first host of the flow's slot in the
//!   group's ownership table that is not this one (the owner itself when
//!   this host is not the owner, e.g. one that is finishing flows after a
//!   table change). A flow whose state ended is sent as an empty entry, so
//!   the replica is forgotten rather than resurrected.
//! - When the table changes, every flow this host holds whose next owner
//!   changed is sent at the next interval too (the flows a new or a
//!   draining host takes over get their state before their next flowlet).
//! - The receiving host keeps replicas in its [`PeerStore`]. When a batch
//!   brings a flow the store holds a replica of, the replica is imported
//!   into the lane's NFs before the chain runs; a part whose clock is not
//!   newer than what the NF holds is stale and refused.
//!
//! - A flowlet the dispatcher moved here whose state is neither here nor
//!   replicated is pulled from the host that had it, its packets waiting
//!   meanwhile ([`pull`]).
//!
//! Nothing here is on the path of a host that is not in a group with
//! peers: a lane without a table does no work but marking flows.

pub mod pools;
pub mod pull;
pub mod store;
pub mod wire;

pub use store::{PeerStore, Replica, StoreCounters};
pub use wire::{
    BindingsKind, FlowRequest, GlobalBatch, PeerBatch, PeerMessage, PoolBindings, PoolRelease, TableValues, WireError,
};

use pull::{Answers, Asks, Outcome, Wait};
use serde::{Deserialize, Serialize};
use sluice_group::OwnershipTable;
use sluice_runtime::{Chain, FlowHook, Hold, NfInstance, RawPacket};
use sluice_wire::FlowKey;
use sluice_wire::steer::SteerMark;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};
use wire::{NfPart, PeerFlow};

type HashSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// Encoded bytes per message at most (under NATS' default 1 MiB payload).
pub const MAX_MESSAGE: usize = 512 * 1024;
/// How often a host sends its values of its global eventual tables to the
/// group's other hosts.
pub const GLOBAL_EVERY: Duration = Duration::from_millis(100);

/// A flow whose state did not change is sent again after this long, so
/// its replica outlives the store's lifetime while the flow is active.
pub const REFRESH: Duration = Duration::from_secs(30);

/// A flow still busy (its packets ran since the last export) whose state
/// changed again is sent at most once every this many replication
/// intervals; it is sent at the first export after it goes quiet, and at
/// once when a table change gives it another next owner. A flow moves
/// only after an idle gap, or with a table change, so this only bounds
/// how stale a busy flow's replica is when its host dies.
pub const BUSY_EVERY: u32 = 10;

/// A message for another host of the group.
#[derive(Debug)]
pub struct Outgoing {
    /// The receiving host.
    pub to: String,
    /// The encoded [`PeerBatch`].
    pub body: Vec<u8>,
    /// Flows in it.
    pub flows: usize,
}

/// What a host's peer state did, for the host report.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerCounters {
    /// Flows sent to peers (state or end).
    pub flows_sent: u64,
    /// Messages sent.
    pub batches_sent: u64,
    /// Flows not sent because the outbox to the bus was full.
    pub flows_send_dropped: u64,
    /// Flows sent because a table change gave them another next owner.
    pub flows_handed_over: u64,
    /// Touched flows not sent because their state had not changed since
    /// they were last sent (and was sent less than 30 s ago).
    pub flows_unchanged: u64,
    /// Times a busy flow's changed state waited for the flow to go quiet
    /// (see [`BUSY_EVERY`]).
    pub flows_deferred: u64,
    /// Flows whose replica was imported when they arrived here.
    pub flows_imported: u64,
    /// NF parts of arriving replicas refused as stale (not newer than what
    /// the NF held).
    pub parts_stale: u64,
    /// NF parts refused otherwise (the NF's flow table full).
    pub parts_refused: u64,
    /// Flowlets the dispatcher moved here from another host (their first
    /// packet carried its mark).
    pub flowlets_moved_in: u64,
    /// Of those, flowlets whose state was here when their first packet
    /// ran (replicated before, or already held).
    pub moved_with_state: u64,
    /// Of those, flowlets whose NFs held no state for them when their
    /// first packet ran and which did not wait for it: their chain keeps
    /// no per-flow state, their previous host left the group, or no room
    /// was left to hold their packets.
    pub moved_without_state: u64,
    /// Of those, flowlets whose state was neither here nor replicated:
    /// their packets waited while it was pulled from their previous host.
    pub moved_waited: u64,
    /// Waits that ended with the state arriving.
    pub waits_with_state: u64,
    /// Waits that ended with the previous host answering it held none.
    pub waits_not_held: u64,
    /// Waits that ended at the pull wait without either (state misses).
    pub waits_timed_out: u64,
    /// Of those, flows whose state arrived later and was imported when
    /// their next packet came.
    pub late_state_imported: u64,
    /// Microseconds waited, over all waits, and the longest wait.
    pub wait_us_total: u64,
    pub wait_us_max: u64,
    /// Packets held while their flow waited.
    pub packets_held: u64,
    /// Packets of waiting flows dropped: over [`pull::PER_FLOW`] a flow,
    /// or no room left to hold them.
    pub packets_held_dropped: u64,
    /// Requests for flows this host had, from hosts their flows moved to.
    pub pulls_received: u64,
    /// Of those, requests dropped: too many pending.
    pub pulls_refused: u64,
    /// Flows sent in answer to requests.
    pub pull_flows_sent: u64,
    /// Flows of requests this host held no state of.
    pub pull_flows_not_held: u64,
    /// The moved flowlets by the host they came from (its id, or the
    /// hash its mark carried if it is no longer in the table): after a
    /// kill, how many of the dead host's flows found their state here.
    pub moved_from: std::collections::BTreeMap<String, MovedFrom>,
    /// The ownership table version the host holds.
    pub table_version: Option<u64>,
    /// The replicas this host keeps for its peers.
    pub store: StoreCounters,
    /// Entries of global eventual tables sent to the group's other hosts
    /// (this host's values of keys that changed), per receiving host.
    pub global_entries_sent: u64,
    /// Entries of global eventual tables other hosts sent here.
    pub global_entries_received: u64,
    /// Of those, entries refused (the table's capacity for that host, or
    /// the NF's state budget) or for a deployment or NF not running here.
    pub global_entries_refused: u64,
    /// Release pools split between the group's hosts ([`pools`]).
    pub pools: PoolCounters,
}

/// Counters of the release pools split between the group's hosts.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolCounters {
    /// Bindings handed to the new owner of their block.
    pub handed_over: u64,
    /// Bindings taken in with blocks handed over to this host.
    pub taken_over: u64,
    /// Replicated bindings taken in with blocks of a host that went.
    pub replicas_imported: u64,
    /// Resources released here by flows that moved to other hosts.
    pub released_remote: u64,
    /// Bindings refused (state budget, outside the pool, unknown NF).
    pub refused: u64,
    /// Gained blocks handed out after [`pools::HANDOVER_WAIT`] without
    /// their previous owner's handover.
    pub handover_waits_timed_out: u64,
}

#[derive(Debug, Default)]
struct Counts {
    flows_sent: AtomicU64,
    batches_sent: AtomicU64,
    flows_send_dropped: AtomicU64,
    flows_handed_over: AtomicU64,
    flows_unchanged: AtomicU64,
    flows_deferred: AtomicU64,
    flows_imported: AtomicU64,
    parts_stale: AtomicU64,
    parts_refused: AtomicU64,
    flowlets_moved_in: AtomicU64,
    moved_with_state: AtomicU64,
    moved_without_state: AtomicU64,
    moved_waited: AtomicU64,
    waits_with_state: AtomicU64,
    waits_not_held: AtomicU64,
    waits_timed_out: AtomicU64,
    late_state_imported: AtomicU64,
    wait_us_total: AtomicU64,
    wait_us_max: AtomicU64,
    packets_held: AtomicU64,
    packets_held_dropped: AtomicU64,
    pulls_received: AtomicU64,
    pulls_refused: AtomicU64,
    pull_flows_sent: AtomicU64,
    pull_flows_not_held: AtomicU64,
    global_entries_sent: AtomicU64,
    global_entries_received: AtomicU64,
    global_entries_refused: AtomicU64,
}

/// The flowlets moved to a host from one other host.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MovedFrom {
    /// Flowlets.
    pub flowlets: u64,
    /// Of those, whose state was here when their first packet ran.
    pub with_state: u64,
    /// Of those, whose state was pulled while their packets waited.
    pub pulled: u64,
    /// Of those, that ran without state: none came within the wait, the
    /// host held none, or they could not wait.
    pub without_state: u64,
}

/// A global eventual table as the host sees it, merged over the group.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GlobalTable {
    /// Keys held.
    pub entries: usize,
    /// The largest values (key, value), largest first.
    pub top: Vec<(u64, u64)>,
}

/// The NFs of a deployment whose global tables are merged over the group:
/// their names and shared state, and the chain's shape they belong to.
#[derive(Debug)]
struct Registered {
    shape: String,
    nfs: Vec<(String, Arc<sluice_state::Domain>)>,
}

/// A host's peer state: its name, the group's ownership table, the
/// replicas it keeps and its way out to the bus. Shared by its workers.
#[derive(Debug)]
pub struct Peer {
    me: String,
    table: RwLock<Option<Arc<OwnershipTable>>>,
    store: PeerStore,
    outbox: crossbeam_channel::Sender<Outgoing>,
    interval: Duration,
    /// How long a moved flow's packets wait for its pulled state.
    pull_wait: Duration,
    counts: Counts,
    domains: std::sync::Mutex<HashMap<String, Registered>>,
    /// Other hosts' requests for flows this host had.
    asks: Asks,
    /// Other hosts' answers that they hold none of a flow asked for.
    answers: Answers,
    /// Tickets of held packets, unique on the host.
    tickets: AtomicU64,
    /// Moved flowlets by the host they came from.
    moved_from: std::sync::Mutex<std::collections::BTreeMap<String, MovedFrom>>,
    /// Release pools split between the group's hosts.
    pools: pools::Pools,
    pools_counts: pools::PoolCounts,
}

impl Peer {
    /// The peer state of host `me`: replicate every `interval` through
    /// `outbox`, keep replicas in `store`, let a moved flow's packets wait
    /// up to `pull_wait` for its pulled state.
    pub fn new(
        me: &str,
        interval: Duration,
        pull_wait: Duration,
        store: PeerStore,
        outbox: crossbeam_channel::Sender<Outgoing>,
    ) -> Arc<Self> {
        Arc::new(Peer {
            me: me.to_string(),
            table: RwLock::new(None),
            store,
            outbox,
            interval,
            pull_wait,
            counts: Counts::default(),
            domains: std::sync::Mutex::new(HashMap::default()),
            asks: Asks::default(),
            answers: Answers::default(),
            tickets: AtomicU64::new(1),
            moved_from: std::sync::Mutex::new(std::collections::BTreeMap::new()),
            pools: pools::Pools::default(),
            pools_counts: pools::PoolCounts::default(),
        })
    }

    /// Counts a moved flowlet against the host it came from (`previous`:
    /// the hash its mark carried).
    fn note_moved(&self, previous: u32, count: impl FnOnce(&mut MovedFrom)) {
        let name = self
            .table()
            .and_then(|t| host_by_hash(&t, previous).map(String::from))
            .unwrap_or_else(|| format!("#{previous:08x}"));
        let mut m = self.moved_from.lock().unwrap_or_else(PoisonError::into_inner);
        // Bounded: hashes of hosts no longer in the table are few, but come
        // from the wire.
        if m.len() >= 1024 && !m.contains_key(&name) {
            return;
        }
        count(m.entry(name).or_default());
    }

    /// Takes a message host `from` sent (`now_ns`: the host's clock, as
    /// its live workers' packet time). A message that cannot be read is
    /// counted and its error returned (to log); nothing is kept of it.
    pub fn receive(&self, from: &str, bytes: &[u8], now: Instant, now_ns: u64) -> Result<(), WireError> {
        match PeerMessage::decode(bytes) {
            Ok(PeerMessage::Flows(b)) => self.store.insert(from, b, now),
            Ok(PeerMessage::Global(g)) => self.take_global(from, g, now_ns),
            Ok(PeerMessage::Pull(r)) => self.ask(from, r, now),
            Ok(PeerMessage::NotHeld(r)) => self.answers.insert(&r.deployment, r.flow_keys(), now),
            Ok(PeerMessage::Bindings(b)) => self.take_bindings(b, now),
            Ok(PeerMessage::Released(r)) => self.take_released(r),
            Err(e) => {
                self.store.refused();
                return Err(e);
            }
        }
        Ok(())
    }

    /// Host `from` asks for flows it received without their state: the
    /// deployment's lanes answer (see [`LanePeer::serve`]); with none here,
    /// the answer is that none is held.
    fn ask(&self, from: &str, r: FlowRequest, now: Instant) {
        let c = &self.counts;
        c.pulls_received.fetch_add(1, Ordering::Relaxed);
        let keys: Vec<FlowKey> = r.flow_keys().map(|k| k.normalized()).collect();
        let lanes = self.asks.lanes_of(&r.deployment);
        if lanes == 0 {
            c.pull_flows_not_held.fetch_add(keys.len() as u64, Ordering::Relaxed);
            self.send_not_held(from, &r.deployment, &keys);
            return;
        }
        if !self.asks.push(from, &r.deployment, keys, lanes, now) {
            c.pulls_refused.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn send_not_held(&self, to: &str, deployment: &str, keys: &[FlowKey]) {
        if keys.is_empty() {
            return;
        }
        let m = PeerMessage::NotHeld(FlowRequest {
            deployment: deployment.to_string(),
            keys: keys.iter().map(|k| k.to_bytes().to_vec()).collect(),
        });
        if let Ok(body) = m.encode() {
            let _ = self.outbox.try_send(Outgoing { to: to.to_string(), body, flows: 0 });
        }
    }

    /// Registers the NFs of a deployment (names and the state their
    /// workers share) whose global eventual tables are merged over the
    /// group. `shape` names the chain they belong to: a registration of
    /// the same shape is kept (a hot swap keeps the NFs' shared state).
    pub fn register(&self, deployment: &str, shape: String, nfs: Vec<(String, Arc<sluice_state::Domain>)>) {
        let mut d = self.domains.lock().unwrap_or_else(PoisonError::into_inner);
        if d.get(deployment).is_some_and(|r| r.shape == shape) {
            return;
        }
        for (_, domain) in &nfs {
            domain.track_changes();
        }
        d.insert(deployment.to_string(), Registered { shape, nfs });
        drop(d);
        // Its release pools hand out only this host's blocks, from the start.
        self.pool_tick(Instant::now());
    }

    /// The group-wide view of every registered global eventual table, by
    /// `<deployment>/<nf>/<table>`: its largest `top` values (all when
    /// fewer), largest first, and its entry count.
    pub fn global_tables(&self, top: usize) -> std::collections::BTreeMap<String, GlobalTable> {
        let registered: Vec<(String, String, Arc<sluice_state::Domain>)> = {
            let d = self.domains.lock().unwrap_or_else(PoisonError::into_inner);
            d.iter().flat_map(|(dep, r)| r.nfs.iter().map(|(nf, dom)| (dep.clone(), nf.clone(), dom.clone()))).collect()
        };
        let mut out = std::collections::BTreeMap::new();
        for (deployment, nf, domain) in registered {
            for table in domain.eventual_tables() {
                let (entries, values) = domain.eventual_top(&table, top).unwrap_or_default();
                out.insert(format!("{deployment}/{nf}/{table}"), GlobalTable { entries, top: values });
            }
        }
        out
    }

    /// Forgets a removed deployment.
    pub fn unregister(&self, deployment: &str) {
        self.domains.lock().unwrap_or_else(PoisonError::into_inner).remove(deployment);
        self.store.remove_deployment(deployment);
    }

    /// The group's other hosts: the table's members and the hosts
    /// finishing their flows.
    pub fn peers(&self) -> Vec<String> {
        let Some(t) = self.table() else { return Vec::new() };
        let mut v: Vec<String> = t
            .members()
            .iter()
            .map(|m| m.host.clone())
            .chain(t.finishing().iter().cloned())
            .filter(|h| *h != self.me)
            .collect();
        v.sort();
        v.dedup();
        v
    }

    /// Messages with this host's values of the global eventual tables
    /// that changed since the last call (and of all live keys every half
    /// idle timeout), for every other host of the group (each message
    /// under [`MAX_MESSAGE`]); counts them as sent to `peers` hosts.
    /// `now_ns`: the host's clock, as its live workers' packet time.
    pub fn global_messages(&self, peers: usize, now_ns: u64) -> Vec<Vec<u8>> {
        let registered: Vec<(String, String, Arc<sluice_state::Domain>)> = {
            let d = self.domains.lock().unwrap_or_else(PoisonError::into_inner);
            d.iter().flat_map(|(dep, r)| r.nfs.iter().map(|(nf, dom)| (dep.clone(), nf.clone(), dom.clone()))).collect()
        };
        let mut out = Vec::new();
        for (deployment, nf, domain) in registered {
            for (table, entries) in domain.eventual_changes(now_ns) {
                // 16 bytes an entry at most, encoded: well under the bound.
                for chunk in entries.chunks(wire::MAX_ENTRIES.min(MAX_MESSAGE / 20)) {
                    let m = PeerMessage::Global(GlobalBatch {
                        deployment: deployment.clone(),
                        nf: nf.clone(),
                        tables: vec![TableValues { table: table.clone(), entries: chunk.to_vec() }],
                    });
                    if let Ok(body) = m.encode() {
                        self.counts.global_entries_sent.fetch_add((chunk.len() * peers) as u64, Ordering::Relaxed);
                        out.push(body);
                    }
                }
            }
        }
        out
    }

    /// Takes host `from`'s values of global eventual tables (`now_ns`:
    /// the host's clock, as its live workers' packet time).
    pub fn take_global(&self, from: &str, b: GlobalBatch, now_ns: u64) {
        let n: u64 = b.tables.iter().map(|t| t.entries.len() as u64).sum();
        self.counts.global_entries_received.fetch_add(n, Ordering::Relaxed);
        let domain = {
            let d = self.domains.lock().unwrap_or_else(PoisonError::into_inner);
            d.get(&b.deployment).and_then(|r| r.nfs.iter().find(|(nf, _)| *nf == b.nf).map(|(_, dom)| dom.clone()))
        };
        let Some(domain) = domain else {
            self.counts.global_entries_refused.fetch_add(n, Ordering::Relaxed);
            return;
        };
        for t in &b.tables {
            let refused = domain.set_eventual_remote(from, &t.table, &t.entries, now_ns);
            self.counts.global_entries_refused.fetch_add(refused, Ordering::Relaxed);
        }
    }

    /// This host's name.
    pub fn me(&self) -> &str {
        &self.me
    }

    /// The replicas it keeps.
    pub fn store(&self) -> &PeerStore {
        &self.store
    }

    /// Takes a newer ownership table of the group; true if it was newer.
    pub fn set_table(&self, t: OwnershipTable) -> bool {
        let mut g = self.table.write().unwrap_or_else(PoisonError::into_inner);
        if g.as_ref().is_some_and(|old| old.version() >= t.version()) {
            return false;
        }
        *g = Some(Arc::new(t));
        true
    }

    /// The table it holds.
    pub fn table(&self) -> Option<Arc<OwnershipTable>> {
        self.table.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The part of one deployment's lane on one worker.
    pub fn lane(self: &Arc<Self>, deployment: &str) -> LanePeer {
        self.asks.lane_started(deployment);
        LanePeer {
            waiting: HashMap::default(),
            pulls: HashMap::default(),
            asks_seen: self.asks.newest.load(Ordering::Acquire),
            arrivals_seen: (0, 0),
            next_deadline: None,
            released: Vec::new(),
            late: HashMap::default(),
            deferred: HashSet::default(),
            quiet: Vec::new(),
            peer: self.clone(),
            deployment: deployment.to_string(),
            dirty: HashSet::default(),
            changed: Vec::new(),
            busy: HashSet::default(),
            sent: HashMap::default(),
            last_sweep: Instant::now(),
            keys: Vec::new(),
            taken: Vec::new(),
            moved: Vec::new(),
            next_export: Instant::now() + self.interval,
            table: None,
        }
    }

    /// Its counts now.
    pub fn counters(&self) -> PeerCounters {
        let c = &self.counts;
        PeerCounters {
            flows_sent: c.flows_sent.load(Ordering::Relaxed),
            batches_sent: c.batches_sent.load(Ordering::Relaxed),
            flows_send_dropped: c.flows_send_dropped.load(Ordering::Relaxed),
            flows_handed_over: c.flows_handed_over.load(Ordering::Relaxed),
            flows_unchanged: c.flows_unchanged.load(Ordering::Relaxed),
            flows_deferred: c.flows_deferred.load(Ordering::Relaxed),
            flows_imported: c.flows_imported.load(Ordering::Relaxed),
            parts_stale: c.parts_stale.load(Ordering::Relaxed),
            parts_refused: c.parts_refused.load(Ordering::Relaxed),
            flowlets_moved_in: c.flowlets_moved_in.load(Ordering::Relaxed),
            moved_with_state: c.moved_with_state.load(Ordering::Relaxed),
            moved_without_state: c.moved_without_state.load(Ordering::Relaxed),
            moved_waited: c.moved_waited.load(Ordering::Relaxed),
            waits_with_state: c.waits_with_state.load(Ordering::Relaxed),
            waits_not_held: c.waits_not_held.load(Ordering::Relaxed),
            waits_timed_out: c.waits_timed_out.load(Ordering::Relaxed),
            late_state_imported: c.late_state_imported.load(Ordering::Relaxed),
            wait_us_total: c.wait_us_total.load(Ordering::Relaxed),
            wait_us_max: c.wait_us_max.load(Ordering::Relaxed),
            packets_held: c.packets_held.load(Ordering::Relaxed),
            packets_held_dropped: c.packets_held_dropped.load(Ordering::Relaxed),
            pulls_received: c.pulls_received.load(Ordering::Relaxed),
            pulls_refused: c.pulls_refused.load(Ordering::Relaxed),
            pull_flows_sent: c.pull_flows_sent.load(Ordering::Relaxed),
            pull_flows_not_held: c.pull_flows_not_held.load(Ordering::Relaxed),
            global_entries_sent: c.global_entries_sent.load(Ordering::Relaxed),
            global_entries_received: c.global_entries_received.load(Ordering::Relaxed),
            global_entries_refused: c.global_entries_refused.load(Ordering::Relaxed),
            table_version: self.table().map(|t| t.version()),
            store: self.store.counters(),
            moved_from: self.moved_from.lock().unwrap_or_else(PoisonError::into_inner).clone(),
            pools: self.pools_counts.snapshot(),
        }
    }
}

/// The host a flow's state goes to from `me`: the first host of its slot
/// that is not `me`.
pub fn next_owner<'t>(table: &'t OwnershipTable, me: &str, key: &FlowKey) -> Option<&'t str> {
    table.preferences(table.slot_of(key.hash_normalized())).find(|h| *h != me)
}

/// The host of the group's table (a member, or one finishing its flows)
/// whose [`sluice_wire::steer::host_hash`] is `hash`.
pub fn host_by_hash(table: &OwnershipTable, hash: u32) -> Option<&str> {
    let members = table.members().iter().map(|m| m.host.as_str());
    members.chain(table.finishing().iter().map(String::as_str)).find(|h| sluice_wire::steer::host_hash(h) == hash)
}

fn flow_of(p: &RawPacket<'_>) -> Option<FlowKey> {
    sluice_wire::parse(p.data).key.map(|k| k.normalized())
}

/// A deployment's peer state on one worker.
#[derive(Debug)]
pub struct LanePeer {
    peer: Arc<Peer>,
    deployment: String,
    /// Flows looked up in the store since the last export (normalized
    /// keys; only while the store holds replicas).
    dirty: HashSet<FlowKey>,
    /// Flows whose state changed since the last export, as noted.
    changed: Vec<FlowKey>,
    /// The same, normalized and without repeats.
    busy: HashSet<FlowKey>,
    /// Flows sent: the sum of their clocks then, and when.
    sent: HashMap<FlowKey, (u64, Instant)>,
    last_sweep: Instant,
    keys: Vec<FlowKey>,
    taken: Vec<(FlowKey, Replica)>,
    /// Flows of the batch's packets marked as moved here, with the hash
    /// of the host they came from.
    moved: Vec<(FlowKey, u32)>,
    next_export: Instant,
    /// The table the last export went by.
    table: Option<Arc<OwnershipTable>>,
    /// Flows whose packets wait for their pulled state.
    waiting: HashMap<FlowKey, Wait>,
    /// Flows to ask for, per previous host, not asked for yet.
    pulls: HashMap<String, Vec<FlowKey>>,
    /// The newest request of other hosts this lane looked at.
    asks_seen: u64,
    /// The arrival counts of the store and of answers the waiting flows
    /// were last looked at by.
    arrivals_seen: (u64, u64),
    /// When the first waiting flow times out.
    next_deadline: Option<Instant>,
    /// Flows whose wait ended, whose replica (if it came) is imported
    /// when their packets run.
    released: Vec<FlowKey>,
    /// Flows whose wait timed out, and when: their state, if it comes
    /// later, is imported with their next packet (kept [`LATE`] at most).
    late: HashMap<FlowKey, Instant>,
    /// Busy flows whose changed state was not sent yet (see
    /// [`BUSY_EVERY`]), and those of them that went quiet.
    deferred: HashSet<FlowKey>,
    quiet: Vec<FlowKey>,
}

/// How long a flow whose pull timed out still takes its late state.
pub const LATE: Duration = Duration::from_secs(2);

impl Drop for LanePeer {
    fn drop(&mut self) {
        self.peer.asks.lane_stopped(&self.deployment);
    }
}

impl LanePeer {
    /// Before the chain runs a batch: notes the flows of the packets the
    /// dispatcher marked as moved here (`moved`: index in `packets`), to
    /// count in [`FlowHook::before`] whether their state is here.
    pub fn set_moved(&mut self, packets: &[RawPacket<'_>], moved: &[(usize, SteerMark)]) {
        self.moved.clear();
        for &(i, mark) in moved {
            if let Some(k) = packets.get(i).and_then(|p| sluice_wire::parse(p.data).key) {
                self.moved.push((k.normalized(), mark.previous));
            }
        }
    }

    /// Before the chain runs its part of a batch: which packets wait for
    /// their flow's state (see [`pull`]). A marked packet (`moved`: index
    /// in `packets`) whose flow none of `stages` holds state of, and of
    /// which no replica arrived, starts a wait and a request to its
    /// previous host; every packet of a waiting flow is held (at most
    /// `room` in all) or, over the bounds, dropped. Appends (index,
    /// decision) for those packets to `out`; the others run.
    pub fn hold(
        &mut self,
        stages: &[NfInstance],
        packets: &[RawPacket<'_>],
        moved: &[(usize, SteerMark)],
        mut room: usize,
        out: &mut Vec<(usize, Hold)>,
    ) {
        if self.waiting.is_empty() && (moved.is_empty() || room == 0) {
            return;
        }
        let counts = &self.peer.counts;
        if !moved.is_empty() && stages.iter().any(NfInstance::needs_flows) {
            let table = self.peer.table();
            let now = Instant::now();
            for &(i, mark) in moved {
                let Some(k) = packets.get(i).and_then(flow_of) else { continue };
                if self.waiting.contains_key(&k)
                    || self.waiting.len() >= pull::MAX_WAITING
                    || stages.iter().any(|s| s.flow_clock(&k).is_some())
                    || self.peer.store.holds(&self.deployment, &k)
                {
                    continue;
                }
                let me = self.peer.me.as_str();
                let Some(previous) = table.as_deref().and_then(|t| host_by_hash(t, mark.previous)).filter(|h| *h != me)
                else {
                    continue;
                };
                let ticket = self.peer.tickets.fetch_add(1, Ordering::Relaxed);
                self.waiting.insert(k, Wait { ticket, since: now, packets: 0, previous: mark.previous });
                self.pulls.entry(previous.to_string()).or_default().push(k);
                counts.flowlets_moved_in.fetch_add(1, Ordering::Relaxed);
                counts.moved_waited.fetch_add(1, Ordering::Relaxed);
                let deadline = now + self.peer.pull_wait;
                self.next_deadline = Some(self.next_deadline.map_or(deadline, |d| d.min(deadline)));
            }
        }
        if self.waiting.is_empty() {
            return;
        }
        let (mut held, mut dropped) = (0u64, 0u64);
        for (i, p) in packets.iter().enumerate() {
            let Some(w) = flow_of(p).and_then(|k| self.waiting.get_mut(&k)) else { continue };
            if w.packets < pull::PER_FLOW && room > 0 {
                w.packets += 1;
                room -= 1;
                held += 1;
                out.push((i, Hold::Keep(w.ticket)));
            } else {
                dropped += 1;
                out.push((i, Hold::Drop));
            }
        }
        counts.packets_held.fetch_add(held, Ordering::Relaxed);
        counts.packets_held_dropped.fetch_add(dropped, Ordering::Relaxed);
        for (to, keys) in self.pulls.drain() {
            for chunk in keys.chunks(wire::MAX_REQUEST) {
                let r = FlowRequest {
                    deployment: self.deployment.clone(),
                    keys: chunk.iter().map(|k| k.to_bytes().to_vec()).collect(),
                };
                // Not sent (the outbox full): the wait times out.
                if let Ok(body) = PeerMessage::Pull(r).encode() {
                    let _ = self.peer.outbox.try_send(Outgoing { to: to.clone(), body, flows: 0 });
                }
            }
        }
    }

    /// Appends the tickets of the waiting flows whose wait is over (their
    /// state arrived, their previous host holds none, or the pull wait
    /// passed): their held packets run first in the next batch.
    pub fn release(&mut self, out: &mut Vec<u64>) {
        if self.waiting.is_empty() {
            return;
        }
        let now = Instant::now();
        let arrivals = (self.peer.store.arrivals(), self.peer.answers.arrivals.load(Ordering::Acquire));
        if arrivals == self.arrivals_seen && self.next_deadline.is_none_or(|d| now < d) {
            return;
        }
        self.arrivals_seen = arrivals;
        let (peer, deployment) = (&self.peer, self.deployment.as_str());
        let mut next: Option<Instant> = None;
        let released = &mut self.released;
        let late = &mut self.late;
        if !late.is_empty() {
            late.retain(|_, at| now.saturating_duration_since(*at) < LATE);
        }
        self.waiting.retain(|k, w| {
            let outcome = if peer.store.holds(deployment, k) {
                Outcome::State
            } else if peer.answers.take(deployment, k) {
                Outcome::NotHeld
            } else if now.saturating_duration_since(w.since) >= peer.pull_wait {
                Outcome::TimedOut
            } else {
                let d = w.since + peer.pull_wait;
                next = Some(next.map_or(d, |n| n.min(d)));
                return true;
            };
            let c = &peer.counts;
            match outcome {
                Outcome::State => c.waits_with_state.fetch_add(1, Ordering::Relaxed),
                Outcome::NotHeld => c.waits_not_held.fetch_add(1, Ordering::Relaxed),
                Outcome::TimedOut => c.waits_timed_out.fetch_add(1, Ordering::Relaxed),
            };
            if outcome == Outcome::TimedOut && late.len() < pull::MAX_WAITING * 4 {
                late.insert(*k, now);
            }
            peer.note_moved(w.previous, |m| {
                m.flowlets += 1;
                if outcome == Outcome::State {
                    m.pulled += 1;
                } else {
                    m.without_state += 1;
                }
            });
            let us = u64::try_from(now.saturating_duration_since(w.since).as_micros()).unwrap_or(u64::MAX);
            c.wait_us_total.fetch_add(us, Ordering::Relaxed);
            c.wait_us_max.fetch_max(us, Ordering::Relaxed);
            released.push(*k);
            out.push(w.ticket);
            false
        });
        self.next_deadline = next;
    }

    /// Answers the requests of other hosts for flows of this deployment
    /// (see [`pull`]) that this lane has not looked at: sends the state of
    /// those it holds; the deployment's last lane to look answers for the
    /// flows none held.
    pub fn serve(&mut self, chain: &Chain, now: Instant) {
        if self.peer.asks.newest.load(Ordering::Acquire) == self.asks_seen {
            return;
        }
        let mut found: Vec<(String, Vec<PeerFlow>)> = Vec::new();
        let mut not_held: Vec<(String, Vec<FlowKey>)> = Vec::new();
        {
            let mut g = self.peer.asks.lock();
            let (list, seq) = &mut *g;
            // At most SERVE_AT_ONCE requests a call: a flood of requests
            // slows the answers, never the worker's packets.
            let mut seen = self.asks_seen;
            let mine = list.iter_mut().filter(|a| a.seq > self.asks_seen);
            for a in mine.take(pull::SERVE_AT_ONCE) {
                seen = a.seq;
                if a.deployment != self.deployment {
                    continue;
                }
                let mut flows = Vec::new();
                for k in &a.keys {
                    let Some(sum) = chain.stages().iter().filter_map(|s| s.flow_clock(k)).reduce(u64::wrapping_add)
                    else {
                        continue;
                    };
                    a.found.insert(*k);
                    // The asking host now holds it: it is sent again only
                    // when it changes.
                    self.sent.insert(*k, (sum, now));
                    let nfs = chain.stages().iter().filter_map(|s| s.export_flow(k).map(|e| NfPart::of(s.name(), &e)));
                    flows.push(PeerFlow { key: k.to_bytes().to_vec(), nfs: nfs.collect() });
                }
                a.remaining = a.remaining.saturating_sub(1);
                if a.remaining == 0 {
                    let missing: Vec<FlowKey> = a.keys.iter().filter(|k| !a.found.contains(k)).copied().collect();
                    not_held.push((a.from.clone(), missing));
                }
                if !flows.is_empty() {
                    found.push((a.from.clone(), flows));
                }
            }
            list.retain(|a| a.remaining > 0);
            // Nothing newer left: every later request is another's.
            self.asks_seen = if list.iter().any(|a| a.seq > seen) { seen } else { (*seq).max(seen) };
        }
        let version = self.peer.table().map_or(0, |t| t.version());
        let c = &self.peer.counts;
        for (to, flows) in found {
            c.pull_flows_sent.fetch_add(flows.len() as u64, Ordering::Relaxed);
            for k in self.send(&to, version, flows) {
                self.sent.remove(&k);
            }
        }
        for (to, keys) in not_held {
            c.pull_flows_not_held.fetch_add(keys.len() as u64, Ordering::Relaxed);
            self.peer.send_not_held(&to, &self.deployment, &keys);
        }
    }

    /// Whether an export is due.
    pub fn due(&self, now: Instant) -> bool {
        now >= self.next_export
    }

    /// Sends the state of the flows whose state changed since the last
    /// export to their next owners (and, after a table change, of every
    /// flow held whose next owner changed; every [`REFRESH`], of the flows
    /// sent that long ago and still held). Call when [`due`](Self::due).
    pub fn export(&mut self, chain: &mut Chain, now: Instant) {
        self.next_export = now + self.peer.interval;
        // What changed since the last export, as the state noted it.
        self.changed.clear();
        let mut complete = true;
        for stage in chain.stages_mut() {
            complete &= stage.take_flow_changes(&mut self.changed);
        }
        let Some(table) = self.peer.table() else {
            self.dirty.clear();
            return;
        };
        let chain: &Chain = chain;
        let me = self.peer.me.as_str();
        let mut candidates: Vec<(FlowKey, bool)> = Vec::new();
        if self.table.as_ref().is_none_or(|t| t.version() != table.version()) {
            let before = self.table.clone();
            let mut handed = 0u64;
            for stage in chain.stages() {
                for k in stage.flow_table().keys() {
                    let old = before.as_deref().and_then(|t| next_owner(t, me, k));
                    if old != next_owner(&table, me, k) {
                        // Sent again whatever it was sent before.
                        self.sent.remove(k);
                        candidates.push((*k, false));
                        handed += 1;
                    }
                }
            }
            self.peer.counts.flows_handed_over.fetch_add(handed, Ordering::Relaxed);
            self.table = Some(table.clone());
        }
        if !complete {
            // Too many changed to note: every flow held may have.
            for stage in chain.stages() {
                candidates.extend(stage.flow_table().keys().map(|k| (*k, true)));
            }
        }
        if now.saturating_duration_since(self.last_sweep) >= REFRESH {
            self.last_sweep = now;
            // Flows still held whose replica was sent a refresh ago: sent
            // again, so that it outlives the receiver's lifetime.
            for (k, (_, at)) in &self.sent {
                if now.saturating_duration_since(*at) >= REFRESH {
                    candidates.push((*k, false));
                }
            }
            self.sent.retain(|_, (_, at)| now.saturating_duration_since(*at) < REFRESH * 2);
        }
        self.dirty.clear();
        self.busy.clear();
        self.busy.extend(self.changed.iter().map(|k| k.normalized()));
        // Deferred flows that did not change since the last export are
        // quiet: their state goes now.
        self.quiet.clear();
        for k in self.deferred.drain() {
            if !self.busy.contains(&k) {
                self.quiet.push(k);
            }
        }
        if self.busy.is_empty() && self.quiet.is_empty() && candidates.is_empty() {
            return;
        }
        let busy_every = self.peer.interval.saturating_mul(BUSY_EVERY);
        let mut per_host: HashMap<&str, Vec<PeerFlow>> = HashMap::default();
        let (mut unchanged, mut deferred) = (0u64, 0u64);
        let quiet = std::mem::take(&mut self.quiet);
        candidates.extend(self.busy.iter().map(|k| (*k, true)));
        candidates.extend(quiet.iter().map(|k| (*k, false)));
        let mut seen: HashSet<FlowKey> = HashSet::default();
        for (k, busy) in candidates {
            if !seen.insert(k) {
                continue;
            }
            let Some(to) = next_owner(&table, me, &k) else { continue };
            // Every write counts a clock up: an equal sum is the same
            // state (noted, but written back unchanged), not sent again.
            let clocks = chain.stages().iter().filter_map(|s| s.flow_clock(&k)).reduce(u64::wrapping_add);
            let nfs: Vec<NfPart> = match clocks {
                None => {
                    // The flow ended here: a replica sent before is forgotten.
                    if self.sent.remove(&k).is_none() {
                        continue;
                    }
                    Vec::new()
                }
                Some(sum) => {
                    if self.sent.get(&k).is_some_and(|&(s, at)| s == sum && now.saturating_duration_since(at) < REFRESH)
                    {
                        unchanged += 1;
                        continue;
                    }
                    if busy && self.sent.get(&k).is_some_and(|&(_, at)| now.saturating_duration_since(at) < busy_every)
                    {
                        self.deferred.insert(k);
                        deferred += 1;
                        continue;
                    }
                    self.sent.insert(k, (sum, now));
                    chain.stages().iter().filter_map(|s| s.export_flow(&k).map(|e| NfPart::of(s.name(), &e))).collect()
                }
            };
            per_host.entry(to).or_default().push(PeerFlow { key: k.to_bytes().to_vec(), nfs });
        }
        self.peer.counts.flows_unchanged.fetch_add(unchanged, Ordering::Relaxed);
        self.peer.counts.flows_deferred.fetch_add(deferred, Ordering::Relaxed);
        self.quiet = quiet;
        for (to, flows) in per_host {
            // A flow that could not be sent is sent again at the next
            // interval it changes.
            for k in self.send(to, table.version(), flows) {
                self.sent.remove(&k);
            }
        }
    }

    /// Sends flows to one host, in messages under [`MAX_MESSAGE`].
    /// Returns the flows it could not send (the outbox to the bus full).
    fn send(&self, to: &str, version: u64, flows: Vec<PeerFlow>) -> Vec<FlowKey> {
        let counts = &self.peer.counts;
        let mut part = Vec::new();
        let mut size = 0usize;
        let mut unsent = Vec::new();
        let mut flush = |part: Vec<PeerFlow>| {
            let n = part.len();
            let batch = PeerBatch { deployment: self.deployment.clone(), table_version: version, flows: part };
            let message = PeerMessage::Flows(batch);
            let sent = message
                .encode()
                .ok()
                .map(|body| self.peer.outbox.try_send(Outgoing { to: to.to_string(), body, flows: n }).is_ok());
            if sent == Some(true) {
                counts.flows_sent.fetch_add(n as u64, Ordering::Relaxed);
                counts.batches_sent.fetch_add(1, Ordering::Relaxed);
            } else {
                counts.flows_send_dropped.fetch_add(n as u64, Ordering::Relaxed);
                if let PeerMessage::Flows(batch) = &message {
                    unsent.extend(batch.flows.iter().filter_map(|f| FlowKey::from_bytes(&f.key)));
                }
            }
        };
        for f in flows {
            // Encoded size, roughly: key, names, values, varints.
            let s = 48 + f.nfs.iter().map(|p| 32 + p.nf.len() + p.bytes() + 24 * p.tables.len()).sum::<usize>();
            if size + s > MAX_MESSAGE && !part.is_empty() {
                flush(std::mem::take(&mut part));
                size = 0;
            }
            size += s;
            part.push(f);
        }
        if !part.is_empty() {
            flush(part);
        }
        unsent
    }
}

impl FlowHook for LanePeer {
    /// Marks the batch's flows for the next export, imports the replicas
    /// held for flows new since the last one, and counts the moved
    /// flowlets by whether their state is here.
    fn before(&mut self, stages: &mut [NfInstance], keys: &[FlowKey]) {
        for stage in stages.iter_mut() {
            stage.track_flow_changes();
        }
        self.keys.clear();
        // Flows not seen since the last export look for a replica, while
        // the store holds any.
        if self.peer.store.held() > 0 {
            for k in keys {
                if self.dirty.insert(*k) {
                    self.keys.push(*k);
                }
            }
        }
        // Flows whose wait ended run now: their replica, if it came; and
        // flows whose wait timed out, if theirs came since.
        for k in self.released.drain(..) {
            if !self.keys.contains(&k) {
                self.keys.push(k);
            }
        }
        let mut late = 0usize;
        if !self.late.is_empty() {
            for k in keys {
                if self.late.contains_key(k) && !self.keys.contains(k) {
                    self.keys.push(*k);
                    late += 1;
                }
            }
        }
        let counts = &self.peer.counts;
        if !self.keys.is_empty() && self.peer.store.held() > 0 {
            self.peer.store.take(&self.deployment, &self.keys, &mut self.taken);
            for (key, replica) in self.taken.drain(..) {
                counts.flows_imported.fetch_add(1, Ordering::Relaxed);
                if late > 0 && self.late.remove(&key).is_some() {
                    counts.late_state_imported.fetch_add(1, Ordering::Relaxed);
                }
                for part in &replica.nfs {
                    let Some(stage) = stages.iter_mut().find(|s| s.name() == part.nf) else { continue };
                    match stage.import_flow(part.to_export(key)) {
                        Ok(()) => {}
                        Err(sluice_runtime::ImportError::Stale { .. }) => {
                            counts.parts_stale.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(sluice_runtime::ImportError::Full { .. }) => {
                            counts.parts_refused.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }
        }
        for (k, previous) in self.moved.drain(..) {
            counts.flowlets_moved_in.fetch_add(1, Ordering::Relaxed);
            let with = stages.iter().any(|s| s.flow_clock(&k).is_some());
            if with {
                counts.moved_with_state.fetch_add(1, Ordering::Relaxed);
            } else {
                counts.moved_without_state.fetch_add(1, Ordering::Relaxed);
            }
            self.peer.note_moved(previous, |m| {
                m.flowlets += 1;
                if with {
                    m.with_state += 1;
                } else {
                    m.without_state += 1;
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;
    use sluice_group::Member;

    fn table(version: u64, hosts: &[&str]) -> OwnershipTable {
        let members: Vec<Member> = hosts.iter().map(|h| Member { host: h.to_string(), weight: 1 }).collect();
        OwnershipTable::build("edge", version, 0, &members, 1021, 3).unwrap()
    }

    #[test]
    fn the_next_owner_is_the_first_other_host_of_the_slot() {
        let t = table(1, &["h1", "h2", "h3"]);
        for port in 0..200u16 {
            let k = FlowKey { src_port: port, dst_port: 80, protocol: 6, ..FlowKey::default() };
            let prefs: Vec<&str> = t.preferences(t.slot_of(k.hash_normalized())).collect();
            assert_eq!(next_owner(&t, prefs[0], &k), Some(prefs[1]));
            assert_eq!(next_owner(&t, "elsewhere", &k), Some(prefs[0]));
        }
        assert_eq!(next_owner(&table(2, &["h1"]), "h1", &FlowKey::default()), None);
    }

    #[test]
    fn only_newer_tables_replace_the_held_one() {
        let (tx, _rx) = crossbeam_channel::bounded(1);
        let p = Peer::new(
            "h1",
            Duration::from_millis(10),
            Duration::from_millis(2),
            PeerStore::new(10, 1 << 20, Duration::from_secs(1)),
            tx,
        );
        assert!(p.set_table(table(2, &["h1", "h2"])));
        assert!(!p.set_table(table(1, &["h1", "h2", "h3"])));
        assert_eq!(p.counters().table_version, Some(2));
    }
}
