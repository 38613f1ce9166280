"""A per-source SYN guard on two single-writer tables, both with
sync-interval-ns 0: the counter table `syns`, keyed by the IPv4 source
address (its big-endian value widened to u64), counts TCP SYN packets
without ACK; the byte table `blocked` (key-size 4: the IPv4 source in
network order; max-value-size 1) holds the blocked sources. A TCP packet
is an IPv4 packet whose whole TCP header was captured. Each batch:
(a) at its start, one `get-many` on `blocked` for the distinct sources of
the batch's TCP packets and one `counter-get` on `syns` for the distinct
sources of its SYN-without-ACK packets, both in order of first
appearance; decisions use only these reads, never counts from the same
batch; (b) every TCP packet whose source has a value in `blocked` is
dropped, and every SYN-without-ACK packet whose source's `syns` count
read at the start is 3 or more is dropped; everything else is forwarded
unchanged; (c) at its end, one `counter-add` on `syns` with one key per
distinct SYN-without-ACK source (in order of first appearance) and that
source's number of SYN-without-ACK packets in the batch as its delta, and
one `put-many` on `blocked` writing the value [1] for every such source
(same order) whose count read at the start plus the batch's SYNs from it
is 8 or more and that was not blocked at the start. Non-IPv4 and non-TCP
packets are forwarded and touch no table; a call whose list is empty is
skipped. Since decisions use only batch-start reads, the output is the
same for 1 and 2 workers."""

from sluice_nf import DROP, TCP_ACK, TCP_SYN, Batch, Bytes, Counters, export, frame, stateless, unframe

# Drops the SYNs of a source once it has sent this many (read at the start
# of a batch); blocks it once it has sent BLOCK_AT.
SYN_LIMIT = 3
BLOCK_AT = 8


class Guard:
    def init(self, config: bytes):
        self.syns = Counters.single_writer("syns", 0)
        self.blocked = Bytes.single_writer("blocked", 4, 1, 0)
        return stateless()

    def process(self, batch: Batch) -> None:
        tcp, sources, syn_sources = [], {}, {}
        for i, p in enumerate(batch.packets()):
            if not p.is_ipv4() or not p.is_tcp():
                continue
            src = p.ipv4_src()
            flags = p.tcp_flags()
            syn = bool(flags & TCP_SYN) and not flags & TCP_ACK
            tcp.append((i, src, syn))
            sources.setdefault(src, False)
            if syn:
                syn_sources[src] = syn_sources.get(src, 0) + 1
        # (a) The tables as of the start of the batch (dicts keep the order
        # of first appearance).
        if sources:
            values = unframe(self.blocked.get_many(frame([s.to_bytes(4, "big") for s in sources])))
            for s, v in zip(list(sources), values):
                sources[s] = len(v) > 0
        counts = {}
        if syn_sources:
            counts = dict(zip(syn_sources, self.syns.get(list(syn_sources))))
        # (b) Verdicts from those reads only.
        for i, src, syn in tcp:
            if sources[src] or (syn and counts[src] >= SYN_LIMIT):
                batch.set_verdict(i, DROP)
        # (c) This batch's SYNs, and the sources they push over the limit.
        if syn_sources:
            self.syns.add(list(syn_sources), list(syn_sources.values()))
        entries = []
        for src, n in syn_sources.items():
            if counts[src] + n >= BLOCK_AT and not sources[src]:
                entries += [src.to_bytes(4, "big"), b"\x01"]
        if entries:
            self.blocked.put_many(frame(entries))


Nf = export(Guard)
