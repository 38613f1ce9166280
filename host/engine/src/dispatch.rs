//! One worker of a multi-tenant host: a batch from shared ports, split by
//! a [`Classifier`] among the deployments attached there, each part run
//! through its deployment's chain, the verdicts put back in order.
//!
//! Each deployment is a [`Lane`] of the worker: it holds its own
//! [`Worker`] (chain instance, meters, swaps). A packet reaches at most one
//! lane; packets no lane claims get the host's [`Unmatched`] policy and
//! are counted here, never in a lane's meters. A lane's NFs may send
//! packets only out of ports its attachments name (ingress or `out`):
//! any other explicit port is refused and counted, so no tenant can inject
//! traffic into another's port.

use crate::classify::{Attachment, Classifier, Unmatched, outer_vlan};
use crate::io::{PacketIo, Receive, Results};
use crate::worker::{Worker, recycle};
use serde::Serialize;
use sluice_runtime::{Defer, Fate, Hold, PacketResult, RawPacket, StageTimes, Stopwatch};
use sluice_wire::steer::SteerMark;

/// A deployment's part of a host worker.
pub trait Lane {
    /// Its chain.
    fn worker(&mut self) -> &mut Worker;
    /// Whether its NFs may name this port (id) in a verdict.
    fn may_send(&self, port: u16) -> bool;
    /// Whether its chain keeps flow state of the flow `key`, or keeps none
    /// (see [`Chain::holds_flow`](sluice_runtime::Chain::holds_flow)): an
    /// IP fragment of a flow it does not hold is passed to another worker
    /// where the I/O can (see [`PacketIo::circle`]).
    fn holds_flow(&mut self, key: &sluice_wire::FlowKey) -> bool {
        self.worker().chain().holds_flow(key)
    }
    /// Whose it is, for what a host keeps on behalf of lanes and shares
    /// between them (the flows a worker hands to another, see
    /// [`crate::handoff`]): lanes of one owner (a tenant) share a quota.
    fn owner(&self) -> u64 {
        0
    }
    /// Whether its NFs may send a packet they rewrote to carry this outer
    /// VLAN (none: untagged); asked only when the rewrite changed it.
    fn may_tag(&self, vlan: Option<u16>) -> bool {
        let _ = vlan;
        true
    }
    /// Whether it may run its part of this batch now. `contended`: other
    /// lanes have packets in the same batch, waiting for it. A lane over
    /// its tenant's share of the worker says no only then; its part is
    /// refused (dropped, counted), so a tenant whose NFs are slow cannot
    /// starve the others on the worker, and takes the whole worker when
    /// alone.
    fn admit(&mut self, contended: bool) -> bool {
        let _ = contended;
        true
    }
    /// Whether it is told what it ran ([`ran`](Self::ran)): a lane that
    /// is not (a worker alone on its I/O) costs no clock read and no count
    /// of its forwarded packets.
    const ACCOUNTED: bool = true;
    /// Told after each batch how many of its packets it ran, how many of
    /// them leave forwarded, and how long its chain took.
    fn ran(&mut self, packets: u64, forwarded: u64, took: std::time::Duration) {
        let _ = (packets, forwarded, took);
    }
    /// Runs its packets of a batch through its chain. `moved`: the packets
    /// (index in `packets`) a group's dispatcher marked as the first of a
    /// flowlet moved here from another host.
    fn run(&mut self, packets: &[RawPacket<'_>], moved: &[(usize, SteerMark)]) -> &mut [PacketResult] {
        let _ = moved;
        self.worker().run(packets)
    }
    /// The results of its last [`run`](Self::run).
    fn last_results(&mut self) -> &mut [PacketResult] {
        self.worker().chain_mut().last_results_mut()
    }
    /// Told how many of its packets were refused because it was over its
    /// share.
    fn refused(&mut self, packets: u64) {
        let _ = packets;
    }
    /// Before its part of a batch runs: the packets that wait for their
    /// flow's state from another host (index in `packets`, held or
    /// dropped, at most `room` held; see [`Hold`]). The others run.
    /// `moved` as for [`run`](Self::run).
    fn hold(
        &mut self,
        packets: &[RawPacket<'_>],
        moved: &[(usize, SteerMark)],
        room: usize,
        out: &mut Vec<(usize, Hold)>,
    ) {
        let _ = (packets, moved, room, out);
    }
    /// Appends the tickets of its held packets whose wait is over: they
    /// come back first in the next batch.
    fn release(&mut self, out: &mut Vec<u64>) {
        let _ = out;
    }
    /// Whether its packets' output may wait for their flows' changed
    /// state to be held by another host (output commit): only then is
    /// [`defer`](Self::defer) asked.
    fn commits(&self) -> bool {
        false
    }
    /// After its part of a batch ran (`leaves`: whether each of `packets`
    /// leaves the host): the packets whose output waits until their
    /// flow's changed state is held by another host (index in `packets`;
    /// at most `room` kept; see [`Defer`]). The others leave at once.
    fn defer(&mut self, packets: &[RawPacket<'_>], leaves: &[bool], room: usize, out: &mut Vec<(usize, Defer)>) {
        let _ = (packets, leaves, room, out);
    }
    /// Appends the tickets of its kept outputs that may leave now to
    /// `send`, and of those that may not to `drop`.
    fn settle(&mut self, send: &mut Vec<u64>, drop: &mut Vec<u64>) {
        let _ = (send, drop);
    }
}

/// A worker alone on its I/O owns every port: its verdicts leave as its
/// chain gave them.
impl Lane for Worker {
    const ACCOUNTED: bool = false;

    fn worker(&mut self) -> &mut Worker {
        self
    }

    fn may_send(&self, _port: u16) -> bool {
        true
    }
}

/// Counts of a dispatcher's own decisions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct DispatchCounters {
    /// Packets no attachment matched.
    pub unmatched: u64,
    /// Packets a lane's NF sent to a port its attachments do not name.
    pub refused_egress: u64,
    /// Packets refused because their deployment's tenant was over its
    /// share of the worker while others waited.
    pub over_share: u64,
    /// Packets an attachment claims for a deployment that is not running
    /// on this worker (starting, or failed to start): dropped, never given
    /// the unmatched policy, so a tenant's traffic is not forwarded past
    /// NFs that are not there.
    pub not_running: u64,
    /// Packets whose flow's changed state could not be sent to be held
    /// elsewhere, or that found no room to wait for it (output commit):
    /// dropped rather than sent on state only this host holds.
    pub uncommitted: u64,
}

/// Where a packet goes.
#[derive(Debug, Clone, Copy)]
struct Owner {
    lane: usize,
    /// The verdict port of the attachment's `out`, if it names one.
    out: Option<u16>,
    /// The lane owns the worker's every port (see [`Dispatch::step_one`]):
    /// its verdicts go out as its chain gave them, with no egress or VLAN
    /// check.
    whole: bool,
}

impl Owner {
    /// The owner of every packet of a worker with one lane.
    const WHOLE: Owner = Owner { lane: 0, out: None, whole: true };
}

/// The owner id of a tenant's lanes (see [`Lane::owner`]): its name
/// hashed.
pub fn owner_of(tenant: &str) -> u64 {
    use std::hash::BuildHasher;
    foldhash::fast::FixedState::with_seed(0x0051_17ce).hash_one(tenant)
}

/// A packet of a batch that a device's hash may have placed on another
/// worker than the rest of its flow: an IP fragment (placed by its
/// addresses alone) or an ICMP error (placed by its own addresses, not
/// those of the connection it is about). Its index, what it is, the flow
/// it belongs to as far as it is known (a first fragment's, an error's
/// quoted packet's) and, for a fragment, its datagram's hash.
#[derive(Debug, Clone, Copy)]
struct Stray {
    at: usize,
    kind: StrayKind,
    key: Option<sluice_wire::FlowKey>,
    datagram: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StrayKind {
    FirstFragment,
    LaterFragment,
    IcmpError,
}

/// Appends the strays among `raw` to `out` (only frames that may be one
/// are parsed).
fn find_strays(raw: &[RawPacket<'_>], out: &mut Vec<Stray>) {
    for (at, p) in raw.iter().enumerate() {
        if sluice_wire::parse::may_be_fragment(p.data) {
            let parsed = sluice_wire::parse(p.data);
            if let Some(f) = parsed.ip.and_then(|ip| ip.fragment) {
                let datagram = crate::datagrams::datagram_hash(&f.key);
                let kind = if f.offset == 0 { StrayKind::FirstFragment } else { StrayKind::LaterFragment };
                out.push(Stray { at, kind, key: parsed.key, datagram });
            }
        } else if sluice_wire::parse::may_be_icmp(p.data)
            && let Some(key) = sluice_wire::parse::quoted_key(p.data)
        {
            out.push(Stray { at, kind: StrayKind::IcmpError, key: Some(key), datagram: 0 });
        }
    }
}

/// The datagrams whose first fragment a worker passed on lately (their
/// later fragments follow it); and each lane owner's budget of fragments to pass on (tokens, when last filled),
/// so that a flood of first fragments of flows no worker holds, each
/// passed round every worker, costs the host a bounded amount, and one
/// tenant's flood does not use up another's (beyond it, fragments stay
/// where they came in).
#[derive(Debug)]
struct Passed {
    datagrams: crate::datagrams::Datagrams<()>,
    born: std::time::Instant,
    budgets: std::collections::HashMap<u64, (u64, u64)>,
}

impl Default for Passed {
    fn default() -> Self {
        Passed {
            datagrams: crate::datagrams::Datagrams::default(),
            born: std::time::Instant::now(),
            budgets: std::collections::HashMap::new(),
        }
    }
}

/// Fragments a worker passes on a second at most for one lane owner, and
/// at once.
const PASS_RATE: u64 = 100_000;
const PASS_BURST: u64 = 4096;
/// Owners whose budgets a worker keeps (beyond, every budget starts over).
const PASS_OWNERS: usize = 1024;

impl Passed {
    fn now_ns(&self) -> u64 {
        u64::try_from(self.born.elapsed().as_nanos()).unwrap_or(u64::MAX).max(1)
    }

    fn note(&mut self, datagram: u64, now: u64) {
        self.datagrams.note(datagram, (), now);
    }

    /// Takes one fragment's pass from `owner`'s budget, if it has one
    /// left.
    fn take(&mut self, owner: u64, now: u64) -> bool {
        if self.budgets.len() >= PASS_OWNERS && !self.budgets.contains_key(&owner) {
            self.budgets.clear();
        }
        let (tokens, filled) = self.budgets.entry(owner).or_insert((PASS_BURST, now));
        let earned = now.saturating_sub(*filled).saturating_mul(PASS_RATE) / 1_000_000_000;
        if earned > 0 {
            *tokens = tokens.saturating_add(earned).min(PASS_BURST);
            *filled = now;
        }
        let left = *tokens > 0;
        *tokens = tokens.saturating_sub(1);
        left
    }

    fn holds(&self, datagram: u64, now: u64) -> bool {
        self.datagrams.get(datagram, now).is_some()
    }
}

/// A host worker's classification and the buffers its batches reuse.
#[derive(Debug)]
pub struct Dispatch {
    /// Port ids in verdict order: verdict port k ≥ 1 is `ports[k - 1]`.
    ports: Vec<u16>,
    unmatched: Unmatched,
    counters: DispatchCounters,
    raw: Vec<RawPacket<'static>>,
    sub: Vec<RawPacket<'static>>,
    owners: Vec<Option<Owner>>,
    /// Per port, whether the lane being run may name it.
    allowed: Vec<bool>,
    /// Packets of the batch per lane.
    per_lane: Vec<usize>,
    /// Results of the lane being run whose rewrite changed the outer VLAN:
    /// (index in its results, new VLAN).
    retagged: Vec<(usize, Option<u16>)>,
    /// Where each packet of the batch has its result: (lane, index in the
    /// lane's results), or a place in [`FIXED`] (lane: the number of
    /// lanes).
    at: Vec<(u32, u32)>,
    /// The lanes' results and [`FIXED`], for delivery.
    parts: Vec<&'static [PacketResult]>,
    /// The owner of each lane, for delivery.
    lane_owners: Vec<u64>,
    /// The batch's strays, when the I/O can pass packets between workers
    /// (see [`Dispatch::pass_strays`]).
    strays: Vec<Stray>,
    /// The batch's packets passed from another worker, and how often.
    passed_in: Vec<(usize, usize)>,
    /// The batch's packets to pass on.
    to_pass: Vec<usize>,
    /// Datagrams whose first fragment this worker passed on lately: their
    /// later fragments follow it (see [`Passed`]).
    passed: Passed,
    /// The batch's marked packets, and those of the lane being run.
    moved: Vec<(usize, SteerMark)>,
    lane_moved: Vec<(usize, SteerMark)>,
    /// Position in the batch of each packet of the lane being run.
    positions: Vec<usize>,
    /// The batch's positions grouped by lane, and where each lane's start.
    order: Vec<usize>,
    starts: Vec<usize>,
    cursor: Vec<usize>,
    /// The lane's decisions for packets that wait (index in its part).
    holds: Vec<(usize, Hold)>,
    /// Packets of the batch to hold (position, ticket), and tickets to
    /// release.
    to_hold: Vec<(usize, u64)>,
    tickets: Vec<u64>,
    /// Output commit: whether each packet of the lane being run leaves,
    /// its decisions (index in its part), the batch's outputs to keep
    /// (position, ticket), and kept outputs to send or drop.
    leaves: Vec<bool>,
    defers: Vec<(usize, Defer)>,
    to_defer: Vec<(usize, u64)>,
    send: Vec<u64>,
    unsent: Vec<u64>,
    /// Stage times, when asked for ([`Dispatch::time_stages`]); the
    /// lanes' chains' own are added after each of their runs.
    timing: Option<Box<(Stopwatch, StageTimes)>>,
}

impl Dispatch {
    /// A dispatcher for a worker whose I/O has these ports (ids, in the
    /// I/O's order), with `unmatched` for packets nobody claims.
    pub fn new(ports: Vec<u16>, unmatched: Unmatched) -> Self {
        Dispatch {
            ports,
            unmatched,
            counters: DispatchCounters::default(),
            raw: Vec::new(),
            sub: Vec::new(),
            owners: Vec::new(),
            allowed: Vec::new(),
            per_lane: Vec::new(),
            retagged: Vec::new(),
            at: Vec::new(),
            parts: Vec::new(),
            lane_owners: Vec::new(),
            strays: Vec::new(),
            passed_in: Vec::new(),
            to_pass: Vec::new(),
            passed: Passed::default(),
            moved: Vec::new(),
            lane_moved: Vec::new(),
            positions: Vec::new(),
            order: Vec::new(),
            starts: Vec::new(),
            cursor: Vec::new(),
            holds: Vec::new(),
            to_hold: Vec::new(),
            tickets: Vec::new(),
            leaves: Vec::new(),
            defers: Vec::new(),
            to_defer: Vec::new(),
            send: Vec::new(),
            unsent: Vec::new(),
            timing: None,
        }
    }

    /// Times each stage of a batch from now on (see
    /// [`sluice_runtime::stages`]): receive, read, classify, each lane's
    /// chain (build, call, verdicts; the dispatch's own handling of the
    /// lane's results counts as verdicts), deliver and `io`'s transmit,
    /// and the caller's loop between batches.
    pub fn time_stages(&mut self, io: &mut (impl PacketIo + ?Sized)) {
        self.timing = Some(Box::default());
        io.time_transmit();
    }

    /// The stage times so far (zero when not timed); `io` is the one it
    /// steps, whose transmit time is taken out of delivery.
    pub fn stage_times(&self, io: &(impl PacketIo + ?Sized)) -> StageTimes {
        let mut t = self.timing.as_deref().map(|t| t.1).unwrap_or_default();
        t.transmit_ns = io.transmit_ns();
        t.deliver_ns = t.deliver_ns.saturating_sub(t.transmit_ns);
        t
    }

    /// Adds the time since the last lap to the stage `slot` picks, when
    /// timed.
    #[inline]
    fn lap(&mut self, slot: impl FnOnce(&mut StageTimes) -> &mut u64) {
        if let Some(t) = self.timing.as_deref_mut() {
            *slot(&mut t.1) += t.0.lap();
        }
    }

    /// What it decided so far.
    pub fn counters(&self) -> DispatchCounters {
        self.counters
    }

    fn verdict_port(&self, port: u16) -> Option<u16> {
        self.ports.iter().position(|&p| p == port).and_then(|i| u16::try_from(i + 1).ok())
    }

    fn owner(&self, classifier: &Classifier, p: &RawPacket<'_>) -> Option<Owner> {
        classifier.classify(p).map(|(lane, a): (usize, &Attachment)| Owner {
            lane,
            // An `out` naming no port of this host cannot be honoured: the
            // packet is refused rather than sent somewhere else.
            out: a.out.map(|o| self.verdict_port(o).unwrap_or(u16::MAX)),
            whole: false,
        })
    }

    /// [`step`](Self::step) for a worker with one lane that owns every
    /// packet of `io` (`sluice-host run` and `dpdk`, a `serve` capture
    /// replay): nothing is classified, and the lane's verdicts leave as its
    /// chain gave them (the ports are all its own).
    pub fn step_one<L: Lane, I: PacketIo + ?Sized>(&mut self, io: &mut I, max: usize, lane: &mut L) -> Receive {
        self.step_by(io, max, None, std::slice::from_mut(lane))
    }

    /// Runs one batch of at most `max` packets (per queue of `io`): each
    /// packet through the chain of the lane `classifier` gives it to
    /// (its index in `lanes`), then delivers every result to `io` in the
    /// order received.
    pub fn step<L: Lane, I: PacketIo + ?Sized>(
        &mut self,
        io: &mut I,
        max: usize,
        classifier: &Classifier,
        lanes: &mut [L],
    ) -> Receive {
        self.step_by(io, max, Some(classifier), lanes)
    }

    /// A step whose packets `classifier` gives to `lanes`, or, without
    /// one, all to the first lane.
    fn step_by<L: Lane, I: PacketIo + ?Sized>(
        &mut self,
        io: &mut I,
        max: usize,
        classifier: Option<&Classifier>,
        lanes: &mut [L],
    ) -> Receive {
        // The time since the last batch was the caller's loop.
        self.lap(|t| &mut t.between_ns);
        // Each lane's part of a batch should be about a batch: more lanes,
        // larger batches (up to the runtime's).
        let max = max.saturating_mul(lanes.len().max(1)).min(sluice_wire::abi::MAX_BATCH.max(max));
        // Held packets whose wait is over come back first.
        self.tickets.clear();
        for lane in lanes.iter_mut() {
            lane.release(&mut self.tickets);
        }
        if !self.tickets.is_empty() {
            io.release(&self.tickets);
        }
        // Kept outputs whose flows' changes are held elsewhere leave (or
        // are dropped) before anything newer of theirs.
        self.send.clear();
        self.unsent.clear();
        for lane in lanes.iter_mut() {
            lane.settle(&mut self.send, &mut self.unsent);
        }
        io.settle(&self.send, &self.unsent);
        let got = io.receive(max);
        let Receive::Packets(n) = got else {
            return got;
        };
        self.lap(|t| &mut t.receive_ns);
        let mut room = io.hold_room();
        let mut defer_room = io.defer_room();
        self.to_hold.clear();
        self.to_defer.clear();
        self.to_pass.clear();
        self.moved.clear();
        let circle = io.circle();
        self.passed_in.clear();
        if circle.is_some() {
            io.passed_in(&mut self.passed_in);
        }
        let mut raw = recycle(std::mem::take(&mut self.raw));
        io.packets(&mut raw, &mut self.moved);
        self.strays.clear();
        if circle.is_some() {
            find_strays(&raw, &mut self.strays);
        }
        self.lap(|t| &mut t.read_ns);
        // One lane owns every packet: nothing to classify or check.
        if classifier.is_none()
            && self.strays.is_empty()
            && let Some(lane) = lanes.first_mut()
            && let Some(run) = self.sole_run(lane, &raw, room, defer_room, true)
        {
            self.raw = recycle(raw);
            self.sole_deliver(io, lane, run, n);
            return got;
        }
        self.owners.clear();
        match classifier {
            Some(classifier) => self.classify(classifier, &raw),
            None => self.owners.resize(raw.len(), Some(Owner::WHOLE)),
        }
        self.counters.unmatched += self.owners.iter().filter(|o| o.is_none()).count() as u64;
        self.per_lane.clear();
        self.per_lane.resize(lanes.len(), 0);
        for o in self.owners.iter().flatten() {
            match self.per_lane.get_mut(o.lane) {
                Some(n) => *n += 1,
                None => self.counters.not_running += 1,
            }
        }
        // The common case: one lane owns the whole batch. It runs on the
        // batch as received and its results are delivered where they are.
        if classifier.is_some()
            && self.strays.is_empty()
            && let Some(li) = self.per_lane.iter().position(|&n| n == raw.len())
            && let Some(lane) = lanes.get_mut(li)
            && let Some(run) = self.sole_run(lane, &raw, room, defer_room, false)
        {
            self.raw = recycle(raw);
            self.sole_deliver(io, lane, run, n);
            return got;
        }
        // A claimed packet that no lane runs is dropped; each lane that runs
        // points its packets at its own results.
        let fixed = u32::try_from(lanes.len()).unwrap_or(u32::MAX);
        let unmatched = (fixed, u32::from(matches!(self.unmatched, Unmatched::Forward)));
        self.at.clear();
        self.at.extend(self.owners.iter().map(|o| if o.is_some() { (fixed, REFUSED) } else { unmatched }));
        let contended = self.per_lane.iter().filter(|&&n| n > 0).count() > 1;
        // The batch's packets grouped by lane, in order within each: lane
        // `l`'s are `order[starts[l]..starts[l] + per_lane[l]]`.
        self.starts.clear();
        let mut at = 0;
        for &n in &self.per_lane {
            self.starts.push(at);
            at += n;
        }
        self.order.clear();
        self.order.resize(at, 0);
        self.cursor.clear();
        self.cursor.extend_from_slice(&self.starts);
        for (i, o) in self.owners.iter().enumerate() {
            if let Some(slot) = o.and_then(|o| self.cursor.get_mut(o.lane))
                && let Some(place) = self.order.get_mut(*slot)
            {
                *place = i;
                *slot += 1;
            }
        }
        // One clock read per lane: its end is the next one's start.
        let mut started = std::time::Instant::now();
        for (li, lane) in lanes.iter_mut().enumerate() {
            let mine = self.per_lane.get(li).copied().unwrap_or(0);
            if mine == 0 {
                continue;
            }
            if !lane.admit(contended) {
                // Its packets' places stay refused.
                self.counters.over_share += mine as u64;
                lane.refused(mine as u64);
                continue;
            }
            let mut sub = recycle(std::mem::take(&mut self.sub));
            self.lane_moved.clear();
            self.positions.clear();
            if mine == raw.len() {
                // The whole batch is this lane's.
                sub.extend_from_slice(&raw);
                self.lane_moved.extend_from_slice(&self.moved);
                self.positions.extend(0..raw.len());
            } else {
                let from = self.starts.get(li).copied().unwrap_or(0);
                self.positions.extend_from_slice(self.order.get(from..from + mine).unwrap_or(&[]));
                sub.extend(self.positions.iter().filter_map(|&i| raw.get(i).copied()));
                for &(at, mark) in &self.moved {
                    if let Ok(k) = self.positions.binary_search(&at) {
                        self.lane_moved.push((k, mark));
                    }
                }
            }
            if let Some(t) = self.timing.as_deref_mut() {
                if !lane.worker().chain().timed() {
                    lane.worker().chain_mut().time_stages(true);
                }
                t.1.classify_ns += t.0.lap();
            }
            self.holds.clear();
            lane.hold(&sub, &self.lane_moved, room, &mut self.holds);
            if let Some(circle) = circle
                && !self.strays.is_empty()
            {
                self.pass_strays(lane, circle);
            }
            if !self.holds.is_empty() {
                let before = self.to_hold.len();
                self.without_held(&mut sub);
                room = room.saturating_sub(self.to_hold.len() - before);
            }
            if !sub.is_empty() {
                self.allowed.clear();
                self.allowed.extend(self.ports.iter().map(|&p| lane.may_send(p)));
                let results = lane.run(&sub, &self.lane_moved);
                let mut forwarded = 0u64;
                let part = u32::try_from(li).unwrap_or(u32::MAX);
                // The lane's results in order, with the position in the
                // batch of each (held packets are in neither).
                for ((k, r), &i) in results.iter_mut().enumerate().zip(&self.positions) {
                    let (Some(place), Some(Some(owner)), Some(original)) =
                        (self.at.get_mut(i), self.owners.get(i), raw.get(i))
                    else {
                        continue;
                    };
                    let fate = fate_of(r.fate, owner, &self.allowed, &mut self.counters);
                    // A rewrite that changed the outer VLAN is checked
                    // below: it may not move a packet into a VLAN that is
                    // not its deployment's (another tenant's traffic).
                    if matches!(fate, Fate::Forward(_))
                        && !owner.whole
                        && let Some(vlan) = r.data.as_deref().map(outer_vlan)
                        && vlan != outer_vlan(original.data)
                    {
                        self.retagged.push((k, vlan));
                    }
                    forwarded += u64::from(matches!(fate, Fate::Forward(_)));
                    r.fate = fate;
                    *place = (part, u32::try_from(k).unwrap_or(u32::MAX));
                }
                let now = std::time::Instant::now();
                let took = now.saturating_duration_since(started);
                started = now;
                forwarded = forwarded.saturating_sub(self.refuse_retagged(lane));
                // Output commit: the packets whose output waits.
                if lane.commits() {
                    forwarded = forwarded.saturating_sub(self.defer_lane(lane, &sub, &mut defer_room, true));
                }
                lane.ran(sub.len() as u64, forwarded, took);
            }
            self.sub = recycle(sub);
            if let Some(t) = self.timing.as_deref_mut() {
                // The lane's run and the handling of its results: the
                // chain's stages as it timed them, the rest verdicts.
                let ns = t.0.lap();
                add_lane_times(&mut t.1, lane.worker().chain_mut().take_stage_times(), ns);
            }
        }
        self.raw = recycle(raw);
        self.lap(|t| &mut t.classify_ns);
        for &(at, ticket) in &self.to_hold {
            io.hold(at, ticket);
        }
        for &at in &self.to_pass {
            io.pass(at);
        }
        for &(at, ticket) in &self.to_defer {
            io.defer(at, ticket);
        }
        // Each lane's results where its chain left them: none is copied.
        let mut parts = recycle(std::mem::take(&mut self.parts));
        self.lane_owners.clear();
        for lane in lanes.iter_mut() {
            self.lane_owners.push(lane.owner());
            parts.push(&*lane.last_results());
        }
        parts.push(&FIXED);
        io.deliver(Results::gathered(&parts, &self.at).owned_by(&self.lane_owners));
        self.parts = recycle(parts);
        if let Some(t) = self.timing.as_deref_mut() {
            t.1.deliver_ns += t.0.lap();
            t.1.batches += 1;
            t.1.packets += n as u64;
        }
        got
    }

    /// Sets the owner of each packet of `raw` by `classifier`.
    fn classify(&mut self, classifier: &Classifier, raw: &[RawPacket<'_>]) {
        // Where owners follow port and VLAN alone, the batch's few pairs
        // are classified once each (remembered for this batch only: the
        // classifier may change before the next).
        let mut memo: [Option<Remembered>; MEMO] = [None; MEMO];
        for p in raw {
            let o = match classifier.l2_key(p) {
                Some(key) => {
                    let slot = memo.get_mut(memo_slot(key));
                    match slot {
                        Some(Some((k, o))) if *k == key => *o,
                        Some(slot) => {
                            let o = self.owner(classifier, p);
                            *slot = Some((key, o));
                            o
                        }
                        None => self.owner(classifier, p),
                    }
                }
                None => self.owner(classifier, p),
            };
            self.owners.push(o);
        }
    }

    /// Asks `lane` (output commit) which of its packets of the batch
    /// (`sub`) wait, after their fates are set in its results: notes the
    /// kept ones in `to_defer` at their place in the batch (`positions`
    /// where `gathered`, else the same index), taking from `room`, and
    /// refuses the ones that may not leave. Returns how many forwarded
    /// packets it refused.
    fn defer_lane<L: Lane>(&mut self, lane: &mut L, sub: &[RawPacket<'_>], room: &mut usize, gathered: bool) -> u64 {
        self.leaves.clear();
        self.leaves.extend(lane.last_results().iter().map(|r| matches!(r.fate, Fate::Forward(_))));
        self.defers.clear();
        lane.defer(sub, &self.leaves, *room, &mut self.defers);
        if self.defers.is_empty() {
            return 0;
        }
        let results = lane.last_results();
        let mut refused = 0;
        for &(k, d) in &self.defers {
            match d {
                Defer::Keep(ticket) => {
                    let at = if gathered { self.positions.get(k).copied() } else { Some(k) };
                    if let Some(at) = at {
                        self.to_defer.push((at, ticket));
                        *room = room.saturating_sub(1);
                    }
                }
                Defer::Drop => {
                    if let Some(r) = results.get_mut(k) {
                        r.fate = Fate::Refused;
                        self.counters.uncommitted += 1;
                        refused += 1;
                    }
                }
            }
        }
        refused
    }

    /// Runs `lane`, which owns every packet of the batch (`raw`), and sets
    /// its fates as the host sends them, in place: no part of the batch to
    /// gather, no results to copy; [`sole_deliver`](Self::sole_deliver)
    /// delivers them. Returns `None`, having done nothing but ask the lane
    /// which packets wait, when the general path must run instead: the
    /// lane is over its share, or holds packets.
    fn sole_run<L: Lane>(
        &mut self,
        lane: &mut L,
        raw: &[RawPacket<'_>],
        room: usize,
        defer_room: usize,
        whole: bool,
    ) -> Option<SoleRun> {
        if !lane.admit(false) {
            return None;
        }
        self.holds.clear();
        lane.hold(raw, &self.moved, room, &mut self.holds);
        if !self.holds.is_empty() {
            // Asked once: the general path takes these decisions.
            return None;
        }
        if let Some(t) = self.timing.as_deref_mut() {
            if !lane.worker().chain().timed() {
                lane.worker().chain_mut().time_stages(true);
            }
            // A lane that owns every packet was classified by nobody: what
            // came before its run is part of it (verdicts).
            if !whole {
                t.1.classify_ns += t.0.lap();
            }
        }
        let started = L::ACCOUNTED.then(std::time::Instant::now);
        if whole {
            // Its verdicts leave as its chain gave them (`Owner::WHOLE`).
            let results = lane.run(raw, &self.moved);
            let forwarded = if L::ACCOUNTED {
                results.iter().filter(|r| matches!(r.fate, Fate::Forward(_))).count() as u64
            } else {
                0
            };
            let mut room = defer_room;
            let forwarded =
                forwarded.saturating_sub(if lane.commits() { self.defer_lane(lane, raw, &mut room, false) } else { 0 });
            let ns = self.timing.as_deref_mut().map_or(0, |t| t.0.lap());
            return Some(SoleRun { started, forwarded, ns });
        }
        self.allowed.clear();
        self.allowed.extend(self.ports.iter().map(|&p| lane.may_send(p)));
        let results = lane.run(raw, &self.moved);
        let mut forwarded = 0u64;
        for (i, (r, (owner, original))) in results.iter_mut().zip(self.owners.iter().zip(raw)).enumerate() {
            let Some(owner) = owner else { continue };
            r.fate = fate_of(r.fate, owner, &self.allowed, &mut self.counters);
            if matches!(r.fate, Fate::Forward(_))
                && !owner.whole
                && let Some(vlan) = r.data.as_deref().map(outer_vlan)
                && vlan != outer_vlan(original.data)
            {
                self.retagged.push((i, vlan));
            }
            forwarded += u64::from(matches!(r.fate, Fate::Forward(_)));
        }
        // Output commit: the packets whose output waits (a rewrite that
        // moves a packet into another VLAN is refused later, and its kept
        // entry left without output).
        if lane.commits() {
            let mut room = defer_room;
            forwarded = forwarded.saturating_sub(self.defer_lane(lane, raw, &mut room, false));
        }
        // The run and the fates: the chain's stages as it timed them, the
        // rest verdicts.
        let ns = self.timing.as_deref_mut().map_or(0, |t| t.0.lap());
        Some(SoleRun { started, forwarded, ns })
    }

    /// Delivers the results [`sole_run`](Self::sole_run) set (`n` packets).
    fn sole_deliver<L: Lane, I: PacketIo + ?Sized>(&mut self, io: &mut I, lane: &mut L, run: SoleRun, n: usize) {
        let SoleRun { started, mut forwarded, ns } = run;
        for &(at, ticket) in &self.to_defer {
            io.defer(at, ticket);
        }
        // A rewrite that changed a packet's VLAN is checked against the
        // lane's attachments.
        forwarded = forwarded.saturating_sub(self.refuse_retagged(lane));
        let owner = [lane.owner()];
        io.deliver(Results::from(&*lane.last_results()).owned_by(&owner));
        let took = started.map(|s| s.elapsed());
        if let Some(t) = self.timing.as_deref_mut() {
            t.1.deliver_ns += t.0.lap();
            add_lane_times(&mut t.1, lane.worker().chain_mut().take_stage_times(), ns);
            t.1.batches += 1;
            t.1.packets += n as u64;
        }
        if let Some(took) = took {
            lane.ran(n as u64, forwarded, took);
        }
    }

    /// Refuses the results of `lane` in `retagged` (index in its results,
    /// new outer VLAN) whose VLAN it may not send: a rewrite may not move
    /// a packet into another tenant's VLAN. Returns how many it refused
    /// (they had been forwarded).
    fn refuse_retagged<L: Lane>(&mut self, lane: &mut L) -> u64 {
        if self.retagged.is_empty() {
            return 0;
        }
        self.retagged.retain(|&(_, vlan)| !lane.may_tag(vlan));
        let results = lane.last_results();
        let mut refused = 0;
        for (k, _) in self.retagged.drain(..) {
            if let Some(r) = results.get_mut(k) {
                r.fate = Fate::Refused;
                self.counters.refused_egress += 1;
                refused += 1;
            }
        }
        refused
    }

    /// Among the lane's packets (at [`positions`](Self::positions) in
    /// the batch), picks the strays to pass to the next worker of the
    /// `circle`: a first fragment or an ICMP error of a flow whose state
    /// the lane's chain does not hold, and the later fragments of a
    /// datagram whose first one this worker passed. The device's hash
    /// placed them by addresses alone (RSS and the kernel's fanout cannot
    /// see a fragment's ports, nor the connection an error quotes),
    /// possibly on another worker than the rest of their flow; passed
    /// round, one stops at the worker that holds its flow, or back where it
    /// came in when none does. A packet picked is added to `holds` as
    /// dropped (the lane does not run it) and to `to_pass`.
    fn pass_strays<L: Lane>(&mut self, lane: &mut L, circle: usize) {
        let now = self.passed.now_ns();
        let owner = lane.owner();
        for f in &self.strays {
            let Ok(si) = self.positions.binary_search(&f.at) else { continue };
            let hops = match self.passed_in.binary_search_by_key(&f.at, |&(i, _)| i) {
                Ok(k) => self.passed_in.get(k).map_or(0, |&(_, h)| h),
                Err(_) => 0,
            };
            if hops >= circle || self.holds.iter().any(|&(i, _)| i == si) {
                continue;
            }
            let pass = match (f.kind, f.key) {
                (StrayKind::FirstFragment | StrayKind::IcmpError, Some(key)) => !lane.holds_flow(&key),
                (StrayKind::LaterFragment, _) => self.passed.holds(f.datagram, now),
                _ => false,
            };
            if pass && self.passed.take(owner, now) {
                if f.kind == StrayKind::FirstFragment {
                    self.passed.note(f.datagram, now);
                }
                self.holds.push((si, Hold::Drop));
                self.to_pass.push(f.at);
            }
        }
    }

    /// Takes the packets the lane holds or drops (`holds`) out of its part
    /// (`sub` and `positions`, and the marks of `lane_moved` re-indexed),
    /// and notes the held ones in `to_hold`. Their results stay refused: a
    /// held one is not delivered, a dropped one is dropped.
    fn without_held(&mut self, sub: &mut Vec<RawPacket<'_>>) {
        self.holds.sort_unstable_by_key(|&(i, _)| i);
        self.holds.dedup_by_key(|&mut (i, _)| i);
        for &(si, h) in &self.holds {
            let Some(&at) = self.positions.get(si) else { continue };
            if let Hold::Keep(ticket) = h {
                self.to_hold.push((at, ticket));
            }
        }
        let held = |si: usize| self.holds.binary_search_by_key(&si, |&(i, _)| i);
        let mut si = 0;
        sub.retain(|_| {
            let keep = held(si).is_err();
            si += 1;
            keep
        });
        let mut si = 0;
        self.positions.retain(|_| {
            let keep = held(si).is_err();
            si += 1;
            keep
        });
        self.lane_moved.retain_mut(|(si, _)| match held(*si) {
            Ok(_) => false,
            // Err(n): n held packets come before it.
            Err(n) => {
                *si -= n;
                true
            }
        });
    }
}

/// The results of packets no lane ran: refused (at [`REFUSED`]) and
/// forwarded by the host's [`Unmatched`] policy (at 1).
static FIXED: [PacketResult; 2] = [PacketResult::of(Fate::Refused), PacketResult::of(Fate::Forward(0))];
const REFUSED: u32 = 0;

/// Port and VLAN pairs a batch remembers the owners of (direct-mapped: a
/// batch of 16 tenants' VLANs in turn thrashed 8 slots, and classified
/// nearly every packet in full).
const MEMO: usize = 64;

/// The memo slot of a port and VLAN pair (Fibonacci hashing: consecutive
/// VLAN ids land far apart).
fn memo_slot(key: (u16, Option<u16>)) -> usize {
    let k = (u32::from(key.0) << 16) | u32::from(key.1.unwrap_or(0xffff));
    (k.wrapping_mul(0x9E37_79B1) >> (32 - MEMO.trailing_zeros())) as usize
}
/// A port and VLAN pair and its owner.
type Remembered = ((u16, Option<u16>), Option<Owner>);

/// What [`Dispatch::sole_run`] leaves for its delivery.
struct SoleRun {
    /// When the lane's run started, if it is told what it ran.
    started: Option<std::time::Instant>,
    forwarded: u64,
    /// Ns of the run and the fates, when timed.
    ns: u64,
}

/// Adds a lane's run, `ns` in all, to `t`: its chain's stages as the chain
/// timed them (`chain`), the rest (the dispatch's handling of its
/// results) as verdicts.
fn add_lane_times(t: &mut StageTimes, chain: StageTimes, ns: u64) {
    let own = chain.build_ns + chain.call_ns + chain.verdicts_ns;
    t.build_ns += chain.build_ns;
    t.call_ns += chain.call_ns;
    t.verdicts_ns += chain.verdicts_ns + ns.saturating_sub(own);
}

/// A lane's verdict for a packet of `owner`'s attachment, as the host
/// sends it: port 0 (the default output) becomes the attachment's `out`
/// where it names one, and a port the lane may not name (`allowed`, by
/// verdict port - 1), or an `out` this host does not have, is refused
/// and counted.
fn fate_of(fate: Fate, owner: &Owner, allowed: &[bool], counters: &mut DispatchCounters) -> Fate {
    if owner.whole {
        return fate;
    }
    match fate {
        // An `out` port this host does not have.
        Fate::Forward(0) if owner.out == Some(u16::MAX) => {
            counters.refused_egress += 1;
            Fate::Refused
        }
        Fate::Forward(0) => Fate::Forward(owner.out.unwrap_or(0)),
        Fate::Forward(k) => {
            if usize::from(k).checked_sub(1).and_then(|i| allowed.get(i)).copied().unwrap_or(false) {
                Fate::Forward(k)
            } else {
                counters.refused_egress += 1;
                Fate::Refused
            }
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;

    /// Packets from a list, results kept.
    struct ListIo {
        frames: Vec<(Vec<u8>, u16)>,
        taken: bool,
        delivered: Vec<Fate>,
        owners: Vec<u64>,
    }

    impl PacketIo for ListIo {
        fn receive(&mut self, _max: usize) -> Receive {
            if self.taken {
                return Receive::Done;
            }
            self.taken = true;
            Receive::Packets(self.frames.len())
        }
        fn packets<'a>(&'a mut self, out: &mut Vec<RawPacket<'a>>, _moved: &mut Vec<(usize, SteerMark)>) {
            for (f, port) in &self.frames {
                out.push(RawPacket { data: f, wire_len: f.len() as u32, timestamp_ns: 0, ingress_port: *port });
            }
        }
        fn deliver(&mut self, results: Results<'_>) {
            self.delivered = results.iter().map(|r| r.fate).collect();
            self.owners = (0..results.len()).map(|i| results.owner(i)).collect();
        }
    }

    fn tagged(vlan: u16) -> Vec<u8> {
        let mut f = vec![0u8; 12];
        f.extend_from_slice(&[0x81, 0x00]);
        f.extend_from_slice(&vlan.to_be_bytes());
        f.extend_from_slice(&[0x88, 0xb5, 1, 2, 3, 4]);
        f
    }

    #[test]
    fn a_batch_of_many_tenants_vlans_keeps_each_pair_in_a_memo_slot_of_its_own() {
        for first in [1u16, 100, 1000, 4000] {
            let slots: std::collections::HashSet<usize> =
                (first..first + 16).map(|v| memo_slot((0, Some(v)))).collect();
            assert_eq!(slots.len(), 16, "VLANs {first}..{}", first + 16);
        }
        for port in 0..64u16 {
            assert!(memo_slot((port, None)) < MEMO);
            assert!(memo_slot((port, Some(4095))) < MEMO);
        }
    }

    #[test]
    fn unmatched_packets_follow_the_host_policy_and_are_counted() {
        let c = Classifier::new([(0, "port=0,vlan=100".parse().unwrap())]);
        for (policy, fate) in [(Unmatched::Drop, Fate::Refused), (Unmatched::Forward, Fate::Forward(0))] {
            let mut io = ListIo {
                frames: vec![(tagged(200), 0), (tagged(300), 0)],
                taken: false,
                delivered: vec![],
                owners: vec![],
            };
            let mut d = Dispatch::new(vec![0, 1], policy);
            let mut lanes: Vec<NoLane> = Vec::new();
            assert_eq!(d.step(&mut io, 32, &c, &mut lanes), Receive::Packets(2));
            assert_eq!(io.delivered, vec![fate, fate]);
            assert_eq!(d.counters().unmatched, 2);
        }
    }

    /// A claim with no lane behind it (its deployment is not running on
    /// the worker) drops its packets whatever the unmatched policy.
    #[test]
    fn claimed_packets_without_a_lane_are_dropped_not_forwarded() {
        let c = Classifier::new([(0, "port=0,vlan=100".parse().unwrap())]);
        let mut io = ListIo {
            frames: vec![(tagged(100), 0), (tagged(300), 0)],
            taken: false,
            delivered: vec![],
            owners: vec![],
        };
        let mut d = Dispatch::new(vec![0, 1], Unmatched::Forward);
        let mut lanes: Vec<NoLane> = Vec::new();
        assert_eq!(d.step(&mut io, 32, &c, &mut lanes), Receive::Packets(2));
        assert_eq!(io.delivered, vec![Fate::Refused, Fate::Forward(0)]);
        assert_eq!(d.counters().not_running, 1);
        assert_eq!(d.counters().unmatched, 1);
    }

    /// Frames of a batch, and the marks among them.
    type Batch = (Vec<Vec<u8>>, Vec<(usize, SteerMark)>);

    /// Batches from a list; packets held by ticket come back first in the
    /// next batch once released, as a DPDK I/O does.
    struct HoldIo {
        batches: std::collections::VecDeque<Batch>,
        frames: Vec<Vec<u8>>,
        marks: Vec<(usize, SteerMark)>,
        held: Vec<(u64, Vec<u8>)>,
        holding: Vec<(usize, u64)>,
        released: Vec<Vec<u8>>,
        delivered: Vec<(Vec<u8>, Fate)>,
    }

    impl PacketIo for HoldIo {
        fn receive(&mut self, _max: usize) -> Receive {
            self.frames = std::mem::take(&mut self.released);
            let (frames, marks) = self.batches.pop_front().unwrap_or_default();
            let back = self.frames.len();
            self.marks = marks.into_iter().map(|(i, m)| (i + back, m)).collect();
            self.frames.extend(frames);
            if self.frames.is_empty() { Receive::Done } else { Receive::Packets(self.frames.len()) }
        }
        fn packets<'a>(&'a mut self, out: &mut Vec<RawPacket<'a>>, moved: &mut Vec<(usize, SteerMark)>) {
            for f in &self.frames {
                out.push(RawPacket { data: f, wire_len: f.len() as u32, timestamp_ns: 0, ingress_port: 0 });
            }
            moved.extend_from_slice(&self.marks);
        }
        fn deliver(&mut self, results: Results<'_>) {
            for (i, (f, r)) in self.frames.iter().zip(results.iter()).enumerate() {
                match self.holding.iter().find(|h| h.0 == i) {
                    Some(&(_, t)) => self.held.push((t, f.clone())),
                    None => self.delivered.push((f.clone(), r.fate)),
                }
            }
            self.holding.clear();
        }
        fn hold_room(&self) -> usize {
            4 - self.held.len() - self.holding.len()
        }
        fn hold(&mut self, index: usize, ticket: u64) {
            self.holding.push((index, ticket));
        }
        fn release(&mut self, tickets: &[u64]) {
            let (go, stay): (Vec<_>, Vec<_>) = self.held.drain(..).partition(|(t, _)| tickets.contains(t));
            self.held = stay;
            self.released.extend(go.into_iter().map(|(_, f)| f));
        }
    }

    /// A lane that forwards everything, and holds the packets whose last
    /// byte is 1 (a "flow" waiting for its state) until told to release
    /// them; over the I/O's room it drops them. Records what it ran, and
    /// the marks it was given.
    struct WaitingLane {
        waiting: bool,
        release: bool,
        ran: Vec<Vec<u8>>,
        marks: Vec<usize>,
        results: Vec<PacketResult>,
    }

    impl Lane for WaitingLane {
        fn worker(&mut self) -> &mut Worker {
            unreachable!("run is its own")
        }
        fn may_send(&self, _: u16) -> bool {
            true
        }
        fn hold(
            &mut self,
            packets: &[RawPacket<'_>],
            _: &[(usize, SteerMark)],
            mut room: usize,
            out: &mut Vec<(usize, Hold)>,
        ) {
            for (i, p) in packets.iter().enumerate() {
                if self.waiting && p.data.last() == Some(&1) {
                    if room > 0 {
                        room -= 1;
                        out.push((i, Hold::Keep(7)));
                    } else {
                        out.push((i, Hold::Drop));
                    }
                }
            }
        }
        fn release(&mut self, out: &mut Vec<u64>) {
            if self.release {
                self.waiting = false;
                self.release = false;
                out.push(7);
            }
        }
        fn run(&mut self, packets: &[RawPacket<'_>], moved: &[(usize, SteerMark)]) -> &mut [PacketResult] {
            self.ran.extend(packets.iter().map(|p| p.data.to_vec()));
            self.marks.extend(moved.iter().map(|m| m.0));
            self.results = packets.iter().map(|_| PacketResult::of(Fate::Forward(0))).collect();
            &mut self.results
        }
        fn last_results(&mut self) -> &mut [PacketResult] {
            &mut self.results
        }
    }

    /// Held packets are neither run nor delivered; once released they run
    /// first in the next batch, in the order they came, ahead of newer
    /// packets of their flow. Marks of the packets that run keep pointing
    /// at them; packets over the I/O's room are dropped.
    #[test]
    fn held_packets_wait_then_run_first_and_in_order() {
        // On a tenant's lane, and in the one-lane case.
        for one in [false, true] {
            held_packets_wait_then_run_first_and_in_order_on(one);
        }
    }

    fn held_packets_wait_then_run_first_and_in_order_on(one: bool) {
        let mark = SteerMark { previous: 9, table_version: 2 };
        let c = Classifier::new([(0, "port=0,vlan=100".parse().unwrap())]);
        let f = |flow: u8, n: u8| {
            let mut p = tagged(100);
            p.extend_from_slice(&[n, flow]);
            p
        };
        let mut io = HoldIo {
            batches: [
                (vec![f(1, 1), f(2, 1), f(1, 2), f(2, 2), f(1, 3), f(1, 4), f(1, 5)], vec![(0, mark), (3, mark)]),
                (vec![f(1, 6), f(2, 3)], vec![(1, mark)]),
            ]
            .into(),
            frames: Vec::new(),
            marks: Vec::new(),
            held: Vec::new(),
            holding: Vec::new(),
            released: Vec::new(),
            delivered: Vec::new(),
        };
        let mut d = Dispatch::new(vec![0], Unmatched::Drop);
        let mut lanes =
            vec![WaitingLane { waiting: true, release: false, ran: vec![], marks: vec![], results: vec![] }];
        let step = |d: &mut Dispatch, io: &mut HoldIo, lanes: &mut Vec<WaitingLane>| {
            if one { d.step_one(io, 32, &mut lanes[0]) } else { d.step(io, 32, &c, lanes) }
        };
        assert_eq!(step(&mut d, &mut io, &mut lanes), Receive::Packets(7));
        // The held first packet's mark went with it; f(2, 2)'s follows it.
        assert_eq!(lanes[0].marks, vec![1]);
        // Four held (the I/O's room), the fifth dropped; flow 2 ran.
        assert_eq!(io.held.len(), 4);
        assert_eq!(lanes[0].ran, vec![f(2, 1), f(2, 2)]);
        assert_eq!(io.delivered.iter().filter(|(_, fate)| *fate == Fate::Refused).count(), 1);
        lanes[0].release = true;
        assert_eq!(step(&mut d, &mut io, &mut lanes), Receive::Packets(6));
        assert_eq!(lanes[0].ran[2..], [f(1, 1), f(1, 2), f(1, 3), f(1, 4), f(1, 6), f(2, 3)]);
        // The mark of f(2, 3), after the four released packets and f(1, 6).
        assert_eq!(lanes[0].marks, vec![1, 5]);
        assert!(io.held.is_empty());
        assert_eq!(io.delivered.iter().filter(|(_, fate)| *fate == Fate::Forward(0)).count(), 8);
    }

    /// A lane whose chain sends every packet out of one verdict port.
    struct PortLane {
        port: u16,
        owner: u64,
        results: Vec<PacketResult>,
    }

    /// A lane that holds no flow, or every flow.
    struct FlowLane {
        holds: bool,
        results: Vec<PacketResult>,
    }

    impl Lane for FlowLane {
        fn worker(&mut self) -> &mut Worker {
            unreachable!("run is its own")
        }
        fn may_send(&self, _: u16) -> bool {
            true
        }
        fn holds_flow(&mut self, _: &sluice_wire::FlowKey) -> bool {
            self.holds
        }
        fn run(&mut self, packets: &[RawPacket<'_>], _: &[(usize, SteerMark)]) -> &mut [PacketResult] {
            self.results = packets.iter().map(|_| PacketResult::of(Fate::Forward(0))).collect();
            &mut self.results
        }
        fn last_results(&mut self) -> &mut [PacketResult] {
            &mut self.results
        }
    }

    /// An I/O of a worker among `circle`: its frames, which came passed
    /// how often, and what it was told to pass on.
    struct CircleIo {
        frames: Vec<Vec<u8>>,
        hops: Vec<(usize, usize)>,
        taken: bool,
        passed: Vec<usize>,
    }

    impl PacketIo for CircleIo {
        fn receive(&mut self, _max: usize) -> Receive {
            if std::mem::replace(&mut self.taken, true) { Receive::Done } else { Receive::Packets(self.frames.len()) }
        }
        fn packets<'a>(&'a mut self, out: &mut Vec<RawPacket<'a>>, _moved: &mut Vec<(usize, SteerMark)>) {
            out.extend(self.frames.iter().map(|f| RawPacket {
                data: f,
                wire_len: f.len() as u32,
                timestamp_ns: 0,
                ingress_port: 0,
            }));
        }
        fn deliver(&mut self, _results: Results<'_>) {}
        fn circle(&self) -> Option<usize> {
            Some(2)
        }
        fn passed_in(&self, out: &mut Vec<(usize, usize)>) {
            out.extend_from_slice(&self.hops);
        }
        fn pass(&mut self, index: usize) {
            self.passed.push(index);
        }
    }

    #[test]
    fn a_worker_passes_each_owners_fragments_within_its_budget() {
        let mut p = Passed::default();
        let passed = (0..PASS_BURST + 10).filter(|_| p.take(7, 1)).count() as u64;
        assert_eq!(passed, PASS_BURST);
        // Another owner has its own.
        assert!(p.take(9, 1));
        // A millisecond earns a hundred more.
        let more = (0..1000).filter(|_| p.take(7, 1_000_001)).count() as u64;
        assert_eq!(more, PASS_RATE / 1000);
    }

    /// A datagram's fragments that came to a worker whose chain does not
    /// hold their flow are passed on: the first, and the later ones after
    /// it; whole packets stay, and so does all of it once passed all the
    /// way round, or where the chain holds the flow.
    #[test]
    fn fragments_of_a_flow_the_lane_does_not_hold_are_passed_round_the_workers() {
        let mut spec = sluice_wire::build::FrameSpec::udp4([10, 0, 0, 5], 4000, [198, 51, 100, 7], 53);
        spec.payload = vec![7; 3000];
        let mut datagram = spec.build();
        datagram[20] &= !0x40; // may be fragmented
        let pieces = sluice_wire::fragment::split_ipv4(&datagram, 1500).unwrap();
        assert_eq!(pieces.len(), 3);
        let whole = sluice_wire::build::FrameSpec::udp4([10, 0, 0, 5], 4001, [198, 51, 100, 7], 53).build();
        let frames: Vec<Vec<u8>> = pieces.iter().cloned().chain([whole]).collect();
        let io = |hops: Vec<(usize, usize)>| CircleIo { frames: frames.clone(), hops, taken: false, passed: vec![] };
        let step = |holds: bool, io: &mut CircleIo| {
            let mut d = Dispatch::new(vec![0], Unmatched::Drop);
            let mut lane = FlowLane { holds, results: vec![] };
            assert_eq!(d.step_one(io, 32, &mut lane), Receive::Packets(4));
            lane.results.len()
        };
        let mut first = io(vec![]);
        assert_eq!(step(false, &mut first), 1, "only the whole packet ran");
        assert_eq!(first.passed, vec![0, 1, 2]);
        let mut round = io(vec![(0, 2), (1, 2), (2, 2)]);
        assert_eq!(step(false, &mut round), 4);
        assert!(round.passed.is_empty());
        let mut home = io(vec![]);
        assert_eq!(step(true, &mut home), 4);
        assert!(home.passed.is_empty());
        // A later fragment alone, whose first this worker did not pass.
        let mut later = CircleIo { frames: vec![pieces[1].clone()], hops: vec![], taken: false, passed: vec![] };
        let mut d = Dispatch::new(vec![0], Unmatched::Drop);
        let mut lane = FlowLane { holds: false, results: vec![] };
        assert_eq!(d.step_one(&mut later, 32, &mut lane), Receive::Packets(1));
        assert!(later.passed.is_empty());
    }

    impl Lane for PortLane {
        fn worker(&mut self) -> &mut Worker {
            unreachable!("run is its own")
        }
        fn may_send(&self, _: u16) -> bool {
            false
        }
        fn owner(&self) -> u64 {
            self.owner
        }
        fn run(&mut self, packets: &[RawPacket<'_>], _: &[(usize, SteerMark)]) -> &mut [PacketResult] {
            self.results = packets.iter().map(|_| PacketResult::of(Fate::Forward(self.port))).collect();
            &mut self.results
        }
        fn last_results(&mut self) -> &mut [PacketResult] {
            &mut self.results
        }
    }

    /// A worker alone on its I/O owns every port: its verdicts leave as
    /// its chain gave them; the same lane attached as a tenant may not
    /// name a port its attachments do not.
    #[test]
    fn the_one_lane_case_checks_no_port_and_a_tenant_s_lane_does() {
        let io = || ListIo {
            frames: vec![(tagged(100), 0), (tagged(7), 1)],
            taken: false,
            delivered: vec![],
            owners: vec![],
        };
        let mut lane = PortLane { port: 2, owner: 0, results: vec![] };
        let mut d = Dispatch::new(Vec::new(), Unmatched::Drop);
        let mut alone = io();
        assert_eq!(d.step_one(&mut alone, 32, &mut lane), Receive::Packets(2));
        assert_eq!(alone.delivered, vec![Fate::Forward(2), Fate::Forward(2)]);
        assert_eq!(d.step_one(&mut alone, 32, &mut lane), Receive::Done);
        assert_eq!(d.counters(), DispatchCounters::default());
        let c = Classifier::new([(0, "port=0".parse().unwrap()), (0, "port=1".parse().unwrap())]);
        let mut d = Dispatch::new(vec![0, 1], Unmatched::Drop);
        let mut shared = io();
        assert_eq!(d.step(&mut shared, 32, &c, std::slice::from_mut(&mut lane)), Receive::Packets(2));
        assert_eq!(shared.delivered, vec![Fate::Refused, Fate::Refused]);
        assert_eq!(d.counters().refused_egress, 2);
    }

    /// Each delivered result names the owner of the lane that ran it
    /// (the tenant whose translations the I/O keeps for it), whether the
    /// batch's results are gathered from several lanes or are one lane's;
    /// a packet no lane claims names none.
    #[test]
    fn delivered_results_name_the_owner_of_the_lane_that_ran_them() {
        let c = Classifier::new([(0, "port=0".parse().unwrap()), (1, "port=1".parse().unwrap())]);
        let mut lanes =
            vec![PortLane { port: 0, owner: 7, results: vec![] }, PortLane { port: 0, owner: 9, results: vec![] }];
        let mut d = Dispatch::new(vec![0, 1, 2], Unmatched::Drop);
        let frames = vec![(tagged(1), 0), (tagged(1), 1), (tagged(1), 2), (tagged(1), 0)];
        let mut io = ListIo { frames, taken: false, delivered: vec![], owners: vec![] };
        assert_eq!(d.step(&mut io, 32, &c, &mut lanes), Receive::Packets(4));
        assert_eq!(io.owners, vec![7, 9, 0, 7]);
        let mut io = ListIo { frames: vec![(tagged(1), 1); 2], taken: false, delivered: vec![], owners: vec![] };
        assert_eq!(d.step(&mut io, 32, &c, &mut lanes), Receive::Packets(2));
        assert_eq!(io.owners, vec![9, 9]);
    }

    /// An I/O for output commit: what it sent, in order, and the outputs
    /// it keeps by ticket.
    struct CommitIo {
        batches: std::collections::VecDeque<Vec<Vec<u8>>>,
        frames: Vec<Vec<u8>>,
        deferring: Vec<(usize, u64)>,
        kept: Vec<(u64, Vec<u8>)>,
        sent: Vec<Vec<u8>>,
        dropped: usize,
    }

    impl PacketIo for CommitIo {
        fn receive(&mut self, _max: usize) -> Receive {
            match self.batches.pop_front() {
                Some(b) => {
                    self.frames = b;
                    Receive::Packets(self.frames.len())
                }
                None => Receive::Idle,
            }
        }
        fn packets<'a>(&'a mut self, out: &mut Vec<RawPacket<'a>>, _moved: &mut Vec<(usize, SteerMark)>) {
            out.extend(self.frames.iter().map(|f| RawPacket {
                data: f,
                wire_len: f.len() as u32,
                timestamp_ns: 0,
                ingress_port: 0,
            }));
        }
        fn deliver(&mut self, results: Results<'_>) {
            for (i, (f, r)) in self.frames.iter().zip(results.iter()).enumerate() {
                if !matches!(r.fate, Fate::Forward(_)) {
                    self.dropped += 1;
                } else if let Some(&(_, t)) = self.deferring.iter().find(|(at, _)| *at == i) {
                    self.kept.push((t, f.clone()));
                } else {
                    self.sent.push(f.clone());
                }
            }
            self.deferring.clear();
        }
        fn defer_room(&self) -> usize {
            8 - self.kept.len() - self.deferring.len()
        }
        fn defer(&mut self, index: usize, ticket: u64) {
            self.deferring.push((index, ticket));
        }
        fn settle(&mut self, send: &[u64], drop: &[u64]) {
            let (go, stay): (Vec<_>, Vec<_>) = self.kept.drain(..).partition(|(t, _)| send.contains(t));
            self.dropped += stay.iter().filter(|(t, _)| drop.contains(t)).count();
            self.kept = stay.into_iter().filter(|(t, _)| !drop.contains(t)).collect();
            self.sent.extend(go.into_iter().map(|(_, f)| f));
        }
    }

    /// A lane that forwards everything and, while `waiting`, keeps the
    /// output of packets whose last byte is 1 under ticket 5 and drops
    /// those whose last byte is 2 (their change could not be sent); lets
    /// ticket 5 go when told to.
    struct CommitLane {
        waiting: bool,
        held: bool,
        results: Vec<PacketResult>,
    }

    impl Lane for CommitLane {
        fn worker(&mut self) -> &mut Worker {
            unreachable!("run is its own")
        }
        fn may_send(&self, _: u16) -> bool {
            true
        }
        fn run(&mut self, packets: &[RawPacket<'_>], _: &[(usize, SteerMark)]) -> &mut [PacketResult] {
            self.results = packets.iter().map(|_| PacketResult::of(Fate::Forward(0))).collect();
            &mut self.results
        }
        fn last_results(&mut self) -> &mut [PacketResult] {
            &mut self.results
        }
        fn commits(&self) -> bool {
            true
        }
        fn defer(
            &mut self,
            packets: &[RawPacket<'_>],
            leaves: &[bool],
            mut room: usize,
            out: &mut Vec<(usize, Defer)>,
        ) {
            for (i, (p, &leaves)) in packets.iter().zip(leaves).enumerate() {
                match p.data.last() {
                    Some(1) if self.waiting && leaves && room > 0 => {
                        room -= 1;
                        out.push((i, Defer::Keep(5)));
                    }
                    Some(1) if self.waiting && leaves => out.push((i, Defer::Drop)),
                    Some(2) if self.waiting => out.push((i, Defer::Drop)),
                    _ => {}
                }
            }
        }
        fn settle(&mut self, send: &mut Vec<u64>, _drop: &mut Vec<u64>) {
            if self.held {
                self.held = false;
                self.waiting = false;
                send.push(5);
            }
        }
    }

    /// Kept outputs leave only when their ticket is let go, ahead of the
    /// next batch and in the order they were kept; a packet whose change
    /// could not be sent never leaves; the others leave at once. Both the
    /// path of a batch with one lane and that of a batch shared by lanes.
    #[test]
    fn outputs_kept_for_their_flows_changes_leave_once_held_and_in_order() {
        let f = |vlan: u16, n: u8, last: u8| {
            let mut p = tagged(vlan);
            p.extend_from_slice(&[n, last]);
            p
        };
        for shared in [false, true] {
            let c = Classifier::new([(0, "port=0,vlan=100".parse().unwrap()), (1, "port=0,vlan=200".parse().unwrap())]);
            let other = if shared { 200 } else { 100 };
            let mut io = CommitIo {
                batches: [vec![f(100, 1, 1), f(other, 2, 0), f(100, 3, 1), f(100, 4, 2)], vec![f(100, 5, 0)]].into(),
                frames: Vec::new(),
                deferring: Vec::new(),
                kept: Vec::new(),
                sent: Vec::new(),
                dropped: 0,
            };
            let mut d = Dispatch::new(vec![0], Unmatched::Drop);
            let lane = |waiting| CommitLane { waiting, held: false, results: Vec::new() };
            let mut lanes = vec![lane(true), lane(false)];
            assert_eq!(d.step(&mut io, 32, &c, &mut lanes), Receive::Packets(4));
            assert_eq!(io.sent, vec![f(other, 2, 0)], "shared: {shared}");
            assert_eq!(
                io.kept.iter().map(|(t, f)| (*t, f.clone())).collect::<Vec<_>>(),
                [(5, f(100, 1, 1)), (5, f(100, 3, 1))]
            );
            assert_eq!((io.dropped, d.counters().uncommitted), (1, 1));
            lanes[0].held = true;
            assert_eq!(d.step(&mut io, 32, &c, &mut lanes), Receive::Packets(1));
            assert_eq!(io.sent, vec![f(other, 2, 0), f(100, 1, 1), f(100, 3, 1), f(100, 5, 0)], "shared: {shared}");
            assert!(io.kept.is_empty());
        }
    }

    /// A lane that never exists (lanes with chains are tested with real
    /// components in the integration tests).
    struct NoLane;
    impl Lane for NoLane {
        fn worker(&mut self) -> &mut Worker {
            unreachable!("no packet is classified to a lane that is not there")
        }
        fn may_send(&self, _: u16) -> bool {
            false
        }
    }
}
