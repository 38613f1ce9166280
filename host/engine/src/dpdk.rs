//! A worker's RX/TX queues on DPDK ports.
//!
//! Worker `w` owns queue `w` of every port. A batch is up to `max`
//! packets from each of its queues; forwarded packets leave by their
//! output port's queue `w` (rewritten in place when an NF changed them),
//! dropped ones are freed.
//!
//! Outputs: verdict port 0 is the default output (the port the packet
//! came in on, or its pair with `pairs`); port k ≥ 1 is the k-th output,
//! by default the k-th port. A worker may be given other outputs
//! ([`DpdkIo::with_outputs`]): several on one port, each writing its own
//! destination MAC into the frames it sends (a group's dispatcher reaches
//! each host through one), and may receive on only some of its ports
//! ([`DpdkIo::receive_on`]). A full TX queue drops what it refuses, or,
//! with [`DpdkIo::with_tx_retry`], is retried for a bounded time unless
//! its output is marked down.
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

use crate::handoff::{Handed, Handoff, Homed, Homes};
use crate::io::{OutputCount, PacketIo, QueueCounters, Receive, Results};
use sluice_dpdk::{Mbuf, Mempool, Queue};
use sluice_runtime::{Fate, RawPacket};
use sluice_wire::steer::{self, SteerMark};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
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
    /// Output index.
    output: usize,
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

/// Where verdict port k ≥ 1 sends a packet (see [`DpdkIo::with_outputs`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Output {
    /// Index of the worker's port (queue) it leaves by.
    pub port: usize,
    /// Destination MAC written into each frame it sends, if any.
    pub mac: Option<[u8; 6]>,
}

/// One worker's queues, and the buffers its batches reuse.
#[derive(Debug)]
pub struct DpdkIo {
    queues: Vec<Queue>,
    port_ids: Vec<u16>,
    pairs: bool,
    counters: Vec<QueueCounters>,
    /// Where each verdict port k ≥ 1 sends (output k − 1).
    outputs: Vec<Output>,
    /// Per port index: the output of verdict port 0 for packets that come
    /// in there (its default port's output without a MAC), if any.
    default_outputs: Vec<Option<usize>>,
    output_counts: Vec<OutputCount>,
    /// Ports (from the first) whose queues are polled.
    receive_ports: usize,
    /// How long a burst refused by a full TX queue is retried, and per
    /// output whether it is down (not retried).
    tx_retry: Option<(Duration, Arc<[AtomicBool]>)>,
    mbufs: Vec<Mbuf>,
    /// Port index each packet came in on.
    ingress: Vec<usize>,
    /// Each packet's length, as `packets` read it.
    lens: Vec<u32>,
    /// Per output, the longest frame [`deliver_plain`](Self::deliver_plain)
    /// queues without a look at it (reused across batches).
    straight: Vec<u32>,
    /// Multi-segment packets copied into one buffer each, and marked
    /// packets without their mark, in the order of the batch.
    scratch: Vec<Vec<u8>>,
    /// Packets of the batch read from `scratch`: (index, buffer).
    copied: Vec<(usize, usize)>,
    /// Of those, the packets a dispatcher marked: (index, buffer holding
    /// the frame without its mark, which leaves in its place).
    stripped: Vec<(usize, usize)>,
    /// Packets at the front of the batch that were held and released
    /// (their marks were stripped when they first came in).
    back: usize,
    /// Per output: the frames to send at the end of `deliver`.
    out: Vec<Vec<Mbuf>>,
    ts: u64,
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
    /// Per port index: how many more frames to look at for the marks of a
    /// kernel's offloads ([`unfinished_by_offload`]), and whether any port
    /// has some left (tested once per batch).
    offload_checks: Vec<u16>,
    checking_offloads: bool,
    /// The host's table of translated flows and inboxes, and this worker's
    /// index in it (see [`crate::handoff`]).
    handoff: Option<(Arc<Handoff>, usize)>,
    /// The flows whose rewrites this worker looked at lately.
    homed: Homed,
    /// The flows other workers homed.
    homes: Homes,
    /// Packets received this batch, set aside while they are steered.
    steering: Vec<(Mbuf, usize)>,
    /// Packets of the batch that came passed from another worker: (index,
    /// times passed; `u8::MAX`: handed to their flow's home).
    passed_in: Vec<(usize, u8)>,
    /// Packets of the batch to pass to the next worker at `deliver`.
    passing: Vec<usize>,
    /// Datagrams whose first fragment this worker handed to the home of
    /// its flow lately: their later fragments follow it.
    fragment_homes: Datagrams<u16>,
}

