//! A worker's RX/TX queues on DPDK ports.
//!
//! Worker `w` owns queue `w` of every port. A batch is up to `max`
//! packets from each of its queues; forwarded packets leave by their
//! output port's queue `w` (rewritten in place when an NF changed them),
//! dropped ones are freed.
//!
//! Output ports: verdict port 0 is the default output (the port the packet
//! came in on, or its pair with `pairs`); port k ≥ 1 is the k-th port.
//!
//! A forwarded IPv4 datagram longer than its output port's MTU (a
//! reassembled one, or one an NF grew) is cut into fragments that fit
//! (RFC 791), in new mbufs from the pool; one that may not be fragmented
//! (Don't Fragment, IPv6) is dropped and counted (`dropped_too_big`), as
//! a router does, since the port would refuse it.
//!
//! Packets whose flow waits for its state from another host are held (the
//! mbufs kept, at most [`MAX_HELD`] a worker) until released, then come
//! back first, in order; one not released within [`HOLD_LIMIT`] (its
//! deployment was removed meanwhile) comes back anyway.
//!
//! With output commit, the output of a packet whose flow's changed state
//! is not yet held by another host is kept (its frames ready to send, at
//! most [`MAX_DEFERRED`] a worker) until its ticket is let go (sent, in
//! the order kept) or dropped; one kept past [`DEFER_LIMIT`] is dropped.

use crate::io::{PacketIo, QueueCounters, Receive};
use sluice_dpdk::{Mbuf, Mempool, Queue};
use sluice_runtime::{Fate, PacketResult, RawPacket};
use sluice_wire::steer::{self, SteerMark};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Packets one worker holds at most.
pub const MAX_HELD: usize = 512;
/// A held packet comes back after this long even if not released.
pub const HOLD_LIMIT: Duration = Duration::from_millis(100);

/// Outputs one worker keeps back for output commit, at most (frames).
pub const MAX_DEFERRED: usize = 4096;
/// A kept output whose ticket is neither let go nor dropped within this
/// long (its deployment was removed meanwhile) is dropped.
pub const DEFER_LIMIT: Duration = Duration::from_secs(1);

/// The output of a packet kept back until its flow's changed state is
/// held by another host (output commit).
#[derive(Debug)]
struct Kept {
    ticket: u64,
    /// Output port index.
    port: usize,
    /// The frames it left as (one, or its fragments).
    frames: Vec<Mbuf>,
    at: Instant,
}

/// A packet kept back until its ticket is released.
#[derive(Debug)]
struct Held {
    ticket: u64,
    mbuf: Mbuf,
    /// Port index it came in on.
    ingress: usize,
    at: Instant,
}

/// What a worker needs to fit datagrams to its output ports.
#[derive(Debug, Clone)]
pub struct Egress {
    /// Each port's MTU, by port index (0: unknown, never cut).
    pub mtus: Vec<usize>,
    /// The pool fragments are allocated from.
    pub pool: std::sync::Arc<Mempool>,
}

/// One worker's queues, and the buffers its batches reuse.
#[derive(Debug)]
pub struct DpdkIo {
    queues: Vec<Queue>,
    port_ids: Vec<u16>,
    pairs: bool,
    counters: Vec<QueueCounters>,
    mbufs: Vec<Mbuf>,
    /// Port index each packet came in on.
    ingress: Vec<usize>,
    /// Each packet's length, as `packets` read it.
    lens: Vec<u32>,
    /// Multi-segment packets, copied into one buffer each (in order).
    scratch: Vec<Vec<u8>>,
    out: Vec<Vec<Mbuf>>,
    ts: u64,
    /// Packets of the batch a dispatcher marked (see [`sluice_wire::steer`]).
    moved: Vec<(usize, SteerMark)>,
    /// Packets of the batch that carry a dispatcher's mark.
    marked: Vec<usize>,
    unmark: Vec<u8>,
    /// The views of the last batch's mbufs, emptied, kept for the next.
    views: Vec<sluice_dpdk::MbufView<'static>>,
    /// Packets held, in the order held.
    held: Vec<Held>,
    /// Packets of the batch to hold at `deliver`: (index, ticket).
    holding: Vec<(usize, u64)>,
    /// Held packets released, to come back at the next `receive`.
    released: std::collections::VecDeque<(Mbuf, usize)>,
    /// Packets of the batch whose output to keep at `deliver`: (index,
    /// ticket).
    deferring: Vec<(usize, u64)>,
    /// Outputs kept, in the order kept, and their frames in all.
    kept: std::collections::VecDeque<Kept>,
    kept_frames: usize,
    egress: Option<Egress>,
    /// A frame read out of its mbuf to be cut.
    frame: Vec<u8>,
    /// Times transmit bursts, when asked for, and their sum.
    tx_watch: Option<(sluice_runtime::Stopwatch, u64)>,
    /// A port index whose TX queue this worker shares with another thread
    /// (a host's beacon sender), and the lock both take around a burst.
    shared_tx: Option<(usize, std::sync::Arc<parking_lot::Mutex<()>>)>,
}

