//! The per-lane hook ([`LanePeer`]): a deployment's peer state on one
//! worker, the [`FlowHook`] its chain calls each batch. It marks the
//! flows a batch touched, imports the replicas held for them, holds the
//! packets of moved flows while their state is pulled, answers other
//! hosts' pulls and exports changed state to each flow's next owner.

use crate::commit::{self, Commits};
use crate::host::{Peer, host_by_hash, next_live_owner, next_owner};
use crate::out::Outgoing;
use crate::pull::{self, Outcome, Wait};
use crate::store::Replica;
use crate::wire::{
    self, BindingsKind, FlowRequest, NfPart, OffloadPart, PeerBatch, PeerFlow, PeerMessage, PoolBindings,
};
use crate::{HashMap, HashSet};
use sluice_group::{OwnershipTable, block_of};
use sluice_runtime::{Chain, Defer, FlowHook, Hold, NfInstance, RawPacket};
use sluice_wire::FlowKey;
use sluice_wire::steer::SteerMark;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// How a lane's flows leave: on the peer link where one is set up (a
/// pull's answer, which packets wait on), or on the bus (replication).
#[derive(Debug, Clone, Copy)]
enum Way {
    Quick,
    Bus,
}

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

impl Peer {
    /// The part of one deployment's lane on one worker; `replicated`: its
    /// packets wait for their flows' changed state to be held by the
    /// next owner (see [`crate::commit`]).
    pub fn lane(self: &Arc<Self>, deployment: &str, replicated: bool) -> LanePeer {
        self.asks.lane_started(deployment);
        LanePeer {
            commit: replicated.then(|| Commits::new(self.commit_lane())),
            refused: HashSet::default(),
            suspects: Vec::new(),
            route: None,
            seen: HashSet::default(),
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
            carried: Vec::new(),
        }
    }
}

/// The normalized flow of packet `p`, if it has one.
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
    /// Output commit, for a deployment with `durability = "replicated"`.
    commit: Option<Commits>,
    /// Flows of the last batch whose change could not be sent.
    refused: HashSet<FlowKey>,
    /// The hosts suspected dead as of this batch ([`Peer::suspect`]).
    suspects: Vec<String>,
    /// What output commit last sent each flow's changes by: the table and
    /// the hosts suspected then (with the peer's suspect epoch).
    route: Option<Route>,
    /// The flows of a batch's changes already looked at (kept between
    /// batches for its capacity).
    seen: HashSet<FlowKey>,
    /// Offload entries that came with imported replicas, for the chain.
    carried: Vec<(FlowKey, Vec<sluice_runtime::offload::Carried>)>,
}

/// How output commit picked next owners (see [`LanePeer::reroute`]).
#[derive(Debug)]
struct Route {
    table: Arc<OwnershipTable>,
    epoch: u64,
    suspects: Vec<String>,
}

/// How long a flow whose pull timed out still takes its late state.
pub const LATE: Duration = Duration::from_secs(2);

