//! The hosts' liveness beacons ([`sluice_wire::beacon`]) as the dispatcher
//! hears them (`--liveness-ms`): a host whose last beacon is older than
//! the bound is treated as gone, as if its link had gone down, and its
//! flows go to their next owners at their next packet; its next beacon
//! brings it back.
//!
//! Beacons are read from the receive queues of the ports towards the
//! hosts, which nothing else reads (the workers only send on them; RX and
//! TX queues of a DPDK port are independent). A beacon counts only on the
//! port its host is reached by (`--to <host>=<port>`); anything else a
//! host sends there is freed and counted. Beacons are not authenticated:
//! a forged one can only keep a dead host's flows waiting for the
//! controller's silence bound, as without beacons; the links to the hosts
//! are the group's own (memif, a point-to-point cable, a switch port of
//! the group's network).

use super::{RouteFeed, Target};
use sluice_dpdk::{Mbuf, Port, Queue};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Frames read from one queue at a time.
const BURST: u16 = 32;

/// What the dispatcher has heard from its hosts.
pub(super) struct Liveness {
    bound: Duration,
    /// Host ports' receive queues, with their port id.
    queues: Vec<Queue>,
    /// Host id → index in `--to` order, and its port.
    index: HashMap<String, (usize, u16)>,
    /// Per host: when its last beacon came.
    last: Vec<Option<Instant>>,
    buf: Vec<Mbuf>,
}

impl Liveness {
    /// Hears the beacons of `to`'s hosts on their ports, among `ports`.
    pub(super) fn new(bound: Duration, to: &[Target], ports: &[Port]) -> Self {
        let mut queues = Vec::new();
        for p in ports.iter().filter(|p| to.iter().any(|t| t.port == p.id())) {
            queues.extend((0..p.queues()).filter_map(|q| p.queue(q)));
        }
        Liveness {
            bound,
            queues,
            index: to.iter().enumerate().map(|(i, t)| (t.host.clone(), (i, t.port))).collect(),
            last: vec![None; to.len()],
            buf: Vec::with_capacity(usize::from(BURST)),
        }
    }

    /// Reads what the hosts sent since the last call.
    pub(super) fn poll(&mut self, feed: &RouteFeed, now: Instant) {
        for q in &mut self.queues {
            loop {
                let n = q.rx_burst(&mut self.buf, BURST);
                for m in self.buf.drain(..) {
                    let beacon = m.data().and_then(|d| sluice_wire::beacon::Beacon::new_checked(d).ok());
                    match beacon.and_then(|b| self.index.get(b.host())).filter(|(_, port)| *port == q.port()) {
                        Some(&(i, _)) => {
                            if let Some(l) = self.last.get_mut(i) {
                                *l = Some(now);
                            }
                            feed.heard(i);
                        }
                        None => feed.stray_frame(),
                    }
                }
                if n < usize::from(BURST) {
                    break;
                }
            }
        }
    }

    /// Whether every host has been heard from.
    pub(super) fn heard_all(&self) -> bool {
        self.last.iter().all(Option::is_some)
    }

    /// Whether host `i`'s last beacon is within the bound.
    pub(super) fn alive(&self, i: usize, now: Instant) -> bool {
        self.last.get(i).copied().flatten().is_some_and(|t| now.saturating_duration_since(t) <= self.bound)
    }

    /// The bound, for messages.
    pub(super) fn bound(&self) -> Duration {
        self.bound
    }
}