impl DpdkIo {
    /// The worker's `queues` (one per port, in the order of `port_ids`).
    pub fn new(queues: Vec<Queue>, port_ids: Vec<u16>, pairs: bool, batch: usize) -> Self {
        let n = queues.len();
        DpdkIo {
            counters: vec![QueueCounters::default(); n],
            mbufs: Vec::with_capacity(batch * n),
            ingress: Vec::with_capacity(batch * n),
            lens: Vec::with_capacity(batch * n),
            scratch: Vec::new(),
            out: (0..n).map(|_| Vec::with_capacity(batch)).collect(),
            queues,
            port_ids,
            pairs,
            ts: 0,
            moved: Vec::new(),
            marked: Vec::new(),
            unmark: Vec::new(),
            views: Vec::new(),
            held: Vec::new(),
            holding: Vec::new(),
            released: std::collections::VecDeque::new(),
            deferring: Vec::new(),
            kept: std::collections::VecDeque::new(),
            kept_frames: 0,
            egress: None,
            frame: Vec::new(),
            tx_watch: None,
            shared_tx: None,
        }
    }

    /// Shares this worker's TX queue on port index `port` with another
    /// thread: every burst there is sent under `lock`.
    pub fn with_shared_tx(mut self, port: usize, lock: std::sync::Arc<parking_lot::Mutex<()>>) -> Self {
        self.shared_tx = Some((port, lock));
        self
    }

    /// Cuts forwarded IPv4 datagrams longer than their output port's MTU
    /// into fragments from `egress.pool` (see the module's documentation).
    pub fn with_egress(mut self, egress: Egress) -> Self {
        self.egress = Some(egress);
        self
    }

    /// Queues `m` (with bytes `data` if an NF rewrote it) on output `t`,
    /// cut to the port's MTU when it is longer; counts what happened
    /// against ingress port index `pi`.
    /// `len` is the mbuf's length (read when the batch was built).
    fn enqueue(&mut self, m: Mbuf, data: Option<&[u8]>, len: usize, t: usize, pi: usize) {
        let mtu = self.egress.as_ref().and_then(|e| e.mtus.get(t).copied()).unwrap_or(0);
        if mtu == 0 {
            return self.queue(m, data, t, pi);
        }
        let len = data.map_or(len, <[u8]>::len);
        // Shorter than an untagged frame of the MTU: nothing to check.
        if len <= mtu + sluice_wire::ethernet::HEADER_LEN {
            return self.queue(m, data, t, pi);
        }
        if data.is_none() {
            m.read_into(&mut self.frame);
        }
        let frame = data.unwrap_or(&self.frame);
        let Some(ip) = sluice_wire::fragment::inspect(frame) else {
            // Not IP: the port decides (and counts a refusal).
            return self.queue(m, data, t, pi);
        };
        if len <= mtu + ip.l3 {
            return self.queue(m, data, t, pi);
        }
        let pieces = sluice_wire::fragment::split_ipv4(frame, mtu);
        let Some(pool) = self.egress.as_ref().map(|e| e.pool.clone()) else { return };
        let Ok(pieces) = pieces else {
            if let Some(c) = self.counters.get_mut(pi) {
                c.dropped_too_big += 1;
            }
            return;
        };
        if let Some(c) = self.counters.get_mut(pi) {
            c.fragmented += pieces.len().saturating_sub(1) as u64;
        }
        let mut first = Some(m);
        for piece in &pieces {
            let buf = first.take().or_else(|| pool.alloc()).and_then(|mut b| b.set_data(piece).is_ok().then_some(b));
            match (buf, self.out.get_mut(t)) {
                (Some(b), Some(o)) => o.push(b),
                // No mbuf left in the pool, or no such port.
                _ => {
                    if let Some(c) = self.counters.get_mut(pi) {
                        c.dropped_other += 1;
                    }
                }
            }
        }
    }

