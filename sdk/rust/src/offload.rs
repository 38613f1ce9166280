//! Flow offload (`sluice:nf@0.5.0` `offload`): once the NF has decided a
//! flow, the host gives the flow's later packets the same verdict and
//! header changes itself, without calling the NF.
//!
//! Offload a packet with [`Batch::offload`](crate::Batch::offload): its
//! flow, in its direction and from its ingress port, gets this packet's
//! verdict from now on, plus the changes listed (the packet itself is
//! changed only by what the batch rewrites, as usual). Offload each
//! direction with a packet that travels it. An entry ends, and that packet
//! comes to the NF, on a TCP FIN or RST, at its packet or byte limit, or
//! when a TTL is too low to lower; it also ends when idle, revoked or when
//! the NF is replaced. What passed under it comes back with a later batch
//! ([`Batch::offload_returns`](crate::Batch::offload_returns)), so counters
//! the NF keeps can end equal to a run without offload.
//!
//! ```no_run
//! use sluice_sdk::offload::Offload;
//! # fn f(batch: &mut sluice_sdk::Batch, i: usize) {
//! // An accepted connection: later packets this way pass without a call,
//! // until FIN/RST, or 30 s without a packet.
//! batch.offload(Offload::packet(i).idle_timeout_ns(30_000_000_000));
//! # }
//! ```
//!
//! A chain skips its NFs for a packet only where every NF it went through
//! offloaded it in the same batch. An NF that must see every packet (an
//! IDS, a rate limiter) does not offload. Each entry is charged 256 bytes
//! against the NF's state budget. Natively (the host's baseline build of an
//! NF) there are no entries: requests are refused with `not-now`.

pub use crate::wit::sluice::nf::offload::{
    EndReason, Endpoint, OffloadError, OffloadRequest, OffloadReturn, RewriteOp,
};
use sluice_wire::IpAddr128;

/// A request to offload one packet's flow, built up with its changes and
/// limits.
#[derive(Debug, Clone)]
pub struct Offload(pub(crate) OffloadRequest);

impl Offload {
    /// Offloads the flow of packet `i` of the batch, in its direction: its
    /// later packets get the verdict this one has when `process` returns.
    pub fn packet(i: usize) -> Self {
        Offload(OffloadRequest {
            packet: u32::try_from(i).unwrap_or(u32::MAX),
            rewrites: Vec::new(),
            idle_timeout_ns: 0,
            max_packets: 0,
            max_bytes: 0,
            max_age_ns: 0,
            return_counts: true,
        })
    }

    /// Later packets get this sender address (and port, for TCP and UDP).
    pub fn source(self, address: IpAddr128, port: Option<u16>) -> Self {
        self.rewrite(RewriteOp::Source(endpoint(address, port)))
    }

    /// Later packets get this receiver address (and port).
    pub fn destination(self, address: IpAddr128, port: Option<u16>) -> Self {
        self.rewrite(RewriteOp::Destination(endpoint(address, port)))
    }

    /// Later packets have their TTL or hop limit lowered by one.
    pub fn decrement_ttl(self) -> Self {
        self.rewrite(RewriteOp::DecrementTtl)
    }

    /// Later packets get this DSCP (0 to 63).
    pub fn dscp(self, dscp: u8) -> Self {
        self.rewrite(RewriteOp::SetDscp(dscp))
    }

    /// Adds a change (at most 8 per request).
    pub fn rewrite(mut self, op: RewriteOp) -> Self {
        self.0.rewrites.push(op);
        self
    }

    /// Ends the entry after this long without a packet (packet time); the
    /// default is the NF's flow idle timeout.
    pub fn idle_timeout_ns(mut self, ns: u64) -> Self {
        self.0.idle_timeout_ns = ns;
        self
    }

    /// Ends the entry after this many packets (0: no limit).
    pub fn max_packets(mut self, n: u64) -> Self {
        self.0.max_packets = n;
        self
    }

    /// Ends the entry after this many bytes (0: no limit).
    pub fn max_bytes(mut self, n: u64) -> Self {
        self.0.max_bytes = n;
        self
    }

    /// Ends the entry this long (packet time) after it was made (0: no
    /// limit): the next packet comes to the NF, which may offload again.
    pub fn max_age_ns(mut self, ns: u64) -> Self {
        self.0.max_age_ns = ns;
        self
    }

