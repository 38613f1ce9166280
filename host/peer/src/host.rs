//! The host-level peer ([`Peer`]): what a host runs once for the group,
//! shared by its workers: the ownership table, the messages it receives
//! from other hosts (replicas, pulls, global tables, pool bindings), the
//! registered deployments whose global tables are merged over the group,
//! and its counters. Its release pools split between hosts are in
//! [`pools`]; a worker's lane of a deployment is in [`crate::hook`].

pub mod pools;

use crate::HashMap;
use crate::counters::{Counts, GlobalTable, MovedFrom, PeerCounters};
use crate::link::PeerLink;
use crate::out::{Outgoing, PeerOut};
use crate::pull::{Answers, Asks};
use crate::store::PeerStore;
use crate::wire::{self, FlowRequest, GlobalBatch, PeerMessage, TableValues, WireError};
use parking_lot::RwLock;
use sluice_group::OwnershipTable;
use sluice_wire::FlowKey;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Encoded bytes per message at most (under NATS' default 1 MiB payload).
pub const MAX_MESSAGE: usize = 512 * 1024;
/// How often a host sends its values of its global eventual tables to the
/// group's other hosts.
pub const GLOBAL_EVERY: Duration = Duration::from_millis(100);

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
    pub(crate) me: String,
    table: RwLock<Option<Arc<OwnershipTable>>>,
    pub(crate) store: PeerStore,
    pub(crate) outbox: PeerOut,
    pub(crate) interval: Duration,
    /// How long a moved flow's packets wait for its pulled state.
    pub(crate) pull_wait: Duration,
    pub(crate) counts: Counts,
    domains: parking_lot::Mutex<HashMap<String, Registered>>,
    /// Other hosts' requests for flows this host had.
    pub(crate) asks: Asks,
    /// Other hosts' answers that they hold none of a flow asked for.
    pub(crate) answers: Answers,
    /// Tickets of held packets, unique on the host.
    pub(crate) tickets: AtomicU64,
    /// Moved flowlets by the host they came from.
    moved_from: parking_lot::Mutex<std::collections::BTreeMap<String, MovedFrom>>,
    /// Release pools split between the group's hosts.
    pools: pools::Pools,
    pools_counts: pools::PoolCounts,
    /// Live workers to wake when a request or an answer arrives (an idle
    /// worker parks between polls).
    workers: parking_lot::Mutex<Vec<Woken>>,
    /// Whether workers may be raised to real-time priority for a pull
    /// (false once the host could not: no `CAP_SYS_NICE`).
    may_raise: std::sync::atomic::AtomicBool,
    /// Lanes with output commit, by id: the answers (sender, message
    /// number) that arrived for each (see [`crate::commit`]).
    commit_acks: parking_lot::Mutex<HashMap<u64, Vec<(String, u64)>>>,
    next_lane: AtomicU64,
    /// Hosts of the table that look dead before the controller says so
    /// (see [`Peer::suspect`]): output commit skips them.
    suspects: parking_lot::Mutex<Vec<String>>,
    /// Whether `suspects` holds any (read without the lock per message).
    any_suspect: std::sync::atomic::AtomicBool,
    /// Counts up whenever `suspects` changes: lanes with output commit
    /// send again the flows whose next live owner it changed.
    suspect_epoch: AtomicU64,
    /// The host's peer link, where one is set up ([`Peer::attach_link`]).
    link: std::sync::OnceLock<Arc<PeerLink>>,
    /// When this host last offered its link to every peer, and the peers
    /// it has offered it to since it started.
    offered: parking_lot::Mutex<(Option<Instant>, crate::HashSet<String>)>,
}

/// A live worker woken on arrivals.
#[derive(Debug)]
struct Woken {
    thread: std::thread::Thread,
    native: thread_priority::ThreadId,
    raised: Raised,
}

/// Set when a pull raised a live worker to real-time priority (see
/// [`Peer::wake_me_on_arrivals`]).
#[derive(Debug, Clone)]
pub struct Raised(Arc<std::sync::atomic::AtomicBool>);

