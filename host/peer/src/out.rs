//! How a host's peer messages leave it ([`PeerOut`]): handed straight to
//! the bus by the thread that makes them (a live worker answering a pull)
//! when the bus takes them without waiting, else queued for a sender
//! thread. A request or an answer then costs no thread handoff on either
//! host, and a worker never waits for the bus.
//!
//! Order holds: while any message waits in the queue (or is being sent
//! from it), later ones join the queue behind it.

use std::sync::atomic::{AtomicUsize, Ordering};

/// A message for another host of the group.
#[derive(Debug)]
pub struct Outgoing {
    /// The receiving host.
    pub to: String,
    /// The encoded [`PeerMessage`](crate::PeerMessage).
    pub body: Vec<u8>,
    /// Flows in it.
    pub flows: usize,
}

/// Hands a message to the bus without waiting: `None` when it was taken,
/// `Some(body)` given back when the bus could not take it at once.
pub type Direct = Box<dyn Fn(&str, Vec<u8>) -> Option<Vec<u8>> + Send + Sync>;

/// The way out of a host's peer messages.
pub struct PeerOut {
    direct: Option<Direct>,
    queue: crossbeam_channel::Sender<Outgoing>,
    /// Messages queued and not yet sent by the sender thread.
    queued: AtomicUsize,
}

impl std::fmt::Debug for PeerOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerOut")
            .field("direct", &self.direct.is_some())
            .field("queued", &self.queued.load(Ordering::Relaxed))
            .finish()
    }
}

impl PeerOut {
    /// Messages go to `queue` (its receiver calls [`PeerOut::sent`] after
    /// each), or first through `direct` where given.
    pub fn new(queue: crossbeam_channel::Sender<Outgoing>, direct: Option<Direct>) -> PeerOut {
        PeerOut { direct, queue, queued: AtomicUsize::new(0) }
    }

    /// Sends `o` without waiting; false when it was dropped (the queue is
    /// full: the bus is far behind).
    pub fn send(&self, o: Outgoing) -> bool {
        let o = match &self.direct {
            Some(direct) if self.queued.load(Ordering::Acquire) == 0 => match direct(&o.to, o.body) {
                None => return true,
                Some(body) => Outgoing { body, ..o },
            },
            _ => o,
        };
        self.queued.fetch_add(1, Ordering::AcqRel);
        if self.queue.try_send(o).is_err() {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            return false;
        }
        true
    }

    /// The sender thread sent (or gave up on) one queued message.
    pub fn sent(&self) {
        let _ = self.queued.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use parking_lot::Mutex;
    use std::sync::Arc;

    fn msg(n: u8) -> Outgoing {
        Outgoing { to: "h2".into(), body: vec![n], flows: 0 }
    }

    #[test]
    fn messages_go_straight_out_unless_some_wait_in_the_queue() {
        let (tx, rx) = crossbeam_channel::bounded(2);
        let taken = Arc::new(Mutex::new(Vec::new()));
        let open = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let (t, o) = (taken.clone(), open.clone());
        let out = PeerOut::new(
            tx,
            Some(Box::new(move |_to: &str, body: Vec<u8>| {
                if o.load(Ordering::Relaxed) {
                    t.lock().push(body);
                    None
                } else {
                    Some(body)
                }
            })),
        );
        assert!(out.send(msg(1)));
        assert_eq!(*taken.lock(), vec![vec![1]]);
        // The bus cannot take one: it waits in the queue, and the next
        // joins it there although the bus could take it.
        open.store(false, Ordering::Relaxed);
        assert!(out.send(msg(2)));
        open.store(true, Ordering::Relaxed);
        assert!(out.send(msg(3)));
        assert_eq!(taken.lock().len(), 1);
        // The queue holds two: the next is dropped, counted by the caller.
        assert!(!out.send(msg(4)));
        assert_eq!(rx.try_recv().unwrap().body, vec![2]);
        out.sent();
        assert_eq!(rx.try_recv().unwrap().body, vec![3]);
        out.sent();
        // Drained: straight out again.
        assert!(out.send(msg(5)));
        assert_eq!(*taken.lock(), vec![vec![1], vec![5]]);
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn without_a_direct_way_every_message_is_queued() {
        let (tx, rx) = crossbeam_channel::bounded(4);
        let out = PeerOut::new(tx, None);
        assert!(out.send(msg(1)));
        assert_eq!(rx.try_recv().unwrap().body, vec![1]);
        out.sent();
        out.sent();
        assert!(out.send(msg(2)));
        assert_eq!(rx.try_recv().unwrap().body, vec![2]);
    }
}