    /// Asks for nothing back when the entry ends: for an NF that counts
    /// nothing per packet (a firewall). The default hands what passed under
    /// the entry to [`Batch::offload_returns`](crate::Batch::offload_returns).
    pub fn without_counts(mut self) -> Self {
        self.0.return_counts = false;
        self
    }

    /// The request as the contract carries it.
    pub fn request(&self) -> &OffloadRequest {
        &self.0
    }
}

/// Which flow directions have proved long enough to offload: a count of
/// each direction's packets, kept in the instance's own memory.
///
/// An entry costs the host a request, an install and an end; a flow that
/// carries only a few more packets saves less than that, so an NF whose
/// call is cheap (Rust, C) offloads a direction once it has carried
/// `after` packets the NF would have offloaded, as flow caches admit only
/// flows that have proved long. The counts live in a table of `slots`
/// flows, four ways per hash (a new flow takes the place of the one with
/// the fewest packets there): a count lost to another flow, another worker
/// or a restart only makes the flow wait longer. Nothing here changes a
/// verdict.
///
/// ```
/// use sluice_sdk::offload::Admission;
/// let mut gate = Admission::new(3);
/// assert!(!gate.admit(0xfeed, false));
/// assert!(!gate.admit(0xfeed, false));
/// assert!(!gate.admit(0xfeed, true)); // the other direction counts apart
/// assert!(gate.admit(0xfeed, false)); // the third packet this way
/// ```
#[derive(Debug, Clone)]
pub struct Admission {
    after: u32,
    /// Per slot: the flow's hash and its two directions' counts; `WAYS`
    /// slots in a row per set.
    slots: Vec<(u64, [u32; 2])>,
}

/// Slots a flow's hash may take.
const WAYS: usize = 4;

impl Admission {
    /// Flows a table holds by default (48 KiB of the instance's memory).
    pub const DEFAULT_SLOTS: usize = 4096;

    /// Admits a direction at its `after`th packet (0 and 1: at once).
    pub fn new(after: u32) -> Self {
        Self::with_slots(after, Self::DEFAULT_SLOTS)
    }

    /// [`new`](Self::new) with room for `slots` flows (rounded up to a
    /// power of two, at least 4, at most 2^20).
    pub fn with_slots(after: u32, slots: usize) -> Self {
        let slots = if after > 1 { slots.clamp(WAYS, 1 << 20).next_power_of_two() } else { 0 };
        Admission { after, slots: vec![(0, [0, 0]); slots] }
    }

    /// The packets a direction carries before it is admitted.
    pub fn after(&self) -> u32 {
        self.after
    }

    /// The set of slots `flow_hash` may take.
    fn set(&mut self, flow_hash: u64) -> &mut [(u64, [u32; 2])] {
        let sets = self.slots.len() / WAYS;
        let at = (flow_hash as usize & sets.saturating_sub(1)) * WAYS;
        self.slots.get_mut(at..at + WAYS).unwrap_or(&mut [])
    }

    /// Counts one packet of the flow with this hash
    /// ([`Packet::flow_hash`](crate::Packet::flow_hash)) in this direction
    /// ([`Packet::is_reverse`](crate::Packet::is_reverse)); true once the
    /// direction has carried `after` counted packets.
    pub fn admit(&mut self, flow_hash: u64, reverse: bool) -> bool {
        if self.after <= 1 {
            return true;
        }
        let after = self.after;
        let set = self.set(flow_hash);
        let slot = match set.iter().position(|(h, _)| *h == flow_hash) {
            Some(at) => set.get_mut(at),
            None => {
                let fewest = set.iter_mut().min_by_key(|(_, [a, b])| a.saturating_add(*b));
                fewest.map(|slot| {
                    *slot = (flow_hash, [0, 0]);
                    slot
                })
            }
        };
        let Some(n) = slot.and_then(|(_, counts)| counts.get_mut(usize::from(reverse))) else { return true };
        *n = n.saturating_add(1);
        *n >= after
    }

    /// Forgets the flow's counts (a new connection on its 5-tuple).
    pub fn forget(&mut self, flow_hash: u64) {
        if let Some(slot) = self.set(flow_hash).iter_mut().find(|(h, _)| *h == flow_hash) {
            slot.1 = [0, 0];
        }
    }
}

