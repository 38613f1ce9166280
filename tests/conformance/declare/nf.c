/* Declares one table of every kind with the spec constructors, sized by a
 * configuration read with the typed getters, and exercises the IPv6
 * accessors and the index of a refused item (see nf.rs for the full
 * description): per batch, the largest packet per source in an eventual
 * max table whose refusal drops the refused sources, packets per flow, and
 * IPv6 source -> destination in a single-writer byte table. */
#include <math.h>
#include <sluice_nf.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MS 1000000ull

static sluice_table_t largest, packets, v6, seen, notes, weights, names, ports;
static double scale;
static bool v6_events;
static char tag[17];

static bool declare(sluice_table_spec_t *spec, uint32_t capacity, uint64_t idle_timeout_ns, sluice_table_t *table,
                    sluice_error_t *err) {
    spec->capacity = capacity;
    spec->idle_timeout_ns = idle_timeout_ns;
    return sluice_declare(spec, table, err);
}

bool nf_init(const uint8_t *config, size_t len, sluice_info_t *info, sluice_error_t *err) {
    int64_t capacity, idle_ms, pool_first;
    if (!sluice_config_int(config, len, "capacity", 65536, &capacity, err) ||
        !sluice_config_int(config, len, "idle-ms", 0, &idle_ms, err) ||
        !sluice_config_float(config, len, "scale", 1.0, &scale, err) ||
        !sluice_config_bool(config, len, "v6-events", false, &v6_events, err) ||
        !sluice_config_string(config, len, "tag", "none", tag, sizeof tag, err) ||
        !sluice_config_int(config, len, "pool-first", 5000, &pool_first, err))
        return false;
    if (capacity < 0 || capacity > UINT32_MAX) return sluice_fail(err, "capacity: out of range");
    if (idle_ms < 0) return sluice_fail(err, "idle-ms: negative");
    if (pool_first < 0) return sluice_fail(err, "pool-first: negative");
    uint64_t idle_ns = (uint64_t)idle_ms * MS;

    sluice_table_spec_t spec;
    sluice_spec_eventual_counter(&spec, "largest", SLUICE_MERGE_MAX, 0);
    if (!declare(&spec, (uint32_t)capacity, idle_ns, &largest, err)) return false;
    sluice_spec_per_flow_counter(&spec, "packets");
    if (!declare(&spec, 0, idle_ns, &packets, err)) return false;
    sluice_spec_single_writer_bytes(&spec, "v6", 16, 16, 0);
    if (!declare(&spec, 1000, 0, &v6, err)) return false;
    sluice_spec_single_writer_counter(&spec, "seen", 0);
    if (!declare(&spec, 1000, 1000 * MS, &seen, err)) return false;
    sluice_spec_per_flow_bytes(&spec, "notes", 8);
    if (!declare(&spec, 4096, 1000 * MS, &notes, err)) return false;
    sluice_spec_read_only_counter(&spec, "weights");
    if (!declare(&spec, 16, 0, &weights, err)) return false;
    uint64_t wkeys[] = {1, 2, 3};
    int64_t wvalues[] = {10, 20, 30};
    if (!sluice_counter_add(weights, wkeys, wvalues, 3, err)) return false;
    sluice_spec_read_only_bytes(&spec, "names", 0, 16);
    if (!declare(&spec, 16, 0, &names, err)) return false;
    sluice_buf_t entry = {0};
    bool ok = sluice_frame_push(&entry, "tag", 3) && sluice_frame_push(&entry, tag, (uint32_t)strlen(tag));
    ok = ok ? sluice_put_many(names, entry.ptr, entry.len, err) : sluice_fail(err, "out of memory");
    sluice_buf_free(&entry);
    if (!ok) return false;
    sluice_spec_pool(&spec, "ports", (uint64_t)pool_first, 100, 4);
    spec.consistency.val.release.chunk = 10;
    if (!sluice_declare(&spec, &ports, err)) return false;
    info->wants_flow_state = false;
    return true;
}

struct source {
    uint64_t key;
    uint32_t first, largest;
};

struct flow {
    uint64_t flow;
    int64_t count;
};

static void hex(const uint8_t *b, char out[33]) {
    for (int i = 0; i < 16; i++) snprintf(out + 2 * i, 3, "%02x", b[i]);
}

