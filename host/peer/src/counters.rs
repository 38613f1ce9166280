//! What a host's peer state counts: the report's counters
//! ([`PeerCounters`], [`PoolCounters`], [`MovedFrom`]), the atomic counts
//! the host and its lanes update, and the group-wide view of a global
//! table ([`GlobalTable`]).

use crate::store::StoreCounters;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};

/// Buckets of the wait histograms ([`PeerCounters::commit_wait_us`],
/// [`PeerCounters::wait_us`]):
/// four per power of two of microseconds (a bucket's bounds are within
/// 25 % of each other); the last counts waits of about a second and more.
pub(crate) const WAIT_BUCKETS: usize = 80;

/// The bucket of a wait of `us` microseconds: `us` itself under 4, then
/// four per power of two.
fn wait_bucket(us: u64) -> usize {
    if us < 4 {
        return us as usize;
    }
    let e = u64::BITS - 1 - us.leading_zeros();
    (4 * (e - 1) + ((us >> (e - 2)) & 3) as u32) as usize
}

/// The smallest wait (µs) that bucket `i` of the commit wait histogram
/// counts.
pub fn wait_bucket_floor(i: usize) -> u64 {
    if i < 4 {
        return i as u64;
    }
    let (e, sub) = (i / 4 + 1, (i % 4) as u64);
    (4 + sub) << (e - 2).min(62)
}

/// The `q` quantile (0–1) of waits counted in a commit wait histogram, as
/// the upper bound (µs) of its bucket; 0 when it counts none.
pub fn wait_quantile(buckets: &[u64], q: f64) -> u64 {
    let total: u64 = buckets.iter().sum();
    let want = ((total as f64 * q).ceil() as u64).max(1);
    let mut seen = 0;
    for (i, n) in buckets.iter().enumerate() {
        seen += n;
        if seen >= want && total > 0 {
            return wait_bucket_floor(i + 1);
        }
    }
    0
}

/// The commit wait histogram's counts (see [`WAIT_BUCKETS`]).
#[derive(Debug)]
pub(crate) struct WaitHistogram([AtomicU64; WAIT_BUCKETS]);

impl Default for WaitHistogram {
    fn default() -> Self {
        WaitHistogram(std::array::from_fn(|_| AtomicU64::new(0)))
    }
}