    /// Queues the fragments a reassembled datagram left the chain as, the
    /// first in `m`, the others in mbufs from the egress pool.
    fn enqueue_fragments(&mut self, m: Mbuf, fragments: &[Vec<u8>], t: usize, pi: usize) {
        let pool = self.egress.as_ref().map(|e| e.pool.clone());
        if let Some(c) = self.counters.get_mut(pi) {
            c.fragmented += fragments.len().saturating_sub(1) as u64;
        }
        let mut first = Some(m);
        for piece in fragments {
            match first.take().or_else(|| pool.as_ref().and_then(|p| p.alloc())) {
                Some(b) => self.enqueue(b, Some(piece), piece.len(), t, pi),
                None => {
                    if let Some(c) = self.counters.get_mut(pi) {
                        c.dropped_other += 1;
                    }
                }
            }
        }
    }

    fn queue(&mut self, mut m: Mbuf, data: Option<&[u8]>, t: usize, pi: usize) {
        // Only packets an NF rewrote are written back.
        let fits = data.is_none_or(|d| m.set_data(d).is_ok());
        match (self.out.get_mut(t), fits) {
            (Some(o), true) => o.push(m),
            _ => {
                if let Some(c) = self.counters.get_mut(pi) {
                    c.dropped_other += 1;
                }
            }
        }
    }

    /// Moves the held packets `release` picks to the released queue, in
    /// the order they were held.
    fn release_where(&mut self, release: impl Fn(&Held) -> bool) {
        let mut keep = Vec::with_capacity(self.held.len());
        for h in self.held.drain(..) {
            if release(&h) {
                self.released.push_back((h.mbuf, h.ingress));
            } else {
                keep.push(h);
            }
        }
        self.held = keep;
    }

    /// The default output of a packet that came in on port index `pi`.
    fn default_out(&self, pi: usize) -> usize {
        let n = self.queues.len();
        if self.pairs && n > 1 { (pi ^ 1).min(n - 1) } else { pi }
    }

    /// Sends or frees the kept outputs of these tickets, and frees those
    /// kept past [`DEFER_LIMIT`]; sends what it moved out.
    fn settle_kept(&mut self, send: &[u64], drop: &[u64]) {
        let now = Instant::now();
        let mut sent = false;
        let mut keep = std::collections::VecDeque::with_capacity(self.kept.len());
        for k in self.kept.drain(..) {
            let go = send.contains(&k.ticket);
            if !go && !drop.contains(&k.ticket) && now.saturating_duration_since(k.at) < DEFER_LIMIT {
                keep.push_back(k);
                continue;
            }
            self.kept_frames = self.kept_frames.saturating_sub(k.frames.len());
            match (go, self.out.get_mut(k.port)) {
                (true, Some(o)) => {
                    o.extend(k.frames);
                    sent = true;
                }
                _ => {
                    if let Some(c) = self.counters.get_mut(k.port) {
                        c.dropped_uncommitted += k.frames.len() as u64;
                    }
                }
            }
        }
        self.kept = keep;
        if sent {
            self.transmit();
        }
    }

    fn transmit(&mut self) {
        if let Some((w, _)) = &mut self.tx_watch {
            w.restart();
        }
        for (t, pkts) in self.out.iter_mut().enumerate() {
            if pkts.is_empty() {
                continue;
            }
            let Some(&port) = self.port_ids.get(t) else { continue };
            let queued = pkts.len() as u64;
            let _shared = self.shared_tx.as_ref().filter(|(i, _)| *i == t).map(|(_, lock)| lock.lock());
            let sent = self.queues.get_mut(t).map(|q| q.tx_burst(port, pkts)).unwrap_or(0) as u64;
            // Counted against the egress port's queue of this worker.
            if let Some(c) = self.counters.get_mut(t) {
                c.tx += sent;
                c.dropped_tx_full += queued - sent;
            }
            pkts.clear(); // frees what the device did not take
        }
        if let Some((w, sum)) = &mut self.tx_watch {
            *sum += w.lap();
        }
    }
}

fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| u64::try_from(d.as_nanos()).unwrap_or(0)).unwrap_or(0)
}

