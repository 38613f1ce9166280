//! A per-source SYN guard on two single-writer tables, both with
//! sync-interval-ns 0: the counter table `syns`, keyed by the IPv4 source
//! address (its big-endian value widened to u64), counts TCP SYN packets
//! without ACK; the byte table `blocked` (key-size 4: the IPv4 source in
//! network order; max-value-size 1) holds the blocked sources. A TCP packet
//! is an IPv4 packet whose whole TCP header was captured. Each batch:
//! (a) at its start, one `get-many` on `blocked` for the distinct sources of
//! the batch's TCP packets and one `counter-get` on `syns` for the distinct
//! sources of its SYN-without-ACK packets, both in order of first
//! appearance; decisions use only these reads, never counts from the same
//! batch; (b) every TCP packet whose source has a value in `blocked` is
//! dropped, and every SYN-without-ACK packet whose source's `syns` count
//! read at the start is 3 or more is dropped; everything else is forwarded
//! unchanged; (c) at its end, one `counter-add` on `syns` with one key per
//! distinct SYN-without-ACK source (in order of first appearance) and that
//! source's number of SYN-without-ACK packets in the batch as its delta, and
//! one `put-many` on `blocked` writing the value [1] for every such source
//! (same order) whose count read at the start plus the batch's SYNs from it
//! is 8 or more and that was not blocked at the start. Non-IPv4 and non-TCP
//! packets are forwarded and touch no table; a call whose list is empty is
//! skipped. Since decisions use only batch-start reads, the output is the
//! same for 1 and 2 workers.

use sluice_sdk::state::{Bytes, Counters, TableSpec, frames, push_frame};
use sluice_sdk::{Batch, NetworkFunction, NfInfo, Verdict};

struct Guard {
    syns: Counters,
    blocked: Bytes,
}

fn state_err(e: impl std::fmt::Debug) -> String {
    format!("{e:?}")
}

/// Drops the SYNs of a source once it has sent this many (read at the
/// start of a batch).
const SYN_LIMIT: u64 = 3;
/// Blocks a source once it has sent this many SYNs.
const BLOCK_AT: u64 = 8;

impl NetworkFunction for Guard {
    fn init(_config: &[u8]) -> Result<(Self, NfInfo), String> {
        let syns = Counters::declare(TableSpec::single_writer_counter("syns", 0)).map_err(state_err)?;
        let blocked = Bytes::declare(TableSpec::single_writer_bytes("blocked", 4, 1, 0)).map_err(state_err)?;
        Ok((Guard { syns, blocked }, NfInfo::stateless()))
    }

    fn process(&mut self, batch: &mut Batch) -> Result<(), String> {
        // Per TCP packet: its index, source and whether it is a SYN
        // without ACK. Distinct sources of TCP packets and of SYNs (with
        // their SYN counts), in order of first appearance.
        let mut tcp: Vec<(usize, [u8; 4], bool)> = Vec::new();
        let mut sources: Vec<[u8; 4]> = Vec::new();
        let mut syn_sources: Vec<([u8; 4], i64)> = Vec::new();
        for (i, p) in batch.packets().enumerate() {
            let (Some(ip), Some(t)) = (p.ipv4(), p.tcp()) else { continue };
            let src = ip.src();
            let syn = t.syn() && !t.ack();
            tcp.push((i, src, syn));
            if !sources.contains(&src) {
                sources.push(src);
            }
            if syn {
                match syn_sources.iter_mut().find(|s| s.0 == src) {
                    Some(s) => s.1 += 1,
                    None => syn_sources.push((src, 1)),
                }
            }
        }
        // (a) The tables as of the start of the batch.
        let mut blocked: Vec<[u8; 4]> = Vec::new();
        if !sources.is_empty() {
            let mut keys = Vec::new();
            for src in &sources {
                push_frame(&mut keys, src);
            }
            let values = self.blocked.get_many(&keys).map_err(state_err)?;
            for (src, value) in sources.iter().zip(frames(&values)) {
                if !value.map_err(|i| format!("bad framing at {i}"))?.is_empty() {
                    blocked.push(*src);
                }
            }
        }
        let mut counts: Vec<u64> = Vec::new();
        if !syn_sources.is_empty() {
            let keys: Vec<u64> = syn_sources.iter().map(|s| u64::from(u32::from_be_bytes(s.0))).collect();
            counts = self.syns.get(&keys).map_err(state_err)?;
        }
        let count_of = |src: &[u8; 4]| {
            syn_sources.iter().position(|s| s.0 == *src).and_then(|k| counts.get(k).copied()).unwrap_or(0)
        };
        // (b) Verdicts from those reads only.
        for &(i, src, syn) in &tcp {
            if blocked.contains(&src) || (syn && count_of(&src) >= SYN_LIMIT) {
                batch.set_verdict(i, Verdict::Drop);
            }
        }
        // (c) This batch's SYNs, and the sources they push over the limit.
        if !syn_sources.is_empty() {
            let keys: Vec<u64> = syn_sources.iter().map(|s| u64::from(u32::from_be_bytes(s.0))).collect();
            let deltas: Vec<i64> = syn_sources.iter().map(|s| s.1).collect();
            self.syns.add(&keys, &deltas).map_err(state_err)?;
        }
        let mut entries = Vec::new();
        for (src, n) in &syn_sources {
            if count_of(src).saturating_add(n.unsigned_abs()) >= BLOCK_AT && !blocked.contains(src) {
                push_frame(&mut entries, src);
                push_frame(&mut entries, &[1]);
            }
        }
        if !entries.is_empty() {
            self.blocked.put_many(&entries).map_err(state_err)?;
        }
        Ok(())
    }
}

sluice_sdk::export_nf!(Guard);
