/* Remembers each flow for 2 ms of packet time and reports when the host
 * forgets it (see nf.rs for the full description): per-flow packet counts
 * in a per-flow byte table with notify-expired; nf_expired emits one
 * `conformance.expired` event per entry. */
#include <sluice_nf.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static sluice_table_t recent;

bool nf_init(const uint8_t *config, size_t len, sluice_info_t *info, sluice_error_t *err) {
    (void)config, (void)len, (void)info;
    return sluice_declare_per_flow_bytes_expiring("recent", 8, 2000000, true, &recent, err);
}

bool nf_process(sluice_batch_t *batch, sluice_error_t *err) {
    uint32_t n = sluice_batch_len(batch), nflows = 0;
    uint32_t *flow = calloc(n ? n : 1, sizeof *flow);
    uint64_t *count = calloc(n ? n : 1, sizeof *count);
    sluice_buf_t entries = {0};
    bool ok = flow && count;
    for (uint32_t i = 0; ok && i < n; i++) {
        sluice_packet_t p = sluice_batch_packet(batch, i);
        if (p.flow == SLUICE_NO_FLOW) continue;
        uint32_t k = 0;
        while (k < nflows && flow[k] != p.flow) k++;
        if (k == nflows) flow[nflows++] = p.flow;
        count[k]++;
    }
    for (uint32_t k = 0; ok && k < nflows; k++) {
        uint8_t key[4] = {(uint8_t)flow[k], (uint8_t)(flow[k] >> 8), (uint8_t)(flow[k] >> 16), (uint8_t)(flow[k] >> 24)};
        ok = sluice_frame_push(&entries, key, 4) && sluice_frame_push(&entries, &count[k], 8);
    }
    if (!ok) sluice_fail(err, "out of memory");
    if (ok && nflows) ok = sluice_put_many(recent, entries.ptr, entries.len, err);
    free(flow), free(count);
    sluice_buf_free(&entries);
    return ok;
}

bool nf_expired(uint32_t table, const uint8_t *entries, size_t len, sluice_error_t *err) {
    (void)table;
    size_t at = 0;
    const uint8_t *key, *value;
    uint32_t klen, vlen;
    while (sluice_frame_next(entries, len, &at, &key, &klen) && sluice_frame_next(entries, len, &at, &value, &vlen)) {
        char hex[2 * 64 + 1] = "", packets[24];
        for (uint32_t i = 0; i < klen && i < 64; i++) snprintf(hex + 2 * i, 3, "%02x", key[i]);
        uint64_t v = 0;
        if (vlen == 8) memcpy(&v, value, 8);
        snprintf(packets, sizeof packets, "%llu", (unsigned long long)v);
        const char *fields[] = {"key", hex, "packets", packets};
        if (!sluice_emit("conformance.expired", SLUICE_INFO, fields, 2)) return sluice_fail(err, "out of memory");
    }
    return true;
}
