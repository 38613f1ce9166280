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