fn endpoint(address: IpAddr128, port: Option<u16>) -> Endpoint {
    let address = match address.to_v4() {
        Some(v4) => v4.to_vec(),
        None => address.to_v6().to_vec(),
    };
    Endpoint { address, port }
}

/// Asks the host to offload these packets' flows now: one result per
/// request. [`Batch::offload`](crate::Batch::offload) gathers requests and
/// makes this call once when `process` returns; call this directly to see
/// each refusal.
pub fn offload(requests: &[OffloadRequest]) -> Vec<Result<(), OffloadError>> {
    imp::offload(requests)
}

/// Ends this worker's entries of the flows with these hashes
/// ([`Packet::flow_hash`](crate::Packet::flow_hash)), both directions, when
/// the batch is done.
pub fn revoke(flow_hashes: &[u64]) {
    imp::revoke(flow_hashes)
}

/// Ends every entry of this NF on this worker when the batch is done.
pub fn revoke_all() {
    imp::revoke_all()
}

/// The entries that ended since the last call, and what passed under
/// each. [`Batch::offload_returns`](crate::Batch::offload_returns) calls
/// it once per batch.
pub fn returned() -> Vec<OffloadReturn> {
    imp::returned()
}

#[cfg(target_arch = "wasm32")]
mod imp {
    use super::{OffloadError, OffloadRequest, OffloadReturn};
    use crate::wit::sluice::nf::offload as host;

    pub fn offload(requests: &[OffloadRequest]) -> Vec<Result<(), OffloadError>> {
        host::offload(requests)
    }
    pub fn revoke(flow_hashes: &[u64]) {
        host::revoke(flow_hashes)
    }
    pub fn revoke_all() {
        host::revoke_all()
    }
    pub fn returned() -> Vec<OffloadReturn> {
        host::returned()
    }
}

/// Natively no host offloads: requests are refused with `not-now`.
#[cfg(not(target_arch = "wasm32"))]
mod imp {
    use super::{OffloadError, OffloadRequest, OffloadReturn};

    pub fn offload(requests: &[OffloadRequest]) -> Vec<Result<(), OffloadError>> {
        requests.iter().map(|_| Err(OffloadError::NotNow)).collect()
    }
    pub fn revoke(_flow_hashes: &[u64]) {}
    pub fn revoke_all() {}
    pub fn returned() -> Vec<OffloadReturn> {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::Admission;

    #[test]
    fn a_direction_is_admitted_at_its_nth_packet_and_each_direction_counts_apart() {
        let mut gate = Admission::new(4);
        let admitted: Vec<bool> = (0..5).map(|_| gate.admit(7, false)).collect();
        assert_eq!(admitted, [false, false, false, true, true]);
        assert!(!gate.admit(7, true));
        gate.forget(7);
        assert!(!gate.admit(7, false));
    }

    #[test]
    fn a_full_set_gives_the_place_of_its_flow_with_the_fewest_packets() {
        // One set of four: flows 1..=4 fill it, 1 has the most packets.
        let mut gate = Admission::with_slots(3, 4);
        for flow in 1..=4 {
            assert!(!gate.admit(flow, false));
        }
        assert!(!gate.admit(1, false));
        assert!(!gate.admit(5, true)); // takes 2's place (fewest, first)
        assert!(gate.admit(1, false)); // 1 kept its count
        assert!(!gate.admit(2, false)); // 2 starts again
        // Forgetting a flow that holds no slot leaves the others alone.
        gate.forget(9);
        assert!(gate.admit(1, false));
    }

    #[test]
    fn interleaved_flows_of_a_table_s_size_are_all_admitted() {
        let mut gate = Admission::new(4);
        let flows: Vec<u64> = (0..256u64).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15)).collect();
        for round in 1..=4 {
            let admitted = flows.iter().filter(|&&f| gate.admit(f, false)).count();
            assert_eq!(admitted, if round == 4 { 256 } else { 0 });
        }
    }

    #[test]
    fn admitting_at_once_keeps_no_table() {
        for after in [0, 1] {
            let mut gate = Admission::with_slots(after, 1 << 30);
            assert!(gate.admit(3, true));
            assert!(gate.slots.is_empty());
        }
    }
}