use crate::datagrams::{Datagrams, datagram_hash};

/// Frames of each port a worker looks at for a kernel's offloads: enough
/// to see the first connections' segments, and then no cost per packet.
const OFFLOAD_CHECKS: u16 = 1024;

impl DpdkIo {
    /// The worker's `queues` (one per port, in the order of `port_ids`).
    pub fn new(queues: Vec<Queue>, port_ids: Vec<u16>, pairs: bool, batch: usize) -> Self {
        let n = queues.len();
        let outputs: Vec<Output> = (0..n).map(|port| Output { port, mac: None }).collect();
        DpdkIo {
            counters: vec![QueueCounters::default(); n],
            default_outputs: default_outputs(&outputs, n, pairs),
            output_counts: vec![OutputCount::default(); n],
            outputs,
            receive_ports: n,
            tx_retry: None,
            mbufs: Vec::with_capacity(batch * n),
            ingress: Vec::with_capacity(batch * n),
            lens: Vec::with_capacity(batch * n),
            straight: Vec::new(),
            scratch: Vec::new(),
            copied: Vec::new(),
            stripped: Vec::new(),
            back: 0,
            out: (0..n).map(|_| Vec::with_capacity(batch)).collect(),
            queues,
            port_ids,
            pairs,
            ts: 0,
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
            offload_checks: vec![OFFLOAD_CHECKS; n],
            checking_offloads: n > 0,
            handoff: None,
            homed: Homed::default(),
            homes: Homes::default(),
            steering: Vec::new(),
            passed_in: Vec::new(),
            passing: Vec::new(),
            fragment_homes: Datagrams::default(),
        }
    }

    /// Shares this worker's TX queue on port index `port` with another
    /// thread: every burst there is sent under `lock`.
    pub fn with_shared_tx(mut self, port: usize, lock: std::sync::Arc<parking_lot::Mutex<()>>) -> Self {
        self.shared_tx = Some((port, lock));
        self
    }

    /// Sends verdict port k ≥ 1 through `outputs[k − 1]` instead of the
    /// k-th port (an output naming no port of the worker sends nothing: its
    /// packets count as its `dropped`). Verdict port 0 keeps the
    /// default port, through the first output there without a MAC.
    pub fn with_outputs(mut self, outputs: Vec<Output>) -> Self {
        let n = self.queues.len();
        self.default_outputs = default_outputs(&outputs, n, self.pairs);
        self.output_counts = vec![OutputCount::default(); outputs.len()];
        self.out = outputs.iter().map(|_| Vec::with_capacity(self.mbufs.capacity() / n.max(1))).collect();
        self.outputs = outputs;
        self
    }

    /// Polls only the first `ports` of the worker's ports (the others are
    /// only sent to).
    pub fn receive_on(mut self, ports: usize) -> Self {
        self.receive_ports = ports.min(self.queues.len());
        self
    }

    /// Retries a burst a full TX queue refused for up to `retry` (spinning)
    /// before what is left is dropped, except towards an output whose flag
    /// in `down` (by output index) is set: waiting there would hold every
    /// other output's packets too.
    pub fn with_tx_retry(mut self, retry: Duration, down: Arc<[AtomicBool]>) -> Self {
        self.tx_retry = Some((retry, down));
        self
    }

    /// Cuts forwarded IPv4 datagrams longer than their output port's MTU
    /// into fragments from `egress.pool` (see the module's documentation).
    pub fn with_egress(mut self, egress: Egress) -> Self {
        self.egress = Some(egress);
        self
    }

    /// Makes this worker `worker` of the host's `handoff`: it hands the
    /// packets of flows homed at another worker there, takes in what the
    /// others hand it, and homes the flows its chain translates (see
    /// [`crate::handoff`]). Only for hosts with several workers.
    pub fn with_handoff(mut self, handoff: Arc<Handoff>, worker: usize) -> Self {
        self.handoff = Some((handoff, worker));
        self
    }