impl Raised {
    /// Whether a pull raised the calling worker since the last call
    /// (clears it): call at the start of a pass of the worker's loop, and
    /// [`lower`](Self::lower) at its end, after the pass looked at its
    /// peers' requests and answers.
    pub fn take(&self) -> bool {
        self.0.swap(false, Ordering::AcqRel)
    }

    /// Back to normal scheduling (the calling thread).
    pub fn lower(&self) {
        set_fifo(thread_priority::thread_native_id(), false);
    }
}

/// Sets thread `native` (a thread of this process) to `SCHED_FIFO` 1 or
/// back to normal scheduling; false when it could not (no
/// `CAP_SYS_NICE`). The peer link's thread and raised live workers run so.
pub fn set_fifo(native: thread_priority::ThreadId, realtime: bool) -> bool {
    use thread_priority::{
        NormalThreadSchedulePolicy, RealtimeThreadSchedulePolicy, ThreadPriority, ThreadSchedulePolicy,
        set_thread_priority_and_policy,
    };
    let policy = if realtime {
        ThreadSchedulePolicy::Realtime(RealtimeThreadSchedulePolicy::Fifo)
    } else {
        ThreadSchedulePolicy::Normal(NormalThreadSchedulePolicy::Other)
    };
    set_thread_priority_and_policy(native, ThreadPriority::Min, policy).is_ok()
}

/// How often a host offers its peer link again to every peer (a peer that
/// restarted lost the offer).
pub const OFFER_EVERY: Duration = Duration::from_secs(1);

/// Hosts suspected at once, at most.
const MAX_SUSPECTS: usize = 64;

/// Live workers a host wakes on arrivals, at most.
const MAX_WORKERS: usize = 256;
/// Answers kept for a lane with output commit between two of its
/// batches, at most (see [`crate::commit`]).
pub const MAX_ACKS: usize = 65_536;

impl Peer {
    /// The peer state of host `me`: replicate every `interval` through
    /// `outbox`, keep replicas in `store`, let a moved flow's packets wait
    /// up to `pull_wait` for its pulled state.
    pub fn new(me: &str, interval: Duration, pull_wait: Duration, store: PeerStore, outbox: PeerOut) -> Arc<Self> {
        Arc::new(Peer {
            me: me.to_string(),
            table: RwLock::new(None),
            store,
            outbox,
            interval,
            pull_wait,
            counts: Counts::default(),
            domains: parking_lot::Mutex::new(HashMap::default()),
            asks: Asks::default(),
            answers: Answers::default(),
            tickets: AtomicU64::new(1),
            moved_from: parking_lot::Mutex::new(std::collections::BTreeMap::new()),
            pools: pools::Pools::default(),
            pools_counts: pools::PoolCounts::default(),
            workers: parking_lot::Mutex::new(Vec::new()),
            may_raise: std::sync::atomic::AtomicBool::new(true),
            commit_acks: parking_lot::Mutex::new(HashMap::default()),
            next_lane: AtomicU64::new(1),
            suspects: parking_lot::Mutex::new(Vec::new()),
            any_suspect: std::sync::atomic::AtomicBool::new(false),
            suspect_epoch: AtomicU64::new(0),
            link: std::sync::OnceLock::new(),
            offered: parking_lot::Mutex::new((None, crate::HashSet::default())),
        })
    }

    /// Sets up the host's peer link: from now on it is offered to the
    /// group's other hosts ([`Peer::offer_links`]), and pulls, their
    /// answers and probes go to those that offered theirs as datagrams.
    /// False when one is set up already.
    pub fn attach_link(&self, link: Arc<PeerLink>) -> bool {
        self.link.set(link).is_ok()
    }

