//! What a dispatcher did: per host, per worker, and its table and link
//! changes.

use super::feed::{LinkEvent, RouteFeed, TableEvent};
use crate::dpdk::PortReport;
use serde::Serialize;
use sluice_group::FlowletCounters;

/// Packets sent to one host.
#[derive(Debug, Clone, Default, Serialize)]
pub struct HostCount {
    /// Host id.
    pub host: String,
    /// Port towards it.
    pub port: u16,
    /// Packets it was sent.
    pub packets: u64,
    /// Packets for it that its port did not take (a full ring, or a link
    /// that went down with the host): dropped.
    pub dropped: u64,
    /// Flowlets moved to it from another host.
    pub moved_in: u64,
    /// Flowlets of flows it had that went to another host (a table that
    /// moved its slots, or its link down): after a kill, the flows the
    /// loss moved.
    pub moved_away: u64,
    /// Liveness beacons heard from it (with `--liveness-ms`).
    pub beacons: u64,
}

/// Counters of one worker.
#[derive(Debug, Clone, Default, Serialize)]
pub(super) struct WorkerStats {
    pub(super) received: u64,
    pub(super) per_host: Vec<u64>,
    pub(super) per_host_dropped: Vec<u64>,
    pub(super) per_host_moved_in: Vec<u64>,
    pub(super) per_host_moved_away: Vec<u64>,
    pub(super) no_route: u64,
    pub(super) not_ip: u64,
    pub(super) dropped_tx_full: u64,
    pub(super) marked: u64,
    pub(super) to_pool_owner: u64,
    pub(super) flowlets: FlowletCounters,
    pub(super) flows: usize,
}

/// The report of a dispatcher run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SteerReport {
    /// Packets received on the ingress ports.
    pub received: u64,
    /// Packets sent towards their hosts.
    pub forwarded: u64,
    /// Packets whose flow's owner is not reachable from here (no `--to`
    /// for it, or no table yet): dropped.
    pub no_route: u64,
    /// Packets without a flow key (not IP): dropped.
    pub not_ip: u64,
    /// Packets a host's port did not take: dropped.
    pub dropped_tx_full: u64,
    /// First packets of moved flowlets, marked with the host the flow was
    /// on (see `sluice_wire::steer`); a mark that did not fit the buffer
    /// leaves the packet unmarked.
    pub marked: u64,
    /// Packets to a pool address (`--pool-address`) sent to the owner of
    /// their destination port's block.
    pub to_pool_owner: u64,
    /// Per host.
    pub hosts: Vec<HostCount>,
    /// The tables steered by, in order, with the hosts each let in or
    /// lost (the latest 64).
    pub tables: Vec<TableEvent>,
    /// Links towards hosts that went down or came back (the latest 64).
    pub links: Vec<LinkEvent>,
    /// Frames the hosts sent the dispatcher that were not their beacons
    /// (freed; with `--liveness-ms`).
    pub stray_frames: u64,
    /// Flowlets started, moved between hosts, moved because their host
    /// was gone; flows untracked or forgotten.
    pub flowlets: FlowletCounters,
    /// Flows tracked at the end, over all workers.
    pub flows: usize,
    /// The table version steered by at the end.
    pub table_version: u64,
    /// Workers.
    pub workers: usize,
    /// Wall time, ns.
    pub wall_ns: u64,
    /// Received Mpps over the wall time.
    pub mpps: f64,
    /// Ports.
    pub ports: Vec<PortReport>,
}

impl SteerReport {
    /// The human-readable summary.
    pub fn summary(&self) -> String {
        let f = &self.flowlets;
        let mut s = format!(
            "packets: {} rx, {} forwarded, {} no route, {} not IP, {} dropped (TX full) | flowlets: {} started, {} moved ({} from a gone host, {} marked), {} flows | table v{} | {:.3} Mpps | {} worker(s)\n",
            self.received,
            self.forwarded,
            self.no_route,
            self.not_ip,
            self.dropped_tx_full,
            f.flowlets,
            f.moved,
            f.moved_from_gone,
            self.marked,
            self.flows,
            self.table_version,
            self.mpps,
            self.workers
        );
        for h in &self.hosts {
            s.push_str(&format!(
                "  {} (port {}): {} packets, {} dropped | flowlets moved in {}, away {}\n",
                h.host, h.port, h.packets, h.dropped, h.moved_in, h.moved_away
            ));
        }
        s
    }

    /// What the feed saw: tables, links, beacons.
    pub(super) fn add_feed(&mut self, feed: &RouteFeed) {
        self.table_version = feed.version();
        self.tables = feed.events();
        self.links = feed.link_events();
        let (beacons, stray) = feed.beacon_counts();
        for (h, n) in self.hosts.iter_mut().zip(beacons) {
            h.beacons = n;
        }
        self.stray_frames = stray;
    }

    pub(super) fn add(&mut self, w: &WorkerStats) {
        self.received += w.received;
        self.no_route += w.no_route;
        self.not_ip += w.not_ip;
        self.dropped_tx_full += w.dropped_tx_full;
        self.marked += w.marked;
        self.to_pool_owner += w.to_pool_owner;
        for (h, n) in self.hosts.iter_mut().zip(&w.per_host) {
            h.packets += n;
            self.forwarded += n;
        }
        for (h, n) in self.hosts.iter_mut().zip(&w.per_host_dropped) {
            h.dropped += n;
        }
        for (h, n) in self.hosts.iter_mut().zip(&w.per_host_moved_in) {
            h.moved_in += n;
        }
        for (h, n) in self.hosts.iter_mut().zip(&w.per_host_moved_away) {
            h.moved_away += n;
        }
        let f = &mut self.flowlets;
        f.flowlets += w.flowlets.flowlets;
        f.moved += w.flowlets.moved;
        f.moved_from_gone += w.flowlets.moved_from_gone;
        f.untracked += w.flowlets.untracked;
        f.forgotten += w.flowlets.forgotten;
        self.flows += w.flows;
    }
}
