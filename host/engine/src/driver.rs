//! The loop every packet thread runs ([`Driver`]): `sluice-host run`'s
//! and `dpdk`'s workers, a `serve` host's capture replays and live
//! workers, and the dispatcher's (`steer`) workers.
//!
//! A thread says what one pass of its loop is (a [`Pass`]: a batch, and
//! whatever else it does each time round) and what it does periodically
//! (its tick: events, meter windows, reports, replication); the driver
//! owns everything else, once: when the loop stops (a stop flag, a
//! shared packet limit, an idle bound, or the pass's own end), what an
//! empty poll does ([`Backoff`]), and when ticks are due — one clock read
//! a pass (none when it has neither ticks nor an idle bound).

use crate::idle::Backoff;
use crate::io::Receive;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// One pass of a packet thread's loop, and its periodic work.
pub trait Pass {
    /// Runs one pass: what [`Receive`] it had. `Done` ends the loop (a
    /// capture's end, or the thread was told to stop).
    fn pass(&mut self) -> Receive;

    /// Periodic work, at most every [`Driver::tick_every`] (busy or
    /// idle); `now` is the clock read after the pass.
    fn tick(&mut self, now: Instant) {
        let _ = now;
    }
}

/// Why a [`Driver`] loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The stop flag was set.
    Stopped,
    /// The pass said so ([`Receive::Done`]).
    Done,
    /// No packet came for the idle bound.
    Idle,
    /// The shared packet count reached its limit.
    Limit,
}

/// A packet thread's loop (see the module's documentation).
#[derive(Debug)]
pub struct Driver<'a> {
    stop: Option<&'a AtomicBool>,
    backoff: Backoff,
    idle_exit: Option<Duration>,
    limit: Option<(&'a AtomicU64, Option<u64>)>,
    tick: Option<Duration>,
}

impl<'a> Driver<'a> {
    /// A loop that runs until its pass is done, doing `backoff` after an
    /// empty poll.
    pub fn new(backoff: Backoff) -> Self {
        Driver { stop: None, backoff, idle_exit: None, limit: None, tick: None }
    }

    /// Also ends when `stop` is set (checked before every pass).
    pub fn stop_on(mut self, stop: &'a AtomicBool) -> Self {
        self.stop = Some(stop);
        self
    }

    /// Also ends after `idle` without a packet, if given.
    pub fn idle_exit(mut self, idle: Option<Duration>) -> Self {
        self.idle_exit = idle;
        self
    }

    /// Adds every pass's packets to `count` (shared by the threads of one
    /// run), and ends once it reaches `max`, if given.
    pub fn count(mut self, count: &'a AtomicU64, max: Option<u64>) -> Self {
        self.limit = Some((count, max));
        self
    }

    /// Calls the pass's [`Pass::tick`] at most this often (never, unless
    /// set).
    pub fn tick_every(mut self, every: Duration) -> Self {
        self.tick = Some(every);
        self
    }

    /// Runs `pass` until the loop ends, and says why.
    pub fn run(mut self, pass: &mut impl Pass) -> End {
        let start = Instant::now();
        let (mut last_rx, mut last_tick) = (start, start);
        // A loop with neither ticks nor an idle bound reads no clock.
        let clocked = self.tick.is_some() || self.idle_exit.is_some();
        loop {
            if self.stop.is_some_and(|s| s.load(Ordering::Relaxed)) {
                return End::Stopped;
            }
            if let Some((count, Some(max))) = self.limit
                && count.load(Ordering::Relaxed) >= max
            {
                return End::Limit;
            }
            let got = pass.pass();
            let now = if clocked { Instant::now() } else { start };
            match got {
                Receive::Packets(n) => {
                    self.backoff.busy();
                    last_rx = now;
                    if let Some((count, _)) = self.limit {
                        count.fetch_add(n as u64, Ordering::Relaxed);
                    }
                }
                Receive::Idle => {
                    if self.idle_exit.is_some_and(|d| now.saturating_duration_since(last_rx) >= d) {
                        return End::Idle;
                    }
                }
                Receive::Done => return End::Done,
            }
            if let Some(every) = self.tick
                && now.saturating_duration_since(last_tick) >= every
            {
                last_tick = now;
                pass.tick(now);
            }
            if got == Receive::Idle {
                self.backoff.idle();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pass over a list of what each poll finds.
    struct Script {
        polls: Vec<Receive>,
        at: usize,
        ticks: u32,
        stop_after: Option<(usize, &'static AtomicBool)>,
    }

    impl Pass for Script {
        fn pass(&mut self) -> Receive {
            if let Some((n, flag)) = self.stop_after
                && self.at == n
            {
                flag.store(true, Ordering::Relaxed);
            }
            let r = self.polls.get(self.at).copied().unwrap_or(Receive::Idle);
            self.at += 1;
            r
        }
        fn tick(&mut self, _: Instant) {
            self.ticks += 1;
        }
    }

    fn script(polls: Vec<Receive>) -> Script {
        Script { polls, at: 0, ticks: 0, stop_after: None }
    }

    #[test]
    fn a_pass_that_is_done_ends_the_loop() {
        let mut s = script(vec![Receive::Packets(3), Receive::Idle, Receive::Done, Receive::Packets(1)]);
        assert_eq!(Driver::new(Backoff::polling()).run(&mut s), End::Done);
        assert_eq!(s.at, 3);
    }

    #[test]
    fn the_shared_count_ends_every_loop_at_its_limit() {
        let count = AtomicU64::new(0);
        let mut s = script(vec![Receive::Packets(4); 10]);
        assert_eq!(Driver::new(Backoff::polling()).count(&count, Some(10)).run(&mut s), End::Limit);
        assert_eq!(count.load(Ordering::Relaxed), 12);
        // Another thread of the same run stops before its first pass.
        let mut other = script(vec![Receive::Packets(4)]);
        assert_eq!(Driver::new(Backoff::polling()).count(&count, Some(10)).run(&mut other), End::Limit);
        assert_eq!(other.at, 0);
    }

    #[test]
    fn the_stop_flag_and_the_idle_bound_end_the_loop() {
        static STOP: AtomicBool = AtomicBool::new(false);
        let mut s = script(vec![Receive::Packets(1); 100]);
        s.stop_after = Some((5, &STOP));
        assert_eq!(Driver::new(Backoff::polling()).stop_on(&STOP).run(&mut s), End::Stopped);
        assert_eq!(s.at, 6);
        // Idle polls end it after the bound, not before a packet came.
        let mut s = script(vec![Receive::Packets(1)]);
        let t = Instant::now();
        let end = Driver::new(Backoff::polling()).idle_exit(Some(Duration::from_millis(20))).run(&mut s);
        assert_eq!(end, End::Idle);
        assert!(t.elapsed() >= Duration::from_millis(20));
    }

    #[test]
    fn ticks_come_at_most_at_their_interval_busy_or_idle() {
        let mut s = script(vec![Receive::Packets(1); 1000]);
        s.polls.push(Receive::Done);
        Driver::new(Backoff::polling()).tick_every(Duration::from_secs(3600)).run(&mut s);
        assert_eq!(s.ticks, 0);
        let mut s = script(vec![Receive::Idle; 50]);
        s.polls.push(Receive::Done);
        Driver::new(Backoff::polling()).tick_every(Duration::ZERO).run(&mut s);
        assert_eq!(s.ticks, 50);
    }
}