    /// Offers this host's peer link to the table's hosts it has not
    /// offered it to, and to all of them every [`OFFER_EVERY`]. Call on
    /// the host's tick.
    pub fn offer_links(&self, now: Instant) {
        if self.link.get().is_none() {
            return;
        }
        let peers = self.peers();
        let due = {
            let mut g = self.offered.lock();
            let (last, offered) = &mut *g;
            let all = last.is_none_or(|t| now.saturating_duration_since(t) >= OFFER_EVERY);
            if all {
                *last = Some(now);
            }
            let due: Vec<String> = peers.into_iter().filter(|p| all || !offered.contains(p)).collect();
            offered.extend(due.iter().cloned());
            due
        };
        for to in due {
            self.offer_link(&to);
        }
    }

    /// Sends host `to` this host's link offer, on the bus.
    fn offer_link(&self, to: &str) {
        if let Some(o) = self.link.get().and_then(|l| l.offer_for(to)) {
            self.post(to, &PeerMessage::Offer(o));
        }
    }

    /// Sends a message a packet waits on (a pull, its answer, a probe):
    /// as a datagram on the peer link when `to` offered one and it fits,
    /// else on the bus. False when neither took it.
    pub(crate) fn send_quick(&self, to: &str, body: Vec<u8>, flows: usize) -> bool {
        if let Some(l) = self.link.get()
            && l.send(to, &body)
        {
            return true;
        }
        self.outbox.send(Outgoing { to: to.to_string(), body, flows })
    }

    /// Takes a message host `from` sent on the peer link (checked by it):
    /// only a pull, its answers and probes are taken from a link.
    pub fn receive_link(&self, from: &str, bytes: &[u8], now: Instant, now_ns: u64) -> Result<(), WireError> {
        let m = PeerMessage::decode(bytes)
            .inspect_err(|_| _ = self.counts.link_kind_refused.fetch_add(1, Ordering::Relaxed))?;
        match m {
            PeerMessage::Flows(_)
            | PeerMessage::Pull(_)
            | PeerMessage::NotHeld(_)
            | PeerMessage::Probe
            | PeerMessage::Alive => self.take(from, m, now, now_ns),
            _ => {
                self.counts.link_kind_refused.fetch_add(1, Ordering::Relaxed);
                Err(WireError::Bound("a message of this kind is taken from the bus only, not the peer link".into()))
            }
        }
    }

    /// A new lane with output commit: its id, under which answers for it
    /// are kept until it takes them.
    pub(crate) fn commit_lane(&self) -> u64 {
        let id = self.next_lane.fetch_add(1, Ordering::Relaxed);
        self.commit_acks.lock().insert(id, Vec::new());
        id
    }

    /// Forgets a lane with output commit.
    pub(crate) fn end_commit_lane(&self, id: u64) {
        self.commit_acks.lock().remove(&id);
    }

    /// Host `host` looks dead: a commit to it was not answered in time, or
    /// the dispatcher moved a flow it owns in the table here (it sends a
    /// dead host's flows to their next owners at once, long before the
    /// controller drops the host from the table). Output commit sends to
    /// the next host of each flow's preferences instead, until a message
    /// from `host` arrives or a table without it comes.
    pub fn suspect(&self, host: &str) {
        if host == self.me {
            return;
        }
        let mut s = self.suspects.lock();
        if !s.iter().any(|h| h == host) && s.len() < MAX_SUSPECTS {
            s.push(host.to_string());
            self.counts.hosts_suspected.fetch_add(1, Ordering::Relaxed);
            self.suspect_epoch.fetch_add(1, Ordering::Release);
        }
        self.any_suspect.store(!s.is_empty(), Ordering::Relaxed);
    }

    /// Counts up whenever the hosts suspected dead change.
    pub(crate) fn suspect_epoch(&self) -> u64 {
        self.suspect_epoch.load(Ordering::Acquire)
    }

    /// Asks each host suspected dead whether it lives
    /// ([`PeerMessage::Probe`]): its answer, or any message from it, ends
    /// the suspicion. Call every [`GLOBAL_EVERY`]: a host taken for dead
    /// wrongly (a forged mark, a slow answer) gets its flows' state back
    /// within a round trip of the next call.
    pub fn probe_suspects(&self) {
        let mut suspects = Vec::new();
        self.suspects(&mut suspects);
        let Ok(body) = PeerMessage::Probe.encode() else { return };
        for to in suspects {
            self.send_quick(&to, body.clone(), 0);
        }
    }

