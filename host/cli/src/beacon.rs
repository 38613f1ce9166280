//! Liveness beacons: a group's host tells its dispatcher it is alive
//! (`serve --dpdk --beacon <port>`), so that the dispatcher
//! (`steer --liveness-ms`) moves a dead host's flows within milliseconds
//! of its last beacon instead of waiting for its link to go down or for
//! the controller to notice its silence. The frame is
//! [`sluice_wire::beacon`].
//!
//! One thread per host sends them, apart from the workers, so that a
//! worker busy in a long NF call (up to its deadline) does not stop them:
//! a beacon says the process and its port are alive, not that every
//! worker is idle. It sends on TX queue 0 of the beacon port, which it
//! shares with worker 0 under a lock (taken once per burst on that port).

use crate::run::RunError;
use std::str::FromStr;
use std::time::Duration;
#[cfg(feature = "dpdk")]
pub(crate) use thread::{BeaconPort, Beacons};

/// Where beacons go: `<port>` (broadcast) or `<port>@<mac>` (the
/// dispatcher's port, when the link is a switch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BeaconTarget {
    /// DPDK port id (the link the dispatcher reaches this host by).
    pub port: u16,
    /// Destination MAC.
    pub dst: [u8; 6],
}

impl FromStr for BeaconTarget {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("'{s}' is not <port>[@<mac>], e.g. 0 or 0@02:00:00:00:00:01");
        let (port, mac) = match s.split_once('@') {
            Some((p, m)) => (p, Some(m)),
            None => (s, None),
        };
        let port = port.parse().map_err(|_| bad())?;
        let dst = match mac {
            Some(m) => sluice_wire::ethernet::parse_mac(m).ok_or_else(bad)?,
            None => [0xff; 6],
        };
        Ok(BeaconTarget { port, dst })
    }
}

/// What beacons a host sends.
#[derive(Debug, Clone)]
pub struct BeaconOptions {
    /// Where.
    pub target: BeaconTarget,
    /// How often.
    pub every: Duration,
    /// The id they carry (the host's id in the group).
    pub host: String,
}

impl BeaconOptions {
    /// Checks the id and interval before any port is opened.
    pub fn check(&self) -> Result<(), RunError> {
        let mut f = Vec::new();
        sluice_wire::beacon::build(self.target.dst, &self.host, 0, &mut f)
            .map_err(|e| RunError::Usage(format!("host id '{}' cannot be sent in a beacon: {e}", self.host)))?;
        if self.every.is_zero() || self.every > Duration::from_secs(1) {
            return Err(RunError::Usage(format!(
                "a beacon every {:?} is not useful: give --beacon-us between 1 and 1000000",
                self.every
            )));
        }
        Ok(())
    }
}

/// The sending thread (with DPDK).
#[cfg(feature = "dpdk")]
mod thread {
    use super::BeaconOptions;
    use crate::run::RunError;
    use parking_lot::Mutex;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::thread::JoinHandle;

    /// The beacon thread: stops, and is waited for, when dropped.
    #[derive(Debug)]
    pub(crate) struct Beacons {
        stop: Arc<AtomicBool>,
        sent: Arc<AtomicU64>,
        thread: Option<JoinHandle<()>>,
    }

    /// What the beacon thread needs from the opened ports.
    pub(crate) struct BeaconPort {
        /// Registers the thread with EAL.
        pub(crate) register: Box<dyn Fn() -> Result<sluice_dpdk::ThreadGuard, sluice_dpdk::DpdkError> + Send>,
        /// TX queue 0 of the beacon port (shared with worker 0 under `lock`).
        pub(crate) queue: sluice_dpdk::Queue,
        pub(crate) pool: Arc<sluice_dpdk::Mempool>,
        pub(crate) lock: Arc<Mutex<()>>,
    }

    impl Beacons {
        /// Starts sending.
        pub(crate) fn start(opts: &BeaconOptions, port: BeaconPort) -> Result<Beacons, RunError> {
            let stop = Arc::new(AtomicBool::new(false));
            let sent = Arc::new(AtomicU64::new(0));
            let (stop2, sent2, opts2) = (stop.clone(), sent.clone(), opts.clone());
            let thread = std::thread::Builder::new()
                .name("beacons".into())
                .spawn(move || send(&opts2, port, &stop2, &sent2))
                .map_err(|e| RunError::Usage(format!("cannot start the beacon thread: {e}")))?;
            tracing::info!(port = opts.target.port, every_us = opts.every.as_micros(), "sending liveness beacons");
            Ok(Beacons { stop, sent, thread: Some(thread) })
        }
    }

    fn send(opts: &BeaconOptions, mut port: BeaconPort, stop: &AtomicBool, sent: &AtomicU64) {
        let _guard = match (port.register)() {
            Ok(g) => g,
            Err(e) => {
                tracing::error!("the beacon thread cannot register with DPDK, no beacons are sent: {e}");
                return;
            }
        };
        let mut frame = Vec::new();
        let mut burst = Vec::with_capacity(1);
        let (mut seq, mut failed) = (0u64, 0u64);
        let id = port.queue.port();
        while !stop.load(Ordering::Relaxed) {
            if sluice_wire::beacon::build(opts.target.dst, &opts.host, seq, &mut frame).is_ok()
                && let Some(mut m) = port.pool.alloc()
                && m.set_data(&frame).is_ok()
            {
                burst.push(m);
                let took = {
                    let _tx = port.lock.lock();
                    port.queue.tx_burst(id, &mut burst)
                };
                // What the device did not take is freed.
                burst.clear();
                if took == 1 {
                    sent.fetch_add(1, Ordering::Relaxed);
                } else {
                    failed += 1;
                    if failed.is_power_of_two() {
                        tracing::warn!(port = id, failed, "a beacon was not taken by the port (its ring is full)");
                    }
                }
            }
            seq = seq.wrapping_add(1);
            std::thread::sleep(opts.every);
        }
    }

    impl Drop for Beacons {
        fn drop(&mut self) {
            self.stop.store(true, Ordering::Relaxed);
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
            tracing::info!(sent = self.sent.load(Ordering::Relaxed), "liveness beacons stopped");
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_target_is_a_port_and_maybe_a_mac() {
        assert_eq!("0".parse::<BeaconTarget>().unwrap(), BeaconTarget { port: 0, dst: [0xff; 6] });
        assert_eq!(
            "3@02:00:00:00:00:0a".parse::<BeaconTarget>().unwrap(),
            BeaconTarget { port: 3, dst: [2, 0, 0, 0, 0, 10] }
        );
        for bad in ["", "x", "0@", "0@02:00", "70000"] {
            assert!(bad.parse::<BeaconTarget>().is_err(), "{bad}");
        }
    }

    #[test]
    fn ids_and_intervals_a_beacon_cannot_carry_are_refused_up_front() {
        let ok = BeaconOptions {
            target: BeaconTarget { port: 0, dst: [0xff; 6] },
            every: Duration::from_millis(1),
            host: "h1".into(),
        };
        assert!(ok.check().is_ok());
        assert!(BeaconOptions { host: "h".repeat(65), ..ok.clone() }.check().is_err());
        assert!(BeaconOptions { every: Duration::ZERO, ..ok.clone() }.check().is_err());
        assert!(BeaconOptions { every: Duration::from_secs(2), ..ok }.check().is_err());
    }
}