impl WaitHistogram {
    /// Counts a wait of `us` microseconds in its bucket.
    pub(crate) fn count(&self, us: u64) {
        if let Some(b) = self.0.get(wait_bucket(us).min(WAIT_BUCKETS - 1)) {
            b.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The counts, by bucket.
    pub(crate) fn snapshot(&self) -> Vec<u64> {
        self.0.iter().map(|b| b.load(Ordering::Relaxed)).collect()
    }
}

/// What a host's peer state did, for the host report.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerCounters {
    /// Flows sent to peers (state or end).
    pub flows_sent: u64,
    /// Messages sent.
    pub batches_sent: u64,
    /// Flows not sent because the outbox to the bus was full.
    pub flows_send_dropped: u64,
    /// Flows sent because a table change gave them another next owner.
    pub flows_handed_over: u64,
    /// Touched flows not sent because their state had not changed since
    /// they were last sent (and was sent less than 30 s ago).
    pub flows_unchanged: u64,
    /// Times a busy flow's changed state waited for the flow to go quiet
    /// (see [`BUSY_EVERY`](crate::BUSY_EVERY)).
    pub flows_deferred: u64,
    /// Flows whose replica was imported when they arrived here.
    pub flows_imported: u64,
    /// NF parts of arriving replicas refused as stale (not newer than what
    /// the NF held).
    pub parts_stale: u64,
    /// NF parts refused otherwise (the NF's flow table full).
    pub parts_refused: u64,
    /// Flowlets the dispatcher moved here from another host (their first
    /// packet carried its mark).
    pub flowlets_moved_in: u64,
    /// Of those, flowlets whose state was here when their first packet
    /// ran (replicated before, or already held).
    pub moved_with_state: u64,
    /// Of those, flowlets whose NFs held no state for them when their
    /// first packet ran and which did not wait for it: their chain keeps
    /// no per-flow state, their previous host left the group, or no room
    /// was left to hold their packets.
    pub moved_without_state: u64,
    /// Of those, flowlets whose state was neither here nor replicated:
    /// their packets waited while it was pulled from their previous host.
    pub moved_waited: u64,
    /// Waits that ended with the state arriving.
    pub waits_with_state: u64,
    /// Waits that ended with the previous host answering it held none.
    pub waits_not_held: u64,
    /// Waits that ended at the pull wait without either (state misses).
    pub waits_timed_out: u64,
    /// Of those, flows whose state arrived later and was imported when
    /// their next packet came.
    pub late_state_imported: u64,
    /// Microseconds waited, over all waits, and the longest wait.
    pub wait_us_total: u64,
    pub wait_us_max: u64,
    /// Those waits in the buckets of [`commit_wait_us`](Self::commit_wait_us)
    /// ([`wait_quantile`] reads it).
    #[serde(default)]
    pub wait_us: Vec<u64>,
    /// Packets held while their flow waited.
    pub packets_held: u64,
    /// Packets of waiting flows dropped: over [`PER_FLOW`](crate::pull::PER_FLOW) a flow,
    /// or no room left to hold them.
    pub packets_held_dropped: u64,
    /// Requests for flows this host had, from hosts their flows moved to.
    pub pulls_received: u64,
    /// Of those, requests dropped: too many pending.
    pub pulls_refused: u64,
    /// Flows sent in answer to requests.
    pub pull_flows_sent: u64,
    /// Flows of requests this host held no state of.
    pub pull_flows_not_held: u64,
    /// Requests answered (every lane of the deployment looked), and the
    /// microseconds from each one's arrival to its answer, over all of
    /// them: the part of a pull spent on this host.
    #[serde(default)]
    pub pulls_answered: u64,
    #[serde(default)]
    pub pull_answer_us_total: u64,
    /// Output commit (`durability = "replicated"`): messages of changed
    /// flows sent that packets waited on, those the next owner held (and
    /// the microseconds from sending each to its answer, over all of
    /// them), and those not held in time (their packets dropped).
    #[serde(default)]
    pub commits_sent: u64,
    #[serde(default)]
    pub commits_held: u64,
    #[serde(default)]
    pub commit_wait_us_total: u64,
    /// Those waits, four buckets per power of two of µs: entry `i` counts
    /// waits from [`wait_bucket_floor`]`(i)` to `wait_bucket_floor(i + 1)`
    /// (the last, the longer ones); [`wait_quantile`] reads it.
    #[serde(default)]
    pub commit_wait_us: Vec<u64>,
    #[serde(default)]
    pub commits_timed_out: u64,
    /// Packets whose output waited for their flow's change to be held,
    /// and those of them dropped because it was not (or no room was left
    /// to wait).
    #[serde(default)]
    pub packets_deferred: u64,
    #[serde(default)]
    pub packets_commit_dropped: u64,
    /// As next owner: other hosts' commit messages held and answered, and
    /// those refused (the replica store full).
    #[serde(default)]
    pub commits_answered: u64,
    #[serde(default)]
    pub commits_refused: u64,
    /// Hosts this host took for dead before the controller said so (a
    /// commit to them not answered in time, or their flows moved here):
    /// output commit passed over them.
    #[serde(default)]
    pub hosts_suspected: u64,
    /// The peer link ([`link`](crate::link)): datagrams sent, received
    /// and accepted, refused (forged, replayed, from a host offered none,
    /// unreadable, or of a kind the link does not take), and messages for it that took
    /// the bus instead (the receiver offered no link, too big).
    #[serde(default)]
    pub link_sent: u64,
    #[serde(default)]
    pub link_received: u64,
    #[serde(default)]
    pub link_refused: u64,
    #[serde(default)]
    pub link_by_bus: u64,
    /// Windows of 100 ms in which more than 1,000 datagrams or 1 MiB
    /// failed their check on the link (its thread then ran at normal
    /// priority for a second).
    #[serde(default)]
    pub link_floods: u64,
    /// Where this host's peer link receives (`ip:port`), if it has one.
    #[serde(default)]
    pub link_addr: Option<String>,
    /// The moved flowlets by the host they came from (its id, or the
    /// hash its mark carried if it is no longer in the table): after a
    /// kill, how many of the dead host's flows found their state here.
    pub moved_from: std::collections::BTreeMap<String, MovedFrom>,
    /// The ownership table version the host holds.
    pub table_version: Option<u64>,
    /// The replicas this host keeps for its peers.
    pub store: StoreCounters,
    /// Entries of global eventual tables sent to the group's other hosts
    /// (this host's values of keys that changed), per receiving host.
    pub global_entries_sent: u64,
    /// Entries of global eventual tables other hosts sent here.
    pub global_entries_received: u64,
    /// Of those, entries refused (the table's capacity for that host, or
    /// the NF's state budget) or for a deployment or NF not running here.
    pub global_entries_refused: u64,
    /// Release pools split between the group's hosts ([`pools`](crate::pools)).
    pub pools: PoolCounters,
}

/// Counters of the release pools split between the group's hosts.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolCounters {
    /// Bindings handed to the new owner of their block.
    pub handed_over: u64,
    /// Bindings taken in with blocks handed over to this host.
    pub taken_over: u64,
    /// Replicated bindings taken in with blocks of a host that went.
    pub replicas_imported: u64,
    /// Resources released here by flows that moved to other hosts.
    pub released_remote: u64,
    /// Bindings refused (state budget, outside the pool, unknown NF).
    pub refused: u64,
    /// Gained blocks handed out after [`HANDOVER_WAIT`](crate::pools::HANDOVER_WAIT) without
    /// their previous owner's handover.
    pub handover_waits_timed_out: u64,
}