bool nf_process(sluice_batch_t *batch, sluice_error_t *err) {
    uint32_t n = sluice_batch_len(batch), nsources = 0, nflows = 0;
    size_t cap = n ? n : 1;
    uint64_t *source_of = calloc(cap, sizeof *source_of), *keys = calloc(cap, sizeof *keys);
    bool *has_source = calloc(cap, sizeof *has_source);
    int64_t *values = calloc(cap, sizeof *values);
    struct source *sources = calloc(cap, sizeof *sources);
    struct flow *flows = calloc(cap, sizeof *flows);
    sluice_buf_t entries = {0};
    int64_t first_v6 = -1;
    uint8_t first_src[16], first_dst[16];
    bool ok = source_of && keys && has_source && values && sources && flows;
    if (!ok) sluice_fail(err, "out of memory");

    for (uint32_t i = 0; ok && i < n; i++) {
        sluice_packet_t p = sluice_batch_packet(batch, i);
        uint8_t src[16], dst[16];
        if (sluice_is_ipv4(&p)) {
            source_of[i] = sluice_ipv4_src(&p);
            has_source[i] = true;
        } else if (sluice_ipv6_src(&p, src) && sluice_ipv6_dst(&p, dst)) {
            uint64_t low = 0;
            for (int b = 8; b < 16; b++) low = low << 8 | src[b];
            source_of[i] = low | 1ull << 63;
            has_source[i] = true;
            ok = sluice_frame_push(&entries, src, 16) && sluice_frame_push(&entries, dst, 16);
            if (!ok) sluice_fail(err, "out of memory");
            if (first_v6 < 0) {
                first_v6 = i;
                memcpy(first_src, src, 16);
                memcpy(first_dst, dst, 16);
            }
        }
        if (has_source[i]) {
            uint32_t k = 0;
            while (k < nsources && sources[k].key != source_of[i]) k++;
            if (k == nsources) sources[nsources++] = (struct source){source_of[i], i, p.wire_len};
            else if (p.wire_len > sources[k].largest) sources[k].largest = p.wire_len;
        }
        if (p.flow != SLUICE_NO_FLOW) {
            uint32_t k = 0;
            while (k < nflows && flows[k].flow != p.flow) k++;
            if (k == nflows) flows[nflows++] = (struct flow){p.flow, 0};
            flows[k].count++;
        }
    }
    /* (1) The largest packet per source; a full table refuses a source and
     * every one after it. */
    if (ok && nsources) {
        for (uint32_t k = 0; k < nsources; k++) {
            keys[k] = sources[k].key;
            values[k] = (int64_t)floor((double)sources[k].largest * scale);
        }
        if (!sluice_counter_add(largest, keys, values, nsources, err)) {
            if (err->state_error != SLUICE_STATE_ERR_FULL || err->item < 0 || err->item >= nsources) {
                ok = false;
            } else {
                uint32_t item = (uint32_t)err->item;
                for (uint32_t i = 0; i < n; i++) {
                    if (!has_source[i]) continue;
                    for (uint32_t k = item; k < nsources; k++)
                        if (keys[k] == source_of[i]) sluice_set_verdict(batch, i, SLUICE_DROP);
                }
                char item_text[16], count_text[16];
                snprintf(item_text, sizeof item_text, "%u", item);
                snprintf(count_text, sizeof count_text, "%u", nsources);
                const char *fields[] = {"item", item_text, "sources", count_text};
                if (!sluice_event(batch, "conformance.full", SLUICE_WARN, sources[item].first, fields, 2))
                    ok = sluice_fail(err, "out of memory");
            }
        }
    }
    /* (2) Packets per flow. */
    if (ok && nflows) {
        for (uint32_t k = 0; k < nflows; k++) keys[k] = flows[k].flow, values[k] = flows[k].count;
        ok = sluice_counter_add(packets, keys, values, nflows, err);
    }
    /* (3) IPv6 source -> destination. */
    if (ok && first_v6 >= 0) {
        ok = sluice_put_many(v6, entries.ptr, entries.len, err);
        if (ok && v6_events) {
            char s[33], d[33];
            hex(first_src, s);
            hex(first_dst, d);
            const char *fields[] = {"src", s, "dst", d, "tag", tag};
            if (!sluice_event(batch, "conformance.v6", SLUICE_INFO, first_v6, fields, 3))
                ok = sluice_fail(err, "out of memory");
        }
    }
    free(source_of), free(keys), free(has_source), free(values), free(sources), free(flows);
    sluice_buf_free(&entries);
    return ok;
}
