//! The group's table as a dispatcher's workers steer by it, and the
//! changes of tables and links they saw.

use parking_lot::{Mutex, RwLock};
use serde::Serialize;
use sluice_group::{OwnershipTable, Route};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The group's table as the workers steer by it: swapped whole when a new
/// version arrives; a worker looks at the version once per burst.
#[derive(Debug)]
pub struct RouteFeed {
    hosts: Vec<String>,
    version: AtomicU64,
    route: RwLock<Arc<Route>>,
    started: Instant,
    /// A table seen but not steered by yet, and when it will be.
    pending: Mutex<Option<(OwnershipTable, Instant)>>,
    events: Mutex<Vec<TableEvent>>,
    /// Per host (in `--to` order): whether its link is down.
    down: Arc<[AtomicBool]>,
    /// Counts link changes, so workers copy `down` only after one.
    link_epoch: AtomicU64,
    links: Mutex<Vec<LinkEvent>>,
    /// Per host, since its link last went down: flowlets moved away from
    /// it, and the packets sent to it in the [`RECENT_MS`] before (added
    /// by each worker when it sees the link down).
    since_down: Vec<(AtomicU64, AtomicU64)>,
    /// Per host: liveness beacons heard from it.
    beacons: Vec<AtomicU64>,
    /// Frames hosts sent the dispatcher that were not their beacons.
    stray: AtomicU64,
}

/// The window before a link went down whose packets a link event counts
/// (they were in flight to, or queued at, a host that may have died).
pub const RECENT_MS: u64 = 20;
/// Buckets of the per-host count of recent packets (one per ms).
pub(super) const BUCKETS: usize = 32;

/// A link towards a host that went down or came back.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LinkEvent {
    /// The host.
    pub host: String,
    /// Whether it is up now.
    pub up: bool,
    /// Why: down, `link` (the port's link went down) or `beacons` (with
    /// `--liveness-ms`: none heard within the bound); up, `link` or
    /// `link and beacons` (both are up again).
    pub cause: String,
    /// When, ms since the dispatcher started.
    pub at_ms: u64,
    /// When, µs since the Unix epoch (to set against other processes'
    /// clocks, e.g. when a host was killed).
    pub at_unix_us: u64,
    /// Down: packets sent to the host in the 20 ms before its link went
    /// down: what may have been lost with it (in flight, in its queues;
    /// what a dead host had taken before is not counted).
    pub sent_before: u64,
    /// Down: flowlets moved away from the host since (its flows, each at
    /// its next packet, to the slot's next owner).
    pub flowlets_moved: u64,
}

/// Now, µs since the Unix epoch.
fn unix_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// Tables kept in a dispatcher's report, at most (the latest).
const MAX_EVENTS: usize = 64;

/// A table the dispatcher started to steer by.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TableEvent {
    /// Its version.
    pub version: u64,
    /// When, ms since the dispatcher started.
    pub at_ms: u64,
    /// When, µs since the Unix epoch.
    pub at_unix_us: u64,
    /// How long after the dispatcher first saw it, ms (the handover delay
    /// of a planned change; 0 when a host was lost).
    pub delayed_ms: u64,
    /// Hosts of the dispatcher that may receive packets now and could not
    /// before.
    pub joined: Vec<String>,
    /// Hosts that could receive packets before and are gone now: their
    /// flows move at once, their next packets start flowlets elsewhere.
    pub left: Vec<String>,
}

impl RouteFeed {
    /// A feed for a dispatcher that reaches `hosts` (in `--to` order).
    pub fn new(hosts: Vec<String>) -> Self {
        RouteFeed {
            version: AtomicU64::new(0),
            route: RwLock::new(Arc::new(Route::empty())),
            started: Instant::now(),
            pending: Mutex::new(None),
            events: Mutex::new(Vec::new()),
            down: hosts.iter().map(|_| AtomicBool::new(false)).collect::<Vec<_>>().into(),
            link_epoch: AtomicU64::new(0),
            links: Mutex::new(Vec::new()),
            since_down: hosts.iter().map(|_| (AtomicU64::new(0), AtomicU64::new(0))).collect(),
            beacons: hosts.iter().map(|_| AtomicU64::new(0)).collect(),
            stray: AtomicU64::new(0),
            hosts,
        }
    }

    /// Per host (in `--to` order), whether its link is down (as last
    /// noted): shared with the workers' TX retries.
    pub(super) fn down_flags(&self) -> Arc<[AtomicBool]> {
        self.down.clone()
    }

    /// Whether the link towards host `i` is down (as last noted).
    pub fn link_down(&self, i: usize) -> bool {
        self.down.get(i).is_some_and(|d| d.load(Ordering::Acquire))
    }

