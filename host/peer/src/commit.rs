//! Output commit (SNF §6): with `durability = "replicated"`, a packet
//! whose processing changed its flow's state leaves only once that state
//! is held by the flow's next owner, so a `kill -9` of this host loses no
//! state that any packet out of it depended on.
//!
//! After a lane's part of a batch ran, the flows whose state it changed
//! (as the state noted them: written, imported or ended) are sent at once
//! to their next owners ([`crate::PeerMessage::Commit`], numbered per
//! lane), and the lane's packets of every flow with a change not yet held
//! elsewhere are *deferred*: the worker's packet I/O keeps their output
//! (rewritten, ready to send) under a ticket. The next owner keeps the
//! flows as replicas and answers [`crate::PeerMessage::Held`]; the lane
//! then lets the packets of every message up to the first one not held go,
//! in the order they were deferred (a flow's packets never overtake one
//! another). Packets of flows whose state did not change and had no change
//! waiting pass at once.
//!
//! Bindings of split release pools (a NAT's public ports) that a batch
//! bound or released go the same way, before its flows, to their blocks'
//! next owner ([`crate::PeerMessage::CommitBindings`]); every packet of
//! that batch that leaves waits for them (a reply to a public port must
//! find its binding on whichever host takes the port's block over).
//!
//! A message not held within [`WAIT`] (its next owner is dead, slow or
//! full, or the message was lost) lets nothing go: its packets are dropped
//! (counted) and its flows are sent again with their next packet, so no
//! packet ever leaves on state that only this host holds. Bindings not held
//! in time take every later message's packets with them (those depended on
//! them) and are sent again, as they are then, with the next batch. A flow
//! without a
//! next owner (a group of one) has nowhere to be held, and its packets pass.

use crate::host::Peer;
use crate::wire::{BindingsCommit, CommitBatch, PeerBatch, PeerFlow, PeerMessage, PoolBindings};
use crate::{HashMap, HashSet};
use sluice_wire::FlowKey;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// How long a lane waits for its next owner to hold a change before it
/// drops the packets that depend on it.
pub const WAIT: Duration = Duration::from_millis(50);
/// Messages of one lane waiting to be held, at most: a lane over it sends
/// no more and drops the packets that would wait.
pub const MAX_OUTSTANDING: usize = 4096;

/// A message waiting to be held.
#[derive(Debug)]
struct Outstanding {
    seq: u64,
    /// The host it went to (only its answer counts).
    to: String,
    /// The ticket its packets wait under.
    ticket: u64,
    at: Instant,
    keys: Vec<FlowKey>,
    /// Packets deferred under its ticket.
    packets: u64,
    /// Pool bindings it carries: (NF, pool, resources). Every later
    /// message's packets depend on them, so they fall with it.
    bindings: Option<(String, String, Vec<u64>)>,
}

/// Flows changed while a message to their next owner was on its way:
/// sent together, their state as it is then, once that host holds every
/// earlier message (one export per flow per round trip, however many of
/// its packets changed it).
#[derive(Debug)]
pub(crate) struct Open {
    /// The ticket their packets wait under.
    pub ticket: u64,
    pub keys: Vec<FlowKey>,
    set: HashSet<FlowKey>,
    packets: u64,
}

impl Open {
    /// Packets waiting under its ticket.
    pub fn packets(&self) -> u64 {
        self.packets
    }
}

/// A lane's output commit.
#[derive(Debug)]
pub(crate) struct Commits {
    /// The lane's id on this host.
    pub lane: u64,
    next_seq: u64,
    /// Messages sent and not held yet, in order.
    outstanding: VecDeque<Outstanding>,
    /// Messages held, not yet first in line.
    held: HashSet<u64>,
    /// Flows with a change not held yet: the ticket of their newest.
    waiting: HashMap<FlowKey, u64>,
    /// Flows whose change was not held (or not sent): sent again with
    /// their next packet, changed or not.
    again: HashSet<FlowKey>,
    acks: Vec<(String, u64)>,
    /// Per next owner, the flows that wait for the messages to it to be
    /// held before they go.
    open: HashMap<String, Open>,
    /// Tickets of open sets that could not be sent: their packets drop.
    lost: Vec<u64>,
    /// Tickets dropped while more parts of their open set were on their
    /// way.
    dropped: HashSet<u64>,
    /// Pool bindings not held in time: (NF, pool, resources), sent again,
    /// as they are then, with the next batch.
    again_bindings: Vec<(String, String, Vec<u64>)>,
}

