//! CPU fairness between tenants whose workers share a core.
//!
//! The OS shares a core fairly between threads, so a tenant with six
//! deployments on a core got six shares to a neighbour's one. Here each
//! tenant active on a core gets an equal share of it instead, whatever its
//! number of threads: every batch is charged the CPU time its thread
//! used, against a token bucket per tenant and core that refills at
//! `1 / active tenants` of real time (up to a small burst). Before each
//! batch, a thread whose tenant is over its share waits until the bucket
//! is back to zero, which leaves the core to the others; alone on a core,
//! a tenant never waits. Fairness holds at batch granularity: a batch in
//! flight is never interrupted (its deadline bounds it).

use foldhash::HashMap;
use parking_lot::Mutex;
use sluice_runtime::cpu_time::thread_cpu_time;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A tenant that charged a batch this recently is active on its core.
const ACTIVE: Duration = Duration::from_millis(200);
/// CPU time a tenant may run ahead of its share.
const BURST: Duration = Duration::from_millis(20);
/// Longest single pause (the thread then checks its control messages).
const MAX_PAUSE: Duration = Duration::from_millis(50);

#[derive(Debug)]
struct Account {
    /// Threads of the tenant on the core.
    members: usize,
    /// CPU time the tenant may still use, ns (negative: over its share).
    tokens: f64,
    refilled: Instant,
    active: Instant,
}

/// The accounts of every tenant on every core.
#[derive(Debug, Clone, Default)]
pub struct FairShare {
    cores: Arc<Mutex<HashMap<usize, HashMap<String, Account>>>>,
}

impl FairShare {
    /// No tenant on any core yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// A thread of `tenant` starts running on `core`; it must charge its
    /// batches to the returned [`Share`] (from that thread).
    pub fn join(&self, core: usize, tenant: &str) -> Share {
        let mut cores = self.cores.lock();
        let now = Instant::now();
        let a = cores.entry(core).or_default().entry(tenant.to_string()).or_insert(Account {
            members: 0,
            tokens: BURST.as_nanos() as f64,
            refilled: now,
            active: now,
        });
        a.members += 1;
        Share {
            fair: self.clone(),
            core,
            tenant: tenant.to_string(),
            cpu: thread_cpu_time(),
            last_cost: Duration::ZERO,
            reserved: Duration::ZERO,
            owed: 0.0,
            unsettled: 0,
        }
    }

    /// Tenants active on `core` now.
    pub fn active_tenants(&self, core: usize) -> usize {
        let cores = self.cores.lock();
        let now = Instant::now();
        cores.get(&core).map_or(0, |m| m.values().filter(|a| now.duration_since(a.active) < ACTIVE).count())
    }
}

/// One thread's membership of its tenant's account on its core.
#[derive(Debug)]
pub struct Share {
    fair: FairShare,
    core: usize,
    tenant: String,
    /// The thread's CPU time at the last charge.
    cpu: Duration,
    /// What the thread's last batch cost, reserved from the bucket when
    /// the next one starts (so a tenant's threads cannot all start
    /// expensive batches at once on a full bucket).
    last_cost: Duration,
    /// What is reserved for the batch in flight.
    reserved: Duration,
    /// Ns charged by [`charge_used`](Self::charge_used) and not settled
    /// with the account yet, and over how many batches.
    owed: f64,
    unsettled: u32,
}

/// [`Share::charge_used`] settles with the account after this many
/// batches, or [`SETTLE_NS`] of charges, or at the next
/// [`pause`](Share::pause), whichever comes first.
const SETTLE_EVERY: u32 = 8;
const SETTLE_NS: f64 = 200_000.0;

impl Share {
    /// Charges the CPU time this thread used since the last charge (or
    /// since it joined) to its tenant: call it after every batch.
    pub fn charge(&mut self) {
        let now_cpu = thread_cpu_time();
        let used = now_cpu.saturating_sub(self.cpu);
        self.cpu = now_cpu;
        self.last_cost = used;
        let reserved = std::mem::take(&mut self.reserved);
        self.settle(used.as_nanos() as f64 - reserved.as_nanos() as f64);
    }

    /// Charges `used` (measured by the caller) to the tenant: for workers
    /// that run several tenants' batches on one thread one after another,
    /// where the thread's CPU clock cannot tell them apart.
    ///
    /// The charges of a few batches settle together (see
    /// [`SETTLE_EVERY`]): a batch alone on its core then costs no visit to
    /// the accounts, and [`pause`](Self::pause), which decides, settles
    /// first.
    pub fn charge_used(&mut self, used: Duration) {
        self.last_cost = used;
        let reserved = std::mem::take(&mut self.reserved);
        self.owed += used.as_nanos() as f64 - reserved.as_nanos() as f64;
        self.unsettled += 1;
        if self.unsettled >= SETTLE_EVERY || self.owed >= SETTLE_NS {
            self.settle_owed();
        }
    }