    /// The hosts suspected dead now (usually none).
    pub(crate) fn suspects(&self, out: &mut Vec<String>) {
        out.clear();
        if self.any_suspect.load(Ordering::Relaxed) {
            out.extend(self.suspects.lock().iter().cloned());
        }
    }

    /// A message from `host` arrived: it is alive.
    fn heard_from(&self, host: &str) {
        if self.any_suspect.load(Ordering::Relaxed) {
            let mut s = self.suspects.lock();
            let before = s.len();
            s.retain(|h| h != host);
            if s.len() != before {
                self.suspect_epoch.fetch_add(1, Ordering::Release);
            }
            self.any_suspect.store(!s.is_empty(), Ordering::Relaxed);
        }
    }

    /// Moves the answers that arrived for lane `id` to `out`.
    pub(crate) fn take_acks(&self, id: u64, out: &mut Vec<(String, u64)>) {
        if let Some(v) = self.commit_acks.lock().get_mut(&id) {
            out.append(v);
        }
    }

    /// Keeps flows a lane of host `from` waits on as replicas, and answers
    /// that they are held when every one of them is (a store too full to
    /// hold one leaves the answer out: the sender's packets wait, then
    /// are dropped).
    fn take_commit(&self, from: &str, c: crate::wire::CommitBatch, now: Instant) {
        let (lane, seq) = (c.lane, c.seq);
        if self.store.insert(from, c.batch, now) > 0 {
            self.counts.commits_refused.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.answer_commit(from, lane, seq);
    }

    /// Tells host `from` that its lane's message `seq` is held here.
    fn answer_commit(&self, from: &str, lane: u64, seq: u64) {
        let m = PeerMessage::Held(crate::wire::CommitAck { lane, seq });
        if let Ok(body) = m.encode() {
            self.counts.commits_answered.fetch_add(1, Ordering::Relaxed);
            let _ = self.outbox.send(Outgoing { to: from.to_string(), body, flows: 0 });
        }
    }

    /// Host `from` holds a lane's message (kept for the lane, if it is
    /// here: an answer for no lane is dropped).
    fn take_ack(&self, from: &str, a: crate::wire::CommitAck) {
        if let Some(v) = self.commit_acks.lock().get_mut(&a.lane)
            && v.len() < MAX_ACKS
        {
            v.push((from.to_string(), a.seq));
        }
    }

    /// The sender thread sent (or gave up on) one message of the queue of
    /// [`PeerOut`].
    pub fn sent(&self) {
        self.outbox.sent();
    }

    /// Wakes the calling live worker's thread ([`std::thread::unpark`]) when
    /// another host's request or answer arrives, so that an idle worker
    /// parked between polls looks at it at once. A pull's request (on the
    /// host asked) and its answer (on the host whose flows wait for it)
    /// also raise the worker to the lowest real-time priority
    /// (`SCHED_FIFO` 1, where the host may, as its peer link thread runs):
    /// on cores shared with other busy threads a woken worker would wait
    /// for a time slice, milliseconds, and the pull with it. The worker
    /// lowers itself after the pass of its loop that began raised (see
    /// [`Raised`]).
    pub fn wake_me_on_arrivals(&self) -> Raised {
        let me = std::thread::current();
        let raised = Raised(Arc::new(std::sync::atomic::AtomicBool::new(false)));
        let mut w = self.workers.lock();
        if w.len() < MAX_WORKERS && !w.iter().any(|t| t.thread.id() == me.id()) {
            w.push(Woken { thread: me, native: thread_priority::thread_native_id(), raised: raised.clone() });
        }
        raised
    }

    /// Stops waking and raising the calling worker: call before its thread
    /// ends (a thread that has ended must not be raised).
    pub fn stop_waking_me(&self) {
        let me = std::thread::current().id();
        self.workers.lock().retain(|t| t.thread.id() != me);
    }

    fn wake_workers(&self) {
        for t in self.workers.lock().iter() {
            t.thread.unpark();
        }
    }

    /// [`wake_workers`](Self::wake_workers), each worker raised first (see
    /// [`wake_me_on_arrivals`](Self::wake_me_on_arrivals)).
    fn wake_workers_for_pull(&self) {
        let may = self.may_raise.load(Ordering::Relaxed);
        for t in self.workers.lock().iter() {
            if may && !t.raised.0.load(Ordering::Relaxed) {
                if set_fifo(t.native, true) {
                    t.raised.0.store(true, Ordering::Release);
                } else {
                    self.may_raise.store(false, Ordering::Relaxed);
                }
            }
            t.thread.unpark();
        }
    }

    /// Whether flows of this host wait for pulled state.
    fn pulls_waiting(&self) -> bool {
        let c = &self.counts;
        let ended = c.waits_with_state.load(Ordering::Relaxed)
            + c.waits_not_held.load(Ordering::Relaxed)
            + c.waits_timed_out.load(Ordering::Relaxed);
        c.moved_waited.load(Ordering::Relaxed) > ended
    }

    /// Counts a moved flowlet against the host it came from (`previous`:
    /// the hash its mark carried).
    pub(crate) fn note_moved(&self, previous: u32, count: impl FnOnce(&mut MovedFrom)) {
        let name = self
            .table()
            .and_then(|t| host_by_hash(&t, previous).map(String::from))
            .unwrap_or_else(|| format!("#{previous:08x}"));
        let mut m = self.moved_from.lock();
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
            Ok(m) => self.take(from, m, now, now_ns),
            Err(e) => {
                self.heard_from(from);
                self.store.refused();
                Err(e)
            }
        }
    }

