//! Back-off for deployments whose start failed on this host.
//!
//! A start can fail for reasons that pass (a loaded core made `init` miss
//! its start deadline, the instance pool was full) or that do not (a
//! config the NF rejects). Either way the host tries again, waiting twice
//! as long after each failure (1 s up to a minute), until the deployment
//! runs or is removed; the status says which attempt failed and when the
//! next one is.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Wait after the first failure.
pub const FIRST_WAIT: Duration = Duration::from_secs(1);
/// Longest wait between attempts.
pub const MAX_WAIT: Duration = Duration::from_secs(60);

#[derive(Debug)]
struct Backoff {
    attempts: u32,
    next: Instant,
    /// A retry was handed out and its outcome is not known yet.
    trying: bool,
}

/// Failed starts per deployment, shared by the agent and its workers.
#[derive(Debug, Clone, Default)]
pub struct Retries(Arc<Mutex<HashMap<String, Backoff>>>);

/// The wait after `attempts` failures.
pub fn wait_after(attempts: u32) -> Duration {
    FIRST_WAIT.saturating_mul(1u32 << attempts.saturating_sub(1).min(16)).min(MAX_WAIT)
}

impl Retries {
    /// Records that deployment `id` failed to start; returns the attempt
    /// that failed and the wait before the next. The workers of a live
    /// host that fail the same attempt count once.
    pub fn failed(&self, id: &str) -> (u32, Duration) {
        self.failed_at(id, Instant::now())
    }

    /// [`failed`](Self::failed), at `now`.
    pub fn failed_at(&self, id: &str, now: Instant) -> (u32, Duration) {
        let mut m = self.0.lock();
        let b = m.entry(id.to_string()).or_insert(Backoff { attempts: 0, next: now, trying: true });
        if b.trying {
            b.attempts = b.attempts.saturating_add(1);
            b.trying = false;
            b.next = now + wait_after(b.attempts);
        }
        (b.attempts, wait_after(b.attempts))
    }

    /// Deployment `id` started: no more retries.
    pub fn started(&self, id: &str) {
        self.forget(id);
    }

    /// Deployment `id` is gone.
    pub fn forget(&self, id: &str) {
        self.0.lock().remove(id);
    }

    /// Deployments whose next attempt is due; each is handed out once per
    /// attempt.
    pub fn due(&self) -> Vec<String> {
        self.due_at(Instant::now())
    }

    /// [`due`](Self::due), at `now`.
    pub fn due_at(&self, now: Instant) -> Vec<String> {
        let mut m = self.0.lock();
        m.iter_mut()
            .filter(|(_, b)| !b.trying && b.next <= now)
            .map(|(id, b)| {
                b.trying = true;
                id.clone()
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn waits_double_up_to_a_minute() {
        let w: Vec<u64> = (1..=9).map(|a| wait_after(a).as_secs()).collect();
        assert_eq!(w, vec![1, 2, 4, 8, 16, 32, 60, 60, 60]);
    }

    #[test]
    fn one_attempt_counts_once_and_is_handed_out_once() {
        let r = Retries::default();
        assert_eq!(r.failed("d").0, 1);
        // A second worker failing the same attempt.
        assert_eq!(r.failed("d").0, 1);
        assert!(r.due().is_empty(), "not due before its wait");
        std::thread::sleep(FIRST_WAIT);
        assert_eq!(r.due(), vec!["d".to_string()]);
        assert!(r.due().is_empty(), "handed out once");
        assert_eq!(r.failed("d"), (2, Duration::from_secs(2)));
        r.started("d");
        assert!(r.due().is_empty());
    }

    #[test]
    fn each_failure_waits_twice_as_long_up_to_the_bound() {
        let r = Retries::default();
        let mut now = Instant::now();
        let mut waits = Vec::new();
        for attempt in 1..=9 {
            let (failed, wait) = r.failed_at("d", now);
            assert_eq!(failed, attempt);
            waits.push(wait.as_secs());
            assert!(r.due_at(now + wait - Duration::from_millis(1)).is_empty(), "attempt {attempt}: due early");
            now += wait;
            assert_eq!(r.due_at(now), vec!["d".to_string()], "attempt {attempt}: not due after its wait");
            assert!(r.due_at(now + MAX_WAIT).is_empty(), "handed out once per attempt");
        }
        assert_eq!(waits, vec![1, 2, 4, 8, 16, 32, 60, 60, 60]);
        r.started("d");
        assert!(r.due_at(now + MAX_WAIT).is_empty(), "a deployment that started is not retried");
    }
}