impl PacketIo for DpdkIo {
    /// Counters per port (in the order of the ports).
    fn queue_counters(&self) -> &[QueueCounters] {
        &self.counters
    }

    fn time_transmit(&mut self) {
        self.tx_watch = Some((sluice_runtime::Stopwatch::new(), 0));
    }

    fn transmit_ns(&self) -> u64 {
        self.tx_watch.as_ref().map_or(0, |(_, sum)| *sum)
    }

    fn moved(&self) -> &[(usize, SteerMark)] {
        &self.moved
    }

    fn hold_room(&self) -> usize {
        MAX_HELD.saturating_sub(self.held.len() + self.released.len() + self.holding.len())
    }

    fn hold(&mut self, index: usize, ticket: u64) {
        if self.hold_room() > 0 {
            self.holding.push((index, ticket));
        }
    }

    fn release(&mut self, tickets: &[u64]) {
        if !tickets.is_empty() {
            self.release_where(|h| tickets.contains(&h.ticket));
        }
    }

    fn defer_room(&self) -> usize {
        MAX_DEFERRED.saturating_sub(self.kept_frames + self.deferring.len())
    }

    fn defer(&mut self, index: usize, ticket: u64) {
        if self.defer_room() > 0 {
            self.deferring.push((index, ticket));
        }
    }

    fn settle(&mut self, send: &[u64], drop: &[u64]) {
        let expired = self.kept.front().is_some_and(|k| k.at.elapsed() >= DEFER_LIMIT);
        if !send.is_empty() || !drop.is_empty() || expired {
            self.settle_kept(send, drop);
        }
    }

    /// Released packets first (up to `max`), then, once none is left, up
    /// to `max` packets from each of the worker's queues: a packet never
    /// overtakes a released one of its flow.
    fn receive(&mut self, max: usize) -> Receive {
        self.mbufs.clear();
        self.ingress.clear();
        if self.held.first().is_some_and(|h| h.at.elapsed() >= HOLD_LIMIT) {
            let now = Instant::now();
            self.release_where(|h| now.saturating_duration_since(h.at) >= HOLD_LIMIT);
        }
        while self.mbufs.len() < max.max(1) {
            let Some((m, pi)) = self.released.pop_front() else { break };
            self.mbufs.push(m);
            self.ingress.push(pi);
        }
        let back = self.mbufs.len();
        let per_port = u16::try_from(max).unwrap_or(u16::MAX);
        for (pi, q) in self.queues.iter_mut().enumerate() {
            if !self.released.is_empty() {
                break;
            }
            let got = q.rx_burst(&mut self.mbufs, per_port);
            self.ingress.extend(std::iter::repeat_n(pi, got));
            if let Some(c) = self.counters.get_mut(pi) {
                c.rx += got as u64;
            }
        }
        if self.mbufs.is_empty() {
            return Receive::Idle;
        }
        self.ts = now_ns();
        // One read of every mbuf (one call into DPDK per 64 packets), for
        // the marks and the segments here.
        let mut views = crate::worker::recycle(std::mem::take(&mut self.views));
        sluice_dpdk::views(&self.mbufs, &mut views);
        // A dispatcher's mark is stripped before anything reads the packet
        // (released packets were stripped when they first came in).
        self.moved.clear();
        self.marked.clear();
        let mut segmented = false;
        for (i, v) in views.iter().enumerate() {
            match v.data {
                Some(d) => {
                    if i >= back && d.get(12..14) == Some(&steer::ETHERTYPE.to_be_bytes()) {
                        self.marked.push(i);
                    }
                }
                None => segmented = true,
            }
        }
        self.views = crate::worker::recycle(views);
        for &i in &self.marked {
            let Some(m) = self.mbufs.get_mut(i) else { continue };
            if let Some(mark) = m.data().and_then(|d| steer::decap(d, &mut self.unmark))
                && m.set_data(&self.unmark).is_ok()
            {
                self.moved.push((i, mark));
            }
        }
        // Multi-segment packets are copied into one buffer each; the rest
        // are read in place.
        if segmented || !self.marked.is_empty() {
            let mut used = 0;
            for m in &self.mbufs {
                if m.view().data.is_none() {
                    if self.scratch.len() <= used {
                        self.scratch.push(Vec::new());
                    }
                    if let Some(buf) = self.scratch.get_mut(used) {
                        m.read_into(buf);
                    }
                    used += 1;
                }
            }
        }
        Receive::Packets(self.mbufs.len())
    }