    /// Takes a decoded message from host `from`.
    fn take(&self, from: &str, m: PeerMessage, now: Instant, now_ns: u64) -> Result<(), WireError> {
        self.heard_from(from);
        match m {
            PeerMessage::Flows(b) => {
                self.store.insert(from, b, now);
                if self.pulls_waiting() { self.wake_workers_for_pull() } else { self.wake_workers() }
            }
            PeerMessage::Global(g) => self.take_global(from, g, now_ns),
            PeerMessage::Pull(r) => {
                self.ask(from, r, now);
                self.wake_workers_for_pull();
            }
            PeerMessage::NotHeld(r) => {
                self.answers.insert(&r.deployment, r.flow_keys(), now);
                self.wake_workers_for_pull();
            }
            PeerMessage::Bindings(b) => {
                self.take_bindings(b, now);
            }
            PeerMessage::Released(r) => self.take_released(r),
            PeerMessage::Commit(c) => {
                self.take_commit(from, c, now);
                self.wake_workers();
            }
            PeerMessage::Held(a) => {
                self.take_ack(from, a);
                self.wake_workers();
            }
            PeerMessage::Probe => {
                if let Ok(body) = PeerMessage::Alive.encode() {
                    self.send_quick(from, body, 0);
                }
            }
            PeerMessage::Alive => {}
            PeerMessage::Offer(o) => {
                let Some(link) = self.link.get() else { return Ok(()) };
                match link.take_offer(from, &o) {
                    // A new or restarted host may lack this host's offer.
                    Ok(true) => self.offer_link(from),
                    Ok(false) => {}
                    Err(e) => {
                        self.store.refused();
                        return Err(WireError::Bound(e.to_string()));
                    }
                }
            }
            PeerMessage::CommitBindings(c) => {
                let (lane, seq) = (c.lane, c.seq);
                if self.take_bindings(c.bindings, now) > 0 {
                    self.counts.commits_refused.fetch_add(1, Ordering::Relaxed);
                } else {
                    self.answer_commit(from, lane, seq);
                }
            }
        }
        Ok(())
    }

    /// Host `from` asks for flows it received without their state: the
    /// deployment's lanes answer (see [`LanePeer::serve`](crate::LanePeer::serve)); with none here,
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

