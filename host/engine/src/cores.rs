//! Which CPU cores worker threads run on.
//!
//! Each worker (a `run` or `dpdk` worker, a `serve` deployment) is pinned
//! to one core of a list: the EAL's lcores for `dpdk`, the `cores` setting
//! otherwise (by default every core the process may use). With more
//! workers than cores, workers share cores round-robin; their deadlines
//! count CPU time (see [`sluice_runtime::cpu_time`]), so sharing slows
//! them but never makes a well-behaved NF trap.

use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
use nix::unistd::Pid;
use parking_lot::Mutex;
use std::collections::BTreeSet;
use std::sync::Arc;

/// Errors about core lists and pinning.
#[derive(Debug, thiserror::Error)]
pub enum CoreError {
    /// A core list that does not parse.
    #[error("core list '{list}': {reason}; write cores as in taskset, e.g. \"0-3,6\"")]
    Parse {
        /// The list as given.
        list: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The OS refused.
    #[error("cannot {what}: {source}")]
    Os {
        /// What was tried.
        what: String,
        /// The OS error.
        source: nix::Error,
    },
}

/// A list of CPU cores, in the order workers take them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoreList(Vec<usize>);

impl CoreList {
    /// The cores the calling thread may run on now (before any pinning:
    /// the process's).
    pub fn allowed() -> Result<CoreList, CoreError> {
        let set = sched_getaffinity(Pid::from_raw(0))
            .map_err(|source| CoreError::Os { what: "read the process's CPU affinity".into(), source })?;
        let cores: Vec<usize> = (0..CpuSet::count()).filter(|&c| set.is_set(c).unwrap_or(false)).collect();
        Ok(CoreList(cores))
    }

    /// A list of the given cores (duplicates removed, order kept).
    pub fn new(cores: impl IntoIterator<Item = usize>) -> CoreList {
        let mut seen = BTreeSet::new();
        CoreList(cores.into_iter().filter(|c| seen.insert(*c)).collect())
    }

    /// The cores, in order.
    pub fn cores(&self) -> &[usize] {
        &self.0
    }

    /// Number of cores.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The core of worker `i`: the list round-robin.
    pub fn for_worker(&self, i: usize) -> Option<usize> {
        if self.0.is_empty() { None } else { self.0.get(i % self.0.len()).copied() }
    }
}

impl std::fmt::Display for CoreList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut first = true;
        let mut i = 0;
        while let Some(&start) = self.0.get(i) {
            let mut end = start;
            while self.0.get(i + 1) == Some(&(end + 1)) {
                end += 1;
                i += 1;
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if end == start {
                write!(f, "{start}")?
            } else {
                write!(f, "{start}-{end}")?
            }
            i += 1;
        }
        Ok(())
    }
}

impl std::str::FromStr for CoreList {
    type Err = CoreError;

    /// `"0-3,6,8-9"`.
    fn from_str(list: &str) -> Result<Self, CoreError> {
        let err = |reason: String| CoreError::Parse { list: list.to_string(), reason };
        let max = CpuSet::count();
        let mut cores = Vec::new();
        for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let num = |s: &str| {
                s.trim().parse::<usize>().map_err(|_| err(format!("'{s}' is not a core number"))).and_then(|c| {
                    if c < max { Ok(c) } else { Err(err(format!("core {c} is beyond the largest ({})", max - 1))) }
                })
            };
            match part.split_once('-') {
                Some((a, b)) => {
                    let (a, b) = (num(a)?, num(b)?);
                    if b < a {
                        return Err(err(format!("range '{part}' runs backwards")));
                    }
                    cores.extend(a..=b);
                }
                None => cores.push(num(part)?),
            }
        }
        if cores.is_empty() {
            return Err(err("no cores".into()));
        }
        Ok(CoreList::new(cores))
    }
}

/// The cores a process's own threads (peer-state sender, journal writer,
/// liveness beacons, the async runtime's tasks started later) run on once
/// its workers hold cores: those the process was `allowed` before minus
/// the `workers'` cores, so that a spinning worker never makes them wait
/// for its time slice; the workers' cores when nothing else is left. DPDK
/// gives its control threads the same set (`rte_thread_create_control`).
pub fn control_cores(allowed: &CoreList, workers: &CoreList) -> CoreList {
    let rest = CoreList::new(allowed.cores().iter().copied().filter(|c| !workers.cores().contains(c)));
    if rest.is_empty() { workers.clone() } else { rest }
}

/// Lets the calling thread (and the threads it starts from now on) run on
/// any of `cores`.
pub fn run_current_thread_on(cores: &CoreList) -> Result<(), CoreError> {
    let mut set = CpuSet::new();
    for &c in cores.cores() {
        set.set(c).map_err(|source| CoreError::Os { what: format!("name core {c}"), source })?;
    }
    sched_setaffinity(Pid::from_raw(0), &set)
        .map_err(|source| CoreError::Os { what: format!("let a thread run on cores {cores}"), source })
}

/// Pins the calling thread to `core`.
pub fn pin_current_thread(core: usize) -> Result<(), CoreError> {
    let mut set = CpuSet::new();
    set.set(core).map_err(|source| CoreError::Os { what: format!("name core {core}"), source })?;
    sched_setaffinity(Pid::from_raw(0), &set)
        .map_err(|source| CoreError::Os { what: format!("pin a worker thread to core {core}"), source })
}