impl Commits {
    pub fn new(lane: u64) -> Commits {
        Commits {
            lane,
            next_seq: 1,
            outstanding: VecDeque::new(),
            held: HashSet::default(),
            waiting: HashMap::default(),
            again: HashSet::default(),
            acks: Vec::new(),
            open: HashMap::default(),
            lost: Vec::new(),
            dropped: HashSet::default(),
            again_bindings: Vec::new(),
        }
    }

    /// An open set could not be sent: its packets are dropped and its
    /// flows go again.
    pub fn lose(&mut self, peer: &Peer, open: Open) {
        peer.counts.packets_commit_dropped.fetch_add(open.packets, Ordering::Relaxed);
        for k in &open.keys {
            if self.waiting.get(k) == Some(&open.ticket) {
                self.waiting.remove(k);
            }
        }
        self.again.extend(open.keys);
        self.lost.push(open.ticket);
    }

    /// Whether a message to host `to` is on its way (not yet let go).
    pub fn busy_towards(&self, to: &str) -> bool {
        self.outstanding.iter().any(|o| o.to == to)
    }

    /// Flow `k` changed while a message to its next owner `to` is on its
    /// way: it goes with the next one (see [`Open`]); its packets wait
    /// for that one from now on.
    pub fn add_open(&mut self, peer: &Peer, to: &str, k: FlowKey) {
        let open = self.open.entry(to.to_string()).or_insert_with(|| Open {
            ticket: peer.tickets.fetch_add(1, Ordering::Relaxed),
            keys: Vec::new(),
            set: HashSet::default(),
            packets: 0,
        });
        if open.set.insert(k) {
            open.keys.push(k);
        }
        self.waiting.insert(k, open.ticket);
    }

    /// The open sets whose host has no message on its way, or is
    /// suspected dead (their flows go elsewhere): to send now.
    pub fn take_ready(&mut self, suspects: &[String]) -> Vec<(String, Open)> {
        if self.open.is_empty() {
            return Vec::new();
        }
        let ready: Vec<String> = self
            .open
            .keys()
            .filter(|to| !self.busy_towards(to) || suspects.iter().any(|s| s == *to))
            .cloned()
            .collect();
        ready.into_iter().filter_map(|to| self.open.remove(&to).map(|o| (to, o))).collect()
    }