    /// Tells host `to` that no lane here holds state of flows `keys` of
    /// `deployment`.
    pub(crate) fn send_not_held(&self, to: &str, deployment: &str, keys: &[FlowKey]) {
        if keys.is_empty() {
            return;
        }
        let m = PeerMessage::NotHeld(FlowRequest {
            deployment: deployment.to_string(),
            keys: keys.iter().map(|k| k.to_bytes().to_vec()).collect(),
        });
        if let Ok(body) = m.encode() {
            self.send_quick(to, body, 0);
        }
    }

    /// Registers the NFs of a deployment (names and the state their
    /// workers share) whose global eventual tables are merged over the
    /// group. `shape` names the chain they belong to: a registration of
    /// the same shape is kept (a hot swap keeps the NFs' shared state).
    pub fn register(&self, deployment: &str, shape: String, nfs: Vec<(String, Arc<sluice_state::Domain>)>) {
        let mut d = self.domains.lock();
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
            let d = self.domains.lock();
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
        self.domains.lock().remove(deployment);
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
            let d = self.domains.lock();
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
            let d = self.domains.lock();
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
        let mut g = self.table.write();
        if g.as_ref().is_some_and(|old| old.version() >= t.version()) {
            return false;
        }
        // Hosts suspected dead and no longer in the table are gone; those
        // still in it stay suspected.
        if self.any_suspect.load(Ordering::Relaxed) {
            let mut s = self.suspects.lock();
            s.retain(|h| t.members().iter().any(|m| &m.host == h) || t.finishing().iter().any(|f| f == h));
            self.any_suspect.store(!s.is_empty(), Ordering::Relaxed);
        }
        *g = Some(Arc::new(t));
        true
    }

    /// The table it holds.
    pub fn table(&self) -> Option<Arc<OwnershipTable>> {
        self.table.read().clone()
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
            wait_us: c.wait_us.snapshot(),
            packets_held: c.packets_held.load(Ordering::Relaxed),
            packets_held_dropped: c.packets_held_dropped.load(Ordering::Relaxed),
            pulls_received: c.pulls_received.load(Ordering::Relaxed),
            pulls_refused: c.pulls_refused.load(Ordering::Relaxed),
            pull_flows_sent: c.pull_flows_sent.load(Ordering::Relaxed),
            pull_flows_not_held: c.pull_flows_not_held.load(Ordering::Relaxed),
            pulls_answered: c.pulls_answered.load(Ordering::Relaxed),
            pull_answer_us_total: c.pull_answer_us_total.load(Ordering::Relaxed),
            commits_sent: c.commits_sent.load(Ordering::Relaxed),
            commits_held: c.commits_held.load(Ordering::Relaxed),
            commit_wait_us_total: c.commit_wait_us_total.load(Ordering::Relaxed),
            commit_wait_us: c.commit_wait_us.snapshot(),
            commits_timed_out: c.commits_timed_out.load(Ordering::Relaxed),
            packets_deferred: c.packets_deferred.load(Ordering::Relaxed),
            packets_commit_dropped: c.packets_commit_dropped.load(Ordering::Relaxed),
            commits_answered: c.commits_answered.load(Ordering::Relaxed),
            commits_refused: c.commits_refused.load(Ordering::Relaxed),
            hosts_suspected: c.hosts_suspected.load(Ordering::Relaxed),
            link_sent: self.link.get().map_or(0, |l| l.counts.sent.load(Ordering::Relaxed)),
            link_received: self.link.get().map_or(0, |l| l.counts.received.load(Ordering::Relaxed)),
            link_refused: self.link.get().map_or(0, |l| l.counts.refused.load(Ordering::Relaxed))
                + c.link_kind_refused.load(Ordering::Relaxed),
            link_by_bus: self.link.get().map_or(0, |l| l.counts.by_bus.load(Ordering::Relaxed)),
            link_floods: self.link.get().map_or(0, |l| l.counts.floods.load(Ordering::Relaxed)),
            link_addr: self.link.get().map(|l| l.addr().to_string()),
            global_entries_sent: c.global_entries_sent.load(Ordering::Relaxed),
            global_entries_received: c.global_entries_received.load(Ordering::Relaxed),
            global_entries_refused: c.global_entries_refused.load(Ordering::Relaxed),
            table_version: self.table().map(|t| t.version()),
            store: self.store.counters(),
            moved_from: self.moved_from.lock().clone(),
            pools: self.pools_counts.snapshot(),
        }
    }
}