    /// Settles what [`charge_used`](Self::charge_used) left owed.
    fn settle_owed(&mut self) -> Option<Duration> {
        let owed = std::mem::take(&mut self.owed);
        self.unsettled = 0;
        self.settle(owed)
    }

    /// Whether this thread may start its next batch now: `None` when its
    /// tenant is within its share (or alone on the core), and then what
    /// its last batch cost is reserved from the share until [`charge`]
    /// settles it; otherwise how long to wait first (at most 50 ms at a
    /// time: wait, handle what else the thread must, and ask again).
    ///
    /// [`charge`]: Self::charge
    pub fn pause(&mut self) -> Option<Duration> {
        // What is owed and the reservation in one visit to the accounts
        // (a contended lane asks every batch).
        let owed = std::mem::take(&mut self.owed);
        self.unsettled = 0;
        let wait = self.settle_then(owed, self.last_cost.as_nanos() as f64);
        if wait.is_none() {
            self.reserved = self.last_cost;
        }
        wait
    }

    /// Refills the tenant's bucket, takes `used` ns from it, and says how
    /// long to wait.
    fn settle(&mut self, used: f64) -> Option<Duration> {
        self.settle_then(used, 0.0)
    }

    /// [`settle`](Self::settle), then, when there is no wait, takes
    /// `reserve` ns more.
    fn settle_then(&mut self, used: f64, reserve: f64) -> Option<Duration> {
        let mut cores = self.fair.cores.lock();
        let tenants = cores.get_mut(&self.core)?;
        let now = Instant::now();
        let others =
            tenants.iter().filter(|(t, a)| **t != self.tenant && now.duration_since(a.active) < ACTIVE).count();
        let me = tenants.get_mut(&self.tenant)?;
        me.active = now;
        let rate = 1.0 / (others + 1) as f64;
        let refill = now.duration_since(me.refilled).as_nanos() as f64 * rate;
        me.refilled = now;
        me.tokens = (me.tokens + refill).min(BURST.as_nanos() as f64) - used;
        if others == 0 {
            me.tokens = (me.tokens - reserve).max(0.0);
            return None;
        }
        if me.tokens < 0.0 {
            return Some(Duration::from_nanos((-me.tokens / rate) as u64).min(MAX_PAUSE));
        }
        me.tokens -= reserve;
        None
    }

    /// The core.
    pub fn core(&self) -> usize {
        self.core
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        let mut cores = self.fair.cores.lock();
        if let Some(tenants) = cores.get_mut(&self.core) {
            if let Some(a) = tenants.get_mut(&self.tenant) {
                a.members = a.members.saturating_sub(1);
                if a.members == 0 {
                    tenants.remove(&self.tenant);
                }
            }
            if tenants.is_empty() {
                cores.remove(&self.core);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn burn(d: Duration) {
        let start = thread_cpu_time();
        let mut x = 0u64;
        while thread_cpu_time().saturating_sub(start) < d {
            for i in 0..10_000u64 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
            }
        }
    }

    #[test]
    fn alone_a_tenant_is_never_paused() {
        let fair = FairShare::new();
        let mut s = fair.join(0, "a");
        for _ in 0..5 {
            burn(Duration::from_millis(10));
            s.charge();
            assert_eq!(s.pause(), None);
        }
    }

    #[test]
    fn a_tenant_over_its_share_pauses_and_one_within_does_not() {
        let fair = FairShare::new();
        let mut hog = fair.join(7, "hog");
        // The light tenant's thread uses next to no CPU.
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let (tell, told) = std::sync::mpsc::channel();
        let light_fair = fair.clone();
        let light = std::thread::spawn(move || {
            let mut light = light_fair.join(7, "light");
            light.charge();
            tell.send(light.pause()).unwrap();
            wait.recv().unwrap();
            light.charge();
            tell.send(light.pause()).unwrap();
            wait.recv().unwrap();
        });
        assert_eq!(told.recv().unwrap(), None);
        burn(Duration::from_millis(40));
        hog.charge();
        // 40 ms used against a 20 ms burst at half the core: about 40 ms,
        // waited at most 50 ms at a time.
        let pause = hog.pause().unwrap();
        assert!(pause >= Duration::from_millis(30), "{pause:?}");
        std::thread::sleep(Duration::from_millis(10));
        assert!(hog.pause().unwrap() < pause, "the bucket refills while waiting");
        go.send(()).unwrap();
        assert_eq!(told.recv().unwrap(), None);
        assert_eq!(fair.active_tenants(7), 2);
        go.send(()).unwrap();
        light.join().unwrap();
        // Alone again: no pause.
        burn(Duration::from_millis(30));
        hog.charge();
        assert_eq!(hog.pause(), None);
        drop(hog);
        assert_eq!(fair.active_tenants(7), 0);
    }
}
