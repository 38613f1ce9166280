/* A per-source SYN guard on two single-writer tables, both with
 * sync-interval-ns 0: the counter table `syns`, keyed by the IPv4 source
 * address (its big-endian value widened to u64), counts TCP SYN packets
 * without ACK; the byte table `blocked` (key-size 4: the IPv4 source in
 * network order; max-value-size 1) holds the blocked sources. A TCP packet
 * is an IPv4 packet whose whole TCP header was captured. Each batch:
 * (a) at its start, one `get-many` on `blocked` for the distinct sources of
 * the batch's TCP packets and one `counter-get` on `syns` for the distinct
 * sources of its SYN-without-ACK packets, both in order of first
 * appearance; decisions use only these reads, never counts from the same
 * batch; (b) every TCP packet whose source has a value in `blocked` is
 * dropped, and every SYN-without-ACK packet whose source's `syns` count
 * read at the start is 3 or more is dropped; everything else is forwarded
 * unchanged; (c) at its end, one `counter-add` on `syns` with one key per
 * distinct SYN-without-ACK source (in order of first appearance) and that
 * source's number of SYN-without-ACK packets in the batch as its delta, and
 * one `put-many` on `blocked` writing the value [1] for every such source
 * (same order) whose count read at the start plus the batch's SYNs from it
 * is 8 or more and that was not blocked at the start. Non-IPv4 and non-TCP
 * packets are forwarded and touch no table; a call whose list is empty is
 * skipped. Since decisions use only batch-start reads, the output is the
 * same for 1 and 2 workers. */
#include <sluice_nf.h>
#include <stdlib.h>

/* Drops the SYNs of a source once it has sent this many (read at the
 * start of a batch); blocks it once it has sent BLOCK_AT. */
#define SYN_LIMIT 3
#define BLOCK_AT 8

static sluice_table_t syns, blocked;

bool nf_init(const uint8_t *config, size_t len, sluice_info_t *info, sluice_error_t *err) {
    (void)config, (void)len, (void)info;
    return sluice_declare_single_writer_counter("syns", 0, &syns, err) &&
           sluice_declare_single_writer_bytes("blocked", 4, 1, 0, &blocked, err);
}

/* A distinct source of the batch's TCP packets. */
struct source {
    uint32_t addr;
    bool blocked;
    /* Index among the SYN sources, or -1 if it sent no SYN. */
    int64_t syn;
};

/* A distinct source of the batch's SYN-without-ACK packets. */
struct syn_source {
    uint32_t source;
    int64_t syns;
    uint64_t count;
};

static void be32(uint8_t *b, uint32_t v) { b[0] = (uint8_t)(v >> 24), b[1] = (uint8_t)(v >> 16), b[2] = (uint8_t)(v >> 8), b[3] = (uint8_t)v; }

bool nf_process(sluice_batch_t *batch, sluice_error_t *err) {
    uint32_t n = sluice_batch_len(batch), nsources = 0, nsyn = 0;
    struct source *sources = calloc(n ? n : 1, sizeof *sources);
    struct syn_source *syn = calloc(n ? n : 1, sizeof *syn);
    /* Per packet: its source's index + 1 (0: not TCP), and SYN without ACK. */
    uint32_t *src_of = calloc(n ? n : 1, sizeof *src_of);
    bool *is_syn = calloc(n ? n : 1, sizeof *is_syn);
    uint64_t *keys = calloc(n ? n : 1, sizeof *keys), *counts = calloc(n ? n : 1, sizeof *counts);
    int64_t *deltas = calloc(n ? n : 1, sizeof *deltas);
    sluice_buf_t framed = {0}, values = {0}, entries = {0};
    bool ok = sources && syn && src_of && is_syn && keys && counts && deltas;
    if (!ok) sluice_fail(err, "out of memory");

    for (uint32_t i = 0; ok && i < n; i++) {
        sluice_packet_t p = sluice_batch_packet(batch, i);
        if (!sluice_is_ipv4(&p) || !sluice_is_tcp(&p)) continue;
        uint32_t addr = sluice_ipv4_src(&p);
        uint8_t flags = sluice_tcp_flags(&p);
        uint32_t k = 0;
        while (k < nsources && sources[k].addr != addr) k++;
        if (k == nsources) sources[nsources++] = (struct source){addr, false, -1};
        src_of[i] = k + 1;
        is_syn[i] = (flags & SLUICE_TCP_SYN) && !(flags & SLUICE_TCP_ACK);
        if (!is_syn[i]) continue;
        if (sources[k].syn < 0) {
            sources[k].syn = nsyn;
            syn[nsyn++] = (struct syn_source){k, 0, 0};
        }
        syn[sources[k].syn].syns++;
    }

    /* (a) The tables as of the start of the batch. */
    for (uint32_t k = 0; ok && k < nsources; k++) {
        uint8_t key[4];
        be32(key, sources[k].addr);
        ok = sluice_frame_push(&framed, key, 4) || sluice_fail(err, "out of memory");
    }
    if (ok && nsources) {
        ok = sluice_get_many(blocked, framed.ptr, framed.len, &values, err);
        size_t at = 0;
        for (uint32_t k = 0; ok && k < nsources; k++) {
            const uint8_t *v;
            uint32_t vlen;
            if (!sluice_frame_next(values.ptr, values.len, &at, &v, &vlen)) {
                ok = sluice_fail(err, "get-many: short answer");
                break;
            }
            sources[k].blocked = vlen > 0;
        }
    }
    for (uint32_t j = 0; j < nsyn; j++) keys[j] = sources[syn[j].source].addr, deltas[j] = syn[j].syns;
    if (ok && nsyn) {
        ok = sluice_counter_get(syns, keys, counts, nsyn, err);
        for (uint32_t j = 0; ok && j < nsyn; j++) syn[j].count = counts[j];
    }

    /* (b) Verdicts from those reads only. */
    for (uint32_t i = 0; ok && i < n; i++) {
        if (!src_of[i]) continue;
        const struct source *s = &sources[src_of[i] - 1];
        if (s->blocked || (is_syn[i] && syn[s->syn].count >= SYN_LIMIT)) sluice_set_verdict(batch, i, SLUICE_DROP);
    }

    /* (c) This batch's SYNs, and the sources they push over the limit. */
    if (ok && nsyn) ok = sluice_counter_add(syns, keys, deltas, nsyn, err);
    static const uint8_t mark = 1;
    for (uint32_t j = 0; ok && j < nsyn; j++) {
        const struct source *s = &sources[syn[j].source];
        if (s->blocked || syn[j].count + (uint64_t)syn[j].syns < BLOCK_AT) continue;
        uint8_t key[4];
        be32(key, s->addr);
        ok = (sluice_frame_push(&entries, key, 4) && sluice_frame_push(&entries, &mark, 1)) ||
             sluice_fail(err, "out of memory");
    }
    if (ok && entries.len) ok = sluice_put_many(blocked, entries.ptr, entries.len, err);

    free(sources), free(syn), free(src_of), free(is_syn), free(keys), free(counts), free(deltas);
    sluice_buf_free(&framed), sluice_buf_free(&values), sluice_buf_free(&entries);
    return ok;
}