/// Pins the calling worker thread to `core` (when there is one) and
/// returns the cores it may run on afterwards, as the OS reports them. A
/// refusal is logged and the worker runs where it may.
pub fn pin_worker(worker: &str, core: Option<usize>) -> String {
    if let Some(c) = core
        && let Err(e) = pin_current_thread(c)
    {
        tracing::warn!(worker, "{e}; the worker runs unpinned");
    }
    CoreList::allowed().map(|l| l.to_string()).unwrap_or_default()
}

/// Logs once when `workers` must share `cores`.
pub fn warn_if_oversubscribed(workers: usize, cores: &CoreList) {
    if workers > cores.len() {
        tracing::warn!(
            workers,
            cores = %cores,
            "more workers than cores: workers share cores round-robin; NF deadlines count CPU time, so sharing slows NFs down but does not make them trap"
        );
    }
}

/// Cores handed out to long-lived workers that come and go (a `serve`
/// host's deployments): each takes the core fewest others hold, and gives
/// it back when its [`CoreLease`] drops.
#[derive(Debug, Clone)]
pub struct CorePool {
    inner: Arc<Mutex<Vec<(usize, usize)>>>,
}

impl CorePool {
    /// A pool over `cores`.
    pub fn new(cores: &CoreList) -> CorePool {
        CorePool { inner: Arc::new(Mutex::new(cores.cores().iter().map(|&c| (c, 0)).collect())) }
    }

    /// Takes the least-held core (the first of them in list order).
    /// `None` when the pool is empty.
    pub fn lease(&self) -> Option<CoreLease> {
        let mut v = self.inner.lock();
        let slot = v.iter_mut().min_by_key(|(_, n)| *n)?;
        slot.1 += 1;
        let core = slot.0;
        let shared = slot.1 > 1;
        Some(CoreLease { pool: self.clone(), core, shared })
    }

    /// How many workers hold each core.
    pub fn holders(&self) -> Vec<(usize, usize)> {
        self.inner.lock().clone()
    }
}

/// A core held by one worker; given back on drop.
#[derive(Debug)]
pub struct CoreLease {
    pool: CorePool,
    core: usize,
    shared: bool,
}

impl CoreLease {
    /// The core.
    pub fn core(&self) -> usize {
        self.core
    }

    /// Whether another worker held the core already when this one took it.
    pub fn shared(&self) -> bool {
        self.shared
    }
}

impl Drop for CoreLease {
    fn drop(&mut self) {
        let mut v = self.pool.inner.lock();
        if let Some(slot) = v.iter_mut().find(|(c, _)| *c == self.core) {
            slot.1 = slot.1.saturating_sub(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_parse_and_print() {
        let l: CoreList = "0-3, 6,8-9,2".parse().unwrap();
        assert_eq!(l.cores(), &[0, 1, 2, 3, 6, 8, 9]);
        assert_eq!(l.to_string(), "0-3,6,8-9");
        assert_eq!(l.for_worker(7), Some(0));
        for bad in ["", "x", "3-1", "0-99999", "1,,a"] {
            assert!(bad.parse::<CoreList>().is_err(), "{bad}");
        }
    }

    #[test]
    fn control_threads_keep_off_the_workers_cores_unless_none_is_left() {
        let all = CoreList::new([0, 1, 2, 3]);
        assert_eq!(control_cores(&all, &CoreList::new([1, 2])).cores(), &[0, 3]);
        assert_eq!(control_cores(&all, &CoreList::new([0, 1, 2, 3])).cores(), &[0, 1, 2, 3]);
        assert_eq!(control_cores(&CoreList::new([1]), &CoreList::new([1])).cores(), &[1]);
    }

    #[test]
    fn a_thread_can_be_let_run_on_several_cores() {
        let allowed = CoreList::allowed().unwrap();
        std::thread::spawn(move || {
            pin_current_thread(allowed.cores()[0]).unwrap();
            assert_eq!(CoreList::allowed().unwrap().len(), 1);
            run_current_thread_on(&allowed).unwrap();
            assert_eq!(CoreList::allowed().unwrap(), allowed);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn the_pool_spreads_and_takes_back() {
        let pool = CorePool::new(&CoreList::new([4, 5]));
        let a = pool.lease().unwrap();
        let b = pool.lease().unwrap();
        assert_eq!((a.core(), b.core()), (4, 5));
        assert!(!b.shared());
        let c = pool.lease().unwrap();
        assert!(c.shared());
        drop(a);
        assert_eq!(pool.lease().unwrap().core(), 4);
    }

    #[test]
    fn pinning_takes_effect_and_cpu_time_moves() {
        let allowed = CoreList::allowed().unwrap();
        let core = allowed.for_worker(0).unwrap();
        std::thread::spawn(move || {
            pin_current_thread(core).unwrap();
            assert_eq!(CoreList::allowed().unwrap().cores(), &[core]);
            let t0 = sluice_runtime::cpu_time::thread_cpu_time();
            let mut x = 0u64;
            for i in 0..5_000_000u64 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
            }
            assert!(sluice_runtime::cpu_time::thread_cpu_time() > t0);
        })
        .join()
        .unwrap();
    }
}