    /// Notes the state of the link towards host `i`, and why it changed
    /// (`cause`, when it did: see [`LinkEvent::cause`]). A host whose
    /// link went down is treated as gone at once: its flows move to their
    /// next owners (which hold their replicated state) without waiting
    /// for the controller to notice its silence.
    pub fn set_link(&self, i: usize, up: bool, cause: &str) {
        let Some(flag) = self.down.get(i) else { return };
        let was_down = flag.swap(!up, Ordering::AcqRel);
        if was_down != up {
            // No change.
            return;
        }
        self.link_epoch.fetch_add(1, Ordering::AcqRel);
        let host = self.hosts.get(i).cloned().unwrap_or_default();
        if up {
            tracing::info!(host, cause, "the link towards a host is up");
        } else {
            tracing::warn!(host, cause, "the link towards a host went down: its flows go to their next owners");
        }
        let mut links = self.links.lock();
        if !up && let Some((moved, sent)) = self.since_down.get(i) {
            moved.store(0, Ordering::Relaxed);
            sent.store(0, Ordering::Relaxed);
        }
        if links.len() >= MAX_EVENTS {
            links.remove(0);
        }
        links.push(LinkEvent {
            host,
            up,
            cause: cause.to_string(),
            at_ms: u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX),
            at_unix_us: unix_us(),
            ..Default::default()
        });
    }

    /// The link changes so far (the latest 64); each host's latest down
    /// event with its counts since.
    pub fn link_events(&self) -> Vec<LinkEvent> {
        let mut links = self.links.lock().clone();
        for (i, host) in self.hosts.iter().enumerate() {
            let Some((moved, sent)) = self.since_down.get(i) else { continue };
            if let Some(e) = links.iter_mut().rev().find(|e| e.host == *host && !e.up) {
                e.flowlets_moved = moved.load(Ordering::Relaxed);
                e.sent_before = sent.load(Ordering::Relaxed);
            }
        }
        links
    }

    /// A worker's count of the packets it sent host `i` in the window
    /// before its link went down.
    pub(super) fn add_sent_before_down(&self, i: usize, n: u64) {
        if let Some((_, sent)) = self.since_down.get(i) {
            sent.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// A flowlet moved away from host `i` while its link is down.
    pub(super) fn moved_from_down(&self, i: usize) {
        if let Some((moved, _)) = self.since_down.get(i)
            && self.down.get(i).is_some_and(|d| d.load(Ordering::Relaxed))
        {
            moved.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A beacon of host `i` was heard.
    pub(super) fn heard(&self, i: usize) {
        if let Some(b) = self.beacons.get(i) {
            b.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A host sent a frame that was not its beacon.
    pub(super) fn stray_frame(&self) {
        self.stray.fetch_add(1, Ordering::Relaxed);
    }

    /// Beacons heard per host (in `--to` order), and stray frames.
    pub(super) fn beacon_counts(&self) -> (Vec<u64>, u64) {
        (self.beacons.iter().map(|b| b.load(Ordering::Relaxed)).collect(), self.stray.load(Ordering::Relaxed))
    }

    pub(super) fn link_epoch(&self) -> u64 {
        self.link_epoch.load(Ordering::Acquire)
    }

    pub(super) fn copy_down(&self, out: &mut Vec<bool>) {
        out.clear();
        out.extend(self.down.iter().map(|d| d.load(Ordering::Acquire)));
    }

    /// Offers a table read from the bus. A table in which a host the
    /// dispatcher sends to is gone (neither a member nor finishing) is
    /// steered by at once: packets sent there are lost. Any other change
    /// (a host joining or draining, new weights) waits `handover` after it
    /// was first seen, so that the hosts, which read the table as often,
    /// have handed the moving flows' state to their new owners before the
    /// first packet reaches them. Returns whether the dispatcher steers by
    /// a new table now.
    pub fn offer(&self, table: OwnershipTable, now: Instant, handover: Duration) -> bool {
        if table.version() <= self.version() {
            return false;
        }
        let current = self.current();
        let listed = |h: &str| table.members().iter().any(|m| m.host == h) || table.finishing().iter().any(|f| f == h);
        let lost = (0..self.hosts.len())
            .any(|i| u16::try_from(i).is_ok_and(|i| current.is_up(i)) && !self.hosts.get(i).is_some_and(|h| listed(h)));
        let mut pending = self.pending.lock();
        let (due, seen) = match &*pending {
            Some((t, due)) if t.version() == table.version() => (*due, due.checked_sub(handover).unwrap_or(now)),
            _ => (now + handover, now),
        };
        if lost || current.version == 0 || now >= due {
            *pending = None;
            drop(pending);
            self.apply(&table, now.saturating_duration_since(seen));
            true
        } else {
            *pending = Some((table, due));
            false
        }
    }

    /// Steers by the pending table if its delay is over.
    pub fn apply_due(&self, now: Instant, handover: Duration) -> bool {
        let pending = self.pending.lock().take();
        match pending {
            Some((t, due)) if now >= due => {
                self.apply(&t, handover);
                true
            }
            Some(p) => {
                *self.pending.lock() = Some(p);
                false
            }
            None => false,
        }
    }

    pub(super) fn apply(&self, table: &OwnershipTable, delayed: Duration) {
        let before = self.current();
        if !self.set(table) {
            return;
        }
        let after = self.current();
        let (mut joined, mut left) = (Vec::new(), Vec::new());
        for (i, h) in self.hosts.iter().enumerate() {
            let Ok(i) = u16::try_from(i) else { continue };
            match (before.is_up(i), after.is_up(i)) {
                (false, true) => joined.push(h.clone()),
                (true, false) => left.push(h.clone()),
                _ => {}
            }
        }
        let mut events = self.events.lock();
        if events.len() >= MAX_EVENTS {
            events.remove(0);
        }
        events.push(TableEvent {
            version: table.version(),
            at_ms: u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX),
            at_unix_us: unix_us(),
            delayed_ms: u64::try_from(delayed.as_millis()).unwrap_or(u64::MAX),
            joined,
            left,
        });
    }

    /// The tables steered by so far (the latest [`MAX_EVENTS`]).
    pub fn events(&self) -> Vec<TableEvent> {
        self.events.lock().clone()
    }

    /// Steers by `table` from now on (an older or equal version is
    /// ignored). Returns whether it was taken.
    pub fn set(&self, table: &OwnershipTable) -> bool {
        if table.version() <= self.version.load(Ordering::Acquire) {
            return false;
        }
        let route = Arc::new(Route::of(table, &self.hosts));
        *self.route.write() = route;
        self.version.store(table.version(), Ordering::Release);
        true
    }

    /// The version steered by (0: none yet).
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    pub(super) fn current(&self) -> Arc<Route> {
        self.route.read().clone()
    }
}
