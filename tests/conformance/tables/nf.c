/* Gives every flow an id from a pool and remembers it per flow (see nf.rs
 * for the full description): new flows acquire ids bound to their IPv4
 * source, ids are stored per flow, read back with lookup and reported as
 * `conformance.flow` events; FIN/RST gives the id back. */
#include <sluice_nf.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static sluice_table_t ids_table, pool;

bool nf_init(const uint8_t *config, size_t len, sluice_info_t *info, sluice_error_t *err) {
    (void)config, (void)len, (void)info;
    return sluice_declare_per_flow_bytes("ids", 8, &ids_table, err) &&
           sluice_declare_pool("pool", 100, 1000, 4, &pool, err);
}

struct flow {
    uint32_t flow, first;
    uint8_t src[4];
    bool ends, has_id;
    uint64_t id;
};

static void le32(uint8_t *b, uint32_t v) { b[0] = (uint8_t)v, b[1] = (uint8_t)(v >> 8), b[2] = (uint8_t)(v >> 16), b[3] = (uint8_t)(v >> 24); }

bool nf_process(sluice_batch_t *batch, sluice_error_t *err) {
    uint32_t n = sluice_batch_len(batch), nflows = 0;
    struct flow *flows = calloc(n ? n : 1, sizeof *flows);
    uint32_t *fresh = calloc(n ? n : 1, sizeof *fresh);
    sluice_buf_t keys = {0}, values = {0}, entries = {0}, known = {0}, bound = {0}, removals = {0};
    uint64_t *ids = NULL, *done = NULL;
    size_t nids = 0, ndone = 0;
    bool ok = flows && fresh;
    if (!ok) sluice_fail(err, "out of memory");

    for (uint32_t i = 0; ok && i < n; i++) {
        sluice_packet_t p = sluice_batch_packet(batch, i);
        if (p.flow == SLUICE_NO_FLOW) continue;
        bool ends = sluice_tcp_flags(&p) & (SLUICE_TCP_FIN | SLUICE_TCP_RST);
        uint32_t k = 0;
        while (k < nflows && flows[k].flow != p.flow) k++;
        if (k < nflows) {
            flows[k].ends |= ends;
            continue;
        }
        uint32_t a = sluice_ipv4_src(&p);
        flows[k] = (struct flow){p.flow, i, {(uint8_t)(a >> 24), (uint8_t)(a >> 16), (uint8_t)(a >> 8), (uint8_t)a}, ends, false, 0};
        nflows++;
    }
    if (!ok || !nflows) goto out;

    for (uint32_t k = 0; ok && k < nflows; k++) {
        uint8_t key[4];
        le32(key, flows[k].flow);
        ok = sluice_frame_push(&keys, key, 4);
    }
    ok = ok && sluice_get_many(ids_table, keys.ptr, keys.len, &known, err);
    uint32_t nfresh = 0;
    size_t at = 0;
    for (uint32_t k = 0; ok && k < nflows; k++) {
        const uint8_t *v;
        uint32_t vlen;
        if (!sluice_frame_next(known.ptr, known.len, &at, &v, &vlen)) {
            ok = sluice_fail(err, "get-many: short answer");
            break;
        }
        if (vlen == 8) {
            memcpy(&flows[k].id, v, 8);
            flows[k].has_id = true;
        } else if (vlen == 0) {
            fresh[nfresh++] = k;
        }
    }
    if (ok && nfresh) {
        for (uint32_t j = 0; ok && j < nfresh; j++) ok = sluice_frame_push(&values, flows[fresh[j]].src, 4);
        ok = ok && sluice_acquire(pool, values.ptr, values.len, &ids, &nids, err);
        for (size_t j = 0; ok && j < nids && j < nfresh; j++) {
            struct flow *f = &flows[fresh[j]];
            uint8_t key[4];
            le32(key, f->flow);
            f->id = ids[j];
            f->has_id = true;
            ok = sluice_frame_push(&entries, key, 4) && sluice_frame_push(&entries, &f->id, 8);
        }
        ok = ok && sluice_put_many(ids_table, entries.ptr, entries.len, err);
        ok = ok && sluice_lookup(pool, ids, nids, &bound, err);
        at = 0;
        for (size_t j = 0; ok && j < nids && j < nfresh; j++) {
            const uint8_t *h;
            uint32_t hlen;
            if (!sluice_frame_next(bound.ptr, bound.len, &at, &h, &hlen)) break;
            char id[24], host[16] = "none";
            snprintf(id, sizeof id, "%llu", (unsigned long long)ids[j]);
            if (hlen == 4) snprintf(host, sizeof host, "%u.%u.%u.%u", h[0], h[1], h[2], h[3]);
            const char *fields[] = {"id", id, "host", host};
            if (!sluice_event(batch, "conformance.flow", SLUICE_INFO, flows[fresh[j]].first, fields, 2))
                ok = sluice_fail(err, "out of memory");
        }
    }
    if (ok) {
        done = calloc(nflows, sizeof *done);
        ok = done != NULL;
    }
    for (uint32_t k = 0; ok && k < nflows; k++) {
        if (!flows[k].ends || !flows[k].has_id) continue;
        uint8_t key[4];
        le32(key, flows[k].flow);
        done[ndone++] = flows[k].id;
        ok = sluice_frame_push(&removals, key, 4) && sluice_frame_push(&removals, NULL, 0);
    }
    if (ok && ndone) {
        ok = sluice_release(pool, done, ndone, err) && sluice_put_many(ids_table, removals.ptr, removals.len, err);
    }
out:
    free(flows), free(fresh), free(ids), free(done);
    sluice_buf_free(&keys), sluice_buf_free(&values), sluice_buf_free(&entries);
    sluice_buf_free(&known), sluice_buf_free(&bound), sluice_buf_free(&removals);
    return ok;
}