    fn packets<'a>(&'a mut self, out: &mut Vec<RawPacket<'a>>) {
        let mut views = crate::worker::recycle(std::mem::take(&mut self.views));
        sluice_dpdk::views(&self.mbufs, &mut views);
        let mut next_scratch = 0;
        self.lens.clear();
        for (v, &pi) in views.iter().zip(&self.ingress) {
            let data = match v.data {
                Some(d) => d,
                None => {
                    let d = self.scratch.get(next_scratch).map(Vec::as_slice).unwrap_or(&[]);
                    next_scratch += 1;
                    d
                }
            };
            let len = u32::try_from(v.len).unwrap_or(u32::MAX);
            self.lens.push(len);
            out.push(RawPacket {
                data,
                wire_len: len,
                timestamp_ns: self.ts,
                ingress_port: self.port_ids.get(pi).copied().unwrap_or(0),
            });
        }
        self.views = crate::worker::recycle(views);
    }

    fn deliver(&mut self, results: &[PacketResult]) {
        let n_ports = self.queues.len();
        let mut mbufs = std::mem::take(&mut self.mbufs);
        self.holding.sort_unstable_by_key(|&(i, _)| i);
        let holding_now = std::mem::take(&mut self.holding);
        let mut holding = holding_now.iter().peekable();
        self.deferring.sort_unstable_by_key(|&(i, _)| i);
        let deferring_now = std::mem::take(&mut self.deferring);
        let mut deferring = deferring_now.iter().peekable();
        // Read the clock only for a batch that holds or keeps packets.
        let now = (!holding_now.is_empty() || !deferring_now.is_empty()).then(Instant::now);
        let ingress = std::mem::take(&mut self.ingress);
        let lens = std::mem::take(&mut self.lens);
        for (i, ((m, pi), r)) in mbufs.drain(..).zip(ingress.iter().copied()).zip(results).enumerate() {
            if let Some(&(_, ticket)) = holding.next_if(|&&(at, _)| at == i) {
                self.held.push(Held { ticket, mbuf: m, ingress: pi, at: now.unwrap_or_else(Instant::now) });
                continue;
            }
            let target = match r.fate {
                Fate::Dropped(_) => {
                    if let Some(c) = self.counters.get_mut(pi) {
                        c.dropped_by_nf += 1;
                    }
                    continue;
                }
                Fate::Reassembling => {
                    // Its bytes are in the chain's reassembly buffer now.
                    if let Some(c) = self.counters.get_mut(pi) {
                        c.reassembling += 1;
                    }
                    continue;
                }
                Fate::Refused => None,
                Fate::Forward(0) => Some(self.default_out(pi)),
                Fate::Forward(port) => Some(usize::from(port) - 1).filter(|&t| t < n_ports),
            };
            // Entries of packets that left no output (dropped) are passed.
            while deferring.next_if(|&&(at, _)| at < i).is_some() {}
            let keep = deferring.next_if(|&&(at, _)| at == i).map(|&(_, ticket)| ticket);
            let queued = target.and_then(|t| self.out.get(t)).map_or(0, Vec::len);
            match target {
                Some(t) if !r.fragments.is_empty() => self.enqueue_fragments(m, &r.fragments, t, pi),
                Some(t) => {
                    let len = lens.get(i).map_or_else(|| m.len(), |&l| l as usize);
                    self.enqueue(m, r.data.as_deref(), len, t, pi)
                }
                None => {
                    if let Some(c) = self.counters.get_mut(pi) {
                        c.dropped_other += 1;
                    }
                }
            }
            // Its output waits: the frames it just queued are kept back.
            if let (Some(ticket), Some(t)) = (keep, target)
                && let Some(o) = self.out.get_mut(t)
                && o.len() > queued
            {
                let frames = o.split_off(queued);
                self.kept_frames += frames.len();
                if let Some(c) = self.counters.get_mut(t) {
                    c.deferred += frames.len() as u64;
                }
                self.kept.push_back(Kept { ticket, port: t, frames, at: now.unwrap_or_else(Instant::now) });
            }
        }
        drop(holding);
        drop(deferring);
        self.deferring = deferring_now;
        self.deferring.clear();
        self.ingress = ingress;
        self.lens = lens;
        self.holding = holding_now;
        self.holding.clear();
        self.mbufs = mbufs;
        self.transmit();
    }
}