    /// Flows sent again whatever changed (their last change was not held).
    pub fn again(&mut self) -> impl Iterator<Item = FlowKey> + '_ {
        self.again.drain()
    }

    /// The ticket a packet of flow `k` waits under, if its flow has a
    /// change not held yet.
    pub fn ticket_of(&self, k: &FlowKey) -> Option<u64> {
        self.waiting.get(k).copied()
    }

    /// A packet waits under `ticket` (a ticket of [`Commits::ticket_of`]).
    pub fn deferred(&mut self, ticket: u64) {
        if let Some(o) = self.outstanding.iter_mut().rev().find(|o| o.ticket == ticket) {
            o.packets += 1;
        } else if let Some(o) = self.open.values_mut().find(|o| o.ticket == ticket) {
            o.packets += 1;
        }
    }

    /// Flows whose change could not be sent: sent again with their next
    /// packet.
    pub fn retry(&mut self, keys: Vec<FlowKey>) {
        self.again.extend(keys);
    }

    /// Whether it may send another message.
    pub fn has_room(&self) -> bool {
        self.outstanding.len() < MAX_OUTSTANDING
    }

    /// Sends `flows` (their `keys`) to host `to` as one message; true if
    /// the outbox took it. Their packets wait from now on, under `ticket`
    /// (an open set's, with the `packets` already waiting) or a new one.
    pub fn send(
        &mut self,
        peer: &Peer,
        to: &str,
        batch: PeerBatch,
        keys: Vec<FlowKey>,
        now: Instant,
        ticket: Option<(u64, u64)>,
    ) -> bool {
        let seq = self.next_seq;
        let n = batch.flows.len();
        let m = PeerMessage::Commit(CommitBatch { lane: self.lane, seq, batch });
        let sent =
            m.encode().is_ok_and(|body| peer.outbox.send(crate::Outgoing { to: to.to_string(), body, flows: n }));
        let c = &peer.counts;
        if !sent {
            c.flows_send_dropped.fetch_add(n as u64, Ordering::Relaxed);
            return false;
        }
        self.next_seq += 1;
        c.flows_sent.fetch_add(n as u64, Ordering::Relaxed);
        c.batches_sent.fetch_add(1, Ordering::Relaxed);
        c.commits_sent.fetch_add(1, Ordering::Relaxed);
        let (ticket, packets) = ticket.unwrap_or_else(|| (peer.tickets.fetch_add(1, Ordering::Relaxed), 0));
        for k in &keys {
            // A newer change waiting in an open set keeps its ticket.
            if self.open.get(to).is_none_or(|o| !o.set.contains(k)) {
                self.waiting.insert(*k, ticket);
            }
        }
        self.outstanding.push_back(Outstanding {
            seq,
            to: to.to_string(),
            ticket,
            at: now,
            keys,
            packets,
            bindings: None,
        });
        true
    }

    /// Sends bindings of a split pool to host `to`, the next owner of
    /// their blocks; true if the outbox took it. Returns its ticket: the
    /// packets of the batch that changed them wait for it (and every
    /// message after it is let go only once it is held, or falls with it).
    pub fn send_bindings(&mut self, peer: &Peer, to: &str, bindings: PoolBindings, now: Instant) -> Option<u64> {
        let seq = self.next_seq;
        let resources: Vec<u64> = bindings.entries.iter().map(|(r, _)| *r).collect();
        let (nf, pool) = (bindings.nf.clone(), bindings.pool.clone());
        let m = PeerMessage::CommitBindings(BindingsCommit { lane: self.lane, seq, bindings });
        let sent =
            m.encode().is_ok_and(|body| peer.outbox.send(crate::Outgoing { to: to.to_string(), body, flows: 0 }));
        if !sent {
            return None;
        }
        self.next_seq += 1;
        peer.counts.commits_sent.fetch_add(1, Ordering::Relaxed);
        let ticket = peer.tickets.fetch_add(1, Ordering::Relaxed);
        self.outstanding.push_back(Outstanding {
            seq,
            to: to.to_string(),
            ticket,
            at: now,
            keys: Vec::new(),
            packets: 0,
            bindings: Some((nf, pool, resources)),
        });
        Some(ticket)
    }

    /// Pool bindings whose message was not held in time (or not sent):
    /// (NF, pool, resources) to send again, as they are now.
    pub fn again_bindings(&mut self) -> Vec<(String, String, Vec<u64>)> {
        std::mem::take(&mut self.again_bindings)
    }

    /// Bindings could not be sent: sent again with the next batch.
    pub fn retry_bindings(&mut self, nf: &str, pool: &str, resources: Vec<u64>) {
        self.again_bindings.push((nf.to_string(), pool.to_string(), resources));
    }

    /// A message carrying bindings was not held in time: every message
    /// after it and every open set depended on it, so their packets drop
    /// and their flows go again.
    fn fall_after(&mut self, peer: &Peer, drop: &mut Vec<u64>) {
        let c = &peer.counts;
        let mut fallen = Vec::new();
        for o in &self.outstanding {
            if self.dropped.insert(o.ticket) {
                c.packets_commit_dropped.fetch_add(o.packets, Ordering::Relaxed);
                drop.push(o.ticket);
                fallen.push(o.ticket);
            }
            self.again.extend(o.keys.iter().copied());
        }
        self.waiting.retain(|_, t| !fallen.contains(t));
        let open: Vec<Open> = self.open.drain().map(|(_, o)| o).collect();
        for o in open {
            self.lose(peer, o);
        }
        drop.append(&mut self.lost);
    }

    /// Takes the answers that arrived, then appends the tickets whose
    /// packets may leave (every message up to them held) to `leave`, and
    /// those whose packets may not (a message not held within [`WAIT`])
    /// to `drop`.
    pub fn settle(&mut self, peer: &Peer, now: Instant, leave: &mut Vec<u64>, drop: &mut Vec<u64>) {
        drop.append(&mut self.lost);
        if self.outstanding.is_empty() {
            return;
        }
        peer.take_acks(self.lane, &mut self.acks);
        for (from, seq) in self.acks.drain(..) {
            // Only the host it went to may say it holds it.
            if self.outstanding.iter().any(|o| o.seq == seq && o.to == from) {
                self.held.insert(seq);
            }
        }
        let c = &peer.counts;
        let mut suspects = Vec::new();
        peer.suspects(&mut suspects);
        while let Some(first) = self.outstanding.front() {
            let held = self.held.remove(&first.seq);
            // A message to a host suspected dead will not be held: it falls
            // at once rather than after the wait.
            let gone = suspects.contains(&first.to);
            let late = !held && (gone || now.saturating_duration_since(first.at) >= WAIT);
            if late && !gone {
                peer.suspect(&first.to);
                suspects.push(first.to.clone());
            }
            if !held && !late {
                break;
            }
            let Some(o) = self.outstanding.pop_front() else { break };
            // The parts of an open set too large for one message share its
            // ticket: it is let go with the last of them, and dropped with
            // the first not held.
            let last = !self.outstanding.iter().any(|m| m.ticket == o.ticket);
            if last {
                for k in &o.keys {
                    if self.waiting.get(k) == Some(&o.ticket) {
                        self.waiting.remove(k);
                    }
                }
            }
            let dropped = self.dropped.contains(&o.ticket);
            if held {
                c.commits_held.fetch_add(1, Ordering::Relaxed);
                let us = u64::try_from(now.saturating_duration_since(o.at).as_micros()).unwrap_or(u64::MAX);
                c.commit_wait_us_total.fetch_add(us, Ordering::Relaxed);
                c.commit_wait_us.count(us);
                if last && !dropped {
                    leave.push(o.ticket);
                }
            } else {
                c.commits_timed_out.fetch_add(1, Ordering::Relaxed);
                self.again.extend(o.keys.iter().copied());
                if let Some((nf, pool, resources)) = o.bindings {
                    self.again_bindings.push((nf, pool, resources));
                    self.fall_after(peer, drop);
                }
                if !dropped {
                    c.packets_commit_dropped.fetch_add(o.packets, Ordering::Relaxed);
                    drop.push(o.ticket);
                    if !last {
                        self.dropped.insert(o.ticket);
                        // Its packets no longer wait for the other parts.
                        self.waiting.retain(|_, t| *t != o.ticket);
                    }
                }
            }
            if last {
                self.dropped.remove(&o.ticket);
            }
        }
    }

    /// Whether any message waits to be held or sent.
    pub fn pending(&self) -> bool {
        !self.outstanding.is_empty() || !self.open.is_empty() || !self.lost.is_empty()
    }
}