    /// Queues `m` (with bytes `data` if an NF rewrote it) on output `t`,
    /// cut to the output port's MTU when it is longer; counts what
    /// happened against ingress port index `pi`.
    /// `len` is the mbuf's length (read when the batch was built).
    fn enqueue(&mut self, m: Mbuf, data: Option<&[u8]>, len: usize, t: usize, pi: usize) {
        let port = self.outputs.get(t).map_or(usize::MAX, |o| o.port);
        let mtu = self.egress.as_ref().and_then(|e| e.mtus.get(port).copied()).unwrap_or(0);
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
            match first.take().or_else(|| pool.alloc()) {
                Some(b) => self.queue(b, Some(piece), t, pi),
                // No mbuf left in the pool.
                None => {
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

    /// Where a packet of ingress port `pi` with `fate` leaves: `None`
    /// when it leaves no output (dropped by an NF or held for reassembly,
    /// counted here), `Some(None)` when it has nowhere to go.
    #[inline]
    fn target(&mut self, fate: Fate, pi: usize) -> Option<Option<usize>> {
        match fate {
            Fate::Dropped(_) => {
                if let Some(c) = self.counters.get_mut(pi) {
                    c.dropped_by_nf += 1;
                }
                None
            }
            Fate::Reassembling => {
                // Its bytes are in the chain's reassembly buffer now.
                if let Some(c) = self.counters.get_mut(pi) {
                    c.reassembling += 1;
                }
                None
            }
            Fate::Refused => Some(None),
            Fate::Forward(0) => Some(self.default_outputs.get(pi).copied().flatten()),
            Fate::Forward(port) => Some(Some(usize::from(port) - 1).filter(|&t| t < self.outputs.len())),
        }
    }

    /// [`deliver`](PacketIo::deliver) for a batch none of whose packets
    /// is held, kept back, passed on or marked (the common case): a
    /// packet forwarded with its bytes unchanged to an output that writes
    /// no MAC, and that it fits whole, goes straight to that output's
    /// queue; the others take [`enqueue`](Self::enqueue) as always.
    fn deliver_plain(&mut self, results: Results<'_>) {
        let mut mbufs = std::mem::take(&mut self.mbufs);
        let ingress = std::mem::take(&mut self.ingress);
        let lens = std::mem::take(&mut self.lens);
        // Per output, the longest frame that goes straight (0: none does).
        let mut straight = std::mem::take(&mut self.straight);
        straight.clear();
        straight.extend(self.outputs.iter().map(|o| match o.mac {
            Some(_) => 0,
            None => match self.egress.as_ref().and_then(|e| e.mtus.get(o.port).copied()).unwrap_or(0) {
                0 => u32::MAX,
                mtu => u32::try_from(mtu + sluice_wire::ethernet::HEADER_LEN).unwrap_or(u32::MAX),
            },
        }));
        let mut homes_now = 0;
        for (i, ((m, pi), r)) in mbufs.drain(..).zip(ingress.iter().copied()).zip(results.iter()).enumerate() {
            let Some(target) = self.target(r.fate, pi) else { continue };
            let Some(t) = target else {
                if let Some(c) = self.counters.get_mut(pi) {
                    c.dropped_other += 1;
                }
                continue;
            };
            let len = lens.get(i).map_or_else(|| u32::try_from(m.len()).unwrap_or(u32::MAX), |&l| l);
            if r.data.is_none()
                && r.fragments.is_none()
                && straight.get(t).is_some_and(|&max| len <= max)
                && let Some(o) = self.out.get_mut(t)
            {
                o.push(m);
                continue;
            }
            if self.handoff.is_some()
                && let Some(d) = r.data.as_deref()
            {
                Self::note_rewrite(&self.handoff, &mut self.homed, &mut homes_now, results.owner(i), &m, d);
            }
            match r.fragments.as_deref() {
                Some(cut) if !cut.is_empty() => self.enqueue_fragments(m, cut, t, pi),
                _ => self.enqueue(m, r.data.as_deref(), len as usize, t, pi),
            }
        }
        self.straight = straight;
        self.ingress = ingress;
        self.lens = lens;
        self.mbufs = mbufs;
    }

    fn queue(&mut self, mut m: Mbuf, data: Option<&[u8]>, t: usize, pi: usize) {
        // Only packets an NF rewrote are written back.
        let mut fits = data.is_none_or(|d| m.set_data(d).is_ok());
        if fits && let Some(mac) = self.outputs.get(t).and_then(|o| o.mac) {
            fits = set_dst_mac(&mut m, mac, &mut self.frame);
        }
        match (self.out.get_mut(t), fits) {
            (Some(o), true) => o.push(m),
            _ => {
                if let Some(c) = self.counters.get_mut(pi) {
                    c.dropped_other += 1;
                }
            }
        }
    }

    /// Takes in what other workers handed this one, up to `max` packets.
    fn take_handed(&mut self, max: usize) {
        let Some((h, me)) = self.handoff.as_ref() else { return };
        while self.mbufs.len() < max.max(1) {
            let Some(p) = h.take(*me) else { break };
            if let Some(c) = self.counters.get_mut(p.port) {
                c.taken_over += 1;
            }
            if p.hops > 0 {
                self.passed_in.push((self.mbufs.len(), p.hops));
            }
            self.mbufs.push(p.mbuf);
            self.ingress.push(p.port);
        }
    }

    /// Hands the packets received from `from` on whose flow is homed at
    /// another worker to that worker; the others stay, in order. A packet
    /// whose home's inbox is full stays too.
    #[inline(never)]
    fn steer(&mut self, from: usize, now: u64) {
        let Some((h, me)) = self.handoff.as_ref() else { return };
        let idle = h.idle_ns();
        let mut steering = std::mem::take(&mut self.steering);
        steering.extend(self.mbufs.drain(from..).zip(self.ingress.drain(from..)));
        for (m, pi) in steering.drain(..) {
            // Who the packet is between, read at fixed offsets where the
            // frame allows; parsed only if it may be of a homed flow. A
            // fragment is parsed: a later one goes where its datagram's
            // first went, a first one where its flow's home is.
            let fragment = m.data().filter(|d| sluice_wire::parse::may_be_fragment(d)).and_then(|d| {
                let p = sluice_wire::parse(d);
                p.ip.and_then(|ip| ip.fragment).map(|f| (datagram_hash(&f.key), f.offset == 0, p.key))
            });
            let home = match fragment {
                Some((datagram, false, _)) => self.fragment_homes.get(datagram, now).map(usize::from),
                Some((datagram, true, key)) => {
                    let home = key
                        .filter(|k| self.homes.may_hold(k.src, k.dst))
                        .and_then(|k| self.homes.home_of(k.symmetric_hash(), now, idle));
                    if let Some(w) = home {
                        self.fragment_homes.note(datagram, u16::try_from(w).unwrap_or(u16::MAX), now);
                    }
                    home
                }
                // An ICMP error goes where the flow it quotes is homed.
                None => m
                    .data()
                    .filter(|&d| sluice_wire::parse::ip_addresses(d).is_none_or(|(s, t)| self.homes.may_hold(s, t)))
                    .and_then(|d| Some((d, sluice_wire::parse(d).key?)))
                    .filter(|(_, k)| self.homes.may_hold(k.src, k.dst))
                    .and_then(|(d, k)| match self.homes.home_of(k.symmetric_hash(), now, idle) {
                        None if matches!(
                            k.protocol,
                            sluice_wire::parse::protocol::ICMP | sluice_wire::parse::protocol::ICMPV6
                        ) =>
                        {
                            sluice_wire::parse::quoted_key(d)
                                .and_then(|q| self.homes.home_of(q.symmetric_hash(), now, idle))
                        }
                        home => home,
                    }),
            }
            .filter(|w| w != me);
            let stays = match home {
                Some(w) => match h.hand(w, Handed { mbuf: m, port: pi, hops: u8::MAX }) {
                    Ok(()) => {
                        if let Some(c) = self.counters.get_mut(pi) {
                            c.handed_off += 1;
                        }
                        None
                    }
                    Err(back) => Some(back.mbuf),
                },
                None => Some(m),
            };
            if let Some(m) = stays {
                self.mbufs.push(m);
                self.ingress.push(pi);
            }
        }
        self.steering = steering;
    }

    /// Homes the flow of a packet `owner`'s chain rewrote (`data`; the
    /// mbuf `m` still holds what came in) at this worker when the rewrite
    /// translated it (its replies come to the new addresses or ports). A
    /// flow is compared with what came in, and published, about once per
    /// [`crate::handoff::REFRESH`].
    #[inline(never)]
    fn note_rewrite(
        handoff: &Option<(Arc<Handoff>, usize)>,
        homed: &mut Homed,
        now: &mut u64,
        owner: u64,
        m: &Mbuf,
        data: &[u8],
    ) {
        let Some((h, me)) = handoff.as_ref() else { return };
        let Some(to) = sluice_wire::parse(data).key else { return };
        let hash = to.symmetric_hash();
        if *now == 0 {
            *now = h.now_ns().max(1);
        }
        if !homed.due(hash, *now) {
            return;
        }
        let Some(from) = m.data().and_then(|d| sluice_wire::parse(d).key) else { return };
        let translated = from.normalized() != to.normalized();
        if translated {
            h.publish(*me, owner, &from, &to);
        }
        homed.looked(hash, *now, translated);
    }

    /// Marks the strays received from `from` on whose flow this worker
    /// translated as at home (passed in with `u8::MAX` hops, as steered
    /// packets are), so that the dispatcher runs them here instead of
    /// passing them round: a reply's first fragment or an ICMP error about
    /// a translated flow carries the outside key, which no chain holds, so
    /// every worker would pass it on until it came back here.
    #[inline(never)]
    fn keep_own_strays(&mut self, from: usize, now: u64) {
        let Some((h, _)) = self.handoff.as_ref() else { return };
        let idle = h.idle_ns();
        for (i, m) in self.mbufs.iter().enumerate().skip(from) {
            let Some(d) = m.data() else { continue };
            let key = if sluice_wire::parse::may_be_fragment(d) {
                let p = sluice_wire::parse(d);
                p.ip.and_then(|ip| ip.fragment).filter(|f| f.offset == 0).and(p.key)
            } else if sluice_wire::parse::may_be_icmp(d) {
                sluice_wire::parse::quoted_key(d)
            } else {
                None
            };
            if key.is_some_and(|k| self.homed.translated(k.symmetric_hash(), now, idle)) {
                self.passed_in.push((i, u8::MAX));
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
            match (go, self.out.get_mut(k.output)) {
                (true, Some(o)) => {
                    o.extend(k.frames);
                    sent = true;
                }
                _ => {
                    let port = self.outputs.get(k.output).map_or(usize::MAX, |o| o.port);
                    if let Some(c) = self.counters.get_mut(port) {
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
        for (o, pkts) in self.out.iter_mut().enumerate() {
            if pkts.is_empty() {
                continue;
            }
            let t = self.outputs.get(o).map_or(usize::MAX, |o| o.port);
            let (Some(&port), Some(q)) = (self.port_ids.get(t), self.queues.get_mut(t)) else {
                // An output on no port of this worker.
                if let Some(c) = self.output_counts.get_mut(o) {
                    c.dropped += pkts.len() as u64;
                }
                pkts.clear();
                continue;
            };
            let queued = pkts.len() as u64;
            let _shared = self.shared_tx.as_ref().filter(|(i, _)| *i == t).map(|(_, lock)| lock.lock());
            let mut sent = q.tx_burst(port, pkts) as u64;
            if let Some((retry, down)) = &self.tx_retry
                && !pkts.is_empty()
            {
                let since = Instant::now();
                while !pkts.is_empty()
                    && since.elapsed() < *retry
                    && !down.get(o).is_some_and(|d| d.load(Ordering::Acquire))
                {
                    std::hint::spin_loop();
                    sent += q.tx_burst(port, pkts) as u64;
                }
            }
            // Counted against the egress port's queue of this worker.
            if let Some(c) = self.counters.get_mut(t) {
                c.tx += sent;
                c.dropped_tx_full += queued - sent;
            }
            if let Some(c) = self.output_counts.get_mut(o) {
                c.sent += sent;
                c.dropped += queued - sent;
            }
            pkts.clear(); // frees what the device did not take
        }
        if let Some((w, sum)) = &mut self.tx_watch {
            *sum += w.lap();
        }
    }
}

/// Per port index, the output of verdict port 0 for packets that come in
/// there: the first of `outputs` on the default port without a MAC.
fn default_outputs(outputs: &[Output], ports: usize, pairs: bool) -> Vec<Option<usize>> {
    (0..ports)
        .map(|pi| {
            let port = if pairs && ports > 1 { (pi ^ 1).min(ports - 1) } else { pi };
            outputs.iter().position(|o| o.port == port && o.mac.is_none())
        })
        .collect()
}

/// Writes `mac` as the frame's destination, in place, or in a copy of a
/// buffer others share; false if the frame is shorter than an address or
/// the copy does not fit.
fn set_dst_mac(m: &mut Mbuf, mac: [u8; 6], scratch: &mut Vec<u8>) -> bool {
    if let Some(frame) = m.first_segment_mut() {
        return match frame.get_mut(..6) {
            Some(dst) => {
                dst.copy_from_slice(&mac);
                true
            }
            None => false,
        };
    }
    m.read_into(scratch);
    match scratch.get_mut(..6) {
        Some(dst) => dst.copy_from_slice(&mac),
        None => return false,
    }
    m.set_data(scratch).is_ok()
}

/// Looks at a batch's packets (from port indexes `ingress`) whose ports
/// have frames `left` to look at; whether any port still has.
#[cold]
#[inline(never)]
fn look_for_offloads(packets: &[RawPacket<'_>], ingress: &[usize], left: &mut [u16]) -> bool {
    for (p, &pi) in packets.iter().zip(ingress) {
        if let Some(l) = left.get_mut(pi)
            && *l > 0
        {
            unfinished_by_offload(p.data, p.ingress_port, l);
        }
    }
    left.iter().any(|&l| l > 0)
}

/// Looks at one of port `port`'s first frames (`left` more to look at)
/// for what a kernel interface with checksum or segmentation offload on
/// hands a packet socket (`net_af_packet`, or a TAP device): a TCP or UDP
/// checksum left for a device to finish, or a TCP segment longer than the
/// frame that carried it (a super-frame cut to the ring's frame). No
/// receiver accepts either, so TCP through the port stalls; the host says
/// so once, and stops looking.
#[cold]
#[inline(never)]
fn unfinished_by_offload(frame: &[u8], port: u16, left: &mut u16) {
    let l = sluice_wire::parse(frame);
    let tcp = l.key.is_some_and(|k| k.protocol == sluice_wire::parse::protocol::TCP);
    let cut = tcp && l.ip.is_some_and(|ip| ip.cut_short(frame.len()));
    let partial = sluice_wire::parse::checksum_left_for_offload(frame, &l);
    if cut || partial == Some(true) {
        *left = 0;
        let what = if cut {
            "a TCP segment longer than the frame that carried it (a segmentation offload's super-frame cut to the \
             frame, or a capture cut short)"
        } else {
            "a TCP or UDP checksum left for a device to finish (checksum offload)"
        };
        tracing::warn!(
            port,
            "port {port} received {what}: a kernel interface with checksum or segmentation offload on hands a \
             packet socket such frames, no receiver accepts them, and TCP through this port stalls; if one sends \
             into this port, turn them off on it: ethtool -K <interface> tx off tso off gso off gro off \
             (README, \"No DPDK NIC?\")"
        );
    } else {
        *left = left.saturating_sub(1);
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

    fn output_counts(&self) -> &[OutputCount] {
        &self.output_counts
    }

    fn hold_room(&self) -> usize {
        MAX_HELD.saturating_sub(self.held.len() + self.released.len() + self.holding.len())
    }

    fn hold(&mut self, index: usize, ticket: u64) {
        if self.hold_room() > 0 {
            self.holding.push((index, ticket));
        }
    }

    fn circle(&self) -> Option<usize> {
        self.handoff.as_ref().map(|(h, _)| h.workers())
    }

    fn passed_in(&self, out: &mut Vec<(usize, usize)>) {
        out.extend(
            self.passed_in.iter().map(|&(i, hops)| (i, if hops == u8::MAX { usize::MAX } else { usize::from(hops) })),
        );
    }

    fn pass(&mut self, index: usize) {
        self.passing.push(index);
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
        self.passed_in.clear();
        self.passing.clear();
        // What `packets` found belongs to its batch only.
        self.copied.clear();
        self.stripped.clear();
        if self.held.first().is_some_and(|h| h.at.elapsed() >= HOLD_LIMIT) {
            let now = Instant::now();
            self.release_where(|h| now.saturating_duration_since(h.at) >= HOLD_LIMIT);
        }
        while self.mbufs.len() < max.max(1) {
            let Some((m, pi)) = self.released.pop_front() else { break };
            self.mbufs.push(m);
            self.ingress.push(pi);
        }
        self.back = self.mbufs.len();
        if self.handoff.is_some() && self.released.is_empty() {
            self.take_handed(max);
        }
        let received = self.mbufs.len();
        let per_port = u16::try_from(max).unwrap_or(u16::MAX);
        for (pi, q) in self.queues.iter_mut().enumerate().take(self.receive_ports) {
            if !self.released.is_empty() {
                break;
            }
            let got = q.rx_burst(&mut self.mbufs, per_port);
            self.ingress.extend(std::iter::repeat_n(pi, got));
            if let Some(c) = self.counters.get_mut(pi) {
                c.rx += got as u64;
            }
        }
        if let Some((h, me)) = self.handoff.as_ref() {
            let now = h.now_ns();
            self.homes.update(h, *me, now);
            if self.mbufs.len() > received && !self.homes.is_empty() {
                self.steer(received, now);
            }
            if self.mbufs.len() > received && self.homed.translates() {
                self.keep_own_strays(received, now);
            }
        }
        if self.mbufs.is_empty() {
            return Receive::Idle;
        }
        self.ts = now_ns();
        Receive::Packets(self.mbufs.len())
    }

    /// One read of every mbuf (one call into DPDK per 64 packets). A
    /// dispatcher's mark is taken off before anything reads the packet
    /// (released packets lost theirs when they first came in): the packet
    /// is read from a copy without it, which also leaves in its place;
    /// multi-segment packets are read from a copy in one buffer.
    fn packets<'a>(&'a mut self, out: &mut Vec<RawPacket<'a>>, moved: &mut Vec<(usize, SteerMark)>) {
        let DpdkIo {
            mbufs,
            views: kept,
            scratch,
            copied,
            stripped,
            back,
            lens,
            ingress,
            port_ids,
            ts,
            offload_checks,
            checking_offloads,
            ..
        } = self;
        let mbufs: &'a Vec<Mbuf> = mbufs;
        let first = out.len();
        let mut views = crate::worker::recycle(std::mem::take(kept));
        sluice_dpdk::views(mbufs, &mut views);
        copied.clear();
        stripped.clear();
        for (i, (v, m)) in views.iter().zip(mbufs).enumerate() {
            let marked = v.data.filter(|d| i >= *back && d.get(12..14) == Some(&steer::ETHERTYPE.to_be_bytes()));
            if v.data.is_some() && marked.is_none() {
                continue;
            }
            let slot = copied.len();
            if scratch.len() <= slot {
                scratch.push(Vec::new());
            }
            let Some(buf) = scratch.get_mut(slot) else { continue };
            match marked {
                Some(d) => match steer::decap(d, buf) {
                    Some(mark) => {
                        moved.push((i, mark));
                        stripped.push((i, slot));
                    }
                    // Not a mark after all: read as it is.
                    None => continue,
                },
                None => m.read_into(buf),
            }
            copied.push((i, slot));
        }
        let scratch: &'a Vec<Vec<u8>> = scratch;
        let mut copies = copied.iter().peekable();
        lens.clear();
        for (i, (v, &pi)) in views.iter().zip(ingress.iter()).enumerate() {
            let (data, len) = match copies.next_if(|&&(at, _)| at == i) {
                Some(&(_, slot)) => {
                    let d = scratch.get(slot).map(Vec::as_slice).unwrap_or(&[]);
                    (d, if v.data.is_some() { d.len() } else { v.len })
                }
                None => (v.data.unwrap_or(&[]), v.len),
            };
            let len = u32::try_from(len).unwrap_or(u32::MAX);
            lens.push(len);
            let port = port_ids.get(pi).copied().unwrap_or(0);
            out.push(RawPacket { data, wire_len: len, timestamp_ns: *ts, ingress_port: port });
        }
        if *checking_offloads {
            let batch = out.get(first..).unwrap_or_default();
            *checking_offloads = look_for_offloads(batch, ingress, offload_checks);
        }
        *kept = crate::worker::recycle(views);
    }

    fn deliver(&mut self, results: Results<'_>) {
        if self.holding.is_empty() && self.deferring.is_empty() && self.stripped.is_empty() && self.passing.is_empty() {
            self.deliver_plain(results);
            self.transmit();
            return;
        }
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
        // Marked packets leave (or wait) as read: without their marks.
        let scratch = std::mem::take(&mut self.scratch);
        let stripped_now = std::mem::take(&mut self.stripped);
        let mut stripped = stripped_now.iter().peekable();
        // The handoff table's clock, read at the batch's first rewrite.
        let mut homes_now = 0;
        self.passing.sort_unstable();
        let passing_now = std::mem::take(&mut self.passing);
        let mut passing = passing_now.iter().peekable();
        for (i, ((mut m, pi), r)) in mbufs.drain(..).zip(ingress.iter().copied()).zip(results.iter()).enumerate() {
            let unmarked = stripped.next_if(|&&(at, _)| at == i).and_then(|&(_, slot)| scratch.get(slot));
            if passing.next_if(|&&at| at == i).is_some() {
                // To the next worker, as it came in.
                let handed = unmarked.is_none_or(|frame| m.set_data(frame).is_ok()).then_some(m).and_then(|m| {
                    let (h, me) = self.handoff.as_ref()?;
                    let hops = match self.passed_in.binary_search_by_key(&i, |&(at, _)| at) {
                        Ok(k) => self.passed_in.get(k).map_or(0, |&(_, h)| h),
                        Err(_) => 0,
                    };
                    let next = (me + 1) % h.workers().max(1);
                    h.hand(next, Handed { mbuf: m, port: pi, hops: hops.saturating_add(1).min(u8::MAX - 1) }).ok()
                });
                if let Some(c) = self.counters.get_mut(pi) {
                    match handed {
                        Some(()) => {
                            c.handed_off += 1;
                            c.passed_on += 1;
                        }
                        None => c.dropped_other += 1,
                    }
                }
                continue;
            }
            if let Some(&(_, ticket)) = holding.next_if(|&&(at, _)| at == i) {
                if let Some(frame) = unmarked
                    && m.set_data(frame).is_err()
                {
                    if let Some(c) = self.counters.get_mut(pi) {
                        c.dropped_other += 1;
                    }
                    continue;
                }
                self.held.push(Held { ticket, mbuf: m, ingress: pi, at: now.unwrap_or_else(Instant::now) });
                continue;
            }
            let Some(target) = self.target(r.fate, pi) else { continue };
            if self.handoff.is_some()
                && target.is_some()
                && let Some(d) = r.data.as_deref()
            {
                Self::note_rewrite(&self.handoff, &mut self.homed, &mut homes_now, results.owner(i), &m, d);
            }
            // Entries of packets that left no output (dropped) are passed.
            while deferring.next_if(|&&(at, _)| at < i).is_some() {}
            let keep = deferring.next_if(|&&(at, _)| at == i).map(|&(_, ticket)| ticket);
            let queued = target.and_then(|t| self.out.get(t)).map_or(0, Vec::len);
            match target {
                Some(t) if r.fragments.as_deref().is_some_and(|c| !c.is_empty()) => {
                    self.enqueue_fragments(m, r.fragments.as_deref().unwrap_or(&[]), t, pi)
                }
                Some(t) => {
                    let len = lens.get(i).map_or_else(|| m.len(), |&l| l as usize);
                    let data = r.data.as_deref().or(unmarked.map(Vec::as_slice));
                    self.enqueue(m, data, len, t, pi)
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
                let port = self.outputs.get(t).map_or(usize::MAX, |o| o.port);
                if let Some(c) = self.counters.get_mut(port) {
                    c.deferred += frames.len() as u64;
                }
                self.kept.push_back(Kept { ticket, output: t, frames, at: now.unwrap_or_else(Instant::now) });
            }
        }
        drop(holding);
        drop(deferring);
        drop(stripped);
        drop(passing);
        self.passing = passing_now;
        self.passing.clear();
        self.scratch = scratch;
        self.stripped = stripped_now;
        self.stripped.clear();
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