/// The host a flow's state goes to from `me`: the first host of its slot
/// that is not `me`.
pub fn next_owner<'t>(table: &'t OwnershipTable, me: &str, key: &FlowKey) -> Option<&'t str> {
    table.preferences(table.slot_of(key.hash_normalized())).find(|h| *h != me)
}

/// [`next_owner`], passing over the hosts in `suspects`.
pub fn next_live_owner<'t>(table: &'t OwnershipTable, me: &str, key: &FlowKey, suspects: &[String]) -> Option<&'t str> {
    table.preferences(table.slot_of(key.hash_normalized())).find(|h| *h != me && !suspects.iter().any(|s| s == h))
}

/// The host of the group's table (a member, or one finishing its flows)
/// whose [`sluice_wire::steer::host_hash`] is `hash`.
pub fn host_by_hash(table: &OwnershipTable, hash: u32) -> Option<&str> {
    let members = table.members().iter().map(|m| m.host.as_str());
    members.chain(table.finishing().iter().map(String::as_str)).find(|h| sluice_wire::steer::host_hash(h) == hash)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;
    use crate::link::{self, LinkOffer};
    use sluice_group::Member;

    fn table(version: u64, hosts: &[&str]) -> OwnershipTable {
        let members: Vec<Member> = hosts.iter().map(|h| Member { host: h.to_string(), weight: 1 }).collect();
        OwnershipTable::build("edge", version, 0, &members, 1021, 3).unwrap()
    }

    #[test]
    fn a_suspected_host_is_probed_and_any_message_from_it_ends_the_suspicion() {
        let (tx, rx) = crossbeam_channel::bounded(8);
        let store = PeerStore::new(10, 1 << 20, Duration::from_secs(60));
        let p = Peer::new("h1", Duration::from_millis(1), Duration::from_millis(5), store, PeerOut::new(tx, None));
        let e0 = p.suspect_epoch();
        p.suspect("h2");
        p.suspect("h2");
        p.suspect("h1");
        assert_eq!(p.suspect_epoch(), e0 + 1, "once, and never itself");
        p.probe_suspects();
        let out = rx.try_recv().unwrap();
        assert_eq!((out.to.as_str(), PeerMessage::decode(&out.body).unwrap()), ("h2", PeerMessage::Probe));
        // It answers others' probes.
        p.receive("h3", &PeerMessage::Probe.encode().unwrap(), Instant::now(), 0).unwrap();
        let out = rx.try_recv().unwrap();
        assert_eq!((out.to.as_str(), PeerMessage::decode(&out.body).unwrap()), ("h3", PeerMessage::Alive));
        p.receive("h2", &PeerMessage::Alive.encode().unwrap(), Instant::now(), 0).unwrap();
        let mut s = Vec::new();
        p.suspects(&mut s);
        assert!(s.is_empty());
        assert_eq!(p.suspect_epoch(), e0 + 2);
        assert_eq!(p.counters().hosts_suspected, 1);
    }

    /// Two hosts with links, their bus a channel each: offers cross on
    /// the bus, then probes, answers and pulls take the link, and the
    /// link takes nothing else.
    #[test]
    fn links_are_offered_on_the_bus_and_carry_only_what_packets_wait_on() {
        let host = |me: &str| {
            let (tx, rx) = crossbeam_channel::bounded(64);
            let store = PeerStore::new(10, 1 << 20, Duration::from_secs(60));
            let p = Peer::new(me, Duration::from_millis(1), Duration::from_millis(5), store, PeerOut::new(tx, None));
            let link = Arc::new(PeerLink::bind(me, "127.0.0.1:0".parse().unwrap()).unwrap());
            assert!(p.attach_link(link.clone()));
            p.set_table(table(1, &["h1", "h2"]));
            (p, rx, link)
        };
        let ((a, a_bus, a_link), (b, b_bus, b_link)) = (host("h1"), host("h2"));
        // h1 offers its link to h2 on the bus; h2, new to it, offers back.
        a.offer_links(Instant::now());
        let offer = a_bus.try_recv().unwrap();
        assert_eq!(offer.to, "h2");
        assert!(matches!(PeerMessage::decode(&offer.body).unwrap(), PeerMessage::Offer(_)));
        b.receive("h1", &offer.body, Instant::now(), 0).unwrap();
        let back = b_bus.try_recv().unwrap();
        // h1 takes it as new too and offers once more; h2 has that offer:
        // the exchange ends there.
        a.receive("h2", &back.body, Instant::now(), 0).unwrap();
        let again = a_bus.try_recv().unwrap();
        assert_eq!(again.body, offer.body);
        b.receive("h1", &again.body, Instant::now(), 0).unwrap();
        assert!(b_bus.try_recv().is_err());
        // Offers are not due again within a second.
        a.offer_links(Instant::now());
        assert!(a_bus.try_recv().is_err());
        // A probe and its answer take the links, not the bus.
        a.suspect("h2");
        a.probe_suspects();
        assert!(a_bus.try_recv().is_err());
        let mut buf = vec![0u8; link::MAX_DATAGRAM];
        let (from, body) = b_link.receive(&mut buf, Duration::from_secs(2)).unwrap().unwrap();
        b.receive_link(&from, body, Instant::now(), 0).unwrap();
        assert!(b_bus.try_recv().is_err());
        let (from, body) = a_link.receive(&mut buf, Duration::from_secs(2)).unwrap().unwrap();
        a.receive_link(&from, body, Instant::now(), 0).unwrap();
        let mut s = Vec::new();
        a.suspects(&mut s);
        assert!(s.is_empty(), "the answer on the link ended the suspicion");
        // What only the bus may carry is refused from the link: an offer, a
        // commit, pool bindings, global tables.
        let bus_only = [
            PeerMessage::Offer(LinkOffer { addr: "127.0.0.1:9".into(), key: vec![1; link::KEY] }),
            PeerMessage::Held(crate::wire::CommitAck { lane: 1, seq: 1 }),
            PeerMessage::Global(GlobalBatch { deployment: "d".into(), nf: "n".into(), tables: Vec::new() }),
        ];
        for m in &bus_only {
            assert!(b.receive_link("h1", &m.encode().unwrap(), Instant::now(), 0).is_err(), "{m:?}");
        }
        assert!(b.receive_link("h1", b"\x01junk", Instant::now(), 0).is_err());
        let c = b.counters();
        assert_eq!((c.link_received, c.link_refused, c.link_sent), (1, 4, 1), "{c:?}");
        assert_eq!(c.link_addr, Some(b_link.addr().to_string()));
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
        let t = table(3, &["h1", "h2", "h3"]);
        for n in 0..64u16 {
            let k = FlowKey { src_port: n, ..FlowKey::default() };
            let prefs: Vec<&str> = t.preferences(t.slot_of(k.hash_normalized())).collect();
            let suspects = vec![prefs[1].to_string()];
            assert_eq!(next_live_owner(&t, prefs[0], &k, &suspects), Some(prefs[2]));
            assert_eq!(next_live_owner(&t, prefs[0], &k, &[]), Some(prefs[1]));
        }
    }

    #[test]
    fn only_newer_tables_replace_the_held_one() {
        let (tx, _rx) = crossbeam_channel::bounded(1);
        let p = Peer::new(
            "h1",
            Duration::from_millis(10),
            Duration::from_millis(2),
            PeerStore::new(10, 1 << 20, Duration::from_secs(1)),
            PeerOut::new(tx, None),
        );
        assert!(p.set_table(table(2, &["h1", "h2"])));
        assert!(!p.set_table(table(1, &["h1", "h2", "h3"])));
        assert_eq!(p.counters().table_version, Some(2));
    }
}