/// Splits `flows` into messages under [`crate::MAX_MESSAGE`] (encoded
/// size, roughly: key, names, values, varints).
pub(crate) fn chunks(flows: Vec<PeerFlow>) -> Vec<Vec<PeerFlow>> {
    let mut out = Vec::new();
    let mut part = Vec::new();
    let mut size = 0usize;
    for f in flows {
        let s = 48 + f.nfs.iter().map(|p| 32 + p.nf.len() + p.bytes() + 24 * p.tables.len()).sum::<usize>();
        if size + s > crate::MAX_MESSAGE && !part.is_empty() {
            out.push(std::mem::take(&mut part));
            size = 0;
        }
        size += s;
        part.push(f);
    }
    if !part.is_empty() {
        out.push(part);
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;
    use crate::out::{Outgoing, PeerOut};
    use crate::store::PeerStore;
    use crate::wire::CommitAck;
    use std::sync::Arc;

    fn peer() -> (Arc<Peer>, crossbeam_channel::Receiver<Outgoing>) {
        let (tx, rx) = crossbeam_channel::bounded(64);
        let store = PeerStore::new(1000, 1 << 20, Duration::from_secs(60));
        let p = Peer::new("h1", Duration::from_millis(1), Duration::from_millis(5), store, PeerOut::new(tx, None));
        (p, rx)
    }

    fn key(n: u16) -> FlowKey {
        FlowKey { src_port: n, dst_port: 80, protocol: 6, ..FlowKey::default() }.normalized()
    }

    fn batch(keys: &[FlowKey]) -> PeerBatch {
        PeerBatch {
            deployment: "d".into(),
            table_version: 1,
            flows: keys
                .iter()
                .map(|k| PeerFlow { key: k.to_bytes().to_vec(), nfs: Vec::new(), offload: Vec::new() })
                .collect(),
        }
    }

    fn ack(p: &Peer, from: &str, lane: u64, seq: u64) {
        let m = PeerMessage::Held(CommitAck { lane, seq }).encode().unwrap();
        p.receive(from, &m, Instant::now(), 0).unwrap();
    }

    #[test]
    fn packets_leave_in_order_once_every_message_before_theirs_is_held() {
        let (p, rx) = peer();
        let mut c = Commits::new(p.commit_lane());
        let t0 = Instant::now();
        assert!(c.send(&p, "h2", batch(&[key(1)]), vec![key(1)], t0, None));
        assert!(c.send(&p, "h3", batch(&[key(2)]), vec![key(2)], t0, None));
        assert_eq!(rx.len(), 2);
        let (a, b) = (c.ticket_of(&key(1)).unwrap(), c.ticket_of(&key(2)).unwrap());
        assert_ne!(a, b);
        // The second is held first: nothing leaves until the first is.
        ack(&p, "h3", c.lane, 2);
        let (mut leave, mut drop) = (Vec::new(), Vec::new());
        c.settle(&p, t0, &mut leave, &mut drop);
        assert!(leave.is_empty() && drop.is_empty());
        // An answer from a host the message did not go to counts for nothing.
        ack(&p, "h3", c.lane, 1);
        c.settle(&p, t0, &mut leave, &mut drop);
        assert!(leave.is_empty());
        ack(&p, "h2", c.lane, 1);
        c.settle(&p, t0, &mut leave, &mut drop);
        assert_eq!((leave, drop), (vec![a, b], vec![]));
        assert!(!c.pending());
        assert_eq!((c.ticket_of(&key(1)), c.ticket_of(&key(2))), (None, None));
        assert_eq!(p.counters().commits_held, 2);
        assert_eq!(p.counters().commit_wait_us.iter().sum::<u64>(), 2);
    }

    #[test]
    fn flows_changed_while_a_message_is_on_its_way_go_together_with_the_next() {
        let (p, rx) = peer();
        let mut c = Commits::new(p.commit_lane());
        let t0 = Instant::now();
        assert!(c.send(&p, "h2", batch(&[key(1)]), vec![key(1)], t0, None));
        let first = c.ticket_of(&key(1)).unwrap();
        assert!(c.busy_towards("h2") && !c.busy_towards("h3"));
        // Flow 1 changes again and flow 2 changes: both wait for the next
        // message to h2, which is not sent while the first is on its way.
        c.add_open(&p, "h2", key(1));
        c.add_open(&p, "h2", key(2));
        c.add_open(&p, "h2", key(1));
        let next = c.ticket_of(&key(1)).unwrap();
        assert_ne!(next, first);
        assert_eq!(c.ticket_of(&key(2)), Some(next));
        c.deferred(next);
        assert!(c.take_ready(&[]).is_empty());
        ack(&p, "h2", c.lane, 1);
        let (mut leave, mut drop) = (Vec::new(), Vec::new());
        c.settle(&p, t0, &mut leave, &mut drop);
        assert_eq!(leave, vec![first]);
        // Flow 1 still waits, for the open set.
        assert_eq!(c.ticket_of(&key(1)), Some(next));
        let ready = c.take_ready(&[]);
        assert_eq!(ready.len(), 1);
        let (to, open) = ready.into_iter().next().unwrap();
        assert_eq!((to.as_str(), open.keys.clone(), open.packets()), ("h2", vec![key(1), key(2)], 1));
        assert!(c.send(&p, &to, batch(&open.keys), open.keys.clone(), t0, Some((open.ticket, open.packets()))));
        assert_eq!(rx.len(), 2);
        ack(&p, "h2", c.lane, 2);
        let (mut leave, mut drop) = (Vec::new(), Vec::new());
        c.settle(&p, t0, &mut leave, &mut drop);
        assert_eq!((leave, drop), (vec![next], vec![]));
        assert!(!c.pending());
    }

    #[test]
    fn the_parts_of_one_open_set_let_its_packets_go_with_the_last_and_drop_them_with_the_first_lost() {
        let (p, _rx) = peer();
        let mut c = Commits::new(p.commit_lane());
        let t0 = Instant::now();
        let t = 99;
        assert!(c.send(&p, "h2", batch(&[key(1)]), vec![key(1)], t0, Some((t, 3))));
        assert!(c.send(&p, "h2", batch(&[key(2)]), vec![key(2)], t0, Some((t, 0))));
        ack(&p, "h2", c.lane, 1);
        let (mut leave, mut drop) = (Vec::new(), Vec::new());
        c.settle(&p, t0, &mut leave, &mut drop);
        assert!(leave.is_empty() && drop.is_empty(), "not before the last part");
        ack(&p, "h2", c.lane, 2);
        c.settle(&p, t0, &mut leave, &mut drop);
        assert_eq!((leave, drop), (vec![t], vec![]));
        // The first part lost: dropped at once, and the held last part
        // lets nothing go.
        assert!(c.send(&p, "h2", batch(&[key(1)]), vec![key(1)], t0, Some((t + 1, 2))));
        assert!(c.send(&p, "h2", batch(&[key(2)]), vec![key(2)], t0 + WAIT, Some((t + 1, 0))));
        ack(&p, "h2", c.lane, 4);
        let (mut leave, mut drop) = (Vec::new(), Vec::new());
        c.settle(&p, t0 + WAIT, &mut leave, &mut drop);
        assert_eq!((leave, drop), (vec![], vec![t + 1]));
        assert!(!c.pending());
    }

    #[test]
    fn a_message_not_held_in_time_drops_its_packets_and_its_flows_go_again() {
        let (p, _rx) = peer();
        let mut c = Commits::new(p.commit_lane());
        let t0 = Instant::now();
        assert!(c.send(&p, "h2", batch(&[key(1), key(2)]), vec![key(1), key(2)], t0, None));
        let t = c.ticket_of(&key(1)).unwrap();
        c.deferred(t);
        c.deferred(t);
        let (mut leave, mut drop) = (Vec::new(), Vec::new());
        c.settle(&p, t0 + WAIT / 2, &mut leave, &mut drop);
        assert!(drop.is_empty());
        c.settle(&p, t0 + WAIT, &mut leave, &mut drop);
        assert_eq!((leave, drop), (vec![], vec![t]));
        let mut again: Vec<FlowKey> = c.again().collect();
        again.sort_by_key(|k| k.src_port);
        assert_eq!(again, vec![key(1), key(2)]);
        let counts = p.counters();
        assert_eq!((counts.commits_timed_out, counts.packets_commit_dropped), (1, 2));
        // A late answer finds nothing to let go.
        ack(&p, "h2", c.lane, 1);
        let (mut leave, mut drop) = (Vec::new(), Vec::new());
        c.settle(&p, t0 + WAIT * 2, &mut leave, &mut drop);
        assert!(leave.is_empty() && drop.is_empty());
    }

    #[test]
    fn a_host_that_holds_nothing_in_time_is_suspected_and_its_later_messages_fall_at_once() {
        let (p, _rx) = peer();
        let mut c = Commits::new(p.commit_lane());
        let t0 = Instant::now();
        assert!(c.send(&p, "h2", batch(&[key(1)]), vec![key(1)], t0, None));
        assert!(c.send(&p, "h2", batch(&[key(2)]), vec![key(2)], t0 + WAIT / 2, None));
        let (a, b) = (c.ticket_of(&key(1)).unwrap(), c.ticket_of(&key(2)).unwrap());
        let mut suspects = Vec::new();
        p.suspects(&mut suspects);
        assert!(suspects.is_empty());
        // The first times out: h2 is suspected, and the second, sent half a
        // wait later, falls with it rather than a wait later.
        let (mut leave, mut drop) = (Vec::new(), Vec::new());
        c.settle(&p, t0 + WAIT, &mut leave, &mut drop);
        assert_eq!((leave, drop), (vec![], vec![a, b]));
        p.suspects(&mut suspects);
        assert_eq!(suspects, vec!["h2".to_string()]);
        assert_eq!(p.counters().hosts_suspected, 1);
        // Any message from it says it lives.
        ack(&p, "h2", c.lane, 9);
        p.suspects(&mut suspects);
        assert!(suspects.is_empty());
    }

    #[test]
    fn bindings_not_held_in_time_take_every_later_message_s_packets_with_them() {
        let (p, rx) = peer();
        let mut c = Commits::new(p.commit_lane());
        let t0 = Instant::now();
        let b = PoolBindings {
            deployment: "d".into(),
            nf: "nat".into(),
            pool: "ports".into(),
            kind: crate::wire::BindingsKind::Replica,
            blocks: Vec::new(),
            entries: vec![(1024, Some(vec![1]))],
        };
        let gate = c.send_bindings(&p, "h3", b, t0).unwrap();
        assert!(c.send(&p, "h2", batch(&[key(1)]), vec![key(1)], t0, None));
        assert_eq!(rx.len(), 2);
        let t = c.ticket_of(&key(1)).unwrap();
        c.deferred(gate);
        c.deferred(t);
        c.add_open(&p, "h2", key(2));
        let open = c.ticket_of(&key(2)).unwrap();
        c.deferred(open);
        // The flows are held, the bindings not: nothing leaves.
        ack(&p, "h2", c.lane, 2);
        let (mut leave, mut drop) = (Vec::new(), Vec::new());
        c.settle(&p, t0, &mut leave, &mut drop);
        assert!(leave.is_empty() && drop.is_empty());
        c.settle(&p, t0 + WAIT, &mut leave, &mut drop);
        drop.sort_unstable();
        let mut want = vec![gate, t, open];
        want.sort_unstable();
        assert_eq!((leave, drop), (vec![], want));
        assert_eq!(c.again_bindings(), vec![("nat".to_string(), "ports".to_string(), vec![1024])]);
        let mut again: Vec<FlowKey> = c.again().collect();
        again.sort_by_key(|k| k.src_port);
        assert_eq!(again, vec![key(1), key(2)]);
        assert_eq!(p.counters().packets_commit_dropped, 3);
        assert!(!c.pending());
        assert_eq!((c.ticket_of(&key(1)), c.ticket_of(&key(2))), (None, None));
    }

    #[test]
    fn the_next_owner_answers_once_it_holds_the_flows_and_only_then() {
        let (p, rx) = peer();
        let m = PeerMessage::Commit(CommitBatch { lane: 7, seq: 3, batch: batch(&[key(1)]) });
        p.receive("h2", &m.encode().unwrap(), Instant::now(), 0).unwrap();
        let out = rx.try_recv().unwrap();
        assert_eq!(out.to, "h2");
        assert_eq!(PeerMessage::decode(&out.body).unwrap(), PeerMessage::Held(CommitAck { lane: 7, seq: 3 }));
        assert_eq!(p.counters().commits_answered, 1);
        // A store with no room holds nothing, and says nothing.
        let (tx, rx) = crossbeam_channel::bounded(4);
        let full = Peer::new(
            "h1",
            Duration::from_millis(1),
            Duration::from_millis(5),
            PeerStore::new(0, 1 << 20, Duration::from_secs(60)),
            PeerOut::new(tx, None),
        );
        let flow = PeerFlow {
            key: key(1).to_bytes().to_vec(),
            nfs: vec![crate::wire::NfPart {
                nf: "fw".into(),
                state: Some(crate::wire::StatePart { value: vec![1], clock: 1, last_seen_ns: 0 }),
                tables: Vec::new(),
            }],
            offload: Vec::new(),
        };
        let b = PeerBatch { deployment: "d".into(), table_version: 1, flows: vec![flow] };
        let m = PeerMessage::Commit(CommitBatch { lane: 7, seq: 4, batch: b });
        full.receive("h2", &m.encode().unwrap(), Instant::now(), 0).unwrap();
        assert!(rx.try_recv().is_err());
        assert_eq!(full.counters().commits_refused, 1);
    }
}
