//! What a polling thread (a live worker, a dispatcher's worker) does when
//! a poll finds nothing ([`Backoff`]).
//!
//! It gives its core to any other thread that is ready to run
//! (`sched_yield`, which returns at once when none is): on a machine where
//! the poller shares a core, a woken thread (the bus client, a peer's
//! request, the journal writer) runs within a poll instead of after the
//! poller's time slice, and on a core of its own the poller loses only the
//! call. After a run of empty polls it may sleep, woken early by
//! [`std::thread::Thread::unpark`].

use std::time::Duration;

/// Empty polls before a sleeping [`Backoff`] starts to sleep.
pub const SPINS: u32 = 1024;

/// A poller's state between polls.
#[derive(Debug, Clone)]
pub struct Backoff {
    empty: u32,
    sleep: Option<Duration>,
}

impl Backoff {
    /// A poller that never sleeps (its packets' latency is never more than
    /// a poll).
    pub const fn polling() -> Backoff {
        Backoff { empty: 0, sleep: None }
    }

    /// A poller that sleeps up to `sleep` between polls once [`SPINS`]
    /// polls running found nothing (a shared machine gets the core back;
    /// a packet's latency rises by at most `sleep`).
    pub const fn sleeping(sleep: Duration) -> Backoff {
        Backoff { empty: 0, sleep: Some(sleep) }
    }

    /// A poll found work.
    pub fn busy(&mut self) {
        self.empty = 0;
    }

    /// A poll found nothing: yields the core, or sleeps (see [`Backoff`]).
    pub fn idle(&mut self) {
        self.empty = self.empty.saturating_add(1);
        match self.sleep {
            Some(d) if self.empty > SPINS => std::thread::park_timeout(d),
            _ => std::thread::yield_now(),
        }
    }

    /// Whether it has started to sleep between polls.
    pub fn sleeps(&self) -> bool {
        self.sleep.is_some() && self.empty > SPINS
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn a_sleeping_poller_sleeps_only_after_a_run_of_empty_polls_and_an_unpark_wakes_it() {
        let mut b = Backoff::sleeping(Duration::from_secs(5));
        for _ in 0..SPINS {
            b.idle();
        }
        assert!(!b.sleeps());
        b.busy();
        for _ in 0..SPINS {
            b.idle();
        }
        assert!(!b.sleeps());
        // The next empty poll sleeps: an unpark from another thread ends
        // it long before its 5 s.
        let me = std::thread::current();
        let waker = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            me.unpark();
        });
        let t = Instant::now();
        b.idle();
        assert!(b.sleeps());
        assert!(t.elapsed() < Duration::from_secs(4));
        waker.join().ok();
    }

    #[test]
    fn a_polling_poller_never_sleeps() {
        let mut b = Backoff::polling();
        let t = Instant::now();
        for _ in 0..(SPINS * 4) {
            b.idle();
        }
        assert!(!b.sleeps());
        assert!(t.elapsed() < Duration::from_secs(4));
    }
}