/// The counts behind [`PeerCounters`], updated by the host and its lanes.
#[derive(Debug, Default)]
pub(crate) struct Counts {
    pub(crate) flows_sent: AtomicU64,
    pub(crate) batches_sent: AtomicU64,
    pub(crate) flows_send_dropped: AtomicU64,
    pub(crate) flows_handed_over: AtomicU64,
    pub(crate) flows_unchanged: AtomicU64,
    pub(crate) flows_deferred: AtomicU64,
    pub(crate) flows_imported: AtomicU64,
    pub(crate) parts_stale: AtomicU64,
    pub(crate) parts_refused: AtomicU64,
    pub(crate) flowlets_moved_in: AtomicU64,
    pub(crate) moved_with_state: AtomicU64,
    pub(crate) moved_without_state: AtomicU64,
    pub(crate) moved_waited: AtomicU64,
    pub(crate) waits_with_state: AtomicU64,
    pub(crate) waits_not_held: AtomicU64,
    pub(crate) waits_timed_out: AtomicU64,
    pub(crate) late_state_imported: AtomicU64,
    pub(crate) wait_us_total: AtomicU64,
    pub(crate) wait_us_max: AtomicU64,
    pub(crate) wait_us: WaitHistogram,
    pub(crate) packets_held: AtomicU64,
    pub(crate) packets_held_dropped: AtomicU64,
    pub(crate) pulls_received: AtomicU64,
    pub(crate) pulls_refused: AtomicU64,
    pub(crate) pull_flows_sent: AtomicU64,
    pub(crate) pull_flows_not_held: AtomicU64,
    pub(crate) pulls_answered: AtomicU64,
    pub(crate) pull_answer_us_total: AtomicU64,
    /// Messages from the peer link that could not be read or are of a
    /// kind it does not take.
    pub(crate) link_kind_refused: AtomicU64,
    pub(crate) commits_sent: AtomicU64,
    pub(crate) commits_held: AtomicU64,
    pub(crate) commit_wait_us_total: AtomicU64,
    pub(crate) commit_wait_us: WaitHistogram,
    pub(crate) commits_timed_out: AtomicU64,
    pub(crate) packets_deferred: AtomicU64,
    pub(crate) packets_commit_dropped: AtomicU64,
    pub(crate) commits_answered: AtomicU64,
    pub(crate) commits_refused: AtomicU64,
    pub(crate) hosts_suspected: AtomicU64,
    pub(crate) global_entries_sent: AtomicU64,
    pub(crate) global_entries_received: AtomicU64,
    pub(crate) global_entries_refused: AtomicU64,
}

/// The flowlets moved to a host from one other host.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MovedFrom {
    /// Flowlets.
    pub flowlets: u64,
    /// Of those, whose state was here when their first packet ran.
    pub with_state: u64,
    /// Of those, whose state was pulled while their packets waited.
    pub pulled: u64,
    /// Of those, that ran without state: none came within the wait, the
    /// host held none, or they could not wait.
    pub without_state: u64,
}

/// A global eventual table as the host sees it, merged over the group.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GlobalTable {
    /// Keys held.
    pub entries: usize,
    /// The largest values (key, value), largest first.
    pub top: Vec<(u64, u64)>,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::indexing_slicing)]
    use super::*;

    #[test]
    fn wait_buckets_cover_every_wait_once_and_quantiles_read_them() {
        for us in 0..100_000u64 {
            let i = wait_bucket(us);
            assert!(wait_bucket_floor(i) <= us && us < wait_bucket_floor(i + 1), "{us} in bucket {i}");
        }
        assert_eq!(wait_bucket(1 << 20), WAIT_BUCKETS - 4);
        let mut h = vec![0u64; WAIT_BUCKETS];
        h[wait_bucket(300)] = 50;
        h[wait_bucket(900)] = 49;
        h[wait_bucket(5000)] = 1;
        assert_eq!(wait_quantile(&h, 0.5), 320);
        assert_eq!(wait_quantile(&h, 0.99), 1024);
        assert_eq!(wait_quantile(&h, 1.0), 5120);
        assert_eq!(wait_quantile(&[0; 4], 0.5), 0);
    }
}
