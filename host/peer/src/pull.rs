//! Reactive pull (SNF §5): the state of a flowlet the dispatcher moved
//! here without it.
//!
//! The first packet of a moved flowlet carries the previous host (its
//! mark). When none of the lane's NFs holds state for the flow and no
//! replica of it arrived, the lane asks that host for it
//! ([`crate::PeerMessage::Pull`]) and the flow's packets wait, held by the
//! worker's packet I/O (never copied, and the worker never blocks): at
//! most [`PER_FLOW`] packets a flow (later ones are dropped, counted: they
//! may not overtake the held ones), at most [`MAX_WAITING`] flows a lane,
//! and what the I/O has room for. The wait ends when the state arrives (a
//! [`crate::PeerMessage::Flows`] answer, or a proactive replica), when the
//! previous host answers that it holds none
//! ([`crate::PeerMessage::NotHeld`]), or after the host's pull wait (a
//! state miss). The held packets then run first, in order, before any
//! later packet of their flow.
//!
//! On the previous host every worker's lane of the deployment looks at
//! the request once: each sends the flows it holds; the last one to look
//! answers for the flows none of them held.

use crate::{HashMap, HashSet};
use parking_lot::Mutex;
use sluice_wire::FlowKey;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The longest pull wait a host may set (its packet I/O gives held
/// packets back after 100 ms whatever happens).
pub const MAX_WAIT: Duration = Duration::from_millis(50);
/// Packets one waiting flow may hold.
pub const PER_FLOW: usize = 64;
/// Flows one lane waits for at once.
pub const MAX_WAITING: usize = 256;
/// Requests a lane looks at in one call, at most.
pub const SERVE_AT_ONCE: usize = 4;
/// Requests from other hosts waiting for this host's lanes, at most.
pub const MAX_ASKED: usize = 1024;
/// A request no lane finished looking at within this long is dropped
/// (the asking host has stopped waiting long before).
pub const ASKED_LIFETIME: Duration = Duration::from_secs(1);
/// "Not held" answers kept for the lanes waiting for them, at most.
pub const MAX_ANSWERS: usize = 65_536;

/// How a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The flow's state arrived.
    State,
    /// The previous host holds none.
    NotHeld,
    /// Neither within the pull wait.
    TimedOut,
}

/// One flow a lane waits for.
#[derive(Debug)]
pub(crate) struct Wait {
    pub ticket: u64,
    pub since: Instant,
    pub packets: usize,
    /// The hash of the host the flow came from.
    pub previous: u32,
}

/// A request from another host, waiting for this host's lanes.
#[derive(Debug)]
pub(crate) struct Asked {
    pub seq: u64,
    pub from: String,
    pub deployment: String,
    pub keys: Vec<FlowKey>,
    /// Lanes of the deployment that have not looked at it yet.
    pub remaining: usize,
    pub found: HashSet<FlowKey>,
    pub at: Instant,
}

/// The requests of other hosts and the lanes that answer them.
#[derive(Debug, Default)]
pub(crate) struct Asks {
    /// Pending requests, oldest first; `seq` counts them, under the lock.
    pub list: Mutex<(VecDeque<Asked>, u64)>,
    /// The newest request's `seq`, read without the lock.
    pub newest: AtomicU64,
    /// Lanes per deployment on this host.
    pub lanes: Mutex<HashMap<String, usize>>,
}

impl Asks {
    pub fn lanes_of(&self, deployment: &str) -> usize {
        self.lanes.lock().get(deployment).copied().unwrap_or(0)
    }

    pub fn lane_started(&self, deployment: &str) {
        *self.lanes.lock().entry(deployment.to_string()).or_default() += 1;
    }

    pub fn lane_stopped(&self, deployment: &str) {
        let mut l = self.lanes.lock();
        if let Some(n) = l.get_mut(deployment) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                l.remove(deployment);
            }
        }
    }

    /// Queues a request for the lanes: false if it was dropped (too many
    /// pending). Drops requests past [`ASKED_LIFETIME`] first.
    pub fn push(&self, from: &str, deployment: &str, keys: Vec<FlowKey>, lanes: usize, now: Instant) -> bool {
        let mut g = self.list.lock();
        let (list, seq) = &mut *g;
        while list.front().is_some_and(|a| now.saturating_duration_since(a.at) >= ASKED_LIFETIME) {
            list.pop_front();
        }
        if list.len() >= MAX_ASKED {
            return false;
        }
        *seq += 1;
        list.push_back(Asked {
            seq: *seq,
            from: from.to_string(),
            deployment: deployment.to_string(),
            keys,
            remaining: lanes,
            found: HashSet::default(),
            at: now,
        });
        self.newest.store(*seq, Ordering::Release);
        true
    }
}

/// The "not held" answers that arrived for this host's waiting lanes.
#[derive(Debug, Default)]
pub(crate) struct Answers {
    map: Mutex<HashMap<(String, FlowKey), Instant>>,
    /// Counts up with every answer taken in.
    pub arrivals: AtomicU64,
}

impl Answers {
    pub fn insert(&self, deployment: &str, keys: impl Iterator<Item = FlowKey>, now: Instant) {
        let mut m = self.map.lock();
        self.arrivals.fetch_add(1, Ordering::Release);
        for k in keys {
            if m.len() >= MAX_ANSWERS {
                m.retain(|_, at| now.saturating_duration_since(*at) < ASKED_LIFETIME);
                if m.len() >= MAX_ANSWERS {
                    return;
                }
            }
            m.insert((deployment.to_string(), k), now);
        }
    }

    /// Takes the answer for a flow, if one came.
    pub fn take(&self, deployment: &str, key: &FlowKey) -> bool {
        let mut m = self.map.lock();
        m.remove(&(deployment.to_string(), *key)).is_some()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;

    #[test]
    fn requests_are_bounded_and_expire() {
        let a = Asks::default();
        let t0 = Instant::now();
        for _ in 0..MAX_ASKED {
            assert!(a.push("h2", "d", vec![FlowKey::default()], 1, t0));
        }
        assert!(!a.push("h2", "d", Vec::new(), 1, t0));
        assert_eq!(a.newest.load(Ordering::Relaxed), MAX_ASKED as u64);
        // Old ones make room.
        assert!(a.push("h2", "d", Vec::new(), 1, t0 + ASKED_LIFETIME));
        assert_eq!(a.list.lock().0.len(), 1);
    }

    #[test]
    fn lanes_are_counted_per_deployment() {
        let a = Asks::default();
        a.lane_started("d");
        a.lane_started("d");
        a.lane_stopped("d");
        assert_eq!(a.lanes_of("d"), 1);
        a.lane_stopped("d");
        a.lane_stopped("d");
        assert_eq!(a.lanes_of("d"), 0);
    }

    #[test]
    fn an_answer_is_taken_once() {
        let a = Answers::default();
        let k = FlowKey { src_port: 9, ..FlowKey::default() };
        a.insert("d", [k].into_iter(), Instant::now());
        assert_eq!(a.arrivals.load(Ordering::Relaxed), 1);
        assert!(!a.take("e", &k));
        assert!(a.take("d", &k));
        assert!(!a.take("d", &k));
    }
}