impl Drop for LanePeer {
    fn drop(&mut self) {
        self.peer.asks.lane_stopped(&self.deployment);
        if let Some(c) = &self.commit {
            self.peer.end_commit_lane(c.lane);
        }
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
                    self.peer.send_quick(&to, body, 0);
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
            c.wait_us.count(us);
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
            let mut g = self.peer.asks.list.lock();
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
                    let Some(sum) = flow_sum(chain, k) else { continue };
                    a.found.insert(*k);
                    // The asking host now holds it: it is sent again only
                    // when it changes.
                    self.sent.insert(*k, (sum, now));
                    // Without its offload entries: they return here.
                    flows.push(flow_out(chain, k, Vec::new()));
                }
                a.remaining = a.remaining.saturating_sub(1);
                if a.remaining == 0 {
                    let us = u64::try_from(now.saturating_duration_since(a.at).as_micros()).unwrap_or(u64::MAX);
                    let c = &self.peer.counts;
                    c.pulls_answered.fetch_add(1, Ordering::Relaxed);
                    c.pull_answer_us_total.fetch_add(us, Ordering::Relaxed);
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
            for k in self.send(&to, version, flows, Way::Quick) {
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
        let mut complete = chain.take_offload_changes(&mut self.changed);
        for stage in chain.stages_mut() {
            complete &= stage.take_flow_changes(&mut self.changed);
        }
        let Some(table) = self.peer.table() else {
            self.dirty.clear();
            return;
        };
        let me = self.peer.me.as_str();
        let mut candidates: Vec<(FlowKey, bool)> = Vec::new();
        // Flows this host owned until this table: their offload entries
        // leave with them.
        let mut leaving: HashSet<FlowKey> = HashSet::default();
        if self.table.as_ref().is_none_or(|t| t.version() != table.version()) {
            let before = self.table.clone();
            let mut handed = 0u64;
            let held =
                chain.stages().iter().flat_map(|s| s.flow_table().keys()).copied().chain(chain.offloaded_flows());
            for key in held {
                let k = &key;
                let old = before.as_deref().and_then(|t| next_owner(t, me, k));
                let leaves = before.as_deref().is_some_and(|t| owns(t, me, k)) && !owns(&table, me, k);
                if leaves || old != next_owner(&table, me, k) {
                    // Sent again whatever it was sent before.
                    self.sent.remove(k);
                    candidates.push((*k, false));
                    handed += 1;
                    if leaves {
                        leaving.insert(*k);
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
            candidates.extend(chain.offloaded_flows().map(|k| (k, true)));
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
            let flow = match flow_sum(chain, &k) {
                None => {
                    // The flow ended here: a replica sent before is forgotten.
                    if self.sent.remove(&k).is_none() {
                        continue;
                    }
                    PeerFlow { key: k.to_bytes().to_vec(), nfs: Vec::new(), offload: Vec::new() }
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
                    // Its owner sends its offload entries (a replica's
                    // copies); a host it leaves hands them over.
                    let entries = if leaving.contains(&k) {
                        chain.hand_over_offloads(&k)
                    } else if owns(&table, me, &k) {
                        chain.carry_offloads(&k)
                    } else {
                        Vec::new()
                    };
                    flow_out(chain, &k, entries)
                }
            };
            per_host.entry(to).or_default().push(flow);
        }
        self.peer.counts.flows_unchanged.fetch_add(unchanged, Ordering::Relaxed);
        self.peer.counts.flows_deferred.fetch_add(deferred, Ordering::Relaxed);
        self.quiet = quiet;
        for (to, flows) in per_host {
            // A flow that could not be sent is sent again at the next
            // interval it changes.
            for k in self.send(to, table.version(), flows, Way::Bus) {
                self.sent.remove(&k);
            }
        }
    }

    /// Sends flows to one host, in messages under [`crate::MAX_MESSAGE`],
    /// `way`. Returns the flows it could not send (the outbox to the bus
    /// full).
    fn send(&self, to: &str, version: u64, flows: Vec<PeerFlow>, way: Way) -> Vec<FlowKey> {
        let counts = &self.peer.counts;
        let mut unsent = Vec::new();
        for part in commit::chunks(flows) {
            let n = part.len();
            let batch = PeerBatch { deployment: self.deployment.clone(), table_version: version, flows: part };
            let message = PeerMessage::Flows(batch);
            let sent = message.encode().ok().map(|body| match way {
                Way::Quick => self.peer.send_quick(to, body, n),
                Way::Bus => self.peer.outbox.send(Outgoing { to: to.to_string(), body, flows: n }),
            });
            if sent == Some(true) {
                counts.flows_sent.fetch_add(n as u64, Ordering::Relaxed);
                counts.batches_sent.fetch_add(1, Ordering::Relaxed);
            } else {
                counts.flows_send_dropped.fetch_add(n as u64, Ordering::Relaxed);
                if let PeerMessage::Flows(batch) = &message {
                    unsent.extend(batch.flows.iter().filter_map(|f| FlowKey::from_bytes(&f.key)));
                }
            }
        }
        unsent
    }

    /// Whether its packets wait for their flows' changes to be held
    /// elsewhere (`durability = "replicated"`).
    pub fn commits(&self) -> bool {
        self.commit.is_some()
    }

    /// After its part of a batch ran (`leaves`: whether each of `packets`
    /// leaves the host): sends the flows whose state the batch changed to
    /// their next owners at once, and appends (index, decision) for the
    /// packets whose output waits for a change to be held there (at most
    /// `room` kept; see [`crate::commit`]). The others leave at once.
    pub fn defer(
        &mut self,
        chain: &mut Chain,
        packets: &[RawPacket<'_>],
        leaves: &[bool],
        mut room: usize,
        out: &mut Vec<(usize, Defer)>,
    ) {
        let Some(commit) = self.commit.as_mut() else { return };
        self.changed.clear();
        let mut complete = chain.take_offload_changes(&mut self.changed);
        for stage in chain.stages_mut() {
            complete &= stage.take_flow_changes(&mut self.changed);
        }
        if !complete {
            // Too many changed to note: every flow held may have.
            for stage in chain.stages() {
                self.changed.extend(stage.flow_table().keys().copied());
            }
        }
        // Flows whose last change was not held go again, changed or not.
        for k in commit.again() {
            self.sent.remove(&k);
            self.changed.push(k);
        }
        self.refused.clear();
        let table = self.peer.table();
        let now = Instant::now();
        self.peer.suspects(&mut self.suspects);
        if let Some(t) = &table {
            self.reroute(chain, t);
        }
        // Bindings of split pools the batch changed go first: every packet
        // of the batch that leaves waits for them (see [`commit`]).
        let gate = match table.as_deref() {
            Some(table) => self.send_bindings(chain, table, now),
            None => Gate::Open,
        };
        let me = self.peer.me.as_str();
        let Some(commit) = self.commit.as_mut() else { return };
        if !self.changed.is_empty()
            && let Some(table) = table.as_deref()
        {
            // A few next owners: a list, searched.
            let mut per_host: Vec<(&str, Vec<PeerFlow>)> = Vec::new();
            self.seen.clear();
            let chain: &Chain = chain;
            for k in self.changed.iter().map(FlowKey::normalized) {
                if !self.seen.insert(k) {
                    continue;
                }
                // A group of one: nowhere to hold it, its packets pass.
                let Some(to) = next_live_owner(table, me, &k, &self.suspects) else { continue };
                if !changed_since_sent(chain, &self.sent, &k) {
                    continue;
                }
                // A message to its next owner is on its way: the flow goes
                // with the next one, as it is then.
                if commit.busy_towards(to) {
                    commit.add_open(&self.peer, to, k);
                    continue;
                }
                let Some(flow) = commit_part(chain, &mut self.sent, &k, now, owns(table, me, &k)) else { continue };
                match per_host.iter_mut().find(|(h, _)| *h == to) {
                    Some((_, v)) => v.push(flow),
                    None => per_host.push((to, vec![flow])),
                }
            }
            for (to, flows) in per_host {
                for part in commit::chunks(flows) {
                    let keys: Vec<FlowKey> = part.iter().filter_map(|f| FlowKey::from_bytes(&f.key)).collect();
                    let batch =
                        PeerBatch { deployment: self.deployment.clone(), table_version: table.version(), flows: part };
                    if !commit.has_room() || !commit.send(&self.peer, to, batch, keys.clone(), now, None) {
                        self.refused.extend(keys.iter().copied());
                        commit.retry(keys);
                    }
                }
            }
        }
        self.flush(chain, now);
        let Some(commit) = self.commit.as_mut() else { return };
        if !commit.pending() && self.refused.is_empty() && gate == Gate::Open {
            return;
        }
        let gate_ticket = match gate {
            Gate::Wait(t) => Some(t),
            Gate::Open | Gate::Shut => None,
        };
        let (mut deferred, mut dropped) = (0u64, 0u64);
        for (i, (p, &leaves)) in packets.iter().zip(leaves).enumerate() {
            if !leaves {
                continue;
            }
            let k = flow_of(p);
            if gate == Gate::Shut || k.is_some_and(|k| self.refused.contains(&k)) {
                out.push((i, Defer::Drop));
                dropped += 1;
            } else if let Some(ticket) = k.and_then(|k| commit.ticket_of(&k)).or(gate_ticket) {
                if room > 0 {
                    room -= 1;
                    commit.deferred(ticket);
                    out.push((i, Defer::Keep(ticket)));
                    deferred += 1;
                } else {
                    out.push((i, Defer::Drop));
                    dropped += 1;
                }
            }
        }
        let c = &self.peer.counts;
        c.packets_deferred.fetch_add(deferred, Ordering::Relaxed);
        c.packets_commit_dropped.fetch_add(dropped, Ordering::Relaxed);
    }

    /// After the table or the hosts suspected dead changed: the flows held
    /// here whose next live owner is another host than the one their
    /// changes went to are sent again (their packets wait for it), so the
    /// host that would take them over holds them whether or not they
    /// change — and a host suspected wrongly gets back the flows that went
    /// past it meanwhile.
    fn reroute(&mut self, chain: &Chain, table: &Arc<OwnershipTable>) {
        let epoch = self.peer.suspect_epoch();
        if self.route.as_ref().is_some_and(|r| r.table.version() == table.version() && r.epoch == epoch) {
            return;
        }
        let me = self.peer.me.as_str();
        if let Some(old) = self.route.take() {
            for stage in chain.stages() {
                for k in stage.flow_table().keys() {
                    if next_live_owner(&old.table, me, k, &old.suspects)
                        != next_live_owner(table, me, k, &self.suspects)
                    {
                        self.sent.remove(k);
                        self.changed.push(*k);
                    }
                }
            }
        }
        self.route = Some(Route { table: table.clone(), epoch, suspects: self.suspects.clone() });
    }

    /// Sends the bindings of split pools that the batch's calls changed
    /// (and those not held in time before) to their blocks' next owners.
    fn send_bindings(&mut self, chain: &mut Chain, table: &OwnershipTable, now: Instant) -> Gate {
        let Some(commit) = self.commit.as_mut() else { return Gate::Open };
        for (nf, pool, resources) in commit.again_bindings() {
            if let Some(stage) = chain.stages_mut().iter_mut().find(|s| s.name() == nf) {
                stage.renote_pool_changes(&pool, &resources);
            }
        }
        let me = self.peer.me.as_str();
        let mut gate = Gate::Open;
        let mut changes = Vec::new();
        for stage in chain.stages_mut() {
            changes.clear();
            stage.take_pool_changes(&mut changes);
            for (pool, entries) in changes.drain(..) {
                let mut per_host: HashMap<&str, Vec<sluice_state::PoolChange>> = HashMap::default();
                for (r, v) in entries {
                    let mut prefs = table.block_preferences(block_of(r));
                    // Bound on another host (a flow that moved here
                    // released it): its owner is told with the pools' tick.
                    if prefs.next() != Some(me) {
                        continue;
                    }
                    if let Some(next) = prefs.find(|h| !self.suspects.iter().any(|s| s == h)) {
                        per_host.entry(next).or_default().push((r, v));
                    }
                }
                for (to, entries) in per_host {
                    for part in entries.chunks(crate::wire::MAX_BINDINGS) {
                        let bindings = PoolBindings {
                            deployment: self.deployment.clone(),
                            nf: stage.name().to_string(),
                            pool: pool.clone(),
                            kind: BindingsKind::Replica,
                            blocks: Vec::new(),
                            entries: part.to_vec(),
                        };
                        let sent =
                            if commit.has_room() { commit.send_bindings(&self.peer, to, bindings, now) } else { None };
                        match sent {
                            Some(t) if gate != Gate::Shut => gate = Gate::Wait(t),
                            Some(_) => {}
                            None => {
                                let resources = part.iter().map(|(r, _)| *r).collect();
                                commit.retry_bindings(stage.name(), &pool, resources);
                                gate = Gate::Shut;
                            }
                        }
                    }
                }
            }
        }
        gate
    }

    /// Appends the tickets of deferred packets that may leave now (their
    /// flows' changes are held elsewhere) to `leave`, and of those that may
    /// not (not held in time) to `drop`.
    pub fn settle(&mut self, chain: &Chain, leave: &mut Vec<u64>, drop: &mut Vec<u64>) {
        if let Some(c) = self.commit.as_mut()
            && c.pending()
        {
            let now = Instant::now();
            c.settle(&self.peer, now, leave, drop);
            self.flush(chain, now);
        }
    }

    /// Sends the open sets (see [`commit::Open`]) whose next owner holds
    /// every earlier message, their flows' state as it is now.
    fn flush(&mut self, chain: &Chain, now: Instant) {
        let Some(commit) = self.commit.as_mut() else { return };
        let ready = commit.take_ready(&self.suspects);
        if ready.is_empty() {
            return;
        }
        let table = self.peer.table();
        let version = table.as_ref().map_or(0, |t| t.version());
        let me = self.peer.me.as_str();
        for (to, open) in ready {
            // Flows whose next owner looks dead go to the host after it.
            let mut per_host: Vec<(&str, Vec<PeerFlow>)> = Vec::new();
            for k in &open.keys {
                let dest = if self.suspects.contains(&to) {
                    table.as_deref().and_then(|t| next_live_owner(t, me, k, &self.suspects))
                } else {
                    Some(to.as_str())
                };
                let Some(dest) = dest else { continue };
                let owner = table.as_deref().is_some_and(|t| owns(t, me, k));
                let Some(flow) = commit_part(chain, &mut self.sent, k, now, owner) else { continue };
                match per_host.iter_mut().find(|(h, _)| *h == dest) {
                    Some((_, v)) => v.push(flow),
                    None => per_host.push((dest, vec![flow])),
                }
            }
            // Nothing left to send (written back unchanged, or ended
            // unsent): an empty message still lets its packets go in order.
            let mut parts: Vec<(&str, Vec<PeerFlow>)> = Vec::new();
            for (h, flows) in per_host {
                parts.extend(commit::chunks(flows).into_iter().map(|p| (h, p)));
            }
            if parts.is_empty() {
                if self.suspects.contains(&to) {
                    // Nowhere to say so in order: its packets drop.
                    commit.lose(&self.peer, open);
                    continue;
                }
                parts.push((to.as_str(), Vec::new()));
            }
            let mut sent = true;
            for (i, (dest, part)) in parts.into_iter().enumerate() {
                let keys: Vec<FlowKey> = part.iter().filter_map(|f| FlowKey::from_bytes(&f.key)).collect();
                let batch = PeerBatch { deployment: self.deployment.clone(), table_version: version, flows: part };
                let packets = if i == 0 { open.packets() } else { 0 };
                sent &=
                    commit.has_room() && commit.send(&self.peer, dest, batch, keys, now, Some((open.ticket, packets)));
                if !sent {
                    break;
                }
            }
            if !sent {
                commit.lose(&self.peer, open);
            }
        }
    }
}

/// What the packets of a batch that changed pool bindings wait for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gate {
    /// It changed none: nothing.
    Open,
    /// The last of the messages carrying them (by its ticket).
    Wait(u64),
    /// One could not be sent: the batch's packets may not leave.
    Shut,
}

/// Whether flow `k`'s state is not what was last sent of it (sent
/// neither; ended after it was sent; written since).
fn changed_since_sent(chain: &Chain, sent: &HashMap<FlowKey, (u64, Instant)>, k: &FlowKey) -> bool {
    match flow_sum(chain, k) {
        None => sent.contains_key(k),
        // Every write counts a clock up: an equal sum is the same state.
        Some(sum) => sent.get(k).is_none_or(|&(s, _)| s != sum),
    }
}

/// Flow `k` to send as its state is now (with copies of its offload
/// entries where `owner`), noted as sent: without parts when it ended
/// after it was sent (the replica is forgotten); `None` when there is
/// nothing to send.
fn commit_part(
    chain: &Chain,
    sent: &mut HashMap<FlowKey, (u64, Instant)>,
    k: &FlowKey,
    now: Instant,
    owner: bool,
) -> Option<PeerFlow> {
    match flow_sum(chain, k) {
        None => sent.remove(k).map(|_| PeerFlow { key: k.to_bytes().to_vec(), nfs: Vec::new(), offload: Vec::new() }),
        Some(sum) if sent.get(k).is_some_and(|&(s, _)| s == sum) => None,
        Some(sum) => {
            sent.insert(*k, (sum, now));
            let entries = if owner { chain.carry_offloads(k) } else { Vec::new() };
            Some(flow_out(chain, k, entries))
        }
    }
}

/// What this host holds of flow `k`, summed: its NFs' logical clocks and
/// its offload entries' [`Chain::offload_sum`]. Every change changes it;
/// `None` when nothing of the flow is held here.
fn flow_sum(chain: &Chain, k: &FlowKey) -> Option<u64> {
    let nfs = chain.stages().iter().filter_map(|s| s.flow_clock(k)).reduce(u64::wrapping_add);
    match (nfs, chain.offload_sum(k)) {
        (None, 0) => None,
        (nfs, entries) => Some(nfs.unwrap_or(0).wrapping_add(entries)),
    }
}

/// Flow `k` as it leaves this host: each NF's state of it, and `entries`.
fn flow_out(chain: &Chain, k: &FlowKey, entries: Vec<sluice_runtime::offload::Carried>) -> PeerFlow {
    PeerFlow {
        key: k.to_bytes().to_vec(),
        nfs: chain
            .stages()
            .iter()
            .enumerate()
            .filter_map(|(i, s)| chain.export_flow(i, k).map(|e| NfPart::of(s.name(), &e)))
            .collect(),
        offload: entries.iter().map(OffloadPart::of).collect(),
    }
}

/// Whether `me` owns flow `k` by `table`.
fn owns(table: &OwnershipTable, me: &str, k: &FlowKey) -> bool {
    table.owner(k.hash_normalized()) == Some(me)
}

impl FlowHook for LanePeer {
    /// The offload entries that came with the replicas [`before`] took in.
    ///
    /// [`before`]: FlowHook::before
    fn carried(&mut self, out: &mut Vec<(FlowKey, Vec<sluice_runtime::offload::Carried>)>) {
        out.append(&mut self.carried);
    }

    /// Marks the batch's flows for the next export, imports the replicas
    /// held for flows new since the last one, and counts the moved
    /// flowlets by whether their state is here.
    fn before(&mut self, stages: &mut [NfInstance], keys: &[FlowKey]) {
        for stage in stages.iter_mut() {
            stage.track_flow_changes();
            if self.commit.is_some() {
                stage.track_pool_changes();
            }
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
                if !replica.offload.is_empty() {
                    let entries = replica.offload.iter().filter_map(OffloadPart::to_carried).collect();
                    self.carried.push((key, entries));
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
        let table = if self.moved.is_empty() { None } else { self.peer.table() };
        for (k, previous) in self.moved.drain(..) {
            counts.flowlets_moved_in.fetch_add(1, Ordering::Relaxed);
            // The dispatcher moved a flow away from the host the table
            // still gives it to: it saw that host's link or beacons go.
            if let Some(t) = table.as_deref()
                && let Some(owner) = t.owner(k.hash_normalized())
                && host_by_hash(t, previous) == Some(owner)
            {
                self.peer.suspect(owner);
            }
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
