// A per-source SYN guard on two single-writer tables, both with
// sync-interval-ns 0: the counter table `syns`, keyed by the IPv4 source
// address (its big-endian value widened to u64), counts TCP SYN packets
// without ACK; the byte table `blocked` (key-size 4: the IPv4 source in
// network order; max-value-size 1) holds the blocked sources. A TCP packet
// is an IPv4 packet whose whole TCP header was captured. Each batch:
// (a) at its start, one `get-many` on `blocked` for the distinct sources of
// the batch's TCP packets and one `counter-get` on `syns` for the distinct
// sources of its SYN-without-ACK packets, both in order of first
// appearance; decisions use only these reads, never counts from the same
// batch; (b) every TCP packet whose source has a value in `blocked` is
// dropped, and every SYN-without-ACK packet whose source's `syns` count
// read at the start is 3 or more is dropped; everything else is forwarded
// unchanged; (c) at its end, one `counter-add` on `syns` with one key per
// distinct SYN-without-ACK source (in order of first appearance) and that
// source's number of SYN-without-ACK packets in the batch as its delta, and
// one `put-many` on `blocked` writing the value [1] for every such source
// (same order) whose count read at the start plus the batch's SYNs from it
// is 8 or more and that was not blocked at the start. Non-IPv4 and non-TCP
// packets are forwarded and touch no table; a call whose list is empty is
// skipped. Since decisions use only batch-start reads, the output is the
// same for 1 and 2 workers.
import { Bytes, Counters, DROP, TCP_ACK, TCP_SYN, exportNf, frame, stateless, unframe } from "@sluice/nf";

// Drops the SYNs of a source once it has sent this many (read at the start
// of a batch); blocks it once it has sent BLOCK_AT.
const SYN_LIMIT = 3n;
const BLOCK_AT = 8n;

const be32 = (v) => Uint8Array.of(v >>> 24, (v >>> 16) & 0xff, (v >>> 8) & 0xff, v & 0xff);

class Guard {
  init(config) {
    this.syns = Counters.singleWriter("syns", 0n);
    this.blocked = Bytes.singleWriter("blocked", 4, 1, 0n);
    return stateless();
  }

  process(batch) {
    // Maps keep the order of first appearance: source -> blocked at the
    // start, source -> SYNs in this batch.
    const tcp = [];
    const sources = new Map();
    const synSources = new Map();
    for (let i = 0; i < batch.length; i++) {
      const p = batch.packet(i);
      if (!p.isIpv4() || !p.isTcp()) continue;
      const src = p.ipv4Src();
      const flags = p.tcpFlags();
      const syn = (flags & TCP_SYN) !== 0 && (flags & TCP_ACK) === 0;
      tcp.push([i, src, syn]);
      if (!sources.has(src)) sources.set(src, false);
      if (syn) synSources.set(src, (synSources.get(src) ?? 0) + 1);
    }
    // (a) The tables as of the start of the batch.
    if (sources.size) {
      const keys = [...sources.keys()];
      const values = unframe(this.blocked.getMany(frame(keys.map(be32))));
      keys.forEach((src, k) => sources.set(src, values[k].length > 0));
    }
    const counts = new Map();
    if (synSources.size) {
      const keys = [...synSources.keys()];
      const got = this.syns.get(keys);
      keys.forEach((src, k) => counts.set(src, got[k]));
    }
    // (b) Verdicts from those reads only.
    for (const [i, src, syn] of tcp) {
      if (sources.get(src) || (syn && counts.get(src) >= SYN_LIMIT)) batch.setVerdict(i, DROP);
    }
    // (c) This batch's SYNs, and the sources they push over the limit.
    if (synSources.size) this.syns.add([...synSources.keys()], [...synSources.values()]);
    const entries = [];
    for (const [src, n] of synSources) {
      if (counts.get(src) + BigInt(n) >= BLOCK_AT && !sources.get(src)) entries.push(be32(src), Uint8Array.of(1));
    }
    if (entries.length) this.blocked.putMany(frame(entries));
  }
}

export const nf = exportNf(Guard);
